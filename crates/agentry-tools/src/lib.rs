//! Agentry's built-in tools, ready to register with a [`Runtime`](agentry_core::Runtime).
//!
//! - `read_file`, `write_file`, `edit_file`, `list_dir` and `search` over the run's workspace
//!   (confined by [`agentry_core::workspace`]), and `fetch` under a [`NetworkPolicy`]: see
//!   [`workspace_tools`].
//! - `exec` and `terminal`, commands in the session's sandbox: see [`shell_tools`].
//! - HTTP tools ([`HttpTool`]) and command tools ([`CommandTool`]) an operator defines
//!   ([`ToolDefinition`]), with secrets from a [`SecretResolver`].
//! - `current_time`: see [`builtin_tools`].
//! - `delegate` and `talk_to`, sub-agents started through the embedder's
//!   [`SubRuns`](agentry_core::subrun::SubRuns): see [`delegation_tools`].
//!
//! The tool contract ([`Tool`](agentry_core::tool::Tool), the registry, results, risk classes)
//! and the run engine are in `agentry-core`, which knows nothing of these tools: the embedder
//! registers the ones it wants, and gives the runtime [`validate_network_policy`] to check the
//! network narrowings of runs (see [`RuntimeBuilder::network_check`]).
//!
//! [`RuntimeBuilder::network_check`]: agentry_core::RuntimeBuilder::network_check

pub mod agents;
pub mod builtin;
pub mod command;
pub mod definition;
pub mod http;
pub mod shell;
pub mod workspace;

pub use agentry_core::network::{MAX_ALLOW_ENTRIES, NetworkPolicy, NetworkPolicyError};
pub use agents::{DelegationConfig, delegation_tools};
pub use builtin::{builtin, builtin_tools};
pub use command::{CommandTool, CommandToolConfig};
pub use definition::{HeaderDefinition, HostRefusal, ToolDefinition, load_definitions};
pub use http::{
    EnvSecrets, HeaderValueSource, HttpTool, HttpToolConfig, SecretResolver, StaticSecrets,
};
pub use shell::{PtyTerminals, ShellToolsConfig, shell_tools};
pub use workspace::{
    FetchConfig, WorkspaceToolsConfig, undo_tool, validate_network_policy, workspace_tools,
};
