//! HTTP API benchmark. Prints a report; asserts nothing.
//!
//! `cargo bench -p agentry-server --bench infer`
//!
//! 1. `POST /v1/infer` running a two-round tool loop (tool call, then answer) in a new durable
//!    session against the zero-latency mock provider: requests per second and p50/p99 latency
//!    at concurrency 1, 20 and 200. Client, server, mock and SQLite share the machine.
//! 2. The OpenAI-compatible endpoint's added cost: the same one-round stateless run through
//!    `POST /openai/v1/chat/completions` and through `POST /v1/infer`, whole and streamed, in
//!    alternating batches at concurrency 20; requests per second and the ratio.
//! 3. Start-up: time from spawning `agentry serve` to `/readyz` answering (needs the binary:
//!    `cargo build -p agentry --release` first; skipped if it is missing).

// They await whole futures on purpose: nothing keeps them per request in flight, as a
// handler's is (the crate's 2 KiB `future-size-threshold`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::large_futures)]

use std::time::{Duration, Instant};

use agentry_server::{AppState, router};
use agentry_store::{ConfigKind, Store};
use agentry_testkit::{MockProvider, Reply};
use futures::StreamExt;
use serde_json::json;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The mock provider; `load` queues its replies.
async fn mock() -> MockProvider {
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(
        agentry_testkit::ScriptedTurn::text("It is noon.").with_usage(30, 4),
    ));
    mock
}

async fn server(mock: &MockProvider) -> (String, tempfile::TempDir) {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "m"}),
        )
        .await
        .unwrap();
    let state = AppState::new(store).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(
            agentry_server::without_delay(listener),
            router(state).into_make_service(),
        )
        .await
        .unwrap()
    });
    (url, home)
}

async fn load(url: &str, mock: &MockProvider, concurrency: usize, total: usize) {
    let http = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
    // Two rounds per run: a (tool call, answer) pair per run. Concurrent runs interleave the
    // queue, but every answer ends exactly one run, so runs average exactly two model calls.
    for _ in 0..total {
        mock.enqueue(Reply::scripted(agentry_testkit::ScriptedTurn::tool_call(
            "current_time",
            json!({}),
        )));
        mock.enqueue(Reply::scripted(
            agentry_testkit::ScriptedTurn::text("It is noon.").with_usage(30, 4),
        ));
    }
    let started = Instant::now();
    let mut latencies: Vec<Duration> = futures::stream::iter(0..total)
        .map(|_| {
            let http = http.clone();
            let url = url.to_owned();
            async move {
                let begun = Instant::now();
                let response = http
                    .post(format!("{url}/v1/infer"))
                    .json(&json!({"session_id": "new", "text": "What time is it?"}))
                    .send()
                    .await
                    .unwrap();
                assert!(response.status().is_success(), "{}", response.status());
                let _ = response.bytes().await.unwrap();
                begun.elapsed()
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let elapsed = started.elapsed();
    latencies.sort();
    println!(
        "  concurrency {concurrency:>3}: {:>7.0} runs/s   p50 {:>7.2} ms   p99 {:>7.2} ms   ({total} runs)",
        total as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.5).as_secs_f64() * 1e3,
        percentile(&latencies, 0.99).as_secs_f64() * 1e3,
    );
    mock.take_requests();
}

/// One batch of `total` requests to `path` with `body` at concurrency 20; the seconds it took.
async fn batch(url: &str, path: &str, body: &serde_json::Value, total: usize) -> f64 {
    let http = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
    let started = Instant::now();
    futures::stream::iter(0..total)
        .map(|_| {
            let http = http.clone();
            async move {
                let response = http
                    .post(format!("{url}{path}"))
                    .json(body)
                    .send()
                    .await
                    .unwrap();
                assert!(response.status().is_success(), "{}", response.status());
                let _ = response.bytes().await.unwrap();
            }
        })
        .buffer_unordered(20)
        .collect::<Vec<()>>()
        .await;
    started.elapsed().as_secs_f64()
}

/// The same run through the OpenAI-compatible endpoint and through `/v1/infer`, batches
/// alternating so both see the same machine; the fallback answer of the mock ends each run.
async fn openai_overhead(url: &str) {
    const BATCH: usize = 500;
    const ROUNDS: usize = 6;
    for streamed in [false, true] {
        let infer_path = if streamed {
            "/v1/infer/stream"
        } else {
            "/v1/infer"
        };
        let infer = json!({"model_id": "mock", "text": "What time is it?"});
        let chat = json!({"model": "mock", "stream": streamed,
                          "messages": [{"role": "user", "content": "What time is it?"}]});
        // Warm both paths first.
        batch(url, infer_path, &infer, 100).await;
        batch(url, "/openai/v1/chat/completions", &chat, 100).await;
        let (mut native, mut openai) = (0.0, 0.0);
        for _ in 0..ROUNDS {
            native += batch(url, infer_path, &infer, BATCH).await;
            openai += batch(url, "/openai/v1/chat/completions", &chat, BATCH).await;
        }
        let runs = (BATCH * ROUNDS) as f64;
        println!(
            "  {:<8} {infer_path:<17} {:>7.0} runs/s   /openai/v1/chat/completions {:>7.0} runs/s   added cost {:>+5.1} %",
            if streamed { "streamed" } else { "whole" },
            runs / native,
            runs / openai,
            (openai / native - 1.0) * 100.0
        );
    }
}

fn startup() {
    let binary =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/release/agentry");
    if !binary.exists() {
        println!("start-up: skipped (build it first: cargo build -p agentry --release)");
        return;
    }
    let mut times = Vec::new();
    for _ in 0..10 {
        let home = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let started = Instant::now();
        let mut child = std::process::Command::new(&binary)
            .arg("--home")
            .arg(home.path())
            .args(["serve", &format!("127.0.0.1:{port}")])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        loop {
            if let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
                use std::io::{Read, Write};
                let _ = stream
                    .write_all(b"GET /readyz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
                let mut reply = String::new();
                let _ = stream.read_to_string(&mut reply);
                if reply.starts_with("HTTP/1.1 200") {
                    break;
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        times.push(started.elapsed());
        let _ = child.kill();
        let _ = child.wait();
    }
    times.sort();
    println!(
        "start-up to /readyz (fresh data folder, migrations included): p50 {:.1} ms, max {:.1} ms",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        times.last().unwrap().as_secs_f64() * 1e3
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mock = mock().await;
        let (url, _home) = server(&mock).await;
        println!("POST /v1/infer, two-round tool loop, new durable session per run (SQLite)");
        load(&url, &mock, 1, 300).await;
        load(&url, &mock, 20, 2000).await;
        load(&url, &mock, 200, 2000).await;
        println!("the same one-round stateless run: OpenAI-compatible against native (SQLite)");
        openai_overhead(&url).await;
    });
    startup();
}
