//! Running requests in sessions: one writer per session, write-through, recovery.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use agentry_types::{
    ErrorInfo, Message, RunEvent, RunId, RunStopReason, SessionEvent, SessionId, ToolCall,
    ToolResult,
};
use serde::{Deserialize, Serialize};
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

use super::log::{LogError, SessionLog, SessionStatus};
use super::replay::{InFlight, replay};
use crate::driver::{EventSink, Journal, drive};
use crate::engine::{Phase, RunLimits, RunState};
use crate::runtime::{EVENT_BUFFER, RunError, RunRequest, RunStream, Runtime};

/// The result given to a non-idempotent tool call that was running when the process stopped.
pub const OUTCOME_UNKNOWN: &str = "interrupted: the process stopped while this tool call was \
     running, so it may or may not have taken effect; it was not run again";

/// What to do with a new message for a session whose run is still in progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusyPolicy {
    /// Refuse it with [`SessionError::Busy`], naming the running run.
    Reject,
    /// Run it after the current run (and any queued before it).
    #[default]
    Enqueue,
    /// Cancel the current run at its next step, then run it.
    Interrupt,
}

/// Why a session request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    /// The session has a run in progress and the policy was `reject`.
    #[error(
        "session {session} is busy with run {}",
        run_id.map_or_else(|| "being set up".to_owned(), |id| id.to_string())
    )]
    Busy {
        /// The session.
        session: SessionId,
        /// The run in progress (`None` while it is being set up).
        run_id: Option<RunId>,
    },
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The request is invalid.
    #[error(transparent)]
    Run(#[from] RunError),
}

/// One session's writer lock and its running run.
#[derive(Default)]
struct Slot {
    gate: Arc<tokio::sync::Mutex<()>>,
    active: Mutex<Option<(RunId, CancellationToken)>>,
}

impl Slot {
    fn active(&self) -> Option<(RunId, CancellationToken)> {
        self.active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn set_active(&self, active: Option<(RunId, CancellationToken)>) {
        *self
            .active
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = active;
    }
}

/// Runs requests in durable sessions. Cheap to clone.
#[derive(Clone)]
pub struct SessionManager {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: std::sync::RwLock<Runtime>,
    log: Arc<dyn SessionLog>,
    slots: Mutex<HashMap<SessionId, Arc<Slot>>>,
    /// Where each session's workspace lives (`<root>/<session id>`), if anywhere.
    workspaces: Option<PathBuf>,
}

impl SessionManager {
    /// A manager running `runtime`'s models and tools, writing through `log`.
    pub fn new(runtime: Runtime, log: Arc<dyn SessionLog>) -> Self {
        Self {
            inner: Arc::new(Inner {
                runtime: std::sync::RwLock::new(runtime),
                log,
                slots: Mutex::new(HashMap::new()),
                workspaces: None,
            }),
        }
    }

    /// Gives every session a workspace folder, `<root>/<session id>` (made on first use by the
    /// tools that need it): runs that name no workspace of their own get their session's, and
    /// so do runs resumed after a crash.
    #[must_use]
    pub fn with_workspaces(self, root: PathBuf) -> Self {
        let inner = Inner {
            runtime: std::sync::RwLock::new(self.runtime()),
            log: Arc::clone(&self.inner.log),
            slots: Mutex::new(HashMap::new()),
            workspaces: Some(root),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// The workspace folder of `session`, when the manager gives sessions one.
    pub fn workspace(&self, session: SessionId) -> Option<PathBuf> {
        self.inner
            .workspaces
            .as_ref()
            .map(|root| root.join(session.to_string()))
    }

    /// The runtime new runs use.
    pub fn runtime(&self) -> Runtime {
        self.inner
            .runtime
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Replaces the runtime (models, tools, templates changed). Runs in progress keep the one
    /// they started with.
    pub fn set_runtime(&self, runtime: Runtime) {
        *self
            .inner
            .runtime
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = runtime;
    }

    /// The log.
    pub fn log(&self) -> &Arc<dyn SessionLog> {
        &self.inner.log
    }

    /// Creates an empty session.
    pub async fn create_session(&self) -> Result<SessionId, SessionError> {
        let session = SessionId::new();
        self.inner.log.create(session).await?;
        Ok(session)
    }

    /// The run in progress in `session`, if any.
    pub fn active_run(&self, session: SessionId) -> Option<RunId> {
        let slot = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&session)
            .cloned()?;
        slot.active().map(|(run_id, _)| run_id)
    }

    /// The conversation of `session`, rebuilt from its log.
    pub async fn history(&self, session: SessionId) -> Result<Vec<Message>, SessionError> {
        let events = self.inner.log.load(session).await?;
        Ok(replay(&events).messages)
    }

    /// Forgets `session`'s writer lock once a run has ended and nothing else holds or waits
    /// for it, so a long-running server does not keep one per session ever used.
    fn release(&self, session: SessionId, slot: Arc<Slot>) {
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The map and `slot` are the only holders: no run is queued or starting. Anyone who
        // wants the session later takes it from the map under this same lock, so nobody can
        // pick up this one between the check and the removal.
        if Arc::strong_count(&slot) == 2
            && slots
                .get(&session)
                .is_some_and(|held| Arc::ptr_eq(held, &slot))
        {
            slots.remove(&session);
        }
    }

    /// How many sessions currently have a writer lock (runs in progress or queued).
    pub fn tracked_sessions(&self) -> usize {
        self.inner
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    fn slot(&self, session: SessionId) -> Arc<Slot> {
        let mut slots = self
            .inner
            .slots
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(slots.entry(session).or_default())
    }

    /// Runs `request` in `session`: its history comes from the log, its new messages are
    /// committed before the model is called, and every completed step is written through.
    /// `policy` decides what happens when a run is already in progress.
    pub async fn send(
        &self,
        session: SessionId,
        request: RunRequest,
        policy: BusyPolicy,
    ) -> Result<RunStream, SessionError> {
        // Reject bad requests (unknown model or tools, template errors) before queueing.
        self.runtime()
            .prepare(request.clone().with_history(vec![Message::user("")]))?;
        let slot = self.slot(session);
        let guard =
            match policy {
                BusyPolicy::Reject => {
                    Some(Arc::clone(&slot.gate).try_lock_owned().map_err(|_| {
                        SessionError::Busy {
                            session,
                            run_id: slot.active().map(|(run_id, _)| run_id),
                        }
                    })?)
                }
                BusyPolicy::Enqueue => None,
                BusyPolicy::Interrupt => {
                    if let Some((_, cancel)) = slot.active() {
                        cancel.cancel();
                    }
                    None
                }
            };
        let run_id = RunId::new();
        let cancel = CancellationToken::new();
        let (sink, events) = EventSink::channel(EVENT_BUFFER);
        let manager = self.clone();
        let task_cancel = cancel.clone();
        let task = tokio::spawn(async move {
            let guard = match guard {
                Some(guard) => guard,
                None => Arc::clone(&slot.gate).lock_owned().await,
            };
            let state = manager
                .run_new(session, request, run_id, &slot, sink, task_cancel)
                .await;
            slot.set_active(None);
            drop(guard);
            manager.release(session, slot);
            state
        });
        Ok(RunStream::new(events, task, cancel))
    }

    async fn run_new(
        &self,
        session: SessionId,
        request: RunRequest,
        run_id: RunId,
        slot: &Slot,
        sink: EventSink,
        cancel: CancellationToken,
    ) -> RunState {
        if cancel.is_cancelled() {
            // Cancelled while queued: nothing was committed, nothing runs.
            let mut state = placeholder(run_id);
            state.cancel();
            sink.send_final(&state).await;
            return state;
        }
        slot.set_active(Some((run_id, cancel.clone())));
        match self.start(session, request, run_id, &sink).await {
            Ok(state) => self.drive(session, state, sink, cancel).await,
            Err(error) => {
                let mut state = placeholder(run_id);
                state.fail(error_info(&error));
                sink.send_final(&state).await;
                state
            }
        }
    }

    /// Loads the history, closes a run a crash left open, and commits the new run's start.
    async fn start(
        &self,
        session: SessionId,
        mut request: RunRequest,
        run_id: RunId,
        sink: &EventSink,
    ) -> Result<RunState, SessionError> {
        let log = &self.inner.log;
        let events = log.load(session).await?;
        let mut replayed = replay(&events);
        if let Some(in_flight) = replayed.in_flight.take() {
            // A run the process lost and nobody resumed: close it honestly before going on.
            let results = close_unknown(log.as_ref(), session, &in_flight, true).await?;
            replayed
                .messages
                .extend(results.into_iter().map(Message::Tool));
        }
        let history_len = replayed.messages.len();
        request.history = replayed.messages;
        if request.workspace.is_none() {
            request.workspace = self.workspace(session);
        }
        let mut state = self.runtime().prepare(request)?;
        state.run_id = run_id;
        let new_messages: Vec<Message> = if history_len == 0 {
            state.messages.clone()
        } else {
            state.messages[history_len..].to_vec()
        };
        let mut records = vec![SessionEvent::RunStarted {
            run_id,
            model: state.model.clone(),
            tools: state.tools.iter().map(|t| t.name.clone()).collect(),
            params: serde_json::to_value(&state.params).unwrap_or_default(),
            limits: serde_json::to_value(&state.limits).unwrap_or_default(),
            fallback_models: state.fallback_models.clone(),
        }];
        records.extend(
            new_messages
                .into_iter()
                .map(|message| SessionEvent::Message { run_id, message }),
        );
        let last = log.append(session, records.clone()).await?;
        log.set_status(session, SessionStatus::Running).await?;
        let first = last + 1 - (records.len() as u64).min(last + 1);
        for (offset, event) in records.into_iter().enumerate() {
            sink.send(RunEvent::Committed {
                seq: first + offset as u64,
                event,
            })
            .await;
        }
        Ok(state)
    }

    async fn drive(
        &self,
        session: SessionId,
        state: RunState,
        sink: EventSink,
        cancel: CancellationToken,
    ) -> RunState {
        let runtime = self.runtime();
        let model = match runtime.client_for(&state) {
            Ok(model) => model,
            Err(error) => {
                let mut state = state;
                state.fail(error_info(&SessionError::Run(error)));
                sink.send_final(&state).await;
                return state;
            }
        };
        let journal = Journal::new(Arc::clone(&self.inner.log), session);
        let tools = runtime.tools().clone();
        // The driver records the session's status with the end of the run.
        drive(state, model, tools, sink, cancel, Some(journal)).await
    }

    /// Continues the run that was in flight in `session` when the process stopped, from its
    /// last committed step. Tool calls whose intent was committed without a result run again
    /// only if their tool is idempotent; the others get an "outcome unknown" result. Returns
    /// `None` when no run was in flight.
    pub async fn resume(&self, session: SessionId) -> Result<Option<RunStream>, SessionError> {
        let slot = self.slot(session);
        let guard: OwnedMutexGuard<()> =
            Arc::clone(&slot.gate)
                .try_lock_owned()
                .map_err(|_| SessionError::Busy {
                    session,
                    run_id: slot.active().map(|(run_id, _)| run_id),
                })?;
        let log = &self.inner.log;
        let events = log.load(session).await?;
        let replayed = replay(&events);
        let Some(in_flight) = replayed.in_flight else {
            log.set_status(session, SessionStatus::Idle).await?;
            return Ok(None);
        };
        let mut messages = replayed.messages;
        let results = close_unknown(log.as_ref(), session, &in_flight, false).await?;
        messages.extend(results.into_iter().map(Message::Tool));
        let mut state = self.resumed_state(&in_flight, messages);
        state.workspace = self.workspace(session);
        let run_id = state.run_id;
        let cancel = CancellationToken::new();
        slot.set_active(Some((run_id, cancel.clone())));
        let (sink, events) = EventSink::channel(EVENT_BUFFER);
        let manager = self.clone();
        let task_cancel = cancel.clone();
        let task = tokio::spawn(async move {
            let state = manager.drive(session, state, sink, task_cancel).await;
            slot.set_active(None);
            drop(guard);
            manager.release(session, slot);
            state
        });
        Ok(Some(RunStream::new(events, task, cancel)))
    }

    /// Resumes every run that was in flight when the process stopped (sessions still marked
    /// running). Call once at start-up, before accepting new work.
    pub async fn recover(&self) -> Result<Vec<(SessionId, RunStream)>, SessionError> {
        let mut resumed = Vec::new();
        for session in self
            .inner
            .log
            .sessions_with_status(SessionStatus::Running)
            .await?
        {
            if let Some(stream) = self.resume(session).await? {
                resumed.push((session, stream));
            }
        }
        Ok(resumed)
    }

    fn resumed_state(&self, in_flight: &InFlight, messages: Vec<Message>) -> RunState {
        let runtime = self.runtime();
        let tools = runtime.tools();
        let specs = in_flight
            .tools
            .iter()
            .filter_map(|name| tools.get(name).map(|tool| tool.spec().clone()))
            .collect();
        let rerun: Vec<ToolCall> = in_flight
            .pending
            .iter()
            .filter(|(_, idempotent)| *idempotent)
            .map(|(call, _)| call.clone())
            .collect();
        let phase = if !rerun.is_empty() {
            Phase::RunTools {
                calls: rerun,
                warnings: Default::default(),
            }
        } else if in_flight.answered && in_flight.pending.is_empty() {
            Phase::Finished {
                reason: RunStopReason::Completed,
                error: None,
                note: None,
            }
        } else {
            Phase::CallModel
        };
        let limits: RunLimits =
            serde_json::from_value(in_flight.limits.clone()).unwrap_or_default();
        RunState {
            run_id: in_flight.run_id,
            model: in_flight.model.clone(),
            fallback_models: in_flight.fallback_models.clone(),
            messages,
            tools: specs,
            params: serde_json::from_value(in_flight.params.clone()).unwrap_or_default(),
            limits,
            round: in_flight.round,
            tool_rounds: in_flight.tool_rounds,
            tool_calls: in_flight.tool_calls,
            usage: in_flight.usage,
            working_dir: in_flight.working_dir.clone(),
            // The log does not record the workspace: it is the session's (set by `resume`).
            workspace: None,
            loops: in_flight.loops.clone(),
            // The deadline starts again: the time the process was down does not count.
            started_at_ms: None,
            phase,
        }
    }
}

/// Commits an "outcome unknown" result for each pending call that must not run again (all of
/// them when `all`, else the non-idempotent ones), and, when `all`, the end of the run.
async fn close_unknown(
    log: &dyn SessionLog,
    session: SessionId,
    in_flight: &InFlight,
    all: bool,
) -> Result<Vec<ToolResult>, SessionError> {
    let results: Vec<ToolResult> = in_flight
        .pending
        .iter()
        .filter(|(_, idempotent)| all || !idempotent)
        .map(|(call, _)| ToolResult {
            name: Some(call.name.clone()),
            ..ToolResult::error(call.id.clone(), OUTCOME_UNKNOWN)
        })
        .collect();
    let mut records: Vec<SessionEvent> = results
        .iter()
        .map(|result| SessionEvent::ToolCallResult {
            run_id: in_flight.run_id,
            result: result.clone(),
            duration_ms: 0,
            working_dir: None,
        })
        .collect();
    if all {
        records.push(SessionEvent::RunFinished {
            run_id: in_flight.run_id,
            stop_reason: RunStopReason::Cancelled,
            usage: in_flight.usage,
            rounds: in_flight.round,
            error: None,
            note: Some("the process stopped during this run and it was not resumed".into()),
        });
    }
    if !records.is_empty() {
        log.append(session, records).await?;
    }
    Ok(results)
}

fn placeholder(run_id: RunId) -> RunState {
    let mut state = RunState::new(
        "",
        Vec::new(),
        Vec::new(),
        Default::default(),
        RunLimits::default(),
    );
    state.run_id = run_id;
    state
}

fn error_info(error: &SessionError) -> ErrorInfo {
    let (code, retryable) = match error {
        SessionError::Busy { .. } => (agentry_types::ErrorCode::Conflict, true),
        SessionError::Log(_) => (agentry_types::ErrorCode::Internal, true),
        SessionError::Run(_) => (agentry_types::ErrorCode::InvalidRequest, false),
    };
    ErrorInfo {
        code,
        message: error.to_string(),
        retryable,
        status: None,
    }
}

impl EventSink {
    /// Sends the end event of a run that never reached the driver.
    async fn send_final(&self, state: &RunState) {
        let event = match &state.phase {
            Phase::Finished {
                error: Some(error), ..
            } => RunEvent::RunFailed {
                stop_reason: RunStopReason::Error,
                error: error.clone(),
                usage: state.usage,
                rounds: state.round,
            },
            _ => RunEvent::RunFinished {
                stop_reason: state.stop_reason().unwrap_or(RunStopReason::Cancelled),
                text: String::new(),
                usage: state.usage,
                rounds: state.round,
            },
        };
        self.send(event).await;
    }
}
