//! The MCP servers as every front-end manages them: registered from the usual
//! `{"mcpServers": {…}}` document (saved, started, waited for), listed with their status and
//! tools (secrets masked), restarted, deleted, and their resources and prompts read.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use agentry_mcp::{
    McpError, McpServerConfig, ServerState, ServerStatus, TransportKind, ValueSource,
    parse_servers_document, validate_server_name,
};

use crate::App;
use crate::config::ConfigRepo;
use crate::error::{AppError, Failure};
use crate::mcp_tools::{mcp_error, save_and_start};
use crate::schema::serde_name;

/// How long a registration or restart waits for the server's first connection before it
/// answers with the status it has then (the server keeps starting in the background).
const READY_WAIT: Duration = Duration::from_secs(30);

/// A server: its status, tools and configuration (header values and environment values shown
/// only as the name of the secret they come from, or masked).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct McpServerView {
    /// The name.
    pub name: String,
    /// `stdio` or `streamable_http`.
    pub transport: String,
    /// `starting`, `connected`, `restarting`, `failed` or `stopped`.
    pub state: String,
    /// How many tools it offers.
    pub tool_count: usize,
    /// Its tools' Agentry names (`<server>__<tool>`).
    pub tools: Vec<String>,
    /// The last error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// How many times it has been restarted.
    pub restarts: u32,
    /// The process id (stdio, while running; for a sandboxed server, the host pid of its
    /// sandbox's first process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// A stdio server running in a sandbox of its own (`false`: on the host, or not stdio).
    pub sandboxed: bool,
    /// The protocol revision agreed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The server's own name and version.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub server_info: Option<Value>,
    /// The configuration, secrets masked.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub config: Value,
}

/// Several servers.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct McpServerList {
    /// The servers, by name.
    pub servers: Vec<McpServerView>,
}

/// Masks a configuration for display: literal environment and header values become `***`.
fn masked(config: &McpServerConfig) -> Value {
    let mut shown = config.clone();
    for value in shown.env.values_mut().chain(shown.headers.values_mut()) {
        if let ValueSource::Literal(text) = value {
            *text = "***".into();
        }
    }
    serde_json::to_value(shown).unwrap_or(Value::Null)
}

fn check_name(name: &str) -> Result<(), AppError> {
    validate_server_name(name).map_err(mcp_error)
}

/// The MCP servers every run shares: registered, restarted, removed, and their resources and
/// prompts.
pub struct McpServers<'a> {
    app: &'a App,
}

impl App {
    /// The MCP servers every run shares: registered, restarted, removed, and their resources and
    /// prompts.
    pub fn mcp(&self) -> McpServers<'_> {
        McpServers { app: self }
    }
}

impl McpServers<'_> {
    /// Waits up to `wait` for each of the MCP servers `names` (started with the app) to answer,
    /// then rebuilds the runtime with their tools; an error names the first that did not start.
    pub async fn await_ready(&self, names: &[String], wait: Duration) -> Result<(), AppError> {
        for name in names {
            let status = self
                .app
                .parts
                .mcp
                .wait_ready(name, wait)
                .await
                .map_err(mcp_error)?;
            if status.state != ServerState::Connected {
                return Err(AppError::new(
                    Failure::Unavailable,
                    "mcp_unavailable",
                    format!(
                        "the MCP server {name:?} did not start: {}",
                        status.last_error.as_deref().unwrap_or("no answer")
                    ),
                ));
            }
        }
        self.app.reload_runtime().await
    }

    fn view(&self, status: ServerStatus) -> McpServerView {
        let config = self
            .app
            .parts
            .mcp
            .config(&status.name)
            .map(|config| masked(&config))
            .unwrap_or(Value::Null);
        McpServerView {
            transport: serde_name(&status.transport),
            state: serde_name(&status.state),
            name: status.name,
            tool_count: status.tool_count,
            tools: status.tools,
            last_error: status.last_error,
            restarts: status.restarts,
            pid: status.pid,
            sandboxed: status.sandboxed,
            protocol_version: status.protocol_version,
            server_info: status.server_info,
            config,
        }
    }

    /// Saves and starts the servers of an `{"mcpServers": {…}}` document (a server of the same
    /// name is replaced) and waits a while for each. While host commands are allowed, a stdio
    /// server needs `keys_exist` (an API key guards the server): registering one is refused
    /// otherwise, and nothing is saved or started when one is refused.
    pub async fn register(
        &self,
        document: &Value,
        keys_exist: bool,
    ) -> Result<McpServerList, AppError> {
        let servers = parse_servers_document(document).map_err(mcp_error)?;
        let stdio = servers
            .iter()
            .find(|(_, config)| config.transport_kind().ok() == Some(TransportKind::Stdio));
        if let Some((name, _)) = stdio.filter(|_| self.app.parts.tools.allow_host_commands)
            && !keys_exist
        {
            return Err(AppError::new(
                Failure::Forbidden,
                "api_key_required",
                format!(
                    "MCP server {name:?} is a stdio server, and this server allows host commands \
                     (--allow-host-commands): registering one over HTTP needs an API key, and \
                     none exists (create one with `agentry keys create`)"
                ),
            ));
        }
        save_and_start(&self.app.parts.store, &self.app.parts.mcp, &servers).await?;
        let waits = servers
            .keys()
            .map(|name| self.app.parts.mcp.wait_ready(name, READY_WAIT));
        let statuses = futures::future::join_all(waits).await;
        // The tools are usable as soon as the answer arrives.
        self.app.reload_runtime().await?;
        let mut views = Vec::new();
        for status in statuses {
            views.push(self.view(status.map_err(mcp_error)?));
        }
        Ok(McpServerList { servers: views })
    }

    /// Every MCP server with its status.
    pub fn list(&self) -> McpServerList {
        let servers = self
            .app
            .parts
            .mcp
            .statuses()
            .into_iter()
            .map(|status| self.view(status))
            .collect();
        McpServerList { servers }
    }

    /// One MCP server with its status.
    pub fn get(&self, name: &str) -> Result<McpServerView, AppError> {
        check_name(name)?;
        let status = self.app.parts.mcp.status(name).map_err(mcp_error)?;
        Ok(self.view(status))
    }

    /// Stops and deletes an MCP server; its tools leave the runtime.
    pub async fn delete(&self, name: &str) -> Result<(), AppError> {
        check_name(name)?;
        let stored = ConfigRepo::<McpServerConfig>::new(&self.app.parts.store)
            .delete(name)
            .await?;
        let running = self.app.parts.mcp.remove(name).await.is_ok();
        self.app.reload_runtime().await?;
        if stored || running {
            Ok(())
        } else {
            Err(mcp_error(McpError::UnknownServer(name.to_owned())))
        }
    }

    /// Restarts an MCP server (a new process or connection) and waits a while for it.
    pub async fn restart(&self, name: &str) -> Result<McpServerView, AppError> {
        check_name(name)?;
        let before = self.app.parts.mcp.status(name).map_err(mcp_error)?;
        self.app.parts.mcp.restart(name).map_err(mcp_error)?;
        // Wait for the restart to be under way, then for its outcome.
        let deadline = tokio::time::Instant::now() + READY_WAIT;
        loop {
            let now = self.app.parts.mcp.status(name).map_err(mcp_error)?;
            let moved = now.restarts > before.restarts;
            let settled = matches!(now.state, ServerState::Connected | ServerState::Failed);
            if (moved && settled) || tokio::time::Instant::now() >= deadline {
                self.app.reload_runtime().await?;
                return Ok(self.view(now));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// An MCP server's resources (`resources/list`).
    pub async fn resources(&self, name: &str) -> Result<Value, AppError> {
        check_name(name)?;
        let resources = self
            .app
            .parts
            .mcp
            .list_resources(name)
            .await
            .map_err(mcp_error)?;
        Ok(json!({ "resources": resources }))
    }

    /// Reads one resource of an MCP server (`resources/read`).
    pub async fn read_resource(&self, name: &str, uri: &str) -> Result<Value, AppError> {
        check_name(name)?;
        if uri.trim().is_empty() || uri.len() > 4096 {
            return Err(AppError::bad_request("uri must have 1 to 4096 characters"));
        }
        self.app
            .parts
            .mcp
            .read_resource(name, uri)
            .await
            .map_err(mcp_error)
    }

    /// An MCP server's prompts (`prompts/list`).
    pub async fn prompts(&self, name: &str) -> Result<Value, AppError> {
        check_name(name)?;
        let prompts = self
            .app
            .parts
            .mcp
            .list_prompts(name)
            .await
            .map_err(mcp_error)?;
        Ok(json!({ "prompts": prompts }))
    }

    /// Renders one prompt of an MCP server (`prompts/get`).
    pub async fn prompt(
        &self,
        name: &str,
        prompt: &str,
        arguments: std::collections::BTreeMap<String, String>,
    ) -> Result<Value, AppError> {
        check_name(name)?;
        if prompt.trim().is_empty() || prompt.len() > 256 {
            return Err(AppError::bad_request(
                "a prompt name has 1 to 256 characters",
            ));
        }
        self.app
            .parts
            .mcp
            .get_prompt(name, prompt, arguments)
            .await
            .map_err(mcp_error)
    }
}
