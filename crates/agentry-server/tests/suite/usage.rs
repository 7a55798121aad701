//! Usage and cost: every model call's tokens and cost land in the ledger with its event, the
//! report groups them by agent, model and day (a user key sees its own), and a budget stops
//! the runs it counts with `budget_exceeded`.

use agentry_app::auth::{KeyLimits, KeyRole, create_key, create_key_with};
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, start};

/// Registers `priced` (the mock at `input` and `output` dollars per million tokens) and the
/// agents `alpha` and `beta` on it.
async fn priced_agents(server: &Server, input: f64, output: f64) {
    let (_, mock) = server.get("/v1/models/mock").await;
    let model = json!({"id": "priced", "protocol": "openai", "base_url": mock["base_url"],
                       "model_name": "m", "labels": ["economy"],
                       "pricing": {"input": input, "output": output}});
    let (status, body) = server.post("/v1/models", model).await;
    assert_eq!(status, 201, "{body}");
    for agent in ["alpha", "beta"] {
        let (status, body) = server
            .post(
                "/v1/agents",
                json!({"id": agent, "model_id": "priced", "tool_ids": ["current_time"]}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
}

async fn run_as(server: &Server, agent: Option<&str>, turns: Vec<ScriptedTurn>) -> Value {
    for turn in turns {
        server.mock.enqueue(Reply::scripted(turn));
    }
    let mut body = json!({"session_id": "new", "text": "go"});
    if let Some(agent) = agent {
        body["agent_ids"] = json!([agent]);
    }
    let (status, answer) = server.post("/v1/infer", body).await;
    assert_eq!(status, 200, "{answer}");
    answer
}

fn close(actual: &Value, expected: f64) -> bool {
    actual
        .as_f64()
        .is_some_and(|v| (v - expected).abs() < 1e-12)
}

#[tokio::test]
async fn a_negative_price_is_refused_and_nothing_is_stored() {
    let server = start().await;
    for pricing in [
        json!({"input": 1.0, "output": -2.0}),
        json!({"input": 1.0, "output": 2.0, "cache_write": -0.5}),
        json!({"input": -0.1, "output": 2.0}),
    ] {
        let model = json!({"id": "bad-price", "protocol": "openai", "model_name": "m",
                           "pricing": pricing});
        let (status, body) = server.post("/v1/models", model).await;
        assert_eq!(status, 400, "{pricing}: {body}");
        assert!(body.to_string().contains("pricing"), "{body}");
        let (status, _) = server.get("/v1/models/bad-price").await;
        assert_eq!(status, 404, "{pricing}");
    }
}

#[tokio::test]
async fn usage_and_cost_are_recorded_per_call_and_grouped_by_agent_model_and_day() {
    let server = start().await;
    priced_agents(&server, 1.0, 2.0).await;
    let tool = || ScriptedTurn::tool_call("current_time", json!({})).with_usage(100, 10);
    // alpha: a two-round run and a one-round run; beta: one round; no agent, the unpriced
    // mock model: one round.
    let first = run_as(
        &server,
        Some("alpha"),
        vec![tool(), ScriptedTurn::text("t").with_usage(200, 20)],
    )
    .await;
    run_as(
        &server,
        Some("alpha"),
        vec![ScriptedTurn::text("a").with_usage(50, 5)],
    )
    .await;
    run_as(
        &server,
        Some("beta"),
        vec![ScriptedTurn::text("b").with_usage(1000, 100)],
    )
    .await;
    run_as(
        &server,
        None,
        vec![ScriptedTurn::text("c").with_usage(7, 3)],
    )
    .await;

    // The answer's event carries the model, the agent and the cost.
    let session = first["session_id"].as_str().unwrap();
    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let answers: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["type"] == "assistant_message")
        .collect();
    assert_eq!(answers.len(), 2, "{events}");
    let payload = &answers[0]["event"];
    assert_eq!(payload["model"], "priced", "{payload}");
    assert_eq!(payload["agent_id"], "alpha");
    assert!(
        close(&payload["cost_usd"], (100.0 + 20.0) / 1e6),
        "{payload}"
    );

    let (status, report) = server.get("/v1/usage?group_by=agent,day").await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["group_by"], json!(["agent", "day"]));
    let groups = report["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3, "{report}");
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    // Ordered by agent: the runs without one first.
    let (none, alpha, beta) = (&groups[0], &groups[1], &groups[2]);
    assert_eq!(none["agent"], Value::Null);
    assert_eq!(
        (none["calls"].as_u64(), none["unpriced_calls"].as_u64()),
        (Some(1), Some(1))
    );
    assert!(close(&none["cost_usd"], 0.0));
    assert_eq!(alpha["agent"], "alpha");
    assert_eq!(alpha["day"], today.as_str());
    assert_eq!(
        (alpha["runs"].as_u64(), alpha["calls"].as_u64()),
        (Some(2), Some(3))
    );
    assert_eq!(
        (
            alpha["input_tokens"].as_u64(),
            alpha["output_tokens"].as_u64()
        ),
        (Some(350), Some(35))
    );
    assert!(close(&alpha["cost_usd"], (350.0 + 70.0) / 1e6), "{alpha}");
    assert_eq!(beta["agent"], "beta");
    assert!(close(&beta["cost_usd"], (1000.0 + 200.0) / 1e6), "{beta}");
    let total = &report["total"];
    assert_eq!(
        (total["runs"].as_u64(), total["calls"].as_u64()),
        (Some(4), Some(5))
    );
    assert!(close(&total["cost_usd"], (420.0 + 1200.0) / 1e6), "{total}");

    // By model, for one agent, over an explicit range.
    let (_, by_model) = server
        .get(&format!(
            "/v1/usage?group_by=model&agent=alpha&from={today}"
        ))
        .await;
    assert_eq!(
        by_model["groups"].as_array().unwrap().len(),
        1,
        "{by_model}"
    );
    assert_eq!(by_model["groups"][0]["model"], "priced");
    // A range before any call is empty.
    let (_, empty) = server.get("/v1/usage?from=2020-01-01&to=2020-02-01").await;
    assert_eq!(empty["groups"], json!([]));
    assert_eq!(empty["total"]["calls"], 0);

    // Bad queries are typed errors.
    for query in [
        "group_by=colour",
        "group_by=day,day",
        "from=yesterday",
        "from=2026-02-01&to=2026-01-01",
        "session=not-an-id",
    ] {
        let (status, body) = server.get(&format!("/v1/usage?{query}")).await;
        assert_eq!(status, 400, "{query}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{query}");
    }
}

#[tokio::test]
async fn a_budget_stops_the_runs_it_counts_before_their_next_model_call() {
    let server = start().await;
    // A token costs a tenth of a cent.
    priced_agents(&server, 1000.0, 1000.0).await;
    for bad in [
        json!({"name": "b", "agent": "alpha", "key": "k", "limit_usd": 1}),
        json!({"name": "b", "limit_usd": 1}),
        json!({"name": "b", "agent": "alpha", "limit_usd": -1}),
        json!({"name": "b", "agent": "alpha", "limit_usd": 1, "period": "fortnight"}),
        json!({"name": "../b", "agent": "alpha", "limit_usd": 1}),
        json!({"name": "b", "agent": "alpha", "limit_usd": 1, "colour": "red"}),
    ] {
        let (status, body) = server.post("/v1/budgets", bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {body}");
    }
    let (_, listed) = server.get("/v1/budgets").await;
    assert_eq!(listed["budgets"], json!([]), "nothing was saved");
    let (status, created) = server
        .post(
            "/v1/budgets",
            json!({"name": "alpha-daily", "agent": "alpha", "limit_usd": 0.05, "period": "day"}),
        )
        .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["spent_usd"], 0.0);
    assert_eq!(created["exceeded"], false);

    // $0.04: under the limit.
    let first = run_as(
        &server,
        Some("alpha"),
        vec![ScriptedTurn::text("one").with_usage(40, 0)],
    )
    .await;
    assert_eq!(first["stop_reason"], "completed", "{first}");
    // The next run's first call takes it to $0.06; its second call is not made.
    let calls_before = server.mock.requests().len();
    let second = run_as(
        &server,
        Some("alpha"),
        vec![ScriptedTurn::tool_call("current_time", json!({})).with_usage(20, 0)],
    )
    .await;
    assert_eq!(second["stop_reason"], "budget_exceeded", "{second}");
    assert_eq!(server.mock.requests().len(), calls_before + 1);
    let note = second.to_string();
    assert!(note.contains("alpha-daily"), "{second}");
    // A third run stops before any call; beta has no budget and goes on.
    let third = run_as(&server, Some("alpha"), Vec::new()).await;
    assert_eq!(third["stop_reason"], "budget_exceeded", "{third}");
    assert_eq!(server.mock.requests().len(), calls_before + 1);
    let other = run_as(
        &server,
        Some("beta"),
        vec![ScriptedTurn::text("b").with_usage(10, 0)],
    )
    .await;
    assert_eq!(other["stop_reason"], "completed");

    let (_, budget) = server.get("/v1/budgets/alpha-daily").await;
    assert!(close(&budget["spent_usd"], 0.06), "{budget}");
    assert_eq!(budget["exceeded"], true);
    // A raised limit lets alpha run again.
    let response = server
        .http
        .put(format!("{}/v1/budgets/alpha-daily", server.url))
        .json(&json!({"name": "alpha-daily", "agent": "alpha", "limit_usd": 1, "period": "day"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let again = run_as(&server, Some("alpha"), vec![ScriptedTurn::text("ok")]).await;
    assert_eq!(again["stop_reason"], "completed", "{again}");
    let (status, _) = server
        .raw(reqwest::Method::DELETE, "/v1/budgets/alpha-daily", "")
        .await;
    assert_eq!(status, 204);
    let (status, _) = server.get("/v1/budgets/alpha-daily").await;
    assert_eq!(status, 404);
}

async fn as_key(server: &Server, key: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let url = format!("{}{path}", server.url);
    let request = match body {
        Some(body) => server.http.post(url).json(&body),
        None => server.http.get(url),
    };
    let response = request.bearer_auth(key).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_key_budget_stops_that_key_and_a_user_key_sees_only_its_own_usage() {
    let server = start().await;
    priced_agents(&server, 1000.0, 1000.0).await;
    let admin = create_key(&server.state.app.parts().store, "admin")
        .await
        .unwrap();
    let user = create_key_with(
        &server.state.app.parts().store,
        "user",
        KeyRole::User,
        KeyLimits::default(),
    )
    .await
    .unwrap();
    server.state.auth.refresh();
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("a").with_usage(30, 0)));
    let (status, body) = as_key(
        &server,
        &admin.key,
        "/v1/infer",
        // Named by its label: priced and recorded as the model it labels.
        Some(json!({"session_id": "new", "text": "go", "model_id": "economy"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("u").with_usage(20, 0)));
    let (status, body) = as_key(
        &server,
        &user.key,
        "/v1/infer",
        Some(json!({"session_id": "new", "text": "go", "model_id": "priced"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");

    // The user key's report holds its own call only; an admin's holds both, by key.
    let (status, mine) = as_key(&server, &user.key, "/v1/usage?group_by=key", None).await;
    assert_eq!(status, 200, "{mine}");
    assert_eq!(mine["groups"].as_array().unwrap().len(), 1, "{mine}");
    assert_eq!(mine["groups"][0]["key"], user.id.as_str());
    assert!(close(&mine["total"]["cost_usd"], 0.02), "{mine}");
    let (_, everyone) = as_key(&server, &admin.key, "/v1/usage?group_by=key", None).await;
    assert_eq!(
        everyone["groups"].as_array().unwrap().len(),
        2,
        "{everyone}"
    );
    let (_, models) = as_key(&server, &admin.key, "/v1/usage?group_by=model", None).await;
    assert_eq!(models["groups"].as_array().unwrap().len(), 1, "{models}");
    assert_eq!(models["groups"][0]["model"], "priced");
    assert!(close(&models["total"]["cost_usd"], 0.05), "{models}");
    // Budgets are the admin's.
    let (status, _) = as_key(&server, &user.key, "/v1/budgets", None).await;
    assert_eq!(status, 403);

    // A budget on the user key: its runs stop, the admin's go on.
    let (status, body) = as_key(
        &server,
        &admin.key,
        "/v1/budgets",
        Some(json!({"name": "user-cap", "key": user.id, "limit_usd": 0.01, "period": "month"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["exceeded"], true, "{body}");
    let (_, stopped) = as_key(
        &server,
        &user.key,
        "/v1/infer",
        Some(json!({"session_id": "new", "text": "more", "model_id": "priced"})),
    )
    .await;
    assert_eq!(stopped["stop_reason"], "budget_exceeded", "{stopped}");
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("fine")));
    let (_, fine) = as_key(
        &server,
        &admin.key,
        "/v1/infer",
        Some(json!({"session_id": "new", "text": "go", "model_id": "priced"})),
    )
    .await;
    assert_eq!(fine["stop_reason"], "completed", "{fine}");
}
