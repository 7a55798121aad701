//! Tools defined at run time from configuration: HTTP endpoints and local commands.
//!
//! A definition is plain data (JSON), so tools can come from a file, the CLI or (later) the HTTP
//! API. Building one checks everything a tool needs before it is offered to a model.
//!
//! ```json
//! [
//!   {"kind": "http", "name": "search", "description": "Search the wiki",
//!    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
//!    "url": "https://wiki.example/api/search",
//!    "headers": {"authorization": {"secret": "WIKI_TOKEN"}}, "timeout_ms": 10000},
//!   {"kind": "command", "name": "word_count", "program": "wc", "args": ["-w"],
//!    "idempotent": true}
//! ]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agentry_types::ToolSpec;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use agentry_core::tool::{Tool, ToolContext, ToolError, ToolOutput};

use crate::command::{CommandTool, CommandToolConfig};
use crate::http::{HeaderValueSource, HttpTool, HttpToolConfig, SecretResolver};

/// Output kept from a configured tool unless the definition says otherwise.
const DEFAULT_OUTPUT_LIMIT: usize = 1024 * 1024;

/// A header value: literal text, or the value of a named secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum HeaderDefinition {
    /// The value of the secret with this name (resolved when the tool is built, never logged).
    Secret {
        /// The secret's name.
        secret: String,
    },
    /// This exact value.
    Literal(String),
}

/// A tool defined by configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ToolDefinition {
    /// POST the arguments as JSON to a URL; the response body is the result.
    Http {
        /// The tool's name.
        name: String,
        /// What it does, for the model.
        #[serde(default)]
        description: String,
        /// JSON Schema of the arguments (default: an object with any properties).
        #[serde(default = "any_object")]
        parameters: Value,
        /// The endpoint (`http` or `https`).
        url: String,
        /// Headers sent with every call.
        #[serde(default)]
        headers: BTreeMap<String, HeaderDefinition>,
        /// Timeout in milliseconds (default: the run's tool timeout).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// Most bytes of the response kept (default 1 MiB).
        #[serde(default = "default_output_limit")]
        max_response_bytes: usize,
        /// Whether calling it twice with the same arguments is harmless.
        #[serde(default)]
        idempotent: bool,
    },
    /// Run a program with the arguments as JSON on standard input; its output is the result.
    /// It runs in the session's sandbox; without a sandbox it is refused unless the operator
    /// allows host commands (see [`ToolDefinition::build_in`]).
    Command {
        /// The tool's name.
        name: String,
        /// What it does, for the model.
        #[serde(default)]
        description: String,
        /// JSON Schema of the arguments (default: an object with any properties).
        #[serde(default = "any_object")]
        parameters: Value,
        /// The program: a path, or a name looked up in `PATH`.
        program: PathBuf,
        /// Fixed command-line arguments.
        #[serde(default)]
        args: Vec<String>,
        /// Environment variables for the program.
        #[serde(default)]
        env: BTreeMap<String, String>,
        /// Timeout in milliseconds (default: the run's tool timeout).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timeout_ms: Option<u64>,
        /// Most bytes of standard output kept (default 1 MiB).
        #[serde(default = "default_output_limit")]
        max_output_bytes: usize,
        /// Whether running it twice with the same arguments is harmless.
        #[serde(default)]
        idempotent: bool,
        /// Run it on the host even when sandboxes are on: **no isolation**, for programs the
        /// sandbox cannot see (the sandbox shows the host's system folders and the session's
        /// workspace only). Refused unless the operator allows host commands
        /// (`--allow-host-commands`).
        #[serde(default)]
        host: bool,
    },
}

fn any_object() -> Value {
    json!({"type": "object", "properties": {}})
}

fn default_output_limit() -> usize {
    DEFAULT_OUTPUT_LIMIT
}

impl ToolDefinition {
    /// The tool's name.
    pub fn name(&self) -> &str {
        match self {
            Self::Http { name, .. } | Self::Command { name, .. } => name,
        }
    }

    /// Builds the tool with no sandbox and host commands not allowed, so a command tool is
    /// refused. HTTP tools share `http` (a pooled client) and resolve secret headers through
    /// `secrets`.
    pub fn build(
        self,
        http: &reqwest::Client,
        secrets: Arc<dyn SecretResolver>,
    ) -> Result<Arc<dyn Tool>, ToolError> {
        self.build_in(http, secrets, None, false)
    }

    /// Why this definition cannot be built where there are `sandboxes` (or none) and host
    /// commands are allowed or not: `None` when it can. A command tool runs in the sandbox of
    /// the run's workspace; on the host (no isolation) only when `allow_host` (the operator's
    /// `--allow-host-commands`) and either it says `"host": true` or there is no sandbox.
    pub fn host_refusal(&self, sandbox: bool, allow_host: bool) -> Option<HostRefusal> {
        match self {
            Self::Http { .. } => None,
            Self::Command { host: true, .. } if !allow_host => Some(HostRefusal::HostFlag),
            Self::Command { host: false, .. } if !sandbox && !allow_host => {
                Some(HostRefusal::NoSandbox)
            }
            Self::Command { .. } => None,
        }
    }

    /// Builds the tool; a command tool runs in the sandbox of the run's workspace when
    /// `sandboxes` is given and it does not say `"host": true`. On the host only when
    /// `allow_host`; otherwise it is refused ([`ToolError::Registration`], naming the setting;
    /// see [`ToolDefinition::host_refusal`]).
    pub fn build_in(
        self,
        http: &reqwest::Client,
        secrets: Arc<dyn SecretResolver>,
        sandboxes: Option<&agentry_sandbox::SandboxPool>,
        allow_host: bool,
    ) -> Result<Arc<dyn Tool>, ToolError> {
        if let Some(refusal) = self.host_refusal(sandboxes.is_some(), allow_host) {
            return Err(ToolError::Registration(format!(
                "command tool {:?}: {refusal}",
                self.name()
            )));
        }
        let (tool, idempotent): (Arc<dyn Tool>, bool) = match self {
            Self::Http {
                name,
                description,
                parameters,
                url,
                headers,
                timeout_ms,
                max_response_bytes,
                idempotent,
            } => {
                let headers = headers
                    .into_iter()
                    .map(|(header, value)| {
                        let source = match value {
                            HeaderDefinition::Secret { secret } => {
                                HeaderValueSource::Secret(secret)
                            }
                            HeaderDefinition::Literal(text) => HeaderValueSource::Literal(text),
                        };
                        (header, source)
                    })
                    .collect();
                let config = HttpToolConfig {
                    name,
                    description,
                    parameters,
                    url,
                    headers,
                    timeout: timeout_ms.map(Duration::from_millis),
                    max_response_bytes,
                };
                (
                    Arc::new(HttpTool::new(config, http.clone(), secrets)?),
                    idempotent,
                )
            }
            Self::Command {
                name,
                description,
                parameters,
                program,
                args,
                env,
                timeout_ms,
                max_output_bytes,
                idempotent,
                host,
            } => {
                if host && sandboxes.is_some() {
                    tracing::warn!(
                        tool = %name,
                        "command tool runs on the host (\"host\": true): it is not sandboxed"
                    );
                }
                let config = CommandToolConfig {
                    name,
                    description,
                    parameters,
                    program,
                    args,
                    env: env.into_iter().collect(),
                    timeout: timeout_ms.map(Duration::from_millis),
                    max_output_bytes,
                };
                let tool = CommandTool::new(config)?;
                let tool = match sandboxes.filter(|_| !host) {
                    Some(sandboxes) => tool.in_sandbox(sandboxes.clone()),
                    None => tool,
                };
                (Arc::new(tool), idempotent)
            }
        };
        Ok(if idempotent {
            Arc::new(Idempotent(tool))
        } else {
            tool
        })
    }
}

/// Why a command tool may not run (see [`ToolDefinition::host_refusal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostRefusal {
    /// It says `"host": true` and host commands are not allowed.
    #[error(
        "\"host\": true runs it on the host without isolation, which is not allowed here: start \
         the server with `--allow-host-commands`, or drop \"host\" to run it in the sandbox"
    )]
    HostFlag,
    /// There is no sandbox to run it in and host commands are not allowed.
    #[error(
        "command tools run in the sandbox, and there is none: start the server with `--sandbox \
         native` (or `--sandbox local`, no isolation), or let them run on the host with \
         `--allow-host-commands`"
    )]
    NoSandbox,
}

impl HostRefusal {
    /// The stable error code of the HTTP API.
    pub fn code(self) -> &'static str {
        match self {
            Self::HostFlag => "host_commands_refused",
            Self::NoSandbox => "sandbox_required",
        }
    }
}

/// Reads a JSON array of tool definitions from a file.
pub fn load_definitions(path: &Path) -> Result<Vec<ToolDefinition>, ToolError> {
    let text = std::fs::read_to_string(path).map_err(|error| {
        ToolError::Registration(format!("cannot read {}: {error}", path.display()))
    })?;
    serde_json::from_str(&text).map_err(|error| {
        ToolError::Registration(format!(
            "{} is not a JSON array of tool definitions: {error}",
            path.display()
        ))
    })
}

/// Marks a configured tool as idempotent.
struct Idempotent(Arc<dyn Tool>);

impl Tool for Idempotent {
    fn spec(&self) -> &ToolSpec {
        self.0.spec()
    }

    fn timeout(&self) -> Option<Duration> {
        self.0.timeout()
    }

    fn idempotent(&self) -> bool {
        true
    }

    fn call(
        &self,
        arguments: Value,
        context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        self.0.call(arguments, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::StaticSecrets;

    fn http_client() -> reqwest::Client {
        agentry_llm::http_client(Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn definitions_parse_with_defaults_and_build() {
        let definitions: Vec<ToolDefinition> = serde_json::from_value(json!([
            {"kind": "http", "name": "search", "url": "https://wiki.example/api",
             "headers": {"authorization": {"secret": "TOKEN"}, "x-client": "agentry"},
             "timeout_ms": 1500},
            {"kind": "command", "name": "count", "program": "wc", "args": ["-w"], "idempotent": true}
        ]))
        .unwrap();
        assert_eq!(definitions[0].name(), "search");
        let secrets: Arc<dyn SecretResolver> = Arc::new(StaticSecrets(
            [("TOKEN".to_owned(), "t0k3n".to_owned())].into(),
        ));
        let tools: Vec<Arc<dyn Tool>> = definitions
            .into_iter()
            .map(|d| {
                d.build_in(&http_client(), Arc::clone(&secrets), None, true)
                    .unwrap()
            })
            .collect();
        assert_eq!(tools[0].timeout(), Some(Duration::from_millis(1500)));
        assert!(!tools[0].idempotent());
        assert!(tools[1].idempotent());
        assert_eq!(tools[1].spec().parameters["type"], "object");
    }

    #[test]
    fn command_tools_never_run_on_the_host_unless_allowed() {
        let plain: ToolDefinition =
            serde_json::from_value(json!({"kind": "command", "name": "c", "program": "true"}))
                .unwrap();
        let host: ToolDefinition = serde_json::from_value(
            json!({"kind": "command", "name": "h", "program": "true", "host": true}),
        )
        .unwrap();
        let http: ToolDefinition =
            serde_json::from_value(json!({"kind": "http", "name": "w", "url": "https://h/"}))
                .unwrap();
        // (sandbox, allow_host) → refusal
        assert_eq!(
            plain.host_refusal(false, false),
            Some(HostRefusal::NoSandbox)
        );
        assert_eq!(plain.host_refusal(true, false), None);
        assert_eq!(plain.host_refusal(false, true), None);
        assert_eq!(host.host_refusal(true, false), Some(HostRefusal::HostFlag));
        assert_eq!(host.host_refusal(false, false), Some(HostRefusal::HostFlag));
        assert_eq!(host.host_refusal(true, true), None);
        assert_eq!(http.host_refusal(false, false), None);
        // Building refuses, naming the setting.
        let error = plain
            .clone()
            .build(&http_client(), Arc::new(StaticSecrets::default()))
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("--sandbox native"), "{error}");
        assert!(error.contains("--allow-host-commands"), "{error}");
        let error = host
            .clone()
            .build_in(
                &http_client(),
                Arc::new(StaticSecrets::default()),
                None,
                false,
            )
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("--allow-host-commands"), "{error}");
        assert!(
            plain
                .build_in(
                    &http_client(),
                    Arc::new(StaticSecrets::default()),
                    None,
                    true
                )
                .is_ok()
        );
    }

    #[test]
    fn bad_definitions_are_clear_errors() {
        let unknown_kind =
            serde_json::from_value::<ToolDefinition>(json!({"kind": "ftp", "name": "x"}));
        assert!(unknown_kind.is_err());
        let missing_secret = serde_json::from_value::<ToolDefinition>(json!(
            {"kind": "http", "name": "s", "url": "https://h/", "headers": {"a": {"secret": "NOPE"}}}
        ))
        .unwrap()
        .build(&http_client(), Arc::new(StaticSecrets::default()));
        let error = missing_secret.err().unwrap().to_string();
        assert!(error.contains("NOPE"), "{error}");
        let bad_url = serde_json::from_value::<ToolDefinition>(json!(
            {"kind": "http", "name": "s", "url": "file:///etc/passwd"}
        ))
        .unwrap()
        .build(&http_client(), Arc::new(StaticSecrets::default()));
        assert!(bad_url.is_err());
    }
}
