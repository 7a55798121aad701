//! Fallback models and the per-run quotas (output tokens, tool calls), end to end against the
//! mock provider.

use std::sync::Arc;

use agentry_core::{FallbackModelClient, RunRequest, Runtime};
use agentry_llm::{
    HttpModelClient, ModelClient, ModelRequest, Protocol, ProviderConfig, RetryPolicy,
    TransportConfig, collect_response,
};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::{Message, RunStopReason};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::support::{ProbeTool, limits, run_collect};

/// A client for the mock's OpenAI endpoint, calling the provider model `name`.
fn named(mock: &MockProvider, name: &str) -> HttpModelClient {
    HttpModelClient::new(
        ProviderConfig::new(Protocol::OpenAi, name)
            .with_base_url(mock.openai_base_url())
            .with_transport(TransportConfig {
                retry: RetryPolicy::none(),
                ..TransportConfig::default()
            }),
    )
    .unwrap()
}

fn models_called(mock: &MockProvider) -> Vec<String> {
    mock.requests()
        .iter()
        .map(|request| {
            request.body["model"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

fn overloaded() -> Reply {
    Reply::error(
        503,
        json!({"error": {"message": "overloaded", "type": "server_error"}}),
    )
}

#[tokio::test]
async fn the_fallback_client_tries_the_next_model_after_a_provider_error() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(overloaded());
    mock.enqueue(Reply::error(
        429,
        json!({"error": {"message": "slow down", "type": "rate_limit_error"}}),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("from the third")));
    let client = FallbackModelClient::new(vec![
        (
            "a".into(),
            Arc::new(named(&mock, "model-a")) as Arc<dyn ModelClient>,
        ),
        ("b".into(), Arc::new(named(&mock, "model-b"))),
        ("c".into(), Arc::new(named(&mock, "model-c"))),
    ]);
    assert_eq!(client.ids(), ["a", "b", "c"]);
    let request = ModelRequest::new(vec![Message::user("hi")]);
    let response = collect_response(client.stream(request, CancellationToken::new()))
        .await
        .unwrap();
    assert_eq!(response.text(), "from the third");
    assert_eq!(models_called(&mock), ["model-a", "model-b", "model-c"]);
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn the_fallback_client_returns_the_last_error_and_does_not_fall_back_once_output_began() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(overloaded());
    mock.enqueue(overloaded());
    let client = FallbackModelClient::new(vec![
        (
            "a".into(),
            Arc::new(named(&mock, "model-a")) as Arc<dyn ModelClient>,
        ),
        ("b".into(), Arc::new(named(&mock, "model-b"))),
    ]);
    let error = collect_response(client.stream(
        ModelRequest::new(vec![Message::user("hi")]),
        CancellationToken::new(),
    ))
    .await
    .unwrap_err();
    assert_eq!(error.status(), Some(503));
    assert_eq!(models_called(&mock), ["model-a", "model-b"]);

    // A stream cut after its first bytes has produced output: no second model.
    let mock = MockProvider::start().await.unwrap();
    let long = "word ".repeat(60);
    mock.enqueue(Reply::scripted(ScriptedTurn::text(long)).cut_after(1200));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("never")));
    let client = FallbackModelClient::new(vec![
        (
            "a".into(),
            Arc::new(named(&mock, "model-a")) as Arc<dyn ModelClient>,
        ),
        ("b".into(), Arc::new(named(&mock, "model-b"))),
    ]);
    let mut stream = client.stream(
        ModelRequest::new(vec![Message::user("hi")]),
        CancellationToken::new(),
    );
    let mut deltas = 0;
    let mut failed = false;
    while let Some(event) = futures::StreamExt::next(&mut stream).await {
        match event {
            Ok(_) => deltas += 1,
            Err(_) => failed = true,
        }
    }
    assert!(deltas > 0 && failed, "{deltas} events, failed: {failed}");
    assert_eq!(models_called(&mock), ["model-a"]);
    assert_eq!(mock.pending_replies(), 1);

    // `complete` falls back the same way.
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(overloaded());
    mock.enqueue(Reply::scripted(ScriptedTurn::text("whole")));
    let client = FallbackModelClient::new(vec![
        (
            "a".into(),
            Arc::new(named(&mock, "model-a")) as Arc<dyn ModelClient>,
        ),
        ("b".into(), Arc::new(named(&mock, "model-b"))),
    ]);
    let response = client
        .complete(
            ModelRequest::new(vec![Message::user("hi")]),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(response.text(), "whole");
    assert_eq!(models_called(&mock), ["model-a", "model-b"]);
}

#[tokio::test]
async fn a_run_uses_its_fallback_models_and_only_those() {
    let mock = MockProvider::start().await.unwrap();
    let mut builder = Runtime::builder();
    builder
        .model("primary", named(&mock, "model-primary"))
        .model("backup", named(&mock, "model-backup"));
    builder.limits(limits());
    let runtime = builder.build();

    mock.enqueue(overloaded());
    mock.enqueue(Reply::scripted(ScriptedTurn::text("the backup answered")));
    let request = RunRequest::text("go")
        .with_model("primary")
        .with_fallbacks(vec!["backup".into()]);
    let (_, output) = run_collect(&runtime, request).await;
    assert_eq!(output.stop_reason, RunStopReason::Completed);
    assert_eq!(output.text, "the backup answered");
    assert_eq!(output.state.fallback_models, ["backup"]);
    assert_eq!(models_called(&mock), ["model-primary", "model-backup"]);

    // Without fallbacks the same failure fails the run.
    mock.take_requests();
    mock.enqueue(overloaded());
    let (_, output) = run_collect(&runtime, RunRequest::text("go").with_model("primary")).await;
    assert_eq!(output.stop_reason, RunStopReason::Error);
    assert_eq!(models_called(&mock), ["model-primary"]);

    // An unknown fallback is refused before anything is sent.
    let error = runtime
        .stream(
            RunRequest::text("go")
                .with_model("primary")
                .with_fallbacks(vec!["nope".into()]),
        )
        .err()
        .unwrap();
    assert!(error.to_string().contains("nope"), "{error}");
}

#[tokio::test]
async fn the_output_token_quota_caps_calls_and_stops_the_run() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(
        ScriptedTurn::tool_call("lookup", json!({"id": 1})).with_usage(10, 30),
    ));
    let tool = ProbeTool::lookup();
    let mut builder = Runtime::builder();
    builder.model("mock", named(&mock, "m"));
    let mut quota = limits();
    quota.max_output_tokens = Some(50);
    builder.tool(tool.clone()).unwrap().limits(quota);
    let mut request = RunRequest::text("go");
    request.params.max_tokens = Some(1000);
    let (_, output) = run_collect(&builder.build(), request).await;
    assert_eq!(output.stop_reason, RunStopReason::QuotaExceeded);
    assert!(
        output
            .note
            .as_deref()
            .unwrap()
            .contains("max_output_tokens"),
        "{:?}",
        output.note
    );
    assert_eq!(output.usage.output_tokens, 60);
    // Two calls: the first may use all 50 tokens, the second only the 20 left.
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let caps: Vec<u64> = requests
        .iter()
        .map(|request| {
            request.body["max_completion_tokens"]
                .as_u64()
                .or(request.body["max_tokens"].as_u64())
                .unwrap()
        })
        .collect();
    assert_eq!(caps, [50, 20]);
    // Only the first round's tool ran.
    assert_eq!(tool.executions().len(), 1);
}

#[tokio::test]
async fn the_tool_call_quota_stops_the_run_before_the_call_over_it() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("lookup", json!({"id": 1}))
            .with_tool_call("lookup", json!({"id": 2})),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 3}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 4}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("unreached")));
    let tool = ProbeTool::lookup();
    let mut builder = Runtime::builder();
    builder.model("mock", named(&mock, "m"));
    let mut quota = limits();
    quota.max_tool_calls = Some(3);
    builder.tool(tool.clone()).unwrap().limits(quota);
    let (_, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
    assert_eq!(output.stop_reason, RunStopReason::QuotaExceeded);
    assert!(output.note.as_deref().unwrap().contains("max_tool_calls"));
    let ids: Vec<i64> = tool
        .executions()
        .iter()
        .map(|execution| execution.arguments["id"].as_i64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3]);
    assert_eq!(output.state.tool_calls, 3);
    assert_eq!(mock.request_count(), 3);
    assert_eq!(mock.pending_replies(), 1);
}
