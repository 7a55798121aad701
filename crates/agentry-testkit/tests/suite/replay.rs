//! Replaying every recorded fixture through the mock: status, headers and body bytes come back
//! as recorded, whole or cut into arbitrary chunks.

use agentry_testkit::{Chunking, Fixture, MockProvider, Reply};
use reqwest::Method;

use super::client::{http_client, read_chunks};

/// Framing headers the mock does not replay (it frames the body itself).
const NOT_REPLAYED: [&str; 3] = ["content-length", "transfer-encoding", "connection"];

/// The path (and query) a fixture's request was sent to, or a synthetic one.
fn request_target(fixture: &Fixture) -> String {
    let Some(request) = &fixture.request else {
        return format!("/replay/{}", fixture.name);
    };
    match request.uri.split_once("://") {
        Some((_, rest)) => rest
            .find('/')
            .map_or("/".to_owned(), |i| rest[i..].to_owned()),
        None => request.uri.clone(),
    }
}

async fn replay_all(chunking: Chunking) {
    let fixtures = Fixture::all().expect("fixtures");
    assert!(!fixtures.is_empty());
    let mock = MockProvider::start().await.expect("start mock");
    let client = http_client();
    for fixture in &fixtures {
        mock.enqueue(Reply::fixture(fixture.clone()).chunked(chunking.clone()));
        let (method, body) = match &fixture.request {
            Some(request) => (
                Method::from_bytes(request.method.as_bytes()).expect("method"),
                request.body.to_string(),
            ),
            None => (Method::POST, "{}".to_owned()),
        };
        let url = format!("{}{}", mock.base_url(), request_target(fixture));
        let response = client
            .request(method, url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("send");

        assert_eq!(
            response.status().as_u16(),
            fixture.status,
            "{}",
            fixture.name
        );
        for (name, value) in &fixture.headers {
            if NOT_REPLAYED.iter().any(|n| n.eq_ignore_ascii_case(name)) {
                continue;
            }
            let returned: Vec<&[u8]> = response
                .headers()
                .get_all(name.as_str())
                .iter()
                .map(|v| v.as_bytes())
                .collect();
            let recorded = fixture
                .headers
                .iter()
                .filter(|(n, _)| n.eq_ignore_ascii_case(name));
            assert_eq!(
                returned.len(),
                recorded.count(),
                "{}: header {name} count (got {returned:?})",
                fixture.name
            );
            assert!(
                returned.contains(&value.as_bytes()),
                "{}: header {name}: expected {value:?}, got {returned:?}",
                fixture.name
            );
        }
        let (bytes, _, outcome) = read_chunks(response).await;
        outcome.expect("clean end of body");
        assert_eq!(bytes, fixture.body.as_bytes(), "{}: body", fixture.name);
    }
    assert_eq!(mock.request_count(), fixtures.len());
}

#[tokio::test]
async fn every_fixture_replays_exactly() {
    replay_all(Chunking::Whole).await;
}

#[tokio::test]
async fn every_fixture_replays_exactly_in_7_byte_chunks() {
    replay_all(Chunking::Every(7)).await;
}

#[tokio::test]
async fn every_fixture_replays_exactly_in_random_chunks() {
    replay_all(Chunking::Random {
        seed: 0x5eed,
        max: 64,
    })
    .await;
}

#[tokio::test]
async fn every_fixture_replays_exactly_cut_at_chosen_offsets() {
    replay_all(Chunking::At(vec![1, 2, 3, 17, 100, 101, 4096])).await;
}

#[tokio::test]
async fn framing_headers_are_not_replayed_and_hyper_frames_the_body() {
    let fixture = Fixture::named("openai/chat_tool_call_nonstream").expect("fixture");
    assert_eq!(fixture.header("transfer-encoding"), Some("chunked"));
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(Reply::fixture(fixture.clone()).chunked(Chunking::Every(50)));
    let response = http_client()
        .post(format!("{}/v1/chat/completions", mock.base_url()))
        .body("{}")
        .send()
        .await
        .expect("send");
    assert!(response.headers().get("connection").is_none());
    assert!(response.headers().get("content-length").is_none());
    // The chunked framing is hyper's own, not a replayed header.
    assert_eq!(
        response
            .headers()
            .get_all("transfer-encoding")
            .iter()
            .count(),
        1
    );
    assert_eq!(response.headers()["openai-processing-ms"], "1777");
    assert_eq!(
        response.bytes().await.expect("body"),
        fixture.body.as_bytes()
    );
}
