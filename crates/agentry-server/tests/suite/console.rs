//! The web console as served by the binary (`/`, `/console/…`: embedded, typed, cached,
//! under a strict CSP, open without a key) and the API-key routes its settings page uses.

use reqwest::StatusCode;
use serde_json::{Value, json};

use super::support::{Server, start};

/// A request carrying `key`.
async fn keyed(
    server: &Server,
    method: reqwest::Method,
    path: &str,
    key: &str,
    body: Option<serde_json::Value>,
) -> reqwest::Response {
    let mut request = server
        .http
        .request(method, format!("{}{path}", server.url))
        .bearer_auth(key);
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn the_page_and_every_asset_it_references_are_served_embedded() {
    let server = start().await;
    let page = server
        .http
        .get(format!("{}/", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let headers = page.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert!(
        csp.contains("script-src 'self'") && !csp.contains("unsafe"),
        "{csp}"
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["x-frame-options"], "DENY");
    let html = page.text().await.unwrap();
    // `<style>` elements need the page's nonce: in the CSP and the page, fresh per response.
    let nonce = csp
        .split("'nonce-")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .unwrap()
        .to_owned();
    assert!(nonce.len() >= 24, "{csp}");
    assert!(
        html.contains(&format!("<meta name=\"csp-nonce\" content=\"{nonce}\">")),
        "{html}"
    );
    let again = server
        .http
        .get(format!("{}/", server.url))
        .send()
        .await
        .unwrap();
    let policy = again.headers()["content-security-policy"].to_str().unwrap();
    assert!(!policy.contains(&nonce), "{policy}");

    // Every file the page and its modules name is embedded and served with its type.
    let mut referenced: Vec<String> = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        for piece in html.split(attribute).skip(1) {
            let path = piece.split('"').next().unwrap();
            if path.starts_with("/console/") {
                referenced.push(path.to_owned());
            }
        }
    }
    assert!(
        referenced.iter().any(|p| p.ends_with("app.js")),
        "{referenced:?}"
    );
    let mut seen = std::collections::BTreeSet::new();
    while let Some(path) = referenced.pop() {
        if !seen.insert(path.clone()) {
            continue;
        }
        let response = server
            .http
            .get(format!("{}{path}", server.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let kind = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_owned();
        let expected = match path.rsplit('.').next().unwrap() {
            "js" | "mjs" => "text/javascript; charset=utf-8",
            "css" => "text/css; charset=utf-8",
            "svg" => "image/svg+xml",
            other => panic!("unexpected asset type {other}"),
        };
        assert_eq!(kind, expected, "{path}");
        let body = response.text().await.unwrap();
        assert!(!body.trim().is_empty(), "{path} is empty");
        // Modules import their siblings (`from "./x.js"`) and vendored modules
        // (`from "../vendor/…"`).
        for piece in body.split("from \"./").skip(1) {
            let name = piece.split('"').next().unwrap();
            referenced.push(format!("/console/js/{name}"));
        }
        for piece in body.split("from \"../").skip(1) {
            let name = piece.split('"').next().unwrap();
            referenced.push(format!("/console/{name}"));
        }
    }
    let embedded: Vec<&str> = agentry_server::console::asset_paths().collect();
    for path in &seen {
        assert!(
            embedded.contains(&path.trim_start_matches("/console/")),
            "{path}"
        );
    }
    assert!(seen.len() >= 9, "{seen:?}");
}

#[tokio::test]
async fn assets_revalidate_by_etag_and_unknown_files_are_404() {
    let server = start().await;
    let url = format!("{}/console/js/app.js", server.url);
    let first = server.http.get(&url).send().await.unwrap();
    let etag = first.headers()["etag"].to_str().unwrap().to_owned();
    assert_eq!(first.headers()["cache-control"], "no-cache");
    let again = server
        .http
        .get(&url)
        .header("if-none-match", &etag)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(again.headers()["etag"].to_str().unwrap(), etag);
    for missing in ["/console/js/nope.js", "/console/../Cargo.toml", "/console/"] {
        let response = server
            .http
            .get(format!("{}{missing}", server.url))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{missing}");
    }
}

#[tokio::test]
async fn api_keys_are_created_once_listed_without_secrets_and_revoked() {
    let server = start().await;
    let (status, empty) = server.get("/v1/api-keys").await;
    assert_eq!(status, 200);
    assert_eq!(empty, json!({"keys": [], "auth_enabled": false}));

    let (status, created) = server.post("/v1/api-keys", json!({"label": "ci"})).await;
    assert_eq!(status, 201, "{created}");
    let key = created["key"].as_str().unwrap().to_owned();
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(key.starts_with(&format!("agk_{id}_")), "{key}");

    // Auth is on now: the API needs the key, the console page does not.
    let (status, _) = server.get("/v1/api-keys").await;
    assert_eq!(status, 401);
    let page = server
        .http
        .get(format!("{}/", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let listed: serde_json::Value =
        keyed(&server, reqwest::Method::GET, "/v1/api-keys", &key, None)
            .await
            .json()
            .await
            .unwrap();
    assert_eq!(listed["auth_enabled"], true);
    assert_eq!(listed["keys"][0]["id"], id.as_str());
    assert_eq!(listed["keys"][0]["label"], "ci");
    assert!(!listed.to_string().contains(&key), "{listed}");

    // Bad input: a long label, an unknown field, a malformed id, an unknown one.
    for body in [
        json!({"label": "x".repeat(201)}),
        json!({"label": "x", "admin": true}),
    ] {
        let bad = keyed(
            &server,
            reqwest::Method::POST,
            "/v1/api-keys",
            &key,
            Some(body),
        )
        .await;
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
    }
    for (path, expected) in [
        ("/v1/api-keys/not-hex", StatusCode::BAD_REQUEST),
        ("/v1/api-keys/0123456789ab", StatusCode::NOT_FOUND),
    ] {
        let response = keyed(&server, reqwest::Method::DELETE, path, &key, None).await;
        assert_eq!(response.status(), expected, "{path}");
    }

    // The last active admin key cannot be revoked over the API: that would lock everyone out
    // (and, before, turned authentication off).
    let path = format!("/v1/api-keys/{id}");
    let refused = keyed(&server, reqwest::Method::DELETE, &path, &key, None).await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    // Another key, revoked: it stops working at once, and authentication stays on.
    let second = keyed(
        &server,
        reqwest::Method::POST,
        "/v1/api-keys",
        &key,
        Some(json!({"label": "second"})),
    )
    .await;
    assert_eq!(second.status(), StatusCode::CREATED);
    let second: Value = second.json().await.unwrap();
    assert_eq!(second["role"], "user");
    let second_key = second["key"].as_str().unwrap().to_owned();
    let second_path = format!("/v1/api-keys/{}", second["id"].as_str().unwrap());
    let revoked = keyed(&server, reqwest::Method::DELETE, &second_path, &key, None).await;
    assert_eq!(revoked.status(), StatusCode::NO_CONTENT);
    let refused = keyed(
        &server,
        reqwest::Method::GET,
        "/v1/sessions",
        &second_key,
        None,
    )
    .await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    let (status, _) = server.get("/v1/api-keys").await;
    assert_eq!(status, 401);
    let after: Value = keyed(&server, reqwest::Method::GET, "/v1/api-keys", &key, None)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(after["auth_enabled"], true);
    assert_eq!(after["keys"][0]["revoked"], true, "{after}");
}

#[tokio::test]
async fn session_events_carry_their_commit_time() {
    let server = start().await;
    server.mock.enqueue(agentry_testkit::Reply::scripted(
        agentry_testkit::ScriptedTurn::text("Hi."),
    ));
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "Hello"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let session = body["session_id"].as_str().unwrap();
    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let events = events["events"].as_array().unwrap();
    assert!(events.len() >= 4);
    let mut last = before;
    for event in events {
        let at = event["at"].as_u64().unwrap();
        assert!(at >= last, "{event}");
        last = at;
    }
}
