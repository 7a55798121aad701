//! Tracing overhead benchmark: two `agentry serve` processes (this build's release binary) on
//! SQLite, side by side — one with no OTLP endpoint, one exporting every span to a local OTLP
//! receiver (the testkit's `OtlpReceiver`, answering 200 to every batch) — and the same two-round tool loop
//! (`POST /v1/infer` in a new durable session: a `current_time` call, then the answer, from the
//! zero-latency mock) sent to each in alternating batches at concurrency 20. Prints runs/s for
//! both and the overhead; asserts nothing.
//!
//! `cargo bench -p agentry --bench tracing`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::{Duration, Instant};

use agentry_testkit::{MockProvider, OtlpReceiver, Reply, ScriptedTurn};
use futures::StreamExt;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A server on a fresh data folder, with `envs`; its base URL once it listens.
async fn serve(home: &std::path::Path, envs: &[(&str, String)]) -> (String, tokio::process::Child) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"));
    command
        .arg("--home")
        .arg(home)
        .args(["serve", &format!("127.0.0.1:{port}")])
        .env_remove("OPENAI_API_KEY")
        .env_remove("AGENTRY_DATABASE_URL")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    for (name, value) in envs {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = stdout.next_line().await.unwrap().unwrap();
    assert!(first.starts_with("Agentry is listening"), "{first}");
    tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
    (format!("http://127.0.0.1:{port}"), child)
}

/// `total` two-round runs against `url` at concurrency 20; the seconds it took.
async fn batch(http: &reqwest::Client, url: &str, total: usize) -> f64 {
    let started = Instant::now();
    futures::stream::iter(0..total)
        .map(|_| {
            let http = http.clone();
            async move {
                let response = http
                    .post(format!("{url}/v1/infer"))
                    .json(&json!({"session_id": "new", "text": "What time is it?",
                                  "tool_ids": ["current_time"]}))
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

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mock = MockProvider::start().await.unwrap();
        // Each run: a `current_time` call, then the answer. A request whose last message is a
        // tool result gets the answer; any other gets the call.
        mock.set_fallback(Reply::scripted(ScriptedTurn::text("It is noon.").with_usage(30, 4)));
        let otlp = OtlpReceiver::start().await.unwrap();
        let off_home = tempfile::tempdir().unwrap();
        let on_home = tempfile::tempdir().unwrap();
        let (off, _off) = serve(off_home.path(), &[]).await;
        let (on, _on) = serve(
            on_home.path(),
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint()),
                ("OTEL_BSP_SCHEDULE_DELAY", "200".to_owned()),
            ],
        )
        .await;
        let http = agentry_llm::http_client(Duration::from_secs(10)).unwrap();
        for url in [&off, &on] {
            let response = http
                .post(format!("{url}/v1/models"))
                .json(&json!({"id": "mock", "protocol": "openai",
                              "base_url": mock.openai_base_url(), "model_name": "m"}))
                .send()
                .await
                .unwrap();
            assert!(response.status().is_success());
        }
        const BATCH: usize = 400;
        const ROUNDS: usize = 5;
        let load = |count: usize| {
            for _ in 0..count {
                mock.enqueue(Reply::scripted(ScriptedTurn::tool_call("current_time", json!({}))));
                mock.enqueue(Reply::scripted(
                    ScriptedTurn::text("It is noon.").with_usage(30, 4),
                ));
            }
        };
        // Warm both.
        for url in [&off, &on] {
            load(100);
            batch(&http, url, 100).await;
        }
        let (mut off_secs, mut on_secs) = (0.0, 0.0);
        for _ in 0..ROUNDS {
            load(BATCH);
            off_secs += batch(&http, &off, BATCH).await;
            load(BATCH);
            on_secs += batch(&http, &on, BATCH).await;
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        let runs = (BATCH * ROUNDS) as f64;
        println!(
            "two-round tool loop, new durable session per run (SQLite), concurrency 20, \
             {} runs each, alternating batches",
            BATCH * ROUNDS
        );
        println!("  tracing off (no endpoint)        {:>7.0} runs/s", runs / off_secs);
        println!(
            "  tracing on (OTLP/HTTP protobuf)  {:>7.0} runs/s   overhead {:>+5.1} %   ({} KiB exported)",
            runs / on_secs,
            (on_secs / off_secs - 1.0) * 100.0,
            otlp.bytes() / 1024
        );
    });
}
