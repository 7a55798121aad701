//! What Agentry answers when an MCP server talks to it: progress notifications routed to the
//! call they belong to, tool-list changes passed to the server's supervisor, log messages and
//! the server's stderr in our log, and elicitation requests handed to the calls in flight that
//! take them ([`crate::elicitation`]), declined with a clear message when none does.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

#[allow(deprecated)]
use rmcp::model::LoggingMessageNotificationParam;
use rmcp::model::{
    ClientConfig, ElicitRequestParams, ElicitResult, ElicitationAction, ErrorCode,
    ProgressNotificationParam, ProgressToken,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ClientHandler, ErrorData, RoleClient};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::elicitation::{ElicitationAnswer, ElicitationKind, ElicitationRoutes};

/// The message an MCP server gets when it asks for user input and no call of a run that a
/// person follows is in flight on it (a direct tool call, or no call at all).
pub const ELICITATION_DECLINED: &str = "Agentry declined this elicitation request: no tool call of a run that a person follows is in flight on this server";

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
    pub(crate) elicitations: Arc<ElicitationRoutes>,
}

/// Checks the `url` of a URL-mode elicitation: an absolute `http` or `https` URL, or the reason
/// it is refused (a `javascript:` or `data:` link must never reach the person asked).
pub(crate) fn check_elicitation_url(url: &str) -> Result<(), String> {
    let parsed = reqwest::Url::parse(url)
        .map_err(|error| format!("its url is not a valid absolute URL ({error})"))?;
    match parsed.scheme() {
        "http" | "https" => Ok(()),
        other => Err(format!(
            "its url has the scheme {other:?}; only http and https URLs are accepted"
        )),
    }
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        let info = serde_json::json!({
            "protocolVersion": rmcp::model::ProtocolVersion::LATEST_WITH_INITIALIZE,
            "capabilities": { "elicitation": { "form": {}, "url": {} } },
            "clientInfo": { "name": "agentry", "version": env!("CARGO_PKG_VERSION") },
        });
        serde_json::from_value(info).unwrap_or_default()
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        let (message, kind) = match request {
            ElicitRequestParams::FormElicitationParams {
                message,
                requested_schema,
                ..
            } => (
                message,
                ElicitationKind::Form {
                    requested_schema: serde_json::to_value(&requested_schema)
                        .unwrap_or_else(|_| serde_json::json!({"type": "object"})),
                },
            ),
            ElicitRequestParams::UrlElicitationParams {
                message,
                url,
                elicitation_id,
                ..
            } => {
                // The url is shown to a person as a link: nothing but http(s) reaches them.
                if let Err(reason) = check_elicitation_url(&url) {
                    tracing::warn!(
                        mcp_server = %self.server,
                        %url,
                        "declined a URL elicitation request: {reason}"
                    );
                    return Err(ErrorData::new(
                        ErrorCode::INVALID_PARAMS,
                        format!("Agentry declined this elicitation request: {reason}"),
                        None,
                    ));
                }
                (
                    message,
                    ElicitationKind::Url {
                        url,
                        elicitation_id,
                    },
                )
            }
            other => {
                tracing::warn!(
                    mcp_server = %self.server,
                    request = %serde_json::to_string(&other).unwrap_or_default(),
                    "declined an elicitation request of an unknown mode"
                );
                return Err(ErrorData::new(
                    ErrorCode::INVALID_PARAMS,
                    "Agentry declined this elicitation request: its mode is not supported",
                    None,
                ));
            }
        };
        let answer = self
            .elicitations
            .ask(&self.server, message.clone(), kind, context.ct.clone())
            .await;
        let Some(answer) = answer else {
            tracing::warn!(
                mcp_server = %self.server,
                %message,
                "declined an elicitation request: no call in flight takes it"
            );
            return Err(ErrorData::new(
                ErrorCode::INVALID_REQUEST,
                ELICITATION_DECLINED,
                None,
            ));
        };
        Ok(match answer {
            ElicitationAnswer::Accept(Value::Null) => ElicitResult::new(ElicitationAction::Accept),
            ElicitationAnswer::Accept(content) => {
                ElicitResult::new(ElicitationAction::Accept).with_content(content)
            }
            ElicitationAnswer::Decline => ElicitResult::new(ElicitationAction::Decline),
            ElicitationAnswer::Cancel => ElicitResult::new(ElicitationAction::Cancel),
        })
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

#[cfg(test)]
mod tests {
    use super::check_elicitation_url;

    #[test]
    fn elicitation_urls_must_be_http_or_https() {
        for good in [
            "https://example.com/authorize?state=1",
            "http://127.0.0.1:8080/callback",
            "HTTPS://EXAMPLE.COM/",
        ] {
            assert_eq!(check_elicitation_url(good), Ok(()), "{good}");
        }
        for (bad, needle) in [
            ("javascript:alert(document.cookie)", "\"javascript\""),
            ("JavaScript:alert(1)", "\"javascript\""),
            ("data:text/html,<script>alert(1)</script>", "\"data\""),
            ("file:///etc/passwd", "\"file\""),
            ("vbscript:msgbox", "\"vbscript\""),
            ("/relative/path", "not a valid absolute URL"),
            ("", "not a valid absolute URL"),
        ] {
            let reason = check_elicitation_url(bad).unwrap_err();
            assert!(reason.contains(needle), "{bad}: {reason}");
        }
        assert!(
            check_elicitation_url("javascript:alert(1)")
                .unwrap_err()
                .contains("only http and https")
        );
    }
}
