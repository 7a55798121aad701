//! Schedules: bad input refused with nothing stored; an interval and a cron expression with
//! seconds fire on time; one slot fires once even with two workers on one database; missed
//! slots follow `catch_up`; `overlap: skip` holds later slots while a run still goes; disabled
//! schedules do not fire.

use std::collections::BTreeSet;
use std::time::Duration;

use agentry_app::queue::QueueSettings;
use agentry_server::routes::schedules::stored_run_spec;
use agentry_store::NewSchedule;
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, host_commands, start_with};

async fn start_queue() -> Server {
    let server = start_with(host_commands, |_| {}).await;
    server.state.app.set_queue_settings(QueueSettings {
        poll: Duration::from_millis(50),
        // These tests fire every second; the default floor is a minute.
        min_schedule_interval: Duration::from_secs(1),
        ..QueueSettings::default()
    });
    server.state.app.start_worker();
    server
}

/// A schedule's run as the app stores it: the spec, beside the request it was read from.
fn stored_run(request: Value) -> Value {
    let spec = stored_run_spec(&request).unwrap();
    json!({"spec": spec.to_stored().unwrap(), "request": request})
}

async fn runs_of(server: &Server, id: &str) -> Vec<Value> {
    let (status, body) = server.get(&format!("/v1/schedules/{id}/runs")).await;
    assert_eq!(status, 200, "{body}");
    body["runs"].as_array().unwrap().clone()
}

#[tokio::test]
async fn bad_schedules_are_refused_and_nothing_is_stored() {
    let server = start_queue().await;
    let run = json!({"text": "tick", "model_id": "mock"});
    for (body, why) in [
        (json!({"cron": "61 * * * *", "run": run}), "minute 61"),
        (json!({"cron": "every day", "run": run}), "not cron"),
        (
            json!({"cron": "0 9 * * *", "timezone": "Mars/Olympus", "run": run}),
            "zone",
        ),
        (
            json!({"cron": "0 9 * * *", "interval_secs": 60, "run": run}),
            "both",
        ),
        (json!({"run": run}), "neither"),
        (json!({"interval_secs": 0, "run": run}), "zero interval"),
        (
            json!({"interval_secs": 60, "run": {"text": "x", "model_id": "nope"}}),
            "model",
        ),
        (
            json!({"interval_secs": 60, "run": run, "overlap": "sometimes"}),
            "overlap",
        ),
        (
            json!({"interval_secs": 60, "run": {"text": "x", "agent_ids": ["a", "b"]}}),
            "group",
        ),
    ] {
        let (status, answer) = server.post("/v1/schedules", body).await;
        assert!((400..500).contains(&status), "{why}: {status} {answer}");
    }
    let (_, listed) = server.get("/v1/schedules").await;
    assert_eq!(listed["schedules"], json!([]));
    let (_, sessions) = server.get("/v1/sessions").await;
    assert_eq!(
        sessions["sessions"],
        json!([]),
        "checking a run creates nothing"
    );
    let (status, _) = server.get("/v1/schedules/nope").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn an_interval_fires_each_slot_once_until_disabled() {
    let server = start_queue().await;
    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::text("tick")));
    let (status, schedule) = server
        .post(
            "/v1/schedules",
            json!({"name": "ticker", "interval_secs": 1, "run": {"text": "tick", "model_id": "mock"}}),
        )
        .await;
    assert_eq!(status, 201, "{schedule}");
    let id = schedule["id"].as_str().unwrap().to_owned();
    let fires: Vec<u64> = schedule["next_fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert_eq!(fires.len(), 5);
    assert!(fires.windows(2).all(|w| w[1] - w[0] == 1000), "{fires:?}");

    tokio::time::sleep(Duration::from_millis(3500)).await;
    let runs = runs_of(&server, &id).await;
    assert!((2..=4).contains(&runs.len()), "3 slots in 3.5 s: {runs:#?}");
    assert!(runs.iter().all(|r| r["schedule_id"] == id.as_str()));
    let sessions: BTreeSet<&str> = runs
        .iter()
        .map(|r| r["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(sessions.len(), runs.len(), "each fire gets its own session");

    // Disabled: no more fires.
    let (status, disabled) = server
        .raw(
            reqwest::Method::PUT,
            &format!("/v1/schedules/{id}"),
            &json!({"name": "ticker", "interval_secs": 1, "enabled": false,
                    "run": {"text": "tick", "model_id": "mock"}})
            .to_string(),
        )
        .await;
    assert_eq!(status, 200, "{disabled}");
    assert_eq!(disabled["next_fires"], json!([]));
    let before = runs_of(&server, &id).await.len();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(runs_of(&server, &id).await.len(), before);
    for run in runs_of(&server, &id).await {
        let (_, done) = server
            .get(&format!(
                "/v1/runs/{}/wait?timeout_secs=10",
                run["run_id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(done["state"], "succeeded", "{done}");
    }
    let (status, _) = server
        .raw(reqwest::Method::DELETE, &format!("/v1/schedules/{id}"), "")
        .await;
    assert_eq!(status, 204);
}

#[tokio::test]
async fn a_cron_expression_with_seconds_fires_in_its_time_zone() {
    let server = start_queue().await;
    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::text("tock")));
    let (status, schedule) = server
        .post(
            "/v1/schedules",
            json!({"cron": "*/2 * * * * *", "timezone": "Asia/Kathmandu",
                   "run": {"text": "tock", "model_id": "mock"}}),
        )
        .await;
    assert_eq!(status, 201, "{schedule}");
    let fires: Vec<u64> = schedule["next_fires"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    assert!(fires.windows(2).all(|w| w[1] - w[0] == 2000), "{fires:?}");
    assert!(
        fires.iter().all(|t| t % 2000 == 0),
        "on even seconds: {fires:?}"
    );
    let id = schedule["id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let runs = runs_of(&server, id).await;
    assert!((1..=3).contains(&runs.len()), "{runs:#?}");
}

#[tokio::test]
async fn one_slot_fires_once_with_two_workers_on_one_database() {
    let server = start_queue().await;
    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::text("once")));
    // A second app over the same data folder: another worker seeing the same schedules.
    let store = agentry_store::Store::open_home(server.home.path())
        .await
        .unwrap();
    let second = agentry_app::App::with_tools(store, host_commands(server.home.path()))
        .await
        .unwrap();
    second.set_queue_settings(QueueSettings {
        poll: Duration::from_millis(20),
        min_schedule_interval: Duration::from_secs(1),
        ..QueueSettings::default()
    });
    second.start_worker();
    let (status, schedule) = server
        .post(
            "/v1/schedules",
            json!({"interval_secs": 1, "run": {"text": "once", "model_id": "mock"}}),
        )
        .await;
    assert_eq!(status, 201, "{schedule}");
    let id = schedule["id"].as_str().unwrap().to_owned();
    tokio::time::sleep(Duration::from_millis(3500)).await;
    second.parts().shutdown.cancel();
    let runs = runs_of(&server, &id).await;
    assert!((2..=4).contains(&runs.len()), "{runs:#?}");
    // Fired at distinct slots, each once: one model call per run.
    let mut calls = 0;
    for run in &runs {
        let (_, done) = server
            .get(&format!(
                "/v1/runs/{}/wait?timeout_secs=10",
                run["run_id"].as_str().unwrap()
            ))
            .await;
        assert_eq!(done["state"], "succeeded", "{done}");
        calls += 1;
    }
    assert_eq!(server.mock.request_count(), calls);
}

/// A schedule stored as if the server had been down for ten minutes.
async fn overdue(server: &Server, catch_up: &str) -> String {
    let now = agentry_app::clock::now_ms();
    let id = agentry_types::RunId::new().to_string();
    server
        .state
        .app
        .parts()
        .store
        .create_schedule(&NewSchedule {
            id: id.clone(),
            name: format!("overdue {catch_up}"),
            owner: None,
            cron: None,
            timezone: "UTC".into(),
            interval_secs: Some(3600),
            request: stored_run(json!({"text": "catch up", "model_id": "mock"})),
            enabled: true,
            catch_up: catch_up.into(),
            overlap: "skip".into(),
            next_fire_at: Some(now - 600_000),
        })
        .await
        .unwrap();
    id
}

#[tokio::test]
async fn missed_slots_are_skipped_or_run_once() {
    let server = start_queue().await;
    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::text("caught up")));
    let skipped = overdue(&server, "skip").await;
    let once = overdue(&server, "once").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(runs_of(&server, &skipped).await.len(), 0);
    assert_eq!(runs_of(&server, &once).await.len(), 1);
    // Both moved on to a future slot.
    let now = agentry_app::clock::now_ms();
    for id in [&skipped, &once] {
        let (_, schedule) = server.get(&format!("/v1/schedules/{id}")).await;
        assert!(
            schedule["next_fires"][0].as_u64().unwrap() > now,
            "{schedule}"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        runs_of(&server, &once).await.len(),
        1,
        "once, not once per missed slot"
    );
}

#[tokio::test]
async fn overlap_skip_holds_later_slots_while_the_run_goes() {
    let server = start_queue().await;
    server.mock.set_fallback(
        Reply::scripted(ScriptedTurn::text("slow")).delay_headers(Duration::from_millis(2500)),
    );
    let (status, schedule) = server
        .post(
            "/v1/schedules",
            json!({"interval_secs": 1, "overlap": "skip", "run": {"text": "slow", "model_id": "mock"}}),
        )
        .await;
    assert_eq!(status, 201, "{schedule}");
    let id = schedule["id"].as_str().unwrap();
    tokio::time::sleep(Duration::from_millis(2300)).await;
    let runs = runs_of(&server, id).await;
    assert_eq!(
        runs.len(),
        1,
        "later slots skipped while the first runs: {runs:#?}"
    );
}

#[tokio::test]
async fn a_slot_submitted_before_a_crash_is_not_submitted_again() {
    // No worker: the test fires by hand, as a worker's loop would.
    let server = start_with(host_commands, |_| {}).await;
    let slot = agentry_app::clock::now_ms() - 100;
    let schedule = NewSchedule {
        id: agentry_types::RunId::new().to_string(),
        name: "crash window".into(),
        owner: None,
        cron: None,
        timezone: "UTC".into(),
        interval_secs: Some(3600),
        request: stored_run(json!({"text": "once", "model_id": "mock"})),
        enabled: true,
        catch_up: "skip".into(),
        overlap: "queue".into(),
        next_fire_at: Some(slot),
    };
    server
        .state
        .app
        .parts()
        .store
        .create_schedule(&schedule)
        .await
        .unwrap();
    server.state.app.schedules().fire_due().await;
    assert_eq!(runs_of(&server, &schedule.id).await.len(), 1);
    // The process died after submitting but before moving the schedule on: the next one finds
    // the same slot due, and submits nothing new.
    server
        .state
        .app
        .parts()
        .store
        .update_schedule(&schedule)
        .await
        .unwrap();
    server.state.app.schedules().fire_due().await;
    assert_eq!(runs_of(&server, &schedule.id).await.len(), 1);
    // It moved on this time.
    let (_, shown) = server.get(&format!("/v1/schedules/{}", schedule.id)).await;
    assert!(
        shown["next_fires"][0].as_u64().unwrap() > slot + 3_000_000,
        "{shown}"
    );
}

/// A schedule fires at most once a minute unless the operator lowers the floor, and its runs
/// never pile up in the queue past a bound (the second security review's N14).
#[tokio::test]
async fn schedules_have_a_floor_and_their_queued_fires_a_cap() {
    // The default floor: a minute.
    let server = start_with(host_commands, |_| {}).await;
    let run = json!({"text": "tick", "model_id": "mock"});
    for body in [
        json!({"interval_secs": 1, "run": run}),
        json!({"interval_secs": 59, "run": run}),
        json!({"cron": "* * * * * *", "run": run}),
        json!({"cron": "0-4 * * * * *", "run": run}),
    ] {
        let (status, answer) = server.post("/v1/schedules", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(
            answer.to_string().contains("--min-schedule-interval-secs"),
            "{answer}"
        );
    }
    for body in [
        json!({"interval_secs": 60, "run": run}),
        json!({"cron": "0 9 * * *", "run": run}),
    ] {
        let (status, answer) = server.post("/v1/schedules", body.clone()).await;
        assert_eq!(status, 201, "{body}: {answer}");
    }
    // No worker: every fired run stays queued. Slot after slot comes due, and the schedule
    // stops adding runs once ten wait.
    let mut schedule = NewSchedule {
        id: agentry_types::RunId::new().to_string(),
        name: "piling".into(),
        owner: None,
        cron: None,
        timezone: "UTC".into(),
        interval_secs: Some(3600),
        request: stored_run(json!({"text": "pile", "model_id": "mock"})),
        enabled: true,
        catch_up: "skip".into(),
        overlap: "queue".into(),
        next_fire_at: None,
    };
    let start = agentry_app::clock::now_ms() - 60_000;
    server
        .state
        .app
        .parts()
        .store
        .create_schedule(&schedule)
        .await
        .unwrap();
    for n in 0..15 {
        schedule.next_fire_at = Some(start + n * 1000);
        server
            .state
            .app
            .parts()
            .store
            .update_schedule(&schedule)
            .await
            .unwrap();
        server.state.app.schedules().fire_due().await;
    }
    let runs = runs_of(&server, &schedule.id).await;
    assert_eq!(
        runs.len(),
        agentry_app::schedules::MAX_QUEUED_FIRES,
        "{runs:#?}"
    );
    assert!(runs.iter().all(|run| run["state"] == "queued"), "{runs:#?}");
}

#[tokio::test]
async fn a_schedule_fires_as_its_owners_key_is_now_and_stops_when_it_is_revoked() {
    use agentry_app::auth::{KeyLimits, create_key, revoke_key};

    use super::security::{as_key, with_keys};

    let server = start_queue().await;
    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::text("tick")));
    let (owner, _, _) = with_keys(&server, KeyLimits::default()).await;
    let other = create_key(&server.state.app.parts().store, "another admin")
        .await
        .unwrap();
    let (status, schedule) = as_key(
        &server,
        &owner,
        "POST",
        "/v1/schedules",
        json!({"interval_secs": 1, "run": {"text": "tick", "model_id": "mock"}}),
    )
    .await;
    assert_eq!(status, 201, "{schedule}");
    let id = schedule["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/schedules/{id}/runs");
    let runs = || async {
        let (status, body) = as_key(&server, &other.key, "GET", &path, json!({})).await;
        assert_eq!(status, 200, "{body}");
        body["runs"].as_array().unwrap().len()
    };
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(runs().await >= 1, "the schedule fired");

    let owner_id = owner.split('_').nth(1).unwrap();
    assert!(
        revoke_key(&server.state.app.parts().store, owner_id)
            .await
            .unwrap()
    );
    // A fire already under way when the key went may still land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = runs().await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        runs().await,
        before,
        "a revoked key's schedule submits nothing more"
    );
}

#[tokio::test]
async fn a_schedule_an_earlier_release_stored_is_rewritten_at_start_and_fires() {
    let server = start_with(host_commands, |_| {}).await;
    let store = &server.state.app.parts().store;
    let now = agentry_app::clock::now_ms();
    // An earlier release stored the client's request alone.
    let legacy = |id: &str, request: Value| NewSchedule {
        id: id.into(),
        name: id.into(),
        owner: None,
        cron: None,
        timezone: "UTC".into(),
        interval_secs: Some(3600),
        request,
        enabled: true,
        catch_up: "once".into(),
        overlap: "queue".into(),
        next_fire_at: Some(now - 1000),
    };
    let request = json!({"text": "from before", "model_id": "mock", "messages": []});
    store
        .create_schedule(&legacy("old", request.clone()))
        .await
        .unwrap();
    // One whose request no longer reads is disabled, not fired.
    store
        .create_schedule(&legacy("unreadable", json!({"text": "x", "bogus": 1})))
        .await
        .unwrap();
    let upgraded = server
        .state
        .app
        .schedules()
        .upgrade(stored_run_spec)
        .await
        .unwrap();
    assert_eq!(upgraded, 2);
    let stored = store.schedule("old").await.unwrap().unwrap();
    assert_eq!(stored.request["spec"]["version"], 1, "{}", stored.request);
    assert_eq!(
        stored.request["spec"]["spec"]["input"]["text"],
        "from before"
    );
    assert!(stored.enabled);
    let unreadable = store.schedule("unreadable").await.unwrap().unwrap();
    assert!(!unreadable.enabled, "{unreadable:?}");
    // Shown back as its client wrote it, as before.
    let (status, shown) = server.get("/v1/schedules/old").await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["run"], request);
    // A second start has nothing left to rewrite but the one it could not read.
    assert_eq!(
        server
            .state
            .app
            .schedules()
            .upgrade(stored_run_spec)
            .await
            .unwrap(),
        1
    );

    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::text("fired")));
    server.state.app.set_queue_settings(QueueSettings {
        poll: Duration::from_millis(50),
        ..QueueSettings::default()
    });
    server.state.app.start_worker();
    let mut fired = Vec::new();
    for _ in 0..100 {
        fired = runs_of(&server, "old").await;
        if fired.iter().any(|run| run["state"] == "succeeded") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        fired.iter().any(|run| run["state"] == "succeeded"),
        "{fired:#?}"
    );
    assert!(runs_of(&server, "unreadable").await.is_empty());
}
