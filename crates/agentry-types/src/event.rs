//! What a model call streams to its caller.
//!
//! Deltas are for live display only; the final [`ModelEvent::Completed`] carries the assembled
//! assistant message, which is what gets committed.

use serde::{Deserialize, Serialize};

use crate::message::AssistantPart;
use crate::tool::ToolCall;
use crate::usage::{StopReason, Usage};

/// One item of a model call's stream, normalised across providers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ModelEvent {
    /// A fragment of answer text.
    TextDelta {
        /// The fragment.
        text: String,
    },
    /// A fragment of reasoning text.
    ThinkingDelta {
        /// The fragment.
        text: String,
    },
    /// A fragment of a tool call being generated. `id` and `name` arrive on the first fragment
    /// of each call (some providers repeat them); `arguments` is raw, possibly partial JSON.
    ToolCallDelta {
        /// Position of the call in this response.
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
    /// A tool call whose arguments are complete and parsed.
    ToolCall {
        /// Position of the call in this response.
        index: usize,
        /// The call.
        call: ToolCall,
    },
    /// The call is complete.
    Completed {
        /// The assembled response.
        response: ModelResponse,
    },
}

/// The assembled result of one model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelResponse {
    /// The provider's response id, if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The model that answered, as the provider named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The assistant message's parts, in order.
    pub content: Vec<AssistantPart>,
    /// Tokens used.
    pub usage: Usage,
    /// Why generation stopped.
    pub stop_reason: StopReason,
}

impl ModelResponse {
    /// The answer text: every text part, concatenated.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|part| match part {
                AssistantPart::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    /// The reasoning text: every readable thinking part, concatenated.
    pub fn thinking(&self) -> String {
        self.content
            .iter()
            .filter_map(|part| match part {
                AssistantPart::Thinking(crate::message::Thinking::Text { text, .. }) => {
                    Some(text.as_str())
                }
                _ => None,
            })
            .collect()
    }

    /// The tool calls, in order.
    pub fn tool_calls(&self) -> Vec<&ToolCall> {
        self.content
            .iter()
            .filter_map(|part| match part {
                AssistantPart::ToolCall(call) => Some(call),
                _ => None,
            })
            .collect()
    }

    /// The response as an assistant message for the conversation history.
    pub fn to_message(&self) -> crate::message::Message {
        crate::message::Message::Assistant {
            content: self.content.clone(),
        }
    }
}
