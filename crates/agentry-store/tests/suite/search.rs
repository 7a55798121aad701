//! Searching payload text.

use std::time::Duration;

use agentry_store::StoreError;
use serde_json::json;

use super::support::{Harness, both_backends, new_session, text_event};

both_backends!(search_is_case_insensitive_and_literal);

async fn search_is_case_insensitive_and_literal(h: &Harness) {
    let store = &h.store;
    let fox = new_session(store, "fox").await;
    store
        .append(
            fox,
            None,
            &[
                text_event("note", "nothing here"),
                text_event("user.message", "The Quick brown fox jumps"),
                text_event("note", "still nothing"),
            ],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let percent = new_session(store, "percent").await;
    store
        .append(
            percent,
            None,
            &[text_event("note", "100% sure_thing, said \"Ann\"")],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let lookalike = new_session(store, "lookalike").await;
    store
        .append(
            lookalike,
            None,
            &[
                text_event("note", "1000 percent sureXthing"),
                text_event("note", "a quick BROWN fox again"),
            ],
        )
        .await
        .unwrap();

    // Case-insensitive, newest first, one hit per session (its newest match).
    let hits = store.search("QUICK brown", 10).await.unwrap();
    let found: Vec<_> = hits.iter().map(|h| (h.session_id, h.seq)).collect();
    assert_eq!(found, [(lookalike, 2), (fox, 2)]);
    assert!(
        hits[1].snippet.contains("Quick brown"),
        "{}",
        hits[1].snippet
    );
    assert!(hits[1].snippet.len() < 200);

    // % and _ are literal.
    let hits = store.search("100%", 10).await.unwrap();
    assert_eq!(
        hits.iter().map(|h| h.session_id).collect::<Vec<_>>(),
        [percent]
    );
    let hits = store.search("e_t", 10).await.unwrap();
    assert_eq!(
        hits.iter().map(|h| h.session_id).collect::<Vec<_>>(),
        [percent]
    );
    // Quotes match the escaped JSON text.
    let hits = store.search("said \"ann\"", 10).await.unwrap();
    assert_eq!(
        hits.iter().map(|h| h.session_id).collect::<Vec<_>>(),
        [percent]
    );

    assert_eq!(store.search("fox", 1).await.unwrap().len(), 1);
    assert!(store.search("absent words", 10).await.unwrap().is_empty());
    assert!(matches!(
        store.search("", 10).await,
        Err(StoreError::InvalidInput(_))
    ));
    // Payloads are searched as text, keys included.
    store
        .append(
            fox,
            None,
            &[agentry_store::NewEvent::new(
                "note",
                json!({"needle_key": 1}),
            )],
        )
        .await
        .unwrap();
    assert_eq!(store.search("NEEDLE_KEY", 10).await.unwrap()[0].seq, 4);
}
