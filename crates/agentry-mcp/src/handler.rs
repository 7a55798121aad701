//! What Agentry answers when an MCP server talks to it: progress notifications routed to the
//! call they belong to, tool-list changes passed to the server's supervisor, log messages and
//! the server's stderr in our log, and elicitation requests declined with a clear message until
//! people can answer them (the approvals work).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientConfig, ElicitRequestParams, ElicitResult, ErrorCode, ProgressNotificationParam,
    ProgressToken,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ClientHandler, ErrorData, RoleClient};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// The message an MCP server gets when it asks for user input.
pub const ELICITATION_DECLINED: &str = "Agentry declined this elicitation request: answering MCP servers' requests for user input is not supported yet";

/// One progress notification of a call in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpProgress {
    /// Progress so far.
    pub progress: f64,
    /// The total, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<f64>,
    /// What the server says it is doing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where each call in flight wants its progress notifications.
#[derive(Debug, Default)]
pub(crate) struct ProgressRoutes(Mutex<HashMap<String, mpsc::UnboundedSender<McpProgress>>>);

impl ProgressRoutes {
    fn key(token: &ProgressToken) -> String {
        serde_json::to_string(token).unwrap_or_default()
    }

    pub(crate) fn insert(&self, token: &ProgressToken, sender: mpsc::UnboundedSender<McpProgress>) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(Self::key(token), sender);
    }

    pub(crate) fn remove(&self, token: &ProgressToken) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&Self::key(token));
    }

    fn send(&self, token: &ProgressToken, progress: McpProgress) {
        let routes = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = routes.get(&Self::key(token)) {
            let _ = sender.send(progress);
        }
    }
}

/// Something the supervisor of a server must act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerSignal {
    /// `notifications/tools/list_changed`.
    ToolsChanged,
}

/// The client side of one server's connection.
pub(crate) struct Handler {
    pub(crate) server: String,
    pub(crate) progress: Arc<ProgressRoutes>,
    pub(crate) signals: mpsc::UnboundedSender<ServerSignal>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        let info = serde_json::json!({
            "protocolVersion": rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE,
            "capabilities": { "elicitation": {} },
            "clientInfo": { "name": "agentry", "version": env!("CARGO_PKG_VERSION") },
        });
        serde_json::from_value(info).unwrap_or_default()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        tracing::warn!(
            mcp_server = %self.server,
            request = %serde_json::to_string(&request).unwrap_or_default(),
            "declined an elicitation request"
        );
        Err(ErrorData::new(
            ErrorCode::INVALID_REQUEST,
            ELICITATION_DECLINED,
            None,
        ))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.progress.send(
            &params.progress_token,
            McpProgress {
                progress: params.progress,
                total: params.total,
                message: params.message,
            },
        );
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        let _ = self.signals.send(ServerSignal::ToolsChanged);
    }

    // Servers of the 2025-11-25 revision still send log messages; they go to our log.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let data = params.data.to_string();
        tracing::info!(
            mcp_server = %self.server,
            level = ?params.level,
            logger = params.logger.as_deref().unwrap_or_default(),
            "{data}"
        );
    }
}
