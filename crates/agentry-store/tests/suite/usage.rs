//! The usage ledger: a model call's row commits with its event (and only then), survives its
//! session, and sums by agent, model, session, key and day over a time range.

use agentry_store::{
    NewEvent, NewSession, SpendScope, StoreError, UsageDimension, UsageEntry, UsageQuery,
};
use agentry_types::{RunId, Usage};
use serde_json::json;

use super::support::{Harness, both_backends, now_ms};

both_backends!(calls_are_recorded_with_their_events_and_summed_by_agent_and_day);

const DAY: u64 = 86_400_000;

fn call(
    run: RunId,
    agent: &str,
    model: &str,
    input: u64,
    output: u64,
    cost: Option<f64>,
) -> NewEvent {
    NewEvent::new("assistant_message", json!({"run": run.to_string()})).with_usage(UsageEntry {
        run_id: run,
        agent_id: Some(agent.to_owned()),
        model: model.to_owned(),
        usage: Usage {
            input_tokens: input,
            output_tokens: output,
            cached_input_tokens: input / 2,
            ..Usage::default()
        },
        cost_usd: cost,
    })
}

async fn calls_are_recorded_with_their_events_and_summed_by_agent_and_day(h: &Harness) {
    let store = &h.store;
    let mut owned = NewSession::new();
    owned.owner = Some("key-a".into());
    let first = store.create_session(owned).await.unwrap().id;
    let second = store.create_session(NewSession::new()).await.unwrap().id;
    let (alpha_run, beta_run) = (RunId::new(), RunId::new());

    // Two calls of alpha's run (with an event that is not a call between them), one of beta's.
    store
        .append(
            first,
            None,
            &[
                call(alpha_run, "alpha", "m1", 100, 10, Some(0.001)),
                NewEvent::new("tool_call_result", json!({})),
            ],
        )
        .await
        .unwrap();
    store
        .append(
            first,
            None,
            &[call(alpha_run, "alpha", "m1", 50, 5, Some(0.0005))],
        )
        .await
        .unwrap();
    store
        .append(second, None, &[call(beta_run, "beta", "m2", 200, 20, None)])
        .await
        .unwrap();
    // A refused append records nothing.
    let refused = store
        .append(
            first,
            Some(1),
            &[call(alpha_run, "alpha", "m1", 9_999, 9_999, Some(1.0))],
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Conflict(_))),
        "{refused:?}"
    );
    assert_eq!(h.raw_int("SELECT COUNT(*) FROM usage_records").await, 3);
    // Each row sits at its event's seq.
    assert_eq!(
        h.raw_int(&format!(
            "SELECT MAX(seq) FROM usage_records WHERE session_id = '{first}'"
        ))
        .await,
        3
    );
    // Beta's call was yesterday.
    h.raw_exec(&format!(
        "UPDATE usage_records SET created_at = created_at - {DAY} WHERE run_id = '{beta_run}'"
    ))
    .await;

    let now = now_ms();
    let mut query = UsageQuery {
        from: now - 3 * DAY,
        to: now + 60_000,
        group_by: vec![UsageDimension::Agent, UsageDimension::Day],
        ..UsageQuery::default()
    };
    let groups = store.usage_report(&query).await.unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    let (alpha, beta) = (&groups[0], &groups[1]);
    assert_eq!(alpha.key[0].as_deref(), Some("alpha"));
    assert_eq!((alpha.runs, alpha.calls), (1, 2));
    assert_eq!(
        (
            alpha.usage.input_tokens,
            alpha.usage.output_tokens,
            alpha.usage.cached_input_tokens
        ),
        (150, 15, 75)
    );
    assert!(
        (alpha.cost_usd - 0.0015).abs() < 1e-12,
        "{}",
        alpha.cost_usd
    );
    assert_eq!(alpha.unpriced_calls, 0);
    assert_eq!(beta.key[0].as_deref(), Some("beta"));
    assert_eq!(
        (beta.calls, beta.usage.input_tokens, beta.unpriced_calls),
        (1, 200, 1)
    );
    assert_eq!(beta.cost_usd, 0.0);
    // The days are UTC dates, one apart.
    let day = |group: &agentry_store::UsageGroup| group.key[1].clone().unwrap();
    assert_eq!(day(alpha).len(), 10);
    assert!(day(beta) < day(alpha), "{} {}", day(beta), day(alpha));

    // By key: the session's owner was recorded; `Some(None)` is the operator's.
    query.group_by = vec![UsageDimension::Key];
    let by_key = store.usage_report(&query).await.unwrap();
    let keys: Vec<Option<String>> = by_key.iter().map(|g| g.key[0].clone()).collect();
    assert!(
        keys.contains(&Some("key-a".into())) && keys.contains(&None),
        "{keys:?}"
    );
    query.group_by.clear();
    query.key = Some(Some("key-a".into()));
    let mine = store.usage_report(&query).await.unwrap();
    assert_eq!((mine.len(), mine[0].calls), (1, 2));
    query.key = Some(None);
    assert_eq!(store.usage_report(&query).await.unwrap()[0].calls, 1);
    // A range without calls is an empty report; a range that ends first is refused.
    query.key = None;
    query.from = now + DAY;
    query.to = now + 2 * DAY;
    assert!(store.usage_report(&query).await.unwrap().is_empty());
    query.to = now;
    assert!(matches!(
        store.usage_report(&query).await,
        Err(StoreError::InvalidInput(_))
    ));

    // Budgets read what a scope spent since a time.
    let spent = store.spent(SpendScope::Agent("alpha"), 0).await.unwrap();
    assert!((spent - 0.0015).abs() < 1e-12, "{spent}");
    assert_eq!(
        store
            .spent(SpendScope::Agent("alpha"), now + 1)
            .await
            .unwrap(),
        0.0
    );
    let by_key = store.spent(SpendScope::Key("key-a"), 0).await.unwrap();
    assert!((by_key - 0.0015).abs() < 1e-12);

    // Deleting a conversation does not undo what it spent.
    assert!(store.delete_session(first).await.unwrap());
    let total = store
        .usage_report(&UsageQuery {
            from: 0,
            to: now + 60_000,
            ..UsageQuery::default()
        })
        .await
        .unwrap();
    assert_eq!(total[0].calls, 3);
}
