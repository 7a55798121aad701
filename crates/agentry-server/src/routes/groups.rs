//! Group chat routes: `POST /v1/groups` (a group session over saved agents),
//! `GET /v1/groups/{id}` (members and transcript), `POST /v1/groups/{id}/messages` (waits for
//! the exchange's end), `POST /v1/groups/{id}/messages/stream` (SSE) and
//! `POST /v1/groups/{id}/abort`, and `GET /v1/groups/{id}/stream` (follow it over SSE). `POST /v1/infer` with several `agent_ids` runs the same
//! exchange ([`infer_group`]). See [`agentry_app::group`] for how an exchange runs and is recorded.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::{Stream, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::group::{self, GroupInfo, GroupLive, GroupView, LiveGroups, Started};
use agentry_types::{RunEvent, RunId, SessionEvent, SessionId};

use super::config::ApiPath;
use super::run_request::InferRequest;
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{BadRequest, Conflict, JsonBodyErrors, NotFound, SessionPath};
use crate::state::AppState;
use agentry_app::ids::parse_session_id;
use agentry_app::ops::PostToGroup;

/// The group chat routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create_group))
        .routes(routes!(get_group))
        .routes(routes!(post_message))
        .routes(routes!(post_message_stream))
        .routes(routes!(abort_group))
        .routes(routes!(group_stream))
}

/// A new group chat.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateGroup {
    /// The saved agents taking part (2 to 16, by id).
    #[serde(alias = "agent_ids")]
    pub members: Vec<String>,
    /// Rounds one user message may lead to (1 to 50; default 5).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 50)]
    pub max_rounds: Option<u32>,
    /// A title (default: the members' names).
    #[serde(default)]
    pub title: Option<String>,
}

/// A message to a group.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GroupMessage {
    /// What the user says; `@name`, `@id` or `@all` wake those members (everyone when it
    /// mentions none).
    pub text: String,
    /// The user it is from (its name in the transcript; members' memories of this user join
    /// their system prompts): a `user` key's own end user, or for an admin any, a key's as
    /// `<key id>:<name>`.
    #[serde(default)]
    #[schema(pattern = "^([A-Za-z0-9_.-]{1,64}:)?[A-Za-z0-9_.-]{1,64}$")]
    pub user: Option<String>,
}

/// The group session and its members.
#[derive(Debug, Clone, ToSchema)]
#[allow(dead_code)]
pub struct GroupCreated {
    /// The group session.
    pub session_id: String,
    /// Its settings.
    pub group: GroupInfo,
}

/// An exchange's outcome.
#[derive(Debug, Clone, ToSchema)]
#[allow(dead_code)]
pub struct GroupOutcome {
    /// Whether it ended (not interrupted).
    pub success: bool,
    /// The group session.
    pub session_id: String,
    /// The exchange.
    pub run_id: String,
    /// `completed` (nobody mentioned for another round), `max_rounds` or `cancelled`.
    pub stop_reason: String,
    /// Rounds run.
    pub rounds: u32,
    /// The last reply.
    pub text: String,
    /// The exchange's messages: `{"seq", "event"}`, the user's first, then each member's reply
    /// (`{"type": "group", "run_id", "event": {"kind": "message", "round", "agent_id", "name",
    /// "text", "mentions", "session_id", "member_run_id", "stop_reason", "error"}}`).
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Value>,
}

/// One server-sent event of a group exchange: `session` (first), `group.message` (the user's
/// message, then each member's reply, with its seq as id), `group.round` (the members a round
/// wakes), `group.speaking` (a member starts: `{round, agent_id, name, session_id}`),
/// `group.delta` / `group.thinking` (`{round, agent_id, text}`), `group.member` (a member's
/// other run events: `{round, agent_id, event}`), and last `group.finished`.
#[derive(Debug, Clone, ToSchema)]
#[allow(dead_code)]
pub struct GroupStreamEvent {
    /// The event's name.
    pub event: String,
    /// Its JSON data.
    #[schema(value_type = Object)]
    pub data: Value,
}

/// Creates a group chat: a session over saved agents, each member with a linked session of its
/// own where its turns run.
#[utoipa::path(
    post,
    path = "/v1/groups",
    tag = "groups",
    operation_id = "create_group",
    request_body = CreateGroup,
    responses(
        (status = 201, description = "The group session.", body = GroupCreated),
        JsonBodyErrors,
    )
)]
async fn create_group(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Result<Json<CreateGroup>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let (session, info) = group::create(
        &state.app,
        &caller,
        &body.members,
        body.max_rounds,
        body.title,
    )
    .await?;
    Ok((
        StatusCode::CREATED,
        Json(json!({"session_id": session, "group": info})),
    )
        .into_response())
}

/// A group chat: its members, settings, whether an exchange is going on, and its transcript
/// (`{"seq", "event"}` for every group event of its log).
#[utoipa::path(
    get,
    path = "/v1/groups/{id}",
    tag = "groups",
    operation_id = "get_group",
    params(SessionPath),
    responses(
        (status = 200, description = "The group.", body = Object),
        BadRequest,
        NotFound,
    )
)]
async fn get_group(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<GroupView>, ApiError> {
    let session = parse_session_id(&id)?;
    Ok(Json(Box::pin(group::view(&state.app, session)).await?))
}

/// Posts a message to a group and waits for the exchange's end (every round it leads to).
#[utoipa::path(
    post,
    path = "/v1/groups/{id}/messages",
    tag = "groups",
    operation_id = "post_group_message",
    params(SessionPath),
    request_body = GroupMessage,
    responses(
        (status = 200, description = "The exchange ended.", body = GroupOutcome),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn post_message(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
    body: Result<Json<GroupMessage>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let session = parse_session_id(&id)?;
    let started = Box::pin(group::post(
        &state.app, &caller, session, body.text, body.user,
    ))
    .await?;
    Box::pin(waited(&state, session, started, false)).await
}

/// Posts a message to a group, streaming the exchange as server-sent events.
#[utoipa::path(
    post,
    path = "/v1/groups/{id}/messages/stream",
    tag = "groups",
    operation_id = "post_group_message_stream",
    params(SessionPath),
    request_body = GroupMessage,
    responses(
        (status = 200, description = "The exchange's events, until it ends.",
         body = GroupStreamEvent, content_type = "text/event-stream"),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn post_message_stream(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
    body: Result<Json<GroupMessage>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let session = parse_session_id(&id)?;
    let started = Box::pin(group::post(
        &state.app, &caller, session, body.text, body.user,
    ))
    .await?;
    Ok(streamed(state, session, started, false))
}

/// Cancels the exchange going on in a group (its members' runs are cancelled).
#[utoipa::path(
    post,
    path = "/v1/groups/{id}/abort",
    tag = "groups",
    operation_id = "abort_group",
    params(SessionPath),
    responses(
        (status = 200, description = "Whether an exchange was going on.", body = Object),
        BadRequest,
        NotFound,
    )
)]
async fn abort_group(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let session = parse_session_id(&id)?;
    group::load(&state.app, session).await?;
    Ok(Json(
        json!({"session_id": session, "aborted": state.app.groups().cancel(session)}),
    ))
}

/// Cancels a group's exchange when dropped, if armed (`cancel_on_disconnect`).
struct CancelOnDrop(Option<(LiveGroups, SessionId)>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some((groups, session)) = self.0.take() {
            groups.cancel(session);
        }
    }
}

async fn waited(
    state: &AppState,
    session: SessionId,
    started: Started,
    cancel_on_disconnect: bool,
) -> Result<Response, ApiError> {
    let mut guard =
        CancelOnDrop(cancel_on_disconnect.then(|| (state.app.groups().clone(), session)));
    let run_id = started.run_id;
    let events = Box::pin(group::wait(&state.app, session, started)).await;
    guard.0 = None;
    let events = events?;
    let mut response = Json(group::outcome(session, run_id, &events)).into_response();
    if let Ok(value) = HeaderValue::from_str(&session.to_string()) {
        response.headers_mut().insert("x-session-id", value);
    }
    Ok(response)
}

fn streamed(
    state: AppState,
    session: SessionId,
    started: Started,
    cancel_on_disconnect: bool,
) -> Response {
    let intro = Event::default()
        .event("session")
        .data(json!({"session_id": session, "run_id": started.run_id}).to_string());
    let guard = CancelOnDrop(cancel_on_disconnect.then(|| (state.app.groups().clone(), session)));
    let events = follow(
        state,
        session,
        started.first_seq.saturating_sub(1),
        Some((started.run_id, started.events)),
    );
    // The guard lives as long as the client reads the stream.
    let events = futures::StreamExt::map(events, move |event| {
        let _ = &guard;
        event
    });
    let stream = futures::StreamExt::chain(
        futures::stream::once(async move { Ok::<_, Infallible>(intro) }),
        events,
    );
    let mut response = Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response();
    if let Ok(value) = HeaderValue::from_str(&session.to_string()) {
        response.headers_mut().insert("x-session-id", value);
    }
    response
}

/// A group's events as server-sent events (see [`group::follow`]).
fn follow(
    state: AppState,
    session: SessionId,
    after: u64,
    live: Option<(RunId, broadcast::Receiver<Arc<GroupLive>>)>,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    group::follow(state.app.clone(), session, after, live).filter_map(|item| async move {
        match item {
            Ok(live) => sse_event(&live).map(Ok),
            Err(error) => Some(Ok(Event::default()
                .event("error")
                .data(ApiError::from(error).body().to_string()))),
        }
    })
}

/// Where to start following a group's stream.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct FollowQuery {
    /// Only events with a greater seq.
    #[serde(default)]
    #[param(default = 0)]
    after: u64,
}

/// Follows a group chat (a console attaching or reconnecting): its group events after `after`
/// (or `Last-Event-ID`) from the log, then the live exchange's events until it ends; the
/// stream ends at once when no exchange is going on.
#[utoipa::path(
    get,
    path = "/v1/groups/{id}/stream",
    tag = "groups",
    operation_id = "group_stream",
    params(
        SessionPath,
        FollowQuery,
        ("Last-Event-ID" = Option<u64>, Header,
         description = "The last seq the client has (takes precedence over `after`)."),
    ),
    responses(
        (status = 200, description = "The group's events, named as in \
         `POST /v1/groups/{id}/messages/stream`.",
         body = GroupStreamEvent, content_type = "text/event-stream"),
        BadRequest,
        NotFound,
    )
)]
async fn group_stream(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    query: Result<Query<FollowQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let session = parse_session_id(&id)?;
    group::load(&state.app, session).await?;
    let after = super::sse::resume_after(&headers, query.after)?;
    let live = state.app.groups().subscribe(session);
    Ok(Sse::new(follow(state, session, after, live))
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// `POST /v1/infer` (`stream`: `/v1/infer/stream`) with several `agent_ids`: a group chat
/// ([`agentry_app::ops::PostToGroup`]); `cancel_on_disconnect` cancels the exchange when the client goes away.
///
/// Its future is boxed: a group exchange's is large (about 17 KiB), and inline it would size
/// the future of every `/v1/infer` request, most of which are not group chats.
pub(crate) fn infer_group(
    state: AppState,
    caller: &agentry_app::auth::Principal,
    body: InferRequest,
    stream: bool,
) -> futures::future::BoxFuture<'_, Result<Response, ApiError>> {
    Box::pin(async move {
        let post = PostToGroup {
            caller: caller.clone(),
            post: body.group_post()?,
        };
        let (session, started) = Box::pin(state.app.submit(post)).await?;
        if stream {
            Ok(streamed(state, session, started, body.cancel_on_disconnect))
        } else {
            Box::pin(waited(&state, session, started, body.cancel_on_disconnect)).await
        }
    })
}

/// The SSE event for a live group event (committed ones carry their seq as id).
pub fn sse_event(live: &GroupLive) -> Option<Event> {
    let event = |name: &str, data: Value| Event::default().event(name).data(data.to_string());
    Some(match live {
        GroupLive::Committed {
            seq,
            event: committed,
        } => {
            let SessionEvent::Group { event: group, .. } = committed else {
                return None;
            };
            event(
                super::sse::sse_name(group),
                json!({"seq": seq, "event": committed}),
            )
            .id(seq.to_string())
        }
        GroupLive::Speaking {
            round,
            agent_id,
            name,
            session_id,
        } => event(
            "group.speaking",
            json!({"round": round, "agent_id": agent_id, "name": name, "session_id": session_id}),
        ),
        GroupLive::Member {
            round,
            agent_id,
            event: member,
        } => match member.as_ref() {
            RunEvent::TextDelta { text } => event(
                "group.delta",
                json!({"round": round, "agent_id": agent_id, "text": text}),
            ),
            RunEvent::ThinkingDelta { text } => event(
                "group.thinking",
                json!({"round": round, "agent_id": agent_id, "text": text}),
            ),
            other => event(
                "group.member",
                json!({"round": round, "agent_id": agent_id, "event": other}),
            ),
        },
    })
}
