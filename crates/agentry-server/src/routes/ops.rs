//! Operations: liveness, readiness, and the JSON 404.

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::state::AppState;

/// The operations routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Ready when the database answers.
async fn readyz(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let version = state.store.schema_version().await.map_err(|error| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            error.to_string(),
        )
    })?;
    Ok(Json(json!({
        "status": "ready",
        "database": state.store.backend().as_str(),
        "schema_version": version,
        "live_runs": state.hub.live_runs(),
    })))
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
