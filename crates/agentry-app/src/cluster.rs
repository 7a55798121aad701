//! This process as a node of a cluster: several `agentry serve` processes sharing one
//! PostgreSQL database (a SQLite folder has exactly one).
//!
//! [`App::join_cluster`] registers the node under its id (refused while another live process
//! holds it). [`App::start_worker`] then keeps the membership: a heartbeat every quarter of the
//! lease renews the node's row and the lease of every run it holds in one transaction
//! ([`agentry_store::Store::heartbeat`]); a run whose lease the heartbeat did not renew was
//! taken over by another node (this one stalled past its lease) and is stopped here — its
//! writes were refused by the fence already; a run someone asked to cancel, on any node, is
//! cancelled here at the next heartbeat; and the running sessions of dead nodes (on this node's
//! workspace volume) are taken and resumed here (`resume_orphaned`). A process whose id
//! another incarnation took stops. The status feed hears of other nodes' runs
//! (`follow_other_nodes`). Beside it, the configuration watch reads the configuration's generation every
//! [`CONFIG_POLL`] and rebuilds the runtime (models, tools, skills, templates, agents) and the
//! MCP servers when another node changed them. [`App::leave_cluster`] at a clean stop lets the
//! node's runs go at once, so another node takes them without waiting for the lease.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use serde::Serialize;

use agentry_store::{NodeBeat, NodeRecord, RunState};
use agentry_types::{RunId, SessionId};

use crate::App;
use crate::error::AppError;

/// How often a node looks for configuration changes other nodes made.
pub const CONFIG_POLL: Duration = Duration::from_millis(250);

/// How often a node's status feed looks for the runs of other nodes.
pub const FEED_POLL: Duration = Duration::from_millis(500);

/// This process ready to serve ([`App::readiness`]).
#[derive(Debug, Clone)]
pub struct Readiness {
    /// The database's backend: `sqlite` or `postgres`.
    pub database: &'static str,
    /// The database's schema version.
    pub schema_version: u32,
    /// The runs live in this process.
    pub live_runs: usize,
}

/// Why this process cannot serve now.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NotReady {
    /// The database does not answer.
    #[error("{0}")]
    Unreachable(String),
    /// The database has no room for writes.
    #[error("the database has no room for writes: {0}")]
    StorageFull(String),
}

impl App {
    /// Whether this process can serve: its database answers and has room for writes.
    pub async fn readiness(&self) -> Result<Readiness, NotReady> {
        let store = &self.parts.store;
        let schema_version = store
            .schema_version()
            .await
            .map_err(|error| NotReady::Unreachable(error.to_string()))?;
        if let Some(reason) = store.storage_full() {
            return Err(NotReady::StorageFull(reason));
        }
        Ok(Readiness {
            database: store.backend().as_str(),
            schema_version,
            live_runs: self.parts.hub.live_runs(),
        })
    }
}

/// A stored session status as the status feed says it.
fn feed_status(status: &str) -> Option<crate::hub::FeedStatus> {
    use crate::hub::FeedStatus;
    Some(match status {
        "idle" => FeedStatus::Idle,
        "running" => FeedStatus::Running,
        "interrupted" => FeedStatus::Interrupted,
        "failed" => FeedStatus::Failed,
        "waiting" => FeedStatus::Waiting,
        "paused" => FeedStatus::Paused,
        _ => return None,
    })
}

/// A node as `GET /v1/cluster` shows it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct NodeView {
    /// Its id (`--node-id`).
    pub id: String,
    /// Where other nodes reach it.
    pub address: String,
    /// The Agentry version it runs.
    pub version: String,
    /// `alive`, `dead` (no heartbeat within its lease: its runs go to other nodes) or
    /// `stopped` (it left cleanly).
    pub state: String,
    /// This is the node that answered.
    pub this_node: bool,
    /// When its process started, Unix milliseconds.
    pub started_at: u64,
    /// Its last heartbeat, Unix milliseconds.
    pub heartbeat_at: u64,
    /// How long after a heartbeat it counts as alive, milliseconds.
    pub lease_ms: u64,
    /// Runs it had going at its last heartbeat.
    pub running_runs: u64,
    /// Background runs it takes at once.
    pub max_runs: u64,
    /// Its machine's one-minute load average at its last heartbeat.
    pub load: Option<f64>,
    /// The volume its sessions' workspaces are on: nodes on one volume take over each other's
    /// runs.
    pub workspaces_volume: Option<String>,
}

/// `GET /v1/cluster`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ClusterView {
    /// The node that answered.
    pub node_id: String,
    /// Every node the database knows, by id.
    pub nodes: Vec<NodeView>,
}

fn view(record: NodeRecord, this: &str, now: u64) -> NodeView {
    let state = if record.stopped_at.is_some() {
        "stopped"
    } else if record.alive_at(now) {
        "alive"
    } else {
        "dead"
    };
    NodeView {
        this_node: record.id == this,
        state: state.into(),
        load: record.load_milli.map(|milli| milli as f64 / 1000.0),
        id: record.id,
        address: record.address,
        version: record.version,
        started_at: record.started_at,
        heartbeat_at: record.heartbeat_at,
        lease_ms: record.lease_ms,
        running_runs: record.running_runs,
        max_runs: record.max_runs,
        workspaces_volume: record.volume,
    }
}

/// The machine's one-minute load average in thousandths (`/proc/loadavg`), when readable.
fn load_milli() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let first: f64 = text.split_whitespace().next()?.parse().ok()?;
    (first.is_finite() && first >= 0.0).then(|| (first * 1000.0).round() as u64)
}

impl App {
    /// What this node says of itself.
    fn beat(&self) -> NodeBeat {
        let settings = self.queue_settings();
        NodeBeat {
            id: settings.node_id.clone(),
            incarnation: settings.worker.clone(),
            address: settings.address.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            lease: settings.lease,
            running_runs: self.parts.hub.live_runs() as u64,
            max_runs: settings.max_concurrent as u64,
            load_milli: load_milli(),
            volume: settings.volume.clone(),
            replaces: settings.replaces.clone(),
        }
    }

    /// Registers this process as the node its settings name; a conflict when a live process
    /// holds the id.
    pub async fn join_cluster(&self) -> Result<(), AppError> {
        let previous = self
            .parts
            .store
            .join_cluster(&self.beat())
            .await
            .map_err(|error| match error {
                agentry_store::StoreError::Conflict(message) => AppError::conflict(message),
                other => other.into(),
            })?;
        *self
            .parts
            .queue
            .previous
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = previous;
        Ok(())
    }

    /// This node stops cleanly: it leaves the cluster, and the runs it still holds go to other
    /// nodes at once.
    pub async fn leave_cluster(&self) {
        self.parts.queue.left.cancel();
        let settings = self.queue_settings();
        if let Err(error) = self
            .parts
            .store
            .leave_cluster(&settings.node_id, &settings.worker)
            .await
        {
            tracing::warn!("leaving the cluster failed: {error}");
        }
    }

    /// The cluster's nodes.
    pub async fn cluster(&self) -> Result<ClusterView, AppError> {
        let this = self.queue_settings().node_id;
        let now = crate::clock::now_ms();
        let nodes = self.parts.store.nodes().await?;
        Ok(ClusterView {
            nodes: nodes
                .into_iter()
                .map(|record| view(record, &this, now))
                .collect(),
            node_id: this,
        })
    }

    /// The address of the node running `session`'s run, when that is another live node (the
    /// run is not live here): requests about the run go there.
    pub async fn remote_owner(&self, session: SessionId) -> Result<Option<String>, AppError> {
        // A SQLite folder has one process: no other node to ask (and no lookup per stream).
        if self.parts.hub.is_live(session)
            || self.parts.store.backend() == agentry_store::Backend::Sqlite
        {
            return Ok(None);
        }
        let worker = match self.parts.store.session_worker(session).await? {
            Some(worker) => Some(worker),
            // A background run claimed a moment ago: running before its session says so.
            None => self
                .parts
                .store
                .list_runs(&agentry_store::RunQuery {
                    session_id: Some(session),
                    state: Some(RunState::Running),
                    background: Some(true),
                    limit: 1,
                    ..agentry_store::RunQuery::default()
                })
                .await?
                .into_iter()
                .next()
                .and_then(|run| run.worker),
        };
        let Some(worker) = worker else {
            return Ok(None);
        };
        if worker == self.parts.queue.worker() {
            return Ok(None);
        }
        let Some(node) = self.parts.store.node_of_worker(&worker).await? else {
            return Ok(None);
        };
        let alive = node.alive_at(crate::clock::now_ms()) && !node.address.is_empty();
        Ok(alive.then_some(node.address))
    }

    /// The address of the node where `run` is live, when that is another node.
    pub async fn remote_run_owner(&self, run: RunId) -> Result<Option<String>, AppError> {
        if self.parts.sessions.session_of_live_run(run).is_some()
            || self.parts.store.backend() == agentry_store::Backend::Sqlite
        {
            return Ok(None);
        }
        match self.locate(run).await {
            Ok(session) => self.remote_owner(session).await,
            Err(_) => Ok(None),
        }
    }

    /// Keeps this node's membership and its runs' leases until the app shuts down; see the
    /// module's documentation.
    pub(crate) async fn keep_membership(self) {
        loop {
            let every = self.queue_settings().lease / 4;
            tokio::select! {
                () = self.parts.queue.left.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            // After a shutdown, the heartbeat goes on while runs held here finish (until the
            // node leaves): until then nobody else may take them.
            if self.parts.shutdown.is_cancelled() && self.parts.queue.held().is_empty() {
                return;
            }
            // The runs held before the heartbeat: one claimed after it is not missed by it.
            let held: HashMap<RunId, SessionId> = self.parts.queue.held();
            match self.parts.store.heartbeat(&self.beat()).await {
                Ok(Some(renewed)) => {
                    let renewed_ids: HashSet<RunId> =
                        renewed.iter().map(|lease| lease.run_id).collect();
                    for lease in renewed.iter().filter(|lease| lease.cancel_requested) {
                        if let Some(session) = held.get(&lease.run_id) {
                            self.parts.hub.cancel(*session);
                        }
                    }
                    for run in held.keys().filter(|run| !renewed_ids.contains(run)) {
                        self.check_lost(*run).await;
                    }
                    // The runs of nodes that died go on here (unless another node took them
                    // first).
                    if !self.parts.shutdown.is_cancelled() {
                        self.resume_orphaned(false).await;
                        self.settle_stranded().await;
                    }
                }
                Ok(None) => {
                    tracing::error!(
                        node = %self.queue_settings().node_id,
                        "another process took this node's id (this one was taken for dead): \
                         stopping"
                    );
                    self.parts.queue.lose_all();
                    self.parts.shutdown.cancel();
                    return;
                }
                Err(error) => tracing::warn!("the node's heartbeat failed: {error}"),
            }
        }
    }

    /// A run the heartbeat did not renew: settled meanwhile (fine), or taken over by another
    /// node (this one stops it).
    async fn check_lost(&self, run: RunId) {
        let worker = self.queue_settings().worker;
        match self.parts.store.run_record(run).await {
            Ok(Some(record))
                if record.state == RunState::Running
                    && record.worker.as_deref() != Some(worker.as_str()) =>
            {
                tracing::warn!(%run, "another node took this run over: stopping it here");
                self.parts.queue.lose(run);
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(%run, "cannot read a held run: {error}"),
        }
    }

    /// Tells this node's status feed about the sessions other nodes run: every
    /// [`FEED_POLL`], the sessions whose activity moved and whose run is not live here are
    /// announced with their stored status when it changed. PostgreSQL only (a SQLite folder has
    /// one process, whose own runs the feed hears directly); until the app shuts down.
    pub(crate) async fn follow_other_nodes(self) {
        if self.parts.store.backend() != agentry_store::Backend::Postgres {
            return;
        }
        let mut since = crate::clock::now_ms();
        let mut known: HashMap<SessionId, String> = HashMap::new();
        loop {
            tokio::select! {
                () = self.parts.shutdown.cancelled() => return,
                () = tokio::time::sleep(FEED_POLL) => {}
            }
            let changed = match self.parts.store.sessions_active_since(since, 1000).await {
                Ok(changed) => changed,
                Err(error) => {
                    tracing::debug!("cannot read the sessions' activity: {error}");
                    continue;
                }
            };
            for (session, status, at) in changed {
                since = since.max(at);
                if self.parts.hub.is_live(session) {
                    continue;
                }
                if known.get(&session) == Some(&status) {
                    continue;
                }
                if let Some(feed) = feed_status(&status) {
                    self.parts.hub.announce(session, feed);
                }
                known.insert(session, status);
            }
            // Bounded: the sessions seen recently are enough to skip repeats.
            if known.len() > 10_000 {
                known.clear();
            }
        }
    }

    /// Rebuilds the runtime and the MCP servers whenever the configuration's generation moves
    /// (another node changed it), until the app shuts down.
    pub(crate) async fn watch_configuration(self) {
        let mut seen = self
            .parts
            .queue
            .config_generation
            .load(std::sync::atomic::Ordering::Relaxed);
        loop {
            tokio::select! {
                () = self.parts.shutdown.cancelled() => return,
                () = tokio::time::sleep(CONFIG_POLL) => {}
            }
            let generation = match self.parts.store.config_generation().await {
                Ok(generation) => generation,
                Err(error) => {
                    tracing::debug!("cannot read the configuration's generation: {error}");
                    continue;
                }
            };
            if generation == seen {
                continue;
            }
            seen = generation;
            if let Err(error) =
                crate::mcp_tools::sync_saved(&self.parts.store, &self.parts.mcp).await
            {
                tracing::warn!("cannot follow the saved MCP servers: {}", error.message);
            }
            if let Err(error) = self.reload_runtime().await {
                tracing::warn!("cannot rebuild the runtime: {}", error.message);
            }
        }
    }
}
