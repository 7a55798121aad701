//! API keys and the console login.
//!
//! Keys look like `agk_<id>_<secret>`. Only a SHA-256 hash is stored (configuration kind
//! `api_key`), so a database leak reveals no key; the full key is shown once, at creation.
//! As soon as one key exists, every `/v1` route (and the MCP endpoint `/mcp`) needs
//! `Authorization: Bearer <key>` or the session cookie a login sets; revoking a key takes
//! effect on the next request.
//!
//! Console logins live in memory for [`LOGIN_TTL`]. Expired ones are swept whenever a login is
//! added, and at most [`MAX_LOGINS`] are kept (the oldest goes first), so repeated logins cannot
//! grow the table without bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use agentry_store::{ConfigKind, Store, StoreError};

/// The cookie a login sets.
pub const SESSION_COOKIE: &str = "agentry_session";
/// How long a login lasts.
pub const LOGIN_TTL: Duration = Duration::from_secs(12 * 3600);
/// How many logins are kept at once; a login beyond that ends the oldest.
pub const MAX_LOGINS: usize = 10_000;
/// How long "is auth on" is cached.
const ENABLED_CACHE: Duration = Duration::from_secs(1);

/// What is stored for a key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredKey {
    /// SHA-256 of the whole key, hex.
    pub hash: String,
    /// A label for people.
    #[serde(default)]
    pub label: String,
    /// Creation time, Unix ms.
    pub created_at: u64,
    /// Revocation time, Unix ms.
    #[serde(default)]
    pub revoked_at: Option<u64>,
}

/// A key as listed (never the key itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    /// The key's id (the part after `agk_`).
    pub id: String,
    /// Its label.
    pub label: String,
    /// Creation time, Unix ms.
    pub created_at: u64,
    /// Whether it was revoked.
    pub revoked: bool,
}

/// A newly created key: shown once.
#[derive(Debug, Clone)]
pub struct NewKey {
    /// The id.
    pub id: String,
    /// The full key to give to clients.
    pub key: String,
}

/// Why a key operation failed.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No randomness was available.
    #[error("cannot generate a key: {0}")]
    Random(String),
    /// The label is too long or has control characters.
    #[error("invalid label: {0}")]
    InvalidLabel(String),
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn random_hex(len: usize) -> Result<String, AuthError> {
    let mut bytes = vec![0u8; len];
    getrandom::fill(&mut bytes).map_err(|error| AuthError::Random(error.to_string()))?;
    Ok(hex(&bytes))
}

fn digest(text: &str) -> String {
    hex(&Sha256::digest(text.as_bytes()))
}

/// Compares two equal-length strings without an early exit.
fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// Creates a key.
pub async fn create_key(store: &Store, label: &str) -> Result<NewKey, AuthError> {
    if label.chars().count() > 200 || label.chars().any(char::is_control) {
        return Err(AuthError::InvalidLabel(
            "at most 200 characters, no control characters".into(),
        ));
    }
    let id = random_hex(6)?;
    let key = format!("agk_{id}_{}", random_hex(24)?);
    let stored = StoredKey {
        hash: digest(&key),
        label: label.to_owned(),
        created_at: now_ms(),
        revoked_at: None,
    };
    let value =
        serde_json::to_value(&stored).map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    store.put_config(ConfigKind::ApiKey, &id, &value).await?;
    Ok(NewKey { id, key })
}

/// Every key, newest first.
pub async fn list_keys(store: &Store) -> Result<Vec<KeyInfo>, AuthError> {
    let mut keys: Vec<KeyInfo> = store
        .list_config(ConfigKind::ApiKey)
        .await?
        .into_iter()
        .filter_map(|(id, value)| {
            let stored: StoredKey = serde_json::from_value(value).ok()?;
            Some(KeyInfo {
                id,
                label: stored.label,
                created_at: stored.created_at,
                revoked: stored.revoked_at.is_some(),
            })
        })
        .collect();
    keys.sort_by_key(|key| std::cmp::Reverse(key.created_at));
    Ok(keys)
}

/// Revokes a key; false if there is none with this id.
pub async fn revoke_key(store: &Store, id: &str) -> Result<bool, AuthError> {
    let Some(value) = store.config(ConfigKind::ApiKey, id).await? else {
        return Ok(false);
    };
    let Ok(mut stored) = serde_json::from_value::<StoredKey>(value) else {
        return Ok(false);
    };
    stored.revoked_at.get_or_insert_with(now_ms);
    let value =
        serde_json::to_value(&stored).map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    store.put_config(ConfigKind::ApiKey, id, &value).await?;
    Ok(true)
}

/// Whether any key is active (authentication is on).
pub async fn any_active_key(store: &Store) -> Result<bool, AuthError> {
    Ok(list_keys(store).await?.iter().any(|key| !key.revoked))
}

/// The console logins: token hash → (key id, when it started). Bounded in time and number.
#[derive(Debug)]
struct Logins {
    entries: HashMap<String, (String, Instant)>,
    ttl: Duration,
    max: usize,
}

impl Logins {
    fn new(ttl: Duration, max: usize) -> Self {
        Self {
            entries: HashMap::new(),
            ttl,
            max,
        }
    }

    /// Adds a login at `now`: expired logins are swept first, and when the table is still
    /// full the oldest logins end to make room.
    fn insert(&mut self, token_hash: String, key_id: String, now: Instant) {
        let ttl = self.ttl;
        self.entries
            .retain(|_, (_, at)| now.saturating_duration_since(*at) <= ttl);
        while self.entries.len() >= self.max.max(1) {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, (_, at))| *at)
                .map(|(hash, _)| hash.clone())
            else {
                break;
            };
            self.entries.remove(&oldest);
        }
        self.entries.insert(token_hash, (key_id, now));
    }

    /// The key id of a current login; an expired one is removed.
    fn get(&mut self, token_hash: &str, now: Instant) -> Option<String> {
        let (id, at) = self.entries.get(token_hash)?;
        if now.saturating_duration_since(*at) > self.ttl {
            self.entries.remove(token_hash);
            return None;
        }
        Some(id.clone())
    }

    fn remove(&mut self, token_hash: &str) {
        self.entries.remove(token_hash);
    }

    fn len(&self) -> usize {
        self.entries.len()
    }
}

/// Checks presented credentials against the store.
#[derive(Clone)]
pub struct Authenticator {
    store: Store,
    enabled: Arc<Mutex<Option<(Instant, bool)>>>,
    logins: Arc<Mutex<Logins>>,
}

impl Authenticator {
    /// An authenticator over `store`, with logins lasting [`LOGIN_TTL`], at most
    /// [`MAX_LOGINS`] at once.
    pub fn new(store: Store) -> Self {
        Self::with_login_limits(store, LOGIN_TTL, MAX_LOGINS)
    }

    /// An authenticator whose logins last `ttl`, at most `max` at once.
    pub fn with_login_limits(store: Store, ttl: Duration, max: usize) -> Self {
        Self {
            store,
            enabled: Arc::default(),
            logins: Arc::new(Mutex::new(Logins::new(ttl, max))),
        }
    }

    fn logins(&self) -> std::sync::MutexGuard<'_, Logins> {
        self.logins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many logins are held (expired ones may remain until the next login sweeps them).
    pub fn login_count(&self) -> usize {
        self.logins().len()
    }

    /// Whether authentication is on (any active key), cached for a second.
    pub async fn enabled(&self) -> Result<bool, AuthError> {
        let cached = *self
            .enabled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some((at, enabled)) = cached
            && at.elapsed() < ENABLED_CACHE
        {
            return Ok(enabled);
        }
        let enabled = any_active_key(&self.store).await?;
        *self
            .enabled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((Instant::now(), enabled));
        Ok(enabled)
    }

    /// Forgets the cached "is auth on" (after a key is created or revoked here).
    pub fn refresh(&self) {
        *self
            .enabled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// The id of the active key `presented` is, if it is one.
    pub async fn verify_key(&self, presented: &str) -> Result<Option<String>, AuthError> {
        let Some(id) = presented
            .strip_prefix("agk_")
            .and_then(|rest| rest.split_once('_'))
            .map(|(id, _)| id)
            .filter(|id| id.len() == 12 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            return Ok(None);
        };
        let Some(value) = self.store.config(ConfigKind::ApiKey, id).await? else {
            return Ok(None);
        };
        let Ok(stored) = serde_json::from_value::<StoredKey>(value) else {
            return Ok(None);
        };
        let valid = stored.revoked_at.is_none() && same(&stored.hash, &digest(presented));
        Ok(valid.then(|| id.to_owned()))
    }

    /// Starts a login for a valid key: the cookie token, or `None` if the key is not valid.
    pub async fn login(&self, presented: &str) -> Result<Option<String>, AuthError> {
        let Some(id) = self.verify_key(presented).await? else {
            return Ok(None);
        };
        let token = random_hex(32)?;
        self.logins().insert(digest(&token), id, Instant::now());
        Ok(Some(token))
    }

    /// Ends a login.
    pub fn logout(&self, token: &str) {
        self.logins().remove(&digest(token));
    }

    /// Whether a login token is current and its key still active.
    pub async fn verify_login(&self, token: &str) -> Result<bool, AuthError> {
        let entry = self.logins().get(&digest(token), Instant::now());
        let Some(id) = entry else {
            return Ok(false);
        };
        let active = match self.store.config(ConfigKind::ApiKey, &id).await? {
            Some(value) => serde_json::from_value::<StoredKey>(value)
                .is_ok_and(|stored| stored.revoked_at.is_none()),
            None => false,
        };
        Ok(active)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expired_logins_are_swept_when_one_is_added() {
        let start = Instant::now();
        let mut logins = Logins::new(Duration::from_secs(60), 100);
        for n in 0..50 {
            logins.insert(format!("old{n}"), "k".into(), start);
        }
        assert_eq!(logins.len(), 50);
        // Nobody presents the old tokens again; one later login sweeps them all.
        let later = start + Duration::from_secs(61);
        logins.insert("new".into(), "k".into(), later);
        assert_eq!(logins.len(), 1);
        assert_eq!(logins.get("new", later).as_deref(), Some("k"));
        assert_eq!(logins.get("old0", later), None);
        // An expired login is refused when presented, and removed.
        assert_eq!(logins.get("new", later + Duration::from_secs(61)), None);
        assert_eq!(logins.len(), 0);
    }

    #[test]
    fn logins_are_capped_and_the_oldest_goes_first() {
        let start = Instant::now();
        let mut logins = Logins::new(Duration::from_secs(3600), 3);
        for n in 0..10u64 {
            logins.insert(
                format!("t{n}"),
                format!("k{n}"),
                start + Duration::from_secs(n),
            );
            assert!(logins.len() <= 3);
        }
        assert_eq!(logins.len(), 3);
        let now = start + Duration::from_secs(10);
        for n in 0..7 {
            assert_eq!(logins.get(&format!("t{n}"), now), None, "t{n}");
        }
        for n in 7..10 {
            assert_eq!(logins.get(&format!("t{n}"), now), Some(format!("k{n}")));
        }
    }
}
