//! Agentry's shared vocabulary.
//!
//! Everything that crosses a crate boundary or leaves the process (HTTP bodies, stored events,
//! CLI `--json` output) is defined here: time-ordered ids, messages and their content parts,
//! tool specs, calls and results, token usage, stop reasons, streamed model events and stable
//! error codes. This crate does no IO and depends on serde only, so every other crate can use it.

pub mod error;
pub mod event;
pub mod id;
pub mod message;
pub mod run;
pub mod session;
pub mod tool;
pub mod usage;

pub use error::{ErrorCode, ErrorInfo};
pub use event::{ModelEvent, ModelResponse};
pub use id::{IdError, RunId, SessionId};
pub use message::{
    AssistantPart, ContentPart, ImageSource, Message, Thinking, ToolResult, ToolResultPart,
};
pub use run::{RunEvent, SuspendStatus};
pub use session::{
    ApprovalVerdict, CompactionMemory, DroppedMessages, GroupEvent, PendingApproval, RunStopReason,
    SessionEvent,
};
pub use tool::{ToolCall, ToolSpec};
pub use usage::{ModelPrice, StopReason, Usage};
