//! What an authenticated caller may do: roles and ownership.
//!
//! An `admin` key (and the operator of a server without keys) may do everything. A `user` key
//! may run (within its limits on agents, models and tools), read the catalogue of models,
//! agents, tools and templates, and use only the sessions, runs and sandboxes it created;
//! everything else (configuration, keys, secrets, MCP servers, memories, metrics, the MCP
//! endpoint) is 403. Somebody else's session, run or sandbox is 404, exactly as if it did not
//! exist, so ids cannot be probed. The checks run in a middleware after authentication, by the
//! route's path, before any handler; listings and searches filter by owner in their handlers
//! ([`Caller::owner_filter`](agentry_app::auth::Principal::owner_filter)).

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use agentry_types::{RunId, SessionId};

use crate::error::ApiError;
use crate::state::AppState;
use agentry_app::auth::Principal;

/// The caller of a request, as the authentication middleware found it.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<Principal>()
            .cloned()
            .map(Caller)
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "this request was not authenticated",
                )
            })
    }
}

/// Whether a `user` key may call `method path` at all (ownership aside).
fn user_may(method: &Method, path: &str) -> bool {
    let read = *method == Method::GET;
    let under = |prefix: &str| path == prefix || path.starts_with(&format!("{prefix}/"));
    match path {
        "/v1/infer" | "/v1/infer/stream" | "/v1/infer/abort" => true,
        "/v1/sandbox/capabilities" => read,
        // Their own usage (the report filters by the key).
        "/v1/usage" => read,
        "/v1/auth/login" | "/v1/auth/logout" | "/v1/auth/status" => true,
        // Its own webhook signing secret (an admin's call rotates the server's).
        "/v1/webhook-secret" => *method == Method::POST,
        _ if under("/v1/sessions")
            || under("/v1/workspace")
            || under("/v1/runs")
            || under("/v1/groups")
            || under("/v1/sandboxes")
            || under("/v1/sandbox-snapshots")
            || under("/v1/terminals") =>
        {
            true
        }
        // The catalogue, read-only (an agent's memories are the admin's).
        _ if under("/v1/models")
            || under("/v1/tools")
            || under("/v1/prompt-templates")
            || under("/v1/skills") =>
        {
            read && !path.ends_with("/test")
        }
        _ if under("/v1/agents") => read && !path.ends_with("/memories"),
        _ => false,
    }
}

/// A resource that belongs to someone, named in a path.
enum Owned {
    Session(SessionId),
    Run(RunId),
    Sandbox(uuid::Uuid),
}

/// The owned resource `path` names, if any (ids that do not parse are left to the handler).
fn owned_resource(path: &str) -> Option<Owned> {
    let mut parts = path.trim_start_matches('/').split('/');
    let (Some("v1"), Some(collection), Some(id)) = (parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    match collection {
        "sessions" | "groups" => SessionId::parse(id).ok().map(Owned::Session),
        "runs" => RunId::parse(id).ok().map(Owned::Run),
        "sandboxes" => uuid::Uuid::parse_str(id).ok().map(Owned::Sandbox),
        _ => None,
    }
}

/// The middleware: refuses what the caller's role does not allow (403) and somebody else's
/// session, run or sandbox (404).
pub(crate) async fn authorize(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let Some(caller) = request.extensions().get::<Principal>().cloned() else {
        return next.run(request).await;
    };
    if caller.is_admin() {
        return next.run(request).await;
    }
    // The seed's API (`/linglong/v1/…`) is the same API in other shapes: the same rules.
    let full = request.uri().path();
    let path = full
        .strip_prefix(crate::prefixes::LINGLONG)
        .filter(|rest| rest.starts_with("/v1/"))
        .unwrap_or(full)
        .to_owned();
    // The OpenAI-compatible API: a chat completion is a run, its models the catalogue.
    let path = match path.strip_prefix(crate::prefixes::OPENAI) {
        Some("/chat/completions") => "/v1/infer".to_owned(),
        Some("/models") => "/v1/models".to_owned(),
        Some(rest) if rest == "/responses" || rest.starts_with("/responses/") => {
            "/v1/infer".to_owned()
        }
        Some(_) => "/v1/openai".to_owned(),
        None => path,
    };
    // A2A: a published agent's card is the agent's; its JSON-RPC calls are runs (the tasks'
    // owners are checked by the calls).
    let path = match path.strip_prefix(crate::prefixes::A2A) {
        Some(rest) if rest.contains("/.well-known/") => "/v1/agents/a2a".to_owned(),
        None if path.starts_with("/.well-known/agent") => "/v1/agents/a2a".to_owned(),
        Some(_) => "/v1/infer".to_owned(),
        None => path,
    };
    let is_api =
        path.starts_with("/v1/") || path == "/metrics" || path == crate::mcp_endpoint::MCP_PATH;
    if is_api && !user_may(request.method(), &path) {
        return ApiError::new(
            StatusCode::FORBIDDEN,
            "permission_denied",
            format!(
                "{} {path} needs an admin API key (this key's role is `user`)",
                request.method()
            ),
        )
        .into_response();
    }
    // The store's lookups are boxed: this middleware's future is kept for every request in
    // flight, and an unboxed lookup would make it as large as the lookup for all of them.
    let visible = match owned_resource(&path) {
        None => Ok(true),
        Some(Owned::Session(id)) => Box::pin(state.app.may_see_session(&caller, id))
            .await
            .map_err(ApiError::from),
        Some(Owned::Run(id)) => match Box::pin(state.app.locate(id)).await {
            Ok(session) => Box::pin(state.app.may_see_session(&caller, session))
                .await
                .map_err(ApiError::from),
            Err(_) => Ok(true),
        },
        Some(Owned::Sandbox(id)) => Ok(state.app.sandboxes().may_see(&caller, id)),
    };
    match visible {
        Ok(true) => next.run(request).await,
        Ok(false) => {
            let what = match owned_resource(&path) {
                Some(Owned::Run(_)) => "run",
                Some(Owned::Sandbox(_)) => "sandbox",
                _ => "session",
            };
            let id = path.split('/').nth(3).unwrap_or_default();
            ApiError::not_found(format!("no {what} {id}")).into_response()
        }
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_keys_reach_runs_and_their_work_but_not_configuration() {
        for (method, path) in [
            (Method::POST, "/v1/infer"),
            (Method::POST, "/v1/infer/stream"),
            (Method::GET, "/v1/sessions"),
            (Method::DELETE, "/v1/sessions/x"),
            (Method::POST, "/v1/runs/x/approvals"),
            (Method::POST, "/v1/sandboxes"),
            (Method::GET, "/v1/models"),
            (Method::GET, "/v1/tools/current_time"),
            (Method::GET, "/v1/agents/writer"),
        ] {
            assert!(user_may(&method, path), "{method} {path}");
        }
        for (method, path) in [
            (Method::POST, "/v1/models"),
            (Method::POST, "/v1/models/x/test"),
            (Method::PUT, "/v1/tools/x"),
            (Method::POST, "/v1/tools/mcp"),
            (Method::POST, "/v1/tools/call"),
            (Method::GET, "/v1/api-keys"),
            (Method::POST, "/v1/env"),
            (Method::GET, "/v1/env"),
            (Method::GET, "/v1/agents/x/memories"),
            (Method::DELETE, "/v1/memories/1"),
            (Method::POST, "/v1/agents"),
            (Method::GET, "/v1/mcp-servers"),
            (Method::GET, "/metrics"),
            (Method::POST, "/mcp"),
            (Method::GET, "/v1/sessionsx"),
        ] {
            assert!(!user_may(&method, path), "{method} {path}");
        }
    }
}
