//! The two backends behind one API: pools, dialect differences, row decoding, migrations.
//!
//! Every operation is written once. The `with_reader!`, `with_writer!`, `in_write_tx!` and
//! `in_read_tx!` macros expand that one body for each backend's concrete pool type, so the SQL
//! text and the Rust around it are shared; where the dialects differ the body asks the
//! [`Dialect`] for its spelling. Placeholders are `$1, $2, …` everywhere (SQLite accepts them).
//!
//! SQLite runs with one writer connection (and the group commit's, which takes turns with it) and
//! a small read pool: writes queue in process for the single writer (each transaction starts with `BEGIN IMMEDIATE`, so another process sharing the
//! file waits on the 5 s busy timeout instead of failing mid-transaction), and WAL lets reads go
//! on beside it. PostgreSQL uses one pool; an append updates the session row first, which locks
//! it, so appends to one session serialise while other sessions proceed.

use std::time::Duration;

use sqlx::postgres::{PgPool, PgRow};
use sqlx::sqlite::{SqlitePool, SqliteRow};

use crate::StoreError;
use crate::model::now_millis;

/// The pools of one store.
#[derive(Debug)]
pub(crate) enum Db {
    /// One writer connection, a read pool beside it, and the group commit's thread with its own
    /// connection.
    Sqlite {
        writer: SqlitePool,
        reader: SqlitePool,
        committer: crate::sqlite_commit::SqliteCommitter,
        /// Held while writing, through `writer` or `committer`: they take turns in process
        /// instead of meeting in SQLite's busy handler.
        write_turn: std::sync::Arc<tokio::sync::Mutex<()>>,
    },
    /// One pool for everything.
    Postgres(PgPool),
}

/// Runs `$body` with `$pool` bound to the pool reads go to and `$d` to the [`Dialect`].
macro_rules! with_reader {
    ($store:expr, |$pool:ident, $d:ident| $body:expr) => {
        match &$store.inner.db {
            $crate::db::Db::Sqlite { reader, .. } => {
                let $pool = reader;
                #[allow(unused_variables)]
                let $d = $crate::db::Dialect::Sqlite;
                $body
            }
            $crate::db::Db::Postgres(pool) => {
                let $pool = pool;
                #[allow(unused_variables)]
                let $d = $crate::db::Dialect::Postgres;
                $body
            }
        }
    };
}

/// Runs `$body` (one statement, no transaction) with `$pool` bound to the pool writes go to.
macro_rules! with_writer {
    ($store:expr, |$pool:ident, $d:ident| $body:expr) => {
        match &$store.inner.db {
            $crate::db::Db::Sqlite {
                writer, write_turn, ..
            } => {
                let _turn = write_turn.lock().await;
                let $pool = writer;
                #[allow(unused_variables)]
                let $d = $crate::db::Dialect::Sqlite;
                $body
            }
            $crate::db::Db::Postgres(pool) => {
                let $pool = pool;
                #[allow(unused_variables)]
                let $d = $crate::db::Dialect::Postgres;
                $body
            }
        }
    };
}

/// Runs `$body` inside a write transaction bound to `$tx` (use `&mut *$tx` as the executor) and
/// commits when it completes. Leaving early with `?` or `return` rolls the transaction back.
macro_rules! in_write_tx {
    ($store:expr, |$tx:ident, $d:ident| $body:expr) => {
        match &$store.inner.db {
            $crate::db::Db::Sqlite {
                writer, write_turn, ..
            } => {
                let _turn = write_turn.lock().await;
                // IMMEDIATE takes the write lock now, so a transaction never fails half-way
                // because another connection (another process) wrote first.
                let mut $tx = writer.begin_with("BEGIN IMMEDIATE").await?;
                #[allow(unused_variables)]
                let $d = $crate::db::Dialect::Sqlite;
                let out = $body;
                $tx.commit().await?;
                out
            }
            $crate::db::Db::Postgres(pool) => {
                let mut $tx = pool.begin().await?;
                #[allow(unused_variables)]
                let $d = $crate::db::Dialect::Postgres;
                let out = $body;
                $tx.commit().await?;
                out
            }
        }
    };
}

/// Runs `$body` inside a read-only transaction that sees one snapshot of the database.
macro_rules! in_read_tx {
    ($store:expr, |$tx:ident, $d:ident| $body:expr) => {
        match &$store.inner.db {
            $crate::db::Db::Sqlite { reader, .. } => {
                // In WAL mode a read transaction sees the database as of its first read.
                let mut $tx = reader.begin().await?;
                #[allow(unused_variables)]
                let $d = $crate::db::Dialect::Sqlite;
                let out = $body;
                $tx.commit().await?;
                out
            }
            $crate::db::Db::Postgres(pool) => {
                let mut $tx = pool
                    .begin_with("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                    .await?;
                #[allow(unused_variables)]
                let $d = $crate::db::Dialect::Postgres;
                let out = $body;
                $tx.commit().await?;
                out
            }
        }
    };
}

pub(crate) use {in_read_tx, in_write_tx, with_reader, with_writer};

/// Where the two SQL dialects differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    /// `SELECT found, bytes` for one session: whether it exists, and its payload bytes.
    pub(crate) fn stored_bytes_sql(self) -> &'static str {
        match self {
            Self::Sqlite => {
                "SELECT (SELECT COUNT(*) FROM sessions WHERE id = $1) AS found, \
                 COALESCE((SELECT SUM(length(CAST(payload AS BLOB))) FROM events \
                 WHERE session_id = $1), 0) AS bytes"
            }
            Self::Postgres => {
                "SELECT (SELECT COUNT(*) FROM sessions WHERE id = $1) AS found, \
                 COALESCE((SELECT SUM(octet_length(payload)) FROM events \
                 WHERE session_id = $1), 0)::BIGINT AS bytes"
            }
        }
    }

    /// The newest matching event per session, newest first: `$1` is a LIKE pattern with `\` as
    /// its escape character, `$2` the limit.
    pub(crate) fn search_sql(self) -> &'static str {
        // SQLite's LIKE is case-insensitive for ASCII; PostgreSQL needs ILIKE.
        match self {
            Self::Sqlite => {
                "SELECT e.session_id, e.seq, e.payload, e.created_at FROM events e \
                 JOIN (SELECT session_id, MAX(seq) AS seq FROM events \
                       WHERE payload LIKE $1 ESCAPE '\\' GROUP BY session_id) m \
                 ON m.session_id = e.session_id AND m.seq = e.seq \
                 JOIN sessions s ON s.id = e.session_id \
                 WHERE ($3 IS NULL OR s.owner = $3) \
                 ORDER BY e.created_at DESC, e.session_id DESC LIMIT CAST($2 AS BIGINT)"
            }
            Self::Postgres => {
                "SELECT e.session_id, e.seq, e.payload, e.created_at FROM events e \
                 JOIN (SELECT session_id, MAX(seq) AS seq FROM events \
                       WHERE payload ILIKE $1 ESCAPE '\\' GROUP BY session_id) m \
                 ON m.session_id = e.session_id AND m.seq = e.seq \
                 JOIN sessions s ON s.id = e.session_id \
                 WHERE ($3::text IS NULL OR s.owner = $3::text) \
                 ORDER BY e.created_at DESC, e.session_id DESC LIMIT CAST($2 AS BIGINT)"
            }
        }
    }

    /// Sessions filtered by status (`$1`) and owner (`$2`), either NULL for any, most recent
    /// activity first, `$3` of them after skipping `$4`.
    pub(crate) fn list_sessions_sql(self) -> &'static str {
        match self {
            Self::Sqlite => concat!(
                "SELECT ",
                crate::store::session_columns!(),
                " FROM sessions WHERE ($1 IS NULL OR status = $1) AND ($2 IS NULL OR owner = $2) \
                 ORDER BY last_activity DESC, id DESC LIMIT CAST($3 AS BIGINT) OFFSET $4"
            ),
            Self::Postgres => concat!(
                "SELECT ",
                crate::store::session_columns!(),
                " FROM sessions WHERE ($1::text IS NULL OR status = $1::text) \
                 AND ($2::text IS NULL OR owner = $2::text) \
                 ORDER BY last_activity DESC, id DESC LIMIT CAST($3 AS BIGINT) OFFSET $4"
            ),
        }
    }

    /// A statement that serialises forks and deletions (which rewire parent links) among
    /// themselves, for the rest of the transaction. SQLite needs none: its writes are serial.
    pub(crate) fn topology_lock_sql(self) -> Option<&'static str> {
        match self {
            Self::Sqlite => None,
            Self::Postgres => Some(
                "SELECT pg_advisory_xact_lock(hashtext('agentry.topology.' || \
                 COALESCE(current_schema(), '')))",
            ),
        }
    }

    /// Renews the leases of the runs a worker (`$2`) holds until `$1`; returns `id,
    /// lease_epoch, cancel_requested` of each. On PostgreSQL the rows are locked in id order,
    /// as the group commit locks the runs its writes are fenced by: the two never wait on each
    /// other in a cycle (a deadlock, which PostgreSQL breaks only after a second).
    pub(crate) fn renew_leases_sql(self) -> &'static str {
        match self {
            Self::Sqlite => {
                "UPDATE runs SET lease_until = $1 WHERE worker = $2 AND state = 'running' \
                 RETURNING id, lease_epoch, cancel_requested"
            }
            Self::Postgres => {
                "UPDATE runs SET lease_until = $1 WHERE id IN (SELECT id FROM runs \
                 WHERE worker = $2 AND state = 'running' ORDER BY id FOR UPDATE) \
                 RETURNING id, lease_epoch, cancel_requested"
            }
        }
    }

    /// A statement that serialises migrations of one schema across processes.
    fn migration_lock_sql(self) -> Option<&'static str> {
        match self {
            Self::Sqlite => None,
            Self::Postgres => Some(
                "SELECT pg_advisory_xact_lock(hashtext('agentry.migrate.' || \
                 COALESCE(current_schema(), '')))",
            ),
        }
    }

    fn migrations(self) -> &'static [Migration] {
        match self {
            Self::Sqlite => SQLITE_MIGRATIONS,
            Self::Postgres => POSTGRES_MIGRATIONS,
        }
    }
}

/// One schema change, applied once, in order.
#[derive(Debug)]
struct Migration {
    version: i64,
    name: &'static str,
    sql: &'static str,
}

const SQLITE_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: include_str!("../migrations/sqlite/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "memories",
        sql: include_str!("../migrations/sqlite/0002_memories.sql"),
    },
    Migration {
        version: 3,
        name: "config order",
        sql: include_str!("../migrations/sqlite/0003_config_order.sql"),
    },
    Migration {
        version: 4,
        name: "owners",
        sql: include_str!("../migrations/sqlite/0004_owners.sql"),
    },
    Migration {
        version: 5,
        name: "runs",
        sql: include_str!("../migrations/sqlite/0005_runs.sql"),
    },
    Migration {
        version: 6,
        name: "webhooks",
        sql: include_str!("../migrations/sqlite/0006_webhooks.sql"),
    },
    Migration {
        version: 7,
        name: "workflow events",
        sql: include_str!("../migrations/sqlite/0007_workflow_events.sql"),
    },
    Migration {
        version: 8,
        name: "cluster",
        sql: include_str!("../migrations/sqlite/0008_cluster.sql"),
    },
    Migration {
        version: 9,
        name: "usage",
        sql: include_str!("../migrations/sqlite/0009_usage.sql"),
    },
    Migration {
        version: 10,
        name: "session runs",
        sql: include_str!("../migrations/sqlite/0010_session_runs.sql"),
    },
    Migration {
        version: 11,
        name: "group commit",
        sql: include_str!("../migrations/sqlite/0011_group_commit.sql"),
    },
    Migration {
        version: 12,
        name: "group commit function",
        sql: include_str!("../migrations/sqlite/0012_group_commit_function.sql"),
    },
    Migration {
        version: 13,
        name: "run usage",
        sql: include_str!("../migrations/sqlite/0013_run_usage.sql"),
    },
];

const POSTGRES_MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: include_str!("../migrations/postgres/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "memories",
        sql: include_str!("../migrations/postgres/0002_memories.sql"),
    },
    Migration {
        version: 3,
        name: "config order",
        sql: include_str!("../migrations/postgres/0003_config_order.sql"),
    },
    Migration {
        version: 4,
        name: "owners",
        sql: include_str!("../migrations/postgres/0004_owners.sql"),
    },
    Migration {
        version: 5,
        name: "runs",
        sql: include_str!("../migrations/postgres/0005_runs.sql"),
    },
    Migration {
        version: 6,
        name: "webhooks",
        sql: include_str!("../migrations/postgres/0006_webhooks.sql"),
    },
    Migration {
        version: 7,
        name: "workflow events",
        sql: include_str!("../migrations/postgres/0007_workflow_events.sql"),
    },
    Migration {
        version: 8,
        name: "cluster",
        sql: include_str!("../migrations/postgres/0008_cluster.sql"),
    },
    Migration {
        version: 9,
        name: "usage",
        sql: include_str!("../migrations/postgres/0009_usage.sql"),
    },
    Migration {
        version: 10,
        name: "session runs",
        sql: include_str!("../migrations/postgres/0010_session_runs.sql"),
    },
    Migration {
        version: 11,
        name: "group commit",
        sql: include_str!("../migrations/postgres/0011_group_commit.sql"),
    },
    Migration {
        version: 12,
        name: "group commit function",
        sql: include_str!("../migrations/postgres/0012_group_commit_function.sql"),
    },
    Migration {
        version: 13,
        name: "run usage",
        sql: include_str!("../migrations/postgres/0013_run_usage.sql"),
    },
];

/// The schema version this build creates and understands.
pub const SCHEMA_VERSION: u32 = 13;

/// Brings the schema up to date inside one transaction; refuses a database newer than this
/// build.
pub(crate) async fn migrate(store: &crate::Store) -> Result<(), StoreError> {
    in_write_tx!(store, |tx, d| {
        if let Some(lock) = d.migration_lock_sql() {
            sqlx::query(lock).execute(&mut *tx).await?;
        }
        sqlx::query(
            "CREATE TABLE IF NOT EXISTS agentry_migrations \
             (version BIGINT PRIMARY KEY NOT NULL, applied_at BIGINT NOT NULL)",
        )
        .execute(&mut *tx)
        .await
        .map_err(|e| StoreError::Migration(format!("cannot create agentry_migrations: {e}")))?;
        let current =
            sqlx::query("SELECT COALESCE(MAX(version), 0) AS version FROM agentry_migrations")
                .fetch_one(&mut *tx)
                .await?
                .int("version")?;
        let migrations = d.migrations();
        let latest = migrations.last().map_or(0, |m| m.version);
        if current > latest {
            return Err(StoreError::Migration(format!(
                "the database schema is at version {current}, newer than this build of Agentry \
                 understands ({latest}); upgrade Agentry to open it"
            )));
        }
        for migration in migrations.iter().filter(|m| m.version > current) {
            sqlx::raw_sql(migration.sql)
                .execute(&mut *tx)
                .await
                .map_err(|e| {
                    StoreError::Migration(format!(
                        "migration {} ({}) failed: {e}",
                        migration.version, migration.name
                    ))
                })?;
            sqlx::query("INSERT INTO agentry_migrations (version, applied_at) VALUES ($1, $2)")
                .bind(migration.version)
                .bind(to_db(now_millis()))
                .execute(&mut *tx)
                .await?;
            tracing::info!(
                backend = %store.backend(),
                version = migration.version,
                name = migration.name,
                "applied schema migration"
            );
        }
        Ok(())
    })
}

/// Typed column access shared by both backends' rows.
pub(crate) trait RowExt {
    /// An integer column.
    fn int(&self, column: &str) -> Result<i64, StoreError>;
    /// A nullable integer column.
    fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError>;
    /// A text column.
    fn text(&self, column: &str) -> Result<String, StoreError>;
    /// A nullable text column.
    fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError>;
    /// A blob (bytea) column.
    fn blob(&self, column: &str) -> Result<Vec<u8>, StoreError>;
}

macro_rules! impl_row_ext {
    ($($row:ty),*) => {$(
        impl RowExt for $row {
            fn int(&self, column: &str) -> Result<i64, StoreError> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
            fn opt_int(&self, column: &str) -> Result<Option<i64>, StoreError> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
            fn text(&self, column: &str) -> Result<String, StoreError> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
            fn opt_text(&self, column: &str) -> Result<Option<String>, StoreError> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
            fn blob(&self, column: &str) -> Result<Vec<u8>, StoreError> {
                Ok(sqlx::Row::try_get(self, column)?)
            }
        }
    )*};
}

impl_row_ext!(SqliteRow, PgRow);

/// A `u64` as the database's signed 64-bit integer (saturating).
pub(crate) fn to_db(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// A database integer as `u64` (negative values, which the store never writes, read as 0).
pub(crate) fn from_db(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

/// How long SQLite waits for another connection's lock before giving up.
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long an operation waits for a pooled connection.
pub(crate) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a pooled connection may sit idle and still be handed out without a ping, unless
/// the store's options say otherwise.
pub const PING_AFTER_IDLE: Duration = Duration::from_secs(10);

/// The options every pool of the store starts from. A connection that sat idle for
/// `ping_after_idle` or longer is pinged before it is handed out (the server may have closed
/// it meanwhile); one in steady use is not. sqlx's default pings on every acquire: a round trip
/// to PostgreSQL (or a hop to SQLite's connection thread) before each statement or
/// transaction.
pub(crate) fn pool_options<DB: sqlx::Database>(
    ping_after_idle: Duration,
) -> sqlx::pool::PoolOptions<DB> {
    sqlx::pool::PoolOptions::new()
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .test_before_acquire(false)
        .before_acquire(move |connection, meta| {
            Box::pin(async move {
                // A transaction whose commit and rollback both failed (a full disk) leaves the
                // connection inside it for good: every later `BEGIN` on it would fail ("non-zero
                // transaction depth") after the disk has room again. Such a connection is
                // closed and a fresh one opened instead.
                if sqlx::Connection::is_in_transaction(connection) {
                    return Ok(false);
                }
                if meta.idle_for >= ping_after_idle {
                    sqlx::Connection::ping(connection).await?;
                }
                Ok(true)
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SQLite (3.47 and later) plans a `LIMIT` given as a bare parameter with the bound value,
    /// and so marks the statement to be prepared again whenever that parameter is bound: at
    /// every execution. Found with a debugger on `sqlite3Reprepare` (the claim of queued runs
    /// and the history read were prepared again each time). A `CAST` keeps the plan
    /// independent of the value, so every `LIMIT` the store binds goes through one.
    #[test]
    fn no_statement_limits_by_a_bare_parameter() {
        let folder = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut limits = 0;
        for entry in std::fs::read_dir(&folder).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).unwrap();
            for bare in [concat!("LIMIT ", "$"), concat!("LIMIT ", "?")] {
                assert!(
                    !source.contains(bare),
                    "{} binds a bare LIMIT",
                    path.display()
                );
            }
            limits += source.matches("LIMIT CAST(").count();
        }
        assert!(limits >= 15, "{limits}");
    }

    #[test]
    fn migrations_are_ordered_and_match_the_schema_version() {
        for set in [SQLITE_MIGRATIONS, POSTGRES_MIGRATIONS] {
            let versions: Vec<i64> = set.iter().map(|m| m.version).collect();
            let expected: Vec<i64> = (1..=i64::from(SCHEMA_VERSION)).collect();
            assert_eq!(versions, expected);
        }
    }

    #[test]
    fn integer_conversions_saturate() {
        assert_eq!(to_db(u64::MAX), i64::MAX);
        assert_eq!(to_db(7), 7);
        assert_eq!(from_db(-1), 0);
        assert_eq!(from_db(7), 7);
    }
}
