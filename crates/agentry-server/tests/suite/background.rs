//! Background runs on the run queue: submit (202 at once), wait, get, list, stream, cancel;
//! `Idempotency-Key`; back-pressure (429 with `Retry-After`, nothing stored); a run that waits
//! for approval and is decided later; 500 concurrent submissions, none lost, none run twice.

use std::collections::BTreeSet;
use std::time::Duration;

use agentry_app::queue::QueueSettings;
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, host_commands, start_with};

/// A server whose worker runs at most `max_concurrent` background runs and queues `max_queued`.
async fn start_queue(max_concurrent: usize, max_queued: u64) -> Server {
    let server = start_with(host_commands, |_| {}).await;
    server.state.app.set_queue_settings(QueueSettings {
        max_concurrent,
        max_queued,
        poll: Duration::from_millis(50),
        ..QueueSettings::default()
    });
    server.state.app.start_worker();
    server
}

/// POST /v1/runs with headers; (status, Retry-After, body).
async fn submit(server: &Server, body: Value, key: Option<&str>) -> (u16, Option<String>, Value) {
    let mut request = server
        .http
        .post(format!("{}/v1/runs", server.url))
        .json(&body);
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let retry = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    (status, retry, response.json().await.unwrap())
}

async fn wait(server: &Server, run_id: &str) -> Value {
    let (status, body) = server
        .get(&format!("/v1/runs/{run_id}/wait?timeout_secs=20"))
        .await;
    assert_eq!(status, 200, "{body}");
    body
}

#[tokio::test]
async fn a_background_run_answers_at_once_then_ends_and_is_listed() {
    let server = start_queue(4, 100).await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "done in the background",
    )));
    let (status, _, run) = submit(&server, json!({"text": "work", "model_id": "mock"}), None).await;
    assert_eq!(status, 202, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    assert!(
        matches!(run["state"].as_str(), Some("queued" | "running")),
        "{run}"
    );
    assert_eq!(run["stream"], format!("/v1/runs/{run_id}/stream"));

    let done = wait(&server, &run_id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 1);
    assert_eq!(done["outcome"]["text"], "done in the background");
    assert_eq!(done["outcome"]["run_id"], run_id.as_str());
    assert!(done["finished_at"].as_u64().is_some());

    // The run is the session's run, under the same id.
    let session = done["session_id"].as_str().unwrap();
    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let started: Vec<&Value> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["event"]["type"] == "run_started")
        .collect();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0]["event"]["run_id"], run_id.as_str());

    let (_, listed) = server.get("/v1/runs?state=succeeded").await;
    let ids: Vec<&str> = listed["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![run_id.as_str()]);
    let (_, none) = server.get("/v1/runs?state=queued").await;
    assert_eq!(none["runs"], json!([]));
    let (_, shown) = server.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(shown["state"], "succeeded");
    let (status, _) = server.get("/v1/runs?state=nonsense").await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn bad_submissions_are_refused_and_nothing_is_stored() {
    let server = start_queue(4, 100).await;
    for (body, why) in [
        (json!({"text": "x", "model_id": "nope"}), "unknown model"),
        (
            json!({"text": "x", "model_id": "mock", "tool_ids": ["nope"]}),
            "unknown tool",
        ),
        (
            json!({"text": "x", "model_id": "mock", "cancel_on_disconnect": true}),
            "disconnect",
        ),
        (
            json!({"text": "x", "model_id": "mock", "bogus": 1}),
            "unknown field",
        ),
        (json!({"text": "x", "agent_ids": ["a", "b"]}), "group"),
    ] {
        let (status, _, body) = submit(&server, body, None).await;
        assert!((400..500).contains(&status), "{why}: {status} {body}");
    }
    let (status, _) = server
        .post("/v1/runs?priority=500", json!({"text": "x"}))
        .await;
    assert_eq!(status, 400);
    let (_, listed) = server.get("/v1/runs").await;
    assert_eq!(listed["runs"], json!([]));
    let (_, sessions) = server.get("/v1/sessions").await;
    assert_eq!(
        sessions["sessions"],
        json!([]),
        "no session was made for a refused run"
    );
}

#[tokio::test]
async fn an_idempotency_key_returns_the_same_run_and_refuses_another_body() {
    let server = start_queue(4, 100).await;
    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::text("once")));
    let body = json!({"text": "exactly once", "model_id": "mock"});
    let (status, _, first) = submit(&server, body.clone(), Some("order-42")).await;
    assert_eq!(status, 202, "{first}");
    let (status, _, again) = submit(&server, body.clone(), Some("order-42")).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["run_id"], first["run_id"]);
    let (status, _, other) = submit(
        &server,
        json!({"text": "something else", "model_id": "mock"}),
        Some("order-42"),
    )
    .await;
    assert_eq!(status, 409, "{other}");
    wait(&server, first["run_id"].as_str().unwrap()).await;
    let (_, listed) = server.get("/v1/runs").await;
    assert_eq!(listed["runs"].as_array().unwrap().len(), 1);
    let (_, sessions) = server.get("/v1/sessions").await;
    assert_eq!(sessions["sessions"].as_array().unwrap().len(), 1);
    assert_eq!(server.mock.request_count(), 1, "the model was called once");
}

#[tokio::test]
async fn a_full_queue_answers_429_with_retry_after_and_stores_nothing() {
    // One run at a time, one waiting: the third submission is refused.
    let server = start_queue(1, 1).await;
    server.mock.set_fallback(
        Reply::scripted(ScriptedTurn::text("slow")).delay_headers(Duration::from_millis(800)),
    );
    let body = json!({"text": "x", "model_id": "mock"});
    let (status, _, running) = submit(&server, body.clone(), None).await;
    assert_eq!(status, 202);
    // Let the worker claim the first, so the second waits in the queue.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, run) = server
            .get(&format!("/v1/runs/{}", running["run_id"].as_str().unwrap()))
            .await;
        if run["state"] != "queued" || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, _, queued) = submit(&server, body.clone(), None).await;
    assert_eq!(status, 202, "{queued}");
    let (status, retry, refused) = submit(&server, body.clone(), None).await;
    assert_eq!(status, 429, "{refused}");
    assert_eq!(refused["error"]["code"], "queue_full");
    assert_eq!(retry.as_deref(), Some("1"));
    let (_, listed) = server.get("/v1/runs").await;
    assert_eq!(
        listed["runs"].as_array().unwrap().len(),
        2,
        "nothing stored for the refused one"
    );
    let (_, sessions) = server.get("/v1/sessions").await;
    assert_eq!(sessions["sessions"].as_array().unwrap().len(), 2);
    for run in [&running, &queued] {
        let done = wait(&server, run["run_id"].as_str().unwrap()).await;
        assert_eq!(done["state"], "succeeded", "{done}");
    }
}

#[tokio::test]
async fn cancel_stops_a_queued_run_and_a_running_one() {
    let server = start_queue(1, 10).await;
    server.mock.set_fallback(
        Reply::scripted(ScriptedTurn::text("slow")).delay_headers(Duration::from_secs(3)),
    );
    let body = json!({"text": "x", "model_id": "mock"});
    let (_, _, first) = submit(&server, body.clone(), None).await;
    let (_, _, second) = submit(&server, body.clone(), None).await;
    let first_id = first["run_id"].as_str().unwrap();
    let second_id = second["run_id"].as_str().unwrap();
    // The second waits behind the first: cancelled at once, it never runs.
    let (status, cancelled) = server
        .post(&format!("/v1/runs/{second_id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200, "{cancelled}");
    assert_eq!(cancelled["state"], "cancelled");
    assert_eq!(cancelled["cancel_requested"], true);
    // The first is running (or about to): it stops at its next step.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, run) = server.get(&format!("/v1/runs/{first_id}")).await;
        if run["state"] == "running" || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (status, _) = server
        .post(&format!("/v1/runs/{first_id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200);
    let done = wait(&server, first_id).await;
    assert_eq!(done["state"], "cancelled", "{done}");
    assert_eq!(done["outcome"]["stop_reason"], "cancelled");
    let second_session = second["session_id"].as_str().unwrap();
    let (_, events) = server
        .get(&format!("/v1/sessions/{second_session}/events"))
        .await;
    assert_eq!(
        events["events"],
        json!([]),
        "the cancelled queued run never started"
    );
    let (status, _) = server
        .post(
            &format!("/v1/runs/{}/cancel", agentry_types::RunId::new()),
            json!({}),
        )
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn a_background_run_streams_its_events() {
    let server = start_queue(2, 10).await;
    server.mock.enqueue(
        Reply::scripted(ScriptedTurn::text("streamed reply"))
            .delay_headers(Duration::from_millis(300)),
    );
    let (_, _, run) = submit(&server, json!({"text": "x", "model_id": "mock"}), None).await;
    let run_id = run["run_id"].as_str().unwrap();
    let mut stream = server
        .sse(&format!("/v1/runs/{run_id}/stream"), None, None)
        .await;
    let events = stream.rest().await;
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert!(names.contains(&"run.started"), "{names:?}");
    assert_eq!(names.last(), Some(&"run.finished"), "{names:?}");
    let finished = events.last().unwrap();
    assert_eq!(finished.data["event"]["run_id"], run_id);
}

#[tokio::test]
async fn a_background_run_waiting_for_approval_goes_on_when_decided() {
    let server = start_queue(2, 10).await;
    server.add_echo_tool().await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "echo",
        json!({"text": "hi"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("echoed")));
    let (_, _, run) = submit(
        &server,
        json!({"text": "echo", "model_id": "mock", "tool_ids": ["echo"],
               "approvals": {"tools": {"echo": "always"}}}),
        None,
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap();
    let waiting = wait(&server, run_id).await;
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    let call_id = waiting["outcome"]["pending"][0]["call"]["id"]
        .as_str()
        .unwrap();
    let (status, decided) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals"),
            json!({"call_id": call_id, "decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let done = loop {
        let done = wait(&server, run_id).await;
        if done["state"] != "waiting" && done["state"] != "running"
            || std::time::Instant::now() > deadline
        {
            break done;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["outcome"]["text"], "echoed");
}

/// The first run listed by `query` (`GET /v1/runs?…`), waiting up to 10 s for one.
async fn first_listed(server: &Server, query: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (status, listed) = server.get(&format!("/v1/runs?{query}")).await;
        assert_eq!(status, 200, "{listed}");
        if let Some(run) = listed["runs"].as_array().and_then(|runs| runs.first()) {
            return run.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no run listed by {query}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn runs_started_in_their_sessions_have_records_too() {
    let server = start_queue(2, 10).await;
    server.add_echo_tool().await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "helper", "model_id": "mock", "tool_ids": ["echo"]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");

    // A conversation's run that waits for approval: recorded, `waiting`, then `succeeded`.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "echo",
        json!({"text": "hi"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("echoed")));
    let (status, answer) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "agent_id": "helper", "text": "echo",
                   "approvals": {"tools": {"echo": "always"}}}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    let run_id = answer["run_id"].as_str().unwrap().to_owned();
    let session = answer["session_id"].as_str().unwrap().to_owned();
    let (status, run) = server.get(&format!("/v1/runs/{run_id}")).await;
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["state"], "waiting", "{run}");
    assert_eq!(run["background"], false);
    assert_eq!(run["session_id"], session.as_str());
    assert_eq!(run["agent_id"], "helper");
    assert!(run["started_at"].as_u64().is_some(), "{run}");
    let call_id = answer["pending"][0]["call"]["id"].as_str().unwrap();
    let (status, decided) = server
        .post(
            &format!("/v1/runs/{run_id}/approvals"),
            json!({"call_id": call_id, "decision": "approve"}),
        )
        .await;
    assert_eq!(status, 200, "{decided}");
    let done = wait(&server, &run_id).await;
    let done = if done["state"] == "running" {
        wait(&server, &run_id).await
    } else {
        done
    };
    assert_eq!(done["state"], "succeeded", "{done}");
    assert!(done["finished_at"].as_u64().is_some(), "{done}");
    // Its outcome is read from the session's log.
    assert_eq!(done["outcome"]["text"], "echoed", "{done}");
    assert_eq!(done["outcome"]["run_id"], run_id.as_str());

    // Listed beside background runs, and told apart.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("queued answer")));
    let (_, _, queued) = submit(&server, json!({"text": "q", "model_id": "mock"}), None).await;
    let queued_id = queued["run_id"].as_str().unwrap().to_owned();
    assert_eq!(queued["background"], true);
    wait(&server, &queued_id).await;
    let ids = |listed: &Value| -> Vec<String> {
        listed["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|run| run["run_id"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, all) = server.get("/v1/runs").await;
    assert!(
        ids(&all).contains(&run_id) && ids(&all).contains(&queued_id),
        "{all}"
    );
    let (_, in_sessions) = server.get("/v1/runs?background=false").await;
    assert_eq!(ids(&in_sessions), vec![run_id.clone()]);
    let (_, background) = server.get("/v1/runs?background=true").await;
    assert_eq!(ids(&background), vec![queued_id]);
    let (status, bad) = server.get("/v1/runs?background=maybe").await;
    assert_eq!(status, 400, "{bad}");

    // A conversation's run cancelled through its record, while it runs.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("slow")).delay_headers(Duration::from_secs(5)));
    let infer = {
        let http = server.http.clone();
        let url = format!("{}/v1/infer", server.url);
        tokio::spawn(async move {
            http.post(url)
                .json(&json!({"session_id": session, "model_id": "mock", "text": "slowly"}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    let running = first_listed(&server, "background=false&state=running").await;
    let slow_id = running["run_id"].as_str().unwrap().to_owned();
    assert_ne!(slow_id, run_id);
    let (status, cancelled) = server
        .post(&format!("/v1/runs/{slow_id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200, "{cancelled}");
    let answer = infer.await.unwrap();
    assert_eq!(answer["stop_reason"], "cancelled", "{answer}");
    let ended = wait(&server, &slow_id).await;
    assert_eq!(ended["state"], "cancelled", "{ended}");
    assert_eq!(ended["outcome"]["stop_reason"], "cancelled", "{ended}");
}

#[tokio::test]
async fn five_hundred_concurrent_submissions_run_each_exactly_once() {
    let server = start_queue(32, 10_000).await;
    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::text("ok")));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..500 {
        let http = server.http.clone();
        let url = format!("{}/v1/runs", server.url);
        tasks.spawn(async move {
            let response = http
                .post(url)
                .json(&json!({"text": format!("task {i}"), "model_id": "mock"}))
                .send()
                .await
                .unwrap();
            assert_eq!(response.status().as_u16(), 202);
            let body: Value = response.json().await.unwrap();
            body["run_id"].as_str().unwrap().to_owned()
        });
    }
    let mut submitted = BTreeSet::new();
    while let Some(id) = tasks.join_next().await {
        assert!(submitted.insert(id.unwrap()));
    }
    assert_eq!(submitted.len(), 500);
    for id in &submitted {
        let done = wait(&server, id).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        assert_eq!(done["attempt"], 1, "{done}");
    }
    // Each ran exactly once: one model call per run, one run per session.
    assert_eq!(server.mock.request_count(), 500);
    let (_, listed) = server.get("/v1/runs?limit=1000&state=succeeded").await;
    assert_eq!(listed["runs"].as_array().unwrap().len(), 500);
}

#[tokio::test]
async fn an_agents_limit_runs_its_background_runs_one_at_a_time() {
    let server = start_queue(8, 100).await;
    let (status, agent) = server
        .post(
            "/v1/agents",
            json!({"id": "single", "model_id": "mock", "limits": {"max_concurrent_runs": 1}}),
        )
        .await;
    assert_eq!(status, 201, "{agent}");
    server.mock.set_fallback(
        Reply::scripted(ScriptedTurn::text("one at a time"))
            .delay_headers(Duration::from_millis(300)),
    );
    let mut ids = Vec::new();
    for i in 0..3 {
        let (status, _, run) = submit(
            &server,
            json!({"text": format!("job {i}"), "agent_id": "single"}),
            None,
        )
        .await;
        assert_eq!(status, 202, "{run}");
        ids.push(run["run_id"].as_str().unwrap().to_owned());
    }
    let mut most = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (_, running) = server.get("/v1/runs?state=running").await;
        most = most.max(running["runs"].as_array().unwrap().len());
        let (_, done) = server.get("/v1/runs?state=succeeded").await;
        if done["runs"].as_array().unwrap().len() == 3 || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    assert_eq!(most, 1, "never more than one run of the agent at once");
    for id in &ids {
        assert_eq!(wait(&server, id).await["state"], "succeeded");
    }
}

/// Start-up recovery resumes a run a stop left in flight, but not a background run that is
/// `running` in the queue: another node may hold its lease, and resuming it here would
/// interleave two drivers in one session. The queue's worker resumes it, fenced, once the lease
/// expires.
#[tokio::test]
async fn start_up_recovery_leaves_running_background_runs_to_the_queue() {
    use agentry_store::{NewEvent, NewRun, NewSession};
    use agentry_types::{RunId, SessionId};
    let server = start_with(host_commands, |_| {}).await;
    let store = server.state.app.parts().store.clone();
    // A real run's start, to copy into two sessions that a crash left mid-run.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("first")));
    let (status, done) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "Hello"}),
        )
        .await;
    assert_eq!(status, 200, "{done}");
    let model_session: SessionId = done["session_id"].as_str().unwrap().parse().unwrap();
    let started: Vec<NewEvent> = store
        .events(model_session, 0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|event| event.kind == "run_started" || event.kind == "message")
        .map(|event| {
            let mut payload = event.payload;
            payload["run_id"] = json!(RunId::new().to_string());
            NewEvent::new(event.kind, payload)
        })
        .collect();
    assert_eq!(started.len(), 2, "{started:?}");
    let interrupted = || async {
        let session = store.create_session(NewSession::new()).await.unwrap().id;
        store
            .append_and_set_status(session, &started, "running", None)
            .await
            .unwrap();
        session
    };
    let queued = interrupted().await;
    let plain = interrupted().await;
    // The background run is running under another node's live lease.
    store
        .enqueue_run(
            &NewRun {
                id: RunId::new(),
                session_id: queued,
                agent_id: None,
                owner: None,
                priority: 0,
                idempotency_key: None,
                schedule_id: None,
                webhook_url: None,
                agent_limit: None,
                request_digest: "d".into(),
                request: json!({}),
                new_session: None,
            },
            10,
        )
        .await
        .unwrap();
    let claimed = store
        .claim_runs("other-node", 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("resumed")));
    assert_eq!(server.state.app.recover_at_start().await, 1);
    assert!(!server.state.app.hub().is_live(queued), "left to the queue");
    // The plain one was resumed and ends; the queued one's log is untouched.
    for _ in 0..200 {
        if store.session(plain).await.unwrap().unwrap().status == "idle" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(store.session(plain).await.unwrap().unwrap().status, "idle");
    assert_eq!(store.events(queued, 0, 100).await.unwrap().len(), 2);
    assert_eq!(
        store.session(queued).await.unwrap().unwrap().status,
        "running"
    );
}

/// The value of the metric line starting with `prefix` (labels included), if present.
fn metric(text: &str, prefix: &str) -> Option<f64> {
    text.lines()
        .find(|line| line.starts_with(prefix))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.parse().ok())
}

#[tokio::test]
async fn metrics_time_model_calls_by_model_count_failures_by_code_and_watch_the_queue() {
    let server = start_queue(4, 100).await;
    let (_, mock) = server.get("/v1/models/mock").await;
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": "priced", "protocol": "openai", "base_url": mock["base_url"],
                   "model_name": "m", "pricing": {"input": 1000, "output": 1000}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // A streamed background run on the priced model.
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("a streamed answer in several chunks").with_usage(10, 30),
    ));
    let (status, _, run) =
        submit(&server, json!({"text": "work", "model_id": "priced"}), None).await;
    assert_eq!(status, 202, "{run}");
    let done = wait(&server, run["run_id"].as_str().unwrap()).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    // A run whose model call fails.
    server.mock.enqueue(Reply::error(
        400,
        json!({"error": {"message": "bad", "type": "invalid_request_error"}}),
    ));
    let (_, failed) = server
        .post("/v1/infer", json!({"session_id": "new", "text": "x"}))
        .await;
    let code = failed["error"]["code"].as_str().unwrap_or("").to_owned();
    assert!(!code.is_empty(), "{failed}");

    let text = server.metrics_text().await;
    let model = "{model=\"priced\"}";
    for name in [
        "agentry_model_time_to_first_output_seconds_count",
        "agentry_model_call_duration_seconds_count",
        "agentry_model_output_tokens_per_second_count",
    ] {
        assert_eq!(
            metric(&text, &format!("{name}{model}")),
            Some(1.0),
            "{name}: {text}"
        );
    }
    assert_eq!(
        metric(
            &text,
            "agentry_model_tokens_total{model=\"priced\",direction=\"output\"}"
        ),
        Some(30.0),
        "{text}"
    );
    let cost = metric(&text, "agentry_model_cost_dollars_total{model=\"priced\"}").unwrap();
    assert!((cost - 0.04).abs() < 1e-9, "{cost}");
    assert_eq!(
        metric(
            &text,
            &format!("agentry_runs_failed_total{{code=\"{code}\"}}")
        ),
        Some(1.0),
        "{text}"
    );
    assert_eq!(
        metric(&text, "agentry_queue_wait_seconds_count"),
        Some(1.0),
        "{text}"
    );
    assert_eq!(metric(&text, "agentry_queue_depth"), Some(0.0), "{text}");
    assert_eq!(metric(&text, "agentry_queue_running"), Some(0.0), "{text}");
}
