//! Group commit: one writer task per store gathers the appends of every session and writes them
//! in one transaction, answering each after the commit.
//!
//! [`Store::append`], [`Store::append_fenced`], [`Store::append_and_set_status`] and
//! [`Store::set_status`] send a [`Pending`] write to the task and wait for its answer. The task
//! takes what queued up while the database was busy (at most [`MAX_BATCH`] writes), applies it
//! in one transaction in arrival order (sorted by session on PostgreSQL so that two nodes lock
//! session rows in the same order), commits once, and only then answers each write: nothing is
//! reported before it is durable. Live deltas never come here.
//!
//! A write that cannot apply (an unknown session, a stale `expected_last_seq`, a lease another
//! worker took over) is refused alone: its checks come before it writes anything, so the rest
//! of the batch still commits. If the transaction itself fails (the connection broke, a
//! deadlock with another node), every write of the batch is retried in a transaction of its
//! own, so one bad write never fails its neighbours.
//!
//! SQLite has one writer connection, so one batch is in flight at a time; PostgreSQL runs up to
//! [`POSTGRES_IN_FLIGHT`] batches at once on its pool (appends to one session still serialise on
//! the session's row). Under light load a batch holds one write and costs what a plain
//! transaction costs; under load the commits per write fall with the batch size.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use crate::db::{Dialect, RowExt, from_db, in_write_tx, to_db};
use crate::store::{Inner, Store};
use crate::{Lease, StoreError};
use agentry_types::SessionId;

/// The most writes one transaction takes.
pub(crate) const MAX_BATCH: usize = 256;

/// How many batches PostgreSQL commits at once.
pub(crate) const POSTGRES_IN_FLIGHT: usize = 4;

/// Event rows per `INSERT` statement (5 parameters each, well under either database's limit).
const ROWS_PER_INSERT: usize = 500;

/// One write for the writer task: events to append to a session (possibly none) and/or a new
/// status for it.
#[derive(Debug)]
pub(crate) struct Write {
    pub(crate) session: SessionId,
    pub(crate) expected_last_seq: Option<u64>,
    /// `(kind, payload as JSON text)`, already validated.
    pub(crate) events: Vec<(String, String)>,
    pub(crate) lease: Option<Lease>,
    /// The session's new status, already validated.
    pub(crate) status: Option<String>,
    /// The time the events are stamped with, Unix milliseconds.
    pub(crate) now: u64,
}

/// A write waiting in the queue, with where its answer goes: the session's last seq after the
/// write, or why it was refused.
struct Pending {
    write: Write,
    reply: oneshot::Sender<Result<u64, StoreError>>,
}

/// How many writes the writer task committed, in how many transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CommitCounts {
    /// Appends and status changes applied (refused ones not counted).
    pub writes: u64,
    /// Transactions committed for them.
    pub commits: u64,
}

#[derive(Debug, Default)]
struct Counters {
    writes: AtomicU64,
    commits: AtomicU64,
}

/// The sending side of a store's writer task.
#[derive(Debug, Clone)]
pub(crate) struct GroupWriter {
    sender: mpsc::UnboundedSender<Pending>,
    counters: Arc<Counters>,
}

impl GroupWriter {
    /// Starts the writer task of the store behind `inner`. The task holds the store only while
    /// it commits a batch, so it ends once every [`Store`] clone is gone.
    pub(crate) fn start(inner: Weak<Inner>, in_flight: usize) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        tokio::spawn(run(
            inner,
            receiver,
            in_flight.max(1),
            Arc::clone(&counters),
        ));
        Self { sender, counters }
    }

    /// The writes and commits so far.
    pub(crate) fn counts(&self) -> CommitCounts {
        CommitCounts {
            writes: self.counters.writes.load(Ordering::Relaxed),
            commits: self.counters.commits.load(Ordering::Relaxed),
        }
    }

    /// Queues `write` for the task and waits until it is committed (or refused): the session's
    /// last seq after it.
    pub(crate) async fn write(&self, write: Write) -> Result<u64, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.sender
            .send(Pending { write, reply })
            .map_err(|_| closed())?;
        answer.await.map_err(|_| closed())?
    }
}

/// The answer when the writer task is gone: the store was closed or dropped.
fn closed() -> StoreError {
    StoreError::Database(sqlx::Error::PoolClosed)
}

async fn run(
    inner: Weak<Inner>,
    mut receiver: mpsc::UnboundedReceiver<Pending>,
    limit: usize,
    counters: Arc<Counters>,
) {
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            first = receiver.recv(), if in_flight.len() < limit => {
                let Some(first) = first else { break };
                let mut batch = vec![first];
                while batch.len() < MAX_BATCH {
                    match receiver.try_recv() {
                        Ok(write) => batch.push(write),
                        Err(_) => break,
                    }
                }
                let Some(inner) = inner.upgrade() else {
                    // Every store is gone; the waiting writes hear that the writer stopped.
                    break;
                };
                in_flight.push(commit(Store { inner }, batch, &counters));
            }
        }
    }
    while in_flight.next().await.is_some() {}
}

/// Commits `batch` in one transaction and answers each write; after a failed transaction, each
/// write alone.
async fn commit(store: Store, mut batch: Vec<Pending>, counters: &Counters) {
    if store.backend() == crate::Backend::Postgres {
        // The same lock order on every node: no deadlock between two batches. The sort is
        // stable, so one session's writes keep their order.
        batch.sort_by_key(|pending| pending.write.session);
    }
    let outcome = apply(&store, &batch).await;
    if let Ok(results) = &outcome {
        counters.commits.fetch_add(1, Ordering::Relaxed);
        let applied = results.iter().filter(|result| result.is_ok()).count();
        counters.writes.fetch_add(applied as u64, Ordering::Relaxed);
    }
    match outcome {
        Ok(results) => {
            for (pending, result) in batch.into_iter().zip(results) {
                let _ = pending.reply.send(result);
            }
        }
        Err(error) if batch.len() == 1 => {
            if let Some(pending) = batch.pop() {
                let _ = pending.reply.send(Err(error));
            }
        }
        Err(error) => {
            tracing::warn!(
                writes = batch.len(),
                "a group commit failed ({error}); retrying its writes one by one"
            );
            for pending in batch {
                let result = match apply(&store, std::slice::from_ref(&pending)).await {
                    Ok(mut results) => {
                        counters.commits.fetch_add(1, Ordering::Relaxed);
                        let result = results.pop().unwrap_or_else(|| Err(closed()));
                        if result.is_ok() {
                            counters.writes.fetch_add(1, Ordering::Relaxed);
                        }
                        result
                    }
                    Err(error) => Err(error),
                };
                let _ = pending.reply.send(result);
            }
        }
    }
}

/// One transaction for `batch`: the outer error when it could not commit, else each write's
/// own result.
async fn apply(
    store: &Store,
    batch: &[Pending],
) -> Result<Vec<Result<u64, StoreError>>, StoreError> {
    let mut results = Vec::with_capacity(batch.len());
    in_write_tx!(store, |tx, d| {
        let mut rows: Vec<(&str, i64, &str, &str, i64)> = Vec::new();
        let keys: Vec<String> = batch
            .iter()
            .map(|pending| pending.write.session.to_string())
            .collect();
        for (Pending { write, .. }, key) in batch.iter().zip(&keys) {
            if let Some(lease) = &write.lease {
                let held = sqlx::query(d.lease_check_sql())
                    .bind(lease.run_id.to_string())
                    .bind(&lease.worker)
                    .bind(to_db(lease.epoch))
                    .fetch_optional(&mut *tx)
                    .await?;
                if held.is_none() {
                    results.push(Err(StoreError::StaleLease(format!(
                        "run {} is no longer leased to {} (epoch {}): another worker took it over",
                        lease.run_id, lease.worker, lease.epoch
                    ))));
                    continue;
                }
            }
            let count = to_db(write.events.len() as u64);
            // Updating the session row first locks it: concurrent appends to this session from
            // another connection wait here, then see the new last_seq.
            let row = sqlx::query(d.append_update_sql())
                .bind(key)
                .bind(count)
                .bind(to_db(write.now))
                .bind(write.expected_last_seq.map(to_db))
                .bind(write.status.as_deref())
                .fetch_optional(&mut *tx)
                .await?;
            let Some(row) = row else {
                let current = sqlx::query("SELECT last_seq FROM sessions WHERE id = $1")
                    .bind(key)
                    .fetch_optional(&mut *tx)
                    .await?;
                results.push(Err(match current {
                    None => StoreError::NotFound(format!("session {}", write.session)),
                    Some(row) => StoreError::Conflict(format!(
                        "session {} is at seq {}, not the expected {}",
                        write.session,
                        row.int("last_seq")?,
                        write.expected_last_seq.unwrap_or_default()
                    )),
                }));
                continue;
            };
            let last = row.int("last_seq")?;
            let first = last - count + 1;
            for (seq, (kind, payload)) in (first..).zip(&write.events) {
                rows.push((key, seq, kind, payload, to_db(write.now)));
            }
            results.push(Ok(from_db(last)));
        }
        for chunk in rows.chunks(ROWS_PER_INSERT) {
            // Only placeholders vary, no value is spelled into the text.
            let mut insert = sqlx::query(sqlx::AssertSqlSafe(insert_sql(chunk.len())));
            for (key, seq, kind, payload, created_at) in chunk {
                insert = insert
                    .bind(*key)
                    .bind(*seq)
                    .bind(*kind)
                    .bind(*payload)
                    .bind(*created_at);
            }
            insert.execute(&mut *tx).await?;
        }
    });
    Ok(results)
}

impl Dialect {
    /// Advances a session's `last_seq` by `$2` events stamped `$3` (the activity time moves only
    /// when there are events), only while `last_seq` is `$4` when that is given, and sets its
    /// status to `$5` when that is given; returns the new `last_seq`.
    fn append_update_sql(self) -> &'static str {
        match self {
            Self::Sqlite => {
                "UPDATE sessions SET last_seq = last_seq + $2, \
                 last_activity = CASE WHEN $2 > 0 THEN $3 ELSE last_activity END, \
                 status = COALESCE($5, status) \
                 WHERE id = $1 AND ($4 IS NULL OR last_seq = $4) RETURNING last_seq"
            }
            Self::Postgres => {
                "UPDATE sessions SET last_seq = last_seq + $2, \
                 last_activity = CASE WHEN $2::BIGINT > 0 THEN $3 ELSE last_activity END, \
                 status = COALESCE($5::TEXT, status) \
                 WHERE id = $1 AND ($4::BIGINT IS NULL OR last_seq = $4) RETURNING last_seq"
            }
        }
    }
}

/// `INSERT INTO events … VALUES ($1, …, $5), ($6, …)` for `rows` rows.
fn insert_sql(rows: usize) -> String {
    let mut sql =
        String::from("INSERT INTO events (session_id, seq, kind, payload, created_at) VALUES ");
    for row in 0..rows {
        let base = row * 5;
        if row > 0 {
            sql.push_str(", ");
        }
        sql.push_str(&format!(
            "(${}, ${}, ${}, ${}, ${})",
            base + 1,
            base + 2,
            base + 3,
            base + 4,
            base + 5
        ));
    }
    sql
}

#[cfg(test)]
mod tests {
    use super::insert_sql;

    #[test]
    fn insert_statement_numbers_its_parameters_row_by_row() {
        assert_eq!(
            insert_sql(2),
            "INSERT INTO events (session_id, seq, kind, payload, created_at) VALUES \
             ($1, $2, $3, $4, $5), ($6, $7, $8, $9, $10)"
        );
    }
}
