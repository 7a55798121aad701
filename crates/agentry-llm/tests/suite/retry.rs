//! Retries, timeouts and cancellation against the mock provider.

use std::time::{Duration, Instant};

use agentry_llm::{
    CancellationToken, LlmError, ModelClient, Protocol, RetryPolicy, TimeoutKind, TransportConfig,
};
use agentry_testkit::{Chunking, Fixture, MockProvider, Reply, ScriptedTurn};
use agentry_types::{ErrorCode, ModelEvent};
use futures::StreamExt;
use serde_json::json;

use super::support::{client, client_with, fast_transport, hello, stream_outcome};

fn rate_limit_body() -> serde_json::Value {
    json!({"error": {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}})
}

/// Byte offset just after the `n`-th SSE event of a body.
fn after_event(body: &str, n: usize) -> usize {
    body.match_indices("\n\n")
        .nth(n - 1)
        .map(|(i, _)| i + 2)
        .expect("enough events")
}

#[tokio::test]
async fn rate_limited_with_retry_after_then_success() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::error(429, rate_limit_body()).with_header("retry-after", "1"));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("made it")));
    let client = client(&mock, Protocol::OpenAi);
    let started = Instant::now();
    let outcome = stream_outcome(&client, hello()).await;
    assert_eq!(outcome.response().text(), "made it");
    assert_eq!(mock.request_count(), 2);
    // The backoff honoured retry-after (1 s) instead of the 10 ms policy backoff.
    assert!(started.elapsed() >= Duration::from_secs(1));
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn retry_after_ms_takes_precedence() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(
        Reply::error(429, rate_limit_body())
            .with_header("retry-after", "30")
            .with_header("retry-after-ms", "150"),
    );
    mock.enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let client = client(&mock, Protocol::OpenAi);
    let started = Instant::now();
    let response = client
        .complete(hello(), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(response.text(), "ok");
    assert_eq!(mock.request_count(), 2);
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn a_retry_after_longer_than_allowed_is_returned_not_waited() {
    let mock = MockProvider::start().await.unwrap();
    // retry-after: 16 s, beyond the policy's 5 s ceiling.
    mock.enqueue(Reply::fixture(
        Fixture::named("anthropic/error_429_rate_limit").unwrap(),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("never reached")));
    let client = client(&mock, Protocol::Anthropic);
    let outcome = stream_outcome(&client, hello()).await;
    assert_eq!(outcome.error().code(), ErrorCode::RateLimited);
    assert_eq!(outcome.error().retry_after(), Some(Duration::from_secs(16)));
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn overloaded_529_then_success() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::fixture(
        Fixture::named("anthropic/error_529_overloaded").unwrap(),
    ));
    mock.enqueue(Reply::fixture(
        Fixture::named("anthropic/error_529_overloaded").unwrap(),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("recovered").with_usage(10, 2),
    ));
    let client = client(&mock, Protocol::Anthropic);
    let outcome = stream_outcome(&client, hello()).await;
    assert_eq!(outcome.response().text(), "recovered");
    assert_eq!(outcome.response().usage.output_tokens, 2);
    assert_eq!(mock.request_count(), 3);
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn non_streaming_calls_retry_too() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::error(
        503,
        json!({"error": {"message": "upstream down"}}),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("fine")));
    let client = client(&mock, Protocol::Ollama);
    let response = client
        .complete(hello(), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(response.text(), "fine");
    assert_eq!(mock.request_count(), 2);
}

#[tokio::test]
async fn client_errors_are_never_retried() {
    for status in [400u16, 401, 403, 404, 413, 422] {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(
            Reply::error(
                status,
                json!({"error": {"message": "no", "type": "invalid_request_error"}}),
            )
            .with_header("x-should-retry", "true"),
        );
        mock.enqueue(Reply::scripted(ScriptedTurn::text("must not be fetched")));
        let client = client(&mock, Protocol::OpenAi);
        let outcome = stream_outcome(&client, hello()).await;
        assert_eq!(outcome.error().status(), Some(status));
        assert!(!outcome.error().is_retryable());
        assert_eq!(mock.request_count(), 1, "HTTP {status} was retried");
    }
}

#[tokio::test]
async fn retries_stop_after_the_limit() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::error(500, json!({"error": {"message": "boom"}})));
    let client = client(&mock, Protocol::OpenAi);
    let outcome = stream_outcome(&client, hello()).await;
    assert_eq!(outcome.error().code(), ErrorCode::ProviderError);
    assert_eq!(mock.request_count(), 4, "one attempt and three retries");
}

#[tokio::test]
async fn a_failure_after_the_first_token_is_not_retried() {
    let fixture = Fixture::named("local/llama_cpp_python_chat_stream_text").unwrap();
    // Role chunk, then "Hello", then the connection breaks.
    let cut = after_event(&fixture.body, 2) + 10;
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::fixture(fixture).cut_after(cut));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("must not be fetched")));
    let client = client(&mock, Protocol::OpenAi);
    let outcome = stream_outcome(&client, hello()).await;
    assert_eq!(outcome.streamed_text(), "Hello");
    let error = outcome.error();
    assert!(
        matches!(
            error.code(),
            ErrorCode::Connection | ErrorCode::StreamEndedEarly
        ),
        "{error:?}"
    );
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn a_failure_before_the_first_token_is_retried() {
    let fixture = Fixture::named("local/llama_cpp_python_chat_stream_text").unwrap();
    // Only the role chunk (no output) arrives before the connection breaks.
    let cut = after_event(&fixture.body, 1);
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::fixture(fixture.clone()).cut_after(cut));
    mock.enqueue(Reply::fixture(fixture));
    let client = client(&mock, Protocol::OpenAi);
    let outcome = stream_outcome(&client, hello()).await;
    assert_eq!(
        outcome.response().text(),
        "Hello, welcome to my little corner of the world!"
    );
    assert_eq!(mock.request_count(), 2);
}

#[tokio::test]
async fn an_error_event_mid_stream_before_output_is_retried() {
    let body = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"model\":\"c\",\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n\
                event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::raw(
        200,
        vec![("content-type".into(), "text/event-stream".into())],
        body,
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("second try")));
    let client = client(&mock, Protocol::Anthropic);
    let outcome = stream_outcome(&client, hello()).await;
    assert_eq!(outcome.response().text(), "second try");
    assert_eq!(mock.request_count(), 2);
}

#[tokio::test]
async fn cancellation_mid_stream_ends_promptly() {
    let fixture = Fixture::named("openai_compat/deepseek_reasoning_content_stream").unwrap();
    let mock = MockProvider::start().await.unwrap();
    // ~340 chunks, 100 ms apart: the whole stream would take about half a minute.
    mock.enqueue(
        Reply::fixture(fixture)
            .chunked(Chunking::Every(200))
            .paced(Duration::from_millis(100)),
    );
    let client = client(&mock, Protocol::OpenAi);
    let cancel = CancellationToken::new();
    let mut stream = client.stream(hello(), cancel.clone());
    let mut saw_output = false;
    let mut cancelled_at = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(ModelEvent::ThinkingDelta { .. } | ModelEvent::TextDelta { .. }) if !saw_output => {
                saw_output = true;
                cancel.cancel();
                cancelled_at = Some(Instant::now());
            }
            Ok(ModelEvent::Completed { .. }) => panic!("the stream completed despite cancellation"),
            Ok(_) => {}
            Err(error) => {
                assert!(matches!(error, LlmError::Cancelled), "{error:?}");
                break;
            }
        }
    }
    assert!(saw_output);
    let waited = cancelled_at.unwrap().elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "cancellation took {waited:?}"
    );
    assert!(
        stream.next().await.is_none(),
        "nothing after the cancellation error"
    );
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn cancellation_during_backoff() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::error(429, rate_limit_body()).with_header("retry-after", "4"));
    let client = client(&mock, Protocol::OpenAi);
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        canceller.cancel();
    });
    let started = Instant::now();
    let error = client.complete(hello(), cancel).await.unwrap_err();
    assert!(matches!(error, LlmError::Cancelled), "{error:?}");
    assert!(started.elapsed() < Duration::from_secs(4));
    assert_eq!(mock.request_count(), 1);
}

fn transport(adjust: impl FnOnce(&mut TransportConfig)) -> TransportConfig {
    let mut transport = TransportConfig {
        retry: RetryPolicy::none(),
        ..fast_transport()
    };
    adjust(&mut transport);
    transport
}

#[tokio::test]
async fn first_byte_timeout() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("late")).delay_headers(Duration::from_secs(3)));
    let client = client_with(
        &mock,
        Protocol::OpenAi,
        transport(|t| t.first_byte_timeout = Duration::from_millis(200)),
    );
    let outcome = stream_outcome(&client, hello()).await;
    match outcome.error() {
        LlmError::Timeout { kind, .. } => assert_eq!(*kind, TimeoutKind::FirstByte),
        other => panic!("expected a first-byte timeout, got {other:?}"),
    }
    assert!(outcome.error().is_retryable());
}

#[tokio::test]
async fn idle_timeout_between_chunks() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(
        Reply::fixture(Fixture::named("local/llama_cpp_python_chat_stream_text").unwrap())
            .chunked(Chunking::Every(400))
            .paced(Duration::from_secs(2)),
    );
    let client = client_with(
        &mock,
        Protocol::OpenAi,
        transport(|t| t.idle_timeout = Duration::from_millis(300)),
    );
    let outcome = stream_outcome(&client, hello()).await;
    match outcome.error() {
        LlmError::Timeout { kind, .. } => assert_eq!(*kind, TimeoutKind::Idle),
        other => panic!("expected an idle timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn the_idle_timeout_counts_from_the_last_chunk_not_the_first() {
    // 18 events 100 ms apart: 1.7 s in all, more than four idle timeouts, none of them idle.
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text(
            "one two three four five six seven eight nine ten eleven twelve thirteen fourteen",
        ))
        .chunked(Chunking::SseEvents)
        .paced(Duration::from_millis(100)),
    );
    let client = client_with(
        &mock,
        Protocol::OpenAi,
        transport(|t| t.idle_timeout = Duration::from_millis(400)),
    );
    let started = Instant::now();
    let outcome = stream_outcome(&client, hello()).await;
    assert!(
        started.elapsed() > Duration::from_millis(800),
        "the stream was paced: {:?}",
        started.elapsed()
    );
    assert_eq!(
        outcome.response().text(),
        "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
    );
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn total_timeout_is_not_retryable() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(
        Reply::fixture(Fixture::named("local/llama_cpp_python_chat_stream_text").unwrap())
            .chunked(Chunking::Every(100))
            .paced(Duration::from_millis(200)),
    );
    let client = client_with(
        &mock,
        Protocol::OpenAi,
        TransportConfig {
            total_timeout: Some(Duration::from_millis(500)),
            ..fast_transport()
        },
    );
    let outcome = stream_outcome(&client, hello()).await;
    match outcome.error() {
        LlmError::Timeout { kind, .. } => assert_eq!(*kind, TimeoutKind::Total),
        other => panic!("expected the total timeout, got {other:?}"),
    }
    assert!(!outcome.error().is_retryable());
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn connection_refused_is_a_typed_retryable_error() {
    // Bind then drop a listener so the port is (almost certainly) closed.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let config = agentry_llm::ProviderConfig::new(Protocol::OpenAi, "m")
        .with_base_url(format!("http://127.0.0.1:{port}/v1"))
        .with_transport(transport(|_| {}));
    let client = agentry_llm::HttpModelClient::new(config).unwrap();
    let error = client
        .complete(hello(), CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(error.code(), ErrorCode::Connection, "{error:?}");
    assert!(error.is_retryable());
}
