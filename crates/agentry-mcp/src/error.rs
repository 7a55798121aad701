//! The errors of the MCP layer.

use std::time::Duration;

/// What went wrong talking to (or configuring) an MCP server.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The configuration is not valid; nothing was started.
    #[error("invalid MCP configuration: {0}")]
    InvalidConfig(String),
    /// No server has this name.
    #[error("no MCP server is named {0:?}")]
    UnknownServer(String),
    /// A server with this name exists already.
    #[error("an MCP server named {0:?} exists already")]
    DuplicateServer(String),
    /// The server has no tool with this name.
    #[error("MCP server {server:?} has no tool named {tool:?}")]
    UnknownTool {
        /// The server.
        server: String,
        /// The tool asked for.
        tool: String,
    },
    /// A secret the configuration names is not set.
    #[error("MCP server {server:?} needs the secret {secret:?}, which is not set")]
    MissingSecret {
        /// The server.
        server: String,
        /// The secret.
        secret: String,
    },
    /// The server is not connected (starting, restarting after a crash, failed or disabled).
    #[error("MCP server {server:?} is not available: {reason}")]
    Unavailable {
        /// The server.
        server: String,
        /// Its state and last error.
        reason: String,
    },
    /// Starting or initialising the server failed.
    #[error("MCP server {server:?} could not be started: {reason}")]
    Connect {
        /// The server.
        server: String,
        /// Why.
        reason: String,
    },
    /// The server went away while the request was in flight (a crashed process, a closed
    /// connection); it is being restarted.
    #[error("MCP server {server:?} exited while the request was in flight; it is being restarted")]
    ServerExited {
        /// The server.
        server: String,
    },
    /// The request ran past its deadline (the idle one, restarted by each progress
    /// notification, or the hard cap); the server was told to cancel it.
    #[error("MCP server {server:?} did not answer within {after:?}; the request was cancelled")]
    Timeout {
        /// The server.
        server: String,
        /// The deadline that passed.
        after: Duration,
    },
    /// The caller cancelled; the server was told to cancel the request.
    #[error("the MCP request was cancelled")]
    Cancelled,
    /// The server answered with a JSON-RPC error.
    #[error("MCP server {server:?} answered with an error ({code}): {message}")]
    Protocol {
        /// The server.
        server: String,
        /// The JSON-RPC error code.
        code: i32,
        /// Its message.
        message: String,
    },
    /// The server asked for something Agentry cannot give (for example user input through
    /// MRTR) or answered with something unexpected.
    #[error("MCP server {server:?}: {message}")]
    Unsupported {
        /// The server.
        server: String,
        /// What happened.
        message: String,
    },
    /// A stdio server would run on the host, unsandboxed, and the operator has not allowed that
    /// (`--allow-host-commands`); nothing was started.
    #[error("MCP server {server:?} is refused: {reason}")]
    HostCommandsRefused {
        /// The server.
        server: String,
        /// Why, naming the setting that would allow it.
        reason: String,
    },
    /// Any other transport failure.
    #[error("MCP server {server:?}: {message}")]
    Transport {
        /// The server.
        server: String,
        /// What happened.
        message: String,
    },
}

impl McpError {
    /// The stable error code of the HTTP API for this error.
    pub fn code(&self) -> &'static str {
        match self {
            Self::InvalidConfig(_) => "invalid_request",
            Self::UnknownServer(_) | Self::UnknownTool { .. } => "not_found",
            Self::DuplicateServer(_) => "conflict",
            Self::MissingSecret { .. } => "invalid_request",
            Self::Unavailable { .. } | Self::Connect { .. } | Self::ServerExited { .. } => {
                "mcp_unavailable"
            }
            Self::HostCommandsRefused { .. } => "host_commands_refused",
            Self::Timeout { .. } => "timeout",
            Self::Cancelled => "cancelled",
            Self::Protocol { .. } | Self::Unsupported { .. } | Self::Transport { .. } => {
                "mcp_error"
            }
        }
    }
}
