//! The command protocol: every command a front-end sends the application goes through
//! [`App::submit`] as a [`Command`], typed by what it answers — a run's controls ([`Op`], answered
//! by an [`OpOutcome`]), stopping a session ([`StopSession`]), queueing a run ([`Enqueue`]) and
//! posting to a group chat ([`PostToGroup`]). A front-end parses its own input into one and
//! renders the answer, so a decision, a pause or an abort does the same thing whichever front-end
//! sent it: the same checks, the same run continued, the same status on the feed. The HTTP
//! routes, A2A, the seed's API and `agentry chat --agent` submit through it; a chat on a profile,
//! which runs without an `App`, still decides its inline approvals through the session manager.
//! Each submission runs in a `command` span named after it.

use std::future::Future;

use serde_json::{Value, json};
use tracing::Instrument;

use agentry_core::approval::ApprovalDecision;
use agentry_mcp::ElicitationAnswer;
use agentry_types::{PendingApproval, RunId, SessionId};

use crate::App;
use crate::auth::Principal;
use crate::elicitation::ElicitationError;
use crate::error::AppError;
use crate::group::{GroupPost, Started};
use crate::hub::FeedStatus;
use crate::queue::RunView;
use crate::run_spec::RunSpec;

/// A command to the application: what it carries, what it answers, and how it is carried out.
/// Front-ends submit commands with [`App::submit`]; they do not call what carries them out.
pub trait Command: Send {
    /// Its name, in the span its submission runs in.
    const NAME: &'static str;
    /// What it answers.
    type Output;
    /// Carries it out.
    fn apply(self, app: &App) -> impl Future<Output = Result<Self::Output, AppError>> + Send;
}

/// Stop what runs in a session now — its run, or its group chat's exchange — as a client's
/// "abort this session" asks (`/v1/infer/abort`, the seed's, a terminal's Ctrl-C). Answers
/// whether something was running. The run ends interrupted, and what is queued behind it runs.
#[derive(Debug, Clone, Copy)]
pub struct StopSession {
    /// The session.
    pub session_id: SessionId,
}

/// Queue a run for the worker, for `caller`: checked as a run now is, stored as its spec, and
/// checked again when a worker takes it up ([`crate::queue`]). Answers the run and whether this
/// submission created it (`false`: an earlier one with the same idempotency key).
#[derive(Debug, Clone)]
pub struct Enqueue {
    /// Who queues it.
    pub caller: Principal,
    /// What to run (without a session it gets a new one).
    pub spec: RunSpec,
    /// A client's key: the same key and spec answer the same run.
    pub idempotency_key: Option<String>,
    /// Higher runs first (-100 to 100).
    pub priority: i64,
}

/// Post a message to a group chat, for `caller`: a new group session, or the group session
/// named. Answers the group session and the exchange started.
#[derive(Debug, Clone)]
pub struct PostToGroup {
    /// Who posts.
    pub caller: Principal,
    /// The message and where it goes.
    pub post: GroupPost,
}

impl Command for Op {
    const NAME: &'static str = "run_control";
    type Output = OpOutcome;
    async fn apply(self, app: &App) -> Result<OpOutcome, AppError> {
        Box::pin(app.control(self)).await
    }
}

impl Command for StopSession {
    const NAME: &'static str = "stop_session";
    type Output = bool;
    async fn apply(self, app: &App) -> Result<bool, AppError> {
        Ok(app.parts.hub.cancel(self.session_id) || app.parts.groups.cancel(self.session_id))
    }
}

impl Command for Enqueue {
    const NAME: &'static str = "enqueue";
    type Output = (RunView, bool);
    async fn apply(self, app: &App) -> Result<(RunView, bool), AppError> {
        Box::pin(app.submit_queued(
            &self.caller,
            self.spec,
            self.idempotency_key,
            self.priority,
            None,
        ))
        .await
    }
}

impl Command for PostToGroup {
    const NAME: &'static str = "post_to_group";
    type Output = (SessionId, Started);
    async fn apply(self, app: &App) -> Result<(SessionId, Started), AppError> {
        Box::pin(crate::group::post_message(app, &self.caller, self.post)).await
    }
}

/// A command about a run.
#[derive(Debug, Clone)]
pub enum Op {
    /// Decide waiting tool calls (approve, reject, edit); the run goes on once none waits.
    Decide {
        /// The run.
        run_id: RunId,
        /// One decision per call.
        decisions: Vec<ApprovalDecision>,
    },
    /// Answer an MCP server's request for input made during one of the run's tool calls.
    AnswerElicitation {
        /// The run.
        run_id: RunId,
        /// The request.
        elicitation_id: String,
        /// The answer.
        answer: ElicitationAnswer,
    },
    /// Pause the run between rounds.
    Pause {
        /// The run.
        run_id: RunId,
    },
    /// Resume a paused run where it stopped.
    Resume {
        /// The run.
        run_id: RunId,
    },
    /// Stop the run (its queued successors still run).
    Interrupt {
        /// The run.
        run_id: RunId,
    },
    /// Stop the run and drop the runs queued behind it.
    Abort {
        /// The run.
        run_id: RunId,
    },
}

impl Op {
    /// The run the command is about.
    pub fn run_id(&self) -> RunId {
        match self {
            Self::Decide { run_id, .. }
            | Self::AnswerElicitation { run_id, .. }
            | Self::Pause { run_id }
            | Self::Resume { run_id }
            | Self::Interrupt { run_id }
            | Self::Abort { run_id } => *run_id,
        }
    }
}

/// What a command did.
#[derive(Debug, Clone)]
pub struct OpOutcome {
    /// The run.
    pub run_id: RunId,
    /// Its session.
    pub session_id: SessionId,
    /// The run's status now (`Running` once decided, `Waiting` while calls or questions wait;
    /// a pause is asked for, so the run is still `Running` until its round ends).
    pub status: FeedStatus,
    /// Calls still waiting for a decision.
    pub pending: Vec<PendingApproval>,
    /// MCP questions still waiting.
    pub elicitations: Vec<Value>,
    /// For an abort: how many queued runs were dropped.
    pub dropped_queued: Option<usize>,
}

impl OpOutcome {
    /// What a command did to `run_id`, with nothing waiting.
    fn new(run_id: RunId, session_id: SessionId, status: FeedStatus) -> Self {
        Self {
            run_id,
            session_id,
            status,
            pending: Vec::new(),
            elicitations: Vec::new(),
            dropped_queued: None,
        }
    }
}

impl App {
    /// Carries out `command`, in a `command` span named after it. Every front-end's commands
    /// come through here.
    pub async fn submit<C: Command>(&self, command: C) -> Result<C::Output, AppError> {
        let span = tracing::info_span!("command", name = C::NAME);
        command.apply(self).instrument(span).await
    }

    /// Carries out a run's control.
    async fn control(&self, op: Op) -> Result<OpOutcome, AppError> {
        let run_id = op.run_id();
        match op {
            Op::Decide { decisions, .. } => {
                let session = self.locate(run_id).await?;
                let decided = self
                    .parts
                    .sessions
                    .decide(session, run_id, decisions)
                    .await?;
                let status = match decided.stream {
                    Some(stream) => {
                        let subscription = self.parts.hub.adopt(session, stream);
                        self.track_continued(run_id, session, subscription);
                        self.parts.hub.announce(session, FeedStatus::Running);
                        FeedStatus::Running
                    }
                    None => FeedStatus::Waiting,
                };
                Ok(OpOutcome {
                    pending: decided.pending,
                    elicitations: self.parts.elicitations.for_run(run_id),
                    ..OpOutcome::new(run_id, session, status)
                })
            }
            Op::AnswerElicitation {
                elicitation_id,
                answer,
                ..
            } => {
                let session = self.locate(run_id).await?;
                self.parts
                    .elicitations
                    .answer(run_id, &elicitation_id, answer)
                    .await
                    .map_err(|error| match error {
                        ElicitationError::NotFound(_) => AppError::not_found(error.to_string()),
                        ElicitationError::Invalid(_) => AppError::bad_request(error.to_string()),
                    })?;
                let pending = self.pending_of(session, run_id).await?;
                let elicitations = self.parts.elicitations.for_run(run_id);
                let status = if elicitations.is_empty() && pending.is_empty() {
                    FeedStatus::Running
                } else {
                    FeedStatus::Waiting
                };
                Ok(OpOutcome {
                    pending,
                    elicitations,
                    ..OpOutcome::new(run_id, session, status)
                })
            }
            Op::Pause { .. } => {
                let Some(session) = self.parts.sessions.session_of_live_run(run_id) else {
                    // Known but not live: say why it cannot pause.
                    let session = self.locate(run_id).await?;
                    let waiting = !self.pending_of(session, run_id).await?.is_empty();
                    return Err(AppError::conflict(if waiting {
                        format!("run {run_id} is waiting for approvals, not running")
                    } else {
                        format!("run {run_id} is not running (paused or ended)")
                    })
                    .with_details(json!({"run_id": run_id, "session_id": session})));
                };
                self.parts.sessions.pause(run_id)?;
                Ok(OpOutcome::new(run_id, session, FeedStatus::Running))
            }
            Op::Resume { .. } => {
                let session = self.locate(run_id).await?;
                if self.parts.hub.is_live(session) {
                    return Err(AppError::conflict(format!(
                        "session {session} has a run in progress"
                    )));
                }
                let stream = self.parts.sessions.resume_paused(session, run_id).await?;
                let subscription = self.parts.hub.adopt(session, stream);
                self.track_continued(run_id, session, subscription);
                self.parts.hub.announce(session, FeedStatus::Running);
                Ok(OpOutcome::new(run_id, session, FeedStatus::Running))
            }
            Op::Interrupt { .. } => {
                let session = self.locate(run_id).await?;
                let live = self.parts.hub.is_live(session);
                self.parts.sessions.interrupt(session, run_id).await?;
                if !live {
                    self.cancelled_while_stopped(run_id).await?;
                    self.parts.hub.announce(session, FeedStatus::Interrupted);
                }
                Ok(OpOutcome::new(run_id, session, FeedStatus::Interrupted))
            }
            Op::Abort { .. } => {
                let session = self.locate(run_id).await?;
                let live = self.parts.hub.is_live(session);
                let dropped = self.parts.sessions.abort(session, run_id).await?;
                if !live {
                    self.cancelled_while_stopped(run_id).await?;
                    self.parts.hub.announce(session, FeedStatus::Interrupted);
                }
                Ok(OpOutcome {
                    dropped_queued: Some(dropped),
                    ..OpOutcome::new(run_id, session, FeedStatus::Interrupted)
                })
            }
        }
    }

    /// The calls of `run_id` (in `session`) that wait for a decision.
    pub async fn pending_of(
        &self,
        session: SessionId,
        run_id: RunId,
    ) -> Result<Vec<PendingApproval>, AppError> {
        Ok(self
            .parts
            .sessions
            .pending_approvals(session)
            .await?
            .filter(|(id, _)| *id == run_id)
            .map(|(_, pending)| pending)
            .unwrap_or_default())
    }

    /// The session of `run_id`: a run live here, else the one its record names (every run in a
    /// session has a record, written with its first events), found by the run's id through the
    /// runs table's key — never by searching logs, which any caller probing ids could make
    /// expensive.
    pub async fn locate(&self, run_id: RunId) -> Result<SessionId, AppError> {
        if let Some(session) = self.parts.sessions.session_of_live_run(run_id) {
            return Ok(session);
        }
        if let Some(record) = self.parts.store.run_record(run_id).await? {
            return Ok(record.session_id);
        }
        Err(AppError::not_found(format!("no run {run_id}")))
    }
}
