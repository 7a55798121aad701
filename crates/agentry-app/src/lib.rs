//! Agentry's application layer: everything a front-end (the HTTP API, the CLI, the MCP
//! endpoint and the stdio MCP server) needs below its own parsing and rendering.
//!
//! [`App`] owns the store, the session manager, the live-run [`hub::Hub`], the MCP servers, the
//! standalone sandboxes, the MCP elicitations waiting for a person and the live group exchanges;
//! nothing lives in a process-wide static. Front-ends parse a request, call the app, and render
//! what it returns; the app never names HTTP, and its errors are [`AppError`]s that each
//! front-end maps in one place.

pub mod agents;
pub mod approvals;
pub mod auth;
mod catalogue;
pub mod catalogue_service;
pub mod clock;
pub mod cluster;
mod code_interpreter;
pub mod config;
pub mod context_report;
pub mod delegation;
pub mod elicitation;
mod environment;
pub mod error;
pub mod follow;
pub mod group;
pub mod hub;
pub mod ids;
pub mod key_quotas;
pub mod mcp_server;
pub mod mcp_service;
pub mod mcp_tools;
pub mod memory;
pub mod model_config;
pub mod ops;
pub mod outcome;
pub mod publication;
pub mod queue;
pub mod quotas;
mod run_spec;
pub mod runs;
pub mod runtime;
mod sandbox_errors;
pub mod sandbox_requests;
pub mod sandbox_service;
pub mod sandboxes;
pub mod schedules;
pub mod schema;
pub mod secrets;
pub mod session_service;
pub mod skills;
pub mod standard_webhooks;
mod store_log;
pub mod terminals;
pub mod titles;
pub mod turn_files;
pub mod tus;
pub mod usage;
pub mod webhooks;
pub mod workflows;
pub mod workspace_files;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use agentry_core::session::SessionManager;
use agentry_core::workspace::journal::{FileJournal, JournalConfig};
use agentry_mcp::McpManager;
use agentry_store::Store;

/// The layers below, for the front-ends: they parse into and render these crates' types (run
/// and session events, requests, configurations, errors) but reach them only through the app,
/// so the app is the one door to the domain and a front-end's manifest names no engine, store
/// or MCP crate (the boundary test in `crates/agentry/tests` holds this).
pub mod domain {
    pub use agentry_core as core;
    pub use agentry_llm as llm;
    pub use agentry_mcp as mcp;
    pub use agentry_sandbox as sandbox;
    pub use agentry_store as store;
    pub use agentry_tools as tools;
}

pub use environment::ToolEnvironment;
pub use error::{AppError, Failure};
pub use store_log::StoreLog;

use crate::elicitation::Elicitations;
use crate::group::LiveGroups;
use crate::hub::{Hub, RunObserver};
use crate::runtime::build_runtime;
use crate::sandboxes::SandboxRegistry;

/// The application. Cheap to clone: one shared [`AppParts`]. Its parts are its own: a front-end
/// asks the app's methods and its typed services ([`App::hub`], [`App::groups`]), never the
/// store or the engine behind them (the `testing` feature opens the parts to tests).
#[derive(Clone)]
pub struct App {
    parts: Arc<AppParts>,
}

/// What the application is made of. Each part is itself shared, so a copy (made only when a
/// setting of a shared [`App`] is changed) shares the store, the sessions, the hub and the rest.
#[derive(Clone)]
pub struct AppParts {
    /// The database: sessions, configuration, secrets.
    pub store: Store,
    /// Runs requests in sessions.
    pub sessions: SessionManager,
    /// Live runs and the clients attached to them.
    pub hub: Hub,
    /// The pooled HTTP client models and HTTP tools share.
    pub http: reqwest::Client,
    /// Cancelled when the application shuts down.
    pub shutdown: CancellationToken,
    /// The MCP servers, shared by every run.
    pub mcp: McpManager,
    /// Whether Agentry's own MCP server (`/mcp`, `agentry mcp serve`) offers the registered
    /// tools besides the agents.
    pub mcp_expose_tools: bool,
    /// The sessions' workspaces and sandboxes.
    pub tools: ToolEnvironment,
    /// The standalone sandboxes (made with `tools.sandboxes`' backend).
    pub sandboxes: SandboxRegistry,
    /// MCP servers' requests for input waiting for a person, by run.
    pub elicitations: Elicitations,
    /// The group exchanges going on.
    pub groups: LiveGroups,
    /// The run queue's worker state in this process (settings, runs held, waiters).
    pub queue: Arc<queue::QueueState>,
    /// The workflow runs driven by this process.
    pub workflows: Arc<workflows::LiveWorkflows>,
    /// Workspace thumbnails: a few decodes at once, and the ones made.
    pub thumbnails: Arc<workspace_files::Thumbnails>,
    /// The sessions each key created in the last minute (its `sessions_per_minute` quota).
    pub session_windows: Arc<quotas::SessionWindows>,
}

impl App {
    /// An app over `store`, with the runtime built from its configuration. The saved MCP
    /// servers start in the background; the runtime is rebuilt as their tools come and go.
    pub async fn new(store: Store) -> Result<Self, AppError> {
        Self::with_tools(store, ToolEnvironment::default()).await
    }

    /// An app over `store` whose runs work in `tools`' workspaces and sandboxes.
    pub async fn with_tools(store: Store, tools: ToolEnvironment) -> Result<Self, AppError> {
        Self::observed(store, tools, Arc::new(hub::Unobserved)).await
    }

    /// An app whose live runs `observer` watches (the HTTP server's metrics).
    pub async fn observed(
        store: Store,
        tools: ToolEnvironment,
        observer: Arc<dyn RunObserver>,
    ) -> Result<Self, AppError> {
        Self::builder(store)
            .tools(tools)
            .observer(observer)
            .build()
            .await
    }

    /// How an app is made, step by step: the one composition root of every front-end (the
    /// HTTP server, `mcp serve`, and the CLI's commands).
    pub fn builder(store: Store) -> AppBuilder {
        AppBuilder {
            store,
            tools: ToolEnvironment::default(),
            observer: Arc::new(hub::Unobserved),
            mcp: McpStart::Saved,
            stdio: None,
        }
    }
}

/// Which saved MCP servers an app starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum McpStart {
    /// Every saved one (a server: `agentry serve`, `agentry mcp serve`).
    #[default]
    Saved,
    /// Only these (a run as an agent: the agent's own).
    Only(Vec<String>),
    /// None (a command that runs nothing: checks, reports).
    None,
}

/// An [`App`] being made ([`App::builder`]).
pub struct AppBuilder {
    store: Store,
    tools: ToolEnvironment,
    observer: Arc<dyn RunObserver>,
    mcp: McpStart,
    stdio: Option<agentry_mcp::StdioPolicy>,
}

impl AppBuilder {
    /// Runs work in `tools`' workspaces and sandboxes.
    pub fn tools(mut self, tools: ToolEnvironment) -> Self {
        self.tools = tools;
        self
    }

    /// `observer` watches the live runs (the HTTP server's metrics).
    pub fn observer(mut self, observer: Arc<dyn RunObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// Which saved MCP servers start (in the background; the runtime is rebuilt as their tools
    /// come and go). Default: every one.
    pub fn mcp(mut self, which: McpStart) -> Self {
        self.mcp = which;
        self
    }

    /// Where stdio MCP servers start (default: the tools' sandboxes, or the host where host
    /// commands are allowed). The CLI starts them on the host: its operator named them.
    pub fn stdio_mcp(mut self, policy: agentry_mcp::StdioPolicy) -> Self {
        self.stdio = Some(policy);
        self
    }

    /// The app, its runtime built from the store's configuration.
    pub async fn build(self) -> Result<App, AppError> {
        let Self {
            store,
            mut tools,
            observer,
            mcp: start,
            stdio,
        } = self;
        let elicitations = tools
            .elicitations
            .get_or_insert_with(Default::default)
            .clone();
        let http = agentry_llm::http_client(Duration::from_secs(10))
            .map_err(|error| AppError::internal(error.to_string()))?;
        if let Some(root) = &tools.workspaces
            && tools.file_journal.is_none()
        {
            tools.file_journal = Some(Arc::new(FileJournal::new(
                root.join(".journal"),
                JournalConfig::default(),
            )));
        }
        let mcp = McpManager::with_stdio(stdio.unwrap_or_else(|| tools.stdio_policy()));
        match &start {
            McpStart::Saved => mcp_tools::start_saved(&store, &mcp, None).await?,
            McpStart::Only(names) => mcp_tools::start_saved(&store, &mcp, Some(names)).await?,
            McpStart::None => {}
        }
        // The configuration's generation before the runtime is built from it: a change made
        // by another node from now on is seen by the configuration watch.
        let generation = store.config_generation().await?;
        let runtime = build_runtime(&store, &http, &mcp, &tools).await?;
        let queue = Arc::new(queue::QueueState::default());
        queue
            .config_generation
            .store(generation, std::sync::atomic::Ordering::Relaxed);
        // This process's writes carry its name: a session it runs is its own until the run
        // stops, and no other process writes to it meanwhile.
        store.set_worker(&queue.worker());
        let log = Arc::new(StoreLog::fenced(store.clone(), queue.fences.clone()));
        let mut sessions = SessionManager::new(runtime, log);
        if let Some(root) = &tools.workspaces {
            sessions =
                sessions.with_workspaces_journalled(root.clone(), tools.file_journal.clone());
        }
        runtime::rebuild_on_changes(
            &mcp,
            store.clone(),
            http.clone(),
            tools.clone(),
            sessions.clone(),
        );
        let app = App::from_parts(AppParts {
            mcp,
            sessions,
            store,
            hub: Hub::new(observer),
            http,
            shutdown: CancellationToken::new(),
            mcp_expose_tools: false,
            sandboxes: SandboxRegistry::new(tools.sandbox_root.clone()),
            tools,
            elicitations,
            groups: LiveGroups::default(),
            queue,
            workflows: Arc::default(),
            thumbnails: Arc::default(),
            session_windows: Arc::default(),
        });
        app.parts.tools.delegation.bind(
            &app.parts.store,
            &app.parts.sessions,
            &app.parts.hub,
            app.parts.tools.skill_roots.clone(),
        );
        app.parts.elicitations.bind(&app.parts.hub);
        if let Some(pool) = &app.parts.tools.sandboxes {
            // Sandboxes paused when a server last stopped over this data folder come back.
            let restored = app.parts.sandboxes.restore(pool.backend()).await;
            if restored > 0 {
                tracing::info!(
                    restored,
                    "paused sandboxes made again over their workspaces"
                );
            }
        }
        Ok(app)
    }
}

impl App {
    fn from_parts(parts: AppParts) -> Self {
        Self {
            parts: Arc::new(parts),
        }
    }

    /// The parts, for tests that look below the app (the `testing` feature).
    #[cfg(feature = "testing")]
    pub fn parts(&self) -> &AppParts {
        &self.parts
    }

    /// The parts to change, for tests that set one up differently (the `testing` feature): on a
    /// shared app it changes this handle's own copy only.
    #[cfg(feature = "testing")]
    pub fn parts_mut(&mut self) -> &mut AppParts {
        Arc::make_mut(&mut self.parts)
    }

    /// Whether Agentry's own MCP server (`/mcp`, `agentry mcp serve`) offers the registered
    /// tools besides the agents. A setting made before the app is shared: on a shared app it
    /// changes this handle's own copy only.
    pub fn expose_tools_over_mcp(&mut self, expose: bool) {
        Arc::make_mut(&mut self.parts).mcp_expose_tools = expose;
    }

    /// Which tool calls wait for a person unless a run says otherwise.
    pub fn approval_defaults(&self) -> &agentry_core::tool::ApprovalDefaults {
        &self.parts.tools.approval_defaults
    }

    /// The live runs and the clients attached to them.
    pub fn hub(&self) -> &Hub {
        &self.parts.hub
    }

    /// The group exchanges going on.
    pub fn groups(&self) -> &LiveGroups {
        &self.parts.groups
    }

    /// Cancelled when the application shuts down.
    pub fn shutdown_signal(&self) -> &CancellationToken {
        &self.parts.shutdown
    }

    /// Shuts the application down: its background work stops and live streams end.
    pub fn shut_down(&self) {
        self.parts.shutdown.cancel();
    }

    /// Shuts the application down and closes the store, once its last writes are made (a CLI
    /// command's end).
    pub async fn close(&self) {
        self.parts.shutdown.cancel();
        self.parts.store.close().await;
    }

    /// Waits up to `grace` for the runs live in this process to stop (after the front-end
    /// stopped taking requests); answers how many are still running.
    pub async fn drain(&self, grace: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + grace;
        while self.parts.hub.live_runs() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.parts.hub.live_runs()
    }

    /// Lets go of what this process holds, at a server's clean stop: its background runs go to
    /// another node at once, and the MCP servers' processes, the terminals and every sandbox
    /// end with it rather than when the OS gets to them.
    pub async fn release(&self) {
        Box::pin(self.leave_cluster()).await;
        self.parts.mcp.shutdown().await;
        self.parts.tools.terminals.close_all();
        self.parts.sandboxes.close_all().await;
        if let Some(pool) = &self.parts.tools.sandboxes {
            pool.close_all().await;
        }
    }

    /// Rebuilds the runtime after a configuration change; new runs use it at once.
    pub async fn reload_runtime(&self) -> Result<(), AppError> {
        let runtime = build_runtime(
            &self.parts.store,
            &self.parts.http,
            &self.parts.mcp,
            &self.parts.tools,
        )
        .await?;
        self.parts.sessions.set_runtime(runtime);
        Ok(())
    }
}
