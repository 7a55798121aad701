//! Streaming clients that read slowly (issue 49): a run writes thousands of large deltas while
//! its client reads nothing, so the client's subscription falls far behind the live channel
//! (256 events) once the socket's buffers are full. When the run has ended the client reads its
//! whole stream; from every front-end it gets every byte of the answer, in order, as deltas —
//! what it missed live is caught up from the log, never left out.

use std::time::Duration;

use agentry_app::queue::QueueSettings;
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, host_commands, start_with};

/// Words in the answer, each one delta of the mock's stream.
const WORDS: usize = 4_000;

/// The answer: `WORDS` words of about 2 KB each (8 MB in all, twice what the sockets between
/// the server and a client that reads nothing hold).
fn answer() -> String {
    (0..WORDS)
        .map(|index| format!("w{index:05}{}", "x".repeat(2_000)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A server whose worker runs background runs (A2A tasks are), answering `answer` once.
async fn start(answer: &str) -> Server {
    let server = start_with(host_commands, |_| {}).await;
    server.state.app.set_queue_settings(QueueSettings {
        poll: Duration::from_millis(50),
        ..QueueSettings::default()
    });
    server.state.app.start_worker();
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text(answer)));
    server
}

/// Sends `request`, takes the response's head, waits (reading nothing) until no run is live,
/// then reads the whole body.
async fn read_after_the_run(server: &Server, request: reqwest::RequestBuilder) -> String {
    let response = request.send().await.unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    // The run starts (an A2A task on the worker), then ends while the client reads nothing.
    while server.state.app.hub().live_runs() == 0 && server.mock.requests().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    while server.state.app.hub().live_runs() > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::timeout(Duration::from_secs(60), response.text())
        .await
        .expect("the stream ends")
        .unwrap()
}

/// The `data:` payloads of an SSE body, with each event's name (`message` when unnamed).
fn sse(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|event| !event.trim().is_empty())
        .filter_map(|event| {
            let mut name = "message".to_owned();
            let mut data = Vec::new();
            for line in event.lines() {
                if let Some(value) = line.strip_prefix("event:") {
                    name = value.trim().to_owned();
                } else if let Some(value) = line.strip_prefix("data:") {
                    data.push(value.strip_prefix(' ').unwrap_or(value));
                }
            }
            (!data.is_empty()).then(|| (name, data.join("\n")))
        })
        .collect()
}

fn json_of(data: &str) -> Value {
    serde_json::from_str(data).unwrap_or(Value::Null)
}

/// Checks that the streamed text is the answer, byte for byte, saying where it first differs.
fn assert_whole(front_end: &str, streamed: &str, answer: &str) {
    if streamed == answer {
        return;
    }
    let same = streamed
        .bytes()
        .zip(answer.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    panic!(
        "{front_end}: the streamed text ({} bytes) is not the answer ({} bytes): they differ from byte {same}",
        streamed.len(),
        answer.len()
    );
}

#[tokio::test]
async fn a_v1_stream_read_slowly_gets_every_delta() {
    let answer = answer();
    let server = start(&answer).await;
    let request = server
        .http
        .post(format!("{}/v1/infer/stream", server.url))
        .json(&json!({"session_id": "new", "text": "Write it all."}));
    let body = read_after_the_run(&server, request).await;
    let events = sse(&body);
    let streamed: String = events
        .iter()
        .filter(|(name, _)| name == "delta.text")
        .map(|(_, data)| {
            json_of(data)["text"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_whole("/v1/infer/stream", &streamed, &answer);
    assert_eq!(
        events.last().unwrap().0,
        "run.finished",
        "{:?}",
        events.last()
    );
}

#[tokio::test]
async fn an_openai_chat_stream_read_slowly_gets_every_byte() {
    let answer = answer();
    let server = start(&answer).await;
    let request = server
        .http
        .post(format!("{}/openai/v1/chat/completions", server.url))
        .header("x-agentry-session-id", "new")
        .json(&json!({"model": "mock", "stream": true,
                      "messages": [{"role": "user", "content": "Write it all."}]}));
    let body = read_after_the_run(&server, request).await;
    let events = sse(&body);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|(_, data)| json_of(data))
        .collect();
    let streamed: String = chunks
        .iter()
        .filter_map(|chunk| chunk["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_whole("chat completions", &streamed, &answer);
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop", "{last}");
}

#[tokio::test]
async fn a_responses_stream_read_slowly_gets_every_byte() {
    let answer = answer();
    let server = start(&answer).await;
    let request = server
        .http
        .post(format!("{}/openai/v1/responses", server.url))
        .json(&json!({"model": "mock", "stream": true, "input": "Write it all."}));
    let body = read_after_the_run(&server, request).await;
    let events = sse(&body);
    let streamed: String = events
        .iter()
        .filter(|(name, _)| name == "response.output_text.delta")
        .map(|(_, data)| {
            json_of(data)["delta"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    assert_whole("responses", &streamed, &answer);
    let (name, data) = events.last().unwrap();
    assert_eq!(name, "response.completed");
    let completed = json_of(data);
    let text = completed["response"]["output"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().unwrap().clone())
        .filter_map(|part| part["text"].as_str().map(str::to_owned))
        .collect::<String>();
    assert_whole("responses (completed)", &text, &answer);
}

#[tokio::test]
async fn an_a2a_stream_read_slowly_gets_every_byte() {
    let answer = answer();
    let server = start(&answer).await;
    let (status, created) = server
        .post(
            "/v1/agents",
            json!({"id": "writer", "model_id": "mock", "a2a": {}}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    let request = server
        .http
        .post(format!("{}/a2a/writer", server.url))
        .header("content-type", "application/json")
        .body(
            json!({"jsonrpc": "2.0", "id": "r1", "method": "message/stream", "params": {"message":
                   {"role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "Write it all."}]}}})
            .to_string(),
        );
    let body = read_after_the_run(&server, request).await;
    // The artifact as a client builds it: a chunk that appends extends it, one that does not
    // starts it anew; the streamed chunks before the closing one hold the answer too.
    let mut artifact = String::new();
    let mut streamed = String::new();
    for (_, data) in sse(&body) {
        let result = &json_of(&data)["result"];
        if result["kind"] != "artifact-update" {
            continue;
        }
        let text: String = result["artifact"]["parts"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|part| part["text"].as_str())
            .collect();
        if result["append"] == true {
            artifact.push_str(&text);
        } else {
            artifact = text.clone();
        }
        if result["lastChunk"] != true {
            if result["append"] != true {
                streamed.clear();
            }
            streamed.push_str(&text);
        }
    }
    assert_whole("A2A (streamed chunks)", &streamed, &answer);
    assert_whole("A2A (artifact)", &artifact, &answer);
}

#[tokio::test]
async fn a_seed_stream_read_slowly_gets_every_byte() {
    let answer = answer();
    let server = start(&answer).await;
    let request = server
        .http
        .post(format!("{}/linglong/v1/infer/stream", server.url))
        .json(
            &json!({"model_id": "mock", "stream": true, "session_id": "new",
                      "messages": [{"role": "user", "content": "Write it all."}]}),
        );
    let body = read_after_the_run(&server, request).await;
    let events = sse(&body);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    let streamed: String = events
        .iter()
        .map(|(_, data)| json_of(data))
        .filter(|frame| frame["role"] == "assistant")
        .filter_map(|frame| frame["content"].as_str().map(str::to_owned))
        .collect();
    assert_whole("seed", &streamed, &answer);
}
