//! The agent routes: `/v1/agents` lists, saves, replaces and deletes saved agents. What an
//! agent is and how it is checked lives in [`agentry_app::agents`].

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::agents::{AgentConfig, stored_agent};
use agentry_app::config::{ConfigRepo, check_name};

use super::config::{ApiJson, ApiPath, created};
use crate::error::ApiError;
use crate::openapi::{AgentPath, BadRequest, Conflict, JsonBodyErrors, NotFound};
use crate::state::AppState;

/// The agent routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_agents, create_agent))
        .routes(routes!(get_agent, replace_agent, delete_agent))
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
    let agents: Vec<AgentConfig> = ConfigRepo::new(&state.store)
        .list()
        .await?
        .into_iter()
        .map(|(_, agent)| agent)
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
    state.validate_agent(&agent).await?;
    ConfigRepo::new(&state.store)
        .create(&agent.id, &agent)
        .await?;
    if !agent.skills.is_empty() {
        // The runtime registers the skills of every saved agent.
        state.reload_runtime().await?;
    }
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
    state.validate_agent(&agent).await?;
    let repo = ConfigRepo::<AgentConfig>::new(&state.store);
    let Some(old) = repo.get(&id).await? else {
        return Err(no_agent(&id));
    };
    repo.replace(&id, &id, &agent).await?;
    if old.skills != agent.skills {
        state.reload_runtime().await?;
    }
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
    let repo = ConfigRepo::<AgentConfig>::new(&state.store);
    let had_skills = repo
        .get(&id)
        .await
        .ok()
        .flatten()
        .is_some_and(|agent| !agent.skills.is_empty());
    if repo.delete(&id).await? {
        if had_skills {
            state.reload_runtime().await?;
        }
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(no_agent(&id))
    }
}
