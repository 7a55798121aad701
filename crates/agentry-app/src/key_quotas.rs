//! What a key's quotas are: as its limits set them ([`KeyQuotas`], saved with the key) and as
//! they are in force ([`Quotas`], the defaults filled in). The quotas module holds keys to them.

use serde::{Deserialize, Serialize};

/// The quotas a key's limits may set (absent: the default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct KeyQuotas {
    /// Runs going at once (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub live_runs: Option<u32>,
    /// Standalone sandboxes open at once (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandboxes: Option<u32>,
    /// Terminals open at once in its sessions (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminals: Option<u32>,
    /// Sessions it may create a minute (default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions_per_minute: Option<u32>,
    /// Model tokens (input and output) over the last 24 hours (default: no quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
}

impl KeyQuotas {
    /// The most any quota may be set to.
    const MAX: u64 = 1_000_000_000_000;

    /// Checks the values (each at least 1).
    pub fn validate(&self) -> Result<(), String> {
        let values = [
            ("live_runs", self.live_runs.map(u64::from)),
            ("sandboxes", self.sandboxes.map(u64::from)),
            ("terminals", self.terminals.map(u64::from)),
            (
                "sessions_per_minute",
                self.sessions_per_minute.map(u64::from),
            ),
            ("tokens_per_day", self.tokens_per_day),
        ];
        for (name, value) in values {
            if value.is_some_and(|value| value == 0 || value > Self::MAX) {
                return Err(format!("quota `{name}` is 1 to {}", Self::MAX));
            }
        }
        Ok(())
    }

    /// The quotas in force: these, else the defaults.
    pub fn effective(&self) -> Quotas {
        Quotas {
            live_runs: self.live_runs.unwrap_or(16),
            sandboxes: self.sandboxes.unwrap_or(8),
            terminals: self.terminals.unwrap_or(8),
            sessions_per_minute: self.sessions_per_minute.unwrap_or(60),
            tokens_per_day: self.tokens_per_day,
        }
    }
}

/// The quotas a `user` key is held to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Quotas {
    /// Runs going at once.
    pub live_runs: u32,
    /// Standalone sandboxes open at once.
    pub sandboxes: u32,
    /// Terminals open at once in its sessions.
    pub terminals: u32,
    /// Sessions created a minute.
    pub sessions_per_minute: u32,
    /// Model tokens over the last 24 hours (`None`: no quota).
    pub tokens_per_day: Option<u64>,
}
