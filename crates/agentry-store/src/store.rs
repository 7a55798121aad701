//! [`Store`]: opening a database, sessions and their event log.

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use agentry_types::SessionId;
use sqlx::postgres::PgConnectOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqliteSynchronous};

use crate::db::{
    BUSY_TIMEOUT, Db, PING_AFTER_IDLE, RowExt, from_db, in_read_tx, in_write_tx, pool_options,
    to_db, with_reader, with_writer,
};
use crate::group_commit::{CommitCounts, GroupWriter, Limits, NewRow, POSTGRES_IN_FLIGHT, Write};
use crate::model::{now_millis, truncate, validate_event_kind, validate_status};
use crate::{
    Backend, NewEvent, NewSession, SearchHit, SecretKey, SessionQuery, SessionRecord, StoreError,
    StoredEvent,
};

/// How hard SQLite works to keep a committed transaction (PostgreSQL follows the server's own
/// `synchronous_commit` setting). The store always runs SQLite in WAL mode, so neither setting
/// can corrupt the database; they differ in what a crash can take back. An append is answered
/// only after its transaction committed, in both.
///
/// | setting | process crash (kill -9, panic, OOM) | power loss / kernel crash | cost |
/// |---|---|---|---|
/// | `Normal` (`synchronous = NORMAL`) | nothing committed is lost | the last commits before the loss may be rolled back (the database stays consistent) | an fsync per WAL checkpoint, none per commit |
/// | `Full` (`synchronous = FULL`) | nothing committed is lost | nothing committed is lost | an fsync per commit (group commit shares it among the writes of a batch) |
///
/// `OFF` is not offered: a power loss could corrupt the file. `EXTRA` adds nothing in WAL mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous = NORMAL` (the default): a committed event survives a crash of the
    /// process; the last transactions may be lost if the machine loses power.
    #[default]
    Normal,
    /// `synchronous = FULL`: every commit is synced to disk, so it also survives power loss.
    Full,
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// The key that encrypts secrets at rest.
    pub secret_key: SecretKey,
    /// At most this many connections (SQLite: readers, beside the single writer; PostgreSQL:
    /// up to half of them held by the group-commit writer from one batch to the next).
    pub max_connections: u32,
    /// SQLite's durability; see [`Durability`].
    pub durability: Durability,
    /// A pooled connection idle this long is pinged before it is used again (the server may
    /// have closed it meanwhile); one in steady use is not, which saves a round trip per
    /// statement or transaction.
    pub ping_after_idle: Duration,
}

impl StoreOptions {
    /// Options with `secret_key`, 8 connections, [`Durability::Normal`] and a ping after
    /// [`PING_AFTER_IDLE`] idle.
    pub fn new(secret_key: SecretKey) -> Self {
        Self {
            secret_key,
            max_connections: 8,
            durability: Durability::Normal,
            ping_after_idle: PING_AFTER_IDLE,
        }
    }
}

impl Default for StoreOptions {
    /// Options with a random key that lives only as long as this value: secrets stored with it
    /// cannot be read by a later process. Set `secret_key` (for example from
    /// [`SecretKey::load_or_create`]) for anything that persists.
    fn default() -> Self {
        Self::new(SecretKey::ephemeral())
    }
}

/// The columns of `new` as the group commit creates them: its title checked, its metadata as
/// JSON text.
pub(crate) fn new_row(new: &NewSession) -> Result<NewRow, StoreError> {
    if let Some(title) = &new.title {
        validate_title(title)?;
    }
    Ok(NewRow {
        title: new.title.clone(),
        expires_at: new.expires_at,
        metadata: to_json_text(&new.metadata)?,
        owner: new.owner.clone(),
    })
}

/// The event log and configuration store, on SQLite or PostgreSQL. Cloning is cheap: clones
/// share the connection pools.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) db: Db,
    pub(crate) key: SecretKey,
    /// Where appends and status changes go: the group-commit writer task.
    pub(crate) writer: GroupWriter,
    /// The process writing through this store ([`Store::set_worker`]).
    worker: std::sync::RwLock<Option<Arc<str>>>,
    /// The volume of this process's workspaces ([`Store::set_volume`]).
    volume: std::sync::RwLock<Option<Arc<str>>>,
    /// Whether the last writes had room ([`Store::storage_full`]).
    pub(crate) room: Room,
    /// How long past its lease a background run stranded on another volume waits before this
    /// process may take it ([`Store::set_stranded_resume`]).
    stranded_resume: std::sync::RwLock<Option<Duration>>,
}

/// Whether the database had room for the last writes: set by a group commit or a node
/// heartbeat that failed because the storage is full, cleared by the next one that commits.
/// The heartbeat writes every few seconds, so a freed disk is noticed without other traffic.
#[derive(Debug, Default)]
pub(crate) struct Room {
    full: std::sync::Mutex<Option<String>>,
}

impl Room {
    /// Takes note of a write's outcome.
    pub(crate) fn note<T>(&self, outcome: &Result<T, StoreError>) {
        let full = match outcome {
            Ok(_) => None,
            Err(error) if error.is_storage_full() => Some(error.to_string()),
            // Other failures say nothing about room.
            Err(_) => return,
        };
        if let Ok(mut slot) = self.full.lock() {
            *slot = full;
        }
    }

    fn full(&self) -> Option<String> {
        self.full.lock().ok().and_then(|slot| slot.clone())
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend())
            .finish_non_exhaustive()
    }
}

/// The columns of a session row, in the order [`session_from_row`] reads them.
macro_rules! session_columns {
    () => {
        "id, title, status, created_at, last_activity, last_seq, read_seq, parent_id, \
         parent_seq, expires_at, metadata, owner"
    };
}
pub(crate) use session_columns;

impl Store {
    /// Opens (creating if needed) the database at `url` and brings its schema up to date.
    ///
    /// `postgres://…` or `postgresql://…` selects PostgreSQL (connection parameters such as
    /// `sslmode` or `options[search_path]=…` go in the query string); `sqlite://PATH`,
    /// `sqlite:PATH` or a plain file path selects SQLite. In-memory SQLite is refused: the read
    /// pool and the writer would each see a different database.
    pub async fn connect(url: &str, options: StoreOptions) -> Result<Store, StoreError> {
        let url = url.trim();
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            let connect = PgConnectOptions::from_str(url)
                .map_err(|e| StoreError::InvalidInput(format!("invalid PostgreSQL URL: {e}")))?;
            return Self::connect_postgres(connect, options).await;
        }
        if lower.contains(":memory:") || lower.contains("mode=memory") {
            return Err(StoreError::InvalidInput(
                "in-memory SQLite is not supported; give a file path".into(),
            ));
        }
        let connect = if lower.starts_with("sqlite:") {
            SqliteConnectOptions::from_str(url)
                .map_err(|e| StoreError::InvalidInput(format!("invalid SQLite URL: {e}")))?
        } else if url.contains("://") {
            return Err(StoreError::InvalidInput(format!(
                "unsupported database URL {:?}: use postgres://…, sqlite://PATH or a file path",
                truncate(url.split("://").next().unwrap_or_default())
            )));
        } else if url.is_empty() {
            return Err(StoreError::InvalidInput("empty database URL".into()));
        } else {
            SqliteConnectOptions::new().filename(url)
        };
        Self::connect_sqlite(connect, options).await
    }

    /// Opens the SQLite store in an Agentry home folder: `home/agentry.db`, with the secret key
    /// in `home/secret.key` (created on first use, mode 0600). Creates `home` (mode 0700) if it
    /// does not exist.
    pub async fn open_home(home: &Path) -> Result<Store, StoreError> {
        Self::open_home_with(home, Durability::default()).await
    }

    /// [`Store::open_home`] with SQLite's [`Durability`].
    pub async fn open_home_with(home: &Path, durability: Durability) -> Result<Store, StoreError> {
        let home = home.to_path_buf();
        let (home, key) = tokio::task::spawn_blocking(move || {
            if !home.is_dir() {
                let mut builder = std::fs::DirBuilder::new();
                builder.recursive(true);
                #[cfg(unix)]
                {
                    use std::os::unix::fs::DirBuilderExt;
                    builder.mode(0o700);
                }
                builder
                    .create(&home)
                    .map_err(|e| StoreError::io(format!("cannot create {}", home.display()), e))?;
            }
            let key = SecretKey::load_or_create(&home.join("secret.key"))?;
            Ok::<_, StoreError>((home, key))
        })
        .await
        .map_err(|e| StoreError::io("opening the home folder", std::io::Error::other(e)))??;
        let connect = SqliteConnectOptions::new().filename(home.join("agentry.db"));
        let mut options = StoreOptions::new(key);
        options.durability = durability;
        Self::connect_sqlite(connect, options).await
    }

    /// Prepared statements each SQLite connection keeps (sqlx's default is 100). A group
    /// commit's statements are spelled for their number of rows (up to a few hundred variants
    /// of a handful of statements); with too small a cache the writer parses them again and
    /// again. SQLite's prepared statements are small.
    const SQLITE_STATEMENT_CACHE: usize = 512;

    async fn connect_sqlite(
        connect: SqliteConnectOptions,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        let connect = connect
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(match options.durability {
                Durability::Normal => SqliteSynchronous::Normal,
                Durability::Full => SqliteSynchronous::Full,
            })
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT)
            .statement_cache_capacity(Self::SQLITE_STATEMENT_CACHE);
        let write_turn = Arc::new(tokio::sync::Mutex::new(()));
        let committer =
            crate::sqlite_commit::SqliteCommitter::start(crate::sqlite_commit::Settings {
                write_turn: Arc::clone(&write_turn),
                path: connect.get_filename().to_owned(),
                synchronous: match options.durability {
                    Durability::Normal => "NORMAL",
                    Durability::Full => "FULL",
                },
                busy_timeout: BUSY_TIMEOUT,
                statement_cache: Self::SQLITE_STATEMENT_CACHE,
            })?;
        let writer = pool_options::<sqlx::Sqlite>(options.ping_after_idle)
            .max_connections(1)
            .connect_with(connect.clone())
            .await?;
        let reader = pool_options::<sqlx::Sqlite>(options.ping_after_idle)
            .max_connections(options.max_connections.max(1))
            .connect_lazy_with(connect);
        Self::finish_open(
            Db::Sqlite {
                writer,
                reader,
                committer,
                write_turn,
            },
            options,
        )
        .await
    }

    async fn connect_postgres(
        connect: PgConnectOptions,
        options: StoreOptions,
    ) -> Result<Store, StoreError> {
        // A server that does not answer is said at once: the pool would retry for its whole
        // acquire timeout.
        let probe = {
            use sqlx::ConnectOptions as _;
            tokio::time::timeout(Duration::from_secs(10), connect.connect()).await
        };
        match probe {
            Ok(Ok(connection)) => {
                use sqlx::Connection as _;
                let _ = connection.close().await;
            }
            Ok(Err(error)) => return Err(StoreError::Database(error)),
            Err(_) => {
                return Err(StoreError::Database(sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "cannot connect to PostgreSQL: no answer within 10 s",
                ))));
            }
        }
        let pool = pool_options::<sqlx::Postgres>(options.ping_after_idle)
            .max_connections(options.max_connections.max(1))
            .connect_with(connect)
            .await?;
        Self::finish_open(Db::Postgres(pool), options).await
    }

    async fn finish_open(db: Db, options: StoreOptions) -> Result<Store, StoreError> {
        // PostgreSQL's writer keeps up to one pooled connection per batch in flight between its
        // batches, leaving at least half of the pool to everything else.
        let (in_flight, keep) = match db {
            // Two SQLite batches in flight: the thread starts the next (with whatever queued
            // behind it) as soon as one commits, without waiting for this task's turn.
            Db::Sqlite { .. } => (2, 0),
            Db::Postgres(_) => (
                POSTGRES_IN_FLIGHT,
                POSTGRES_IN_FLIGHT.min(options.max_connections as usize / 2),
            ),
        };
        let store = Store {
            inner: Arc::new_cyclic(|inner| Inner {
                db,
                key: options.secret_key,
                writer: GroupWriter::start(
                    inner.clone(),
                    Limits {
                        in_flight,
                        keep,
                        ping_after_idle: options.ping_after_idle,
                    },
                ),
                worker: std::sync::RwLock::new(None),
                volume: std::sync::RwLock::new(None),
                room: Room::default(),
                stranded_resume: std::sync::RwLock::new(None),
            }),
        };
        if let Err(error) = crate::db::migrate(&store).await {
            store.close().await;
            return Err(error);
        }
        Ok(store)
    }

    /// How many appends and status changes this store committed, in how many transactions:
    /// under concurrent load group commit puts many writes in one transaction.
    pub fn commit_counts(&self) -> CommitCounts {
        self.inner.writer.counts()
    }

    /// Why the database has no room for writes, when the last group commit or heartbeat
    /// failed for that reason (`None` once one commits again): readiness reports it.
    pub fn storage_full(&self) -> Option<String> {
        self.inner.room.full()
    }

    /// Which database this store runs on.
    pub fn backend(&self) -> Backend {
        match self.inner.db {
            Db::Sqlite { .. } => Backend::Sqlite,
            Db::Postgres(_) => Backend::Postgres,
        }
    }

    /// Closes the pools, waiting for connections in use to be returned. Every later operation
    /// fails.
    pub async fn close(&self) {
        match &self.inner.db {
            Db::Sqlite {
                writer,
                reader,
                committer,
                ..
            } => {
                reader.close().await;
                writer.close().await;
                committer.close();
            }
            Db::Postgres(pool) => {
                // The pool waits for the connections the writer holds.
                self.inner.writer.release_connections();
                pool.close().await;
            }
        }
    }

    /// The schema version of the database (the highest migration applied).
    pub async fn schema_version(&self) -> Result<u32, StoreError> {
        let version = with_reader!(self, |pool, d| {
            sqlx::query("SELECT COALESCE(MAX(version), 0) AS version FROM agentry_migrations")
                .fetch_one(pool)
                .await?
                .int("version")?
        });
        u32::try_from(version)
            .map_err(|_| StoreError::Corrupt(format!("schema version {version} is out of range")))
    }

    // --- sessions ---

    /// Names the process writing through this store (a node's incarnation, the worker name of
    /// its leases). A session becomes the process's when one of its writes sets it `running`,
    /// and stays so until a write sets another status: meanwhile writes from any other process
    /// are refused ([`StoreError::StaleLease`]), so two processes never interleave a session's
    /// run. A process that names none writes only to sessions no process holds.
    pub fn set_worker(&self, worker: &str) {
        *self
            .inner
            .worker
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::from(worker));
    }

    /// Names the volume this process's session workspaces are on: runs and sessions of dead
    /// nodes are taken over only from nodes on the same one ([`Store::claim_runs`],
    /// [`Store::claim_orphaned_sessions`]). Unnamed: no such check.
    pub fn set_volume(&self, volume: &str) {
        *self
            .inner
            .volume
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::from(volume));
    }

    /// Lets this process take a background run whose worker died on another workspace volume
    /// (which no live node may have) once its lease has been expired for `after` (it runs on
    /// here without that volume's files); `None`: only runs of this process's own volume.
    pub fn set_stranded_resume(&self, after: Option<Duration>) {
        *self
            .inner
            .stranded_resume
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = after;
    }

    /// [`Store::set_stranded_resume`]'s setting.
    pub(crate) fn stranded_resume(&self) -> Option<Duration> {
        *self
            .inner
            .stranded_resume
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The volume this process's session workspaces are on.
    pub fn volume(&self) -> Option<Arc<str>> {
        self.inner
            .volume
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// The process writing through this store.
    pub fn worker(&self) -> Option<Arc<str>> {
        self.inner
            .worker
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Creates a session with status `idle` and no events. An id that exists already is a
    /// [`StoreError::Conflict`].
    pub async fn create_session(&self, new: NewSession) -> Result<SessionRecord, StoreError> {
        let row = new_row(&new)?;
        let (_, now) = self
            .append_rows(new.id, None, &[], None, None, Some(row))
            .await?;
        Ok(SessionRecord {
            id: new.id,
            title: new.title,
            status: "idle".into(),
            created_at: now,
            last_activity: now,
            last_seq: 0,
            read_seq: 0,
            parent: None,
            expires_at: new.expires_at,
            metadata: new.metadata,
            owner: new.owner,
        })
    }

    /// Creates a session (as [`Store::create_session`]) with its first `events` and `status`,
    /// in one commit; returns the last event's seq. An id that exists already is a
    /// [`StoreError::Conflict`], and nothing is written.
    pub async fn create_session_with_events(
        &self,
        new: NewSession,
        events: &[NewEvent],
        status: Option<&str>,
    ) -> Result<u64, StoreError> {
        if let Some(status) = status {
            validate_status(status)?;
        }
        let create = new_row(&new)?;
        let (last, _) = self
            .append_rows(new.id, None, events, None, status, Some(create))
            .await?;
        Ok(last)
    }

    /// The session, if it exists.
    pub async fn session(&self, id: SessionId) -> Result<Option<SessionRecord>, StoreError> {
        let id = id.to_string();
        with_reader!(self, |pool, d| {
            let row = sqlx::query(concat!(
                "SELECT ",
                session_columns!(),
                " FROM sessions WHERE id = $1"
            ))
            .bind(&id)
            .fetch_optional(pool)
            .await?;
            row.as_ref().map(session_from_row).transpose()
        })
    }

    /// How many sessions `owner` created from `since` (Unix milliseconds) on, and when the
    /// first of them was created: what every node counts a key's `sessions_per_minute` by.
    pub async fn sessions_created_since(
        &self,
        owner: &str,
        since: u64,
    ) -> Result<(u64, Option<u64>), StoreError> {
        with_reader!(self, |pool, d| {
            let row = sqlx::query(
                "SELECT COUNT(*) AS created, MIN(created_at) AS first FROM sessions \
                 WHERE owner = $1 AND created_at >= $2",
            )
            .bind(owner)
            .bind(to_db(since))
            .fetch_one(pool)
            .await?;
            Ok((
                from_db(row.int("created")?),
                row.opt_int("first")?.map(from_db),
            ))
        })
    }

    /// Sessions, most recent activity first, optionally only those with one status.
    pub async fn list_sessions(
        &self,
        query: &SessionQuery,
    ) -> Result<Vec<SessionRecord>, StoreError> {
        if let Some(status) = &query.status {
            validate_status(status)?;
        }
        let limit = to_db(query.limit as u64);
        let offset = to_db(query.offset as u64);
        with_reader!(self, |pool, d| {
            let rows = sqlx::query(d.list_sessions_sql())
                .bind(query.status.as_deref())
                .bind(query.owner.as_deref())
                .bind(limit)
                .bind(offset)
                .fetch_all(pool)
                .await?;
            rows.iter().map(session_from_row).collect()
        })
    }

    /// Deletes a session, its events and the records of the runs started in it; `false` if it
    /// did not exist.
    ///
    /// Sessions forked from it keep their whole history: the part of this session's events each
    /// one references is copied into it, and its parent link moves to this session's own parent
    /// (or goes away). Only this session's own events are copied; what it inherited stays
    /// referenced.
    pub async fn delete_session(&self, id: SessionId) -> Result<bool, StoreError> {
        let id = id.to_string();
        in_write_tx!(self, |tx, d| {
            if let Some(lock) = d.topology_lock_sql() {
                sqlx::query(lock).execute(&mut *tx).await?;
            }
            let Some(row) = sqlx::query("SELECT parent_id, parent_seq FROM sessions WHERE id = $1")
                .bind(&id)
                .fetch_optional(&mut *tx)
                .await?
            else {
                return Ok(false);
            };
            let grandparent = row.opt_text("parent_id")?;
            let own_from = row.opt_int("parent_seq")?.unwrap_or(0);
            let children = sqlx::query("SELECT id, parent_seq FROM sessions WHERE parent_id = $1")
                .bind(&id)
                .fetch_all(&mut *tx)
                .await?;
            for child in &children {
                let child_id = child.text("id")?;
                let fork_seq = child.opt_int("parent_seq")?.unwrap_or(0);
                // The child's history: our events in (own_from, fork_seq], then what we
                // inherited up to min(own_from, fork_seq).
                sqlx::query(
                    "INSERT INTO events (session_id, seq, kind, payload, created_at) \
                     SELECT $1, seq, kind, payload, created_at FROM events \
                     WHERE session_id = $2 AND seq > $3 AND seq <= $4",
                )
                .bind(&child_id)
                .bind(&id)
                .bind(own_from)
                .bind(fork_seq)
                .execute(&mut *tx)
                .await?;
                let new_parent_seq = grandparent.as_ref().map(|_| own_from.min(fork_seq));
                sqlx::query("UPDATE sessions SET parent_id = $2, parent_seq = $3 WHERE id = $1")
                    .bind(&child_id)
                    .bind(grandparent.as_deref())
                    .bind(new_parent_seq)
                    .execute(&mut *tx)
                    .await?;
            }
            sqlx::query("DELETE FROM events WHERE session_id = $1")
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            // The records of the runs started in it go with it (their outcomes were its log);
            // a background run's record stays, as the queue's history.
            sqlx::query("DELETE FROM runs WHERE session_id = $1 AND background = 0")
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            sqlx::query("DELETE FROM sessions WHERE id = $1")
                .bind(&id)
                .execute(&mut *tx)
                .await?;
            tracing::debug!(session = %id, forks = children.len(), "deleted session");
            Ok(true)
        })
    }

    /// Sets the session's title (at most 1,000 characters).
    pub async fn set_title(&self, id: SessionId, title: &str) -> Result<(), StoreError> {
        validate_title(title)?;
        self.update_session(id, "UPDATE sessions SET title = $2 WHERE id = $1", title)
            .await
    }

    /// Sets the session's status: a short word chosen by the engine (`idle`, `running`,
    /// `interrupted`, `failed`, …), 1 to 32 characters of `a-z` and `_`.
    pub async fn set_status(&self, id: SessionId, status: &str) -> Result<(), StoreError> {
        validate_status(status)?;
        self.inner
            .writer
            .write(Write {
                session: id,
                expected_last_seq: None,
                events: Vec::new(),
                usage: Vec::new(),
                runs: Vec::new(),
                lease: None,
                status: Some(status.to_owned()),
                worker: self.worker(),
                now: now_millis(),
                create: None,
            })
            .await?;
        Ok(())
    }

    async fn update_session(
        &self,
        id: SessionId,
        sql: &'static str,
        value: &str,
    ) -> Result<(), StoreError> {
        let key = id.to_string();
        let updated = with_writer!(self, |pool, d| {
            sqlx::query(sql)
                .bind(&key)
                .bind(value)
                .execute(pool)
                .await?
                .rows_affected()
        });
        if updated == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }

    /// Marks the session read up to and including `seq` (which must not pass its last event).
    /// It is unread while `last_seq > read_seq`.
    pub async fn mark_read(&self, id: SessionId, seq: u64) -> Result<(), StoreError> {
        let key = id.to_string();
        let updated = with_writer!(self, |pool, d| {
            sqlx::query("UPDATE sessions SET read_seq = $2 WHERE id = $1 AND last_seq >= $2")
                .bind(&key)
                .bind(to_db(seq))
                .execute(pool)
                .await?
                .rows_affected()
        });
        if updated == 0 {
            let Some(session) = self.session(id).await? else {
                return Err(not_found(id));
            };
            return Err(StoreError::InvalidInput(format!(
                "cannot mark session {id} read up to {seq}: its last event is {}",
                session.last_seq
            )));
        }
        Ok(())
    }

    /// Sets (or clears) when [`Store::prune`] may delete the session, in Unix milliseconds.
    pub async fn set_expiry(
        &self,
        id: SessionId,
        expires_at: Option<u64>,
    ) -> Result<(), StoreError> {
        let key = id.to_string();
        let updated = with_writer!(self, |pool, d| {
            sqlx::query("UPDATE sessions SET expires_at = $2 WHERE id = $1")
                .bind(&key)
                .bind(expires_at.map(to_db))
                .execute(pool)
                .await?
                .rows_affected()
        });
        if updated == 0 {
            return Err(not_found(id));
        }
        Ok(())
    }

    // --- the event log ---

    /// Appends `events` atomically, numbered consecutively after the session's last event (the
    /// first event of a session is 1; a fork at `k` continues at `k + 1`), and returns them as
    /// stored. Updates the session's `last_seq` and `last_activity`.
    ///
    /// With `expected_last_seq: Some(n)` the append happens only if the session's last event is
    /// still `n`, else [`StoreError::Conflict`] and nothing is written. With `None` it always
    /// happens; concurrent appends to one session never leave gaps or duplicates. An unknown
    /// session is [`StoreError::NotFound`]; an empty `events` writes nothing and returns nothing.
    pub async fn append(
        &self,
        session: SessionId,
        expected_last_seq: Option<u64>,
        events: &[NewEvent],
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.append_with(session, expected_last_seq, events, None, None)
            .await
    }

    /// [`Store::append`] by the holder of a queued run's lease: refused
    /// ([`StoreError::StaleLease`], nothing written) unless the lease is still the worker's — in
    /// the same transaction, so a claim by another worker is ordered before or after it, never
    /// in between (on PostgreSQL the run's row is locked for the append).
    pub async fn append_fenced(
        &self,
        session: SessionId,
        events: &[NewEvent],
        lease: &crate::Lease,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        self.append_with(session, None, events, Some(lease), None)
            .await
    }

    /// [`Store::append`] (fenced by `lease` when given) and [`Store::set_status`] in one
    /// transaction: the events and the session's new status commit together.
    pub async fn append_and_set_status(
        &self,
        session: SessionId,
        events: &[NewEvent],
        status: &str,
        lease: Option<&crate::Lease>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        validate_status(status)?;
        self.append_with(session, None, events, lease, Some(status))
            .await
    }

    /// [`Store::append`] (fenced by `lease` when given, with the session's new `status` when
    /// given, in one transaction) for a writer that needs only the seq of the last event (0
    /// when none was written): the events are not handed back.
    pub async fn write_events(
        &self,
        session: SessionId,
        events: &[NewEvent],
        status: Option<&str>,
        lease: Option<&crate::Lease>,
    ) -> Result<u64, StoreError> {
        if let Some(status) = status {
            validate_status(status)?;
        }
        if events.is_empty() && status.is_none() {
            return Ok(0);
        }
        let (last, _) = self
            .append_rows(session, None, events, lease, status, None)
            .await?;
        Ok(if events.is_empty() { 0 } else { last })
    }

    async fn append_with(
        &self,
        session: SessionId,
        expected_last_seq: Option<u64>,
        events: &[NewEvent],
        lease: Option<&crate::Lease>,
        status: Option<&str>,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        if events.is_empty() && status.is_none() {
            return Ok(Vec::new());
        }
        let (last, now) = self
            .append_rows(session, expected_last_seq, events, lease, status, None)
            .await?;
        let first = last + 1 - events.len() as u64;
        (first..)
            .zip(events)
            .map(|(seq, event)| {
                Ok(StoredEvent {
                    session_id: session,
                    seq,
                    kind: event.kind.clone(),
                    payload: from_json_text(event.payload())?,
                    created_at: now,
                })
            })
            .collect()
    }

    /// Writes `events` (and `status`) through the group commit, creating the session first
    /// when `create` says so; returns the session's last seq after the write and the time
    /// written.
    async fn append_rows(
        &self,
        session: SessionId,
        expected_last_seq: Option<u64>,
        events: &[NewEvent],
        lease: Option<&crate::Lease>,
        status: Option<&str>,
        create: Option<NewRow>,
    ) -> Result<(u64, u64), StoreError> {
        let mut rows = Vec::with_capacity(events.len());
        let mut usage = Vec::new();
        let mut runs = Vec::new();
        for (index, event) in events.iter().enumerate() {
            validate_event_kind(&event.kind)?;
            rows.push((event.kind.clone(), event.payload().to_owned()));
            if let Some(entry) = &event.usage {
                usage.push((index, entry.clone()));
            }
            runs.extend(event.run.clone());
        }
        let now = now_millis();
        let last = self
            .inner
            .writer
            .write(Write {
                session,
                expected_last_seq,
                events: rows,
                usage,
                runs,
                lease: lease.cloned(),
                status: status.map(str::to_owned),
                // A leased run writes as its lease's worker.
                worker: lease
                    .map(|lease| Arc::from(lease.worker.as_str()))
                    .or_else(|| self.worker()),
                now,
                create,
            })
            .await?;
        Ok((last, now))
    }

    /// The session's events with `seq > after`, in order, at most `limit`.
    ///
    /// For a fork this includes the history it references: its ancestors' events up to the fork
    /// points, each reported under the session it is stored in; the numbering is continuous (a
    /// fork at 7 continues at 8). An unknown session is [`StoreError::NotFound`].
    pub async fn events(
        &self,
        session: SessionId,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, StoreError> {
        let key = session.to_string();
        let after = to_db(after);
        // Most sessions are no forks: their events come in one statement (one snapshot, no
        // transaction to open and close). A fork's row says so, and its chain is read below.
        let unforked = with_reader!(self, |pool, d| {
            let rows = sqlx::query(
                "SELECT s.parent_id, e.seq, e.kind, e.payload, e.created_at FROM sessions s \
                 LEFT JOIN events e ON e.session_id = s.id AND e.seq > $2 \
                 WHERE s.id = $1 ORDER BY e.seq LIMIT CAST($3 AS BIGINT)",
            )
            .bind(&key)
            .bind(after)
            // At least one row, so that a session with no events is told from no session.
            .bind(to_db(limit.max(1) as u64))
            .fetch_all(pool)
            .await?;
            let Some(first) = rows.first() else {
                return Err(not_found(session));
            };
            if first.opt_text("parent_id")?.is_some() {
                None
            } else {
                let mut events = Vec::with_capacity(rows.len().min(limit));
                for row in rows.iter().take(limit) {
                    // A session with no events is one row with no event in it.
                    if row.opt_int("seq")?.is_none() {
                        break;
                    }
                    events.push(stored_event(row, session)?);
                }
                Some(events)
            }
        });
        if let Some(events) = unforked {
            return Ok(events);
        }
        in_read_tx!(self, |tx, d| {
            // The session and its ancestors, the session first.
            let chain = sqlx::query(
                "WITH RECURSIVE chain (id, parent_id, parent_seq, depth) AS ( \
                   SELECT id, parent_id, parent_seq, 0 FROM sessions WHERE id = $1 \
                   UNION ALL \
                   SELECT s.id, s.parent_id, s.parent_seq, c.depth + 1 \
                   FROM sessions s JOIN chain c ON s.id = c.parent_id WHERE c.depth < 100000 \
                 ) SELECT id, parent_seq FROM chain ORDER BY depth",
            )
            .bind(&key)
            .fetch_all(&mut *tx)
            .await?;
            if chain.is_empty() {
                return Err(not_found(session));
            }
            // Each session contributes the events in (its fork point, the lowest fork point
            // below it]: a fork of a fork at a lower seq cuts its grandparent's part short.
            let mut segments = Vec::with_capacity(chain.len());
            let mut cap = i64::MAX;
            for link in &chain {
                let id = link.text("id")?;
                let from = link.opt_int("parent_seq")?.unwrap_or(0);
                if from < cap {
                    segments.push((id, from, cap));
                }
                cap = cap.min(from);
            }
            let mut out = Vec::new();
            for (id, from, to) in segments.into_iter().rev() {
                let remaining = limit.saturating_sub(out.len());
                if remaining == 0 || to <= after {
                    continue;
                }
                let session_id = parse_session_id(&id)?;
                let rows = sqlx::query(
                    "SELECT seq, kind, payload, created_at FROM events \
                     WHERE session_id = $1 AND seq > $2 AND seq <= $3 ORDER BY seq LIMIT CAST($4 AS BIGINT)",
                )
                .bind(&id)
                .bind(from.max(after))
                .bind(to)
                .bind(to_db(remaining as u64))
                .fetch_all(&mut *tx)
                .await?;
                for row in &rows {
                    out.push(stored_event(row, session_id)?);
                }
            }
            Ok(out)
        })
    }

    /// Creates a session whose history is `source`'s events up to and including `at_seq`,
    /// referenced rather than copied; its own events continue at `at_seq + 1`. `at_seq` past
    /// the source's last event is [`StoreError::InvalidInput`].
    pub async fn fork_session(
        &self,
        source: SessionId,
        at_seq: u64,
        new: NewSession,
    ) -> Result<SessionRecord, StoreError> {
        if let Some(title) = &new.title {
            validate_title(title)?;
        }
        let metadata = to_json_text(&new.metadata)?;
        let now = now_millis();
        let source_key = source.to_string();
        let id = new.id.to_string();
        in_write_tx!(self, |tx, d| {
            if let Some(lock) = d.topology_lock_sql() {
                sqlx::query(lock).execute(&mut *tx).await?;
            }
            let last = sqlx::query("SELECT last_seq FROM sessions WHERE id = $1")
                .bind(&source_key)
                .fetch_optional(&mut *tx)
                .await?
                .ok_or_else(|| not_found(source))?
                .int("last_seq")?;
            if to_db(at_seq) > last {
                return Err(StoreError::InvalidInput(format!(
                    "cannot fork session {source} at seq {at_seq}: its last event is {last}"
                )));
            }
            sqlx::query(
                "INSERT INTO sessions (id, title, status, created_at, last_activity, last_seq, \
                 read_seq, parent_id, parent_seq, expires_at, metadata, owner) \
                 VALUES ($1, $2, 'idle', $3, $3, $4, $4, $5, $4, $6, $7, $8)",
            )
            .bind(&id)
            .bind(new.title.as_deref())
            .bind(to_db(now))
            .bind(to_db(at_seq))
            .bind(&source_key)
            .bind(new.expires_at.map(to_db))
            .bind(&metadata)
            .bind(new.owner.as_deref())
            .execute(&mut *tx)
            .await
            .map_err(|e| unique_is_conflict(e, || format!("session {id} already exists")))?;
            Ok::<(), StoreError>(())
        })?;
        Ok(SessionRecord {
            id: new.id,
            title: new.title,
            status: "idle".into(),
            created_at: now,
            last_activity: now,
            last_seq: at_seq,
            read_seq: at_seq,
            parent: Some((source, at_seq)),
            expires_at: new.expires_at,
            metadata: new.metadata,
            owner: new.owner,
        })
    }

    /// Sessions with an event whose payload contains `query`, newest first: for each, the
    /// newest matching event and a short snippet around the match.
    ///
    /// The match is on the payload's JSON text, so a quote or newline in `query` matches the
    /// escaped form stored there; `%` and `_` are literal. Case is ignored for ASCII letters on
    /// both backends (beyond ASCII, PostgreSQL follows the database's locale and SQLite does
    /// not fold case). An event inherited by a fork is reported under the session that stores
    /// it. This scans payloads: fine for the sizes one node keeps, not a full-text index.
    pub async fn search(&self, query: &str, limit: usize) -> Result<Vec<SearchHit>, StoreError> {
        self.search_owned(query, limit, None).await
    }

    /// [`Store::search`] over the sessions of one owner only (`None`: every session).
    pub async fn search_owned(
        &self,
        query: &str,
        limit: usize,
        owner: Option<&str>,
    ) -> Result<Vec<SearchHit>, StoreError> {
        if query.is_empty() || query.chars().count() > 1000 {
            return Err(StoreError::InvalidInput(
                "a search query needs 1 to 1,000 characters".into(),
            ));
        }
        // The payload is stored as JSON text: look for the query as JSON would spell it.
        let needle = json_string_body(query)?;
        let pattern = format!("%{}%", escape_like(&needle));
        with_reader!(self, |pool, d| {
            let rows = sqlx::query(d.search_sql())
                .bind(&pattern)
                .bind(to_db(limit as u64))
                .bind(owner)
                .fetch_all(pool)
                .await?;
            rows.iter()
                .map(|row| {
                    Ok(SearchHit {
                        session_id: parse_session_id(&row.text("session_id")?)?,
                        seq: from_db(row.int("seq")?),
                        snippet: snippet(&row.text("payload")?, &needle),
                        created_at: from_db(row.int("created_at")?),
                    })
                })
                .collect()
        })
    }

    /// Deletes sessions whose expiry has passed and, with `older_than`, sessions whose last
    /// activity is older than that; sessions with status `running`, `waiting` (tool calls wait
    /// for approval) or `paused` are kept either way (their run has not ended). Forks of deleted sessions keep their
    /// history, as with [`Store::delete_session`]. Returns how many were deleted.
    pub async fn prune(&self, older_than: Option<Duration>) -> Result<u64, StoreError> {
        let now = now_millis();
        let idle_before = match older_than {
            Some(age) => {
                to_db(now.saturating_sub(u64::try_from(age.as_millis()).unwrap_or(u64::MAX)))
            }
            None => i64::MIN,
        };
        let candidates = with_reader!(self, |pool, d| {
            // Newest first, so forks go before their parents and nothing is copied needlessly.
            sqlx::query(
                "SELECT id FROM sessions WHERE status NOT IN ('running', 'waiting', 'paused') AND \
                 ((expires_at IS NOT NULL AND expires_at <= $1) OR last_activity < $2) \
                 ORDER BY created_at DESC, id DESC",
            )
            .bind(to_db(now))
            .bind(idle_before)
            .fetch_all(pool)
            .await?
            .iter()
            .map(|row| parse_session_id(&row.text("id")?))
            .collect::<Result<Vec<_>, StoreError>>()?
        });
        let mut deleted = 0;
        for id in candidates {
            if self.delete_session(id).await? {
                deleted += 1;
            }
        }
        if deleted > 0 {
            tracing::info!(deleted, "pruned sessions");
        }
        Ok(deleted)
    }

    /// Bytes of event payload stored under the session (its own events; what a fork references
    /// counts for the session that stores it).
    pub async fn stored_bytes(&self, session: SessionId) -> Result<u64, StoreError> {
        let key = session.to_string();
        let (found, bytes) = with_reader!(self, |pool, d| {
            let row = sqlx::query(d.stored_bytes_sql())
                .bind(&key)
                .fetch_one(pool)
                .await?;
            (row.int("found")?, row.int("bytes")?)
        });
        if found == 0 {
            return Err(not_found(session));
        }
        Ok(from_db(bytes))
    }
}

fn session_from_row(row: &impl RowExt) -> Result<SessionRecord, StoreError> {
    let parent = match (row.opt_text("parent_id")?, row.opt_int("parent_seq")?) {
        (Some(id), Some(seq)) => Some((parse_session_id(&id)?, from_db(seq))),
        _ => None,
    };
    Ok(SessionRecord {
        id: parse_session_id(&row.text("id")?)?,
        title: row.opt_text("title")?,
        status: row.text("status")?,
        created_at: from_db(row.int("created_at")?),
        last_activity: from_db(row.int("last_activity")?),
        last_seq: from_db(row.int("last_seq")?),
        read_seq: from_db(row.int("read_seq")?),
        parent,
        expires_at: row.opt_int("expires_at")?.map(from_db),
        metadata: from_json_text(&row.text("metadata")?)?,
        owner: row.opt_text("owner")?,
    })
}

fn parse_session_id(text: &str) -> Result<SessionId, StoreError> {
    SessionId::parse(text).map_err(|e| StoreError::Corrupt(e.to_string()))
}

fn not_found(id: SessionId) -> StoreError {
    StoreError::NotFound(format!("session {id}"))
}

fn validate_title(title: &str) -> Result<(), StoreError> {
    if title.chars().count() > 1000 {
        return Err(StoreError::InvalidInput(
            "a session title has at most 1,000 characters".into(),
        ));
    }
    Ok(())
}

/// A unique-constraint violation as [`StoreError::Conflict`]; anything else as it is.
pub(crate) fn unique_is_conflict(
    error: sqlx::Error,
    message: impl FnOnce() -> String,
) -> StoreError {
    match &error {
        sqlx::Error::Database(db) if db.is_unique_violation() => StoreError::Conflict(message()),
        _ => StoreError::Database(error),
    }
}

/// An event row (`seq`, `kind`, `payload`, `created_at`) of `session`'s log.
fn stored_event(row: &impl RowExt, session_id: SessionId) -> Result<StoredEvent, StoreError> {
    Ok(StoredEvent {
        session_id,
        seq: from_db(row.int("seq")?),
        kind: row.text("kind")?,
        payload: from_json_text(&row.text("payload")?)?,
        created_at: from_db(row.int("created_at")?),
    })
}

pub(crate) fn to_json_text(value: &serde_json::Value) -> Result<String, StoreError> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::InvalidInput(format!("value does not serialise as JSON: {e}")))
}

pub(crate) fn from_json_text(text: &str) -> Result<serde_json::Value, StoreError> {
    serde_json::from_str(text).map_err(|e| StoreError::Corrupt(format!("stored JSON: {e}")))
}

/// `value` as the inside of a JSON string literal (quotes, backslashes and control characters
/// escaped, as serde_json writes them).
fn json_string_body(value: &str) -> Result<String, StoreError> {
    let quoted = serde_json::to_string(value)
        .map_err(|e| StoreError::InvalidInput(format!("search query: {e}")))?;
    Ok(quoted[1..quoted.len() - 1].to_owned())
}

/// Escapes LIKE's wildcards (and the escape character itself) with `\`.
fn escape_like(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        if matches!(c, '\\' | '%' | '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// About 40 bytes either side of the first (ASCII case-insensitive) match of `needle`.
fn snippet(text: &str, needle: &str) -> String {
    const CONTEXT: usize = 40;
    let found = text
        .to_ascii_lowercase()
        .find(&needle.to_ascii_lowercase())
        .map(|at| (at, at + needle.len()));
    let (at, end) = found.unwrap_or((0, 0));
    let start = text.floor_char_boundary(at.saturating_sub(CONTEXT));
    let stop = text.ceil_char_boundary((end + CONTEXT).min(text.len()));
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    out.push_str(&text[start..stop]);
    if stop < text.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The setting reaches the connection that commits: NORMAL is 1, FULL is 2.
    #[tokio::test]
    async fn durability_sets_sqlites_synchronous_on_the_writer() {
        for (durability, expected) in [(Durability::Normal, 1), (Durability::Full, 2)] {
            let home = tempfile::tempdir().unwrap();
            let store = Store::open_home_with(home.path(), durability)
                .await
                .unwrap();
            let Db::Sqlite {
                writer, committer, ..
            } = &store.inner.db
            else {
                panic!("open_home opens SQLite");
            };
            let row = sqlx::query("PRAGMA synchronous")
                .fetch_one(writer)
                .await
                .unwrap();
            assert_eq!(row.int("synchronous").unwrap(), expected, "{durability:?}");
            // The group commit's own connection too.
            assert_eq!(
                committer.synchronous().await.unwrap(),
                expected,
                "{durability:?}"
            );
            store.close().await;
        }
    }

    #[test]
    fn like_escaping_and_json_spelling() {
        assert_eq!(escape_like(r"50%_a\b"), r"50\%\_a\\b");
        assert_eq!(json_string_body("say \"hi\"\n").unwrap(), r#"say \"hi\"\n"#);
    }

    #[test]
    fn snippets_cut_on_char_boundaries() {
        let text = format!("{}needle{}", "é".repeat(50), "ü".repeat(50));
        let cut = snippet(&text, "NEEDLE");
        assert!(cut.starts_with('…') && cut.ends_with('…'));
        assert!(cut.contains("needle"));
        assert_eq!(snippet("short needle here", "needle"), "short needle here");
    }
}
