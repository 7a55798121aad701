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
use crate::run::RunStopReason;
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
            | Self::RunFinished { run_id, .. } => *run_id,
        }
    }
}
