//! Refused input and unknown sessions, with their error codes.

use agentry_store::{NewEvent, SessionId, StoreError};
use agentry_types::ErrorCode;
use serde_json::json;

use super::support::{Harness, both_backends, new_session, text_event};

both_backends!(invalid_input_is_refused_and_unknown_sessions_are_not_found);

async fn invalid_input_is_refused_and_unknown_sessions_are_not_found(h: &Harness) {
    let store = &h.store;
    let id = new_session(store, "strict").await;

    for kind in [
        "",
        "User",
        "tool result",
        "tool-result",
        "ok/no",
        &"k".repeat(65),
    ] {
        let events = [text_event("note", "fine"), NewEvent::new(kind, json!({}))];
        let error = store.append(id, None, &events).await.unwrap_err();
        assert!(
            matches!(error, StoreError::InvalidInput(_)),
            "{kind:?}: {error:?}"
        );
        assert_eq!(error.code(), ErrorCode::InvalidRequest);
    }
    assert_eq!(
        h.event_rows().await,
        0,
        "a batch with a bad kind writes nothing"
    );
    store
        .append(
            id,
            None,
            &[
                NewEvent::new("k".repeat(64), json!({})),
                text_event("a.b_c", "ok"),
            ],
        )
        .await
        .unwrap();

    let error = store.set_status(id, "Bad Status").await.unwrap_err();
    assert!(matches!(error, StoreError::InvalidInput(_)));
    let error = store
        .put_config(agentry_store::ConfigKind::Model, "bad name", &json!({}))
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::InvalidInput(_)));

    let unknown = SessionId::new();
    let error = store
        .append(unknown, None, &[text_event("note", "x")])
        .await
        .unwrap_err();
    assert!(matches!(error, StoreError::NotFound(_)), "{error:?}");
    assert_eq!(error.code(), ErrorCode::NotFound);
    assert!(error.to_string().contains(&unknown.to_string()));
    assert!(matches!(
        store
            .append(unknown, Some(0), &[text_event("note", "x")])
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.events(unknown, 0, 10).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.stored_bytes(unknown).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(store.delete_session(unknown).await, Ok(false)));
    assert_eq!(h.event_rows().await, 2);
}
