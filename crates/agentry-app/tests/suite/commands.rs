//! Commands about runs at the app's boundary (`App::submit`: a run's controls, `StopSession`), as every
//! front-end sends them: a waiting run decided and followed to its end, a session's run stopped,
//! a command about a run that does not exist (issue 49).

use std::time::Duration;

use agentry_app::App;
use agentry_app::Failure;
use agentry_app::auth::Principal;
use agentry_app::follow::{FollowFrom, Followed};
use agentry_app::hub::FeedStatus;
use agentry_app::ops::{Op, StopSession};
use agentry_app::runs::{RunSpec, SessionChoice, Target, prepare};
use agentry_core::Input;
use agentry_core::approval::{ApprovalDecision, ApprovalPolicy};
use agentry_core::session::BusyPolicy;
use agentry_testkit::{Chunking, Reply, ScriptedTurn};
use agentry_types::{ApprovalVerdict, RunEvent, RunId, SessionEvent, SessionId, SuspendStatus};
use serde_json::json;

use super::follow::{app, collect};

/// Starts `input` in a new session, as every front-end does, followed from its start.
async fn start_new(app: &App, input: RunSpec) -> (SessionId, Followed) {
    let (target, request) = prepare(app, &Principal::operator(), input).await.unwrap();
    let Target::Session(session) = target else {
        panic!("a new session's run has its session");
    };
    let events = app
        .start_followed(session, request, BusyPolicy::Reject)
        .await
        .unwrap();
    (session, events)
}

/// The last committed seq among `events`.
fn last_seq(events: &[std::sync::Arc<RunEvent>]) -> u64 {
    events
        .iter()
        .filter_map(|event| match event.as_ref() {
            RunEvent::Committed { seq, .. } => Some(*seq),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

#[tokio::test]
async fn a_waiting_run_is_decided_through_submit_and_followed_to_its_end() {
    let (app, mock, _home) = app().await;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It is late.")));
    let approvals: ApprovalPolicy =
        serde_json::from_value(json!({"tools": {"current_time": "always"}})).unwrap();
    let input = RunSpec {
        model_id: Some("mock".into()),
        tool_ids: Some(vec!["current_time".into()]),
        approvals: Some(approvals),
        input: Some(Input::Text {
            text: "What time is it?".into(),
        }),
        session: SessionChoice::New,
        ..RunSpec::default()
    };
    let (session, events) = start_new(&app, input).await;
    let first = collect(events).await;
    let Some(RunEvent::RunSuspended {
        run_id,
        status: SuspendStatus::Waiting,
        pending,
        ..
    }) = first.last().map(|event| event.as_ref())
    else {
        panic!("the run waits for the call: {first:?}");
    };
    assert_eq!(pending.len(), 1);
    assert_eq!(mock.request_count(), 1);
    // An edit that the tool's schema refuses is refused, and nothing moves.
    let bad = Op::Decide {
        run_id: *run_id,
        decisions: vec![ApprovalDecision {
            call_id: pending[0].call.id.clone(),
            decision: ApprovalVerdict::Edit,
            reason: None,
            arguments: Some(json!({"timezone": 42})),
        }],
    };
    assert!(app.submit(bad).await.is_err());
    assert_eq!(app.pending_of(session, *run_id).await.unwrap().len(), 1);
    let approve = Op::Decide {
        run_id: *run_id,
        decisions: vec![ApprovalDecision {
            call_id: pending[0].call.id.clone(),
            decision: ApprovalVerdict::Approve,
            reason: None,
            arguments: None,
        }],
    };
    let outcome = app.submit(approve.clone()).await.unwrap();
    assert_eq!(outcome.status, FeedStatus::Running);
    assert!(outcome.pending.is_empty());
    // The rest of the run, from the last event the client had.
    let rest = collect(
        app.follow(session, FollowFrom::After(last_seq(&first)))
            .await
            .unwrap(),
    )
    .await;
    assert!(
        rest.iter().any(|event| matches!(
            event.as_ref(),
            RunEvent::Committed {
                event: SessionEvent::ApprovalDecided { .. },
                ..
            }
        )),
        "{rest:?}"
    );
    assert!(
        matches!(
            rest.last().map(|event| event.as_ref()),
            Some(RunEvent::RunFinished { .. })
        ),
        "{rest:?}"
    );
    // The model got the tool's result and answered.
    assert_eq!(mock.request_count(), 2);
    let sent = mock.requests()[1].body.to_string();
    assert!(sent.contains("current_time"), "{sent}");
    // A decision on a run that no longer waits is refused.
    assert!(app.submit(approve).await.is_err());
}

#[tokio::test]
async fn stopping_a_session_interrupts_its_run_and_says_whether_anything_ran() {
    let (app, mock, _home) = app().await;
    let answer = "one two three four five six seven eight nine ten eleven twelve thirteen";
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text(answer))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(100)),
    );
    let input = RunSpec {
        model_id: Some("mock".into()),
        input: Some(Input::Text {
            text: "Count slowly.".into(),
        }),
        session: SessionChoice::New,
        ..RunSpec::default()
    };
    let (session, events) = start_new(&app, input).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(
        app.submit(StopSession {
            session_id: session
        })
        .await
        .unwrap()
    );
    let events = collect(events).await;
    let Some(RunEvent::RunFinished { stop_reason, .. }) = events.last().map(|e| e.as_ref()) else {
        panic!("the run ends: {events:?}");
    };
    assert_eq!(stop_reason.as_str(), "cancelled", "{events:?}");
    // Nothing runs there now.
    assert!(
        !app.submit(StopSession {
            session_id: session
        })
        .await
        .unwrap()
    );
}

#[tokio::test]
async fn a_command_about_a_run_that_does_not_exist_is_not_found() {
    let (app, _mock, _home) = app().await;
    for op in [
        Op::Pause {
            run_id: RunId::new(),
        },
        Op::Resume {
            run_id: RunId::new(),
        },
        Op::Abort {
            run_id: RunId::new(),
        },
    ] {
        let error = app.submit(op).await.unwrap_err();
        assert_eq!(error.failure, Failure::NotFound, "{error:?}");
    }
}
