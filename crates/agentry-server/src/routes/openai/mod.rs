//! The OpenAI-compatible API under `/openai/v1`: `GET /models`, `POST /chat/completions`
//! ([`chat`]: streamed as `chat.completion.chunk` server-sent events ending with
//! `data: [DONE]`, or whole), and the Responses API ([`responses`]): `POST /responses` (whole,
//! or its stream of named events) and `GET /responses/{id}`. The same API keys as `/v1`
//! (`Authorization: Bearer`); errors in OpenAI's shape. Not in the OpenAPI document: OpenAI's
//! own reference describes it. The wire formats live here; a request becomes an app
//! [`agentry_app::runs::RunSpec`], and a run is followed through the app.

pub mod chat;
pub mod responses;

use std::convert::Infallible;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{Router, get, post};
use futures::{Stream, StreamExt};

use agentry_app::domain::core::session::BusyPolicy;
use agentry_app::runs::Target;

use self::chat::{ChatCompletionRequest, ChunkMapper, OpenAiError, chat_completion};
use self::responses::{ResponseEvents, ResponsesRequest, response_of};

use crate::authorization::Caller;
use crate::state::AppState;

/// Where the API is served.
pub const PREFIX: &str = crate::prefixes::OPENAI;

/// The header naming the session a chat completion runs in (`new` or an id); answered with the
/// session's id.
pub const SESSION_HEADER: &str = "x-agentry-session-id";

/// The OpenAI-compatible routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/openai/v1/models", get(models))
        .route("/openai/v1/chat/completions", post(chat_completions))
        .route("/openai/v1/responses", post(responses))
        .route("/openai/v1/responses/{id}", get(stored_response))
}

/// A run's events, from its start: an ephemeral run's own stream, or a session run's live
/// events through the hub.
async fn run_events(
    state: &AppState,
    target: Target,
    request: agentry_app::domain::core::RunRequest,
) -> Result<std::pin::Pin<Box<dyn Stream<Item = agentry_types::RunEvent> + Send>>, OpenAiError> {
    Ok(match target {
        Target::Ephemeral => Box::pin(state.app.stream_stateless(request)?),
        Target::Session(session) => {
            let events = Box::pin(
                state
                    .app
                    .start_followed(session, request, BusyPolicy::Reject),
            )
            .await
            .map_err(OpenAiError::from)?;
            // A slow reader that fell behind is caught up from the log; a log that cannot be
            // read ends the stream (the run goes on).
            Box::pin(async_stream::stream! {
                let mut events = events;
                while let Some(event) = events.next().await {
                    match event {
                        Ok(event) => yield (*event).clone(),
                        Err(error) => {
                            tracing::warn!(%session, "an OpenAI stream lost its run: {error}");
                            break;
                        }
                    }
                }
            })
        }
    })
}

/// The body as `T`, or OpenAI's 400.
fn parse_body<T: serde::de::DeserializeOwned>(body: &[u8], what: &str) -> Result<T, OpenAiError> {
    serde_json::from_slice(body).map_err(|problem| OpenAiError {
        status: 400,
        body: serde_json::json!({"error": {
            "message": format!("the body is not {what}: {problem}"),
            "type": "invalid_request_error", "param": null, "code": null}}),
    })
}

async fn responses(State(state): State<AppState>, Caller(caller): Caller, body: Bytes) -> Response {
    let body: ResponsesRequest = match parse_body(&body, "a Responses API request") {
        Ok(body) => body,
        Err(failure) => return error(failure),
    };
    let stream = body.stream;
    let previous = body.previous_response_id.clone();
    let run = match Box::pin(responses::prepare(&state.app, &caller, body)).await {
        Ok(run) => run,
        Err(failure) => return error(failure),
    };
    if !stream {
        let outcome = match Box::pin(state.app.run_to_end(
            run.target,
            run.request.clone(),
            BusyPolicy::Reject,
            false,
        ))
        .await
        {
            Ok(outcome) => outcome,
            Err(failure) => return error(failure.into()),
        };
        return match response_of(&run, &outcome, previous) {
            Ok(response) => Json(response).into_response(),
            Err(failure) => error(failure),
        };
    }
    let mut mapper = ResponseEvents::new(&run, previous);
    let events = match Box::pin(run_events(&state, run.target, run.request)).await {
        Ok(events) => events,
        Err(failure) => return error(failure),
    };
    let stream = async_stream::stream! {
        let mut events = events;
        while let Some(event) = events.next().await {
            for (name, data) in mapper.map(&event) {
                yield Ok::<Event, Infallible>(Event::default().event(name).data(data.to_string()));
            }
            if mapper.done {
                break;
            }
        }
    };
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn stored_response(
    State(state): State<AppState>,
    Caller(caller): Caller,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    match Box::pin(responses::stored(&state.app, &caller, &id)).await {
        Ok(response) => Json(response).into_response(),
        Err(failure) => error(failure),
    }
}

fn error(error: OpenAiError) -> Response {
    let status = StatusCode::from_u16(error.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, Json(error.body)).into_response()
}

async fn models(State(state): State<AppState>, Caller(caller): Caller) -> Response {
    match chat::models(&state.app, &caller).await {
        Ok(list) => Json(list).into_response(),
        Err(failure) => error(failure),
    }
}

async fn chat_completions(
    State(state): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body: ChatCompletionRequest = match parse_body(&body, "a chat completion request") {
        Ok(body) => body,
        Err(failure) => return error(failure),
    };
    let session = headers
        .get(SESSION_HEADER)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let stream = body.stream;
    let run = match Box::pin(chat::prepare(&state.app, &caller, body, session.as_deref())).await {
        Ok(run) => run,
        Err(failure) => return error(failure),
    };
    let mut answer_headers = HeaderMap::new();
    if let Target::Session(session) = run.target
        && let Ok(value) = HeaderValue::from_str(&session.to_string())
    {
        answer_headers.insert(SESSION_HEADER, value);
    }
    if !stream {
        let outcome = match Box::pin(state.app.run_to_end(
            run.target,
            run.request,
            BusyPolicy::Reject,
            false,
        ))
        .await
        {
            Ok(outcome) => outcome,
            Err(failure) => return error(failure.into()),
        };
        return match chat_completion(&run.model, &outcome, &run.client_tools) {
            Ok(completion) => (answer_headers, Json(completion)).into_response(),
            Err(failure) => error(failure),
        };
    }
    let mut mapper = ChunkMapper::new(&run.model, run.include_usage, run.client_tools.clone());
    let events = match Box::pin(run_events(&state, run.target, run.request)).await {
        Ok(events) => events,
        Err(failure) => return error(failure),
    };
    let chunks = async_stream::stream! {
        let mut events = events;
        while let Some(event) = events.next().await {
            for chunk in mapper.map(&event) {
                yield Ok::<Event, Infallible>(Event::default().data(chunk.to_string()));
            }
            if mapper.done {
                break;
            }
        }
        yield Ok(Event::default().data("[DONE]"));
    };
    (
        answer_headers,
        Sse::new(chunks).keep_alive(KeepAlive::default()),
    )
        .into_response()
}
