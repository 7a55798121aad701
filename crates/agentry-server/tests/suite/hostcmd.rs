//! Commands never run unsandboxed unasked: stdio MCP servers registered over HTTP run in a
//! sandbox of their own; without a sandbox, command tools and stdio servers are refused (nothing
//! saved, nothing spawned); `"host": true` needs `--allow-host-commands`; with host commands
//! allowed, registering a stdio server over HTTP needs an API key; the capabilities say which.

use std::path::Path;
use std::time::Duration;

use agentry_app::ToolEnvironment;
use agentry_store::ConfigKind;
use serde_json::{Value, json};

use super::support::{Server, mcp_servers, sandboxed_mcp, start, start_sandboxed, start_with};

/// The text of a direct tool call's answer (result or error).
async fn call(server: &Server, tool: &str, arguments: Value) -> (u16, String) {
    let (status, body) = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": tool, "arguments": arguments}),
        )
        .await;
    (status, body.to_string())
}

/// A stdio server entry that, if it were ever started, would create `marker` on the host.
fn marker_server(marker: &Path) -> Value {
    json!({"command": "/bin/sh", "args": ["-c", format!("touch {}", marker.display())]})
}

#[tokio::test]
async fn an_mcp_stdio_server_registered_over_http_runs_inside_the_sandbox() {
    let server = start_sandboxed().await;
    // A file on the host, outside the server's workspace: a server on the host could read it.
    let secret = server.home.path().join("host-secret.txt");
    std::fs::write(&secret, "host-only-s3cret").unwrap();
    // And one in the server's own workspace, which it sees at /workspace.
    let workspace = server.home.path().join("mcp-workspaces").join("fs");
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("inside.txt"), "inside the workspace").unwrap();

    // The filesystem server, told it may read everything ("/"): only the sandbox confines it.
    let spec = mcp_servers().filesystem(Path::new("/"));
    let (status, body) = server
        .post(
            "/v1/tools/mcp",
            json!({"mcpServers": {"fs": {"command": spec.program, "args": spec.args}}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let shown = &body["servers"][0];
    assert_eq!(shown["state"], "connected", "{shown}");
    assert_eq!(shown["sandboxed"], true, "{shown}");

    let (status, inside) = call(
        &server,
        "fs__read_text_file",
        json!({"path": "/workspace/inside.txt"}),
    )
    .await;
    assert_eq!(status, 200, "{inside}");
    assert!(inside.contains("inside the workspace"), "{inside}");
    // Its /etc is the sandbox's own.
    let (_, hostname) = call(
        &server,
        "fs__read_text_file",
        json!({"path": "/etc/hostname"}),
    )
    .await;
    assert!(hostname.contains("sandbox"), "{hostname}");
    // The host file does not exist in there.
    let (_, outside) = call(
        &server,
        "fs__read_text_file",
        json!({"path": secret.to_str().unwrap()}),
    )
    .await;
    assert!(!outside.contains("host-only-s3cret"), "{outside}");
    assert!(
        outside.contains("ENOENT") || outside.to_lowercase().contains("no such file"),
        "{outside}"
    );

    // Deleting the server closes its sandbox: its first process goes.
    let pid = shown["pid"].as_u64().unwrap();
    let (status, _) = server
        .raw(reqwest::Method::DELETE, "/v1/mcp-servers/fs", "")
        .await;
    assert_eq!(status, 204);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the sandbox outlived its server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn with_the_sandbox_off_command_tools_and_stdio_servers_are_refused() {
    let server = start_with(|_| ToolEnvironment::default(), |_| {}).await;
    let folder = tempfile::tempdir().unwrap();
    let marker = folder.path().join("ran");

    // A command tool: refused, naming the settings, and not saved.
    let (status, body) = server
        .post(
            "/v1/tools",
            json!({"kind": "command", "name": "touch", "program": "/bin/sh",
                   "args": ["-c", format!("touch {}", marker.display())]}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "sandbox_required", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("--sandbox native"), "{message}");
    assert!(message.contains("--allow-host-commands"), "{message}");
    let (status, _) = server.get("/v1/tools/touch").await;
    assert_eq!(status, 404);

    // One configured before (in the store): not offered, so a call cannot run it.
    server
        .state
        .app
        .parts()
        .store
        .put_config(
            ConfigKind::Tool,
            "stored",
            &json!({"kind": "command", "name": "stored", "program": "/bin/sh",
                    "args": ["-c", format!("touch {}", marker.display())]}),
        )
        .await
        .unwrap();
    server.state.app.reload_runtime().await.unwrap();
    for tool in ["stored", "slow"] {
        let (status, answer) = call(&server, tool, json!({})).await;
        assert_eq!(status, 404, "{tool}: {answer}");
    }

    // A stdio MCP server: refused before anything is saved or spawned.
    let (status, body) = server
        .post(
            "/v1/tools/mcp",
            json!({"mcpServers": {"probe": marker_server(&marker)}}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "sandbox_required", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--allow-host-commands"),
        "{body}"
    );
    assert!(server.state.app.parts().mcp.names().is_empty());
    assert!(
        server
            .state
            .app
            .parts()
            .store
            .list_config(ConfigKind::McpServer)
            .await
            .unwrap()
            .is_empty()
    );

    let (status, capabilities) = server.get("/v1/sandbox/capabilities").await;
    assert_eq!(status, 200, "{capabilities}");
    assert_eq!(capabilities["allow_host_commands"], false);
    assert_eq!(capabilities["command_tools"], "refused");
    assert_eq!(capabilities["mcp_stdio"], "refused");

    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "a refused command ran on the host");
}

#[tokio::test]
async fn host_true_is_refused_over_http_unless_host_commands_are_allowed() {
    let server = start_with(
        |home| ToolEnvironment {
            workspaces: Some(home.join("workspaces")),
            ..sandboxed_mcp(home)
        },
        |_| {},
    )
    .await;
    let folder = tempfile::tempdir().unwrap();
    let marker = folder.path().join("ran");
    let (status, body) = server
        .post(
            "/v1/tools",
            json!({"kind": "command", "name": "hostid", "program": "/bin/sh",
                   "args": ["-c", "id"], "host": true}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "host_commands_refused", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--allow-host-commands"),
        "{body}"
    );
    let (status, _) = server.get("/v1/tools/hostid").await;
    assert_eq!(status, 404);
    // Without "host" it is accepted: it runs in the sandbox.
    let (status, body) = server
        .post(
            "/v1/tools",
            json!({"kind": "command", "name": "boxed", "program": "/bin/sh", "args": ["-c", "id"]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // A stdio MCP server asking for the host: refused too, nothing spawned.
    let mut probe = marker_server(&marker);
    probe["host"] = json!(true);
    let (status, body) = server
        .post("/v1/tools/mcp", json!({"mcpServers": {"probe": probe}}))
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "host_commands_refused", "{body}");
    assert!(server.state.app.parts().mcp.names().is_empty());

    let (_, capabilities) = server.get("/v1/sandbox/capabilities").await;
    assert_eq!(capabilities["allow_host_commands"], false, "{capabilities}");
    assert_eq!(capabilities["command_tools"], "sandbox", "{capabilities}");
    assert_eq!(capabilities["mcp_stdio"], "sandbox", "{capabilities}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "a refused server ran on the host");
}

#[tokio::test]
async fn with_host_commands_allowed_a_stdio_server_over_http_needs_an_api_key() {
    // `start`: no sandbox, host commands allowed (`--allow-host-commands`).
    let server = start().await;
    let (_, capabilities) = server.get("/v1/sandbox/capabilities").await;
    assert_eq!(capabilities["allow_host_commands"], true, "{capabilities}");
    assert_eq!(capabilities["command_tools"], "host", "{capabilities}");
    assert_eq!(capabilities["mcp_stdio"], "host", "{capabilities}");
    // "host": true is accepted now.
    let (status, body) = server
        .post(
            "/v1/tools",
            json!({"kind": "command", "name": "hostid", "program": "/bin/sh",
                   "args": ["-c", "echo on-the-host"], "host": true}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, answer) = call(&server, "hostid", json!({})).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer.contains("on-the-host"), "{answer}");

    // No key yet: a stdio server is refused, and nothing is spawned.
    let folder = tempfile::tempdir().unwrap();
    let marker = folder.path().join("ran");
    let (status, body) = server
        .post(
            "/v1/tools/mcp",
            json!({"mcpServers": {"probe": marker_server(&marker)}}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "api_key_required", "{body}");
    assert!(server.state.app.parts().mcp.names().is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!marker.exists(), "a refused server ran");

    // With a key, the operator's client may register one; it runs on the host.
    let key = agentry_app::auth::create_key(&server.state.app.parts().store, "operator")
        .await
        .unwrap();
    server.state.auth.refresh();
    let spec = mcp_servers().everything();
    let response = server
        .http
        .post(format!("{}/v1/tools/mcp", server.url))
        .bearer_auth(&key.key)
        .json(&json!({"mcpServers": {"everything": {"command": spec.program, "args": spec.args}}}))
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let body: Value = response.json().await.unwrap();
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["servers"][0]["state"], "connected", "{body}");
    assert_eq!(body["servers"][0]["sandboxed"], false, "{body}");
    server.state.app.parts().mcp.shutdown().await;
}
