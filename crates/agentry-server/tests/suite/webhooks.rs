//! Webhooks: a real HTTP receiver in the test gets the run's outcome, signed the Standard
//! Webhooks way; a receiver failing twice gets the same delivery id a third time; a restart in
//! between keeps the one delivery id; bad URLs are refused with nothing stored.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agentry_app::queue::QueueSettings;
use agentry_app::queue::WebhookSettings;
use agentry_app::standard_webhooks::sign;
use agentry_testkit::{Reply, ScriptedTurn};
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::support::{Server, host_commands, start_with};

/// What the receiver got: (webhook-id, webhook-timestamp, webhook-signature, body).
type Received = Arc<Mutex<Vec<(String, String, String, String)>>>;

/// A receiver on loopback answering `statuses` in turn (then 200).
async fn receiver(statuses: Vec<u16>) -> (String, Received) {
    let received: Received = Arc::default();
    let answers = Arc::new(Mutex::new(statuses.into_iter()));
    let log = received.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: Bytes| {
            let log = log.clone();
            let answers = answers.clone();
            async move {
                let header = |name: &str| {
                    headers
                        .get(name)
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default()
                };
                log.lock().unwrap().push((
                    header("webhook-id"),
                    header("webhook-timestamp"),
                    header("webhook-signature"),
                    String::from_utf8(body.to_vec()).unwrap(),
                ));
                let status = answers.lock().unwrap().next().unwrap_or(200);
                StatusCode::from_u16(status).unwrap()
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, received)
}

fn settings(allow_private: bool) -> QueueSettings {
    QueueSettings {
        poll: Duration::from_millis(50),
        webhooks: WebhookSettings {
            allow_private,
            backoff: Duration::from_millis(100),
            ..WebhookSettings::default()
        },
        ..QueueSettings::default()
    }
}

async fn start(allow_private: bool) -> Server {
    let server = start_with(host_commands, |_| {}).await;
    server.state.app.set_queue_settings(settings(allow_private));
    server.state.app.start_worker();
    server
}

async fn secret(server: &Server) -> String {
    let (status, body) = server.post("/v1/webhook-secret", json!({})).await;
    assert_eq!(status, 201, "{body}");
    let secret = body["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    secret
}

async fn until(check: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !check() {
        assert!(std::time::Instant::now() < deadline, "timed out");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn a_signed_webhook_is_retried_until_the_receiver_takes_it() {
    let server = start(true).await;
    let secret = secret(&server).await;
    let (url, received) = receiver(vec![500, 503]).await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("hooked")));
    let (status, run) = server
        .post(
            "/v1/runs",
            json!({"text": "x", "model_id": "mock", "webhook_url": url}),
        )
        .await;
    assert_eq!(status, 202, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    until(|| received.lock().unwrap().len() >= 3).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "two failures, then delivered: {got:#?}");
    let ids: std::collections::BTreeSet<&str> = got.iter().map(|g| g.0.as_str()).collect();
    assert_eq!(ids.len(), 1, "one delivery id for every attempt");
    for (id, timestamp, signature, body) in &got {
        let expected = sign(&secret, id, timestamp.parse().unwrap(), body).unwrap();
        assert_eq!(signature, &expected, "the signature verifies");
        let body: Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["type"], "run.succeeded");
        assert_eq!(body["data"]["run_id"], run_id.as_str());
        assert_eq!(body["data"]["outcome"]["text"], "hooked");
    }
    // A wrong secret does not verify.
    let (id, timestamp, signature, body) = &got[0];
    let other = "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    assert_ne!(
        signature,
        &sign(other, id, timestamp.parse().unwrap(), body).unwrap()
    );

    let (status, log) = server.get(&format!("/v1/runs/{run_id}/webhooks")).await;
    assert_eq!(status, 200, "{log}");
    let delivery = &log["deliveries"][0];
    assert_eq!(delivery["state"], "delivered", "{log}");
    assert_eq!(delivery["attempts"], 3);
    assert_eq!(delivery["id"], got[0].0.as_str());
    let statuses: Vec<Value> = delivery["log"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].clone())
        .collect();
    assert_eq!(statuses, vec![json!(500), json!(503), json!(200)]);
}

#[tokio::test]
async fn a_restart_between_attempts_keeps_the_one_delivery_id() {
    let server = start_with(host_commands, |_| {}).await;
    server.state.app.set_queue_settings(QueueSettings {
        webhooks: WebhookSettings {
            allow_private: true,
            backoff: Duration::from_millis(600),
            ..WebhookSettings::default()
        },
        ..settings(true)
    });
    server.state.app.start_worker();
    secret(&server).await;
    let (url, received) = receiver(vec![500]).await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("restart")));
    let (_, run) = server
        .post(
            "/v1/runs",
            json!({"text": "x", "model_id": "mock", "webhook_url": url}),
        )
        .await;
    until(|| !received.lock().unwrap().is_empty()).await;
    // The process stops after the first (failed) attempt; another starts on the same data.
    server.state.app.parts().shutdown.cancel();
    let store = agentry_store::Store::open_home(server.home.path())
        .await
        .unwrap();
    let next = agentry_app::App::with_tools(store, host_commands(server.home.path()))
        .await
        .unwrap();
    next.set_queue_settings(settings(true));
    next.start_worker();
    until(|| received.lock().unwrap().len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got = received.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "{got:#?}");
    assert_eq!(got[0].0, got[1].0, "the same delivery id after the restart");
    let run_id: agentry_types::RunId = run["run_id"].as_str().unwrap().parse().unwrap();
    let log = next.run_webhooks(run_id).await.unwrap();
    assert_eq!(log.deliveries.len(), 1);
    assert_eq!(log.deliveries[0].state, "delivered");
    assert_eq!(log.deliveries[0].attempts, 2);
}

#[tokio::test]
async fn bad_webhook_urls_are_refused_and_nothing_is_stored() {
    let server = start(false).await;
    let body = |url: &str| json!({"text": "x", "model_id": "mock", "webhook_url": url});
    // No secret yet.
    let (status, answer) = server
        .post("/v1/runs", body("https://example.com/hook"))
        .await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("webhook-secret")
    );
    secret(&server).await;
    for url in [
        "ftp://example.com/hook",
        "not a url",
        "http://user:pw@example.com/hook",
        "http://127.0.0.1:9/hook",
        "http://10.1.2.3/hook",
        "http://[::1]/hook",
        "http://localhost/hook",
        "http://169.254.169.254/latest/meta-data",
    ] {
        let (status, answer) = server.post("/v1/runs", body(url)).await;
        assert_eq!(status, 400, "{url}: {answer}");
    }
    // Not for a run the client waits for.
    let (status, answer) = server
        .post("/v1/infer", body("https://example.com/hook"))
        .await;
    assert_eq!(status, 400, "{answer}");
    let (_, listed) = server.get("/v1/runs").await;
    assert_eq!(listed["runs"], json!([]));
    let (_, sessions) = server.get("/v1/sessions").await;
    assert_eq!(sessions["sessions"], json!([]));
}

#[tokio::test]
async fn a_run_that_waits_for_a_person_is_told_twice_waiting_then_its_end() {
    let server = start(true).await;
    secret(&server).await;
    let (url, received) = receiver(vec![]).await;
    server.add_echo_tool().await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "echo",
        json!({"text": "hi"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("approved and done")));
    let (_, run) = server
        .post(
            "/v1/runs",
            json!({"text": "echo", "model_id": "mock", "tool_ids": ["echo"], "webhook_url": url,
                   "approvals": {"tools": {"echo": "always"}}}),
        )
        .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    until(|| !received.lock().unwrap().is_empty()).await;
    let first: Value = serde_json::from_str(&received.lock().unwrap()[0].3).unwrap();
    assert_eq!(first["type"], "run.waiting", "{first}");
    let call_id = first["data"]["outcome"]["pending"][0]["call"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (status, decided) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals"),
            json!({"call_id": call_id, "decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    until(|| received.lock().unwrap().len() >= 2).await;
    let got = received.lock().unwrap().clone();
    let second: Value = serde_json::from_str(&got[1].3).unwrap();
    assert_eq!(second["type"], "run.succeeded", "{second}");
    assert_eq!(second["data"]["outcome"]["text"], "approved and done");
    assert_ne!(got[0].0, got[1].0, "one delivery id per event");
}

/// An agent's default webhook hears of its background runs that name none; a run's own
/// `webhook_url` goes first; a private default is refused when saved unless the server allows
/// private webhooks.
#[tokio::test]
async fn an_agents_default_webhook_hears_of_runs_that_name_none() {
    let strict = start(false).await;
    secret(&strict).await;
    let (url, _) = receiver(vec![]).await;
    let (status, body) = strict
        .post(
            "/v1/agents",
            json!({"id": "hooked", "model_id": "mock", "webhook_url": url}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("private"),
        "{body}"
    );
    let (status, body) = strict
        .post(
            "/v1/agents",
            json!({"id": "hooked", "model_id": "mock", "webhook_url": "ftp://example.com/x"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    let server = start(true).await;
    secret(&server).await;
    let (default_url, by_default) = receiver(vec![]).await;
    let (own_url, by_own) = receiver(vec![]).await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "hooked", "model_id": "mock", "webhook_url": default_url}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    for text in ["first", "second"] {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text(text)));
    }
    let (status, run) = server
        .post("/v1/runs", json!({"text": "x", "agent_id": "hooked"}))
        .await;
    assert_eq!(status, 202, "{run}");
    until(|| by_default.lock().unwrap().len() == 1).await;
    let (status, own) = server
        .post(
            "/v1/runs",
            json!({"text": "y", "agent_id": "hooked", "webhook_url": own_url}),
        )
        .await;
    assert_eq!(status, 202, "{own}");
    until(|| by_own.lock().unwrap().len() == 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let defaulted: Value = serde_json::from_str(&by_default.lock().unwrap()[0].3).unwrap();
    assert_eq!(defaulted["data"]["run_id"], run["run_id"]);
    assert_eq!(
        by_default.lock().unwrap().len(),
        1,
        "the run's own webhook went first"
    );
    let owned: Value = serde_json::from_str(&by_own.lock().unwrap()[0].3).unwrap();
    assert_eq!(owned["data"]["run_id"], own["run_id"]);
}

#[tokio::test]
async fn a_workflow_runs_end_is_told_to_its_webhook() {
    let server = start(true).await;
    let steps = json!([{"id": "pause", "kind": "wait", "seconds": 0}]);
    // No signing secret yet: a workflow with a webhook is refused, and so is a bad URL.
    let (url, received) = receiver(vec![500]).await;
    let (status, body) = server
        .post(
            "/v1/workflows",
            json!({"id": "told", "steps": steps, "webhook_url": url}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let secret = secret(&server).await;
    let (status, body) = server
        .post(
            "/v1/workflows",
            json!({"id": "told", "steps": steps, "webhook_url": "ftp://example.com/x"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("webhook_url"),
        "{body}"
    );
    let (status, body) = server
        .post(
            "/v1/workflows",
            json!({"id": "told", "steps": steps, "webhook_url": url}),
        )
        .await;
    assert_eq!(status, 201, "{body}");

    // A run with no webhook of its own: the workflow's hears its end (retried once, one id).
    let (status, run) = server
        .post("/v1/workflows/told/runs", json!({"input": {}}))
        .await;
    assert_eq!(status, 202, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    until(|| received.lock().unwrap().len() >= 2).await;
    let got = received.lock().unwrap().clone();
    assert_eq!(got[0].0, got[1].0, "one delivery id for every attempt");
    for (id, timestamp, signature, body) in &got {
        let expected = sign(&secret, id, timestamp.parse().unwrap(), body).unwrap();
        assert_eq!(signature, &expected, "the signature verifies");
        let body: Value = serde_json::from_str(body).unwrap();
        assert_eq!(body["type"], "workflow.succeeded", "{body}");
        assert_eq!(body["data"]["run_id"], run_id.as_str());
        assert_eq!(body["data"]["workflow_id"], "told");
        assert_eq!(body["data"]["state"], "succeeded");
        assert!(body["data"]["output"]["waited_until"].is_u64(), "{body}");
    }
    // The delivery is recorded once the receiver's answer is back, which can be after the
    // receiver has counted the request: read the log until its second attempt is in.
    let log_path = format!("/v1/workflow-runs/{run_id}/webhooks");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let log = loop {
        let (status, log) = server.get(&log_path).await;
        assert_eq!(status, 200, "{log}");
        if log["deliveries"][0]["attempts"] != 1 || std::time::Instant::now() >= deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(log["deliveries"].as_array().unwrap().len(), 1, "{log}");
    assert_eq!(log["deliveries"][0]["state"], "delivered", "{log}");
    assert_eq!(log["deliveries"][0]["attempts"], 2);

    // A run that names its own webhook: only that one hears of it.
    let (own, own_received) = receiver(vec![]).await;
    let (status, run) = server
        .post(
            "/v1/workflows/told/runs",
            json!({"input": {}, "webhook_url": own}),
        )
        .await;
    assert_eq!(status, 202, "{run}");
    until(|| own_received.lock().unwrap().len() == 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        received.lock().unwrap().len(),
        2,
        "the workflow's webhook heard nothing more"
    );
    let body: Value = serde_json::from_str(&own_received.lock().unwrap()[0].3).unwrap();
    assert_eq!(body["data"]["run_id"], run["run_id"]);
    let (status, body) = server
        .post(
            "/v1/workflows/told/runs",
            json!({"input": {}, "webhook_url": "not a url"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, _) = server
        .get(&format!(
            "/v1/workflow-runs/{}/webhooks",
            uuid::Uuid::new_v4()
        ))
        .await;
    assert_eq!(status, 404);
}

/// Webhook deliveries name the key whose run they tell of, and a key may sign its own with a
/// secret of its own, so one key cannot send deliveries that verify at another key's receiver;
/// the signing secrets are written only by their endpoint, never through `/v1/env` (the second
/// security review's N13).
#[tokio::test]
async fn each_key_signs_its_own_webhooks_and_payloads_name_it() {
    use agentry_app::auth::{KeyLimits, KeyRole, create_key, create_key_with};
    let server = start(true).await;
    let admin = create_key(&server.state.app.parts().store, "admin")
        .await
        .unwrap();
    let alice = create_key_with(
        &server.state.app.parts().store,
        "a",
        KeyRole::User,
        KeyLimits::default(),
    )
    .await
    .unwrap();
    server.state.auth.refresh();
    let call = |key: &str, method: reqwest::Method, path: &str, body: Value| {
        let request = server
            .http
            .request(method, format!("{}{path}", server.url))
            .bearer_auth(key)
            .json(&body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (status, body) = call(
        &admin.key,
        reqwest::Method::POST,
        "/v1/webhook-secret",
        json!({}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let server_secret = body["secret"].as_str().unwrap().to_owned();
    let (status, body) = call(
        &alice.key,
        reqwest::Method::POST,
        "/v1/webhook-secret",
        json!({}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let alices_secret = body["secret"].as_str().unwrap().to_owned();
    assert_ne!(alices_secret, server_secret);
    // Neither can be overwritten nor deleted as an ordinary secret.
    for name in [
        "AGENTRY_WEBHOOK_SECRET",
        &format!("AGENTRY_WEBHOOK_SECRET.{}", alice.id),
        "workflow-trigger.abc",
    ] {
        let (status, body) = call(
            &admin.key,
            reqwest::Method::POST,
            "/v1/env",
            json!({"name": name, "value": "whsec_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}),
        )
        .await;
        assert_eq!(status, 400, "{name}: {body}");
        assert_eq!(body["error"]["code"], "reserved_secret", "{body}");
        let (status, _) = call(
            &admin.key,
            reqwest::Method::DELETE,
            &format!("/v1/env/{name}"),
            json!({}),
        )
        .await;
        assert_ne!(status, 204, "{name}");
    }
    let (url, received) = receiver(vec![]).await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("hooked")));
    let (status, run) = call(
        &alice.key,
        reqwest::Method::POST,
        "/v1/runs",
        json!({"text": "x", "model_id": "mock", "webhook_url": url}),
    )
    .await;
    assert_eq!(status, 202, "{run}");
    until(|| !received.lock().unwrap().is_empty()).await;
    let (id, timestamp, signature, body) = received.lock().unwrap()[0].clone();
    let timestamp = timestamp.parse().unwrap();
    assert_eq!(
        signature,
        sign(&alices_secret, &id, timestamp, &body).unwrap()
    );
    assert_ne!(
        signature,
        sign(&server_secret, &id, timestamp, &body).unwrap()
    );
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["key_id"], alice.id.as_str(), "{body}");
}
