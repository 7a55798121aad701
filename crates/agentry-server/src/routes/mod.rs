//! The router: every route of the API.
//!
//! The routes of `ops`, `infer`, `sessions`, `runs`, `config`, `agents`, `mcp` and
//! `sandboxes` are registered through [`OpenApiRouter`] from their handlers' `#[utoipa::path]`
//! operations ([`documented`]), which is also where `GET /openapi.json` takes them from (the
//! openapi module).

pub mod a2a;
pub mod agents;
pub mod background;
pub mod config;
pub mod context;
pub mod groups;
pub mod hooks;
pub mod infer;
pub mod keys;
pub mod linglong;
pub mod mcp;
pub mod memories;
pub mod openai;
pub mod ops;
pub mod run_request;
pub mod runs;
pub mod sandboxes;
pub mod schedules;
pub mod sessions;
pub mod sse;
pub mod status;
pub mod terminals;
pub mod usage;
pub mod workflows;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use utoipa_axum::router::OpenApiRouter;

use crate::state::AppState;

/// The largest request body accepted (bytes).
pub const BODY_LIMIT: usize = 4 * 1024 * 1024;

/// The routes registered with their OpenAPI operations: the router and its document together.
pub fn documented() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(ops::routes())
        .merge(infer::routes())
        .merge(sessions::routes())
        .merge(runs::routes())
        .merge(background::routes())
        .merge(schedules::routes())
        .merge(config::routes())
        .merge(agents::routes())
        .merge(memories::routes())
        .merge(context::routes())
        .merge(mcp::routes())
        .merge(sandboxes::routes())
        .merge(groups::routes())
        .merge(keys::routes())
        .merge(terminals::routes())
        .merge(workflows::routes())
        .merge(usage::routes())
}

/// The API's router, with authentication, metrics, request ids and access logs around it.
///
/// `/mcp` (Agentry as an MCP server over streamable HTTP, see [`crate::mcp_endpoint`]) sits
/// behind the same authentication; it is not in the OpenAPI document, the MCP specification
/// describes it. The web console (`/`, `/console/…`, see [`crate::console`]) is served to
/// anyone: it asks for a key when the API does.
pub fn router(state: AppState) -> Router {
    let (documented, _) = documented().split_for_parts();
    let routes = documented
        .merge(status::routes())
        .merge(hooks::routes())
        .merge(linglong::routes())
        .merge(openai::routes())
        .merge(a2a::routes())
        .merge(crate::mcp_endpoint::routes(&state))
        .merge(crate::console::routes())
        .fallback(ops::not_found)
        .method_not_allowed_fallback(ops::method_not_allowed)
        .layer(DefaultBodyLimit::max(BODY_LIMIT));
    crate::middleware::apply(routes, state)
}
