//! Run-engine benchmark. Prints a report; asserts nothing.
//!
//! `cargo bench -p agentry-core --bench engine`
//!
//! 1. The engine's own overhead per round and per tool call, with an in-process model that
//!    answers instantly (no HTTP): what Agentry adds on top of the model and the tools.
//! 2. Requests per second of a two-round tool loop (tool call, then answer) against the
//!    zero-latency mock provider over loopback HTTP, at concurrency 1 and 20.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use agentry_core::tool::{Tool, ToolContext, ToolError, ToolOutput};
use agentry_core::{RunLimits, RunRequest, Runtime};
use agentry_llm::{
    CancellationToken, HttpModelClient, LlmError, ModelClient, ModelRequest, ModelStream, Protocol,
    ProviderConfig,
};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::{
    AssistantPart, Message, ModelEvent, ModelResponse, StopReason, ToolCall, ToolSpec, Usage,
};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

/// An in-process model: asks for `calls` tool calls for `rounds` rounds, then answers.
struct InstantModel {
    rounds: usize,
    calls: usize,
}

impl InstantModel {
    fn respond(&self, request: &ModelRequest) -> ModelResponse {
        let round = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count();
        let content = if round < self.rounds {
            (0..self.calls)
                .map(|i| {
                    AssistantPart::ToolCall(ToolCall::new(
                        format!("call_{round}_{i}"),
                        "noop",
                        json!({"round": round, "i": i}),
                    ))
                })
                .collect()
        } else {
            vec![AssistantPart::Text {
                text: "done".into(),
            }]
        };
        ModelResponse {
            id: None,
            model: None,
            content,
            usage: Usage::default(),
            stop_reason: StopReason::EndTurn,
        }
    }
}

impl ModelClient for InstantModel {
    fn stream(&self, request: ModelRequest, _cancel: CancellationToken) -> ModelStream {
        let response = self.respond(&request);
        Box::pin(futures::stream::iter([
            Ok(ModelEvent::TextDelta { text: "…".into() }),
            Ok(ModelEvent::Completed { response }),
        ]))
    }

    fn complete(
        &self,
        request: ModelRequest,
        _cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ModelResponse, LlmError>> {
        let response = self.respond(&request);
        Box::pin(async move { Ok(response) })
    }
}

struct Noop {
    spec: ToolSpec,
    calls: Arc<AtomicUsize>,
}

impl Tool for Noop {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }
    fn call(&self, _: Value, _: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Box::pin(async { Ok(ToolOutput::text("ok")) })
    }
}

fn noop() -> Noop {
    Noop {
        spec: ToolSpec::new(
            "noop",
            "does nothing",
            json!({"type": "object", "properties": {"round": {"type": "integer"}, "i": {"type": "integer"}}}),
        ),
        calls: Arc::default(),
    }
}

fn limits() -> RunLimits {
    RunLimits {
        max_tool_rounds: 1_000,
        // Unique arguments every call: no loop warnings.
        ..RunLimits::default()
    }
}

async fn time_runs(runtime: &Runtime, runs: usize) -> Duration {
    let started = Instant::now();
    for _ in 0..runs {
        let output = runtime.run(RunRequest::text("go")).await.unwrap();
        assert_eq!(output.text, "done");
    }
    started.elapsed() / runs as u32
}

async fn engine_overhead() {
    println!("engine overhead (in-process model, no-op tools)");
    let runs = 200;
    let mut per_run = Vec::new();
    for (rounds, calls) in [(0usize, 0usize), (10, 1), (10, 8)] {
        let mut builder = Runtime::builder();
        builder.model("m", InstantModel { rounds, calls });
        builder.tool(noop()).unwrap().limits(limits());
        let runtime = builder.build();
        time_runs(&runtime, 20).await;
        let time = time_runs(&runtime, runs).await;
        per_run.push(time);
        println!(
            "  {rounds:>2} tool rounds × {calls} calls + answer: {:>8.1} µs per run",
            time.as_secs_f64() * 1e6
        );
    }
    let (base, one, eight) = (per_run[0], per_run[1], per_run[2]);
    let per_round = (one.saturating_sub(base)).as_secs_f64() * 1e6 / 10.0;
    let per_extra_call = (eight.saturating_sub(one)).as_secs_f64() * 1e6 / (10.0 * 7.0);
    println!("  ⇒ per round (model step + 1 tool call): {per_round:.1} µs");
    println!("  ⇒ per additional parallel tool call:    {per_extra_call:.1} µs");
}

async fn tool_loop_throughput(protocol: Protocol) {
    let mock = MockProvider::start().await.unwrap();
    let base = match protocol {
        Protocol::OpenAi | Protocol::OpenAiResponses => mock.openai_base_url(),
        Protocol::Anthropic => mock.anthropic_base_url(),
        Protocol::Ollama => mock.ollama_base_url(),
        Protocol::A2a => unreachable!("the mock speaks model APIs, not A2A"),
    };
    let model = Arc::new(
        HttpModelClient::new(ProviderConfig::new(protocol, "bench").with_base_url(base)).unwrap(),
    );
    let mut line = format!("  {:<10}", protocol.name());
    for concurrency in [1usize, 20] {
        let total = 1_000;
        let mut builder = Runtime::builder();
        builder.model_arc("m", model.clone());
        builder.tool(noop()).unwrap();
        let runtime = builder.build();
        // Each run: request 1 → tool call, request 2 → answer. With concurrent runs the FIFO
        // queue interleaves, but every text reply ends one run and every tool reply extends
        // one, so on average each run still makes exactly two model calls.
        for _ in 0..total + 10 {
            mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
                "noop",
                json!({"round": 0, "i": 0}),
            )));
            mock.enqueue(Reply::scripted(ScriptedTurn::text("done")));
        }
        for _ in 0..10 {
            runtime.run(RunRequest::text("go")).await.unwrap();
        }
        let started = Instant::now();
        if concurrency == 1 {
            for _ in 0..total {
                runtime.run(RunRequest::text("go")).await.unwrap();
            }
        } else {
            futures::stream::iter(0..total)
                .map(|_| {
                    let runtime = runtime.clone();
                    async move { runtime.run(RunRequest::text("go")).await.unwrap() }
                })
                .buffer_unordered(concurrency)
                .for_each(|_| async {})
                .await;
        }
        let rps = total as f64 / started.elapsed().as_secs_f64();
        line.push_str(&format!(
            "  {rps:>8.0} runs/s at concurrency {concurrency:<2}"
        ));
        mock.take_requests();
    }
    println!("{line}");
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        engine_overhead().await;
        println!();
        println!("two-round tool loop against the mock provider (loopback HTTP, 2 cores shared)");
        for protocol in [Protocol::OpenAi, Protocol::Anthropic, Protocol::Ollama] {
            tool_loop_throughput(protocol).await;
        }
    });
}
