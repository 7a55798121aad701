//! `GET /v1/sessions/events`: a live feed of every session's status changes.

use axum::Router;

use crate::state::AppState;

/// The status-feed routes.
pub fn routes() -> Router<AppState> {
    Router::new()
}
