//! MCP servers through the API: registered once, their tools in every run, status, restart,
//! delete, resources and prompts, persistence across a restart of the server, bad input.

use std::time::Duration;

use agentry_store::{ConfigKind, Store};
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, start, start_sandboxed};

/// The `{"mcpServers": …}` entry that starts server-everything over stdio.
fn everything() -> Value {
    let spec = super::support::mcp_servers().everything();
    json!({"command": spec.program, "args": spec.args})
}

async fn register_everything(server: &Server) -> Value {
    let (status, body) = server
        .post(
            "/v1/tools/mcp",
            json!({"mcpServers": {"everything": everything()}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["servers"][0]["state"], "connected", "{body}");
    body["servers"][0].clone()
}

/// A process's state letter and parent (`/proc/<pid>/stat`: pid (comm) state ppid …).
fn state_and_parent(pid: u32) -> Option<(String, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, after_comm) = stat.rsplit_once(") ")?;
    let mut fields = after_comm.split(' ');
    let state = fields.next()?.to_owned();
    let ppid = fields.next()?.parse().ok()?;
    Some((state, ppid))
}

/// Live processes that descend from `root` (a sandboxed server's first process) and run
/// `script`.
fn descendants_running(root: u32, script: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if !String::from_utf8_lossy(&cmdline).contains(script) {
            continue;
        }
        let Some((state, mut parent)) = state_and_parent(pid) else {
            continue;
        };
        while parent > 1 && parent != root {
            parent = state_and_parent(parent).map_or(0, |(_, p)| p);
        }
        if parent == root && state != "Z" {
            found.push(pid);
        }
    }
    found
}

async fn tool_names(server: &Server) -> Vec<String> {
    let (_, tools) = server.get("/v1/tools").await;
    tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn registered_servers_tools_join_the_runtime_and_a_model_calls_one() {
    let server = start_sandboxed().await;
    let shown = register_everything(&server).await;
    assert!(shown["tool_count"].as_u64().unwrap() >= 13, "{shown}");
    assert_eq!(shown["transport"], "stdio");
    assert!(shown["pid"].is_u64());
    assert_eq!(shown["sandboxed"], true, "{shown}");

    let (status, list) = server.get("/v1/mcp-servers").await;
    assert_eq!(status, 200);
    assert_eq!(list["servers"][0]["name"], "everything");
    let (status, one) = server.get("/v1/mcp-servers/everything").await;
    assert_eq!(status, 200);
    assert_eq!(
        one["config"]["args"].as_array().unwrap().last().unwrap(),
        "stdio"
    );

    // The runtime is rebuilt with the server's tools.
    let names = tool_names(&server).await;
    assert!(
        names.contains(&"everything__get-sum".to_owned()),
        "{names:?}"
    );

    // A direct call.
    let (status, called) = server
        .post(
            "/v1/tools/call",
            json!({"name": "everything__get-sum", "arguments": {"a": 20, "b": 22}}),
        )
        .await;
    assert_eq!(status, 200, "{called}");
    assert!(called.to_string().contains("42"), "{called}");

    // A model run through the mock: the model calls the MCP tool and sees its result.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "everything__get-sum",
        json!({"a": 2, "b": 3}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("The sum is 5.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "2+3?",
                   "tool_ids": ["everything__get-sum"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "The sum is 5.");
    let requests = server.mock.requests();
    let offered = &requests[0].body["tools"][0]["function"];
    assert_eq!(offered["name"], "everything__get-sum");
    assert!(
        offered["parameters"]["properties"]["a"].is_object(),
        "{offered}"
    );
    let tool_message = requests[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|message| message["role"] == "tool")
        .cloned()
        .unwrap();
    assert!(
        tool_message["content"].to_string().contains('5'),
        "{tool_message}"
    );
}

#[tokio::test]
async fn two_agents_using_one_server_share_one_process() {
    let server = start_sandboxed().await;
    let shown = register_everything(&server).await;
    let root = u32::try_from(shown["pid"].as_u64().unwrap()).unwrap();
    let script = super::support::mcp_servers().everything().args[0].clone();
    let before = descendants_running(root, &script);
    assert_eq!(
        before.len(),
        1,
        "one process after registration: {before:?}"
    );
    for id in ["alpha", "beta"] {
        let (status, body) = server
            .post(
                "/v1/agents",
                json!({"id": id, "model_id": "mock", "tool_ids": ["everything__echo"]}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    // One agent after the other: the mock answers from one queue, so two interleaved
    // conversations could take each other's scripted turns (a run given "done" before its echo).
    for agent in ["alpha", "beta"] {
        server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "everything__echo",
            json!({"message": "hi"}),
        )));
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text("done")));
        let (status, body) = server
            .post(
                "/v1/infer",
                json!({"session_id": "new", "agent_ids": [agent], "text": "echo hi"}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let echoed = body["messages"]
            .as_array()
            .unwrap()
            .iter()
            .any(|message| message.to_string().contains("Echo: hi"));
        assert!(echoed, "{agent}: {body}");
    }
    assert_eq!(
        descendants_running(root, &script),
        before,
        "still the same single process"
    );
}

#[tokio::test]
async fn restart_delete_resources_and_prompts_through_the_api() {
    let server = start_sandboxed().await;
    let shown = register_everything(&server).await;
    let first_pid = shown["pid"].as_u64().unwrap();

    let (status, restarted) = server
        .post("/v1/mcp-servers/everything/restart", json!({}))
        .await;
    assert_eq!(status, 200, "{restarted}");
    assert_eq!(restarted["state"], "connected");
    assert_eq!(restarted["restarts"], 1);
    assert_ne!(restarted["pid"].as_u64().unwrap(), first_pid);

    let (status, resources) = server.get("/v1/mcp-servers/everything/resources").await;
    assert_eq!(status, 200, "{resources}");
    let uri = resources["resources"][0]["uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, read) = server
        .post(
            "/v1/mcp-servers/everything/resources/read",
            json!({"uri": uri}),
        )
        .await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["contents"][0]["uri"], uri.as_str());
    let (status, prompts) = server.get("/v1/mcp-servers/everything/prompts").await;
    assert_eq!(status, 200);
    assert!(
        prompts["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "simple-prompt")
    );
    let (status, rendered) = server
        .post(
            "/v1/mcp-servers/everything/prompts/get",
            json!({"name": "simple-prompt"}),
        )
        .await;
    assert_eq!(status, 200, "{rendered}");
    assert!(!rendered["messages"].as_array().unwrap().is_empty());

    let pid = restarted["pid"].as_u64().unwrap();
    let (status, _) = server
        .raw(reqwest::Method::DELETE, "/v1/mcp-servers/everything", "")
        .await;
    assert_eq!(status, 204);
    let (status, _) = server.get("/v1/mcp-servers/everything").await;
    assert_eq!(status, 404);
    assert!(
        server
            .state
            .app
            .parts()
            .store
            .config(ConfigKind::McpServer, "everything")
            .await
            .unwrap()
            .is_none()
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the process outlived its deletion"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Its tools leave the runtime.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while tool_names(&server)
        .await
        .iter()
        .any(|name| name.starts_with("everything__"))
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "tools outlived the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn bad_registrations_are_refused_and_nothing_is_saved() {
    let server = start_sandboxed().await;
    let cases = [
        (r#"{"mcpServers": {"a": {}}}"#, 400, "needs \"command\""),
        (
            r#"{"mcpServers": {"a__b": {"command": "x"}}}"#,
            400,
            "not a valid MCP server name",
        ),
        (
            r#"{"mcpServers": {"a": {"url": "file:///etc/passwd"}}}"#,
            400,
            "http or https",
        ),
        (
            r#"{"mcpServers": {"a": {"command": "x", "env": {"K": {"secret": "nope"}}}}}"#,
            400,
            "not set",
        ),
        (
            r#"{"mcpServers": {"ok": {"command": "x"}, "bad": {"url": 3}}}"#,
            400,
            "bad",
        ),
        (r#"{"mcpServers": "#, 400, ""),
        (r#"[1]"#, 400, "JSON object"),
    ];
    for (body, expected_status, needle) in cases {
        let (status, answer) = server
            .raw(reqwest::Method::POST, "/v1/tools/mcp", body)
            .await;
        assert_eq!(status, expected_status, "{body}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap()
                .contains(needle),
            "{body}: {answer}"
        );
    }
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
    assert!(server.state.app.parts().mcp.names().is_empty());

    for (path, expected) in [
        ("/v1/mcp-servers/nope", 404),
        ("/v1/mcp-servers/a__b", 400),
        ("/v1/mcp-servers/nope/resources", 404),
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, expected, "{path}: {body}");
        assert!(body["error"]["code"].is_string(), "{body}");
    }
    let (status, body) = server
        .raw(
            reqwest::Method::POST,
            "/v1/mcp-servers/nope/resources/read",
            r#"{"uri": "x", "extra": 1}"#,
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = server.post("/v1/mcp-servers/nope/restart", json!({})).await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn saved_servers_reconnect_at_start_up_and_mcp_json_is_imported() {
    let home = tempfile::tempdir().unwrap();
    let spec = super::support::mcp_servers().everything();
    std::fs::write(
        home.path().join("mcp.json"),
        json!({"mcpServers": {"from-file": {"command": spec.program, "args": spec.args}}})
            .to_string(),
    )
    .unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    let imported = agentry_app::mcp_tools::import_servers_file(&store, home.path())
        .await
        .unwrap();
    assert_eq!(imported, 1);
    // A new server process (AppState) on the same store starts it by itself.
    let state = agentry_server::AppState::with_tools(
        store.clone(),
        super::support::sandboxed_mcp(home.path()),
    )
    .await
    .unwrap();
    let status = state
        .app
        .parts()
        .mcp
        .wait_ready("from-file", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        status.state,
        agentry_mcp::ServerState::Connected,
        "{status:?}"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !state
        .app
        .parts()
        .sessions
        .runtime()
        .tools()
        .contains("from-file__echo")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "tools never reached the runtime"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A broken file is a clear error naming it.
    std::fs::write(
        home.path().join("mcp.json"),
        "{\"mcpServers\": {\"x\": {}}}",
    )
    .unwrap();
    let error = agentry_app::mcp_tools::import_servers_file(&store, home.path())
        .await
        .unwrap_err();
    assert!(error.message.contains("mcp.json"), "{}", error.message);
    state.app.parts().mcp.shutdown().await;
}

#[tokio::test]
async fn secrets_reach_the_server_through_its_environment_only() {
    let server = start_sandboxed().await;
    let (status, _) = server
        .post("/v1/env", json!({"name": "MCP_TOKEN", "value": "t0ken"}))
        .await;
    assert_eq!(status / 100, 2);
    let mut config = everything();
    config["env"] = json!({"GIVEN_TOKEN": {"secret": "MCP_TOKEN"}, "PLAIN": "visible"});
    let (status, body) = server
        .post(
            "/v1/tools/mcp",
            json!({"mcpServers": {"everything": config}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // The listing masks literal values and names secrets.
    assert_eq!(body["servers"][0]["config"]["env"]["PLAIN"], "***");
    assert_eq!(
        body["servers"][0]["config"]["env"]["GIVEN_TOKEN"]["secret"],
        "MCP_TOKEN"
    );
    let (status, called) = server
        .post(
            "/v1/tools/call",
            json!({"name": "everything__get-env", "arguments": {}}),
        )
        .await;
    assert_eq!(status, 200, "{called}");
    let env: Value = serde_json::from_str(called["result"].as_str().unwrap_or("{}"))
        .unwrap_or_else(|_| called.clone());
    assert!(env.to_string().contains("t0ken"), "{called}");
}

#[tokio::test]
async fn aborting_a_run_cancels_its_call_on_the_mcp_server() {
    // About cancellation, not placement: the probe (the venv's Python, a marker file in a
    // temporary folder) runs on the host, allowed explicitly by `start`, and is registered
    // through the server's own configuration path rather than over HTTP (which, with host
    // commands allowed, would need an API key).
    let server = start().await;
    let python = super::support::mcp_servers().python();
    let folder = tempfile::tempdir().unwrap();
    let marker = folder.path().join("marker");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cancel_probe_server.py");
    let servers =
        serde_json::from_value(json!({"probe": {"command": python, "args": [script, marker]}}))
            .unwrap();
    agentry_app::mcp_tools::save_and_start(
        &server.state.app.parts().store,
        &server.state.app.parts().mcp,
        &servers,
    )
    .await
    .unwrap();
    let status = server
        .state
        .app
        .parts()
        .mcp
        .wait_ready("probe", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        status.state,
        agentry_mcp::ServerState::Connected,
        "{status:?}"
    );
    assert!(!status.sandboxed, "{status:?}");
    server.state.app.reload_runtime().await.unwrap();

    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "probe__wait",
        json!({"seconds": 60}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("not reached")));
    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(
                json!({"session_id": "new", "model_id": "mock", "text": "wait",
                        "tool_ids": ["probe__wait"]}),
            ),
            None,
        )
        .await;
    let session = stream.session.clone().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&marker).unwrap_or_default() != "started" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the tool never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, aborted) = server
        .post("/v1/infer/abort", json!({"session_id": session}))
        .await;
    assert_eq!((status, aborted["aborted"].clone()), (200, json!(true)));
    let rest = stream.rest().await;
    let end = rest.last().unwrap();
    assert_eq!(end.name, "run.finished");
    assert_eq!(end.data["event"]["stop_reason"], "cancelled");
    // The server itself was told: its tool's task was cancelled.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&marker).unwrap_or_default() != "cancelled" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server never saw the cancellation: {:?}",
            std::fs::read_to_string(&marker)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn agentry_reaches_its_own_mcp_endpoint_on_the_current_revision_with_a_secret_header() {
    let server = start().await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "helper", "model_id": "mock", "system_prompt": "You help."}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // From now on /mcp needs the key: the client sends it from a stored secret.
    let key = agentry_app::auth::create_key(&server.state.app.parts().store, "self")
        .await
        .unwrap();
    server.state.auth.refresh();
    server
        .state
        .app
        .parts()
        .store
        .put_secret("SELF_KEY", &format!("Bearer {}", key.key))
        .await
        .unwrap();
    let endpoint = format!("{}/mcp", server.url);
    let servers = serde_json::from_value(json!({
        "self": {"url": endpoint, "headers": {"Authorization": {"secret": "SELF_KEY"}}},
        "anonymous": {"url": endpoint, "connect_timeout_ms": 5000}
    }))
    .unwrap();
    agentry_app::mcp_tools::save_and_start(
        &server.state.app.parts().store,
        &server.state.app.parts().mcp,
        &servers,
    )
    .await
    .unwrap();

    let status = server
        .state
        .app
        .parts()
        .mcp
        .wait_ready("self", Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(
        status.state,
        agentry_mcp::ServerState::Connected,
        "{status:?}"
    );
    // rmcp's server speaks the stateless revision: discovered, no initialize handshake.
    assert_eq!(
        status.protocol_version.as_deref(),
        Some("2026-07-28"),
        "{status:?}"
    );
    let tool = agentry_app::mcp_server::agent_tool_name("helper");
    assert!(
        status.tools.contains(&format!("self__{tool}")),
        "{status:?}"
    );

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Happy to help.")));
    let answer = server
        .state
        .app
        .parts()
        .mcp
        .call_tool(
            "self",
            &tool,
            json!({"message": "Can you help?"}),
            agentry_mcp::CallOptions::default(),
        )
        .await
        .unwrap();
    assert!(!answer.is_error, "{answer:?}");
    assert!(
        json!(answer.content).to_string().contains("Happy to help."),
        "{answer:?}"
    );

    // Without the key the endpoint refuses, and the status says so.
    let refused = server
        .state
        .app
        .parts()
        .mcp
        .wait_ready("anonymous", Duration::from_secs(30))
        .await
        .unwrap();
    assert_ne!(refused.state, agentry_mcp::ServerState::Connected);
    let reason = refused.last_error.unwrap_or_default();
    assert!(reason.to_lowercase().contains("auth required"), "{reason}");
}

/// Waits until the runtime offers `tool` (server-everything registers its elicitation tools
/// after initialisation, announced with `tools/list_changed`).
async fn wait_for_tool(server: &Server, tool: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !tool_names(server).await.iter().any(|name| name == tool) {
        assert!(tokio::time::Instant::now() < deadline, "{tool} never came");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a streamed run whose model calls `tool`, and reads its events until the MCP server's
/// request for input arrives: (stream, run id, the `elicitation.requested` data).
async fn run_until_elicitation(
    server: &Server,
    tool: &str,
    arguments: Value,
) -> (super::support::SseClient, String, Value) {
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::tool_call(tool, arguments)));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Thanks.")));
    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(
                json!({"session_id": "new", "model_id": "mock", "text": "go",
                        "tool_ids": [tool]}),
            ),
            None,
        )
        .await;
    let mut run_id = None;
    loop {
        let event = stream.next().await.expect("the stream ended early");
        if event.name == "run.started" {
            run_id = event.data["event"]["run_id"]
                .as_str()
                .or_else(|| event.data["run_id"].as_str())
                .map(str::to_owned);
        }
        if event.name == "elicitation.requested" {
            return (stream, run_id.expect("run.started came first"), event.data);
        }
        assert!(
            !matches!(event.name.as_str(), "run.finished" | "run.failed"),
            "the run ended without asking: {event:?}"
        );
    }
}

#[tokio::test]
async fn an_mcp_servers_request_for_input_waits_in_the_runs_approvals_until_a_person_answers() {
    let server = start_sandboxed().await;
    register_everything(&server).await;
    let tool = "everything__trigger-elicitation-request";
    wait_for_tool(&server, tool).await;
    let mut feed = server.sse("/v1/sessions/events", None, None).await;

    let (mut stream, run_id, asked) = run_until_elicitation(&server, tool, json!({})).await;
    let session = stream.session.clone().unwrap();
    let id = asked["elicitation_id"].as_str().unwrap().to_owned();
    assert_eq!(asked["server"], "everything");
    assert_eq!(asked["mode"], "form");
    assert_eq!(asked["requested_schema"]["required"], json!(["name"]));

    // Listed with the run's approvals and the session's; the status feed says `waiting`.
    let (status, listed) = server.get(&format!("/v1/runs/{run_id}/approvals")).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["status"], "waiting", "{listed}");
    assert_eq!(listed["pending"], json!([]));
    let waiting = &listed["elicitations"][0];
    assert_eq!(waiting["elicitation_id"], id.as_str());
    assert_eq!(waiting["tool"], tool);
    assert_eq!(waiting["call_id"], asked["call_id"]);
    assert!(
        waiting["message"]
            .as_str()
            .unwrap()
            .contains("Please provide")
    );
    let (_, by_session) = server
        .get(&format!("/v1/sessions/{session}/approvals"))
        .await;
    assert_eq!(by_session["status"], "waiting");
    assert_eq!(by_session["run_id"], run_id.as_str());
    assert_eq!(by_session["elicitations"][0]["elicitation_id"], id.as_str());
    loop {
        let change = feed.next().await.unwrap();
        if change.data["session_id"] == session.as_str() && change.data["status"] == "waiting" {
            break;
        }
    }

    // Bad answers are refused and change nothing.
    let url = format!("/v1/runs/{run_id}/approvals");
    let (status, refused) = server
        .post(
            &url,
            json!({"elicitation_id": id, "decision": "approve", "content": {"check": true}}),
        )
        .await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused.to_string().contains("name"), "{refused}");
    let (status, _) = server
        .post(
            &url,
            json!({"elicitation_id": id, "decision": "edit", "content": {"name": "x"}}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post(
            &url,
            json!({"elicitation_id": "no-such-request", "decision": "reject"}),
        )
        .await;
    assert_eq!(status, 404);
    let (_, still) = server.get(&url).await;
    assert_eq!(still["elicitations"][0]["elicitation_id"], id.as_str());

    // The answer reaches the server's tool, whose result the model reads.
    let (status, answered) = server
        .post(
            &url,
            json!({"elicitation_id": id, "decision": "approve",
                   "content": {"name": "Ada Lovelace", "check": true}}),
        )
        .await;
    assert_eq!(status, 200, "{answered}");
    assert_eq!(answered["status"], "running");
    assert_eq!(answered["elicitations"], json!([]));
    let rest = stream.rest().await;
    let resolved = rest
        .iter()
        .find(|event| event.name == "elicitation.resolved")
        .expect("elicitation.resolved");
    assert_eq!(resolved.data["action"], "accept");
    assert_eq!(resolved.data["elicitation_id"], id.as_str());
    assert_eq!(rest.last().unwrap().name, "run.finished");
    let result = rest
        .iter()
        .find(|event| event.name == "tool.result")
        .expect("tool.result");
    assert!(
        result.data.to_string().contains("Name: Ada Lovelace"),
        "{}",
        result.data
    );
    let (_, after) = server.get(&url).await;
    assert_eq!(after["elicitations"], json!([]));
    assert_ne!(after["status"], "waiting");
}

#[tokio::test]
async fn a_declined_or_abandoned_request_for_input_lets_the_run_go_on_or_end() {
    let server = start_sandboxed().await;
    register_everything(&server).await;
    let tool = "everything__trigger-elicitation-request";
    wait_for_tool(&server, tool).await;

    // Rejected: the server's tool hears "decline".
    let (mut stream, run_id, asked) = run_until_elicitation(&server, tool, json!({})).await;
    let (status, body) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals"),
            json!({"elicitation_id": asked["elicitation_id"], "decision": "reject"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let rest = stream.rest().await;
    let result = rest.iter().find(|e| e.name == "tool.result").unwrap();
    assert!(
        result.data.to_string().contains("declined"),
        "{}",
        result.data
    );

    // Aborted while asking: the request is withdrawn.
    let (mut stream, run_id, asked) = run_until_elicitation(&server, tool, json!({})).await;
    let session = stream.session.clone().unwrap();
    let (status, _) = server
        .post("/v1/infer/abort", json!({"session_id": session}))
        .await;
    assert_eq!(status, 200);
    let rest = stream.rest().await;
    assert_eq!(
        rest.last().unwrap().data["event"]["stop_reason"],
        "cancelled"
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, listed) = server.get(&format!("/v1/runs/{run_id}/approvals")).await;
        if listed["elicitations"] == json!([]) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{listed}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals"),
            json!({"elicitation_id": asked["elicitation_id"], "decision": "approve",
                   "content": {"name": "late"}}),
        )
        .await;
    assert_eq!(status, 404);
}
