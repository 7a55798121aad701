//! Model-layer benchmark: decode throughput on recorded streams, and the latency and throughput
//! of whole calls against the zero-latency mock provider. Prints a report; asserts nothing.
//!
//! `cargo bench -p agentry-llm --bench model_call`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use agentry_llm::{
    CancellationToken, HttpModelClient, LlmError, ModelClient, ModelRequest, Protocol,
    ProviderConfig, collect_response, decode_stream,
};
use agentry_testkit::{Fixture, MockProvider, Reply, ScriptedTurn};
use agentry_types::Message;
use bytes::Bytes;
use futures::StreamExt;

fn protocol_of(fixture: &Fixture) -> Protocol {
    match fixture.provider.as_str() {
        "anthropic" => Protocol::Anthropic,
        "ollama" => Protocol::Ollama,
        _ => Protocol::OpenAi,
    }
}

async fn decode_throughput() {
    println!("decode (in memory, whole body per iteration)");
    println!(
        "{:<55} {:>10} {:>12} {:>12}",
        "fixture", "bytes", "MB/s", "µs/body"
    );
    let fixtures: Vec<Fixture> = Fixture::all()
        .unwrap()
        .into_iter()
        .filter(|f| f.status == 200 && f.is_streaming())
        .collect();
    for fixture in fixtures {
        let body = Bytes::from(fixture.body.clone());
        let protocol = protocol_of(&fixture);
        let iterations = (2_000_000 / body.len().max(1)).clamp(50, 20_000);
        let started = Instant::now();
        for _ in 0..iterations {
            let chunks = futures::stream::iter([Ok::<_, LlmError>(body.clone())]);
            let events = decode_stream(protocol, chunks);
            futures::pin_mut!(events);
            while let Some(event) = events.next().await {
                std::hint::black_box(event.ok());
            }
        }
        let elapsed = started.elapsed();
        let per_body = elapsed / iterations as u32;
        let mbps = (body.len() * iterations) as f64 / elapsed.as_secs_f64() / 1e6;
        println!(
            "{:<55} {:>10} {:>12.1} {:>12.1}",
            fixture.name,
            body.len(),
            mbps,
            per_body.as_secs_f64() * 1e6
        );
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

async fn call_latency(protocol: Protocol, streamed: bool) {
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(
        ScriptedTurn::text("The quick brown fox jumps over the lazy dog.").with_usage(20, 10),
    ));
    let base = match protocol {
        Protocol::OpenAi | Protocol::OpenAiResponses => mock.openai_base_url(),
        Protocol::Anthropic => mock.anthropic_base_url(),
        Protocol::Ollama => mock.ollama_base_url(),
        Protocol::A2a => unreachable!("the mock speaks model APIs, not A2A"),
    };
    let client = Arc::new(
        HttpModelClient::new(ProviderConfig::new(protocol, "bench").with_base_url(base)).unwrap(),
    );
    let request = ModelRequest::new(vec![Message::user("hello")]);
    let call = |client: Arc<HttpModelClient>, request: ModelRequest| async move {
        if streamed {
            collect_response(client.stream(request, CancellationToken::new())).await
        } else {
            client.complete(request, CancellationToken::new()).await
        }
    };
    // Warm the connection pool.
    for _ in 0..50 {
        call(client.clone(), request.clone()).await.unwrap();
    }
    let sequential = 2_000;
    let mut latencies = Vec::with_capacity(sequential);
    let started = Instant::now();
    for _ in 0..sequential {
        let begun = Instant::now();
        call(client.clone(), request.clone()).await.unwrap();
        latencies.push(begun.elapsed());
    }
    let sequential_rps = sequential as f64 / started.elapsed().as_secs_f64();
    latencies.sort();

    let concurrent = 8_000;
    let concurrency = 32;
    let started = Instant::now();
    futures::stream::iter(0..concurrent)
        .map(|_| call(client.clone(), request.clone()))
        .buffer_unordered(concurrency)
        .for_each(|result| async move {
            result.unwrap();
        })
        .await;
    let concurrent_rps = concurrent as f64 / started.elapsed().as_secs_f64();
    println!(
        "{:<10} {:<9} p50 {:>7.1} µs  p99 {:>7.1} µs  {:>8.0} calls/s sequential  {:>8.0} calls/s at {concurrency}",
        protocol.name(),
        if streamed { "stream" } else { "complete" },
        percentile(&latencies, 0.5).as_secs_f64() * 1e6,
        percentile(&latencies, 0.99).as_secs_f64() * 1e6,
        sequential_rps,
        concurrent_rps,
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        decode_throughput().await;
        println!();
        println!("whole calls against the mock provider on loopback (client + mock share 2 cores)");
        for protocol in [Protocol::OpenAi, Protocol::Anthropic, Protocol::Ollama] {
            for streamed in [true, false] {
                call_latency(protocol, streamed).await;
            }
        }
    });
}
