//! Trigger URLs: `POST /hooks/workflows/{id}` starts a run of the workflow with the request's
//! body as its input. Other systems call it, so it is authenticated by the workflow's trigger
//! secret (a Standard Webhooks signature, or the secret as a bearer token), not by an API key;
//! it lives outside `/v1` and the OpenAPI document, like `/metrics`. What it checks and how a
//! delivery starts one run is [`agentry_app::workflows::triggers`].

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::json;

use agentry_app::workflows::triggers::Delivery;

use crate::error::ApiError;
use crate::state::AppState;

/// The trigger routes.
pub fn routes() -> Router<AppState> {
    Router::new().route("/hooks/workflows/{id}", post(trigger))
}

/// 202 `{"run_id", "state", "created": true}` for a new run; 200 with `created: false` for a
/// delivery seen before (its run); 401 when not authenticated.
async fn trigger(
    State(state): State<AppState>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let text = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let delivery = Delivery {
        webhook_id: text("webhook-id"),
        timestamp: text("webhook-timestamp"),
        signature: text("webhook-signature"),
        bearer: text("authorization")
            .and_then(|value| value.strip_prefix("Bearer ").map(str::to_owned)),
        idempotency_key: text("idempotency-key"),
    };
    let (run, created) = Box::pin(state.app.trigger_workflow(&id, &delivery, &body)).await?;
    let status = if created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let answer = json!({"run_id": run.run_id, "state": run.state, "created": created});
    Ok((status, axum::Json(answer)).into_response())
}
