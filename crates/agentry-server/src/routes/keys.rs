//! API keys: `GET /v1/api-keys` lists them (never a key itself), `POST` creates one and shows it
//! once, `DELETE /v1/api-keys/{key_id}` revokes one. Creating the first key turns
//! authentication on (see [`crate::auth`]); revoking takes effect on the next request.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::config::{ApiJson, ApiPath};
use crate::auth::{AuthError, create_key, list_keys, revoke_key};
use crate::error::ApiError;
use crate::openapi::{BadRequest, JsonBodyErrors, NotFound};
use crate::state::AppState;

/// The API-key routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(revoke))
}

/// A key as listed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApiKeyInfo {
    /// The key's id (the part after `agk_`).
    pub id: String,
    /// Its label.
    pub label: String,
    /// When it was created (Unix ms).
    pub created_at: u64,
    /// Whether it was revoked.
    pub revoked: bool,
}

/// The keys, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApiKeyList {
    /// The keys.
    pub keys: Vec<ApiKeyInfo>,
    /// Whether authentication is on (some key is not revoked).
    pub auth_enabled: bool,
}

/// A new key.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewKeyBody {
    /// A label for people (at most 200 characters, no control characters).
    #[serde(default)]
    #[schema(max_length = 200)]
    pub label: String,
}

/// A created key: `key` is shown this once.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct CreatedKey {
    /// The key's id.
    pub id: String,
    /// The whole key, for `Authorization: Bearer …` or the console's login.
    pub key: String,
    /// Its label.
    pub label: String,
}

/// The key a route acts on.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct KeyPath {
    /// The key's id (12 hexadecimal digits).
    #[param(pattern = "^[0-9a-f]{12}$")]
    pub key_id: String,
}

fn auth_error(error: AuthError) -> ApiError {
    match error {
        AuthError::InvalidLabel(_) => ApiError::bad_request(error.to_string()),
        AuthError::Store(error) => error.into(),
        AuthError::Random(_) => ApiError::internal(error.to_string()),
    }
}

/// Lists the API keys (never the keys themselves).
#[utoipa::path(
    get,
    path = "/v1/api-keys",
    tag = "auth",
    operation_id = "list_api_keys",
    responses((status = 200, description = "The keys, newest first.", body = ApiKeyList))
)]
async fn list(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let keys = list_keys(&state.store).await.map_err(auth_error)?;
    let enabled = keys.iter().any(|key| !key.revoked);
    Ok(Json(json!({"keys": keys, "auth_enabled": enabled})))
}

/// Creates an API key and returns it once. The first key turns authentication on: from the
/// next request, every `/v1` route needs it (or a console login made with it).
#[utoipa::path(
    post,
    path = "/v1/api-keys",
    tag = "auth",
    operation_id = "create_api_key",
    request_body = NewKeyBody,
    responses(
        (status = 201, description = "Created; `key` is not shown again.", body = CreatedKey),
        JsonBodyErrors,
    )
)]
async fn create(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<NewKeyBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let created = create_key(&state.store, &body.label)
        .await
        .map_err(auth_error)?;
    state.auth.refresh();
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": created.id, "key": created.key, "label": body.label})),
    ))
}

/// Revokes an API key; requests carrying it fail from the next one.
#[utoipa::path(
    delete,
    path = "/v1/api-keys/{key_id}",
    tag = "auth",
    operation_id = "revoke_api_key",
    params(KeyPath),
    responses(
        (status = 204, description = "Revoked."),
        BadRequest,
        NotFound,
    )
)]
async fn revoke(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if id.len() != 12 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(
            "a key id is 12 hexadecimal digits (the part after `agk_`)",
        ));
    }
    if revoke_key(&state.store, &id).await.map_err(auth_error)? {
        state.auth.refresh();
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no API key {id}")))
    }
}
