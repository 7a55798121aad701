//! Approvals and run control through the `SessionManager`: a call that needs approval
//! suspends the run durably (status `waiting`), a person approves, rejects or edits it and the
//! run goes on with the same id; pause and resume between rounds; interrupt; abort drops the
//! queue; a call whose outcome a crash left unknown can be sent for approval.

use std::sync::Arc;
use std::time::Duration;

use agentry_core::RunRequest;
use agentry_core::approval::{ApprovalDecision, ApprovalError, ApprovalPolicy};
use agentry_core::session::{
    BusyPolicy, MemoryLog, SessionError, SessionLog, SessionManager, SessionStatus,
};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::{
    ApprovalVerdict, Message, RunEvent, RunId, RunStopReason, SessionEvent, SessionId,
    SuspendStatus,
};
use futures::StreamExt;
use serde_json::json;

use super::sessions::{Idempotent, crashed_session_with};
use super::support::{ProbeTool, builder, limits};

fn build(mock: &MockProvider, tools: Vec<ProbeTool>, log: Arc<MemoryLog>) -> SessionManager {
    let mut builder = builder(mock, agentry_llm::Protocol::OpenAi);
    for tool in tools {
        builder.tool(tool).unwrap();
    }
    builder.limits(limits());
    SessionManager::new(builder.build(), log)
}

/// Reads a run's events until its first tool call starts; returns the run's id.
async fn until_a_tool_starts(stream: &mut agentry_core::RunStream) -> agentry_types::RunId {
    let mut run_id = None;
    while let Some(event) = stream.next().await {
        if let RunEvent::RunStarted { run_id: id } = event {
            run_id = Some(id);
        }
        if matches!(event, RunEvent::ToolCallStarted { .. }) {
            break;
        }
    }
    run_id.expect("the run started")
}

fn always(tool: &str) -> ApprovalPolicy {
    serde_json::from_value(json!({"tools": {tool: "always"}})).unwrap()
}

fn kinds(events: &[(u64, SessionEvent)]) -> Vec<&'static str> {
    events.iter().map(|(_, e)| e.kind()).collect()
}

async fn status(log: &MemoryLog, session: SessionId, status: SessionStatus) -> bool {
    log.sessions_with_status(status)
        .await
        .unwrap()
        .contains(&session)
}

fn decision(call_id: &str, verdict: ApprovalVerdict) -> ApprovalDecision {
    ApprovalDecision {
        call_id: call_id.into(),
        decision: verdict,
        reason: None,
        arguments: None,
    }
}

/// Starts a run whose `lookup` call waits; returns the run id and the waiting call's id.
async fn waiting_run(
    manager: &SessionManager,
    log: &MemoryLog,
    session: SessionId,
) -> (RunId, String) {
    let mut request = RunRequest::text("look up item 1");
    request.approvals = Some(always("lookup"));
    let mut stream = manager
        .send(session, request, BusyPolicy::Reject)
        .await
        .unwrap();
    let mut suspended = None;
    while let Some(event) = stream.next().await {
        if let RunEvent::RunSuspended {
            run_id,
            status,
            pending,
            ..
        } = event
        {
            suspended = Some((run_id, status, pending));
        }
    }
    let output = stream.finish().await.unwrap();
    let (run_id, status_now, pending) = suspended.expect("the run suspended");
    assert_eq!(status_now, SuspendStatus::Waiting);
    assert_eq!(output.run_id, run_id);
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].call.name, "lookup");
    assert!(
        pending[0].reason.contains("lookup"),
        "{}",
        pending[0].reason
    );
    assert!(status(log, session, SessionStatus::Waiting).await);
    let events = log.load(session).await.unwrap();
    let names = kinds(&events);
    assert!(names.contains(&"approval_requested"), "{names:?}");
    assert!(
        !names.contains(&"tool_call_intent"),
        "nothing runs before the decision: {names:?}"
    );
    assert!(!names.contains(&"run_finished"));
    let (listed_run, listed) = manager
        .pending_approvals(session)
        .await
        .unwrap()
        .expect("calls wait");
    assert_eq!(listed_run, run_id);
    assert_eq!(listed.len(), 1);
    (run_id, pending[0].call.id.clone())
}

#[tokio::test]
async fn an_approved_call_runs_and_the_run_completes_with_the_same_id() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It is a teapot.")));
    let lookup = ProbeTool::lookup();
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![lookup.clone()], log.clone());
    let session = manager.create_session().await.unwrap();
    let (run_id, call_id) = waiting_run(&manager, &log, session).await;
    assert!(lookup.executions().is_empty());
    assert_eq!(mock.request_count(), 1);

    let decided = manager
        .decide(
            session,
            run_id,
            vec![decision(&call_id, ApprovalVerdict::Approve)],
        )
        .await
        .unwrap();
    assert!(decided.pending.is_empty());
    let output = decided
        .stream
        .expect("the run goes on")
        .finish()
        .await
        .unwrap();
    assert_eq!(output.run_id, run_id);
    assert_eq!(output.stop_reason, RunStopReason::Completed);
    assert_eq!(output.text, "It is a teapot.");
    assert_eq!(lookup.executions().len(), 1);
    assert_eq!(lookup.executions()[0].arguments, json!({"id": 1}));
    let events = log.load(session).await.unwrap();
    assert_eq!(
        kinds(&events),
        [
            "run_started",
            "message",
            "assistant_message",
            "approval_requested",
            "approval_decided",
            "run_resumed",
            "tool_call_intent",
            "tool_call_result",
            "assistant_message",
            "run_finished"
        ]
    );
    assert!(events.iter().all(|(_, e)| e.run_id() == run_id));
    assert!(status(&log, session, SessionStatus::Idle).await);
    assert!(manager.pending_approvals(session).await.unwrap().is_none());
    mock.check_protocol().unwrap();
    // Deciding again is refused: the run no longer waits.
    match manager
        .decide(
            session,
            run_id,
            vec![decision(&call_id, ApprovalVerdict::Approve)],
        )
        .await
    {
        Err(SessionError::WrongState { state, .. }) => assert!(state.contains("ended")),
        Err(other) => panic!("expected a run that has ended, got {other:?}"),
        Ok(_) => panic!("expected an error"),
    }
}

#[tokio::test]
async fn a_rejection_reaches_the_model_as_the_calls_error_result() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Understood.")));
    let lookup = ProbeTool::lookup();
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![lookup.clone()], log.clone());
    let session = manager.create_session().await.unwrap();
    let (run_id, call_id) = waiting_run(&manager, &log, session).await;
    let mut reject = decision(&call_id, ApprovalVerdict::Reject);
    reject.reason = Some("item 1 is confidential".into());
    let output = manager
        .decide(session, run_id, vec![reject])
        .await
        .unwrap()
        .stream
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(output.text, "Understood.");
    assert!(lookup.executions().is_empty(), "a rejected call never runs");
    let sent = mock.requests()[1].body.to_string();
    assert!(sent.contains("item 1 is confidential"), "{sent}");
    assert!(sent.contains("rejected"), "{sent}");
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn edited_arguments_are_checked_then_used() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Item 7 it is.")));
    let lookup = ProbeTool::lookup();
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![lookup.clone()], log.clone());
    let session = manager.create_session().await.unwrap();
    let (run_id, call_id) = waiting_run(&manager, &log, session).await;
    let before = log.load(session).await.unwrap().len();

    // Arguments the schema refuses: nothing is committed, the run keeps waiting.
    let mut bad = decision(&call_id, ApprovalVerdict::Edit);
    bad.arguments = Some(json!({"id": "seven"}));
    match manager.decide(session, run_id, vec![bad]).await {
        Err(SessionError::Approval(ApprovalError::InvalidDecision(message))) => {
            assert!(message.contains("lookup"), "{message}");
        }
        Err(other) => panic!("expected an invalid decision, got {other:?}"),
        Ok(_) => panic!("expected an invalid decision"),
    }
    // `edit` without arguments, and an unknown call, are refused too.
    assert!(matches!(
        manager
            .decide(
                session,
                run_id,
                vec![decision(&call_id, ApprovalVerdict::Edit)]
            )
            .await,
        Err(SessionError::Approval(ApprovalError::InvalidDecision(_)))
    ));
    assert!(matches!(
        manager
            .decide(
                session,
                run_id,
                vec![decision("nope", ApprovalVerdict::Approve)]
            )
            .await,
        Err(SessionError::Approval(ApprovalError::UnknownCall(_)))
    ));
    assert_eq!(log.load(session).await.unwrap().len(), before);

    let mut edit = decision(&call_id, ApprovalVerdict::Edit);
    edit.arguments = Some(json!({"id": 7}));
    let output = manager
        .decide(session, run_id, vec![edit])
        .await
        .unwrap()
        .stream
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(output.text, "Item 7 it is.");
    assert_eq!(lookup.executions().len(), 1);
    assert_eq!(lookup.executions()[0].arguments, json!({"id": 7}));
    let sent = mock.requests()[1].body.to_string();
    assert!(sent.contains("edited"), "the model is told: {sent}");
    let events = log.load(session).await.unwrap();
    assert!(events.iter().any(|(_, e)| matches!(e,
        SessionEvent::ApprovalDecided { decision: ApprovalVerdict::Edit, arguments: Some(a), .. }
            if *a == json!({"id": 7}))));
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn a_waiting_run_survives_a_restart_and_is_not_recovered_as_interrupted() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("After the restart.")));
    let lookup = ProbeTool::lookup();
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![lookup.clone()], log.clone());
    let session = manager.create_session().await.unwrap();
    let (run_id, call_id) = waiting_run(&manager, &log, session).await;
    drop(manager);

    // A new process on the same log.
    let manager = build(&mock, vec![lookup.clone()], log.clone());
    assert!(manager.recover().await.unwrap().is_empty());
    assert!(status(&log, session, SessionStatus::Waiting).await);
    let (waiting_run_id, pending) = manager.pending_approvals(session).await.unwrap().unwrap();
    assert_eq!(waiting_run_id, run_id);
    assert_eq!(pending[0].call.id, call_id);
    let output = manager
        .decide(
            session,
            run_id,
            vec![decision(&call_id, ApprovalVerdict::Approve)],
        )
        .await
        .unwrap()
        .stream
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(output.text, "After the restart.");
    assert_eq!(output.run_id, run_id);
    assert_eq!(lookup.executions().len(), 1);
}

#[tokio::test]
async fn some_decisions_keep_the_run_waiting_until_all_are_made() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("lookup", json!({"id": 1}))
            .with_tool_call("lookup", json!({"id": 2})),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Both handled.")));
    let lookup = ProbeTool::lookup();
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![lookup.clone()], log.clone());
    let session = manager.create_session().await.unwrap();
    let mut request = RunRequest::text("two lookups");
    request.approvals = Some(always("lookup"));
    let output = manager
        .send(session, request, BusyPolicy::Reject)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(output.suspended, Some(SuspendStatus::Waiting));
    let pending = output.state.pending_approvals();
    assert_eq!(pending.len(), 2);
    let first = manager
        .decide(
            session,
            output.run_id,
            vec![decision(&pending[0].call.id, ApprovalVerdict::Approve)],
        )
        .await
        .unwrap();
    assert!(first.stream.is_none());
    assert_eq!(first.pending.len(), 1);
    assert!(status(&log, session, SessionStatus::Waiting).await);
    // The same call cannot be decided twice.
    assert!(matches!(
        manager
            .decide(
                session,
                output.run_id,
                vec![decision(&pending[0].call.id, ApprovalVerdict::Reject)],
            )
            .await,
        Err(SessionError::Approval(ApprovalError::AlreadyDecided(_)))
    ));
    let done = manager
        .decide(
            session,
            output.run_id,
            vec![decision(&pending[1].call.id, ApprovalVerdict::Reject)],
        )
        .await
        .unwrap()
        .stream
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(done.text, "Both handled.");
    assert_eq!(lookup.executions().len(), 1);
    assert_eq!(lookup.executions()[0].arguments, json!({"id": 1}));
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn an_unknown_outcome_can_be_sent_for_approval() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Recovered.")));
    let reader = ProbeTool::new(
        "reader",
        json!({"type": "object", "properties": {"id": {"type": "integer"}}}),
    );
    let lookup = ProbeTool::lookup();
    let mut builder = builder(&mock, agentry_llm::Protocol::OpenAi);
    builder.tool(Idempotent(reader.clone())).unwrap();
    builder.tool(lookup.clone()).unwrap();
    let log = Arc::new(MemoryLog::default());
    let manager = SessionManager::new(builder.build(), log.clone());
    let session = crashed_session_with(
        &log,
        json!({"id": 1}),
        json!({"id": 2}),
        json!({"unknown_outcome": "ask"}),
    )
    .await;
    let recovered = manager.recover().await.unwrap();
    assert_eq!(recovered.len(), 1);
    let (_, stream) = recovered.into_iter().next().unwrap();
    let output = stream.finish().await.unwrap();
    let pending = output.state.pending_approvals();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].call.id, "call_b");
    assert!(pending[0].reason.contains("may not have taken effect"));
    assert!(status(&log, session, SessionStatus::Waiting).await);
    assert!(lookup.executions().is_empty());
    let events = log.load(session).await.unwrap();
    assert!(
        !events.iter().any(|(_, e)| matches!(e,
            SessionEvent::ToolCallResult { result, .. } if result.call_id == "call_b")),
        "no outcome-unknown result was given"
    );
    let done = manager
        .decide(
            session,
            output.run_id,
            vec![decision("call_b", ApprovalVerdict::Approve)],
        )
        .await
        .unwrap()
        .stream
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(done.text, "Recovered.");
    assert_eq!(lookup.executions().len(), 1, "approved: it ran again");
    assert_eq!(
        reader.executions().len(),
        1,
        "the idempotent call ran again"
    );
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn pause_stops_between_rounds_durably_and_resume_continues_the_same_run() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Resumed and done.")));
    let slow = ProbeTool::lookup().sleeping(Duration::from_millis(300));
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![slow.clone()], log.clone());
    let session = manager.create_session().await.unwrap();
    let mut stream = manager
        .send(session, RunRequest::text("slow"), BusyPolicy::Reject)
        .await
        .unwrap();
    let run_id = until_a_tool_starts(&mut stream).await;
    assert_eq!(manager.pause(run_id).unwrap(), session);
    let mut suspended = None;
    while let Some(event) = stream.next().await {
        if let RunEvent::RunSuspended { status, .. } = event {
            suspended = Some(status);
        }
    }
    stream.finish().await.unwrap();
    assert_eq!(suspended, Some(SuspendStatus::Paused));
    // The round in progress finished; the next model call was not made.
    assert_eq!(slow.executions().len(), 1);
    assert_eq!(mock.request_count(), 1);
    assert!(status(&log, session, SessionStatus::Paused).await);
    let events = log.load(session).await.unwrap();
    assert_eq!(events.last().unwrap().1.kind(), "run_paused");
    // Pausing a run that is not live is refused.
    assert!(matches!(
        manager.pause(run_id),
        Err(SessionError::WrongState { .. })
    ));

    // A restart leaves it paused.
    drop(manager);
    let manager = build(&mock, vec![slow.clone()], log.clone());
    assert!(manager.recover().await.unwrap().is_empty());
    assert!(status(&log, session, SessionStatus::Paused).await);
    let output = manager
        .resume_paused(session, run_id)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(output.run_id, run_id);
    assert_eq!(output.text, "Resumed and done.");
    assert_eq!(output.rounds, 2);
    assert!(status(&log, session, SessionStatus::Idle).await);
    let events = log.load(session).await.unwrap();
    assert!(kinds(&events).contains(&"run_resumed"));
    // Resuming a run that is not paused is refused.
    assert!(matches!(
        manager.resume_paused(session, run_id).await,
        Err(SessionError::WrongState { .. })
    ));
    assert!(matches!(
        manager.resume_paused(session, RunId::new()).await,
        Err(SessionError::NoSuchRun { .. })
    ));
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn interrupt_stops_a_live_run_and_keeps_the_session_usable() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Still here.")));
    let slow = ProbeTool::lookup().sleeping(Duration::from_secs(5));
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![slow.clone()], log.clone());
    let session = manager.create_session().await.unwrap();
    let mut stream = manager
        .send(session, RunRequest::text("slow"), BusyPolicy::Reject)
        .await
        .unwrap();
    let run_id = until_a_tool_starts(&mut stream).await;
    let started = std::time::Instant::now();
    assert!(manager.interrupt(session, run_id).await.unwrap());
    let output = stream.finish().await.unwrap();
    assert_eq!(output.stop_reason, RunStopReason::Cancelled);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "the tool was cancelled"
    );
    assert_eq!(*slow.cancelled.lock().unwrap(), 1);
    assert!(status(&log, session, SessionStatus::Interrupted).await);
    let next = manager
        .send(session, RunRequest::text("again"), BusyPolicy::Reject)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(next.text, "Still here.");
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn interrupting_a_waiting_run_ends_it() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![ProbeTool::lookup()], log.clone());
    let session = manager.create_session().await.unwrap();
    let (run_id, _) = waiting_run(&manager, &log, session).await;
    assert!(manager.interrupt(session, run_id).await.unwrap());
    assert!(status(&log, session, SessionStatus::Interrupted).await);
    assert!(manager.pending_approvals(session).await.unwrap().is_none());
    let events = log.load(session).await.unwrap();
    assert!(matches!(
        &events.last().unwrap().1,
        SessionEvent::RunFinished { stop_reason: RunStopReason::Cancelled, note: Some(note), .. }
            if note.contains("approval")
    ));
}

#[tokio::test]
async fn abort_cancels_the_run_and_drops_the_queue() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    let slow = ProbeTool::lookup().sleeping(Duration::from_secs(5));
    let log = Arc::new(MemoryLog::default());
    let manager = build(&mock, vec![slow], log.clone());
    let session = manager.create_session().await.unwrap();
    let mut first = manager
        .send(session, RunRequest::text("first"), BusyPolicy::Reject)
        .await
        .unwrap();
    let run_id = until_a_tool_starts(&mut first).await;
    let queued: Vec<_> = futures::future::join_all(
        ["queued one", "queued two"]
            .map(|text| manager.send(session, RunRequest::text(text), BusyPolicy::Enqueue)),
    )
    .await
    .into_iter()
    .map(Result::unwrap)
    .collect();
    assert_eq!(manager.abort(session, run_id).await.unwrap(), 2);
    assert_eq!(
        first.finish().await.unwrap().stop_reason,
        RunStopReason::Cancelled
    );
    for stream in queued {
        assert_eq!(
            stream.finish().await.unwrap().stop_reason,
            RunStopReason::Cancelled
        );
    }
    assert_eq!(
        mock.request_count(),
        1,
        "no queued message reached the model"
    );
    let history = manager.history(session).await.unwrap();
    assert!(!history.iter().any(
        |m| matches!(m, Message::User { content } if format!("{content:?}").contains("queued"))
    ));
    let runs = log
        .load(session)
        .await
        .unwrap()
        .iter()
        .filter(|(_, e)| e.kind() == "run_started")
        .count();
    assert_eq!(runs, 1);
}
