//! What wraps every route: request ids, access logs, CORS, metrics, authentication; and the
//! routes that belong to them (`/metrics`, `/v1/auth/*`).

use std::time::{Duration, Instant};

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
use tower_http::trace::TraceLayer;

use crate::error::ApiError;
use crate::state::AppState;
use agentry_app::auth::{Principal, SECURE_SESSION_COOKIE, SESSION_COOKIE};

/// Wraps the routes and attaches the state.
pub fn apply(routes: Router<AppState>, state: AppState) -> Router {
    let cors = cors_layer(&state.access.allowed_origins);
    routes
        .merge(own_routes())
        .layer(from_fn_with_state(
            state.clone(),
            crate::authorization::authorize,
        ))
        .layer(from_fn_with_state(state.clone(), authenticate))
        .layer(from_fn_with_state(state.clone(), track))
        .layer(cors)
        // tus: its discovery is an `OPTIONS` the CORS layer must not take for a preflight.
        .layer(axum::middleware::from_fn(
            crate::routes::linglong::tus::gate,
        ))
        .layer(from_fn_with_state(state.clone(), check_access))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(record_status),
        )
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .with_state(state)
}

/// A request's span (`agentry::trace`, so the OpenTelemetry layer exports it as the server
/// span): it continues the caller's trace when the request carries a W3C `traceparent`, and
/// the runs the request starts are its children.
fn request_span(request: &axum::http::Request<Body>) -> tracing::Span {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let route = request
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(axum::extract::MatchedPath::as_str);
    let span = tracing::info_span!(
        target: agentry_app::domain::core::telemetry::TARGET,
        "request",
        // The route's template, not the path: span names stay few (no ids in them).
        otel.name = %format!("{} {}", request.method(), route.unwrap_or(request.uri().path())),
        http.route = route,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        http.request.method = %request.method(),
        url.path = %request.uri().path(),
        http.response.status_code = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        request_id = request
            .headers()
            .get("x-request-id")
            .and_then(|value| value.to_str().ok()),
    );
    if !span.is_disabled() {
        let parent = opentelemetry::global::get_text_map_propagator(|propagator| {
            propagator.extract(&opentelemetry_http::HeaderExtractor(request.headers()))
        });
        let _ = span.set_parent(parent);
        // The trace's id on the span, so each log line of the request (and of its runs) can
        // be found from the trace, and back; only when traces are on (a valid context).
        let context = span.context();
        let trace = opentelemetry::trace::TraceContextExt::span(&context)
            .span_context()
            .clone();
        if trace.is_valid() {
            span.record("trace_id", trace.trace_id().to_string().as_str());
        }
    }
    span
}

/// Records a response's status on its request's span (a 5xx is the span's error) and logs it.
fn record_status<B>(response: &axum::http::Response<B>, latency: Duration, span: &tracing::Span) {
    let status = response.status();
    span.record("http.response.status_code", i64::from(status.as_u16()));
    if status.is_server_error() {
        span.record("otel.status_code", "error");
    }
    tracing::info!(
        target: "tower_http::trace::on_response",
        status = status.as_u16(),
        latency_ms = latency.as_millis() as u64,
        "finished processing request"
    );
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
    match state.app.background_runs().depth().await {
        Ok(depth) => state.metrics.queue(&depth),
        Err(error) => tracing::warn!("cannot read the queue's depth: {}", error.message),
    }
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
        .find(|(name, _)| *name == SESSION_COOKIE || *name == SECURE_SESSION_COOKIE)
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

/// Every `/v1` route (the seed's `/linglong/v1`, the OpenAI-compatible `/openai/v1` and A2A's `/a2a` too, and `/metrics`, `/openapi.json` and the MCP endpoint `/mcp`) needs a
/// valid key or login once any key exists; the caller ([`Principal`]) goes into the request's
/// extensions for [`crate::authorization`] and the handlers.
async fn authenticate(State(state): State<AppState>, mut request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let protected = (path.starts_with("/v1/")
        || path.starts_with("/linglong/v1/")
        || path.starts_with("/openai/v1/")
        || path.starts_with("/a2a/")
        || path.starts_with("/.well-known/agent")
        || path == "/metrics"
        || path == "/openapi.json"
        || path == crate::mcp_endpoint::MCP_PATH)
        && path != "/v1/auth/login"
        && path != "/v1/auth/status";
    if !protected || request.method() == Method::OPTIONS {
        return next.run(request).await;
    }
    match state.auth.enabled().await {
        Ok(false) => {
            request.extensions_mut().insert(Principal::operator());
            return next.run(request).await;
        }
        Ok(true) => {}
        Err(error) => return ApiError::internal(error.to_string()).into_response(),
    }
    // Forwarded by another node of the cluster: its assertion, not the client's credentials.
    if let Some(assertion) = request.headers().get(crate::relay::ASSERTION) {
        let path_and_query = request
            .uri()
            .path_and_query()
            .map_or(path, |whole| whole.as_str());
        let vouched = match assertion.to_str() {
            Ok(assertion) => {
                crate::relay::verify(&state, assertion, request.method(), path_and_query).await
            }
            Err(_) => Ok(None),
        };
        return match vouched {
            Ok(Some(caller)) => {
                request.extensions_mut().insert(caller);
                next.run(request).await
            }
            Ok(None) => unauthorized(
                "the relay assertion is not valid (malformed, for another request, expired, not \
                 signed with this cluster's key, or its key is no longer active)",
            ),
            Err(error) => error.into_response(),
        };
    }
    let (bearer, cookie) = credentials(&request);
    let caller = match (bearer, cookie) {
        (Some(key), _) => state.auth.verify_key(&key).await,
        (None, Some(token)) => state.auth.verify_login(&token).await,
        (None, None) => {
            return unauthorized(
                "this server needs an API key: send `Authorization: Bearer <key>`",
            );
        }
    };
    match caller {
        Ok(Some(caller)) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Ok(None) => unauthorized("the API key or login is not valid (unknown, revoked or expired)"),
        Err(error) => ApiError::internal(error.to_string()).into_response(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LoginBody {
    api_key: String,
}

/// Whether the request reached us over TLS (a proxy in front says so).
fn over_tls(headers: &axum::http::HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proto| proto.trim().eq_ignore_ascii_case("https"))
}

/// Exchanges a key for an HttpOnly session cookie (for the web console). Behind TLS the
/// cookie is `Secure` and `__Host-` prefixed; failed attempts are throttled.
async fn login(
    State(state): State<AppState>,
    connection: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: axum::http::HeaderMap,
    body: Result<Json<LoginBody>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Json(body) = body?;
    // Failed logins are counted per client address: one client's guesses hold back no one
    // else's login (behind a trusted proxy, the client it names).
    let peer = connection.map(|axum::Extension(axum::extract::ConnectInfo(peer))| peer.ip());
    let client = state.access.client_address(peer, &headers);
    if let Some(wait) = state.auth.login_throttled(client) {
        let mut response = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            "too many failed logins from this address: wait a minute",
        )
        .into_response();
        if let Ok(value) = HeaderValue::from_str(&wait.as_secs().max(1).to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return Ok(response);
    }
    let token = state
        .auth
        .login(&body.api_key)
        .await
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let Some(token) = token else {
        state.auth.login_failed(client);
        return Ok(unauthorized("the API key is not valid"));
    };
    let (name, secure) = if over_tls(&headers) {
        (SECURE_SESSION_COOKIE, "; Secure")
    } else {
        (SESSION_COOKIE, "")
    };
    let cookie = format!(
        "{name}={token}; HttpOnly; SameSite=Strict; Path=/; Max-Age={}{secure}",
        agentry_app::auth::LOGIN_TTL.as_secs()
    );
    let cookie =
        HeaderValue::from_str(&cookie).map_err(|error| ApiError::internal(error.to_string()))?;
    Ok((StatusCode::NO_CONTENT, [(header::SET_COOKIE, cookie)]).into_response())
}

async fn logout(State(state): State<AppState>, request: Request) -> Response {
    if let (_, Some(token)) = credentials(&request) {
        state.auth.logout(&token);
    }
    let expired = if over_tls(request.headers()) {
        HeaderValue::from_static(
            "__Host-agentry_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0; Secure",
        )
    } else {
        HeaderValue::from_static("agentry_session=; HttpOnly; SameSite=Strict; Path=/; Max-Age=0")
    };
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
    let caller = match credentials(&request) {
        (Some(key), _) => state.auth.verify_key(&key).await.ok().flatten(),
        (None, Some(token)) => state.auth.verify_login(&token).await.ok().flatten(),
        (None, None) => None,
    };
    let role = match (&caller, enabled) {
        (Some(caller), _) => Some(caller.role),
        (None, false) => Some(agentry_app::auth::KeyRole::Admin),
        (None, true) => None,
    };
    Ok(Json(json!({
        "enabled": enabled,
        "authenticated": caller.is_some(),
        "role": role,
        "key_id": caller.and_then(|caller| caller.key_id),
    })))
}

/// The middleware: refuses a request the [`crate::access::AccessPolicy`] does not allow, before anything else
/// (authentication included) sees it.
pub(crate) async fn check_access(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match state.access.check(request.method(), request.headers()) {
        Ok(()) => next.run(request).await,
        Err(error) => {
            tracing::warn!(
                method = %request.method(),
                path = request.uri().path(),
                "refused: {error}"
            );
            error.into_api_error().into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::future_size;

    /// A middleware's future is kept for every request in flight (a thousand streams starting
    /// at once keep a thousand of each): what only some requests await (the store's lookups
    /// of owners) is boxed, not laid out in every one of them.
    #[test]
    fn the_middlewares_futures_stay_small() {
        for (name, size) in [
            ("authenticate", future_size(authenticate)),
            ("authorize", future_size(crate::authorization::authorize)),
            ("track", future_size(track)),
            ("check_access", future_size(check_access)),
        ] {
            assert!(size <= 2048, "{name}'s future takes {size} bytes");
        }
    }
}
