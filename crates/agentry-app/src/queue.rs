//! Background runs on the store's run queue.
//!
//! Queueing a run (the `Enqueue` command) checks its [`RunSpec`] exactly as a run started now
//! is ([`crate::runs::prepare`]: agent, model, tools, limits; a session is created for it),
//! honours an idempotency key (the same key and spec return the same run; the same key with
//! another spec is a conflict), refuses with `queue_full` (429) when the queue holds its maximum,
//! and stores the spec, the run `queued`. Nothing is created for a request that fails a check.
//! A worker that takes the run up checks its spec again, under its owner's key as it is then.
//!
//! [`RunWorker`] is the process's worker: it claims runs while it has room under
//! `max_concurrent` (highest priority first, oldest first), starts each in its session under
//! the run's own id through the hub (so clients follow it like any run), has the node's
//! heartbeat ([`crate::cluster`]) renew the lease while it goes, stops it if the lease is lost
//! or a cancel is asked for (on any node), and settles it fenced by
//! the lease: `succeeded`, `failed`, `cancelled`, or `waiting` / `paused` when it stopped for a
//! person (the command that continues it, [`App::submit`], takes it from there). A run whose
//! worker died is claimed again when its lease expires and resumes from its log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::sync::Notify;

use agentry_core::RunRequest;
use agentry_core::session::BusyPolicy;
use agentry_store::{Enqueued, NewRun, RunQuery, RunRecord, RunState};
use agentry_types::{RunId, SessionId, SuspendStatus};

use crate::App;
use crate::auth::Principal;
use crate::error::{AppError, Failure};
use crate::outcome::RunOutcome;
use crate::run_spec::{RunSpec, SessionChoice};
use crate::runs::{Admission, Target};

/// How the process's worker runs the queue.
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// This process's name in leases (unique per process: a node's incarnation).
    pub worker: String,
    /// The node's id in the cluster (`--node-id`), unique among live nodes.
    pub node_id: String,
    /// Where other nodes reach this one (`host:port`).
    pub address: String,
    /// The volume the sessions' workspaces are on (nodes on one volume share their files):
    /// runs of dead nodes are taken over only from nodes on the same one.
    pub volume: Option<String>,
    /// Runs this process runs at once; more wait in the queue.
    pub max_concurrent: usize,
    /// Runs that may wait in the queue; more are refused with 429.
    pub max_queued: u64,
    /// How long a lease lasts unless renewed; the node's heartbeat renews all its leases
    /// every quarter of it. A node dead this long has its runs taken by others.
    pub lease: Duration,
    /// How often the worker looks for runs other processes queued.
    pub poll: Duration,
    /// How webhooks are delivered.
    pub webhooks: WebhookSettings,
    /// The shortest time a schedule may leave between two fires (each fire may make a session).
    pub min_schedule_interval: Duration,
    /// What becomes of the running sessions of a dead node whose workspace volume no live node
    /// shares (none may take them over: their files are elsewhere). `None`: they wait for a
    /// node on that volume (their detail says so, `waiting_for_volume`).
    pub stranded: Option<StrandedPolicy>,
    /// This node's previous incarnation when it is provably gone (`serve` restarted on the
    /// data folder whose lock it held): the node's id is taken from it at once.
    pub replaces: Option<String>,
}

/// After how long, and how, a node takes the stranded sessions of a dead node on another
/// workspace volume ([`QueueSettings::stranded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StrandedPolicy {
    /// How long past the dead node's lease they wait for a node on its volume.
    pub after: Duration,
    /// What is done with them then.
    pub action: StrandedAction,
}

/// What a node does with a stranded session it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StrandedAction {
    /// Resumes its run here, without the files of the other volume.
    Resume,
    /// Ends its run `cancelled` and leaves the session `interrupted`, for a person to continue.
    Interrupt,
}

impl Default for QueueSettings {
    fn default() -> Self {
        let worker = format!("{}-{}", std::process::id(), RunId::new());
        Self {
            node_id: worker.clone(),
            worker,
            address: String::new(),
            volume: None,
            stranded: None,
            max_concurrent: 64,
            max_queued: 10_000,
            lease: DEFAULT_LEASE,
            poll: Duration::from_millis(250),
            webhooks: WebhookSettings::default(),
            min_schedule_interval: DEFAULT_MIN_SCHEDULE_INTERVAL,
            replaces: None,
        }
    }
}

/// A schedule fires at most once a minute unless the operator says otherwise
/// (`agentry serve --min-schedule-interval-secs`).
pub const DEFAULT_MIN_SCHEDULE_INTERVAL: Duration = Duration::from_secs(60);

/// How delivery behaves.
#[derive(Debug, Clone)]
pub struct WebhookSettings {
    /// URLs may reach loopback and private addresses.
    pub allow_private: bool,
    /// The wait before the second attempt; it doubles for each later one (at most an hour).
    pub backoff: Duration,
    /// Attempts before a delivery is given up.
    pub max_attempts: u32,
    /// How long one attempt may take.
    pub timeout: Duration,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        Self {
            allow_private: false,
            backoff: Duration::from_secs(5),
            max_attempts: 8,
            timeout: Duration::from_secs(10),
        }
    }
}

/// A run as clients see it: a background run, or one started in its session (`/v1/infer`, a
/// continue, a delegated child, a group member, a workflow step).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunView {
    /// The run (its id in the session's log too).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    /// Its session.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
    /// The saved agent it runs as.
    pub agent_id: Option<String>,
    /// The schedule that fired it.
    pub schedule_id: Option<String>,
    /// `queued`, `running`, `waiting` (tool calls wait for approval), `paused`, `succeeded`,
    /// `failed` or `cancelled`.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub state: RunState,
    /// Higher runs first.
    pub priority: i64,
    /// How many times a worker started it (more than 1: a worker died under it).
    pub attempt: u64,
    /// A cancel was asked for.
    pub cancel_requested: bool,
    /// The process running it, while it runs (`<node id>/<process>` on `agentry serve`).
    pub worker: Option<String>,
    /// When it was submitted, Unix milliseconds.
    pub created_at: u64,
    /// When a worker first started it.
    pub started_at: Option<u64>,
    /// When it ended.
    pub finished_at: Option<u64>,
    /// How it ended, or why it stopped (the body `POST /v1/infer` answers). A list leaves it
    /// out for runs started in their sessions: `GET /v1/runs/{run_id}` reads it from the log.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<RunOutcome>))]
    pub outcome: Option<serde_json::Value>,
    /// Submitted to the queue (`POST /v1/runs`, a schedule), not started in its session
    /// directly.
    pub background: bool,
    /// Where to follow it.
    pub stream: String,
}

impl From<RunRecord> for RunView {
    fn from(record: RunRecord) -> Self {
        Self {
            run_id: record.id,
            session_id: record.session_id,
            agent_id: record.agent_id,
            schedule_id: record.schedule_id,
            state: record.state,
            priority: record.priority,
            attempt: record.attempt,
            cancel_requested: record.cancel_requested,
            worker: record.worker.filter(|_| record.state == RunState::Running),
            created_at: record.created_at,
            started_at: record.started_at,
            finished_at: record.finished_at,
            outcome: record.outcome,
            background: record.background,
            stream: format!("/v1/runs/{}/stream", record.id),
        }
    }
}

/// `GET /v1/runs`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunList {
    /// The runs, newest first.
    pub runs: Vec<RunView>,
}

/// What the queue stored of a run before it stored its [`RunSpec`]: the engine's request as it
/// was checked then, and what to do when its session is busy. Still read, for runs queued by an
/// earlier release.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct QueuedRequest {
    request: RunRequest,
    policy: BusyPolicy,
}

/// A claimed run, started or found ended.
enum Claimed {
    /// Live in the hub.
    Live(crate::hub::Subscription),
    /// It had ended before the claim.
    Ended(RunOutcome),
}

/// A run this process's worker holds.
#[derive(Debug, Clone)]
struct Held {
    session: SessionId,
    /// Cancelled when another node took the run over.
    lost: tokio_util::sync::CancellationToken,
}

/// What the worker shares with the app: the runs it holds, and a signal for waiters.
#[derive(Debug, Default)]
pub struct QueueState {
    settings: Mutex<QueueSettings>,
    active: Mutex<HashMap<RunId, Held>>,
    /// The configuration's generation the runtime was last built from.
    pub(crate) config_generation: std::sync::atomic::AtomicU64,
    /// Cancelled when the node leaves the cluster: its heartbeat stops.
    pub(crate) left: tokio_util::sync::CancellationToken,
    /// The incarnation this node had before it restarted under the same id (its sessions are
    /// this process's to resume).
    pub(crate) previous: Mutex<Option<String>>,
    /// Woken when a run of this process settles, and when a run is submitted here.
    changed: Notify,
    /// A webhook delivery was queued here: the worker's next turn looks for due deliveries and
    /// schedules at once instead of at their poll.
    timers_due: std::sync::atomic::AtomicBool,
    /// Who waits for which run: only a run's own waiters wake when it changes.
    watchers: Mutex<HashMap<RunId, Arc<Notify>>>,
    /// The leases this worker holds: the session log fences each run's appends with its own.
    pub(crate) fences: crate::store_log::LeaseFences,
    /// The clients webhooks go out with: no redirects (a signed delivery goes where it was
    /// addressed, nowhere else), no proxy; the first connects only to public addresses, the
    /// second (`--webhook-allow-private`) anywhere.
    webhook_clients: [std::sync::OnceLock<Result<reqwest::Client, String>>; 2],
}

impl QueueState {
    /// This process's worker name (its incarnation).
    pub(crate) fn worker(&self) -> String {
        self.settings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .worker
            .clone()
    }

    fn settings(&self) -> QueueSettings {
        self.settings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn active(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Held>> {
        self.active.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The runs this process holds, with their sessions.
    pub(crate) fn held(&self) -> HashMap<RunId, SessionId> {
        self.active()
            .iter()
            .map(|(run, held)| (*run, held.session))
            .collect()
    }

    /// Another node took `run` over: its follower here stops.
    pub(crate) fn lose(&self, run: RunId) {
        if let Some(held) = self.active().get(&run) {
            held.lost.cancel();
        }
    }

    /// Every run held here is lost (another process took this node's id).
    pub(crate) fn lose_all(&self) {
        for held in self.active().values() {
            held.lost.cancel();
        }
    }

    /// Wakes the worker to look for due webhook deliveries and schedules at once.
    pub(crate) fn notify(&self) {
        self.timers_due
            .store(true, std::sync::atomic::Ordering::Release);
        self.changed.notify_waiters();
    }

    /// Whether [`QueueState::notify`] asked for a look at the deliveries and schedules since
    /// the last call.
    fn take_timers_due(&self) -> bool {
        self.timers_due
            .swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Run `run` changed here: wakes the worker and the run's own waiters.
    pub(crate) fn touched(&self, run: RunId) {
        self.changed.notify_waiters();
        if let Some(watch) = self.watchers().get(&run) {
            watch.notify_waiters();
        }
    }

    fn watchers(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Arc<Notify>>> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What wakes a waiter for `run`.
    fn watch(&self, run: RunId) -> Arc<Notify> {
        Arc::clone(self.watchers().entry(run).or_default())
    }

    /// A waiter for `run` is done: the entry goes with its last waiter.
    fn unwatch(&self, run: RunId, watch: Arc<Notify>) {
        let mut watchers = self.watchers();
        drop(watch);
        if watchers
            .get(&run)
            .is_some_and(|left| Arc::strong_count(left) == 1)
        {
            watchers.remove(&run);
        }
    }

    /// The client a webhook goes out with: one that connects only to the public addresses a
    /// name resolves to when it connects, unless `allow_private`. One that cannot be built
    /// delivers nothing (never a client without the guard).
    pub(crate) fn webhook_client(&self, allow_private: bool) -> Result<&reqwest::Client, String> {
        let client = self.webhook_clients[usize::from(allow_private)].get_or_init(|| {
            agentry_llm::install_tls_provider();
            let builder = reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy();
            let builder = if allow_private {
                builder
            } else {
                builder.dns_resolver(agentry_tools::workspace::public_only_resolver())
            };
            builder
                .build()
                .map_err(|error| format!("cannot build the webhook client: {error}"))
        });
        client.as_ref().map_err(Clone::clone)
    }
}

/// How often the worker sweeps unfinished uploads that went idle.
const UPLOAD_SWEEP: Duration = Duration::from_secs(600);

/// How long a lease lasts by default: a node dead this long has its runs taken over.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(4);

/// How often a wait for a run looks at the database for changes made by other processes.
const OTHERS_POLL: Duration = Duration::from_millis(500);

/// 429 `queue_full`.
fn queue_full(max_queued: u64) -> AppError {
    AppError::new(
        Failure::TooMany,
        "queue_full",
        format!("the run queue holds its maximum of {max_queued} runs; try again later"),
    )
    .with_details(serde_json::json!({ "max_queued": max_queued, "retry_after_secs": 1 }))
}

/// The digest that tells a retried submission from another one reusing its key.
fn digest(body: &RunSpec) -> Result<String, AppError> {
    let bytes = serde_json::to_vec(body)
        .map_err(|error| AppError::internal(format!("cannot digest the request: {error}")))?;
    Ok(Sha256::digest(&bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect())
}

/// The queue state a run that stopped is in.
fn state_of(outcome: &RunOutcome) -> RunState {
    match outcome.status {
        Some(SuspendStatus::Waiting) => RunState::Waiting,
        Some(SuspendStatus::Paused) => RunState::Paused,
        None if outcome.stop_reason == "cancelled" => RunState::Cancelled,
        None if outcome.failed() => RunState::Failed,
        None => RunState::Succeeded,
    }
}

/// The queue as it is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueDepth {
    /// Runs waiting for a worker (on every node sharing the store).
    pub queued: u64,
    /// Runs this process's worker holds.
    pub running_here: u64,
}

impl App {
    /// At start-up: resumes the runs a stop left in flight — the running sessions that no
    /// live process holds any more (`resume_orphaned`; on SQLite, whose folder only this
    /// process may serve, every running session). Background runs that are `running` in the
    /// queue are left to it: a worker claims each once its lease expires (here, or on another
    /// node, never both) and resumes it fenced by its new lease. Returns how many runs were
    /// resumed.
    pub async fn recover_at_start(&self) -> usize {
        let exclusive = self.parts.store.backend() == agentry_store::Backend::Sqlite;
        self.resume_orphaned(exclusive).await
    }

    /// Takes the running sessions whose process is gone (a dead or stopped node, this node's
    /// previous incarnation; with `exclusive`, any) and resumes their runs here. Returns how
    /// many runs were resumed.
    pub(crate) async fn resume_orphaned(&self, exclusive: bool) -> usize {
        let worker = self.parts.queue.worker();
        let previous = self
            .parts
            .queue
            .previous
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let sessions = match self
            .parts
            .store
            .claim_orphaned_sessions(&worker, previous.as_deref(), exclusive)
            .await
        {
            Ok(sessions) => sessions,
            Err(error) => {
                tracing::error!("looking for interrupted runs failed: {error}");
                return 0;
            }
        };
        let mut resumed = 0;
        for session in sessions {
            if self.parts.hub.is_live(session) {
                continue;
            }
            if self.resume_here(session, "its process stopped").await {
                resumed += 1;
            }
        }
        resumed
    }

    /// Resumes `session`'s interrupted run here from its log (the run stopped because `why`);
    /// answers whether a run was resumed.
    async fn resume_here(&self, session: SessionId, why: &str) -> bool {
        match self.parts.sessions.recover_session(session).await {
            Ok(Some(stream)) => {
                tracing::info!(%session, "resuming a run here: {why}");
                self.parts.hub.adopt(session, stream);
                true
            }
            Ok(None) => false,
            Err(error) => {
                tracing::error!(%session, "could not resume the session: {error}");
                false
            }
        }
    }

    /// Takes the stranded sessions of dead nodes (see [`QueueSettings::stranded`]) and resumes
    /// or interrupts them as the policy says; answers how many it took.
    pub(crate) async fn settle_stranded(&self) -> usize {
        let Some(policy) = self.parts.queue.settings().stranded else {
            return 0;
        };
        let worker = self.parts.queue.worker();
        let sessions = match self
            .parts
            .store
            .claim_stranded_sessions(&worker, policy.after)
            .await
        {
            Ok(sessions) => sessions,
            Err(error) => {
                tracing::error!("looking for stranded runs failed: {error}");
                return 0;
            }
        };
        for session in &sessions {
            if self.parts.hub.is_live(*session) {
                continue;
            }
            match policy.action {
                StrandedAction::Resume => {
                    let why = "its node died on another workspace volume (its files are not here)";
                    self.resume_here(*session, why).await;
                }
                StrandedAction::Interrupt => {
                    let note = format!(
                        "the run was interrupted: its node stopped and no live node has its \
                         workspace volume (waited {} s past the node's lease)",
                        policy.after.as_secs()
                    );
                    match self.parts.sessions.interrupt_stopped(*session, note).await {
                        Ok(_) => {
                            tracing::warn!(%session, "interrupted a run stranded on another volume");
                            self.parts
                                .hub
                                .announce(*session, crate::hub::FeedStatus::Interrupted);
                        }
                        Err(error) => tracing::error!(%session, "could not interrupt: {error}"),
                    }
                }
            }
        }
        sessions.len()
    }

    /// The queue's settings (this process's worker).
    pub fn queue_settings(&self) -> QueueSettings {
        self.parts.queue.settings()
    }

    /// Sets how the worker runs the queue (before [`App::start_worker`]).
    pub fn set_queue_settings(&self, settings: QueueSettings) {
        self.parts.store.set_worker(&settings.worker);
        if let Some(volume) = &settings.volume {
            self.parts.store.set_volume(volume);
        }
        // Background runs stranded on another volume are resumed here under `resume`; under
        // `interrupt` they wait for their volume (only conversations are interrupted).
        self.parts.store.set_stranded_resume(
            settings
                .stranded
                .filter(|policy| policy.action == StrandedAction::Resume)
                .map(|policy| policy.after),
        );
        *self
            .parts
            .queue
            .settings
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = settings;
    }

    /// Checks and queues a run for `caller` (see the module's documentation), for
    /// the `Enqueue` command and for a run a schedule fires. Returns the run and whether this
    /// call created it (`false`: an earlier submission with the same key).
    pub(crate) async fn submit_queued(
        &self,
        caller: &Principal,
        mut body: RunSpec,
        idempotency_key: Option<String>,
        priority: i64,
        schedule_id: Option<String>,
    ) -> Result<(RunView, bool), AppError> {
        if !(-100..=100).contains(&priority) {
            return Err(AppError::bad_request(
                "`priority` must be between -100 and 100",
            ));
        }
        // A background run is durable: without a session it gets a new one.
        if body.session == SessionChoice::Ephemeral {
            body.session = SessionChoice::New;
        }
        // The digest covers the whole submission, its webhook included.
        let digest = digest(&body)?;
        let agent_id = body.agent_id.clone();
        let agent = match &agent_id {
            Some(id) => crate::agents::stored_agent(&self.parts.store, id).await?,
            None => None,
        };
        // The run's own webhook, else its agent's default.
        let webhook_url = body
            .webhook_url
            .take()
            .or_else(|| agent.as_ref().and_then(|agent| agent.webhook_url.clone()));
        let owner = caller.owner();
        if let Some(url) = &webhook_url {
            self.check_webhook(url, owner.as_deref()).await?;
        }
        let settings = self.parts.queue.settings();
        // A retried submission finds its run before anything new is created.
        if let Some(key) = &idempotency_key
            && let Some(record) = self.background_runs().by_key(owner.as_deref(), key).await?
        {
            if record.request_digest != digest {
                return Err(AppError::conflict(format!(
                    "the idempotency key {key:?} was used for another request"
                )));
            }
            return Ok((record.into(), false));
        }
        // A full queue is refused by the store, in the transaction that would add the run
        // (`Enqueued::QueueFull`): one count, and no race between two submissions.
        let (target, mut request) = crate::runs::prepare(self, caller, body.clone()).await?;
        let Target::Session(session) = target else {
            return Err(AppError::internal("a background run has no session"));
        };
        // The queued run's record names its session: a new one is created with the record,
        // in one transaction.
        let new_session = request
            .new_session
            .take()
            .map(|info| crate::store_log::new_session(session, info));
        let agent_limit = agent
            .and_then(|agent| agent.limits)
            .and_then(|limits| limits.max_concurrent_runs);
        // The spec is stored, in the session the record names: the run is checked again when a
        // worker takes it up, under its owner's key as it is then.
        body.session = SessionChoice::Existing(session);
        let stored = body.to_stored()?;
        let run = NewRun {
            id: RunId::new(),
            session_id: session,
            agent_id,
            owner,
            priority,
            idempotency_key,
            schedule_id,
            webhook_url,
            agent_limit,
            request_digest: digest,
            request: stored,
            new_session,
        };
        let (record, created) = match self
            .parts
            .store
            .enqueue_run(&run, settings.max_queued)
            .await?
        {
            Enqueued::Created(record) => (record, true),
            Enqueued::Existing(record) => (record, false),
            Enqueued::QueueFull { max_queued } => return Err(queue_full(max_queued)),
        };
        self.parts.queue.touched(record.id);
        Ok((record.into(), created))
    }

    /// Starts the process's worker (at most one per app), with the node's heartbeat (which
    /// renews the worker's leases) and the configuration watch: they run until the app shuts
    /// down.
    pub fn start_worker(&self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(self.clone().keep_membership());
        tokio::spawn(self.clone().watch_configuration());
        tokio::spawn(self.clone().follow_other_nodes());
        let app = self.clone();
        tokio::spawn(async move { app.work().await })
    }

    async fn work(self) {
        // Schedules and webhook retries are due by the clock: they are looked for once per
        // poll (and at once when a delivery is queued here), not at every submission and
        // settle that wakes the worker: under load those are hundreds a second, each look a
        // query or two.
        let mut timers_looked: Option<tokio::time::Instant> = None;
        let mut uploads_swept = tokio::time::Instant::now();
        loop {
            // Unfinished uploads that received nothing for hours go, without waiting for the
            // next upload to sweep them.
            if uploads_swept.elapsed() >= UPLOAD_SWEEP {
                uploads_swept = tokio::time::Instant::now();
                let app = self.clone();
                tokio::spawn(async move {
                    let removed = app.workspace_files().sweep_idle_uploads().await;
                    if removed > 0 {
                        tracing::info!(removed, "idle unfinished uploads removed");
                    }
                });
            }
            // Listening before looking: a run submitted (or a slot freed) while this pass
            // reads the queue wakes the next pass at once instead of waiting for the poll.
            let changed = self.parts.queue.changed.notified();
            let settings = self.parts.queue.settings();
            if self.parts.queue.take_timers_due()
                || timers_looked.is_none_or(|at| at.elapsed() >= settings.poll)
            {
                timers_looked = Some(tokio::time::Instant::now());
                self.schedules().fire_due().await;
                self.deliver_due_webhooks().await;
            }
            let room = settings
                .max_concurrent
                .saturating_sub(self.parts.queue.active().len());
            if room > 0 {
                match self
                    .parts
                    .store
                    .claim_runs(&settings.worker, room, settings.lease)
                    .await
                {
                    Ok(claimed) => {
                        let now = crate::clock::now_ms();
                        for record in claimed {
                            // A run claimed again after its worker died waited since then, not
                            // since it was submitted: only first claims count.
                            if record.attempt <= 1 {
                                self.parts
                                    .hub
                                    .observer()
                                    .run_dequeued(Duration::from_millis(
                                        now.saturating_sub(record.created_at),
                                    ));
                            }
                            let lost = tokio_util::sync::CancellationToken::new();
                            self.parts.queue.active().insert(
                                record.id,
                                Held {
                                    session: record.session_id,
                                    lost: lost.clone(),
                                },
                            );
                            let app = self.clone();
                            tokio::spawn(async move {
                                let run_id = record.id;
                                app.execute(record, lost).await;
                                app.parts.queue.active().remove(&run_id);
                                app.parts.queue.touched(run_id);
                            });
                        }
                    }
                    Err(error) => tracing::warn!("claiming queued runs failed: {error}"),
                }
            }
            tokio::select! {
                _ = self.parts.shutdown.cancelled() => break,
                _ = changed => {}
                _ = tokio::time::sleep(settings.poll) => {}
            }
        }
    }

    /// Runs one claimed run to where it stops, then settles it under its lease; stops when
    /// `lost` says another node took it over.
    async fn execute(&self, record: RunRecord, lost: tokio_util::sync::CancellationToken) {
        let Some(lease) = record.lease() else {
            return;
        };
        let has_webhook = record.webhook_url.is_some();
        let settle = |state: RunState, outcome: Option<serde_json::Value>| {
            let lease = lease.clone();
            async move {
                match self
                    .parts
                    .store
                    .settle_run(&lease, state, outcome.as_ref())
                    .await
                {
                    // Only a run that names a webhook reads its record again for it.
                    Ok(true) if has_webhook => {
                        self.tell_webhook(lease.run_id).await;
                    }
                    Ok(true) => {}
                    Ok(false) => {
                        tracing::warn!(run = %lease.run_id, "the run's lease was lost before it settled")
                    }
                    Err(error) => {
                        tracing::error!(run = %lease.run_id, "settling the run failed: {error}")
                    }
                }
            }
        };
        if record.cancel_requested {
            settle(RunState::Cancelled, None).await;
            return;
        }
        // Every append of the run from here on carries the lease: a takeover fences us out.
        self.parts.queue.fences.hold(lease.clone());
        self.follow_claimed(&record, &lost, &settle).await;
        self.parts.queue.fences.release(record.id);
    }

    /// Starts a claimed run, follows it to where it stops and settles it.
    async fn follow_claimed<F, Fut>(
        &self,
        record: &RunRecord,
        lost: &tokio_util::sync::CancellationToken,
        settle: &F,
    ) where
        F: Fn(RunState, Option<serde_json::Value>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let session = record.session_id;
        let subscription = match self.start_claimed(record).await {
            Ok(Claimed::Live(subscription)) => {
                // Streams waiting for it to start can attach now.
                self.parts.queue.touched(record.id);
                subscription
            }
            Ok(Claimed::Ended(outcome)) => {
                // A worker died after the run ended but before it settled: the log says how.
                let state = state_of(&outcome);
                settle(state, serde_json::to_value(&outcome).ok()).await;
                return;
            }
            Err(error) => {
                tracing::warn!(run = %record.id, "a queued run could not start: {}", error.message);
                let outcome = serde_json::json!({
                    "success": false,
                    "run_id": record.id,
                    "session_id": session,
                    "stop_reason": "error",
                    "error": {"code": error.code, "message": error.message},
                });
                settle(RunState::Failed, Some(outcome)).await;
                return;
            }
        };
        // The node's heartbeat renews the lease; it says when the run was lost or cancelled.
        let outcome = tokio::select! {
            outcome = self.follow_to_end(session, Some(record.id), subscription, false) => outcome,
            () = lost.cancelled() => {
                // The lease is lost: another node owns the run now (its writes here were
                // refused already); stop ours.
                self.parts.hub.cancel(session);
                return;
            }
        };
        match outcome {
            Ok(outcome) => {
                let state = state_of(&outcome);
                let value = serde_json::to_value(&outcome).ok();
                settle(state, value).await;
            }
            Err(error) => {
                tracing::warn!(run = %record.id, "following a queued run failed: {}", error.message);
                settle(RunState::Failed, None).await;
            }
        }
    }

    /// Starts (or, after a worker died, resumes) a claimed run in its session; a run that
    /// already ended (its worker died before settling it) is answered from the log.
    async fn start_claimed(&self, record: &RunRecord) -> Result<Claimed, AppError> {
        let session = record.session_id;
        if self.parts.hub.run_id(session) == Some(record.id)
            && let Some(subscription) = self.parts.hub.subscribe(session)
        {
            // Already live here (resumed at start-up).
            return Ok(Claimed::Live(subscription));
        }
        if record.attempt > 1 {
            if let Some(outcome) = self.logged_outcome(session, record.id).await? {
                return Ok(Claimed::Ended(outcome));
            }
            if let Some(stream) = self.parts.sessions.resume(session).await? {
                return Ok(Claimed::Live(self.parts.hub.adopt(session, stream)));
            }
        }
        let (request, policy) = match RunSpec::from_stored(&record.request)? {
            // Checked again as the owner's key allows it now: a key revoked or narrowed since
            // the run was queued does not run it.
            Some(spec) => {
                let owner = self.principal_of_owner(record.owner.as_deref()).await?;
                let policy = spec.policy;
                let (_, request) =
                    crate::runs::prepare_as(self, &owner, spec, Admission::TakenUp).await?;
                (request, policy)
            }
            None => {
                let queued: QueuedRequest = serde_json::from_value(record.request.clone())
                    .map_err(|error| {
                        AppError::internal(format!("the stored request is unreadable: {error}"))
                    })?;
                (queued.request, queued.policy)
            }
        };
        let stream = self
            .parts
            .sessions
            .send_as(session, request, policy, record.id)
            .await?;
        Ok(Claimed::Live(self.parts.hub.adopt(session, stream)))
    }

    /// Who a stored run or schedule runs as: its owner's key as it is now (`None`: the operator
    /// of a server without keys). A key revoked since is refused by name.
    pub(crate) async fn principal_of_owner(
        &self,
        owner: Option<&str>,
    ) -> Result<Principal, AppError> {
        let Some(key) = owner else {
            return Ok(Principal::operator());
        };
        crate::auth::active_key(&self.parts.store, key)
            .await
            .map_err(|error| AppError::internal(error.to_string()))?
            .ok_or_else(|| {
                AppError::forbidden(format!(
                    "the key {key} that submitted the run was revoked or deleted"
                ))
            })
    }

    /// After a command ended a run that waited for a person or was paused (interrupt, abort):
    /// if it is a background run, its record says it was cancelled.
    pub(crate) async fn cancelled_while_stopped(&self, run_id: RunId) -> Result<(), AppError> {
        if self
            .parts
            .store
            .set_run_state(run_id, RunState::Cancelled, None)
            .await?
        {
            self.tell_webhook(run_id).await;
            self.parts.queue.touched(run_id);
        }
        Ok(())
    }

    /// After a command continued a run that waited for a person (or was paused): if it is a
    /// background run, its record follows it to its end.
    pub(crate) fn track_continued(
        &self,
        run_id: RunId,
        session: SessionId,
        subscription: crate::hub::Subscription,
    ) {
        let app = self.clone();
        tokio::spawn(async move {
            match app.parts.store.run_record(run_id).await {
                Ok(Some(record)) if !record.state.is_final() => {}
                _ => return,
            }
            let _ = app
                .parts
                .store
                .set_run_state(run_id, RunState::Running, None)
                .await;
            app.parts.queue.touched(run_id);
            if let Ok(outcome) = app
                .follow_to_end(session, Some(run_id), subscription, false)
                .await
            {
                let value = serde_json::to_value(&outcome).ok();
                if let Ok(true) = app
                    .parts
                    .store
                    .set_run_state(run_id, state_of(&outcome), value.as_ref())
                    .await
                {
                    app.tell_webhook(run_id).await;
                }
                app.parts.queue.touched(run_id);
            }
        });
    }
}

/// The background runs: queued, read, waited for and cancelled (the worker that runs them is the
/// app's).
pub struct BackgroundRuns<'a> {
    app: &'a App,
}

impl App {
    /// The background runs: queued, read, waited for and cancelled (the worker that runs them is
    /// the app's).
    pub fn background_runs(&self) -> BackgroundRuns<'_> {
        BackgroundRuns { app: self }
    }
}

impl BackgroundRuns<'_> {
    /// The queue as it is now.
    pub async fn depth(&self) -> Result<QueueDepth, AppError> {
        Ok(QueueDepth {
            queued: self.app.parts.store.queued_runs().await?,
            running_here: self.app.parts.queue.active().len() as u64,
        })
    }

    async fn by_key(&self, owner: Option<&str>, key: &str) -> Result<Option<RunRecord>, AppError> {
        Ok(self
            .app
            .parts
            .store
            .run_by_idempotency_key(owner, key)
            .await?)
    }

    /// A run, with its outcome once it ended.
    pub async fn get(&self, run_id: RunId) -> Result<RunView, AppError> {
        let record = self.record(run_id).await?;
        self.view(record).await
    }

    /// A run as clients see it. A run started in its session has its outcome in its log, not
    /// in its record: it is read from there once the run ended.
    async fn view(&self, record: RunRecord) -> Result<RunView, AppError> {
        let logged = if !record.background && record.outcome.is_none() && record.state.is_final() {
            match self.app.logged_outcome(record.session_id, record.id).await {
                Ok(outcome) => outcome,
                // Its session was deleted meanwhile: the record alone.
                Err(error) if error.failure == crate::error::Failure::NotFound => None,
                Err(error) => return Err(error),
            }
        } else {
            None
        };
        let mut view = RunView::from(record);
        if let Some(outcome) = logged {
            view.outcome = Some(serde_json::to_value(&outcome).map_err(|error| {
                AppError::internal(format!("cannot encode an outcome: {error}"))
            })?);
        }
        Ok(view)
    }

    async fn record(&self, run_id: RunId) -> Result<RunRecord, AppError> {
        self.app
            .parts
            .store
            .run_record(run_id)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no run {run_id}")))
    }

    /// Runs, newest first (at most 1,000: a client's page).
    pub async fn list(&self, query: &RunQuery) -> Result<RunList, AppError> {
        if query.limit == 0 || query.limit > 1000 {
            return Err(AppError::bad_request("`limit` must be between 1 and 1000"));
        }
        Ok(RunList {
            runs: self.find(query).await?,
        })
    }

    /// The runs `query` matches, newest first: as many as its `limit`, which the caller
    /// bounds.
    pub async fn find(&self, query: &RunQuery) -> Result<Vec<RunView>, AppError> {
        let runs = self.app.parts.store.list_runs(query).await?;
        Ok(runs.into_iter().map(RunView::from).collect())
    }

    /// How many runs `query` matches, its `limit` and `offset` aside.
    pub async fn count(&self, query: &RunQuery) -> Result<u64, AppError> {
        Ok(self.app.parts.store.count_runs(query).await?)
    }

    /// Waits up to `timeout` for a background run to stop (end, or wait for a person), then
    /// answers it as it is.
    pub async fn wait(&self, run_id: RunId, timeout: Duration) -> Result<RunView, AppError> {
        self.wait_until(run_id, timeout, |_, record| {
            record.state.is_final() || matches!(record.state, RunState::Waiting | RunState::Paused)
        })
        .await
    }

    /// Waits up to `timeout` for a queued run to be started by a worker; answers it as it is.
    pub async fn wait_until_started(
        &self,
        run_id: RunId,
        timeout: Duration,
    ) -> Result<RunView, AppError> {
        let worker = self.app.parts.queue.settings().worker;
        self.wait_until(run_id, timeout, |app, record| {
            // Started here: the hub has it (a worker elsewhere: its log will).
            record.state != RunState::Queued
                && (app.parts.hub.run_id(record.session_id) == Some(record.id)
                    || record.state != RunState::Running
                    || record.worker.as_deref() != Some(worker.as_str()))
        })
        .await
    }

    /// Reads a run until `done` says so or `timeout` passes, woken by this process's changes
    /// and polling for other processes'; answers the run as it is then.
    pub async fn wait_until(
        &self,
        run_id: RunId,
        timeout: Duration,
        done: impl Fn(&App, &RunRecord) -> bool,
    ) -> Result<RunView, AppError> {
        let watch = self.app.parts.queue.watch(run_id);
        let waited = self.wait_on(run_id, timeout, done, &watch).await;
        self.app.parts.queue.unwatch(run_id, watch);
        waited
    }

    async fn wait_on(
        &self,
        run_id: RunId,
        timeout: Duration,
        done: impl Fn(&App, &RunRecord) -> bool,
        watch: &Notify,
    ) -> Result<RunView, AppError> {
        let deadline = tokio::time::Instant::now() + timeout;
        // This process's changes to the run wake the wait at once; the poll is for other
        // processes'.
        let poll = self.app.parts.queue.settings().poll.max(OTHERS_POLL);
        loop {
            // Listen before reading, so a change in between is not missed.
            let changed = watch.notified();
            let record = self.record(run_id).await?;
            if done(self.app, &record) || tokio::time::Instant::now() >= deadline {
                return self.view(record).await;
            }
            tokio::select! {
                _ = changed => {}
                _ = tokio::time::sleep(poll) => {}
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.app.parts.shutdown.cancelled() => return self.view(record).await,
            }
        }
    }

    /// Cancels a background run: a queued one at once; a running one is interrupted (here, or
    /// by its worker when it next renews its lease); a waiting or paused one ends cancelled.
    pub async fn cancel(&self, run_id: RunId) -> Result<RunView, AppError> {
        let record = self
            .app
            .parts
            .store
            .cancel_run(run_id)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no run {run_id}")))?;
        match record.state {
            // Queued: cancelled at once, never run.
            RunState::Cancelled if record.started_at.is_none() => {
                self.app.tell_webhook(run_id).await;
            }
            RunState::Running if self.app.parts.hub.run_id(record.session_id) == Some(run_id) => {
                self.app.parts.hub.cancel(record.session_id);
            }
            RunState::Waiting | RunState::Paused => {
                self.app
                    .parts
                    .sessions
                    .interrupt(record.session_id, run_id)
                    .await?;
                if self
                    .app
                    .parts
                    .store
                    .set_run_state(run_id, RunState::Cancelled, None)
                    .await?
                {
                    self.app.tell_webhook(run_id).await;
                }
                self.app
                    .parts
                    .hub
                    .announce(record.session_id, crate::hub::FeedStatus::Interrupted);
            }
            _ => {}
        }
        self.app.parts.queue.touched(run_id);
        self.get(run_id).await
    }
}
