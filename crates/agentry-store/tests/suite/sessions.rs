//! Sessions: create, read, list, title, status, read state, expiry, delete.

use std::time::Duration;

use agentry_store::{NewSession, SessionId, SessionQuery, StoreError};
use serde_json::json;

use super::support::{Harness, append_notes, both_backends, new_session, now_ms, text_event};

both_backends!(
    sessions_are_created_listed_and_filtered,
    titles_statuses_and_expiry_are_updated,
    read_state_follows_mark_read,
    deleting_a_session_removes_its_events,
    sessions_belong_to_their_owner,
    a_session_is_created_with_its_first_events_in_one_commit,
);

async fn pause() {
    // Activity times are in milliseconds: keep the order unambiguous.
    tokio::time::sleep(Duration::from_millis(5)).await;
}

async fn sessions_are_created_listed_and_filtered(h: &Harness) {
    let store = &h.store;
    let before = now_ms();
    let mut new = NewSession::new();
    new.title = Some("first".into());
    new.metadata = json!({"agent": "coder", "tags": ["a", "b"]});
    let first = store.create_session(new.clone()).await.unwrap();
    assert_eq!(first.id, new.id);
    assert_eq!(first.status, "idle");
    assert_eq!((first.last_seq, first.read_seq), (0, 0));
    assert!(first.created_at >= before && first.last_activity == first.created_at);
    assert_eq!(store.session(first.id).await.unwrap().unwrap(), first);
    assert!(matches!(
        store.create_session(new).await,
        Err(StoreError::Conflict(_))
    ));

    pause().await;
    let second = new_session(store, "second").await;
    pause().await;
    let third = new_session(store, "third").await;
    pause().await;
    append_notes(store, first.id, 1, 1).await; // the first is now the most recent

    let all = store.list_sessions(&SessionQuery::default()).await.unwrap();
    let order: Vec<SessionId> = all.iter().map(|s| s.id).collect();
    assert_eq!(order, [first.id, third, second]);
    assert_eq!(
        all[0].metadata,
        json!({"agent": "coder", "tags": ["a", "b"]})
    );

    store.set_status(second, "running").await.unwrap();
    let running = store
        .list_sessions(&SessionQuery {
            status: Some("running".into()),
            ..SessionQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(running.iter().map(|s| s.id).collect::<Vec<_>>(), [second]);

    let page = store
        .list_sessions(&SessionQuery {
            limit: 1,
            offset: 1,
            ..SessionQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(page.iter().map(|s| s.id).collect::<Vec<_>>(), [third]);
    assert!(store.session(SessionId::new()).await.unwrap().is_none());
}

async fn titles_statuses_and_expiry_are_updated(h: &Harness) {
    let store = &h.store;
    let id = new_session(store, "old title").await;
    store.set_title(id, "new title ✓").await.unwrap();
    store.set_status(id, "interrupted").await.unwrap();
    let expires = now_ms() + 60_000;
    store.set_expiry(id, Some(expires)).await.unwrap();
    let record = store.session(id).await.unwrap().unwrap();
    assert_eq!(record.title.as_deref(), Some("new title ✓"));
    assert_eq!(record.status, "interrupted");
    assert_eq!(record.expires_at, Some(expires));
    store.set_expiry(id, None).await.unwrap();
    assert_eq!(store.session(id).await.unwrap().unwrap().expires_at, None);

    for bad in ["Running", "", "run-ning", "idle ", &"a".repeat(33)] {
        assert!(
            matches!(
                store.set_status(id, bad).await,
                Err(StoreError::InvalidInput(_))
            ),
            "{bad:?}"
        );
    }
    store.set_status(id, &"a".repeat(32)).await.unwrap();
    assert!(matches!(
        store.set_title(id, &"t".repeat(1001)).await,
        Err(StoreError::InvalidInput(_))
    ));
    let unknown = SessionId::new();
    assert!(matches!(
        store.set_status(unknown, "idle").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.set_title(unknown, "x").await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.set_expiry(unknown, None).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn read_state_follows_mark_read(h: &Harness) {
    let store = &h.store;
    let id = new_session(store, "inbox").await;
    assert!(!store.session(id).await.unwrap().unwrap().unread());
    store
        .append(
            id,
            None,
            &[text_event("note", "a"), text_event("note", "b")],
        )
        .await
        .unwrap();
    assert!(store.session(id).await.unwrap().unwrap().unread());
    store.mark_read(id, 2).await.unwrap();
    let record = store.session(id).await.unwrap().unwrap();
    assert_eq!(record.read_seq, 2);
    assert!(!record.unread());
    assert!(matches!(
        store.mark_read(id, 3).await,
        Err(StoreError::InvalidInput(_))
    ));
    store.mark_read(id, 1).await.unwrap();
    assert!(store.session(id).await.unwrap().unwrap().unread());
    assert!(matches!(
        store.mark_read(SessionId::new(), 0).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn deleting_a_session_removes_its_events(h: &Harness) {
    let store = &h.store;
    let keep = new_session(store, "keep").await;
    let gone = new_session(store, "gone").await;
    append_notes(store, keep, 1, 2).await;
    append_notes(store, gone, 1, 3).await;
    assert_eq!(h.event_rows().await, 5);

    assert!(store.delete_session(gone).await.unwrap());
    assert_eq!(h.event_rows().await, 2);
    assert!(store.session(gone).await.unwrap().is_none());
    assert!(matches!(
        store.events(gone, 0, 10).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store
            .append(gone, None, &[text_event("note", "late")])
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert!(!store.delete_session(gone).await.unwrap());
    assert_eq!(store.events(keep, 0, 10).await.unwrap().len(), 2);
}

async fn sessions_belong_to_their_owner(h: &Harness) {
    let store = &h.store;
    let mut alice = NewSession::new();
    alice.owner = Some("aaaaaaaaaaaa".into());
    let alice = store.create_session(alice).await.unwrap();
    assert_eq!(alice.owner.as_deref(), Some("aaaaaaaaaaaa"));
    pause().await;
    let mut bob = NewSession::new();
    bob.owner = Some("bbbbbbbbbbbb".into());
    let bob = store.create_session(bob).await.unwrap();
    pause().await;
    let operator = store.create_session(NewSession::new()).await.unwrap();
    for (session, word) in [(alice.id, "needle alpha"), (bob.id, "needle beta")] {
        store
            .append(session, None, &[text_event("note", word)])
            .await
            .unwrap();
    }
    assert_eq!(
        store
            .session(bob.id)
            .await
            .unwrap()
            .unwrap()
            .owner
            .as_deref(),
        Some("bbbbbbbbbbbb")
    );
    let owned = |owner: Option<&str>| SessionQuery {
        owner: owner.map(str::to_owned),
        ..SessionQuery::default()
    };
    let of_alice = store
        .list_sessions(&owned(Some("aaaaaaaaaaaa")))
        .await
        .unwrap();
    assert_eq!(
        of_alice.iter().map(|s| s.id).collect::<Vec<_>>(),
        [alice.id]
    );
    let all = store.list_sessions(&owned(None)).await.unwrap();
    assert_eq!(all.len(), 3);
    assert!(all.iter().any(|s| s.id == operator.id && s.owner.is_none()));
    // With a status too.
    store.set_status(bob.id, "running").await.unwrap();
    let running_of_alice = store
        .list_sessions(&SessionQuery {
            status: Some("running".into()),
            owner: Some("aaaaaaaaaaaa".into()),
            ..SessionQuery::default()
        })
        .await
        .unwrap();
    assert!(running_of_alice.is_empty());
    // Search sees only the owner's sessions when asked to.
    let hits = store
        .search_owned("needle", 10, Some("bbbbbbbbbbbb"))
        .await
        .unwrap();
    assert_eq!(
        hits.iter().map(|h| h.session_id).collect::<Vec<_>>(),
        [bob.id]
    );
    assert_eq!(store.search("needle", 10).await.unwrap().len(), 2);
    // A fork keeps the owner it is given.
    let mut fork = NewSession::new();
    fork.owner = alice.owner.clone();
    let fork = store.fork_session(alice.id, 1, fork).await.unwrap();
    assert_eq!(
        store
            .session(fork.id)
            .await
            .unwrap()
            .unwrap()
            .owner
            .as_deref(),
        Some("aaaaaaaaaaaa")
    );
}

async fn a_session_is_created_with_its_first_events_in_one_commit(h: &Harness) {
    let store = &h.store;
    let mut new = NewSession::new();
    new.title = Some("with its start".into());
    new.owner = Some("key-1".into());
    let before = store.commit_counts();
    let last = store
        .create_session_with_events(
            new.clone(),
            &[text_event("run_started", "a"), text_event("message", "b")],
            Some("running"),
        )
        .await
        .unwrap();
    assert_eq!(last, 2);
    let after = store.commit_counts();
    assert_eq!(
        (after.writes - before.writes, after.commits - before.commits),
        (1, 1)
    );
    // The commit's time is counted before the write is answered.
    assert!(
        after.busy_micros > before.busy_micros,
        "{before:?} {after:?}"
    );
    let record = store.session(new.id).await.unwrap().unwrap();
    assert_eq!(record.title.as_deref(), Some("with its start"));
    assert_eq!(record.owner.as_deref(), Some("key-1"));
    assert_eq!((record.status.as_str(), record.last_seq), ("running", 2));
    let kinds: Vec<String> = store
        .events(new.id, 0, 10)
        .await
        .unwrap()
        .into_iter()
        .map(|event| event.kind)
        .collect();
    assert_eq!(kinds, ["run_started", "message"]);

    // An id that exists is refused, and the session it names is left as it was.
    let again = store
        .create_session_with_events(new.clone(), &[text_event("message", "c")], Some("idle"))
        .await;
    assert!(matches!(again, Err(StoreError::Conflict(_))), "{again:?}");
    let record = store.session(new.id).await.unwrap().unwrap();
    assert_eq!((record.status.as_str(), record.last_seq), ("running", 2));
    assert_eq!(store.events(new.id, 0, 10).await.unwrap().len(), 2);

    // Many at once share commits, each with its own events.
    let ids: Vec<SessionId> = (0..40).map(|_| SessionId::new()).collect();
    let writes = ids.iter().map(|id| {
        let mut new = NewSession::with_id(*id);
        new.title = Some(id.to_string());
        async move {
            store
                .create_session_with_events(new, &[text_event("message", "x")], None)
                .await
        }
    });
    for last in futures::future::join_all(writes).await {
        assert_eq!(last.unwrap(), 1);
    }
    for id in &ids {
        let record = store.session(*id).await.unwrap().unwrap();
        assert_eq!((record.status.as_str(), record.last_seq), ("idle", 1));
        assert_eq!(record.title, Some(id.to_string()));
    }
}
