//! The values the store reads and writes, and the rules for the names and kinds it accepts.

use std::fmt;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use agentry_types::SessionId;
use serde::{Deserialize, Serialize};

use crate::StoreError;

/// Which database a [`Store`](crate::Store) runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// An embedded SQLite file (the default).
    Sqlite,
    /// A PostgreSQL server, which several nodes can share.
    Postgres,
}

impl Backend {
    /// The backend's name: `sqlite` or `postgres`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A session to create.
#[derive(Debug, Clone, PartialEq)]
pub struct NewSession {
    /// Its id, chosen by the caller.
    pub id: SessionId,
    /// A title for people, if known yet.
    pub title: Option<String>,
    /// When [`Store::prune`](crate::Store::prune) may delete it, in Unix milliseconds.
    pub expires_at: Option<u64>,
    /// Anything the engine wants to keep with the session; opaque to the store.
    pub metadata: serde_json::Value,
    /// Who it belongs to (an API key's id); `None`: the operator.
    pub owner: Option<String>,
}

impl NewSession {
    /// A session with a fresh id, no title, no expiry and empty (`{}`) metadata.
    pub fn new() -> Self {
        Self::with_id(SessionId::new())
    }

    /// A session with the given id, no title, no expiry and empty (`{}`) metadata.
    pub fn with_id(id: SessionId) -> Self {
        Self {
            id,
            title: None,
            expires_at: None,
            metadata: serde_json::Value::Object(serde_json::Map::new()),
            owner: None,
        }
    }
}

impl Default for NewSession {
    fn default() -> Self {
        Self::new()
    }
}

/// A session as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionRecord {
    /// The session's id.
    pub id: SessionId,
    /// Its title, if set.
    pub title: Option<String>,
    /// The status the engine last set (`idle` for a new session).
    pub status: String,
    /// Creation time, Unix milliseconds.
    pub created_at: u64,
    /// Time of the last append (or creation), Unix milliseconds.
    pub last_activity: u64,
    /// The sequence number of its last event; 0 when it has none.
    pub last_seq: u64,
    /// The last sequence number a reader marked as read.
    pub read_seq: u64,
    /// The session and sequence number this one was forked from: its history starts with that
    /// session's events up to and including that number. If that session is deleted, the
    /// events are copied here and this points to the session it was itself forked from (or
    /// becomes `None`).
    pub parent: Option<(SessionId, u64)>,
    /// When it may be pruned, Unix milliseconds.
    pub expires_at: Option<u64>,
    /// The metadata it was created with.
    pub metadata: serde_json::Value,
    /// Who it belongs to (an API key's id); `None`: the operator.
    #[serde(default)]
    pub owner: Option<String>,
}

impl SessionRecord {
    /// Whether it has events past the last one marked read.
    pub fn unread(&self) -> bool {
        self.last_seq > self.read_seq
    }
}

/// Which sessions [`Store::list_sessions`](crate::Store::list_sessions) returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionQuery {
    /// Only sessions with this status.
    pub status: Option<String>,
    /// Only sessions of this owner (an API key's id).
    pub owner: Option<String>,
    /// At most this many.
    pub limit: usize,
    /// Skip this many first.
    pub offset: usize,
}

impl Default for SessionQuery {
    /// Every status, the first 100.
    fn default() -> Self {
        Self {
            status: None,
            owner: None,
            limit: 100,
            offset: 0,
        }
    }
}

/// An event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// What kind of event it is: 1 to 64 characters of `a-z`, `_` and `.`.
    pub kind: String,
    /// The event itself as JSON text; opaque to the store.
    payload: String,
    /// The model call it records, for the usage ledger (see [`crate::usage`]).
    pub usage: Option<crate::UsageEntry>,
    /// What it says of its run's record (a run started in its session).
    pub run: Option<crate::RunMark>,
}

impl NewEvent {
    /// An event of `kind` carrying `payload`.
    pub fn new(kind: impl Into<String>, payload: serde_json::Value) -> Self {
        Self {
            kind: kind.into(),
            // A `Value` always writes as JSON.
            payload: payload.to_string(),
            usage: None,
            run: None,
        }
    }

    /// An event of `kind` carrying `event` serialised, written straight to JSON text (without
    /// building a [`serde_json::Value`] first: the way a session's events are stored).
    pub fn encode(
        kind: impl Into<String>,
        event: &impl serde::Serialize,
    ) -> Result<Self, crate::StoreError> {
        let payload = serde_json::to_string(event).map_err(|error| {
            crate::StoreError::InvalidInput(format!(
                "the event does not serialise as JSON: {error}"
            ))
        })?;
        Ok(Self {
            kind: kind.into(),
            payload,
            usage: None,
            run: None,
        })
    }

    /// The payload's JSON text.
    pub fn payload(&self) -> &str {
        &self.payload
    }

    /// The event, recording a model call in the usage ledger in the same transaction.
    #[must_use]
    pub fn with_usage(mut self, entry: crate::UsageEntry) -> Self {
        self.usage = Some(entry);
        self
    }

    /// The event, keeping its run's record in the same transaction (see [`crate::RunMark`]).
    #[must_use]
    pub fn with_run(mut self, mark: crate::RunMark) -> Self {
        self.run = Some(mark);
        self
    }
}

/// An event as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredEvent {
    /// The session it is stored under (for a fork's inherited prefix: the ancestor's id).
    pub session_id: SessionId,
    /// Its sequence number, continuous across a fork.
    pub seq: u64,
    /// Its kind.
    pub kind: String,
    /// The payload exactly as appended.
    pub payload: serde_json::Value,
    /// When it was appended, Unix milliseconds.
    pub created_at: u64,
}

/// One result of [`Store::search`](crate::Store::search): the newest matching event of a
/// session.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SearchHit {
    /// The session the event is stored under.
    pub session_id: SessionId,
    /// The matching event's sequence number.
    pub seq: u64,
    /// A short piece of the payload's JSON text around the match.
    pub snippet: String,
    /// When the event was appended, Unix milliseconds.
    pub created_at: u64,
}

/// A secret as listed: never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretInfo {
    /// Its name.
    pub name: String,
    /// A masked form: `…` and the last 4 characters (`…wxyz`), or only `…` when the value is
    /// shorter than 16 characters.
    pub masked: String,
    /// The hosts it may be sent to, when it is bound to some (absent when it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<Vec<String>>,
    /// When it was last set, Unix milliseconds.
    pub updated_at: u64,
}

/// What [`Store::replace_config`](crate::Store::replace_config) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigReplaced {
    /// The configuration was replaced (and renamed, if asked).
    Replaced,
    /// Nothing is stored under the name: nothing was written.
    Missing,
    /// Another configuration has the new name: nothing was written.
    NameTaken,
}

/// The kinds of configuration the store keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConfigKind {
    /// A model and its provider settings.
    Model,
    /// A tool defined by configuration.
    Tool,
    /// An MCP server to connect to.
    McpServer,
    /// A skill.
    Skill,
    /// A prompt template.
    Template,
    /// An agent definition.
    Agent,
    /// An API key of the HTTP server (its hash, never the key).
    ApiKey,
    /// A workflow definition.
    Workflow,
    /// A workflow run's document (its state and every step's).
    WorkflowRun,
    /// A spending budget of an agent or an API key.
    Budget,
}

impl ConfigKind {
    /// Every kind.
    pub const ALL: [ConfigKind; 10] = [
        Self::Model,
        Self::Tool,
        Self::McpServer,
        Self::Skill,
        Self::Template,
        Self::Agent,
        Self::ApiKey,
        Self::Workflow,
        Self::WorkflowRun,
        Self::Budget,
    ];

    /// The kind's stable name (`model`, `tool`, `mcp_server`, `skill`, `template`, `agent`,
    /// `api_key`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Model => "model",
            Self::Tool => "tool",
            Self::McpServer => "mcp_server",
            Self::Skill => "skill",
            Self::Template => "template",
            Self::Agent => "agent",
            Self::ApiKey => "api_key",
            Self::Workflow => "workflow",
            Self::WorkflowRun => "workflow_run",
            Self::Budget => "budget",
        }
    }
}

impl fmt::Display for ConfigKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ConfigKind {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| {
                StoreError::InvalidInput(format!(
                    "unknown configuration kind {:?}; expected one of model, tool, mcp_server, \
                     skill, template, agent, api_key, workflow, workflow_run, budget",
                    truncate(s)
                ))
            })
    }
}

/// Checks an event kind: 1 to 64 characters of `a-z`, `_`, `.`.
pub(crate) fn validate_event_kind(kind: &str) -> Result<(), StoreError> {
    if (1..=64).contains(&kind.len())
        && kind
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'.')
    {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "invalid event kind {:?}: use 1 to 64 characters of a-z, '_' and '.'",
            truncate(kind)
        )))
    }
}

/// Checks a session status: 1 to 32 characters of `a-z`, `_`.
pub(crate) fn validate_status(status: &str) -> Result<(), StoreError> {
    if (1..=32).contains(&status.len())
        && status.bytes().all(|b| b.is_ascii_lowercase() || b == b'_')
    {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "invalid session status {:?}: use 1 to 32 characters of a-z and '_'",
            truncate(status)
        )))
    }
}

/// Checks a configuration or secret name: 1 to 64 characters of `A-Z a-z 0-9 _ . -`.
pub(crate) fn validate_name(what: &str, name: &str) -> Result<(), StoreError> {
    if (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
    {
        Ok(())
    } else {
        Err(StoreError::InvalidInput(format!(
            "invalid {what} name {:?}: use 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' and '-'",
            truncate(name)
        )))
    }
}

/// At most 64 characters of a rejected input, for error messages.
pub(crate) fn truncate(value: &str) -> String {
    value.chars().take(64).collect()
}

/// Now, in Unix milliseconds.
pub(crate) fn now_millis() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_kinds_and_statuses() {
        assert!(validate_event_kind("tool.result").is_ok());
        assert!(validate_event_kind("Tool").is_err());
        assert!(validate_event_kind("").is_err());
        assert!(validate_event_kind(&"a".repeat(65)).is_err());
        assert!(validate_status("interrupted").is_ok());
        assert!(validate_status("run-ning").is_err());
        assert!(validate_status(&"a".repeat(33)).is_err());
        assert!(validate_name("config", "gpt-4.1_mini").is_ok());
        assert!(validate_name("config", "../etc").is_err());
        assert!(validate_name("config", "a b").is_err());
    }

    #[test]
    fn config_kinds_round_trip() {
        for kind in ConfigKind::ALL {
            assert_eq!(kind.as_str().parse::<ConfigKind>().unwrap(), kind);
            assert_eq!(serde_json::to_value(kind).unwrap(), kind.as_str());
        }
        assert!(matches!(
            "mcp".parse::<ConfigKind>(),
            Err(StoreError::InvalidInput(_))
        ));
    }
}
