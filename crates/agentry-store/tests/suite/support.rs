//! The harness every scenario runs in: a fresh database on either backend, a way to reopen it,
//! and raw SQL access for checks the public API does not offer (row counts, stored bytes).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agentry_store::{Backend, NewEvent, NewSession, SecretKey, SessionId, Store, StoreOptions};
use sqlx::{AssertSqlSafe, Connection, Row};
use tempfile::TempDir;

/// Where the PostgreSQL variants connect; every test works in a schema of its own.
pub fn postgres_url() -> String {
    std::env::var("AGENTRY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned())
}

/// Generates `mod sqlite` and `mod postgres`, each with one test per scenario: the scenario
/// `async fn name(h: &Harness)` runs against a fresh database of that backend.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::suite::support::Harness::sqlite().await;
                    super::$name(&harness).await;
                    harness.finish().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let harness = $crate::suite::support::Harness::postgres().await;
                    super::$name(&harness).await;
                    harness.finish().await;
                }
            )*
        }
    };
}
pub(crate) use both_backends;

/// A fresh database and a store open on it.
pub struct Harness {
    pub store: Store,
    pub key: SecretKey,
    pub url: String,
    raw: Raw,
    _dir: Option<TempDir>,
    _schema: Option<PgSchema>,
}

enum Raw {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Harness {
    /// A SQLite file in a new temporary folder.
    pub async fn sqlite() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agentry.db");
        let url = format!("sqlite://{}", path.display());
        let key = SecretKey::generate().unwrap();
        let store = Store::connect(&url, StoreOptions::new(key.clone()))
            .await
            .unwrap();
        assert_eq!(store.backend(), Backend::Sqlite);
        Self {
            store,
            key,
            url,
            raw: Raw::Sqlite(path),
            _dir: Some(dir),
            _schema: None,
        }
    }

    /// A new schema in the test PostgreSQL database, dropped when the harness is.
    pub async fn postgres() -> Self {
        let base = postgres_url();
        let mut admin = sqlx::PgConnection::connect(&base)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "PostgreSQL is not reachable at {base}: {e}. The PostgreSQL variants need it: \
                 run scripts/test (which starts it), or start it and set \
                 AGENTRY_TEST_DATABASE_URL"
                )
            });
        let schema = format!("t_{}", SessionId::new().to_string().replace('-', ""));
        sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
            .execute(&mut admin)
            .await
            .unwrap();
        admin.close().await.unwrap();
        let guard = PgSchema {
            base: base.clone(),
            name: schema.clone(),
        };
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}options[search_path]={schema}");
        let key = SecretKey::generate().unwrap();
        let store = Store::connect(&url, StoreOptions::new(key.clone()))
            .await
            .unwrap();
        assert_eq!(store.backend(), Backend::Postgres);
        Self {
            store,
            key,
            raw: Raw::Postgres(url.clone()),
            url,
            _dir: None,
            _schema: Some(guard),
        }
    }

    /// Opens another store on the same database, with the same key.
    pub async fn reopen(&self) -> Result<Store, agentry_store::StoreError> {
        self.reopen_with_key(self.key.clone()).await
    }

    /// Opens another store on the same database with `key`.
    pub async fn reopen_with_key(
        &self,
        key: SecretKey,
    ) -> Result<Store, agentry_store::StoreError> {
        Store::connect(&self.url, StoreOptions::new(key)).await
    }

    /// Runs one statement directly on the database.
    pub async fn raw_exec(&self, sql: &str) {
        match &self.raw {
            Raw::Sqlite(path) => {
                let mut conn = sqlite_conn(path).await;
                sqlx::query(AssertSqlSafe(sql.to_owned()))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.unwrap();
            }
            Raw::Postgres(url) => {
                let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::query(AssertSqlSafe(sql.to_owned()))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.unwrap();
            }
        }
    }

    /// The first column of the first row of `sql`, an integer (cast to BIGINT on PostgreSQL by
    /// the caller where needed).
    pub async fn raw_int(&self, sql: &str) -> i64 {
        match &self.raw {
            Raw::Sqlite(path) => {
                let mut conn = sqlite_conn(path).await;
                let row = sqlx::query(AssertSqlSafe(sql.to_owned()))
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
                row.try_get::<i64, _>(0).unwrap()
            }
            Raw::Postgres(url) => {
                let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
                let row = sqlx::query(AssertSqlSafe(sql.to_owned()))
                    .fetch_one(&mut conn)
                    .await
                    .unwrap();
                row.try_get::<i64, _>(0).unwrap()
            }
        }
    }

    /// The first column of every row of `sql`, as bytes.
    pub async fn raw_blobs(&self, sql: &str) -> Vec<Vec<u8>> {
        match &self.raw {
            Raw::Sqlite(path) => {
                let mut conn = sqlite_conn(path).await;
                let rows = sqlx::query(AssertSqlSafe(sql.to_owned()))
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
                rows.iter().map(|r| r.try_get(0).unwrap()).collect()
            }
            Raw::Postgres(url) => {
                let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
                let rows = sqlx::query(AssertSqlSafe(sql.to_owned()))
                    .fetch_all(&mut conn)
                    .await
                    .unwrap();
                rows.iter().map(|r| r.try_get(0).unwrap()).collect()
            }
        }
    }

    /// How many rows the events table holds.
    pub async fn event_rows(&self) -> i64 {
        self.raw_int("SELECT COUNT(*) FROM events").await
    }

    /// Closes the store (the schema or folder goes when the harness drops).
    pub async fn finish(self) {
        self.store.close().await;
    }
}

async fn sqlite_conn(path: &std::path::Path) -> sqlx::SqliteConnection {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .busy_timeout(Duration::from_secs(5));
    sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap()
}

/// Drops the test schema, also when the test panicked.
struct PgSchema {
    base: String,
    name: String,
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        let base = self.base.clone();
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name);
        // A runtime of its own: this may run while the test's runtime unwinds.
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let mut conn = sqlx::PgConnection::connect(&base).await?;
                sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut conn).await?;
                conn.close().await
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}", self.name);
        }
    }
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// A session with a fresh id and `title`.
pub async fn new_session(store: &Store, title: &str) -> SessionId {
    let mut new = NewSession::new();
    new.title = Some(title.to_owned());
    store.create_session(new).await.unwrap().id
}

/// An event of `kind` with `{"text": text}`.
pub fn text_event(kind: &str, text: &str) -> NewEvent {
    NewEvent::new(kind, serde_json::json!({ "text": text }))
}

/// Appends `count` events `note` with `{"n": i}` (i from `from`), one append each.
pub async fn append_notes(store: &Store, session: SessionId, from: u64, count: u64) {
    for n in from..from + count {
        store
            .append(
                session,
                None,
                &[NewEvent::new("note", serde_json::json!({ "n": n }))],
            )
            .await
            .unwrap();
    }
}

/// `(session id, seq, payload)` of every event the session's history holds.
pub async fn history(
    store: &Store,
    session: SessionId,
) -> Vec<(SessionId, u64, serde_json::Value)> {
    store
        .events(session, 0, 10_000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.session_id, e.seq, e.payload))
        .collect()
}
