//! The agent routes: `/v1/agents` lists, saves, replaces and deletes saved agents. What an
//! agent is and how it is checked lives in [`agentry_app::agents`].

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::agents::AgentConfig;
use agentry_app::config::check_name;

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

/// Every agent.
#[utoipa::path(
    get,
    path = "/v1/agents",
    tag = "agents",
    operation_id = "list_agents",
    responses((status = 200, description = "Every agent, by id.", body = Object))
)]
async fn list_agents(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    Ok(Json(json!({ "agents": state.app.agents().await? })))
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
    state.app.create_agent(&agent).await?;
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
    Ok(Json(state.app.agent(&id).await?))
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
    Box::pin(state.app.replace_agent(&agent)).await?;
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
    state.app.delete_agent(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}
