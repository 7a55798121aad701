//! MCP servers in the runtime: their tools as Agentry tools, their configuration in the store.
//!
//! Servers are configured once (`POST /v1/tools/mcp`, `agentry mcp add`, or `mcp.json` in the
//! data folder), saved under [`ConfigKind::McpServer`], started by the shared
//! [`McpManager`] when the server starts, and their tools (`<server>__<tool>`) are registered in
//! every runtime the server builds. When a server's tool list changes (it connects, announces
//! `tools/list_changed`, crashes or is removed), the runtime is rebuilt.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Failure;
use futures::FutureExt;
use futures::future::BoxFuture;

use agentry_core::tool::{Tool, ToolContext, ToolError, ToolOutput};
use agentry_mcp::{CallOptions, McpError, McpManager, McpServerConfig, McpToolInfo};
use agentry_store::{ConfigKind, Store};
use agentry_types::ToolSpec;

use crate::config::ConfigRepo;
use crate::elicitation::Elicitations;
use crate::error::AppError;
use crate::secrets::Secrets;
use agentry_tools::SecretResolver as _;

/// The name of the file in the data folder whose servers are imported at start-up.
pub const SERVERS_FILE: &str = "mcp.json";

/// One tool of an MCP server, as an Agentry tool.
pub struct McpTool {
    info: McpToolInfo,
    spec: ToolSpec,
    cap: Duration,
    manager: McpManager,
    elicitations: Option<Elicitations>,
}

impl McpTool {
    /// The tool `info` of the manager's servers; its server's requests for input during a
    /// run's call wait in `elicitations` for a person (without one, they are declined).
    pub fn new(info: McpToolInfo, manager: McpManager, elicitations: Option<Elicitations>) -> Self {
        let spec = ToolSpec::new(
            info.name.clone(),
            info.description.clone(),
            info.input_schema.clone(),
        );
        let cap = manager
            .config(&info.server)
            .map(|config| config.max_call())
            .unwrap_or(agentry_mcp::config::DEFAULT_MAX_CALL);
        Self {
            info,
            spec,
            cap,
            manager,
            elicitations,
        }
    }
}

impl Tool for McpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// The server's hard cap: the manager enforces the idle deadline, which progress extends.
    fn timeout(&self) -> Option<Duration> {
        Some(self.cap)
    }

    fn idempotent(&self) -> bool {
        self.info.idempotent
    }

    /// An MCP server's tool reaches outside Agentry (another process or a remote server).
    fn risk(&self) -> agentry_core::tool::ToolRisk {
        agentry_core::tool::ToolRisk::of(agentry_core::tool::RiskClass::Network)
    }

    fn call(
        &self,
        arguments: serde_json::Value,
        context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let manager = self.manager.clone();
        let server = self.info.server.clone();
        let tool = self.info.tool.clone();
        let name = self.info.name.clone();
        let elicitations = self.elicitations.clone();
        async move {
            // A call of a run takes the server's requests for input (a person answers them);
            // a direct call declines them.
            let (requests_tx, requests) = tokio::sync::mpsc::unbounded_channel();
            let elicitations = elicitations.filter(|_| context.caller.is_some());
            let options = CallOptions {
                cancel: context.cancel.clone(),
                elicitation: elicitations.is_some().then_some(requests_tx),
                ..CallOptions::default()
            };
            let call = manager.call_tool(&server, &tool, arguments, options);
            let outcome = match &elicitations {
                Some(elicitations) => elicitations.serve(&context, &name, requests, call).await,
                None => call.await,
            };
            match outcome {
                Ok(result) => Ok(ToolOutput::parts(result.parts_for_model(), result.is_error)),
                Err(McpError::Cancelled) => Err(ToolError::Cancelled),
                Err(McpError::Timeout { after, .. }) => Err(ToolError::Timeout(after)),
                Err(error) => Err(ToolError::Failed(error.to_string())),
            }
        }
        .boxed()
    }
}

/// The MCP tools to register in a runtime: every connected server's tools.
/// Their servers' requests for input during a run wait in `elicitations` (declined without).
pub fn tools(manager: &McpManager, elicitations: Option<&Elicitations>) -> Vec<Arc<dyn Tool>> {
    manager
        .tools()
        .into_iter()
        .map(|info| {
            Arc::new(McpTool::new(info, manager.clone(), elicitations.cloned())) as Arc<dyn Tool>
        })
        .collect()
}

/// Starts every server saved in the store, or only those `only` names (in the background: a
/// server that is slow or down delays nothing). A stored entry that is invalid is skipped with
/// a warning.
pub async fn start_saved(
    store: &Store,
    manager: &McpManager,
    only: Option<&[String]>,
) -> Result<(), AppError> {
    let secrets = Secrets::load(store).await?;
    for (name, value) in store.list_config(ConfigKind::McpServer).await? {
        if only.is_some_and(|only| !only.contains(&name)) {
            continue;
        }
        let added = match serde_json::from_value::<McpServerConfig>(value) {
            Ok(config) => add_server(manager, &secrets, &name, config)
                .await
                .map_err(|error| error.message),
            Err(error) => Err(error.to_string()),
        };
        if let Err(error) = added {
            tracing::warn!(mcp_server = %name, "not starting a saved MCP server: {error}");
        }
    }
    Ok(())
}

/// Makes `manager` run exactly the servers saved in the store (another node added, changed or
/// removed some): a new or changed server is (re)started, one no longer saved is stopped, the
/// rest are left running.
pub async fn sync_saved(store: &Store, manager: &McpManager) -> Result<(), AppError> {
    let secrets = Secrets::load(store).await?;
    let mut saved = std::collections::HashSet::new();
    for (name, value) in store.list_config(ConfigKind::McpServer).await? {
        saved.insert(name.clone());
        let config = match serde_json::from_value::<McpServerConfig>(value) {
            Ok(config) => config,
            Err(error) => {
                tracing::warn!(mcp_server = %name, "a saved MCP server is unreadable: {error}");
                continue;
            }
        };
        if manager.config(&name).is_ok_and(|running| running == config) {
            continue;
        }
        if let Err(error) = add_server(manager, &secrets, &name, config).await {
            tracing::warn!(
                mcp_server = %name,
                "not starting a saved MCP server: {}",
                error.message
            );
        }
    }
    for name in manager.names() {
        if !saved.contains(&name)
            && let Err(error) = manager.remove(&name).await
        {
            tracing::warn!(mcp_server = %name, "cannot stop an MCP server no longer saved: {error}");
        }
    }
    Ok(())
}

/// Saves servers in the store and (re)starts them in `manager`; validation of all of them comes
/// first, so a bad one saves nothing.
pub async fn save_and_start(
    store: &Store,
    manager: &McpManager,
    servers: &BTreeMap<String, McpServerConfig>,
) -> Result<(), AppError> {
    let secrets = Secrets::load(store).await?;
    for (name, config) in servers {
        config.validate(name).map_err(mcp_error)?;
        // Refused here, before anything is saved or spawned, when it has nowhere to run.
        manager
            .stdio_policy()
            .check(name, config)
            .map_err(mcp_error)?;
        // Every secret it names is set and may go where it would send it.
        secrets.for_mcp_server(name, config)?;
    }
    for (name, config) in servers {
        ConfigRepo::new(store).put(name, config).await?;
        add_server(manager, &secrets, name, config.clone()).await?;
    }
    Ok(())
}

/// Adds (or replaces) the server `name` in `manager`, with the secrets it names, each allowed
/// where the server sends it (see [`Secrets::for_mcp_server`]).
pub async fn add_server(
    manager: &McpManager,
    secrets: &Secrets,
    name: &str,
    config: McpServerConfig,
) -> Result<(), AppError> {
    let resolver = secrets.for_mcp_server(name, &config)?;
    manager
        .add(name, config, &|secret| resolver.resolve(secret))
        .await
        .map_err(mcp_error)
}

/// Imports the servers of `<home>/mcp.json` (`{"mcpServers": {…}}`) into the store, replacing
/// saved servers of the same names. A missing file is nothing to import; an invalid one is an
/// error naming the file.
pub async fn import_servers_file(store: &Store, home: &Path) -> Result<usize, AppError> {
    let path = home.join(SERVERS_FILE);
    let text = match tokio::fs::read_to_string(&path).await {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(error) => {
            return Err(AppError::internal(format!(
                "cannot read {}: {error}",
                path.display()
            )));
        }
    };
    let document: serde_json::Value = serde_json::from_str(&text).map_err(|error| {
        AppError::bad_request(format!("{} is not JSON: {error}", path.display()))
    })?;
    let servers = agentry_mcp::parse_servers_document(&document)
        .map_err(|error| AppError::bad_request(format!("{}: {error}", path.display())))?;
    for (name, config) in &servers {
        ConfigRepo::new(store).put(name, config).await?;
    }
    Ok(servers.len())
}

/// The API error for an MCP error.
pub fn mcp_error(error: McpError) -> AppError {
    let status = match &error {
        McpError::InvalidConfig(_) | McpError::MissingSecret { .. } => Failure::Invalid,
        McpError::UnknownServer(_) | McpError::UnknownTool { .. } => Failure::NotFound,
        McpError::DuplicateServer(_) => Failure::Conflict,
        McpError::HostCommandsRefused { .. } => Failure::Forbidden,
        McpError::Timeout { .. } => Failure::Timeout,
        _ => Failure::Upstream,
    };
    let code = match &error {
        McpError::HostCommandsRefused { reason, .. }
            if reason == agentry_mcp::stdio::NO_SANDBOX_HINT =>
        {
            "sandbox_required"
        }
        _ => error.code(),
    };
    AppError::new(status, code, error.to_string())
}
