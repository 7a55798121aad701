//! Concurrent appends: gap-free numbering for one session, independence across many.

use std::collections::BTreeSet;

use agentry_store::{Backend, NewEvent, NewSession, SessionId, StoreError};
use serde_json::json;

use super::support::{Harness, both_backends, new_session};

both_backends!(
    fifty_appenders_to_one_session_leave_no_gaps,
    two_hundred_sessions_append_concurrently,
    concurrent_writes_share_commits_and_bad_ones_are_refused_alone,
    a_batch_that_fails_half_way_is_rolled_back_and_its_neighbours_commit,
);

async fn fifty_appenders_to_one_session_leave_no_gaps(h: &Harness) {
    let id = new_session(&h.store, "contended").await;
    let mut tasks = tokio::task::JoinSet::new();
    let mut expected_total = 0u64;
    for task in 0..50u64 {
        let count = task % 3 + 1;
        expected_total += count;
        let store = h.store.clone();
        tasks.spawn(async move {
            let events: Vec<NewEvent> = (0..count)
                .map(|i| NewEvent::new("note", json!({"task": task, "i": i})))
                .collect();
            let stored = store.append(id, None, &events).await.unwrap();
            (task, stored)
        });
    }
    let mut seen = BTreeSet::new();
    let mut by_seq = std::collections::BTreeMap::new();
    while let Some(result) = tasks.join_next().await {
        let (task, stored) = result.unwrap();
        assert_eq!(stored.len() as u64, task % 3 + 1);
        // One append's events are consecutive.
        for pair in stored.windows(2) {
            assert_eq!(pair[1].seq, pair[0].seq + 1);
        }
        for event in stored {
            assert!(seen.insert(event.seq), "seq {} handed out twice", event.seq);
            by_seq.insert(event.seq, event.payload);
        }
    }
    assert_eq!(seen, (1..=expected_total).collect::<BTreeSet<_>>());

    let log = h.store.events(id, 0, 1000).await.unwrap();
    assert_eq!(
        log.iter().map(|e| e.seq).collect::<Vec<_>>(),
        (1..=expected_total).collect::<Vec<_>>()
    );
    for event in &log {
        assert_eq!(by_seq[&event.seq], event.payload, "seq {}", event.seq);
    }
    assert_eq!(
        h.store.session(id).await.unwrap().unwrap().last_seq,
        expected_total
    );
}

async fn two_hundred_sessions_append_concurrently(h: &Harness) {
    let mut ids = Vec::new();
    for i in 0..200 {
        ids.push(new_session(&h.store, &format!("s{i}")).await);
    }
    let mut tasks = tokio::task::JoinSet::new();
    for (i, id) in ids.iter().copied().enumerate() {
        let store = h.store.clone();
        tasks.spawn(async move {
            for round in 0..3u64 {
                let events = [
                    NewEvent::new("note", json!({"session": i, "round": round, "part": 0})),
                    NewEvent::new("note", json!({"session": i, "round": round, "part": 1})),
                ];
                let stored = store.append(id, Some(round * 2), &events).await.unwrap();
                assert_eq!(stored[0].seq, round * 2 + 1);
            }
        });
    }
    while let Some(result) = tasks.join_next().await {
        result.unwrap();
    }
    for (i, id) in ids.iter().copied().enumerate() {
        let log = h.store.events(id, 0, 100).await.unwrap();
        assert_eq!(
            log.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6]
        );
        assert!(log.iter().all(|e| e.payload["session"] == i));
        assert_eq!(log[5].payload, json!({"session": i, "round": 2, "part": 1}));
    }
    assert_eq!(h.event_rows().await, 1200);
}

/// Group commit: writes sent at once share transactions; a write that cannot apply (an unknown
/// session, a stale expected seq) is refused alone while the rest of its batch commits; events
/// and a status sent together land together.
async fn concurrent_writes_share_commits_and_bad_ones_are_refused_alone(h: &Harness) {
    // Creations go through the same writer: concurrent ones share commits too, and an id that
    // exists is a conflict for that creation alone.
    let ids: Vec<SessionId> = (0..100).map(|_| SessionId::new()).collect();
    let before = h.store.commit_counts();
    let mut creations = tokio::task::JoinSet::new();
    for (i, id) in ids.iter().copied().enumerate() {
        for attempt in 0..if i < 5 { 2 } else { 1 } {
            let store = h.store.clone();
            creations.spawn(async move {
                let mut new = NewSession::with_id(id);
                new.title = Some(format!("g{i}.{attempt}"));
                store.create_session(new).await
            });
        }
    }
    let (mut created, mut conflicts) = (0, 0);
    while let Some(result) = creations.join_next().await {
        match result.unwrap() {
            Ok(_) => created += 1,
            Err(StoreError::Conflict(_)) => conflicts += 1,
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!((created, conflicts), (100, 5));
    let after = h.store.commit_counts();
    assert_eq!(after.writes - before.writes, 100);
    assert!(after.commits - before.commits < 100, "{after:?}");

    let before = h.store.commit_counts();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, id) in ids.iter().copied().enumerate() {
        let store = h.store.clone();
        tasks.spawn(async move {
            let events = [NewEvent::new("note", json!({"session": i}))];
            let stored = if i % 2 == 0 {
                store
                    .append_and_set_status(id, &events, "running", None)
                    .await
            } else {
                store.append(id, Some(0), &events).await
            };
            ("good", stored.map(|stored| stored[0].seq))
        });
    }
    for (i, stale) in ids.iter().copied().enumerate().take(20) {
        let store = h.store.clone();
        tasks.spawn(async move {
            let events = [NewEvent::new("note", json!({"stale": i}))];
            (
                "stale",
                store.append(stale, Some(7), &events).await.map(|_| 0),
            )
        });
        let store = h.store.clone();
        tasks.spawn(async move {
            let events = [NewEvent::new("note", json!({"unknown": i}))];
            let unknown = SessionId::new();
            (
                "unknown",
                store.append(unknown, None, &events).await.map(|_| 0),
            )
        });
    }
    let mut good = 0;
    while let Some(result) = tasks.join_next().await {
        match result.unwrap() {
            ("good", seq) => {
                assert_eq!(seq.unwrap(), 1);
                good += 1;
            }
            ("stale", refused) => {
                assert!(
                    matches!(refused, Err(StoreError::Conflict(_))),
                    "{refused:?}"
                )
            }
            (_, refused) => {
                assert!(
                    matches!(refused, Err(StoreError::NotFound(_))),
                    "{refused:?}"
                )
            }
        }
    }
    assert_eq!(good, 100);
    let after = h.store.commit_counts();
    assert_eq!(
        after.writes - before.writes,
        100,
        "refused writes are not counted"
    );
    assert!(
        after.commits - before.commits < 100,
        "100 writes sent at once took {} commits",
        after.commits - before.commits
    );
    for (i, id) in ids.iter().copied().enumerate() {
        let log = h.store.events(id, 0, 10).await.unwrap();
        assert_eq!(log.len(), 1, "session {i}: {log:?}");
        assert_eq!(log[0].payload, json!({"session": i}));
        let status = h.store.session(id).await.unwrap().unwrap().status;
        assert_eq!(status, if i % 2 == 0 { "running" } else { "idle" });
    }
}

/// A batch whose transaction fails half-way (a trigger refuses one event, after the sessions
/// advanced) is rolled back whole: the refused write gets the database's error, the writes
/// beside it commit (retried alone), no seq is used up, and the writer's connection carries no
/// open transaction into the next batch.
async fn a_batch_that_fails_half_way_is_rolled_back_and_its_neighbours_commit(h: &Harness) {
    match h.store.backend() {
        Backend::Sqlite => {
            h.raw_exec(
                "CREATE TRIGGER refuse_boom BEFORE INSERT ON events WHEN NEW.kind = 'boom' \
                 BEGIN SELECT RAISE(ABORT, 'boom refused'); END",
            )
            .await
        }
        Backend::Postgres => {
            h.raw_exec(
                "CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN IF NEW.kind = 'boom' THEN RAISE EXCEPTION 'boom refused'; END IF; \
                 RETURN NEW; END $$",
            )
            .await;
            h.raw_exec(
                "CREATE TRIGGER refuse_boom BEFORE INSERT ON events FOR EACH ROW \
                 EXECUTE FUNCTION refuse_boom()",
            )
            .await
        }
    }
    let good: Vec<SessionId> = vec![
        new_session(&h.store, "good one").await,
        new_session(&h.store, "good two").await,
    ];
    let bad = new_session(&h.store, "bad").await;
    for round in 0..3 {
        let mut tasks = tokio::task::JoinSet::new();
        for id in good.iter().copied() {
            let store = h.store.clone();
            tasks.spawn(async move {
                let events = [NewEvent::new("note", json!({ "round": round }))];
                (id, store.append(id, None, &events).await)
            });
        }
        let store = h.store.clone();
        tasks.spawn(async move {
            let events = [
                NewEvent::new("note", json!({ "before": "boom" })),
                NewEvent::new("boom", json!({})),
            ];
            (bad, store.append(bad, None, &events).await)
        });
        while let Some(joined) = tasks.join_next().await {
            let (id, outcome) = joined.unwrap();
            if id == bad {
                let error = outcome.expect_err("the trigger refuses the event");
                assert!(error.to_string().contains("boom refused"), "{error}");
            } else {
                let stored = outcome.unwrap();
                assert_eq!(stored.len(), 1);
                assert_eq!(stored[0].seq, round + 1, "round {round}");
            }
        }
    }
    // Nothing of the refused writes stayed: not their first event, not their seqs.
    assert_eq!(h.store.session(bad).await.unwrap().unwrap().last_seq, 0);
    assert!(h.store.events(bad, 0, 100).await.unwrap().is_empty());
    for id in &good {
        assert_eq!(h.store.session(*id).await.unwrap().unwrap().last_seq, 3);
    }
    // The next writes go through: no transaction was left open on the writer's connection.
    let stored = h
        .store
        .append(
            bad,
            Some(0),
            &[NewEvent::new("note", json!({ "after": "boom" }))],
        )
        .await
        .unwrap();
    assert_eq!(stored[0].seq, 1);
    h.store
        .create_session(NewSession::with_id(SessionId::new()))
        .await
        .unwrap();
}
