//! A2A, the Agent2Agent protocol, for the saved agents published with an `a2a` section
//! ([`agentry_app::publication`]; the protocol in [`protocol`]): each agent's card at `/a2a/{agent}/.well-known/agent-card.json`
//! (and the older `agent.json`; the agent marked `a2a.default` also at the server's root,
//! `/.well-known/agent-card.json`), its JSON-RPC endpoint at `POST /a2a/{agent}` —
//! `message/send`, `tasks/get` and `tasks/cancel` answer JSON; `message/stream` and
//! `tasks/resubscribe` answer server-sent events, one JSON-RPC response each (an error too, as
//! the stream's one event). The same API keys as `/v1` (`Authorization: Bearer`); protocol
//! errors are JSON-RPC errors (HTTP 200). Not in the OpenAPI document: the A2A specification
//! describes it. A2A 1.0's methods are served on the same endpoint ([`v1`]).

pub mod protocol;
pub(crate) mod v1;

use std::convert::Infallible;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::http::header::HOST;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{Router, get, post};
use futures::StreamExt;
use serde_json::{Value, json};

use self::protocol::{A2aCall, A2aError, CARD_PATH, call_of, parse_rpc};

use crate::authorization::Caller;
use crate::error::ApiError;
use crate::state::AppState;

/// Where the published agents are served.
pub const PREFIX: &str = crate::prefixes::A2A;

/// The A2A routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route(&format!("{PREFIX}/{{agent}}{CARD_PATH}"), get(card))
        .route(
            &format!("{PREFIX}/{{agent}}/.well-known/agent.json"),
            get(card),
        )
        .route(&format!("{PREFIX}/{{agent}}"), post(rpc))
        .route(CARD_PATH, get(root_card))
        .route("/.well-known/agent.json", get(root_card))
}

/// The scheme and authority clients reached us by: the `Host` header when it is a plain
/// host and port, else the address the node advertises.
fn origin(state: &AppState, headers: &HeaderMap) -> String {
    let host = headers
        .get(HOST)
        .and_then(|value| value.to_str().ok())
        .filter(|host| {
            !host.is_empty()
                && host.len() <= 255
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || ".-:[]".contains(c))
        });
    match host {
        Some(host) => format!("http://{host}"),
        None => {
            let address = state.app.queue_settings().address;
            if address.starts_with("http://") || address.starts_with("https://") {
                address
            } else {
                format!("http://{address}")
            }
        }
    }
}

async fn card(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let base = format!("{}{PREFIX}/{agent}", origin(&state, &headers));
    let bearer = state.auth.enabled().await.unwrap_or(true);
    Ok(Json(
        protocol::card(&state.app, &caller, &agent, &base, bearer).await?,
    ))
}

/// The default agent's card at the server's root (`a2a.default`), for clients given only the
/// server's address; its `url` is the agent's endpoint under `/a2a`.
async fn root_card(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
) -> Result<Json<Value>, ApiError> {
    let agent = protocol::default_agent(&state.app).await?;
    card(State(state), caller, Path(agent), headers).await
}

/// A JSON-RPC response: `result`, or the error.
fn answer(id: &Value, result: Result<Value, A2aError>) -> Value {
    match result {
        Ok(result) => json!({"jsonrpc": "2.0", "id": id, "result": result}),
        Err(error) => json!({"jsonrpc": "2.0", "id": id, "error": error.to_json()}),
    }
}

async fn rpc(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(agent): Path<String>,
    body: Bytes,
) -> Response {
    let mut request = match parse_rpc(&body) {
        Ok(request) => request,
        Err((id, error)) => return Json(answer(&id, Err(error))).into_response(),
    };
    let id = request.id.clone();
    // A 1.0 method: handled as its 0.3 form, answered in 1.0's shapes (`v1`).
    let v10 = v1::v03_method(&request.method).map(|v03| {
        let v10 = std::mem::replace(&mut request.method, v03.to_owned());
        request.params = v1::params_to_v03(std::mem::take(&mut request.params));
        v10
    });
    let answer = move |id: &Value, result: Result<Value, A2aError>| {
        answer(
            id,
            result.map(|result| match &v10 {
                Some(method) => v1::result_to_v10(method, result),
                None => result,
            }),
        )
    };
    // An agent that is not published is a 404, whatever the method.
    if let Err(error) = protocol::published_agent(&state.app, &agent).await {
        return ApiError::from(error).into_response();
    }
    // A streaming method's error is an event of its stream, as the specification's reference
    // server sends it (a client reading a stream expects one).
    let streaming = matches!(
        request.method.as_str(),
        "message/stream" | "tasks/resubscribe"
    );
    let refuse = |error: A2aError| {
        let response = answer(&id, Err(error));
        if streaming {
            let event = Event::default().data(response.to_string());
            Sse::new(futures::stream::once(
                async move { Ok::<_, Infallible>(event) },
            ))
            .into_response()
        } else {
            Json(response).into_response()
        }
    };
    let call = match call_of(&request) {
        Ok(call) => call,
        Err(error) => return refuse(error),
    };
    let run = match call {
        A2aCall::Get {
            id: task,
            history_length,
        } => {
            let task = Box::pin(protocol::get(
                &state.app,
                &caller,
                &agent,
                &task,
                history_length,
            ))
            .await;
            return Json(answer(&id, task)).into_response();
        }
        A2aCall::Cancel { id: task } => {
            let task = Box::pin(protocol::cancel(&state.app, &caller, &agent, &task)).await;
            return Json(answer(&id, task)).into_response();
        }
        A2aCall::List(list) => {
            let page = protocol::list(&state.app, &caller, &agent, &list).await;
            return Json(answer(&id, page)).into_response();
        }
        A2aCall::Send {
            params,
            stream: false,
        } => {
            let task = match Box::pin(protocol::send(&state.app, &caller, &agent, &params)).await {
                Ok(run) => Box::pin(protocol::blocking(&state.app, &run, &params)).await,
                Err(error) => Err(error),
            };
            return Json(answer(&id, task)).into_response();
        }
        A2aCall::Send {
            params,
            stream: true,
        } => Box::pin(protocol::send(&state.app, &caller, &agent, &params)).await,
        A2aCall::Resubscribe { id: task } => {
            Box::pin(protocol::resubscribe(&state.app, &caller, &agent, &task)).await
        }
    };
    let run = match run {
        Ok(run) => run,
        Err(error) => return refuse(error),
    };
    let events = protocol::events(&state.app, run).map(move |result| {
        Ok::<_, Infallible>(Event::default().data(answer(&id, Ok(result)).to_string()))
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}
