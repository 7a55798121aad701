//! Workflow step events: appended in batches numbered per run, read back after a number, and a
//! batch whose first number is taken (a second driver of the run) refused whole.

use agentry_store::{ConfigKind, StoreError};
use serde_json::json;

use super::support::{Harness, both_backends};

both_backends!(
    step_events_are_numbered_per_run_and_a_taken_number_refuses_the_batch,
    a_snapshot_commits_with_its_events_or_not_at_all,
);

async fn step_events_are_numbered_per_run_and_a_taken_number_refuses_the_batch(h: &Harness) {
    let store = &h.store;
    store
        .append_workflow_events("run-a", 1, &[json!({"step": "s0"}), json!({"step": "s1"})])
        .await
        .unwrap();
    store
        .append_workflow_events("run-b", 1, &[json!({"step": "other"})])
        .await
        .unwrap();
    store
        .append_workflow_events("run-a", 3, &[json!({"step": "s2"})])
        .await
        .unwrap();
    let all = store.workflow_events("run-a", 0).await.unwrap();
    let seqs: Vec<u64> = all.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(all[2].1, json!({"step": "s2"}));
    let after = store.workflow_events("run-a", 2).await.unwrap();
    assert_eq!(after, vec![(3, json!({"step": "s2"}))]);

    // Another driver that read the run before event 3 tries to append 3 and 4: refused, and
    // neither is written.
    let refused = store
        .append_workflow_events(
            "run-a",
            3,
            &[json!({"step": "late"}), json!({"step": "later"})],
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict(_))),
        "{refused:?}"
    );
    assert_eq!(store.workflow_events("run-a", 0).await.unwrap().len(), 3);
    // A batch that starts free but runs into a taken number is refused whole too.
    store
        .append_workflow_events("run-b", 3, &[json!({"step": "ahead"})])
        .await
        .unwrap();
    let refused = store
        .append_workflow_events("run-b", 2, &[json!({"step": "x"}), json!({"step": "y"})])
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict(_))),
        "{refused:?}"
    );
    let b: Vec<u64> = store
        .workflow_events("run-b", 0)
        .await
        .unwrap()
        .iter()
        .map(|(seq, _)| *seq)
        .collect();
    assert_eq!(b, [1, 3], "the batch's first event was rolled back");
}

/// The run's document is written in the same transaction as its events: a second driver whose
/// events are refused leaves the first one's document as it was.
async fn a_snapshot_commits_with_its_events_or_not_at_all(h: &Harness) {
    let store = &h.store;
    let run = "0191a3c4-0000-4000-8000-000000000001";
    let document = |seq: u64, by: &str| json!({"seq": seq, "by": by});
    store
        .append_workflow_events_and_snapshot(
            run,
            1,
            &[json!({"step": "a"}), json!({"type": "run"})],
            Some(&document(2, "first")),
        )
        .await
        .unwrap();
    let stored = store.config(ConfigKind::WorkflowRun, run).await.unwrap();
    assert_eq!(stored, Some(document(2, "first")));
    // Events without a document leave the document as it is.
    store
        .append_workflow_events_and_snapshot(run, 3, &[json!({"step": "b"})], None)
        .await
        .unwrap();
    assert_eq!(
        store.config(ConfigKind::WorkflowRun, run).await.unwrap(),
        Some(document(2, "first"))
    );
    // A stale driver (it read the run at event 2) is refused: no event, no document.
    let refused = store
        .append_workflow_events_and_snapshot(
            run,
            3,
            &[json!({"type": "run"})],
            Some(&document(3, "stale")),
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict(_))),
        "{refused:?}"
    );
    assert_eq!(
        store.config(ConfigKind::WorkflowRun, run).await.unwrap(),
        Some(document(2, "first"))
    );
    assert_eq!(store.workflow_events(run, 0).await.unwrap().len(), 3);
}
