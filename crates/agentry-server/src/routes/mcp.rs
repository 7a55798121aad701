//! MCP server routes: register servers (`POST /v1/tools/mcp`, the usual `{"mcpServers": {…}}`),
//! see their status and tools, restart or delete them, and list and read their resources and
//! prompts.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::mcp_service::{McpServerList, McpServerView};

use super::config::{ApiJson, ApiPath};
use crate::error::ApiError;
use crate::openapi::{
    BadGateway, BadRequest, GatewayTimeout, HostCommandsRefused, JsonBodyErrors, NotFound,
};
use crate::state::AppState;

/// The MCP routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(register_servers))
        .routes(routes!(list_servers))
        .routes(routes!(get_server, delete_server))
        .routes(routes!(restart_server))
        .routes(routes!(list_resources))
        .routes(routes!(read_resource))
        .routes(routes!(list_prompts))
        .routes(routes!(get_prompt))
}

/// The MCP server a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ServerPath {
    /// The server's name: 1 to 32 of `A-Z a-z 0-9 _ -`, without `__`.
    #[param(pattern = "^[A-Za-z0-9-]+(_[A-Za-z0-9-]+)*$", max_length = 32)]
    pub name: String,
}

/// The body of `POST /v1/mcp-servers/{name}/resources/read`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadResourceRequest {
    /// The resource's URI.
    #[schema(min_length = 1, max_length = 4096)]
    pub uri: String,
}

/// The body of `POST /v1/mcp-servers/{name}/prompts/get`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GetPromptRequest {
    /// The prompt's name.
    #[schema(min_length = 1, max_length = 256)]
    pub name: String,
    /// Its arguments.
    #[serde(default)]
    pub arguments: BTreeMap<String, String>,
}

/// Registers MCP servers.
///
/// The body is the usual `{"mcpServers": {name: {command, args, env, cwd} or {url, headers}}}`;
/// values of `env` and `headers` may be `{"secret": "NAME"}` (see `/v1/env`). Servers are
/// saved, started (a server of the same name is replaced), and waited for up to 30 s; the answer
/// gives each one's status and tools.
///
/// A stdio server runs in a sandbox of its own (its workspace `<data>/mcp-workspaces/<name>`,
/// the server's sandbox network policy and read-only mounts). Without a sandbox, or with
/// `"host": true`, it would run on the host: that is refused (403) unless the server runs with
/// `--allow-host-commands`, and whenever host commands are allowed, registering a stdio server
/// needs an API key (403 `api_key_required` while the server has none). Nothing is saved or
/// started when one server is refused.
#[utoipa::path(
    post,
    path = "/v1/tools/mcp",
    tag = "mcp",
    operation_id = "register_mcp_servers",
    request_body(content = Object, description = "`{\"mcpServers\": {name: config}}`"),
    responses(
        (status = 201, description = "Saved and started.", body = McpServerList),
        JsonBodyErrors,
        HostCommandsRefused,
    )
)]
async fn register_servers(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let keys_exist = state
        .auth
        .enabled()
        .await
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let servers = state.app.mcp().register(&body, keys_exist).await?;
    Ok((StatusCode::CREATED, Json(servers)).into_response())
}

/// Every MCP server with its status.
#[utoipa::path(
    get,
    path = "/v1/mcp-servers",
    tag = "mcp",
    operation_id = "list_mcp_servers",
    responses((status = 200, description = "Every server, by name.", body = McpServerList))
)]
async fn list_servers(State(state): State<AppState>) -> Json<McpServerList> {
    Json(state.app.mcp().list())
}

/// One MCP server with its status.
#[utoipa::path(
    get,
    path = "/v1/mcp-servers/{name}",
    tag = "mcp",
    operation_id = "get_mcp_server",
    params(ServerPath),
    responses(
        (status = 200, description = "The server.", body = McpServerView),
        BadRequest,
        NotFound,
    )
)]
async fn get_server(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<McpServerView>, ApiError> {
    Ok(Json(state.app.mcp().get(&name)?))
}

/// Stops and deletes an MCP server; its tools leave the runtime.
#[utoipa::path(
    delete,
    path = "/v1/mcp-servers/{name}",
    tag = "mcp",
    operation_id = "delete_mcp_server",
    params(ServerPath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_server(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.mcp().delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Restarts an MCP server (a new process or connection) and waits up to 30 s for it.
#[utoipa::path(
    post,
    path = "/v1/mcp-servers/{name}/restart",
    tag = "mcp",
    operation_id = "restart_mcp_server",
    params(ServerPath),
    responses(
        (status = 200, description = "Restarted; its status now.", body = McpServerView),
        BadRequest,
        NotFound,
    )
)]
async fn restart_server(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<McpServerView>, ApiError> {
    Ok(Json(state.app.mcp().restart(&name).await?))
}

/// The server's resources (`resources/list`).
#[utoipa::path(
    get,
    path = "/v1/mcp-servers/{name}/resources",
    tag = "mcp",
    operation_id = "list_mcp_resources",
    params(ServerPath),
    responses(
        (status = 200, description = "`{\"resources\": […]}` as the server lists them.", body = Object),
        BadRequest,
        NotFound,
        BadGateway,
        GatewayTimeout,
    )
)]
async fn list_resources(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(Box::pin(state.app.mcp().resources(&name)).await?))
}

/// Reads one resource (`resources/read`).
#[utoipa::path(
    post,
    path = "/v1/mcp-servers/{name}/resources/read",
    tag = "mcp",
    operation_id = "read_mcp_resource",
    params(ServerPath),
    request_body = ReadResourceRequest,
    responses(
        (status = 200, description = "`{\"contents\": […]}` as the server sent them.", body = Object),
        JsonBodyErrors,
        NotFound,
        BadGateway,
        GatewayTimeout,
    )
)]
async fn read_resource(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<ReadResourceRequest>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        Box::pin(state.app.mcp().read_resource(&name, &request.uri)).await?,
    ))
}

/// The server's prompts (`prompts/list`).
#[utoipa::path(
    get,
    path = "/v1/mcp-servers/{name}/prompts",
    tag = "mcp",
    operation_id = "list_mcp_prompts",
    params(ServerPath),
    responses(
        (status = 200, description = "`{\"prompts\": […]}` as the server lists them.", body = Object),
        BadRequest,
        NotFound,
        BadGateway,
        GatewayTimeout,
    )
)]
async fn list_prompts(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(Box::pin(state.app.mcp().prompts(&name)).await?))
}

/// Renders one prompt (`prompts/get`).
#[utoipa::path(
    post,
    path = "/v1/mcp-servers/{name}/prompts/get",
    tag = "mcp",
    operation_id = "get_mcp_prompt",
    params(ServerPath),
    request_body = GetPromptRequest,
    responses(
        (status = 200, description = "`{\"messages\": […]}` as the server rendered them.", body = Object),
        JsonBodyErrors,
        NotFound,
        BadGateway,
        GatewayTimeout,
    )
)]
async fn get_prompt(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(request): ApiJson<GetPromptRequest>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(
        Box::pin(
            state
                .app
                .mcp()
                .prompt(&name, &request.name, request.arguments),
        )
        .await?,
    ))
}
