//! Agentry's HTTP API.
//!
//! `agentry serve` mounts [`router`] on axum: inference (waiting or streamed as SSE), durable
//! sessions (list, inspect, attach to a live run, fork, delete), the configuration of models,
//! tools, prompt templates and secrets, and standalone sandboxes (`/v1/sandboxes`: commands,
//! background processes, files; see [`sandboxes`]). Runs belong to the server, not to the
//! connection that started them: they keep going when every client disconnects, and any client
//! can attach to a session and receive its committed events (each with its seq as the SSE id)
//! and then its live ones.

pub mod access;
pub mod auth;
pub mod authorization;
pub mod console;
pub mod delegation;
pub mod elicitation;
pub mod error;
pub mod group;
pub mod hub;
pub mod mcp;
pub mod mcp_endpoint;
pub mod memory_prompt;
pub mod metrics;
pub mod middleware;
pub mod models;
pub mod openapi;
pub mod routes;
pub mod sandboxes;
pub mod serve;
pub mod state;
pub mod store_log;

pub use error::ApiError;
pub use routes::router;
pub use serve::{ServeError, ServerConfig, serve};
pub use state::{AppState, ToolEnvironment};
pub use store_log::StoreLog;
