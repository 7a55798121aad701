//! Forks: referenced prefixes, forks of forks, and deleting a parent.

use agentry_store::{NewSession, SessionId, Store, StoreError};
use serde_json::json;

use super::support::{Harness, append_notes, both_backends, history, new_session};

both_backends!(
    a_fork_references_its_parents_prefix,
    forks_of_forks_read_through_the_chain,
    fork_points_are_checked,
    deleting_a_parent_keeps_forks_whole,
    deleting_a_middle_session_relinks_to_the_grandparent,
);

/// The notes' numbers of a history, in order.
fn numbers(history: &[(SessionId, u64, serde_json::Value)]) -> Vec<u64> {
    history
        .iter()
        .map(|(_, _, p)| p["n"].as_u64().unwrap())
        .collect()
}

async fn fork(store: &Store, source: SessionId, at: u64) -> SessionId {
    let record = store
        .fork_session(source, at, NewSession::new())
        .await
        .unwrap();
    assert_eq!(record.parent, Some((source, at)));
    assert_eq!(record.last_seq, at);
    assert!(!record.unread());
    record.id
}

async fn a_fork_references_its_parents_prefix(h: &Harness) {
    let store = &h.store;
    let parent = new_session(store, "parent").await;
    append_notes(store, parent, 1, 10).await;
    assert_eq!(h.event_rows().await, 10);

    let child = fork(store, parent, 7).await;
    assert_eq!(h.event_rows().await, 10, "forking copies nothing");
    let stored = store.session(child).await.unwrap().unwrap();
    assert_eq!(stored.parent, Some((parent, 7)));
    assert_eq!(stored.last_seq, 7);

    let inherited = history(store, child).await;
    assert_eq!(numbers(&inherited), (1..=7).collect::<Vec<_>>());
    assert!(inherited.iter().all(|(session, _, _)| *session == parent));

    // The child continues at 8; the parent's later events stay its own.
    let own = store
        .append(
            child,
            Some(7),
            &[super::support::text_event("note", "child")],
        )
        .await
        .unwrap();
    assert_eq!(own[0].seq, 8);
    append_notes(store, child, 100, 1).await;
    append_notes(store, parent, 11, 1).await;
    assert_eq!(
        h.event_rows().await,
        13,
        "only the child's own events were added"
    );

    let log = history(store, child).await;
    assert_eq!(
        log.iter().map(|(_, s, _)| *s).collect::<Vec<_>>(),
        (1..=9).collect::<Vec<_>>()
    );
    assert_eq!(log[7], (child, 8, json!({"text": "child"})));
    assert_eq!(log[8], (child, 9, json!({"n": 100})));
    assert_eq!(
        numbers(&history(store, parent).await),
        (1..=11).collect::<Vec<_>>()
    );

    // Paging across the fork point.
    let page = store.events(child, 6, 2).await.unwrap();
    assert_eq!(
        page.iter()
            .map(|e| (e.session_id, e.seq))
            .collect::<Vec<_>>(),
        [(parent, 7), (child, 8)]
    );
    // Bytes count where they are stored.
    assert!(store.stored_bytes(child).await.unwrap() < store.stored_bytes(parent).await.unwrap());
}

async fn forks_of_forks_read_through_the_chain(h: &Harness) {
    let store = &h.store;
    let root = new_session(store, "root").await;
    append_notes(store, root, 1, 5).await; // root: 1..5
    let middle = fork(store, root, 3).await;
    append_notes(store, middle, 4, 3).await; // middle: 1..3 from root, 4..6 own
    let leaf = fork(store, middle, 5).await;
    append_notes(store, leaf, 6, 2).await; // leaf: 1..3 root, 4..5 middle, 6..7 own

    let log = history(store, leaf).await;
    assert_eq!(numbers(&log), (1..=7).collect::<Vec<_>>());
    let owners: Vec<SessionId> = log.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(owners, [root, root, root, middle, middle, leaf, leaf]);

    // A fork of the fork below its own fork point reads only the root.
    let early = fork(store, middle, 2).await;
    let log = history(store, early).await;
    assert_eq!(numbers(&log), [1, 2]);
    assert!(log.iter().all(|(s, _, _)| *s == root));

    let page = store.events(leaf, 2, 3).await.unwrap();
    assert_eq!(
        page.iter()
            .map(|e| (e.session_id, e.seq))
            .collect::<Vec<_>>(),
        [(root, 3), (middle, 4), (middle, 5)]
    );
    assert_eq!(h.event_rows().await, 5 + 3 + 2);
}

async fn fork_points_are_checked(h: &Harness) {
    let store = &h.store;
    let source = new_session(store, "source").await;
    append_notes(store, source, 1, 5).await;
    assert!(matches!(
        store.fork_session(source, 6, NewSession::new()).await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(
        store
            .fork_session(SessionId::new(), 0, NewSession::new())
            .await,
        Err(StoreError::NotFound(_))
    ));
    // An id that exists already.
    assert!(matches!(
        store
            .fork_session(source, 1, NewSession::with_id(source))
            .await,
        Err(StoreError::Conflict(_))
    ));
    // A fork at 0 inherits nothing and starts at 1.
    let empty = fork(store, source, 0).await;
    assert!(history(store, empty).await.is_empty());
    let stored = store
        .append(
            empty,
            Some(0),
            &[super::support::text_event("note", "first")],
        )
        .await
        .unwrap();
    assert_eq!(stored[0].seq, 1);
}

async fn deleting_a_parent_keeps_forks_whole(h: &Harness) {
    let store = &h.store;
    let parent = new_session(store, "parent").await;
    append_notes(store, parent, 1, 6).await;
    let child = fork(store, parent, 4).await;
    append_notes(store, child, 5, 2).await; // child: 1..4 parent, 5..6 own
    let grandchild = fork(store, child, 5).await;
    append_notes(store, grandchild, 6, 1).await; // 1..4 parent, 5 child, 6 own
    let sibling = fork(store, parent, 2).await; // 1..2 parent

    let numbers_of = |log: &[(SessionId, u64, serde_json::Value)]| numbers(log);
    let before = [
        numbers_of(&history(store, child).await),
        numbers_of(&history(store, grandchild).await),
        numbers_of(&history(store, sibling).await),
    ];
    assert_eq!(before[0], [1, 2, 3, 4, 5, 6]);

    assert!(store.delete_session(parent).await.unwrap());
    assert!(store.session(parent).await.unwrap().is_none());
    assert!(matches!(
        store.events(parent, 0, 10).await,
        Err(StoreError::NotFound(_))
    ));
    let after = [
        numbers_of(&history(store, child).await),
        numbers_of(&history(store, grandchild).await),
        numbers_of(&history(store, sibling).await),
    ];
    assert_eq!(after, before, "every fork still reads its whole history");
    let child_log = history(store, child).await;
    assert!(
        child_log.iter().all(|(s, _, _)| *s == child),
        "copied into the child"
    );
    assert_eq!(store.session(child).await.unwrap().unwrap().parent, None);
    assert_eq!(store.session(sibling).await.unwrap().unwrap().parent, None);
    assert_eq!(
        store.session(grandchild).await.unwrap().unwrap().parent,
        Some((child, 5))
    );

    // Deleting the next link down keeps the grandchild whole too.
    assert!(store.delete_session(child).await.unwrap());
    assert_eq!(numbers_of(&history(store, grandchild).await), before[1]);
    assert_eq!(
        store.session(grandchild).await.unwrap().unwrap().parent,
        None
    );
    // The forks keep appending where they were.
    let next = store
        .append(
            grandchild,
            Some(6),
            &[super::support::text_event("note", "on")],
        )
        .await
        .unwrap();
    assert_eq!(next[0].seq, 7);
    // Rows: sibling 2 + grandchild 6 + 1.
    assert_eq!(h.event_rows().await, 9);
}

async fn deleting_a_middle_session_relinks_to_the_grandparent(h: &Harness) {
    let store = &h.store;
    let root = new_session(store, "root").await;
    append_notes(store, root, 1, 5).await;
    let middle = fork(store, root, 3).await;
    append_notes(store, middle, 4, 3).await; // 1..3 root, 4..6 own
    let late = fork(store, middle, 5).await; // 1..3 root, 4..5 middle
    let early = fork(store, middle, 2).await; // 1..2 root
    let rows = h.event_rows().await;

    assert!(store.delete_session(middle).await.unwrap());
    let late_log = history(store, late).await;
    assert_eq!(numbers(&late_log), [1, 2, 3, 4, 5]);
    let owners: Vec<SessionId> = late_log.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(
        owners,
        [root, root, root, late, late],
        "the root stays referenced"
    );
    assert_eq!(
        store.session(late).await.unwrap().unwrap().parent,
        Some((root, 3))
    );
    assert_eq!(numbers(&history(store, early).await), [1, 2]);
    assert_eq!(
        store.session(early).await.unwrap().unwrap().parent,
        Some((root, 2))
    );
    // The middle's 3 rows went; its 2 referenced by `late` were copied.
    assert_eq!(h.event_rows().await, rows - 3 + 2);
    assert!(!store.delete_session(middle).await.unwrap());
}
