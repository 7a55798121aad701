//! The tokio driver: performs the engine's steps and reports every one as a [`RunEvent`].
//!
//! The driver owns all IO of a run: it streams the model call (forwarding deltas live), runs a
//! round's tool calls in parallel (bounded by a semaphore, each in its own task so a panicking
//! tool cannot take the run down), and enforces the run's deadline and cancellation around every
//! step. Cancellation reaches the model stream and every running tool promptly: their futures
//! are dropped and their cancellation tokens fire.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use agentry_llm::{LlmError, ModelClient, ModelRequest};
use agentry_types::{
    ErrorCode, ErrorInfo, ModelEvent, ModelResponse, RunEvent, RunStopReason, SessionEvent,
    SuspendStatus, ToolCall, ToolResultPart,
};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::{Phase, RunState, Step, ToolOutcome};
pub use crate::events::EventSink;
use crate::session::{LogError, SessionLog, SessionStatus};
use crate::tool::{
    CANCEL_GRACE, ToolContext, ToolEffect, ToolError, ToolOutput, ToolRegistry, result_for_model,
};

/// How long cancelled tools get to stop on their own before their tasks are aborted: the
/// registry's own grace for a cancelled tool, plus a margin to report the result.
const TOOL_STOP_GRACE: Duration = CANCEL_GRACE.saturating_add(Duration::from_millis(50));

/// Where a run's committed steps are written: the session's log.
#[derive(Clone)]
pub struct Journal {
    log: Arc<dyn SessionLog>,
    session: agentry_types::SessionId,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal")
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl Journal {
    /// A journal writing to `session` in `log`.
    pub fn new(log: Arc<dyn SessionLog>, session: agentry_types::SessionId) -> Self {
        Self { log, session }
    }

    /// Appends `events`, then reports each as [`RunEvent::Committed`] with its seq.
    async fn record(&self, events: Vec<SessionEvent>, sink: &EventSink) -> Result<(), LogError> {
        let count = events.len() as u64;
        let last = self.log.append(self.session, events.clone()).await?;
        let first = last + 1 - count.min(last + 1);
        for (offset, event) in events.into_iter().enumerate() {
            sink.send(RunEvent::Committed {
                seq: first + offset as u64,
                event,
            })
            .await;
        }
        Ok(())
    }
}

/// The error a run ends with when its log cannot be written: without the log the run's
/// steps could be lost, so it must not go on.
fn storage_error(error: &LogError) -> ErrorInfo {
    ErrorInfo {
        code: ErrorCode::Internal,
        message: format!("the run stopped because its session log failed: {error}"),
        retryable: true,
        status: None,
    }
}

/// Records `events` if the run has a journal; a failure ends the run.
async fn commit(
    journal: Option<&Journal>,
    state: &mut RunState,
    events: Vec<SessionEvent>,
    sink: &EventSink,
) {
    if let Some(journal) = journal
        && let Err(error) = journal.record(events, sink).await
    {
        tracing::error!(run_id = %state.run_id, "session log write failed: {error}");
        state.fail(storage_error(&error));
    }
}

/// How a guarded step ended.
enum Guarded<T> {
    Done(T),
    Cancelled,
    Expired,
}

async fn guarded<T>(
    cancel: &CancellationToken,
    deadline: Option<Instant>,
    step: impl Future<Output = T>,
) -> Guarded<T> {
    let expiry = async {
        match deadline {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        biased;
        _ = cancel.cancelled() => Guarded::Cancelled,
        _ = expiry => Guarded::Expired,
        done = step => Guarded::Done(done),
    }
}

/// The run's deadline as an instant, counted from when the run started (kept in the state, so a
/// resumed run does not get a fresh allowance).
fn deadline_of(state: &mut RunState) -> Option<Instant> {
    let now_ms = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let started_ms = *state.started_at_ms.get_or_insert(now_ms);
    let limit = state.limits.deadline?;
    let elapsed = Duration::from_millis(now_ms.saturating_sub(started_ms));
    Some(Instant::now() + limit.saturating_sub(elapsed))
}

/// Compacts the conversation when the next request would not fit (or always, when `force`),
/// and records the compaction. Returns whether anything was compacted. A conversation that
/// cannot fit even compacted is left to the provider when not forced (the estimate may be
/// cautious), and ends the run when forced.
async fn fit_context(
    state: &mut RunState,
    model: &dyn ModelClient,
    summarizer: Option<&Arc<dyn ModelClient>>,
    force: bool,
    cancel: &CancellationToken,
    journal: Option<&Journal>,
    events: &EventSink,
) -> bool {
    // Compaction cuts between whole units, which it finds in the repaired history.
    crate::repair::repair_history(&mut state.messages);
    match crate::compactor::compact(state, model, summarizer, force, cancel).await {
        Ok(Some(event)) => {
            commit(journal, state, vec![event], events).await;
            true
        }
        Ok(None) => false,
        Err(error) if force => {
            state.fail(ErrorInfo {
                code: ErrorCode::ContextLengthExceeded,
                message: error.to_string(),
                retryable: false,
                status: None,
            });
            false
        }
        Err(error) => {
            tracing::warn!(run_id = %state.run_id, "{error}; sending the request anyway");
            false
        }
    }
}

/// Drives `state` until the run is finished, sending every event to `events`. Returns the final
/// state (which serialises, for storage or inspection).
pub async fn drive(
    state: RunState,
    model: Arc<dyn ModelClient>,
    tools: ToolRegistry,
    events: EventSink,
    cancel: CancellationToken,
    journal: Option<Journal>,
) -> RunState {
    drive_controlled(state, model, None, tools, events, cancel, None, journal).await
}

/// Like [`drive`], and a run whose `pause` token fires stops at the next safe point (before a
/// model call, when the round before it has finished): it commits `run_paused`, marks the
/// session `paused` and returns the state unfinished. A run whose calls wait for approval
/// stops the same way with `waiting`. Both end their stream with [`RunEvent::RunSuspended`].
///
/// `summarizer` writes the summaries of context compaction (the model named by the run's
/// context policy); without it, compaction drops old turns.
#[allow(clippy::too_many_arguments)]
pub async fn drive_controlled(
    mut state: RunState,
    model: Arc<dyn ModelClient>,
    summarizer: Option<Arc<dyn ModelClient>>,
    tools: ToolRegistry,
    events: EventSink,
    cancel: CancellationToken,
    pause: Option<CancellationToken>,
    journal: Option<Journal>,
) -> RunState {
    let deadline = deadline_of(&mut state);
    let mut suspended = None;
    events
        .send(RunEvent::RunStarted {
            run_id: state.run_id,
        })
        .await;
    loop {
        if matches!(state.phase, Phase::CallModel)
            && state.context.is_some()
            && !pause.as_ref().is_some_and(CancellationToken::is_cancelled)
        {
            fit_context(
                &mut state,
                &*model,
                summarizer.as_ref(),
                false,
                &cancel,
                journal.as_ref(),
                &events,
            )
            .await;
        }
        match state.next_step() {
            Step::Finish => break,
            Step::CallModel(_) if pause.as_ref().is_some_and(CancellationToken::is_cancelled) => {
                let paused = SessionEvent::RunPaused {
                    run_id: state.run_id,
                };
                // Commit, record the status, then report: a client that sees the pause also
                // sees the status.
                if let Some(journal) = &journal {
                    match journal
                        .log
                        .append(journal.session, vec![paused.clone()])
                        .await
                    {
                        Ok(seq) => {
                            set_status(Some(journal), SessionStatus::Paused).await;
                            events
                                .send(RunEvent::Committed { seq, event: paused })
                                .await;
                        }
                        Err(error) => {
                            state.fail(storage_error(&error));
                            continue;
                        }
                    }
                }
                suspended = Some(SuspendStatus::Paused);
                break;
            }
            Step::AwaitApproval => {
                if !state.approvals_decided() {
                    // The requests were committed with the assistant message.
                    set_status(journal.as_ref(), SessionStatus::Waiting).await;
                    suspended = Some(SuspendStatus::Waiting);
                    break;
                }
                let Ok(rejected) = state.continue_after_approvals() else {
                    state.fail(ErrorInfo {
                        code: ErrorCode::Internal,
                        message: "the run's approvals could not be applied".into(),
                        retryable: false,
                        status: None,
                    });
                    continue;
                };
                // The approved calls' intents first, then the rejections' results: replay
                // counts the round as done once no intent is left unanswered.
                let mut records: Vec<SessionEvent> = Vec::new();
                if let Phase::RunTools { calls, .. } = &state.phase {
                    records.extend(calls.iter().map(|call| SessionEvent::ToolCallIntent {
                        run_id: state.run_id,
                        call: call.clone(),
                        idempotent: tools.get(&call.name).is_some_and(|t| t.idempotent()),
                    }));
                }
                records.extend(rejected.iter().map(|result| SessionEvent::ToolCallResult {
                    run_id: state.run_id,
                    result: result.clone(),
                    duration_ms: 0,
                    working_dir: None,
                }));
                commit(journal.as_ref(), &mut state, records, &events).await;
                for result in rejected {
                    events
                        .send(RunEvent::ToolResult {
                            result,
                            duration_ms: 0,
                        })
                        .await;
                }
            }
            Step::CallModel(request) => {
                let round = state.round + 1;
                let call_cancel = cancel.child_token();
                // What the request was estimated at, to calibrate the counter with the
                // provider's reported usage.
                let counted = state.context.as_ref().map(|_| {
                    let counter = model.context().counter;
                    let raw = counter.count_request_raw(&request);
                    (counter, raw)
                });
                let call = call_model(&*model, request, &events, call_cancel.clone());
                match guarded(&cancel, deadline, call).await {
                    Guarded::Done(Ok(response)) => {
                        if let Some((counter, raw)) = counted {
                            counter.observe(raw, response.usage.input_tokens);
                        }
                        state.on_model_response(&response);
                        // The answer and the intents of the calls it asks for are committed
                        // together, before any tool runs.
                        let mut records = vec![SessionEvent::AssistantMessage {
                            run_id: state.run_id,
                            round,
                            content: response.content.clone(),
                            usage: response.usage,
                            stop_reason: response.stop_reason.clone(),
                        }];
                        match &state.phase {
                            Phase::RunTools { calls, .. } => {
                                records.extend(calls.iter().map(|call| {
                                    SessionEvent::ToolCallIntent {
                                        run_id: state.run_id,
                                        call: call.clone(),
                                        idempotent: tools
                                            .get(&call.name)
                                            .is_some_and(|t| t.idempotent()),
                                    }
                                }));
                            }
                            // Calls that wait for approval are requested instead; their
                            // intents are committed once they are decided.
                            Phase::AwaitingApproval { pending, .. } => {
                                records.extend(pending.iter().map(|pending| {
                                    SessionEvent::ApprovalRequested {
                                        run_id: state.run_id,
                                        call: pending.call.clone(),
                                        reason: pending.reason.clone(),
                                    }
                                }));
                            }
                            _ => {}
                        }
                        commit(journal.as_ref(), &mut state, records, &events).await;
                        events
                            .send(RunEvent::AssistantMessage {
                                round,
                                content: response.content,
                                stop_reason: response.stop_reason,
                            })
                            .await;
                        events
                            .send(RunEvent::Usage {
                                round,
                                usage: response.usage,
                            })
                            .await;
                    }
                    Guarded::Done(Err(_)) | Guarded::Cancelled if cancel.is_cancelled() => {
                        state.cancel();
                    }
                    // The provider says the context is too long: one forced compaction and
                    // one retry, never more.
                    Guarded::Done(Err(error))
                        if error.is_context_too_long()
                            && state.context.is_some()
                            && !state.overflow_retried =>
                    {
                        state.overflow_retried = true;
                        let compacted = fit_context(
                            &mut state,
                            &*model,
                            summarizer.as_ref(),
                            true,
                            &cancel,
                            journal.as_ref(),
                            &events,
                        )
                        .await;
                        if !compacted && !state.is_finished() {
                            state.on_model_error(error.info());
                        }
                    }
                    Guarded::Done(Err(error)) => state.on_model_error(error.info()),
                    Guarded::Cancelled => state.cancel(),
                    Guarded::Expired => {
                        call_cancel.cancel();
                        state.expire();
                    }
                }
            }
            Step::RunTools(calls) => {
                let round_cancel = cancel.child_token();
                let finished = Arc::new(Mutex::new(Vec::new()));
                let log_failure = Arc::new(Mutex::new(None));
                let guard = {
                    let run = run_tools(
                        &state,
                        calls,
                        &tools,
                        &events,
                        &round_cancel,
                        &finished,
                        (journal.as_ref(), &log_failure),
                    );
                    tokio::pin!(run);
                    let guard = guarded(&cancel, deadline, &mut run).await;
                    if !matches!(guard, Guarded::Done(())) {
                        // Tell the running tools to stop, and give them a moment to do it
                        // cleanly before their tasks are aborted.
                        round_cancel.cancel();
                        let _ = tokio::time::timeout(TOOL_STOP_GRACE, &mut run).await;
                    }
                    guard
                };
                let outcomes = std::mem::take(&mut *lock(&finished));
                state.on_tool_results(outcomes);
                if let Some(error) = lock(&log_failure).take() {
                    state.fail(storage_error(&error));
                }
                match guard {
                    Guarded::Done(()) => {}
                    Guarded::Cancelled => state.cancel(),
                    Guarded::Expired => state.expire(),
                }
            }
        }
    }
    if let Some(status) = suspended {
        events
            .send(RunEvent::RunSuspended {
                run_id: state.run_id,
                status,
                pending: state.pending_approvals(),
                usage: state.usage,
                rounds: state.round,
            })
            .await;
        return state;
    }
    if let (
        Some(journal),
        Phase::Finished {
            reason,
            error,
            note,
        },
    ) = (&journal, &state.phase)
    {
        let end = SessionEvent::RunFinished {
            run_id: state.run_id,
            stop_reason: *reason,
            usage: state.usage,
            rounds: state.round,
            error: error.clone(),
            note: note.clone(),
        };
        // Commit the end, record the session's status, and only then report the commit: a
        // client that sees the end also sees the new status. (Status after the append: a crash
        // in between leaves a finished run marked running, which recovery simply closes.)
        match journal.log.append(journal.session, vec![end.clone()]).await {
            Ok(seq) => {
                let status = match reason {
                    RunStopReason::Error => SessionStatus::Failed,
                    RunStopReason::Cancelled | RunStopReason::Deadline => {
                        SessionStatus::Interrupted
                    }
                    _ => SessionStatus::Idle,
                };
                if let Err(error) = journal.log.set_status(journal.session, status).await {
                    tracing::error!(session = %journal.session, "could not record the session's status: {error}");
                }
                events.send(RunEvent::Committed { seq, event: end }).await;
            }
            // The run is over either way; recovery will see it as unfinished and close it.
            Err(error) => {
                tracing::error!(run_id = %state.run_id, "could not record the end of the run: {error}")
            }
        }
    }
    events.send(final_event(&state)).await;
    state
}

/// Records the session's status, if the run has a journal (a failure is logged: the log's
/// events, not the status, are the truth recovery goes by).
async fn set_status(journal: Option<&Journal>, status: SessionStatus) {
    if let Some(journal) = journal
        && let Err(error) = journal.log.set_status(journal.session, status).await
    {
        tracing::error!(session = %journal.session, "could not record the session's status: {error}");
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A tool task that panicked while holding the lock leaves valid data behind (a Vec).
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn final_event(state: &RunState) -> RunEvent {
    match &state.phase {
        Phase::Finished {
            reason: RunStopReason::Error,
            error: Some(error),
            ..
        } => RunEvent::RunFailed {
            stop_reason: RunStopReason::Error,
            error: error.clone(),
            usage: state.usage,
            rounds: state.round,
        },
        Phase::Finished { reason, .. } => RunEvent::RunFinished {
            stop_reason: *reason,
            text: state.final_text(),
            usage: state.usage,
            rounds: state.round,
        },
        // `drive` only ends on a finished state.
        _ => RunEvent::RunFinished {
            stop_reason: RunStopReason::Error,
            text: String::new(),
            usage: state.usage,
            rounds: state.round,
        },
    }
}

/// Streams one model call, forwarding deltas, and returns the complete response.
async fn call_model(
    model: &dyn ModelClient,
    request: ModelRequest,
    events: &EventSink,
    cancel: CancellationToken,
) -> Result<ModelResponse, LlmError> {
    let mut stream = model.stream(request, cancel);
    while let Some(item) = stream.next().await {
        let event = match item? {
            ModelEvent::TextDelta { text } => RunEvent::TextDelta { text },
            ModelEvent::ThinkingDelta { text } => RunEvent::ThinkingDelta { text },
            ModelEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => RunEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            },
            ModelEvent::ToolCall { .. } => continue,
            ModelEvent::Completed { response } => return Ok(response),
        };
        events.send(event).await;
    }
    Err(LlmError::StreamEndedEarly {
        detail: "the model stream ended without a response".into(),
    })
}

/// Runs a round's calls in parallel, at most `max_parallel_tools` at a time. Each outcome is
/// pushed to `finished` as soon as it exists, so a cancelled round keeps what completed.
async fn run_tools(
    state: &RunState,
    calls: Vec<ToolCall>,
    tools: &ToolRegistry,
    events: &EventSink,
    cancel: &CancellationToken,
    finished: &Arc<Mutex<Vec<ToolOutcome>>>,
    (journal, log_failure): (Option<&Journal>, &Arc<Mutex<Option<LogError>>>),
) {
    let limits = &state.limits;
    let permits = Arc::new(Semaphore::new(limits.max_parallel_tools.max(1)));
    let caller = Arc::new(crate::tool::CallerInfo {
        run_id: state.run_id,
        session: journal.map(|journal| journal.session),
        model: state.model.clone(),
        tools: state.tools.clone(),
        agent_id: state.agent_id.clone(),
        approvals: state.approvals.clone(),
        network: state.network.clone(),
    });
    let mut tasks = JoinSet::new();
    for call in calls {
        let permits = Arc::clone(&permits);
        let tools = tools.clone();
        let events = events.clone();
        let finished = Arc::clone(finished);
        let context = ToolContext {
            call_id: call.id.clone(),
            working_dir: state.working_dir.clone(),
            workspace: state.workspace.clone(),
            cancel: cancel.child_token(),
            caller: Some(Arc::clone(&caller)),
            events: Some(events.clone()),
            network: state.network.clone(),
        };
        let timeout = limits.tool_timeout;
        let result_limit = limits.result_limit;
        let warning = state.loop_warning(&call.id).map(str::to_owned);
        let journal = journal.cloned();
        let log_failure = Arc::clone(log_failure);
        let run_id = state.run_id;
        tasks.spawn(async move {
            // The semaphore is never closed, so acquiring only waits.
            let _permit = permits.acquire_owned().await;
            events
                .send(RunEvent::ToolCallStarted { call: call.clone() })
                .await;
            let started = Instant::now();
            let outcome = tools
                .invoke(&call.name, call.arguments.clone(), context, timeout)
                .await;
            let working_dir = match &outcome {
                Ok(ToolOutput {
                    effect: Some(ToolEffect::SetWorkingDir(dir)),
                    ..
                }) => Some(dir.clone()),
                _ => None,
            };
            let mut result = result_for_model(&call, outcome, result_limit);
            if let Some(text) = warning {
                result.content.push(ToolResultPart::Text { text });
            }
            let duration_ms = started.elapsed().as_millis() as u64;
            if let Some(journal) = &journal {
                let record = SessionEvent::ToolCallResult {
                    run_id,
                    result: result.clone(),
                    duration_ms,
                    working_dir: working_dir.clone(),
                };
                if let Err(error) = journal.record(vec![record], &events).await {
                    *lock(&log_failure) = Some(error);
                }
            }
            events
                .send(RunEvent::ToolResult {
                    result: result.clone(),
                    duration_ms,
                })
                .await;
            lock(&finished).push(ToolOutcome {
                result,
                working_dir,
            });
        });
    }
    while let Some(joined) = tasks.join_next().await {
        if let Err(error) = joined
            && error.is_panic()
        {
            tracing::error!("a tool task panicked: {error}");
        }
    }
    // A call whose task panicked has no outcome; give the model an explicit error for it.
    let done: Vec<String> = lock(finished)
        .iter()
        .map(|o| o.result.call_id.clone())
        .collect();
    for call in &state_calls(state) {
        if !done.contains(&call.id) {
            let result = result_for_model(
                call,
                Err(ToolError::Failed("the tool crashed".into())),
                limits.result_limit,
            );
            lock(finished).push(ToolOutcome {
                result,
                working_dir: None,
            });
        }
    }
}

fn state_calls(state: &RunState) -> Vec<ToolCall> {
    match &state.phase {
        Phase::RunTools { calls, .. } => calls.clone(),
        _ => Vec::new(),
    }
}
