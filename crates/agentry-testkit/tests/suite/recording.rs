//! What the mock records about requests, and how it picks replies: FIFO queue, fallback,
//! 500 when nothing is queued, shutdown on drop.

use std::time::Duration;

use agentry_testkit::{MockProvider, Protocol, Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::client::http_client;

#[tokio::test]
async fn requests_are_recorded_with_path_query_headers_and_body() {
    let mock = MockProvider::start().await.expect("start mock");
    mock.set_fallback(Reply::raw(200, vec![], "ok"));
    let client = http_client();
    let body = json!({"model": "claude", "max_tokens": 5, "messages": []});
    client
        .post(format!("{}/messages?beta=true", mock.anthropic_base_url()))
        .header("X-Api-Key", "test-key")
        .header("anthropic-version", "2023-06-01")
        .json(&body)
        .send()
        .await
        .expect("send");
    client
        .put(format!("{}/upload", mock.base_url()))
        .body("not json at all")
        .send()
        .await
        .expect("send");

    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(mock.request_count(), 2);
    let first = &requests[0];
    assert_eq!(first.method, "POST");
    assert_eq!(first.path, "/v1/messages");
    assert_eq!(first.query.as_deref(), Some("beta=true"));
    assert_eq!(first.protocol, Some(Protocol::Anthropic));
    assert_eq!(first.body, body);
    assert_eq!(first.header("x-api-key"), Some("test-key"));
    assert_eq!(first.header("Anthropic-Version"), Some("2023-06-01"));
    assert!(
        first.headers.iter().any(|(name, _)| name == "x-api-key"),
        "names are lowercased"
    );
    assert!(
        first
            .headers
            .iter()
            .all(|(name, _)| *name == name.to_lowercase())
    );

    let second = &requests[1];
    assert_eq!(second.method, "PUT");
    assert_eq!(second.path, "/upload");
    assert_eq!(second.query, None);
    assert_eq!(second.protocol, None);
    assert_eq!(second.body, Value::String("not json at all".to_owned()));
    assert!(second.received_at >= first.received_at);
}

#[tokio::test]
async fn queued_replies_are_served_in_fifo_order() {
    let mock = MockProvider::start().await.expect("start mock");
    for word in ["first", "second", "third"] {
        mock.enqueue(Reply::raw(200, vec![], word));
    }
    assert_eq!(mock.pending_replies(), 3);
    let client = http_client();
    let mut answers = Vec::new();
    for _ in 0..3 {
        let response = client.get(mock.base_url()).send().await.expect("send");
        answers.push(response.text().await.expect("text"));
    }
    assert_eq!(answers, ["first", "second", "third"]);
    assert_eq!(mock.pending_replies(), 0);
}

#[tokio::test]
async fn fallback_serves_whenever_the_queue_is_empty() {
    let mock = MockProvider::start().await.expect("start mock");
    mock.set_fallback(Reply::raw(200, vec![], "fallback"));
    mock.enqueue(Reply::raw(201, vec![], "queued"));
    let client = http_client();
    let mut answers = Vec::new();
    for _ in 0..4 {
        let response = client.get(mock.base_url()).send().await.expect("send");
        answers.push((
            response.status().as_u16(),
            response.text().await.expect("text"),
        ));
    }
    assert_eq!(
        answers,
        [
            (201, "queued".to_owned()),
            (200, "fallback".to_owned()),
            (200, "fallback".to_owned()),
            (200, "fallback".to_owned()),
        ]
    );
    mock.clear_fallback();
    let response = client.get(mock.base_url()).send().await.expect("send");
    assert_eq!(response.status(), 500);
}

#[tokio::test]
async fn scripted_fallback_renders_fresh_for_every_request() {
    let mock = MockProvider::start().await.expect("start mock");
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("again")));
    let client = http_client();
    for sequence in 0..3 {
        let completion: Value = client
            .post(format!("{}/chat/completions", mock.openai_base_url()))
            .json(&json!({"messages": []}))
            .send()
            .await
            .expect("send")
            .json()
            .await
            .expect("json");
        assert_eq!(completion["choices"][0]["message"]["content"], "again");
        assert_eq!(completion["id"], format!("chatcmpl-mock{sequence}"));
    }
}

#[tokio::test]
async fn an_empty_queue_without_fallback_answers_500_and_still_records() {
    let mock = MockProvider::start().await.expect("start mock");
    let response = http_client()
        .post(format!("{}/chat/completions", mock.openai_base_url()))
        .json(&json!({"messages": []}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 500);
    assert_eq!(response.headers()["content-type"], "application/json");
    let body: Value = response.json().await.expect("json");
    assert_eq!(
        body,
        json!({"error": {"message": "agentry-testkit: no reply queued", "type": "mock_error"}})
    );
    assert_eq!(mock.request_count(), 1);
    assert_eq!(mock.requests()[0].protocol, Some(Protocol::OpenAi));
}

#[tokio::test]
async fn base_urls_point_at_the_bound_port() {
    let mock = MockProvider::start().await.expect("start mock");
    let base = mock.base_url();
    assert_eq!(base, format!("http://127.0.0.1:{}", mock.addr().port()));
    assert_eq!(mock.openai_base_url(), format!("{base}/v1"));
    assert_eq!(mock.anthropic_base_url(), format!("{base}/v1"));
    assert_eq!(mock.ollama_base_url(), base);
}

#[test]
fn protocol_is_inferred_from_the_path() {
    let cases = [
        ("/v1/chat/completions", Some(Protocol::OpenAi)),
        ("/chat/completions", Some(Protocol::OpenAi)),
        ("/openai/v1/chat/completions/", Some(Protocol::OpenAi)),
        ("/v1/messages", Some(Protocol::Anthropic)),
        ("/v1/messages?beta=true", Some(Protocol::Anthropic)),
        ("/api/chat", Some(Protocol::Ollama)),
        ("/api/generate", Some(Protocol::Ollama)),
        ("/v1/messages/count_tokens", None),
        ("/v1/embeddings", None),
        ("/", None),
    ];
    for (path, expected) in cases {
        assert_eq!(Protocol::from_path(path), expected, "{path}");
    }
}

#[tokio::test]
async fn clones_share_the_server_and_the_last_drop_shuts_it_down() {
    let mock = MockProvider::start().await.expect("start mock");
    let clone = mock.clone();
    clone.enqueue(Reply::raw(200, vec![], "via clone"));
    let url = mock.base_url();
    drop(clone);
    let response = http_client().get(&url).send().await.expect("still serving");
    assert_eq!(response.text().await.expect("text"), "via clone");
    assert_eq!(mock.request_count(), 1);
    drop(mock);

    // A fresh client (no pooled connection) must eventually be refused.
    let mut refused = false;
    for _ in 0..100 {
        if http_client().get(&url).send().await.is_err() {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        refused,
        "the server kept accepting after the last handle was dropped"
    );
}
