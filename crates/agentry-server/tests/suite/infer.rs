//! Inference over HTTP: waiting and streamed, durable runs, reconnecting with Last-Event-ID,
//! several clients on one run, abort, and bad input.

use std::time::Duration;

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Received, seqs, start};

fn two_rounds(server: &super::support::Server, tool: &str) {
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::tool_call(tool, json!({}))));
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("All done, with a fairly long answer.").with_usage(20, 7),
    ));
}

#[tokio::test]
async fn infer_waits_and_returns_the_new_messages() {
    let server = start().await;
    two_rounds(&server, "current_time");
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "What time is it?"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["success"], true);
    assert_eq!(body["stop_reason"], "completed");
    assert_eq!(body["text"], "All done, with a fairly long answer.");
    assert_eq!(body["rounds"], 2);
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    let session = body["session_id"].as_str().unwrap().to_owned();
    // The session holds the same conversation.
    let (_, shown) = server.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(shown["messages"].as_array().unwrap().len(), 4);
    assert_eq!(shown["session"]["status"], "idle");
    // A second turn continues it.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Still here.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": session, "messages": [{"role": "user", "content": "Again?"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "Still here.");
    assert!(
        server.mock.requests()[2]
            .body
            .to_string()
            .contains("What time is it?")
    );
    server.mock.check_protocol().unwrap();
}

#[tokio::test]
async fn stateless_inference_stores_nothing() {
    let server = start().await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Hi!")));
    let (status, body) = server.post("/v1/infer", json!({"text": "Hello"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "Hi!");
    assert!(body["session_id"].is_null());
    let (_, list) = server.get("/v1/sessions").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0);
}

#[tokio::test]
async fn a_failing_model_is_a_typed_error() {
    let server = start().await;
    server.mock.enqueue(Reply::error(
        401,
        json!({"error": {"message": "bad key", "type": "invalid_api_key"}}),
    ));
    let (status, body) = server
        .post("/v1/infer", json!({"session_id": "new", "text": "x"}))
        .await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(body["success"], false);
    assert_eq!(body["error"]["code"], "authentication");
    assert_eq!(body["stop_reason"], "error");
}

#[tokio::test]
async fn the_stream_names_events_and_numbers_committed_steps() {
    let server = start().await;
    two_rounds(&server, "current_time");
    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(json!({"session_id": "new", "text": "What time is it?"})),
            None,
        )
        .await;
    assert!(stream.session.is_some());
    let events = stream.rest().await;
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names[0], "session");
    for expected in [
        "run.started",
        "message",
        "delta.text",
        "usage",
        "tool.started",
        "tool.result",
        "run.finished",
    ] {
        assert!(names.contains(&expected), "missing {expected} in {names:?}");
    }
    assert_eq!(*names.last().unwrap(), "run.finished");
    // Committed steps are numbered 1.. with no gap; deltas carry no id.
    let ids = seqs(&events);
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    // On the wire, deltas carry no id line and committed steps do.
    two_rounds(&server, "current_time");
    let raw = server
        .http
        .post(format!("{}/v1/infer/stream", server.url))
        .json(&json!({"session_id": "new", "text": "again"}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let blocks: Vec<&str> = raw.split("\n\n").filter(|b| b.contains("event:")).collect();
    assert!(blocks.iter().any(|b| b.contains("event: delta.text")));
    for block in blocks {
        let has_id = block.lines().any(|line| line.starts_with("id:"));
        let uncommitted = ["event: delta.", "event: usage", "event: session"]
            .iter()
            .any(|name| block.contains(name));
        assert_eq!(has_id, !uncommitted, "{block}");
    }
    // The ids are the log's seqs.
    let session = stream.session.unwrap();
    let (_, stored) = server.get(&format!("/v1/sessions/{session}/events")).await;
    assert_eq!(stored["events"].as_array().unwrap().len(), ids.len());
}

/// Starts a run whose tool takes ~600 ms, returning the stream and the session id.
async fn slow_run(server: &super::support::Server) -> (super::support::SseClient, String) {
    two_rounds(server, "slow");
    let stream = server
        .sse(
            "/v1/infer/stream",
            Some(json!({"session_id": "new", "text": "Take your time."})),
            None,
        )
        .await;
    let session = stream.session.clone().unwrap();
    (stream, session)
}

async fn until(stream: &mut super::support::SseClient, name: &str) -> Vec<Received> {
    let mut seen = Vec::new();
    while let Some(event) = stream.next().await {
        let done = event.name == name;
        seen.push(event);
        if done {
            break;
        }
    }
    seen
}

#[tokio::test]
async fn reconnecting_with_last_event_id_gets_every_later_step_exactly_once() {
    let server = start().await;
    let (mut first, session) = slow_run(&server).await;
    let before = until(&mut first, "tool.started").await;
    let last = *seqs(&before).last().unwrap();
    drop(first); // the connection breaks mid-run
    let mut again = server
        .sse(&format!("/v1/sessions/{session}/stream"), None, Some(last))
        .await;
    let after = again.rest().await;
    assert_eq!(after.last().unwrap().name, "run.finished");
    let mut all = seqs(&before);
    all.extend(seqs(&after));
    let (_, stored) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let stored: Vec<u64> = stored["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(all, stored, "every committed event exactly once, in order");
}

#[tokio::test]
async fn a_second_client_attaching_mid_run_sees_the_same_run() {
    let server = start().await;
    let (mut first, session) = slow_run(&server).await;
    until(&mut first, "tool.started").await;
    let mut second = server
        .sse(&format!("/v1/sessions/{session}/stream"), None, None)
        .await;
    let seen_by_second = second.rest().await;
    let rest_of_first = first.rest().await;
    assert_eq!(seen_by_second.last().unwrap().name, "run.finished");
    assert_eq!(rest_of_first.last().unwrap().name, "run.finished");
    // The second client got the whole committed history from seq 1.
    let ids = seqs(&seen_by_second);
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());
    let finished = |events: &[Received]| {
        events
            .iter()
            .find(|e| e.name == "run.finished")
            .map(|e| e.data.clone())
    };
    assert_eq!(finished(&seen_by_second), finished(&rest_of_first));
}

async fn wait_idle(server: &super::support::Server, session: &str) -> Value {
    for _ in 0..200 {
        let (_, shown) = server.get(&format!("/v1/sessions/{session}")).await;
        if shown["session"]["status"] != "running" {
            return shown;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the run did not finish");
}

#[tokio::test]
async fn a_run_finishes_after_its_client_disconnects() {
    let server = start().await;
    let (mut stream, session) = slow_run(&server).await;
    until(&mut stream, "run.started").await;
    drop(stream);
    let shown = wait_idle(&server, &session).await;
    assert_eq!(shown["session"]["status"], "idle");
    let last = shown["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(
        last["content"][0]["text"],
        "All done, with a fairly long answer."
    );
}

#[tokio::test]
async fn cancel_on_disconnect_opts_out() {
    let server = start().await;
    two_rounds(&server, "slow");
    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(json!({"session_id": "new", "text": "x", "cancel_on_disconnect": true})),
            None,
        )
        .await;
    let session = stream.session.clone().unwrap();
    until(&mut stream, "tool.started").await;
    drop(stream);
    let shown = wait_idle(&server, &session).await;
    assert_eq!(shown["session"]["status"], "interrupted");
}

#[tokio::test]
async fn abort_ends_the_run_with_a_final_event() {
    let server = start().await;
    let (mut stream, session) = slow_run(&server).await;
    until(&mut stream, "tool.started").await;
    let (status, body) = server
        .post("/v1/infer/abort", json!({"session_id": session}))
        .await;
    assert_eq!((status, body["aborted"].clone()), (200, json!(true)));
    let rest = stream.rest().await;
    let end = rest.last().unwrap();
    assert_eq!(end.name, "run.finished");
    assert_eq!(end.data["event"]["stop_reason"], "cancelled");
    let (_, body) = server
        .post("/v1/infer/abort", json!({"session_id": session}))
        .await;
    assert_eq!(body["aborted"], false);
}

#[tokio::test]
async fn a_second_message_while_busy_is_rejected_by_default() {
    let server = start().await;
    let (mut stream, session) = slow_run(&server).await;
    until(&mut stream, "tool.started").await;
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": session, "text": "me too"}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "conflict");
    assert_eq!(body["error"]["details"]["session_id"], session.as_str());
    stream.rest().await;
}

#[tokio::test]
async fn bad_input_is_a_clear_4xx_and_writes_nothing() {
    let server = start().await;
    let cases: Vec<(&str, u16)> = vec![
        ("{not json", 400),
        (r#"{"text": 5}"#, 400),
        (r#"{"text": "x", "unknown_field": 1}"#, 400),
        (r#"{"session_id": "../../x", "text": "x"}"#, 400),
        (
            r#"{"session_id": "01890a5d-ac96-774b-bcce-b302099a8057", "text": "x"}"#,
            404,
        ),
        (
            r#"{"session_id": "new", "text": "x", "model_id": "gpt-9"}"#,
            400,
        ),
        (
            r#"{"session_id": "new", "text": "x", "tool_ids": ["rm_rf"]}"#,
            400,
        ),
        (
            r#"{"messages": [{"role": "assistant", "content": "x"}]}"#,
            400,
        ),
        (r#"{"messages": [{"role": "user", "content": 7}]}"#, 400),
        (
            r#"{"messages": [{"role": "user", "content": "x", "images": ["ftp://x"]}]}"#,
            400,
        ),
        (r#"{}"#, 400),
    ];
    for (body, expected) in cases {
        let (status, reply) = server.raw(reqwest::Method::POST, "/v1/infer", body).await;
        assert_eq!(status, expected, "{body}: {reply}");
        assert!(reply["error"]["code"].is_string(), "{body}: {reply}");
        assert!(reply["error"]["message"].is_string());
    }
    let huge = format!(r#"{{"text": "{}"}}"#, "x".repeat(5 * 1024 * 1024));
    let (status, reply) = server.raw(reqwest::Method::POST, "/v1/infer", &huge).await;
    assert_eq!(status, 413, "{reply}");
    assert_eq!(reply["error"]["code"], "request_too_large");
    // Only the session named "new" with a bad model got created? No: model errors come first.
    let (_, list) = server.get("/v1/sessions").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 0, "{list}");
    assert_eq!(server.mock.request_count(), 0);
    let (status, reply) = server.get("/v1/nope").await;
    assert_eq!(
        (status, reply["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
}

#[tokio::test]
async fn shutdown_ends_open_streams_with_a_final_event_and_the_run_resumes_later() {
    let server = start().await;
    let (mut stream, session) = slow_run(&server).await;
    let seen = until(&mut stream, "tool.started").await;
    server.state.app.parts().shutdown.cancel();
    let rest = stream.rest().await;
    let last = rest.last().unwrap();
    assert_eq!(last.name, "server.shutdown");
    assert_eq!(last.data["session_id"], session.as_str());
    assert_eq!(last.data["last_seq"], *seqs(&seen).last().unwrap());
    assert_eq!(
        last.data["resume"],
        format!("/v1/sessions/{session}/stream")
    );
}
