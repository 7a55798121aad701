//! Agentry's MCP layer, the only crate that imports `rmcp` (its API moves fast).
//!
//! - [`McpManager`]: MCP servers configured once for the whole runtime and shared by every agent
//!   and session: one process or connection per server, supervised (timeouts, restart with
//!   backoff, tool-list refresh), with calls that honour deadlines, progress and cancellation,
//!   and servers' elicitation requests handed to the calls in flight ([`elicitation`]).
//! - [`config`]: the `{"mcpServers": {…}}` configuration and its validation.
//! - [`stdio`]: where stdio servers run: each in a sandbox of its own, on the host only when the
//!   operator allows host commands, else refused ([`StdioPolicy`]).
//! - [`server`]: Agentry as an MCP server (stdio and streamable HTTP) over a [`server::McpBackend`]
//!   the HTTP crate implements.

pub mod config;
pub mod content;
pub mod elicitation;
pub mod error;
mod handler;
pub mod manager;
pub mod server;
pub mod stdio;

pub use config::{
    McpServerConfig, TransportKind, ValueSource, parse_servers_document, qualified_tool_name,
    validate_server_name,
};
pub use content::McpToolResult;
pub use elicitation::{
    ElicitationAnswer, ElicitationKind, ElicitationRequest, ElicitationResponder,
};
pub use error::McpError;
pub use handler::{ELICITATION_DECLINED, McpProgress};
pub use manager::{
    CallOptions, McpManager, McpToolInfo, ServerState, ServerStatus, WeakMcpManager,
};
pub use stdio::{StdioPolicy, StdioSandbox};
