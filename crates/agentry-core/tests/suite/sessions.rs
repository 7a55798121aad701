//! Durable sessions over an in-memory log: write-through, the busy policies, many sessions at
//! once, and recovery of a run that was in flight when the process stopped.

use std::sync::Arc;
use std::time::Duration;

use agentry_core::RunRequest;
use agentry_core::session::{
    BusyPolicy, MemoryLog, NewSessionInfo, SessionError, SessionLog, SessionManager, SessionStatus,
};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::{
    AssistantPart, Message, RunEvent, RunId, RunStopReason, SessionEvent, StopReason, ToolCall,
    Usage,
};
use futures::StreamExt;
use serde_json::json;

use super::support::{PROTOCOLS, ProbeTool, builder, limits};

fn kinds(events: &[(u64, SessionEvent)]) -> Vec<&'static str> {
    events.iter().map(|(_, e)| e.kind()).collect()
}

async fn manager(
    mock: &MockProvider,
    protocol: agentry_llm::Protocol,
    tools: Vec<ProbeTool>,
) -> (SessionManager, Arc<MemoryLog>) {
    let mut builder = builder(mock, protocol);
    for tool in tools {
        builder.tool(tool).unwrap();
    }
    builder.limits(limits());
    let log = Arc::new(MemoryLog::default());
    (SessionManager::new(builder.build(), log.clone()), log)
}

#[tokio::test]
async fn runs_write_through_the_log_and_later_runs_see_the_history() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "lookup",
            json!({"id": 1}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("It is a teapot.")));
        mock.enqueue(Reply::scripted(ScriptedTurn::text(
            "You asked about item 1.",
        )));
        let (manager, log) = manager(&mock, protocol, vec![ProbeTool::lookup()]).await;
        let session = manager.create_session().await.unwrap();

        let request = RunRequest::text("What is item 1?").with_system("Be brief.");
        let mut first = manager
            .send(session, request, BusyPolicy::Reject)
            .await
            .unwrap();
        // Every committed step is reported with its seq in the log, in order.
        let mut committed = Vec::new();
        // The commits, answers and end in the order they are reported.
        let mut trace = Vec::new();
        while let Some(event) = first.next().await {
            match event {
                RunEvent::Committed { seq, .. } => {
                    committed.push(seq);
                    trace.push(format!("committed {seq}"));
                }
                RunEvent::AssistantMessage { round, .. } => trace.push(format!("answer {round}")),
                RunEvent::RunFinished { .. } => trace.push("finished".to_owned()),
                _ => {}
            }
        }
        // An answer is reported after its commit, the end after the last answer.
        assert_eq!(
            trace[trace.len() - 4..],
            ["committed 7", "answer 2", "committed 8", "finished"],
            "{protocol:?}"
        );
        assert!(
            trace.iter().position(|t| t == "committed 4")
                < trace.iter().position(|t| t == "answer 1"),
            "{trace:?}"
        );
        let output = first.finish().await.unwrap();
        assert_eq!(output.text, "It is a teapot.", "{protocol:?}");
        assert_eq!(committed, (1..=8).collect::<Vec<u64>>());
        // Four writes for a two-round tool loop: the start, the first answer with the call's
        // intent, the call's result, and the last answer with the run's end.
        assert_eq!(log.appends(), 4, "{protocol:?}");
        let events = log.load(session).await.unwrap();
        assert_eq!(
            kinds(&events),
            [
                "run_started",
                "message",
                "message",
                "assistant_message",
                "tool_call_intent",
                "tool_call_result",
                "assistant_message",
                "run_finished"
            ]
        );

        // The second run's history comes from the log; the system prompt is not repeated.
        let second = manager
            .send(
                session,
                RunRequest::text("What did I ask?").with_system("Be brief."),
                BusyPolicy::Reject,
            )
            .await
            .unwrap();
        assert_eq!(
            second.finish().await.unwrap().text,
            "You asked about item 1."
        );
        let history = manager.history(session).await.unwrap();
        assert_eq!(history.len(), 7);
        assert_eq!(
            history
                .iter()
                .filter(|m| matches!(m, Message::System { .. }))
                .count(),
            1
        );
        let sent = mock.requests()[2].body.to_string();
        assert!(sent.contains("What is item 1?") && sent.contains("teapot"));
        mock.check_protocol()
            .unwrap_or_else(|v| panic!("{protocol:?}: {v:?}"));
        assert_eq!(
            log.sessions_with_status(SessionStatus::Idle).await.unwrap(),
            vec![session]
        );
    }
}

/// A run told to create its session does so with its first write: the empty log is not read
/// first, and the creation and the run's start are one append.
#[tokio::test]
async fn a_run_creates_its_new_session_with_its_first_write() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Hello.")));
    let (manager, log) = manager(&mock, PROTOCOLS[0], vec![]).await;
    let session = agentry_types::SessionId::new();
    // Nobody created it: a plain run finds no log to read.
    assert!(matches!(
        log.load(session).await,
        Err(agentry_core::session::LogError::NotFound(_))
    ));
    let mut request = RunRequest::text("Hi");
    request.new_session = Some(NewSessionInfo {
        title: Some("Hi".into()),
        owner: None,
    });
    let run = manager
        .send(session, request, BusyPolicy::Reject)
        .await
        .unwrap();
    assert_eq!(run.finish().await.unwrap().text, "Hello.");
    // Two writes: the session with the run's start, the answer with the run's end.
    assert_eq!(log.appends(), 2);
    assert_eq!(
        kinds(&log.load(session).await.unwrap()),
        [
            "run_started",
            "message",
            "assistant_message",
            "run_finished"
        ]
    );
    assert_eq!(
        log.sessions_with_status(SessionStatus::Idle).await.unwrap(),
        vec![session]
    );
}

/// A log whose session creations wait until released, or fail.
struct HeldLog {
    inner: Arc<MemoryLog>,
    released: tokio::sync::Semaphore,
    fail: bool,
}

impl HeldLog {
    fn new(fail: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: Arc::new(MemoryLog::default()),
            released: tokio::sync::Semaphore::new(0),
            fail,
        })
    }
}

impl SessionLog for HeldLog {
    fn create(
        &self,
        session: agentry_types::SessionId,
    ) -> futures::future::BoxFuture<'_, Result<(), agentry_core::session::LogError>> {
        self.inner.create(session)
    }

    fn append(
        &self,
        session: agentry_types::SessionId,
        events: Vec<SessionEvent>,
    ) -> futures::future::BoxFuture<'_, Result<u64, agentry_core::session::LogError>> {
        self.inner.append(session, events)
    }

    fn load(
        &self,
        session: agentry_types::SessionId,
    ) -> futures::future::BoxFuture<
        '_,
        Result<Vec<(u64, SessionEvent)>, agentry_core::session::LogError>,
    > {
        self.inner.load(session)
    }

    fn set_status(
        &self,
        session: agentry_types::SessionId,
        status: SessionStatus,
    ) -> futures::future::BoxFuture<'_, Result<(), agentry_core::session::LogError>> {
        self.inner.set_status(session, status)
    }

    fn create_with(
        &self,
        session: agentry_types::SessionId,
        info: NewSessionInfo,
        events: Vec<SessionEvent>,
        status: SessionStatus,
    ) -> futures::future::BoxFuture<'_, Result<u64, agentry_core::session::LogError>> {
        Box::pin(async move {
            let _permit = self.released.acquire().await.unwrap();
            if self.fail {
                return Err(agentry_core::session::LogError::Storage(
                    "the disk is full".into(),
                ));
            }
            self.inner.create_with(session, info, events, status).await
        })
    }

    fn sessions_with_status(
        &self,
        status: SessionStatus,
    ) -> futures::future::BoxFuture<
        '_,
        Result<Vec<agentry_types::SessionId>, agentry_core::session::LogError>,
    > {
        self.inner.sessions_with_status(status)
    }
}

/// A run answered "Hello." started in a new session over a [`HeldLog`] (whose creation then
/// fails when `fail`); returns once the model call arrived while the creation is still held.
async fn run_with_held_start(
    fail: bool,
) -> (
    MockProvider,
    Arc<HeldLog>,
    agentry_types::SessionId,
    agentry_core::RunStream,
) {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Hello.")));
    let log = HeldLog::new(fail);
    let mut builder = builder(&mock, PROTOCOLS[0]);
    builder.limits(limits());
    let manager = SessionManager::new(builder.build(), log.clone());
    let session = agentry_types::SessionId::new();
    let mut request = RunRequest::text("Hi");
    request.new_session = Some(NewSessionInfo {
        title: None,
        owner: None,
    });
    let mut run = manager
        .send(session, request, BusyPolicy::Reject)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while mock.request_count() == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the model call goes out while the run's start is being written");
    // The answer is there, but nothing of the run is reported before its start commits.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        tokio::time::timeout(Duration::from_millis(1), run.next())
            .await
            .is_err(),
        "an event was reported before the run's start was committed"
    );
    assert!(log.inner.load(session).await.is_err());
    (mock, log, session, run)
}

#[tokio::test]
async fn a_new_runs_model_call_goes_out_while_its_start_commits() {
    let (_mock, log, session, mut run) = run_with_held_start(false).await;
    log.released.add_permits(1);
    let mut trace = Vec::new();
    let mut text = String::new();
    while let Some(event) = run.next().await {
        match event {
            RunEvent::Committed { seq, event } => trace.push(format!("{seq} {}", event.kind())),
            RunEvent::RunStarted { .. } => trace.push("started".to_owned()),
            RunEvent::TextDelta { text: delta } => {
                if text.is_empty() {
                    trace.push("first delta".to_owned());
                }
                text.push_str(&delta);
            }
            RunEvent::RunFinished { .. } => trace.push("finished".to_owned()),
            _ => {}
        }
    }
    assert_eq!(text, "Hello.");
    // The same order as when the start is committed before the call: the start's commits,
    // the run's start, then the answer.
    assert_eq!(
        trace,
        [
            "1 run_started",
            "2 message",
            "started",
            "first delta",
            "3 assistant_message",
            "4 run_finished",
            "finished"
        ]
    );
    assert_eq!(
        kinds(&log.load(session).await.unwrap()),
        [
            "run_started",
            "message",
            "assistant_message",
            "run_finished"
        ]
    );
}

#[tokio::test]
async fn a_run_whose_start_cannot_be_written_reports_nothing_of_its_answer() {
    let (_mock, log, session, mut run) = run_with_held_start(true).await;
    log.released.add_permits(1);
    let mut events = Vec::new();
    while let Some(event) = run.next().await {
        events.push(event);
    }
    assert_eq!(events.len(), 1, "{events:?}");
    match &events[0] {
        RunEvent::RunFailed { error, .. } => {
            assert!(error.message.contains("the disk is full"), "{error:?}");
            assert!(error.retryable);
        }
        other => panic!("expected the run to fail, got {other:?}"),
    }
    // Nothing was written after the failed start: no session, no end.
    assert!(log.load(session).await.is_err());
    assert_eq!(log.inner.appends(), 0);
}

/// A session whose first run waits in a slow tool.
async fn busy_session(
    mock: &MockProvider,
) -> (
    SessionManager,
    agentry_types::SessionId,
    ProbeTool,
    agentry_core::RunStream,
) {
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    let slow = ProbeTool::lookup().sleeping(Duration::from_millis(600));
    let (manager, _log) = manager(mock, agentry_llm::Protocol::OpenAi, vec![slow.clone()]).await;
    let session = manager.create_session().await.unwrap();
    let mut first = manager
        .send(session, RunRequest::text("first"), BusyPolicy::Reject)
        .await
        .unwrap();
    while let Some(event) = first.next().await {
        if matches!(event, RunEvent::ToolCallStarted { .. }) {
            break;
        }
    }
    (manager, session, slow, first)
}

#[tokio::test]
async fn reject_names_the_running_run() {
    let mock = MockProvider::start().await.unwrap();
    let (manager, session, _slow, first) = busy_session(&mock).await;
    let running = manager.active_run(session).expect("a run is active");
    match manager
        .send(session, RunRequest::text("second"), BusyPolicy::Reject)
        .await
    {
        Err(SessionError::Busy { run_id, .. }) => assert_eq!(run_id, Some(running)),
        Err(other) => panic!("expected busy, got {other:?}"),
        Ok(_) => panic!("expected busy, got a run"),
    }
    mock.enqueue(Reply::scripted(ScriptedTurn::text("first done")));
    assert_eq!(first.finish().await.unwrap().text, "first done");
    assert!(manager.active_run(session).is_none());
}

#[tokio::test]
async fn enqueue_runs_after_the_current_run() {
    let mock = MockProvider::start().await.unwrap();
    let (manager, session, slow, first) = busy_session(&mock).await;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("first done")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("second done")));
    let second = manager
        .send(session, RunRequest::text("second"), BusyPolicy::Enqueue)
        .await
        .unwrap();
    let second = second.finish().await.unwrap();
    assert_eq!(second.text, "second done");
    assert_eq!(first.finish().await.unwrap().text, "first done");
    assert_eq!(slow.executions().len(), 1);
    // The second run saw the whole first run.
    let sent = mock.requests()[2].body.to_string();
    assert!(sent.contains("first done") && sent.contains("second"));
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn queued_runs_are_capped_per_session() {
    let mock = MockProvider::start().await.unwrap();
    let (manager, session, _slow, first) = busy_session(&mock).await;
    assert_eq!(
        manager.max_queued_runs(),
        agentry_core::session::DEFAULT_MAX_QUEUED_RUNS
    );
    manager.set_max_queued_runs(2);
    let mut queued = Vec::new();
    for text in ["second", "third"] {
        queued.push(
            manager
                .send(session, RunRequest::text(text), BusyPolicy::Enqueue)
                .await
                .unwrap(),
        );
    }
    for policy in [BusyPolicy::Enqueue, BusyPolicy::Interrupt] {
        match manager
            .send(session, RunRequest::text("one too many"), policy)
            .await
        {
            Err(error) => {
                let SessionError::QueueFull { session: full, max } = &error else {
                    panic!("{policy:?}: expected a full queue, got {error:?}");
                };
                assert_eq!((*full, *max), (session, 2));
                assert!(error.to_string().contains("2 runs queued"), "{error}");
            }
            Ok(_) => panic!("{policy:?}: expected a full queue, got a run"),
        }
    }
    // Another session is not affected.
    let other = manager.create_session().await.unwrap();
    // The other run's model call comes first: the first run is still in its slow tool.
    mock.enqueue(Reply::scripted(ScriptedTurn::text("other done")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("first done")));
    let other_run = manager
        .send(other, RunRequest::text("hi"), BusyPolicy::Enqueue)
        .await
        .unwrap();
    assert_eq!(other_run.finish().await.unwrap().text, "other done");

    // A queued run that is cancelled frees its place.
    queued[1].cancel();
    queued.push(
        manager
            .send(session, RunRequest::text("fourth"), BusyPolicy::Enqueue)
            .await
            .unwrap(),
    );
    for run in &queued {
        run.cancel();
    }
    assert_eq!(first.finish().await.unwrap().text, "first done");
    for run in queued {
        assert_eq!(
            run.finish().await.unwrap().stop_reason,
            RunStopReason::Cancelled
        );
    }
    assert_eq!(manager.tracked_sessions(), 0);
}

#[tokio::test]
async fn interrupt_cancels_the_current_run_then_runs() {
    let mock = MockProvider::start().await.unwrap();
    let (manager, session, slow, first) = busy_session(&mock).await;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("second done")));
    let second = manager
        .send(session, RunRequest::text("second"), BusyPolicy::Interrupt)
        .await
        .unwrap();
    let first = first.finish().await.unwrap();
    assert_eq!(first.stop_reason, RunStopReason::Cancelled);
    let second = second.finish().await.unwrap();
    assert_eq!(second.text, "second done");
    assert_eq!(
        *slow.cancelled.lock().unwrap(),
        1,
        "the slow tool was told to stop"
    );
    // The interrupted call got a result before the next model call: a valid history.
    mock.check_protocol().unwrap();
    assert_eq!(mock.request_count(), 2);
}

#[tokio::test]
async fn hundreds_of_sessions_at_once() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("ok").with_usage(3, 1)));
    let (manager, log) = manager(&mock, agentry_llm::Protocol::Ollama, vec![]).await;
    let mut sessions = Vec::new();
    for _ in 0..300 {
        sessions.push(manager.create_session().await.unwrap());
    }
    let runs = futures::future::join_all(sessions.iter().map(|session| {
        let manager = manager.clone();
        let session = *session;
        async move {
            manager
                .send(session, RunRequest::text("hi"), BusyPolicy::Reject)
                .await
                .unwrap()
                .finish()
                .await
                .unwrap()
        }
    }))
    .await;
    assert!(runs.iter().all(|run| run.text == "ok"));
    // Finished sessions leave no writer lock behind.
    assert_eq!(manager.tracked_sessions(), 0);
    for session in sessions {
        assert_eq!(
            kinds(&log.load(session).await.unwrap()),
            [
                "run_started",
                "message",
                "assistant_message",
                "run_finished"
            ]
        );
    }
    assert_eq!(mock.request_count(), 300);
}

#[tokio::test]
async fn a_run_cancelled_while_queued_never_starts() {
    let mock = MockProvider::start().await.unwrap();
    let (manager, session, _slow, first) = busy_session(&mock).await;
    let queued = manager
        .send(session, RunRequest::text("never"), BusyPolicy::Enqueue)
        .await
        .unwrap();
    queued.cancel();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("first done")));
    first.finish().await.unwrap();
    let queued = queued.finish().await.unwrap();
    assert_eq!(queued.stop_reason, RunStopReason::Cancelled);
    assert_eq!(manager.tracked_sessions(), 0);
    let history = manager.history(session).await.unwrap();
    assert!(!history.iter().any(
        |m| matches!(m, Message::User { content } if format!("{content:?}").contains("never"))
    ));
}

/// Writes the log a crash would leave: a run whose model asked for two tools, whose intents are
/// committed and whose results are not.
async fn crashed_session(
    log: &MemoryLog,
    idempotent_args: serde_json::Value,
    other_args: serde_json::Value,
) -> agentry_types::SessionId {
    crashed_session_with(log, idempotent_args, other_args, serde_json::Value::Null).await
}

/// [`crashed_session`] with an approval policy recorded in its `run_started`.
pub(crate) async fn crashed_session_with(
    log: &MemoryLog,
    idempotent_args: serde_json::Value,
    other_args: serde_json::Value,
    approvals: serde_json::Value,
) -> agentry_types::SessionId {
    let session = agentry_types::SessionId::new();
    log.create(session).await.unwrap();
    let run_id = RunId::new();
    let calls = [
        ToolCall::new("call_a", "reader", idempotent_args),
        ToolCall::new("call_b", "lookup", other_args),
    ];
    log.append(
        session,
        vec![
            SessionEvent::RunStarted {
                run_id,
                model: "mock".into(),
                tools: vec!["reader".into(), "lookup".into()],
                params: json!({}),
                limits: serde_json::to_value(limits()).unwrap(),
                fallback_models: Vec::new(),
                approvals: approvals.clone(),
                network: json!(null),
                agent_id: None,
                grant: json!(null),
            },
            SessionEvent::Message {
                run_id,
                message: Message::user("do both"),
            },
            SessionEvent::AssistantMessage {
                run_id,
                round: 1,
                content: calls.iter().cloned().map(AssistantPart::ToolCall).collect(),
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 4,
                    ..Usage::default()
                },
                stop_reason: StopReason::ToolUse,
                model: None,
                agent_id: None,
                cost_usd: None,
                duration_ms: None,
                first_output_ms: None,
            },
            SessionEvent::ToolCallIntent {
                run_id,
                call: calls[0].clone(),
                idempotent: true,
            },
            SessionEvent::ToolCallIntent {
                run_id,
                call: calls[1].clone(),
                idempotent: false,
            },
        ],
    )
    .await
    .unwrap();
    log.set_status(session, SessionStatus::Running)
        .await
        .unwrap();
    session
}

/// `ProbeTool` marked idempotent.
pub(crate) struct Idempotent(pub(crate) ProbeTool);

impl agentry_core::tool::Tool for Idempotent {
    fn spec(&self) -> &agentry_types::ToolSpec {
        self.0.spec()
    }
    fn idempotent(&self) -> bool {
        true
    }
    fn call(
        &self,
        arguments: serde_json::Value,
        context: agentry_core::tool::ToolContext,
    ) -> futures::future::BoxFuture<
        'static,
        Result<agentry_core::tool::ToolOutput, agentry_core::tool::ToolError>,
    > {
        self.0.call(arguments, context)
    }
}

#[tokio::test]
async fn recovery_reruns_only_idempotent_calls() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(
            ScriptedTurn::text("Recovered.").with_usage(30, 2),
        ));
        let reader = ProbeTool::new(
            "reader",
            json!({"type": "object", "properties": {"id": {"type": "integer"}}}),
        );
        let lookup = ProbeTool::lookup();
        let mut builder = builder(&mock, protocol);
        builder.tool(Idempotent(reader.clone())).unwrap();
        builder.tool(lookup.clone()).unwrap();
        let log = Arc::new(MemoryLog::default());
        let manager = SessionManager::new(builder.build(), log.clone());
        let session = crashed_session(&log, json!({"id": 1}), json!({"id": 2})).await;

        let recovered = manager.recover().await.unwrap();
        assert_eq!(recovered.len(), 1, "{protocol:?}");
        let (id, stream) = recovered.into_iter().next().unwrap();
        assert_eq!(id, session);
        let output = stream.finish().await.unwrap();
        assert_eq!(output.text, "Recovered.");
        // Counters and usage carried over from before the crash.
        assert_eq!(output.rounds, 2);
        assert_eq!(output.usage.input_tokens, 40);
        assert_eq!(
            reader.executions().len(),
            1,
            "the idempotent tool ran again"
        );
        assert!(
            lookup.executions().is_empty(),
            "the other tool did not run twice"
        );
        let events = log.load(session).await.unwrap();
        let unknown = events.iter().any(|(_, e)| matches!(e,
            SessionEvent::ToolCallResult { result, .. } if result.call_id == "call_b" && result.is_error
                && result.text_content().contains("may or may not have taken effect")));
        assert!(
            unknown,
            "the non-idempotent call got an outcome-unknown result"
        );
        assert_eq!(events.last().unwrap().1.kind(), "run_finished");
        mock.check_protocol()
            .unwrap_or_else(|v| panic!("{protocol:?}: {v:?}"));
        assert!(
            log.sessions_with_status(SessionStatus::Running)
                .await
                .unwrap()
                .is_empty()
        );
        // Nothing left to recover.
        assert!(manager.recover().await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn a_new_message_closes_a_run_nobody_recovered() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Fresh start.")));
    let (manager, log) = manager(
        &mock,
        agentry_llm::Protocol::Anthropic,
        vec![ProbeTool::lookup()],
    )
    .await;
    let session = crashed_session(&log, json!({"id": 1}), json!({"id": 2})).await;
    let output = manager
        .send(
            session,
            RunRequest::text("anyone there?"),
            BusyPolicy::Reject,
        )
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(output.text, "Fresh start.");
    // Both lost calls were closed (neither ran), and the provider saw a valid history.
    mock.check_protocol().unwrap();
    let sent = mock.requests()[0].body.to_string();
    assert!(sent.contains("may or may not have taken effect"));
}

#[tokio::test]
async fn continuing_after_an_interruption_gives_a_valid_history() {
    let mock = MockProvider::start().await.unwrap();
    let (manager, session, _slow, first) = busy_session(&mock).await;
    first.cancel();
    assert_eq!(
        first.finish().await.unwrap().stop_reason,
        RunStopReason::Cancelled
    );
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Continuing.")));
    // No new input: the model continues from the history.
    let output = manager
        .send(session, RunRequest::default(), BusyPolicy::Reject)
        .await
        .unwrap()
        .finish()
        .await
        .unwrap();
    assert_eq!(output.text, "Continuing.");
    mock.check_protocol().unwrap();
}

/// Issue 48: a run's end is reported only once the session can take the next run, so a
/// client that sends the next turn the moment it is told the run ended is never refused as
/// busy (`BusyPolicy::Reject`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_turn_sent_the_moment_a_run_ends_is_never_refused() {
    let mock = MockProvider::start().await.unwrap();
    const TURNS: usize = 300;
    for n in 0..TURNS {
        mock.enqueue(Reply::scripted(ScriptedTurn::text(format!("answer {n}"))));
    }
    let (manager, _log) = manager(&mock, agentry_llm::Protocol::OpenAi, Vec::new()).await;
    let session = manager.create_session().await.unwrap();
    for n in 0..TURNS {
        let mut run = match manager
            .send(
                session,
                RunRequest::text(format!("turn {n}")),
                BusyPolicy::Reject,
            )
            .await
        {
            Ok(run) => run,
            Err(error) => panic!("turn {n} was refused: {error}"),
        };
        // Read to the end event and no further: the next turn goes at once.
        while let Some(event) = run.next().await {
            if event.is_terminal() {
                break;
            }
        }
    }
}
