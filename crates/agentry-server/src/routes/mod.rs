//! The router: every route of the API.

pub mod config;
pub mod infer;
pub mod ops;
pub mod sessions;
pub mod sse;
pub mod status;

use axum::Router;
use axum::extract::DefaultBodyLimit;

use crate::state::AppState;

/// The largest request body accepted (bytes).
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// The API's router, with authentication, metrics, request ids and access logs around it.
pub fn router(state: AppState) -> Router {
    let routes = Router::new()
        .merge(ops::routes())
        .merge(status::routes())
        .merge(infer::routes())
        .merge(sessions::routes())
        .merge(config::routes())
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT));
    crate::middleware::apply(routes, state)
}
