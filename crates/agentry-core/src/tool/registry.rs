//! The tool registry: the set of tools a run (or a direct call) can use.
//!
//! Registering a tool checks its name and compiles its argument schema once; every call is then
//! validated against that compiled schema before the tool runs, and run under a timeout and the
//! caller's cancellation token. Validation errors are written for the model: each names the JSON
//! pointer of the offending value, so the model can correct its call.

use std::collections::BTreeMap;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use agentry_types::ToolSpec;
use futures::FutureExt as _;
use serde_json::Value;

use super::result::{ResultFormat, format_output, truncate_on_char_boundary};
use super::{Tool, ToolContext, ToolError, ToolOutput};

/// What a valid tool name looks like, for error messages.
pub const TOOL_NAME_RULE: &str = "1 to 64 characters, each a letter, digit, '_' or '-'";

/// The longest tool name every provider accepts.
const TOOL_NAME_MAX_LEN: usize = 64;

/// At most this many schema errors are listed for one call; the rest are counted.
const MAX_LISTED_ERRORS: usize = 20;

/// How long a cancelled or timed-out tool may take to wind down before it is dropped.
pub const CANCEL_GRACE: Duration = Duration::from_millis(250);

/// A single schema error line is cut to this many bytes (it may quote a large value).
const MAX_ERROR_LINE: usize = 300;

/// The tool name that stands for every registered tool in a list of tool names: a run, an agent
/// or a sub-agent is offered only the tools it names, and all of them only when it names this.
pub const ALL_TOOLS: &str = "*";

/// Whether a list of tool names asks for every tool ([`ALL_TOOLS`]).
pub fn names_all_tools(names: &[String]) -> bool {
    names.iter().any(|name| name == ALL_TOOLS)
}

/// Whether `name` is a valid tool name: 1–64 characters of `[A-Za-z0-9_-]`, which every provider
/// accepts. Skill and template names follow the same rule.
pub fn is_valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= TOOL_NAME_MAX_LEN
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || byte == b'_' || byte == b'-')
}

/// One registered tool with its compiled argument schema.
#[derive(Clone)]
struct Entry {
    tool: Arc<dyn Tool>,
    validator: Arc<jsonschema::Validator>,
}

/// The tools available to a run, by name.
///
/// Cloning is cheap (the table is shared); registering into a clone copies the table first, so
/// clones never see each other's later registrations.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    entries: Arc<BTreeMap<String, Entry>>,
}

impl fmt::Debug for ToolRegistry {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("ToolRegistry")
            .field("tools", &self.entries.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a tool.
    ///
    /// Fails with [`ToolError::Registration`] when the name is invalid or already taken, or the
    /// argument schema does not compile or does not describe an object.
    pub fn register(&mut self, tool: impl Tool) -> Result<(), ToolError> {
        self.register_arc(Arc::new(tool))
    }

    /// Registers a shared tool; see [`register`](Self::register).
    pub fn register_arc(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolError> {
        let spec = tool.spec();
        let name = spec.name.clone();
        if !is_valid_tool_name(&name) {
            return Err(ToolError::Registration(format!(
                "invalid tool name {name:?}: a name is {TOOL_NAME_RULE}"
            )));
        }
        if self.entries.contains_key(&name) {
            return Err(ToolError::Registration(format!(
                "a tool named {name:?} is already registered"
            )));
        }
        let validator = compile_schema(&name, &spec.parameters)?;
        Arc::make_mut(&mut self.entries).insert(
            name,
            Entry {
                tool,
                validator: Arc::new(validator),
            },
        );
        Ok(())
    }

    /// The tool with this name.
    pub fn get(&self, name: &str) -> Option<Arc<dyn Tool>> {
        self.entries.get(name).map(|entry| Arc::clone(&entry.tool))
    }

    /// Whether a tool has this name.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The specs of every tool, sorted by name (what the model is told).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.entries
            .values()
            .map(|entry| entry.tool.spec().clone())
            .collect()
    }

    /// The names of every tool, sorted.
    pub fn names(&self) -> Vec<String> {
        self.entries.keys().cloned().collect()
    }

    /// How many tools are registered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no tool is registered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A registry holding only the named tools (for example the CLI's `--tool NAME`s);
    /// [`ALL_TOOLS`] (`"*"`) among the names stands for every tool.
    ///
    /// Fails with [`ToolError::NotFound`] for the first name no tool has.
    pub fn subset(&self, names: &[String]) -> Result<ToolRegistry, ToolError> {
        if names.iter().any(|name| name == ALL_TOOLS) {
            return Ok(self.clone());
        }
        let mut entries = BTreeMap::new();
        for name in names {
            let entry = self
                .entries
                .get(name)
                .ok_or_else(|| ToolError::NotFound(name.clone()))?;
            entries.insert(name.clone(), entry.clone());
        }
        Ok(ToolRegistry {
            entries: Arc::new(entries),
        })
    }

    /// Checks arguments against the named tool's schema.
    ///
    /// Fails with [`ToolError::NotFound`] for an unknown tool, and with
    /// [`ToolError::InvalidArguments`] listing every schema error, each prefixed with the JSON
    /// pointer of the value at fault, for example
    /// `"/city": 5 is not of type "string"; (root): "units" is a required property`.
    pub fn validate(&self, name: &str, arguments: &Value) -> Result<(), ToolError> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| ToolError::NotFound(name.to_owned()))?;
        let mut lines = Vec::new();
        let mut total = 0_usize;
        for error in entry.validator.iter_errors(arguments) {
            total += 1;
            if lines.len() < MAX_LISTED_ERRORS {
                let line = format!("{}: {error}", pointer_label(error.instance_path().as_str()));
                lines.push(cut_line(line));
            }
        }
        if total == 0 {
            return Ok(());
        }
        let mut message = lines.join("; ");
        if total > lines.len() {
            message.push_str(&format!("; and {} more", total - lines.len()));
        }
        Err(ToolError::InvalidArguments(message))
    }

    /// Validates the arguments, then runs the named tool.
    ///
    /// The call runs under the tool's own timeout, or `default_timeout` when it has none
    /// ([`ToolError::Timeout`]), and ends with [`ToolError::Cancelled`] when `context.cancel`
    /// is cancelled while it runs. The tool is given a child of `context.cancel`; on timeout or
    /// cancellation that token is cancelled and the tool gets at most [`CANCEL_GRACE`] to wind
    /// down before it is dropped. The caller's token is never cancelled here. A tool that panics
    /// yields [`ToolError::Failed`].
    pub async fn invoke(
        &self,
        name: &str,
        arguments: Value,
        context: ToolContext,
        default_timeout: Duration,
    ) -> Result<ToolOutput, ToolError> {
        self.validate(name, &arguments)?;
        let tool = self
            .get(name)
            .ok_or_else(|| ToolError::NotFound(name.to_owned()))?;
        let limit = tool.timeout().unwrap_or(default_timeout);
        let caller_cancel = context.cancel.clone();
        if caller_cancel.is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        let call_cancel = caller_cancel.child_token();
        let context = ToolContext {
            cancel: call_cancel.clone(),
            ..context
        };
        let started = std::panic::catch_unwind(AssertUnwindSafe(|| tool.call(arguments, context)));
        let future = match started {
            Ok(future) => future,
            Err(_) => return Err(panicked(name)),
        };
        let mut guarded = std::pin::pin!(AssertUnwindSafe(future).catch_unwind());
        let stop = tokio::select! {
            biased;
            () = caller_cancel.cancelled() => ToolError::Cancelled,
            () = tokio::time::sleep(limit) => ToolError::Timeout(limit),
            outcome = &mut guarded => return outcome.unwrap_or_else(|_| Err(panicked(name))),
        };
        // Tell the tool to stop, and give one that watches its token a moment to wind down
        // (close a connection, kill a child) before it is dropped.
        call_cancel.cancel();
        let _ = tokio::time::timeout(CANCEL_GRACE, &mut guarded).await;
        Err(stop)
    }

    /// Runs a tool directly, without a model: validates, invokes it with a detached context and
    /// the given timeout, and formats the result (see [`format_output`]).
    pub async fn call_direct(
        &self,
        name: &str,
        arguments: Value,
        format: ResultFormat,
        timeout: Duration,
    ) -> Result<Value, ToolError> {
        let context = ToolContext::detached("direct");
        let output = self.invoke(name, arguments, context, timeout).await?;
        format_output(&output, format)
    }
}

/// Compiles a tool's argument schema, requiring an object at the top level.
fn compile_schema(name: &str, schema: &Value) -> Result<jsonschema::Validator, ToolError> {
    let Some(object) = schema.as_object() else {
        return Err(ToolError::Registration(format!(
            "the parameters of tool {name:?} must be a JSON Schema object"
        )));
    };
    if object.get("type").and_then(Value::as_str) != Some("object") {
        return Err(ToolError::Registration(format!(
            "the parameters schema of tool {name:?} must have \"type\": \"object\" at the top level"
        )));
    }
    jsonschema::validator_for(schema).map_err(|error| {
        ToolError::Registration(format!(
            "the parameters schema of tool {name:?} is invalid: {}",
            cut_line(error.to_string())
        ))
    })
}

/// How an instance location is shown: the JSON pointer in quotes, `(root)` for the whole object.
fn pointer_label(pointer: &str) -> String {
    if pointer.is_empty() {
        "(root)".to_owned()
    } else {
        format!("{pointer:?}")
    }
}

/// Cuts an over-long error line.
fn cut_line(line: String) -> String {
    if line.len() <= MAX_ERROR_LINE {
        return line;
    }
    let mut cut = truncate_on_char_boundary(&line, MAX_ERROR_LINE).to_owned();
    cut.push('…');
    cut
}

fn panicked(name: &str) -> ToolError {
    ToolError::Failed(format!("the tool {name:?} crashed (it panicked)"))
}
