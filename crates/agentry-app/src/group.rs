//! Group chat: several saved agents in one session, woken by `@mentions`.
//!
//! A group session's metadata holds `{"group": {"members": [{"agent_id", "session_id"}],
//! "max_rounds"}}`. Each member has a linked session of its own (metadata `{"group_member":
//! {"group_session_id", "agent_id"}}`) where its turns run through the [`SessionManager`] like
//! any session run — durable, with its tool calls, live on its own stream — so its history *is*
//! its point of view: its own replies are its assistant messages, and each turn's user message
//! is what it had not seen yet, each message labelled with its speaker
//! ([`agentry_core::group::render_pending`]). Its system prompt is its own, followed by a note
//! naming the other members.
//!
//! The group session's log holds the transcript as [`SessionEvent::Group`] events, one
//! exchange (a user message and the rounds it leads to) per run id: the user's message, each
//! round with the members it wakes, each member's reply (with its session, run and mentions),
//! and the end (`completed`, `max_rounds`, `cancelled`, or `interrupted` when the server
//! stopped mid-exchange; the next message closes such an exchange first). Which members a round
//! wakes is [`agentry_core::group::GroupRouter`]'s decision; the members of a round run in
//! parallel.
//!
//! Progress streams live as [`GroupLive`] (over SSE in the HTTP API): `group.message`, `group.round`,
//! `group.finished` (committed, with the seq as id), and live `group.speaking` (a member
//! starts), `group.delta` / `group.thinking` (its text) and `group.member` (its other events).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::Stream;
use futures::future::join_all;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;

use agentry_core::RunRequest;
use agentry_core::group::{GroupRouter, Member, TranscriptEntry};
use agentry_core::session::{BusyPolicy, SessionStatus};
use agentry_core::{Input, group};
use agentry_store::NewSession;
use agentry_types::{ErrorInfo, GroupEvent, Message, RunEvent, RunId, SessionEvent, SessionId};

use crate::App;
use crate::agents::{AgentConfig, stored_agent};
use crate::error::AppError;
use crate::hub::StatusChange;

/// The key of a group session's members in its metadata.
pub const METADATA_KEY: &str = "group";
/// The key of a member session's link to its group in its metadata.
pub const MEMBER_KEY: &str = "group_member";
/// The most members a group may have.
pub const MAX_MEMBERS: usize = 16;
/// The highest `max_rounds` a group may set.
pub const MAX_ROUNDS_LIMIT: u32 = 50;
/// The longest user message accepted (characters).
pub const MAX_TEXT_CHARS: usize = 200_000;

/// Events a slow subscriber may fall behind by before it catches up from the log.
const CHANNEL_CAPACITY: usize = 1024;

/// A member of a group session, as stored in its metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupMemberInfo {
    /// The saved agent.
    pub agent_id: String,
    /// The member's own session, where its turns run.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
}

/// A group session's settings, as stored in its metadata under `group`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct GroupInfo {
    /// The members, in order.
    pub members: Vec<GroupMemberInfo>,
    /// Rounds one user message may lead to.
    pub max_rounds: u32,
}

/// Something a group's live stream carries.
#[derive(Debug, Clone)]
#[expect(
    clippy::large_enum_variant,
    reason = "always sent in an `Arc`: one allocation per event whatever its variant"
)]
pub enum GroupLive {
    /// A committed step of the group session.
    Committed {
        /// Its seq in the group session.
        seq: u64,
        /// The event.
        event: SessionEvent,
    },
    /// A member begins its turn.
    Speaking {
        /// The round.
        round: u32,
        /// The member.
        agent_id: String,
        /// Its display name.
        name: String,
        /// Its session.
        session_id: SessionId,
    },
    /// One of a member's run events.
    Member {
        /// The round.
        round: u32,
        /// The member.
        agent_id: String,
        /// The event.
        event: Arc<RunEvent>,
    },
}

/// The exchange going on in a group session.
struct LiveGroup {
    run_id: RunId,
    sender: broadcast::Sender<Arc<GroupLive>>,
    cancel: CancellationToken,
}

/// The exchanges going on, by group session: one per group session at a time. Owned by the
/// [`App`] (`App::groups`), so two apps in one process never share them.
#[derive(Clone, Default)]
pub struct LiveGroups(Arc<Mutex<HashMap<SessionId, LiveGroup>>>);

impl LiveGroups {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, LiveGroup>> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Subscribes to the exchange going on in `session`, if any: its id and its live events.
    pub fn subscribe(
        &self,
        session: SessionId,
    ) -> Option<(RunId, broadcast::Receiver<Arc<GroupLive>>)> {
        self.lock()
            .get(&session)
            .map(|group| (group.run_id, group.sender.subscribe()))
    }

    /// Cancels the exchange going on in `session`; false if none is.
    pub fn cancel(&self, session: SessionId) -> bool {
        match self.lock().get(&session) {
            Some(group) => {
                group.cancel.cancel();
                true
            }
            None => false,
        }
    }
}

/// The group settings of a session, if it is a group session.
pub fn info_of(metadata: &Value) -> Option<GroupInfo> {
    serde_json::from_value(metadata.get(METADATA_KEY)?.clone()).ok()
}

/// Checks a member list: 2 to [`MAX_MEMBERS`] distinct saved agents. Returns their configs.
pub async fn check_members(state: &App, ids: &[String]) -> Result<Vec<AgentConfig>, AppError> {
    if ids.len() < 2 || ids.len() > MAX_MEMBERS {
        return Err(AppError::bad_request(format!(
            "a group has 2 to {MAX_MEMBERS} members, not {}",
            ids.len()
        )));
    }
    let mut agents = Vec::with_capacity(ids.len());
    for (index, id) in ids.iter().enumerate() {
        if ids[..index].contains(id) {
            return Err(AppError::bad_request(format!(
                "the agent {id:?} is named twice"
            )));
        }
        let agent = stored_agent(&state.parts.store, id)
            .await?
            .ok_or_else(|| AppError::bad_request(format!("no agent {id:?}")))?;
        agents.push(agent);
    }
    Ok(agents)
}

/// Creates a group session over `ids` (checked first) and its members' sessions.
pub async fn create(
    state: &App,
    caller: &crate::auth::Principal,
    ids: &[String],
    max_rounds: Option<u32>,
    title: Option<String>,
) -> Result<(SessionId, GroupInfo), AppError> {
    for id in ids {
        caller.check_agent(id)?;
    }
    let max_rounds = max_rounds.unwrap_or(group::DEFAULT_MAX_ROUNDS);
    if max_rounds == 0 || max_rounds > MAX_ROUNDS_LIMIT {
        return Err(AppError::bad_request(format!(
            "`max_rounds` is 1 to {MAX_ROUNDS_LIMIT}"
        )));
    }
    let agents = check_members(state, ids).await?;
    let runtime = state.parts.sessions.runtime();
    for agent in &agents {
        agent.resolve(&runtime, state.parts.tools.skill_roots.as_deref())?;
    }
    // A group is one new session against the caller's per-minute quota (its members' own
    // sessions come with it).
    state.take_session(caller).await?;
    let group_id = SessionId::new();
    let mut members = Vec::with_capacity(agents.len());
    for agent in &agents {
        let mut new = NewSession::new();
        new.title = Some(format!("{} (group member)", display(agent)));
        new.metadata = json!({ MEMBER_KEY: {"group_session_id": group_id, "agent_id": agent.id} });
        new.owner = caller.owner();
        let record = state.parts.store.create_session(new).await?;
        members.push(GroupMemberInfo {
            agent_id: agent.id.clone(),
            session_id: record.id,
        });
    }
    let info = GroupInfo {
        members,
        max_rounds,
    };
    let mut new = NewSession::with_id(group_id);
    new.title = Some(title.unwrap_or_else(|| {
        let names: Vec<&str> = agents.iter().map(display).collect();
        let joined = names.join(", ");
        format!("Group: {}", joined.chars().take(70).collect::<String>())
    }));
    new.metadata = json!({ METADATA_KEY: info });
    new.owner = caller.owner();
    state.parts.store.create_session(new).await?;
    Ok((group_id, info))
}

fn display(agent: &AgentConfig) -> &str {
    agent.nickname.as_deref().unwrap_or(&agent.id)
}

/// The group session `session` and its settings: 404 if there is no such session, 400 if it is
/// not a group.
pub async fn load(state: &App, session: SessionId) -> Result<GroupInfo, AppError> {
    let record = state
        .parts
        .store
        .session(session)
        .await?
        .ok_or_else(|| AppError::not_found(format!("no session {session}")))?;
    info_of(&record.metadata)
        .ok_or_else(|| AppError::bad_request(format!("session {session} is not a group chat")))
}

/// The group events of a session's log, with their seqs.
pub async fn group_events(
    state: &App,
    session: SessionId,
    after: u64,
) -> Result<Vec<(u64, RunId, GroupEvent)>, AppError> {
    Ok(state
        .parts
        .store
        .events(session, after, usize::MAX)
        .await?
        .into_iter()
        .filter_map(
            |record| match serde_json::from_value::<SessionEvent>(record.payload) {
                Ok(SessionEvent::Group { run_id, event }) => Some((record.seq, run_id, event)),
                _ => None,
            },
        )
        .collect())
}

/// A started exchange: its id and a subscription made before its first event.
pub struct Started {
    /// The exchange.
    pub run_id: RunId,
    /// Its live events, from the first.
    pub events: broadcast::Receiver<Arc<GroupLive>>,
    /// The seq of the user's message in the group session.
    pub first_seq: u64,
}

/// A message posted to a group chat, as a front-end read it from its request.
#[derive(Debug, Clone)]
pub struct GroupPost {
    /// The group's members: a new group's, or the existing group's (which must match).
    pub agent_ids: Vec<String>,
    /// Rounds one message may lead to, for a new group.
    pub max_rounds: Option<u32>,
    /// A new group session, or this existing one (an ephemeral choice is a new one).
    pub session: crate::run_spec::SessionChoice,
    /// The message.
    pub text: String,
    /// The end user it is for.
    pub user: Option<String>,
}

/// Posts a message to a group chat (the `PostToGroup` command): a new group session of
/// `message.agent_ids`, or the group session named, whose members must be the agents named and
/// which `caller` may use; the group session and the started exchange.
pub(crate) async fn post_message(
    app: &App,
    caller: &crate::auth::Principal,
    message: GroupPost,
) -> Result<(SessionId, Started), AppError> {
    let GroupPost {
        agent_ids: ids,
        max_rounds,
        session,
        text,
        user,
    } = message;
    let session = match session {
        crate::run_spec::SessionChoice::Existing(session) => {
            app.check_session_access(caller, session).await?;
            let info = load(app, session).await?;
            let mut members: Vec<&str> = info.members.iter().map(|m| m.agent_id.as_str()).collect();
            let mut named: Vec<&str> = ids.iter().map(String::as_str).collect();
            members.sort_unstable();
            named.sort_unstable();
            if members != named {
                return Err(AppError::bad_request(format!(
                    "session {session} is a group of {members:?}, not {named:?}"
                )));
            }
            if max_rounds.is_some_and(|rounds| rounds != info.max_rounds) {
                return Err(AppError::bad_request(
                    "`max_rounds` is set when the group is created",
                ));
            }
            session
        }
        _ => {
            if text.trim().is_empty() {
                return Err(AppError::bad_request("the message is empty"));
            }
            let title: String = text.chars().take(80).collect();
            create(app, caller, &ids, max_rounds, Some(title)).await?.0
        }
    };
    let started = post(app, caller, session, text, user).await?;
    Ok((session, started))
}

/// One member, ready to run.
#[derive(Clone)]
struct Runner {
    member: Member,
    session: SessionId,
    agent: AgentConfig,
}

/// Posts the user's `text` to the group `session` and starts the exchange in the background.
/// 409 while another exchange of the group is going on.
pub async fn post(
    state: &App,
    caller: &crate::auth::Principal,
    session: SessionId,
    text: String,
    user: Option<String>,
) -> Result<Started, AppError> {
    let info = load(state, session).await?;
    if text.trim().is_empty() {
        return Err(AppError::bad_request("the message is empty"));
    }
    if text.chars().count() > MAX_TEXT_CHARS {
        return Err(AppError::bad_request(format!(
            "a message has at most {MAX_TEXT_CHARS} characters"
        )));
    }
    // The transcript names the user as given; its memories are its end user's in the caller's
    // namespace.
    let end_user = user
        .as_deref()
        .map(|user| caller.end_user(user))
        .transpose()?;
    state.check_run_quotas(caller, false).await?;
    let ids: Vec<String> = info.members.iter().map(|m| m.agent_id.clone()).collect();
    // Each member runs within the caller's grant (checked again on its resolved run).
    for id in &ids {
        caller.check_agent(id)?;
    }
    let agents = check_members(state, &ids).await?;
    let runtime = state.parts.sessions.runtime();
    let grant = state.run_grant(caller);
    for agent in &agents {
        let run = agent.resolve(&runtime, state.parts.tools.skill_roots.as_deref())?;
        // A member's model, fallbacks and tools are held to the caller's grant before the
        // exchange starts (each member's run is checked again when it starts).
        if let Some(grant) = &grant {
            let mut check = run.request(None).with_history(vec![Message::user("")]);
            check.grant = Some(grant.clone().running_as(check.tools.clone()));
            runtime.prepare(check)?;
        }
    }
    let runners: Vec<Runner> = agents
        .into_iter()
        .zip(&info.members)
        .map(|(agent, info)| Runner {
            member: Member::new(agent.id.clone(), agent.nickname.clone()),
            session: info.session_id,
            agent,
        })
        .collect();
    // One exchange at a time.
    let (sender, events) = broadcast::channel(CHANNEL_CAPACITY);
    let cancel = CancellationToken::new();
    let run_id = RunId::new();
    {
        let mut live = state.parts.groups.lock();
        if live.contains_key(&session) {
            return Err(AppError::conflict(format!(
                "group session {session} is busy with another message"
            )));
        }
        live.insert(
            session,
            LiveGroup {
                run_id,
                sender: sender.clone(),
                cancel: cancel.clone(),
            },
        );
    }
    let prepared = prepare_exchange(state, session, run_id, &runners, &text, user.as_deref()).await;
    let (transcript, turns, exchange, first_seq) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => {
            state.parts.groups.lock().remove(&session);
            return Err(error);
        }
    };
    let exchange_task = Exchange {
        state: state.clone(),
        session,
        run_id,
        exchange,
        runners,
        max_rounds: info.max_rounds,
        user: end_user,
        grant,
        sender,
        cancel,
        transcript: Arc::new(Mutex::new((transcript, turns))),
    };
    tokio::spawn(exchange_task.run(text));
    Ok(Started {
        run_id,
        events,
        first_seq,
    })
}

/// Closes an exchange a stopped server left open, rebuilds the transcript, and commits the
/// user's message as the start of exchange `run_id`. Returns the transcript, each member's last
/// turn (`(exchange, round)`), the exchange's number and the message's seq.
async fn prepare_exchange(
    state: &App,
    session: SessionId,
    run_id: RunId,
    runners: &[Runner],
    text: &str,
    user: Option<&str>,
) -> Result<Prepared, AppError> {
    let events = group_events(state, session, 0).await?;
    let mut transcript = Vec::new();
    let mut turns = HashMap::new();
    let mut exchange = 0;
    let mut open: Option<(RunId, u32)> = None;
    let mut current = None;
    for (_, run_id, event) in &events {
        if current != Some(*run_id) {
            current = Some(*run_id);
            exchange += 1;
        }
        match event {
            GroupEvent::Message {
                round,
                agent_id,
                name,
                text,
                error,
                ..
            } => {
                open = Some((*run_id, *round));
                if error.is_none() && !text.trim().is_empty() {
                    transcript.push(TranscriptEntry {
                        exchange,
                        round: *round,
                        speaker: agent_id.clone(),
                        name: name.clone(),
                        text: text.clone(),
                    });
                }
            }
            GroupEvent::Round { round, members } => {
                open = Some((*run_id, *round));
                for member in members {
                    turns.insert(member.clone(), (exchange, *round));
                }
            }
            GroupEvent::Finished { .. } => open = None,
        }
    }
    let log = state.parts.sessions.log();
    if let Some((run_id, rounds)) = open {
        log.append(
            session,
            vec![SessionEvent::Group {
                run_id,
                event: GroupEvent::Finished {
                    rounds,
                    stop_reason: "interrupted".into(),
                },
            }],
        )
        .await
        .map_err(|error| AppError::internal(error.to_string()))?;
    }
    exchange += 1;
    let members: Vec<Member> = runners.iter().map(|r| r.member.clone()).collect();
    let name = user.unwrap_or("user").to_owned();
    let message = GroupEvent::Message {
        round: 0,
        agent_id: None,
        name: name.clone(),
        text: text.to_owned(),
        mentions: group::mentions(text, &members).members(&members),
        session_id: None,
        member_run_id: None,
        stop_reason: None,
        error: None,
    };
    let seq = log
        .append(
            session,
            vec![SessionEvent::Group {
                run_id,
                event: message,
            }],
        )
        .await
        .map_err(|error| AppError::internal(error.to_string()))?;
    transcript.push(TranscriptEntry {
        exchange,
        round: 0,
        speaker: None,
        name,
        text: text.to_owned(),
    });
    Ok((transcript, turns, exchange, seq))
}

/// Each member's last turn: `(exchange, round)`.
type Turns = HashMap<String, (u32, u32)>;

/// What [`prepare_exchange`] returns.
type Prepared = (Vec<TranscriptEntry>, Turns, u32, u64);

/// One exchange, run in the background.
struct Exchange {
    state: App,
    session: SessionId,
    run_id: RunId,
    exchange: u32,
    runners: Vec<Runner>,
    max_rounds: u32,
    /// The end user its members' memories are about (in the poster's namespace).
    user: Option<String>,
    /// What the poster may use: each member's run is held to it.
    grant: Option<agentry_core::access::Grant>,
    sender: broadcast::Sender<Arc<GroupLive>>,
    cancel: CancellationToken,
    /// The transcript so far, and each member's last turn.
    transcript: Arc<Mutex<(Vec<TranscriptEntry>, Turns)>>,
}

/// A member's reply: its text, or why there is none.
struct Reply {
    text: String,
    error: Option<ErrorInfo>,
}

impl Exchange {
    fn send(&self, event: GroupLive) {
        // Nobody listening is fine: the exchange goes on.
        let _ = self.sender.send(Arc::new(event));
    }

    /// Commits a step, then reports it; false when the log refused it (the exchange stops
    /// rather than go on unrecorded).
    async fn commit(&self, event: GroupEvent) -> bool {
        let event = SessionEvent::Group {
            run_id: self.run_id,
            event,
        };
        match self
            .state
            .parts
            .sessions
            .log()
            .append(self.session, vec![event.clone()])
            .await
        {
            Ok(seq) => {
                self.send(GroupLive::Committed { seq, event });
                true
            }
            Err(error) => {
                tracing::error!(session = %self.session, "could not record a group chat step: {error}");
                false
            }
        }
    }

    async fn set_status(&self, status: SessionStatus, stop_reason: Option<&str>) {
        if let Err(error) = self
            .state
            .parts
            .sessions
            .log()
            .set_status(self.session, status)
            .await
        {
            tracing::warn!(session = %self.session, "could not set a group's status: {error}");
        }
        self.state.parts.hub.notify(StatusChange {
            session_id: self.session,
            status: status.into(),
            stop_reason: stop_reason.map(str::to_owned),
            title: None,
        });
    }

    async fn run(self, text: String) {
        self.set_status(SessionStatus::Running, None).await;
        let members: Vec<Member> = self.runners.iter().map(|r| r.member.clone()).collect();
        let mut router = GroupRouter::new(members, self.max_rounds);
        let (mut round, mut woken) = router.start(&text);
        let stop_reason = loop {
            if self.cancel.is_cancelled() {
                break "cancelled";
            }
            let recorded = self
                .commit(GroupEvent::Round {
                    round,
                    members: woken.clone(),
                })
                .await;
            if !recorded {
                break "error";
            }
            let turns = woken
                .iter()
                .filter_map(|id| self.runners.iter().find(|r| r.member.id == *id))
                .map(|runner| self.turn(runner, round));
            let replies: Vec<(String, String)> =
                join_all(turns).await.into_iter().flatten().collect();
            if self.cancel.is_cancelled() {
                break "cancelled";
            }
            match router.after(&replies) {
                Ok((next, members)) => {
                    round = next;
                    woken = members;
                }
                Err(end) => break end.as_str(),
            }
        };
        // If even this fails, subscribers see the channel close when the exchange is dropped.
        self.commit(GroupEvent::Finished {
            rounds: router.rounds(),
            stop_reason: stop_reason.into(),
        })
        .await;
        self.state.parts.groups.lock().remove(&self.session);
        self.set_status(SessionStatus::Idle, Some(stop_reason))
            .await;
    }

    /// Runs one member's turn; returns `(its id, its reply)` when it answered.
    async fn turn(&self, runner: &Runner, round: u32) -> Option<(String, String)> {
        let id = runner.member.id.clone();
        let name = runner.member.display_name().to_owned();
        let input = {
            let mut guard = self
                .transcript
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (transcript, turns) = &mut *guard;
            let previous = turns.insert(id.clone(), (self.exchange, round));
            let pending = group::pending_for(&id, transcript, previous, self.exchange, round);
            group::render_pending(&pending)
        };
        self.send(GroupLive::Speaking {
            round,
            agent_id: id.clone(),
            name: name.clone(),
            session_id: runner.session,
        });
        let (member_run_id, stop_reason, reply) = self.run_member(runner, round, input).await;
        let members: Vec<Member> = self.runners.iter().map(|r| r.member.clone()).collect();
        let mentions = group::mentions(&reply.text, &members).members(&members);
        // A run stopped before it answered (cancelled, a guard) says nothing to the others.
        let answered = reply.error.is_none() && !reply.text.trim().is_empty();
        let recorded = self
            .commit(GroupEvent::Message {
                round,
                agent_id: Some(id.clone()),
                name: name.clone(),
                text: reply.text.clone(),
                mentions,
                session_id: Some(runner.session),
                member_run_id,
                stop_reason,
                error: reply.error,
            })
            .await;
        if !answered || !recorded {
            return None;
        }
        self.transcript
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .push(TranscriptEntry {
                exchange: self.exchange,
                round,
                speaker: Some(id.clone()),
                name,
                text: reply.text.clone(),
            });
        Some((id, reply.text))
    }

    /// Runs the member's run in its own session and follows it to its end.
    async fn run_member(
        &self,
        runner: &Runner,
        round: u32,
        input: String,
    ) -> (Option<RunId>, Option<String>, Reply) {
        let failed = |message: String| {
            (
                None,
                Some("error".to_owned()),
                Reply {
                    text: String::new(),
                    error: Some(internal_error(message)),
                },
            )
        };
        let request = match self.request(runner, input).await {
            Ok(request) => request,
            Err(error) => return failed(error.message),
        };
        let stream = match self
            .state
            .parts
            .sessions
            .send(runner.session, request, BusyPolicy::Reject)
            .await
        {
            Ok(stream) => stream,
            Err(error) => return failed(error.to_string()),
        };
        let mut subscription = self.state.parts.hub.adopt(runner.session, stream);
        let mut run_id = None;
        loop {
            let received = tokio::select! {
                received = subscription.events.recv() => received,
                () = self.cancel.cancelled() => {
                    self.state.parts.hub.cancel(runner.session);
                    // Keep reading: the run ends promptly, with its cancelled end.
                    subscription.events.recv().await
                }
            };
            let event = match received {
                Ok(event) => event,
                Err(RecvError::Lagged(_)) => continue,
                Err(RecvError::Closed) => {
                    return (
                        run_id,
                        Some("error".into()),
                        Reply {
                            text: String::new(),
                            error: Some(internal_error(
                                "the member's run ended without a final event".into(),
                            )),
                        },
                    );
                }
            };
            if let RunEvent::Committed {
                event: SessionEvent::RunStarted { run_id: id, .. },
                ..
            } = event.as_ref()
            {
                run_id = Some(*id);
            }
            let end = match event.as_ref() {
                RunEvent::RunFinished {
                    stop_reason, text, ..
                } => Some((
                    stop_reason.as_str().to_owned(),
                    Reply {
                        text: text.clone(),
                        error: None,
                    },
                )),
                RunEvent::RunFailed {
                    stop_reason, error, ..
                } => Some((
                    stop_reason.as_str().to_owned(),
                    Reply {
                        text: String::new(),
                        error: Some(error.clone()),
                    },
                )),
                RunEvent::RunSuspended { status, .. } => Some((
                    status.as_str().to_owned(),
                    Reply {
                        text: String::new(),
                        error: Some(internal_error(format!(
                            "the member's run is {} (its session: {})",
                            status.as_str(),
                            runner.session
                        ))),
                    },
                )),
                _ => None,
            };
            self.send(GroupLive::Member {
                round,
                agent_id: runner.member.id.clone(),
                event: Arc::clone(&event),
            });
            if let Some((stop_reason, reply)) = end {
                return (run_id, Some(stop_reason), reply);
            }
        }
    }

    /// The member's run request: its saved agent, the group note after its system prompt, and
    /// what it has not seen as the new user message.
    async fn request(&self, runner: &Runner, input: String) -> Result<RunRequest, AppError> {
        let run = runner.agent.resolve(
            &self.state.parts.sessions.runtime(),
            self.state.parts.tools.skill_roots.as_deref(),
        )?;
        let members: Vec<Member> = self.runners.iter().map(|r| r.member.clone()).collect();
        let note = group::group_prompt(&runner.member, &members);
        let mut request = run.request(self.user.clone());
        request.grant = self
            .grant
            .clone()
            .map(|grant| grant.running_as(request.tools.clone()));
        request.system = Some(match request.system.take() {
            Some(own) => format!("{own}\n\n{note}"),
            None => note,
        });
        request.input = Some(Input::Text { text: input });
        crate::memory::remember(&self.state.parts.store, &mut request).await?;
        Ok(request)
    }
}

fn internal_error(message: String) -> ErrorInfo {
    ErrorInfo {
        code: agentry_types::ErrorCode::Internal,
        message,
        retryable: false,
        status: None,
    }
}

/// Whether a live event ends the exchange.
pub fn is_end(live: &GroupLive) -> bool {
    matches!(
        live,
        GroupLive::Committed {
            event: SessionEvent::Group {
                event: GroupEvent::Finished { .. },
                ..
            },
            ..
        }
    )
}

/// Waits for the exchange's end; returns its committed group events (from the log, so none is
/// missed).
pub async fn wait(
    state: &App,
    session: SessionId,
    started: Started,
) -> Result<Vec<(u64, GroupEvent)>, AppError> {
    let mut events = started.events;
    loop {
        match events.recv().await {
            Ok(live) if is_end(&live) => break,
            Ok(_) | Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => break,
        }
    }
    Ok(
        group_events(state, session, started.first_seq.saturating_sub(1))
            .await?
            .into_iter()
            .filter(|(_, run_id, _)| *run_id == started.run_id)
            .map(|(seq, _, event)| (seq, event))
            .collect(),
    )
}

/// The JSON outcome of a finished exchange.
pub fn outcome(session: SessionId, run_id: RunId, events: &[(u64, GroupEvent)]) -> Value {
    let mut stop_reason = "interrupted".to_owned();
    let mut rounds = 0;
    let mut messages = Vec::new();
    let mut text = String::new();
    for (seq, event) in events {
        match event {
            GroupEvent::Finished {
                rounds: total,
                stop_reason: reason,
            } => {
                rounds = *total;
                stop_reason.clone_from(reason);
            }
            GroupEvent::Message {
                agent_id,
                text: reply,
                error,
                ..
            } => {
                if agent_id.is_some() && error.is_none() && !reply.is_empty() {
                    text.clone_from(reply);
                }
                let event = SessionEvent::Group {
                    run_id,
                    event: event.clone(),
                };
                messages.push(json!({"seq": seq, "event": event}));
            }
            GroupEvent::Round { .. } => {}
        }
    }
    json!({
        "success": stop_reason != "interrupted",
        "group": true,
        "session_id": session,
        "run_id": run_id,
        "stop_reason": stop_reason,
        "rounds": rounds,
        "text": text,
        "messages": messages,
    })
}

/// A group chat as a client sees it: members, settings, whether an exchange is going on, and
/// its transcript.
#[derive(Debug, Clone, Serialize)]
pub struct GroupView {
    /// The group session.
    pub session_id: SessionId,
    /// Its members.
    pub members: Vec<MemberView>,
    /// Rounds one message may lead to.
    pub max_rounds: u32,
    /// Whether an exchange is going on.
    pub live: bool,
    /// Every group event of its log.
    pub transcript: Vec<TranscriptItem>,
}

/// A member of a group as a client sees it.
#[derive(Debug, Clone, Serialize)]
pub struct MemberView {
    /// The saved agent.
    pub agent_id: String,
    /// Its nickname, if it has one.
    pub nickname: Option<String>,
    /// The member's own session.
    pub session_id: SessionId,
}

/// One committed group event with its seq.
#[derive(Debug, Clone, Serialize)]
pub struct TranscriptItem {
    /// Its seq in the group session's log.
    pub seq: u64,
    /// The event.
    pub event: SessionEvent,
}

/// The group `session` as a client sees it.
pub async fn view(state: &App, session: SessionId) -> Result<GroupView, AppError> {
    let info = load(state, session).await?;
    let mut members = Vec::with_capacity(info.members.len());
    for member in &info.members {
        let agent = stored_agent(&state.parts.store, &member.agent_id).await?;
        members.push(MemberView {
            agent_id: member.agent_id.clone(),
            nickname: agent.and_then(|agent| agent.nickname),
            session_id: member.session_id,
        });
    }
    // Whether an exchange is going on is read before the transcript: an exchange commits its
    // `finished` before it stops being live, so "not live" always comes with a transcript that
    // holds its end (read the other way round, one could end in between).
    let live = state.parts.groups.subscribe(session).is_some();
    let transcript = group_events(state, session, 0)
        .await?
        .into_iter()
        .map(|(seq, run_id, event)| TranscriptItem {
            seq,
            event: SessionEvent::Group { run_id, event },
        })
        .collect();
    Ok(GroupView {
        session_id: session,
        members,
        max_rounds: info.max_rounds,
        live,
        transcript,
    })
}

/// A group's events for a client following it: its committed group events after `after` from
/// the log, then, when an exchange is live (`live`: its id and a subscription made before
/// reading the log), its live events until it ends. A subscriber that fell behind catches up on
/// committed events from the log; committed events come once each, by seq. A failure to read
/// the log ends the stream with the error.
pub fn follow(
    state: App,
    session: SessionId,
    after: u64,
    live: Option<(RunId, broadcast::Receiver<Arc<GroupLive>>)>,
) -> impl Stream<Item = Result<Arc<GroupLive>, AppError>> + Send {
    async_stream::stream! {
        let mut last_seq = after;
        let target = live.as_ref().map(|(run_id, _)| *run_id);
        let mut ended = false;
        match group_events(&state, session, last_seq).await {
            Ok(backlog) => {
                for (seq, run_id, event) in backlog {
                    last_seq = seq;
                    let live = GroupLive::Committed { seq, event: SessionEvent::Group { run_id, event } };
                    ended |= Some(run_id) == target && is_end(&live);
                    yield Ok(Arc::new(live));
                }
            }
            Err(error) => {
                yield Err(error);
                ended = true;
            }
        }
        if let (Some((_, mut events)), false) = (live, ended) {
            loop {
                match events.recv().await {
                    Ok(live) => {
                        if let GroupLive::Committed { seq, .. } = live.as_ref() {
                            if *seq <= last_seq {
                                continue;
                            }
                            last_seq = *seq;
                        }
                        let end = is_end(&live);
                        yield Ok(live);
                        if end {
                            break;
                        }
                    }
                    Err(RecvError::Lagged(_)) => {
                        let Ok(missed) = group_events(&state, session, last_seq).await else {
                            break;
                        };
                        let mut ended = false;
                        for (seq, run_id, event) in missed {
                            last_seq = seq;
                            let live = GroupLive::Committed { seq, event: SessionEvent::Group { run_id, event } };
                            ended |= Some(run_id) == target && is_end(&live);
                            yield Ok(Arc::new(live));
                        }
                        if ended {
                            break;
                        }
                    }
                    Err(RecvError::Closed) => break,
                }
            }
        }
    }
}
