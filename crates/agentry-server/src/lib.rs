//! Agentry's HTTP API.
//!
//! `agentry serve` mounts [`router`] on axum: inference (waiting or streamed as SSE), durable
//! sessions (list, inspect, attach to a live run, fork, delete), the configuration of models,
//! tools, prompt templates and secrets, and standalone sandboxes (`/v1/sandboxes`). Runs belong
//! to the application ([`agentry_app::App`]), not to the connection that started them: they
//! keep going when every client disconnects, and any client can attach to a session and receive
//! its committed events (each with its seq as the SSE id) and then its live ones. This crate
//! only parses, submits to the app and renders.

pub mod access;
pub mod authorization;
pub mod console;
pub mod error;
pub mod mcp_endpoint;
pub mod metrics;
pub mod middleware;
pub mod openapi;
pub mod prefixes;
pub mod relay;
pub mod routes;
pub mod serve;
pub mod state;

pub use error::ApiError;
pub use routes::router;
pub use serve::{LISTEN_BACKLOG, ServeError, ServerConfig, listen, serve, without_delay};
pub use state::AppState;

/// The size of the future an async function of three arguments (a handler of three extractors,
/// a middleware) returns, without calling it: what a request in flight keeps of it.
#[cfg(test)]
pub(crate) fn future_size<F, A, B, C, Fut>(_function: F) -> usize
where
    F: FnOnce(A, B, C) -> Fut,
{
    std::mem::size_of::<Fut>()
}
