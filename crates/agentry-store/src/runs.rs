//! The run queue: background runs as durable records that workers claim under leases.
//!
//! A run is enqueued `queued` ([`Store::enqueue_run`]: one transaction that honours an
//! idempotency key and a bound on queued runs). A worker claims runs ([`Store::claim_runs`]:
//! highest priority, then oldest; PostgreSQL skips rows another worker is claiming with `FOR
//! UPDATE SKIP LOCKED`, SQLite's single writer serialises claims), which makes them `running`
//! under a lease: the worker's name, an expiry, and an epoch that grows with every claim. The
//! worker renews its lease while the run goes on ([`Store::renew_lease`]) and settles the run
//! when it stops ([`Store::settle_run`]); both are fenced by the epoch, so a worker whose lease
//! expired and was claimed again by another is refused instead of overwriting the new owner's
//! state. A `running` run whose lease expired is claimable again (its worker died), with its
//! attempt counted.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use agentry_types::{RunId, SessionId};

use crate::StoreError;
use crate::db::{Dialect, RowExt, from_db, in_write_tx, to_db, with_reader, with_writer};
use crate::model::now_millis;
use crate::store::{Store, from_json_text, to_json_text};

/// Where a queued run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    /// Waiting for a worker.
    Queued,
    /// A worker runs it under a lease.
    Running,
    /// Stopped without ending: tool calls wait for a person's approval.
    Waiting,
    /// Stopped without ending: paused between rounds.
    Paused,
    /// Ended without an error (a guard that stopped it included).
    Succeeded,
    /// Ended with an error.
    Failed,
    /// Cancelled before or while it ran.
    Cancelled,
}

impl RunState {
    /// Every state, in the order a run goes through them.
    pub const ALL: [Self; 7] = [
        Self::Queued,
        Self::Running,
        Self::Waiting,
        Self::Paused,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    /// The stored (and wire) name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::Paused => "paused",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// The state a stored name names.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == name)
    }

    /// Whether the run has ended for good.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// What an appended event says of its run's record, for a run started in its session (not
/// queued): the group commit keeps the record in the same transaction as the event (see
/// [`crate::NewEvent::with_run`]). Such a record has no worker and no lease (its session's
/// worker fences it), so the queue never claims, renews or counts it.
#[derive(Debug, Clone, PartialEq)]
pub enum RunMark {
    /// The run starts: it is recorded `running`, unless it has a record already (a queued
    /// run's, or its own from before a restart).
    Started {
        /// The run.
        run_id: RunId,
        /// The saved agent it runs as.
        agent_id: Option<String>,
    },
    /// The run is now in `state` (a record that ended, or a queued run's, is left as it is).
    Now {
        /// The run.
        run_id: RunId,
        /// Where it is.
        state: RunState,
    },
}

/// A run to enqueue.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRun {
    /// Its id (the engine runs it under this id).
    pub id: RunId,
    /// The session it runs in.
    pub session_id: SessionId,
    /// The saved agent it runs as.
    pub agent_id: Option<String>,
    /// The API key that submitted it.
    pub owner: Option<String>,
    /// Higher runs first.
    pub priority: i64,
    /// A client's key for the submission: the same key (per owner) returns the same run.
    pub idempotency_key: Option<String>,
    /// The schedule that fired it.
    pub schedule_id: Option<String>,
    /// Where to tell when it stops.
    pub webhook_url: Option<String>,
    /// At most this many runs of its agent may run at once (across every worker).
    pub agent_limit: Option<u32>,
    /// A digest of what was submitted, to tell a retried submission from another one that
    /// reuses its key.
    pub request_digest: String,
    /// What to run, as the app stores it.
    pub request: serde_json::Value,
    /// The session to create for it, in the same transaction as its record (a run submitted
    /// in a new session): both are stored, or neither.
    pub new_session: Option<crate::NewSession>,
}

/// A queued run as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRecord {
    /// Its id.
    pub id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// The saved agent it runs as.
    pub agent_id: Option<String>,
    /// The API key that submitted it.
    pub owner: Option<String>,
    /// Where it is.
    pub state: RunState,
    /// Higher runs first.
    pub priority: i64,
    /// How many times a worker claimed it.
    pub attempt: u64,
    /// The worker holding its lease.
    pub worker: Option<String>,
    /// When that lease expires, Unix milliseconds.
    pub lease_until: Option<u64>,
    /// The lease's epoch (grows with every claim).
    pub lease_epoch: u64,
    /// The submission's idempotency key.
    pub idempotency_key: Option<String>,
    /// The schedule that fired it.
    pub schedule_id: Option<String>,
    /// Where to tell when it stops.
    pub webhook_url: Option<String>,
    /// The digest of what was submitted.
    pub request_digest: String,
    /// What to run.
    pub request: serde_json::Value,
    /// How it ended (or why it stopped), once it did.
    pub outcome: Option<serde_json::Value>,
    /// Someone asked for it to be cancelled.
    pub cancel_requested: bool,
    /// When it was enqueued, Unix milliseconds.
    pub created_at: u64,
    /// When a worker first started it.
    pub started_at: Option<u64>,
    /// When it ended.
    pub finished_at: Option<u64>,
    /// Submitted to the queue (a background run), not started in its session directly.
    pub background: bool,
}

/// What [`Store::enqueue_run`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Enqueued {
    /// The run is queued.
    Created(RunRecord),
    /// The idempotency key named a run submitted before with the same request: that run.
    Existing(RunRecord),
    /// The queue holds its maximum of queued runs: nothing was stored.
    QueueFull {
        /// The bound.
        max_queued: u64,
    },
}

/// A worker's hold on a running run: the fence every later write of the worker carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run_id: RunId,
    /// The worker.
    pub worker: String,
    /// The epoch of the claim.
    pub epoch: u64,
}

impl RunRecord {
    /// The lease of a claimed run (`None` when no worker holds it).
    pub fn lease(&self) -> Option<Lease> {
        self.worker.as_ref().map(|worker| Lease {
            run_id: self.id,
            worker: worker.clone(),
            epoch: self.lease_epoch,
        })
    }
}

/// Which runs [`Store::list_runs`] returns, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunQuery {
    /// Only this session's.
    pub session_id: Option<SessionId>,
    /// Only runs as this agent.
    pub agent_id: Option<String>,
    /// Only runs in this state.
    pub state: Option<RunState>,
    /// Only this key's.
    pub owner: Option<String>,
    /// Only runs this schedule fired.
    pub schedule_id: Option<String>,
    /// Only runs enqueued at or after this time, Unix milliseconds.
    pub created_after: Option<u64>,
    /// Only runs enqueued before this time.
    pub created_before: Option<u64>,
    /// Only background runs (`true`) or only runs started in their sessions (`false`).
    pub background: Option<bool>,
    /// At most this many.
    pub limit: usize,
    /// Skip this many first.
    pub offset: usize,
}

/// The `FROM … WHERE` of a [`RunQuery`], its filters as `$1` to `$8` (bound by
/// [`bind_run_filter!`]).
macro_rules! run_filter {
    () => {
        " FROM runs WHERE ($1 IS NULL OR session_id = $1) \
         AND ($2 IS NULL OR agent_id = $2) AND ($3 IS NULL OR state = $3) \
         AND ($4 IS NULL OR owner = $4) AND ($5 IS NULL OR created_at >= $5) \
         AND ($6 IS NULL OR created_at < $6) AND ($7 IS NULL OR schedule_id = $7) \
         AND ($8 IS NULL OR background = $8)"
    };
}

/// Binds a [`RunQuery`]'s filters to `$1` to `$8` of [`run_filter!`].
macro_rules! bind_run_filter {
    ($statement:expr, $query:expr) => {
        $statement
            .bind($query.session_id.map(|id| id.to_string()))
            .bind($query.agent_id.as_deref())
            .bind($query.state.map(RunState::as_str))
            .bind($query.owner.as_deref())
            .bind($query.created_after.map(to_db))
            .bind($query.created_before.map(to_db))
            .bind($query.schedule_id.as_deref())
            .bind($query.background.map(i64::from))
    };
}

macro_rules! run_columns {
    () => {
        "id, session_id, agent_id, owner, state, priority, attempt, worker, lease_until, \
         lease_epoch, idempotency_key, schedule_id, webhook_url, request_digest, request, \
         outcome, cancel_requested, created_at, started_at, finished_at, background"
    };
}

/// The runs a worker may claim now (`$3`: now), best first: queued ones and running ones whose
/// lease expired, within their agent's limit.
macro_rules! claimable {
    () => {
        "SELECT id FROM (SELECT id, priority, created_at, agent_limit, \
         ROW_NUMBER() OVER (PARTITION BY agent_id ORDER BY priority DESC, created_at, id) \
         AS place, (SELECT COUNT(*) FROM runs busy WHERE busy.agent_id = candidate.agent_id \
         AND busy.background = 1 AND busy.state = 'running' AND busy.lease_until >= $3) \
         AS busy FROM runs candidate WHERE background = 1 AND (state = 'queued' \
         OR (state = 'running' AND lease_until < $3 AND (CAST($5 AS TEXT) IS NULL \
             OR lease_until < $3 - CAST($6 AS BIGINT) \
             OR NOT EXISTS (SELECT 1 FROM nodes n WHERE n.incarnation = candidate.worker \
             AND COALESCE(n.volume, '') <> CAST($5 AS TEXT)))))) ranked \
         WHERE agent_limit IS NULL OR place + busy <= agent_limit \
         ORDER BY priority DESC, created_at, id"
    };
}

fn run_from_row(row: &impl RowExt) -> Result<RunRecord, StoreError> {
    let state = row.text("state")?;
    Ok(RunRecord {
        id: RunId::parse(&row.text("id")?).map_err(|e| StoreError::Corrupt(e.to_string()))?,
        session_id: SessionId::parse(&row.text("session_id")?)
            .map_err(|e| StoreError::Corrupt(e.to_string()))?,
        agent_id: row.opt_text("agent_id")?,
        owner: row.opt_text("owner")?,
        state: RunState::parse(&state)
            .ok_or_else(|| StoreError::Corrupt(format!("run state {state:?}")))?,
        priority: row.int("priority")?,
        attempt: from_db(row.int("attempt")?),
        worker: row.opt_text("worker")?,
        lease_until: row.opt_int("lease_until")?.map(from_db),
        lease_epoch: from_db(row.int("lease_epoch")?),
        idempotency_key: row.opt_text("idempotency_key")?,
        schedule_id: row.opt_text("schedule_id")?,
        webhook_url: row.opt_text("webhook_url")?,
        request_digest: row.text("request_digest")?,
        request: from_json_text(&row.text("request")?)?,
        outcome: row
            .opt_text("outcome")?
            .map(|text| from_json_text(&text))
            .transpose()?,
        cancel_requested: row.int("cancel_requested")? != 0,
        created_at: from_db(row.int("created_at")?),
        started_at: row.opt_int("started_at")?.map(from_db),
        finished_at: row.opt_int("finished_at")?.map(from_db),
        background: row.int("background")? != 0,
    })
}

fn check_key(key: &str) -> Result<(), StoreError> {
    if key.is_empty() || key.len() > 255 || key.chars().any(char::is_control) {
        return Err(StoreError::InvalidInput(
            "an idempotency key has 1 to 255 characters, none of them control characters".into(),
        ));
    }
    Ok(())
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Dialect {
    /// The claim statement: the oldest claimable runs by priority, made `running` under a new
    /// lease, none beyond its agent's limit (runs of a limited agent are ranked within the
    /// agent, and one is claimable while its rank plus the agent's running runs stays within
    /// the limit); a run whose lease expired only from a node on the same workspace volume
    /// (`$5`, when known), or from any once expired for `$6` ms (when set: stranded runs are
    /// resumed elsewhere). `$1` worker, `$2` lease expiry, `$3` now, `$4` how many.
    fn claim_sql(self) -> &'static str {
        match self {
            Self::Sqlite => concat!(
                "UPDATE runs SET state = 'running', worker = $1, lease_until = $2, \
                 lease_epoch = lease_epoch + 1, attempt = attempt + 1, \
                 started_at = COALESCE(started_at, $3) WHERE id IN (",
                claimable!(),
                " LIMIT CAST($4 AS BIGINT)) RETURNING ",
                run_columns!()
            ),
            Self::Postgres => concat!(
                "UPDATE runs SET state = 'running', worker = $1, lease_until = $2, \
                 lease_epoch = lease_epoch + 1, attempt = attempt + 1, \
                 started_at = COALESCE(started_at, $3) WHERE id IN (\
                 SELECT id FROM runs WHERE id IN (",
                claimable!(),
                // Checked again here, on the locked row: a run another worker claimed since
                // this statement's snapshot is skipped, not claimed twice.
                ") AND (state = 'queued' OR (state = 'running' AND lease_until < $3)) \
                 ORDER BY priority DESC, created_at, id LIMIT CAST($4 AS BIGINT) FOR UPDATE SKIP LOCKED) \
                 RETURNING ",
                run_columns!()
            ),
        }
    }
}

impl Store {
    /// Enqueues a run, in one transaction: with an idempotency key already used by the same
    /// owner, the earlier run if the request is the same (else a conflict, and nothing is
    /// stored); when `max_queued` runs wait already, nothing is stored either.
    pub async fn enqueue_run(&self, run: &NewRun, max_queued: u64) -> Result<Enqueued, StoreError> {
        if let Some(key) = &run.idempotency_key {
            check_key(key)?;
        }
        match self.try_enqueue(run, max_queued).await {
            // Two submissions with one key raced (PostgreSQL): the second sees the first's run.
            Err(StoreError::Database(sqlx::Error::Database(error)))
                if error.is_unique_violation() =>
            {
                self.try_enqueue(run, max_queued).await
            }
            other => other,
        }
    }

    async fn try_enqueue(&self, run: &NewRun, max_queued: u64) -> Result<Enqueued, StoreError> {
        let request = to_json_text(&run.request)?;
        let session = match &run.new_session {
            Some(new) if new.id != run.session_id => {
                return Err(StoreError::InvalidInput(format!(
                    "the new session {} is not the run's session {}",
                    new.id, run.session_id
                )));
            }
            Some(new) => Some(crate::store::new_row(new)?),
            None => None,
        };
        let now = to_db(now_millis());
        in_write_tx!(self, |tx, d| {
            if let Some(key) = &run.idempotency_key {
                let existing = sqlx::query(concat!(
                    "SELECT ",
                    run_columns!(),
                    " FROM runs WHERE COALESCE(owner, '') = COALESCE($1, '') \
                     AND idempotency_key = $2"
                ))
                .bind(run.owner.as_deref())
                .bind(key)
                .fetch_optional(&mut *tx)
                .await?;
                if let Some(row) = existing {
                    let record = run_from_row(&row)?;
                    if record.request_digest != run.request_digest {
                        return Err(StoreError::Conflict(format!(
                            "the idempotency key {key:?} was used for another request"
                        )));
                    }
                    return Ok(Enqueued::Existing(record));
                }
            }
            let queued: i64 = sqlx::Row::try_get(
                &sqlx::query(
                    "SELECT COUNT(*) AS queued FROM runs WHERE background = 1 AND state = 'queued'",
                )
                .fetch_one(&mut *tx)
                .await?,
                "queued",
            )?;
            if from_db(queued) >= max_queued {
                return Ok(Enqueued::QueueFull { max_queued });
            }
            if let Some(new) = &session {
                // Numbered parameters: one statement for both dialects (it has few).
                sqlx::query(
                    "INSERT INTO sessions (id, title, status, created_at, last_activity, \
                     last_seq, read_seq, expires_at, metadata, owner) \
                     VALUES ($1, $2, 'idle', $3, $3, 0, 0, $4, $5, $6)",
                )
                .bind(run.session_id.to_string())
                .bind(new.title.as_deref())
                .bind(now)
                .bind(new.expires_at.map(to_db))
                .bind(new.metadata.as_str())
                .bind(new.owner.as_deref())
                .execute(&mut *tx)
                .await?;
            }
            let row = sqlx::query(concat!(
                "INSERT INTO runs (id, session_id, agent_id, owner, state, priority, \
                 idempotency_key, request_digest, request, created_at, schedule_id, \
                 webhook_url, agent_limit) \
                 VALUES ($1, $2, $3, $4, 'queued', $5, $6, $7, $8, $9, $10, $11, $12) RETURNING ",
                run_columns!()
            ))
            .bind(run.id.to_string())
            .bind(run.session_id.to_string())
            .bind(run.agent_id.as_deref())
            .bind(run.owner.as_deref())
            .bind(run.priority)
            .bind(run.idempotency_key.as_deref())
            .bind(&run.request_digest)
            .bind(&request)
            .bind(now)
            .bind(run.schedule_id.as_deref())
            .bind(run.webhook_url.as_deref())
            .bind(run.agent_limit.map(i64::from))
            .fetch_one(&mut *tx)
            .await?;
            Ok(Enqueued::Created(run_from_row(&row)?))
        })
    }

    /// Claims up to `limit` runs for `worker` under a lease of `lease_for`: queued ones, and
    /// running ones whose lease expired (their worker is gone). Highest priority first, then
    /// oldest.
    pub async fn claim_runs(
        &self,
        worker: &str,
        limit: usize,
        lease_for: Duration,
    ) -> Result<Vec<RunRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let now = now_millis();
        // Most looks find nothing: a read says so without taking the write lock.
        let claimable = with_reader!(self, |pool, d| {
            sqlx::query(
                "SELECT 1 AS found FROM runs WHERE background = 1 AND (state = 'queued' \
                 OR (state = 'running' AND lease_until < $1)) LIMIT 1",
            )
            .bind(to_db(now))
            .fetch_optional(pool)
            .await?
            .is_some()
        });
        if !claimable {
            return Ok(Vec::new());
        }
        let until = to_db(now.saturating_add(millis(lease_for)));
        let mut claimed = in_write_tx!(self, |tx, d| {
            let rows = sqlx::query(d.claim_sql())
                .bind(worker)
                .bind(until)
                .bind(to_db(now))
                .bind(to_db(limit as u64))
                .bind(self.volume().as_deref().map(str::to_owned))
                .bind(self.stranded_resume().map(|after| to_db(millis(after))))
                .fetch_all(&mut *tx)
                .await?;
            let claimed = rows
                .iter()
                .map(run_from_row)
                .collect::<Result<Vec<_>, StoreError>>()?;
            // The runs' sessions are the worker's now (a run taken over from a dead worker
            // takes its session with it), unless a live process runs them.
            for run in &claimed {
                sqlx::query(
                    "UPDATE sessions SET worker = $1 WHERE id = $2 \
                     AND (worker IS NULL OR worker = $1 OR worker NOT IN \
                     (SELECT incarnation FROM nodes WHERE stopped_at IS NULL \
                      AND heartbeat_at + lease_ms >= $3))",
                )
                .bind(worker)
                .bind(run.session_id.to_string())
                .bind(to_db(now))
                .execute(&mut *tx)
                .await?;
            }
            claimed
        });
        claimed.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.created_at.cmp(&b.created_at))
        });
        Ok(claimed)
    }

    /// Extends a lease by `lease_for` from now. `false` when the lease is no longer the
    /// worker's (another claimed the run, or it was settled): the worker must stop.
    pub async fn renew_lease(
        &self,
        lease: &Lease,
        lease_for: Duration,
    ) -> Result<bool, StoreError> {
        let until = to_db(now_millis().saturating_add(millis(lease_for)));
        let renewed = with_writer!(self, |pool, d| {
            sqlx::query(
                "UPDATE runs SET lease_until = $1 WHERE id = $2 AND worker = $3 \
                 AND lease_epoch = $4 AND state = 'running'",
            )
            .bind(until)
            .bind(lease.run_id.to_string())
            .bind(&lease.worker)
            .bind(to_db(lease.epoch))
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(renewed > 0)
    }

    /// Records where a leased run stopped and gives the lease up, fenced by the lease: `false`
    /// (and nothing written) when the lease is no longer the worker's.
    pub async fn settle_run(
        &self,
        lease: &Lease,
        state: RunState,
        outcome: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        let outcome = outcome.map(to_json_text).transpose()?;
        let now = to_db(now_millis());
        let settled = with_writer!(self, |pool, d| {
            sqlx::query(
                "UPDATE runs SET state = $1, outcome = COALESCE($2, outcome), worker = NULL, \
                 lease_until = NULL, finished_at = CASE WHEN $3 THEN $4 ELSE finished_at END \
                 WHERE id = $5 AND worker = $6 AND lease_epoch = $7 AND state = 'running'",
            )
            .bind(state.as_str())
            .bind(outcome.as_deref())
            .bind(state.is_final())
            .bind(now)
            .bind(lease.run_id.to_string())
            .bind(&lease.worker)
            .bind(to_db(lease.epoch))
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(settled > 0)
    }

    /// Records where a run that no worker holds (it waited for a person, then went on) is now.
    /// A run that has ended for good is left as it is: `false`.
    pub async fn set_run_state(
        &self,
        id: RunId,
        state: RunState,
        outcome: Option<&serde_json::Value>,
    ) -> Result<bool, StoreError> {
        let outcome = outcome.map(to_json_text).transpose()?;
        let now = to_db(now_millis());
        let updated = with_writer!(self, |pool, d| {
            sqlx::query(
                "UPDATE runs SET state = $1, outcome = COALESCE($2, outcome), \
                 finished_at = CASE WHEN $3 THEN $4 ELSE finished_at END \
                 WHERE id = $5 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
            )
            .bind(state.as_str())
            .bind(outcome.as_deref())
            .bind(state.is_final())
            .bind(now)
            .bind(id.to_string())
            .execute(pool)
            .await?
            .rows_affected()
        });
        Ok(updated > 0)
    }

    /// Asks for a run to be cancelled: a queued one is cancelled at once; any other that has
    /// not ended is marked, for its worker (or whoever continues it) to stop. The run as it is
    /// now, or `None` when there is no such run.
    pub async fn cancel_run(&self, id: RunId) -> Result<Option<RunRecord>, StoreError> {
        let now = to_db(now_millis());
        in_write_tx!(self, |tx, d| {
            sqlx::query(
                "UPDATE runs SET state = 'cancelled', finished_at = $1, cancel_requested = 1 \
                 WHERE id = $2 AND state = 'queued'",
            )
            .bind(now)
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "UPDATE runs SET cancel_requested = 1 \
                 WHERE id = $1 AND state NOT IN ('succeeded', 'failed', 'cancelled')",
            )
            .bind(id.to_string())
            .execute(&mut *tx)
            .await?;
            let row = sqlx::query(concat!(
                "SELECT ",
                run_columns!(),
                " FROM runs WHERE id = $1"
            ))
            .bind(id.to_string())
            .fetch_optional(&mut *tx)
            .await?;
            row.as_ref().map(run_from_row).transpose()
        })
    }

    /// One queued run.
    pub async fn run_record(&self, id: RunId) -> Result<Option<RunRecord>, StoreError> {
        with_reader!(self, |pool, d| {
            let row = sqlx::query(concat!(
                "SELECT ",
                run_columns!(),
                " FROM runs WHERE id = $1"
            ))
            .bind(id.to_string())
            .fetch_optional(pool)
            .await?;
            row.as_ref().map(run_from_row).transpose()
        })
    }

    /// The run an owner submitted with an idempotency key.
    pub async fn run_by_idempotency_key(
        &self,
        owner: Option<&str>,
        key: &str,
    ) -> Result<Option<RunRecord>, StoreError> {
        check_key(key)?;
        with_reader!(self, |pool, d| {
            let row = sqlx::query(concat!(
                "SELECT ",
                run_columns!(),
                " FROM runs WHERE COALESCE(owner, '') = COALESCE($1, '') AND idempotency_key = $2"
            ))
            .bind(owner)
            .bind(key)
            .fetch_optional(pool)
            .await?;
            row.as_ref().map(run_from_row).transpose()
        })
    }

    /// Queued runs, newest first.
    pub async fn list_runs(&self, query: &RunQuery) -> Result<Vec<RunRecord>, StoreError> {
        with_reader!(self, |pool, d| {
            let rows = bind_run_filter!(
                sqlx::query(concat!(
                    "SELECT ",
                    run_columns!(),
                    run_filter!(),
                    " ORDER BY created_at DESC, id DESC LIMIT CAST($9 AS BIGINT) OFFSET $10"
                )),
                query
            )
            .bind(to_db(query.limit as u64))
            .bind(to_db(query.offset as u64))
            .fetch_all(pool)
            .await?;
            rows.iter().map(run_from_row).collect()
        })
    }

    /// How many runs `query` matches (its `limit` and `offset` aside), counted in the
    /// database: nothing is read of the runs themselves.
    pub async fn count_runs(&self, query: &RunQuery) -> Result<u64, StoreError> {
        with_reader!(self, |pool, d| {
            let row = bind_run_filter!(
                sqlx::query(concat!("SELECT COUNT(*) AS matched", run_filter!())),
                query
            )
            .fetch_one(pool)
            .await?;
            Ok(from_db(sqlx::Row::try_get(&row, "matched")?))
        })
    }

    /// How many runs wait in the queue.
    pub async fn queued_runs(&self) -> Result<u64, StoreError> {
        with_reader!(self, |pool, d| {
            let row = sqlx::query(
                "SELECT COUNT(*) AS queued FROM runs WHERE background = 1 AND state = 'queued'",
            )
            .fetch_one(pool)
            .await?;
            Ok(from_db(sqlx::Row::try_get(&row, "queued")?))
        })
    }
}
