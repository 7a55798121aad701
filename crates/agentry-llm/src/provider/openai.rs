//! OpenAI chat completions, and the OpenAI-compatible servers (vLLM, llama.cpp, LM Studio,
//! OpenRouter, DeepSeek, Groq, Ollama's `/v1`).
//!
//! Parsing is lenient on purpose: reasoning arrives as `reasoning_content`, `reasoning` or
//! `thinking`; usage comes in a last chunk with empty `choices` or as `usage: null` on every
//! chunk; ids and names may repeat on every tool delta; legacy `function_call` is understood;
//! error codes may be numbers; unknown fields are ignored.

use agentry_types::{
    AssistantPart, ContentPart, ImageSource, Message, StopReason, Thinking, ToolResultPart,
};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Protocol, error_in_stream, function_tools, insert_sampling, parse_json};
use crate::config::ProviderConfig;
use crate::delta::{Delta, UsageUpdate};
use crate::error::LlmError;
use crate::request::ModelRequest;

/// Key used for a legacy `function_call`, which has no index.
const LEGACY_FUNCTION_KEY: u64 = u64::MAX;

/// Encodes the request body.
pub(crate) fn encode(
    config: &ProviderConfig,
    request: &ModelRequest,
    stream: bool,
) -> Result<Value, LlmError> {
    let mut messages = Vec::with_capacity(request.messages.len());
    let mut tool_images: Vec<Value> = Vec::new();
    for message in &request.messages {
        if !matches!(message, Message::Tool(_)) && !tool_images.is_empty() {
            messages.push(tool_images_message(std::mem::take(&mut tool_images)));
        }
        if let (Message::Tool(result), true) = (message, config.openai.tool_images_as_user) {
            tool_images.extend(result.content.iter().filter_map(|part| match part {
                ToolResultPart::Image { source } => {
                    Some(json!({"type": "image_url", "image_url": {"url": image_url(source)}}))
                }
                _ => None,
            }));
        }
        messages.push(encode_message(message, config.openai.replay_reasoning));
    }
    if !tool_images.is_empty() {
        messages.push(tool_images_message(tool_images));
    }
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert("messages".into(), Value::Array(messages));
    if !request.tools.is_empty() {
        body.insert("tools".into(), function_tools(&request.tools));
    }
    let params = &request.params;
    if let Some(max) = params.max_tokens {
        body.insert(config.openai_max_tokens_field().into(), json!(max));
    }
    insert_sampling(&mut body, params, "stop");
    if let Some(effort) = params.thinking.as_ref().and_then(|t| t.effort.as_ref()) {
        body.insert("reasoning_effort".into(), json!(effort));
    }
    for (key, value) in &params.extra {
        body.insert(key.clone(), value.clone());
    }
    body.insert("stream".into(), json!(stream));
    if stream {
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Ok(Value::Object(body))
}

/// The user message that carries the tool results' images, after the tool messages.
fn tool_images_message(images: Vec<Value>) -> Value {
    let mut content = vec![json!({
        "type": "text",
        "text": "The images the tool results above returned, in order:",
    })];
    content.extend(images);
    json!({"role": "user", "content": content})
}

fn encode_message(message: &Message, replay_reasoning: bool) -> Value {
    match message {
        Message::System { text } => json!({"role": "system", "content": text}),
        Message::User { content } => {
            json!({"role": "user", "content": encode_user_content(content)})
        }
        Message::Assistant { content } => {
            let mut text = String::new();
            let mut reasoning = String::new();
            let mut calls = Vec::new();
            for part in content {
                match part {
                    AssistantPart::Text { text: t } => text.push_str(t),
                    AssistantPart::Thinking(Thinking::Text { text: t, .. }) => {
                        reasoning.push_str(t)
                    }
                    AssistantPart::Thinking(Thinking::Redacted { .. }) => {}
                    AssistantPart::ToolCall(call) => calls.push(json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments.to_string()},
                    })),
                }
            }
            let mut out = serde_json::Map::new();
            out.insert("role".into(), json!("assistant"));
            out.insert(
                "content".into(),
                if text.is_empty() && !calls.is_empty() {
                    Value::Null
                } else {
                    json!(text)
                },
            );
            if !calls.is_empty() {
                out.insert("tool_calls".into(), Value::Array(calls));
            }
            if replay_reasoning && !reasoning.is_empty() {
                out.insert("reasoning_content".into(), json!(reasoning));
            }
            Value::Object(out)
        }
        Message::Tool(result) => json!({
            "role": "tool",
            "tool_call_id": result.call_id,
            "content": result.text_content(),
        }),
    }
}

fn encode_user_content(content: &[ContentPart]) -> Value {
    if let [ContentPart::Text { text }] = content {
        return json!(text);
    }
    let parts = content
        .iter()
        .map(|part| match part {
            ContentPart::Text { text } => json!({"type": "text", "text": text}),
            ContentPart::Image { source } => {
                json!({"type": "image_url", "image_url": {"url": image_url(source)}})
            }
            ContentPart::Audio { format, data } => {
                json!({"type": "input_audio", "input_audio": {"data": data, "format": format}})
            }
        })
        .collect();
    Value::Array(parts)
}

/// An image as a URL, inline bytes as a `data:` URL.
pub(crate) fn image_url(source: &ImageSource) -> String {
    match source {
        ImageSource::Url { url } => url.clone(),
        ImageSource::Base64 { media_type, data } => format!("data:{media_type};base64,{data}"),
    }
}

#[derive(Deserialize)]
pub(crate) struct Chunk {
    /// Set when a server reports an error inside the stream.
    #[serde(default)]
    error: Option<Value>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Option<Vec<Choice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, alias = "message")]
    delta: Option<WireMessage>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireMessage {
    #[serde(default)]
    content: Option<Value>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    thinking: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
    #[serde(default)]
    function_call: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireToolCall {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<Value>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
    /// DeepSeek's spelling of cached prompt tokens.
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    fn update(&self) -> UsageUpdate {
        UsageUpdate {
            input_tokens: self.prompt_tokens,
            output_tokens: self.completion_tokens,
            cached_input_tokens: self
                .prompt_tokens_details
                .as_ref()
                .and_then(|d| d.cached_tokens)
                .or(self.prompt_cache_hit_tokens),
            cache_creation_input_tokens: None,
            reasoning_tokens: self
                .completion_tokens_details
                .as_ref()
                .and_then(|d| d.reasoning_tokens),
        }
    }
}

/// Decodes an OpenAI SSE stream.
#[derive(Default)]
pub(crate) struct StreamDecoder {
    meta_sent: bool,
}

impl StreamDecoder {
    pub(crate) fn decode(&mut self, data: &str, out: &mut Vec<Delta>) -> Result<(), LlmError> {
        let data = data.trim();
        if data == "[DONE]" {
            out.push(Delta::Done);
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        let chunk: Chunk = parse_json(Protocol::OpenAi, data)?;
        if chunk.error.as_ref().is_some_and(|e| !e.is_null()) {
            return Err(error_in_stream(Protocol::OpenAi, data));
        }
        if !self.meta_sent {
            self.meta_sent = true;
            out.push(Delta::Meta {
                id: chunk.id,
                model: chunk.model,
            });
        }
        decode_choices(chunk.choices.unwrap_or_default(), out);
        if let Some(usage) = chunk.usage {
            out.push(Delta::Usage(usage.update()));
        }
        Ok(())
    }
}

fn decode_choices(choices: Vec<Choice>, out: &mut Vec<Delta>) {
    // Only the first choice is used (Agentry never asks for n > 1).
    let Some(choice) = choices.into_iter().find(|c| c.index.unwrap_or(0) == 0) else {
        return;
    };
    if let Some(message) = choice.delta {
        decode_message(message, out);
    }
    if let Some(reason) = choice.finish_reason.filter(|r| !r.is_empty()) {
        out.push(Delta::Stop(StopReason::from_openai(&reason)));
    }
}

fn decode_message(message: WireMessage, out: &mut Vec<Delta>) {
    let reasoning = message
        .reasoning_content
        .or(message.reasoning)
        .or(message.thinking);
    if let Some(reasoning) = reasoning.filter(|r| !r.is_empty()) {
        out.push(Delta::Thinking(reasoning));
    }
    match message.content {
        Some(Value::String(text)) if !text.is_empty() => out.push(Delta::Text(text)),
        // Some servers send content as an array of text parts.
        Some(Value::Array(parts)) => {
            for part in parts {
                if let Some(text) = part.get("text").and_then(Value::as_str) {
                    out.push(Delta::Text(text.to_owned()));
                }
            }
        }
        _ => {}
    }
    if let Some(refusal) = message.refusal.filter(|r| !r.is_empty()) {
        out.push(Delta::Text(refusal));
    }
    for (position, call) in message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let key = call.index.unwrap_or(position as u64);
        decode_function(key, call.id, call.function, out);
    }
    if let Some(function) = message.function_call {
        decode_function(LEGACY_FUNCTION_KEY, None, Some(function), out);
    }
}

fn decode_function(
    key: u64,
    id: Option<String>,
    function: Option<WireFunction>,
    out: &mut Vec<Delta>,
) {
    let (name, arguments) = match function {
        Some(function) => (function.name, function.arguments),
        None => (None, None),
    };
    match arguments {
        // Some compatible servers send the arguments as an object rather than JSON text.
        Some(value @ Value::Object(_)) => out.push(Delta::ToolCallWhole {
            key,
            id,
            name: name.unwrap_or_default(),
            arguments: value,
        }),
        arguments => {
            if id.is_some() || name.is_some() {
                out.push(Delta::ToolCallStart { key, id, name });
            }
            let fragment = match arguments {
                Some(Value::String(text)) => text,
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            out.push(Delta::ToolCallArguments { key, fragment });
        }
    }
}

/// Decodes a whole `chat.completion` body.
pub(crate) fn decode_body(chunk: Chunk) -> Result<Vec<Delta>, LlmError> {
    let mut out = vec![Delta::Meta {
        id: chunk.id,
        model: chunk.model,
    }];
    let choices = chunk.choices.unwrap_or_default();
    if choices.is_empty() {
        let detail = match chunk.error {
            Some(error) => format!("openai response has no choices but an error: {error}"),
            None => "openai response has no choices".into(),
        };
        return Err(LlmError::MalformedResponse {
            detail,
            raw: String::new(),
        });
    }
    decode_choices(choices, &mut out);
    if let Some(usage) = chunk.usage {
        out.push(Delta::Usage(usage.update()));
    }
    out.push(Delta::Done);
    Ok(out)
}
