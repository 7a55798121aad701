//! API keys: `GET /v1/api-keys` lists them (never a key itself), `POST` creates one (`admin`
//! or `user`, with limits) and shows it once, `DELETE /v1/api-keys/{key_id}` revokes one.
//! Creating the first key (always an admin) turns authentication on for good (see
//! [`agentry_app::auth`]); revoking takes effect on the next request, and the last active admin key
//! cannot be revoked over the API (409).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::config::{ApiJson, ApiPath};
use crate::error::ApiError;
use crate::openapi::{BadRequest, Conflict, JsonBodyErrors, NotFound};
use crate::state::AppState;
use agentry_app::auth::{AuthError, KeyLimits, KeyRole};

/// The API-key routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(get_key, revoke))
}

/// A key with its use of each quota.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApiKeyDetail {
    /// The key.
    #[serde(flatten)]
    pub key: ApiKeyInfo,
    /// Each quota's use and limit (`limit: null`: none; an admin key has none).
    pub quotas: agentry_app::quotas::QuotaReport,
}

/// One API key (never the key itself), with what it uses of each of its quotas: runs going,
/// sandboxes and terminals open, sessions created in the last minute, tokens of the last day.
#[utoipa::path(
    get,
    path = "/v1/api-keys/{key_id}",
    tag = "auth",
    operation_id = "get_api_key",
    params(KeyPath),
    responses(
        (status = 200, description = "The key and its quotas.", body = ApiKeyDetail),
        BadRequest,
        NotFound,
    )
)]
async fn get_key(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    check_key_id(&id)?;
    let Some((key, quotas)) = state.app.key_with_quotas(&id).await? else {
        return Err(ApiError::not_found(format!("no API key {id}")));
    };
    let mut shown =
        serde_json::to_value(&key).map_err(|error| ApiError::internal(error.to_string()))?;
    shown["quotas"] =
        serde_json::to_value(&quotas).map_err(|error| ApiError::internal(error.to_string()))?;
    Ok(Json(shown))
}

/// A key id is 12 hexadecimal digits.
fn check_key_id(id: &str) -> Result<(), ApiError> {
    if id.len() != 12 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(ApiError::bad_request(
            "a key id is 12 hexadecimal digits (the part after `agk_`)",
        ));
    }
    Ok(())
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
    /// What it may do.
    pub role: KeyRole,
    /// Which agents, models and tools it may use (a `user` key's).
    pub limits: KeyLimits,
}

/// The keys, newest first.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ApiKeyList {
    /// The keys.
    pub keys: Vec<ApiKeyInfo>,
    /// Whether authentication is on (a key was ever created; revoking keys does not turn it
    /// off, `agentry keys reset` on the server's machine does).
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
    /// `admin` (everything) or `user` (runs, and only its own sessions, runs and sandboxes).
    /// Default `user`; the first key is always an admin.
    #[serde(default = "user_role")]
    pub role: KeyRole,
    /// Which agents, models and tools a `user` key may use (absent: any).
    #[serde(default)]
    pub limits: KeyLimits,
}

fn user_role() -> KeyRole {
    KeyRole::User
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
    /// Its role.
    pub role: KeyRole,
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
        AuthError::InvalidLabel(_) | AuthError::InvalidLimits(_) => {
            ApiError::bad_request(error.to_string())
        }
        AuthError::LastAdmin(_) => ApiError::conflict(error.to_string()),
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
    let keys = state.auth.keys().await.map_err(auth_error)?;
    let enabled = !keys.is_empty();
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
    let created = state
        .auth
        .create_key(&body.label, body.role, body.limits)
        .await
        .map_err(auth_error)?;
    let role = state
        .auth
        .keys()
        .await
        .map_err(auth_error)?
        .into_iter()
        .find(|key| key.id == created.id)
        .map_or(body.role, |key| key.role);
    Ok((
        StatusCode::CREATED,
        Json(json!({"id": created.id, "key": created.key, "label": body.label, "role": role})),
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
        Conflict,
    )
)]
async fn revoke(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    check_key_id(&id)?;
    if state.auth.revoke_key(&id).await.map_err(auth_error)? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no API key {id}")))
    }
}
