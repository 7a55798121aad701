//! `GET /v1/sessions/events`: a live feed of every session's status changes (running, idle,
//! failed, interrupted, updated), as server-sent events named `session.status`.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures::Stream;
use tokio::sync::broadcast::error::RecvError;

use crate::authorization::Caller;
use crate::state::AppState;

/// The status-feed routes.
pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/sessions/events", get(feed))
}

async fn feed(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut changes = state.hub.status_changes();
    let shutdown = state.shutdown.clone();
    // A `user` key sees only its own sessions' changes (whose they are, looked up once each).
    let mut visible: HashMap<agentry_types::SessionId, bool> = HashMap::new();
    let stream = async_stream::stream! {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    yield Ok(Event::default().event("server.shutdown").data("{\"reason\":\"the server is shutting down\"}"));
                    break;
                }
                change = changes.recv() => match change {
                    Ok(change) => {
                        if !caller.is_admin() {
                            let seen = match visible.get(&change.session_id) {
                                Some(seen) => *seen,
                                None => {
                                    let seen = state.may_see_session(&caller, change.session_id)
                                        .await
                                        .unwrap_or(false);
                                    visible.insert(change.session_id, seen);
                                    seen
                                }
                            };
                            if !seen {
                                continue;
                            }
                        }
                        let data = serde_json::to_string(&change).unwrap_or_default();
                        yield Ok(Event::default().event("session.status").data(data));
                    }
                    // A slow reader missed some changes: say so, so it can refetch the list.
                    Err(RecvError::Lagged(missed)) => {
                        yield Ok(Event::default().event("session.lagged").data(format!("{{\"missed\":{missed}}}")));
                    }
                    Err(RecvError::Closed) => break,
                },
            }
        }
    };
    Sse::new(stream).keep_alive(KeepAlive::default())
}
