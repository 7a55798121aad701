//! Per-key quotas: what one `user` key may hold at once or use in a while, so that no tenant
//! exhausts what every key shares (the run workers, the sandbox and terminal pools, the
//! model's budget). Each quota has a default well below the server-wide caps, a key's limits
//! may set its own (`limits.quotas`), and admin keys have none; the sandbox and terminal pools
//! keep [`ADMIN_RESERVE`] places that only admins may take. A key over a quota gets `429
//! quota_exceeded` naming it, with `Retry-After`, before anything is created or started.
//!
//! Counted where the thing lives: running runs in the runs table (every node's), sandboxes and
//! terminals in this process's pools, new sessions over the last minute in the sessions table
//! (every node's) and in a sliding minute of this node's (the ones not yet written), tokens in
//! the usage ledger over the last 24 hours (stateless runs' too).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::App;
use crate::auth::Principal;
use crate::error::{AppError, Failure};
use crate::key_quotas::{KeyQuotas, Quotas};

/// Places of the sandbox and terminal pools that `user` keys together never take.
pub const ADMIN_RESERVE: usize = 8;

/// A quota's use against its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaUse {
    /// What is used now.
    pub used: u64,
    /// The limit (`None`: none).
    pub limit: Option<u64>,
}

/// A key's use of each of its quotas (`GET /v1/api-keys/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct QuotaReport {
    /// Runs going now.
    pub live_runs: QuotaUse,
    /// Standalone sandboxes open on this node.
    pub sandboxes: QuotaUse,
    /// Terminals open on this node in its sessions.
    pub terminals: QuotaUse,
    /// Sessions created in the last minute on this node.
    pub sessions_per_minute: QuotaUse,
    /// Model tokens over the last 24 hours.
    pub tokens_per_day: QuotaUse,
}

/// New sessions per key in the last minute, on this node.
#[derive(Debug, Default)]
pub struct SessionWindows {
    by_key: Mutex<HashMap<String, VecDeque<Instant>>>,
}

const MINUTE: Duration = Duration::from_secs(60);

impl SessionWindows {
    fn windows(&self) -> std::sync::MutexGuard<'_, HashMap<String, VecDeque<Instant>>> {
        self.by_key
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// How many sessions `key` created in the minute before `now`.
    fn count(&self, key: &str, now: Instant) -> usize {
        let mut by_key = self.windows();
        let count = by_key
            .get_mut(key)
            .map_or(0, |times| within_the_minute(times, now));
        if count == 0 {
            by_key.remove(key);
        }
        count
    }

    /// Takes a new session for `key` at `now` unless it made `limit` in the last minute; when
    /// refused, how long until one more may be made.
    fn take(&self, key: &str, limit: usize, now: Instant) -> Result<(), Duration> {
        let mut by_key = self.windows();
        let times = by_key.entry(key.to_owned()).or_default();
        if within_the_minute(times, now) >= limit {
            return Err(times.front().map_or(MINUTE, |at| {
                MINUTE.saturating_sub(now.saturating_duration_since(*at))
            }));
        }
        times.push_back(now);
        Ok(())
    }
}

/// Drops the times of `times` a minute or more before `now`; answers how many are left.
fn within_the_minute(times: &mut VecDeque<Instant>, now: Instant) -> usize {
    while times
        .front()
        .is_some_and(|at| now.saturating_duration_since(*at) >= MINUTE)
    {
        times.pop_front();
    }
    times.len()
}

/// `429 quota_exceeded` for `quota` at `limit`, to be tried again after `retry_after`.
fn exceeded(quota: &str, limit: u64, what: &str, retry_after: Duration) -> AppError {
    AppError::new(
        Failure::TooMany,
        "quota_exceeded",
        format!("this API key's quota `{quota}` is {limit} {what}: wait, or ask an admin for more"),
    )
    .with_details(serde_json::json!({
        "quota": quota,
        "limit": limit,
        "retry_after_secs": retry_after.as_secs().max(1),
    }))
}

/// A pool whose places keys hold: its name, its size, and the owner of each place taken.
struct Pool {
    name: &'static str,
    max: usize,
    owners: Vec<Option<String>>,
}

/// How many of the places `owners` describe `key` holds.
fn held_by(owners: &[Option<String>], key: Option<&str>) -> u64 {
    owners
        .iter()
        .filter(|owner| owner.as_deref() == key)
        .count() as u64
}

/// Refuses a `user` key the last [`ADMIN_RESERVE`] places of a pool of `max`, of which
/// `user` keys hold `held_by_users`.
fn check_reserve(pool: &str, max: usize, held_by_users: usize) -> Result<(), AppError> {
    if held_by_users + ADMIN_RESERVE >= max {
        return Err(AppError::new(
            Failure::TooMany,
            "quota_exceeded",
            format!(
                "the server keeps its last {ADMIN_RESERVE} {pool} for admin keys, and API keys \
                 like this one hold the rest: close one first"
            ),
        )
        .with_details(serde_json::json!({
            "quota": pool,
            "limit": max.saturating_sub(ADMIN_RESERVE),
            "retry_after_secs": 60,
        })));
    }
    Ok(())
}

impl App {
    /// The quotas `caller` is held to (`None`: an admin, held to none).
    pub fn quotas_of(&self, caller: &Principal) -> Option<Quotas> {
        (!caller.is_admin()).then(|| {
            caller
                .limits
                .quotas
                .as_ref()
                .map_or_else(|| KeyQuotas::default().effective(), KeyQuotas::effective)
        })
    }

    /// Checks that `caller` may start a run now (its running runs, its tokens of the last
    /// day) and, when the run makes one, a session; nothing is counted when refused.
    pub(crate) async fn check_run_quotas(
        &self,
        caller: &Principal,
        new_session: bool,
    ) -> Result<(), AppError> {
        let (Some(quotas), Some(key)) = (self.quotas_of(caller), caller.key_id.as_deref()) else {
            return Ok(());
        };
        let running = self.running_runs(key).await?;
        if running >= u64::from(quotas.live_runs) {
            return Err(exceeded(
                "live_runs",
                quotas.live_runs.into(),
                "runs going at once",
                Duration::from_secs(5),
            ));
        }
        if let Some(limit) = quotas.tokens_per_day
            && self.tokens_of_the_day(key).await? >= limit
        {
            return Err(exceeded(
                "tokens_per_day",
                limit,
                "model tokens over 24 hours",
                Duration::from_secs(3600),
            ));
        }
        if new_session {
            self.take_session(caller).await?;
        }
        Ok(())
    }

    /// Counts a new session of `caller` against its per-minute quota (429 when over): the
    /// sessions it created in the last minute on every node (the store's), and the ones this
    /// node is creating now (its own window, which also holds the ones not yet written).
    pub(crate) async fn take_session(&self, caller: &Principal) -> Result<(), AppError> {
        let (Some(quotas), Some(key)) = (self.quotas_of(caller), caller.key_id.as_deref()) else {
            return Ok(());
        };
        let now = crate::clock::now_ms();
        let (created, first) = self
            .parts
            .store
            .sessions_created_since(key, now.saturating_sub(60_000))
            .await?;
        if created >= u64::from(quotas.sessions_per_minute) {
            let wait = first.map_or(60_000, |first| (first + 60_000).saturating_sub(now));
            return Err(exceeded(
                "sessions_per_minute",
                quotas.sessions_per_minute.into(),
                "new sessions a minute",
                Duration::from_millis(wait),
            ));
        }
        self.parts
            .session_windows
            .take(key, quotas.sessions_per_minute as usize, Instant::now())
            .map_err(|wait| {
                exceeded(
                    "sessions_per_minute",
                    quotas.sessions_per_minute.into(),
                    "new sessions a minute",
                    wait,
                )
            })
    }

    /// Checks that `caller` may open one more standalone sandbox: its own quota, and the
    /// places the pool keeps for admins.
    pub(crate) async fn check_sandbox_quota(&self, caller: &Principal) -> Result<(), AppError> {
        let Some(quotas) = self.quotas_of(caller) else {
            return Ok(());
        };
        let pool = Pool {
            name: "sandboxes",
            max: self.parts.sandboxes.max(),
            owners: self.sandbox_owners(),
        };
        self.check_pool(caller, pool, quotas.sandboxes).await
    }

    /// Checks that `caller` may open one more terminal: its own quota (terminals in its
    /// sessions), and the places the pool keeps for admins.
    pub(crate) async fn check_terminal_quota(&self, caller: &Principal) -> Result<(), AppError> {
        let Some(quotas) = self.quotas_of(caller) else {
            return Ok(());
        };
        let pool = Pool {
            name: "terminals",
            max: crate::terminals::MAX_TERMINALS,
            owners: self.terminal_owners().await?,
        };
        self.check_pool(caller, pool, quotas.terminals).await
    }

    /// Refuses `caller` one more place of `pool` when it holds `quota` of them, or when
    /// `user` keys together hold all but the [`ADMIN_RESERVE`].
    async fn check_pool(&self, caller: &Principal, pool: Pool, quota: u32) -> Result<(), AppError> {
        let mine = held_by(&pool.owners, caller.key_id.as_deref());
        if mine >= u64::from(quota) {
            return Err(exceeded(
                pool.name,
                quota.into(),
                &format!("{} open at once", pool.name),
                Duration::from_secs(60),
            ));
        }
        let held = self.user_held(&pool.owners).await?;
        check_reserve(pool.name, pool.max, held)
    }

    /// The owners of the open standalone sandboxes.
    fn sandbox_owners(&self) -> Vec<Option<String>> {
        self.parts
            .sandboxes
            .list()
            .iter()
            .map(|entry| entry.owner.clone())
            .collect()
    }

    /// The API key `id` and its use of each quota (`None`: no such key).
    pub async fn key_with_quotas(
        &self,
        id: &str,
    ) -> Result<Option<(crate::auth::KeyInfo, QuotaReport)>, AppError> {
        let key = crate::auth::list_keys(&self.parts.store)
            .await
            .map_err(|error| AppError::internal(error.to_string()))?
            .into_iter()
            .find(|key| key.id == id);
        let Some(key) = key else {
            return Ok(None);
        };
        let holder = Principal {
            key_id: Some(key.id.clone()),
            role: key.role,
            limits: key.limits.clone(),
        };
        let report = self.quota_report(&holder).await?;
        Ok(Some((key, report)))
    }

    /// What `key` uses of each quota.
    pub async fn quota_report(&self, caller: &Principal) -> Result<QuotaReport, AppError> {
        let quotas = self.quotas_of(caller);
        let key = caller.key_id.clone();
        let sandboxes = self.sandbox_owners();
        let terminals = self.terminal_owners().await?;
        let (running, tokens, sessions) = match key.as_deref() {
            Some(key) => (
                self.running_runs(key).await?,
                self.tokens_of_the_day(key).await?,
                self.parts.session_windows.count(key, Instant::now()) as u64,
            ),
            None => (0, 0, 0),
        };
        Ok(QuotaReport {
            live_runs: QuotaUse {
                used: running,
                limit: quotas.map(|q| q.live_runs.into()),
            },
            sandboxes: QuotaUse {
                used: held_by(&sandboxes, key.as_deref()),
                limit: quotas.map(|q| q.sandboxes.into()),
            },
            terminals: QuotaUse {
                used: held_by(&terminals, key.as_deref()),
                limit: quotas.map(|q| q.terminals.into()),
            },
            sessions_per_minute: QuotaUse {
                used: sessions,
                limit: quotas.map(|q| q.sessions_per_minute.into()),
            },
            tokens_per_day: QuotaUse {
                used: tokens,
                limit: quotas.and_then(|q| q.tokens_per_day),
            },
        })
    }

    /// How many places of a pool `user` keys hold (owners that are no admin key).
    async fn user_held(&self, owners: &[Option<String>]) -> Result<usize, AppError> {
        let admins: Vec<String> = crate::auth::list_keys(&self.parts.store)
            .await
            .map_err(|error| AppError::internal(error.to_string()))?
            .into_iter()
            .filter(|key| key.role == crate::auth::KeyRole::Admin)
            .map(|key| key.id)
            .collect();
        Ok(owners
            .iter()
            .filter(|owner| owner.as_ref().is_some_and(|owner| !admins.contains(owner)))
            .count())
    }

    /// The owners of the sessions the open terminals are in (`None`: no owner).
    /// (One lookup per session, however many terminals it has.)
    async fn terminal_owners(&self) -> Result<Vec<Option<String>>, AppError> {
        let mut by_session: HashMap<agentry_types::SessionId, Option<String>> = HashMap::new();
        let mut owners = Vec::new();
        for terminal in self.parts.tools.terminals.all() {
            let Some(session) = terminal.session() else {
                owners.push(None);
                continue;
            };
            let owner = match by_session.get(&session) {
                Some(owner) => owner.clone(),
                None => {
                    let owner = self
                        .parts
                        .store
                        .session(session)
                        .await?
                        .and_then(|record| record.owner);
                    by_session.insert(session, owner.clone());
                    owner
                }
            };
            owners.push(owner);
        }
        Ok(owners)
    }

    /// `key`'s runs going now (on any node).
    async fn running_runs(&self, key: &str) -> Result<u64, AppError> {
        let query = agentry_store::RunQuery {
            owner: Some(key.to_owned()),
            state: Some(agentry_store::RunState::Running),
            ..agentry_store::RunQuery::default()
        };
        Ok(self.parts.store.count_runs(&query).await?)
    }

    /// `key`'s model tokens (input and output) over the last 24 hours.
    async fn tokens_of_the_day(&self, key: &str) -> Result<u64, AppError> {
        let to = crate::clock::now_ms();
        let query = agentry_store::UsageQuery {
            from: to.saturating_sub(86_400_000),
            to: to.saturating_add(1),
            group_by: Vec::new(),
            agent: None,
            model: None,
            session: None,
            key: Some(Some(key.to_owned())),
        };
        Ok(self
            .parts
            .store
            .usage_report(&query)
            .await?
            .iter()
            .map(|group| group.usage.input_tokens + group.usage.output_tokens)
            .sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_holds_at_most_the_quota_of_new_sessions() {
        let windows = SessionWindows::default();
        let start = Instant::now();
        for n in 0..3 {
            assert_eq!(windows.take("k", 3, start + Duration::from_secs(n)), Ok(()));
        }
        let refused = windows.take("k", 3, start + Duration::from_secs(10));
        assert_eq!(refused, Err(Duration::from_secs(50)));
        // Another key is not held back.
        assert_eq!(windows.take("other", 3, start), Ok(()));
        // A minute after the first, one more.
        assert_eq!(
            windows.take("k", 3, start + Duration::from_secs(60)),
            Ok(())
        );
    }

    #[test]
    fn quotas_default_below_the_pools_and_reject_zero() {
        let quotas = KeyQuotas::default().effective();
        assert!((quotas.sandboxes as usize) < crate::terminals::MAX_TERMINALS - ADMIN_RESERVE);
        assert_eq!(quotas.tokens_per_day, None);
        let zero = KeyQuotas {
            live_runs: Some(0),
            ..KeyQuotas::default()
        };
        assert!(zero.validate().is_err());
        assert!(KeyQuotas::default().validate().is_ok());
    }
}
