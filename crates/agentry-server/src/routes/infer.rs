//! Inference: `POST /v1/infer` (waits for the end), `POST /v1/infer/stream` (SSE) and
//! `POST /v1/infer/abort`.
//!
//! The request ([`InferRequest`], checked in the app) accepts the Python service's shapes (`model_id`, `tool_ids`, `text` or
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
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::run_request::{InferRequest, prepare_submission};
use agentry_app::follow::{FollowFrom, Followed};
use agentry_app::hub::CancelOnDrop;
use agentry_app::ids::parse_session_id;
use agentry_app::outcome::RunOutcome;
use agentry_app::runs::{Target, start_in_session};
use agentry_types::SessionId;

use super::sse::SseMapper;
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{
    AbortOutcome, AbortRequest, BadRequest, Conflict, JsonBodyErrors, NotFound, RunStreamEvent,
};
use crate::state::AppState;

/// The inference routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(infer))
        .routes(routes!(infer_stream))
        .routes(routes!(abort))
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
         body = RunOutcome,
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
         body = RunOutcome,
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
    if body.is_group() {
        return super::groups::infer_group(state, &caller, body, false).await;
    }
    let cancel_on_disconnect = body.cancel_on_disconnect;
    // Boxed, as in `infer_stream`: this handler's future is kept until the run ends.
    let (target, request, policy) = Box::pin(prepare_submission(&state.app, &caller, body)).await?;
    let outcome = Box::pin(
        state
            .app
            .run_to_end(target, request, policy, cancel_on_disconnect),
    )
    .await?;
    // A run that failed (the model call failed) is a bad gateway; guards stopping a run are not.
    let status = if outcome.failed() {
        StatusCode::BAD_GATEWAY
    } else {
        StatusCode::OK
    };
    let session = outcome.session_id;
    let mut response = (status, Json(outcome)).into_response();
    if let Some(session) = session
        && let Ok(value) = HeaderValue::from_str(&session.to_string())
    {
        response.headers_mut().insert("x-session-id", value);
    }
    Ok(response)
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
    if body.is_group() {
        return super::groups::infer_group(state, &caller, body, true).await;
    }
    let cancel_on_disconnect = body.cancel_on_disconnect;
    // Boxed, as is the start below (and the group run above, by `infer_group`): axum keeps this
    // handler's future while the request is in flight, and an unboxed await makes it as large
    // as its largest step for every request (kilobytes, a thousand times over when a thousand
    // streams start).
    let (target, request, policy) = Box::pin(prepare_submission(&state.app, &caller, body)).await?;
    let mut headers = HeaderMap::new();
    let events: std::pin::Pin<Box<dyn Stream<Item = Result<Event, Infallible>> + Send>> =
        match target {
            Target::Ephemeral => {
                let run = state.app.stream_stateless(request)?;
                let mut mapper = SseMapper::new(false, 0);
                Box::pin(run.flat_map(move |event| {
                    futures::stream::iter(mapper.map(&event).into_iter().map(Ok))
                }))
            }
            Target::Session(session) => {
                let mut subscription =
                    Box::pin(start_in_session(&state.app, session, request, policy)).await?;
                // A run in a new session creates it with its first write: wait for that, so a
                // start that could not be written is this request's error (507 on a full
                // disk), not a stream that ends as soon as it begins.
                let first = state.app.await_start(&mut subscription).await?;
                if let Ok(value) = HeaderValue::from_str(&session.to_string()) {
                    headers.insert("x-session-id", value);
                }
                let guard = CancelOnDrop::new(
                    state.app.hub().clone(),
                    cancel_on_disconnect.then_some(session),
                );
                let mut intro = Some(
                    Event::default()
                        .event("session")
                        .data(json!({"session_id": session}).to_string()),
                );
                // The intro goes with the run's first event: a new session is created by the
                // run's first commit, and a client that reads the intro finds the session.
                let events = Box::pin(state.app.follow(
                    session,
                    FollowFrom::Live {
                        subscription,
                        first,
                    },
                ))
                .await?;
                let mapper = SseMapper::new(true, 0);
                Box::pin(
                    session_events(state.clone(), session, events, mapper, Some(guard)).flat_map(
                        move |event| {
                            futures::stream::iter(intro.take().map(Ok).into_iter().chain([event]))
                        },
                    ),
                )
            }
        };
    Ok((headers, Sse::new(events).keep_alive(KeepAlive::default())).into_response())
}

/// The SSE events of a session run as [`agentry_app::App::follow`] yields them (`mapper` says
/// what the client has), ending after the run's final event; on shutdown, an event saying where
/// to pick up. `guard` is dropped when the client goes away.
pub(crate) fn session_events<G: Send + 'static>(
    state: AppState,
    session: SessionId,
    events: Followed,
    mapper: SseMapper,
    guard: Option<G>,
) -> impl Stream<Item = Result<Event, Infallible>> + Send {
    async_stream::stream! {
        let _guard = guard;
        let mut mapper = mapper;
        let mut events = events;
        // One wait for the whole stream, not a new one per event: each would be added to and
        // removed from the shutdown token's waiters, which every live stream shares.
        let shutdown = state.app.shutdown_signal().clone().cancelled_owned();
        futures::pin_mut!(shutdown);
        // Until the followed run ends (an end in a backlog that a later start reopens is not
        // the end).
        loop {
            let next = tokio::select! {
                next = events.next() => next,
                () = &mut shutdown => {
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
            match next {
                Some(Ok(event)) => {
                    for sse in mapper.map(&event) {
                        yield Ok(sse);
                    }
                }
                Some(Err(error)) => {
                    let error = ApiError::from(error);
                    yield Ok(Event::default().event("error").data(error.body().to_string()));
                    break;
                }
                None => break,
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
    state.app.check_session_access(&caller, session).await?;
    let aborted = state
        .app
        .submit(agentry_app::ops::StopSession {
            session_id: session,
        })
        .await?;
    Ok(Json(json!({"session_id": session, "aborted": aborted})))
}

#[cfg(test)]
mod tests {
    use crate::future_size;

    /// A run's handler is kept while the run goes on (`/v1/infer`) or starts (the stream):
    /// its steps are boxed, not laid out in every request in flight.
    #[test]
    fn the_run_handlers_futures_stay_small() {
        for (name, size) in [
            ("infer", future_size(super::infer)),
            ("infer_stream", future_size(super::infer_stream)),
        ] {
            assert!(size <= 2048, "{name}'s future takes {size} bytes");
        }
    }
}
