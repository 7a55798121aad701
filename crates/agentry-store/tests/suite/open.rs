//! Opening a store: migrations, URLs, the home folder.

use agentry_store::{
    Backend, NewSession, SCHEMA_VERSION, SecretKey, Store, StoreError, StoreOptions,
};

use super::support::{Harness, both_backends, new_session};

both_backends!(
    migrations_apply_once_and_reopen_is_idempotent,
    newer_schema_is_refused,
    a_closed_store_refuses_writes_at_once
);

/// After `close`, a write gets an error at once (the group commit's connections, SQLite's
/// thread and PostgreSQL's kept connections, are closed with the store), and nothing of it
/// is stored.
async fn a_closed_store_refuses_writes_at_once(h: &Harness) {
    let store = h.reopen().await.unwrap();
    let id = new_session(&store, "before").await;
    store
        .append(id, None, &[super::support::text_event("note", "kept")])
        .await
        .unwrap();
    store.close().await;
    let refused = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        store.append(id, None, &[super::support::text_event("note", "lost")]),
    )
    .await
    .expect("a write to a closed store is answered at once");
    assert!(refused.is_err(), "{refused:?}");
    let created = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        store.create_session(agentry_store::NewSession::new()),
    )
    .await
    .expect("a creation in a closed store is answered at once");
    assert!(created.is_err(), "{created:?}");
    drop(store);
    let events = h.store.events(id, 0, 10).await.unwrap();
    assert_eq!(events.len(), 1, "{events:?}");
}

async fn migrations_apply_once_and_reopen_is_idempotent(h: &Harness) {
    assert_eq!(h.store.schema_version().await.unwrap(), SCHEMA_VERSION);
    let rows = h.raw_int("SELECT COUNT(*) FROM agentry_migrations").await;
    assert_eq!(rows, i64::from(SCHEMA_VERSION));
    let id = new_session(&h.store, "kept").await;

    for _ in 0..2 {
        let again = h.reopen().await.unwrap();
        assert_eq!(again.schema_version().await.unwrap(), SCHEMA_VERSION);
        assert_eq!(
            again.session(id).await.unwrap().unwrap().title.as_deref(),
            Some("kept")
        );
        again.close().await;
    }
    let rows = h.raw_int("SELECT COUNT(*) FROM agentry_migrations").await;
    assert_eq!(rows, i64::from(SCHEMA_VERSION), "reopening applied nothing");
}

async fn newer_schema_is_refused(h: &Harness) {
    h.raw_exec("INSERT INTO agentry_migrations (version, applied_at) VALUES (999, 0)")
        .await;
    match h.reopen().await {
        Err(StoreError::Migration(message)) => {
            assert!(message.contains("999"), "{message}");
            assert!(message.contains("newer"), "{message}");
        }
        other => panic!("expected a migration error, got {other:?}"),
    }
}

#[tokio::test]
async fn urls_pick_the_backend_and_refuse_what_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let key = || StoreOptions::new(SecretKey::from_bytes([1; 32]));

    let plain = dir.path().join("plain.db");
    let store = Store::connect(plain.to_str().unwrap(), key())
        .await
        .unwrap();
    assert_eq!(store.backend(), Backend::Sqlite);
    store.close().await;
    assert!(plain.exists());

    let url = format!("sqlite:{}", dir.path().join("url.db").display());
    let store = Store::connect(&url, key()).await.unwrap();
    assert_eq!(store.backend(), Backend::Sqlite);
    store.close().await;

    for bad in [
        "sqlite::memory:",
        "mysql://localhost/db",
        "",
        "postgres://host:notaport/db",
    ] {
        assert!(
            matches!(
                Store::connect(bad, key()).await,
                Err(StoreError::InvalidInput(_))
            ),
            "{bad:?} should be refused"
        );
    }
}

#[cfg(unix)]
#[tokio::test]
async fn open_home_creates_a_private_folder_and_keeps_its_key() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("nested").join("home");
    let store = Store::open_home(&home).await.unwrap();
    assert_eq!(store.backend(), Backend::Sqlite);
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&home), 0o700);
    assert_eq!(mode(&home.join("secret.key")), 0o600);
    assert!(home.join("agentry.db").exists());

    store
        .put_secret("openai", "sk-test-0123456789abcd")
        .await
        .unwrap();
    let id = store.create_session(NewSession::new()).await.unwrap().id;
    store.close().await;

    // Reopened, the same key opens the secret.
    let store = Store::open_home(&home).await.unwrap();
    assert_eq!(
        store.reveal_secret("openai").await.unwrap().as_deref(),
        Some("sk-test-0123456789abcd")
    );
    assert!(store.session(id).await.unwrap().is_some());
    store.close().await;
}

/// A pooled connection that the server closed while it sat idle is noticed before it is used
/// (it is pinged once idle for `ping_after_idle`), so the store goes on working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_server_closed_while_idle_is_replaced_before_use() {
    use sqlx::Connection as _;
    let harness = Harness::postgres().await;
    // This store's connections, told apart from every other test's by their name.
    let name = format!("ping_{}", std::process::id());
    let url = format!("{}&application_name={name}", harness.url);
    let mut options = StoreOptions::new(harness.key.clone());
    options.ping_after_idle = std::time::Duration::from_millis(100);
    let store = Store::connect(&url, options).await.unwrap();
    let id = new_session(&store, "before").await;
    let mut admin = sqlx::PgConnection::connect(&super::support::postgres_url())
        .await
        .unwrap();
    let closed: i64 = sqlx::query_scalar(
        "SELECT COUNT(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = $1) AS terminated",
    )
    .bind(&name)
    .fetch_one(&mut admin)
    .await
    .unwrap();
    assert!(closed >= 1, "the store had no connection to close");
    admin.close().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    // Reads and writes find live connections.
    assert_eq!(
        store.session(id).await.unwrap().unwrap().title.as_deref(),
        Some("before")
    );
    new_session(&store, "after").await;
    store.close().await;
    harness.finish().await;
}

/// PostgreSQL's group-commit writer keeps pooled connections between its batches, at most half
/// of the pool: a store allowed one connection keeps none, so its reads and its other writes
/// still get the connection after a group commit, and one allowed two leaves one to them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_never_keeps_the_connections_the_rest_of_the_store_needs() {
    let harness = Harness::postgres().await;
    for max_connections in [1, 2] {
        let mut options = StoreOptions::new(harness.key.clone());
        options.max_connections = max_connections;
        let store = Store::connect(&harness.url, options).await.unwrap();
        let id = new_session(&store, "kept").await;
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), store.session(id))
            .await
            .unwrap_or_else(|_| {
                panic!("a read waited for the writer's connection ({max_connections})")
            })
            .unwrap();
        assert_eq!(read.unwrap().title.as_deref(), Some("kept"));
        tokio::time::timeout(std::time::Duration::from_secs(5), store.close())
            .await
            .unwrap_or_else(|_| {
                panic!("closing waited for the writer's connection ({max_connections})")
            });
    }
    harness.finish().await;
}
