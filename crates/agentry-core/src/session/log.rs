//! The log a session is written through, as the engine needs it.
//!
//! The engine depends on this trait, not on a database: the binary wires in the SQLite /
//! PostgreSQL store, tests and ephemeral runs use [`MemoryLog`].

use std::collections::HashMap;
use std::sync::Mutex;

use agentry_types::{SessionEvent, SessionId};
use futures::future::BoxFuture;

/// Why the log could not do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// No session has this id.
    #[error("no session {0}")]
    NotFound(SessionId),
    /// Another process is running the session (a node of the cluster): this one may not
    /// write to it.
    #[error("session {session} is being run by another process ({reason})")]
    Held {
        /// The session.
        session: SessionId,
        /// What the store said.
        reason: String,
    },
    /// The storage failed; the message says how.
    #[error("session storage failed: {0}")]
    Storage(String),
    /// The storage has no room (a full disk): nothing of the write was kept, and it may
    /// succeed once there is room.
    #[error("session storage is full: {0}")]
    Full(String),
    /// A stored event could not be read back.
    #[error("session {session} has an unreadable event at seq {seq}: {reason}")]
    Corrupt {
        /// The session.
        session: SessionId,
        /// The event's seq.
        seq: u64,
        /// Why it could not be read.
        reason: String,
    },
}

/// A session's run status, as kept beside its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SessionStatus {
    /// No run in progress.
    Idle,
    /// A run is in progress (or was, when the process died: recovery looks for these).
    Running,
    /// The last run was stopped before it finished (cancelled, deadline, interrupted).
    Interrupted,
    /// The last run failed.
    Failed,
    /// A run waits for a person to approve tool calls (it continues once they are decided).
    Waiting,
    /// A run was paused between rounds (it continues when resumed).
    Paused,
}

impl SessionStatus {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::Running => "running",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
            Self::Waiting => "waiting",
            Self::Paused => "paused",
        }
    }
}

/// What a session created with its run's first write starts with.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewSessionInfo {
    /// A title for people.
    pub title: Option<String>,
    /// Who it belongs to (an API key's id); `None`: the operator.
    pub owner: Option<String>,
}

/// An append-only event log of sessions.
pub trait SessionLog: Send + Sync + 'static {
    /// Creates an empty session.
    fn create(&self, session: SessionId) -> BoxFuture<'_, Result<(), LogError>>;

    /// Appends events atomically; returns the seq of the last one.
    fn append(
        &self,
        session: SessionId,
        events: Vec<SessionEvent>,
    ) -> BoxFuture<'_, Result<u64, LogError>>;

    /// Every event of the session, in order, with its seq.
    fn load(&self, session: SessionId)
    -> BoxFuture<'_, Result<Vec<(u64, SessionEvent)>, LogError>>;

    /// Records the session's run status.
    fn set_status(
        &self,
        session: SessionId,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<(), LogError>>;

    /// Appends events and records the session's new status; returns the seq of the last event.
    /// A durable log does both in one transaction (one commit, and nobody sees the events
    /// without the status); the default does one after the other.
    fn append_with_status(
        &self,
        session: SessionId,
        events: Vec<SessionEvent>,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<u64, LogError>> {
        Box::pin(async move {
            let last = self.append(session, events).await?;
            self.set_status(session, status).await?;
            Ok(last)
        })
    }

    /// Creates `session` with `info` and appends `events` with the session's new `status`;
    /// returns the seq of the last event. A durable log does all of it in one transaction (and
    /// refuses, writing nothing, if the session exists); the default creates, then appends.
    fn create_with(
        &self,
        session: SessionId,
        info: NewSessionInfo,
        events: Vec<SessionEvent>,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<u64, LogError>> {
        let _ = info;
        Box::pin(async move {
            self.create(session).await?;
            self.append_with_status(session, events, status).await
        })
    }

    /// Sessions whose status is `status`.
    fn sessions_with_status(
        &self,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<Vec<SessionId>, LogError>>;
}

/// A log kept in memory: for tests and runs that need no durability.
#[derive(Debug, Default)]
pub struct MemoryLog {
    sessions: Mutex<HashMap<SessionId, (SessionStatus, Vec<SessionEvent>)>>,
    /// How many appends the log took (each is one write, one transaction in a durable log).
    appends: std::sync::atomic::AtomicU64,
}

impl MemoryLog {
    /// How many appends (with or without a status) the log has taken: what a durable log
    /// would have committed for them.
    pub fn appends(&self) -> u64 {
        self.appends.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut HashMap<SessionId, (SessionStatus, Vec<SessionEvent>)>) -> T,
    ) -> T {
        let mut sessions = self
            .sessions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut sessions)
    }
}

impl SessionLog for MemoryLog {
    fn create(&self, session: SessionId) -> BoxFuture<'_, Result<(), LogError>> {
        self.with(|sessions| {
            sessions
                .entry(session)
                .or_insert((SessionStatus::Idle, Vec::new()));
        });
        Box::pin(async { Ok(()) })
    }

    fn append(
        &self,
        session: SessionId,
        events: Vec<SessionEvent>,
    ) -> BoxFuture<'_, Result<u64, LogError>> {
        self.appends
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = self.with(|sessions| match sessions.get_mut(&session) {
            Some((_, log)) => {
                log.extend(events);
                Ok(log.len() as u64)
            }
            None => Err(LogError::NotFound(session)),
        });
        Box::pin(async move { result })
    }

    fn load(
        &self,
        session: SessionId,
    ) -> BoxFuture<'_, Result<Vec<(u64, SessionEvent)>, LogError>> {
        let result = self.with(|sessions| match sessions.get(&session) {
            Some((_, log)) => Ok(log
                .iter()
                .cloned()
                .enumerate()
                .map(|(i, e)| (i as u64 + 1, e))
                .collect()),
            None => Err(LogError::NotFound(session)),
        });
        Box::pin(async move { result })
    }

    fn set_status(
        &self,
        session: SessionId,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<(), LogError>> {
        let result = self.with(|sessions| match sessions.get_mut(&session) {
            Some((slot, _)) => {
                *slot = status;
                Ok(())
            }
            None => Err(LogError::NotFound(session)),
        });
        Box::pin(async move { result })
    }

    fn sessions_with_status(
        &self,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<Vec<SessionId>, LogError>> {
        let ids = self.with(|sessions| {
            let mut ids: Vec<SessionId> = sessions
                .iter()
                .filter(|(_, (s, _))| *s == status)
                .map(|(id, _)| *id)
                .collect();
            ids.sort();
            ids
        });
        Box::pin(async move { Ok(ids) })
    }
}
