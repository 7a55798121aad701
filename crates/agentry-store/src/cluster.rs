//! The nodes sharing one database, and the configuration's generation.
//!
//! Each `agentry serve` process is a node: a row with its id, the incarnation (one per process:
//! a node restarted under the same id is a new one), its address and version, and a heartbeat.
//! [`Store::join_cluster`] takes the id unless a live node of another incarnation holds it;
//! [`Store::heartbeat`] renews the row and, in the same transaction, the lease of every run the
//! incarnation holds — one statement for all of them, so a node's runs live exactly as long as
//! the node does. A node that misses its lease is dead: its runs' leases expire with it and
//! other nodes claim them ([`Store::claim_runs`]); the epoch fence refuses whatever the dead
//! (or only paused) node still tries to write.
//!
//! A session being run belongs to the process running it (`sessions.worker`, see
//! [`Store::set_worker`]); [`Store::claim_orphaned_sessions`] hands the running sessions of dead
//! nodes to a live one, which resumes their runs.
//!
//! The configuration's generation grows with every change to models, tools, MCP servers,
//! skills, templates, agents, API keys and secrets (a trigger in the same transaction): a node
//! that sees it move rebuilds.

use std::time::Duration;

use agentry_types::RunId;

use crate::StoreError;
use crate::db::{RowExt, from_db, in_write_tx, to_db, with_reader, with_writer};
use crate::model::now_millis;
use crate::store::Store;

/// What a node says of itself when it joins and at every heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeBeat {
    /// The node's id, unique among live nodes (1 to 128 characters of `A-Z a-z 0-9 _ . : -`).
    pub id: String,
    /// This process: the worker name its leases carry.
    pub incarnation: String,
    /// Where other nodes reach it (`host:port`).
    pub address: String,
    /// The Agentry version it runs.
    pub version: String,
    /// How long after a heartbeat it counts as alive; also the length of its runs' leases.
    pub lease: Duration,
    /// Runs it has going now.
    pub running_runs: u64,
    /// Runs it takes at once.
    pub max_runs: u64,
    /// The machine's one-minute load average, in thousandths.
    pub load_milli: Option<u64>,
    /// The volume its sessions' workspaces are on.
    pub volume: Option<String>,
    /// An earlier incarnation of this node that is provably gone (the process restarted on the
    /// data folder whose lock that incarnation held): joining takes the id from it at once,
    /// without waiting for its lease to run out.
    pub replaces: Option<String>,
}

/// A node as the database has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// Its id.
    pub id: String,
    /// Its process.
    pub incarnation: String,
    /// Where it is reached.
    pub address: String,
    /// Its version.
    pub version: String,
    /// When this incarnation joined, Unix milliseconds.
    pub started_at: u64,
    /// Its last heartbeat.
    pub heartbeat_at: u64,
    /// How long after a heartbeat it counts as alive, milliseconds.
    pub lease_ms: u64,
    /// Runs it had going at its last heartbeat.
    pub running_runs: u64,
    /// Runs it takes at once.
    pub max_runs: u64,
    /// The machine's load average then, in thousandths.
    pub load_milli: Option<u64>,
    /// The volume its sessions' workspaces are on.
    pub volume: Option<String>,
    /// When it stopped cleanly.
    pub stopped_at: Option<u64>,
}

impl NodeRecord {
    /// Whether it is alive at `now` (Unix milliseconds): not stopped, heartbeat within its lease.
    pub fn alive_at(&self, now: u64) -> bool {
        self.stopped_at.is_none() && self.heartbeat_at.saturating_add(self.lease_ms) >= now
    }
}

/// A run whose lease a heartbeat renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewedLease {
    /// The run.
    pub run_id: RunId,
    /// Its lease's epoch.
    pub epoch: u64,
    /// Someone asked for it to be cancelled.
    pub cancel_requested: bool,
}

/// Checks a node id.
pub fn check_node_id(id: &str) -> Result<(), StoreError> {
    let valid = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if valid {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "invalid node id {id:?}: use 1 to 128 characters of A-Z a-z 0-9 _ . : -"
        )))
    }
}

/// Session ids as the database returned them.
fn session_ids(ids: &[String]) -> Result<Vec<agentry_types::SessionId>, StoreError> {
    ids.iter()
        .map(|id| {
            id.parse()
                .map_err(|_| StoreError::Corrupt(format!("bad session id {id:?}")))
        })
        .collect()
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// Inserts the node, or takes its row over when it is this incarnation's, stopped, or dead.
/// Binds: 1 id, 2 incarnation, 3 address, 4 version, 5 now, 6 lease_ms, 7 running, 8 max,
/// 9 load, 10 volume.
const JOIN_SQL: &str = "INSERT INTO nodes (id, incarnation, address, version, started_at, \
     heartbeat_at, lease_ms, running_runs, max_runs, load_milli, volume, stopped_at) \
     VALUES ($1, $2, $3, $4, $5, $5, $6, $7, $8, $9, $10, NULL) \
     ON CONFLICT (id) DO UPDATE SET incarnation = excluded.incarnation, \
     address = excluded.address, version = excluded.version, started_at = excluded.started_at, \
     heartbeat_at = excluded.heartbeat_at, lease_ms = excluded.lease_ms, \
     running_runs = excluded.running_runs, max_runs = excluded.max_runs, \
     load_milli = excluded.load_milli, volume = excluded.volume, stopped_at = NULL \
     WHERE nodes.incarnation = excluded.incarnation OR nodes.stopped_at IS NOT NULL \
     OR nodes.heartbeat_at + nodes.lease_ms < excluded.heartbeat_at \
     OR nodes.incarnation = CAST($11 AS TEXT)";

/// Runs [`JOIN_SQL`] for `$node` at `$now` in transaction `$tx`: the rows it wrote (0: another
/// live incarnation holds the id).
macro_rules! join_node {
    ($tx:ident, $node:expr, $now:expr) => {
        sqlx::query(JOIN_SQL)
            .bind(&$node.id)
            .bind(&$node.incarnation)
            .bind(&$node.address)
            .bind(&$node.version)
            .bind(to_db($now))
            .bind(to_db(millis($node.lease)))
            .bind(to_db($node.running_runs))
            .bind(to_db($node.max_runs))
            .bind($node.load_milli.map(to_db))
            .bind($node.volume.as_deref())
            .bind($node.replaces.as_deref())
            .execute(&mut *$tx)
            .await?
            .rows_affected()
    };
}

macro_rules! node_columns {
    () => {
        "id, incarnation, address, version, started_at, heartbeat_at, lease_ms, running_runs, \
         max_runs, load_milli, volume, stopped_at"
    };
}

fn node_from_row<R: RowExt>(row: &R) -> Result<NodeRecord, StoreError> {
    Ok(NodeRecord {
        id: row.text("id")?,
        incarnation: row.text("incarnation")?,
        address: row.text("address")?,
        version: row.text("version")?,
        started_at: from_db(row.int("started_at")?),
        heartbeat_at: from_db(row.int("heartbeat_at")?),
        lease_ms: from_db(row.int("lease_ms")?),
        running_runs: from_db(row.int("running_runs")?),
        max_runs: from_db(row.int("max_runs")?),
        load_milli: row.opt_int("load_milli")?.map(from_db),
        volume: row.opt_text("volume")?,
        stopped_at: row.opt_int("stopped_at")?.map(from_db),
    })
}

impl Store {
    /// Joins the cluster as `node`: [`StoreError::Conflict`] when a live node of another
    /// incarnation holds the id (nothing is written then). Answers the incarnation the node
    /// had before, when it restarted under the same id (its sessions are the new one's to
    /// resume).
    pub async fn join_cluster(&self, node: &NodeBeat) -> Result<Option<String>, StoreError> {
        check_node_id(&node.id)?;
        let now = now_millis();
        let (joined, previous) = in_write_tx!(self, |tx, d| {
            let previous = sqlx::query("SELECT incarnation FROM nodes WHERE id = $1")
                .bind(&node.id)
                .fetch_optional(&mut *tx)
                .await?
                .map(|row| row.text("incarnation"))
                .transpose()?
                .filter(|previous| *previous != node.incarnation);
            let joined = join_node!(tx, node, now);
            (joined, previous)
        });
        if joined == 0 {
            return Err(StoreError::Conflict(format!(
                "another live node holds the id {:?} (it sent a heartbeat within its lease): \
                 give each node its own `--node-id`",
                node.id
            )));
        }
        Ok(previous)
    }

    /// Hands `worker` the running sessions whose process is gone, for it to resume their
    /// runs: those of nodes that are dead or stopped (on this store's workspace volume, when
    /// it has one: elsewhere their files are not here), those of `previous` (this node's
    /// incarnation before a restart), and with `exclusive` (no other process can be writing:
    /// SQLite's folder lock) every running session.
    /// Sessions whose run is a background run are left to the run queue, which takes them
    /// with the run. Answers the sessions taken.
    pub async fn claim_orphaned_sessions(
        &self,
        worker: &str,
        previous: Option<&str>,
        exclusive: bool,
    ) -> Result<Vec<agentry_types::SessionId>, StoreError> {
        let now = to_db(now_millis());
        let rows = with_writer!(self, |pool, d| {
            sqlx::query(
                "UPDATE sessions SET worker = $1 \
                 WHERE status = 'running' \
                 AND ($3 OR worker = $4 OR worker IN (SELECT incarnation FROM nodes \
                      WHERE (stopped_at IS NOT NULL OR heartbeat_at + lease_ms < $2) \
                      AND (CAST($5 AS TEXT) IS NULL OR COALESCE(volume, '') = $5))) \
                 AND NOT EXISTS (SELECT 1 FROM runs \
                      WHERE runs.session_id = sessions.id AND runs.state = 'running' \
                      AND runs.background = 1) \
                 RETURNING id",
            )
            .bind(worker)
            .bind(now)
            .bind(exclusive)
            .bind(previous)
            .bind(self.volume().as_deref().map(str::to_owned))
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| row.text("id"))
            .collect::<Result<Vec<_>, _>>()?
        });
        session_ids(&rows)
    }

    /// The running sessions of dead nodes that no node could take because no live node shares
    /// the dead node's workspace volume, dead for longer than their lease plus `after`: taken
    /// for `worker` whatever its volume (their files are not here), so that it resumes them
    /// without their files or ends them. Background runs are left to the run queue. Answers
    /// the sessions taken.
    pub async fn claim_stranded_sessions(
        &self,
        worker: &str,
        after: std::time::Duration,
    ) -> Result<Vec<agentry_types::SessionId>, StoreError> {
        let now = to_db(now_millis());
        let rows = with_writer!(self, |pool, d| {
            sqlx::query(
                "UPDATE sessions SET worker = $1 \
                 WHERE status = 'running' \
                 AND worker IN (SELECT incarnation FROM nodes \
                      WHERE COALESCE(stopped_at, heartbeat_at + lease_ms) + $3 < $2) \
                 AND NOT EXISTS (SELECT 1 FROM runs \
                      WHERE runs.session_id = sessions.id AND runs.state = 'running' \
                      AND runs.background = 1) \
                 RETURNING id",
            )
            .bind(worker)
            .bind(now)
            .bind(to_db(millis(after)))
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| row.text("id"))
            .collect::<Result<Vec<_>, _>>()?
        });
        session_ids(&rows)
    }

    /// Why a running session waits, when its node is dead and no live node shares that node's
    /// workspace volume (so none may take it over): the volume, and since when (Unix
    /// milliseconds, when the node's lease ran out or it stopped).
    pub async fn stranded_on(
        &self,
        session: agentry_types::SessionId,
    ) -> Result<Option<(String, u64)>, StoreError> {
        let now = to_db(now_millis());
        let id = session.to_string();
        with_reader!(self, |pool, d| {
            let row = sqlx::query(
                "SELECT n.volume AS volume, COALESCE(n.stopped_at, n.heartbeat_at + n.lease_ms) \
                 AS since FROM sessions s JOIN nodes n ON n.incarnation = s.worker \
                 WHERE s.id = $1 AND s.status = 'running' \
                 AND COALESCE(n.volume, '') <> '' \
                 AND (n.stopped_at IS NOT NULL OR n.heartbeat_at + n.lease_ms < $2) \
                 AND NOT EXISTS (SELECT 1 FROM nodes m WHERE m.volume = n.volume \
                      AND m.stopped_at IS NULL AND m.heartbeat_at + m.lease_ms >= $2)",
            )
            .bind(&id)
            .bind(now)
            .fetch_optional(pool)
            .await?;
            match row {
                Some(row) => Ok(Some((row.text("volume")?, from_db(row.int("since")?)))),
                None => Ok(None),
            }
        })
    }

    /// The node's heartbeat: renews its row and the lease of every run its incarnation holds,
    /// in one transaction, and answers those runs. `None` when another incarnation has taken
    /// the id (this process was taken for dead): it must stop working.
    pub async fn heartbeat(
        &self,
        node: &NodeBeat,
    ) -> Result<Option<Vec<RenewedLease>>, StoreError> {
        let outcome = self.renew(node).await;
        // The heartbeat is the store's regular write: it tells whether there is room again.
        self.inner.room.note(&outcome);
        outcome
    }

    /// [`Store::heartbeat`]'s write.
    async fn renew(&self, node: &NodeBeat) -> Result<Option<Vec<RenewedLease>>, StoreError> {
        check_node_id(&node.id)?;
        let now = now_millis();
        let until = to_db(now.saturating_add(millis(node.lease)));
        let renewed = in_write_tx!(self, |tx, d| {
            let updated = sqlx::query(
                "UPDATE nodes SET heartbeat_at = $3, running_runs = $4, max_runs = $5, \
                 load_milli = $6, lease_ms = $7, address = $8, stopped_at = NULL \
                 WHERE id = $1 AND incarnation = $2",
            )
            .bind(&node.id)
            .bind(&node.incarnation)
            .bind(to_db(now))
            .bind(to_db(node.running_runs))
            .bind(to_db(node.max_runs))
            .bind(node.load_milli.map(to_db))
            .bind(to_db(millis(node.lease)))
            .bind(&node.address)
            .execute(&mut *tx)
            .await?
            .rows_affected();
            if updated == 0 {
                // The row went (or never was): join again, unless another incarnation lives.
                let joined = join_node!(tx, node, now);
                if joined == 0 {
                    return Ok(None);
                }
            }
            let rows = sqlx::query(d.renew_leases_sql())
                .bind(until)
                .bind(&node.incarnation)
                .fetch_all(&mut *tx)
                .await?;
            let mut renewed = Vec::with_capacity(rows.len());
            for row in &rows {
                let id = row.text("id")?;
                renewed.push(RenewedLease {
                    run_id: id
                        .parse()
                        .map_err(|_| StoreError::Corrupt(format!("bad run id {id:?}")))?,
                    epoch: from_db(row.int("lease_epoch")?),
                    cancel_requested: row.int("cancel_requested")? != 0,
                });
            }
            renewed
        });
        Ok(Some(renewed))
    }

    /// The node stops cleanly: marked stopped, and the runs it still holds are let go at once
    /// (their leases expire now, so another node claims them without waiting).
    pub async fn leave_cluster(&self, id: &str, incarnation: &str) -> Result<(), StoreError> {
        let now = to_db(now_millis());
        in_write_tx!(self, |tx, d| {
            sqlx::query("UPDATE nodes SET stopped_at = $3 WHERE id = $1 AND incarnation = $2")
                .bind(id)
                .bind(incarnation)
                .bind(now)
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE runs SET lease_until = 0 WHERE worker = $1 AND state = 'running'")
                .bind(incarnation)
                .execute(&mut *tx)
                .await?;
        });
        Ok(())
    }

    /// Every node the database has seen, by id.
    pub async fn nodes(&self) -> Result<Vec<NodeRecord>, StoreError> {
        with_reader!(self, |pool, d| {
            let rows = sqlx::query(concat!(
                "SELECT ",
                node_columns!(),
                " FROM nodes ORDER BY id"
            ))
            .fetch_all(pool)
            .await?;
            rows.iter().map(node_from_row).collect()
        })
    }

    /// The node whose incarnation holds leases as `worker`.
    pub async fn node_of_worker(&self, worker: &str) -> Result<Option<NodeRecord>, StoreError> {
        with_reader!(self, |pool, d| {
            let row = sqlx::query(concat!(
                "SELECT ",
                node_columns!(),
                " FROM nodes WHERE incarnation = $1"
            ))
            .bind(worker)
            .fetch_optional(pool)
            .await?;
            row.as_ref().map(node_from_row).transpose()
        })
    }

    /// The process running `session`'s run, while it is `running`.
    pub async fn session_worker(
        &self,
        session: agentry_types::SessionId,
    ) -> Result<Option<String>, StoreError> {
        with_reader!(self, |pool, d| {
            let row =
                sqlx::query("SELECT worker FROM sessions WHERE id = $1 AND status = 'running'")
                    .bind(session.to_string())
                    .fetch_optional(pool)
                    .await?;
            row.map(|row| row.opt_text("worker"))
                .transpose()
                .map(Option::flatten)
        })
    }

    /// The sessions whose activity moved after `since` (Unix milliseconds), oldest first, at
    /// most `limit`: `(session, status, last activity)`.
    pub async fn sessions_active_since(
        &self,
        since: u64,
        limit: usize,
    ) -> Result<Vec<(agentry_types::SessionId, String, u64)>, StoreError> {
        let rows = with_reader!(self, |pool, d| {
            sqlx::query(
                "SELECT id, status, last_activity FROM sessions WHERE last_activity > $1 \
                 ORDER BY last_activity LIMIT CAST($2 AS BIGINT)",
            )
            .bind(to_db(since))
            .bind(to_db(limit as u64))
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| {
                Ok((
                    row.text("id")?,
                    row.text("status")?,
                    from_db(row.int("last_activity")?),
                ))
            })
            .collect::<Result<Vec<_>, StoreError>>()?
        });
        rows.into_iter()
            .map(|(id, status, at)| {
                id.parse()
                    .map(|id| (id, status, at))
                    .map_err(|_| StoreError::Corrupt(format!("bad session id {id:?}")))
            })
            .collect()
    }

    /// The configuration's generation: it grows with every change that a node's runtime is
    /// built from.
    pub async fn config_generation(&self) -> Result<u64, StoreError> {
        with_reader!(self, |pool, d| {
            let row = sqlx::query("SELECT generation FROM config_generation WHERE id = 1")
                .fetch_optional(pool)
                .await?;
            Ok(row
                .map(|row| row.int("generation"))
                .transpose()?
                .map_or(0, from_db))
        })
    }
}
