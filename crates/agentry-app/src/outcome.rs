//! How a run ended, for a client that waits for it: [`App::run_to_end`] runs a prepared request
//! (ephemeral, or in its session through the hub) and answers a [`RunOutcome`]: the final
//! text, usage, the messages the run added, and its error; or, for a run that stopped without
//! ending (tool calls wait for approval, or it was paused), the calls to decide.

use serde::Serialize;
use tokio::sync::broadcast::error::RecvError;

use agentry_core::RunRequest;
use agentry_core::session::BusyPolicy;
use agentry_types::{
    ErrorInfo, Message, PendingApproval, RunEvent, RunId, SessionEvent, SessionId, SuspendStatus,
    Usage,
};

use crate::App;
use crate::error::AppError;
use crate::hub::CancelOnDrop;
use crate::runs::{Target, start_in_session};

/// How a run ended (also for a run that failed), or why it stopped without ending.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RunOutcome {
    /// Why a guard stopped the run (for `quota_exceeded`, which quota: `max_output_tokens` or
    /// `max_tool_calls`).
    pub note: Option<String>,
    /// Whether the run ended without an error.
    pub success: bool,
    /// The session (absent for an ephemeral run).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub session_id: Option<SessionId>,
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub run_id: Option<RunId>,
    /// `completed`, `max_rounds`, `deadline`, `loop_detected`, `quota_exceeded`, `cancelled`,
    /// `tool_calls` (the model called a tool its caller runs: the OpenAI-compatible API) or
    /// `error`; or, for a run that has not ended, `waiting` (tool calls wait for approval:
    /// see `pending`) or `paused`.
    pub stop_reason: String,
    /// `waiting` or `paused` for a run that has not ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub status: Option<SuspendStatus>,
    /// The calls waiting for approval (`POST /v1/runs/{run_id}/approvals` decides them).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Vec<crate::schema::PendingCall>>))]
    pub pending: Option<Vec<PendingApproval>>,
    /// The final answer's text.
    pub text: String,
    /// Token usage.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub usage: Usage,
    /// Tool rounds taken.
    pub rounds: u32,
    /// The messages this run added (user, assistant, tool).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub messages: Vec<Message>,
    /// The error, when the run failed.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub error: Option<ErrorInfo>,
}

impl RunOutcome {
    /// Whether the run failed (its model call failed): a bad gateway over HTTP. Guards that
    /// stop a run are not failures.
    pub fn failed(&self) -> bool {
        self.error.is_some()
    }
}

/// How long a streamed request waits for its run's first event before it answers: the start
/// of a run in a new session is committed within it, so a start that could not be written is
/// the request's error; a run queued behind another starts streaming without it.
pub const START_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The error of a run whose start could not be written, as the caller hears it: a full disk
/// is `storage_full`, anything else an internal failure (nothing was kept either way).
fn start_failure(error: &ErrorInfo) -> AppError {
    match error.code {
        agentry_types::ErrorCode::StorageFull => AppError::storage_full(error.message.clone()),
        _ => AppError::internal(error.message.clone()),
    }
}

impl App {
    /// Runs a prepared request and waits for its end. A session run keeps going if the caller
    /// stops waiting (the future is dropped) unless `cancel_on_drop`.
    pub async fn run_to_end(
        &self,
        target: Target,
        request: RunRequest,
        policy: BusyPolicy,
        cancel_on_drop: bool,
    ) -> Result<RunOutcome, AppError> {
        let session = match target {
            Target::Ephemeral => {
                let output = self.stream_stateless(request)?.finish().await?;
                return Ok(RunOutcome {
                    note: output.note,
                    success: output.error.is_none(),
                    session_id: None,
                    run_id: Some(output.run_id),
                    stop_reason: output.stop_reason.as_str().to_owned(),
                    status: None,
                    pending: None,
                    text: output.text,
                    usage: output.usage,
                    rounds: output.rounds,
                    messages: output.state.messages,
                    error: output.error,
                });
            }
            Target::Session(session) => session,
        };
        let subscription = start_in_session(self, session, request, policy).await?;
        self.follow_to_end(session, None, subscription, cancel_on_drop)
            .await
    }

    /// Waits up to [`START_WAIT`] for the first event of a run just submitted: `Some` to send
    /// on first, `None` when none came in time (or some were missed), an error when the run
    /// ended before its start was written (a full disk: `storage_full`).
    pub async fn await_start(
        &self,
        subscription: &mut crate::hub::Subscription,
    ) -> Result<Option<std::sync::Arc<RunEvent>>, AppError> {
        match tokio::time::timeout(START_WAIT, subscription.events.recv()).await {
            Ok(Ok(event)) => match event.as_ref() {
                RunEvent::RunFailed { error, .. } => Err(start_failure(error)),
                _ => Ok(Some(event)),
            },
            Ok(Err(RecvError::Lagged(_))) => {
                subscription.missed = true;
                Ok(None)
            }
            Ok(Err(RecvError::Closed)) | Err(_) => Ok(None),
        }
    }

    /// Follows a session's live run from `subscription` to its end (or its suspension) and
    /// answers its outcome; `known` is the run's id when the caller knows it (else the run's
    /// start names it). With `cancel_on_drop`, the run is cancelled if the caller stops
    /// waiting.
    pub async fn follow_to_end(
        &self,
        session: SessionId,
        known: Option<RunId>,
        mut subscription: crate::hub::Subscription,
        cancel_on_drop: bool,
    ) -> Result<RunOutcome, AppError> {
        let mut guard =
            CancelOnDrop::new(self.parts.hub.clone(), cancel_on_drop.then_some(session));
        let mut run_id = known;
        let mut end = None;
        // The run's committed steps as they went by: when the subscription saw the run start
        // and missed nothing, they are the run's whole record and the log need not be read.
        let mut committed = Vec::new();
        let mut whole = false;
        // Whether every event reached this subscription: without a gap, a run that ends
        // without its start committed is a run whose start could not be written.
        let mut missed = false;
        loop {
            match subscription.events.recv().await {
                Ok(event) => match event.as_ref() {
                    RunEvent::Committed {
                        event: SessionEvent::RunStarted { run_id: id, .. },
                        ..
                    } => {
                        run_id = Some(*id);
                        whole = committed.is_empty();
                        committed.push(event);
                    }
                    RunEvent::Committed { .. } => committed.push(event),
                    RunEvent::RunFinished { .. }
                    | RunEvent::RunFailed { .. }
                    | RunEvent::RunSuspended { .. } => {
                        end = Some(event);
                        break;
                    }
                    _ => {}
                },
                Err(RecvError::Lagged(_)) => {
                    whole = false;
                    missed = true;
                    continue;
                }
                Err(RecvError::Closed) => break,
            }
        }
        guard.disarm();
        let Some(end) = end else {
            return Err(AppError::internal("the run ended without a final event"));
        };
        if let RunEvent::RunFailed { error, .. } = end.as_ref()
            && committed.is_empty()
            && !missed
        {
            // The run's start was never written (a new session is created by it): there is
            // nothing of the run to read back, and the caller hears why.
            return Err(start_failure(error));
        }
        let (messages, note) = if whole {
            let events = committed.iter().filter_map(|event| match event.as_ref() {
                RunEvent::Committed { event, .. } => Some(event.clone()),
                _ => None,
            });
            messages_of(events, run_id)
        } else {
            self.run_messages(session, run_id).await?
        };
        let mut outcome = RunOutcome {
            note,
            success: true,
            session_id: Some(session),
            run_id,
            stop_reason: String::new(),
            status: None,
            pending: None,
            text: String::new(),
            usage: Usage::default(),
            rounds: 0,
            messages,
            error: None,
        };
        match end.as_ref() {
            RunEvent::RunFinished {
                stop_reason,
                text,
                usage,
                rounds,
            } => {
                outcome.stop_reason = stop_reason.as_str().to_owned();
                outcome.text.clone_from(text);
                outcome.usage = *usage;
                outcome.rounds = *rounds;
            }
            RunEvent::RunFailed {
                stop_reason,
                error,
                usage,
                rounds,
            } => {
                outcome.success = false;
                outcome.stop_reason = stop_reason.as_str().to_owned();
                outcome.error = Some(error.clone());
                outcome.usage = *usage;
                outcome.rounds = *rounds;
            }
            RunEvent::RunSuspended {
                run_id: suspended,
                status,
                pending,
                usage,
                rounds,
            } => {
                // Not ended: the run waits for approvals or was paused. `stop_reason` says
                // which, and `pending` lists the calls to decide.
                outcome.run_id = Some(*suspended);
                outcome.stop_reason = status.as_str().to_owned();
                outcome.status = Some(*status);
                outcome.pending = Some(pending.clone());
                outcome.usage = *usage;
                outcome.rounds = *rounds;
                outcome.note = None;
            }
            _ => return Err(AppError::internal("unexpected final event")),
        }
        Ok(outcome)
    }

    /// How a run of `session` ended, read from the log: `None` while it has not (it never
    /// started, or it is still in flight).
    pub async fn logged_outcome(
        &self,
        session: SessionId,
        run_id: RunId,
    ) -> Result<Option<RunOutcome>, AppError> {
        let events = self.logged(session).await?;
        let finished = events.iter().find_map(|event| match event {
            SessionEvent::RunFinished {
                run_id: id,
                stop_reason,
                usage,
                rounds,
                error,
                ..
            } if *id == run_id => Some((*stop_reason, *usage, *rounds, error.clone())),
            _ => None,
        });
        let Some((stop_reason, usage, rounds, error)) = finished else {
            return Ok(None);
        };
        let (messages, note) = messages_of(events, Some(run_id));
        let text = messages
            .iter()
            .rev()
            .find_map(Message::answer_text)
            .unwrap_or_default();
        Ok(Some(RunOutcome {
            note,
            success: error.is_none(),
            session_id: Some(session),
            run_id: Some(run_id),
            stop_reason: stop_reason.as_str().to_owned(),
            status: None,
            pending: None,
            text,
            usage,
            rounds,
            messages,
            error,
        }))
    }

    /// The messages a session's run added (user, assistant, tool), and its end's note.
    async fn run_messages(
        &self,
        session: SessionId,
        run_id: Option<RunId>,
    ) -> Result<(Vec<Message>, Option<String>), AppError> {
        Ok(messages_of(self.logged(session).await?, run_id))
    }

    /// A session's events as the log holds them (unreadable ones skipped).
    async fn logged(&self, session: SessionId) -> Result<Vec<SessionEvent>, AppError> {
        Ok(self
            .parts
            .store
            .events(session, 0, usize::MAX)
            .await?
            .into_iter()
            .filter_map(|stored| serde_json::from_value::<SessionEvent>(stored.payload).ok())
            .collect())
    }
}

/// The messages a run added (user, assistant, tool), and its end's note, from its session's
/// events.
fn messages_of(
    events: impl IntoIterator<Item = SessionEvent>,
    run_id: Option<RunId>,
) -> (Vec<Message>, Option<String>) {
    let mut note = None;
    let messages = events
        .into_iter()
        .filter(|event| Some(event.run_id()) == run_id)
        .filter_map(|event| match event {
            SessionEvent::RunFinished { note: end_note, .. } => {
                note = end_note;
                None
            }
            SessionEvent::Message { message, .. } => Some(message),
            SessionEvent::AssistantMessage { content, .. } => Some(Message::Assistant { content }),
            SessionEvent::ToolCallResult { result, .. } => Some(Message::Tool(result)),
            _ => None,
        })
        .collect();
    (messages, note)
}
