//! The session log on `agentry-store`: the engine's [`SessionLog`] trait implemented over the
//! SQLite / PostgreSQL event store.

use agentry_core::session::{LogError, SessionLog, SessionStatus};
use agentry_store::{
    MemoryKind, MemoryScope, NewEvent, NewMemory, NewSession, SessionQuery, Store, StoreError,
};
use agentry_types::{SessionEvent, SessionId};
use futures::future::BoxFuture;

/// The engine's session log, stored in the database.
#[derive(Clone)]
pub struct StoreLog {
    store: Store,
}

impl StoreLog {
    /// The log over `store`.
    pub fn new(store: Store) -> Self {
        Self { store }
    }

    /// Stores the memories a compaction found as its agent's (and user's) long-term memories,
    /// once the event is committed. A memory that cannot be stored is logged and skipped: the
    /// run and its log do not depend on it.
    async fn remember_compaction_memories(&self, session: SessionId, events: &[SessionEvent]) {
        for event in events {
            let SessionEvent::ContextCompacted {
                memories,
                agent_id: Some(agent),
                user,
                ..
            } = event
            else {
                continue;
            };
            for memory in memories {
                let kind = match memory.kind.as_str() {
                    "preference" => MemoryKind::Preference,
                    "decision" => MemoryKind::Decision,
                    _ => MemoryKind::Fact,
                };
                let new = NewMemory {
                    scope: MemoryScope {
                        agent: agent.clone(),
                        user: user.clone(),
                    },
                    kind,
                    text: memory.text.clone(),
                    source_session: Some(session),
                };
                if let Err(error) = self.store.remember(new).await {
                    tracing::warn!(%session, agent, "a memory found while compacting was not stored: {error}");
                }
            }
        }
    }
}

fn storage(error: StoreError) -> LogError {
    LogError::Storage(error.to_string())
}

impl SessionLog for StoreLog {
    fn create(&self, session: SessionId) -> BoxFuture<'_, Result<(), LogError>> {
        Box::pin(async move {
            if self
                .store
                .session(session)
                .await
                .map_err(storage)?
                .is_none()
            {
                self.store
                    .create_session(NewSession::with_id(session))
                    .await
                    .map_err(storage)?;
            }
            Ok(())
        })
    }

    fn append(
        &self,
        session: SessionId,
        events: Vec<SessionEvent>,
    ) -> BoxFuture<'_, Result<u64, LogError>> {
        Box::pin(async move {
            let mut records = Vec::with_capacity(events.len());
            for event in &events {
                let payload = serde_json::to_value(event).map_err(|error| {
                    LogError::Storage(format!("cannot encode an event: {error}"))
                })?;
                records.push(NewEvent::new(event.kind(), payload));
            }
            let stored = self
                .store
                .append(session, None, &records)
                .await
                .map_err(|error| match error {
                    StoreError::NotFound(_) => LogError::NotFound(session),
                    other => storage(other),
                })?;
            self.remember_compaction_memories(session, &events).await;
            Ok(stored.last().map_or(0, |event| event.seq))
        })
    }

    fn load(
        &self,
        session: SessionId,
    ) -> BoxFuture<'_, Result<Vec<(u64, SessionEvent)>, LogError>> {
        Box::pin(async move {
            if self
                .store
                .session(session)
                .await
                .map_err(storage)?
                .is_none()
            {
                return Err(LogError::NotFound(session));
            }
            let stored = self
                .store
                .events(session, 0, usize::MAX)
                .await
                .map_err(storage)?;
            stored
                .into_iter()
                .map(|event| {
                    serde_json::from_value(event.payload)
                        .map(|decoded| (event.seq, decoded))
                        .map_err(|error| LogError::Corrupt {
                            session,
                            seq: event.seq,
                            reason: error.to_string(),
                        })
                })
                .collect()
        })
    }

    fn set_status(
        &self,
        session: SessionId,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<(), LogError>> {
        Box::pin(async move {
            self.store
                .set_status(session, status.as_str())
                .await
                .map_err(storage)
        })
    }

    fn sessions_with_status(
        &self,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<Vec<SessionId>, LogError>> {
        Box::pin(async move {
            let query = SessionQuery {
                status: Some(status.as_str().to_owned()),
                owner: None,
                limit: usize::MAX,
                offset: 0,
            };
            let sessions = self.store.list_sessions(&query).await.map_err(storage)?;
            Ok(sessions.into_iter().map(|record| record.id).collect())
        })
    }
}
