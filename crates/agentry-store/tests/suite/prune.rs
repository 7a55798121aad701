//! Pruning expired and idle sessions.

use std::time::Duration;

use agentry_store::NewSession;

use super::support::{Harness, append_notes, both_backends, history, new_session, now_ms};

both_backends!(prune_deletes_expired_and_idle_sessions_but_not_running_ones);

async fn prune_deletes_expired_and_idle_sessions_but_not_running_ones(h: &Harness) {
    let store = &h.store;
    let mut expired = NewSession::new();
    expired.expires_at = Some(now_ms() - 1_000);
    let expired = store.create_session(expired).await.unwrap().id;
    append_notes(store, expired, 1, 2).await;

    let mut later = NewSession::new();
    later.expires_at = Some(now_ms() + 3_600_000);
    let later = store.create_session(later).await.unwrap().id;
    append_notes(store, later, 1, 3).await;

    let running = new_session(store, "running").await;
    store.set_status(running, "running").await.unwrap();
    store.set_expiry(running, Some(now_ms() - 1)).await.unwrap();
    let idle = new_session(store, "idle").await;
    // Runs that wait for approval or are paused have not ended either.
    let mut suspended = Vec::new();
    for status in ["waiting", "paused"] {
        let session = new_session(store, status).await;
        store.set_status(session, status).await.unwrap();
        store.set_expiry(session, Some(now_ms() - 1)).await.unwrap();
        suspended.push(session);
    }

    // Only the expiry, without an age.
    assert_eq!(store.prune(None).await.unwrap(), 1);
    assert!(store.session(expired).await.unwrap().is_none());
    assert!(store.session(later).await.unwrap().is_some());
    assert!(store.session(running).await.unwrap().is_some());
    assert!(store.session(idle).await.unwrap().is_some());

    tokio::time::sleep(Duration::from_millis(300)).await;
    // Fresh: a new session and a fork of an old one.
    let fresh = new_session(store, "fresh").await;
    let fork = store
        .fork_session(later, 2, NewSession::new())
        .await
        .unwrap()
        .id;

    assert_eq!(
        store.prune(Some(Duration::from_millis(150))).await.unwrap(),
        2
    );
    assert!(store.session(later).await.unwrap().is_none());
    assert!(store.session(idle).await.unwrap().is_none());
    assert!(
        store.session(running).await.unwrap().is_some(),
        "running sessions stay"
    );
    for session in suspended {
        assert!(
            store.session(session).await.unwrap().is_some(),
            "waiting and paused sessions stay"
        );
    }
    assert!(store.session(fresh).await.unwrap().is_some());
    let log = history(store, fork).await;
    assert_eq!(
        log.iter().map(|(_, s, _)| *s).collect::<Vec<_>>(),
        [1, 2],
        "forks keep their history"
    );
    assert_eq!(h.event_rows().await, 2);
    assert_eq!(
        store.prune(Some(Duration::from_secs(3600))).await.unwrap(),
        0
    );
}
