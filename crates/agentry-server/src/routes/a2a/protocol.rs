//! A2A, the Agent2Agent protocol (v0.3, JSON-RPC binding): saved agents published with an
//! `a2a` section answer other agents.
//!
//! - The agent card ([`card`]) names the agent, its skills and its endpoint.
//! - `message/send` and `message/stream` start a task; a task **is a background run** (its id
//!   the run's id), so it is durable, queued, fenced and cancellable like any other, and its
//!   context **is the run's session** (`contextId`): a later message with the same `contextId`
//!   continues the conversation.
//! - A run whose tool calls wait for approval is `input-required`: its status message lists the
//!   calls (a `data` part with `pending`), and a message to the same `taskId` decides them
//!   (`approve` / `reject` as text, or a `data` part `{"decisions": [...]}` as
//!   `POST /v1/runs/{run_id}/approvals` takes them).
//! - `tasks/get`, `tasks/cancel` and `tasks/resubscribe` reach a task by id; another caller's
//!   tasks, and tasks of other agents, are not found.
//!
//! Errors are JSON-RPC errors with A2A's codes ([`A2aError`]). The routes parse the envelope
//! ([`parse_rpc`]) and render what this module answers; a task's work is the app's (a
//! background run submitted and followed through [`App`]). What an agent's card says is saved
//! with the agent ([`agentry_app::publication`]).

use std::time::Duration;

use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};

use agentry_app::agents::AgentConfig;
use agentry_app::approvals::DecideBody;
use agentry_app::auth::Principal;
use agentry_app::domain::core::Input;
use agentry_app::domain::store::{RunQuery, RunState};
use agentry_app::follow::FollowFrom;
use agentry_app::hub::Subscription;
use agentry_app::ops::Enqueue;
use agentry_app::queue::RunView;
use agentry_app::runs::{RunSpec, SessionChoice};
use agentry_app::{App, AppError, Failure};
use agentry_types::{RunEvent, RunId, SessionId};

/// The protocol version the cards declare and the endpoint speaks.
pub const PROTOCOL_VERSION: &str = "0.3.0";

/// Where a published agent's card is, under its base (`/a2a/{id}`).
pub const CARD_PATH: &str = "/.well-known/agent-card.json";

/// How long a blocking `message/send` waits for its task to end or to need input.
const BLOCKING_WAIT: Duration = Duration::from_secs(600);

/// How long a stream waits for a queued task to start before it follows it from the log.
const START_WAIT: Duration = Duration::from_secs(30);

/// How often a stream looks for its task's run in this process's hub, and reads its record.
const HUB_POLL: Duration = Duration::from_millis(10);
const RECORD_POLL: Duration = Duration::from_millis(250);

/// The id of the artifact that holds a task's answer.
const ANSWER_ARTIFACT: &str = "answer";

/// A JSON-RPC error with A2A's codes.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct A2aError {
    /// The JSON-RPC error code.
    pub code: i64,
    /// What went wrong.
    pub message: String,
}

impl A2aError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// The body is not JSON (-32700).
    pub fn parse_error(message: impl Into<String>) -> Self {
        Self::new(-32700, message)
    }

    /// Not a JSON-RPC 2.0 request (-32600).
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(-32600, message)
    }

    /// No such method (-32601).
    pub fn method_not_found(method: &str) -> Self {
        Self::new(-32601, format!("no method {method:?}"))
    }

    /// The parameters are wrong (-32602).
    pub fn invalid_params(message: impl Into<String>) -> Self {
        Self::new(-32602, message)
    }

    /// Our failure (-32603).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(-32603, message)
    }

    /// No such task, or not the caller's (-32001).
    pub fn task_not_found(id: &str) -> Self {
        Self::new(-32001, format!("no task {id}"))
    }

    /// The task has ended (-32002).
    pub fn task_not_cancelable(id: &str, state: &str) -> Self {
        Self::new(
            -32002,
            format!("task {id} is {state}: it cannot be cancelled"),
        )
    }

    /// Push notifications are not offered (-32003).
    pub fn push_not_supported() -> Self {
        Self::new(
            -32003,
            "push notifications are not supported: follow a task with `message/stream` or \
             `tasks/resubscribe`, or poll `tasks/get`",
        )
    }

    /// What the request asks cannot be done (-32004).
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(-32004, message)
    }

    /// A part of a kind the agent does not take (-32005).
    pub fn content_type(message: impl Into<String>) -> Self {
        Self::new(-32005, message)
    }

    /// There is no extended card (-32007).
    pub fn no_extended_card() -> Self {
        Self::new(
            -32007,
            "this agent has no authenticated extended card: its card is the whole card",
        )
    }

    /// The error object of a JSON-RPC response.
    pub fn to_json(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }
}

impl From<AppError> for A2aError {
    fn from(error: AppError) -> Self {
        match error.failure {
            Failure::Invalid | Failure::NotFound | Failure::TooLarge => {
                Self::invalid_params(error.message)
            }
            Failure::Conflict | Failure::TooMany | Failure::Forbidden => {
                Self::unsupported(error.message)
            }
            _ => Self::internal(error.message),
        }
    }
}

/// A JSON-RPC request: its id (echoed in the answer), method and parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcRequest {
    /// The request's id (a string, a number or null).
    pub id: Value,
    /// The method.
    pub method: String,
    /// The parameters (an object; `{}` when absent).
    pub params: Value,
}

/// Reads a JSON-RPC 2.0 request; on failure the id to answer with (null when unknown) and the
/// error.
pub fn parse_rpc(body: &[u8]) -> Result<RpcRequest, (Value, A2aError)> {
    let value: Value = serde_json::from_slice(body).map_err(|error| {
        (
            Value::Null,
            A2aError::parse_error(format!("not JSON: {error}")),
        )
    })?;
    let Value::Object(mut object) = value else {
        return Err((
            Value::Null,
            A2aError::invalid_request("a request is one JSON object (batches are not supported)"),
        ));
    };
    let id = object.remove("id").unwrap_or(Value::Null);
    if !matches!(id, Value::String(_) | Value::Number(_) | Value::Null) {
        return Err((
            Value::Null,
            A2aError::invalid_request("`id` is a string, a number or null"),
        ));
    }
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err((id, A2aError::invalid_request("`jsonrpc` must be \"2.0\"")));
    }
    let Some(Value::String(method)) = object.remove("method") else {
        return Err((id, A2aError::invalid_request("`method` is a string")));
    };
    let params = match object.remove("params") {
        None | Some(Value::Null) => json!({}),
        Some(params @ Value::Object(_)) => params,
        Some(_) => {
            return Err((id, A2aError::invalid_params("`params` is an object")));
        }
    };
    Ok(RpcRequest { id, method, params })
}

/// What a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum A2aCall {
    /// `message/send` (`stream: false`) or `message/stream`.
    Send {
        /// The parameters.
        params: Box<SendParams>,
        /// Whether the answer is a stream.
        stream: bool,
    },
    /// `tasks/get`.
    Get {
        /// The task.
        id: String,
        /// How many of its latest messages to include.
        history_length: Option<usize>,
    },
    /// `tasks/cancel`.
    Cancel {
        /// The task.
        id: String,
    },
    /// `tasks/resubscribe`: the task's stream from now on.
    Resubscribe {
        /// The task.
        id: String,
    },
    /// `tasks/list` (1.0's `ListTasks`): the agent's tasks the caller may see, newest first.
    List(ListParams),
}

/// The parameters of `tasks/list`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListParams {
    /// Only the tasks of this conversation.
    #[serde(default)]
    pub context_id: Option<String>,
    /// Only tasks in this state (`submitted`, `working`, `input-required`, `completed`,
    /// `failed`, `canceled`).
    #[serde(default)]
    pub status: Option<String>,
    /// At most this many (1 to 100; default 50).
    #[serde(default)]
    pub page_size: Option<u32>,
    /// Where the previous page ended (its `nextPageToken`).
    #[serde(default)]
    pub page_token: Option<String>,
    /// How many of each task's latest messages to include.
    #[serde(default)]
    pub history_length: Option<usize>,
    /// Only tasks whose status changed at or after this time (RFC 3339).
    #[serde(default)]
    pub status_timestamp_after: Option<String>,
    /// Include each task's artifacts (default: left out).
    #[serde(default)]
    pub include_artifacts: Option<bool>,
    /// A tenant (one per server here: any value names it).
    #[serde(default)]
    pub tenant: Option<String>,
}

/// The most tasks one `tasks/list` page holds, and how many it holds by default.
const LIST_PAGE_MAX: u32 = 100;
const LIST_PAGE_DEFAULT: u32 = 50;
/// The newest tasks a `tasks/list` filtered run by run (by status time, or `working`) reads.
const LIST_READ_MAX: usize = 10_000;

/// The parameters of `message/send` and `message/stream`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendParams {
    /// The message.
    pub message: IncomingMessage,
    /// How to answer.
    #[serde(default)]
    pub configuration: Option<SendConfiguration>,
    /// Free metadata (not used).
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// `configuration` of a send.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendConfiguration {
    /// Wait for the task to end or need input (default); `false`: answer at once.
    #[serde(default)]
    pub blocking: Option<bool>,
    /// How many of the task's latest messages to include.
    #[serde(default)]
    pub history_length: Option<usize>,
    /// The output types the client takes (text is always among them here).
    #[serde(default)]
    pub accepted_output_modes: Option<Vec<String>>,
    /// Push notifications: not supported.
    #[serde(default)]
    pub push_notification_config: Option<Value>,
}

/// A client's message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IncomingMessage {
    /// `user`.
    pub role: String,
    /// Its parts.
    pub parts: Vec<Value>,
    /// The client's id for it.
    pub message_id: String,
    /// The task it answers (one waiting for input).
    #[serde(default)]
    pub task_id: Option<String>,
    /// The conversation it continues.
    #[serde(default)]
    pub context_id: Option<String>,
    /// `message`, when given.
    #[serde(default)]
    pub kind: Option<String>,
}

/// Reads a request's method and parameters.
pub fn call_of(request: &RpcRequest) -> Result<A2aCall, A2aError> {
    let params = request.params.clone();
    let task_id = |params: &Value| -> Result<String, A2aError> {
        match params.get("id") {
            Some(Value::String(id)) if !id.is_empty() && id.len() <= 128 => Ok(id.clone()),
            _ => Err(A2aError::invalid_params("`params.id` is the task's id")),
        }
    };
    match request.method.as_str() {
        "message/send" | "message/stream" => {
            let params: SendParams = serde_json::from_value(params)
                .map_err(|error| A2aError::invalid_params(format!("bad `params`: {error}")))?;
            Ok(A2aCall::Send {
                params: Box::new(params),
                stream: request.method == "message/stream",
            })
        }
        "tasks/get" => Ok(A2aCall::Get {
            id: task_id(&params)?,
            history_length: match params.get("historyLength") {
                None | Some(Value::Null) => None,
                Some(value) => Some(
                    value
                        .as_u64()
                        .and_then(|length| usize::try_from(length).ok())
                        .ok_or_else(|| {
                            A2aError::invalid_params("`historyLength` is a whole number")
                        })?,
                ),
            },
        }),
        "tasks/cancel" => Ok(A2aCall::Cancel {
            id: task_id(&params)?,
        }),
        "tasks/resubscribe" => Ok(A2aCall::Resubscribe {
            id: task_id(&params)?,
        }),
        "tasks/list" => {
            let params = if params.is_null() { json!({}) } else { params };
            let list: ListParams = serde_json::from_value(params)
                .map_err(|error| A2aError::invalid_params(format!("bad `params`: {error}")))?;
            Ok(A2aCall::List(list))
        }
        "tasks/pushNotificationConfig/set"
        | "tasks/pushNotificationConfig/get"
        | "tasks/pushNotificationConfig/list"
        | "tasks/pushNotificationConfig/delete" => Err(A2aError::push_not_supported()),
        "agent/getAuthenticatedExtendedCard" => Err(A2aError::no_extended_card()),
        other => Err(A2aError::method_not_found(other)),
    }
}

impl IncomingMessage {
    /// Checks the message's shape: a user's, with an id and at least one part.
    fn check(&self) -> Result<(), A2aError> {
        if self.role != "user" {
            return Err(A2aError::invalid_params("`message.role` must be \"user\""));
        }
        if self.kind.as_deref().is_some_and(|kind| kind != "message") {
            return Err(A2aError::invalid_params(
                "`message.kind` must be \"message\"",
            ));
        }
        if self.message_id.is_empty() || self.message_id.len() > 200 {
            return Err(A2aError::invalid_params(
                "`message.messageId` has 1 to 200 characters",
            ));
        }
        if self.parts.is_empty() {
            return Err(A2aError::invalid_params("`message.parts` is empty"));
        }
        Ok(())
    }

    /// The message as text for the model: text parts as they are, data parts as JSON.
    fn text(&self) -> Result<String, A2aError> {
        let mut pieces = Vec::with_capacity(self.parts.len());
        for (index, part) in self.parts.iter().enumerate() {
            match part.get("kind").and_then(Value::as_str) {
                Some("text") => match part.get("text") {
                    Some(Value::String(text)) => pieces.push(text.clone()),
                    _ => {
                        return Err(A2aError::invalid_params(format!(
                            "`message.parts[{index}].text` is a string"
                        )));
                    }
                },
                Some("data") => match part.get("data") {
                    Some(data @ Value::Object(_)) => pieces.push(data.to_string()),
                    _ => {
                        return Err(A2aError::invalid_params(format!(
                            "`message.parts[{index}].data` is an object"
                        )));
                    }
                },
                Some("file") => {
                    return Err(A2aError::content_type(
                        "file parts are not accepted: send text or data parts",
                    ));
                }
                _ => {
                    return Err(A2aError::invalid_params(format!(
                        "`message.parts[{index}].kind` is `text`, `data` or `file`"
                    )));
                }
            }
        }
        let text = pieces.join("\n");
        if text.trim().is_empty() {
            return Err(A2aError::invalid_params("the message has no text"));
        }
        Ok(text)
    }

    /// The data part's object, if the message has one.
    fn data(&self) -> Option<&Value> {
        self.parts
            .iter()
            .find(|part| part.get("kind").and_then(Value::as_str) == Some("data"))
            .and_then(|part| part.get("data"))
    }
}

/// The A2A state of a run's state.
fn task_state(state: RunState) -> &'static str {
    match state {
        RunState::Queued => "submitted",
        RunState::Running | RunState::Paused => "working",
        RunState::Waiting => "input-required",
        RunState::Succeeded => "completed",
        RunState::Failed => "failed",
        RunState::Cancelled => "canceled",
    }
}

/// The run state a task state names (`submitted`, `working`, …), if it names one.
fn run_state_of(state: &str) -> Option<RunState> {
    Some(match state {
        "submitted" => RunState::Queued,
        "working" => RunState::Running,
        "input-required" => RunState::Waiting,
        "completed" => RunState::Succeeded,
        "failed" => RunState::Failed,
        "canceled" => RunState::Cancelled,
        _ => return None,
    })
}

/// When a task's status last changed, Unix milliseconds (as its status says).
fn status_time(run: &RunView) -> u64 {
    run.finished_at.or(run.started_at).unwrap_or(run.created_at)
}

/// A page of tasks as `tasks/list` answers it.
fn task_list(
    runs: Vec<RunView>,
    list: &ListParams,
    total: u64,
    page_size: u32,
    offset: usize,
) -> Value {
    let count = runs.len();
    let tasks: Vec<Value> = runs
        .iter()
        .map(|run| {
            let mut task = task_of(run, list.history_length);
            if list.include_artifacts != Some(true)
                && let Value::Object(task) = &mut task
            {
                task.remove("artifacts");
            }
            task
        })
        .collect();
    let next = offset + count;
    let next = if (next as u64) < total { next } else { 0 };
    task_page(tasks, total, page_size, next)
}

/// A `tasks/list` answer: the page, how many match in all, the page size, and where the next
/// page starts (empty: none).
fn task_page(tasks: Vec<Value>, total: u64, page_size: u32, next: usize) -> Value {
    json!({
        "tasks": tasks,
        "totalSize": total,
        "pageSize": page_size,
        "nextPageToken": if next == 0 { String::new() } else { next.to_string() },
    })
}

/// Unix milliseconds as ISO 8601.
fn timestamp(millis: u64) -> String {
    let millis = i64::try_from(millis).unwrap_or(i64::MAX);
    chrono::DateTime::from_timestamp_millis(millis)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// An agent's message in a task.
fn agent_message(run: &RunView, id: &str, parts: Vec<Value>) -> Value {
    json!({
        "kind": "message",
        "role": "agent",
        "messageId": id,
        "taskId": run.run_id.to_string(),
        "contextId": run.session_id.to_string(),
        "parts": parts,
    })
}

fn text_part(text: &str) -> Value {
    json!({"kind": "text", "text": text})
}

/// The text of a stored message's text parts.
fn message_text(message: &Value) -> String {
    message
        .get("content")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|part| part.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default()
}

/// A task's status: its state, when it last changed, and for a task that needs input or
/// failed, the agent's message saying why.
fn task_status(run: &RunView) -> Value {
    let state = task_state(run.state);
    let mut status = json!({"state": state, "timestamp": timestamp(status_time(run))});
    let outcome = run.outcome.as_ref();
    let message = match run.state {
        RunState::Waiting => {
            let pending = outcome
                .and_then(|outcome| outcome.get("pending"))
                .cloned()
                .unwrap_or_else(|| json!([]));
            let calls: Vec<String> = pending
                .as_array()
                .map(|calls| {
                    calls
                        .iter()
                        .map(|pending| {
                            format!(
                                "{} ({})",
                                pending["call"]["name"].as_str().unwrap_or("a tool"),
                                pending["call"]["id"].as_str().unwrap_or_default()
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            Some(vec![
                text_part(&format!(
                    "Waiting for approval of {}. Reply to this task with \"approve\" or \
                     \"reject\", or with a data part {{\"decisions\": [{{\"call_id\", \
                     \"decision\"}}]}}.",
                    calls.join(", ")
                )),
                json!({"kind": "data", "data": {"pending": pending}}),
            ])
        }
        RunState::Failed => {
            let error = outcome
                .and_then(|outcome| outcome.get("error"))
                .and_then(|error| error.get("message"))
                .and_then(Value::as_str)
                .unwrap_or("the run failed");
            Some(vec![text_part(error)])
        }
        RunState::Paused => Some(vec![text_part(
            "The run is paused; it goes on when resumed.",
        )]),
        _ => None,
    };
    if let Some(parts) = message {
        status["message"] = agent_message(run, &format!("{}-status", run.run_id), parts);
    }
    status
}

/// A task as A2A shows it: its status, its answer as an artifact once it has one, and its
/// latest `history_length` messages (all by default).
pub fn task_of(run: &RunView, history_length: Option<usize>) -> Value {
    let outcome = run.outcome.as_ref();
    let answer = outcome
        .and_then(|outcome| outcome.get("text"))
        .and_then(Value::as_str)
        .filter(|text| !text.is_empty() && run.state.is_final());
    let artifacts: Vec<Value> = answer
        .map(|text| {
            json!({
                "artifactId": ANSWER_ARTIFACT,
                "name": ANSWER_ARTIFACT,
                "parts": [text_part(text)],
            })
        })
        .into_iter()
        .collect();
    let mut history: Vec<Value> = outcome
        .and_then(|outcome| outcome.get("messages"))
        .and_then(Value::as_array)
        .map(|messages| {
            messages
                .iter()
                .enumerate()
                .filter_map(|(index, message)| {
                    let role = match message.get("role").and_then(Value::as_str) {
                        Some("user") => "user",
                        Some("assistant") => "agent",
                        _ => return None,
                    };
                    let text = message_text(message);
                    (!text.is_empty()).then(|| {
                        json!({
                            "kind": "message",
                            "role": role,
                            "messageId": format!("{}-{index}", run.run_id),
                            "taskId": run.run_id.to_string(),
                            "contextId": run.session_id.to_string(),
                            "parts": [text_part(&text)],
                        })
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    if let Some(length) = history_length {
        let skip = history.len().saturating_sub(length);
        history.drain(..skip);
    }
    json!({
        "kind": "task",
        "id": run.run_id.to_string(),
        "contextId": run.session_id.to_string(),
        "status": task_status(run),
        "artifacts": artifacts,
        "history": history,
        "metadata": {"agentry": {
            "run_id": run.run_id.to_string(),
            "session_id": run.session_id.to_string(),
            "attempt": run.attempt,
        }},
    })
}

/// A status-update event.
fn status_update(run: &RunView, last: bool) -> Value {
    json!({
        "kind": "status-update",
        "taskId": run.run_id.to_string(),
        "contextId": run.session_id.to_string(),
        "status": task_status(run),
        "final": last,
    })
}

/// An artifact-update event: a piece of the answer.
fn answer_chunk(run: &RunView, text: &str, append: bool, last: bool) -> Value {
    json!({
        "kind": "artifact-update",
        "taskId": run.run_id.to_string(),
        "contextId": run.session_id.to_string(),
        "artifact": {"artifactId": ANSWER_ARTIFACT, "name": ANSWER_ARTIFACT, "parts": [text_part(text)]},
        "append": append,
        "lastChunk": last,
    })
}

/// Whether a run has stopped for now: ended, or waiting for a person.
fn stopped(state: RunState) -> bool {
    state.is_final() || matches!(state, RunState::Waiting | RunState::Paused)
}

/// The saved agent `id` if it is published over A2A; not found otherwise.
pub async fn published_agent(app: &App, id: &str) -> Result<AgentConfig, AppError> {
    let not_found = || AppError::not_found(format!("no agent {id:?} is published over A2A"));
    match app.agent(id).await {
        Ok(agent) if agent.a2a.is_some() => Ok(agent),
        Ok(_) => Err(not_found()),
        Err(error) if matches!(error.failure, Failure::NotFound | Failure::Invalid) => {
            Err(not_found())
        }
        Err(error) => Err(error),
    }
}

/// The published agent marked `default` (its card is served at the server's root).
pub async fn default_agent(app: &App) -> Result<String, AppError> {
    app.agents()
        .await?
        .into_iter()
        .find(|agent| agent.a2a.as_ref().is_some_and(|a2a| a2a.default))
        .map(|agent| agent.id)
        .ok_or_else(|| {
            AppError::not_found(
                "no agent is the server's default A2A agent (an agent's `a2a.default`)",
            )
        })
}

/// The agent card of published agent `id` for `caller` (an agent its key may not use is
/// not found), served at `base` (its endpoint's URL); `bearer`: the endpoint takes API keys
/// as bearer tokens.
pub async fn card(
    app: &App,
    caller: &Principal,
    id: &str,
    base: &str,
    bearer: bool,
) -> Result<Value, AppError> {
    if caller.check_agent(id).is_err() {
        return Err(AppError::not_found(format!(
            "no agent {id:?} is published over A2A"
        )));
    }
    let agent = published_agent(app, id).await?;
    let publication = agent.a2a.clone().unwrap_or_default();
    let name = agent.nickname.clone().unwrap_or_else(|| agent.id.clone());
    let description = publication
        .description
        .clone()
        .unwrap_or_else(|| format!("The Agentry agent {name}."));
    let skills: Vec<Value> = if publication.skills.is_empty() {
        vec![json!({
            "id": agent.id,
            "name": name,
            "description": description,
            "tags": agent.labels,
        })]
    } else {
        publication
            .skills
            .iter()
            .map(|skill| serde_json::to_value(skill).unwrap_or(Value::Null))
            .collect()
    };
    let mut card = json!({
        "protocolVersion": PROTOCOL_VERSION,
        "name": name,
        "description": description,
        "url": base,
        "preferredTransport": "JSONRPC",
        // A2A 1.0 clients read this list (and prefer 1.0); 0.3 clients the fields above.
        "supportedInterfaces": [
            {"url": base, "protocolBinding": "JSONRPC", "protocolVersion": "1.0"},
            {"url": base, "protocolBinding": "JSONRPC", "protocolVersion": "0.3"},
        ],
        "version": env!("CARGO_PKG_VERSION"),
        "provider": {"organization": "Agentry", "url": "https://github.com/agentry"},
        "capabilities": {
            "streaming": true,
            "pushNotifications": false,
            "stateTransitionHistory": false,
        },
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain"],
        "skills": skills,
    });
    if bearer {
        card["securitySchemes"] = json!({"bearer": {
            "type": "http",
            "scheme": "bearer",
            "description": "An Agentry API key",
        }});
        card["security"] = json!([{"bearer": []}]);
    }
    Ok(card)
}

/// The task `id` of agent `agent`, if `caller` may see it.
async fn task_run(
    app: &App,
    caller: &Principal,
    agent: &str,
    id: &str,
) -> Result<RunView, A2aError> {
    let run_id = RunId::parse(id).map_err(|_| A2aError::task_not_found(id))?;
    let run = match Box::pin(app.background_runs().get(run_id)).await {
        Ok(run) => run,
        Err(error) if error.failure == Failure::NotFound => {
            return Err(A2aError::task_not_found(id));
        }
        Err(error) => return Err(error.into()),
    };
    if run.agent_id.as_deref() != Some(agent)
        || !app.may_see_session(caller, run.session_id).await?
    {
        return Err(A2aError::task_not_found(id));
    }
    Ok(run)
}

/// `tasks/get`.
pub async fn get(
    app: &App,
    caller: &Principal,
    agent: &str,
    id: &str,
    history_length: Option<usize>,
) -> Result<Value, A2aError> {
    let run = Box::pin(task_run(app, caller, agent, id)).await?;
    Ok(task_of(&run, history_length))
}

/// `tasks/list`: a page of the agent's tasks that `caller` may see (an admin every one, a
/// `user` key its own), newest first, with how many match in all.
pub async fn list(
    app: &App,
    caller: &Principal,
    agent: &str,
    list: &ListParams,
) -> Result<Value, A2aError> {
    let page_size = list.page_size.unwrap_or(LIST_PAGE_DEFAULT);
    if !(1..=LIST_PAGE_MAX).contains(&page_size) {
        return Err(A2aError::invalid_params(format!(
            "`pageSize` is 1 to {LIST_PAGE_MAX}"
        )));
    }
    let offset = match list.page_token.as_deref() {
        None | Some("") => 0,
        Some(token) => token
            .parse::<usize>()
            .map_err(|_| A2aError::invalid_params("`pageToken` is not one this server gave"))?,
    };
    let session_id = match list.context_id.as_deref() {
        None | Some("") => None,
        Some(context) => match SessionId::parse(context) {
            Ok(session) => Some(session),
            // No task is in a conversation that cannot exist.
            Err(_) => return Ok(task_page(Vec::new(), 0, page_size, 0)),
        },
    };
    // A state one run state stands for is filtered in the store; `working` (running or
    // paused) run by run.
    let (state, working) = match list.status.as_deref() {
        None | Some("") => (None, false),
        Some("working") => (None, true),
        Some(status) => match run_state_of(status) {
            Some(state) => (Some(state), false),
            // States no task here is ever in.
            None if matches!(status, "rejected" | "auth-required") => {
                return Ok(task_page(Vec::new(), 0, page_size, 0));
            }
            None => {
                return Err(A2aError::invalid_params(format!(
                    "`status` {status:?} is not a task state"
                )));
            }
        },
    };
    let changed_after = match list.status_timestamp_after.as_deref() {
        None | Some("") => None,
        Some(at) => Some(
            chrono::DateTime::parse_from_rfc3339(at)
                .map_err(|_| {
                    A2aError::invalid_params("`statusTimestampAfter` is an RFC 3339 time")
                })?
                .timestamp_millis(),
        ),
    };
    let mut query = RunQuery {
        session_id,
        agent_id: Some(agent.to_owned()),
        state,
        // A task's status changes after its creation: the time filter narrows what is
        // read, and each run's own status time decides.
        created_after: None,
        owner: caller.owner_filter(),
        background: Some(true),
        limit: LIST_READ_MAX,
        offset: 0,
        ..RunQuery::default()
    };
    let (page, total) = if changed_after.is_none() && !working {
        // Filtered, counted and paged in the store.
        let total = app.background_runs().count(&query).await?;
        query.limit = page_size as usize;
        query.offset = offset;
        (app.background_runs().find(&query).await?, total)
    } else {
        // Filtered run by run, then paged.
        let after = changed_after.map_or(0, |after| u64::try_from(after).unwrap_or(0));
        let matching: Vec<RunView> = app
            .background_runs()
            .find(&query)
            .await?
            .into_iter()
            .filter(|run| status_time(run) >= after)
            .filter(|run| !working || task_state(run.state) == "working")
            .collect();
        let total = matching.len() as u64;
        let page = matching
            .into_iter()
            .skip(offset)
            .take(page_size as usize)
            .collect();
        (page, total)
    };
    Ok(task_list(page, list, total, page_size, offset))
}

/// `tasks/cancel`: the task as it is once cancelled (a running one stops at its next
/// step; this waits a few seconds for it).
pub async fn cancel(
    app: &App,
    caller: &Principal,
    agent: &str,
    id: &str,
) -> Result<Value, A2aError> {
    let run = Box::pin(task_run(app, caller, agent, id)).await?;
    if run.state.is_final() {
        return Err(A2aError::task_not_cancelable(id, task_state(run.state)));
    }
    Box::pin(app.background_runs().cancel(run.run_id)).await?;
    let run = Box::pin(app.background_runs().wait_until(
        run.run_id,
        Duration::from_secs(5),
        |_, record| record.state.is_final(),
    ))
    .await?;
    Ok(task_of(&run, None))
}

/// `message/send` and `message/stream`: starts a task of `agent` (in the message's
/// context, or a new one), or answers the task that waits for input. Answers the task as
/// it is then (blocking sends wait until it ends or needs input).
pub async fn send(
    app: &App,
    caller: &Principal,
    agent: &str,
    params: &SendParams,
) -> Result<RunView, A2aError> {
    let message = &params.message;
    message.check()?;
    if params
        .configuration
        .as_ref()
        .is_some_and(|configuration| configuration.push_notification_config.is_some())
    {
        return Err(A2aError::push_not_supported());
    }
    if let Some(modes) = params
        .configuration
        .as_ref()
        .and_then(|configuration| configuration.accepted_output_modes.as_ref())
        && !modes.is_empty()
        && !modes
            .iter()
            .any(|mode| mode == "text/plain" || mode == "text" || mode == "*/*")
    {
        return Err(A2aError::content_type(
            "this agent answers in text/plain, which `acceptedOutputModes` leaves out",
        ));
    }
    if let Some(task) = &message.task_id {
        return Box::pin(answer(app, caller, agent, task, message)).await;
    }
    let session = match &message.context_id {
        Some(context) => {
            let session = SessionId::parse(context).map_err(|_| {
                A2aError::invalid_params(format!(
                    "unknown contextId {context:?}: leave it out to start a new context"
                ))
            })?;
            let visible = match app.sessions().record(context).await {
                Ok(_) => app.may_see_session(caller, session).await?,
                Err(error) if error.failure == Failure::NotFound => false,
                Err(error) => return Err(error.into()),
            };
            if !visible {
                return Err(A2aError::invalid_params(format!(
                    "unknown contextId {context:?}: leave it out to start a new context"
                )));
            }
            SessionChoice::Existing(session)
        }
        None => SessionChoice::New,
    };
    let body = RunSpec {
        agent_id: Some(agent.to_owned()),
        input: Some(Input::Text {
            text: message.text()?,
        }),
        session,
        ..RunSpec::default()
    };
    // The client's message id makes a retried send find its task instead of a second one.
    let key = format!("a2a:{agent}:{}", message.message_id);
    let enqueue = Enqueue {
        caller: caller.clone(),
        spec: body,
        idempotency_key: Some(key),
        priority: 0,
    };
    let (run, _) = Box::pin(app.submit(enqueue)).await?;
    Ok(run)
}

/// A message to task `task`: the decisions on its waiting calls.
async fn answer(
    app: &App,
    caller: &Principal,
    agent: &str,
    task: &str,
    message: &IncomingMessage,
) -> Result<RunView, A2aError> {
    let run = Box::pin(task_run(app, caller, agent, task)).await?;
    if message
        .context_id
        .as_deref()
        .is_some_and(|context| context != run.session_id.to_string())
    {
        return Err(A2aError::invalid_params(format!(
            "task {task} is not in that contextId"
        )));
    }
    if run.state != RunState::Waiting {
        return Err(A2aError::unsupported(format!(
            "task {task} is {} and waits for no input: send a message without `taskId` \
             (with its `contextId` to continue the conversation)",
            task_state(run.state)
        )));
    }
    let body: DecideBody = match message
        .data()
        .filter(|data| data.get("decisions").is_some())
    {
        Some(data) => serde_json::from_value(data.clone())
            .map_err(|error| A2aError::invalid_params(format!("bad `decisions`: {error}")))?,
        None => {
            let text = message.text()?;
            let answer = text.trim().to_lowercase();
            let verdict = if ["approve", "approved", "yes", "y", "ok"].contains(&answer.as_str()) {
                "approve"
            } else if answer.starts_with("reject")
                || answer.starts_with("deny")
                || answer == "no"
                || answer == "n"
            {
                "reject"
            } else {
                return Err(A2aError::invalid_params(
                    "the task waits for approval: answer \"approve\" or \"reject\", or \
                     send a data part {\"decisions\": [...]}",
                ));
            };
            let pending = app.approvals_of_run(run.run_id).await?.pending;
            if pending.is_empty() {
                return Err(A2aError::unsupported(format!(
                    "task {task} has no call waiting"
                )));
            }
            let decisions: Vec<Value> = pending
                .iter()
                .map(|pending| {
                    let mut decision = json!({"call_id": pending.call.id, "decision": verdict});
                    if verdict == "reject" {
                        decision["reason"] = json!(text.trim());
                    }
                    decision
                })
                .collect();
            serde_json::from_value(json!({"decisions": decisions}))
                .map_err(|error| A2aError::internal(format!("bad decisions: {error}")))?
        }
    };
    Box::pin(app.submit(body.into_op(run.run_id)?)).await?;
    Ok(Box::pin(app.background_runs().get(run.run_id)).await?)
}

/// Waits until `run` has stopped (ended, or waits for a person again) or `timeout`
/// passes; answers it as it is then.
pub async fn wait(app: &App, run: &RunView, timeout: Duration) -> Result<RunView, A2aError> {
    let session = run.session_id;
    Ok(Box::pin(
        app.background_runs()
            .wait_until(run.run_id, timeout, move |app, record| {
                // A run that was just answered is live here again before its record says so.
                stopped(record.state) && !app.hub().is_live(session) || record.state.is_final()
            }),
    )
    .await?)
}

/// A blocking `message/send`'s answer: the task once it has stopped.
pub async fn blocking(app: &App, run: &RunView, params: &SendParams) -> Result<Value, A2aError> {
    let configuration = params.configuration.clone().unwrap_or_default();
    let run = if configuration.blocking.unwrap_or(true) {
        Box::pin(wait(app, run, BLOCKING_WAIT)).await?
    } else {
        run.clone()
    };
    Ok(task_of(&run, configuration.history_length))
}

/// `tasks/resubscribe`'s task.
pub async fn resubscribe(
    app: &App,
    caller: &Principal,
    agent: &str,
    id: &str,
) -> Result<RunView, A2aError> {
    let run = Box::pin(task_run(app, caller, agent, id)).await?;
    if run.state.is_final() {
        return Err(A2aError::unsupported(format!(
            "task {id} has ended: read it with `tasks/get`"
        )));
    }
    Ok(run)
}

/// Waits for `run` to start: its live events when it runs here (caught from its first
/// step: the hub is looked at every [`HUB_POLL`], the record every [`RECORD_POLL`]), or
/// nothing when it runs on another node, has stopped, or has not started in
/// [`START_WAIT`]. Answers the run as it was last read.
async fn live(app: &App, run: &RunView) -> (RunView, Option<Subscription>) {
    let deadline = tokio::time::Instant::now() + START_WAIT;
    let mut latest = run.clone();
    let mut next_read = tokio::time::Instant::now();
    loop {
        if app.hub().run_id(run.session_id) == Some(run.run_id)
            && let Some(subscription) = app.hub().subscribe(run.session_id)
        {
            latest.state = RunState::Running;
            return (latest, Some(subscription));
        }
        let now = tokio::time::Instant::now();
        if now >= next_read {
            if let Ok(record) = Box::pin(app.background_runs().get(run.run_id)).await {
                latest = record;
            }
            let elsewhere = latest.state == RunState::Running
                && latest.worker.as_deref() != Some(app.queue_settings().worker.as_str());
            if elsewhere || (latest.state != RunState::Queued && latest.state != RunState::Running)
            {
                return (latest, None);
            }
            next_read = now + RECORD_POLL;
        }
        if now >= deadline || app.shutdown_signal().is_cancelled() {
            return (latest, None);
        }
        tokio::time::sleep(HUB_POLL).await;
    }
}

/// A task's stream (the results of `message/stream` and `tasks/resubscribe`): the task,
/// `working`, its answer's text as it is written (artifact chunks; whole at the end when
/// the run went on on another node), then its final status (`final: true`) once it ends
/// or needs input.
pub fn events(app: &App, run: RunView) -> impl Stream<Item = Value> + Send + 'static {
    let app = app.clone();
    async_stream::stream! {
        yield task_of(&run, None);
        let (started, live) = Box::pin(live(&app, &run)).await;
        if !started.state.is_final() {
            yield status_update(&started, false);
        }
        let mut streamed = false;
        let followed = match live {
            Some(subscription) => {
                let first = None;
                Box::pin(app.follow(run.session_id, FollowFrom::Live { subscription, first })).await.ok()
            }
            None => None,
        };
        if let Some(mut events) = followed {
            // The text generated before the subscription first, then as it comes; what a
            // slow reader missed is caught up from the log.
            while let Some(Ok(event)) = events.next().await {
                match &*event {
                    RunEvent::TextDelta { text } => {
                        yield answer_chunk(&run, text, streamed, false);
                        streamed = true;
                    }
                    event if event.is_terminal() => break,
                    _ => {}
                }
            }
        }
        let ended = match Box::pin(wait(&app, &run, BLOCKING_WAIT)).await {
            Ok(ended) => ended,
            Err(error) => {
                tracing::warn!(run = %run.run_id, "an A2A stream lost its task: {}", error.message);
                return;
            }
        };
        let answer = ended
            .outcome
            .as_ref()
            .and_then(|outcome| outcome.get("text"))
            .and_then(Value::as_str)
            .unwrap_or_default();
        if ended.state.is_final() && !answer.is_empty() {
            // The whole answer closes the artifact (what was streamed included text of
            // earlier rounds; the answer is the last round's).
            yield answer_chunk(&ended, answer, false, true);
        }
        yield status_update(&ended, stopped(ended.state));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelopes_are_checked() {
        assert_eq!(parse_rpc(b"{").unwrap_err().1.code, -32700);
        assert_eq!(parse_rpc(b"[]").unwrap_err().1.code, -32600);
        assert_eq!(
            parse_rpc(br#"{"id": 1, "method": "tasks/get"}"#)
                .unwrap_err()
                .1
                .code,
            -32600
        );
        let (id, error) = parse_rpc(br#"{"jsonrpc": "2.0", "id": "x", "method": 3}"#).unwrap_err();
        assert_eq!((id, error.code), (json!("x"), -32600));
        let (_, error) =
            parse_rpc(br#"{"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": [1]}"#)
                .unwrap_err();
        assert_eq!(error.code, -32602);
        let request = parse_rpc(
            br#"{"jsonrpc": "2.0", "id": 7, "method": "tasks/get", "params": {"id": "t"}}"#,
        )
        .unwrap();
        assert_eq!(
            call_of(&request).unwrap(),
            A2aCall::Get {
                id: "t".into(),
                history_length: None
            }
        );
        let unknown = RpcRequest {
            id: json!(1),
            method: "tasks/explode".into(),
            params: json!({}),
        };
        assert_eq!(call_of(&unknown).unwrap_err().code, -32601);
        let push = RpcRequest {
            method: "tasks/pushNotificationConfig/set".into(),
            ..unknown
        };
        assert_eq!(call_of(&push).unwrap_err().code, -32003);
    }

    #[test]
    fn messages_are_checked_and_read_as_text() {
        let message = |parts: Value, role: &str| IncomingMessage {
            role: role.into(),
            parts: parts.as_array().unwrap().clone(),
            message_id: "m1".into(),
            task_id: None,
            context_id: None,
            kind: Some("message".into()),
        };
        let ok = message(
            json!([{"kind": "text", "text": "hello"}, {"kind": "data", "data": {"a": 1}}]),
            "user",
        );
        ok.check().unwrap();
        assert_eq!(ok.text().unwrap(), "hello\n{\"a\":1}");
        assert!(
            message(json!([{"kind": "text", "text": "x"}]), "agent")
                .check()
                .is_err()
        );
        assert!(message(json!([]), "user").check().is_err());
        let file = message(json!([{"kind": "file", "file": {"uri": "x"}}]), "user");
        assert_eq!(file.text().unwrap_err().code, -32005);
        let blank = message(json!([{"kind": "text", "text": "  "}]), "user");
        assert_eq!(blank.text().unwrap_err().code, -32602);
    }
}
