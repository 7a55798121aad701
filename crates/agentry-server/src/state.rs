//! What every request handler shares.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentry_core::session::SessionManager;
use agentry_mcp::McpManager;
use agentry_sandbox::SandboxPool;
use agentry_store::Store;

use crate::auth::Authenticator;
use crate::error::ApiError;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::models::build_runtime;
use crate::sandboxes::SandboxRegistry;

/// What the built-in tools work in: the sessions' workspaces and their sandboxes.
#[derive(Debug, Clone, Default)]
pub struct ToolEnvironment {
    /// The folder holding one workspace per session (`<folder>/<session id>`). `None`: runs
    /// have no workspace and the file tools are not offered.
    pub workspaces: Option<PathBuf>,
    /// The sandboxes the `exec` and `terminal` tools and command tools run in (one per session
    /// workspace); also what `/v1/sandboxes` creates sandboxes with. `None`: no sandbox, and
    /// those tools are not offered.
    pub sandboxes: Option<SandboxPool>,
    /// The folder standalone sandboxes (`/v1/sandboxes`) get their workspaces in, one folder
    /// per sandbox, removed when it closes. `None`: `agentry-sandboxes-<pid>` in the system's
    /// temporary folder (removed at shutdown).
    pub sandbox_root: Option<PathBuf>,
    /// The `delegate` and `talk_to` tools' limits, and the store and session manager they run
    /// sub-agents through (bound by [`AppState::with_tools`]).
    pub delegation: crate::delegation::DelegationHandle,
    /// Where MCP servers' requests for input during a run wait for a person. `None`: they are
    /// declined (`agentry run`); the server always has one ([`AppState::elicitations`]).
    pub elicitations: Option<crate::elicitation::Elicitations>,
    /// The `fetch` tool's configuration: its network policy (off by default; `agentry serve`
    /// sets it from `--allow-domain`, `--allow-private` and `--fetch-network`). A saved agent's
    /// `network` narrows it for its runs.
    pub fetch: agentry_core::tool::FetchConfig,
    /// Which tools need a person's approval when a run's own policy does not say (default:
    /// every tool that runs on the host).
    pub approval_defaults: agentry_core::tool::ApprovalDefaults,
    /// Where saved agents' skill folders may be: each must resolve (symlinks included) inside
    /// one of these roots, or the agent is refused (400) and the skill not loaded. `agentry
    /// serve` sets `<home>/skills` plus any `--skill-root`. `None`: skill folders may be
    /// anywhere (a local, operator-driven runtime such as `agentry run`).
    pub skill_roots: Option<Vec<PathBuf>>,
    /// Whether commands may run on the host, unsandboxed (`agentry serve
    /// --allow-host-commands`): command tools and stdio MCP servers that say `"host": true`,
    /// and every one of them when there is no sandbox. Off (the default), such tools and
    /// servers are refused, never run on the host; and with it on, registering a stdio MCP
    /// server over HTTP needs an API key.
    pub allow_host_commands: bool,
    /// The folder holding each sandboxed stdio MCP server's workspace
    /// (`<folder>/<server name>`). `None`: `agentry-mcp-workspaces-<pid>` in the system's
    /// temporary folder.
    pub mcp_workspaces: Option<PathBuf>,
}

impl ToolEnvironment {
    /// Where the MCP manager starts stdio servers: each in a sandbox of its own when there are
    /// sandboxes (made with their backend and template, so the operator's network policy and
    /// read-only mounts apply), on the host only when host commands are allowed.
    pub fn stdio_policy(&self) -> agentry_mcp::StdioPolicy {
        agentry_mcp::StdioPolicy {
            sandbox: self
                .sandboxes
                .as_ref()
                .map(|pool| agentry_mcp::StdioSandbox {
                    backend: Arc::clone(pool.backend()),
                    template: pool.template().clone(),
                    workspaces: self.mcp_workspaces.clone().unwrap_or_else(|| {
                        std::env::temp_dir()
                            .join(format!("agentry-mcp-workspaces-{}", std::process::id()))
                    }),
                }),
            allow_host: self.allow_host_commands,
        }
    }
}

/// The server's shared state. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    /// The database: sessions, configuration, secrets.
    pub store: Store,
    /// Runs requests in sessions.
    pub sessions: SessionManager,
    /// Live runs and the clients attached to them.
    pub hub: Hub,
    /// The pooled HTTP client models and HTTP tools share.
    pub http: reqwest::Client,
    /// Cancelled when the server shuts down.
    pub shutdown: CancellationToken,
    /// API keys and logins.
    pub auth: Authenticator,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Which `Host` names and browser origins may reach the API (the origins are also the
    /// CORS origins; none: CORS off).
    pub access: crate::access::AccessPolicy,
    /// The MCP servers, shared by every run.
    pub mcp: McpManager,
    /// Whether Agentry's own MCP server (`/mcp`, `agentry mcp serve`) offers the registered
    /// tools besides the agents.
    pub mcp_expose_tools: bool,
    /// The sessions' workspaces and sandboxes.
    pub tools: ToolEnvironment,
    /// The standalone sandboxes of `/v1/sandboxes` (made with `tools.sandboxes`' backend).
    pub sandboxes: SandboxRegistry,
    /// MCP servers' requests for input waiting for a person, by run.
    pub elicitations: crate::elicitation::Elicitations,
}

impl AppState {
    /// State over `store`, with the runtime built from its configuration. The saved MCP
    /// servers start in the background; the runtime is rebuilt as their tools come and go.
    pub async fn new(store: Store) -> Result<Self, ApiError> {
        Self::with_tools(store, ToolEnvironment::default()).await
    }

    /// State over `store` whose runs work in `tools`' workspaces and sandboxes.
    pub async fn with_tools(store: Store, mut tools: ToolEnvironment) -> Result<Self, ApiError> {
        let elicitations = tools
            .elicitations
            .get_or_insert_with(Default::default)
            .clone();
        let http = agentry_llm::http_client(Duration::from_secs(10))
            .map_err(|error| ApiError::internal(error.to_string()))?;
        let mcp = McpManager::with_stdio(tools.stdio_policy());
        crate::mcp::start_saved(&store, &mcp).await?;
        let runtime = build_runtime(&store, &http, &mcp, &tools).await?;
        let log = Arc::new(crate::store_log::StoreLog::new(store.clone()));
        let metrics = Arc::new(Metrics::default());
        let mut sessions = SessionManager::new(runtime, log);
        if let Some(root) = &tools.workspaces {
            sessions = sessions.with_workspaces(root.clone());
        }
        crate::mcp::rebuild_on_changes(
            &mcp,
            store.clone(),
            http.clone(),
            tools.clone(),
            sessions.clone(),
        );
        let state = Self {
            mcp,
            sessions,
            auth: Authenticator::new(store.clone()),
            store,
            hub: Hub::new(Arc::clone(&metrics)),
            http,
            shutdown: CancellationToken::new(),
            metrics,
            access: crate::access::AccessPolicy::default(),
            mcp_expose_tools: false,
            sandboxes: SandboxRegistry::new(tools.sandbox_root.clone()),
            tools,
            elicitations,
        };
        state.tools.delegation.bind(
            &state.store,
            &state.sessions,
            &state.hub,
            state.tools.skill_roots.clone(),
        );
        state.elicitations.bind(&state.hub);
        Ok(state)
    }

    /// Rebuilds the runtime after a configuration change; new runs use it at once.
    pub async fn reload_runtime(&self) -> Result<(), ApiError> {
        let runtime = build_runtime(&self.store, &self.http, &self.mcp, &self.tools).await?;
        self.sessions.set_runtime(runtime);
        Ok(())
    }
}
