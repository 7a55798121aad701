//! Authentication, metrics, the session status feed, request ids and the bind rule.

use std::net::SocketAddr;
use std::time::Duration;

use agentry_app::auth::{create_key, revoke_key};
use agentry_server::ServerConfig;
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::json;

use super::support::start;

const V1_ROUTES: &[(&str, &str)] = &[
    ("GET", "/v1/sessions"),
    ("GET", "/v1/sessions/search?q=x"),
    ("GET", "/v1/sessions/01890a5d-ac96-774b-bcce-b302099a8057"),
    (
        "DELETE",
        "/v1/sessions/01890a5d-ac96-774b-bcce-b302099a8057",
    ),
    (
        "GET",
        "/v1/sessions/01890a5d-ac96-774b-bcce-b302099a8057/stream",
    ),
    ("GET", "/v1/sessions/events"),
    ("POST", "/v1/infer"),
    ("POST", "/v1/infer/stream"),
    ("POST", "/v1/infer/abort"),
    ("GET", "/v1/models"),
    ("POST", "/v1/models"),
    ("GET", "/v1/tools"),
    ("POST", "/v1/tools/call"),
    ("GET", "/v1/prompt-templates"),
    ("GET", "/v1/env"),
    ("POST", "/v1/env"),
    ("GET", "/v1/sandbox/capabilities"),
    ("GET", "/v1/sandboxes"),
    ("POST", "/v1/sandboxes"),
    (
        "POST",
        "/v1/sandboxes/01890a5d-ac96-774b-bcce-b302099a8057/exec",
    ),
    (
        "PUT",
        "/v1/sandboxes/01890a5d-ac96-774b-bcce-b302099a8057/files?path=a",
    ),
    ("GET", "/metrics"),
];

async fn status_of(
    server: &super::support::Server,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> u16 {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = server.http.request(method, format!("{}{path}", server.url));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

/// Every documented `/v1` operation (the document equals the router: see `openapi.rs`), with
/// path parameters filled in.
pub(super) async fn every_v1_operation(server: &super::support::Server) -> Vec<(String, String)> {
    let (_, document) = server.get("/openapi.json").await;
    let mut operations = Vec::new();
    for (path, item) in document["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/") || path == "/v1/auth/login" || path == "/v1/auth/status" {
            continue;
        }
        let filled = path
            .replace("{id}", "01890a5d-ac96-774b-bcce-b302099a8057")
            .replace("{exec_id}", "01890a5d-ac96-774b-bcce-b302099a8058")
            .replace("{name}", "some_name");
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                operations.push((method.to_uppercase(), filled.clone()));
            }
        }
    }
    operations
}

#[tokio::test]
async fn with_a_key_every_documented_v1_operation_refuses_a_missing_or_revoked_key() {
    let server = start().await;
    let operations = every_v1_operation(&server).await;
    assert!(operations.len() > 30, "{operations:?}");
    let key = create_key(&server.state.app.parts().store, "tests")
        .await
        .unwrap();
    server.state.auth.refresh();
    for (method, path) in &operations {
        assert_eq!(
            status_of(&server, method, path, None).await,
            401,
            "{method} {path} without a key"
        );
    }
    revoke_key(&server.state.app.parts().store, &key.id)
        .await
        .unwrap();
    // A second, active key keeps auth on; the revoked one is refused everywhere.
    create_key(&server.state.app.parts().store, "other")
        .await
        .unwrap();
    server.state.auth.refresh();
    for (method, path) in &operations {
        assert_eq!(
            status_of(&server, method, path, Some(&key.key)).await,
            401,
            "{method} {path} with a revoked key"
        );
    }
}

#[tokio::test]
async fn with_a_key_every_v1_route_refuses_missing_wrong_and_revoked_keys() {
    let server = start().await;
    // No key yet: open (loopback only).
    assert_eq!(status_of(&server, "GET", "/v1/sessions", None).await, 200);
    let key = create_key(&server.state.app.parts().store, "tests")
        .await
        .unwrap();
    server.state.auth.refresh();
    for (method, path) in V1_ROUTES {
        assert_eq!(
            status_of(&server, method, path, None).await,
            401,
            "{method} {path} without a key"
        );
        assert_eq!(
            status_of(&server, method, path, Some("agk_000000000000_nope")).await,
            401,
            "{method} {path} with a wrong key"
        );
    }
    let response = server
        .http
        .get(format!("{}/v1/sessions", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.headers()["www-authenticate"], "Bearer");
    let body: serde_json::Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    // The right key works; health stays open.
    assert_eq!(
        status_of(&server, "GET", "/v1/sessions", Some(&key.key)).await,
        200
    );
    assert_eq!(status_of(&server, "GET", "/healthz", None).await, 200);
    // Revoked: refused on the very next request.
    let other = create_key(&server.state.app.parts().store, "other")
        .await
        .unwrap();
    assert!(
        revoke_key(&server.state.app.parts().store, &key.id)
            .await
            .unwrap()
    );
    assert_eq!(
        status_of(&server, "GET", "/v1/sessions", Some(&key.key)).await,
        401
    );
    assert_eq!(
        status_of(&server, "GET", "/v1/sessions", Some(&other.key)).await,
        200
    );
    // Only the hash is stored.
    let stored = server
        .state
        .app
        .parts()
        .store
        .list_config(agentry_store::ConfigKind::ApiKey)
        .await
        .unwrap();
    assert!(!serde_json::to_string(&stored).unwrap().contains(&other.key));
}

#[tokio::test]
async fn a_login_sets_an_http_only_cookie_that_works_until_logout() {
    let server = start().await;
    let key = create_key(&server.state.app.parts().store, "console")
        .await
        .unwrap();
    server.state.auth.refresh();
    let refused = server
        .http
        .post(format!("{}/v1/auth/login", server.url))
        .json(&json!({"api_key": "agk_000000000000_wrong"}))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status().as_u16(), 401);
    let login = server
        .http
        .post(format!("{}/v1/auth/login", server.url))
        .json(&json!({"api_key": key.key}))
        .send()
        .await
        .unwrap();
    assert_eq!(login.status().as_u16(), 204);
    let cookie = login.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"));
    let pair = cookie.split(';').next().unwrap().to_owned();
    let with_cookie = |path: &str| {
        server
            .http
            .get(format!("{}{path}", server.url))
            .header("cookie", pair.clone())
            .send()
    };
    assert_eq!(
        with_cookie("/v1/sessions").await.unwrap().status().as_u16(),
        200
    );
    let status: serde_json::Value = with_cookie("/v1/auth/status")
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        status,
        json!({"enabled": true, "authenticated": true, "role": "admin", "key_id": key.id})
    );
    server
        .http
        .post(format!("{}/v1/auth/logout", server.url))
        .header("cookie", pair.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(
        with_cookie("/v1/sessions").await.unwrap().status().as_u16(),
        401
    );
}

#[tokio::test]
async fn metrics_count_runs_rounds_and_requests() {
    let server = start().await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("done").with_usage(10, 3),
    ));
    let (status, _) = server
        .post("/v1/infer", json!({"session_id": "new", "text": "time?"}))
        .await;
    assert_eq!(status, 200);
    let text = server.metrics_text().await;
    assert!(text.contains("agentry_runs_started_total 1"), "{text}");
    assert!(text.contains("agentry_rounds_total 2"), "{text}");
    assert!(
        text.contains("agentry_runs_finished_total{stop_reason=\"completed\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("agentry_tool_calls_total{outcome=\"ok\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("agentry_http_requests_total{method=\"POST\",status=\"200\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("agentry_http_request_duration_seconds_bucket"),
        "{text}"
    );
    assert!(text.contains("agentry_live_runs 0"), "{text}");
}

#[tokio::test]
async fn the_status_feed_reports_runs_starting_and_ending() {
    let server = start().await;
    let mut feed = server.sse("/v1/sessions/events", None, None).await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("hello")));
    let (_, body) = server
        .post("/v1/infer", json!({"session_id": "new", "text": "hi"}))
        .await;
    let session = body["session_id"].as_str().unwrap();
    let running = feed.next().await.unwrap();
    assert_eq!(running.name, "session.status");
    assert_eq!(running.data["session_id"], session);
    assert_eq!(running.data["status"], "running");
    let idle = feed.next().await.unwrap();
    assert_eq!(idle.data["status"], "idle");
    assert_eq!(idle.data["stop_reason"], "completed");
}

#[tokio::test]
async fn every_response_has_a_request_id() {
    let server = start().await;
    let response = server
        .http
        .get(format!("{}/healthz", server.url))
        .send()
        .await
        .unwrap();
    let id = response.headers()["x-request-id"].to_str().unwrap();
    assert_eq!(id.len(), 36);
    let given = server
        .http
        .get(format!("{}/healthz", server.url))
        .header("x-request-id", "trace-me-42")
        .send()
        .await
        .unwrap();
    assert_eq!(given.headers()["x-request-id"], "trace-me-42");
}

#[tokio::test]
async fn listening_beyond_loopback_needs_a_key() {
    let server = start().await;
    let open = ServerConfig {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        shutdown_grace: Duration::from_secs(1),
    };
    let refused = agentry_server::serve::bind(&open, &server.state.app.parts().store).await;
    assert!(matches!(
        refused,
        Err(agentry_server::ServeError::InsecureBind(_))
    ));
    create_key(&server.state.app.parts().store, "ops")
        .await
        .unwrap();
    assert!(
        agentry_server::serve::bind(&open, &server.state.app.parts().store)
            .await
            .is_ok()
    );
}

/// The most files this process may open, from `/proc/self/limits`.
fn open_files_limit() -> usize {
    std::fs::read_to_string("/proc/self/limits")
        .ok()
        .and_then(|limits| {
            let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
            line.split_whitespace().nth(3)?.parse().ok()
        })
        .unwrap_or(1024)
}

#[tokio::test]
async fn a_burst_of_connections_waits_to_be_accepted_instead_of_being_dropped() {
    // The server accepts nothing meanwhile: every connection waits in the accept queue. A
    // connection the queue has no room for is dropped and retried only after a second, so each
    // must complete well within that. Beyond tokio's default queue of 1,024 where this machine
    // allows (`somaxconn`, open files).
    let somaxconn: usize = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(1024);
    let burst = 1500
        .min(somaxconn)
        .min(open_files_limit().saturating_sub(500));
    let config = ServerConfig {
        addr: SocketAddr::from(([127, 0, 0, 1], 0)),
        shutdown_grace: Duration::from_secs(1),
    };
    let server = start().await;
    let listener = agentry_server::serve::bind(&config, &server.state.app.parts().store)
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let mut connections = Vec::with_capacity(burst);
    for n in 0..burst {
        let connected = tokio::time::timeout(
            Duration::from_millis(700),
            tokio::net::TcpStream::connect(addr),
        )
        .await;
        match connected {
            Ok(Ok(stream)) => connections.push(stream),
            other => panic!("connection {n} of {burst} was not queued: {other:?}"),
        }
    }
    assert_eq!(connections.len(), burst);
    drop(listener);
}

#[tokio::test]
async fn cors_is_off_by_default() {
    let server = start().await;
    let response = server
        .http
        .get(format!("{}/v1/sessions", server.url))
        .header("origin", "https://evil.example")
        .send()
        .await
        .unwrap();
    assert!(
        response
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );
}
