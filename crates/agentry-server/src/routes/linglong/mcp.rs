//! The seed's MCP routes over Agentry's MCP servers: `POST /v1/tools/mcp` registers an
//! `{"mcpServers": …}` document and answers `{"registered_servers", "registered_tools",
//! "errors"?}`, `GET /v1/mcp-servers` lists `{"mcpServers": {name: config}}` (secrets masked),
//! `DELETE /v1/mcp-servers/{name}` removes a server and its tools.

use serde_json::{Map, Value, json};

use agentry_app::App;
use agentry_app::AppError;

/// `POST /v1/tools/mcp`. A server that could not start is an error in `errors`; when none
/// started the answer is a 400 (`Err`) carrying them.
pub async fn seed_register_mcp(
    app: &App,
    document: Value,
    keys_exist: bool,
) -> Result<Value, AppError> {
    if !document.get("mcpServers").is_some_and(Value::is_object) {
        return Err(AppError::bad_request(
            r#"Missing or invalid "mcpServers" object"#,
        ));
    }
    let list = app.mcp().register(&document, keys_exist).await?;
    let mut servers = Vec::new();
    let mut tools = Vec::new();
    let mut errors = Vec::new();
    for server in list.servers {
        match server.last_error.filter(|_| server.state == "failed") {
            Some(error) => errors.push(format!("{}: {error}", server.name)),
            None => {
                tools.extend(server.tools);
                servers.push(server.name);
            }
        }
    }
    let mut answer = json!({"registered_servers": servers, "registered_tools": tools});
    if !errors.is_empty() {
        if servers.is_empty() {
            return Err(AppError::bad_request(errors.join("; ")));
        }
        answer["errors"] = json!(errors);
    }
    Ok(answer)
}

/// `GET /v1/mcp-servers`.
pub fn seed_mcp_servers(app: &App) -> Value {
    let servers: Map<String, Value> = app
        .mcp()
        .list()
        .servers
        .into_iter()
        .map(|server| (server.name, server.config))
        .collect();
    json!({"mcpServers": servers})
}

/// `DELETE /v1/mcp-servers/{name}`.
pub async fn seed_delete_mcp_server(app: &App, name: &str) -> Result<Value, AppError> {
    let tools = app.mcp().get(name)?.tools;
    app.mcp().delete(name).await?;
    Ok(json!({"status": "deleted", "server_name": name, "deleted_tools": tools}))
}
