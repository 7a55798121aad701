//! Configuration documents per kind.

use agentry_store::{ConfigKind, ConfigReplaced, StoreError};
use serde_json::json;

use super::support::{Harness, both_backends};

both_backends!(
    config_is_kept_per_kind,
    config_names_are_validated,
    config_lists_in_registration_order,
    config_is_created_once_and_replaced_only_where_it_exists
);

async fn config_is_kept_per_kind(h: &Harness) {
    let store = &h.store;
    let model = json!({"provider": "openai", "model": "gpt-4.1", "params": {"temperature": 0.2}});
    let tool = json!({"type": "http", "url": "http://127.0.0.1:9/x"});
    store
        .put_config(ConfigKind::Model, "main", &model)
        .await
        .unwrap();
    store
        .put_config(ConfigKind::Tool, "main", &tool)
        .await
        .unwrap();
    store
        .put_config(ConfigKind::Model, "a.small-1_b", &json!({"model": "tiny"}))
        .await
        .unwrap();

    assert_eq!(
        store.config(ConfigKind::Model, "main").await.unwrap(),
        Some(model.clone())
    );
    assert_eq!(
        store.config(ConfigKind::Tool, "main").await.unwrap(),
        Some(tool)
    );
    assert_eq!(store.config(ConfigKind::Skill, "main").await.unwrap(), None);

    let models = store.list_config(ConfigKind::Model).await.unwrap();
    assert_eq!(
        models.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["a.small-1_b", "main"]
    );
    assert_eq!(models[1].1, model);
    assert!(
        store
            .list_config(ConfigKind::Agent)
            .await
            .unwrap()
            .is_empty()
    );

    // Upsert replaces.
    let replaced = json!({"provider": "anthropic"});
    store
        .put_config(ConfigKind::Model, "main", &replaced)
        .await
        .unwrap();
    assert_eq!(
        store.config(ConfigKind::Model, "main").await.unwrap(),
        Some(replaced)
    );
    assert_eq!(store.list_config(ConfigKind::Model).await.unwrap().len(), 2);

    for kind in ConfigKind::ALL {
        store
            .put_config(kind, "every", &json!({"kind": kind}))
            .await
            .unwrap();
    }
    for kind in ConfigKind::ALL {
        assert_eq!(
            store.config(kind, "every").await.unwrap(),
            Some(json!({"kind": kind.as_str()}))
        );
    }

    assert!(
        store
            .delete_config(ConfigKind::Model, "main")
            .await
            .unwrap()
    );
    assert!(
        !store
            .delete_config(ConfigKind::Model, "main")
            .await
            .unwrap()
    );
    assert_eq!(store.config(ConfigKind::Model, "main").await.unwrap(), None);
    assert!(
        store
            .config(ConfigKind::Tool, "main")
            .await
            .unwrap()
            .is_some()
    );
}

async fn config_names_are_validated(h: &Harness) {
    let store = &h.store;
    let long = "n".repeat(65);
    for bad in [
        "",
        "a/b",
        "../etc",
        "with space",
        "ünïcode",
        "semi;colon",
        long.as_str(),
    ] {
        assert!(
            matches!(
                store.put_config(ConfigKind::Tool, bad, &json!({})).await,
                Err(StoreError::InvalidInput(_))
            ),
            "{bad:?}"
        );
        assert!(matches!(
            store.config(ConfigKind::Tool, bad).await,
            Err(StoreError::InvalidInput(_))
        ));
        assert!(matches!(
            store.delete_config(ConfigKind::Tool, bad).await,
            Err(StoreError::InvalidInput(_))
        ));
    }
    store
        .put_config(ConfigKind::Tool, &"n".repeat(64), &json!(null))
        .await
        .unwrap();
    assert_eq!(store.list_config(ConfigKind::Tool).await.unwrap().len(), 1);
}

async fn config_lists_in_registration_order(h: &Harness) {
    let store = &h.store;
    for name in ["zeta", "alpha", "mid"] {
        store
            .put_config(ConfigKind::Model, name, &json!({"name": name}))
            .await
            .unwrap();
    }
    // Another kind in between does not disturb the models' order.
    store
        .put_config(ConfigKind::Tool, "aaa", &json!({}))
        .await
        .unwrap();
    let names = |list: Vec<(String, serde_json::Value)>| {
        list.into_iter().map(|(name, _)| name).collect::<Vec<_>>()
    };
    assert_eq!(
        names(
            store
                .list_config_registered(ConfigKind::Model)
                .await
                .unwrap()
        ),
        ["zeta", "alpha", "mid"]
    );
    // By name, as before.
    assert_eq!(
        names(store.list_config(ConfigKind::Model).await.unwrap()),
        ["alpha", "mid", "zeta"]
    );
    // Replacing keeps the place; deleting and storing again moves to the end.
    store
        .put_config(ConfigKind::Model, "zeta", &json!({"name": "zeta", "v": 2}))
        .await
        .unwrap();
    assert!(
        store
            .delete_config(ConfigKind::Model, "alpha")
            .await
            .unwrap()
    );
    store
        .put_config(ConfigKind::Model, "alpha", &json!({"name": "alpha"}))
        .await
        .unwrap();
    let listed = store
        .list_config_registered(ConfigKind::Model)
        .await
        .unwrap();
    assert_eq!(listed[0].1, json!({"name": "zeta", "v": 2}));
    assert_eq!(names(listed), ["zeta", "mid", "alpha"]);
}

async fn config_is_created_once_and_replaced_only_where_it_exists(h: &Harness) {
    let store = &h.store;
    let kind = ConfigKind::Agent;
    assert!(
        store
            .insert_config(kind, "a", &json!({"v": 1}))
            .await
            .unwrap()
    );
    assert!(
        store
            .insert_config(kind, "b", &json!({"v": 2}))
            .await
            .unwrap()
    );
    // A second create of the same name writes nothing.
    assert!(
        !store
            .insert_config(kind, "a", &json!({"v": 9}))
            .await
            .unwrap()
    );
    assert_eq!(
        store.config(kind, "a").await.unwrap(),
        Some(json!({"v": 1}))
    );
    // The same name under another kind is another document.
    assert!(
        store
            .insert_config(ConfigKind::Model, "a", &json!({}))
            .await
            .unwrap()
    );

    // Replacing what is not there, or renaming onto another's name, writes nothing.
    assert_eq!(
        store
            .replace_config(kind, "zz", "zz", &json!({}))
            .await
            .unwrap(),
        ConfigReplaced::Missing
    );
    assert_eq!(
        store
            .replace_config(kind, "a", "b", &json!({"v": 3}))
            .await
            .unwrap(),
        ConfigReplaced::NameTaken
    );
    assert_eq!(
        store.config(kind, "a").await.unwrap(),
        Some(json!({"v": 1}))
    );
    assert_eq!(
        store.config(kind, "b").await.unwrap(),
        Some(json!({"v": 2}))
    );

    // In place, then renamed: the document keeps its place in registration order.
    assert_eq!(
        store
            .replace_config(kind, "a", "a", &json!({"v": 4}))
            .await
            .unwrap(),
        ConfigReplaced::Replaced
    );
    assert_eq!(
        store
            .replace_config(kind, "a", "c", &json!({"v": 5}))
            .await
            .unwrap(),
        ConfigReplaced::Replaced
    );
    assert_eq!(store.config(kind, "a").await.unwrap(), None);
    let registered: Vec<String> = store
        .list_config_registered(kind)
        .await
        .unwrap()
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(registered, ["c", "b"]);
    assert_eq!(
        store.config(kind, "c").await.unwrap(),
        Some(json!({"v": 5}))
    );

    // Racing creates of one name: exactly one wins.
    let documents: Vec<_> = (0..8).map(|i| json!({ "i": i })).collect();
    let wins = futures::future::join_all(
        documents
            .iter()
            .map(|document| store.insert_config(kind, "raced", document)),
    )
    .await;
    assert_eq!(
        wins.into_iter()
            .filter(|won| *won.as_ref().unwrap())
            .count(),
        1
    );
}
