//! The queue keeps what to run as a versioned [`RunSpec`] and checks it again when a worker takes
//! it up, under its owner's key as it is then; a run an earlier release queued (the engine's
//! request) still runs (issue 49).

use std::time::Duration;

use agentry_app::App;
use agentry_app::auth::{KeyLimits, KeyRole, Principal, active_key, create_key_with, revoke_key};
use agentry_app::ops::Enqueue;
use agentry_app::queue::QueueSettings;
use agentry_app::runs::{RunSpec, SessionChoice};
use agentry_core::{Input, RunRequest};
use agentry_store::{ConfigKind, Enqueued, NewRun, NewSession, RunState};
use agentry_testkit::{Reply, ScriptedTurn};
use agentry_types::{RunId, SessionId};
use serde_json::{Value, json};

use super::follow::app;

/// Queues `spec` for `caller`, as every front-end does.
fn enqueue(caller: Principal, spec: RunSpec) -> Enqueue {
    Enqueue {
        caller,
        spec,
        idempotency_key: None,
        priority: 0,
    }
}

fn text(text: &str) -> Option<Input> {
    Some(Input::Text { text: text.into() })
}

/// Starts the app's worker, polling often.
fn start_worker(app: &App) {
    app.set_queue_settings(QueueSettings {
        poll: Duration::from_millis(50),
        ..QueueSettings::default()
    });
    app.start_worker();
}

/// Waits for `run` to end; its state and outcome.
async fn ended(app: &App, run: RunId) -> (RunState, Value) {
    for _ in 0..20 {
        let view = app
            .background_runs()
            .wait(run, Duration::from_secs(1))
            .await
            .unwrap();
        if view.state.is_final() {
            return (view.state, view.outcome.unwrap_or(Value::Null));
        }
    }
    panic!("run {run} did not end");
}

async fn save_agent(app: &App, system: &str) {
    app.parts()
        .store
        .put_config(
            ConfigKind::Agent,
            "helper",
            &json!({"id": "helper", "model_id": "mock", "system": system}),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn a_queued_run_is_stored_as_its_spec_and_resolved_when_it_is_taken_up() {
    let (app, mock, _home) = app().await;
    save_agent(&app, "You are the first helper.").await;
    let spec = RunSpec {
        agent_id: Some("helper".into()),
        input: text("work"),
        session: SessionChoice::New,
        ..RunSpec::default()
    };
    let (view, created) = app
        .submit(enqueue(Principal::operator(), spec))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(view.state, RunState::Queued);

    // What is stored is the spec, versioned, in the session its record names.
    let record = app
        .parts()
        .store
        .run_record(view.run_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.request["version"], 1, "{}", record.request);
    let stored = &record.request["spec"];
    assert_eq!(stored["agent_id"], "helper");
    assert_eq!(stored["input"]["text"], "work");
    assert_eq!(
        stored["session"]["existing"],
        view.session_id.to_string(),
        "{stored}"
    );
    assert!(
        stored.get("system").is_none() && stored.get("model").is_none(),
        "the agent is resolved when the run is taken up, not stored: {stored}"
    );

    // The agent changes while the run waits: the run runs as the agent is when it is taken up.
    save_agent(&app, "You are the second helper.").await;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("done")));
    start_worker(&app);
    let (state, outcome) = ended(&app, view.run_id).await;
    assert_eq!(state, RunState::Succeeded, "{outcome}");
    assert_eq!(outcome["text"], "done");
    let asked = mock.requests()[0].body.to_string();
    assert!(asked.contains("You are the second helper."), "{asked}");
    assert!(!asked.contains("You are the first helper."), "{asked}");
}

#[tokio::test]
async fn a_run_whose_key_was_revoked_while_it_waited_does_not_run() {
    let (app, mock, _home) = app().await;
    let key = create_key_with(
        &app.parts().store,
        "user",
        KeyRole::User,
        KeyLimits::default(),
    )
    .await
    .unwrap();
    let id = key.id.clone();
    let caller = active_key(&app.parts().store, &id).await.unwrap().unwrap();
    let spec = RunSpec {
        model_id: Some("mock".into()),
        input: text("work"),
        ..RunSpec::default()
    };
    let (view, _) = app.submit(enqueue(caller, spec)).await.unwrap();
    assert_eq!(view.state, RunState::Queued);

    assert!(revoke_key(&app.parts().store, &id).await.unwrap());
    start_worker(&app);
    let (state, outcome) = ended(&app, view.run_id).await;
    assert_eq!(state, RunState::Failed, "{outcome}");
    assert_eq!(outcome["error"]["code"], "permission_denied", "{outcome}");
    let message = outcome["error"]["message"].as_str().unwrap();
    assert!(message.contains("revoked"), "{message}");
    assert!(mock.requests().is_empty(), "the model was asked nothing");
}

#[tokio::test]
async fn a_run_queued_by_an_earlier_release_still_runs() {
    let (app, mock, _home) = app().await;
    // An earlier release stored the engine's checked request and the busy policy.
    let request = RunRequest {
        model: Some("mock".into()),
        input: text("from before"),
        ..RunRequest::default()
    };
    let session = SessionId::new();
    let run = NewRun {
        id: RunId::new(),
        session_id: session,
        agent_id: None,
        owner: None,
        priority: 0,
        idempotency_key: None,
        schedule_id: None,
        webhook_url: None,
        agent_limit: None,
        request_digest: "0".repeat(64),
        request: json!({"request": request, "policy": "reject"}),
        new_session: Some(NewSession::with_id(session)),
    };
    let Enqueued::Created(record) = app.parts().store.enqueue_run(&run, 100).await.unwrap() else {
        panic!("the run was not queued");
    };
    mock.enqueue(Reply::scripted(ScriptedTurn::text("still here")));
    start_worker(&app);
    let (state, outcome) = ended(&app, record.id).await;
    assert_eq!(state, RunState::Succeeded, "{outcome}");
    assert_eq!(outcome["text"], "still here");
}
