//! Secrets: sealed at rest, masked in lists, bound to the key.

use agentry_store::{SecretKey, StoreError};

use super::support::{Harness, both_backends};

both_backends!(
    secrets_are_encrypted_at_rest,
    a_different_key_cannot_decrypt,
    a_binding_is_sealed_with_the_value
);

async fn a_binding_is_sealed_with_the_value(h: &Harness) {
    let store = &h.store;
    let hosts = vec!["api.example.com".to_owned(), "*.example.org".to_owned()];
    store
        .put_bound_secret("bound", "sk-bound-0123456789", &hosts)
        .await
        .unwrap();
    store
        .put_secret("free", "sk-free-0123456789")
        .await
        .unwrap();
    let revealed = store.reveal_secrets().await.unwrap();
    assert_eq!(revealed.len(), 2);
    assert_eq!(revealed[0].0, "bound");
    assert_eq!(revealed[0].1.value, "sk-bound-0123456789");
    assert_eq!(revealed[0].1.hosts.as_ref(), Some(&hosts));
    assert_eq!(revealed[1].1.hosts, None);
    assert_eq!(
        store.reveal_secret("bound").await.unwrap().as_deref(),
        Some("sk-bound-0123456789")
    );
    let listed = store.list_secrets().await.unwrap();
    assert_eq!(listed[0].hosts.as_ref(), Some(&hosts));
    assert_eq!(listed[1].hosts, None);
    // Neither the hosts nor the value are readable in the database.
    for blob in h.raw_blobs("SELECT sealed FROM secrets").await {
        assert!(!blob.windows(15).any(|w| w == b"api.example.com"));
    }
    // Writing the value without hosts unbinds it.
    store
        .put_secret("bound", "sk-bound-0123456789")
        .await
        .unwrap();
    assert_eq!(store.list_secrets().await.unwrap()[0].hosts, None);
}

async fn secrets_are_encrypted_at_rest(h: &Harness) {
    let store = &h.store;
    let value = "sk-live-abcdefghijklmnopwxyz";
    store.put_secret("openai", value).await.unwrap();
    store.put_secret("pin", "1234").await.unwrap();

    let blobs = h.raw_blobs("SELECT sealed FROM secrets").await;
    assert_eq!(blobs.len(), 2);
    for blob in &blobs {
        assert!(
            !blob.windows(value.len()).any(|w| w == value.as_bytes()),
            "plaintext stored"
        );
        assert!(!blob.windows(4).any(|w| w == b"1234"), "plaintext stored");
    }

    assert_eq!(
        store.reveal_secret("openai").await.unwrap().as_deref(),
        Some(value)
    );
    assert_eq!(
        store.reveal_secret("pin").await.unwrap().as_deref(),
        Some("1234")
    );
    assert_eq!(store.reveal_secret("absent").await.unwrap(), None);

    let listed = store.list_secrets().await.unwrap();
    let shown: Vec<(&str, &str)> = listed
        .iter()
        .map(|s| (s.name.as_str(), s.masked.as_str()))
        .collect();
    assert_eq!(shown, [("openai", "…wxyz"), ("pin", "…")]);
    assert!(listed.iter().all(|s| s.updated_at > 0));

    store
        .put_secret("openai", "sk-other-000000000000")
        .await
        .unwrap();
    assert_eq!(
        store.reveal_secret("openai").await.unwrap().as_deref(),
        Some("sk-other-000000000000")
    );
    assert!(store.delete_secret("pin").await.unwrap());
    assert!(!store.delete_secret("pin").await.unwrap());
    assert_eq!(store.list_secrets().await.unwrap().len(), 1);

    assert!(matches!(
        store.put_secret("a/b", "x").await,
        Err(StoreError::InvalidInput(_))
    ));
    assert!(matches!(
        store.put_secret("empty", "").await,
        Err(StoreError::InvalidInput(_))
    ));
}

async fn a_different_key_cannot_decrypt(h: &Harness) {
    h.store
        .put_secret("anthropic", "sk-ant-0123456789abcdef")
        .await
        .unwrap();
    let other = h
        .reopen_with_key(SecretKey::generate().unwrap())
        .await
        .unwrap();
    let error = other.reveal_secret("anthropic").await.unwrap_err();
    assert!(matches!(error, StoreError::Crypto(_)), "{error:?}");
    assert_eq!(error.code(), agentry_types::ErrorCode::Configuration);
    assert!(matches!(
        other.list_secrets().await,
        Err(StoreError::Crypto(_))
    ));
    other.close().await;
    // The right key still opens it.
    let same = h.reopen().await.unwrap();
    assert_eq!(
        same.reveal_secret("anthropic").await.unwrap().as_deref(),
        Some("sk-ant-0123456789abcdef")
    );
    same.close().await;
}

#[cfg(unix)]
#[test]
fn the_key_file_is_private_created_once_and_checked() {
    use std::os::unix::fs::PermissionsExt;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("secret.key");
    let key = SecretKey::load_or_create(&path).unwrap();
    assert_eq!(format!("{key:?}"), "SecretKey(<redacted>)");
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.len(), 32);
    let bytes = std::fs::read(&path).unwrap();
    SecretKey::load_or_create(&path).unwrap();
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "an existing key is kept"
    );
    // No temporary files are left behind.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

    std::fs::write(&path, b"too short").unwrap();
    assert!(matches!(
        SecretKey::load_or_create(&path),
        Err(StoreError::Crypto(_))
    ));
}
