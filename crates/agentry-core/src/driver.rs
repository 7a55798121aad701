//! The tokio driver: performs the engine's steps and reports every one as a [`RunEvent`].
//!
//! The driver owns all IO of a run: it streams the model call (forwarding deltas live), runs a
//! round's tool calls in parallel (bounded by a semaphore, each in its own task so a panicking
//! tool cannot take the run down), and enforces the run's deadline and cancellation around every
//! step. Cancellation reaches the model stream and every running tool promptly: their futures
//! are dropped and their cancellation tokens fire.
//!
//! A [`Driver`] holds what a run is driven with (its model, tools, event sink, cancellation and
//! pause tokens, journal); [`Driver::run`] takes the run's state through its steps, one method
//! each.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use agentry_llm::{LlmError, ModelClient, ModelRequest};
use agentry_types::{
    ErrorCode, ErrorInfo, ModelEvent, ModelPrice, ModelResponse, RunEvent, RunStopReason,
    SessionEvent, SuspendStatus, ToolCall, ToolResultPart,
};
use futures::StreamExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::budget::{BudgetGate, BudgetQuery};
use crate::engine::{Phase, RunState, Step, ToolOutcome};
pub use crate::events::EventSink;
use crate::session::{LogError, SessionLog, SessionStatus};
use crate::tool::{
    CANCEL_GRACE, RiskClass, ToolContext, ToolEffect, ToolError, ToolOutput, ToolRegistry,
    result_for_model,
};
use crate::workspace::journal::{FileJournal, RoundMark};

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

/// A run's first write (its start, and the new session with it), sent to the log but not yet
/// known to be committed. The run asks the model meanwhile, so the commit's wait is not added
/// to the run's critical path; nothing of the run is reported, and nothing else is written,
/// before the write is settled (see [`Driver::pending_start`]). When it fails, the run ends
/// with its error and writes nothing more: the model's answer, if one came, is dropped.
pub(crate) struct PendingStart {
    run_id: agentry_types::RunId,
    progress: StartProgress,
}

/// Where a [`PendingStart`] is.
enum StartProgress {
    /// The write is on its way, with the records it commits.
    Writing(
        tokio::task::JoinHandle<Result<u64, ErrorInfo>>,
        Vec<SessionEvent>,
    ),
    /// Committed: the live events still to report (the records as committed, then the run's
    /// start).
    Reporting(std::collections::VecDeque<RunEvent>),
    /// The write failed: the run ends with this error.
    Failed(ErrorInfo),
}

impl PendingStart {
    /// Sends `write` (of `records`, the start of run `run_id`) on its way at once.
    pub(crate) fn spawn(
        run_id: agentry_types::RunId,
        records: Vec<SessionEvent>,
        write: impl Future<Output = Result<u64, ErrorInfo>> + Send + 'static,
    ) -> Self {
        Self {
            run_id,
            progress: StartProgress::Writing(tokio::spawn(write.in_current_span()), records),
        }
    }

    /// Waits for the write, then reports its records as committed and the run as started.
    /// Cancel-safe: a settle cut short goes on where it stopped when called again.
    pub(crate) async fn settle(&mut self, sink: &EventSink) -> Result<(), ErrorInfo> {
        loop {
            match &mut self.progress {
                StartProgress::Writing(write, records) => {
                    let answered = match write.await {
                        Ok(Ok(last)) => {
                            let records = std::mem::take(records);
                            let first = last + 1 - (records.len() as u64).min(last + 1);
                            StartProgress::Reporting(
                                (first..)
                                    .zip(records)
                                    .map(|(seq, event)| RunEvent::Committed { seq, event })
                                    .chain([RunEvent::RunStarted {
                                        run_id: self.run_id,
                                    }])
                                    .collect(),
                            )
                        }
                        Ok(Err(error)) => StartProgress::Failed(error),
                        Err(error) => StartProgress::Failed(ErrorInfo {
                            code: ErrorCode::Internal,
                            message: format!("the run's start could not be written: {error}"),
                            retryable: true,
                            status: None,
                        }),
                    };
                    self.progress = answered;
                }
                StartProgress::Reporting(live) => {
                    while let Some(event) = live.front() {
                        sink.send(event.clone()).await;
                        live.pop_front();
                    }
                    return Ok(());
                }
                StartProgress::Failed(error) => return Err(error.clone()),
            }
        }
    }

    /// Whether the write committed and everything it reports was reported (a failed one stays
    /// unsettled: whatever the run does next learns of the failure).
    fn settled(&self) -> bool {
        matches!(&self.progress, StartProgress::Reporting(live) if live.is_empty())
    }
}

/// Why a model call gave no answer.
enum CallFailure {
    /// The model (or the way to it) failed.
    Model(LlmError),
    /// The run's start could not be written (see [`PendingStart`]).
    Start(ErrorInfo),
}

impl From<LlmError> for CallFailure {
    fn from(error: LlmError) -> Self {
        Self::Model(error)
    }
}

/// The error a run ends with when its log cannot be written: without the log the run's
/// steps could be lost, so it must not go on.
fn storage_error(error: &LogError) -> ErrorInfo {
    ErrorInfo {
        code: match error {
            LogError::Full(_) => ErrorCode::StorageFull,
            _ => ErrorCode::Internal,
        },
        message: format!("the run stopped because its session log failed: {error}"),
        retryable: true,
        status: None,
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

/// Drives `state` until the run is finished, sending every event to `events`. Returns the final
/// state (which serialises, for storage or inspection).
///
/// Not an `async fn`: the driver's future is made at once and holds the state only once (see
/// [`Driver::run`]).
pub fn drive(
    state: RunState,
    model: Arc<dyn ModelClient>,
    tools: ToolRegistry,
    events: EventSink,
    cancel: CancellationToken,
    journal: Option<Journal>,
) -> impl Future<Output = RunState> + Send {
    let mut driver = Driver::new(model, tools, events, cancel);
    if let Some(journal) = journal {
        driver = driver.journal(journal);
    }
    driver.run(state)
}

/// What a run is driven with: its model (and the model that summarises for compaction), its
/// tools, where its events go, its cancellation and pause tokens, and the journal its
/// committed steps are written to.
///
/// A run whose `pause` token fires stops at the next safe point (before a model call, when the
/// round before it has finished): it commits `run_paused`, marks the session `paused` and
/// returns the state unfinished. A run whose calls wait for approval stops the same way with
/// `waiting`. Both end their stream with [`RunEvent::RunSuspended`].
pub struct Driver {
    model: Arc<dyn ModelClient>,
    summarizer: Option<Arc<dyn ModelClient>>,
    tools: ToolRegistry,
    events: EventSink,
    cancel: CancellationToken,
    pause: Option<CancellationToken>,
    journal: Option<Journal>,
    files: Option<Arc<FileJournal>>,
    accounting: Accounting,
    /// The last answer of a run that it finished, held to be committed with the run's end:
    /// one write instead of two (see [`Driver::finish`]).
    last_answer: Mutex<Option<HeldAnswer>>,
    /// The run's first write, while it is not settled (kept when it failed: then nothing
    /// more is written).
    start: Mutex<Option<PendingStart>>,
}

/// A run's last answer, not yet committed: its records, and the live events that report it
/// once they are.
struct HeldAnswer {
    records: Vec<SessionEvent>,
    live: Vec<RunEvent>,
}

/// What a run's model calls are accounted with.
#[derive(Clone, Default)]
pub struct Accounting {
    /// The catalogue id of the run's model (the run's `model` may name it by a label).
    pub model_id: Option<String>,
    /// What the model costs.
    pub price: Option<ModelPrice>,
    /// The gate asked before each model call (see [`crate::budget`]).
    pub budget: Option<Arc<dyn BudgetGate>>,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver")
            .field("tools", &self.tools)
            .field("journal", &self.journal)
            .finish_non_exhaustive()
    }
}

impl Driver {
    /// A driver calling `model`, running `tools`, reporting to `events`, stopped by `cancel`;
    /// no summariser, no pause token, no journal.
    pub fn new(
        model: Arc<dyn ModelClient>,
        tools: ToolRegistry,
        events: EventSink,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            model,
            summarizer: None,
            tools,
            events,
            cancel,
            pause: None,
            journal: None,
            files: None,
            accounting: Accounting::default(),
            last_answer: Mutex::new(None),
            start: Mutex::new(None),
        }
    }

    /// Sets the run's first write, sent but not yet known to be committed: the run's first
    /// model call goes out meanwhile, and its first event is reported (and anything else
    /// written) only once the write has committed and been reported.
    #[must_use]
    pub(crate) fn pending_start(self, start: PendingStart) -> Self {
        *lock(&self.start) = Some(start);
        self
    }

    /// Settles the run's first write, if it is pending; a failed one fails the run. Returns
    /// whether the run's start is committed (or the run has no pending start).
    async fn settle_start(&self, state: &mut RunState) -> bool {
        let pending = lock(&self.start).take();
        let Some(mut pending) = pending else {
            return true;
        };
        let settled = pending.settle(&self.events).await;
        self.keep_unsettled(pending);
        match settled {
            Ok(()) => true,
            Err(error) => {
                state.fail(error);
                false
            }
        }
    }

    /// Puts back a start that is not settled (cut short, or failed).
    fn keep_unsettled(&self, pending: PendingStart) {
        if !pending.settled() {
            *lock(&self.start) = Some(pending);
        }
    }

    /// Sets what the run's model calls are accounted with: each call's model and cost are
    /// recorded with its answer, and the budget gate is asked before each call.
    #[must_use]
    pub fn accounting(mut self, accounting: Accounting) -> Self {
        self.accounting = accounting;
        self
    }

    /// The model the run calls, as the catalogue names it.
    fn model_id(&self, state: &RunState) -> String {
        self.accounting
            .model_id
            .clone()
            .unwrap_or_else(|| state.model.clone())
    }

    /// Sets the model that writes the summaries of context compaction (the model named by the
    /// run's context policy); without one, compaction drops old turns.
    #[must_use]
    pub fn summarizer(mut self, summarizer: Option<Arc<dyn ModelClient>>) -> Self {
        self.summarizer = summarizer;
        self
    }

    /// Sets the token that pauses the run at its next safe point.
    #[must_use]
    pub fn pause(mut self, pause: CancellationToken) -> Self {
        self.pause = Some(pause);
        self
    }

    /// Sets the journal the run's committed steps are written to.
    #[must_use]
    pub fn journal(mut self, journal: Journal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// Sets the file journal that records what the run's tools change in its workspace (only
    /// with a session [`journal`](Self::journal): changes are kept per session).
    #[must_use]
    pub fn files(mut self, files: Option<Arc<FileJournal>>) -> Self {
        self.files = files;
        self
    }

    /// Drives `state` until the run is finished or suspended, sending every event to the
    /// driver's sink. Returns the final state (which serialises, for storage or inspection).
    ///
    /// The state is boxed before the run's future is made and stays boxed down the driver's
    /// calls: a future keeps what it was given for as long as it lives, so a state passed by
    /// value is held (about a kilobyte) by each level, for each live run.
    pub fn run(self, state: RunState) -> impl Future<Output = RunState> + Send {
        let state = Box::new(state);
        async move {
            let span = crate::telemetry::run_span(&state, self.journal.as_ref().map(|j| j.session));
            let state = self.run_in_span(state).instrument(span.clone()).await;
            crate::telemetry::end_run(&span, &state);
            *state
        }
    }

    async fn run_in_span(&self, mut state: Box<RunState>) -> Box<RunState> {
        let deadline = deadline_of(&mut state);
        // A run whose start is still being written reports its start once it is (with the
        // first model call's first event at the latest).
        if lock(&self.start).is_none() {
            self.events
                .send(RunEvent::RunStarted {
                    run_id: state.run_id,
                })
                .await;
        }
        let suspended = loop {
            if matches!(state.phase, Phase::CallModel)
                && state.context.is_some()
                && !self.pause_requested()
            {
                self.fit_context(&mut state, false).await;
            }
            match state.next_step() {
                Step::Finish => break None,
                Step::CallModel(_) if self.pause_requested() => {
                    if let Some(status) = self.pause_run(&mut state).await {
                        break Some(status);
                    }
                }
                Step::AwaitApproval => {
                    if let Some(status) = self.await_approval(&mut state).await {
                        break Some(status);
                    }
                }
                Step::CallModel(_) if self.over_budget(&mut state).await => {}
                Step::CallModel(request) => self.call_model(&mut state, request, deadline).await,
                Step::RunTools(calls) => self.run_tools(&mut state, calls, deadline).await,
            }
        };
        match suspended {
            Some(status) => self.suspend(state, status).await,
            None => self.finish(state).await,
        }
    }

    /// Whether a budget of the run's is used up; if so the run is stopped.
    async fn over_budget(&self, state: &mut RunState) -> bool {
        let Some(gate) = &self.accounting.budget else {
            return false;
        };
        // The gate reads the store (the session's owner, what was spent): the run's own start
        // first.
        if !self.settle_start(state).await {
            return true;
        }
        let query = BudgetQuery {
            run_id: state.run_id,
            session: self.journal.as_ref().map(|journal| journal.session),
            agent_id: state.agent_id.as_deref(),
        };
        match gate.exceeded(query).await {
            Some(note) => {
                state.stop_over_budget(note);
                true
            }
            None => false,
        }
    }

    /// Whether the run was asked to pause.
    fn pause_requested(&self) -> bool {
        self.pause
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// Records `events` if the run has a journal; a failure ends the run.
    async fn commit(&self, state: &mut RunState, events: Vec<SessionEvent>) {
        if !self.settle_start(state).await {
            return;
        }
        if let Some(journal) = &self.journal
            && let Err(error) = journal.record(events, &self.events).await
        {
            tracing::error!(run_id = %state.run_id, "session log write failed: {error}");
            state.fail(storage_error(&error));
        }
    }

    /// Records the session's status, if the run has a journal (a failure is logged: the log's
    /// events, not the status, are the truth recovery goes by).
    async fn set_status(&self, status: SessionStatus) {
        if let Some(journal) = &self.journal
            && let Err(error) = journal.log.set_status(journal.session, status).await
        {
            tracing::error!(session = %journal.session, "could not record the session's status: {error}");
        }
    }

    /// Compacts the conversation when the next request would not fit (or always, when `force`),
    /// and records the compaction. Returns whether anything was compacted. A conversation that
    /// cannot fit even compacted is left to the provider when not forced (the estimate may be
    /// cautious), and ends the run when forced.
    async fn fit_context(&self, state: &mut RunState, force: bool) -> bool {
        // Compaction cuts between whole units, which it finds in the repaired history.
        crate::repair::repair_history(&mut state.messages);
        let compacted = crate::compactor::compact(
            state,
            &*self.model,
            self.summarizer.as_ref(),
            force,
            &self.cancel,
        )
        .await;
        match compacted {
            Ok(Some(event)) => {
                self.commit(state, vec![event]).await;
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

    /// Stops before a model call because the run was asked to pause: commits `run_paused` and
    /// marks the session paused. `None` when the pause could not be recorded (the run failed).
    async fn pause_run(&self, state: &mut RunState) -> Option<SuspendStatus> {
        if !self.settle_start(state).await {
            return None;
        }
        let paused = SessionEvent::RunPaused {
            run_id: state.run_id,
        };
        // Commit, record the status, then report: a client that sees the pause also sees the
        // status.
        if let Some(journal) = &self.journal {
            match journal
                .log
                .append_with_status(journal.session, vec![paused.clone()], SessionStatus::Paused)
                .await
            {
                Ok(seq) => {
                    self.events
                        .send(RunEvent::Committed { seq, event: paused })
                        .await;
                }
                Err(error) => {
                    state.fail(storage_error(&error));
                    return None;
                }
            }
        }
        Some(SuspendStatus::Paused)
    }

    /// A round waits for approvals: stops the run while some are undecided (the session is
    /// then `waiting`), else commits the approved calls' intents and the rejections' results.
    async fn await_approval(&self, state: &mut RunState) -> Option<SuspendStatus> {
        if !state.approvals_decided() {
            // The requests were committed with the assistant message.
            self.set_status(SessionStatus::Waiting).await;
            return Some(SuspendStatus::Waiting);
        }
        let Ok(rejected) = state.continue_after_approvals() else {
            state.fail(ErrorInfo {
                code: ErrorCode::Internal,
                message: "the run's approvals could not be applied".into(),
                retryable: false,
                status: None,
            });
            return None;
        };
        // The approved calls' intents first, then the rejections' results: replay counts the
        // round as done once no intent is left unanswered.
        let mut records: Vec<SessionEvent> = Vec::new();
        if let Phase::RunTools { calls, .. } = &state.phase {
            records.extend(calls.iter().map(|call| self.intent(state, call)));
        }
        records.extend(rejected.iter().map(|result| SessionEvent::ToolCallResult {
            run_id: state.run_id,
            result: result.clone(),
            duration_ms: 0,
            working_dir: None,
        }));
        self.commit(state, records).await;
        for result in rejected {
            self.events
                .send(RunEvent::ToolResult {
                    result,
                    duration_ms: 0,
                })
                .await;
        }
        None
    }

    /// The committed intent of a tool call, before it runs.
    fn intent(&self, state: &RunState, call: &ToolCall) -> SessionEvent {
        SessionEvent::ToolCallIntent {
            run_id: state.run_id,
            call: call.clone(),
            idempotent: self.tools.get(&call.name).is_some_and(|t| t.idempotent()),
        }
    }

    /// Calls the model, under the run's cancellation and deadline, and feeds the outcome to
    /// the engine.
    async fn call_model(
        &self,
        state: &mut RunState,
        request: ModelRequest,
        deadline: Option<Instant>,
    ) {
        let round = state.round + 1;
        let call_cancel = self.cancel.child_token();
        // What the request was estimated at, to calibrate the counter with the provider's
        // reported usage.
        let counted = state.context.as_ref().map(|_| {
            let counter = self.model.context().counter;
            let raw = counter.count_request_raw(&request);
            (counter, raw)
        });
        let span = crate::telemetry::chat_span(&state.model, &request);
        // The run's first write may still be on its way: the call goes out meanwhile, and its
        // first event waits for it.
        let mut pending = lock(&self.start).take();
        let gate = async {
            match pending.as_mut() {
                Some(pending) => pending.settle(&self.events).await,
                None => Ok(()),
            }
        };
        let call = stream_model(
            &*self.model,
            request,
            &self.events,
            call_cancel.clone(),
            gate,
        )
        .instrument(span.clone());
        let guard = guarded(&self.cancel, deadline, call).await;
        if let Some(pending) = pending {
            // Cut short before it settled, or failed: the run's next write or its end learns.
            self.keep_unsettled(pending);
        }
        if let Guarded::Done(Ok((response, _))) = &guard {
            crate::telemetry::end_chat(&span, Ok(response));
        } else if let Guarded::Done(Err(CallFailure::Model(error))) = &guard {
            crate::telemetry::end_chat(&span, Err(error));
        }
        match guard {
            Guarded::Done(Err(CallFailure::Start(error))) => {
                call_cancel.cancel();
                state.fail(error);
            }
            Guarded::Done(Ok((response, timing))) => {
                if let Some((counter, raw)) = counted {
                    counter.observe(raw, response.usage.input_tokens);
                }
                self.on_response(state, round, response, timing).await;
            }
            Guarded::Done(Err(_)) | Guarded::Cancelled if self.cancel.is_cancelled() => {
                state.cancel();
            }
            // The provider says the context is too long: one forced compaction and one retry,
            // never more.
            Guarded::Done(Err(CallFailure::Model(error)))
                if error.is_context_too_long()
                    && state.context.is_some()
                    && !state.overflow_retried =>
            {
                state.overflow_retried = true;
                let compacted = self.fit_context(state, true).await;
                if !compacted && !state.is_finished() {
                    state.on_model_error(error.info());
                }
            }
            Guarded::Done(Err(CallFailure::Model(error))) => state.on_model_error(error.info()),
            Guarded::Cancelled => state.cancel(),
            Guarded::Expired => {
                call_cancel.cancel();
                state.expire();
            }
        }
    }

    /// Feeds the model's answer to the engine, commits it with the intents of the calls it
    /// asks for (or their approval requests), and reports it.
    async fn on_response(
        &self,
        state: &mut RunState,
        round: u32,
        response: ModelResponse,
        timing: CallTiming,
    ) {
        state.on_model_response(&response);
        // The answer and the intents of the calls it asks for are committed together, before
        // any tool runs.
        let mut records = vec![SessionEvent::AssistantMessage {
            run_id: state.run_id,
            round,
            content: response.content.clone(),
            usage: response.usage,
            stop_reason: response.stop_reason.clone(),
            model: Some(self.model_id(state)),
            agent_id: state.agent_id.clone(),
            cost_usd: self
                .accounting
                .price
                .map(|price| price.cost(&response.usage)),
            duration_ms: Some(timing.total.as_millis() as u64),
            first_output_ms: timing.first_output.map(|first| first.as_millis() as u64),
        }];
        match &state.phase {
            Phase::RunTools { calls, .. } => {
                records.extend(calls.iter().map(|call| self.intent(state, call)));
            }
            // Calls that wait for approval are requested instead; their intents are committed
            // once they are decided.
            Phase::AwaitingApproval { pending, .. } => {
                records.extend(
                    pending
                        .iter()
                        .map(|pending| SessionEvent::ApprovalRequested {
                            run_id: state.run_id,
                            call: pending.call.clone(),
                            reason: pending.reason.clone(),
                        }),
                );
            }
            _ => {}
        }
        let live = [
            RunEvent::AssistantMessage {
                round,
                content: response.content,
                stop_reason: response.stop_reason,
            },
            RunEvent::Usage {
                round,
                usage: response.usage,
                model: Some(self.model_id(state)),
                first_output_ms: timing.first_output.map(millis_of),
                duration_ms: Some(millis_of(timing.total)),
            },
        ];
        if self.journal.is_some() && state.is_finished() {
            // The run's last step: a finished run goes straight to `finish` (finished is the
            // engine's last phase), so the answer goes with the end, in one write, and is
            // reported in the same order as otherwise.
            *lock(&self.last_answer) = Some(HeldAnswer {
                records,
                live: live.into(),
            });
            return;
        }
        self.commit(state, records).await;
        for event in live {
            self.events.send(event).await;
        }
    }

    /// Runs a round's tool calls under the run's cancellation and deadline, and feeds their
    /// outcomes (those that finished, when the round was cut short) to the engine.
    async fn run_tools(
        &self,
        state: &mut RunState,
        calls: Vec<ToolCall>,
        deadline: Option<Instant>,
    ) {
        let round_cancel = self.cancel.child_token();
        let finished = Arc::new(Mutex::new(Vec::new()));
        let log_failure = Arc::new(Mutex::new(None));
        let mark = self.mark_files(state, &calls).await;
        let guard = {
            let run = self.run_round(state, calls, &round_cancel, &finished, &log_failure);
            tokio::pin!(run);
            let guard = guarded(&self.cancel, deadline, &mut run).await;
            if !matches!(guard, Guarded::Done(())) {
                // Tell the running tools to stop, and give them a moment to do it cleanly
                // before their tasks are aborted.
                round_cancel.cancel();
                let _ = tokio::time::timeout(TOOL_STOP_GRACE, &mut run).await;
            }
            guard
        };
        if let Some(mark) = mark {
            self.record_files(state.run_id, mark).await;
        }
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

    /// Scans the workspace before a round that may change it (a call of a tool that is not
    /// read-only), when the run's changes are journalled. A failing scan is logged: the round
    /// runs anyway, unjournalled.
    async fn mark_files(
        &self,
        state: &RunState,
        calls: &[ToolCall],
    ) -> Option<(Arc<FileJournal>, agentry_types::SessionId, RoundMark)> {
        let (files, journal, workspace) = (
            self.files.as_ref()?,
            self.journal.as_ref()?,
            state.workspace.clone()?,
        );
        let writes = calls.iter().any(|call| {
            self.tools
                .get(&call.name)
                .is_some_and(|tool| tool.risk().class != RiskClass::ReadOnly)
        });
        if !writes {
            return None;
        }
        let (files, session) = (Arc::clone(files), journal.session);
        let scanning = Arc::clone(&files);
        let mark =
            tokio::task::spawn_blocking(move || scanning.before_round(session, &workspace)).await;
        match mark {
            Ok(Ok(mark)) => Some((files, session, mark)),
            Ok(Err(error)) => {
                tracing::warn!(%session, "the file journal skips a round: {error}");
                None
            }
            Err(error) => {
                tracing::error!(%session, "the file journal's scan crashed: {error}");
                None
            }
        }
    }

    /// Records what the round changed (see [`Self::mark_files`]).
    async fn record_files(
        &self,
        run_id: agentry_types::RunId,
        (files, session, mark): (Arc<FileJournal>, agentry_types::SessionId, RoundMark),
    ) {
        let recorded =
            tokio::task::spawn_blocking(move || files.after_round(session, run_id, mark)).await;
        match recorded {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => tracing::warn!(%session, "the file journal missed a round: {error}"),
            Err(error) => tracing::error!(%session, "the file journal's scan crashed: {error}"),
        }
    }

    /// Runs a round's calls in parallel, at most `max_parallel_tools` at a time. Each outcome is
    /// pushed to `finished` as soon as it exists, so a cancelled round keeps what completed; a
    /// failed write of a result to the journal is left in `log_failure`.
    async fn run_round(
        &self,
        state: &RunState,
        calls: Vec<ToolCall>,
        cancel: &CancellationToken,
        finished: &Arc<Mutex<Vec<ToolOutcome>>>,
        log_failure: &Arc<Mutex<Option<LogError>>>,
    ) {
        let limits = &state.limits;
        let permits = Arc::new(Semaphore::new(limits.max_parallel_tools.max(1)));
        let caller = Arc::new(crate::tool::CallerInfo {
            run_id: state.run_id,
            session: self.journal.as_ref().map(|journal| journal.session),
            model: state.model.clone(),
            tools: state.tools.clone(),
            agent_id: state.agent_id.clone(),
            approvals: state.approvals.clone(),
            network: state.network.clone(),
            grant: state.grant.clone(),
        });
        let mut tasks = JoinSet::new();
        for call in calls {
            let permits = Arc::clone(&permits);
            let tools = self.tools.clone();
            let events = self.events.clone();
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
            let journal = self.journal.clone();
            let log_failure = Arc::clone(log_failure);
            let run_id = state.run_id;
            let span = crate::telemetry::tool_span(&call);
            let in_span = span.clone();
            let task = async move {
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
                crate::telemetry::end_tool(&in_span, &result);
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
            };
            tasks.spawn(task.instrument(span));
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

    /// Ends the stream of a run that stopped without ending (paused, or waiting for
    /// approvals) with [`RunEvent::RunSuspended`].
    async fn suspend(&self, state: Box<RunState>, status: SuspendStatus) -> Box<RunState> {
        self.events
            .send(RunEvent::RunSuspended {
                run_id: state.run_id,
                status,
                pending: state.pending_approvals(),
                usage: state.usage,
                rounds: state.round,
            })
            .await;
        state
    }

    /// Commits the end of a finished run and the session's new status (with the run's last
    /// answer, when it held one back), then reports the end.
    async fn finish(&self, mut state: Box<RunState>) -> Box<RunState> {
        let held = lock(&self.last_answer).take();
        // A run whose start was never written writes no end either.
        let started = self.settle_start(&mut state).await;
        if started
            && let (
                Some(journal),
                Phase::Finished {
                    reason,
                    error,
                    note,
                },
            ) = (&self.journal, &state.phase)
        {
            let end = SessionEvent::RunFinished {
                run_id: state.run_id,
                stop_reason: *reason,
                usage: state.usage,
                rounds: state.round,
                error: error.clone(),
                note: note.clone(),
            };
            // Commit the end with the session's status, and only then report the commit: a
            // client that sees the end also sees the new status.
            let status = match reason {
                RunStopReason::Error => SessionStatus::Failed,
                RunStopReason::Cancelled | RunStopReason::Deadline => SessionStatus::Interrupted,
                _ => SessionStatus::Idle,
            };
            let (mut records, live) = match held {
                Some(held) => (held.records, held.live),
                None => (Vec::new(), Vec::new()),
            };
            records.push(end);
            match journal
                .log
                .append_with_status(journal.session, records.clone(), status)
                .await
            {
                Ok(last) => {
                    let first = last + 1 - (records.len() as u64).min(last + 1);
                    let mut committed: Vec<RunEvent> = (first..)
                        .zip(records)
                        .map(|(seq, event)| RunEvent::Committed { seq, event })
                        .collect();
                    // The answer's commits and live events, then the end's commit.
                    let end = committed.pop();
                    for event in committed.into_iter().chain(live).chain(end) {
                        self.events.send(event).await;
                    }
                }
                // The run is over either way; recovery will see it as unfinished and close it.
                Err(error) => {
                    tracing::error!(run_id = %state.run_id, "could not record the end of the run: {error}");
                    if !live.is_empty() {
                        // Its last answer is not in the log: the run did not succeed.
                        state.phase = Phase::Finished {
                            reason: RunStopReason::Error,
                            error: Some(storage_error(&error)),
                            note: None,
                        };
                    }
                }
            }
        }
        self.events.send(final_event(&state)).await;
        state
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
        // The driver only ends on a finished state.
        _ => RunEvent::RunFinished {
            stop_reason: RunStopReason::Error,
            text: String::new(),
            usage: state.usage,
            rounds: state.round,
        },
    }
}

/// How long a model call took.
#[derive(Debug, Clone, Copy)]
struct CallTiming {
    /// From the call's start to its first streamed output, when it streamed any.
    first_output: Option<Duration>,
    /// From the call's start to its complete answer.
    total: Duration,
}

/// Milliseconds, with their fraction.
fn millis_of(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Streams one model call, forwarding deltas, and returns the complete response.
///
/// The request goes out at once; `gate` (the run's first write, see [`PendingStart`]) is
/// awaited alongside the model's first event, and that event is handled only once `gate` has
/// passed.
async fn stream_model(
    model: &dyn ModelClient,
    request: ModelRequest,
    events: &EventSink,
    cancel: CancellationToken,
    gate: impl Future<Output = Result<(), ErrorInfo>>,
) -> Result<(ModelResponse, CallTiming), CallFailure> {
    let started = Instant::now();
    let mut first_output = None;
    let mut stream = model.stream(request, cancel);
    let first = {
        let next = stream.next();
        tokio::pin!(next, gate);
        tokio::select! {
            biased;
            passed = &mut gate => {
                passed.map_err(CallFailure::Start)?;
                next.await
            }
            first = &mut next => {
                gate.await.map_err(CallFailure::Start)?;
                first
            }
        }
    };
    let mut first = Some(first);
    loop {
        let item = match first.take() {
            Some(item) => item,
            None => stream.next().await,
        };
        let Some(item) = item else {
            break;
        };
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
            ModelEvent::Completed { response } => {
                let timing = CallTiming {
                    first_output,
                    total: started.elapsed(),
                };
                return Ok((response, timing));
            }
        };
        first_output.get_or_insert_with(|| started.elapsed());
        events.send(event).await;
    }
    Err(CallFailure::Model(LlmError::StreamEndedEarly {
        detail: "the model stream ended without a response".into(),
    }))
}

fn state_calls(state: &RunState) -> Vec<ToolCall> {
    match &state.phase {
        Phase::RunTools { calls, .. } => calls.clone(),
        _ => Vec::new(),
    }
}
