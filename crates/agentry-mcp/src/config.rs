//! MCP server configuration: the usual `{"mcpServers": {…}}` document, validated.
//!
//! A server is either a program spoken to over stdio (`command`, `args`, `env`, `cwd`) or a
//! streamable HTTP endpoint (`url`, `headers`). Environment and header values are literal text or
//! `{"secret": "NAME"}`, resolved from stored secrets when the server is started, so a key never
//! sits in the configuration itself.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::McpError;

/// The longest server name accepted.
pub const SERVER_NAME_MAX_LEN: usize = 32;

/// Separates the server's name from the tool's in an Agentry tool name: `<server>__<tool>`.
pub const TOOL_NAME_SEPARATOR: &str = "__";

/// A value given to a server: literal text, or a stored secret resolved when the server starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ValueSource {
    /// The value of the secret with this name.
    Secret {
        /// The secret's name.
        secret: String,
    },
    /// This exact value.
    Literal(String),
}

/// How Agentry reaches a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TransportKind {
    /// A child process speaking newline-delimited JSON-RPC on stdin/stdout.
    Stdio,
    /// Streamable HTTP (one endpoint; the server may answer with JSON or an SSE stream).
    #[serde(alias = "http", alias = "streamableHttp", alias = "streamable-http")]
    StreamableHttp,
}

/// One MCP server, as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerConfig {
    /// The transport; inferred from `command` / `url` when absent.
    #[serde(
        default,
        rename = "type",
        alias = "transport",
        skip_serializing_if = "Option::is_none"
    )]
    pub transport: Option<TransportKind>,
    /// The program to start (stdio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments (stdio).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables given to the program (stdio). The program gets these and the
    /// runtime's `PATH`, `HOME`, `LANG` and `TMPDIR`, nothing else of the runtime's environment.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, ValueSource>,
    /// The program's working directory (stdio).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    /// The endpoint (streamable HTTP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Headers sent with every request (streamable HTTP).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, ValueSource>,
    /// How long starting and initialising may take, in milliseconds (default 30 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connect_timeout_ms: Option<u64>,
    /// How long a call may go without an answer or a progress notification, in milliseconds
    /// (default 60 000). Each progress notification restarts this deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call_timeout_ms: Option<u64>,
    /// The hard cap on one call, progress or not, in milliseconds (default 600 000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_call_ms: Option<u64>,
    /// Whether the server's tools are idempotent (crash recovery re-runs only those).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idempotent: bool,
    /// Kept but not started.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// Run this stdio server on the host even when a sandbox is there: **no isolation**. Refused
    /// unless the operator allows host commands (`agentry serve --allow-host-commands`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub host: bool,
}

/// The default connect and initialise timeout.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// The default idle timeout of a call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// The default hard cap of a call.
pub const DEFAULT_MAX_CALL: Duration = Duration::from_secs(600);

impl McpServerConfig {
    /// A stdio server.
    pub fn stdio(
        command: impl Into<String>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            transport: Some(TransportKind::Stdio),
            command: Some(command.into()),
            args: args.into_iter().map(Into::into).collect(),
            ..Self::empty()
        }
    }

    /// A streamable HTTP server.
    pub fn http(url: impl Into<String>) -> Self {
        Self {
            transport: Some(TransportKind::StreamableHttp),
            url: Some(url.into()),
            ..Self::empty()
        }
    }

    fn empty() -> Self {
        Self {
            transport: None,
            command: None,
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: None,
            url: None,
            headers: BTreeMap::new(),
            connect_timeout_ms: None,
            call_timeout_ms: None,
            max_call_ms: None,
            idempotent: false,
            disabled: false,
            host: false,
        }
    }

    /// Adds an environment variable.
    pub fn with_env(mut self, name: impl Into<String>, value: ValueSource) -> Self {
        self.env.insert(name.into(), value);
        self
    }

    /// Sets the call timeouts (idle, reset by progress; and the hard cap).
    pub fn with_call_timeouts(mut self, idle: Duration, cap: Duration) -> Self {
        self.call_timeout_ms = Some(millis(idle));
        self.max_call_ms = Some(millis(cap));
        self
    }

    /// Sets the connect timeout.
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout_ms = Some(millis(timeout));
        self
    }

    /// The transport, given or inferred.
    pub fn transport_kind(&self) -> Result<TransportKind, McpError> {
        match (self.transport, &self.command, &self.url) {
            (Some(kind), _, _) => Ok(kind),
            (None, Some(_), None) => Ok(TransportKind::Stdio),
            (None, None, Some(_)) => Ok(TransportKind::StreamableHttp),
            (None, Some(_), Some(_)) => Err(McpError::InvalidConfig(
                "give either \"command\" (stdio) or \"url\" (streamable HTTP), not both".into(),
            )),
            (None, None, None) => Err(McpError::InvalidConfig(
                "a server needs \"command\" (stdio) or \"url\" (streamable HTTP)".into(),
            )),
        }
    }

    /// Checks the configuration of the server called `name`.
    pub fn validate(&self, name: &str) -> Result<(), McpError> {
        validate_server_name(name)?;
        let invalid =
            |message: String| McpError::InvalidConfig(format!("server {name:?}: {message}"));
        match self.transport_kind()? {
            TransportKind::Stdio => {
                let command = self.command.as_deref().unwrap_or_default();
                if command.trim().is_empty() {
                    return Err(invalid(
                        "a stdio server needs a non-empty \"command\"".into(),
                    ));
                }
                if command.contains('\0') || self.args.iter().any(|arg| arg.contains('\0')) {
                    return Err(invalid(
                        "the command and its arguments cannot contain NUL".into(),
                    ));
                }
                if self.url.is_some() || !self.headers.is_empty() {
                    return Err(invalid(
                        "\"url\" and \"headers\" are for HTTP servers".into(),
                    ));
                }
                for variable in self.env.keys() {
                    if variable.is_empty() || variable.contains(['=', '\0']) {
                        return Err(invalid(format!(
                            "{variable:?} is not an environment variable name"
                        )));
                    }
                }
            }
            TransportKind::StreamableHttp => {
                let url = self.url.as_deref().unwrap_or_default();
                let parsed = reqwest::Url::parse(url)
                    .map_err(|error| invalid(format!("\"url\" {url:?} is not a URL: {error}")))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(invalid("\"url\" must be http or https".into()));
                }
                if self.command.is_some()
                    || !self.args.is_empty()
                    || !self.env.is_empty()
                    || self.host
                {
                    return Err(invalid(
                        "\"command\", \"args\", \"env\" and \"host\" are for stdio servers".into(),
                    ));
                }
                for header in self.headers.keys() {
                    if http::HeaderName::from_bytes(header.as_bytes()).is_err() {
                        return Err(invalid(format!("{header:?} is not a header name")));
                    }
                }
            }
        }
        for (what, value) in [
            ("connect_timeout_ms", self.connect_timeout_ms),
            ("call_timeout_ms", self.call_timeout_ms),
            ("max_call_ms", self.max_call_ms),
        ] {
            if value == Some(0) {
                return Err(invalid(format!("{what} must be positive")));
            }
        }
        Ok(())
    }

    /// The connect and initialise timeout.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout_ms
            .map_or(DEFAULT_CONNECT_TIMEOUT, Duration::from_millis)
    }

    /// The idle timeout of a call.
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout_ms
            .map_or(DEFAULT_CALL_TIMEOUT, Duration::from_millis)
    }

    /// The hard cap of a call.
    pub fn max_call(&self) -> Duration {
        self.max_call_ms
            .map_or(DEFAULT_MAX_CALL, Duration::from_millis)
    }

    /// The names of the secrets this server needs.
    pub fn secret_names(&self) -> impl Iterator<Item = &str> {
        self.env
            .values()
            .chain(self.headers.values())
            .filter_map(|value| match value {
                ValueSource::Secret { secret } => Some(secret.as_str()),
                ValueSource::Literal(_) => None,
            })
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Checks a server name: 1 to 32 of `A-Z a-z 0-9 _ -`, without `__` (which separates the server
/// from the tool in tool names) and not starting or ending with `_`.
pub fn validate_server_name(name: &str) -> Result<(), McpError> {
    let valid = !name.is_empty()
        && name.len() <= SERVER_NAME_MAX_LEN
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
        && !name.contains(TOOL_NAME_SEPARATOR)
        && !name.starts_with('_')
        && !name.ends_with('_');
    if valid {
        Ok(())
    } else {
        Err(McpError::InvalidConfig(format!(
            "{name:?} is not a valid MCP server name (1 to {SERVER_NAME_MAX_LEN} of A-Z a-z 0-9 _ -, no \"__\", not starting or ending with _)"
        )))
    }
}

/// Parses an `{"mcpServers": {name: config, …}}` document (a bare `{name: config}` map is
/// accepted too) and validates every server in it.
pub fn parse_servers_document(
    document: &Value,
) -> Result<BTreeMap<String, McpServerConfig>, McpError> {
    let Some(object) = document.as_object() else {
        return Err(McpError::InvalidConfig(
            "expected a JSON object {\"mcpServers\": {name: {command, args, env} or {url, headers}}}".into(),
        ));
    };
    let servers = match object.get("mcpServers") {
        Some(servers) if object.len() == 1 => servers,
        Some(_) => {
            return Err(McpError::InvalidConfig(
                "unexpected fields beside \"mcpServers\"".into(),
            ));
        }
        None => document,
    };
    let Some(servers) = servers.as_object() else {
        return Err(McpError::InvalidConfig(
            "\"mcpServers\" must be an object of servers by name".into(),
        ));
    };
    if servers.is_empty() {
        return Err(McpError::InvalidConfig("no servers given".into()));
    }
    let mut parsed = BTreeMap::new();
    for (name, value) in servers {
        validate_server_name(name)?;
        let config: McpServerConfig = serde_json::from_value(value.clone())
            .map_err(|error| McpError::InvalidConfig(format!("server {name:?}: {error}")))?;
        config.validate(name)?;
        parsed.insert(name.clone(), config);
    }
    Ok(parsed)
}

/// The Agentry name of a server's tool: `<server>__<tool>`, with every character a model API
/// does not accept in a function name replaced by `_`, cut to 64 characters.
pub fn qualified_tool_name(server: &str, tool: &str) -> String {
    let mut name = String::with_capacity(server.len() + TOOL_NAME_SEPARATOR.len() + tool.len());
    name.push_str(server);
    name.push_str(TOOL_NAME_SEPARATOR);
    for character in tool.chars() {
        if character.is_ascii_alphanumeric() || character == '_' || character == '-' {
            name.push(character);
        } else {
            name.push('_');
        }
    }
    name.truncate(64);
    name
}
