//! Sessions as every front-end sees them: listed, searched, shown with their conversation and
//! what waits in them, their committed events, forked, titled, marked read, continued and
//! deleted. The log itself is the store's; live runs are the hub's.

use serde::Serialize;
use serde_json::Value;

use agentry_core::RunRequest;
use agentry_core::session::{BusyPolicy, replay};
use agentry_store::{NewSession, SessionQuery, SessionRecord};
use agentry_types::{Message, PendingApproval, RunId, SessionEvent, SessionId};

use crate::App;
use crate::auth::Principal;
use crate::error::AppError;
use crate::hub::{FeedStatus, StatusChange};
#[cfg(feature = "openapi")]
use crate::schema::PendingCall;

/// A session as listed.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionSummary {
    /// Its id (UUIDv7).
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: SessionId,
    /// Its title.
    pub title: Option<String>,
    /// `running` while a run is live, else the status the engine last set (`idle`,
    /// `interrupted`, `failed`, `waiting` — tool calls wait for approval — or `paused`).
    pub status: String,
    /// Creation time, Unix milliseconds.
    pub created_at: u64,
    /// Time of the last event, Unix milliseconds.
    pub last_activity: u64,
    /// The seq of its last event (0: none).
    pub last_seq: u64,
    /// The last seq marked read.
    pub read_seq: u64,
    /// Whether it has events past `read_seq`.
    pub unread: bool,
    /// The session and seq it was forked from.
    pub parent: Option<SessionParent>,
    /// When it may be pruned, Unix milliseconds.
    pub expires_at: Option<u64>,
}

impl SessionSummary {
    /// `record` as listed; `live`: a run of it is going on.
    pub fn new(record: &SessionRecord, live: bool) -> Self {
        Self {
            id: record.id,
            title: record.title.clone(),
            status: if live {
                "running".to_owned()
            } else {
                record.status.clone()
            },
            created_at: record.created_at,
            last_activity: record.last_activity,
            last_seq: record.last_seq,
            read_seq: record.read_seq,
            unread: record.unread(),
            parent: record.parent.map(|(id, seq)| SessionParent { id, seq }),
            expires_at: record.expires_at,
        }
    }
}

/// Where a fork branched off.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionParent {
    /// The parent session.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub id: SessionId,
    /// The last of its events the fork shares.
    pub seq: u64,
}

/// `GET /v1/sessions`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionList {
    /// The sessions, most recent activity first.
    pub sessions: Vec<SessionSummary>,
}

/// One search hit.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchHit {
    /// The session.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
    /// The matching event.
    pub seq: u64,
    /// Text around the match.
    pub snippet: String,
}

/// `GET /v1/sessions/search`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SearchResults {
    /// The hits.
    pub hits: Vec<SearchHit>,
}

/// A run that stopped without ending.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SuspendedRun {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    /// `waiting` (tool calls wait for approval) or `paused`.
    pub status: &'static str,
    /// The calls waiting for approval.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<PendingCall>))]
    pub pending: Vec<PendingApproval>,
}

/// `GET /v1/sessions/{id}`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionDetail {
    /// The session.
    pub session: SessionSummary,
    /// Its live run, if one is going.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub run_id: Option<RunId>,
    /// Its run that stopped without ending, if any.
    pub suspended_run: Option<SuspendedRun>,
    /// The conversation.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub messages: Vec<Message>,
    /// For a sub-agent's session, its link: `{"parent_session_id", "parent_run_id", "call_id",
    /// "depth", "tool", "agent_id"?}`.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub delegation: Option<Value>,
    /// The sub-agents' sessions its `delegate` and `talk_to` calls started, in order: `{"session_id",
    /// "run_id", "depth", "stop_reason", "agent_id"?, "error"?, "call_id", "tool"}`.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub children: Vec<Value>,
    /// For a group chat: `{"members": [{"agent_id", "session_id"}], "max_rounds"}` (its
    /// transcript: `GET /v1/groups/{id}`).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub group: Option<Value>,
    /// For a group member's session: `{"group_session_id", "agent_id"}`.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub group_member: Option<Value>,
    /// Why its run is not going on: the node running it died, and no live node has that
    /// node's workspace volume, so none may take it over (see `serve --stranded-after-secs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting_for_volume: Option<VolumeWait>,
}

/// A run waiting for a node on its workspace volume ([`SessionDetail::waiting_for_volume`]).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct VolumeWait {
    /// The volume (the id in its `.agentry-volume` file).
    pub volume: String,
    /// Since when, Unix milliseconds (when its node's lease ran out, or it stopped).
    pub since: u64,
    /// The same, for a person.
    pub message: String,
}

/// One committed event.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StoredEvent {
    /// Its position in the session's log.
    pub seq: u64,
    /// The event (`run_started`, `message`, `assistant_message`, `tool_call_intent`,
    /// `tool_call_result`, `approval_requested`, `approval_decided`, `run_paused`,
    /// `run_resumed`, `run_finished`).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub event: SessionEvent,
    /// When it was committed (Unix milliseconds): the run trace's clock.
    pub at: u64,
}

/// `GET /v1/sessions/{id}/events`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionEvents {
    /// The events after `after`, in order.
    pub events: Vec<StoredEvent>,
}

/// `POST /v1/sessions/{id}/fork`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ForkOutcome {
    /// The new session.
    pub session: SessionSummary,
}

/// `POST /v1/sessions/{id}/title`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TitleOutcome {
    /// The title set.
    pub title: String,
}

/// `POST /v1/sessions/{id}/continue`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ContinueOutcome {
    /// The session.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
    /// Where to follow the run.
    pub stream: String,
}

/// The stored sessions: listed, searched, read, forked, retitled, continued and deleted.
pub struct Sessions<'a> {
    app: &'a App,
}

impl App {
    /// The stored sessions: listed, searched, read, forked, retitled, continued and deleted.
    pub fn sessions(&self) -> Sessions<'_> {
        Sessions { app: self }
    }
}

impl Sessions<'_> {
    /// Sets when `session` expires (Unix ms): it is deleted after that.
    pub async fn expire(&self, session: SessionId, at_ms: u64) -> Result<(), AppError> {
        self.app
            .parts
            .store
            .set_expiry(session, Some(at_ms))
            .await?;
        Ok(())
    }

    /// The session `id` names: 400 for a bad id, 404 when unknown.
    pub async fn record(&self, id: &str) -> Result<SessionRecord, AppError> {
        let id = crate::ids::parse_session_id(id)?;
        self.app
            .parts
            .store
            .session(id)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no session {id}")))
    }

    /// Sessions, most recent activity first (`query.owner` limits them to one key's).
    pub async fn list(&self, query: &SessionQuery) -> Result<SessionList, AppError> {
        if query.limit == 0 || query.limit > 1000 {
            return Err(AppError::bad_request("`limit` must be between 1 and 1000"));
        }
        let records = self.app.parts.store.list_sessions(query).await?;
        let sessions = records
            .iter()
            .map(|record| SessionSummary::new(record, self.app.parts.hub.is_live(record.id)))
            .collect();
        Ok(SessionList { sessions })
    }

    /// Events holding `text`, across the sessions `owner` may see (all for `None`).
    pub async fn search(
        &self,
        text: &str,
        limit: usize,
        owner: Option<&str>,
    ) -> Result<SearchResults, AppError> {
        let hits = self
            .app
            .parts
            .store
            .search_owned(text, limit.clamp(1, 200), owner)
            .await?
            .into_iter()
            .map(|hit| SearchHit {
                session_id: hit.session_id,
                seq: hit.seq,
                snippet: hit.snippet,
            })
            .collect();
        Ok(SearchResults { hits })
    }

    /// A session's committed events after `after`, each with its commit time.
    pub async fn events(&self, id: SessionId, after: u64) -> Result<SessionEvents, AppError> {
        let stored = self.app.parts.store.events(id, after, usize::MAX).await?;
        let events = stored
            .into_iter()
            .map(|record| {
                serde_json::from_value(record.payload)
                    .map(|event| StoredEvent {
                        seq: record.seq,
                        event,
                        at: record.created_at,
                    })
                    .map_err(|error| {
                        AppError::internal(format!("event {} is unreadable: {error}", record.seq))
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(SessionEvents { events })
    }

    /// A session's committed events after `after`, by seq.
    pub async fn logged_events(
        &self,
        id: SessionId,
        after: u64,
    ) -> Result<Vec<(u64, SessionEvent)>, AppError> {
        Ok(self
            .events(id, after)
            .await?
            .events
            .into_iter()
            .map(|stored| (stored.seq, stored.event))
            .collect())
    }

    /// A session with its conversation, its live or suspended run, and its links to sub-agents
    /// and groups.
    pub async fn detail(&self, record: SessionRecord) -> Result<SessionDetail, AppError> {
        let events = self.logged_events(record.id, 0).await?;
        let stranded = if record.status == "running" && !self.app.parts.hub.is_live(record.id) {
            self.app.parts.store.stranded_on(record.id).await?
        } else {
            None
        };
        let mut detail = self.detail_of(record, &events)?;
        detail.waiting_for_volume = stranded.map(|(volume, since)| VolumeWait {
            message: format!(
                "its node stopped and no live node has its workspace volume {volume}: it waits \
                 for one (a node started with --stranded-after-secs resumes or interrupts it)"
            ),
            volume,
            since,
        });
        Ok(detail)
    }

    /// `Sessions::detail` from the session's events, already read.
    pub(crate) fn detail_of(
        &self,
        record: SessionRecord,
        events: &[(u64, SessionEvent)],
    ) -> Result<SessionDetail, AppError> {
        let replayed = replay(events);
        let live = self.app.parts.hub.is_live(record.id);
        // A run that stopped without ending: waiting for approvals, or paused.
        let suspended_run = replayed
            .in_flight
            .as_ref()
            .filter(|run| !live && (run.awaiting_approval() || run.paused))
            .map(|run| SuspendedRun {
                run_id: run.run_id,
                status: if run.awaiting_approval() {
                    "waiting"
                } else {
                    "paused"
                },
                pending: run.undecided(),
            });
        let field = |key: &str| record.metadata.get(key).cloned();
        Ok(SessionDetail {
            session: SessionSummary::new(&record, live),
            run_id: self.app.parts.hub.run_id(record.id),
            suspended_run,
            messages: replayed.messages,
            delegation: field(crate::delegation::METADATA_KEY),
            children: crate::delegation::children(events),
            group: field(crate::group::METADATA_KEY),
            group_member: field(crate::group::MEMBER_KEY),
            waiting_for_volume: None,
        })
    }

    /// Forks `record` after its event `at` (default: its last) for `owner` (default: the
    /// session's). A fork taken mid-run is marked interrupted, not a crashed run to recover.
    pub async fn fork(
        &self,
        record: &SessionRecord,
        at: Option<u64>,
        owner: Option<String>,
    ) -> Result<ForkOutcome, AppError> {
        let at = at.unwrap_or(record.last_seq);
        let mut new = NewSession::new();
        new.title = record.title.as_ref().map(|title| format!("{title} (fork)"));
        new.metadata = record.metadata.clone();
        new.owner = owner.or_else(|| record.owner.clone());
        let fork = self
            .app
            .parts
            .store
            .fork_session(record.id, at, new)
            .await?;
        let events = self.logged_events(fork.id, 0).await?;
        if replay(&events).in_flight.is_some() {
            self.app
                .parts
                .store
                .set_status(fork.id, "interrupted")
                .await?;
        }
        let fork = self.app.parts.store.session(fork.id).await?.unwrap_or(fork);
        Ok(ForkOutcome {
            session: SessionSummary::new(&fork, false),
        })
    }

    /// Sets a session's title, or has `model_id` (default: the first registered) write one
    /// from the conversation, a model `caller` may use; the status feed hears of it.
    pub async fn retitle(
        &self,
        caller: &Principal,
        id: SessionId,
        title: Option<String>,
        model_id: Option<String>,
    ) -> Result<TitleOutcome, AppError> {
        let title = match title {
            Some(title) => title,
            None => {
                crate::titles::generate_title(
                    &self.app.parts.store,
                    &self.app.parts.sessions.runtime(),
                    id,
                    model_id,
                    caller.grant(),
                )
                .await?
            }
        };
        self.app.parts.store.set_title(id, &title).await?;
        self.app.parts.hub.notify(StatusChange {
            session_id: id,
            status: FeedStatus::Updated,
            stop_reason: None,
            title: Some(title.clone()),
        });
        Ok(TitleOutcome { title })
    }

    /// Marks a session read up to `seq` (default: its last event).
    pub async fn mark_read(
        &self,
        record: &SessionRecord,
        seq: Option<u64>,
    ) -> Result<(), AppError> {
        self.app
            .parts
            .store
            .mark_read(record.id, seq.unwrap_or(record.last_seq))
            .await?;
        self.app.parts.hub.announce(record.id, FeedStatus::Updated);
        Ok(())
    }

    /// Continues a session: resumes a run a crash interrupted, or lets the model go on from
    /// the history, within `caller`'s grant. The run goes on in the hub.
    pub async fn go_on(
        &self,
        caller: &Principal,
        record: &SessionRecord,
    ) -> Result<ContinueOutcome, AppError> {
        self.go_on_followed(caller, record).await?;
        Ok(ContinueOutcome {
            session_id: record.id,
            stream: crate::approvals::stream_path(record.id),
        })
    }

    /// `Sessions::go_on`, answering a subscription that misses none of the run's
    /// events.
    pub async fn go_on_followed(
        &self,
        caller: &Principal,
        record: &SessionRecord,
    ) -> Result<crate::hub::Subscription, AppError> {
        if self.app.parts.hub.is_live(record.id) {
            return Err(AppError::conflict(format!(
                "session {} has a run in progress",
                record.id
            )));
        }
        let stream = match self.app.parts.sessions.resume(record.id).await? {
            Some(stream) => stream,
            None => {
                if record.last_seq == 0 {
                    return Err(AppError::bad_request(
                        "the session is empty: nothing to continue",
                    ));
                }
                // A new run on the default model, held to the caller's grant like any other
                // (a resumed run keeps the grant it started with).
                let request = RunRequest {
                    grant: self.app.run_grant(caller),
                    ..RunRequest::default()
                };
                self.app.check_run_quotas(caller, false).await?;
                self.app
                    .parts
                    .sessions
                    .send(record.id, request, BusyPolicy::Reject)
                    .await?
            }
        };
        Ok(self.app.parts.hub.adopt(record.id, stream))
    }

    /// Deletes a session that has no live run (its forks keep the events they share).
    pub async fn delete(&self, id: SessionId) -> Result<(), AppError> {
        if self.app.parts.hub.is_live(id) {
            return Err(AppError::conflict(format!(
                "session {id} has a run in progress; abort it first"
            )));
        }
        self.app.parts.store.delete_session(id).await?;
        self.app.forget_file_journal(id).await;
        Ok(())
    }
}
