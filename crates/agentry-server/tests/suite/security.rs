//! Secure defaults: the Host and Origin checks that keep web pages out, least-privilege tools,
//! approvals by risk class, and API keys with roles that own their work.

use std::time::Duration;

use agentry_app::ToolEnvironment;
use agentry_app::auth::{KeyLimits, KeyRole, create_key, create_key_with};
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::ops::every_v1_operation;
use super::support::{Server, start, start_with};

/// Sends `method path` with a JSON body and the given extra headers; the status and body.
async fn send(
    server: &Server,
    method: &str,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = server
        .http
        .request(method, format!("{}{path}", server.url))
        .json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A stdio MCP server whose command would leave `marker` behind if it ever started.
fn marker_server(marker: &std::path::Path) -> Value {
    json!({"mcpServers": {"rebound": {
        "command": "/bin/sh",
        "args": ["-c", format!("touch {}; sleep 5", marker.display())]
    }}})
}

#[tokio::test]
async fn a_rebinding_page_reaches_no_route_and_starts_nothing() {
    let server = start().await;
    let marker = server.home.path().join("rebound-marker");
    let mut operations = every_v1_operation(&server).await;
    assert!(operations.len() > 30, "{operations:?}");
    operations.extend(
        [
            ("POST", "/mcp"),
            ("GET", "/openapi.json"),
            ("GET", "/metrics"),
            ("GET", "/"),
        ]
        .map(|(method, path)| (method.to_owned(), path.to_owned())),
    );
    let port = server.url.rsplit(':').next().unwrap().to_owned();
    for host in [
        format!("evil.example:{port}"),
        "evil.example".to_owned(),
        format!("127.0.0.1.nip.io:{port}"),
        format!("localhost.evil.example:{port}"),
    ] {
        for (method, path) in &operations {
            let (status, body) = send(
                &server,
                method,
                path,
                &json!({}),
                &[("host", host.as_str())],
            )
            .await;
            assert_eq!(status, 403, "{method} {path} with Host {host}: {body}");
            assert_eq!(body["error"]["code"], "host_not_allowed", "{method} {path}");
            assert_eq!(body["error"]["details"]["setting"], "--allowed-host");
        }
        let (status, _) = send(
            &server,
            "POST",
            "/v1/tools/mcp",
            &marker_server(&marker),
            &[("host", host.as_str())],
        )
        .await;
        assert_eq!(status, 403);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "the MCP server's command ran");
    let (_, servers) = server.get("/v1/mcp-servers").await;
    assert!(!servers.to_string().contains("rebound"), "{servers}");
    // Loopback names and addresses are answered.
    for host in [format!("localhost:{port}"), format!("127.0.0.1:{port}")] {
        let (status, _) = send(
            &server,
            "GET",
            "/v1/sessions",
            &json!({}),
            &[("host", &host)],
        )
        .await;
        assert_eq!(status, 200, "{host}");
    }
}

#[tokio::test]
async fn a_name_the_operator_allows_is_answered() {
    let server = start_with(
        |_| super::support::no_default_approvals(),
        |state| {
            std::sync::Arc::make_mut(&mut state.access).allowed_hosts =
                vec!["agents.example.com".into()];
        },
    )
    .await;
    let (status, _) = send(
        &server,
        "GET",
        "/v1/sessions",
        &json!({}),
        &[("host", "agents.example.com")],
    )
    .await;
    assert_eq!(status, 200);
    let (status, _) = send(
        &server,
        "GET",
        "/v1/sessions",
        &json!({}),
        &[("host", "other.example.com")],
    )
    .await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn a_foreign_origin_cannot_change_anything() {
    let server = start_with(
        |_| super::support::no_default_approvals(),
        |state| {
            std::sync::Arc::make_mut(&mut state.access).allowed_origins =
                vec!["http://localhost:3000".into()];
        },
    )
    .await;
    let marker = server.home.path().join("cross-origin-marker");
    let operations = every_v1_operation(&server).await;
    let changing: Vec<_> = operations
        .iter()
        .filter(|(method, _)| method != "GET")
        .collect();
    assert!(changing.len() > 20, "{changing:?}");
    for origin in ["http://evil.example", "null", "http://127.0.0.1:1"] {
        for (method, path) in &changing {
            let (status, body) =
                send(&server, method, path, &json!({}), &[("origin", origin)]).await;
            assert_eq!(status, 403, "{method} {path} from {origin}: {body}");
            assert_eq!(
                body["error"]["code"], "origin_not_allowed",
                "{method} {path}"
            );
        }
        let (status, _) = send(
            &server,
            "POST",
            "/v1/tools/mcp",
            &marker_server(&marker),
            &[("origin", origin)],
        )
        .await;
        assert_eq!(status, 403);
    }
    // A WebSocket upgrade counts as a change.
    let (status, _) = send(
        &server,
        "GET",
        "/mcp",
        &json!({}),
        &[("origin", "http://evil.example"), ("upgrade", "websocket")],
    )
    .await;
    assert_eq!(status, 403);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!marker.exists(), "the MCP server's command ran");
    // Reading is fine (the browser keeps the answer from the page without CORS).
    let (status, _) = send(
        &server,
        "GET",
        "/v1/sessions",
        &json!({}),
        &[("origin", "http://evil.example")],
    )
    .await;
    assert_eq!(status, 200);
    // The server's own origin (the console) and a configured one may change things.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("hi")));
    let own = server.url.clone();
    let (status, body) = send(
        &server,
        "POST",
        "/v1/infer",
        &json!({"text": "hi"}),
        &[("origin", own.as_str())],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = send(
        &server,
        "POST",
        "/v1/sessions/01890a5d-ac96-774b-bcce-b302099a8057/read",
        &json!({}),
        &[("origin", "http://localhost:3000")],
    )
    .await;
    assert_eq!(status, 404);
}

fn offered(server: &Server, request: usize) -> Vec<String> {
    let body = &server.mock.requests()[request].body;
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|tool| tool["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn a_run_gets_exactly_the_tools_it_names() {
    let server = start().await;
    for _ in 0..3 {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    }
    let (status, body) = server.post("/v1/infer", json!({"text": "hi"})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        offered(&server, 0),
        Vec::<String>::new(),
        "no tools named: none offered"
    );
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"text": "hi", "tool_ids": ["current_time"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(offered(&server, 1), ["current_time"]);
    let (status, body) = server
        .post("/v1/infer", json!({"text": "hi", "tool_ids": ["*"]}))
        .await;
    assert_eq!(status, 200, "{body}");
    let all = offered(&server, 2);
    assert!(
        all.contains(&"current_time".to_owned()) && all.contains(&"slow".to_owned()),
        "{all:?}"
    );
    // An agent with no tools gets none; `["*"]` in an agent offers all.
    for (id, tools) in [("bare", json!([])), ("everything", json!(["*"]))] {
        let (status, body) = server
            .post(
                "/v1/agents",
                json!({"id": id, "model_id": "mock", "tool_ids": tools}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    }
    server
        .post("/v1/infer", json!({"text": "hi", "agent_id": "bare"}))
        .await;
    assert!(offered(&server, 3).is_empty());
    server
        .post("/v1/infer", json!({"text": "hi", "agent_id": "everything"}))
        .await;
    assert!(offered(&server, 4).contains(&"slow".to_owned()));
}

#[tokio::test]
async fn tools_that_run_on_the_host_ask_for_approval_by_default() {
    // The shipped defaults: `slow` is a command tool without a sandbox, so it runs on the host.
    let server = start_with(
        |_| ToolEnvironment {
            allow_host_commands: true,
            ..ToolEnvironment::default()
        },
        |_| {},
    )
    .await;
    let (_, tools) = server.get("/v1/tools").await;
    let tool = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|tool| tool["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(tool("slow")["risk"], "runs_commands");
    assert_eq!(tool("slow")["runs_on_host"], true);
    assert_eq!(tool("current_time")["risk"], "read_only");
    assert_eq!(tool("current_time")["runs_on_host"], false);
    // Without a session such a run could not wait: refused before anything runs.
    let (status, body) = server
        .post("/v1/infer", json!({"text": "go", "tool_ids": ["slow"]}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("approval")
    );
    assert!(server.mock.requests().is_empty());
    // In a session the call waits for a person.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::tool_call("slow", json!({}))));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"text": "go", "session_id": "new", "tool_ids": ["slow"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stop_reason"], "waiting", "{body}");
    assert_eq!(body["pending"][0]["call"]["name"], "slow");
    // A run's own policy wins over the defaults; confined tools never ask.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::tool_call("slow", json!({}))));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("done")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"text": "go", "tool_ids": ["slow", "current_time"],
                   "approvals": {"tools": {"slow": "never"}}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stop_reason"], "completed", "{body}");
}

/// A server with an admin key and a user key; their keys.
pub(super) async fn with_keys(server: &Server, limits: KeyLimits) -> (String, String, String) {
    let admin = create_key(&server.state.app.parts().store, "admin")
        .await
        .unwrap();
    let user = create_key_with(
        &server.state.app.parts().store,
        "user",
        KeyRole::User,
        limits.clone(),
    )
    .await
    .unwrap();
    let other = create_key_with(
        &server.state.app.parts().store,
        "other",
        KeyRole::User,
        limits,
    )
    .await
    .unwrap();
    server.state.auth.refresh();
    (admin.key, user.key, other.key)
}

pub(super) async fn as_key(
    server: &Server,
    key: &str,
    method: &str,
    path: &str,
    body: Value,
) -> (u16, Value) {
    let authorization = format!("Bearer {key}");
    send(
        server,
        method,
        path,
        &body,
        &[("authorization", authorization.as_str())],
    )
    .await
}

#[tokio::test]
async fn a_user_key_sees_only_its_own_work() {
    let server = start().await;
    let (admin, user, other) = with_keys(&server, KeyLimits::default()).await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("mine")));
    let (status, body) = as_key(
        &server,
        &other,
        "POST",
        "/v1/infer",
        json!({"text": "secret plans", "session_id": "new"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let theirs = body["session_id"].as_str().unwrap().to_owned();
    // The user key cannot find, read, stream, continue, fork, search or delete it: 404.
    for (method, path, body) in [
        ("GET", format!("/v1/sessions/{theirs}"), json!({})),
        ("GET", format!("/v1/sessions/{theirs}/events"), json!({})),
        ("GET", format!("/v1/sessions/{theirs}/stream"), json!({})),
        ("GET", format!("/v1/sessions/{theirs}/context"), json!({})),
        ("POST", format!("/v1/sessions/{theirs}/continue"), json!({})),
        ("POST", format!("/v1/sessions/{theirs}/fork"), json!({})),
        (
            "POST",
            format!("/v1/sessions/{theirs}/title"),
            json!({"title": "x"}),
        ),
        ("DELETE", format!("/v1/sessions/{theirs}"), json!({})),
        (
            "POST",
            "/v1/infer".to_owned(),
            json!({"text": "more", "session_id": theirs}),
        ),
        (
            "POST",
            "/v1/infer/abort".to_owned(),
            json!({"session_id": theirs}),
        ),
    ] {
        let (status, answer) = as_key(&server, &user, method, &path, body).await;
        assert_eq!(status, 404, "{method} {path}: {answer}");
        assert!(
            !answer.to_string().contains("secret plans"),
            "{method} {path}: {answer}"
        );
    }
    let (_, listed) = as_key(&server, &user, "GET", "/v1/sessions", json!({})).await;
    assert_eq!(listed["sessions"], json!([]), "{listed}");
    let (_, hits) = as_key(
        &server,
        &user,
        "GET",
        "/v1/sessions/search?q=secret",
        json!({}),
    )
    .await;
    assert_eq!(hits["hits"], json!([]), "{hits}");
    // Its owner and an admin see it.
    let (_, listed) = as_key(&server, &other, "GET", "/v1/sessions", json!({})).await;
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 1);
    let (status, _) = as_key(
        &server,
        &admin,
        "GET",
        &format!("/v1/sessions/{theirs}"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    let (_, hits) = as_key(
        &server,
        &admin,
        "GET",
        "/v1/sessions/search?q=secret",
        json!({}),
    )
    .await;
    assert_eq!(hits["hits"].as_array().unwrap().len(), 1);
    // The session is still there after every refused attempt.
    let (status, _) = as_key(
        &server,
        &other,
        "GET",
        &format!("/v1/sessions/{theirs}"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_user_key_runs_only_within_its_limits_and_manages_nothing() {
    let server = start().await;
    for (id, tools) in [
        ("helper", json!(["current_time"])),
        ("admin-only", json!([])),
    ] {
        let (status, body) = server
            .post(
                "/v1/agents",
                json!({"id": id, "model_id": "mock", "tool_ids": tools}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let (_, user, _) = with_keys(
        &server,
        KeyLimits {
            agents: Some(vec!["helper".into()]),
            models: Some(vec!["mock".into()]),
            tools: Some(vec!["current_time".into()]),
            quotas: None,
        },
    )
    .await;
    for body in [
        json!({"text": "hi", "agent_id": "admin-only"}),
        json!({"text": "hi", "tool_ids": ["slow"]}),
        json!({"text": "hi", "tool_ids": ["*"]}),
        json!({"text": "hi", "model_id": "other"}),
    ] {
        let (status, answer) = as_key(&server, &user, "POST", "/v1/infer", body.clone()).await;
        assert_eq!(status, 403, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "permission_denied");
    }
    assert!(server.mock.requests().is_empty());
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        "/v1/infer",
        json!({"text": "hi", "agent_id": "helper"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    for (method, path) in [
        ("POST", "/v1/models"),
        ("POST", "/v1/tools"),
        ("POST", "/v1/tools/mcp"),
        ("POST", "/v1/tools/call"),
        ("GET", "/v1/api-keys"),
        ("POST", "/v1/api-keys"),
        ("GET", "/v1/env"),
        ("POST", "/v1/agents"),
        ("GET", "/metrics"),
    ] {
        let (status, answer) = as_key(&server, &user, method, path, json!({})).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
    }
    let (status, _) = as_key(&server, &user, "GET", "/v1/models", json!({})).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn revoking_keys_never_turns_authentication_off() {
    let server = start().await;
    let admin = create_key(&server.state.app.parts().store, "admin")
        .await
        .unwrap();
    server.state.auth.refresh();
    // The first key is an admin even when asked for a user.
    let (_, keys) = as_key(&server, &admin.key, "GET", "/v1/api-keys", json!({})).await;
    assert_eq!(keys["keys"][0]["role"], "admin");
    let (status, created) = as_key(
        &server,
        &admin.key,
        "POST",
        "/v1/api-keys",
        json!({"label": "client"}),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["role"], "user");
    let user_id = created["id"].as_str().unwrap().to_owned();
    // The last active admin key cannot be revoked over the API.
    let (status, body) = as_key(
        &server,
        &admin.key,
        "DELETE",
        &format!("/v1/api-keys/{}", admin.id),
        json!({}),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    let (status, _) = as_key(
        &server,
        &admin.key,
        "DELETE",
        &format!("/v1/api-keys/{user_id}"),
        json!({}),
    )
    .await;
    assert_eq!(status, 204);
    // Every key but the admin revoked (and even that one, from the CLI): still locked.
    agentry_app::auth::revoke_key(&server.state.app.parts().store, &admin.id)
        .await
        .unwrap();
    server.state.auth.refresh();
    let (status, _) = server.get("/v1/sessions").await;
    assert_eq!(status, 401);
    let (_, auth) = server.get("/v1/auth/status").await;
    assert_eq!(auth["enabled"], true);
}

#[tokio::test]
async fn logins_are_throttled_and_secure_behind_tls() {
    let server = start().await;
    let key = create_key(&server.state.app.parts().store, "console")
        .await
        .unwrap();
    server.state.auth.refresh();
    let login = |api_key: String, tls: bool| {
        let mut request = server
            .http
            .post(format!("{}/v1/auth/login", server.url))
            .json(&json!({ "api_key": api_key }));
        if tls {
            request = request.header("x-forwarded-proto", "https");
        }
        request.send()
    };
    let response = login(key.key.clone(), true).await.unwrap();
    assert_eq!(response.status().as_u16(), 204);
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cookie.starts_with("__Host-agentry_session="), "{cookie}");
    assert!(
        cookie.contains("; Secure") && cookie.contains("HttpOnly"),
        "{cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();
    let with_cookie = server
        .http
        .get(format!("{}/v1/sessions", server.url))
        .header("cookie", pair)
        .send()
        .await
        .unwrap();
    assert_eq!(with_cookie.status().as_u16(), 200);
    // Ten wrong keys in a minute, then even the right one waits.
    for _ in 0..10 {
        let response = login("agk_000000000000_wrong".into(), false).await.unwrap();
        assert_eq!(response.status().as_u16(), 401);
    }
    let response = login(key.key.clone(), false).await.unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert!(response.headers().contains_key("retry-after"));
    // Those failures hold back only their own client: a console user at another address logs
    // in (the second security review's N10).
    let elsewhere = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    let response = elsewhere
        .post(format!("{}/v1/auth/login", server.url))
        .json(&json!({ "api_key": key.key }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    // With keys, what /readyz tells is only that it is ready; /openapi.json needs a key.
    let (status, ready) = server.get("/readyz").await;
    assert_eq!(status, 200);
    assert_eq!(ready, json!({"status": "ready"}));
    let (status, _) = server.get("/openapi.json").await;
    assert_eq!(status, 401);
}

/// Behind a reverse proxy every client arrives from the proxy's address. With the proxy trusted
/// (`agentry serve --trusted-proxy`), failed logins count against the client it names in
/// `X-Forwarded-For`, so one client's guesses lock no one else behind it out; a peer that is
/// not trusted is counted as itself, whatever header it forges (the second security review's
/// N10, behind a proxy).
#[tokio::test]
async fn behind_a_trusted_proxy_failed_logins_count_per_forwarded_client() {
    let server = start_with(super::support::host_commands, |state| {
        std::sync::Arc::make_mut(&mut state.access).trusted_proxies =
            vec!["127.0.0.1".parse().unwrap()];
    })
    .await;
    let key = create_key(&server.state.app.parts().store, "console")
        .await
        .unwrap();
    server.state.auth.refresh();
    let login = |http: &reqwest::Client, api_key: &str, forwarded: &str| {
        http.post(format!("{}/v1/auth/login", server.url))
            .header("x-forwarded-for", forwarded)
            .json(&json!({ "api_key": api_key }))
            .send()
    };
    let status = |response: reqwest::Response| response.status().as_u16();
    let wrong = "agk_000000000000_wrong";
    for _ in 0..10 {
        let response = login(&server.http, wrong, "203.0.113.5").await.unwrap();
        assert_eq!(status(response), 401);
    }
    let response = login(&server.http, &key.key, "203.0.113.5").await.unwrap();
    assert_eq!(status(response), 429, "that client waits");
    // Another client behind the same proxy logs in.
    let response = login(&server.http, &key.key, "198.51.100.7, 203.0.113.9")
        .await
        .unwrap();
    assert_eq!(
        status(response),
        204,
        "a client behind the proxy is not held back"
    );
    // A peer that is no trusted proxy cannot dodge its count by naming other clients.
    let untrusted = reqwest::Client::builder()
        .local_address(std::net::IpAddr::from([127, 0, 0, 2]))
        .build()
        .unwrap();
    for n in 0..10 {
        let response = login(&untrusted, wrong, &format!("192.0.2.{n}"))
            .await
            .unwrap();
        assert_eq!(status(response), 401);
    }
    let response = login(&untrusted, &key.key, "192.0.2.99").await.unwrap();
    assert_eq!(status(response), 429, "a forged header changes nothing");
}

#[tokio::test]
async fn another_keys_responses_and_a2a_tasks_are_not_found() {
    let server = start().await;
    let (admin, user, other) = with_keys(&server, KeyLimits::default()).await;
    let (status, body) = as_key(
        &server,
        &admin,
        "POST",
        "/v1/agents",
        json!({"id": "public", "model_id": "mock", "a2a": {}}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("kept")));
    let (status, mine) = as_key(
        &server,
        &user,
        "POST",
        "/openai/v1/responses",
        json!({"model": "mock", "input": "remember this"}),
    )
    .await;
    assert_eq!(status, 200, "{mine}");
    let id = mine["id"].as_str().unwrap().to_owned();
    // Another key can neither read it nor continue it; an unknown id is as unknown.
    let (status, answer) = as_key(
        &server,
        &other,
        "GET",
        &format!("/openai/v1/responses/{id}"),
        json!({}),
    )
    .await;
    assert_eq!(status, 404, "{answer}");
    assert_eq!(answer["error"]["type"], "invalid_request_error", "{answer}");
    for previous in [id.as_str(), "resp_01a2b3c4-0000-7000-8000-000000000000"] {
        let (status, answer) = as_key(
            &server,
            &other,
            "POST",
            "/openai/v1/responses",
            json!({"model": "mock", "input": "and?", "previous_response_id": previous}),
        )
        .await;
        assert_eq!(status, 404, "{previous}: {answer}");
        assert_eq!(answer["error"]["param"], "previous_response_id", "{answer}");
    }
    // An A2A task is its sender's.
    let (status, sent) = as_key(
        &server,
        &user,
        "POST",
        "/a2a/public",
        json!({"jsonrpc": "2.0", "id": 1, "method": "message/send", "params": {
            "message": {"kind": "message", "role": "user", "messageId": "m-1",
                        "parts": [{"kind": "text", "text": "hello"}]},
            "configuration": {"blocking": false}}}),
    )
    .await;
    assert_eq!(status, 200, "{sent}");
    let task = sent["result"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{sent}"));
    let get = json!({"jsonrpc": "2.0", "id": 2, "method": "tasks/get", "params": {"id": task}});
    let (_, seen) = as_key(&server, &user, "POST", "/a2a/public", get.clone()).await;
    assert_eq!(seen["result"]["id"], task, "{seen}");
    let (_, hidden) = as_key(&server, &other, "POST", "/a2a/public", get).await;
    assert_eq!(hidden["error"]["code"], -32001, "{hidden}");
    let cancel =
        json!({"jsonrpc": "2.0", "id": 3, "method": "tasks/cancel", "params": {"id": task}});
    let (_, refused) = as_key(&server, &other, "POST", "/a2a/public", cancel).await;
    assert_eq!(refused["error"]["code"], -32001, "{refused}");
    // A key lists its own tasks only (A2A 1.0's `ListTasks`).
    let list = json!({"jsonrpc": "2.0", "id": 4, "method": "ListTasks", "params": {}});
    let (_, mine) = as_key(&server, &user, "POST", "/a2a/public", list.clone()).await;
    assert_eq!(mine["result"]["totalSize"], 1, "{mine}");
    assert_eq!(mine["result"]["tasks"][0]["id"], task, "{mine}");
    let (_, theirs) = as_key(&server, &other, "POST", "/a2a/public", list).await;
    assert_eq!(theirs["result"]["totalSize"], 0, "{theirs}");
    assert_eq!(theirs["result"]["tasks"], json!([]), "{theirs}");
    // Without a key, nothing at all.
    let (status, _) = send(
        &server,
        "GET",
        "/a2a/public/.well-known/agent-card.json",
        &json!({}),
        &[],
    )
    .await;
    assert_eq!(status, 401);
}

/// Forwards `method path` for `caller` with `headers` through the relay to a listener standing
/// in for another node (it answers 204): the request's head as that node received it.
async fn forwarded_head(
    server: &Server,
    caller: &agentry_app::auth::Principal,
    method: reqwest::Method,
    path: &str,
    headers: &reqwest::header::HeaderMap,
) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let node = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut buffer = [0u8; 4096];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let read = socket.read(&mut buffer).await.unwrap();
            assert!(read > 0, "the connection closed before the request's head");
            head.extend_from_slice(&buffer[..read]);
        }
        socket
            .write_all(b"HTTP/1.1 204 No Content\r\ncontent-length: 0\r\n\r\n")
            .await
            .unwrap();
        String::from_utf8_lossy(&head).into_owned()
    });
    // An advertised address with its scheme, as `--advertise-addr http(s)://…` gives it.
    let answer = agentry_server::relay::forward(
        &server.state,
        caller,
        &format!("http://{address}"),
        method,
        path,
        headers,
        Vec::new(),
    )
    .await
    .unwrap();
    assert_eq!(answer.status(), 204);
    node.await.unwrap()
}

/// The value of header `name` in a request's head.
fn header_in(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (field, value) = line.split_once(':')?;
        field
            .eq_ignore_ascii_case(name)
            .then(|| value.trim().to_owned())
    })
}

/// Security review 2, N15: a request forwarded to the node running a run carries a short-lived
/// assertion signed with the cluster's key, never the client's key or cookie; the assertion
/// holds for that one request (method, path and query) only, and not once the key is revoked.
#[tokio::test]
async fn a_relayed_request_carries_an_assertion_never_the_clients_credentials() {
    let server = start().await;
    let (_admin, user, _other) = with_keys(&server, KeyLimits::default()).await;
    let caller = server.state.auth.verify_key(&user).await.unwrap().unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {user}").parse().unwrap());
    headers.insert(
        "cookie",
        "agentry_session=0123456789abcdef".parse().unwrap(),
    );
    headers.insert("last-event-id", "7".parse().unwrap());
    let head = forwarded_head(
        &server,
        &caller,
        reqwest::Method::GET,
        "/v1/sessions",
        &headers,
    )
    .await;
    assert!(head.starts_with("GET /v1/sessions HTTP/1.1\r\n"), "{head}");
    assert_eq!(header_in(&head, "authorization"), None, "{head}");
    assert_eq!(header_in(&head, "cookie"), None, "{head}");
    assert!(!head.contains(&user), "{head}");
    assert_eq!(header_in(&head, "last-event-id").as_deref(), Some("7"));
    assert!(header_in(&head, "x-agentry-relayed-by").is_some(), "{head}");
    let assertion = header_in(&head, "x-agentry-relay-assertion").expect("an assertion");

    // Presented to a node (here the same server, which shares its key), it is the user key,
    // for that request only.
    let vouched = [("x-agentry-relay-assertion", assertion.as_str())];
    let (status, body) = send(&server, "GET", "/v1/sessions", &json!({}), &vouched).await;
    assert_eq!(status, 200, "{body}");
    for (method, path, why) in [
        ("GET", "/v1/sessions?limit=1", "another query"),
        ("GET", "/v1/api-keys", "another path"),
        ("DELETE", "/v1/sessions", "another method"),
    ] {
        let (status, _) = send(&server, method, path, &json!({}), &vouched).await;
        assert_eq!(status, 401, "{why}");
    }
    // Made for an admin-only route, it is still the user key: 403.
    let head = forwarded_head(
        &server,
        &caller,
        reqwest::Method::GET,
        "/v1/api-keys",
        &headers,
    )
    .await;
    let for_keys = header_in(&head, "x-agentry-relay-assertion").unwrap();
    let (status, body) = send(
        &server,
        "GET",
        "/v1/api-keys",
        &json!({}),
        &[("x-agentry-relay-assertion", for_keys.as_str())],
    )
    .await;
    assert_eq!(status, 403, "{body}");
    // Forged: a changed signature, or a later expiry under the old signature.
    let mut fields: Vec<String> = assertion.split(';').map(str::to_owned).collect();
    let mut forged = fields.clone();
    let first = if forged[3].starts_with('A') { "B" } else { "A" };
    forged[3].replace_range(..1, first);
    fields[2] = (fields[2].parse::<u64>().unwrap() + 1000).to_string();
    for (changed, why) in [
        (forged.join(";"), "a changed signature"),
        (fields.join(";"), "a moved expiry"),
    ] {
        let (status, _) = send(
            &server,
            "GET",
            "/v1/sessions",
            &json!({}),
            &[("x-agentry-relay-assertion", changed.as_str())],
        )
        .await;
        assert_eq!(status, 401, "{why}");
    }
    agentry_app::auth::revoke_key(
        &server.state.app.parts().store,
        caller.key_id.as_deref().unwrap(),
    )
    .await
    .unwrap();
    server.state.auth.refresh();
    let (status, _) = send(&server, "GET", "/v1/sessions", &json!({}), &vouched).await;
    assert_eq!(status, 401, "a revoked key");
}
