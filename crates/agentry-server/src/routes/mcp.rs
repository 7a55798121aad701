//! MCP server routes: register servers (`POST /v1/tools/mcp`, the usual `{"mcpServers": {…}}`),
//! see their status and tools, restart or delete them, and list and read their resources and
//! prompts.

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::domain::mcp::{McpServerConfig, ServerStatus, TransportKind, ValueSource};

use super::config::{ApiJson, ApiPath};
use super::serde_name;
use crate::error::ApiError;
use crate::openapi::{
    BadGateway, BadRequest, GatewayTimeout, HostCommandsRefused, JsonBodyErrors, NotFound,
};
use crate::state::AppState;
use agentry_app::config::ConfigRepo;
use agentry_app::mcp_tools::{mcp_error, save_and_start};

/// An MCP manager error as the API reports it.
fn api_error(error: agentry_app::domain::mcp::McpError) -> ApiError {
    mcp_error(error).into()
}

/// How long a registration or restart waits for the server's first connection before it
/// answers with the status it has then (the server keeps starting in the background).
const READY_WAIT: Duration = Duration::from_secs(30);

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

/// A server: its status, tools and configuration (header values and environment values shown
/// only as the name of the secret they come from, or masked).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct McpServerView {
    /// The name.
    pub name: String,
    /// `stdio` or `streamable_http`.
    pub transport: String,
    /// `starting`, `connected`, `restarting`, `failed` or `stopped`.
    pub state: String,
    /// How many tools it offers.
    pub tool_count: usize,
    /// Its tools' Agentry names (`<server>__<tool>`).
    pub tools: Vec<String>,
    /// The last error.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// How many times it has been restarted.
    pub restarts: u32,
    /// The process id (stdio, while running; for a sandboxed server, the host pid of its
    /// sandbox's first process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// A stdio server running in a sandbox of its own (`false`: on the host, or not stdio).
    pub sandboxed: bool,
    /// The protocol revision agreed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol_version: Option<String>,
    /// The server's own name and version.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub server_info: Option<Value>,
    /// The configuration, secrets masked.
    #[schema(value_type = Object)]
    pub config: Value,
}

/// Several servers.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct McpServerList {
    /// The servers, by name.
    pub servers: Vec<McpServerView>,
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

/// Masks a configuration for display: literal environment and header values become `***`.
fn masked(config: &McpServerConfig) -> Value {
    let mut shown = config.clone();
    for value in shown.env.values_mut().chain(shown.headers.values_mut()) {
        if let ValueSource::Literal(text) = value {
            *text = "***".into();
        }
    }
    serde_json::to_value(shown).unwrap_or(Value::Null)
}

fn view(state: &AppState, status: ServerStatus) -> McpServerView {
    let config = state
        .mcp
        .config(&status.name)
        .map(|config| masked(&config))
        .unwrap_or(Value::Null);
    McpServerView {
        transport: serde_name(&status.transport),
        state: serde_name(&status.state),
        name: status.name,
        tool_count: status.tool_count,
        tools: status.tools,
        last_error: status.last_error,
        restarts: status.restarts,
        pid: status.pid,
        sandboxed: status.sandboxed,
        protocol_version: status.protocol_version,
        server_info: status.server_info,
        config,
    }
}

/// The snake_case name serde gives a unit enum value.
fn check_server_name(name: &str) -> Result<(), ApiError> {
    agentry_app::domain::mcp::validate_server_name(name).map_err(api_error)
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
    let servers = agentry_app::domain::mcp::parse_servers_document(&body).map_err(api_error)?;
    let stdio = servers
        .iter()
        .find(|(_, config)| config.transport_kind().ok() == Some(TransportKind::Stdio));
    if let Some((name, _)) = stdio.filter(|_| state.tools.allow_host_commands) {
        let keys = state
            .auth
            .enabled()
            .await
            .map_err(|error| ApiError::internal(error.to_string()))?;
        if !keys {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "api_key_required",
                format!(
                    "MCP server {name:?} is a stdio server, and this server allows host commands \
                     (--allow-host-commands): registering one over HTTP needs an API key, and \
                     none exists (create one with `agentry keys create`)"
                ),
            ));
        }
    }
    save_and_start(&state.store, &state.mcp, &servers).await?;
    let waits = servers
        .keys()
        .map(|name| state.mcp.wait_ready(name, READY_WAIT));
    let statuses = futures::future::join_all(waits).await;
    // The tools are usable as soon as the answer arrives.
    state.reload_runtime().await?;
    let mut views = Vec::new();
    for status in statuses {
        views.push(view(&state, status.map_err(api_error)?));
    }
    Ok((StatusCode::CREATED, Json(McpServerList { servers: views })).into_response())
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
    let servers = state
        .mcp
        .statuses()
        .into_iter()
        .map(|status| view(&state, status))
        .collect();
    Json(McpServerList { servers })
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
    check_server_name(&name)?;
    let status = state.mcp.status(&name).map_err(api_error)?;
    Ok(Json(view(&state, status)))
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
    check_server_name(&name)?;
    let stored = ConfigRepo::<McpServerConfig>::new(&state.store)
        .delete(&name)
        .await?;
    let running = state.mcp.remove(&name).await.is_ok();
    state.reload_runtime().await?;
    if stored || running {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(api_error(
            agentry_app::domain::mcp::McpError::UnknownServer(name),
        ))
    }
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
    check_server_name(&name)?;
    let before = state.mcp.status(&name).map_err(api_error)?;
    state.mcp.restart(&name).map_err(api_error)?;
    // Wait for the restart to be under way, then for its outcome.
    let deadline = tokio::time::Instant::now() + READY_WAIT;
    loop {
        let now = state.mcp.status(&name).map_err(api_error)?;
        let moved = now.restarts > before.restarts;
        let settled = matches!(
            now.state,
            agentry_app::domain::mcp::ServerState::Connected
                | agentry_app::domain::mcp::ServerState::Failed
        );
        if (moved && settled) || tokio::time::Instant::now() >= deadline {
            state.reload_runtime().await?;
            return Ok(Json(view(&state, now)));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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
    check_server_name(&name)?;
    let resources = state.mcp.list_resources(&name).await.map_err(api_error)?;
    Ok(Json(json!({ "resources": resources })))
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
    check_server_name(&name)?;
    if request.uri.trim().is_empty() || request.uri.len() > 4096 {
        return Err(ApiError::bad_request("uri must have 1 to 4096 characters"));
    }
    let contents = state
        .mcp
        .read_resource(&name, &request.uri)
        .await
        .map_err(api_error)?;
    Ok(Json(contents))
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
    check_server_name(&name)?;
    let prompts = state.mcp.list_prompts(&name).await.map_err(api_error)?;
    Ok(Json(json!({ "prompts": prompts })))
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
    check_server_name(&name)?;
    if request.name.trim().is_empty() || request.name.len() > 256 {
        return Err(ApiError::bad_request(
            "a prompt name has 1 to 256 characters",
        ));
    }
    let rendered = state
        .mcp
        .get_prompt(&name, &request.name, request.arguments)
        .await
        .map_err(api_error)?;
    Ok(Json(rendered))
}
