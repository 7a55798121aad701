//! Tools: the contract every tool implements, and the registry that validates and runs them.
//!
//! A tool has a [`ToolSpec`] (name, description, JSON Schema of its arguments) and an async
//! `call`. The registry validates arguments against the schema before a call, so a tool only
//! ever sees arguments that match it; a validation failure, a tool error or a timeout goes back
//! to the model as an error result it can correct, and the run goes on.
//!
//! Here: the [`Tool`] trait and what it is given and returns, the [`ToolRegistry`], shaping of
//! results for the model ([`result`]), risk classes ([`risk`]) and [`FunctionTool`] (a tool made
//! of an async function). The built-in tools (files, search, fetch, shell, HTTP and command
//! tools, `delegate` and `talk_to`) are in the `agentry-tools` crate.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agentry_types::{RunId, SessionId, ToolResultPart, ToolSpec};
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

/// What a tool is given besides its arguments.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The id of the call being answered.
    pub call_id: String,
    /// The run's working directory for file and command tools (a skill's folder once one is
    /// selected). A value passed down: nothing ever changes the process's directory.
    pub working_dir: Option<PathBuf>,
    /// The root of the run's workspace: the only folder the workspace tools (`read_file`,
    /// `write_file`, …) may touch. `None` when the run has no workspace; those tools then fail.
    pub workspace: Option<PathBuf>,
    /// Cancelled when the run is cancelled or the call times out; long tools should watch it.
    pub cancel: CancellationToken,
    /// The calling run (`None` outside a run): what tools that start sub-runs (`delegate`,
    /// `talk_to`) need to know about their caller.
    pub caller: Option<Arc<CallerInfo>>,
    /// The calling run's event stream, for live progress a tool reports (a sub-run's events as
    /// [`RunEvent::Nested`](agentry_types::RunEvent::Nested)). `None` outside a run.
    pub events: Option<crate::events::EventSink>,
    /// Narrowings of the `fetch` tool's network policy for this run (the saved agent's
    /// `network`, a delegating run's): a host must pass each of them as well as the tool's own
    /// policy. Empty: the tool's policy alone.
    pub network: Vec<NetworkPolicy>,
}

/// The run a tool call belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct CallerInfo {
    /// The run.
    pub run_id: RunId,
    /// Its session, for a run in a session.
    pub session: Option<SessionId>,
    /// Its model.
    pub model: String,
    /// The tools offered to it (names, descriptions, schemas).
    pub tools: Vec<ToolSpec>,
    /// The saved agent it runs as, if any.
    pub agent_id: Option<String>,
    /// Which of its tool calls wait for a person's approval: a sub-agent given its tools is held
    /// to the same policy.
    pub approvals: crate::approval::ApprovalPolicy,
    /// Its narrowings of the `fetch` tool's network policy: a sub-agent given its tools is held
    /// to them too.
    pub network: Vec<NetworkPolicy>,
    /// What its caller may use (`None`: everything): a sub-agent it starts is held to it.
    pub grant: Option<crate::access::Grant>,
}

impl ToolContext {
    /// A context for a direct call outside any run.
    pub fn detached(call_id: impl Into<String>) -> Self {
        Self {
            call_id: call_id.into(),
            working_dir: None,
            workspace: None,
            cancel: CancellationToken::new(),
            caller: None,
            events: None,
            network: Vec::new(),
        }
    }

    /// Sets the workspace root.
    #[must_use]
    pub fn with_workspace(mut self, workspace: impl Into<PathBuf>) -> Self {
        self.workspace = Some(workspace.into());
        self
    }
}

/// What a tool returns.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// Text, JSON and images, in order.
    pub content: Vec<ToolResultPart>,
    /// A change to the run's state the tool asks for.
    pub effect: Option<ToolEffect>,
    /// Whether the tool reports a failure through this content (an MCP result with
    /// `isError`): the model sees the content as an error it may correct.
    pub is_error: bool,
}

impl ToolOutput {
    /// A text result.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            content: vec![ToolResultPart::Text { text: text.into() }],
            effect: None,
            is_error: false,
        }
    }

    /// A JSON result.
    pub fn json(value: serde_json::Value) -> Self {
        Self {
            content: vec![ToolResultPart::Json { value }],
            effect: None,
            is_error: false,
        }
    }

    /// A result made of these parts; `is_error` marks it as a failure the tool reports itself.
    pub fn parts(content: Vec<ToolResultPart>, is_error: bool) -> Self {
        Self {
            content,
            effect: None,
            is_error,
        }
    }

    /// Adds an effect.
    pub fn with_effect(mut self, effect: ToolEffect) -> Self {
        self.effect = Some(effect);
        self
    }
}

/// A change to the run a tool may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEffect {
    /// Use this folder as the working directory for the rest of the run (skills).
    SetWorkingDir(PathBuf),
}

/// Why a tool call did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// No tool has this name.
    #[error("no tool is named {0:?}")]
    NotFound(String),
    /// The arguments do not match the tool's schema.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The tool ran and failed.
    #[error("{0}")]
    Failed(String),
    /// The tool ran past its timeout.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// The run was cancelled while the tool ran.
    #[error("cancelled")]
    Cancelled,
    /// The tool cannot be registered (duplicate name, invalid schema or name).
    #[error("cannot register tool: {0}")]
    Registration(String),
}

/// A tool the model (or a caller, directly) can run.
pub trait Tool: Send + Sync + 'static {
    /// Name, description and argument schema.
    fn spec(&self) -> &ToolSpec;

    /// This tool's timeout, overriding the run's default.
    fn timeout(&self) -> Option<Duration> {
        None
    }

    /// Whether running it twice with the same arguments is harmless (crash recovery re-runs only
    /// such tools).
    fn idempotent(&self) -> bool {
        false
    }

    /// What the tool can do (default: read-only, confined). Approvals by risk class and the
    /// tool listings use it.
    fn risk(&self) -> ToolRisk {
        ToolRisk::default()
    }

    /// Runs the tool. Arguments have already been validated against the schema.
    fn call(
        &self,
        arguments: serde_json::Value,
        context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>>;
}

pub use crate::network::{MAX_ALLOW_ENTRIES, NetworkPolicy, NetworkPolicyError};

pub mod function;
pub mod registry;
pub mod result;
pub mod risk;

pub use function::{FunctionTool, arguments_schema};
pub use registry::{
    ALL_TOOLS, CANCEL_GRACE, TOOL_NAME_RULE, ToolRegistry, is_valid_tool_name, names_all_tools,
};
pub use result::{
    DEFAULT_RESULT_LIMIT, ResultFormat, decode_cut_utf8, format_output, result_for_model,
    truncate_on_char_boundary, truncation_note,
};
pub use risk::{ApprovalDefaults, RiskClass, ToolRisk};
