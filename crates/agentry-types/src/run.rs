//! What a run streams and why it ended.
//!
//! A run is one request processed to its final answer: rounds of a model call followed by the
//! round's tool calls. [`RunEvent`]s report every step; deltas are for live display, the other
//! events describe committed steps.

use serde::{Deserialize, Serialize};

use crate::error::ErrorInfo;
use crate::id::RunId;
use crate::message::{AssistantPart, ToolResult};
use crate::session::RunStopReason;
use crate::tool::ToolCall;
use crate::usage::{StopReason, Usage};

/// One event of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RunEvent {
    /// The run began.
    RunStarted {
        /// The run's id.
        run_id: RunId,
    },
    /// A fragment of answer text (live only).
    TextDelta {
        /// The fragment.
        text: String,
    },
    /// A fragment of reasoning (live only).
    ThinkingDelta {
        /// The fragment.
        text: String,
    },
    /// A fragment of a tool call being generated (live only).
    ToolCallDelta {
        /// Position of the call in this round.
        index: usize,
        /// The call's id, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The tool's name, when known.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// A fragment of the arguments' JSON text.
        arguments: String,
    },
    /// The model's complete message for a round.
    AssistantMessage {
        /// The round, from 1.
        round: u32,
        /// The message's parts, in order.
        content: Vec<AssistantPart>,
        /// Why the model stopped.
        stop_reason: StopReason,
    },
    /// Tokens used by a round's model call, and how long it took.
    Usage {
        /// The round, from 1.
        round: u32,
        /// The call's usage.
        usage: Usage,
        /// The model called (its id in the catalogue).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// Milliseconds from the call's start to its first streamed output (text, reasoning or
        /// a tool call's arguments), when it streamed any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        first_output_ms: Option<f64>,
        /// Milliseconds from the call's start to its complete answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<f64>,
    },
    /// A tool call is about to run.
    ToolCallStarted {
        /// The call.
        call: ToolCall,
    },
    /// A tool call's outcome, as the model will see it.
    ToolResult {
        /// The result.
        result: ToolResult,
        /// How long the tool ran, in milliseconds.
        duration_ms: u64,
    },
    /// A step was committed to the session's log (only for runs in a session). Carries the
    /// stored event and its seq, so a client can resume a stream exactly after it.
    Committed {
        /// The event's seq in the session's log.
        seq: u64,
        /// The stored event.
        event: crate::session::SessionEvent,
    },
    /// The run ended with an answer (or stopped by a guard).
    RunFinished {
        /// Why it ended.
        stop_reason: RunStopReason,
        /// The final answer text (empty if a guard stopped it first).
        text: String,
        /// Tokens used over all rounds.
        usage: Usage,
        /// Rounds (model calls) made.
        rounds: u32,
    },
    /// The run stopped without ending: it waits for approvals (`waiting`) or was paused
    /// (`paused`). Its stream ends here; the run goes on in the same session, with the same id,
    /// once the calls are decided or the run is resumed.
    RunSuspended {
        /// The run.
        run_id: RunId,
        /// `waiting` or `paused`.
        status: SuspendStatus,
        /// The calls waiting for a decision (empty when paused).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pending: Vec<crate::session::PendingApproval>,
        /// Tokens used so far.
        usage: Usage,
        /// Rounds (model calls) made so far.
        rounds: u32,
    },
    /// An event of a sub-agent's run started by one of this run's tool calls (`delegate`,
    /// `talk_to`), for live display only: the child's steps are committed in its own session.
    /// A grandchild's events arrive nested twice.
    Nested {
        /// The id of the tool call that started the child run.
        call_id: String,
        /// The child's session.
        session_id: crate::id::SessionId,
        /// The child's delegation depth (1 for a child of a top-level run).
        depth: u32,
        /// The saved agent the child runs as, if any.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_id: Option<String>,
        /// The child's event.
        event: Box<RunEvent>,
    },
    /// An MCP server asked a person for input during one of this run's tool calls (live only:
    /// the request lives as long as the call). Answer it through `POST
    /// /v1/runs/{run_id}/approvals` with its `elicitation_id`.
    ElicitationRequested {
        /// The request's id.
        elicitation_id: String,
        /// The tool call in flight it belongs to.
        call_id: String,
        /// The MCP server asking.
        server: String,
        /// What it asks, for a person.
        message: String,
        /// `form` (answer with an object matching `requested_schema`) or `url` (visit `url`).
        mode: String,
        /// For a form: the JSON Schema of the answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        requested_schema: Option<serde_json::Value>,
        /// For a URL request: the page to visit.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        url: Option<String>,
    },
    /// An elicitation is settled (live only): `accept`, `decline`, `cancel`, or `withdrawn`
    /// (its call ended first).
    ElicitationResolved {
        /// The request's id.
        elicitation_id: String,
        /// The tool call it belonged to.
        call_id: String,
        /// How it was settled.
        action: String,
    },
    /// The run ended because of an error.
    RunFailed {
        /// Why it ended (`error`, or `cancelled`).
        stop_reason: RunStopReason,
        /// What went wrong.
        error: ErrorInfo,
        /// Tokens used over all rounds.
        usage: Usage,
        /// Rounds (model calls) made.
        rounds: u32,
    },
}

impl RunEvent {
    /// Whether this is the run's last event.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            Self::RunFinished { .. } | Self::RunFailed { .. } | Self::RunSuspended { .. }
        )
    }
}

/// Why a run stopped without ending.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SuspendStatus {
    /// Tool calls wait for a person's approval.
    Waiting,
    /// The run was paused between rounds.
    Paused,
}

impl SuspendStatus {
    /// The stable string form (also the session's status).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Paused => "paused",
        }
    }
}
