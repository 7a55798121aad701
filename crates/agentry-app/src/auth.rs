//! API keys and the console login.
//!
//! Keys look like `agk_<id>_<secret>`. Only a SHA-256 hash is stored (configuration kind
//! `api_key`), so a database leak reveals no key; the full key is shown once, at creation.
//! As soon as one key exists, every `/v1` route (and the MCP endpoint `/mcp`) needs
//! `Authorization: Bearer <key>` or the session cookie a login sets; revoking a key takes
//! effect on the next request.
//!
//! Console logins live in memory for [`LOGIN_TTL`]. Expired ones are swept whenever a login is
//! added, at most [`MAX_LOGINS_PER_KEY`] are kept per key and [`MAX_LOGINS`] in all (the oldest
//! goes first), so repeated logins cannot grow the table without bound nor push other keys' out.
//! Failed logins are throttled per client address: one client's guesses lock nobody else out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use agentry_core::access::{AccessDenied, Grant};
use agentry_store::{ConfigKind, Store, StoreError};

/// The cookie a login sets.
pub const SESSION_COOKIE: &str = "agentry_session";
/// The cookie a login over TLS sets (`Secure`, bound to this host and path `/`).
pub const SECURE_SESSION_COOKIE: &str = "__Host-agentry_session";
/// Failed logins allowed from one client address in [`LOGIN_FAILURE_WINDOW`] before its further
/// attempts wait (other clients' go on).
const MAX_LOGIN_FAILURES: usize = 10;
/// Client addresses whose failures are remembered at once; past that, the one that failed
/// longest ago is forgotten.
const MAX_THROTTLED_CLIENTS: usize = 10_000;
/// Logins one key holds at once; another login of the key ends its oldest, so one key holder
/// cannot push every other console user out.
pub const MAX_LOGINS_PER_KEY: usize = 32;
/// The window failed logins are counted in.
const LOGIN_FAILURE_WINDOW: Duration = Duration::from_secs(60);
/// How long a login lasts.
pub const LOGIN_TTL: Duration = Duration::from_secs(12 * 3600);
/// How many logins are kept at once; a login beyond that ends the oldest.
pub const MAX_LOGINS: usize = 10_000;
/// How long "is auth on" is cached.
const ENABLED_CACHE: Duration = Duration::from_secs(1);

/// What a key may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum KeyRole {
    /// Everything: configuration, keys, secrets, every session. Keys made before roles existed
    /// are admins.
    #[default]
    Admin,
    /// Runs, and only its own sessions, runs and sandboxes; within its limits.
    User,
}

/// Which agents, models and tools a `user` key may use (`None`: any).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct KeyLimits {
    /// The saved agents it may run as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    /// The models it may run on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// The tools it may name in a run (an allowed agent brings its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Its quotas, where they differ from the defaults (16 live runs, 8 sandboxes, 8 terminals,
    /// 60 new sessions a minute, no token quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<crate::key_quotas::KeyQuotas>,
}

impl KeyLimits {
    /// Most names in one list.
    const MAX_NAMES: usize = 256;

    fn validate(&self) -> Result<(), AuthError> {
        for (what, names) in [
            ("agents", &self.agents),
            ("models", &self.models),
            ("tools", &self.tools),
        ] {
            let Some(names) = names else { continue };
            if names.len() > Self::MAX_NAMES
                || names.iter().any(|name| {
                    name.is_empty() || name.len() > 128 || name.chars().any(char::is_control)
                })
            {
                return Err(AuthError::InvalidLimits(format!(
                    "`{what}` lists at most {} names of 1 to 128 characters",
                    Self::MAX_NAMES
                )));
            }
        }
        if let Some(quotas) = &self.quotas {
            quotas.validate().map_err(AuthError::InvalidLimits)?;
        }
        Ok(())
    }
}

/// Who a request comes from, once authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The key's id; `None` for the operator (a server without keys).
    pub key_id: Option<String>,
    /// What it may do.
    pub role: KeyRole,
    /// Its limits (a `user` key's).
    pub limits: KeyLimits,
}

impl Principal {
    /// The operator of a server without keys: an admin.
    pub fn operator() -> Self {
        Self {
            key_id: None,
            role: KeyRole::Admin,
            limits: KeyLimits::default(),
        }
    }

    /// Whether it may do everything.
    pub fn is_admin(&self) -> bool {
        self.role == KeyRole::Admin
    }

    /// The owner its new sessions, runs and sandboxes get.
    pub fn owner(&self) -> Option<String> {
        self.key_id.clone()
    }

    /// Whether it may see something owned by `owner`: an admin sees everything, a user key only
    /// what it made.
    pub fn may_see(&self, owner: Option<&str>) -> bool {
        self.is_admin() || (owner.is_some() && owner == self.key_id.as_deref())
    }

    /// The owner to filter listings by: `None` (everything) for an admin, its own id otherwise.
    pub fn owner_filter(&self) -> Option<String> {
        if self.is_admin() {
            None
        } else {
            // A user key always has an id; an empty filter then matches nothing.
            Some(self.key_id.clone().unwrap_or_default())
        }
    }

    /// What its runs may use: `None` (everything) for an admin, its limits for a `user` key.
    /// Every run it starts carries this grant, which the runtime checks on the resolved run
    /// and hands down to the sub-agents the run starts.
    pub fn grant(&self) -> Option<Grant> {
        if self.is_admin() {
            return None;
        }
        Some(Grant {
            agents: self.limits.agents.clone(),
            models: self.limits.models.clone(),
            tools: self.limits.tools.clone(),
            no_commands: false,
        })
    }

    /// Checks that it may run as `agent`.
    pub fn check_agent(&self, agent: &str) -> Result<(), AccessDenied> {
        self.grant()
            .map_or(Ok(()), |grant| grant.check_agent(agent))
    }

    /// The end user `user` names for it: a run's `user`, whose memories the run reads and its
    /// compactions write. User names are `[A-Za-z0-9_.-]`, so `<key id>:<name>` never collides
    /// with a plain one: a `user` key's `alice` is `<its id>:alice`, apart from every other
    /// key's end users; an admin names any end user, plainly or as `<key id>:<name>` to act for
    /// a key's. An invalid name is a bad request.
    pub fn end_user(&self, user: &str) -> Result<String, crate::error::AppError> {
        use crate::config::check_name;
        if !self.is_admin() {
            check_name("user", user)?;
            return Ok(format!(
                "{}:{user}",
                self.key_id.as_deref().unwrap_or_default()
            ));
        }
        match user.split_once(':') {
            Some((key, name)) => {
                check_name("key id", key)?;
                check_name("user", name)?;
            }
            None => check_name("user", user)?,
        }
        Ok(user.to_owned())
    }

    /// Checks that it may call `model` (a session title's, a summary's).
    pub fn check_model(&self, model: &str) -> Result<(), AccessDenied> {
        self.grant()
            .map_or(Ok(()), |grant| grant.check_model(model))
    }
}

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
    /// What it may do (keys made before roles existed are admins).
    #[serde(default)]
    pub role: KeyRole,
    /// Its limits.
    #[serde(default)]
    pub limits: KeyLimits,
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
    /// What it may do.
    pub role: KeyRole,
    /// Its limits.
    pub limits: KeyLimits,
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
    /// The limits are malformed.
    #[error("invalid limits: {0}")]
    InvalidLimits(String),
    /// Revoking this key would leave no active admin key.
    #[error(
        "{0} is the last active admin key: revoking it would lock everyone out (create another \
         admin key first, or turn authentication off on the server's machine with \
         `agentry keys reset`)"
    )]
    LastAdmin(String),
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

/// Creates an admin key.
pub async fn create_key(store: &Store, label: &str) -> Result<NewKey, AuthError> {
    create_key_with(store, label, KeyRole::Admin, KeyLimits::default()).await
}

/// Creates a key with a role and limits. The first key of a store is always an admin (someone
/// must be able to manage the rest).
pub async fn create_key_with(
    store: &Store,
    label: &str,
    role: KeyRole,
    limits: KeyLimits,
) -> Result<NewKey, AuthError> {
    limits.validate()?;
    let role = if list_keys(store).await?.is_empty() {
        KeyRole::Admin
    } else {
        role
    };
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
        created_at: crate::clock::now_ms(),
        revoked_at: None,
        role,
        limits,
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
                role: stored.role,
                limits: stored.limits,
            })
        })
        .collect();
    keys.sort_by_key(|key| std::cmp::Reverse(key.created_at));
    Ok(keys)
}

/// Revokes a key unless it is the last active admin key ([`AuthError::LastAdmin`]); false if
/// there is none with this id. Authentication stays on either way (see [`auth_enabled`]).
pub async fn revoke_key_keeping_an_admin(store: &Store, id: &str) -> Result<bool, AuthError> {
    let keys = list_keys(store).await?;
    let Some(key) = keys.iter().find(|key| key.id == id) else {
        return Ok(false);
    };
    let other_admins = keys
        .iter()
        .filter(|other| other.id != id && !other.revoked && other.role == KeyRole::Admin)
        .count();
    if !key.revoked && key.role == KeyRole::Admin && other_admins == 0 {
        return Err(AuthError::LastAdmin(id.to_owned()));
    }
    revoke_key(store, id).await
}

/// Revokes a key; false if there is none with this id.
pub async fn revoke_key(store: &Store, id: &str) -> Result<bool, AuthError> {
    let Some(value) = store.config(ConfigKind::ApiKey, id).await? else {
        return Ok(false);
    };
    let Ok(mut stored) = serde_json::from_value::<StoredKey>(value) else {
        return Ok(false);
    };
    stored.revoked_at.get_or_insert_with(crate::clock::now_ms);
    let value =
        serde_json::to_value(&stored).map_err(|e| StoreError::InvalidInput(e.to_string()))?;
    store.put_config(ConfigKind::ApiKey, id, &value).await?;
    Ok(true)
}

/// Who the active key `id` is, as it is now; `None` when it is revoked or unknown.
pub async fn active_key(store: &Store, id: &str) -> Result<Option<Principal>, AuthError> {
    let Some(value) = store.config(ConfigKind::ApiKey, id).await? else {
        return Ok(None);
    };
    Ok(serde_json::from_value::<StoredKey>(value)
        .ok()
        .filter(|stored| stored.revoked_at.is_none())
        .map(|stored| Principal {
            key_id: Some(id.to_owned()),
            role: stored.role,
            limits: stored.limits,
        }))
}

/// Whether any key is active.
pub async fn any_active_key(store: &Store) -> Result<bool, AuthError> {
    Ok(list_keys(store).await?.iter().any(|key| !key.revoked))
}

/// Whether authentication is on: once a key has been created it stays on, whatever is revoked
/// later; only `agentry keys reset` (which deletes every key, on the server's machine) turns it
/// off again.
pub async fn auth_enabled(store: &Store) -> Result<bool, AuthError> {
    Ok(!store.list_config(ConfigKind::ApiKey).await?.is_empty())
}

/// Deletes every key: authentication is off afterwards. For the operator only (the CLI).
pub async fn reset_keys(store: &Store) -> Result<usize, AuthError> {
    let keys = store.list_config(ConfigKind::ApiKey).await?;
    for (id, _) in &keys {
        store.delete_config(ConfigKind::ApiKey, id).await?;
    }
    Ok(keys.len())
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

    /// Adds a login at `now`: expired logins are swept first, a key at [`MAX_LOGINS_PER_KEY`]
    /// ends its own oldest login, and when the table is still full the oldest logins end to
    /// make room.
    fn insert(&mut self, token_hash: String, key_id: String, now: Instant) {
        let ttl = self.ttl;
        self.entries
            .retain(|_, (_, at)| now.saturating_duration_since(*at) <= ttl);
        let mut own: Vec<(Instant, String)> = self
            .entries
            .iter()
            .filter(|(_, (id, _))| *id == key_id)
            .map(|(hash, (_, at))| (*at, hash.clone()))
            .collect();
        if own.len() >= MAX_LOGINS_PER_KEY {
            own.sort();
            for (_, hash) in own.iter().take(own.len() + 1 - MAX_LOGINS_PER_KEY) {
                self.entries.remove(hash);
            }
        }
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

/// Recent failed logins by client address (`None`: a caller that gave none), each client's
/// counted apart, at most [`MAX_THROTTLED_CLIENTS`] clients remembered.
#[derive(Debug, Default)]
struct LoginFailures {
    by_client: HashMap<Option<IpAddr>, std::collections::VecDeque<Instant>>,
}

impl LoginFailures {
    fn failed(&mut self, client: Option<IpAddr>, now: Instant) {
        let recent = |at: &Instant| now.saturating_duration_since(*at) <= LOGIN_FAILURE_WINDOW;
        if !self.by_client.contains_key(&client) && self.by_client.len() >= MAX_THROTTLED_CLIENTS {
            self.by_client
                .retain(|_, times| times.back().is_some_and(recent));
            if self.by_client.len() >= MAX_THROTTLED_CLIENTS {
                let stalest = self
                    .by_client
                    .iter()
                    .min_by_key(|(_, times)| times.back().copied())
                    .map(|(address, _)| *address);
                if let Some(stalest) = stalest {
                    self.by_client.remove(&stalest);
                }
            }
        }
        let times = self.by_client.entry(client).or_default();
        times.push_back(now);
        while times.len() > MAX_LOGIN_FAILURES {
            times.pop_front();
        }
    }

    fn wait(&mut self, client: Option<IpAddr>, now: Instant) -> Option<Duration> {
        let times = self.by_client.get_mut(&client)?;
        while times
            .front()
            .is_some_and(|at| now.saturating_duration_since(*at) > LOGIN_FAILURE_WINDOW)
        {
            times.pop_front();
        }
        if times.is_empty() {
            self.by_client.remove(&client);
            return None;
        }
        if times.len() < MAX_LOGIN_FAILURES {
            return None;
        }
        times.front().map(|oldest| {
            LOGIN_FAILURE_WINDOW.saturating_sub(now.saturating_duration_since(*oldest))
        })
    }
}

/// Checks presented credentials against the store.
#[derive(Clone)]
pub struct Authenticator {
    store: Store,
    enabled: Arc<Mutex<Option<(Instant, bool)>>>,
    logins: Arc<Mutex<Logins>>,
    failed_logins: Arc<Mutex<LoginFailures>>,
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
            failed_logins: Arc::default(),
        }
    }

    /// Records a failed login from `client` (its address, when known).
    pub fn login_failed(&self, client: Option<IpAddr>) {
        self.failed_logins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .failed(client, Instant::now());
    }

    /// How long `client` waits before its next login attempt, when too many of its own failed
    /// lately; other clients are not held back by its failures.
    pub fn login_throttled(&self, client: Option<IpAddr>) -> Option<Duration> {
        self.failed_logins
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .wait(client, Instant::now())
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

    /// Whether authentication is on (see [`auth_enabled`]), cached for a second.
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
        let enabled = auth_enabled(&self.store).await?;
        *self
            .enabled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some((Instant::now(), enabled));
        Ok(enabled)
    }

    /// Every key, newest first (never the keys themselves).
    pub async fn keys(&self) -> Result<Vec<KeyInfo>, AuthError> {
        list_keys(&self.store).await
    }

    /// Creates a key with a role and limits ([`create_key_with`]); it works from the next
    /// request.
    pub async fn create_key(
        &self,
        label: &str,
        role: KeyRole,
        limits: KeyLimits,
    ) -> Result<NewKey, AuthError> {
        let created = create_key_with(&self.store, label, role, limits).await?;
        self.refresh();
        Ok(created)
    }

    /// Revokes a key unless it is the last active admin key
    /// ([`revoke_key_keeping_an_admin`]); requests carrying it fail from the next one.
    pub async fn revoke_key(&self, id: &str) -> Result<bool, AuthError> {
        let revoked = revoke_key_keeping_an_admin(&self.store, id).await?;
        if revoked {
            self.refresh();
        }
        Ok(revoked)
    }

    /// A key for `purpose` derived from the data folder's secret key (signed assertions).
    pub fn derived_key(&self, purpose: &str) -> Result<[u8; 32], AuthError> {
        Ok(self.store.derived_key(purpose)?)
    }

    /// Forgets the cached "is auth on" (after a key is created or revoked here).
    pub fn refresh(&self) {
        *self
            .enabled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
    }

    /// Who presents `presented`, if it is an active key.
    pub async fn verify_key(&self, presented: &str) -> Result<Option<Principal>, AuthError> {
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
        Ok(valid.then(|| Principal {
            key_id: Some(id.to_owned()),
            role: stored.role,
            limits: stored.limits,
        }))
    }

    /// Who the active key `id` is, if it is active.
    pub async fn active_key(&self, id: &str) -> Result<Option<Principal>, AuthError> {
        active_key(&self.store, id).await
    }

    /// Starts a login for a valid key: the cookie token, or `None` if the key is not valid.
    pub async fn login(&self, presented: &str) -> Result<Option<String>, AuthError> {
        let Some(id) = self.verify_key(presented).await?.and_then(|who| who.key_id) else {
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

    /// Who a login token belongs to, if it is current and its key still active.
    pub async fn verify_login(&self, token: &str) -> Result<Option<Principal>, AuthError> {
        let entry = self.logins().get(&digest(token), Instant::now());
        let Some(id) = entry else {
            return Ok(None);
        };
        self.active_key(&id).await
    }
}

impl crate::config::ConfigDoc for StoredKey {
    const KIND: agentry_store::ConfigKind = agentry_store::ConfigKind::ApiKey;
    const NOUN: &'static str = "API key";
}

impl crate::App {
    /// Whether `caller` may see the session `id` (a missing session is left to the caller).
    pub async fn may_see_session(
        &self,
        caller: &Principal,
        id: agentry_types::SessionId,
    ) -> Result<bool, crate::error::AppError> {
        if caller.is_admin() {
            return Ok(true);
        }
        Ok(match self.parts.store.session(id).await? {
            Some(record) => caller.may_see(record.owner.as_deref()),
            None => true,
        })
    }

    /// 404 for a session `caller` may not see, worded like a missing one.
    pub async fn check_session_access(
        &self,
        caller: &Principal,
        id: agentry_types::SessionId,
    ) -> Result<(), crate::error::AppError> {
        if self.may_see_session(caller, id).await? {
            Ok(())
        } else {
            Err(crate::error::AppError::not_found(format!(
                "no session {id}"
            )))
        }
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
            logins.insert(format!("old{n}"), format!("k{n}"), start);
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
    fn one_key_holds_a_bounded_number_of_logins_and_pushes_out_no_one_else() {
        let start = Instant::now();
        let mut logins = Logins::new(Duration::from_secs(3600), 1000);
        logins.insert("other".into(), "k2".into(), start);
        for n in 0..100u64 {
            logins.insert(
                format!("t{n}"),
                "k1".into(),
                start + Duration::from_secs(n + 1),
            );
        }
        let now = start + Duration::from_secs(200);
        assert_eq!(logins.len(), MAX_LOGINS_PER_KEY + 1);
        assert_eq!(logins.get("other", now).as_deref(), Some("k2"));
        assert_eq!(logins.get("t99", now).as_deref(), Some("k1"));
        assert_eq!(logins.get("t0", now), None, "the key's oldest went");
    }

    #[test]
    fn failed_logins_hold_back_only_their_own_client() {
        let now = Instant::now();
        let mut failures = LoginFailures::default();
        let attacker = Some(IpAddr::from([127, 0, 0, 9]));
        let user = Some(IpAddr::from([127, 0, 0, 1]));
        for _ in 0..MAX_LOGIN_FAILURES {
            assert_eq!(failures.wait(attacker, now), None);
            failures.failed(attacker, now);
        }
        assert_eq!(failures.wait(attacker, now), Some(LOGIN_FAILURE_WINDOW));
        assert_eq!(failures.wait(user, now), None);
        assert_eq!(failures.wait(None, now), None);
        // A minute later the attacker may try again.
        let later = now + LOGIN_FAILURE_WINDOW + Duration::from_secs(1);
        assert_eq!(failures.wait(attacker, later), None);
        // However many addresses fail, only so many are remembered.
        for n in 0..(MAX_THROTTLED_CLIENTS as u32 + 10) {
            failures.failed(Some(IpAddr::from(n.to_be_bytes())), later);
        }
        assert!(failures.by_client.len() <= MAX_THROTTLED_CLIENTS);
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
