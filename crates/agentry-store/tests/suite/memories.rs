//! Long-term memories: scoped, de-duplicated, searchable with stemming, editable.

use agentry_store::{MemoryKind, MemoryScope, NewMemory, SessionId, StoreError};

use super::support::{Harness, both_backends};

both_backends!(
    memories_are_scoped_and_deduplicated,
    memories_are_found_by_stemmed_words_best_first,
    memories_are_edited_and_deleted,
    bad_memories_are_refused
);

fn memory(scope: &MemoryScope, kind: MemoryKind, text: &str) -> NewMemory {
    NewMemory {
        scope: scope.clone(),
        kind,
        text: text.into(),
        source_session: None,
    }
}

async fn memories_are_scoped_and_deduplicated(h: &Harness) {
    let store = &h.store;
    let agent = MemoryScope::agent("helper");
    let alice = MemoryScope::user("helper", "alice");
    let session = SessionId::new();
    let (first, created) = store
        .remember(NewMemory {
            source_session: Some(session),
            ..memory(&alice, MemoryKind::Preference, "Alice prefers tea.")
        })
        .await
        .unwrap();
    assert!(created);
    assert_eq!(first.source_session, Some(session));
    assert_eq!(first.scope, alice);
    // The same statement, spelt differently: one memory, refreshed.
    let (again, created) = store
        .remember(memory(&alice, MemoryKind::Fact, "  alice PREFERS   tea "))
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(again.id, first.id);
    assert_eq!(
        again.text, "Alice prefers tea.",
        "the first wording is kept"
    );
    assert_eq!(again.kind, MemoryKind::Fact);
    assert!(again.updated_at > first.updated_at);
    // The same words in another scope are another memory.
    let (other, created) = store
        .remember(memory(&agent, MemoryKind::Fact, "Alice prefers tea"))
        .await
        .unwrap();
    assert!(created);
    assert_ne!(other.id, first.id);
    store
        .remember(memory(
            &agent,
            MemoryKind::Decision,
            "Deploy on Fridays is banned",
        ))
        .await
        .unwrap();
    let listed = store.memories(&agent, 10).await.unwrap();
    assert_eq!(listed.len(), 2);
    assert_eq!(
        listed[0].text, "Deploy on Fridays is banned",
        "newest first"
    );
    assert_eq!(store.memories(&alice, 10).await.unwrap().len(), 1);
    assert!(
        store
            .memories(&MemoryScope::user("helper", "bob"), 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.memory(first.id).await.unwrap(), Some(again));
}

async fn memories_are_found_by_stemmed_words_best_first(h: &Harness) {
    let store = &h.store;
    let scope = MemoryScope::agent("ops");
    for (kind, text) in [
        (MemoryKind::Fact, "The staging database runs PostgreSQL 15"),
        (
            MemoryKind::Decision,
            "We decided to deploy with blue-green releases",
        ),
        (
            MemoryKind::Preference,
            "The team prefers short deployment notes",
        ),
        (
            MemoryKind::Fact,
            "Backups of the database run nightly; the database is small",
        ),
    ] {
        store.remember(memory(&scope, kind, text)).await.unwrap();
    }
    store
        .remember(memory(
            &MemoryScope::agent("other"),
            MemoryKind::Fact,
            "The database of another agent",
        ))
        .await
        .unwrap();
    let found = store
        .search_memories(&scope, "databases", 10)
        .await
        .unwrap();
    let texts: Vec<&str> = found.iter().map(|m| m.text.as_str()).collect();
    assert_eq!(texts.len(), 2, "{texts:?}");
    assert!(texts.iter().all(|t| t.contains("database")));
    assert!(
        texts[0].starts_with("Backups"),
        "the memory naming the database twice ranks first: {texts:?}"
    );
    // Stemming: "releasing" finds "releases", "notes" finds "notes"; punctuation is not syntax.
    let found = store
        .search_memories(&scope, "releasing\" OR ( note", 10)
        .await
        .unwrap();
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        store
            .search_memories(&scope, "kubernetes", 10)
            .await
            .unwrap(),
        Vec::new()
    );
    assert!(matches!(
        store.search_memories(&scope, " ?! ", 10).await,
        Err(StoreError::InvalidInput(_))
    ));
}

async fn memories_are_edited_and_deleted(h: &Harness) {
    let store = &h.store;
    let scope = MemoryScope::agent("editor");
    let (a, _) = store
        .remember(memory(
            &scope,
            MemoryKind::Fact,
            "The API runs on port 8080",
        ))
        .await
        .unwrap();
    let (b, _) = store
        .remember(memory(
            &scope,
            MemoryKind::Fact,
            "The API is written in Rust",
        ))
        .await
        .unwrap();
    let edited = store
        .update_memory(a.id, MemoryKind::Decision, "The API moves to port 9090")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(edited.text, "The API moves to port 9090");
    assert_eq!(edited.kind, MemoryKind::Decision);
    // The index follows the edit.
    assert_eq!(
        store.search_memories(&scope, "9090", 5).await.unwrap(),
        vec![edited.clone()]
    );
    assert!(
        store
            .search_memories(&scope, "8080", 5)
            .await
            .unwrap()
            .is_empty()
    );
    // An edit may not make two memories say the same.
    assert!(matches!(
        store
            .update_memory(a.id, MemoryKind::Fact, "the api is written in rust.")
            .await,
        Err(StoreError::InvalidInput(_))
    ));
    assert_eq!(
        store
            .update_memory(999_999, MemoryKind::Fact, "x")
            .await
            .unwrap(),
        None
    );
    assert!(store.delete_memory(b.id).await.unwrap());
    assert!(!store.delete_memory(b.id).await.unwrap());
    assert!(
        store
            .search_memories(&scope, "rust", 5)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(store.memories(&scope, 10).await.unwrap(), vec![edited]);
}

async fn bad_memories_are_refused(h: &Harness) {
    let store = &h.store;
    let scope = MemoryScope::agent("strict");
    for text in ["", "   ", "nul\0byte"] {
        assert!(matches!(
            store.remember(memory(&scope, MemoryKind::Fact, text)).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
    let long = "x".repeat(agentry_store::MAX_MEMORY_CHARS + 1);
    assert!(matches!(
        store
            .remember(memory(&scope, MemoryKind::Fact, &long))
            .await,
        Err(StoreError::InvalidInput(_))
    ));
    for bad in [MemoryScope::agent("../etc"), MemoryScope::user("ok", "a b")] {
        assert!(matches!(
            store.remember(memory(&bad, MemoryKind::Fact, "fine")).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
}
