//! Anthropic Messages.
//!
//! System messages become the top-level `system`; tool results travel as `tool_result` blocks in
//! a user turn; thinking and redacted thinking blocks are sent back unchanged, with their
//! signatures, in their original order; `max_tokens` always has a value. Decoding handles
//! `ping` events, padded data lines, an empty first `input_json_delta` and tools with no
//! arguments.

use agentry_types::{
    AssistantPart, ContentPart, ImageSource, Message, StopReason, Thinking, ToolResultPart,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Protocol, error_in_stream, insert_sampling, parse_json};
use crate::config::ProviderConfig;
use crate::delta::{Delta, UsageUpdate};
use crate::error::LlmError;
use crate::request::ModelRequest;

/// `max_tokens` sent when the request sets none (the API requires a value).
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

/// The API version header value.
pub const API_VERSION: &str = "2023-06-01";

/// Encodes the request body.
pub(crate) fn encode(
    config: &ProviderConfig,
    request: &ModelRequest,
    stream: bool,
) -> Result<Value, LlmError> {
    let mut system = Vec::new();
    let mut messages: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for message in &request.messages {
        let (role, blocks) = match message {
            Message::System { text } => {
                system.push(text.as_str());
                continue;
            }
            Message::User { content } => ("user", encode_user(content)?),
            Message::Assistant { content } => ("assistant", encode_assistant(content)),
            Message::Tool(result) => {
                let content: Vec<Value> = result
                    .content
                    .iter()
                    .map(|part| match part {
                        ToolResultPart::Text { text } => json!({"type": "text", "text": text}),
                        ToolResultPart::Json { value } => {
                            json!({"type": "text", "text": value.to_string()})
                        }
                        ToolResultPart::Image { source } => image_block(source),
                    })
                    .collect();
                let mut block = json!({
                    "type": "tool_result",
                    "tool_use_id": result.call_id,
                    "content": content,
                });
                if result.is_error {
                    block["is_error"] = json!(true);
                }
                ("user", vec![block])
            }
        };
        if blocks.is_empty() {
            continue;
        }
        // The API wants user and assistant turns to alternate: merge neighbours of one role.
        match messages.last_mut() {
            Some((last_role, last_blocks)) if *last_role == role => {
                last_blocks.extend(blocks);
                // Tool results must open the user turn that answers the calls.
                last_blocks.sort_by_key(|block| block["type"] != "tool_result");
            }
            _ => messages.push((role, blocks)),
        }
    }
    let params = &request.params;
    let budget = params.thinking.as_ref().and_then(|t| t.budget_tokens);
    let default_max = match budget {
        Some(budget) => DEFAULT_MAX_TOKENS.max(budget.saturating_add(4096)),
        None => DEFAULT_MAX_TOKENS,
    };
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert(
        "max_tokens".into(),
        json!(params.max_tokens.unwrap_or(default_max)),
    );
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert(
        "messages".into(),
        Value::Array(
            messages
                .into_iter()
                .map(|(role, content)| json!({"role": role, "content": content}))
                .collect(),
        ),
    );
    if !request.tools.is_empty() {
        let tools = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "name": tool.name,
                    "description": tool.description,
                    "input_schema": tool.parameters,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(budget) = budget {
        body.insert(
            "thinking".into(),
            json!({"type": "enabled", "budget_tokens": budget}),
        );
    }
    insert_sampling(&mut body, params, "stop_sequences");
    for (key, value) in &params.extra {
        body.insert(key.clone(), value.clone());
    }
    if stream {
        body.insert("stream".into(), json!(true));
    }
    Ok(Value::Object(body))
}

fn image_block(source: &ImageSource) -> Value {
    match source {
        ImageSource::Url { url } => json!({"type": "image", "source": {"type": "url", "url": url}}),
        ImageSource::Base64 { media_type, data } => json!({
            "type": "image",
            "source": {"type": "base64", "media_type": media_type, "data": data},
        }),
    }
}

fn encode_user(content: &[ContentPart]) -> Result<Vec<Value>, LlmError> {
    content
        .iter()
        .filter(|part| !matches!(part, ContentPart::Text { text } if text.is_empty()))
        .map(|part| match part {
            ContentPart::Text { text } => Ok(json!({"type": "text", "text": text})),
            ContentPart::Image { source } => Ok(image_block(source)),
            ContentPart::Audio { .. } => Err(LlmError::Configuration(
                "the Anthropic Messages API does not accept audio input".into(),
            )),
        })
        .collect()
}

fn encode_assistant(content: &[AssistantPart]) -> Vec<Value> {
    content
        .iter()
        .filter_map(|part| match part {
            AssistantPart::Text { text } if text.is_empty() => None,
            AssistantPart::Text { text } => Some(json!({"type": "text", "text": text})),
            // Signed thinking goes back byte for byte. Unsigned reasoning came from another
            // provider and would be rejected, so it is left out.
            // Another protocol's opaque state (Responses reasoning, an A2A context) is not
            // Anthropic's: left out too.
            AssistantPart::Thinking(Thinking::Text {
                signature: Some(signature),
                ..
            }) if super::foreign_opaque(signature) => None,
            AssistantPart::Thinking(Thinking::Text {
                text,
                signature: Some(signature),
            }) => Some(json!({"type": "thinking", "thinking": text, "signature": signature})),
            AssistantPart::Thinking(Thinking::Redacted { data }) if super::foreign_opaque(data) => {
                None
            }
            AssistantPart::Thinking(Thinking::Text {
                signature: None, ..
            }) => None,
            AssistantPart::Thinking(Thinking::Redacted { data }) => {
                Some(json!({"type": "redacted_thinking", "data": data}))
            }
            AssistantPart::ToolCall(call) => Some(json!({
                "type": "tool_use",
                "id": call.id,
                "name": call.name,
                "input": call.arguments,
            })),
        })
        .collect()
}

#[derive(Deserialize, Default, Clone, Copy)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
}

impl WireUsage {
    /// Merges a later report into this one (fields it lacks keep their values).
    fn merge(&mut self, later: WireUsage) {
        self.input_tokens = later.input_tokens.or(self.input_tokens);
        self.output_tokens = later.output_tokens.or(self.output_tokens);
        self.cache_creation_input_tokens = later
            .cache_creation_input_tokens
            .or(self.cache_creation_input_tokens);
        self.cache_read_input_tokens = later
            .cache_read_input_tokens
            .or(self.cache_read_input_tokens);
    }

    /// Anthropic counts cached prompt tokens apart from `input_tokens`; Agentry's input count
    /// includes them.
    fn update(self) -> UsageUpdate {
        let read = self.cache_read_input_tokens.unwrap_or(0);
        let created = self.cache_creation_input_tokens.unwrap_or(0);
        UsageUpdate {
            input_tokens: self.input_tokens.map(|input| input + read + created),
            output_tokens: self.output_tokens,
            cached_input_tokens: Some(read),
            cache_creation_input_tokens: Some(created),
            reasoning_tokens: None,
        }
    }
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireMessageStart,
    },
    ContentBlockStart {
        index: u64,
        content_block: Value,
    },
    ContentBlockDelta {
        index: u64,
        delta: Value,
    },
    ContentBlockStop {
        #[serde(default)]
        #[allow(dead_code)]
        index: Option<u64>,
    },
    MessageDelta {
        #[serde(default)]
        delta: Option<WireMessageDelta>,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop,
    Ping,
    Error,
    #[serde(other)]
    Unknown,
}

#[derive(Deserialize)]
struct WireMessageStart {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

/// Decodes an Anthropic SSE stream.
#[derive(Default)]
pub(crate) struct StreamDecoder {
    usage: WireUsage,
}

impl StreamDecoder {
    pub(crate) fn decode(
        &mut self,
        event: &str,
        data: &str,
        out: &mut Vec<Delta>,
    ) -> Result<(), LlmError> {
        if event == "error" {
            return Err(error_in_stream(Protocol::Anthropic, data.trim()));
        }
        if data.trim().is_empty() {
            return Ok(());
        }
        let event: WireEvent = parse_json(Protocol::Anthropic, data)?;
        match event {
            WireEvent::MessageStart { message } => {
                out.push(Delta::Meta {
                    id: message.id,
                    model: message.model,
                });
                if let Some(usage) = message.usage {
                    self.usage.merge(usage);
                    out.push(Delta::Usage(self.usage.update()));
                }
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => decode_block(index, &content_block, true, out),
            WireEvent::ContentBlockDelta { index, delta } => {
                let text = |field: &str| {
                    delta
                        .get(field)
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned()
                };
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => out.push(Delta::Text(text("text"))),
                    Some("thinking_delta") => out.push(Delta::Thinking(text("thinking"))),
                    Some("signature_delta") => {
                        out.push(Delta::ThinkingSignature(text("signature")));
                    }
                    Some("input_json_delta") => out.push(Delta::ToolCallArguments {
                        key: index,
                        fragment: text("partial_json"),
                    }),
                    _ => {}
                }
            }
            WireEvent::ContentBlockStop { .. } => out.push(Delta::BlockEnd),
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(usage) = usage {
                    self.usage.merge(usage);
                    out.push(Delta::Usage(self.usage.update()));
                }
                if let Some(reason) = delta.and_then(|d| d.stop_reason) {
                    out.push(Delta::Stop(StopReason::from_anthropic(&reason)));
                }
            }
            WireEvent::MessageStop => out.push(Delta::Done),
            WireEvent::Error => return Err(error_in_stream(Protocol::Anthropic, data.trim())),
            WireEvent::Ping | WireEvent::Unknown => {}
        }
        Ok(())
    }
}

/// Decodes a content block: at its start in a stream, or whole in a non-streamed body.
fn decode_block(index: u64, block: &Value, streaming: bool, out: &mut Vec<Delta>) {
    let field = |name: &str| block.get(name).and_then(Value::as_str).map(str::to_owned);
    match block.get("type").and_then(Value::as_str) {
        Some("text") => {
            out.push(Delta::BlockEnd);
            out.push(Delta::Text(field("text").unwrap_or_default()));
        }
        Some("thinking") => {
            out.push(Delta::BlockEnd);
            out.push(Delta::Thinking(field("thinking").unwrap_or_default()));
            if let Some(signature) = field("signature").filter(|s| !s.is_empty()) {
                out.push(Delta::ThinkingSignature(signature));
            }
        }
        Some("redacted_thinking") => {
            out.push(Delta::RedactedThinking(field("data").unwrap_or_default()));
        }
        Some("tool_use") => {
            let id = field("id");
            let name = field("name");
            // In a stream the input arrives as `input_json_delta` fragments; the `input`
            // field of the start event is an empty placeholder.
            if streaming {
                out.push(Delta::ToolCallStart {
                    key: index,
                    id,
                    name,
                });
            } else {
                out.push(Delta::ToolCallWhole {
                    key: index,
                    id,
                    name: name.unwrap_or_default(),
                    arguments: block.get("input").cloned().unwrap_or(Value::Null),
                });
            }
        }
        _ => {}
    }
}

#[derive(Deserialize)]
pub(crate) struct WireMessage {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    content: Vec<Value>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

/// Decodes a whole `message` body.
pub(crate) fn decode_body(message: WireMessage) -> Result<Vec<Delta>, LlmError> {
    let mut out = vec![Delta::Meta {
        id: message.id,
        model: message.model,
    }];
    for (index, block) in message.content.iter().enumerate() {
        decode_block(index as u64, block, false, &mut out);
    }
    out.push(Delta::BlockEnd);
    if let Some(usage) = message.usage {
        out.push(Delta::Usage(usage.update()));
    }
    if let Some(reason) = message.stop_reason {
        out.push(Delta::Stop(StopReason::from_anthropic(&reason)));
    }
    out.push(Delta::Done);
    Ok(out)
}
