//! The session log on `agentry-store`: the engine's [`SessionLog`] trait implemented over the
//! SQLite / PostgreSQL event store. The events of a run a queue worker holds under a lease are
//! appended fenced by it ([`LeaseFences`]): a worker whose lease was taken over writes nothing
//! more. A run started in its session directly (not queued) gets its record in the run table
//! from its own appends: recorded `running` with its `run_started` event, moved with each event
//! that makes it wait, pause, go on or end ([`agentry_store::RunMark`]), in the same commit.

use agentry_core::session::{LogError, NewSessionInfo, SessionLog, SessionStatus};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use agentry_store::{
    Lease, MemoryKind, MemoryScope, NewEvent, NewMemory, NewSession, RunMark, RunState,
    SessionQuery, Store, StoreError, UsageEntry,
};
use agentry_types::{RunId, RunStopReason, SessionEvent, SessionId};
use futures::future::BoxFuture;

/// The leases this process's worker holds, by run: the fence for each run's appends.
#[derive(Debug, Clone, Default)]
pub struct LeaseFences(Arc<Mutex<HashMap<RunId, Lease>>>);

impl LeaseFences {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Lease>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// From now on the run's appends are fenced by `lease`.
    pub fn hold(&self, lease: Lease) {
        self.lock().insert(lease.run_id, lease);
    }

    /// The run's appends are no longer fenced (its worker let it go).
    pub fn release(&self, run: RunId) {
        self.lock().remove(&run);
    }

    fn of(&self, run: RunId) -> Option<Lease> {
        self.lock().get(&run).cloned()
    }
}

/// The engine's session log, stored in the database.
#[derive(Clone)]
pub struct StoreLog {
    store: Store,
    fences: LeaseFences,
}

impl StoreLog {
    /// The log over `store`.
    pub fn new(store: Store) -> Self {
        Self::fenced(store, LeaseFences::default())
    }

    /// The log over `store` whose appends for the runs in `fences` are fenced by their leases.
    pub fn fenced(store: Store, fences: LeaseFences) -> Self {
        Self { store, fences }
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

impl StoreLog {
    /// Appends `events` (with the session's new `status`, when given, in the same commit),
    /// fenced by the lease of their run when this process's worker holds one; returns the seq
    /// of the last event.
    async fn write(
        &self,
        session: SessionId,
        events: &[SessionEvent],
        status: Option<SessionStatus>,
    ) -> Result<u64, LogError> {
        self.write_creating(session, None, events, status).await
    }

    /// [`StoreLog::write`], creating the session first (in the same commit) when `create`
    /// says so.
    async fn write_creating(
        &self,
        session: SessionId,
        create: Option<NewSessionInfo>,
        events: &[SessionEvent],
        status: Option<SessionStatus>,
    ) -> Result<u64, LogError> {
        let mut records = records_of(events)?;
        let fence = events
            .first()
            .and_then(|event| self.fences.of(event.run_id()));
        // A run started in its session keeps its record in `runs` in the same commit (a
        // queued run's record is its worker's to keep).
        if fence.is_none()
            && let Some((index, mark)) = run_mark(events)
            && let Some(record) = records.get_mut(index)
        {
            record.run = Some(mark);
        }
        let status = status.map(SessionStatus::as_str);
        let written = match create {
            // A new session has no run leased in it yet.
            Some(info) => {
                self.store
                    .create_session_with_events(new_session(session, info), &records, status)
                    .await
            }
            None => {
                self.store
                    .write_events(session, &records, status, fence.as_ref())
                    .await
            }
        };
        let last = written.map_err(log_error(session))?;
        self.remember_compaction_memories(session, events).await;
        Ok(last)
    }
}

/// The session `info` says `session` starts as, as the store creates it.
pub(crate) fn new_session(session: SessionId, info: NewSessionInfo) -> NewSession {
    let mut new = NewSession::with_id(session);
    new.title = info.title;
    new.owner = info.owner;
    new
}

fn storage(error: StoreError) -> LogError {
    if error.is_storage_full() {
        LogError::Full(error.to_string())
    } else {
        LogError::Storage(error.to_string())
    }
}

/// The events as the store keeps them.
fn records_of(events: &[SessionEvent]) -> Result<Vec<NewEvent>, LogError> {
    events
        .iter()
        .map(|event| {
            let record = NewEvent::encode(event.kind(), event)
                .map_err(|error| LogError::Storage(format!("cannot encode an event: {error}")))?;
            Ok(match usage_entry(event) {
                Some(entry) => record.with_usage(entry),
                None => record,
            })
        })
        .collect()
}

/// What a write's events say of their run's record: the last event that moves the run (it
/// starts, waits for a person, pauses, goes on, or ends), by index.
fn run_mark(events: &[SessionEvent]) -> Option<(usize, RunMark)> {
    events.iter().enumerate().rev().find_map(|(index, event)| {
        let state = match event {
            SessionEvent::RunStarted {
                run_id, agent_id, ..
            } => {
                return Some((
                    index,
                    RunMark::Started {
                        run_id: *run_id,
                        agent_id: agent_id.clone(),
                    },
                ));
            }
            SessionEvent::RunFinished {
                stop_reason, error, ..
            } => match (stop_reason, error) {
                (RunStopReason::Cancelled, _) => RunState::Cancelled,
                (_, Some(_)) | (RunStopReason::Error, None) => RunState::Failed,
                _ => RunState::Succeeded,
            },
            SessionEvent::ApprovalRequested { .. } => RunState::Waiting,
            SessionEvent::RunPaused { .. } => RunState::Paused,
            SessionEvent::RunResumed { .. } => RunState::Running,
            _ => return None,
        };
        Some((
            index,
            RunMark::Now {
                run_id: event.run_id(),
                state,
            },
        ))
    })
}
/// The usage-ledger entry of a model call's answer: its tokens and cost, by run, agent and
/// model (the ledger row commits with the event).
fn usage_entry(event: &SessionEvent) -> Option<UsageEntry> {
    let SessionEvent::AssistantMessage {
        run_id,
        usage,
        model: Some(model),
        agent_id,
        cost_usd,
        ..
    } = event
    else {
        return None;
    };
    Some(UsageEntry {
        run_id: *run_id,
        agent_id: agent_id.clone(),
        model: model.clone(),
        usage: *usage,
        cost_usd: *cost_usd,
    })
}

/// A store error as the engine sees it: an unknown session is its own kind.
fn log_error(session: SessionId) -> impl Fn(StoreError) -> LogError {
    move |error| match error {
        StoreError::NotFound(_) => LogError::NotFound(session),
        StoreError::StaleLease(reason) => LogError::Held { session, reason },
        other => storage(other),
    }
}

impl SessionLog for StoreLog {
    fn create(&self, session: SessionId) -> BoxFuture<'_, Result<(), LogError>> {
        Box::pin(async move {
            // A session that exists already is fine: creating it is the check.
            match self
                .store
                .create_session(NewSession::with_id(session))
                .await
            {
                Ok(_) | Err(StoreError::Conflict(_)) => Ok(()),
                Err(error) => Err(storage(error)),
            }
        })
    }

    fn append(
        &self,
        session: SessionId,
        events: Vec<SessionEvent>,
    ) -> BoxFuture<'_, Result<u64, LogError>> {
        Box::pin(async move { self.write(session, &events, None).await })
    }

    fn append_with_status(
        &self,
        session: SessionId,
        events: Vec<SessionEvent>,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<u64, LogError>> {
        Box::pin(async move { self.write(session, &events, Some(status)).await })
    }

    fn create_with(
        &self,
        session: SessionId,
        info: NewSessionInfo,
        events: Vec<SessionEvent>,
        status: SessionStatus,
    ) -> BoxFuture<'_, Result<u64, LogError>> {
        Box::pin(async move {
            self.write_creating(session, Some(info), &events, Some(status))
                .await
        })
    }

    fn load(
        &self,
        session: SessionId,
    ) -> BoxFuture<'_, Result<Vec<(u64, SessionEvent)>, LogError>> {
        Box::pin(async move {
            // An unknown session is the store's NotFound: no separate existence check.
            let stored = self
                .store
                .events(session, 0, usize::MAX)
                .await
                .map_err(log_error(session))?;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use agentry_core::session::SessionLog;
    use agentry_store::{Enqueued, NewRun, Store};
    use agentry_types::{Message, RunId, SessionEvent};

    use super::{LeaseFences, StoreLog};

    #[tokio::test]
    async fn a_runs_appends_are_fenced_by_the_lease_its_worker_holds() {
        let home = tempfile::tempdir().unwrap();
        let store = Store::open_home(home.path()).await.unwrap();
        let fences = LeaseFences::default();
        let log = StoreLog::fenced(store.clone(), fences.clone());
        let session = agentry_types::SessionId::new();
        log.create(session).await.unwrap();
        let run = RunId::new();
        let queued = NewRun {
            id: run,
            session_id: session,
            agent_id: None,
            owner: None,
            priority: 0,
            idempotency_key: None,
            schedule_id: None,
            webhook_url: None,
            agent_limit: None,
            request_digest: "d".into(),
            request: serde_json::json!({}),
            new_session: None,
        };
        assert!(matches!(
            store.enqueue_run(&queued, 10).await.unwrap(),
            Enqueued::Created(_)
        ));
        let old = store
            .claim_runs("old", 1, Duration::from_millis(1))
            .await
            .unwrap()
            .remove(0)
            .lease()
            .unwrap();
        fences.hold(old);
        let message = |text: &str| {
            vec![SessionEvent::Message {
                run_id: run,
                message: Message::user(text),
            }]
        };
        log.append(session, message("while the lease holds"))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        // Another worker takes the run over: this one's next append is refused.
        store
            .claim_runs("new", 1, Duration::from_secs(30))
            .await
            .unwrap();
        let error = log
            .append(session, message("after the takeover"))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, agentry_core::session::LogError::Held { reason, .. }
                if reason.contains("no longer leased")),
            "{error}"
        );
        // The session is the new worker's now: a write of its process goes through (another
        // run's events are not fenced by the old lease).
        store.set_worker("new");
        let other = vec![SessionEvent::Message {
            run_id: RunId::new(),
            message: Message::user("another run"),
        }];
        log.append(session, other).await.unwrap();
        let texts: Vec<String> = log
            .load(session)
            .await
            .unwrap()
            .into_iter()
            .map(|(_, event)| serde_json::to_string(&event).unwrap())
            .collect();
        assert_eq!(texts.len(), 2, "{texts:?}");
        assert!(
            texts
                .iter()
                .all(|text| !text.contains("after the takeover"))
        );
    }
}
