//! `GET /v1/sessions/events`: a live feed of every session's status changes (running, idle,
//! failed, interrupted, updated), as server-sent events named `session.status`.

use std::collections::HashMap;
use std::convert::Infallible;

use axum::Router;
use axum::extract::State;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use futures::{Stream, StreamExt};
use tokio::sync::broadcast::error::RecvError;

use agentry_app::auth::Principal;
use agentry_app::hub::StatusChange;

use crate::authorization::Caller;
use crate::state::AppState;

/// The status-feed routes.
pub fn routes() -> Router<AppState> {
    Router::new().route("/v1/sessions/events", get(feed))
}

/// What a subscriber of the status feed hears: a change it may see, that it missed some, or
/// that the server is shutting down (the last item).
pub(crate) enum FeedItem {
    Change(StatusChange),
    Lagged(u64),
    Shutdown,
}

/// The status changes `caller` may see, as they happen: an admin sees every session's, a
/// `user` key only its own sessions' (whose they are, looked up once each).
pub(crate) fn visible_changes(
    state: AppState,
    caller: Principal,
) -> impl Stream<Item = FeedItem> + Send {
    let mut changes = state.app.hub().status_changes();
    let shutdown = state.app.shutdown_signal().clone();
    let mut visible: HashMap<agentry_types::SessionId, bool> = HashMap::new();
    async_stream::stream! {
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => {
                    yield FeedItem::Shutdown;
                    break;
                }
                change = changes.recv() => match change {
                    Ok(change) => {
                        if !caller.is_admin() {
                            let seen = match visible.get(&change.session_id) {
                                Some(seen) => *seen,
                                None => {
                                    let seen = state.app.may_see_session(&caller, change.session_id)
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
                        yield FeedItem::Change(change);
                    }
                    Err(RecvError::Lagged(missed)) => yield FeedItem::Lagged(missed),
                    Err(RecvError::Closed) => break,
                },
            }
        }
    }
}

async fn feed(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let stream = visible_changes(state, caller).map(|item| {
        Ok(match item {
            FeedItem::Change(change) => {
                let data = serde_json::to_string(&change).unwrap_or_default();
                Event::default().event("session.status").data(data)
            }
            // A slow reader missed some changes: say so, so it can refetch the list.
            FeedItem::Lagged(missed) => Event::default()
                .event("session.lagged")
                .data(format!("{{\"missed\":{missed}}}")),
            FeedItem::Shutdown => Event::default()
                .event("server.shutdown")
                .data("{\"reason\":\"the server is shutting down\"}"),
        })
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
