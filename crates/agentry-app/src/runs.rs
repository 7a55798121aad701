//! Runs as the application starts them. [`prepare`] turns what a front-end asks for (a
//! [`RunSpec`]: the HTTP API's `POST /v1/infer`, an MCP agent call) into a checked run
//! request and where it runs, creating the session when asked; [`start_in_session`] hands the
//! run to the hub. The front-ends only parse their own wire format into a `RunSpec`.

use agentry_core::session::{BusyPolicy, NewSessionInfo};
use agentry_core::{RunLimits, RunRequest};
use agentry_types::{Message, SessionId};

use crate::App;
use crate::auth::Principal;
use crate::error::AppError;
use crate::follow::{FollowFrom, Followed};
use crate::hub::Subscription;

pub use crate::run_spec::{RunSpec, SessionChoice};

/// Where a prepared run goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A durable run in this session.
    Session(SessionId),
    /// An ephemeral run: nothing is stored.
    Ephemeral,
}

/// Checks `input` for `caller` (the agent, model, tools, template and files it names, the
/// caller's grant on the resolved run, approvals only in sessions) and turns it into a run
/// request; for [`SessionChoice::New`] the request says to create the session with the run's
/// first write.
/// Nothing is created when a check fails.
pub async fn prepare(
    app: &App,
    caller: &Principal,
    input: RunSpec,
) -> Result<(Target, RunRequest), AppError> {
    prepare_as(app, caller, input, Admission::New).await
}

/// Whether a run is admitted now, or was admitted when it was queued and is taken up by a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// Admitted now: the caller's quotas count it.
    New,
    /// Taken up from the queue: checked again under its owner's key as it is now, but its
    /// quotas counted it when it was queued.
    TakenUp,
}

/// [`prepare`], for a run admitted now or taken up from the queue.
pub(crate) async fn prepare_as(
    app: &App,
    caller: &Principal,
    input: RunSpec,
    admission: Admission,
) -> Result<(Target, RunRequest), AppError> {
    // The end user, in the caller's namespace: a `user` key reaches only its own end users'
    // memories.
    let user = input
        .user
        .as_deref()
        .map(|user| caller.end_user(user))
        .transpose()?;
    // An existing session's conversation comes from its log: what a request may bring along is
    // its client's results for the tool calls the last run ended on. A new session may start
    // with earlier turns.
    if matches!(input.session, SessionChoice::Existing(_))
        && !input
            .history
            .iter()
            .all(|message| matches!(message, Message::Tool(_)))
    {
        return Err(AppError::bad_request(
            "a session's conversation comes from its log: send only the new message",
        ));
    }
    // The agent the run runs as (`talk_to` refuses to target it): its settings, under what the
    // input itself says.
    // The agent whose one workspace the run works in, when its sessions share one.
    let mut shared_workspace = None;
    // What the caller may use, checked on the resolved run (`Runtime::prepare`): the agent, the
    // model after every override, its fallbacks and stand-ins, and each tool offered.
    let mut grant = app.run_grant(caller);
    let mut request = match input.agent_id.as_deref() {
        Some(id) => {
            crate::config::check_name("agent", id)?;
            caller.check_agent(id)?;
            let agent = crate::agents::stored_agent(&app.parts.store, id)
                .await?
                .ok_or_else(|| AppError::bad_request(format!("no agent {id:?}")))?;
            if agent.workspace == crate::agents::WorkspaceScope::Agent {
                shared_workspace = Some(agent.id.clone());
            }
            let run = agent.resolve(
                &app.parts.sessions.runtime(),
                app.parts.tools.skill_roots.as_deref(),
            )?;
            let mut request = run.request(user.clone());
            // An allowed agent brings its own tools: a request may only narrow them.
            grant = grant.map(|grant| grant.running_as(request.tools.clone()));
            if let Some(model) = input.model_id {
                request.model = Some(model);
                request.fallback_models.clear();
            }
            request.tools = input.tool_ids.or(request.tools);
            request.system = input.system.or(request.system);
            if let Some(params) = input.params {
                request.params = params;
            }
            if let (Some(rounds), Some(limits)) = (input.max_tool_rounds, request.limits.as_mut()) {
                limits.max_tool_rounds = rounds;
            }
            request.approvals = match (request.approvals.take(), input.approvals) {
                (Some(agent), Some(own)) => Some(agent.merged(&own)),
                (agent, own) => own.or(agent),
            };
            request.compaction = input.compaction.or(request.compaction);
            request
        }
        None => RunRequest {
            model: input.model_id,
            system: input.system,
            tools: input.tool_ids,
            params: input.params.unwrap_or_default(),
            limits: input.max_tool_rounds.map(|rounds| RunLimits {
                max_tool_rounds: rounds,
                ..RunLimits::default()
            }),
            approvals: input.approvals,
            compaction: input.compaction,
            user,
            ..RunRequest::default()
        },
    };
    request.input = input.input;
    request.history = input.history;
    request.client_tools = input.client_tools;
    request.grant = grant;
    // A saved agent remembers: its memories (and the user's) join the system prompt.
    crate::memory::remember(&app.parts.store, &mut request).await?;
    // Check the model, tools, template and attached files before anything is created (a new
    // session's id is chosen now, so its workspace is known).
    let new_id = SessionId::new();
    let planned = match input.session {
        SessionChoice::Ephemeral => None,
        SessionChoice::New => Some(new_id),
        SessionChoice::Existing(id) => Some(id),
    };
    let shared_folder = shared_workspace
        .as_deref()
        .and_then(|agent| app.parts.sessions.shared_workspace(agent));
    let mut check = request.clone().with_history(vec![Message::user("")]);
    check.workspace = shared_folder
        .clone()
        .or_else(|| planned.and_then(|id| app.parts.sessions.workspace(id)));
    // The policy the run will have: its own, plus the operator's defaults by risk class.
    let may_ask = app
        .parts
        .sessions
        .runtime()
        .prepare(check)?
        .approvals
        .may_ask();
    // The caller's quotas (runs going, tokens of the day, new sessions a minute), last: a run
    // refused for another reason counts against none of them.
    if admission == Admission::New {
        app.check_run_quotas(caller, input.session == SessionChoice::New)
            .await?;
    }
    let target = match input.session {
        SessionChoice::Ephemeral => {
            if may_ask {
                return Err(AppError::bad_request(
                    "a run whose tool calls may wait for approval needs a session \
                     (`session_id`); tools that run on the host, and the risk classes the \
                     operator named (`agentry serve --approve`), always ask unless the run's \
                     `approvals` say otherwise",
                ));
            }
            if no_input(&request) {
                return Err(AppError::bad_request(
                    "the request has no input (`text` or `messages`)",
                ));
            }
            // A stateless run of an agent with one workspace works in it.
            request.workspace = shared_folder;
            // Its model calls are charged to the caller's key (`App::stream_stateless`).
            request.owner = caller.owner();
            Target::Ephemeral
        }
        SessionChoice::New => {
            if no_input(&request) {
                return Err(AppError::bad_request(
                    "the request has no input (`text` or `messages`)",
                ));
            }
            // Created with the run's first write (one commit for both); a queued run's
            // session is created with its record (`NewRun::new_session`).
            request.new_session = Some(NewSessionInfo {
                title: crate::titles::first_line(&request),
                owner: caller.owner(),
            });
            Target::Session(new_id)
        }
        SessionChoice::Existing(id) => {
            let Some(record) = app
                .parts
                .store
                .session(id)
                .await?
                .filter(|record| caller.may_see(record.owner.as_deref()))
            else {
                return Err(AppError::not_found(format!("no session {id}")));
            };
            if crate::group::info_of(&record.metadata).is_some() {
                return Err(AppError::bad_request(format!(
                    "session {id} is a group chat: name its members in `agent_ids`, or use \
                     `POST /v1/groups/{id}/messages`"
                )));
            }
            // Without input the model goes on from the conversation: an empty session (a
            // fork taken before its first event) has none to go on from.
            if no_input(&request) && record.last_seq == 0 {
                return Err(AppError::bad_request(format!(
                    "the request has no input (`text` or `messages`), and session {id} has no \
                     conversation to go on from"
                )));
            }
            Target::Session(id)
        }
    };
    if let (Target::Session(session), Some(agent)) = (target, &shared_workspace) {
        share_workspace(&app.parts.sessions, session, agent).await?;
    }
    Ok((target, request))
}

/// Whether `request` brings nothing for the model to answer (no new input, no earlier turns).
fn no_input(request: &RunRequest) -> bool {
    request.input.is_none() && request.history.is_empty()
}

/// Makes `session`'s workspace `agent`'s shared one (a session that already has a workspace of
/// its own keeps it).
pub(crate) async fn share_workspace(
    sessions: &agentry_core::session::SessionManager,
    session: SessionId,
    agent: &str,
) -> Result<(), AppError> {
    let sessions = sessions.clone();
    let agent = agent.to_owned();
    tokio::task::spawn_blocking(move || sessions.share_workspace(session, &agent))
        .await
        .map_err(|_| AppError::internal("linking a workspace crashed"))?
        .map_err(|error| {
            AppError::internal(format!("cannot link the agent's workspace: {error}"))
        })?;
    Ok(())
}

/// Starts `request` in `session` (as `policy` says when a run is in progress) and hands it to
/// the hub; the subscription misses none of its events.
///
/// A run that creates its session returns once its start is committed: the session exists
/// for whoever is told its id (a response header, say) and reads it at once. The hub owns the
/// run before that wait, so a caller that goes away meanwhile leaves the run going.
pub async fn start_in_session(
    app: &App,
    session: SessionId,
    request: RunRequest,
    policy: BusyPolicy,
) -> Result<Subscription, AppError> {
    let creates_session = request.new_session.is_some();
    let mut stream = app.parts.sessions.send(session, request, policy).await?;
    let started = creates_session.then(|| stream.first_event());
    let subscription = app.parts.hub.adopt(session, stream);
    if let Some(started) = started {
        // Told, or the hub dropped the stream: either way the start is settled.
        let _ = started.await;
    }
    Ok(subscription)
}

impl App {
    /// Starts `request` in `session` and follows it from its start: [`start_in_session`], then
    /// [`App::follow`].
    pub async fn start_followed(
        &self,
        session: SessionId,
        request: agentry_core::RunRequest,
        policy: agentry_core::session::BusyPolicy,
    ) -> Result<Followed, AppError> {
        let subscription = start_in_session(self, session, request, policy).await?;
        let first = None;
        self.follow(
            session,
            FollowFrom::Live {
                subscription,
                first,
            },
        )
        .await
    }
}
