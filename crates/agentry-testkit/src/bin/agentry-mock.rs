//! `agentry-mock`: the testkit's [`MockProvider`] as a process, for tests written outside Rust
//! (the web console's end-to-end suite drives it from Node).
//!
//! It prints one JSON line — `{"base_url", "openai_base_url", "anthropic_base_url",
//! "ollama_base_url", "control_url"}` — then serves until it is killed or stdin closes. The
//! control API, on its own port:
//!
//! - `POST /enqueue` `{"turns": [TURN, …]}`: replies served in order, one per model request;
//! - `POST /fallback` `TURN` (or `null` to clear): the reply when none is queued;
//! - `GET /requests`: `{"count", "requests": [{"path", "body"}]}`, every request received;
//! - `POST /reset`: forgets queued replies, the fallback and the recorded requests.
//!
//! A TURN: `{"text"?, "thinking"?, "tool_calls"?: [{"name", "arguments", "id"?}],
//! "usage"?: [input, output], "pace_ms"?, "chunk_bytes"?}` — a streamed answer is written in
//! `chunk_bytes`-sized pieces (default 48) `pace_ms` apart (default 0), so a client sees it
//! arrive; or `{"status", "error"}` for an HTTP error reply.

use std::net::SocketAddr;
use std::time::Duration;

use agentry_testkit::{Chunking, MockProvider, Reply, ScriptedTurn};
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallSpec {
    name: String,
    #[serde(default)]
    arguments: Value,
    #[serde(default)]
    id: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TurnSpec {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    tool_calls: Vec<CallSpec>,
    #[serde(default)]
    usage: Option<(u64, u64)>,
    #[serde(default)]
    pace_ms: Option<u64>,
    #[serde(default)]
    chunk_bytes: Option<usize>,
    #[serde(default)]
    status: Option<u16>,
    #[serde(default)]
    error: Option<Value>,
}

impl TurnSpec {
    fn reply(self) -> Reply {
        if let Some(status) = self.status {
            return Reply::error(
                status,
                self.error
                    .unwrap_or_else(|| json!({"error": {"message": "scripted error"}})),
            );
        }
        let mut turn = ScriptedTurn::default();
        if let Some(text) = self.text {
            turn = turn.with_text(text);
        }
        if let Some(thinking) = self.thinking {
            turn = turn.with_thinking(thinking, "mock-signature");
        }
        for call in self.tool_calls {
            let arguments = if call.arguments.is_null() {
                json!({})
            } else {
                call.arguments
            };
            let mut scripted = agentry_testkit::ScriptedToolCall::new(call.name, arguments);
            if let Some(id) = call.id {
                scripted = scripted.with_id(id);
            }
            turn = turn.with_scripted_call(scripted);
        }
        let (input, output) = self.usage.unwrap_or((12, 8));
        turn = turn.with_usage(input, output);
        let mut reply =
            Reply::scripted(turn).chunked(Chunking::Every(self.chunk_bytes.unwrap_or(48)));
        if let Some(pace) = self.pace_ms.filter(|pace| *pace > 0) {
            reply = reply.paced(Duration::from_millis(pace));
        }
        reply
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Enqueue {
    turns: Vec<TurnSpec>,
}

async fn enqueue(State(mock): State<MockProvider>, Json(body): Json<Enqueue>) -> Json<Value> {
    let count = body.turns.len();
    for turn in body.turns {
        mock.enqueue(turn.reply());
    }
    Json(json!({"queued": count, "pending": mock.pending_replies()}))
}

async fn fallback(
    State(mock): State<MockProvider>,
    Json(body): Json<Option<TurnSpec>>,
) -> StatusCode {
    match body {
        Some(turn) => mock.set_fallback(turn.reply()),
        None => mock.clear_fallback(),
    }
    StatusCode::NO_CONTENT
}

async fn requests(State(mock): State<MockProvider>) -> Json<Value> {
    let requests: Vec<Value> = mock
        .requests()
        .into_iter()
        .map(|request| json!({"path": request.path, "body": request.body}))
        .collect();
    Json(json!({"count": requests.len(), "requests": requests}))
}

async fn reset(State(mock): State<MockProvider>) -> StatusCode {
    mock.clear_fallback();
    mock.clear_queue();
    mock.take_requests();
    StatusCode::NO_CONTENT
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mock = MockProvider::start().await?;
    let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let control = listener.local_addr()?;
    let app = Router::new()
        .route("/enqueue", post(enqueue))
        .route("/fallback", post(fallback))
        .route("/requests", get(requests))
        .route("/reset", post(reset))
        .with_state(mock.clone());
    println!(
        "{}",
        json!({
            "base_url": mock.base_url(),
            "openai_base_url": mock.openai_base_url(),
            "anthropic_base_url": mock.anthropic_base_url(),
            "ollama_base_url": mock.ollama_base_url(),
            "control_url": format!("http://{control}"),
        })
    );
    // Ends when the parent goes away (stdin closes) or on Ctrl-C.
    let stdin_closed = async {
        use tokio::io::AsyncReadExt;
        let mut stdin = tokio::io::stdin();
        let mut buffer = [0u8; 64];
        while matches!(stdin.read(&mut buffer).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        served = axum::serve(listener, app.into_make_service()) => served?,
        () = stdin_closed => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
