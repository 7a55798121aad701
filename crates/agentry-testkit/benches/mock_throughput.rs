//! Throughput of the mock provider on loopback: a pooled reqwest client fires a bounded number
//! of requests at fixed concurrency against a fallback reply, per scenario, and prints
//! requests per second.
//!
//! `cargo bench -p agentry-testkit --bench mock_throughput`; set `MOCK_BENCH_REQUESTS` to change
//! the request count per scenario (default 5000) and `MOCK_BENCH_CONCURRENCY` the number of
//! requests in flight (default 32).

use std::error::Error;
use std::time::Instant;

use agentry_testkit::{Chunking, Fixture, MockProvider, Reply, ScriptedTurn};
use futures::StreamExt;
use serde_json::{Value, json};

/// A recorded 7.7 kB SSE stream (two parallel tool calls).
const REPLAYED_FIXTURE: &str = "openai/chat_parallel_tool_calls_stream";

type BenchResult<T> = Result<T, Box<dyn Error + Send + Sync>>;

/// One measured workload: a reply, and the request that fetches it.
struct Scenario {
    label: &'static str,
    reply: Reply,
    path: &'static str,
    body: Value,
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

fn scenarios() -> BenchResult<Vec<Scenario>> {
    let turn =
        ScriptedTurn::text("The weather in Paris is sunny, 24 degrees, with a light breeze.")
            .with_tool_call("get_weather", json!({"city": "Paris", "units": "c"}))
            .with_usage(120, 45);
    let messages = json!([
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Paris?"},
    ]);
    Ok(vec![
        Scenario {
            label: "openai non-stream (scripted)",
            reply: Reply::scripted(turn.clone()),
            path: "/v1/chat/completions",
            body: json!({"model": "gpt-4o", "messages": messages}),
        },
        Scenario {
            label: "openai stream + usage (scripted)",
            reply: Reply::scripted(turn.clone()),
            path: "/v1/chat/completions",
            body: json!({"model": "gpt-4o", "stream": true,
                         "stream_options": {"include_usage": true}, "messages": messages}),
        },
        Scenario {
            label: "anthropic stream (scripted)",
            reply: Reply::scripted(turn.clone()),
            path: "/v1/messages",
            body: json!({"model": "claude-sonnet-4-0", "max_tokens": 1024, "stream": true,
                         "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}),
        },
        Scenario {
            label: "ollama stream (scripted)",
            reply: Reply::scripted(turn),
            path: "/api/chat",
            body: json!({"model": "llama3.2", "messages": messages}),
        },
        Scenario {
            label: "fixture replay (whole body)",
            reply: Reply::fixture(Fixture::named(REPLAYED_FIXTURE)?),
            path: "/v1/chat/completions",
            body: json!({"model": "gpt-4o", "stream": true, "messages": messages}),
        },
        Scenario {
            label: "fixture replay (64-byte chunks)",
            reply: Reply::fixture(Fixture::named(REPLAYED_FIXTURE)?).chunked(Chunking::Every(64)),
            path: "/v1/chat/completions",
            body: json!({"model": "gpt-4o", "stream": true, "messages": messages}),
        },
    ])
}

/// Sends `count` requests, `concurrency` at a time; returns total response bytes.
async fn fire(
    client: &reqwest::Client,
    url: &str,
    body: &str,
    count: usize,
    concurrency: usize,
) -> BenchResult<usize> {
    let results: Vec<BenchResult<usize>> = futures::stream::iter(0..count)
        .map(|_| async move {
            let response = client
                .post(url)
                .header("content-type", "application/json")
                .body(body.to_owned())
                .send()
                .await?;
            if !response.status().is_success() {
                return Err(format!("unexpected status {}", response.status()).into());
            }
            Ok(response.bytes().await?.len())
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    results.into_iter().sum()
}

async fn run() -> BenchResult<()> {
    let requests = env_or("MOCK_BENCH_REQUESTS", 5_000);
    let concurrency = env_or("MOCK_BENCH_CONCURRENCY", 32);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency)
        .build()?;
    let mock = MockProvider::start().await?;
    println!("mock_throughput: {requests} requests per scenario, concurrency {concurrency}");
    for scenario in scenarios()? {
        mock.set_fallback(scenario.reply);
        let url = format!("{}{}", mock.base_url(), scenario.path);
        let body = scenario.body.to_string();
        fire(&client, &url, &body, concurrency * 4, concurrency).await?; // warm the pool
        let started = Instant::now();
        let bytes = fire(&client, &url, &body, requests, concurrency).await?;
        let elapsed = started.elapsed();
        let per_second = requests as f64 / elapsed.as_secs_f64();
        println!(
            "{:<34} {per_second:>9.0} req/s  ({requests} in {elapsed:.2?}, {} bytes/response)",
            scenario.label,
            bytes / requests
        );
        mock.take_requests(); // keep memory flat between scenarios
    }
    Ok(())
}

fn main() -> BenchResult<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}
