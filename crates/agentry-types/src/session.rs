//! What a session's event log records.
//!
//! A session is an append-only sequence of these events. The conversation sent to a model, the
//! run status and crash recovery are all derived from it. Live deltas are never recorded: only
//! completed steps — the user turn before the model is called, each complete assistant message,
//! each tool call's intent before it runs and its result after.

use serde::{Deserialize, Serialize};

use crate::error::ErrorInfo;
use crate::id::RunId;
use crate::message::{AssistantPart, Message, ToolResult};
use crate::tool::ToolCall;
use crate::usage::{StopReason, Usage};

/// One committed step of a session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionEvent {
    /// A run began, with everything needed to resume it elsewhere.
    RunStarted {
        /// The run.
        run_id: RunId,
        /// The model id the run calls.
        model: String,
        /// Names of the tools offered.
        tools: Vec<String>,
        /// Generation parameters (the engine's type, as JSON).
        #[serde(default)]
        params: serde_json::Value,
        /// Guards (the engine's type, as JSON).
        #[serde(default)]
        limits: serde_json::Value,
        /// Models tried in order when a call to `model` fails before any output.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        fallback_models: Vec<String>,
        /// The run's approval policy (the engine's type, as JSON; null when nothing waits).
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        approvals: serde_json::Value,
        /// The run's narrowings of the `fetch` tool's network policy (the engine's type, as
        /// JSON; null when there are none), so that a resumed run keeps them.
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        network: serde_json::Value,
        /// The saved agent the run runs as.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_id: Option<String>,
        /// What the run's caller may use (the engine's type, as JSON; null: everything), so
        /// that a resumed run and its sub-agents stay within it.
        #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
        grant: serde_json::Value,
    },
    /// A message given to the model: the user's turn, or a system prompt.
    Message {
        /// The run it belongs to.
        run_id: RunId,
        /// The message.
        message: Message,
    },
    /// The model's complete answer for one round.
    AssistantMessage {
        /// The run.
        run_id: RunId,
        /// The round, from 1.
        round: u32,
        /// The message's parts, in order.
        content: Vec<AssistantPart>,
        /// Tokens the call used.
        usage: Usage,
        /// Why the model stopped.
        stop_reason: StopReason,
        /// The model the run called (its id in the catalogue).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// The saved agent the run runs as.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_id: Option<String>,
        /// What the call cost in US dollars, by the model's price (absent: no price known).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        /// Milliseconds from the call's start to its complete answer.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        duration_ms: Option<u64>,
        /// Milliseconds from the call's start to its first streamed output.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        first_output_ms: Option<u64>,
    },
    /// A tool call is about to run (committed before it runs).
    ToolCallIntent {
        /// The run.
        run_id: RunId,
        /// The call.
        call: ToolCall,
        /// Whether re-running it after a crash is harmless.
        idempotent: bool,
    },
    /// A tool call's outcome.
    ToolCallResult {
        /// The run.
        run_id: RunId,
        /// The result as the model sees it.
        result: ToolResult,
        /// How long the tool ran.
        duration_ms: u64,
        /// A working directory the tool selected for the rest of the run (skills).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        working_dir: Option<std::path::PathBuf>,
    },
    /// A tool call of the run needs a person's approval before it runs (the run waits, with
    /// the session in status `waiting`, until every such call of the round is decided).
    ApprovalRequested {
        /// The run.
        run_id: RunId,
        /// The call, as the model asked for it.
        call: ToolCall,
        /// Why it needs approval (the rule that matched).
        reason: String,
    },
    /// A person decided on a call that needed approval.
    ApprovalDecided {
        /// The run.
        run_id: RunId,
        /// The call decided on.
        call_id: String,
        /// Approved (as asked, or with edited arguments) or rejected.
        decision: ApprovalVerdict,
        /// Why (for a rejection, the model sees it as the call's error result).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
        /// The arguments the call runs with, when they were edited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arguments: Option<serde_json::Value>,
    },
    /// The run stopped at a safe point (between rounds) on request; the session is `paused`
    /// until the run is resumed.
    RunPaused {
        /// The run.
        run_id: RunId,
    },
    /// A paused or waiting run goes on.
    RunResumed {
        /// The run.
        run_id: RunId,
    },
    /// The conversation was compacted to fit the model's context window. The messages stay in
    /// the log; from now on the model is sent the summary (or a marker) instead of the messages
    /// before `covered`.
    ContextCompacted {
        /// The run.
        run_id: RunId,
        /// Index (in the session's conversation) of the first message still sent verbatim.
        covered: usize,
        /// The running summary of the messages before it, if a summary model wrote one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        /// Messages before `covered` that no summary describes (dropped), over all compactions
        /// so far.
        #[serde(default)]
        dropped: usize,
        /// The messages this compaction dropped without a summary (no summary model is named,
        /// or it failed: see `summary_error`). They stay in the log but are no longer sent, and
        /// no summary describes them. Absent when a summary covers them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dropped_messages: Option<DroppedMessages>,
        /// Messages this compaction covered (the ones the summary model was sent).
        newly_covered: usize,
        /// Tokens of the request before.
        tokens_before: u64,
        /// Tokens of the request after.
        tokens_after: u64,
        /// The model that wrote the summary.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary_model: Option<String>,
        /// Whether the provider's context-length error forced it.
        #[serde(default)]
        forced: bool,
        /// Why there is no new summary although a summary model is configured.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary_error: Option<String>,
        /// Lasting facts, preferences and decisions the summary model found in the new
        /// messages (stored as the agent's long-term memories).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        memories: Vec<CompactionMemory>,
        /// The saved agent the run runs as (whose memories they are).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_id: Option<String>,
        /// The user the run is for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
    },
    /// Turns were revoked: from here on the conversation is what it was after event
    /// `after_seq`. The revoked events stay in the log (for audit) but are no longer part of
    /// the conversation.
    Revoked {
        /// The first revoked turn (the run its user message started).
        run_id: RunId,
        /// The last event kept.
        after_seq: u64,
        /// The revoked runs, oldest first.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        runs: Vec<RunId>,
        /// Whether the files those runs changed were put back.
        #[serde(default)]
        files_restored: bool,
    },
    /// Group chat: one step of a group session's transcript (see [`GroupEvent`]). A group
    /// session holds only these; each member's own turns run in the member's linked session.
    Group {
        /// The exchange (one user message and the rounds it led to).
        run_id: RunId,
        /// What happened.
        event: GroupEvent,
    },
    /// The run ended.
    RunFinished {
        /// The run.
        run_id: RunId,
        /// Why.
        stop_reason: RunStopReason,
        /// Tokens over the run.
        usage: Usage,
        /// Model calls made.
        rounds: u32,
        /// The error, for a failed run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorInfo>,
        /// Why a guard stopped it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
}

impl SessionEvent {
    /// The event's kind, as stored beside the payload.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::RunStarted { .. } => "run_started",
            Self::Message { .. } => "message",
            Self::AssistantMessage { .. } => "assistant_message",
            Self::ToolCallIntent { .. } => "tool_call_intent",
            Self::ToolCallResult { .. } => "tool_call_result",
            Self::ApprovalRequested { .. } => "approval_requested",
            Self::ApprovalDecided { .. } => "approval_decided",
            Self::RunPaused { .. } => "run_paused",
            Self::RunResumed { .. } => "run_resumed",
            Self::ContextCompacted { .. } => "context_compacted",
            Self::Group { .. } => "group",
            Self::Revoked { .. } => "revoked",
            Self::RunFinished { .. } => "run_finished",
        }
    }

    /// The run the event belongs to.
    pub fn run_id(&self) -> RunId {
        match self {
            Self::RunStarted { run_id, .. }
            | Self::Message { run_id, .. }
            | Self::AssistantMessage { run_id, .. }
            | Self::ToolCallIntent { run_id, .. }
            | Self::ToolCallResult { run_id, .. }
            | Self::ApprovalRequested { run_id, .. }
            | Self::ApprovalDecided { run_id, .. }
            | Self::RunPaused { run_id }
            | Self::RunResumed { run_id }
            | Self::ContextCompacted { run_id, .. }
            | Self::Group { run_id, .. }
            | Self::Revoked { run_id, .. }
            | Self::RunFinished { run_id, .. } => *run_id,
        }
    }
}

/// A person's decision on a tool call that needed approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalVerdict {
    /// Run the call as the model asked.
    Approve,
    /// Do not run it: the model gets an error result with the reason.
    Reject,
    /// Run it with edited arguments.
    Edit,
}

impl ApprovalVerdict {
    /// The stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Approve => "approve",
            Self::Reject => "reject",
            Self::Edit => "edit",
        }
    }
}

/// A tool call waiting for a person's decision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingApproval {
    /// The call, as the model asked for it.
    pub call: ToolCall,
    /// Why it needs approval.
    pub reason: String,
}

/// Messages a compaction dropped without a summary (see [`SessionEvent::ContextCompacted`]):
/// indices into the session's conversation, `end` exclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DroppedMessages {
    /// How many: `end - start`.
    pub count: usize,
    /// The first one dropped.
    pub start: usize,
    /// One past the last one dropped.
    pub end: usize,
}

/// A memory found while compacting (see [`SessionEvent::ContextCompacted`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionMemory {
    /// `fact`, `preference` or `decision`.
    pub kind: String,
    /// The statement.
    pub text: String,
}

/// A step of a group chat (inside [`SessionEvent::Group`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GroupEvent {
    /// A round began: the members it wakes, who run in parallel.
    Round {
        /// The round, from 1.
        round: u32,
        /// The members woken, by agent id.
        members: Vec<String>,
    },
    /// A message of the transcript: the user's (round 0, no `agent_id`) or a member's reply.
    Message {
        /// The round, from 1; 0 for the user's message.
        round: u32,
        /// The member who spoke; absent for the user.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_id: Option<String>,
        /// The speaker's display name.
        name: String,
        /// What was said (a member's final answer).
        text: String,
        /// The members the message mentions, by agent id.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        mentions: Vec<String>,
        /// The member's own session, where its turn (with its tool calls) is recorded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        session_id: Option<crate::id::SessionId>,
        /// The member's run in that session.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        member_run_id: Option<RunId>,
        /// How the member's run ended.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stop_reason: Option<String>,
        /// Why the member gave no answer, when its run failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorInfo>,
    },
    /// The exchange ended: `completed` (nobody mentioned for another round), `max_rounds`,
    /// `cancelled`, or `interrupted` (the server stopped mid-exchange).
    Finished {
        /// Rounds run.
        rounds: u32,
        /// Why it ended.
        stop_reason: String,
    },
}

/// Why a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunStopReason {
    /// The model gave its final answer.
    Completed,
    /// The run used its allowed number of tool rounds.
    MaxRounds,
    /// The run's wall-clock deadline passed.
    Deadline,
    /// The model kept repeating the same tool calls.
    LoopDetected,
    /// The caller cancelled the run.
    Cancelled,
    /// A model call failed.
    Error,
    /// The run used up a quota: its output tokens (`max_output_tokens`) or its tool calls
    /// (`max_tool_calls`); the run's note says which.
    QuotaExceeded,
    /// A spending budget of the run's agent or API key is used up (its note says which): the
    /// run stops before its next model call.
    BudgetExceeded,
    /// The model called tools its caller runs itself (the run's client tools): the calls are in
    /// the run's last assistant message, for the caller to answer in a next run.
    ToolCalls,
}

impl RunStopReason {
    /// The reason's stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Completed => "completed",
            Self::MaxRounds => "max_rounds",
            Self::Deadline => "deadline",
            Self::LoopDetected => "loop_detected",
            Self::Cancelled => "cancelled",
            Self::Error => "error",
            Self::QuotaExceeded => "quota_exceeded",
            Self::BudgetExceeded => "budget_exceeded",
            Self::ToolCalls => "tool_calls",
        }
    }
}
