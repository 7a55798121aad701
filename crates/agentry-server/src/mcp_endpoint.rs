//! Agentry as an MCP server over streamable HTTP at `/mcp` ([`routes`], behind the API's
//! authentication). The backend, the saved agents as `ask_<agent id>` tools, is the app's
//! [`agentry_app::mcp_server::McpServer`], the same one `agentry mcp serve` serves over stdio.

use std::sync::Arc;

use axum::Router;
use axum::extract::Request;
use axum::response::IntoResponse;
use axum::routing::any;

use agentry_app::domain::mcp::server::{HttpOptions, McpHttpService};
use agentry_app::mcp_server::{McpServer, identity};

use crate::state::AppState;

/// The path of the streamable HTTP endpoint.
pub const MCP_PATH: &str = "/mcp";

/// The `/mcp` route: MCP over streamable HTTP (`POST` messages, `GET` a session's stream,
/// `DELETE` a session), served from `state`. Authentication is the API's middleware; the
/// endpoint refuses browser origins outside the allowed ones, and its streams end when the
/// server shuts down.
pub fn routes(state: &AppState) -> Router<AppState> {
    let options = HttpOptions {
        identity: identity(),
        // Checked here, on every request: the server's own origin (a page it serves) and the
        // configured ones.
        origins_checked: true,
        allowed_origins: Vec::new(),
        shutdown: state.app.shutdown_signal().clone(),
        keep_alive: None,
    };
    let service = McpHttpService::new(Arc::new(McpServer::new(state.app.clone())), options);
    let access = state.access.clone();
    Router::new().route(
        MCP_PATH,
        any(move |request: Request| {
            let service = service.clone();
            let checked = access.check_origin(request.headers());
            async move {
                match checked {
                    Ok(()) => Box::pin(service.handle(request)).await.into_response(),
                    Err(refused) => refused.into_api_error().into_response(),
                }
            }
        }),
    )
}
