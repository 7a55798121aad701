//! Agentry as an MCP server: each saved agent is a tool, `ask_<agent id>`, that takes a message
//! and returns the agent's final answer, with a progress notification for each step of the run
//! (run started, each model round, each tool call started and finished). With
//! [`App::mcp_expose_tools`] the runtime's registered tools are offered too, under their own
//! names, called through [`agentry_core::Runtime::call_tool`].
//!
//! [`McpServer`] is the backend `agentry-mcp` serves, over streamable HTTP (`/mcp` in the HTTP
//! API) and over stdio (`agentry mcp serve`).
//!
//! An agent call runs exactly like `POST /v1/infer` with `agent_ids: [id]` (the same
//! preparation, [`crate::runs::prepare`]), always in a session: a new one unless the call names
//! one (`session_id`), so the answer's `session_id` continues the conversation. The run belongs
//! to the app: a client cancelling the request (or dropping a one-shot stateless request)
//! cancels it, an app shutting down leaves it to start-up recovery.

use futures::FutureExt as _;
use futures::StreamExt as _;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use agentry_core::Input;
use agentry_core::session::BusyPolicy;
use agentry_core::tool::{ResultFormat, ToolError};
use agentry_mcp::server::{
    BackendError, McpBackend, ProgressSink, ServedResult, ServedTool, ServerIdentity,
};
use agentry_types::{AssistantPart, RunEvent, RunId, RunStopReason, SessionEvent, SessionId};

use crate::App;
use crate::agents::AgentConfig;
use crate::auth::Principal;
use crate::config::ConfigRepo;
use crate::error::{AppError, Failure};
use crate::runs::{RunSpec, SessionChoice, Target, prepare};

/// The longest message an agent tool accepts, in bytes (the HTTP API's body limit).
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The prefix of an agent's tool name: the agent `timekeeper` is the tool `ask_timekeeper`.
pub const AGENT_TOOL_PREFIX: &str = "ask_";

/// How much of an agent's system prompt its tool description quotes.
const DESCRIBED_PROMPT_CHARS: usize = 400;

/// What the server tells clients in its `initialize` result.
const INSTRUCTIONS: &str = "Each tool named ask_<agent> hands a message to one of this Agentry \
server's agents, which works on it (calling its own model and tools) and returns its final \
answer. Pass the session_id of an answer back to continue that conversation; omit it to start \
a new one. Other tools, when offered, are the server's registered tools, called directly.";

/// The tool name of an agent.
pub fn agent_tool_name(agent_id: &str) -> String {
    format!("{AGENT_TOOL_PREFIX}{agent_id}")
}

/// Who Agentry says it is as an MCP server.
pub fn identity() -> ServerIdentity {
    ServerIdentity {
        name: "agentry".into(),
        version: env!("CARGO_PKG_VERSION").into(),
        instructions: Some(INSTRUCTIONS.into()),
    }
}

/// The backend of Agentry's MCP server: the saved agents, and the registered tools when
/// [`App::mcp_expose_tools`] is set.
#[derive(Clone)]
pub struct McpServer {
    app: App,
}

impl McpServer {
    /// A backend over `app`.
    pub fn new(app: App) -> Self {
        Self { app }
    }

    /// The saved agents, by id, skipping (and logging) any that cannot be read.
    async fn agents(&self) -> Result<Vec<AgentConfig>, BackendError> {
        Ok(ConfigRepo::new(&self.app.parts.store)
            .list()
            .await
            .map_err(internal)?
            .into_iter()
            .map(|(_, agent)| agent)
            .collect())
    }

    async fn list(&self) -> Result<Vec<ServedTool>, BackendError> {
        let agents = self.agents().await?;
        let mut tools: Vec<ServedTool> = agents.iter().map(agent_tool).collect();
        if self.app.parts.mcp_expose_tools {
            let runtime = self.app.parts.sessions.runtime();
            for spec in runtime.tools().specs() {
                if tools.iter().any(|tool| tool.name == spec.name) {
                    tracing::warn!(
                        tool = %spec.name,
                        "a registered tool has the name of an agent's tool; the agent's is offered"
                    );
                    continue;
                }
                tools.push(ServedTool {
                    name: spec.name,
                    title: None,
                    description: spec.description,
                    input_schema: spec.parameters,
                    output_schema: None,
                });
            }
        }
        Ok(tools)
    }

    async fn call(
        &self,
        name: String,
        arguments: Value,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> Result<ServedResult, BackendError> {
        if let Some(agent_id) = name.strip_prefix(AGENT_TOOL_PREFIX)
            && let Some(agent) = crate::agents::stored_agent(&self.app.parts.store, agent_id)
                .await
                .map_err(internal)?
        {
            let call = AgentCall::parse(&arguments)?;
            return self.ask(agent, call, progress, cancel).await;
        }
        if self.app.parts.mcp_expose_tools
            && self.app.parts.sessions.runtime().tools().contains(&name)
        {
            return self.call_registered(&name, arguments, cancel).await;
        }
        Err(BackendError::UnknownTool(name))
    }

    /// Calls a registered tool directly, as `POST /v1/tools/{name}/call` does.
    async fn call_registered(
        &self,
        name: &str,
        arguments: Value,
        cancel: CancellationToken,
    ) -> Result<ServedResult, BackendError> {
        let runtime = self.app.parts.sessions.runtime();
        let outcome = tokio::select! {
            outcome = runtime.call_tool(name, arguments, ResultFormat::Text) => outcome,
            () = cancel.cancelled() => return Ok(ServedResult::error("the call was cancelled")),
        };
        match outcome {
            Ok(Value::String(text)) => Ok(ServedResult::text(text)),
            Ok(other) => Ok(ServedResult::text(other.to_string())),
            Err(ToolError::NotFound(name)) => Err(BackendError::UnknownTool(name)),
            Err(ToolError::InvalidArguments(message)) => {
                Err(BackendError::InvalidArguments(message))
            }
            Err(error) => Ok(ServedResult::error(format!("the tool failed: {error}"))),
        }
    }

    /// Runs `agent` on the call's message, reporting progress, and returns its answer.
    async fn ask(
        &self,
        agent: AgentConfig,
        call: AgentCall,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> Result<ServedResult, BackendError> {
        let app = &self.app;
        let session = match call.session_id.as_deref() {
            None => SessionChoice::New,
            Some(id) => match SessionId::parse(id) {
                Ok(id) => SessionChoice::Existing(id),
                Err(error) => return refused(AppError::bad_request(error.to_string())),
            },
        };
        let input = RunSpec {
            agent_id: Some(agent.id.clone()),
            input: Some(Input::Text { text: call.message }),
            session,
            ..RunSpec::default()
        };
        let (target, request) = match prepare(app, &Principal::operator(), input).await {
            Ok(prepared) => prepared,
            Err(error) => return refused(error),
        };
        let Target::Session(session) = target else {
            return Err(BackendError::Internal(
                "an agent call was prepared without a session".into(),
            ));
        };
        let mut events = match app
            .start_followed(session, request, BusyPolicy::Reject)
            .await
        {
            Ok(events) => events,
            Err(error) => return refused(error),
        };
        let mut run_id: Option<RunId> = None;
        let end = loop {
            let received = tokio::select! {
                received = events.next() => received,
                () = cancel.cancelled() => {
                    if app.parts.shutdown.is_cancelled() {
                        // The run stays in flight; the next start resumes it.
                        return Ok(ServedResult::error(format!(
                            "the server is shutting down; the run goes on in session {session}"
                        )));
                    }
                    app.parts.hub.cancel(session);
                    return Ok(ServedResult::error("the call was cancelled; so was the run"));
                }
            };
            match received {
                Some(Ok(event)) => {
                    if event.is_terminal() {
                        break Some(event);
                    }
                    if let RunEvent::Committed { event, .. } = event.as_ref() {
                        if let SessionEvent::RunStarted { run_id: id, .. } = event {
                            run_id = Some(*id);
                        }
                        if let Some(message) = step_message(&agent.id, event) {
                            progress.report(message).await;
                        }
                    }
                }
                Some(Err(error)) => return refused(error),
                None => break None,
            }
        };
        let Some(end) = end else {
            return Err(BackendError::Internal(
                "the run ended without a final event".into(),
            ));
        };
        Ok(answer(session, run_id, &end))
    }
}

impl McpBackend for McpServer {
    fn list_tools(&self) -> BoxFuture<'_, Result<Vec<ServedTool>, BackendError>> {
        self.list().boxed()
    }

    fn call_tool(
        &self,
        name: String,
        arguments: Value,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ServedResult, BackendError>> {
        self.call(name, arguments, progress, cancel).boxed()
    }
}

fn internal(error: impl std::fmt::Display) -> BackendError {
    BackendError::Internal(error.to_string())
}

/// A call the app refuses: the caller's problem (an error result its model can act on) or the
/// app's own (a protocol error).
fn refused(error: AppError) -> Result<ServedResult, BackendError> {
    if matches!(
        error.failure,
        Failure::Internal
            | Failure::Upstream
            | Failure::Unavailable
            | Failure::Timeout
            | Failure::StorageFull
    ) {
        return Err(internal(error));
    }
    Ok(ServedResult::error(format!(
        "{}: {}",
        error.code, error.message
    )))
}

/// The arguments of an agent's tool.
#[derive(Debug)]
struct AgentCall {
    message: String,
    session_id: Option<String>,
}

impl AgentCall {
    /// Checks the arguments: `message` a non-empty string, `session_id` an optional session
    /// id string, nothing else.
    fn parse(arguments: &Value) -> Result<Self, BackendError> {
        let invalid = |message: String| Err(BackendError::InvalidArguments(message));
        let Some(object) = arguments.as_object() else {
            return invalid(format!("the arguments must be an object, not {arguments}"));
        };
        if let Some(unknown) = object
            .keys()
            .find(|key| !matches!(key.as_str(), "message" | "session_id"))
        {
            return invalid(format!(
                "unknown argument {unknown:?} (expected `message` and optionally `session_id`)"
            ));
        }
        let message = match object.get("message") {
            Some(Value::String(text)) if !text.trim().is_empty() => text.clone(),
            Some(Value::String(_)) => return invalid("`message` is empty".into()),
            Some(other) => {
                return invalid(format!("`message` must be a string, not {}", kind(other)));
            }
            None => return invalid("`message` (a string) is required".into()),
        };
        if message.len() > MAX_MESSAGE_BYTES {
            return invalid(format!(
                "`message` is too long ({} bytes; at most {MAX_MESSAGE_BYTES})",
                message.len()
            ));
        }
        let session_id = match object.get("session_id") {
            None | Some(Value::Null) => None,
            Some(Value::String(id)) => match SessionId::parse(id) {
                Ok(id) => Some(id.to_string()),
                Err(error) => return invalid(format!("`session_id`: {error}")),
            },
            Some(other) => {
                return invalid(format!(
                    "`session_id` must be a string, not {}",
                    kind(other)
                ));
            }
        };
        Ok(Self {
            message,
            session_id,
        })
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The tool offered for an agent.
fn agent_tool(agent: &AgentConfig) -> ServedTool {
    let name = agent.nickname.as_deref().unwrap_or(&agent.id);
    let mut description = format!("Ask the agent {name} (`{}`)", agent.id);
    if let Some(system) = agent.system.as_deref().map(str::trim)
        && !system.is_empty()
    {
        let quoted: String = system.chars().take(DESCRIBED_PROMPT_CHARS).collect();
        let ellipsis = if quoted.len() < system.len() {
            "…"
        } else {
            ""
        };
        description.push_str(&format!(", whose instructions are: \"{quoted}{ellipsis}\""));
    }
    description.push_str(&format!(
        ". It works on your message with its model ({})",
        agent.model_id
    ));
    if !agent.tool_ids.is_empty() {
        description.push_str(&format!(" and tools ({})", agent.tool_ids.join(", ")));
    }
    description.push_str(
        " and returns its final answer. Pass the answer's session_id to continue the conversation.",
    );
    ServedTool {
        name: agent_tool_name(&agent.id),
        title: Some(name.to_owned()),
        description,
        input_schema: agent_input_schema(),
        output_schema: Some(agent_output_schema()),
    }
}

fn agent_input_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "message": {
                "type": "string",
                "minLength": 1,
                "description": "What to ask or tell the agent."
            },
            "session_id": {
                "type": "string",
                "description": "The session_id of an earlier answer, to continue that \
                                conversation; omit it to start a new one."
            }
        },
        "required": ["message"],
        "additionalProperties": false
    })
}

fn agent_output_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "answer": {"type": "string", "description": "The agent's final answer."},
            "session_id": {"type": "string", "description": "The conversation, to continue it."},
            "run_id": {"type": ["string", "null"]},
            "stop_reason": {"type": "string"},
            "rounds": {"type": "integer", "minimum": 0}
        },
        "required": ["answer", "session_id", "stop_reason"]
    })
}

/// The progress message for a committed step of the run, if it is one worth reporting.
fn step_message(agent: &str, event: &SessionEvent) -> Option<String> {
    Some(match event {
        SessionEvent::RunStarted { model, .. } => {
            format!("agent {agent} started on model {model}")
        }
        SessionEvent::AssistantMessage { round, content, .. } => {
            let calls = content
                .iter()
                .filter(|part| matches!(part, AssistantPart::ToolCall(_)))
                .count();
            match calls {
                0 => format!("model round {round}: answered"),
                1 => format!("model round {round}: asked for 1 tool call"),
                n => format!("model round {round}: asked for {n} tool calls"),
            }
        }
        SessionEvent::ContextCompacted {
            tokens_before,
            tokens_after,
            ..
        } => format!("context compacted from {tokens_before} to {tokens_after} tokens"),
        SessionEvent::ToolCallIntent { call, .. } => format!("tool {} started", call.name),
        SessionEvent::ToolCallResult {
            result,
            duration_ms,
            ..
        } => {
            let name = result.name.as_deref().unwrap_or("call");
            let outcome = if result.is_error {
                "failed"
            } else {
                "finished"
            };
            format!("tool {name} {outcome} in {duration_ms} ms")
        }
        SessionEvent::ApprovalRequested { call, .. } => {
            format!("tool {} waits for approval", call.name)
        }
        SessionEvent::Message { .. }
        | SessionEvent::RunFinished { .. }
        | SessionEvent::ApprovalDecided { .. }
        | SessionEvent::RunPaused { .. }
        | SessionEvent::RunResumed { .. }
        | SessionEvent::Group { .. }
        | SessionEvent::Revoked { .. } => return None,
    })
}

/// The result for the run's final event.
fn answer(session: SessionId, run_id: Option<RunId>, end: &RunEvent) -> ServedResult {
    match end {
        RunEvent::RunFinished {
            stop_reason: RunStopReason::Completed,
            text,
            rounds,
            ..
        } => {
            let mut structured = Map::new();
            structured.insert("answer".into(), json!(text));
            structured.insert("session_id".into(), json!(session));
            structured.insert("run_id".into(), json!(run_id));
            structured.insert("stop_reason".into(), json!("completed"));
            structured.insert("rounds".into(), json!(rounds));
            ServedResult::text(text.clone()).with_structured(Value::Object(structured))
        }
        RunEvent::RunFinished {
            stop_reason, text, ..
        } => {
            let mut message = format!(
                "the agent stopped before finishing ({}) in session {session}",
                stop_reason.as_str()
            );
            if !text.is_empty() {
                message.push_str(&format!("; its last words: {text}"));
            }
            ServedResult::error(message)
        }
        RunEvent::RunFailed { error, .. } => ServedResult::error(format!(
            "the run failed ({}): {} (session {session})",
            error.code.as_str(),
            error.message
        )),
        RunEvent::RunSuspended { run_id, status, .. } => ServedResult::error(format!(
            "the run {run_id} is {} in session {session}; decide with \
             POST /v1/runs/{run_id}/approvals or resume with POST /v1/runs/{run_id}/resume",
            status.as_str()
        )),
        _ => ServedResult::error("the run ended unexpectedly"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_error(arguments: Value) -> String {
        match AgentCall::parse(&arguments) {
            Err(BackendError::InvalidArguments(message)) => message,
            other => panic!("expected invalid arguments for {arguments}, got {other:?}"),
        }
    }

    #[test]
    fn agent_arguments_are_validated() {
        let call = AgentCall::parse(&json!({"message": "hi"})).unwrap();
        assert_eq!(call.message, "hi");
        assert!(call.session_id.is_none());
        assert!(parse_error(json!({})).contains("`message` (a string) is required"));
        assert!(parse_error(json!({"message": "  "})).contains("empty"));
        assert!(parse_error(json!({"message": 5})).contains("not a number"));
        assert!(parse_error(json!({"message": "x", "colour": 1})).contains("\"colour\""));
        assert!(parse_error(json!({"message": "x", "session_id": "../x"})).contains("session_id"));
        assert!(parse_error(json!({"message": "x", "session_id": 3})).contains("not a number"));
        assert!(parse_error(json!(["x"])).contains("must be an object"));
    }

    #[test]
    fn agents_are_offered_with_a_clear_name_and_schema() {
        let agent: AgentConfig = serde_json::from_value(json!({
            "id": "timekeeper", "nickname": "Tim", "model_id": "mock",
            "tool_ids": ["current_time"], "system": "You keep time."
        }))
        .unwrap();
        let tool = agent_tool(&agent);
        assert_eq!(tool.name, "ask_timekeeper");
        assert_eq!(tool.title.as_deref(), Some("Tim"));
        assert!(tool.description.contains("You keep time."));
        assert!(tool.description.contains("current_time"));
        assert_eq!(tool.input_schema["required"], json!(["message"]));
    }
}
