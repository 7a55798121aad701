//! Run events as server-sent events.
//!
//! Named events: `run.started`, `delta.text`, `delta.thinking`, `delta.tool_call`, `message`,
//! `tool.started`, `tool.result`, `usage`, `approval.requested`, `approval.decided`,
//! `run.resumed`, `nested` (a sub-agent's event, live only: `{"type": "nested", "call_id",
//! "session_id", "depth", "agent_id"?, "event"}`), and last `run.finished`, `run.failed` (with a
//! typed error), `run.waiting`
//! (tool calls wait for approval: `{"run_id", "status", "pending"}`) or `run.paused`.
//! A group session's committed steps are `group.message`, `group.round` and `group.finished`
//! (see [`agentry_app::group`]).
//! In a session, every committed step carries its seq as the SSE id, so a client reconnecting
//! with `Last-Event-ID` receives each later committed event exactly once; deltas carry no id.

use axum::http::HeaderMap;
use axum::response::sse::Event;
use serde::Serialize;

use agentry_types::{GroupEvent, RunEvent, RunId, SessionEvent, Usage};

/// Where a reconnecting client resumes: its `Last-Event-ID` (a seq), else `after`.
pub(crate) fn resume_after(headers: &HeaderMap, after: u64) -> Result<u64, crate::error::ApiError> {
    match headers.get("last-event-id") {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                crate::error::ApiError::bad_request("Last-Event-ID must be a seq number")
            }),
        None => Ok(after),
    }
}

/// Turns run events into SSE events.
#[derive(Debug, Clone)]
pub struct SseMapper {
    /// Whether the run is in a session (steps come as committed events with seqs).
    session: bool,
    /// The highest seq sent so far.
    pub last_seq: u64,
    /// Whether the run's end was sent.
    pub ended: bool,
}

/// An SSE event named `name` whose data is `data` as JSON, written straight to its text (not
/// through a `serde_json::Value`: every delta of every stream comes here).
fn event(name: &str, data: &impl Serialize) -> Event {
    Event::default().event(name).data(json_text(data))
}

/// `data` as JSON text (`null` if it cannot be written).
fn json_text(data: &impl Serialize) -> String {
    serde_json::to_string(data).unwrap_or_else(|_| "null".to_owned())
}

/// A delta's data: `{"text"}`.
#[derive(Serialize)]
struct Text<'a> {
    text: &'a str,
}

/// A run's start without a session: `{"run_id"}`.
#[derive(Serialize)]
struct Started<'a> {
    run_id: &'a RunId,
}

/// A committed step: `{"event", "seq"}`.
#[derive(Serialize)]
struct Committed<'a> {
    event: &'a SessionEvent,
    seq: u64,
}

/// A committed answer's usage: `{"round", "usage"}`.
#[derive(Serialize)]
struct RoundUsage<'a> {
    round: &'a u32,
    usage: &'a Usage,
}

impl SseMapper {
    /// A mapper for a session run (`session`) or an ephemeral one.
    pub fn new(session: bool, last_seq: u64) -> Self {
        Self {
            session,
            last_seq,
            ended: false,
        }
    }

    /// The SSE events for one run event (none for events the client need not see).
    pub fn map(&mut self, run_event: &RunEvent) -> Vec<Event> {
        match run_event {
            RunEvent::TextDelta { text } => vec![event("delta.text", &Text { text })],
            RunEvent::ThinkingDelta { text } => vec![event("delta.thinking", &Text { text })],
            RunEvent::ToolCallDelta { .. } => vec![event("delta.tool_call", run_event)],
            RunEvent::Committed { seq, event } => self.committed(*seq, event),
            // A sub-agent's progress (live only, no id): the whole event, its child's event
            // inside (nested again for a grandchild).
            RunEvent::Nested { .. } => vec![event("nested", run_event)],
            // An MCP server's request for input and its settling (live only, not in the log).
            RunEvent::ElicitationRequested { .. } => {
                vec![event("elicitation.requested", run_event)]
            }
            RunEvent::ElicitationResolved { .. } => {
                vec![event("elicitation.resolved", run_event)]
            }
            // In a session these steps arrive as committed events, with their seqs.
            _ if self.session && !run_event.is_terminal() => Vec::new(),
            RunEvent::RunStarted { run_id } => {
                vec![event("run.started", &Started { run_id })]
            }
            RunEvent::AssistantMessage { .. } => vec![event("message", run_event)],
            RunEvent::Usage { .. } => vec![event("usage", run_event)],
            RunEvent::ToolCallStarted { .. } => vec![event("tool.started", run_event)],
            RunEvent::ToolResult { .. } => vec![event("tool.result", run_event)],
            RunEvent::RunSuspended { status, .. } => {
                if self.ended {
                    return Vec::new();
                }
                self.ended = true;
                let name = match status {
                    agentry_types::SuspendStatus::Waiting => "run.waiting",
                    agentry_types::SuspendStatus::Paused => "run.paused",
                };
                vec![event(name, run_event)]
            }
            RunEvent::RunFinished { .. } | RunEvent::RunFailed { .. } => {
                if self.ended {
                    return Vec::new();
                }
                self.ended = true;
                let name = if matches!(run_event, RunEvent::RunFailed { .. }) {
                    "run.failed"
                } else {
                    "run.finished"
                };
                vec![event(name, run_event)]
            }
        }
    }

    /// The SSE events for a committed step; `None` if it was already sent.
    pub fn committed(&mut self, seq: u64, stored: &SessionEvent) -> Vec<Event> {
        if seq <= self.last_seq {
            return Vec::new();
        }
        self.last_seq = seq;
        let data = json_text(&Committed { event: stored, seq });
        let id = seq.to_string();
        let named = |name: &str| Event::default().event(name).data(&data).id(id.clone());
        match stored {
            // A run (re)starting after an earlier end in the backlog: the stream goes on.
            SessionEvent::RunStarted { .. } => {
                self.ended = false;
                vec![named("run.started")]
            }
            SessionEvent::Message { .. } => vec![named("message")],
            SessionEvent::AssistantMessage { round, usage, .. } => vec![
                named("message"),
                event("usage", &RoundUsage { round, usage }),
            ],
            SessionEvent::ToolCallIntent { .. } => vec![named("tool.started")],
            SessionEvent::ToolCallResult { .. } => vec![named("tool.result")],
            SessionEvent::ApprovalRequested { .. } => vec![named("approval.requested")],
            SessionEvent::ApprovalDecided { .. } => vec![named("approval.decided")],
            SessionEvent::ContextCompacted { .. } => vec![named("context.compacted")],
            // Turns were revoked: the conversation is again what it was after `after_seq`.
            SessionEvent::Revoked { .. } => vec![named("session.revoked")],
            SessionEvent::Group { event, .. } => {
                vec![named(sse_name(event))]
            }
            SessionEvent::RunResumed { .. } => {
                self.ended = false;
                vec![named("run.resumed")]
            }
            SessionEvent::RunPaused { .. } => {
                self.ended = true;
                vec![named("run.paused")]
            }
            SessionEvent::RunFinished { error, .. } => {
                self.ended = true;
                vec![named(if error.is_some() {
                    "run.failed"
                } else {
                    "run.finished"
                })]
            }
        }
    }
}

/// The SSE name of a committed group event.
pub fn sse_name(event: &GroupEvent) -> &'static str {
    match event {
        GroupEvent::Round { .. } => "group.round",
        GroupEvent::Message { .. } => "group.message",
        GroupEvent::Finished { .. } => "group.finished",
    }
}
