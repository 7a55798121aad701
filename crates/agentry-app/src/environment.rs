//! What the built-in tools work in: the sessions' workspaces and sandboxes, the network
//! policy, approvals by default, skill roots and whether commands may run on the host.

use std::path::PathBuf;
use std::sync::Arc;

use agentry_sandbox::SandboxPool;

/// What the built-in tools work in: the sessions' workspaces and their sandboxes.
#[derive(Debug, Clone, Default)]
pub struct ToolEnvironment {
    /// The folder holding one workspace per session (`<folder>/<session id>`). `None`: runs
    /// have no workspace and the file tools are not offered.
    pub workspaces: Option<PathBuf>,
    /// What tools change in the workspaces, turn by turn (`<workspaces>/.journal`): made with
    /// the app when there are workspaces ([`crate::App::observed`]); the `undo` tool and
    /// revoking turns use it.
    pub file_journal: Option<Arc<agentry_core::workspace::journal::FileJournal>>,
    /// The open PTY terminals in sessions' sandboxes: the `terminal` tool's and those people
    /// open through the API (one registry, so either can be watched and typed into).
    pub terminals: agentry_tools::PtyTerminals,
    /// Image descriptions and audio transcripts made for models that cannot take them, kept
    /// across rebuilt runtimes.
    pub media_cache: Arc<agentry_core::media::MediaCache>,
    /// The sandboxes the `exec` and `terminal` tools and command tools run in (one per session
    /// workspace); also what `/v1/sandboxes` creates sandboxes with. `None`: no sandbox, and
    /// those tools are not offered.
    pub sandboxes: Option<SandboxPool>,
    /// The folder standalone sandboxes (`/v1/sandboxes`) get their workspaces in, one folder
    /// per sandbox, removed when it closes. `None`: `agentry-sandboxes-<pid>` in the system's
    /// temporary folder (removed at shutdown).
    pub sandbox_root: Option<PathBuf>,
    /// The `delegate` and `talk_to` tools' limits, and the store and session manager they run
    /// sub-agents through (bound by [`crate::App::with_tools`]).
    pub delegation: crate::delegation::DelegationHandle,
    /// Where MCP servers' requests for input during a run wait for a person. `None`: they are
    /// declined (`agentry run`); the server always has one ([`crate::App::elicitations`]).
    pub elicitations: Option<crate::elicitation::Elicitations>,
    /// The `fetch` tool's configuration: its network policy (off by default; `agentry serve`
    /// sets it from `--allow-domain`, `--allow-private` and `--fetch-network`). A saved agent's
    /// `network` narrows it for its runs.
    pub fetch: agentry_tools::FetchConfig,
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
    /// The Python that runs the code interpreter's kernels (`ipykernel`) inside standalone
    /// sandboxes, as a sandbox sees it (`agentry serve --kernel-python`). `None`: the
    /// sandbox's own `python3`.
    pub kernel_python: Option<String>,
}

impl ToolEnvironment {
    /// The sandboxes command tools run in: the sessions' (when runs have workspaces to run
    /// them in).
    pub fn command_sandboxes(&self) -> Option<&SandboxPool> {
        self.sandboxes
            .as_ref()
            .filter(|_| self.workspaces.is_some())
    }

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
