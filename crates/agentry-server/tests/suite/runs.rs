//! Run control over HTTP: approvals (a call waits with the session `waiting`, then is
//! approved, rejected or edited; across a server restart too), pause and resume, interrupt,
//! abort dropping the queue, and quota stops with their note.

use std::time::Duration;

use agentry_app::ToolEnvironment;
use agentry_server::{AppState, ServerConfig};
use agentry_store::{ConfigKind, Store};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Received, Server, start};

/// A command tool that echoes its arguments, with a schema edits are checked against.
fn echo_tool() -> Value {
    json!({"kind": "command", "name": "echo", "description": "echoes its arguments",
           "program": "/bin/sh", "args": ["-c", "cat"],
           "parameters": {"type": "object", "properties": {"text": {"type": "string"}},
                          "required": ["text"], "additionalProperties": false}})
}

async fn with_echo(server: &Server) {
    let (status, body) = server.post("/v1/tools", echo_tool()).await;
    assert_eq!(status, 201, "{body}");
}

/// Starts a run whose `echo` call waits; returns (session, run id, call id).
async fn waiting(server: &Server) -> (String, String, String) {
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "echo",
        json!({"text": "hello"}),
    )));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"text": "echo hello", "session_id": "new", "model_id": "mock",
                   "tool_ids": ["echo"], "approvals": {"tools": {"echo": "always"}}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stop_reason"], "waiting", "{body}");
    assert_eq!(body["status"], "waiting");
    assert_eq!(body["pending"][0]["call"]["name"], "echo");
    assert!(
        body["pending"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("echo")
    );
    let session = body["session_id"].as_str().unwrap().to_owned();
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let call_id = body["pending"][0]["call"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    (session, run_id, call_id)
}

async fn session_status(server: &Server, session: &str) -> String {
    let (status, body) = server.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, 200, "{body}");
    body["session"]["status"].as_str().unwrap().to_owned()
}

/// Follows the session's stream to the end of its run.
async fn follow(server: &Server, session: &str) -> Vec<Received> {
    server
        .sse(&format!("/v1/sessions/{session}/stream"), None, None)
        .await
        .rest()
        .await
}

fn names(events: &[Received]) -> Vec<&str> {
    events.iter().map(|e| e.name.as_str()).collect()
}

#[tokio::test]
async fn a_waiting_call_is_listed_approved_and_the_run_completes() {
    let server = start().await;
    with_echo(&server).await;
    let (session, run_id, call_id) = waiting(&server).await;
    assert_eq!(session_status(&server, &session).await, "waiting");
    let (_, detail) = server.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(
        detail["suspended_run"]["run_id"],
        run_id.as_str(),
        "{detail}"
    );
    assert_eq!(detail["suspended_run"]["status"], "waiting");
    assert_eq!(
        detail["suspended_run"]["pending"][0]["call"]["id"],
        call_id.as_str()
    );
    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    assert!(kinds.contains(&"approval_requested"), "{kinds:?}");
    assert!(!kinds.contains(&"tool_call_intent"), "{kinds:?}");
    let (status, listed) = server.get(&format!("/v1/runs/{run_id}/approvals")).await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(listed["status"], "waiting");
    assert_eq!(listed["session_id"], session.as_str());
    assert_eq!(listed["pending"][0]["call"]["id"], call_id.as_str());
    let (_, by_session) = server
        .get(&format!("/v1/sessions/{session}/approvals"))
        .await;
    assert_eq!(by_session["run_id"], run_id.as_str());
    assert_eq!(by_session["pending"].as_array().unwrap().len(), 1);

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Echoed.")));
    let (status, decided) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals"),
            json!({"call_id": call_id, "decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    assert_eq!(decided["status"], "running");
    let events = follow(&server, &session).await;
    let names = names(&events);
    assert!(names.contains(&"approval.requested"), "{names:?}");
    assert!(names.contains(&"approval.decided"), "{names:?}");
    assert!(names.contains(&"tool.result"), "{names:?}");
    assert_eq!(names.last(), Some(&"run.finished"), "{names:?}");
    let end = events.last().unwrap();
    assert_eq!(end.data["event"]["run_id"], run_id.as_str());
    assert_eq!(end.data["event"]["stop_reason"], "completed");
    // The tool ran with the model's arguments; the model saw its output.
    let sent = server.mock.requests()[1].body.to_string();
    assert!(sent.contains("hello"), "{sent}");
    assert_eq!(session_status(&server, &session).await, "idle");
    let (_, after) = server.get(&format!("/v1/runs/{run_id}/approvals")).await;
    assert_eq!(after["pending"].as_array().unwrap().len(), 0);
    server.mock.check_protocol().unwrap();
}

#[tokio::test]
async fn rejections_and_bad_decisions() {
    let server = start().await;
    with_echo(&server).await;
    let (session, run_id, call_id) = waiting(&server).await;
    let path = format!("/v1/runs/{run_id}/approvals");
    // Typed errors for bad input.
    for (body, status) in [
        (json!({}), 400),
        (json!({"call_id": call_id, "decision": "maybe"}), 400),
        (json!({"call_id": call_id, "decision": "edit"}), 400),
        (
            json!({"call_id": call_id, "decision": "approve", "arguments": {"text": "x"}}),
            400,
        ),
        (json!({"call_id": "nope", "decision": "approve"}), 400),
        (
            json!({"call_id": call_id, "decision": "edit", "arguments": {"text": 5}}),
            400,
        ),
        (json!({"decisions": []}), 400),
        (
            json!({"call_id": call_id, "decision": "approve", "extra": 1}),
            400,
        ),
    ] {
        let (got, error) = server.post(&path, body.clone()).await;
        assert_eq!(got, status, "{body} → {error}");
        assert_eq!(error["error"]["code"], "invalid_request", "{error}");
    }
    let (status, _) = server.post("/v1/runs/not-a-run/approvals", json!({})).await;
    assert_eq!(status, 400);
    let unknown = agentry_types::RunId::new();
    let (status, error) = server.get(&format!("/v1/runs/{unknown}/approvals")).await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["code"], "not_found");
    // Still waiting: nothing bad was committed.
    assert_eq!(session_status(&server, &session).await, "waiting");
    // A waiting run cannot be paused or resumed.
    let (status, _) = server
        .post(&format!("/v1/runs/{run_id}/pause"), json!({}))
        .await;
    assert_eq!(status, 409);
    let (status, _) = server
        .post(&format!("/v1/runs/{run_id}/resume"), json!({}))
        .await;
    assert_eq!(status, 409);

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("I will not echo.")));
    let (status, decided) = server
        .post(
            &path,
            json!({"decisions": [{"call_id": call_id, "decision": "reject",
                                  "reason": "echoing is forbidden today"}]}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    let events = follow(&server, &session).await;
    assert_eq!(names(&events).last(), Some(&"run.finished"));
    let sent = server.mock.requests()[1].body.to_string();
    assert!(sent.contains("echoing is forbidden today"), "{sent}");
    // Deciding again: the run no longer waits.
    let (status, _) = server
        .post(&path, json!({"call_id": call_id, "decision": "approve"}))
        .await;
    assert_eq!(status, 409);
    server.mock.check_protocol().unwrap();
}

#[tokio::test]
async fn an_edited_call_runs_with_the_edited_arguments() {
    let server = start().await;
    with_echo(&server).await;
    let (session, run_id, call_id) = waiting(&server).await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Done.")));
    let (status, decided) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals"),
            json!({"call_id": call_id, "decision": "edit",
                   "arguments": {"text": "goodbye instead"}}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    follow(&server, &session).await;
    let sent = server.mock.requests()[1].body.to_string();
    assert!(
        sent.contains("goodbye instead"),
        "the tool echoed the edit: {sent}"
    );
    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let intent = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"]["type"] == "tool_call_intent")
        .expect("the call ran")
        .clone();
    assert_eq!(
        intent["event"]["call"]["arguments"],
        json!({"text": "goodbye instead"})
    );
}

/// A server over the store in `home`, served with start-up recovery until `state.shutdown`.
async fn serve_on(home: &std::path::Path) -> (String, AppState, tokio::task::JoinHandle<()>) {
    let store = Store::open_home(home).await.unwrap();
    // About recovery, not about where commands run: the `echo` command tool runs on the host,
    // allowed explicitly.
    let tools = ToolEnvironment {
        allow_host_commands: true,
        ..ToolEnvironment::default()
    };
    let state = AppState::with_tools(store, tools).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = state.clone();
    let task = tokio::spawn(async move {
        let config = ServerConfig {
            shutdown_grace: Duration::from_millis(100),
            ..ServerConfig::default()
        };
        agentry_server::serve(listener, served, &config)
            .await
            .unwrap();
    });
    (url, state, task)
}

#[tokio::test]
async fn a_waiting_run_survives_a_server_restart() {
    let home = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await.unwrap();
    {
        let store = Store::open_home(home.path()).await.unwrap();
        store
            .put_config(
                ConfigKind::Model,
                "mock",
                &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(),
                        "model_name": "m"}),
            )
            .await
            .unwrap();
        store
            .put_config(ConfigKind::Tool, "echo", &echo_tool())
            .await
            .unwrap();
    }
    let http = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "echo",
        json!({"text": "survivor"}),
    )));
    let (url, state, task) = serve_on(home.path()).await;
    let body: Value = http
        .post(format!("{url}/v1/infer"))
        .json(
            &json!({"text": "echo", "session_id": "new", "tool_ids": ["echo"],
                      "approvals": {"tools": {"echo": "always"}}}),
        )
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["stop_reason"], "waiting", "{body}");
    let session = body["session_id"].as_str().unwrap().to_owned();
    let run_id = body["run_id"].as_str().unwrap().to_owned();
    let call_id = body["pending"][0]["call"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    // Stop the server.
    state.app.parts().shutdown.cancel();
    task.await.unwrap();
    drop(state);

    // A new server on the same database: recovery leaves the waiting run alone.
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Back again.")));
    let (url, state, task) = serve_on(home.path()).await;
    let detail: Value = http
        .get(format!("{url}/v1/sessions/{session}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(detail["session"]["status"], "waiting", "{detail}");
    let listed: Value = http
        .get(format!("{url}/v1/runs/{run_id}/approvals"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["pending"][0]["call"]["id"],
        call_id.as_str(),
        "{listed}"
    );
    let response = http
        .post(format!("{url}/v1/runs/{run_id}/approvals"))
        .json(&json!({"call_id": call_id, "decision": "approve"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    // The run completes in the same session with the same id.
    let mut finished = None;
    for _ in 0..200 {
        let events: Value = http
            .get(format!("{url}/v1/sessions/{session}/events"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        finished = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["event"]["type"] == "run_finished")
            .cloned();
        if finished.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let finished = finished.expect("the run finished");
    assert_eq!(finished["event"]["run_id"], run_id.as_str());
    assert_eq!(finished["event"]["stop_reason"], "completed");
    let sent = mock.requests()[1].body.to_string();
    assert!(sent.contains("survivor"), "{sent}");
    state.app.parts().shutdown.cancel();
    task.await.unwrap();
}

/// Starts a session run calling the ~600 ms `slow` tool; returns the stream, session and run.
async fn slow_run(server: &Server) -> (super::support::SseClient, String, String) {
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::tool_call("slow", json!({}))));
    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(json!({"text": "go slowly", "session_id": "new", "tool_ids": ["slow"]})),
            None,
        )
        .await;
    let session = stream.session.clone().unwrap();
    let mut run_id = None;
    while let Some(event) = stream.next().await {
        if event.name == "run.started" {
            run_id = event.data["event"]["run_id"].as_str().map(str::to_owned);
        }
        if event.name == "tool.started" {
            break;
        }
    }
    (stream, session, run_id.expect("run.started"))
}

#[tokio::test]
async fn pause_then_resume_over_http() {
    let server = start().await;
    let (mut stream, session, run_id) = slow_run(&server).await;
    let (status, paused) = server
        .post(&format!("/v1/runs/{run_id}/pause"), json!({}))
        .await;
    assert_eq!(status, 202, "{paused}");
    assert_eq!(paused["status"], "pausing");
    let rest = stream.rest().await;
    assert_eq!(
        names(&rest).last(),
        Some(&"run.paused"),
        "{:?}",
        names(&rest)
    );
    assert_eq!(session_status(&server, &session).await, "paused");
    assert_eq!(
        server.mock.request_count(),
        1,
        "no model call after the pause"
    );

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Resumed.")));
    let (status, resumed) = server
        .post(&format!("/v1/runs/{run_id}/resume"), json!({}))
        .await;
    assert_eq!(status, 200, "{resumed}");
    let events = follow(&server, &session).await;
    let end = events.last().unwrap();
    assert_eq!(end.name, "run.finished");
    assert_eq!(end.data["event"]["run_id"], run_id.as_str());
    assert!(names(&events).contains(&"run.resumed"));
    assert_eq!(session_status(&server, &session).await, "idle");
    // Not paused any more.
    let (status, error) = server
        .post(&format!("/v1/runs/{run_id}/resume"), json!({}))
        .await;
    assert_eq!(status, 409, "{error}");
    assert_eq!(error["error"]["code"], "conflict");
}

#[tokio::test]
async fn interrupt_over_http_keeps_the_session_usable() {
    let server = start().await;
    let (mut stream, session, run_id) = slow_run(&server).await;
    let (status, body) = server
        .post(&format!("/v1/runs/{run_id}/interrupt"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    let rest = stream.rest().await;
    let end = rest.last().unwrap();
    assert_eq!(end.name, "run.finished");
    assert_eq!(end.data["event"]["stop_reason"], "cancelled");
    assert_eq!(session_status(&server, &session).await, "interrupted");
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Fine.")));
    let (status, next) = server
        .post("/v1/infer", json!({"text": "again", "session_id": session}))
        .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["text"], "Fine.");
}

#[tokio::test]
async fn abort_over_http_drops_the_queue() {
    let server = start().await;
    let (mut stream, session, run_id) = slow_run(&server).await;
    let queued = {
        let http = server.http.clone();
        let url = format!("{}/v1/infer", server.url);
        let session = session.clone();
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"text": "queued message", "session_id": session,
                              "policy": "enqueue"}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let id = agentry_types::SessionId::parse(&session).unwrap();
    for _ in 0..200 {
        if server.state.app.parts().sessions.queued(id) == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(server.state.app.parts().sessions.queued(id), 1);
    let (status, body) = server
        .post(&format!("/v1/runs/{run_id}/abort"), json!({}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["dropped_queued"], 1);
    let rest = stream.rest().await;
    assert_eq!(
        rest.last().unwrap().data["event"]["stop_reason"],
        "cancelled"
    );
    let queued = queued.await.unwrap();
    assert_eq!(queued["stop_reason"], "cancelled", "{queued}");
    assert_eq!(server.mock.request_count(), 1);
    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    assert!(!events.to_string().contains("queued message"));
    // The old abort route still works (nothing live now).
    let (status, old) = server
        .post("/v1/infer/abort", json!({"session_id": session}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(old["aborted"], false);
}

#[tokio::test]
async fn a_quota_stop_shows_its_reason_and_note() {
    let server = start().await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "thrifty", "model_id": "mock", "tool_ids": ["slow"],
                   "limits": {"max_tool_calls": 1}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("slow", json!({})).with_tool_call("slow", json!({})),
    ));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "thrifty", "text": "two calls", "session_id": "new"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stop_reason"], "quota_exceeded");
    assert!(
        body["note"].as_str().unwrap().contains("max_tool_calls"),
        "{body}"
    );
}

#[tokio::test]
async fn approval_policies_are_validated_on_agents_and_requests() {
    let server = start().await;
    let (status, error) = server
        .post(
            "/v1/agents",
            json!({"id": "bad", "model_id": "mock",
                   "approvals": {"tools": {"exec": {"ask_if": {"commands": ["re:("]}}}}}),
        )
        .await;
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("approvals")
    );
    let (status, _) = server
        .post(
            "/v1/agents",
            json!({"id": "careful", "model_id": "mock", "tool_ids": ["slow"],
                   "approvals": {"tools": {"slow": "always"}}}),
        )
        .await;
    assert_eq!(status, 201);
    // An ephemeral run that may wait is refused: it needs a session.
    let (status, error) = server
        .post("/v1/infer", json!({"agent_id": "careful", "text": "hi"}))
        .await;
    assert_eq!(status, 400, "{error}");
    let (status, error) = server
        .post(
            "/v1/infer",
            json!({"text": "hi", "session_id": "new",
                   "approvals": {"tools": {"slow": {"ask_if": {}}}}}),
        )
        .await;
    assert_eq!(status, 400, "{error}");
    let (status, _) = server
        .post(
            "/v1/infer",
            json!({"text": "hi", "approvals": {"tools": {"slow": "sometimes"}}}),
        )
        .await;
    assert_eq!(status, 400);
    // The agent's policy applies: its call waits.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::tool_call("slow", json!({}))));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "careful", "text": "go", "session_id": "new"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stop_reason"], "waiting");
}

#[tokio::test]
async fn a_streamed_run_ends_its_stream_with_run_waiting() {
    let server = start().await;
    with_echo(&server).await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "echo",
        json!({"text": "streamed"}),
    )));
    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(
                json!({"text": "echo", "session_id": "new", "tool_ids": ["echo"],
                        "approvals": {"default": "always"}}),
            ),
            None,
        )
        .await;
    let events = stream.rest().await;
    let names = names(&events);
    assert!(names.contains(&"approval.requested"), "{names:?}");
    let end = events.last().unwrap();
    assert_eq!(end.name, "run.waiting", "{names:?}");
    assert_eq!(end.data["status"], "waiting");
    assert_eq!(
        end.data["pending"][0]["call"]["arguments"]["text"],
        "streamed"
    );
    let session = stream.session.clone().unwrap();
    let (_, listed) = server
        .get(&format!("/v1/sessions/{session}/approvals"))
        .await;
    assert_eq!(listed["status"], "waiting");
}
