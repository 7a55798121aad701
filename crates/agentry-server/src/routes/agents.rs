//! Agents: a saved model, tools, system prompt, nickname, labels and limits, used by name in
//! `POST /v1/infer` (`agent_ids`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_llm::GenerationParams;
use agentry_store::{ConfigKind, Store};

use super::config::{ApiJson, ApiPath, WRITE_LOCK, check_name, created, to_document};
use crate::error::ApiError;
use crate::openapi::{AgentPath, BadRequest, Conflict, JsonBodyErrors, NotFound};
use crate::state::AppState;

/// A saved agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The id requests name it by.
    #[serde(alias = "agent_id")]
    pub id: String,
    /// A display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nickname: Option<String>,
    /// The model it runs on.
    pub model_id: String,
    /// The tools it may use (none if empty).
    #[serde(default)]
    pub tool_ids: Vec<String>,
    /// Its system prompt.
    #[serde(
        default,
        alias = "system_prompt",
        skip_serializing_if = "Option::is_none"
    )]
    pub system: Option<String>,
    /// Labels for finding it.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Tool rounds allowed per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_rounds: Option<u32>,
    /// Generation parameters.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub params: GenerationParams,
}

/// The agent routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_agents, create_agent))
        .routes(routes!(get_agent, replace_agent, delete_agent))
}

/// Checks an agent against the runtime: its model and tools must exist.
fn validate(state: &AppState, agent: &AgentConfig) -> Result<(), ApiError> {
    check_name("agent", &agent.id)?;
    let runtime = state.sessions.runtime();
    if runtime.model_client(&agent.model_id).is_err() {
        return Err(ApiError::bad_request(format!(
            "agent {:?} uses the model {:?}, which is not registered (POST /v1/models)",
            agent.id, agent.model_id
        )));
    }
    for tool in &agent.tool_ids {
        if !runtime.tools().contains(tool) {
            return Err(ApiError::bad_request(format!(
                "agent {:?} uses the tool {tool:?}, which does not exist",
                agent.id
            )));
        }
    }
    if agent
        .nickname
        .as_ref()
        .is_some_and(|n| n.chars().count() > 64 || n.trim().is_empty())
    {
        return Err(ApiError::bad_request("a nickname has 1 to 64 characters"));
    }
    if agent.labels.len() > 32
        || agent
            .labels
            .iter()
            .any(|l| l.is_empty() || l.chars().count() > 64)
    {
        return Err(ApiError::bad_request(
            "at most 32 labels, each of 1 to 64 characters",
        ));
    }
    Ok(())
}

/// The stored agent named `id`.
pub async fn stored_agent(store: &Store, id: &str) -> Result<Option<AgentConfig>, ApiError> {
    match store.config(ConfigKind::Agent, id).await? {
        Some(value) => serde_json::from_value(value).map(Some).map_err(|error| {
            ApiError::internal(format!("stored agent {id:?} is unreadable: {error}"))
        }),
        None => Ok(None),
    }
}

fn no_agent(id: &str) -> ApiError {
    ApiError::not_found(format!("no agent {id:?}"))
}

/// Every agent.
#[utoipa::path(
    get,
    path = "/v1/agents",
    tag = "agents",
    operation_id = "list_agents",
    responses((status = 200, description = "Every agent, by id.", body = Object))
)]
async fn list_agents(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let agents: Vec<Value> = state
        .store
        .list_config(ConfigKind::Agent)
        .await?
        .into_iter()
        .map(|(_, value)| value)
        .collect();
    Ok(Json(json!({ "agents": agents })))
}

/// Saves an agent.
#[utoipa::path(
    post,
    path = "/v1/agents",
    tag = "agents",
    operation_id = "create_agent",
    request_body = AgentConfig,
    responses(
        (status = 201, description = "Saved.", body = AgentConfig,
         links(
             ("get_agent" = (operation_id = "get_agent", parameters(("id" = "$response.body#/id")))),
             ("delete_agent" = (operation_id = "delete_agent", parameters(("id" = "$response.body#/id")))),
         )),
        JsonBodyErrors,
        Conflict,
    )
)]
async fn create_agent(
    State(state): State<AppState>,
    ApiJson(agent): ApiJson<AgentConfig>,
) -> Result<Response, ApiError> {
    validate(&state, &agent)?;
    let _guard = WRITE_LOCK.lock().await;
    if stored_agent(&state.store, &agent.id).await?.is_some() {
        return Err(ApiError::conflict(format!(
            "an agent {:?} already exists",
            agent.id
        )));
    }
    state
        .store
        .put_config(ConfigKind::Agent, &agent.id, &to_document(&agent)?)
        .await?;
    Ok(created(agent))
}

/// An agent.
#[utoipa::path(
    get,
    path = "/v1/agents/{id}",
    tag = "agents",
    operation_id = "get_agent",
    params(AgentPath),
    responses(
        (status = 200, description = "The agent.", body = AgentConfig),
        BadRequest,
        NotFound,
    )
)]
async fn get_agent(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<AgentConfig>, ApiError> {
    check_name("agent", &id)?;
    stored_agent(&state.store, &id)
        .await?
        .map(Json)
        .ok_or_else(|| no_agent(&id))
}

/// Replaces an agent (the body's id must be the path's).
#[utoipa::path(
    put,
    path = "/v1/agents/{id}",
    tag = "agents",
    operation_id = "replace_agent",
    params(AgentPath),
    request_body = AgentConfig,
    responses(
        (status = 200, description = "Replaced.", body = AgentConfig),
        JsonBodyErrors,
        NotFound,
    )
)]
async fn replace_agent(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(agent): ApiJson<AgentConfig>,
) -> Result<Json<AgentConfig>, ApiError> {
    check_name("agent", &id)?;
    if agent.id != id {
        return Err(ApiError::bad_request("the body's id must be the path's id"));
    }
    validate(&state, &agent)?;
    let _guard = WRITE_LOCK.lock().await;
    if stored_agent(&state.store, &id).await?.is_none() {
        return Err(no_agent(&id));
    }
    state
        .store
        .put_config(ConfigKind::Agent, &id, &to_document(&agent)?)
        .await?;
    Ok(Json(agent))
}

/// Deletes an agent.
#[utoipa::path(
    delete,
    path = "/v1/agents/{id}",
    tag = "agents",
    operation_id = "delete_agent",
    params(AgentPath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_agent(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    check_name("agent", &id)?;
    let _guard = WRITE_LOCK.lock().await;
    if state.store.delete_config(ConfigKind::Agent, &id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_agent(&id))
    }
}
