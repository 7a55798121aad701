//! Running requests in sessions: one writer per session, write-through, recovery, and run
//! control — approvals (a run waits, durably, until a person decides its calls), pause and
//! resume (between rounds), interrupt and abort.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agentry_types::{
    ErrorInfo, Message, PendingApproval, RunEvent, RunId, RunStopReason, SessionEvent, SessionId,
    ToolCall, ToolResult,
};
use serde::{Deserialize, Serialize};
use tokio::sync::OwnedMutexGuard;
use tokio_util::sync::CancellationToken;

use super::log::{LogError, SessionLog, SessionStatus};
use super::replay::{InFlight, replay};
use crate::approval::{ApprovalDecision, ApprovalError, ApprovalPolicy, UnknownOutcome};
use crate::context::Compaction;
use crate::driver::{Driver, Journal, PendingStart};
use crate::engine::{Phase, RunLimits, RunState};
use crate::events::EventSink;
use crate::runtime::{EVENT_BUFFER, RunError, RunRequest, RunStream, Runtime};
use crate::workspace::journal::{FileJournal, JournalConfig};

/// The result given to a non-idempotent tool call that was running when the process stopped.
pub const OUTCOME_UNKNOWN: &str = "interrupted: the process stopped while this tool call was \
     running, so it may or may not have taken effect; it was not run again";

/// How many runs may wait behind a session's current run by default
/// ([`SessionManager::set_max_queued_runs`]).
pub const DEFAULT_MAX_QUEUED_RUNS: usize = 16;

/// How long a run refused when busy (`BusyPolicy::Reject`) waits for a session whose run has
/// ended but not yet given the session back (it is writing its last event).
const FINISHING_RUN_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The folder under the workspaces root holding shared workspaces (an agent's), beside the
/// sessions' own (a session id is a UUID, never this name).
pub const SHARED_WORKSPACES: &str = "agents";

/// What to do with a new message for a session whose run is still in progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BusyPolicy {
    /// Refuse it with [`SessionError::Busy`], naming the running run.
    Reject,
    /// Run it after the current run (and any queued before it); refused with
    /// [`SessionError::QueueFull`] when the session already has its maximum of queued runs.
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
    /// The session already has `max` runs waiting behind its current one.
    #[error(
        "session {session} already has {max} runs queued behind the one in progress, the most \
         it may have: wait for them to finish, or abort them"
    )]
    QueueFull {
        /// The session.
        session: SessionId,
        /// How many runs a session may queue.
        max: usize,
    },
    /// The log failed.
    #[error(transparent)]
    Log(#[from] LogError),
    /// The request is invalid.
    #[error(transparent)]
    Run(#[from] RunError),
    /// No run with this id is in progress, waiting or paused in the session.
    #[error("run {run_id} is not in progress, waiting or paused in session {session}")]
    NoSuchRun {
        /// The session.
        session: SessionId,
        /// The run.
        run_id: RunId,
    },
    /// The run is not in a state that allows this (not waiting, not paused, not live).
    #[error("run {run_id} {state}")]
    WrongState {
        /// The run.
        run_id: RunId,
        /// What state it is in, as a phrase ("is not waiting for approvals").
        state: String,
    },
    /// A decision on a waiting call is invalid.
    #[error(transparent)]
    Approval(#[from] ApprovalError),
}

/// What deciding on a run's waiting calls led to.
pub struct Decided {
    /// The calls still waiting (empty once the run went on).
    pub pending: Vec<PendingApproval>,
    /// The continued run, once every call is decided.
    pub stream: Option<RunStream>,
}

/// A run started or queued by this manager, for pause, interrupt and abort.
#[derive(Clone)]
struct Control {
    session: SessionId,
    cancel: CancellationToken,
    pause: CancellationToken,
    started: Arc<std::sync::atomic::AtomicBool>,
}

/// What a new run's task is given (see [`SessionManager::new_run_task`]).
struct NewRun {
    session: SessionId,
    request: Box<RunRequest>,
    run_id: RunId,
    slot: Arc<Slot>,
    /// The session's turn, when the run already has it.
    guard: Option<OwnedMutexGuard<()>>,
    control: Control,
    sink: EventSink,
    cancel: CancellationToken,
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

/// A [`SessionManager`] that may be gone ([`SessionManager::downgrade`]).
#[derive(Clone, Default)]
pub struct WeakSessionManager(std::sync::Weak<Inner>);

impl WeakSessionManager {
    /// The manager, while it exists.
    pub fn upgrade(&self) -> Option<SessionManager> {
        self.0.upgrade().map(|inner| SessionManager { inner })
    }
}

impl std::fmt::Debug for WeakSessionManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WeakSessionManager")
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
    /// Runs live or queued, by id.
    controls: Mutex<HashMap<RunId, Control>>,
    /// Where each session's workspace lives (`<root>/<session id>`), if anywhere.
    workspaces: Option<PathBuf>,
    /// What tools change in the workspaces, turn by turn (with workspaces only).
    files: Option<Arc<FileJournal>>,
    /// How many runs may wait behind each session's current run.
    max_queued: std::sync::atomic::AtomicUsize,
}

impl SessionManager {
    /// A manager running `runtime`'s models and tools, writing through `log`.
    pub fn new(runtime: Runtime, log: Arc<dyn SessionLog>) -> Self {
        Self {
            inner: Arc::new(Inner {
                runtime: std::sync::RwLock::new(runtime),
                log,
                slots: Mutex::new(HashMap::new()),
                controls: Mutex::new(HashMap::new()),
                workspaces: None,
                files: None,
                max_queued: std::sync::atomic::AtomicUsize::new(DEFAULT_MAX_QUEUED_RUNS),
            }),
        }
    }

    /// Gives every session a workspace folder, `<root>/<session id>` (made on first use by the
    /// tools that need it): runs that name no workspace of their own get their session's, and
    /// so do runs resumed after a crash. What tools change there is journalled per turn under
    /// `<root>/.journal` (see [`FileJournal`]).
    #[must_use]
    pub fn with_workspaces(self, root: PathBuf) -> Self {
        let journal = FileJournal::new(root.join(".journal"), JournalConfig::default());
        self.with_workspaces_journalled(root, Some(Arc::new(journal)))
    }

    /// [`Self::with_workspaces`] with this file journal (shared with the tools that use it,
    /// such as `undo`), or without one (`None`).
    #[must_use]
    pub fn with_workspaces_journalled(
        self,
        root: PathBuf,
        journal: Option<Arc<FileJournal>>,
    ) -> Self {
        let inner = Inner {
            runtime: std::sync::RwLock::new(self.runtime()),
            log: Arc::clone(&self.inner.log),
            slots: Mutex::new(HashMap::new()),
            controls: Mutex::new(HashMap::new()),
            files: journal,
            workspaces: Some(root),
            max_queued: std::sync::atomic::AtomicUsize::new(self.max_queued_runs()),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// How many runs may wait behind a session's current run ([`DEFAULT_MAX_QUEUED_RUNS`]
    /// unless set).
    pub fn max_queued_runs(&self) -> usize {
        self.inner
            .max_queued
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets how many runs may wait behind a session's current run; a run sent beyond that
    /// (with [`BusyPolicy::Enqueue`] or [`BusyPolicy::Interrupt`]) is refused with
    /// [`SessionError::QueueFull`].
    pub fn set_max_queued_runs(&self, max: usize) {
        self.inner
            .max_queued
            .store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// The workspace folder of `session`, when the manager gives sessions one.
    pub fn workspace(&self, session: SessionId) -> Option<PathBuf> {
        self.inner
            .workspaces
            .as_ref()
            .map(|root| root.join(session.to_string()))
    }

    /// The workspace folder shared under `name` (`<root>/agents/<name>`, for an agent whose
    /// sessions share one), when the manager gives sessions workspaces. `name` must be one
    /// plain path component (an agent id).
    pub fn shared_workspace(&self, name: &str) -> Option<PathBuf> {
        let plain =
            !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0']);
        self.inner
            .workspaces
            .as_ref()
            .filter(|_| plain)
            .map(|root| root.join(SHARED_WORKSPACES).join(name))
    }

    /// Makes `session`'s workspace the shared folder `name` (see [`Self::shared_workspace`]):
    /// `<root>/<session id>` becomes a link to it, so the session's runs, their sandbox, the
    /// ones resumed after a crash and the file routes all work there. A session whose
    /// workspace already exists keeps it (`Ok(false)`); `Ok(true)` when linked now (or already
    /// linked there).
    pub fn share_workspace(&self, session: SessionId, name: &str) -> std::io::Result<bool> {
        let (Some(own), Some(shared)) = (self.workspace(session), self.shared_workspace(name))
        else {
            return Ok(false);
        };
        std::fs::create_dir_all(&shared)?;
        // Relative, so the data folder can move.
        let target = Path::new(SHARED_WORKSPACES).join(name);
        match std::os::unix::fs::symlink(&target, &own) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                Ok(std::fs::read_link(&own).is_ok_and(|linked| linked == target))
            }
            Err(error) => Err(error),
        }
    }

    /// The file journal of the sessions' workspaces, if there is one.
    pub fn file_journal(&self) -> Option<Arc<FileJournal>> {
        self.inner.files.clone()
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

    /// A handle that does not keep the manager alive (for tools the manager's own runtime
    /// holds, such as `delegate`, which would otherwise make a reference cycle).
    pub fn downgrade(&self) -> WeakSessionManager {
        WeakSessionManager(Arc::downgrade(&self.inner))
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
        self.send_as(session, request, policy, RunId::new()).await
    }

    /// [`SessionManager::send`] with the run's id chosen by the caller (a run queue that named
    /// the run when it was submitted). The id must be new.
    pub async fn send_as(
        &self,
        session: SessionId,
        request: RunRequest,
        policy: BusyPolicy,
        run_id: RunId,
    ) -> Result<RunStream, SessionError> {
        // Reject bad requests (unknown model or tools, template errors, files that cannot be
        // attached) before queueing.
        let mut check = request.clone().with_history(vec![Message::user("")]);
        if check.workspace.is_none() {
            check.workspace = self.workspace(session);
        }
        self.runtime().prepare(check)?;
        let slot = self.slot(session);
        let guard = match policy {
            BusyPolicy::Reject => {
                let turn = match Arc::clone(&slot.gate).try_lock_owned() {
                    Ok(guard) => Some(guard),
                    // The run holding the session has ended (its end may be out already): it
                    // gives the session back in a moment.
                    Err(_) if slot.active().is_none() => {
                        let turn = Arc::clone(&slot.gate).lock_owned();
                        tokio::time::timeout(FINISHING_RUN_WAIT, turn).await.ok()
                    }
                    Err(_) => None,
                };
                if turn.is_none() {
                    let busy = SessionError::Busy {
                        session,
                        run_id: slot.active().map(|(run_id, _)| run_id),
                    };
                    self.release(session, slot);
                    return Err(busy);
                }
                turn
            }
            BusyPolicy::Enqueue | BusyPolicy::Interrupt => None,
        };
        let cancel = CancellationToken::new();
        let control = if guard.is_some() {
            self.register(session, run_id, cancel.clone())
        } else {
            match self.register_queued(session, run_id, cancel.clone()) {
                Ok(control) => control,
                Err(error) => {
                    self.release(session, slot);
                    return Err(error);
                }
            }
        };
        // Only once this run has its place: a refused interrupt leaves the current run alone.
        if policy == BusyPolicy::Interrupt
            && let Some((_, cancel)) = slot.active()
        {
            cancel.cancel();
        }
        let (sink, events) = EventSink::channel(EVENT_BUFFER);
        // In the caller's span: a delegated run's trace hangs under the call that started it.
        let task = tokio::spawn(tracing::Instrument::in_current_span(self.new_run_task(
            NewRun {
                session,
                request: Box::new(request),
                run_id,
                slot,
                guard,
                control,
                sink,
                cancel: cancel.clone(),
            },
        )));
        Ok(RunStream::new(events, task, cancel))
    }

    /// The task of a new run: waits for the session's turn (unless it has it), runs, and
    /// gives the turn back.
    ///
    /// The task lives as long as the run, once per live run: the request is boxed, so that it
    /// is not laid out again (most of a kilobyte) in each level of the task's future after the
    /// run has taken it.
    fn new_run_task(&self, run: NewRun) -> impl Future<Output = RunState> + Send + use<> {
        let manager = self.clone();
        async move {
            let NewRun {
                session,
                request,
                run_id,
                slot,
                guard,
                control,
                sink,
                cancel,
            } = run;
            let guard = match guard {
                Some(guard) => guard,
                None => Arc::clone(&slot.gate).lock_owned().await,
            };
            control
                .started
                .store(true, std::sync::atomic::Ordering::SeqCst);
            // The run's end goes out once the session no longer counts the run as active (a
            // client told it ended may send the next turn at once: see `send_as`).
            let (sink, end) = sink.holding_end();
            // Boxed: the state waits across the end's release, and would otherwise widen every
            // live run's task by its size.
            let state = Box::new(
                manager
                    .run_new(session, request, run_id, &slot, sink, cancel, control.pause)
                    .await,
            );
            slot.set_active(None);
            manager.unregister(run_id);
            end.release().await;
            drop(guard);
            manager.release(session, slot);
            *state
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn run_new(
        &self,
        session: SessionId,
        request: Box<RunRequest>,
        run_id: RunId,
        slot: &Slot,
        sink: EventSink,
        cancel: CancellationToken,
        pause: CancellationToken,
    ) -> RunState {
        if cancel.is_cancelled() {
            // Cancelled while queued: nothing was committed, nothing runs.
            return ended_before_the_driver(run_id, None, sink).await;
        }
        slot.set_active(Some((run_id, cancel.clone())));
        // What follows the start is made before it is awaited: a wait inside the `match` on the
        // start's result would keep the result's space (a kilobyte) for the whole run.
        let run = match self.start(session, *request, run_id).await {
            Ok((state, start)) => futures::future::Either::Left(self.drive(
                session,
                state,
                Some(start),
                sink,
                cancel,
                pause,
            )),
            Err(error) => futures::future::Either::Right(ended_before_the_driver(
                run_id,
                Some(error_info(&error)),
                sink,
            )),
        };
        run.await
    }

    /// Loads the history, closes a run a crash left open, and sends the new run's start to the
    /// log: the run goes on while it commits (see [`PendingStart`]).
    async fn start(
        &self,
        session: SessionId,
        mut request: RunRequest,
        run_id: RunId,
    ) -> Result<(RunState, PendingStart), SessionError> {
        let log = &self.inner.log;
        // A session created with this run has no log to read yet.
        let new_session = request.new_session.take();
        let events = match new_session {
            Some(_) => Vec::new(),
            None => log.load(session).await?,
        };
        let mut replayed = replay(&events);
        if let Some(in_flight) = replayed.in_flight.take() {
            // A run the process lost and nobody resumed: close it honestly before going on.
            let results = close_unknown(log.as_ref(), session, &in_flight, true).await?;
            replayed
                .messages
                .extend(results.into_iter().map(Message::Tool));
        }
        let history_len = replayed.messages.len();
        // The log's messages, then any the request brings: a new session's earlier turns (a
        // client that sends its whole conversation), or a client's results for the tool calls
        // the session's last run ended on. Those are logged with this run.
        let brought = std::mem::take(&mut request.history);
        request.history = replayed.messages;
        request.history.extend(brought);
        if request.compacted.is_none() {
            request.compacted = replayed.compaction;
        }
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
            approvals: if state.approvals.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::to_value(&state.approvals).unwrap_or_default()
            },
            network: if state.network.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::to_value(&state.network).unwrap_or_default()
            },
            agent_id: state.agent_id.clone(),
            grant: state
                .grant
                .as_ref()
                .and_then(|grant| serde_json::to_value(grant).ok())
                .unwrap_or_default(),
        }];
        records.extend(
            new_messages
                .into_iter()
                .map(|message| SessionEvent::Message { run_id, message }),
        );
        let log = Arc::clone(log);
        let written = records.clone();
        let write = async move {
            match new_session {
                Some(info) => {
                    log.create_with(session, info, written, SessionStatus::Running)
                        .await
                }
                None => {
                    log.append_with_status(session, written, SessionStatus::Running)
                        .await
                }
            }
            .map_err(|error| error_info(&SessionError::Log(error)))
        };
        Ok((state, PendingStart::spawn(run_id, records, write)))
    }

    // Not an `async fn`: the driver's future is made here, before anything waits, so the
    // run's state is not held a second time by this future (see `Driver::run`).
    fn drive(
        &self,
        session: SessionId,
        mut state: RunState,
        start: Option<PendingStart>,
        sink: EventSink,
        cancel: CancellationToken,
        pause: CancellationToken,
    ) -> impl Future<Output = RunState> + Send + use<> {
        let runtime = self.runtime();
        let model = match runtime.client_for(&state) {
            Ok(model) => model,
            Err(error) => {
                let error = error_info(&SessionError::Run(error));
                return futures::future::Either::Left(async move {
                    // The start's own failure, if it failed, comes first.
                    let settled = match start {
                        Some(mut start) => start.settle(&sink).await,
                        None => Ok(()),
                    };
                    state.fail(settled.err().unwrap_or(error));
                    sink.send_final(&state).await;
                    state
                });
            }
        };
        let journal = Journal::new(Arc::clone(&self.inner.log), session);
        let tools = runtime.tools().clone();
        // The driver records the session's status with the end of the run.
        let summarizer = runtime.summarizer_for(&state);
        let accounting = runtime.accounting(&state);
        let mut driver = Driver::new(model, tools, sink, cancel);
        if let Some(start) = start {
            driver = driver.pending_start(start);
        }
        futures::future::Either::Right(
            driver
                .summarizer(summarizer)
                .accounting(accounting)
                .pause(pause)
                .journal(journal)
                .files(self.inner.files.clone())
                .run(state),
        )
    }

    /// Continues the run that was in flight in `session` when the process stopped, from its
    /// last committed step. Tool calls whose intent was committed without a result run again
    /// only if their tool is idempotent; the others get an "outcome unknown" result. Returns
    /// `None` when no run was in flight. A paused run is resumed too; a run waiting for
    /// approvals stops again at once (its stream ends with `run_suspended`), unless every call
    /// was decided.
    pub async fn resume(&self, session: SessionId) -> Result<Option<RunStream>, SessionError> {
        self.resume_from_log(session, true).await
    }

    async fn resume_from_log(
        &self,
        session: SessionId,
        paused_too: bool,
    ) -> Result<Option<RunStream>, SessionError> {
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
        if in_flight.paused {
            if !paused_too {
                // Paused on purpose: it stays so until someone resumes it.
                log.set_status(session, SessionStatus::Paused).await?;
                return Ok(None);
            }
            log.append_with_status(
                session,
                vec![SessionEvent::RunResumed {
                    run_id: in_flight.run_id,
                }],
                SessionStatus::Running,
            )
            .await?;
        }
        let mut messages = replayed.messages;
        let compaction = replayed.compaction;
        let policy = policy_of(&in_flight);
        let mut ask = Vec::new();
        if !in_flight.awaiting_approval() {
            if policy.unknown_outcome() == UnknownOutcome::Ask {
                // A person decides on the calls whose outcome is unknown.
                ask = in_flight
                    .pending
                    .iter()
                    .filter(|(_, idempotent)| !idempotent)
                    .map(|(call, _)| PendingApproval {
                        call: call.clone(),
                        reason: format!(
                            "the process stopped while this call was running, so it may or may \
                             not have taken effect (the tool is not idempotent): approve to run \
                             it again, reject to tell the model; {OUTCOME_UNKNOWN}"
                        ),
                    })
                    .collect();
                let records: Vec<SessionEvent> = ask
                    .iter()
                    .map(|pending| SessionEvent::ApprovalRequested {
                        run_id: in_flight.run_id,
                        call: pending.call.clone(),
                        reason: pending.reason.clone(),
                    })
                    .collect();
                if !records.is_empty() {
                    log.append(session, records).await?;
                }
            } else {
                let results = close_unknown(log.as_ref(), session, &in_flight, false).await?;
                messages.extend(results.into_iter().map(Message::Tool));
            }
        }
        let mut state = self.resumed_state(&in_flight, messages, compaction);
        if !ask.is_empty() {
            state.phase = Phase::AwaitingApproval {
                calls: in_flight.pending.iter().map(|(c, _)| c.clone()).collect(),
                warnings: Default::default(),
                pending: ask,
                decisions: Default::default(),
            };
        }
        state.workspace = self.workspace(session);
        Ok(Some(self.spawn_continued(session, slot, guard, state)))
    }

    /// Drives a continued run (resumed, approved, unpaused) in its session, holding its
    /// writer lock until it stops.
    fn spawn_continued(
        &self,
        session: SessionId,
        slot: Arc<Slot>,
        guard: OwnedMutexGuard<()>,
        state: RunState,
    ) -> RunStream {
        let run_id = state.run_id;
        let cancel = CancellationToken::new();
        let control = self.register(session, run_id, cancel.clone());
        control
            .started
            .store(true, std::sync::atomic::Ordering::SeqCst);
        slot.set_active(Some((run_id, cancel.clone())));
        let (sink, events) = EventSink::channel(EVENT_BUFFER);
        let manager = self.clone();
        // Made here, not in the task: the task would hold the state a second time.
        let run = self.drive(session, state, None, sink, cancel.clone(), control.pause);
        // In the caller's span: a delegated run's trace hangs under the call that started it.
        let task = tokio::spawn(tracing::Instrument::in_current_span(async move {
            let state = run.await;
            slot.set_active(None);
            manager.unregister(run_id);
            drop(guard);
            manager.release(session, slot);
            state
        }));
        RunStream::new(events, task, cancel)
    }

    fn register(&self, session: SessionId, run_id: RunId, cancel: CancellationToken) -> Control {
        let control = Control {
            session,
            cancel,
            pause: CancellationToken::new(),
            started: Arc::default(),
        };
        lock(&self.inner.controls).insert(run_id, control.clone());
        control
    }

    /// Registers a run that will wait for the session's writer lock, unless the session
    /// already has its maximum of runs waiting ([`SessionError::QueueFull`]). Counted and
    /// registered under one lock, so concurrent sends cannot overshoot.
    fn register_queued(
        &self,
        session: SessionId,
        run_id: RunId,
        cancel: CancellationToken,
    ) -> Result<Control, SessionError> {
        let max = self.max_queued_runs();
        let mut controls = lock(&self.inner.controls);
        let queued = controls
            .values()
            .filter(|control| {
                control.session == session
                    && !control.started.load(std::sync::atomic::Ordering::SeqCst)
                    && !control.cancel.is_cancelled()
            })
            .count();
        if queued >= max {
            return Err(SessionError::QueueFull { session, max });
        }
        let control = Control {
            session,
            cancel,
            pause: CancellationToken::new(),
            started: Arc::default(),
        };
        controls.insert(run_id, control.clone());
        Ok(control)
    }

    fn unregister(&self, run_id: RunId) {
        lock(&self.inner.controls).remove(&run_id);
    }

    /// The session of a run this manager is running or has queued.
    pub fn session_of_live_run(&self, run_id: RunId) -> Option<SessionId> {
        lock(&self.inner.controls)
            .get(&run_id)
            .map(|control| control.session)
    }

    /// Takes `session`'s writer lock, or says which run holds it.
    fn try_gate(
        &self,
        session: SessionId,
    ) -> Result<(Arc<Slot>, OwnedMutexGuard<()>), SessionError> {
        let slot = self.slot(session);
        let guard = Arc::clone(&slot.gate)
            .try_lock_owned()
            .map_err(|_| SessionError::Busy {
                session,
                run_id: slot.active().map(|(run_id, _)| run_id),
            })?;
        Ok((slot, guard))
    }

    /// The run of `session` left in flight in its log (waiting, paused, or lost), if it is
    /// `run_id`.
    async fn in_flight_run(
        &self,
        session: SessionId,
        run_id: RunId,
    ) -> Result<(super::replay::Replay, InFlight), SessionError> {
        let events = self.inner.log.load(session).await?;
        let mut replayed = replay(&events);
        match replayed.in_flight.take() {
            Some(in_flight) if in_flight.run_id == run_id => Ok((replayed, in_flight)),
            _ if events.iter().any(|(_, event)| {
                matches!(event, SessionEvent::RunStarted { run_id: id, .. } if *id == run_id)
            }) =>
            {
                Err(SessionError::WrongState {
                    run_id,
                    state: "has ended".into(),
                })
            }
            _ => Err(SessionError::NoSuchRun { session, run_id }),
        }
    }

    /// The calls of `session`'s run that wait for a decision: the run and its pending calls,
    /// or `None` when no run waits.
    pub async fn pending_approvals(
        &self,
        session: SessionId,
    ) -> Result<Option<(RunId, Vec<PendingApproval>)>, SessionError> {
        let events = self.inner.log.load(session).await?;
        Ok(replay(&events)
            .in_flight
            .filter(InFlight::awaiting_approval)
            .map(|run| (run.run_id, run.undecided())))
    }

    /// Records decisions on the waiting calls of `run_id` in `session`. Each decision is
    /// checked first (a call that waits and is not yet decided; edited arguments valid for the
    /// tool's schema), then all are committed together. Once every call of the round is
    /// decided the run goes on, in the same session with the same id.
    pub async fn decide(
        &self,
        session: SessionId,
        run_id: RunId,
        decisions: Vec<ApprovalDecision>,
    ) -> Result<Decided, SessionError> {
        let (slot, guard) = self.try_gate(session)?;
        let (replayed, in_flight) = self.in_flight_run(session, run_id).await?;
        if !in_flight.awaiting_approval() {
            return Err(SessionError::WrongState {
                run_id,
                state: "is not waiting for approvals".into(),
            });
        }
        let mut state = self.resumed_state(&in_flight, replayed.messages, replayed.compaction);
        let runtime = self.runtime();
        let mut records = Vec::with_capacity(decisions.len());
        for decision in decisions {
            state.decide(decision.clone())?;
            if let Some(arguments) = &decision.arguments {
                let name = in_flight
                    .approval_requests
                    .iter()
                    .find(|p| p.call.id == decision.call_id)
                    .map(|p| p.call.name.clone())
                    .unwrap_or_default();
                if let Err(error) = runtime.tools().validate(&name, arguments) {
                    return Err(ApprovalError::InvalidDecision(format!(
                        "the edited arguments of {:?} are not valid for {name:?}: {error}",
                        decision.call_id
                    ))
                    .into());
                }
            }
            records.push(SessionEvent::ApprovalDecided {
                run_id,
                call_id: decision.call_id.clone(),
                decision: decision.decision,
                reason: decision.reason.clone(),
                arguments: decision.arguments,
            });
        }
        let pending = state.pending_approvals();
        if !pending.is_empty() {
            self.inner.log.append(session, records).await?;
            return Ok(Decided {
                pending,
                stream: None,
            });
        }
        records.push(SessionEvent::RunResumed { run_id });
        self.inner
            .log
            .append_with_status(session, records, SessionStatus::Running)
            .await?;
        state.workspace = self.workspace(session);
        Ok(Decided {
            pending,
            stream: Some(self.spawn_continued(session, slot, guard, state)),
        })
    }

    /// Asks the live run `run_id` to pause at its next safe point (before its next model
    /// call). Returns its session.
    pub fn pause(&self, run_id: RunId) -> Result<SessionId, SessionError> {
        let control = lock(&self.inner.controls).get(&run_id).cloned();
        match control {
            Some(control) if control.started.load(std::sync::atomic::Ordering::SeqCst) => {
                control.pause.cancel();
                Ok(control.session)
            }
            Some(_) => Err(SessionError::WrongState {
                run_id,
                state: "is queued and has not started".into(),
            }),
            None => Err(SessionError::WrongState {
                run_id,
                state: "is not running".into(),
            }),
        }
    }

    /// Continues the paused run `run_id` of `session` where it stopped.
    pub async fn resume_paused(
        &self,
        session: SessionId,
        run_id: RunId,
    ) -> Result<RunStream, SessionError> {
        let (slot, guard) = self.try_gate(session)?;
        let (replayed, in_flight) = self.in_flight_run(session, run_id).await?;
        if !in_flight.paused {
            return Err(SessionError::WrongState {
                run_id,
                state: if in_flight.awaiting_approval() {
                    "is waiting for approvals, not paused".into()
                } else {
                    "is not paused".into()
                },
            });
        }
        let log = &self.inner.log;
        log.append_with_status(
            session,
            vec![SessionEvent::RunResumed { run_id }],
            SessionStatus::Running,
        )
        .await?;
        let mut state = self.resumed_state(&in_flight, replayed.messages, replayed.compaction);
        state.workspace = self.workspace(session);
        Ok(self.spawn_continued(session, slot, guard, state))
    }

    /// Interrupts run `run_id` of `session`: a live run stops its current step (the model call
    /// and tools in flight are cancelled) and ends `cancelled`; a waiting or paused run ends
    /// `cancelled` at once. The session stays usable. Returns whether a run was stopped.
    pub async fn interrupt(&self, session: SessionId, run_id: RunId) -> Result<bool, SessionError> {
        let control = lock(&self.inner.controls).get(&run_id).cloned();
        if let Some(control) = control {
            control.cancel.cancel();
            return Ok(true);
        }
        let (_slot, _guard) = self.try_gate(session)?;
        let (_, in_flight) = self.in_flight_run(session, run_id).await?;
        let how = if in_flight.awaiting_approval() {
            "while it waited for approval"
        } else if in_flight.paused {
            "while it was paused"
        } else {
            "after the process that ran it stopped"
        };
        let log = &self.inner.log;
        log.append_with_status(
            session,
            vec![SessionEvent::RunFinished {
                run_id,
                stop_reason: RunStopReason::Cancelled,
                usage: in_flight.usage,
                rounds: in_flight.round,
                error: None,
                note: Some(format!("the run was interrupted {how}")),
            }],
            SessionStatus::Interrupted,
        )
        .await?;
        Ok(true)
    }

    /// Ends the run `session` was running when the process running it stopped, without
    /// resuming it: `cancelled` with `note`, the session `interrupted` (a person may continue
    /// it). A session with no run in flight is set idle. Returns whether a run was ended.
    pub async fn interrupt_stopped(
        &self,
        session: SessionId,
        note: String,
    ) -> Result<bool, SessionError> {
        let (_slot, _guard) = self.try_gate(session)?;
        let log = &self.inner.log;
        let events = log.load(session).await?;
        let Some(in_flight) = replay(&events).in_flight else {
            log.set_status(session, SessionStatus::Idle).await?;
            return Ok(false);
        };
        log.append_with_status(
            session,
            vec![SessionEvent::RunFinished {
                run_id: in_flight.run_id,
                stop_reason: RunStopReason::Cancelled,
                usage: in_flight.usage,
                rounds: in_flight.round,
                error: None,
                note: Some(note),
            }],
            SessionStatus::Interrupted,
        )
        .await?;
        Ok(true)
    }

    /// Aborts `session`'s work: every run queued behind the current one is dropped (nothing
    /// of it is committed), and the run `run_id` is interrupted. Returns how many queued runs
    /// were dropped.
    pub async fn abort(&self, session: SessionId, run_id: RunId) -> Result<usize, SessionError> {
        let dropped = self.drop_queued(session);
        self.interrupt(session, run_id).await?;
        Ok(dropped)
    }

    /// How many runs wait in `session`'s queue (sent, not started, not cancelled).
    pub fn queued(&self, session: SessionId) -> usize {
        lock(&self.inner.controls)
            .values()
            .filter(|control| {
                control.session == session
                    && !control.started.load(std::sync::atomic::Ordering::SeqCst)
                    && !control.cancel.is_cancelled()
            })
            .count()
    }

    /// Cancels every run queued in `session` that has not started; returns how many.
    pub fn drop_queued(&self, session: SessionId) -> usize {
        let controls = lock(&self.inner.controls);
        let mut dropped = 0;
        for control in controls.values() {
            if control.session == session
                && !control.started.load(std::sync::atomic::Ordering::SeqCst)
                && !control.cancel.is_cancelled()
            {
                control.cancel.cancel();
                dropped += 1;
            }
        }
        dropped
    }

    /// Resumes every run that was in flight when the process stopped (sessions still marked
    /// running). Call once at start-up, before accepting new work.
    pub async fn recover(&self) -> Result<Vec<(SessionId, RunStream)>, SessionError> {
        let mut resumed = Vec::new();
        for session in self.interrupted_sessions().await? {
            if let Some(stream) = self.recover_session(session).await? {
                resumed.push((session, stream));
            }
        }
        Ok(resumed)
    }

    /// The sessions [`SessionManager::recover`] would resume: marked running in the log.
    pub async fn interrupted_sessions(&self) -> Result<Vec<SessionId>, SessionError> {
        Ok(self
            .inner
            .log
            .sessions_with_status(SessionStatus::Running)
            .await?)
    }

    /// Resumes one interrupted session as [`SessionManager::recover`] does (`None` when its
    /// log shows no run in flight after all).
    pub async fn recover_session(
        &self,
        session: SessionId,
    ) -> Result<Option<RunStream>, SessionError> {
        self.resume_from_log(session, false).await
    }

    fn resumed_state(
        &self,
        in_flight: &InFlight,
        messages: Vec<Message>,
        compaction: Option<Compaction>,
    ) -> RunState {
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
        let phase = if in_flight.awaiting_approval() {
            Phase::AwaitingApproval {
                calls: in_flight.unanswered.clone(),
                warnings: Default::default(),
                pending: in_flight.approval_requests.clone(),
                decisions: in_flight.decisions.clone(),
            }
        } else if !rerun.is_empty() {
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
            // The log keeps no client tool: a resumed run offers its own tools only.
            client_tools: Vec::new(),
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
            approvals: policy_of(in_flight),
            // The deadline starts again: the time the process was down does not count.
            started_at_ms: None,
            agent_id: in_flight.agent_id.clone(),
            network: network_of(in_flight),
            grant: grant_of(in_flight),
            // The runtime's compaction settings, and what the log says was compacted.
            context: runtime.context_policy(&in_flight.model, None),
            compaction,
            overflow_retried: false,
            memory: None,
            user: None,
            // The log does not record the run's own stand-ins: the runtime's labelled ones.
            media: runtime
                .media_route(&in_flight.model, None, None)
                .unwrap_or_default(),
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
            note: Some(
                if in_flight.awaiting_approval() {
                    "a new message came while the run waited for approval, so it was closed"
                } else if in_flight.paused {
                    "a new message came while the run was paused, so it was closed"
                } else {
                    "the process stopped during this run and it was not resumed"
                }
                .into(),
            ),
        });
    }
    if !records.is_empty() {
        log.append(session, records).await?;
    }
    Ok(results)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The approval policy a run recorded when it started.
/// The run's network narrowings, as recorded. A record that does not read fails closed: fetch
/// is off for the resumed run.
fn network_of(in_flight: &InFlight) -> Vec<crate::network::NetworkPolicy> {
    if in_flight.network.is_null() {
        return Vec::new();
    }
    serde_json::from_value(in_flight.network.clone())
        .unwrap_or_else(|_| vec![crate::network::NetworkPolicy::Off])
}

/// The grant a run was started with. One that no longer reads (a newer format) grants nothing
/// rather than everything.
fn grant_of(in_flight: &InFlight) -> Option<crate::access::Grant> {
    if in_flight.grant.is_null() {
        return None;
    }
    Some(
        serde_json::from_value(in_flight.grant.clone()).unwrap_or_else(|_| crate::access::Grant {
            agents: Some(Vec::new()),
            models: Some(Vec::new()),
            tools: Some(Vec::new()),
            no_commands: true,
        }),
    )
}

fn policy_of(in_flight: &InFlight) -> ApprovalPolicy {
    if in_flight.approvals.is_null() {
        return ApprovalPolicy::default();
    }
    serde_json::from_value(in_flight.approvals.clone()).unwrap_or_default()
}

/// Reports the end of run `run_id`, which never reached the driver: cancelled while queued
/// (`None`), or failed to start with `error`; returns its state.
async fn ended_before_the_driver(
    run_id: RunId,
    error: Option<ErrorInfo>,
    sink: EventSink,
) -> RunState {
    let mut state = placeholder(run_id);
    match error {
        Some(error) => state.fail(error),
        None => state.cancel(),
    }
    sink.send_final(&state).await;
    state
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
        SessionError::QueueFull { .. } => (agentry_types::ErrorCode::RateLimited, true),
        SessionError::Log(LogError::Full(_)) => (agentry_types::ErrorCode::StorageFull, true),
        SessionError::Log(_) => (agentry_types::ErrorCode::Internal, true),
        SessionError::Run(_) | SessionError::Approval(_) => {
            (agentry_types::ErrorCode::InvalidRequest, false)
        }
        SessionError::NoSuchRun { .. } => (agentry_types::ErrorCode::NotFound, false),
        SessionError::WrongState { .. } => (agentry_types::ErrorCode::Conflict, false),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use agentry_types::{RunId, SessionId};
    use tokio_util::sync::CancellationToken;

    use super::{NewRun, SessionManager, Slot};
    use crate::events::EventSink;
    use crate::runtime::{RunRequest, Runtime};
    use crate::session::MemoryLog;

    /// A new run's task lives as long as the run, once per live run (a thousand live streams,
    /// a thousand tasks): what its future lays out is what each live run costs before any of
    /// its data. While it held the request at two levels and the start's result for the
    /// whole run it took 7,984 bytes (release); now 4,656.
    #[test]
    fn a_new_runs_task_holds_no_copy_of_what_the_run_took() {
        let manager =
            SessionManager::new(Runtime::builder().build(), Arc::new(MemoryLog::default()));
        let (session, run_id, cancel) = (SessionId::new(), RunId::new(), CancellationToken::new());
        let (sink, _events) = EventSink::channel(1);
        let task = manager.new_run_task(NewRun {
            session,
            request: Box::new(RunRequest::default()),
            run_id,
            slot: Arc::new(Slot::default()),
            guard: None,
            control: manager.register(session, run_id, cancel.clone()),
            sink,
            cancel,
        });
        let size = std::mem::size_of_val(&task);
        assert!(size <= 5 * 1024, "a new run's task takes {size} bytes");
    }
}
