//! Conversation messages and their content parts.
//!
//! A conversation is a list of [`Message`]s. Each role has its own variant so that a message can
//! only hold what its role allows: users send text, images and audio; the assistant answers with
//! text, thinking and tool calls, kept in the order the model produced them; tool results answer
//! one tool call each. Provider adapters translate these to and from their wire formats.

use serde::{Deserialize, Serialize};

use crate::tool::ToolCall;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    /// Instructions for the model. Adapters merge system messages as the protocol requires.
    System {
        /// The instruction text.
        text: String,
    },
    /// A turn from the person (or program) driving the agent.
    User {
        /// Text, images and audio, in order.
        content: Vec<ContentPart>,
    },
    /// A turn produced by the model.
    Assistant {
        /// Text, thinking and tool calls, in the order the model produced them.
        content: Vec<AssistantPart>,
    },
    /// The outcome of one tool call.
    Tool(ToolResult),
}

impl Message {
    /// An assistant message's answer: its text parts joined (`None` for other roles).
    pub fn answer_text(&self) -> Option<String> {
        match self {
            Self::Assistant { content } => Some(
                content
                    .iter()
                    .filter_map(|part| match part {
                        AssistantPart::Text { text } => Some(text.as_str()),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => None,
        }
    }

    /// A system message.
    pub fn system(text: impl Into<String>) -> Self {
        Self::System { text: text.into() }
    }

    /// A user message with a single text part.
    pub fn user(text: impl Into<String>) -> Self {
        Self::User {
            content: vec![ContentPart::text(text)],
        }
    }

    /// An assistant message with a single text part.
    pub fn assistant(text: impl Into<String>) -> Self {
        Self::Assistant {
            content: vec![AssistantPart::Text { text: text.into() }],
        }
    }

    /// The role name as providers spell it (`system`, `user`, `assistant`, `tool`).
    pub fn role(&self) -> &'static str {
        match self {
            Self::System { .. } => "system",
            Self::User { .. } => "user",
            Self::Assistant { .. } => "assistant",
            Self::Tool(_) => "tool",
        }
    }

    /// The tool calls of an assistant message, in order (empty for other roles).
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        let parts: &[AssistantPart] = match self {
            Self::Assistant { content } => content,
            _ => &[],
        };
        parts.iter().filter_map(|part| match part {
            AssistantPart::ToolCall(call) => Some(call),
            _ => None,
        })
    }
}

/// A piece of user-supplied content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentPart {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// An image, by URL or inline.
    Image {
        /// Where the image bytes come from.
        source: ImageSource,
    },
    /// Audio, inline and base64-encoded (OpenAI `input_audio`).
    Audio {
        /// Container format such as `wav` or `mp3`.
        format: String,
        /// Base64-encoded audio bytes.
        data: String,
    },
}

impl ContentPart {
    /// A text part.
    pub fn text(text: impl Into<String>) -> Self {
        Self::Text { text: text.into() }
    }
}

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ImageSource {
    /// An `http(s)://` URL the provider fetches itself.
    Url {
        /// The URL.
        url: String,
    },
    /// Inline bytes.
    Base64 {
        /// MIME type, for example `image/png`.
        media_type: String,
        /// Base64-encoded bytes (no `data:` prefix).
        data: String,
    },
}

/// A piece of an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AssistantPart {
    /// Visible answer text.
    Text {
        /// The text.
        text: String,
    },
    /// Reasoning the model exposed (or an opaque redacted payload).
    Thinking(Thinking),
    /// A request to run a tool.
    ToolCall(ToolCall),
}

/// Assistant reasoning, kept opaque and sent back unchanged where the provider requires it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Thinking {
    /// Readable reasoning text with the provider's signature, if it gave one (Anthropic does;
    /// OpenAI-compatible servers expose `reasoning_content` without one).
    Text {
        /// The reasoning text.
        text: String,
        /// The provider's signature over the text; must be returned byte for byte.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    /// Reasoning the provider encrypted; returned unchanged, never shown.
    Redacted {
        /// The opaque payload.
        data: String,
    },
}

/// The outcome of one tool call, as sent back to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The id of the call this answers.
    pub call_id: String,
    /// The tool's name (some protocols want it; kept for display too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Text, JSON and images, in order.
    pub content: Vec<ToolResultPart>,
    /// Whether the tool failed; the model sees the content as an error it may correct.
    #[serde(default)]
    pub is_error: bool,
}

impl ToolResult {
    /// A successful text result.
    pub fn text(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            call_id: call_id.into(),
            name: None,
            content: vec![ToolResultPart::Text { text: text.into() }],
            is_error: false,
        }
    }

    /// A failed result whose text explains the error to the model.
    pub fn error(call_id: impl Into<String>, text: impl Into<String>) -> Self {
        Self {
            is_error: true,
            ..Self::text(call_id, text)
        }
    }

    /// The result flattened to text for protocols that accept only a string: text parts as
    /// they are, JSON parts serialised, images as a placeholder naming their source.
    pub fn text_content(&self) -> String {
        let mut out = String::new();
        for part in &self.content {
            if !out.is_empty() {
                out.push('\n');
            }
            match part {
                ToolResultPart::Text { text } => out.push_str(text),
                ToolResultPart::Json { value } => out.push_str(&value.to_string()),
                ToolResultPart::Image { source } => match source {
                    ImageSource::Url { url } => {
                        out.push_str("[image: ");
                        out.push_str(url);
                        out.push(']');
                    }
                    ImageSource::Base64 { media_type, .. } => {
                        out.push_str("[image: ");
                        out.push_str(media_type);
                        out.push(']');
                    }
                },
            }
        }
        out
    }
}

/// A piece of a tool result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToolResultPart {
    /// Text.
    Text {
        /// The text.
        text: String,
    },
    /// Structured data.
    Json {
        /// The value.
        value: serde_json::Value,
    },
    /// An image.
    Image {
        /// Where the image bytes come from.
        source: ImageSource,
    },
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn messages_serialise_with_role_tags_and_keep_order() {
        let message = Message::Assistant {
            content: vec![
                AssistantPart::Thinking(Thinking::Text {
                    text: "hmm".into(),
                    signature: Some("sig".into()),
                }),
                AssistantPart::Text { text: "ok".into() },
                AssistantPart::ToolCall(ToolCall::new("c1", "f", json!({"a": 1}))),
            ],
        };
        let value = serde_json::to_value(&message).unwrap();
        assert_eq!(value["role"], "assistant");
        assert_eq!(value["content"][0]["type"], "thinking");
        assert_eq!(value["content"][0]["signature"], "sig");
        assert_eq!(value["content"][2]["type"], "tool_call");
        let back: Message = serde_json::from_value(value).unwrap();
        assert_eq!(back, message);
        assert_eq!(back.tool_calls().count(), 1);
    }

    #[test]
    fn tool_result_flattens_to_text() {
        let result = ToolResult {
            call_id: "c".into(),
            name: None,
            content: vec![
                ToolResultPart::Text { text: "a".into() },
                ToolResultPart::Json {
                    value: json!({"b": 2}),
                },
            ],
            is_error: false,
        };
        assert_eq!(result.text_content(), "a\n{\"b\":2}");
    }
}
