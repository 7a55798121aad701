//! SQLite's group commit on a thread of its own, with a connection of its own (rusqlite).
//!
//! sqlx's SQLite driver runs each connection on a thread and hands it every query, and every
//! row of every answer, through channels; its pool also pings a connection each time it is
//! handed back. A batch of the group commit took about eight such hops, each a wake-up of one
//! thread by another on a busy machine, and they, not SQLite's work, kept the writer busy. Here
//! a batch is one hop to this thread and one back: the thread runs the batch's statements one
//! after another inside `BEGIN IMMEDIATE … COMMIT` (see
//! [`crate::group_commit::apply_sqlite`]) and answers with each write's result. The writer task
//! sends the next batch while one commits; the thread then commits every batch that queued up
//! in one transaction (each batch again alone if that fails), without waiting for a hop back.
//!
//! The store's other writes still go through sqlx's writer connection. Both sides take the
//! store's write turn (`Db::Sqlite::write_turn`; this thread blocks on it) first, so they take
//! turns in process instead of
//! meeting in SQLite's busy handler, which sleeps; another process on the same file still waits
//! on the busy timeout.

use std::path::PathBuf;
use std::sync::mpsc;

use rusqlite::types::{ToSqlOutput, Value, ValueRef};
use tokio::sync::oneshot;

use crate::StoreError;
use crate::db::RowExt;
use crate::group_commit::Write;

/// Each write's result, `None` where the batch left it unanswered.
pub(crate) type Results = Vec<Option<Result<u64, StoreError>>>;

/// What the thread gives back for a batch: its writes (for a retry one by one), their results
/// and whether the transaction committed.
pub(crate) struct Applied {
    pub(crate) writes: Vec<Write>,
    pub(crate) results: Results,
    pub(crate) outcome: Result<(), StoreError>,
}

enum Job {
    Batch {
        writes: Vec<Write>,
        results: Results,
        reply: oneshot::Sender<Applied>,
    },
    /// SQLite's `synchronous` setting on the connection (for a test).
    #[cfg(test)]
    Synchronous(oneshot::Sender<Result<i64, StoreError>>),
    /// The store is closing: the connection is closed and the thread ends.
    Close,
}

/// How the thread opens its connection.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The store's write turn, held around each transaction.
    pub(crate) write_turn: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// The database file (created and migrated by the store first).
    pub(crate) path: PathBuf,
    /// `NORMAL` or `FULL`.
    pub(crate) synchronous: &'static str,
    pub(crate) busy_timeout: std::time::Duration,
    /// Prepared statements kept (the group commit's are spelled per row count).
    pub(crate) statement_cache: usize,
}

/// The sending side of the thread; the thread ends when this is dropped or closed.
#[derive(Debug)]
pub(crate) struct SqliteCommitter {
    jobs: mpsc::Sender<Job>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            Self::Batch { .. } => "Batch",
            #[cfg(test)]
            Self::Synchronous(_) => "Synchronous",
            Self::Close => "Close",
        })
    }
}

impl SqliteCommitter {
    /// Starts the thread. Its connection is opened at the first batch (and again after a
    /// failure that may have left it unusable).
    pub(crate) fn start(settings: Settings) -> Result<Self, StoreError> {
        let (jobs, receiver) = mpsc::channel();
        std::thread::Builder::new()
            .name("agentry-sqlite-commit".into())
            .spawn(move || serve(&settings, &receiver))
            .map_err(|error| StoreError::io("starting SQLite's group-commit thread", error))?;
        Ok(Self { jobs })
    }

    /// Applies `writes` in one transaction on the thread (`results` holds the answers already
    /// known, which are left alone).
    pub(crate) async fn apply(&self, writes: Vec<Write>, results: Results) -> Applied {
        let (reply, answer) = oneshot::channel();
        if let Err(mpsc::SendError(job)) = self.jobs.send(Job::Batch {
            writes,
            results,
            reply,
        }) {
            // The thread has ended: the store was closed.
            let (writes, results) = match job {
                Job::Batch {
                    writes, results, ..
                } => (writes, results),
                _ => (Vec::new(), Vec::new()),
            };
            return Applied {
                writes,
                results,
                outcome: Err(crate::group_commit::closed()),
            };
        }
        match answer.await {
            Ok(applied) => applied,
            // The thread never drops a batch unanswered; if it died, nothing of it is known.
            Err(_) => Applied {
                writes: Vec::new(),
                results: Vec::new(),
                outcome: Err(crate::group_commit::closed()),
            },
        }
    }

    /// Closes the connection and ends the thread once the batches sent before are done.
    pub(crate) fn close(&self) {
        let _ = self.jobs.send(Job::Close);
    }

    /// SQLite's `synchronous` on the thread's connection: 1 `NORMAL`, 2 `FULL`.
    #[cfg(test)]
    pub(crate) async fn synchronous(&self) -> Result<i64, StoreError> {
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job::Synchronous(reply))
            .map_err(|_| crate::group_commit::closed())?;
        answer.await.map_err(|_| crate::group_commit::closed())?
    }
}

/// A batch waiting on the thread, with where its answer goes.
struct Queued {
    writes: Vec<Write>,
    results: Results,
    reply: oneshot::Sender<Applied>,
}

/// The thread: until the store closes or is dropped, takes the batches that queued up (the
/// writer task sends the next while one commits) and commits them together; a job of
/// another kind is answered after the batches before it.
fn serve(settings: &Settings, jobs: &mpsc::Receiver<Job>) {
    let mut connection: Option<rusqlite::Connection> = None;
    let mut next: Option<Job> = None;
    loop {
        let job = match next.take() {
            Some(job) => job,
            None => match jobs.recv() {
                Ok(job) => job,
                Err(_) => break,
            },
        };
        match job {
            Job::Close => break,
            Job::Batch {
                writes,
                results,
                reply,
            } => {
                let mut queued = vec![Queued {
                    writes,
                    results,
                    reply,
                }];
                while let Ok(job) = jobs.try_recv() {
                    match job {
                        Job::Batch {
                            writes,
                            results,
                            reply,
                        } => queued.push(Queued {
                            writes,
                            results,
                            reply,
                        }),
                        other => {
                            next = Some(other);
                            break;
                        }
                    }
                }
                let _turn = settings.write_turn.blocking_lock();
                commit_together(&mut connection, settings, queued);
            }
            #[cfg(test)]
            Job::Synchronous(reply) => {
                let answer = open(&mut connection, settings).and_then(|open| {
                    Ok(open.query_row("PRAGMA synchronous", [], |row| row.get(0))?)
                });
                let _ = reply.send(answer);
            }
        }
    }
}

/// Commits `queued` in one transaction and answers each batch; if that fails (and there were
/// several), each batch in a transaction of its own, so that each hears its own error.
fn commit_together(
    connection: &mut Option<rusqlite::Connection>,
    settings: &Settings,
    mut queued: Vec<Queued>,
) {
    if queued.len() > 1 {
        let sizes: Vec<usize> = queued.iter().map(|batch| batch.writes.len()).collect();
        let mut writes = Vec::with_capacity(sizes.iter().sum());
        let mut results = Vec::with_capacity(writes.capacity());
        for batch in &mut queued {
            writes.append(&mut batch.writes);
            results.append(&mut batch.results);
        }
        let unanswered: Vec<bool> = results.iter().map(Option::is_none).collect();
        let outcome = commit_one(connection, settings, &writes, &mut results);
        let ok = outcome.is_ok();
        if !ok {
            // Nothing was committed: the answers the transaction gave are void, and each batch
            // goes again alone.
            for (result, unanswered) in results.iter_mut().zip(unanswered) {
                if unanswered {
                    *result = None;
                }
            }
        }
        let mut writes = writes.into_iter();
        let mut results = results.into_iter();
        for (batch, size) in queued.iter_mut().zip(sizes) {
            batch.writes = writes.by_ref().take(size).collect();
            batch.results = results.by_ref().take(size).collect();
        }
        if ok {
            for batch in queued {
                let _ = batch.reply.send(Applied {
                    writes: batch.writes,
                    results: batch.results,
                    outcome: Ok(()),
                });
            }
            return;
        }
    }
    for mut batch in queued {
        let outcome = commit_one(connection, settings, &batch.writes, &mut batch.results);
        let _ = batch.reply.send(Applied {
            writes: batch.writes,
            results: batch.results,
            outcome,
        });
    }
}

/// One transaction on the thread's connection (opened if need be): `writes`, with `results`
/// filled in.
fn commit_one(
    connection: &mut Option<rusqlite::Connection>,
    settings: &Settings,
    writes: &[Write],
    results: &mut Results,
) -> Result<(), StoreError> {
    let open = open(connection, settings)?;
    let outcome = in_transaction(open, writes, results);
    if !open.is_autocommit() {
        // A transaction left open cannot stay on the connection; one that cannot be rolled
        // back takes the connection with it.
        *connection = None;
    }
    outcome
}

/// The thread's connection, opened if it is not.
fn open<'c>(
    connection: &'c mut Option<rusqlite::Connection>,
    settings: &Settings,
) -> Result<&'c rusqlite::Connection, StoreError> {
    if connection.is_none() {
        let opened = rusqlite::Connection::open(&settings.path)?;
        opened.busy_timeout(settings.busy_timeout)?;
        opened.pragma_update(None, "foreign_keys", "ON")?;
        opened.pragma_update(None, "synchronous", settings.synchronous)?;
        opened.set_prepared_statement_cache_capacity(settings.statement_cache);
        *connection = Some(opened);
    }
    connection.as_ref().ok_or_else(crate::group_commit::closed)
}

/// `BEGIN IMMEDIATE`, the batch, `COMMIT`; rolled back after a failure. IMMEDIATE takes the
/// write lock at once, so a transaction never fails half-way because another connection
/// (another process) wrote first.
fn in_transaction(
    connection: &rusqlite::Connection,
    writes: &[Write],
    results: &mut Results,
) -> Result<(), StoreError> {
    connection.execute_batch("BEGIN IMMEDIATE")?;
    let outcome =
        crate::group_commit::apply_sqlite(&mut Statements { connection }, writes, results)
            .and_then(|()| Ok(connection.execute_batch("COMMIT")?));
    if outcome.is_err() && !connection.is_autocommit() {
        let _ = connection.execute_batch("ROLLBACK");
    }
    outcome
}

/// The statements of one batch, run on the thread's connection.
pub(crate) struct Statements<'c> {
    connection: &'c rusqlite::Connection,
}

impl Statements<'_> {
    /// Runs `script`'s statements in order; the rows of the last one.
    pub(crate) fn fetch_all(&mut self, script: Script<'_>) -> Result<Vec<Row>, StoreError> {
        let mut rows = Vec::new();
        let count = script.statements.len();
        for (place, (sql, parameters)) in script.statements.iter().enumerate() {
            let mut statement = self.connection.prepare_cached(sql)?;
            if place + 1 < count {
                statement.execute(rusqlite::params_from_iter(parameters.iter()))?;
                continue;
            }
            let names: std::sync::Arc<[String]> = statement
                .column_names()
                .into_iter()
                .map(str::to_owned)
                .collect();
            let mut answer = statement.query(rusqlite::params_from_iter(parameters.iter()))?;
            while let Some(row) = answer.next()? {
                let values = (0..names.len())
                    .map(|column| row.get::<_, Value>(column))
                    .collect::<Result<Vec<_>, _>>()?;
                rows.push(Row {
                    names: std::sync::Arc::clone(&names),
                    values,
                });
            }
        }
        Ok(rows)
    }
}

/// Statements with their parameters, bound in order to each statement's anonymous `?`s.
#[derive(Default)]
pub(crate) struct Script<'a> {
    statements: Vec<(std::sync::Arc<str>, Vec<ToSqlOutput<'a>>)>,
}

impl<'a> Script<'a> {
    /// A script of the one statement `sql`.
    pub(crate) fn of(sql: impl Into<std::sync::Arc<str>>) -> Self {
        let mut script = Self::default();
        script.statement(sql);
        script
    }

    /// Adds the statement `sql` (its parameters are bound next, in order).
    pub(crate) fn statement(&mut self, sql: impl Into<std::sync::Arc<str>>) {
        self.statements.push((sql.into(), Vec::new()));
    }

    /// Binds the next parameter of the last statement.
    pub(crate) fn bind(&mut self, value: impl Parameter<'a>) {
        if let Some((_, parameters)) = self.statements.last_mut() {
            parameters.push(value.sql());
        }
    }
}

/// A value bound to a statement of a [`Script`], borrowed where it can be.
pub(crate) trait Parameter<'a> {
    fn sql(self) -> ToSqlOutput<'a>;
}

impl<'a> Parameter<'a> for &'a str {
    fn sql(self) -> ToSqlOutput<'a> {
        ToSqlOutput::Borrowed(ValueRef::Text(self.as_bytes()))
    }
}

impl<'a> Parameter<'a> for &'a String {
    fn sql(self) -> ToSqlOutput<'a> {
        self.as_str().sql()
    }
}

impl<'a> Parameter<'a> for String {
    fn sql(self) -> ToSqlOutput<'a> {
        ToSqlOutput::Owned(Value::Text(self))
    }
}

impl<'a> Parameter<'a> for i64 {
    fn sql(self) -> ToSqlOutput<'a> {
        ToSqlOutput::Owned(Value::Integer(self))
    }
}

impl<'a> Parameter<'a> for bool {
    fn sql(self) -> ToSqlOutput<'a> {
        i64::from(self).sql()
    }
}

impl<'a, T: Parameter<'a>> Parameter<'a> for Option<T> {
    fn sql(self) -> ToSqlOutput<'a> {
        match self {
            Some(value) => value.sql(),
            None => ToSqlOutput::Owned(Value::Null),
        }
    }
}

/// One row of an answer, read by column name.
pub(crate) struct Row {
    names: std::sync::Arc<[String]>,
    values: Vec<Value>,
}

impl Row {
    fn value(&self, name: &str) -> Result<&Value, StoreError> {
        self.names
            .iter()
            .position(|column| column == name)
            .and_then(|column| self.values.get(column))
            .ok_or_else(|| StoreError::Corrupt(format!("no column {name:?} in the answer")))
    }

    fn mismatch(name: &str, value: &Value, wanted: &str) -> StoreError {
        StoreError::Corrupt(format!("column {name:?} holds {value:?}, not {wanted}"))
    }
}

/// The same typed access as the store's sqlx rows.
impl RowExt for Row {
    fn int(&self, column: &str) -> Result<i64, StoreError> {
        self.opt_int(column)?
            .ok_or_else(|| StoreError::Corrupt(format!("column {column:?} is NULL")))
    }

    fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Integer(value) => Ok(Some(*value)),
            other => Err(Self::mismatch(column, other, "an integer")),
        }
    }

    fn text(&self, column: &str) -> Result<String, StoreError> {
        self.opt_text(column)?
            .ok_or_else(|| StoreError::Corrupt(format!("column {column:?} is NULL")))
    }

    fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Text(text) => Ok(Some(text.clone())),
            other => Err(Self::mismatch(column, other, "text")),
        }
    }

    fn blob(&self, column: &str) -> Result<Vec<u8>, StoreError> {
        match self.value(column)? {
            Value::Blob(bytes) => Ok(bytes.clone()),
            other => Err(Self::mismatch(column, other, "a blob")),
        }
    }
}
