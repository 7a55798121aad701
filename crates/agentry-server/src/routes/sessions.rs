//! Session routes: list, search, inspect, stream (attach at any time), fork, title, read,
//! continue, delete; what each turn changed in the workspace, and revoking turns.

use axum::Json;
use axum::extract::rejection::{BytesRejection, JsonRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::domain::store::SessionQuery;
use agentry_app::follow::FollowFrom;
use agentry_app::session_service::{
    SearchResults, SessionDetail, SessionEvents, SessionList, TitleOutcome,
};

use super::infer::session_events;
use super::sse::SseMapper;
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{
    BadGateway, BadRequest, Conflict, JsonBodyErrors, NotFound, PayloadTooLarge, RunStreamEvent,
    ServiceUnavailable, SessionPath,
};
use crate::state::AppState;

/// The session routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(search))
        .routes(routes!(show, remove))
        .routes(routes!(events))
        .routes(routes!(stream))
        .routes(routes!(fork))
        .routes(routes!(title))
        .routes(routes!(read))
        .routes(routes!(continue_run))
        .routes(routes!(file_turns))
        .routes(routes!(file_turn_diff))
        .routes(routes!(revoke))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only sessions with this status.
    #[param(pattern = "^[a-z_]{1,32}$")]
    status: Option<String>,
    /// At most this many.
    #[serde(default = "default_limit")]
    #[param(default = 100, minimum = 1, maximum = 1000)]
    limit: usize,
    /// Skip this many first.
    #[serde(default)]
    #[param(default = 0)]
    offset: usize,
}

fn default_limit() -> usize {
    100
}

/// Lists sessions, most recent activity first.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    tag = "sessions",
    operation_id = "list_sessions",
    params(ListQuery),
    responses(
        (status = 200, description = "The sessions.", body = SessionList),
        BadRequest,
    )
)]
async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<SessionList>, ApiError> {
    let Query(query) = query?;
    let query = SessionQuery {
        status: query.status,
        owner: caller.owner_filter(),
        limit: query.limit,
        offset: query.offset,
    };
    Ok(Json(state.app.sessions().list(&query).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct SearchQuery {
    /// The text to find in event payloads.
    #[param(min_length = 1, max_length = 1000)]
    q: String,
    /// At most this many hits (clamped to 1..=200).
    #[serde(default = "default_search_limit")]
    #[param(default = 20)]
    limit: usize,
}

fn default_search_limit() -> usize {
    20
}

/// Searches every session's events for a text.
#[utoipa::path(
    get,
    path = "/v1/sessions/search",
    tag = "sessions",
    operation_id = "search_sessions",
    params(SearchQuery),
    responses(
        (status = 200, description = "The hits.", body = SearchResults),
        BadRequest,
    )
)]
async fn search(
    State(state): State<AppState>,
    Caller(caller): Caller,
    query: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Json<SearchResults>, ApiError> {
    let Query(query) = query?;
    let owner = caller.owner_filter();
    Ok(Json(
        state
            .app
            .sessions()
            .search(&query.q, query.limit, owner.as_deref())
            .await?,
    ))
}

/// A session and its conversation.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    operation_id = "get_session",
    params(SessionPath),
    responses(
        (status = 200, description = "The session.", body = SessionDetail),
        BadRequest,
        NotFound,
    )
)]
async fn show(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<SessionDetail>, ApiError> {
    let record = state.app.sessions().record(&id).await?;
    Ok(Json(Box::pin(state.app.sessions().detail(record)).await?))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct EventsQuery {
    /// Only events with a greater seq.
    #[serde(default)]
    #[param(default = 0)]
    after: u64,
}

/// A session's committed events.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/events",
    tag = "sessions",
    operation_id = "session_events",
    params(SessionPath, EventsQuery),
    responses(
        (status = 200, description = "The events, in order.", body = SessionEvents),
        BadRequest,
        NotFound,
    )
)]
async fn events(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Json<SessionEvents>, ApiError> {
    let Query(query) = query?;
    let record = state.app.sessions().record(&id).await?;
    Ok(Json(
        Box::pin(state.app.sessions().events(record.id, query.after)).await?,
    ))
}

/// Attaches to a session: its committed events after `Last-Event-ID` (or `?after=`), the
/// current step's partial text, then live events until the run ends.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/stream",
    tag = "sessions",
    operation_id = "session_stream",
    params(
        SessionPath,
        EventsQuery,
        ("Last-Event-ID" = Option<u64>, Header,
         description = "The last seq the client has (takes precedence over `after`)."),
    ),
    responses(
        (status = 200, description = "The session's events as server-sent events (named as in \
         `POST /v1/infer/stream`), until its run ends; at once if none is live.",
         body = RunStreamEvent, content_type = "text/event-stream"),
        BadRequest,
        NotFound,
    )
)]
async fn stream(
    State(state): State<AppState>,
    crate::authorization::Caller(caller): crate::authorization::Caller,
    Path(id): Path<String>,
    headers: HeaderMap,
    query: Result<Query<EventsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let record = state.app.sessions().record(&id).await?;
    let after = super::sse::resume_after(&headers, query.after)?;
    let path = format!("/v1/sessions/{}/stream?after={after}", record.id);
    if let Some(relayed) = relay_stream(&state, &caller, record.id, &path, &headers).await? {
        return Ok(relayed);
    }
    attach(state, record.id, after).await
}

/// A session's stream (`path` on the other node) from the node its run is live on, when that
/// is another node of the cluster (its live deltas are there); `None` when the run is here,
/// nowhere, or the request was forwarded already.
pub(crate) async fn relay_stream(
    state: &AppState,
    caller: &agentry_app::auth::Principal,
    session: agentry_types::SessionId,
    path: &str,
    headers: &HeaderMap,
) -> Result<Option<Response>, ApiError> {
    if crate::relay::was_relayed(headers) {
        return Ok(None);
    }
    let Some(address) = state.app.remote_owner(session).await? else {
        return Ok(None);
    };
    match crate::relay::forward(
        state,
        caller,
        &address,
        axum::http::Method::GET,
        path,
        headers,
        Vec::new(),
    )
    .await
    {
        Ok(response) if response.status().is_success() => Ok(Some(response)),
        // The node went away meanwhile: follow the log here instead.
        Ok(_) | Err(_) => Ok(None),
    }
}

/// A session's events as server-sent events: the log's after `after`, the current step's
/// partial text, then live events until the run ends (at once when none is live; through the
/// log when it is live in another process) — [`agentry_app::App::follow`].
pub(crate) async fn attach(
    state: AppState,
    session: agentry_types::SessionId,
    after: u64,
) -> Result<Response, ApiError> {
    let events = Box::pin(state.app.follow(session, FollowFrom::After(after))).await?;
    let mapper = SseMapper::new(true, after);
    let stream = session_events::<()>(state, session, events, mapper, None);
    Ok(Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response())
}

#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
struct ForkBody {
    /// The last event the fork shares (default: the session's last).
    #[serde(default)]
    at_seq: Option<u64>,
}

/// Forks a session: a new session whose history is this one's up to an event.
///
/// The body is optional; without a `content-type` it is ignored. A body sent as JSON that does
/// not parse is refused by the JSON extractor itself, in plain text.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/fork",
    tag = "sessions",
    operation_id = "fork_session",
    params(SessionPath),
    request_body = Option<ForkBody>,
    responses(
        (status = 201, description = "The new session.", body = agentry_app::session_service::ForkOutcome,
         links(
             ("get_session" = (operation_id = "get_session", parameters(("id" = "$response.body#/session/id")))),
             ("session_events" = (operation_id = "session_events", parameters(("id" = "$response.body#/session/id")))),
             ("session_stream" = (operation_id = "session_stream", parameters(("id" = "$response.body#/session/id")))),
             ("fork_session" = (operation_id = "fork_session", parameters(("id" = "$response.body#/session/id")))),
             ("title_session" = (operation_id = "title_session", parameters(("id" = "$response.body#/session/id")))),
             ("read_session" = (operation_id = "read_session", parameters(("id" = "$response.body#/session/id")))),
             ("continue_session" = (operation_id = "continue_session", parameters(("id" = "$response.body#/session/id")))),
             ("delete_session" = (operation_id = "delete_session", parameters(("id" = "$response.body#/session/id")))),
         )),
        BadRequest,
        PayloadTooLarge,
        NotFound,
    )
)]
async fn fork(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body: ForkBody = optional_json(body)?;
    let record = state.app.sessions().record(&id).await?;
    // The fork belongs to whoever forked it (a user key can fork only its own sessions).
    let fork = Box::pin(
        state
            .app
            .sessions()
            .fork(&record, body.at_seq, caller.owner()),
    )
    .await?;
    Ok((StatusCode::CREATED, Json(fork)).into_response())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct TitleBody {
    /// The title; without one the model writes it.
    #[serde(default)]
    #[schema(max_length = 1000)]
    title: Option<String>,
    /// The model that writes the title (default: the model labelled `summary`, else the
    /// default model).
    #[serde(default)]
    model_id: Option<String>,
}

/// Sets a session's title, or lets a model write one from the conversation.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/title",
    tag = "sessions",
    operation_id = "title_session",
    params(SessionPath),
    request_body = TitleBody,
    responses(
        (status = 200, description = "The title set.", body = TitleOutcome),
        JsonBodyErrors,
        NotFound,
        BadGateway,
    )
)]
async fn title(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    body: Result<Json<TitleBody>, JsonRejection>,
) -> Result<Json<TitleOutcome>, ApiError> {
    let Json(body) = body?;
    let record = state.app.sessions().record(&id).await?;
    Ok(Json(
        Box::pin(
            state
                .app
                .sessions()
                .retitle(&caller, record.id, body.title, body.model_id),
        )
        .await?,
    ))
}

#[derive(Debug, Deserialize, Default, ToSchema)]
#[serde(deny_unknown_fields)]
struct ReadBody {
    /// The last seq read (default: the session's last).
    #[serde(default)]
    seq: Option<u64>,
}

/// Marks a session read up to an event.
///
/// The body is optional; without a `content-type` it is ignored. A body sent as JSON that does
/// not parse is refused by the JSON extractor itself, in plain text.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/read",
    tag = "sessions",
    operation_id = "read_session",
    params(SessionPath),
    request_body = Option<ReadBody>,
    responses(
        (status = 204, description = "Marked."),
        BadRequest,
        PayloadTooLarge,
        NotFound,
    )
)]
async fn read(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let body: ReadBody = optional_json(body)?;
    let record = state.app.sessions().record(&id).await?;
    state.app.sessions().mark_read(&record, body.seq).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Continues a session: resumes a run a crash interrupted, or lets the model go on from the
/// history. Returns at once; follow it on `/v1/sessions/{id}/stream`.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/continue",
    tag = "sessions",
    operation_id = "continue_session",
    params(SessionPath),
    responses(
        (status = 202, description = "The run started.", body = agentry_app::session_service::ContinueOutcome),
        BadRequest,
        NotFound,
        Conflict,
    )
)]
async fn continue_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let record = state.app.sessions().record(&id).await?;
    let outcome = Box::pin(state.app.sessions().go_on(&caller, &record)).await?;
    Ok((StatusCode::ACCEPTED, Json(outcome)).into_response())
}

/// Deletes a session (its forks keep the events they share).
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}",
    tag = "sessions",
    operation_id = "delete_session",
    params(SessionPath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
        Conflict,
    )
)]
async fn remove(
    State(state): State<AppState>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let record = state.app.sessions().record(&id).await?;
    Box::pin(state.app.sessions().delete(record.id)).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The turns whose tools changed files in the session's workspace.
#[derive(Debug, serde::Serialize, ToSchema)]
struct FileTurns {
    /// The session.
    session_id: String,
    /// The turns, oldest first.
    turns: Vec<agentry_app::turn_files::FileTurn>,
}

/// Lists the turns of a session whose tools changed files in its workspace, with the paths
/// each changed (the per-turn file journal).
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/file-journals",
    tag = "sessions",
    operation_id = "session_file_turns",
    params(SessionPath),
    responses(
        (status = 200, description = "The turns, oldest first.", body = FileTurns),
        BadRequest,
        NotFound,
        ServiceUnavailable,
    )
)]
async fn file_turns(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<FileTurns>, ApiError> {
    let turns = Box::pin(state.app.file_turns(&caller, &id)).await?;
    Ok(Json(FileTurns {
        session_id: id,
        turns,
    }))
}

/// A turn's file changes with their contents and unified diffs.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/file-journals/{turn}",
    tag = "sessions",
    operation_id = "session_file_turn_diff",
    params(
        SessionPath,
        ("turn" = String, Path, description = "The turn: its run id, or its user message's time (ISO 8601)."),
    ),
    responses(
        (status = 200, description = "The turn's changes.", body = agentry_app::turn_files::TurnDiff),
        BadRequest,
        NotFound,
        ServiceUnavailable,
    )
)]
async fn file_turn_diff(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path((id, turn)): Path<(String, String)>,
) -> Result<Json<agentry_app::turn_files::TurnDiff>, ApiError> {
    Ok(Json(
        Box::pin(state.app.file_turn_diff(&caller, &id, &turn)).await?,
    ))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct RevokeBody {
    /// The first turn to revoke, by its run id.
    #[serde(default)]
    run_id: Option<String>,
    /// Or by the time of its user message (ISO 8601, as the seed's clients send it).
    #[serde(default)]
    timestamp: Option<String>,
    /// Overwrite files someone changed since those turns (default: such a conflict is a 409
    /// and nothing is done).
    #[serde(default, alias = "forced")]
    force: bool,
    /// Leave the files as they are: only the conversation goes back.
    #[serde(default)]
    keep_files: bool,
}

/// Revokes a turn and every later one: the files their tools changed are put back (created
/// ones removed, deleted ones restored) and the conversation goes back to before the turn's
/// user message. The revoked events stay in the log (a `revoked` event marks the cut).
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/revoke",
    tag = "sessions",
    operation_id = "revoke_session_turn",
    params(SessionPath),
    request_body = RevokeBody,
    responses(
        (status = 200, description = "Revoked.", body = agentry_app::turn_files::RevokeOutcome),
        BadRequest,
        PayloadTooLarge,
        NotFound,
        Conflict,
        ServiceUnavailable,
    )
)]
async fn revoke(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<Json<agentry_app::turn_files::RevokeOutcome>, ApiError> {
    let body: RevokeBody = optional_json(body)?;
    let request = agentry_app::turn_files::RevokeRequest {
        run_id: body.run_id,
        timestamp: body.timestamp,
        force: body.force,
        keep_files: body.keep_files,
    };
    Ok(Json(
        Box::pin(state.app.revoke_turn(&caller, &id, request)).await?,
    ))
}

/// A JSON body that may be left out entirely (an empty body means the defaults); a body that is
/// there must be valid JSON of the right shape, and every failure is our JSON error.
fn optional_json<T: serde::de::DeserializeOwned + Default>(
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    let body = body.map_err(|rejection| {
        let code = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            "request_too_large"
        } else {
            "invalid_request"
        };
        ApiError::new(rejection.status(), code, rejection.body_text())
    })?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&body)
        .map_err(|error| ApiError::bad_request(format!("invalid JSON body: {error}")))
}
