//! The run queue: idempotent enqueueing, the bound, claims in priority order, leases fenced by
//! their epoch, expired leases claimed again, cancellation, listing; and many workers claiming
//! at once, each run claimed exactly once.

use std::collections::BTreeSet;
use std::time::Duration;

use agentry_store::{
    Enqueued, NewEvent, NewRun, NewSession, RunMark, RunQuery, RunState, StoreError,
};
use agentry_types::RunId;
use serde_json::json;

use super::support::{Harness, both_backends, new_session};

both_backends!(
    enqueue_is_idempotent_and_bounded,
    a_run_in_a_new_session_is_stored_with_its_session_or_not_at_all,
    claims_follow_priority_and_leases_are_fenced,
    an_expired_lease_is_claimed_again_and_the_old_worker_is_refused,
    cancel_stops_a_queued_run_and_marks_a_running_one,
    runs_are_listed_by_session_agent_and_state,
    five_hundred_runs_claimed_by_eight_workers_each_exactly_once,
    one_key_submitted_twenty_times_at_once_makes_one_run,
    a_stale_owners_append_is_refused,
    an_agents_limit_holds_its_runs_in_the_queue,
    runs_started_in_sessions_are_recorded_by_their_appends,
);

fn new_run(session: agentry_types::SessionId, key: Option<&str>, digest: &str) -> NewRun {
    NewRun {
        id: RunId::new(),
        session_id: session,
        agent_id: Some("helper".into()),
        owner: None,
        priority: 0,
        idempotency_key: key.map(str::to_owned),
        schedule_id: None,
        webhook_url: None,
        agent_limit: None,
        request_digest: digest.into(),
        request: json!({"text": digest}),
        new_session: None,
    }
}

fn created(enqueued: Enqueued) -> agentry_store::RunRecord {
    match enqueued {
        Enqueued::Created(record) => record,
        other => panic!("expected a new run, got {other:?}"),
    }
}

async fn enqueue_is_idempotent_and_bounded(h: &Harness) {
    let session = new_session(&h.store, "queue").await;
    let first = created(
        h.store
            .enqueue_run(&new_run(session, Some("k1"), "a"), 10)
            .await
            .unwrap(),
    );
    assert_eq!(first.state, RunState::Queued);
    assert_eq!(first.attempt, 0);
    assert_eq!(first.request, json!({"text": "a"}));

    // The same key and request: the same run, nothing new stored.
    match h
        .store
        .enqueue_run(&new_run(session, Some("k1"), "a"), 10)
        .await
        .unwrap()
    {
        Enqueued::Existing(record) => assert_eq!(record.id, first.id),
        other => panic!("expected the earlier run, got {other:?}"),
    }
    // The same key with another request: a conflict.
    let error = h
        .store
        .enqueue_run(&new_run(session, Some("k1"), "b"), 10)
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Conflict(_)), "{error}");
    // Another owner may use the same key.
    let mut other_owner = new_run(session, Some("k1"), "b");
    other_owner.owner = Some("key-2".into());
    created(h.store.enqueue_run(&other_owner, 10).await.unwrap());
    // A bad key is refused.
    let error = h
        .store
        .enqueue_run(&new_run(session, Some(""), "c"), 10)
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::InvalidInput(_)), "{error}");

    assert_eq!(h.store.queued_runs().await.unwrap(), 2);
    // The bound: two wait already.
    match h
        .store
        .enqueue_run(&new_run(session, None, "d"), 2)
        .await
        .unwrap()
    {
        Enqueued::QueueFull { max_queued } => assert_eq!(max_queued, 2),
        other => panic!("expected a full queue, got {other:?}"),
    }
    assert_eq!(h.store.queued_runs().await.unwrap(), 2);
}

/// A run submitted in a new session creates the session in the transaction that stores the
/// run's record: a full queue, a reused key or a session that exists stores neither.
async fn a_run_in_a_new_session_is_stored_with_its_session_or_not_at_all(h: &Harness) {
    let in_new = |key: Option<&str>, digest: &str| {
        let session = agentry_types::SessionId::new();
        let mut run = new_run(session, key, digest);
        let mut new = NewSession::with_id(session);
        new.title = Some("queued".into());
        new.owner = Some("key-1".into());
        run.new_session = Some(new);
        run
    };
    let run = in_new(Some("k"), "a");
    let record = created(h.store.enqueue_run(&run, 1).await.unwrap());
    let session = h.store.session(run.session_id).await.unwrap().unwrap();
    assert_eq!(record.session_id, session.id);
    assert_eq!(
        (session.title.as_deref(), session.owner.as_deref()),
        (Some("queued"), Some("key-1"))
    );
    assert_eq!((session.status.as_str(), session.last_seq), ("idle", 0));

    // The queue is full (one waits, at most one may): neither run nor session.
    let full = in_new(None, "b");
    assert!(matches!(
        h.store.enqueue_run(&full, 1).await.unwrap(),
        Enqueued::QueueFull { .. }
    ));
    assert!(h.store.session(full.session_id).await.unwrap().is_none());
    // The same key again: the first run, and no second session.
    let again = in_new(Some("k"), "a");
    match h.store.enqueue_run(&again, 10).await.unwrap() {
        Enqueued::Existing(existing) => assert_eq!(existing.id, record.id),
        other => panic!("expected the earlier run, got {other:?}"),
    }
    assert!(h.store.session(again.session_id).await.unwrap().is_none());
    // A session that exists already: refused, and no run stored.
    let mut taken = in_new(None, "c");
    taken.session_id = run.session_id;
    if let Some(new) = taken.new_session.as_mut() {
        new.id = run.session_id;
    }
    assert!(h.store.enqueue_run(&taken, 10).await.is_err());
    assert!(h.store.run_record(taken.id).await.unwrap().is_none());
    // A new session that is not the run's: refused before anything is written.
    let mut mismatched = in_new(None, "d");
    mismatched.session_id = run.session_id;
    let error = h.store.enqueue_run(&mismatched, 10).await.unwrap_err();
    assert!(matches!(error, StoreError::InvalidInput(_)), "{error}");
    assert_eq!(h.store.queued_runs().await.unwrap(), 1);
}

async fn claims_follow_priority_and_leases_are_fenced(h: &Harness) {
    let session = new_session(&h.store, "claims").await;
    let low = created(
        h.store
            .enqueue_run(&new_run(session, None, "low"), 10)
            .await
            .unwrap(),
    );
    let mut urgent = new_run(session, None, "urgent");
    urgent.priority = 5;
    let urgent = created(h.store.enqueue_run(&urgent, 10).await.unwrap());

    let claimed = h
        .store
        .claim_runs("w1", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].id, urgent.id, "the higher priority first");
    assert_eq!(claimed[0].state, RunState::Running);
    assert_eq!(claimed[0].attempt, 1);
    assert!(claimed[0].started_at.is_some());
    let lease = claimed[0].lease().unwrap();
    assert_eq!((lease.worker.as_str(), lease.epoch), ("w1", 1));

    // Nothing else but `low` is claimable.
    let next = h
        .store
        .claim_runs("w2", 5, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(next.iter().map(|r| r.id).collect::<Vec<_>>(), vec![low.id]);
    assert!(
        h.store
            .claim_runs("w3", 5, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty()
    );

    assert!(
        h.store
            .renew_lease(&lease, Duration::from_secs(30))
            .await
            .unwrap()
    );
    let mut stale = lease.clone();
    stale.epoch += 1;
    assert!(
        !h.store
            .renew_lease(&stale, Duration::from_secs(30))
            .await
            .unwrap()
    );
    stale.epoch = lease.epoch;
    stale.worker = "w2".into();
    assert!(
        !h.store
            .settle_run(&stale, RunState::Failed, None)
            .await
            .unwrap()
    );

    let outcome = json!({"text": "done"});
    assert!(
        h.store
            .settle_run(&lease, RunState::Succeeded, Some(&outcome))
            .await
            .unwrap()
    );
    let record = h.store.run_record(urgent.id).await.unwrap().unwrap();
    assert_eq!(record.state, RunState::Succeeded);
    assert_eq!(record.outcome, Some(outcome));
    assert!(record.finished_at.is_some());
    assert_eq!(record.worker, None);
    // Settled: the lease is spent.
    assert!(
        !h.store
            .renew_lease(&lease, Duration::from_secs(30))
            .await
            .unwrap()
    );
    assert!(
        !h.store
            .settle_run(&lease, RunState::Failed, None)
            .await
            .unwrap()
    );
    // A final run stays final.
    assert!(
        !h.store
            .set_run_state(urgent.id, RunState::Running, None)
            .await
            .unwrap()
    );
}

async fn an_expired_lease_is_claimed_again_and_the_old_worker_is_refused(h: &Harness) {
    let session = new_session(&h.store, "expiry").await;
    let run = created(
        h.store
            .enqueue_run(&new_run(session, None, "x"), 10)
            .await
            .unwrap(),
    );
    let first = h
        .store
        .claim_runs("dead", 1, Duration::from_millis(1))
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = h
        .store
        .claim_runs("alive", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(second.len(), 1, "an expired lease is claimable");
    assert_eq!(second[0].id, run.id);
    assert_eq!(second[0].attempt, 2);
    assert_eq!(second[0].lease_epoch, 2);
    let old = first[0].lease().unwrap();
    assert!(
        !h.store
            .renew_lease(&old, Duration::from_secs(30))
            .await
            .unwrap()
    );
    assert!(
        !h.store
            .settle_run(&old, RunState::Failed, None)
            .await
            .unwrap()
    );
    let new = second[0].lease().unwrap();
    assert!(
        h.store
            .settle_run(&new, RunState::Waiting, None)
            .await
            .unwrap()
    );
    let record = h.store.run_record(run.id).await.unwrap().unwrap();
    assert_eq!(record.state, RunState::Waiting);
    assert_eq!(record.finished_at, None);
    // Decided later, it goes on outside the queue, then ends.
    assert!(
        h.store
            .set_run_state(run.id, RunState::Running, None)
            .await
            .unwrap()
    );
    assert!(
        h.store
            .set_run_state(run.id, RunState::Succeeded, Some(&json!({"ok": true})))
            .await
            .unwrap()
    );
    assert!(
        h.store
            .run_record(run.id)
            .await
            .unwrap()
            .unwrap()
            .finished_at
            .is_some()
    );
}

async fn cancel_stops_a_queued_run_and_marks_a_running_one(h: &Harness) {
    let session = new_session(&h.store, "cancel").await;
    let queued = created(
        h.store
            .enqueue_run(&new_run(session, None, "q"), 10)
            .await
            .unwrap(),
    );
    let record = h.store.cancel_run(queued.id).await.unwrap().unwrap();
    assert_eq!(record.state, RunState::Cancelled);
    assert!(record.cancel_requested);
    assert!(record.finished_at.is_some());

    let running = created(
        h.store
            .enqueue_run(&new_run(session, None, "r"), 10)
            .await
            .unwrap(),
    );
    let claimed = h
        .store
        .claim_runs("w", 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(claimed[0].id, running.id);
    let record = h.store.cancel_run(running.id).await.unwrap().unwrap();
    assert_eq!(record.state, RunState::Running, "its worker stops it");
    assert!(record.cancel_requested);
    assert!(h.store.cancel_run(RunId::new()).await.unwrap().is_none());
}

async fn runs_are_listed_by_session_agent_and_state(h: &Harness) {
    let one = new_session(&h.store, "one").await;
    let two = new_session(&h.store, "two").await;
    let a = created(
        h.store
            .enqueue_run(&new_run(one, None, "a"), 10)
            .await
            .unwrap(),
    );
    let mut b = new_run(two, None, "b");
    b.agent_id = Some("other".into());
    b.owner = Some("key-1".into());
    let b = created(h.store.enqueue_run(&b, 10).await.unwrap());
    let all = h
        .store
        .list_runs(&RunQuery {
            limit: 10,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|r| r.id).collect::<Vec<_>>(),
        vec![b.id, a.id]
    );
    let query = |query: RunQuery| {
        let store = h.store.clone();
        async move {
            store
                .list_runs(&RunQuery { limit: 10, ..query })
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.id)
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        query(RunQuery {
            session_id: Some(one),
            ..RunQuery::default()
        })
        .await,
        vec![a.id]
    );
    assert_eq!(
        query(RunQuery {
            agent_id: Some("other".into()),
            ..RunQuery::default()
        })
        .await,
        vec![b.id]
    );
    assert_eq!(
        query(RunQuery {
            owner: Some("key-1".into()),
            ..RunQuery::default()
        })
        .await,
        vec![b.id]
    );
    assert_eq!(
        query(RunQuery {
            state: Some(RunState::Running),
            ..RunQuery::default()
        })
        .await,
        Vec::<RunId>::new()
    );
    assert_eq!(
        query(RunQuery {
            created_after: Some(b.created_at + 1),
            ..RunQuery::default()
        })
        .await,
        Vec::<RunId>::new()
    );
    assert_eq!(
        query(RunQuery {
            offset: 1,
            ..RunQuery::default()
        })
        .await,
        vec![a.id]
    );
    // Counted with the same filters, limit and offset aside.
    for (filter, expected) in [
        (RunQuery::default(), 2),
        (
            RunQuery {
                owner: Some("key-1".into()),
                limit: 1,
                offset: 5,
                ..RunQuery::default()
            },
            1,
        ),
        (
            RunQuery {
                state: Some(RunState::Queued),
                session_id: Some(one),
                ..RunQuery::default()
            },
            1,
        ),
        (
            RunQuery {
                state: Some(RunState::Running),
                ..RunQuery::default()
            },
            0,
        ),
    ] {
        assert_eq!(
            h.store.count_runs(&filter).await.unwrap(),
            expected,
            "{filter:?}"
        );
    }
}

async fn five_hundred_runs_claimed_by_eight_workers_each_exactly_once(h: &Harness) {
    let session = new_session(&h.store, "many").await;
    let mut submit = tokio::task::JoinSet::new();
    for i in 0..500 {
        let store = h.store.clone();
        submit.spawn(async move {
            let run = new_run(session, Some(&format!("key-{i}")), &format!("r{i}"));
            match store.enqueue_run(&run, 10_000).await.unwrap() {
                Enqueued::Created(record) => record.id,
                other => panic!("{other:?}"),
            }
        });
    }
    let mut submitted = BTreeSet::new();
    while let Some(id) = submit.join_next().await {
        assert!(submitted.insert(id.unwrap()));
    }
    assert_eq!(submitted.len(), 500);

    let mut workers = tokio::task::JoinSet::new();
    for worker in 0..8 {
        let store = h.store.clone();
        workers.spawn(async move {
            let name = format!("w{worker}");
            let mut mine = Vec::new();
            loop {
                let claimed = store
                    .claim_runs(&name, 7, Duration::from_secs(60))
                    .await
                    .unwrap();
                if claimed.is_empty() {
                    break;
                }
                for run in claimed {
                    let lease = run.lease().unwrap();
                    assert!(
                        store
                            .settle_run(&lease, RunState::Succeeded, None)
                            .await
                            .unwrap()
                    );
                    mine.push(run.id);
                }
            }
            mine
        });
    }
    let mut claimed = Vec::new();
    while let Some(mine) = workers.join_next().await {
        claimed.extend(mine.unwrap());
    }
    assert_eq!(claimed.len(), 500, "every run claimed exactly once");
    assert_eq!(claimed.into_iter().collect::<BTreeSet<_>>(), submitted);
    let done = h
        .store
        .list_runs(&RunQuery {
            state: Some(RunState::Succeeded),
            limit: 1000,
            ..RunQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(done.len(), 500);
    assert!(done.iter().all(|run| run.attempt == 1));
}

async fn one_key_submitted_twenty_times_at_once_makes_one_run(h: &Harness) {
    let session = new_session(&h.store, "same key").await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..20 {
        let store = h.store.clone();
        tasks.spawn(async move {
            store
                .enqueue_run(&new_run(session, Some("once"), "same"), 100)
                .await
                .unwrap()
        });
    }
    let mut created = 0;
    let mut ids = BTreeSet::new();
    while let Some(enqueued) = tasks.join_next().await {
        match enqueued.unwrap() {
            Enqueued::Created(record) => {
                created += 1;
                ids.insert(record.id);
            }
            Enqueued::Existing(record) => {
                ids.insert(record.id);
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(created, 1);
    assert_eq!(ids.len(), 1);
    assert_eq!(h.store.queued_runs().await.unwrap(), 1);
}

async fn a_stale_owners_append_is_refused(h: &Harness) {
    let session = new_session(&h.store, "fenced").await;
    created(
        h.store
            .enqueue_run(&new_run(session, None, "f"), 10)
            .await
            .unwrap(),
    );
    let first = h
        .store
        .claim_runs("old", 1, Duration::from_millis(1))
        .await
        .unwrap()
        .remove(0)
        .lease()
        .unwrap();
    let event = |n: u32| vec![agentry_store::NewEvent::new("note", json!({"n": n}))];
    // The owner writes.
    h.store
        .append_fenced(session, &event(1), &first)
        .await
        .unwrap();
    // Its lease expires and another worker claims the run.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let second = h
        .store
        .claim_runs("new", 1, Duration::from_secs(30))
        .await
        .unwrap()
        .remove(0)
        .lease()
        .unwrap();
    assert_eq!(second.epoch, first.epoch + 1);
    // The old owner is refused, and writes nothing; the new one writes.
    let error = h
        .store
        .append_fenced(session, &event(2), &first)
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::StaleLease(_)), "{error}");
    h.store
        .append_fenced(session, &event(3), &second)
        .await
        .unwrap();
    let log = h.store.events(session, 0, 100).await.unwrap();
    let written: Vec<u64> = log
        .iter()
        .map(|e| e.payload["n"].as_u64().unwrap())
        .collect();
    assert_eq!(written, vec![1, 3]);
    // A settled run fences every further write too.
    assert!(
        h.store
            .settle_run(&second, RunState::Succeeded, None)
            .await
            .unwrap()
    );
    let error = h
        .store
        .append_fenced(session, &event(4), &second)
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::StaleLease(_)), "{error}");
}

async fn an_agents_limit_holds_its_runs_in_the_queue(h: &Harness) {
    let session = new_session(&h.store, "limits").await;
    let limited = |digest: &str| {
        let mut run = new_run(session, None, digest);
        run.agent_id = Some("a".into());
        run.agent_limit = Some(1);
        run
    };
    let a1 = created(h.store.enqueue_run(&limited("a1"), 10).await.unwrap());
    let a2 = created(h.store.enqueue_run(&limited("a2"), 10).await.unwrap());
    let mut other = new_run(session, None, "b");
    other.agent_id = Some("b".into());
    let b = created(h.store.enqueue_run(&other, 10).await.unwrap());
    let claimed = h
        .store
        .claim_runs("w", 10, Duration::from_secs(30))
        .await
        .unwrap();
    let ids: BTreeSet<RunId> = claimed.iter().map(|r| r.id).collect();
    assert_eq!(
        ids,
        BTreeSet::from([a1.id, b.id]),
        "one run of `a` at a time"
    );
    assert!(
        h.store
            .claim_runs("w2", 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty(),
        "a2 waits while a1 runs, whichever worker asks"
    );
    let lease = claimed
        .iter()
        .find(|r| r.id == a1.id)
        .unwrap()
        .lease()
        .unwrap();
    assert!(
        h.store
            .settle_run(&lease, RunState::Succeeded, None)
            .await
            .unwrap()
    );
    let next = h
        .store
        .claim_runs("w", 10, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(next.iter().map(|r| r.id).collect::<Vec<_>>(), vec![a2.id]);
}

/// A run started in its session (not queued) is recorded by its own appends, in the same
/// commit: `running` with its start, then each state its events move it to; a refused append
/// moves nothing; an ended record stays ended; the queue never claims it; a queued run's record
/// is not touched by the marks; and its session is still taken over when its process is gone.
async fn runs_started_in_sessions_are_recorded_by_their_appends(h: &Harness) {
    let mut new = NewSession::new();
    new.owner = Some("key-a".into());
    let session = h.store.create_session(new).await.unwrap().id;
    let run = RunId::new();
    let moved = |kind: &str, state: RunState| {
        NewEvent::new(kind, json!({"run_id": run.to_string()}))
            .with_run(RunMark::Now { run_id: run, state })
    };
    let started = NewEvent::new("run_started", json!({"run_id": run.to_string()})).with_run(
        RunMark::Started {
            run_id: run,
            agent_id: Some("helper".into()),
        },
    );
    assert!(h.store.run_record(run).await.unwrap().is_none());
    h.store
        .append_and_set_status(session, std::slice::from_ref(&started), "running", None)
        .await
        .unwrap();
    let record = h.store.run_record(run).await.unwrap().unwrap();
    assert_eq!(record.state, RunState::Running);
    assert!(!record.background);
    assert_eq!(record.session_id, session);
    assert_eq!(record.agent_id.as_deref(), Some("helper"));
    assert_eq!(
        record.owner.as_deref(),
        Some("key-a"),
        "the session's owner"
    );
    assert_eq!((record.worker, record.lease_until), (None, None));
    assert!(record.started_at.is_some() && record.finished_at.is_none());

    // The queue never claims it, though it is `running` without a lease.
    assert!(
        h.store
            .claim_runs("worker", 10, Duration::from_secs(30))
            .await
            .unwrap()
            .is_empty()
    );

    let state = || async { h.store.run_record(run).await.unwrap().unwrap().state };
    h.store
        .append(
            session,
            None,
            &[moved("approval_requested", RunState::Waiting)],
        )
        .await
        .unwrap();
    assert_eq!(state().await, RunState::Waiting);
    h.store
        .append(session, None, &[moved("run_resumed", RunState::Running)])
        .await
        .unwrap();
    assert_eq!(state().await, RunState::Running);
    // A refused append moves nothing.
    let error = h
        .store
        .append(session, Some(0), &[moved("run_finished", RunState::Failed)])
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::Conflict(_)), "{error}");
    assert_eq!(state().await, RunState::Running);
    h.store
        .append(session, None, &[moved("run_finished", RunState::Succeeded)])
        .await
        .unwrap();
    let ended = h.store.run_record(run).await.unwrap().unwrap();
    assert_eq!(ended.state, RunState::Succeeded);
    assert!(ended.finished_at.is_some());
    // Ended is ended; a second start keeps the first record.
    h.store
        .append(
            session,
            None,
            &[moved("run_resumed", RunState::Running), started],
        )
        .await
        .unwrap();
    assert_eq!(h.store.run_record(run).await.unwrap().unwrap(), ended);

    // A queued run's record is its worker's: marks leave it as it is.
    let queued = created(
        h.store
            .enqueue_run(&new_run(session, None, "q"), 10)
            .await
            .unwrap(),
    );
    h.store
        .append(
            session,
            None,
            &[
                NewEvent::new("run_started", json!({})).with_run(RunMark::Started {
                    run_id: queued.id,
                    agent_id: None,
                }),
                NewEvent::new("run_finished", json!({})).with_run(RunMark::Now {
                    run_id: queued.id,
                    state: RunState::Failed,
                }),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        h.store.run_record(queued.id).await.unwrap().unwrap(),
        queued
    );

    // Listed with the rest, and told apart.
    let listed = |background: Option<bool>| {
        let query = RunQuery {
            session_id: Some(session),
            background,
            limit: 10,
            ..RunQuery::default()
        };
        async move { h.store.list_runs(&query).await }
    };
    let ids = |runs: Vec<agentry_store::RunRecord>| runs.iter().map(|r| r.id).collect::<Vec<_>>();
    assert_eq!(ids(listed(None).await.unwrap()).len(), 2);
    assert_eq!(ids(listed(Some(false)).await.unwrap()), vec![run]);
    assert_eq!(ids(listed(Some(true)).await.unwrap()), vec![queued.id]);

    // A session whose run is recorded `running`, with no live process, is still taken over (a
    // running background run's session is left to the queue).
    let other = new_session(&h.store, "orphan").await;
    let orphan = RunId::new();
    h.store
        .append_and_set_status(
            other,
            &[
                NewEvent::new("run_started", json!({})).with_run(RunMark::Started {
                    run_id: orphan,
                    agent_id: None,
                }),
            ],
            "running",
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        h.store.run_record(orphan).await.unwrap().unwrap().state,
        RunState::Running
    );
    let taken = h
        .store
        .claim_orphaned_sessions("taker", None, true)
        .await
        .unwrap();
    assert!(taken.contains(&other), "{taken:?}");

    // Deleting the session deletes the records of the runs started in it, not a queued run's.
    assert!(h.store.delete_session(session).await.unwrap());
    assert!(h.store.run_record(run).await.unwrap().is_none());
    assert!(h.store.run_record(queued.id).await.unwrap().is_some());
}
