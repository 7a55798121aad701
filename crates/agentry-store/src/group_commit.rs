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
//! SQLite has one writer: batches are applied one after another as a few statements on the
//! group commit's own connection and thread ([`crate::sqlite_commit`]), which takes the two
//! the task may have in flight together when both are waiting. PostgreSQL applies
//! a batch in one call of the `agentry_group_commit` function (schema migrations 11 and 12), one
//! round trip, and runs up to [`POSTGRES_IN_FLIGHT`] batches at once on pooled connections it
//! keeps between batches (appends to one session still serialise on the session's row).
//! Under light load a batch holds one write and costs what a plain transaction costs; under
//! load the commits per write fall with the batch size.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use crate::db::{Db, RowExt, from_db, to_db};
use crate::sqlite_commit::{Script, Statements};
use crate::store::{Inner, Store};
use crate::{Lease, StoreError};
use agentry_types::SessionId;
use sqlx::Row as _;

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
    /// The model calls among `events` (by index) to record in the usage ledger.
    pub(crate) usage: Vec<(usize, crate::UsageEntry)>,
    /// What `events` say of their runs' records (runs started in their sessions).
    pub(crate) runs: Vec<crate::RunMark>,
    pub(crate) lease: Option<Lease>,
    /// The session's new status, already validated.
    pub(crate) status: Option<String>,
    /// The process writing (its incarnation): a session another process is running refuses
    /// the write, and a write that sets `running` makes the session this process's.
    pub(crate) worker: Option<Arc<str>>,
    /// The time the events are stamped with, Unix milliseconds.
    pub(crate) now: u64,
    /// Create the session with these columns first (then write `events` and `status` to it,
    /// if any: a session created with its first run's start).
    pub(crate) create: Option<NewRow>,
}

/// The columns of a session to create (status `idle`, no events), already validated.
#[derive(Debug)]
pub(crate) struct NewRow {
    pub(crate) title: Option<String>,
    pub(crate) expires_at: Option<u64>,
    /// JSON text.
    pub(crate) metadata: String,
    pub(crate) owner: Option<String>,
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
    /// Microseconds the writer spent applying and committing batches (failed ones included),
    /// summed over the batches in flight: over a stretch of wall time, how busy the writer
    /// was (on SQLite, one batch at a time, at most 100 %).
    pub busy_micros: u64,
}

#[derive(Debug, Default)]
struct Counters {
    writes: AtomicU64,
    commits: AtomicU64,
    busy_micros: AtomicU64,
}

/// The sending side of a store's writer task.
#[derive(Debug, Clone)]
pub(crate) struct GroupWriter {
    sender: mpsc::UnboundedSender<Pending>,
    counters: Arc<Counters>,
    /// A kept PostgreSQL connection idle this long is pinged before use.
    ping_after_idle: Duration,
    /// Wakes the task to give back the connections it keeps.
    release: Arc<tokio::sync::Notify>,
}

/// How the writer task works.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Batches committed at once (SQLite: 1).
    pub(crate) in_flight: usize,
    /// PostgreSQL connections kept from one batch to the next (at most `in_flight`).
    pub(crate) keep: usize,
    /// A kept connection idle this long is pinged before use.
    pub(crate) ping_after_idle: Duration,
}

impl GroupWriter {
    /// Starts the writer task of the store behind `inner`. The task holds the store only while
    /// it commits a batch, so it ends once every [`Store`] clone is gone.
    pub(crate) fn start(inner: Weak<Inner>, limits: Limits) -> Self {
        let (sender, receiver) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let release = Arc::new(tokio::sync::Notify::new());
        tokio::spawn(run(
            inner,
            receiver,
            limits,
            Arc::clone(&counters),
            Arc::clone(&release),
        ));
        Self {
            sender,
            counters,
            ping_after_idle: limits.ping_after_idle,
            release,
        }
    }

    /// Gives the connections the writer keeps back to the pool (the store is closing: the
    /// pool waits for them).
    pub(crate) fn release_connections(&self) {
        self.release.notify_one();
    }

    /// The writes and commits so far.
    pub(crate) fn counts(&self) -> CommitCounts {
        CommitCounts {
            writes: self.counters.writes.load(Ordering::Relaxed),
            commits: self.counters.commits.load(Ordering::Relaxed),
            busy_micros: self.counters.busy_micros.load(Ordering::Relaxed),
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
pub(crate) fn closed() -> StoreError {
    StoreError::Database(sqlx::Error::PoolClosed)
}

async fn run(
    inner: Weak<Inner>,
    mut receiver: mpsc::UnboundedReceiver<Pending>,
    limits: Limits,
    counters: Arc<Counters>,
    release: Arc<tokio::sync::Notify>,
) {
    let limit = limits.in_flight.max(1);
    let mut in_flight = FuturesUnordered::new();
    let mut kept: Vec<KeptConnection> = Vec::new();
    // Once the store closes, connections go back to the pool after their batch.
    let mut closing = false;
    loop {
        tokio::select! {
            Some(connection) = in_flight.next(), if !in_flight.is_empty() => {
                if !closing && kept.len() < limits.keep {
                    kept.extend(connection);
                }
            }
            () = release.notified(), if !closing => {
                closing = true;
                kept.clear();
            }
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
                in_flight.push(commit(Store { inner }, batch, &counters, kept.pop()));
            }
        }
    }
    while in_flight.next().await.is_some() {}
}

/// A pooled PostgreSQL connection the writer keeps from one batch to the next instead of
/// handing it back: the pool pings every connection handed back to it (sqlx 0.9,
/// `return_to_pool`), one more round trip to the server per batch. A kept connection goes back
/// to the pool after any error, and one idle for the store's `ping_after_idle` is pinged before
/// use (the server may have closed it).
struct KeptConnection {
    connection: sqlx::pool::PoolConnection<sqlx::Postgres>,
    /// When its last batch ended.
    used: Instant,
}

/// Commits `batch` in one transaction and answers each write; after a failed transaction, each
/// write alone. Gives back the PostgreSQL connection to keep for the next batch, if any.
async fn commit(
    store: Store,
    mut batch: Vec<Pending>,
    counters: &Counters,
    mut connection: Option<KeptConnection>,
) -> Option<KeptConnection> {
    if store.backend() == crate::Backend::Postgres {
        // The same lock order on every node: no deadlock between two batches. The sort is
        // stable, so one session's writes keep their order.
        batch.sort_by_key(|pending| pending.write.session);
    }
    let (writes, mut replies): (Vec<Write>, Vec<_>) = batch
        .into_iter()
        .map(|pending| (pending.write, pending.reply))
        .unzip();
    let (writes, outcome) = timed_apply(&store, writes, counters, &mut connection).await;
    if let Ok(results) = &outcome {
        counters.commits.fetch_add(1, Ordering::Relaxed);
        let applied = results.iter().filter(|result| result.is_ok()).count();
        counters.writes.fetch_add(applied as u64, Ordering::Relaxed);
    }
    match outcome {
        Ok(results) => {
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
        Err(error) if replies.len() == 1 => {
            if let Some(reply) = replies.pop() {
                let _ = reply.send(Err(error));
            }
        }
        Err(error) if writes.len() != replies.len() => {
            // The SQLite thread is gone with the writes: the store was closed.
            tracing::warn!(writes = replies.len(), "a group commit failed ({error})");
            for reply in replies {
                let _ = reply.send(Err(closed()));
            }
        }
        Err(error) => {
            tracing::warn!(
                writes = replies.len(),
                "a group commit failed ({error}); retrying its writes one by one"
            );
            for (write, reply) in writes.into_iter().zip(replies) {
                let result = match timed_apply(&store, vec![write], counters, &mut connection)
                    .await
                    .1
                {
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
                let _ = reply.send(result);
            }
        }
    }
    connection
}

/// [`apply`], its time added to the writer's busy time (before any write is answered).
async fn timed_apply(
    store: &Store,
    batch: Vec<Write>,
    counters: &Counters,
    connection: &mut Option<KeptConnection>,
) -> (Vec<Write>, Result<Vec<Result<u64, StoreError>>, StoreError>) {
    let begun = Instant::now();
    let outcome = apply(store, batch, connection).await;
    store.inner.room.note(&outcome.1);
    let busy = u64::try_from(begun.elapsed().as_micros()).unwrap_or(u64::MAX);
    counters.busy_micros.fetch_add(busy, Ordering::Relaxed);
    outcome
}

/// Adds to `script` the statements keeping the records of the runs the batch's events started
/// or moved (runs started in their sessions, see [`crate::RunMark`]): one insert of the new
/// ones (a run with a record keeps it), then one update of the states they reach
/// ([`run_states`]). `marks` holds `(session, now, mark)` in batch order.
fn keep_run_records<'a>(script: &mut Script<'a>, marks: &[(&'a str, i64, &'a crate::RunMark)]) {
    let started: Vec<(&str, i64, &agentry_types::RunId, Option<&str>)> = marks
        .iter()
        .filter_map(|(session, now, mark)| match mark {
            crate::RunMark::Started { run_id, agent_id } => {
                Some((*session, *now, run_id, agent_id.as_deref()))
            }
            crate::RunMark::Now { .. } => None,
        })
        .collect();
    for chunk in started.chunks(RUN_ROWS_PER_INSERT) {
        script.statement(RUN_INSERT_SQL.text(chunk.len()));
        for (session, now, run_id, agent_id) in chunk {
            script.bind(run_id.to_string());
            script.bind(*session);
            script.bind(*agent_id);
            script.bind(*now);
            script.bind(*now);
            script.bind(*session);
        }
    }
    let states = run_states(marks);
    for chunk in states.chunks(SQLITE_RUN_ROWS_PER_UPDATE) {
        script.statement(RUN_STATE_SQL.text(chunk.len()));
        for (run_id, state, now) in chunk {
            script.bind(run_id.to_string());
            script.bind(state.as_str());
            script.bind(state.is_final());
            script.bind(*now);
        }
    }
}

/// The state each run's record reaches through `marks` (`(session, now, mark)` in batch
/// order), with the time it got there: a record that ends stays ended, so a run's first final
/// state wins, else its last. One `(run, state, now)` per run, in the order first marked.
fn run_states<'a>(
    marks: &[(&str, i64, &'a crate::RunMark)],
) -> Vec<(&'a agentry_types::RunId, crate::RunState, i64)> {
    let mut states: Vec<(&agentry_types::RunId, crate::RunState, i64)> = Vec::new();
    let mut index: std::collections::HashMap<&agentry_types::RunId, usize> =
        std::collections::HashMap::new();
    for (_, now, mark) in marks {
        let crate::RunMark::Now { run_id, state } = mark else {
            continue;
        };
        match index.get(run_id) {
            Some(&at) => {
                if !states[at].1.is_final() {
                    states[at] = (run_id, *state, *now);
                }
            }
            None => {
                index.insert(run_id, states.len());
                states.push((run_id, *state, *now));
            }
        }
    }
    states
}

/// Why the database refused one write of a batch (the others still commit).
#[derive(Debug, PartialEq, Eq)]
enum Refused {
    /// The session to create exists.
    Exists,
    /// The write's run is no longer leased to its writer.
    Lease,
    /// No such session.
    Missing,
    /// Another process (this worker) runs the session.
    Held(String),
    /// The session is at this seq, not the expected one.
    Seq(i64),
}

impl Refused {
    /// What `agentry_group_commit` says (see its migration), if it is a refusal it knows.
    fn parse(reason: &str) -> Option<Self> {
        Some(match reason {
            "exists" => Self::Exists,
            "lease" => Self::Lease,
            "missing" => Self::Missing,
            _ => match reason.split_once(' ')? {
                ("held", worker) => Self::Held(worker.to_owned()),
                ("seq", seq) => Self::Seq(seq.parse().ok()?),
                _ => return None,
            },
        })
    }

    /// The error `write` is answered with.
    fn error(self, write: &Write) -> StoreError {
        let session = write.session;
        match self {
            Self::Exists => StoreError::Conflict(format!("session {session} already exists")),
            Self::Lease => {
                let (run, worker, epoch) = write.lease.as_ref().map_or_else(
                    || (String::new(), "", 0),
                    |lease| (lease.run_id.to_string(), lease.worker.as_ref(), lease.epoch),
                );
                StoreError::StaleLease(format!(
                    "run {run} is no longer leased to {worker} (epoch {epoch}): another worker \
                     took it over"
                ))
            }
            Self::Missing => StoreError::NotFound(format!("session {session}")),
            Self::Held(worker) => StoreError::StaleLease(format!(
                "session {session} is running in another process ({worker})"
            )),
            Self::Seq(seq) => StoreError::Conflict(format!(
                "session {session} is at seq {seq}, not the expected {}",
                write.expected_last_seq.unwrap_or_default()
            )),
        }
    }
}

/// One transaction for `batch`: the outer error when it could not commit, else each write's
/// own result. On PostgreSQL it runs on `connection` (or a new one), left there for the next
/// batch if all went well.
async fn apply(
    store: &Store,
    batch: Vec<Write>,
    connection: &mut Option<KeptConnection>,
) -> (Vec<Write>, Result<Vec<Result<u64, StoreError>>, StoreError>) {
    let mut results: Vec<Option<Result<u64, StoreError>>> = batch.iter().map(|_| None).collect();
    let (batch, results) = match &store.inner.db {
        Db::Sqlite {
            writer, committer, ..
        } => {
            if writer.is_closed() {
                return (batch, Err(closed()));
            }
            let applied = committer.apply(batch, results).await;
            if let Err(error) = applied.outcome {
                return (applied.writes, Err(error));
            }
            (applied.writes, applied.results)
        }
        Db::Postgres(pool) => {
            refuse_second_creations(&batch, &mut results);
            let ping_after_idle = store.inner.writer.ping_after_idle;
            let outcome = match live_connection(pool, connection.take(), ping_after_idle).await {
                Ok(mut live) => apply_postgres(&mut live, &batch, &mut results)
                    .await
                    .map(|()| live),
                Err(error) => Err(error),
            };
            match outcome {
                Ok(live) => {
                    *connection = Some(KeptConnection {
                        connection: live,
                        used: Instant::now(),
                    });
                }
                Err(error) => return (batch, Err(error)),
            }
            (batch, results)
        }
    };
    let results = results
        .into_iter()
        .map(|result| result.unwrap_or_else(|| Err(closed())))
        .collect();
    (batch, Ok(results))
}

/// SQLite: the batch in the transaction the group-commit thread began
/// ([`crate::sqlite_commit`]), a few statements whatever the batch's size: one insert of the
/// new sessions; one read of the leases the writes are fenced by; one statement advancing the
/// session rows per round (a round holds each session at most once; a session's second write
/// in the batch goes in the second round, after the first); the inserts of the events, their
/// usage entries and run records. Fills in the result of each write not yet answered.
pub(crate) fn apply_sqlite(
    tx: &mut Statements<'_>,
    batch: &[Write],
    results: &mut [Option<Result<u64, StoreError>>],
) -> Result<(), StoreError> {
    let keys: Vec<String> = batch
        .iter()
        .map(|write| write.session.to_string())
        .collect();
    refuse_second_creations(batch, results);
    let creates: Vec<usize> = (0..batch.len())
        .filter(|index| batch[*index].create.is_some() && results[*index].is_none())
        .collect();
    let rounds = rounds_of(batch);
    // New sessions first, so that a write to one later in the batch finds it.
    if !creates.is_empty() {
        let mut insert = Script::of(CREATE_SQL.text(creates.len()));
        for index in &creates {
            let write = &batch[*index];
            let Some(new) = &write.create else { continue };
            insert.bind(&keys[*index]);
            insert.bind(new.title.as_deref());
            insert.bind(to_db(write.now));
            insert.bind(to_db(write.now));
            insert.bind(new.expires_at.map(to_db));
            insert.bind(new.metadata.as_str());
            insert.bind(new.owner.as_deref());
        }
        let mut created = std::collections::HashSet::new();
        for row in tx.fetch_all(insert)? {
            created.insert(row.text("id")?);
        }
        for index in creates {
            let write = &batch[index];
            results[index] = if !created.contains(&keys[index]) {
                Some(Err(Refused::Exists.error(write)))
            } else if write.events.is_empty() && write.status.is_none() {
                Some(Ok(0))
            } else {
                // Created: its events and status go in with the rounds.
                None
            };
        }
    }
    // The fences: every leased write's run must still be running under its lease.
    let leased: Vec<&Lease> = batch
        .iter()
        .filter_map(|write| write.lease.as_ref())
        .collect();
    if !leased.is_empty() {
        let mut check = Script::of(LEASES_HELD_SQL.text(leased.len()));
        for lease in &leased {
            check.bind(lease.run_id.to_string());
        }
        let mut held = std::collections::HashSet::new();
        for row in tx.fetch_all(check)? {
            if let Some(worker) = row.opt_text("worker")? {
                held.insert((row.text("id")?, worker, row.int("lease_epoch")?));
            }
        }
        for (index, write) in batch.iter().enumerate() {
            let Some(lease) = &write.lease else {
                continue;
            };
            let key = (
                lease.run_id.to_string(),
                lease.worker.clone(),
                to_db(lease.epoch),
            );
            if !held.contains(&key) {
                results[index] = Some(Err(Refused::Lease.error(write)));
            }
        }
    }
    // The session rows, round by round.
    let mut rows: Vec<EventRow<'_>> = Vec::new();
    let mut usage_rows: Vec<UsageRow<'_>> = Vec::new();
    let mut marks: Vec<(&str, i64, &crate::RunMark)> = Vec::new();
    for round in rounds {
        let round: Vec<usize> = round
            .into_iter()
            .filter(|index| results[*index].is_none())
            .collect();
        if round.is_empty() {
            continue;
        }
        let advances: Vec<Advance<'_>> = round
            .iter()
            .map(|index| {
                let write = &batch[*index];
                Advance {
                    id: &keys[*index],
                    count: to_db(write.events.len() as u64),
                    now: to_db(write.now),
                    expected: write.expected_last_seq.map(to_db),
                    status: write.status.as_deref(),
                    worker: write.worker.as_deref(),
                }
            })
            .collect();
        let last_seqs: std::collections::HashMap<String, i64> =
            advance(tx, &advances)?.into_iter().collect();
        for index in round {
            let write = &batch[index];
            let Some(last) = last_seqs.get(&keys[index]).copied() else {
                let mut read = Script::of("SELECT last_seq, worker FROM sessions WHERE id = ?");
                read.bind(&keys[index]);
                let current = tx.fetch_all(read)?.into_iter().next();
                let refused = match current {
                    None => Refused::Missing,
                    Some(row) => match row.opt_text("worker")? {
                        Some(worker) if Some(worker.as_str()) != write.worker.as_deref() => {
                            Refused::Held(worker)
                        }
                        _ => Refused::Seq(row.int("last_seq")?),
                    },
                };
                results[index] = Some(Err(refused.error(write)));
                continue;
            };
            let first = last - to_db(write.events.len() as u64) + 1;
            for (seq, (kind, payload)) in (first..).zip(&write.events) {
                rows.push(EventRow {
                    session: &keys[index],
                    seq,
                    kind,
                    payload,
                    created_at: to_db(write.now),
                });
            }
            for (offset, entry) in &write.usage {
                usage_rows.push(UsageRow {
                    session: &keys[index],
                    seq: first + to_db(*offset as u64),
                    run: entry.run_id.to_string(),
                    entry,
                    created_at: to_db(write.now),
                });
            }
            marks.extend(
                write
                    .runs
                    .iter()
                    .map(|mark| (keys[index].as_str(), to_db(write.now), mark)),
            );
            results[index] = Some(Ok(from_db(last)));
        }
    }
    // The rows the rounds produced and the commit, as one query.
    let mut last = Script::default();
    for chunk in rows.chunks(ROWS_PER_INSERT) {
        last.statement(INSERT_SQL.text(chunk.len()));
        for row in chunk {
            last.bind(row.session);
            last.bind(row.seq);
            last.bind(row.kind);
            last.bind(row.payload);
            last.bind(row.created_at);
        }
    }
    for chunk in usage_rows.chunks(USAGE_ROWS_PER_INSERT) {
        last.statement(USAGE_INSERT_SQL.text(chunk.len()));
        for row in chunk {
            let usage = &row.entry.usage;
            last.bind(row.session);
            last.bind(row.seq);
            last.bind(row.run.as_str());
            last.bind(row.entry.agent_id.as_deref());
            last.bind(row.entry.model.as_str());
            last.bind(to_db(usage.input_tokens));
            last.bind(to_db(usage.cached_input_tokens));
            last.bind(to_db(usage.cache_creation_input_tokens));
            last.bind(to_db(usage.output_tokens));
            last.bind(to_db(usage.reasoning_tokens));
            last.bind(row.entry.cost_usd.map(crate::usage::nanos_of));
            last.bind(row.created_at);
            last.bind(row.session);
        }
    }
    if !marks.is_empty() {
        keep_run_records(&mut last, &marks);
    }
    tx.fetch_all(last)?;
    Ok(())
}

/// The connection for a PostgreSQL batch: `kept`, pinged first if it sat idle for
/// `ping_after_idle`, else one from the pool. Refused once the store is closed.
async fn live_connection(
    pool: &sqlx::PgPool,
    kept: Option<KeptConnection>,
    ping_after_idle: Duration,
) -> Result<sqlx::pool::PoolConnection<sqlx::Postgres>, StoreError> {
    use sqlx::Connection as _;
    if pool.is_closed() {
        return Err(closed());
    }
    if let Some(mut kept) = kept
        && (kept.used.elapsed() < ping_after_idle || kept.connection.ping().await.is_ok())
    {
        return Ok(kept.connection);
    }
    Ok(pool.acquire().await?)
}

/// PostgreSQL: the whole batch in one call of `agentry_group_commit` (schema migrations 11 and 12),
/// which is its own transaction: one round trip per batch, whatever its size. The writes not
/// yet answered go as arrays, with their events, usage entries and run marks; each gets its
/// session's last seq after it, or why it was refused.
async fn apply_postgres(
    connection: &mut sqlx::PgConnection,
    batch: &[Write],
    results: &mut [Option<Result<u64, StoreError>>],
) -> Result<(), StoreError> {
    let sent: Vec<usize> = (0..batch.len())
        .filter(|index| results[*index].is_none())
        .collect();
    let mut columns = WriteArrays::default();
    let mut events = EventArrays::default();
    let mut usage = UsageArrays::default();
    let mut marks = MarkArrays::default();
    for (number, index) in (1_i32..).zip(&sent) {
        let write = &batch[*index];
        columns.push(write);
        for (place, (kind, payload)) in (1_i64..).zip(&write.events) {
            events.write.push(number);
            events.place.push(place);
            events.kind.push(kind.as_str());
            events.payload.push(payload.as_str());
        }
        for (offset, entry) in &write.usage {
            usage.push(number, to_db(*offset as u64) + 1, entry);
        }
        for mark in &write.runs {
            marks.push(number, mark);
        }
    }
    let row = sqlx::query(
        "SELECT last_seqs, refusals FROM agentry_group_commit(\
         $1::TEXT[], $2::BIGINT[], $3::BIGINT[], $4::BIGINT[], $5::TEXT[], $6::TEXT[], \
         $7::TEXT[], $8::TEXT[], $9::BIGINT[], $10::BOOLEAN[], $11::TEXT[], $12::BIGINT[], \
         $13::TEXT[], $14::TEXT[], $15::INT[], $16::BIGINT[], $17::TEXT[], $18::TEXT[], \
         $19::INT[], $20::BIGINT[], $21::TEXT[], $22::TEXT[], $23::TEXT[], $24::BIGINT[], \
         $25::BIGINT[], $26::BIGINT[], $27::BIGINT[], $28::BIGINT[], $29::BIGINT[], \
         $30::INT[], $31::TEXT[], $32::BOOLEAN[], $33::TEXT[], $34::TEXT[], $35::BOOLEAN[])",
    )
    .bind(columns.session)
    .bind(columns.expected)
    .bind(columns.count)
    .bind(columns.now)
    .bind(columns.status)
    .bind(columns.worker)
    .bind(columns.lease_run)
    .bind(columns.lease_worker)
    .bind(columns.lease_epoch)
    .bind(columns.create)
    .bind(columns.title)
    .bind(columns.expires)
    .bind(columns.metadata)
    .bind(columns.owner)
    .bind(events.write)
    .bind(events.place)
    .bind(events.kind)
    .bind(events.payload)
    .bind(usage.write)
    .bind(usage.place)
    .bind(usage.run)
    .bind(usage.agent)
    .bind(usage.model)
    .bind(usage.input)
    .bind(usage.cached)
    .bind(usage.creation)
    .bind(usage.output)
    .bind(usage.reasoning)
    .bind(usage.cost)
    .bind(marks.write)
    .bind(marks.run)
    .bind(marks.started)
    .bind(marks.agent)
    .bind(marks.state)
    .bind(marks.last)
    .fetch_one(connection)
    .await?;
    let last_seqs: Vec<Option<i64>> = row.try_get("last_seqs")?;
    let refusals: Vec<Option<String>> = row.try_get("refusals")?;
    for (place, index) in sent.into_iter().enumerate() {
        let write = &batch[index];
        results[index] = Some(
            match (
                last_seqs.get(place).copied().flatten(),
                refusals.get(place).cloned().flatten(),
            ) {
                (Some(last), _) => Ok(from_db(last)),
                (None, Some(reason)) => Err(match Refused::parse(&reason) {
                    Some(refused) => refused.error(write),
                    None => StoreError::Corrupt(format!(
                        "the group commit refused a write of session {} for an unknown reason: \
                         {reason}",
                        write.session
                    )),
                }),
                (None, None) => Err(StoreError::Corrupt(format!(
                    "the group commit answered nothing for a write of session {}",
                    write.session
                ))),
            },
        );
    }
    Ok(())
}

/// A PostgreSQL batch's writes, a column each, in the batch's order.
#[derive(Default)]
struct WriteArrays<'a> {
    session: Vec<String>,
    expected: Vec<Option<i64>>,
    count: Vec<i64>,
    now: Vec<i64>,
    status: Vec<Option<&'a str>>,
    worker: Vec<Option<&'a str>>,
    lease_run: Vec<Option<String>>,
    lease_worker: Vec<Option<&'a str>>,
    lease_epoch: Vec<Option<i64>>,
    create: Vec<bool>,
    title: Vec<Option<&'a str>>,
    expires: Vec<Option<i64>>,
    metadata: Vec<Option<&'a str>>,
    owner: Vec<Option<&'a str>>,
}

impl<'a> WriteArrays<'a> {
    fn push(&mut self, write: &'a Write) {
        self.session.push(write.session.to_string());
        self.expected.push(write.expected_last_seq.map(to_db));
        self.count.push(to_db(write.events.len() as u64));
        self.now.push(to_db(write.now));
        self.status.push(write.status.as_deref());
        self.worker.push(write.worker.as_deref());
        let lease = write.lease.as_ref();
        self.lease_run
            .push(lease.map(|lease| lease.run_id.to_string()));
        self.lease_worker
            .push(lease.map(|lease| lease.worker.as_str()));
        self.lease_epoch.push(lease.map(|lease| to_db(lease.epoch)));
        let new = write.create.as_ref();
        self.create.push(new.is_some());
        self.title.push(new.and_then(|new| new.title.as_deref()));
        self.expires
            .push(new.and_then(|new| new.expires_at.map(to_db)));
        self.metadata.push(new.map(|new| new.metadata.as_str()));
        self.owner.push(new.and_then(|new| new.owner.as_deref()));
    }
}

/// A PostgreSQL batch's events, a column each, numbered by their write (from 1) and their
/// place in it (from 1).
#[derive(Default)]
struct EventArrays<'a> {
    write: Vec<i32>,
    place: Vec<i64>,
    kind: Vec<&'a str>,
    payload: Vec<&'a str>,
}

/// A PostgreSQL batch's usage entries, a column each, numbered like [`EventArrays`] by the
/// event each accounts for.
#[derive(Default)]
struct UsageArrays<'a> {
    write: Vec<i32>,
    place: Vec<i64>,
    run: Vec<String>,
    agent: Vec<Option<&'a str>>,
    model: Vec<&'a str>,
    input: Vec<i64>,
    cached: Vec<i64>,
    creation: Vec<i64>,
    output: Vec<i64>,
    reasoning: Vec<i64>,
    cost: Vec<Option<i64>>,
}

impl<'a> UsageArrays<'a> {
    fn push(&mut self, write: i32, place: i64, entry: &'a crate::UsageEntry) {
        let usage = &entry.usage;
        self.write.push(write);
        self.place.push(place);
        self.run.push(entry.run_id.to_string());
        self.agent.push(entry.agent_id.as_deref());
        self.model.push(entry.model.as_str());
        self.input.push(to_db(usage.input_tokens));
        self.cached.push(to_db(usage.cached_input_tokens));
        self.creation.push(to_db(usage.cache_creation_input_tokens));
        self.output.push(to_db(usage.output_tokens));
        self.reasoning.push(to_db(usage.reasoning_tokens));
        self.cost.push(entry.cost_usd.map(crate::usage::nanos_of));
    }
}

/// A PostgreSQL batch's run marks, a column each, numbered by their write.
#[derive(Default)]
struct MarkArrays<'a> {
    write: Vec<i32>,
    run: Vec<String>,
    started: Vec<bool>,
    agent: Vec<Option<&'a str>>,
    state: Vec<Option<&'static str>>,
    last: Vec<bool>,
}

impl<'a> MarkArrays<'a> {
    fn push(&mut self, write: i32, mark: &'a crate::RunMark) {
        self.write.push(write);
        match mark {
            crate::RunMark::Started { run_id, agent_id } => {
                self.run.push(run_id.to_string());
                self.started.push(true);
                self.agent.push(agent_id.as_deref());
                self.state.push(None);
                self.last.push(false);
            }
            crate::RunMark::Now { run_id, state } => {
                self.run.push(run_id.to_string());
                self.started.push(false);
                self.agent.push(None);
                self.state.push(Some(state.as_str()));
                self.last.push(state.is_final());
            }
        }
    }
}

/// Refuses, before the database is asked, each creation of a session that an earlier write of
/// `batch` (not yet answered) creates.
fn refuse_second_creations(batch: &[Write], results: &mut [Option<Result<u64, StoreError>>]) {
    let mut creating = std::collections::HashSet::new();
    for (index, write) in batch.iter().enumerate() {
        if write.create.is_some() && results[index].is_none() && !creating.insert(write.session) {
            results[index] = Some(Err(Refused::Exists.error(write)));
        }
    }
}

/// The batch's writes (creations with nothing more to write aside) in rounds: each round names
/// each session at most once, and a session's writes fall in successive rounds in their
/// order.
fn rounds_of(batch: &[Write]) -> Vec<Vec<usize>> {
    let mut seen: std::collections::HashMap<SessionId, usize> = std::collections::HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (index, write) in batch.iter().enumerate() {
        if write.create.is_some() && write.events.is_empty() && write.status.is_none() {
            continue;
        }
        let round = seen.entry(write.session).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(index);
        *round += 1;
    }
    rounds
}

/// One session row a round advances.
struct Advance<'a> {
    id: &'a str,
    /// Events appended.
    count: i64,
    /// Their time, Unix milliseconds.
    now: i64,
    /// Only while `last_seq` is this, when given.
    expected: Option<i64>,
    /// The new status, when given.
    status: Option<&'a str>,
    /// The process writing.
    worker: Option<&'a str>,
}

/// One usage-ledger row to insert, with its event.
struct UsageRow<'a> {
    session: &'a str,
    seq: i64,
    run: String,
    entry: &'a crate::UsageEntry,
    created_at: i64,
}

/// Usage rows per `INSERT` statement (13 parameters each).
const USAGE_ROWS_PER_INSERT: usize = 64;

/// `INSERT INTO usage_records … VALUES (…), (…)` for `rows` rows of 13 parameters; each row's
/// owner is its session's (the 13th parameter, the session's id again), read in the same
/// statement.
fn usage_insert_sql(rows: usize) -> String {
    owned_rows_sql(
        "INSERT INTO usage_records (session_id, seq, run_id, agent_id, model, input_tokens, \
         cached_input_tokens, cache_creation_input_tokens, output_tokens, reasoning_tokens, \
         cost_nanos, created_at, owner) VALUES ",
        rows,
        12,
        "",
    )
}

/// `head` then `rows` rows of `bound` anonymous placeholders, the owner of the session named by
/// one more (read in the same statement) and the `literals`.
fn owned_rows_sql(head: &str, rows: usize, bound: usize, literals: &str) -> String {
    let row = format!(
        "({}, (SELECT owner FROM sessions WHERE id = ?){literals})",
        sqlite_placeholders(bound)
    );
    let mut sql = String::from(head);
    sql.push_str(&vec![row; rows].join(", "));
    sql
}

/// Rows of new run records per `INSERT` statement (6 parameters each).
const RUN_ROWS_PER_INSERT: usize = 128;

/// `INSERT INTO runs … VALUES (…), (…) ON CONFLICT DO NOTHING` for `rows` new records of runs
/// started in their sessions, 6 parameters each (id, session, agent, created, started, and the
/// session again for its owner, read in the same statement).
fn run_insert_sql(rows: usize) -> String {
    let mut sql = owned_rows_sql(
        "INSERT INTO runs (id, session_id, agent_id, created_at, started_at, owner, state, \
         request_digest, request, background) VALUES ",
        rows,
        5,
        ", 'running', '', 'null', 0",
    );
    sql.push_str(" ON CONFLICT (id) DO NOTHING");
    sql
}

/// One event row to insert.
struct EventRow<'a> {
    session: &'a str,
    seq: i64,
    kind: &'a str,
    payload: &'a str,
    created_at: i64,
}

/// Advances each of `rows`' session's `last_seq` by its count (the activity time moves only
/// when there are events; the status is set when given), only while `last_seq` is its
/// `expected` when that is given. The rows name distinct sessions. Returns `(id, last_seq)` of
/// each row changed: one `UPDATE … FROM (VALUES …)`, which SQLite looks up row by row through
/// the primary key.
fn advance(
    tx: &mut Statements<'_>,
    rows: &[Advance<'_>],
) -> Result<Vec<(String, i64)>, StoreError> {
    let mut update = Script::of(ADVANCE_SQL.text(rows.len()));
    for row in rows {
        update.bind(row.id);
        update.bind(row.count);
        update.bind(row.now);
        update.bind(row.expected);
        update.bind(row.status);
        update.bind(row.worker);
    }
    let mut changed = Vec::with_capacity(rows.len());
    for row in tx.fetch_all(update)? {
        changed.push((row.text("id")?, row.int("last_seq")?));
    }
    Ok(changed)
}

/// SQLite's advance for `rows` rows, each `(id, count, now, expected, status, worker)`.
fn sqlite_advance_sql(rows: usize) -> String {
    let values = sqlite_values(rows, 6);
    format!(
        "UPDATE sessions SET last_seq = sessions.last_seq + v.column2, \
         last_activity = CASE WHEN v.column2 > 0 THEN v.column3 \
         ELSE sessions.last_activity END, \
         status = COALESCE(v.column5, sessions.status), \
         worker = CASE WHEN v.column5 IS NULL THEN sessions.worker \
         WHEN v.column5 = 'running' THEN v.column6 ELSE NULL END \
         FROM (VALUES {values}) AS v \
         WHERE sessions.id = v.column1 \
         AND (v.column4 IS NULL OR sessions.last_seq = v.column4) \
         AND (sessions.worker IS NULL OR sessions.worker = v.column6) \
         RETURNING sessions.id AS id, sessions.last_seq AS last_seq"
    )
}

/// `INSERT INTO sessions …` for `rows` new sessions, each given as `(id, title, now, now,
/// expires_at, metadata, owner)` (`now` twice: created and last active); an id that exists is
/// skipped. Returns the `id` of each row inserted.
fn create_sql(rows: usize) -> String {
    let row = format!("(?, ?, 'idle', ?, ?, 0, 0, {})", sqlite_placeholders(3));
    format!(
        "INSERT INTO sessions (id, title, status, created_at, last_activity, last_seq, \
         read_seq, expires_at, metadata, owner) VALUES {} \
         ON CONFLICT (id) DO NOTHING RETURNING id",
        vec![row; rows].join(", ")
    )
}

/// A SQLite statement of the group commit, spelled for its number of rows: each text is
/// spelled once per process and shared after (a batch's statements are looked up in the
/// connection's statement cache by their text, which must be built first).
pub(crate) struct SpelledSql {
    texts: [std::sync::OnceLock<Arc<str>>; SPELLED_ROWS],
    spell: fn(usize) -> String,
}

/// The row counts whose statements are kept spelled: every count a statement is given (at
/// most [`ROWS_PER_INSERT`] rows, or one per write of a batch of [`MAX_BATCH`]); a statement
/// of more rows would be spelled each time.
const SPELLED_ROWS: usize = 2 * MAX_BATCH;

impl SpelledSql {
    const fn new(spell: fn(usize) -> String) -> Self {
        Self {
            texts: [const { std::sync::OnceLock::new() }; SPELLED_ROWS],
            spell,
        }
    }

    /// The statement for `rows` rows.
    fn text(&self, rows: usize) -> Arc<str> {
        match self.texts.get(rows) {
            Some(text) => Arc::clone(text.get_or_init(|| (self.spell)(rows).into())),
            None => (self.spell)(rows).into(),
        }
    }
}

static CREATE_SQL: SpelledSql = SpelledSql::new(create_sql);
static ADVANCE_SQL: SpelledSql = SpelledSql::new(sqlite_advance_sql);
static INSERT_SQL: SpelledSql = SpelledSql::new(insert_sql);
static USAGE_INSERT_SQL: SpelledSql = SpelledSql::new(usage_insert_sql);
static RUN_INSERT_SQL: SpelledSql = SpelledSql::new(run_insert_sql);
static RUN_STATE_SQL: SpelledSql = SpelledSql::new(run_state_sql);
static LEASES_HELD_SQL: SpelledSql = SpelledSql::new(leases_held_sql);

/// `?, ?, …` for `count` parameters, bound in order: SQLite's anonymous parameters. A SQLite
/// statement with many parameters uses these, because a numbered or named parameter (`$7`) is
/// looked up in a list of all the statement's names, when it is parsed and again when it is
/// bound, which grows with the square of the count.
fn sqlite_placeholders(count: usize) -> String {
    vec!["?"; count].join(", ")
}

/// `(?, …), (?, …)`: `rows` rows of `columns` anonymous parameters, for a SQLite `VALUES`.
fn sqlite_values(rows: usize, columns: usize) -> String {
    vec![format!("({})", sqlite_placeholders(columns)); rows].join(", ")
}

/// Run records per state update (one `UPDATE … FROM (VALUES …)`).
const SQLITE_RUN_ROWS_PER_UPDATE: usize = 64;

/// Moves the records of `rows` runs started in their sessions, each bound `(id, state, final,
/// now)`, to their states (`finished_at` is `now` when the state is final); a record that
/// ended, or a background run's, is left as it is. The rows name distinct runs; each row of
/// the VALUES is looked up by the primary key.
fn run_state_sql(rows: usize) -> String {
    let values = sqlite_values(rows, 4);
    format!(
        "UPDATE runs SET state = v.column2, \
         finished_at = CASE WHEN v.column3 THEN v.column4 ELSE runs.finished_at END \
         FROM (VALUES {values}) AS v WHERE runs.id = v.column1 AND runs.background = 0 \
         AND runs.state NOT IN ('succeeded', 'failed', 'cancelled')"
    )
}

/// `id, worker, lease_epoch` of those of `runs` runs that are running.
fn leases_held_sql(runs: usize) -> String {
    format!(
        "SELECT id, worker, lease_epoch FROM runs WHERE state = 'running' AND id IN ({})",
        sqlite_placeholders(runs)
    )
}

/// SQLite's `INSERT INTO events … VALUES (?, …, ?), (?, …)` for `rows` rows of 5.
fn insert_sql(rows: usize) -> String {
    format!(
        "INSERT INTO events (session_id, seq, kind, payload, created_at) VALUES {}",
        sqlite_values(rows, 5)
    )
}

#[cfg(test)]
mod tests {
    use super::{Refused, insert_sql, run_states, sqlite_advance_sql};
    use sqlx::{AssertSqlSafe, Connection, Row};

    /// `$query` with `$writes` advance rows bound: sessions spread over the table, one event
    /// each, no expected seq, no status.
    macro_rules! bind_spread_writes {
        ($query:expr, $writes:expr) => {{
            let mut query = $query;
            for write in 0..$writes {
                query = query
                    .bind(format!("s{}", write * 300 + 1))
                    .bind(1_i64)
                    .bind(5_i64)
                    .bind(None::<i64>)
                    .bind(None::<String>)
                    .bind(Some("worker"));
            }
            query
        }};
    }

    /// SQLite looks the batch's sessions up by the primary key, not by scanning the table.
    #[tokio::test]
    async fn the_batch_update_uses_the_primary_key_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(dir.path().join("plan.db"))
            .create_if_missing(true);
        let mut db = sqlx::SqliteConnection::connect_with(&options)
            .await
            .unwrap();
        sqlx::raw_sql(
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, status TEXT NOT NULL, \
             last_activity INTEGER NOT NULL, last_seq INTEGER NOT NULL, worker TEXT); \
             WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < 20000) \
             INSERT INTO sessions SELECT 's' || n, 'idle', n, 0, NULL FROM g;",
        )
        .execute(&mut db)
        .await
        .unwrap();
        let writes = 60;
        let sql = format!("EXPLAIN QUERY PLAN {}", sqlite_advance_sql(writes));
        let explain = bind_spread_writes!(sqlx::query(AssertSqlSafe(sql)), writes);
        let plan: Vec<String> = explain
            .fetch_all(&mut db)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<String, _>("detail"))
            .collect();
        let plan = plan.join("\n");
        assert!(!plan.contains("SCAN sessions"), "{plan}");
        assert!(plan.contains("SEARCH sessions"), "{plan}");
    }

    #[test]
    fn sqlite_insert_statement_binds_its_parameters_in_order() {
        assert_eq!(
            insert_sql(2),
            "INSERT INTO events (session_id, seq, kind, payload, created_at) VALUES \
             (?, ?, ?, ?, ?), (?, ?, ?, ?, ?)"
        );
    }

    /// Every SQLite statement of the group commit binds anonymous parameters only (see
    /// [`super::sqlite_placeholders`]), as many as it has rows times its columns; spelled
    /// once per row count.
    #[test]
    fn sqlite_statements_use_anonymous_parameters_only() {
        let spelled: [(&str, &super::SpelledSql, usize); 7] = [
            ("create", &super::CREATE_SQL, 7),
            ("advance", &super::ADVANCE_SQL, 6),
            ("events", &super::INSERT_SQL, 5),
            ("usage", &super::USAGE_INSERT_SQL, 13),
            ("runs", &super::RUN_INSERT_SQL, 6),
            ("states", &super::RUN_STATE_SQL, 4),
            ("leases", &super::LEASES_HELD_SQL, 1),
        ];
        for (name, sql, columns) in spelled {
            for rows in [1, 3, 64] {
                let text = sql.text(rows);
                assert!(!text.contains('$'), "{name}: {text}");
                assert_eq!(text.matches('?').count(), rows * columns, "{name}: {text}");
                assert!(
                    std::sync::Arc::ptr_eq(&text, &sql.text(rows)),
                    "{name} is spelled again"
                );
            }
        }
    }

    #[test]
    fn a_run_record_reaches_its_first_final_state_else_its_last() {
        use crate::{RunMark, RunState};
        use agentry_types::RunId;
        let (a, b, c) = (RunId::new(), RunId::new(), RunId::new());
        let now = |run_id: &RunId, state| RunMark::Now {
            run_id: *run_id,
            state,
        };
        let marks = [
            RunMark::Started {
                run_id: a,
                agent_id: None,
            },
            now(&a, RunState::Waiting),
            now(&b, RunState::Running),
            now(&a, RunState::Running),
            now(&b, RunState::Succeeded),
            now(&c, RunState::Cancelled),
            now(&b, RunState::Running),
            now(&c, RunState::Failed),
        ];
        let marks: Vec<(&str, i64, &RunMark)> = marks
            .iter()
            .enumerate()
            .map(|(at, mark)| ("s", at as i64, mark))
            .collect();
        assert_eq!(
            run_states(&marks),
            [
                (&a, RunState::Running, 3),
                (&b, RunState::Succeeded, 4),
                (&c, RunState::Cancelled, 5),
            ]
        );
    }

    #[test]
    fn the_group_commit_functions_refusals_are_understood() {
        assert_eq!(Refused::parse("exists"), Some(Refused::Exists));
        assert_eq!(Refused::parse("lease"), Some(Refused::Lease));
        assert_eq!(Refused::parse("missing"), Some(Refused::Missing));
        assert_eq!(
            Refused::parse("held node-1 7f3a"),
            Some(Refused::Held("node-1 7f3a".to_owned()))
        );
        assert_eq!(Refused::parse("seq 42"), Some(Refused::Seq(42)));
        assert_eq!(Refused::parse("seq x"), None);
        assert_eq!(Refused::parse("gone"), None);
    }
}
