//! How replies are delivered: pacing between chunks, delayed headers, connections cut
//! mid-body, extra headers, error and raw replies.

use std::time::{Duration, Instant};

use agentry_testkit::{Chunking, Fixture, MockProvider, Reply};
use serde_json::json;

use super::client::{http_client, read_chunks};

/// `body` as server-sent events in writes of 18 bytes, `pace` apart.
fn paced_events(body: &str, pace: Duration) -> Reply {
    Reply::raw(
        200,
        vec![("content-type".into(), "text/event-stream".into())],
        body.to_owned(),
    )
    .chunked(Chunking::Every(18))
    .paced(pace)
}

#[tokio::test]
async fn paced_chunks_arrive_as_separate_reads_no_sooner_than_the_pace_allows() {
    let pace = Duration::from_millis(40);
    let body = "data: 0123456789\n\n".repeat(5); // 90 bytes
    let chunks = body.len().div_ceil(18);
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(paced_events(&body, pace));
    let response = http_client()
        .post(format!("{}/v1/chat/completions", mock.base_url()))
        .body(r#"{"stream":true}"#)
        .send()
        .await
        .expect("send");
    let (bytes, reads, outcome) = read_chunks(response).await;
    let done = Instant::now();
    outcome.expect("clean end");
    assert_eq!(bytes, body.as_bytes());
    assert!(reads > 1, "expected several reads, got {reads}");
    let received_at = mock.requests()[0].received_at;
    let elapsed = done.duration_since(received_at);
    let floor = pace * u32::try_from(chunks - 1).expect("small");
    assert!(
        elapsed >= floor,
        "body took {elapsed:?}, pacing requires at least {floor:?}"
    );
}

/// A model server generates at its own rate: a mock woken late (here its thread is blocked for
/// most of the answer) sends what fell due at once instead of pushing every later chunk back.
#[tokio::test]
async fn a_paced_reply_keeps_its_schedule_when_the_mock_is_woken_late() {
    let pace = Duration::from_millis(100);
    let body = "data: 0123456789\n\n".repeat(5); // 90 bytes: 5 chunks, 4 paces
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(paced_events(&body, pace));
    let mut response = http_client()
        .post(format!("{}/v1/chat/completions", mock.base_url()))
        .body(r#"{"stream":true}"#)
        .send()
        .await
        .expect("send");
    let mut bytes = response
        .chunk()
        .await
        .expect("read")
        .expect("a first chunk")
        .to_vec();
    let first = Instant::now();
    // The test runs on one thread with the mock: it sleeps through the times all later chunks
    // are due (1 to 4 paces after the first).
    std::thread::sleep(pace * 9 / 2);
    while let Some(chunk) = response.chunk().await.expect("read") {
        bytes.extend_from_slice(&chunk);
    }
    let elapsed = first.elapsed();
    assert_eq!(bytes, body.as_bytes());
    // On schedule the last chunk is due 4 paces after the first, so the body ends soon after
    // the block; chunks paced from one another would each wait a pace after it (7.5 paces).
    assert!(
        elapsed < pace * 13 / 2,
        "the body ended {elapsed:?} after its first chunk: the lateness added up"
    );
}

#[tokio::test]
async fn paced_random_chunks_of_a_fixture_reassemble() {
    let fixture = Fixture::named("anthropic/messages_tool_use_stream").expect("fixture");
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(
        Reply::fixture(fixture.clone())
            .chunked(Chunking::Random { seed: 42, max: 300 })
            .paced(Duration::from_millis(2)),
    );
    let response = http_client()
        .post(format!("{}/v1/messages", mock.base_url()))
        .body("{}")
        .send()
        .await
        .expect("send");
    let (bytes, reads, outcome) = read_chunks(response).await;
    outcome.expect("clean end");
    assert!(reads > 1);
    assert_eq!(bytes, fixture.body.as_bytes());
}

async fn read_cut_reply(reply: Reply) -> (Vec<u8>, Result<(), reqwest::Error>) {
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(reply);
    let response = http_client()
        .post(format!("{}/v1/chat/completions", mock.base_url()))
        .body(r#"{"stream":true}"#)
        .send()
        .await
        .expect("headers arrive before the cut");
    assert_eq!(response.status(), 200);
    let (bytes, _, outcome) = read_chunks(response).await;
    (bytes, outcome)
}

#[tokio::test]
async fn cut_after_ends_the_body_with_an_error_not_eof() {
    let fixture = Fixture::named("openai/chat_parallel_tool_calls_stream").expect("fixture");
    let (bytes, outcome) = read_cut_reply(Reply::fixture(fixture.clone()).cut_after(100)).await;
    let error = outcome.expect_err("a cut body must not end cleanly");
    assert!(
        error.is_body() || error.is_decode(),
        "unexpected error kind: {error:?}"
    );
    assert_eq!(bytes, fixture.body.as_bytes()[..100]);
}

#[tokio::test]
async fn cut_after_works_with_paced_chunks() {
    let fixture = Fixture::named("ollama/generate_stream_midstream_error").expect("fixture");
    let reply = Reply::fixture(fixture.clone())
        .chunked(Chunking::Every(16))
        .paced(Duration::from_millis(1))
        .cut_after(90);
    let (bytes, outcome) = read_cut_reply(reply).await;
    assert!(outcome.is_err(), "a cut body must not end cleanly");
    assert_eq!(bytes, fixture.body.as_bytes()[..90]);
}

#[tokio::test]
async fn cut_after_past_the_end_still_withholds_the_clean_ending() {
    let (bytes, outcome) =
        read_cut_reply(Reply::raw(200, vec![], "short body").cut_after(1000)).await;
    assert!(outcome.is_err(), "the body must not end cleanly");
    assert_eq!(bytes, b"short body");
}

#[tokio::test]
async fn cut_after_zero_sends_headers_only() {
    let (bytes, outcome) = read_cut_reply(Reply::raw(200, vec![], "never sent").cut_after(0)).await;
    assert!(outcome.is_err());
    assert!(bytes.is_empty());
}

#[tokio::test]
async fn delay_headers_holds_back_the_status_line() {
    let delay = Duration::from_millis(150);
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(Reply::error(503, json!({"error": "busy"})).delay_headers(delay));
    let client = http_client();
    let sent = Instant::now();
    let response = client.get(mock.base_url()).send().await.expect("send");
    let waited = sent.elapsed();
    assert!(
        waited >= delay,
        "headers arrived after {waited:?}, expected >= {delay:?}"
    );
    assert_eq!(response.status(), 503);

    // A client with a shorter first-byte timeout gives up.
    mock.enqueue(Reply::error(503, json!({})).delay_headers(Duration::from_secs(5)));
    let error = client
        .get(mock.base_url())
        .timeout(Duration::from_millis(50))
        .send()
        .await
        .expect_err("must time out");
    assert!(error.is_timeout(), "{error:?}");
}

#[tokio::test]
async fn error_replies_carry_json_and_extra_headers() {
    let mock = MockProvider::start().await.expect("start mock");
    let body =
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}});
    mock.enqueue(Reply::error(529, body.clone()).with_header("retry-after", "2"));
    let response = http_client()
        .post(format!("{}/v1/messages", mock.base_url()))
        .body("{}")
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 529);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert_eq!(response.headers()["retry-after"], "2");
    let returned: serde_json::Value = response.json().await.expect("json body");
    assert_eq!(returned, body);
}

#[tokio::test]
async fn with_header_overrides_a_recorded_header() {
    let fixture = Fixture::named("anthropic/error_429_rate_limit").expect("fixture");
    assert_eq!(fixture.header("retry-after"), Some("16"));
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(
        Reply::fixture(fixture)
            .with_header("Retry-After", "0")
            .with_header("x-extra", "yes"),
    );
    let response = http_client()
        .post(mock.base_url())
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 429);
    let retry_after: Vec<_> = response.headers().get_all("retry-after").iter().collect();
    assert_eq!(retry_after, ["0"]);
    assert_eq!(response.headers()["x-extra"], "yes");
    assert_eq!(response.headers()["x-should-retry"], "true");
}

#[tokio::test]
async fn raw_replies_drop_framing_headers_and_keep_the_rest() {
    let mock = MockProvider::start().await.expect("start mock");
    let headers = vec![
        ("Content-Length".to_owned(), "9999".to_owned()),
        ("Connection".to_owned(), "close".to_owned()),
        ("x-kept".to_owned(), "1".to_owned()),
        ("x-kept".to_owned(), "2".to_owned()),
    ];
    mock.enqueue(Reply::raw(418, headers, "teapot"));
    let response = http_client()
        .get(mock.base_url())
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 418);
    let kept: Vec<_> = response.headers().get_all("x-kept").iter().collect();
    assert_eq!(kept, ["1", "2"]);
    assert_eq!(response.headers()["content-length"], "6");
    assert_eq!(response.text().await.expect("body"), "teapot");
}

#[tokio::test]
async fn an_invalid_reply_header_is_reported_as_a_mock_error() {
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(Reply::raw(200, vec![], "ok").with_header("bad header", "x"));
    let response = http_client()
        .get(mock.base_url())
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 500);
    let body: serde_json::Value = response.json().await.expect("json");
    assert_eq!(body["error"]["type"], "mock_error");
    assert!(
        body["error"]["message"]
            .as_str()
            .expect("message")
            .contains("bad header")
    );
}
