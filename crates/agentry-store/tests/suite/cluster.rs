//! The cluster: nodes join under unique ids, a heartbeat renews the node and its runs' leases
//! in one transaction, a dead node's id can be taken; a running session belongs to the process
//! running it (other processes' writes are refused) until its status changes, and the running
//! sessions of dead nodes are handed to a live one exactly once; the configuration's generation
//! moves with every configuration change.

use std::time::Duration;

use agentry_store::{ConfigKind, NewEvent, NewRun, NodeBeat, StoreError};
use agentry_types::RunId;
use serde_json::json;

use super::support::{Harness, both_backends, new_session};

both_backends!(
    nodes_join_under_unique_ids_and_a_dead_nodes_id_is_taken,
    a_heartbeat_renews_the_nodes_leases_and_says_which_to_cancel,
    a_running_session_belongs_to_its_process_until_it_stops,
    the_running_sessions_of_a_dead_node_are_handed_over_once,
    a_node_that_leaves_lets_its_runs_go_at_once,
    runs_move_only_between_nodes_on_one_workspace_volume,
    the_configuration_generation_moves_with_every_change,
);

fn beat(id: &str, incarnation: &str, lease: Duration) -> NodeBeat {
    NodeBeat {
        id: id.into(),
        incarnation: incarnation.into(),
        address: "127.0.0.1:1".into(),
        version: "test".into(),
        lease,
        running_runs: 0,
        max_runs: 8,
        load_milli: Some(250),
        volume: Some("shared".into()),
        replaces: None,
    }
}

fn note(n: u32) -> Vec<NewEvent> {
    vec![NewEvent::new("note", json!({ "n": n }))]
}

async fn nodes_join_under_unique_ids_and_a_dead_nodes_id_is_taken(h: &Harness) {
    let a = beat("node-a", "a-1", Duration::from_millis(300));
    assert_eq!(h.store.join_cluster(&a).await.unwrap(), None);
    // Joining again as the same process is fine.
    assert_eq!(h.store.join_cluster(&a).await.unwrap(), None);
    // Another live process with the same id is refused, and changes nothing.
    let error = h
        .store
        .join_cluster(&beat("node-a", "a-2", Duration::from_millis(300)))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, StoreError::Conflict(m) if m.contains("node-a")),
        "{error}"
    );
    let nodes = h.store.nodes().await.unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].incarnation, "a-1");
    assert_eq!(nodes[0].load_milli, Some(250));
    assert!(nodes[0].alive_at(nodes[0].heartbeat_at));
    // A bad id is refused.
    assert!(matches!(
        h.store
            .join_cluster(&beat("no spaces", "x", Duration::from_secs(1)))
            .await,
        Err(StoreError::InvalidInput(_))
    ));
    // Once the first misses its lease, a restarted process takes the id and hears the one
    // before; the old process's heartbeat then says it is no longer the node.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let previous = h
        .store
        .join_cluster(&beat("node-a", "a-2", Duration::from_millis(300)))
        .await
        .unwrap();
    assert_eq!(previous.as_deref(), Some("a-1"));
    assert_eq!(h.store.heartbeat(&a).await.unwrap(), None);
    assert!(
        h.store
            .heartbeat(&beat("node-a", "a-2", Duration::from_millis(300)))
            .await
            .unwrap()
            .is_some()
    );
}

async fn a_heartbeat_renews_the_nodes_leases_and_says_which_to_cancel(h: &Harness) {
    let node = beat("worker-node", "w-1", Duration::from_millis(400));
    h.store.join_cluster(&node).await.unwrap();
    let session = new_session(&h.store, "leased").await;
    let run = NewRun {
        id: RunId::new(),
        session_id: session,
        agent_id: None,
        owner: None,
        priority: 0,
        idempotency_key: None,
        schedule_id: None,
        webhook_url: None,
        agent_limit: None,
        request_digest: "d".into(),
        request: json!({}),
        new_session: None,
    };
    h.store.enqueue_run(&run, 10).await.unwrap();
    let claimed = h
        .store
        .claim_runs("w-1", 1, Duration::from_millis(400))
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    // Heartbeats keep the lease alive well past its length: nobody else can claim the run.
    for _ in 0..4 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let renewed = h.store.heartbeat(&node).await.unwrap().unwrap();
        assert_eq!(renewed.len(), 1);
        assert_eq!(renewed[0].run_id, run.id);
        assert!(!renewed[0].cancel_requested);
        assert!(
            h.store
                .claim_runs("other", 1, Duration::from_secs(1))
                .await
                .unwrap()
                .is_empty()
        );
    }
    // A cancel asked anywhere reaches the holder with its next heartbeat.
    h.store.cancel_run(run.id).await.unwrap();
    let renewed = h.store.heartbeat(&node).await.unwrap().unwrap();
    assert!(renewed[0].cancel_requested);
    // Without heartbeats the lease runs out and another worker takes the run.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let taken = h
        .store
        .claim_runs("other", 1, Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].attempt, 2);
    // The old holder's heartbeat no longer renews it.
    assert!(h.store.heartbeat(&node).await.unwrap().unwrap().is_empty());
}

async fn a_running_session_belongs_to_its_process_until_it_stops(h: &Harness) {
    let other = h.reopen().await.unwrap();
    h.store.set_worker("first");
    other.set_worker("second");
    let session = new_session(&h.store, "owned").await;
    // Before any run, either process may write.
    other.append(session, None, &note(1)).await.unwrap();
    // The first makes it running: it is its own.
    h.store
        .append_and_set_status(session, &note(2), "running", None)
        .await
        .unwrap();
    h.store.append(session, None, &note(3)).await.unwrap();
    let refused = other.append(session, None, &note(4)).await.unwrap_err();
    assert!(
        matches!(&refused, StoreError::StaleLease(m) if m.contains("first")),
        "{refused}"
    );
    let refused = other.set_status(session, "idle").await.unwrap_err();
    assert!(matches!(refused, StoreError::StaleLease(_)), "{refused}");
    // A process with no name writes to no session another one holds.
    let anonymous = h.reopen().await.unwrap();
    assert!(matches!(
        anonymous.append(session, None, &note(5)).await,
        Err(StoreError::StaleLease(_))
    ));
    // The run stops: the session is free again.
    h.store
        .append_and_set_status(session, &note(6), "waiting", None)
        .await
        .unwrap();
    other
        .append_and_set_status(session, &note(7), "running", None)
        .await
        .unwrap();
    let written: Vec<u64> = h
        .store
        .events(session, 0, 100)
        .await
        .unwrap()
        .iter()
        .map(|event| event.payload["n"].as_u64().unwrap())
        .collect();
    assert_eq!(written, vec![1, 2, 3, 6, 7]);
    other.close().await;
    anonymous.close().await;
}

async fn the_running_sessions_of_a_dead_node_are_handed_over_once(h: &Harness) {
    let dying = h.reopen().await.unwrap();
    dying.set_worker("dying-1");
    dying
        .join_cluster(&beat("dying", "dying-1", Duration::from_millis(300)))
        .await
        .unwrap();
    h.store.set_worker("alive-1");
    h.store
        .join_cluster(&beat("alive", "alive-1", Duration::from_secs(30)))
        .await
        .unwrap();
    let orphan = new_session(&dying, "orphan").await;
    dying
        .append_and_set_status(orphan, &note(1), "running", None)
        .await
        .unwrap();
    let finished = new_session(&dying, "finished").await;
    dying
        .append_and_set_status(finished, &note(1), "idle", None)
        .await
        .unwrap();
    let mine = new_session(&h.store, "mine").await;
    h.store
        .append_and_set_status(mine, &note(1), "running", None)
        .await
        .unwrap();
    // While the node lives, nothing is taken.
    assert!(
        h.store
            .claim_orphaned_sessions("alive-1", None, false)
            .await
            .unwrap()
            .is_empty()
    );
    // Dead: its running session is handed over, once; the dead process is refused after.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let (first, second) = tokio::join!(
        h.store.claim_orphaned_sessions("taker-1", None, false),
        h.store.claim_orphaned_sessions("taker-2", None, false)
    );
    let mut taken = first.unwrap();
    taken.extend(second.unwrap());
    assert_eq!(taken, vec![orphan]);
    assert!(matches!(
        dying.append(orphan, None, &note(2)).await,
        Err(StoreError::StaleLease(_))
    ));
    // A node restarted under its id takes its previous incarnation's sessions at once.
    let held = new_session(&h.store, "held").await;
    h.store
        .append_and_set_status(held, &note(1), "running", None)
        .await
        .unwrap();
    let restarted = h
        .store
        .claim_orphaned_sessions("alive-9", Some("alive-1"), false)
        .await
        .unwrap();
    let mut expected = vec![mine, held];
    expected.sort();
    let mut restarted_sorted = restarted;
    restarted_sorted.sort();
    assert_eq!(restarted_sorted, expected);
    dying.close().await;
}

async fn a_node_that_leaves_lets_its_runs_go_at_once(h: &Harness) {
    let node = beat("leaving", "l-1", Duration::from_secs(60));
    h.store.join_cluster(&node).await.unwrap();
    let session = new_session(&h.store, "handed").await;
    let run = NewRun {
        id: RunId::new(),
        session_id: session,
        agent_id: None,
        owner: None,
        priority: 0,
        idempotency_key: None,
        schedule_id: None,
        webhook_url: None,
        agent_limit: None,
        request_digest: "d".into(),
        request: json!({}),
        new_session: None,
    };
    h.store.enqueue_run(&run, 10).await.unwrap();
    assert_eq!(
        h.store
            .claim_runs("l-1", 1, Duration::from_secs(60))
            .await
            .unwrap()
            .len(),
        1
    );
    h.store.leave_cluster("leaving", "l-1").await.unwrap();
    let nodes = h.store.nodes().await.unwrap();
    assert!(nodes[0].stopped_at.is_some());
    assert!(!nodes[0].alive_at(nodes[0].heartbeat_at));
    let taken = h
        .store
        .claim_runs("next", 1, Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(taken.len(), 1, "taken without waiting for the 60 s lease");
}

async fn the_configuration_generation_moves_with_every_change(h: &Harness) {
    let start = h.store.config_generation().await.unwrap();
    h.store
        .put_config(ConfigKind::Model, "m", &json!({"a": 1}))
        .await
        .unwrap();
    let after_put = h.store.config_generation().await.unwrap();
    assert!(after_put > start);
    h.store.put_secret("TOKEN", "x").await.unwrap();
    let after_secret = h.store.config_generation().await.unwrap();
    assert!(after_secret > after_put);
    h.store.delete_config(ConfigKind::Model, "m").await.unwrap();
    let after_delete = h.store.config_generation().await.unwrap();
    assert!(after_delete > after_secret);
    // A workflow run's document is not configuration: no rebuild for it.
    h.store
        .put_config(ConfigKind::WorkflowRun, "r", &json!({"state": "running"}))
        .await
        .unwrap();
    assert_eq!(h.store.config_generation().await.unwrap(), after_delete);
}

async fn runs_move_only_between_nodes_on_one_workspace_volume(h: &Harness) {
    let dying = h.reopen().await.unwrap();
    dying.set_worker("d-1");
    let mut node = beat("d", "d-1", Duration::from_millis(300));
    node.volume = Some("left".into());
    dying.join_cluster(&node).await.unwrap();
    let session = new_session(&dying, "files").await;
    dying
        .append_and_set_status(session, &note(1), "running", None)
        .await
        .unwrap();
    let queued = new_session(&dying, "queued").await;
    let run = NewRun {
        id: RunId::new(),
        session_id: queued,
        agent_id: None,
        owner: None,
        priority: 0,
        idempotency_key: None,
        schedule_id: None,
        webhook_url: None,
        agent_limit: None,
        request_digest: "d".into(),
        request: json!({}),
        new_session: None,
    };
    dying.enqueue_run(&run, 10).await.unwrap();
    assert_eq!(
        dying
            .claim_runs("d-1", 1, Duration::from_millis(300))
            .await
            .unwrap()
            .len(),
        1
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A node whose workspaces are on another volume leaves them: their files are not there.
    let elsewhere = h.reopen().await.unwrap();
    elsewhere.set_volume("right");
    assert!(
        elsewhere
            .claim_orphaned_sessions("e-1", None, false)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        elsewhere
            .claim_runs("e-1", 1, Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty()
    );
    // One on the same volume takes both.
    let beside = h.reopen().await.unwrap();
    beside.set_volume("left");
    assert_eq!(
        beside
            .claim_orphaned_sessions("s-1", None, false)
            .await
            .unwrap(),
        vec![session]
    );
    assert_eq!(
        beside
            .claim_runs("s-1", 1, Duration::from_secs(5))
            .await
            .unwrap()
            .len(),
        1
    );
    for store in [dying, elsewhere, beside] {
        store.close().await;
    }
}
