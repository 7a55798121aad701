//! Ollama's native `/api/chat` (NDJSON).
//!
//! `think` goes at the top level and sampling parameters under `options`; images travel as raw
//! base64; tool calls arrive whole with object arguments and no ids, so each gets a stable id
//! derived from the response; a mid-stream `{"error": …}` line under HTTP 200 is a typed error.

use agentry_types::{AssistantPart, ContentPart, ImageSource, Message, StopReason, Thinking};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Protocol, error_in_stream, function_tools, insert_sampling, parse_json};
use crate::accumulator::derived_call_id;
use crate::config::ProviderConfig;
use crate::delta::{Delta, UsageUpdate};
use crate::error::LlmError;
use crate::request::ModelRequest;

/// Encodes the request body.
pub(crate) fn encode(
    config: &ProviderConfig,
    request: &ModelRequest,
    stream: bool,
) -> Result<Value, LlmError> {
    let mut messages = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        messages.push(encode_message(message)?);
    }
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        body.insert("tools".into(), function_tools(&request.tools));
    }
    body.insert("stream".into(), json!(stream));
    let params = &request.params;
    if params.thinking.is_some() {
        body.insert("think".into(), json!(true));
    }
    let mut options = serde_json::Map::new();
    if let Some(max) = params.max_tokens {
        options.insert("num_predict".into(), json!(max));
    }
    insert_sampling(&mut options, params, "stop");
    for (key, value) in &params.extra {
        // Top-level request fields stay at the top; everything else is a model option.
        if matches!(key.as_str(), "format" | "keep_alive" | "think") {
            body.insert(key.clone(), value.clone());
        } else {
            options.insert(key.clone(), value.clone());
        }
    }
    if !options.is_empty() {
        body.insert("options".into(), Value::Object(options));
    }
    Ok(Value::Object(body))
}

fn encode_message(message: &Message) -> Result<Value, LlmError> {
    Ok(match message {
        Message::System { text } => json!({"role": "system", "content": text}),
        Message::User { content } => {
            let mut text = String::new();
            let mut images = Vec::new();
            for part in content {
                match part {
                    ContentPart::Text { text: t } => {
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(t);
                    }
                    ContentPart::Image {
                        source: ImageSource::Base64 { data, .. },
                    } => images.push(json!(data)),
                    ContentPart::Image {
                        source: ImageSource::Url { .. },
                    } => {
                        return Err(LlmError::Configuration(
                            "Ollama accepts only inline (base64) images, not image URLs".into(),
                        ));
                    }
                    ContentPart::Audio { .. } => {
                        return Err(LlmError::Configuration(
                            "Ollama's /api/chat does not accept audio input".into(),
                        ));
                    }
                }
            }
            let mut out = json!({"role": "user", "content": text});
            if !images.is_empty() {
                out["images"] = Value::Array(images);
            }
            out
        }
        Message::Assistant { content } => {
            let mut text = String::new();
            let mut thinking = String::new();
            let mut calls = Vec::new();
            for part in content {
                match part {
                    AssistantPart::Text { text: t } => text.push_str(t),
                    AssistantPart::Thinking(Thinking::Text { text: t, .. }) => thinking.push_str(t),
                    AssistantPart::Thinking(Thinking::Redacted { .. }) => {}
                    AssistantPart::ToolCall(call) => calls.push(json!({
                        "function": {"name": call.name, "arguments": call.arguments},
                    })),
                }
            }
            let mut out = json!({"role": "assistant", "content": text});
            if !thinking.is_empty() {
                out["thinking"] = json!(thinking);
            }
            if !calls.is_empty() {
                out["tool_calls"] = Value::Array(calls);
            }
            out
        }
        Message::Tool(result) => {
            let mut out = json!({"role": "tool", "content": result.text_content()});
            if let Some(name) = &result.name {
                out["tool_name"] = json!(name);
            }
            out
        }
    })
}

#[derive(Deserialize)]
struct Line {
    /// Set when the server fails mid-stream (under HTTP 200).
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    created_at: Option<String>,
    #[serde(default)]
    message: Option<WireMessage>,
    /// `/api/generate` puts the text here.
    #[serde(default)]
    response: Option<String>,
    #[serde(default)]
    done: bool,
    #[serde(default)]
    done_reason: Option<String>,
    #[serde(default)]
    prompt_eval_count: Option<u64>,
    #[serde(default)]
    eval_count: Option<u64>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    #[serde(default)]
    id: Option<String>,
    function: WireFunction,
}

#[derive(Deserialize)]
struct WireFunction {
    name: String,
    #[serde(default)]
    arguments: Value,
}

/// Decodes an Ollama NDJSON stream, one line at a time.
#[derive(Default)]
pub(crate) struct StreamDecoder {
    meta_sent: bool,
    /// The first line's timestamp: unique per response, the same on every replay.
    salt: String,
    tool_calls: u64,
}

impl StreamDecoder {
    pub(crate) fn decode(&mut self, line: &str, out: &mut Vec<Delta>) -> Result<(), LlmError> {
        let text = line.trim();
        if text.is_empty() {
            return Ok(());
        }
        let line: Line = parse_json(Protocol::Ollama, text)?;
        if line.error.as_ref().is_some_and(|e| !e.is_null()) {
            return Err(error_in_stream(Protocol::Ollama, text));
        }
        if !self.meta_sent {
            self.meta_sent = true;
            self.salt = line.created_at.clone().unwrap_or_default();
            out.push(Delta::Meta {
                id: None,
                model: line.model.clone(),
            });
        }
        self.decode_line(line, out);
        Ok(())
    }

    fn decode_line(&mut self, line: Line, out: &mut Vec<Delta>) {
        if let Some(message) = line.message {
            if let Some(thinking) = message.thinking {
                out.push(Delta::Thinking(thinking));
            }
            if let Some(content) = message.content {
                out.push(Delta::Text(content));
            }
            for call in message.tool_calls.unwrap_or_default() {
                let key = self.tool_calls;
                self.tool_calls += 1;
                let arguments = match call.function.arguments {
                    // Some builds send the arguments as JSON text.
                    Value::String(text) => {
                        serde_json::from_str(&text).unwrap_or(Value::String(text))
                    }
                    other => other,
                };
                let id = call.id.filter(|id| !id.is_empty()).unwrap_or_else(|| {
                    derived_call_id(
                        &self.salt,
                        key as usize,
                        &call.function.name,
                        &arguments.to_string(),
                    )
                });
                out.push(Delta::ToolCallWhole {
                    key,
                    id: Some(id),
                    name: call.function.name,
                    arguments,
                });
            }
        }
        if let Some(text) = line.response {
            out.push(Delta::Text(text));
        }
        if line.done {
            out.push(Delta::Usage(UsageUpdate {
                input_tokens: line.prompt_eval_count,
                output_tokens: line.eval_count,
                ..UsageUpdate::default()
            }));
            let reason = line.done_reason.as_deref().unwrap_or("stop");
            out.push(Delta::Stop(StopReason::from_ollama(reason)));
            out.push(Delta::Done);
        }
    }
}

/// Decodes a whole (`"stream": false`) body: one line, marked done.
pub(crate) fn decode_body(body: &[u8]) -> Result<Vec<Delta>, LlmError> {
    let text = std::str::from_utf8(body).map_err(|error| LlmError::MalformedResponse {
        detail: format!("ollama response body is not UTF-8: {error}"),
        raw: String::new(),
    })?;
    let mut out = Vec::new();
    StreamDecoder::default().decode(text, &mut out)?;
    if !out.contains(&Delta::Done) {
        return Err(LlmError::MalformedResponse {
            detail: "ollama response is not marked done".into(),
            raw: crate::error::truncate(text, 1024),
        });
    }
    Ok(out)
}
