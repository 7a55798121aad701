//! Agentry as an MCP server (`/mcp`, streamable HTTP), driven by an independent client: the
//! official Python `mcp` SDK (`tests/mcp_client.py`, run with the venv that
//! `scripts/install-mcp-servers` installs). Both protocol eras are exercised: the `initialize`
//! handshake with a stateful session (2025-11-25) and the stateless 2026-07-28 requests.

use std::path::PathBuf;
use std::time::Duration;

use agentry_app::auth::create_key;
use agentry_server::{AppState, router};
use agentry_store::{ConfigKind, SessionQuery, Store};
use agentry_testkit::mcp::McpServers;
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};

/// A server on loopback with a `mock` model, optionally offering its registered tools.
struct McpServer {
    url: String,
    state: AppState,
    mock: MockProvider,
    http: reqwest::Client,
    _home: tempfile::TempDir,
}

async fn start(expose_tools: bool) -> McpServer {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    let mock = MockProvider::start().await.unwrap();
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(),
                    "model_name": "m"}),
        )
        .await
        .unwrap();
    let mut state = AppState::new(store).await.unwrap();
    state.app.expose_tools_over_mcp(expose_tools);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = router(state.clone());
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    McpServer {
        url,
        state,
        mock,
        http: agentry_llm::http_client(Duration::from_secs(5)).unwrap(),
        _home: home,
    }
}

impl McpServer {
    /// Saves the agent `timekeeper` (the mock model, the `current_time` tool).
    async fn with_agent(self) -> Self {
        let response = self
            .http
            .post(format!("{}/v1/agents", self.url))
            .json(&json!({
                "id": "timekeeper",
                "nickname": "Tim",
                "model_id": "mock",
                "tool_ids": ["current_time"],
                "system": "You keep time.",
            }))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
        self
    }

    fn spec(&self, mode: &str, headers: Value, calls: Value) -> Value {
        json!({
            "transport": "http",
            "url": format!("{}/mcp", self.url),
            "headers": headers,
            "mode": mode,
            "calls": calls,
        })
    }
}

/// Runs the Python client with `spec` and returns what it printed (asserting it succeeded).
async fn run_client(spec: &Value) -> Value {
    let (ok, output) = try_client(spec).await;
    assert!(ok, "the MCP client failed: {output}");
    output
}

/// Runs the Python client with `spec`: whether it succeeded, and what it printed (with its
/// stderr under `stderr`).
async fn try_client(spec: &Value) -> (bool, Value) {
    let python = McpServers::locate()
        .expect("the MCP test servers (scripts/install-mcp-servers)")
        .python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let run = tokio::process::Command::new(python)
        .arg(script)
        .arg(spec.to_string())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the MCP client finishes within 120 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let mut printed: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|error| {
        panic!("the MCP client printed no JSON ({error}): {stdout}\nstderr: {stderr}")
    });
    printed["stderr"] = json!(stderr);
    (output.status.success(), printed)
}

/// The text of a call's result.
fn text(call: &Value) -> &str {
    call["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_else(|| panic!("a text result: {call}"))
}

fn tool_names(listed: &Value) -> Vec<&str> {
    listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect()
}

/// Lists the tools, asks the agent (which calls `current_time`, then answers) and checks the
/// answer, the progress notifications and what the model was sent.
async fn ask_the_agent(mode: &str, expected_version: &str) {
    let server = start(false).await.with_agent().await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("It is late.")));
    let output = run_client(&server.spec(
        mode,
        json!({}),
        json!([{"tool": "ask_timekeeper", "arguments": {"message": "What time is it?"}}]),
    ))
    .await;
    assert_eq!(output["protocol_version"], expected_version, "{output}");
    assert_eq!(output["server_name"], "agentry");
    // The SDK closed its session without complaint (it logs a failed termination otherwise).
    assert!(
        !output["stderr"]
            .as_str()
            .unwrap()
            .contains("Session termination failed"),
        "{output}"
    );

    // The agent is listed as a tool with its schema; registered tools are not offered.
    assert_eq!(tool_names(&output), ["ask_timekeeper"]);
    let tool = &output["tools"][0];
    assert_eq!(tool["title"], "Tim");
    assert!(
        tool["description"]
            .as_str()
            .unwrap()
            .contains("You keep time.")
    );
    assert_eq!(tool["inputSchema"]["required"], json!(["message"]));
    assert_eq!(
        tool["inputSchema"]["properties"]["message"]["type"],
        "string"
    );

    // The answer is what the mock scripted, with the session to continue it.
    let call = &output["calls"][0];
    assert_eq!(call["result"]["isError"], false, "{call}");
    assert_eq!(text(call), "It is late.");
    let structured = &call["result"]["structuredContent"];
    assert_eq!(structured["answer"], "It is late.");
    assert_eq!(structured["stop_reason"], "completed");
    assert_eq!(structured["rounds"], 2);
    let session = structured["session_id"].as_str().unwrap();

    // A progress notification for each step, in order, counting up.
    let progress = call["progress"].as_array().unwrap();
    let messages: Vec<&str> = progress
        .iter()
        .map(|p| p["message"].as_str().unwrap())
        .collect();
    assert_eq!(
        messages,
        [
            "agent timekeeper started on model mock",
            "model round 1: asked for 1 tool call",
            "tool current_time started",
            messages[3],
            "model round 2: answered",
        ],
        "{call}"
    );
    assert!(
        messages[3].starts_with("tool current_time finished in "),
        "{messages:?}"
    );
    let values: Vec<f64> = progress
        .iter()
        .map(|p| p["progress"].as_f64().unwrap())
        .collect();
    assert_eq!(values, [1.0, 2.0, 3.0, 4.0, 5.0]);
    eprintln!(
        "one agent call through MCP ({mode}, two model rounds and a tool call against the mock): \
         {:.3} s",
        call["seconds"].as_f64().unwrap()
    );

    // The model was called as the agent: its model name, system prompt, tools and message.
    let requests = server.mock.requests();
    assert_eq!(requests.len(), 2);
    let sent = &requests[0].body;
    assert_eq!(sent["model"], "m");
    assert_eq!(sent["messages"][0]["role"], "system");
    assert_eq!(sent["messages"][0]["content"], "You keep time.");
    assert_eq!(sent["messages"][1]["content"], "What time is it?");
    assert_eq!(sent["tools"][0]["function"]["name"], "current_time");
    server.mock.check_protocol().unwrap();

    // The run is a durable session, like one of POST /v1/infer.
    let response = server
        .http
        .get(format!("{}/v1/sessions/{session}", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

#[tokio::test]
async fn a_python_client_with_a_session_asks_an_agent() {
    ask_the_agent("legacy", "2025-11-25").await;
}

#[tokio::test]
async fn a_python_client_on_the_stateless_protocol_asks_an_agent() {
    ask_the_agent("auto", "2026-07-28").await;
}

#[tokio::test]
async fn an_answer_continues_its_session_and_bad_calls_are_explained() {
    let server = start(false).await.with_agent().await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Noon.")));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Still noon.")));
    let first = run_client(&server.spec(
        "legacy",
        json!({}),
        json!([
            {"tool": "ask_timekeeper", "arguments": {"message": "Time?"}},
            {"tool": "ask_timekeeper", "arguments": {}},
            {"tool": "ask_timekeeper", "arguments": {"message": "x", "session_id": "nope"}},
            {"tool": "ask_nobody", "arguments": {"message": "x"}},
            {"tool": "current_time", "arguments": {}},
        ]),
    ))
    .await;
    let calls = first["calls"].as_array().unwrap();
    assert_eq!(text(&calls[0]), "Noon.");
    let session = calls[0]["result"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap();
    // Invalid arguments are an error result the caller's model can read and correct.
    assert_eq!(calls[1]["result"]["isError"], true);
    assert!(
        text(&calls[1]).contains("`message` (a string) is required"),
        "{}",
        calls[1]
    );
    assert_eq!(calls[2]["result"]["isError"], true);
    assert!(text(&calls[2]).contains("session_id"), "{}", calls[2]);
    // Unknown tools (and registered tools, not offered without the flag) are protocol errors.
    for call in &calls[3..] {
        assert!(
            call["error"].as_str().unwrap().contains("unknown tool"),
            "{call}"
        );
    }
    assert_eq!(
        server.mock.requests().len(),
        1,
        "bad calls never reach the model"
    );

    // The session id continues the conversation: the model sees the first exchange.
    let second = run_client(&server.spec(
        "auto",
        json!({}),
        json!([{"tool": "ask_timekeeper",
                "arguments": {"message": "And now?", "session_id": session}}]),
    ))
    .await;
    let call = &second["calls"][0];
    assert_eq!(text(call), "Still noon.");
    assert_eq!(call["result"]["structuredContent"]["session_id"], session);
    let sent = &server.mock.requests()[1].body;
    let contents: Vec<&Value> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["content"])
        .collect();
    assert_eq!(
        contents,
        [
            &json!("You keep time."),
            &json!("Time?"),
            &json!("Noon."),
            &json!("And now?")
        ]
    );
}

#[tokio::test]
async fn a_failing_run_is_an_error_result() {
    let server = start(false).await.with_agent().await;
    server.mock.enqueue(Reply::error(
        400,
        json!({"error": {"message": "bad things", "type": "invalid_request_error"}}),
    ));
    let output = run_client(&server.spec(
        "legacy",
        json!({}),
        json!([{"tool": "ask_timekeeper", "arguments": {"message": "Time?"}}]),
    ))
    .await;
    let call = &output["calls"][0];
    assert_eq!(call["result"]["isError"], true, "{call}");
    assert!(text(call).starts_with("the run failed ("), "{call}");
    assert!(text(call).contains("bad things"), "{call}");
}

#[tokio::test]
async fn registered_tools_are_offered_only_with_the_flag() {
    let server = start(true).await.with_agent().await;
    let output = run_client(&server.spec(
        "legacy",
        json!({}),
        json!([
            {"tool": "current_time", "arguments": {}},
            {"tool": "current_time", "arguments": {"colour": 1}},
        ]),
    ))
    .await;
    let names = tool_names(&output);
    assert!(names.contains(&"ask_timekeeper"), "{names:?}");
    assert!(names.contains(&"current_time"), "{names:?}");
    let calls = output["calls"].as_array().unwrap();
    assert_eq!(calls[0]["result"]["isError"], false, "{}", calls[0]);
    // The built-in clock answers with an RFC 3339 time of this year.
    let now = text(&calls[0]);
    assert!(now.contains("20") && now.contains('T'), "{now}");
    assert_eq!(calls[1]["result"]["isError"], true, "{}", calls[1]);
    assert!(
        text(&calls[1]).contains("invalid arguments"),
        "{}",
        calls[1]
    );
    assert!(server.mock.requests().is_empty());

    // Without the flag, only the agents.
    let plain = start(false).await.with_agent().await;
    let output = run_client(&plain.spec("auto", json!({}), json!([]))).await;
    assert_eq!(tool_names(&output), ["ask_timekeeper"]);
}

#[tokio::test]
async fn with_an_api_key_mcp_needs_it() {
    let server = start(false).await.with_agent().await;
    let key = create_key(&server.state.app.parts().store, "mcp")
        .await
        .unwrap();
    server.state.auth.refresh();

    let response = server
        .http
        .post(format!("{}/mcp", server.url))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 401);
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    // The Python client fails to connect (its error does not name the status).
    let (ok, output) = try_client(&server.spec("legacy", json!({}), json!([]))).await;
    assert!(!ok, "{output}");
    assert!(output.get("tools").is_none(), "{output}");

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Late.")));
    let bearer = json!({"Authorization": format!("Bearer {}", key.key)});
    for mode in ["legacy", "auto"] {
        let output = run_client(&server.spec(
            mode,
            bearer.clone(),
            json!([{"tool": "ask_timekeeper", "arguments": {"message": "Time?"}}]),
        ))
        .await;
        assert_eq!(tool_names(&output), ["ask_timekeeper"]);
        if mode == "legacy" {
            assert_eq!(text(&output["calls"][0]), "Late.");
            server
                .mock
                .enqueue(Reply::scripted(ScriptedTurn::text("Later.")));
        } else {
            assert_eq!(text(&output["calls"][0]), "Later.");
        }
    }
}

#[tokio::test]
async fn the_endpoint_refuses_foreign_origins_and_unknown_sessions() {
    let server = start(false).await.with_agent().await;
    let post = |origin: Option<&str>| {
        let mut request = server
            .http
            .post(format!("{}/mcp", server.url))
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream")
            .body(
                json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                    "protocolVersion": "2025-11-25", "capabilities": {},
                    "clientInfo": {"name": "probe", "version": "0"}}})
                .to_string(),
            );
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    // A browser page elsewhere (or a DNS-rebinding attack) is refused, on a GET too.
    let response = post(Some("http://evil.example")).await.unwrap();
    assert_eq!(response.status().as_u16(), 403);
    let response = server
        .http
        .get(format!("{}/mcp", server.url))
        .header("accept", "text/event-stream")
        .header("origin", "http://evil.example")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 403);
    // A page the server itself serves (its own origin: the console) is answered (issue 48).
    let response = post(Some(&server.url)).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    drop(response);
    // A client without an Origin gets a session.
    let response = post(None).await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let session = response.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_owned();
    drop(response);
    // DELETE ends the session; a GET for an unknown session is refused.
    let response = server
        .http
        .delete(format!("{}/mcp", server.url))
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    // 200, as the MCP SDKs expect (they log a 202 as a failed termination).
    assert_eq!(response.status().as_u16(), 200);
    let response = server
        .http
        .get(format!("{}/mcp", server.url))
        .header("accept", "text/event-stream")
        .header("mcp-session-id", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 404);
}

/// The client gives up on a call after a second (and tells the server): the agent's run is
/// cancelled rather than left running for nobody.
async fn a_cancelled_call_cancels_the_run(mode: &str) {
    let server = start(false).await.with_agent().await;
    server.mock.enqueue(
        Reply::scripted(ScriptedTurn::text("Too late.")).delay_headers(Duration::from_secs(30)),
    );
    let output = run_client(&server.spec(
        mode,
        json!({}),
        json!([{"tool": "ask_timekeeper", "arguments": {"message": "Time?"}, "timeout": 1}]),
    ))
    .await;
    let call = &output["calls"][0];
    assert!(call["error"].is_string(), "the call timed out: {call}");
    let sessions = server
        .state
        .app
        .parts()
        .store
        .list_sessions(&SessionQuery::default())
        .await
        .unwrap();
    assert_eq!(sessions.len(), 1);
    let session = sessions[0].id;
    // The run ends (cancelled) within a few seconds, long before the model would answer.
    let mut ended = None;
    for _ in 0..100 {
        let events = server
            .state
            .app
            .parts()
            .store
            .events(session, 0, usize::MAX)
            .await
            .unwrap();
        ended = events
            .into_iter()
            .map(|event| event.payload)
            .find(|payload| payload["type"] == "run_finished");
        if ended.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended = ended.expect("the run ended within 10 s of the cancellation");
    assert_eq!(ended["stop_reason"], "cancelled", "{ended}");
    assert_eq!(server.state.app.hub().live_runs(), 0);
}

#[tokio::test]
async fn a_cancelled_call_cancels_the_run_in_a_session() {
    a_cancelled_call_cancels_the_run("legacy").await;
}

#[tokio::test]
async fn a_cancelled_call_cancels_the_run_when_stateless() {
    a_cancelled_call_cancels_the_run("auto").await;
}
