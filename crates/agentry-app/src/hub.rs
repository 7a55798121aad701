//! Live runs and the clients attached to them.
//!
//! When the server starts a run it hands the run's event stream to the hub, which forwards every
//! event to any number of subscribers (a broadcast channel) until the run ends. The run belongs
//! to the hub, not to the request that started it: it keeps going when every client has gone.
//! The hub also keeps the current step's partial text, so a client attaching mid-step sees what
//! has been generated so far.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use agentry_core::RunStream;
use agentry_core::session::SessionStatus;
use agentry_types::{RunEvent, RunId, RunStopReason, SessionEvent, SessionId, SuspendStatus};

/// What watches the hub's runs: the HTTP server counts them into its metrics. Every method
/// defaults to doing nothing.
pub trait RunObserver: Send + Sync {
    /// A run was adopted.
    fn run_started(&self) {}
    /// One of its events.
    fn observe(&self, event: &RunEvent) {
        let _ = event;
    }
    /// It ended (finished, failed, suspended or dropped).
    fn run_ended(&self) {}
    /// A worker claimed a queued run that had waited `waited` since it was submitted.
    fn run_dequeued(&self, waited: std::time::Duration) {
        let _ = waited;
    }
}

/// The observer that does nothing.
pub(crate) struct Unobserved;

impl RunObserver for Unobserved {}

/// Events a slow subscriber may fall behind by before it must catch up from the log.
/// (A live run's channel allocates all its slots up front: 256 keep a streaming run small, about
/// 7.7 KiB of slots in a heaptrack of 1,000 live session streams, and are 12.8 s of slack at
/// 50 ms between deltas, 2.5 s at a fast model's 100 deltas a second.)
const CHANNEL_CAPACITY: usize = 256;

/// Status changes of every session a feed subscriber may fall behind by.
const STATUS_CAPACITY: usize = 1024;

/// A live run's fan-out.
struct LiveRun {
    run_id: Option<RunId>,
    sender: broadcast::Sender<Arc<RunEvent>>,
    cancel: CancellationToken,
    progress: Arc<Mutex<Progress>>,
}

/// Where a live run is: the step in progress, and the first step it committed. Changed and
/// sent under one lock, so a subscription's partial step and its receiver agree exactly.
#[derive(Debug, Default)]
struct Progress {
    partial: Partial,
    first_seq: Option<u64>,
}

/// A live run's progress, for its subscribers: where its committed steps begin in the log, for
/// one that fell behind and reads them back (kept after the run ends).
#[derive(Clone, Default)]
pub struct RunProgress(Arc<Mutex<Progress>>);

impl RunProgress {
    /// The seq of the first step the run committed, once it has committed one.
    pub fn first_seq(&self) -> Option<u64> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .first_seq
    }

    /// The progress of a run that first committed `seq` (for tests).
    #[cfg(test)]
    pub(crate) fn first_committed(seq: u64) -> Self {
        Self(Arc::new(Mutex::new(Progress {
            first_seq: Some(seq),
            ..Progress::default()
        })))
    }
}

/// How a live run ended, as its events said: its stop reason, or that it stopped without
/// ending (waiting for a person, paused).
#[derive(Debug, Clone, Copy, Default)]
struct Ending {
    end: Option<RunStopReason>,
    suspended: Option<SuspendStatus>,
}

/// Text and thinking generated since the last committed step.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Partial {
    /// Answer text so far.
    pub text: String,
    /// Reasoning so far.
    pub thinking: String,
    /// The seq of the last step the run committed before this text (0 before its first).
    pub seq: u64,
}

/// What a subscriber gets: the live events, and the partial step at the moment it subscribed.
/// Read it through [`crate::App::follow`], which catches a subscriber that fell behind up
/// from the log.
pub struct Subscription {
    /// Live events from now on.
    pub events: broadcast::Receiver<Arc<RunEvent>>,
    /// The step in progress when the subscription began.
    pub partial: Partial,
    /// The run's progress.
    pub progress: RunProgress,
    /// Whether events were already missed from `events` (a reader that fell behind before
    /// handing it to [`crate::App::follow`]).
    pub missed: bool,
}

/// A change of a session's state, for `GET /v1/sessions/events`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StatusChange {
    /// The session.
    pub session_id: SessionId,
    /// What the session's status is now, or `updated` for a title or read change.
    pub status: FeedStatus,
    /// Why the last run ended, when one just did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<String>,
    /// The new title, when it changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

/// What a status change says: a session's run status, or that something else about it changed.
/// Serialised as its snake-case name (`running`, `idle`, …, `updated`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FeedStatus {
    /// No run in progress.
    Idle,
    /// A run is in progress.
    Running,
    /// The last run was stopped before it finished.
    Interrupted,
    /// The last run failed.
    Failed,
    /// A run waits for a person (approvals, an MCP server's question).
    Waiting,
    /// A run is paused between rounds.
    Paused,
    /// Not the run: the title or the read mark changed.
    Updated,
}

impl FeedStatus {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Running => "running",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
            Self::Waiting => "waiting",
            Self::Paused => "paused",
            Self::Updated => "updated",
        }
    }

    /// The feed status of a session whose last run ended for `reason` (`None`: it never
    /// reported an end).
    pub fn after(reason: Option<RunStopReason>) -> Self {
        match reason {
            Some(RunStopReason::Error) => Self::Failed,
            Some(RunStopReason::Cancelled | RunStopReason::Deadline) | None => Self::Interrupted,
            Some(_) => Self::Idle,
        }
    }
}

impl From<SessionStatus> for FeedStatus {
    fn from(status: SessionStatus) -> Self {
        match status {
            SessionStatus::Idle => Self::Idle,
            SessionStatus::Running => Self::Running,
            SessionStatus::Interrupted => Self::Interrupted,
            SessionStatus::Failed => Self::Failed,
            SessionStatus::Waiting => Self::Waiting,
            SessionStatus::Paused => Self::Paused,
        }
    }
}

impl From<SuspendStatus> for FeedStatus {
    fn from(status: SuspendStatus) -> Self {
        match status {
            SuspendStatus::Waiting => Self::Waiting,
            SuspendStatus::Paused => Self::Paused,
        }
    }
}

impl Progress {
    /// Notes one event of the run.
    fn note(&mut self, event: &RunEvent) {
        match event {
            RunEvent::TextDelta { text } => self.partial.text.push_str(text),
            RunEvent::ThinkingDelta { text } => self.partial.thinking.push_str(text),
            RunEvent::Committed { seq, event } => {
                self.first_seq.get_or_insert(*seq);
                if matches!(event, SessionEvent::AssistantMessage { .. }) {
                    self.partial.text.clear();
                    self.partial.thinking.clear();
                }
                self.partial.seq = *seq;
            }
            _ => {}
        }
    }
}

/// The live runs, by session. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    live: Arc<Mutex<HashMap<SessionId, LiveRun>>>,
    status: broadcast::Sender<StatusChange>,
    observer: Arc<dyn RunObserver>,
}

impl Default for Hub {
    fn default() -> Self {
        Self::new(Arc::new(Unobserved))
    }
}

impl Hub {
    /// What watches its runs.
    pub(crate) fn observer(&self) -> &dyn RunObserver {
        &*self.observer
    }

    /// A hub reporting its runs to `observer`.
    pub fn new(observer: Arc<dyn RunObserver>) -> Self {
        Self {
            live: Arc::default(),
            status: broadcast::channel(STATUS_CAPACITY).0,
            observer,
        }
    }

    /// Subscribes to every session's status changes.
    pub fn status_changes(&self) -> broadcast::Receiver<StatusChange> {
        self.status.subscribe()
    }

    /// Announces a status change.
    pub fn notify(&self, change: StatusChange) {
        // Nobody listening is fine.
        let _ = self.status.send(change);
    }

    /// Announces that `session`'s status is now `status`, for a change no live run reports
    /// (a decision, a pause, a read mark, an MCP server asking for input).
    pub fn announce(&self, session: SessionId, status: FeedStatus) {
        self.notify(StatusChange {
            session_id: session,
            status,
            stop_reason: None,
            title: None,
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, LiveRun>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes over `run` (of `session`): its events go to every subscriber until it ends. Returns
    /// a subscription made before the first event, so the caller misses nothing.
    pub fn adopt(&self, session: SessionId, mut run: RunStream) -> Subscription {
        let (sender, events) = broadcast::channel(CHANNEL_CAPACITY);
        let progress = Arc::new(Mutex::new(Progress::default()));
        let cancel = run.cancel_token();
        self.lock().insert(
            session,
            LiveRun {
                run_id: None,
                sender: sender.clone(),
                cancel,
                progress: Arc::clone(&progress),
            },
        );
        self.observer.run_started();
        // The run's events are handled in the task that sends them (its driver, a tool): the
        // fan-out wakes no task of its own for every delta. The task below only waits for the
        // run's end.
        let ending = Arc::new(Mutex::new(Ending::default()));
        run.tap({
            let hub = self.clone();
            let sender = sender.clone();
            let ending = Arc::clone(&ending);
            let progress = Arc::clone(&progress);
            move |event| hub.fan_out(session, event, &sender, &progress, &ending)
        });
        let hub = self.clone();
        tokio::spawn(async move {
            let finished = run.finish().await;
            hub.observer.run_ended();
            let Ending { end, suspended } = *ending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let status = match (suspended, end) {
                (Some(status), None) => FeedStatus::from(status),
                (_, end) => FeedStatus::after(end),
            };
            hub.notify(StatusChange {
                session_id: session,
                status,
                stop_reason: end.map(|reason| reason.as_str().to_owned()),
                title: None,
            });
            if let Err(error) = finished {
                tracing::error!(%session, "a run ended abnormally: {error}");
            }
            hub.forget(session, &sender);
        });
        Subscription {
            events,
            partial: Partial::default(),
            progress: RunProgress(progress),
            missed: false,
        }
    }

    /// One event of `session`'s live run: noted, then sent to every subscriber.
    fn fan_out(
        &self,
        session: SessionId,
        event: RunEvent,
        sender: &broadcast::Sender<Arc<RunEvent>>,
        progress: &Mutex<Progress>,
        ending: &Mutex<Ending>,
    ) {
        self.note_run(session, &event);
        self.observer.observe(&event);
        let ended = |end: Option<RunStopReason>, suspended: Option<SuspendStatus>| {
            let mut ending = ending
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if end.is_some() {
                ending.end = end;
            }
            if suspended.is_some() {
                ending.suspended = suspended;
            }
            drop(ending);
            self.forget(session, sender);
        };
        match &event {
            RunEvent::RunFinished { stop_reason, .. } | RunEvent::RunFailed { stop_reason, .. } => {
                ended(Some(*stop_reason), None);
            }
            // A run waiting for approval or paused stops here without ending.
            RunEvent::RunSuspended { status, .. } => ended(None, Some(*status)),
            RunEvent::Committed {
                event: SessionEvent::RunPaused { .. },
                ..
            } => ended(None, Some(SuspendStatus::Paused)),
            // In a session, clients see the end as this committed event, which comes first.
            // The run is over once its end is out: no longer live for anyone who has seen it
            // (abort, delete and continue check this).
            RunEvent::Committed {
                event: SessionEvent::RunFinished { stop_reason, .. },
                ..
            } => ended(Some(*stop_reason), None),
            _ => {}
        }
        // The step in progress changes and the event goes out under one lock, so a
        // subscription (made under it too) sees each event either in its partial step or in its
        // receiver, never both or neither. Never hold it while taking `live`: `subscribe` takes
        // them the other way round.
        let mut progress = progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        progress.note(&event);
        // No subscriber is fine: the run goes on.
        let _ = sender.send(Arc::new(event));
    }

    /// Notes a run's id and its start.
    fn note_run(&self, session: SessionId, event: &RunEvent) {
        // A continued run (approved, resumed) commits no `run_started`: take its id from here.
        if let RunEvent::RunStarted { run_id } = event {
            if let Some(live) = self.lock().get_mut(&session) {
                live.run_id.get_or_insert(*run_id);
            }
            return;
        }
        if let RunEvent::Committed {
            event: SessionEvent::RunStarted { run_id, .. },
            ..
        } = event
        {
            if let Some(live) = self.lock().get_mut(&session) {
                live.run_id = Some(*run_id);
            }
            self.notify(StatusChange {
                session_id: session,
                status: FeedStatus::Running,
                stop_reason: None,
                title: None,
            });
        }
    }

    /// Removes `session`'s live run if it is still the one behind `sender`.
    fn forget(&self, session: SessionId, sender: &broadcast::Sender<Arc<RunEvent>>) {
        let mut live = self.lock();
        if live
            .get(&session)
            .is_some_and(|run| run.sender.same_channel(sender))
        {
            live.remove(&session);
        }
    }

    /// Subscribes to the live run of `session`, if one is going.
    pub fn subscribe(&self, session: SessionId) -> Option<Subscription> {
        let live = self.lock();
        let run = live.get(&session)?;
        let progress = run
            .progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Some(Subscription {
            events: run.sender.subscribe(),
            partial: progress.partial.clone(),
            progress: RunProgress(Arc::clone(&run.progress)),
            missed: false,
        })
    }

    /// Cancels the live run of `session`; false if none is going.
    pub fn cancel(&self, session: SessionId) -> bool {
        match self.lock().get(&session) {
            Some(run) => {
                run.cancel.cancel();
                true
            }
            None => false,
        }
    }

    /// The id of the live run of `session`, once it is known.
    pub fn run_id(&self, session: SessionId) -> Option<RunId> {
        self.lock().get(&session).and_then(|run| run.run_id)
    }

    /// Whether `session` has a live run.
    pub fn is_live(&self, session: SessionId) -> bool {
        self.lock().contains_key(&session)
    }

    /// Cancels every live run (shutdown).
    pub fn cancel_all(&self) {
        for run in self.lock().values() {
            run.cancel.cancel();
        }
    }

    /// How many runs are live.
    pub fn live_runs(&self) -> usize {
        self.lock().len()
    }
}

/// Cancels a session's live run when dropped, unless disarmed: a client that goes away takes
/// its run with it (`cancel_on_disconnect`).
pub struct CancelOnDrop {
    hub: Hub,
    session: Option<SessionId>,
}

impl CancelOnDrop {
    /// A guard over `session`'s run; `None` guards nothing.
    pub fn new(hub: Hub, session: Option<SessionId>) -> Self {
        Self { hub, session }
    }

    /// Lets the run go on after the guard is dropped.
    pub fn disarm(&mut self) {
        self.session = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let Some(session) = self.session.take() {
            self.hub.cancel(session);
        }
    }
}
