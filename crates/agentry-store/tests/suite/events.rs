//! Appending and reading the event log.

use agentry_store::{NewEvent, StoreError};
use serde_json::json;

use super::support::{Harness, both_backends, new_session, now_ms};

both_backends!(
    append_numbers_events_and_reads_them_back,
    conditional_append_refuses_a_stale_seq,
    storage_grows_linearly,
);

async fn append_numbers_events_and_reads_them_back(h: &Harness) {
    let store = &h.store;
    let id = new_session(store, "log").await;
    // A session with no events yet reads as empty, not as unknown.
    assert!(store.events(id, 0, 100).await.unwrap().is_empty());
    assert!(store.events(id, 0, 0).await.unwrap().is_empty());
    let before = now_ms();
    let payloads = [
        json!({"text": "héllo wörld — 你好 👋", "quote": "say \"hi\"\n\ttab", "n": 1}),
        json!({"nested": {"list": [1, 2.5, null, true, {"deep": ["x"]}], "empty": {}}}),
        json!("just a string"),
        json!([1, "two", {"three": 3}]),
        json!({"big": "x".repeat(20_000)}),
    ];
    let events: Vec<NewEvent> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| {
            NewEvent::new(
                if i % 2 == 0 {
                    "user.message"
                } else {
                    "tool_result"
                },
                p.clone(),
            )
        })
        .collect();

    let first = store.append(id, None, &events[..3]).await.unwrap();
    assert_eq!(first.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 3]);
    assert!(
        first
            .iter()
            .all(|e| e.session_id == id && e.created_at >= before)
    );
    let second = store.append(id, None, &events[3..]).await.unwrap();
    assert_eq!(second.iter().map(|e| e.seq).collect::<Vec<_>>(), [4, 5]);

    let all = store.events(id, 0, 100).await.unwrap();
    assert_eq!(all.len(), 5);
    for (i, event) in all.iter().enumerate() {
        assert_eq!(event.seq, i as u64 + 1);
        assert_eq!(event.session_id, id);
        assert_eq!(event.kind, events[i].kind);
        assert_eq!(event.payload, payloads[i], "payload {i} intact");
    }
    assert_eq!(all[..3], first[..]);

    // Paging.
    let page = store.events(id, 2, 2).await.unwrap();
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), [3, 4]);
    assert!(store.events(id, 5, 10).await.unwrap().is_empty());
    assert!(store.events(id, 0, 0).await.unwrap().is_empty());
    assert_eq!(store.events(id, 4, 100).await.unwrap().len(), 1);

    let record = store.session(id).await.unwrap().unwrap();
    assert_eq!(record.last_seq, 5);
    assert!(record.last_activity >= record.created_at);
    assert!(record.unread());

    // An empty append writes nothing.
    assert!(store.append(id, None, &[]).await.unwrap().is_empty());
    assert_eq!(store.session(id).await.unwrap().unwrap().last_seq, 5);
}

async fn conditional_append_refuses_a_stale_seq(h: &Harness) {
    let store = &h.store;
    let id = new_session(store, "cas").await;
    let event = || [NewEvent::new("note", json!({"a": 1}))];

    let stored = store.append(id, Some(0), &event()).await.unwrap();
    assert_eq!(stored[0].seq, 1);
    match store.append(id, Some(0), &event()).await {
        Err(StoreError::Conflict(message)) => assert!(message.contains("seq 1"), "{message}"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    // A stale writer with several events writes none of them.
    let many = [
        NewEvent::new("note", json!(1)),
        NewEvent::new("note", json!(2)),
    ];
    assert!(matches!(
        store.append(id, Some(5), &many).await,
        Err(StoreError::Conflict(_))
    ));
    assert_eq!(store.events(id, 0, 100).await.unwrap().len(), 1);
    assert_eq!(store.session(id).await.unwrap().unwrap().last_seq, 1);
    assert_eq!(h.event_rows().await, 1);

    let stored = store.append(id, Some(1), &many).await.unwrap();
    assert_eq!(stored.iter().map(|e| e.seq).collect::<Vec<_>>(), [2, 3]);
    let stored = store.append(id, None, &event()).await.unwrap();
    assert_eq!(stored[0].seq, 4);
}

/// A turn: user message, assistant message, tool intent, tool result, each of similar size.
fn turn(n: usize) -> Vec<NewEvent> {
    let words = "the quick brown fox jumps over the lazy dog ".repeat(6);
    vec![
        NewEvent::new(
            "user.message",
            json!({"role": "user", "text": format!("{n}: {words}")}),
        ),
        NewEvent::new(
            "assistant.message",
            json!({"role": "assistant", "parts": [{"type": "text", "text": format!("{n}: {words}")}]}),
        ),
        NewEvent::new(
            "tool.intent",
            json!({"id": format!("call_{n:06}"), "name": "read_file", "arguments": {"path": format!("src/{n:06}.rs")}}),
        ),
        NewEvent::new(
            "tool.result",
            json!({"id": format!("call_{n:06}"), "output": format!("{n}: {words}"), "is_error": false}),
        ),
    ]
}

async fn storage_grows_linearly(h: &Harness) {
    let store = &h.store;
    let id = new_session(store, "growth").await;
    let mut at_250 = 0;
    for n in 0..500 {
        store.append(id, None, &turn(n)).await.unwrap();
        if n == 249 {
            at_250 = store.stored_bytes(id).await.unwrap();
        }
    }
    let at_500 = store.stored_bytes(id).await.unwrap();
    assert!(at_250 > 250 * 4 * 100, "{at_250} bytes for 250 turns");
    let ratio = at_500 as f64 / at_250 as f64;
    assert!(
        (1.8..=2.2).contains(&ratio),
        "500 turns store {at_500} bytes, 250 turns {at_250}: ratio {ratio:.3}"
    );
    // Never rewritten: one row per event, and the bytes the store reports are the rows' bytes.
    assert_eq!(h.event_rows().await, 2000);
    let first = store.events(id, 0, 4).await.unwrap();
    assert_eq!(
        first[0].payload,
        serde_json::from_str::<serde_json::Value>(turn(0)[0].payload()).unwrap()
    );
    assert_eq!(store.session(id).await.unwrap().unwrap().last_seq, 2000);
}
