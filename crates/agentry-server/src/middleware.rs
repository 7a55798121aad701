//! What wraps every route: request ids, access logs, CORS, metrics, authentication; and the
//! routes that belong to them (`/metrics`, `/v1/auth/*`).

use std::time::Instant;

use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{Next, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultMakeSpan, DefaultOnResponse, TraceLayer};

use crate::auth::SESSION_COOKIE;
use crate::error::ApiError;
use crate::state::AppState;

/// Wraps the routes and attaches the state.
pub fn apply(routes: Router<AppState>, state: AppState) -> Router {
    let cors = cors_layer(&state.cors_origins);
    routes
        .merge(own_routes())
        .layer(from_fn_with_state(state.clone(), authenticate))
        .layer(from_fn_with_state(state.clone(), track))
        .layer(cors)
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(DefaultMakeSpan::new().include_headers(false))
                .on_response(DefaultOnResponse::new().level(tracing::Level::INFO)),
        )
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .with_state(state)
}

/// CORS is off unless origins are allowed explicitly.
fn cors_layer(origins: &[String]) -> CorsLayer {
    let allowed: Vec<HeaderValue> = origins
        .iter()
        .filter_map(|origin| HeaderValue::from_str(origin).ok())
        .collect();
    if allowed.is_empty() {
        return CorsLayer::new();
    }
    CorsLayer::new()
        .allow_origin(AllowOrigin::list(allowed))
        .allow_methods([Method::GET, Method::POST, Method::PUT, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::HeaderName::from_static("last-event-id"),
            // The MCP endpoint's session and protocol headers (streamable HTTP).
            header::HeaderName::from_static("mcp-session-id"),
            header::HeaderName::from_static("mcp-protocol-version"),
        ])
        .expose_headers([header::HeaderName::from_static("mcp-session-id")])
        .allow_credentials(true)
}

fn own_routes() -> Router<AppState> {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/v1/auth/login", post(login))
        .route("/v1/auth/logout", post(logout))
        .route("/v1/auth/status", get(status))
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        state.metrics.render(),
    )
        .into_response()
}

/// Counts every request and its latency; counts open SSE streams.
async fn track(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_owned();
    let response = next.run(request).await;
    state
        .metrics
        .http(&method, response.status().as_u16(), started.elapsed());
    let streaming = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    if !streaming {
        return response;
    }
    let guard = state.metrics.stream_opened();
    let (parts, body) = response.into_parts();
    let stream = body.into_data_stream().map(move |chunk| {
        let _open = &guard;
        chunk
    });
    Response::from_parts(parts, Body::from_stream(stream))
}

/// The credentials a request carries.
fn credentials(request: &Request) -> (Option<String>, Option<String>) {
    let bearer = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|v| v.trim().to_owned());
    let cookie = request
        .headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == SESSION_COOKIE)
        .map(|(_, value)| value.to_owned());
    (bearer, cookie)
}

fn unauthorized(message: &str) -> Response {
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", message).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Every `/v1` route (and `/metrics` and the MCP endpoint `/mcp`) needs a valid key or login
/// once any key exists.
async fn authenticate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let protected =
        (path.starts_with("/v1/") || path == "/metrics" || path == crate::mcp_endpoint::MCP_PATH)
            && path != "/v1/auth/login"
            && path != "/v1/auth/status";
    if !protected || request.method() == Method::OPTIONS {
        return next.run(request).await;
    }
    match state.auth.enabled().await {
        Ok(false) => return next.run(request).await,
        Ok(true) => {}
        Err(error) => return ApiError::internal(error.to_string()).into_response(),
    }
    let (bearer, cookie) = credentials(&request);
    let allowed = match (bearer, cookie) {
        (Some(key), _) => state.auth.verify_key(&key).await.map(|id| id.is_some()),
        (None, Some(token)) => state.auth.verify_login(&token).await,
        (None, None) => {
            return unauthorized(
                "this server needs an API key: send `Authorization: Bearer <key>`",
            );
        }
    };
    match allowed {
        Ok(true) => next.run(request).await,
        Ok(false) => {
            unauthorized("the API key or login is not valid (unknown, revoked or expired)")
        }
        Err(error) => ApiError::internal(error.to_string()).into_response(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    api_key: String,
}

/// Exchanges a key for an HttpOnly session cookie (for the web console).
async fn login(
    State(state): State<AppState>,
    body: Result<Json<LoginBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    let token = state
        .auth
        .login(&body.api_key)
        .await
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let Some(token) = token else {
        return Ok(unauthorized("the API key is not valid"));
    };
    let cookie = format!(
        "{SESSION_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}",
        crate::auth::LOGIN_TTL.as_secs()
    );
    let cookie =
        HeaderValue::from_str(&cookie).map_err(|error| ApiError::internal(error.to_string()))?;
    Ok((StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response())
}

async fn logout(State(state): State<AppState>, request: Request) -> Response {
    if let (_, Some(token)) = credentials(&request) {
        state.auth.logout(&token);
    }
    let expired =
        HeaderValue::from_static("agentry_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0");
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, expired)]).into_response()
}

async fn status(
    State(state): State<AppState>,
    request: Request,
) -> Result<Json<serde_json::Value>, ApiError> {
    let enabled = state
        .auth
        .enabled()
        .await
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let authenticated = match credentials(&request) {
        (Some(key), _) => state
            .auth
            .verify_key(&key)
            .await
            .is_ok_and(|id| id.is_some()),
        (None, Some(token)) => state.auth.verify_login(&token).await.unwrap_or(false),
        (None, None) => false,
    };
    Ok(Json(
        json!({"enabled": enabled, "authenticated": authenticated}),
    ))
}
