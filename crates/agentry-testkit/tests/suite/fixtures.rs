//! Loading recorded exchanges from the shared fixtures directory.

use agentry_testkit::{Fixture, Protocol, TestkitError, check_request, fixtures_dir};

#[test]
fn all_fixtures_load_sorted_by_name() {
    let fixtures = Fixture::all().expect("load fixtures");
    assert!(
        fixtures.len() >= 20,
        "expected the shared fixtures under {}, found {}",
        fixtures_dir().display(),
        fixtures.len()
    );
    let names: Vec<&str> = fixtures.iter().map(|f| f.name.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(names, sorted);
    for fixture in &fixtures {
        assert_eq!(
            fixture.name.split_once('/').map(|(p, _)| p),
            Some(fixture.provider.as_str())
        );
        assert!(
            !fixture.body.is_empty(),
            "{} has an empty body",
            fixture.name
        );
        assert!(
            !fixture.headers.is_empty(),
            "{} has no headers",
            fixture.name
        );
    }
}

#[test]
fn named_fixture_has_its_recorded_fields() {
    let fixture = Fixture::named("anthropic/messages_thinking_stream").expect("fixture");
    assert_eq!(fixture.name, "anthropic/messages_thinking_stream");
    assert_eq!(fixture.provider, "anthropic");
    assert_eq!(fixture.fidelity, "raw");
    assert_eq!(fixture.status, 200);
    assert!(fixture.is_streaming());
    assert_eq!(
        fixture.header("Content-Type"),
        Some("text/event-stream; charset=utf-8")
    );
    // Headers keep file order.
    assert_eq!(fixture.headers[0].0, "cache-control");
    assert!(fixture.body.starts_with("event: message_start\n"));
    let request = fixture.request.expect("recorded request");
    assert_eq!(request.method, "POST");
    assert_eq!(
        request.uri,
        "https://api.anthropic.com/v1/messages?beta=true"
    );
    assert_eq!(request.body["stream"], true);
}

#[test]
fn streaming_is_detected_from_content_type() {
    let ndjson = Fixture::named("ollama/chat_stream_text").expect("fixture");
    assert!(ndjson.is_streaming());
    let json = Fixture::named("openai/chat_tool_call_nonstream").expect("fixture");
    assert!(!json.is_streaming());
    let no_request = Fixture::named("anthropic/error_529_overloaded").expect("fixture");
    assert_eq!(no_request.status, 529);
    assert!(no_request.request.is_none());
}

#[test]
fn unknown_fixture_is_a_not_found_error() {
    let error = Fixture::named("openai/no_such_exchange").expect_err("must fail");
    assert!(
        matches!(error, TestkitError::FixtureNotFound { ref name, .. } if name == "openai/no_such_exchange")
    );
    assert!(error.to_string().contains("openai/no_such_exchange"));
}

#[test]
fn malformed_fixture_file_is_reported() {
    let dir = std::env::temp_dir().join(format!("agentry-testkit-{}", std::process::id()));
    let provider_dir = dir.join("broken");
    std::fs::create_dir_all(&provider_dir).expect("temp dir");
    let path = provider_dir.join("not_a_fixture.json");
    std::fs::write(&path, r#"{"response_status": 200}"#).expect("write");
    let error = Fixture::load(&path).expect_err("missing response_body");
    assert!(matches!(error, TestkitError::FixtureJson { .. }), "{error}");
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// The recorded requests are real, accepted traffic: they must satisfy the invariants.
#[test]
fn recorded_request_bodies_pass_the_protocol_checks() {
    let mut checked = 0;
    for fixture in Fixture::all().expect("fixtures") {
        let Some(request) = fixture.request else {
            continue;
        };
        if !request.body.is_object() {
            continue;
        }
        let path = request
            .uri
            .split_once("://")
            .map_or(request.uri.as_str(), |(_, rest)| {
                rest.find('/').map_or("/", |i| &rest[i..])
            });
        let Some(protocol) = Protocol::from_path(path) else {
            continue;
        };
        let violations = check_request(protocol, &request.body);
        assert!(violations.is_empty(), "{}: {violations:?}", fixture.name);
        checked += 1;
    }
    assert!(
        checked >= 15,
        "only {checked} fixture requests were checked"
    );
}
