//! Operations: liveness, readiness, the cluster's nodes, the OpenAPI document, and the JSON 404.

use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::cluster::NotReady;

use crate::error::ApiError;
use crate::openapi::{Health, Readiness, ServiceUnavailable};
use crate::state::AppState;

/// The operations routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(cluster))
        .routes(routes!(openapi_json))
}

/// Liveness: the process answers.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    operation_id = "healthz",
    responses((status = 200, description = "The server is up.", body = Health))
)]
async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Readiness: ready when the database answers and has room for writes (a full disk makes the
/// node unready, `storage_full`, until a write commits again).
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    operation_id = "readyz",
    responses(
        (status = 200, description = "Ready to serve.", body = Readiness),
        ServiceUnavailable,
    )
)]
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let ready = state.app.readiness().await.map_err(|error| {
        let code = match error {
            NotReady::Unreachable(_) => "unavailable",
            NotReady::StorageFull(_) => "storage_full",
        };
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, error.to_string())
    })?;
    // Readiness is public (load balancers probe it); what it tells beyond that is not, once
    // the server has API keys.
    if state.auth.enabled().await.unwrap_or(true) {
        return Ok(Json(json!({ "status": "ready" })));
    }
    Ok(Json(json!({
        "status": "ready",
        "database": ready.database,
        "schema_version": ready.schema_version,
        "live_runs": ready.live_runs,
    })))
}

/// The nodes sharing this server's database: each one's address, version, state (`alive`,
/// `dead`: no heartbeat within its lease, its runs go to the others; `stopped`), last heartbeat,
/// runs and load.
#[utoipa::path(
    get,
    path = "/v1/cluster",
    tag = "operations",
    operation_id = "cluster",
    responses((status = 200, description = "The cluster.", body = agentry_app::cluster::ClusterView))
)]
async fn cluster(
    State(state): State<AppState>,
) -> Result<Json<agentry_app::cluster::ClusterView>, ApiError> {
    Ok(Json(state.app.cluster().await?))
}

/// This API's OpenAPI 3.1 document.
#[utoipa::path(
    get,
    path = "/openapi.json",
    tag = "operations",
    operation_id = "openapi",
    responses((status = 200, description = "The OpenAPI 3.1 document of this API.", body = Object))
)]
async fn openapi_json() -> Result<Response, ApiError> {
    let document = crate::openapi::document_json()?;
    Ok(([(header::CONTENT_TYPE, "application/json")], document).into_response())
}

/// A known route with the wrong method: a JSON 405.
pub async fn method_not_allowed(method: axum::http::Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not accept {method}", uri.path()),
    )
}

/// Every unknown route: a JSON 404.
pub async fn not_found(uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {}", uri.path()))
}
