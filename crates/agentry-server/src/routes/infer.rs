//! Inference: `POST /v1/infer` (waits for the end), `POST /v1/infer/stream` (SSE) and
//! `POST /v1/infer/abort`.
//!
//! The request accepts the Python service's shapes (`model_id`, `tool_ids`, `text` or
//! `messages` with `prompt_template` and `arguments`, `session_id` where `"new"` creates one,
//! `max_tool_rounds`). With a session the run is durable and belongs to the server: it keeps
//! going when the client disconnects (unless `cancel_on_disconnect`). Without one it is
//! ephemeral and nothing is stored.

use std::convert::Infallible;

use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::domain::core::session::BusyPolicy;
use agentry_app::domain::core::{Input, RunRequest};
use agentry_app::domain::llm::GenerationParams;
use agentry_types::{ContentPart, ImageSource, Message, RunEvent, SessionEvent, SessionId};

use super::sse::SseMapper;
use agentry_app::runs::{RunInput, SessionChoice, Target, start_in_session};

use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{
    AbortOutcome, AbortRequest, BadRequest, Conflict, InferOutcome, JsonBodyErrors, NotFound,
    RunStreamEvent,
};
use crate::state::AppState;
use agentry_app::hub::Subscription;

/// The inference routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(infer))
        .routes(routes!(infer_stream))
        .routes(routes!(abort))
}

/// A message of an inference request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InferMessage {
    /// `user` or `system`.
    #[serde(default = "user_role")]
    #[schema(default = "user", pattern = "^(user|system)$")]
    pub role: String,
    /// Text, or a list of `{"type": "text"|"image_url", …}` parts.
    #[serde(default)]
    #[schema(schema_with = crate::openapi::message_content_schema)]
    pub content: Option<Value>,
    /// Images: `data:` URLs or `http(s)` URLs.
    #[serde(default)]
    pub images: Vec<String>,
    /// A prompt template to render as this message.
    #[serde(default)]
    pub prompt_template: Option<String>,
    /// The template's arguments.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub arguments: serde_json::Map<String, Value>,
    /// Accepted for compatibility and ignored.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub timestamp: Option<Value>,
}

fn user_role() -> String {
    "user".into()
}

/// An inference request.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InferRequest {
    /// The model id (default: the first registered model).
    #[serde(default)]
    pub model_id: Option<String>,
    /// The tools offered, by name: exactly these (an agent's when the request names none);
    /// `["*"]` offers every registered tool. Default: none.
    #[serde(default)]
    pub tool_ids: Option<Vec<String>>,
    /// Shorthand for one user message.
    #[serde(default)]
    pub text: Option<String>,
    /// The new messages.
    #[serde(default)]
    pub messages: Vec<InferMessage>,
    /// `"new"`, an existing session id, or absent for an ephemeral run.
    #[serde(default)]
    #[schema(pattern = "^(new|[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12})$")]
    pub session_id: Option<String>,
    /// A system prompt (a session keeps the one it started with).
    #[serde(default)]
    pub system: Option<String>,
    /// Tool rounds allowed.
    #[serde(default)]
    pub max_tool_rounds: Option<u32>,
    /// Generation parameters (`max_tokens`, `temperature`, `top_p`, `stop`, `thinking`, and
    /// provider-specific fields).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub params: Option<GenerationParams>,
    /// What to do if the session has a run in progress (default: reject).
    #[serde(default)]
    #[schema(value_type = Option<crate::openapi::BusyPolicyName>)]
    pub policy: Option<BusyPolicy>,
    /// Cancel the run when the client disconnects.
    #[serde(default)]
    pub cancel_on_disconnect: bool,
    /// Run as this saved agent: its model and fallbacks, tools, skills and MCP servers' tools,
    /// system prompt or template, parameters and limits (the request's `model_id`, `tool_ids`,
    /// `system`, `max_tool_rounds` and `params` win where given; a request naming its own model
    /// does not use the agent's fallbacks). Several agents: a group chat (see `/v1/groups`) in
    /// a new group session (`session_id` absent or `"new"`) or the group session named.
    #[serde(default)]
    pub agent_ids: Option<Vec<String>>,
    /// Group chat: rounds one message may lead to, for a new group (default 5).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 50)]
    pub max_rounds: Option<u32>,
    /// Which tool calls wait for a person's approval (`always`, `never` or a rule per tool; over
    /// the agent's policy, per tool). A call that needs approval suspends the run (session
    /// status `waiting`) until `POST /v1/runs/{run_id}/approvals` decides it; such runs need a
    /// session.
    #[serde(default)]
    #[schema(value_type = Option<agentry_app::schema::ApprovalPolicyDoc>)]
    pub approvals: Option<agentry_app::domain::core::approval::ApprovalPolicy>,
    /// Run as this saved agent (the same as `agent_ids` with one id).
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub agent_id: Option<String>,
    /// The user the request is for: a saved agent's memories about this user join its own in
    /// the system prompt.
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub user: Option<String>,
    /// How the run compacts its context (`threshold`, `keep_recent`, `summary_model`,
    /// `summary_tokens`, `enabled`; default: the agent's, else the server's).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub compaction: Option<agentry_app::domain::core::context::CompactionSettings>,
}

/// Turns message content into parts.
fn content_parts(message: &InferMessage) -> Result<Vec<ContentPart>, ApiError> {
    let mut parts = Vec::new();
    match &message.content {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => parts.push(ContentPart::text(text.clone())),
        Some(Value::Array(items)) => {
            for item in items {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = item.get("text").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::bad_request("a text part needs a string `text`")
                        })?;
                        parts.push(ContentPart::text(text));
                    }
                    Some("image_url") => {
                        let url = item
                            .pointer("/image_url/url")
                            .or_else(|| item.get("image_url"))
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                ApiError::bad_request("an image part needs `image_url.url`")
                            })?;
                        parts.push(image(url)?);
                    }
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "unknown content part type {other:?} (expected text or image_url)"
                        )));
                    }
                }
            }
        }
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "message content must be a string or a list of parts, not {other}"
            )));
        }
    }
    for url in &message.images {
        parts.push(image(url)?);
    }
    Ok(parts)
}

fn image(url: &str) -> Result<ContentPart, ApiError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (media_type, data) = rest
            .split_once(";base64,")
            .ok_or_else(|| ApiError::bad_request("a data URL image must be base64"))?;
        return Ok(ContentPart::Image {
            source: ImageSource::Base64 {
                media_type: media_type.to_owned(),
                data: data.to_owned(),
            },
        });
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(ContentPart::Image {
            source: ImageSource::Url {
                url: url.to_owned(),
            },
        });
    }
    Err(ApiError::bad_request(
        "an image must be a data: or http(s) URL",
    ))
}

/// Validates a request and prepares its run through the app (resolving its agent, creating
/// the session for `"new"`): the request's own rules (one agent, one new user message, `text`
/// or `messages`) here, the rest in [`agentry_app::runs::prepare`].
pub(crate) async fn prepare(
    state: &AppState,
    caller: &agentry_app::auth::Principal,
    mut body: InferRequest,
) -> Result<(Target, RunRequest, BusyPolicy), ApiError> {
    let agent_id = match (body.agent_id.take(), body.agent_ids.as_deref()) {
        (None, None | Some([])) => None,
        (None, Some([id])) => Some(id.clone()),
        (Some(id), None | Some([])) => Some(id),
        (Some(id), Some([other])) if *other == id => Some(id),
        (Some(_), Some([_])) => {
            return Err(ApiError::bad_request(
                "`agent_id` and `agent_ids` name different agents: give one",
            ));
        }
        (_, Some(_)) => {
            return Err(ApiError::bad_request(
                "several agents make a group chat: `POST /v1/infer` or `/v1/groups`",
            ));
        }
    };
    if body.max_rounds.is_some() {
        return Err(ApiError::bad_request(
            "`max_rounds` is for group chats (several `agent_ids`)",
        ));
    }
    let mut system = body.system.take();
    let mut user_turns = Vec::new();
    for message in &body.messages {
        match message.role.as_str() {
            "system" => {
                let text = message
                    .content
                    .as_ref()
                    .and_then(Value::as_str)
                    .ok_or_else(|| {
                        ApiError::bad_request("a system message needs string content")
                    })?;
                system = Some(text.to_owned());
            }
            "user" => user_turns.push(message),
            other => {
                return Err(ApiError::bad_request(format!(
                    "messages may be `user` or `system`, not {other:?}: the conversation comes \
                     from the session"
                )));
            }
        }
    }
    if user_turns.len() > 1 {
        return Err(ApiError::bad_request(
            "send one new user message per request; earlier turns come from the session",
        ));
    }
    let input = match (user_turns.first(), &body.text) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request("give `text` or `messages`, not both"));
        }
        (None, Some(text)) => Some(Input::Text { text: text.clone() }),
        (Some(message), None) => Some(match &message.prompt_template {
            Some(template) => Input::Template {
                template: template.clone(),
                arguments: message.arguments.clone(),
            },
            None => Input::Content {
                content: content_parts(message)?,
            },
        }),
        (None, None) => None,
    };
    let session = match body.session_id.as_deref() {
        None => SessionChoice::Ephemeral,
        Some("new") => SessionChoice::New,
        Some(id) => SessionChoice::Existing(parse_session_id(id)?),
    };
    let input = RunInput {
        agent_id,
        model_id: body.model_id,
        system,
        tool_ids: body.tool_ids,
        params: body.params,
        max_tool_rounds: body.max_tool_rounds,
        approvals: body.approvals,
        compaction: body.compaction,
        user: body.user,
        input,
        session,
    };
    let (target, request) = agentry_app::runs::prepare(state, caller, input).await?;
    Ok((target, request, body.policy.unwrap_or(BusyPolicy::Reject)))
}

/// Parses a session id from a client, with a clear error.
pub fn parse_session_id(id: &str) -> Result<SessionId, ApiError> {
    SessionId::parse(id).map_err(|error| ApiError::bad_request(error.to_string()))
}

/// Cancels the session's run when dropped, unless disarmed (for `cancel_on_disconnect`).
struct CancelOnDrop {
    hub: agentry_app::hub::Hub,
    session: Option<SessionId>,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.hub.cancel(session);
        }
    }
}

/// Whether a request names several agents: a group chat ([`super::groups::infer_group`]).
fn is_group(body: &InferRequest) -> bool {
    body.agent_ids.as_ref().is_some_and(|ids| ids.len() > 1)
}

/// Runs a request and waits for its end.
///
/// With `session_id` the run is durable: `"new"` creates a session, an id continues one, and the
/// run keeps going if the client disconnects (unless `cancel_on_disconnect`). Without it the run
/// is ephemeral and nothing is stored.
#[utoipa::path(
    post,
    path = "/v1/infer",
    tag = "inference",
    operation_id = "infer",
    request_body = InferRequest,
    responses(
        (status = 200, description = "The run ended: completed, or stopped by a guard.",
         body = InferOutcome,
         headers(("x-session-id" = String, description = "The session, for a session run.")),
         links(
             ("get_session" = (operation_id = "get_session", parameters(("id" = "$response.body#/session_id")))),
             ("session_events" = (operation_id = "session_events", parameters(("id" = "$response.body#/session_id")))),
             ("session_stream" = (operation_id = "session_stream", parameters(("id" = "$response.body#/session_id")))),
             ("fork_session" = (operation_id = "fork_session", parameters(("id" = "$response.body#/session_id")))),
             ("title_session" = (operation_id = "title_session", parameters(("id" = "$response.body#/session_id")))),
             ("read_session" = (operation_id = "read_session", parameters(("id" = "$response.body#/session_id")))),
             ("continue_session" = (operation_id = "continue_session", parameters(("id" = "$response.body#/session_id")))),
             ("delete_session" = (operation_id = "delete_session", parameters(("id" = "$response.body#/session_id")))),
         )),
        (status = 502, description = "The run failed (the model call failed).",
         body = InferOutcome,
         headers(("x-session-id" = String, description = "The session, for a session run."))),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn infer(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Result<Json<InferRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    if is_group(&body) {
        return super::groups::infer_group(state, &caller, body, false).await;
    }
    let cancel_on_disconnect = body.cancel_on_disconnect;
    let (target, request, policy) = prepare(&state, &caller, body).await?;
    match target {
        Target::Ephemeral => {
            let output = state.sessions.runtime().run(request).await?;
            let messages = output.state.messages.clone();
            Ok(outcome(
                None,
                Some(output.run_id.to_string()),
                output.stop_reason.as_str(),
                &output.text,
                json!(output.usage),
                output.rounds,
                output.error.map(|e| json!(e)),
                messages.iter().map(|m| json!(m)).collect(),
                output.note,
            ))
        }
        Target::Session(session) => {
            let mut subscription = start_in_session(&state, session, request, policy).await?;
            let mut guard = CancelOnDrop {
                hub: state.hub.clone(),
                session: cancel_on_disconnect.then_some(session),
            };
            let mut run_id = None;
            let mut end = None;
            loop {
                match subscription.events.recv().await {
                    Ok(event) => match event.as_ref() {
                        RunEvent::Committed {
                            event: SessionEvent::RunStarted { run_id: id, .. },
                            ..
                        } => run_id = Some(*id),
                        RunEvent::RunFinished { .. }
                        | RunEvent::RunFailed { .. }
                        | RunEvent::RunSuspended { .. } => {
                            end = Some(event);
                            break;
                        }
                        _ => {}
                    },
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => break,
                }
            }
            guard.session = None;
            let events = state.store.events(session, 0, usize::MAX).await?;
            let mut note = None;
            let messages: Vec<Value> = events
                .into_iter()
                .filter_map(|stored| serde_json::from_value::<SessionEvent>(stored.payload).ok())
                .filter(|event| Some(event.run_id()) == run_id)
                .filter_map(|event| match event {
                    SessionEvent::RunFinished { note: end_note, .. } => {
                        note = end_note;
                        None
                    }
                    SessionEvent::Message { message, .. } => Some(json!(message)),
                    SessionEvent::AssistantMessage { content, .. } => {
                        Some(json!(Message::Assistant { content }))
                    }
                    SessionEvent::ToolCallResult { result, .. } => {
                        Some(json!(Message::Tool(result)))
                    }
                    _ => None,
                })
                .collect();
            let Some(end) = end else {
                return Err(ApiError::internal("the run ended without a final event"));
            };
            Ok(match end.as_ref() {
                RunEvent::RunFinished {
                    stop_reason,
                    text,
                    usage,
                    rounds,
                } => outcome(
                    Some(session),
                    run_id.map(|id| id.to_string()),
                    stop_reason.as_str(),
                    text,
                    json!(usage),
                    *rounds,
                    None,
                    messages,
                    note.clone(),
                ),
                RunEvent::RunFailed {
                    stop_reason,
                    error,
                    usage,
                    rounds,
                } => outcome(
                    Some(session),
                    run_id.map(|id| id.to_string()),
                    stop_reason.as_str(),
                    "",
                    json!(usage),
                    *rounds,
                    Some(json!(error)),
                    messages,
                    note.clone(),
                ),
                RunEvent::RunSuspended {
                    run_id,
                    status,
                    pending,
                    usage,
                    rounds,
                } => {
                    // Not ended: the run waits for approvals or was paused. `stop_reason` says
                    // which, and `pending` lists the calls to decide.
                    let mut response = Json(json!({
                        "success": true,
                        "session_id": session,
                        "run_id": run_id,
                        "stop_reason": status.as_str(),
                        "status": status.as_str(),
                        "pending": pending,
                        "text": "",
                        "usage": usage,
                        "rounds": rounds,
                        "messages": messages,
                        "error": null,
                    }))
                    .into_response();
                    if let Ok(value) = HeaderValue::from_str(&session.to_string()) {
                        response.headers_mut().insert("x-session-id", value);
                    }
                    response
                }
                _ => return Err(ApiError::internal("unexpected final event")),
            })
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn outcome(
    session: Option<SessionId>,
    run_id: Option<String>,
    stop_reason: &str,
    text: &str,
    usage: Value,
    rounds: u32,
    error: Option<Value>,
    messages: Vec<Value>,
    note: Option<String>,
) -> Response {
    let failed = error.is_some();
    let body = json!({
        "note": note,
        "success": !failed,
        "session_id": session,
        "run_id": run_id,
        "stop_reason": stop_reason,
        "text": text,
        "usage": usage,
        "rounds": rounds,
        "messages": messages,
        "error": error,
    });
    // A run that failed (the model call failed) is a bad gateway; guards stopping a run are not.
    let status = if failed {
        StatusCode::BAD_GATEWAY
    } else {
        StatusCode::OK
    };
    let mut response = (status, Json(body)).into_response();
    if let Some(session) = session
        && let Ok(value) = HeaderValue::from_str(&session.to_string())
    {
        response.headers_mut().insert("x-session-id", value);
    }
    response
}

/// Runs a request, streaming its events as server-sent events.
///
/// Events: `session` (a session run's id, first), `run.started`, `delta.text`,
/// `delta.thinking`, `delta.tool_call`, `message`, `tool.started`, `tool.result`, `usage`, and
/// `run.finished` or `run.failed` last. In a session, committed steps carry their seq as the
/// SSE id, for `GET /v1/sessions/{id}/stream` with `Last-Event-ID`.
#[utoipa::path(
    post,
    path = "/v1/infer/stream",
    tag = "inference",
    operation_id = "infer_stream",
    request_body = InferRequest,
    responses(
        (status = 200, description = "The run's events, until it ends.",
         body = RunStreamEvent, content_type = "text/event-stream",
         headers(("x-session-id" = String, description = "The session, for a session run."))),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn infer_stream(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Result<Json<InferRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    if is_group(&body) {
        return super::groups::infer_group(state, &caller, body, true).await;
    }
    let cancel_on_disconnect = body.cancel_on_disconnect;
    let (target, request, policy) = prepare(&state, &caller, body).await?;
    let mut headers = HeaderMap::new();
    let events: std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> =
        match target {
            Target::Ephemeral => {
                let run = state.sessions.runtime().stream(request)?;
                let mut mapper = SseMapper::new(false, 0);
                Box::pin(run.flat_map(move |event| {
                    futures::stream::iter(mapper.map(&event).into_iter().map(Ok))
                }))
            }
            Target::Session(session) => {
                let subscription = start_in_session(&state, session, request, policy).await?;
                if let Ok(value) = HeaderValue::from_str(&session.to_string()) {
                    headers.insert("x-session-id", value);
                }
                let guard = CancelOnDrop {
                    hub: state.hub.clone(),
                    session: cancel_on_disconnect.then_some(session),
                };
                let intro = Event::default()
                    .event("session")
                    .data(json!({"session_id": session}).to_string());
                Box::pin(
                    futures::stream::once(async move { Ok(intro) }).chain(session_events(
                        state.clone(),
                        session,
                        subscription,
                        0,
                        Some(guard),
                    )),
                )
            }
        };
    Ok((headers, Sse::new(events).keep_alive(KeepAlive::default())).into_response())
}

/// The SSE events of a session run from a subscription: live events, catching up from the log
/// if the subscriber fell behind, ending after the run's final event. `after` is the last seq
/// the client already has; `guard` is dropped when the client goes away.
pub(crate) fn session_events<G: Send + 'static>(
    state: AppState,
    session: SessionId,
    subscription: Subscription,
    after: u64,
    guard: Option<G>,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    async_stream::stream! {
        let _guard = guard;
        let mut mapper = SseMapper::new(true, after);
        let mut events = subscription.events;
        let shutdown = state.shutdown.clone();
        loop {
            let received = tokio::select! {
                received = events.recv() => received,
                _ = shutdown.cancelled() => {
                    // The run goes on (or resumes at the next start); tell the client where to
                    // pick up.
                    let data = serde_json::json!({
                        "reason": "the server is shutting down",
                        "session_id": session,
                        "last_seq": mapper.last_seq,
                        "resume": format!("/v1/sessions/{session}/stream"),
                    });
                    yield Ok(Event::default().event("server.shutdown").data(data.to_string()));
                    break;
                }
            };
            match received {
                Ok(event) => {
                    for sse in mapper.map(&event) {
                        yield Ok(sse);
                    }
                }
                Err(RecvError::Lagged(_)) => {
                    // Deltas were lost (they are not stored); committed steps come from the log.
                    match state.store.events(session, mapper.last_seq, usize::MAX).await {
                        Ok(stored) => {
                            for record in stored {
                                if let Ok(event) = serde_json::from_value::<SessionEvent>(record.payload) {
                                    for sse in mapper.committed(record.seq, &event) {
                                        yield Ok(sse);
                                    }
                                }
                            }
                        }
                        Err(error) => {
                            let error = ApiError::from(error);
                            yield Ok(Event::default().event("error").data(error.body().to_string()));
                            break;
                        }
                    }
                }
                Err(RecvError::Closed) => break,
            }
            if mapper.ended {
                break;
            }
        }
    }
}

/// Cancels the session's live run, if it has one.
#[utoipa::path(
    post,
    path = "/v1/infer/abort",
    tag = "inference",
    operation_id = "abort",
    request_body = AbortRequest,
    responses(
        (status = 200, description = "Whether a live run was cancelled.", body = AbortOutcome),
        JsonBodyErrors,
        BadRequest,
    )
)]
async fn abort(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Result<Json<Value>, JsonRejection>,
) -> Result<Json<Value>, ApiError> {
    let Json(body) = body?;
    let id = body
        .get("session_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::bad_request("`session_id` (a string) is required"))?;
    let session = parse_session_id(id)?;
    crate::authorization::check_session(&state, &caller, session).await?;
    Ok(Json(
        json!({"session_id": session, "aborted": state.hub.cancel(session) || state.groups.cancel(session)}),
    ))
}
