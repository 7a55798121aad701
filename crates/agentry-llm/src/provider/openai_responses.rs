//! OpenAI's Responses API (`POST {base}/responses`), for models served only there (reasoning
//! models with encrypted reasoning, and servers that speak it).
//!
//! Requests are stateless (`store: false`): the whole conversation goes as `input` items —
//! messages (`input_text`, `input_image`; the assistant's `output_text`), `function_call` and
//! `function_call_output` items, and the model's earlier `reasoning` items with their
//! `encrypted_content`, asked for with `include: ["reasoning.encrypted_content"]`. A reasoning
//! item comes back as a thinking part (its summary the text) whose signature is the item's id and
//! encrypted content (`openai-responses:{"id", "encrypted_content"}`, kept byte for byte), or as
//! a redacted part when it has no summary; both are sent back as the same reasoning item on the
//! next turn, and never to another protocol (Anthropic leaves them out).
//!
//! Streams are named events: `response.created`, `response.output_text.delta`,
//! `response.reasoning_summary_text.delta`, `response.output_item.added` / `.done`,
//! `response.function_call_arguments.delta`, `response.completed` (usage; `incomplete` with
//! `max_output_tokens` is a length stop), `response.failed` and `error` (typed errors). Unknown
//! events are skipped.

use std::collections::HashSet;

use agentry_types::{AssistantPart, ContentPart, Message, StopReason, Thinking};
use serde_json::{Value, json};

use super::{Protocol, parse_body, parse_json};
use crate::config::ProviderConfig;
use crate::delta::{Delta, UsageUpdate};
use crate::error::{LlmError, ProviderError, truncate};
use crate::request::ModelRequest;

/// What starts the opaque signature of a reasoning item (so no other protocol takes it for its
/// own).
pub(crate) const OPAQUE_PREFIX: &str = "openai-responses:";

/// The opaque signature of a reasoning item: its id and encrypted content.
fn reasoning_signature(item: &Value) -> Option<String> {
    let encrypted = item.get("encrypted_content").and_then(Value::as_str)?;
    let kept = json!({
        "id": item.get("id").and_then(Value::as_str),
        "encrypted_content": encrypted,
    });
    Some(format!("{OPAQUE_PREFIX}{kept}"))
}

/// A reasoning item for the input, from a kept signature and summary (`None` when the
/// signature is not one of ours: another provider's reasoning is not sent).
fn reasoning_item(signature: &str, summary: &str) -> Option<Value> {
    let kept: Value = serde_json::from_str(signature.strip_prefix(OPAQUE_PREFIX)?).ok()?;
    let encrypted = kept.get("encrypted_content").and_then(Value::as_str)?;
    let mut item = json!({
        "type": "reasoning",
        "summary": if summary.is_empty() {
            json!([])
        } else {
            json!([{"type": "summary_text", "text": summary}])
        },
        "encrypted_content": encrypted,
    });
    if let Some(id) = kept.get("id").and_then(Value::as_str) {
        item["id"] = json!(id);
    }
    Some(item)
}

fn user_content(content: &[ContentPart]) -> Result<Value, LlmError> {
    content
        .iter()
        .map(|part| match part {
            ContentPart::Text { text } => Ok(json!({"type": "input_text", "text": text})),
            ContentPart::Image { source } => Ok(json!({
                "type": "input_image",
                "image_url": super::openai::image_url(source),
            })),
            ContentPart::Audio { .. } => Err(LlmError::Configuration(
                "the Responses API takes no audio input: transcribe it first (a speech model)"
                    .into(),
            )),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Value::Array)
}

/// The input items of one message, in order.
fn input_items(message: &Message, items: &mut Vec<Value>) -> Result<(), LlmError> {
    match message {
        Message::System { text } => {
            items.push(json!({"role": "system", "content": text}));
        }
        Message::User { content } => {
            items.push(json!({"role": "user", "content": user_content(content)?}));
        }
        Message::Assistant { content } => {
            let mut text = String::new();
            let flush = |text: &mut String, items: &mut Vec<Value>| {
                if !text.is_empty() {
                    items.push(json!({
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": std::mem::take(text)}],
                    }));
                }
            };
            for part in content {
                match part {
                    AssistantPart::Text { text: piece } => text.push_str(piece),
                    AssistantPart::Thinking(Thinking::Text {
                        text: summary,
                        signature: Some(signature),
                    }) => {
                        flush(&mut text, items);
                        items.extend(reasoning_item(signature, summary));
                    }
                    AssistantPart::Thinking(Thinking::Redacted { data }) => {
                        flush(&mut text, items);
                        items.extend(reasoning_item(data, ""));
                    }
                    // Reasoning without a signature (another provider's) is not sent.
                    AssistantPart::Thinking(Thinking::Text {
                        signature: None, ..
                    }) => {}
                    AssistantPart::ToolCall(call) => {
                        flush(&mut text, items);
                        items.push(json!({
                            "type": "function_call",
                            "call_id": call.id,
                            "name": call.name,
                            "arguments": call.arguments.to_string(),
                        }));
                    }
                }
            }
            flush(&mut text, items);
        }
        Message::Tool(result) => items.push(json!({
            "type": "function_call_output",
            "call_id": result.call_id,
            "output": result.text_content(),
        })),
    }
    Ok(())
}

/// Encodes the request body.
pub(crate) fn encode(
    config: &ProviderConfig,
    request: &ModelRequest,
    stream: bool,
) -> Result<Value, LlmError> {
    let mut input = Vec::with_capacity(request.messages.len());
    for message in &request.messages {
        input_items(message, &mut input)?;
    }
    let mut body = serde_json::Map::new();
    body.insert("model".into(), json!(config.model));
    body.insert("input".into(), Value::Array(input));
    if !request.tools.is_empty() {
        let tools: Vec<Value> = request
            .tools
            .iter()
            .map(|tool| {
                json!({
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                })
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    let params = &request.params;
    if let Some(max) = params.max_tokens {
        body.insert("max_output_tokens".into(), json!(max));
    }
    if let Some(temperature) = params.temperature {
        body.insert("temperature".into(), json!(temperature));
    }
    if let Some(top_p) = params.top_p {
        body.insert("top_p".into(), json!(top_p));
    }
    if let Some(thinking) = &params.thinking {
        let mut reasoning = json!({"summary": "auto"});
        if let Some(effort) = &thinking.effort {
            reasoning["effort"] = json!(effort);
        }
        body.insert("reasoning".into(), reasoning);
    }
    // Stateless: nothing is kept by the provider; the encrypted reasoning comes back to us.
    body.insert("store".into(), json!(false));
    body.insert("include".into(), json!(["reasoning.encrypted_content"]));
    for (key, value) in &params.extra {
        body.insert(key.clone(), value.clone());
    }
    body.insert("stream".into(), json!(stream));
    Ok(Value::Object(body))
}

/// The id and model of a `response` object.
fn meta(response: &Value) -> Delta {
    let text = |key: &str| response.get(key).and_then(Value::as_str).map(str::to_owned);
    Delta::Meta {
        id: text("id"),
        model: text("model"),
    }
}

/// The usage of a `response` object.
fn usage(response: &Value) -> Option<UsageUpdate> {
    let usage = response.get("usage").filter(|usage| usage.is_object())?;
    let number = |value: Option<&Value>| value.and_then(Value::as_u64);
    Some(UsageUpdate {
        input_tokens: number(usage.get("input_tokens")),
        output_tokens: number(usage.get("output_tokens")),
        cached_input_tokens: number(usage.pointer("/input_tokens_details/cached_tokens")),
        cache_creation_input_tokens: None,
        reasoning_tokens: number(usage.pointer("/output_tokens_details/reasoning_tokens")),
    })
}

/// Why a `response` stopped.
fn stop_reason(response: &Value, called: bool) -> StopReason {
    let reason = response
        .pointer("/incomplete_details/reason")
        .and_then(Value::as_str);
    match reason {
        Some("max_output_tokens") => StopReason::MaxTokens,
        Some("content_filter") => StopReason::ContentFilter,
        Some(other) => StopReason::Other(other.to_owned()),
        None if called => StopReason::ToolUse,
        None => StopReason::EndTurn,
    }
}

/// A failed response's (or an `error` event's) typed error.
fn failure(payload: &Value) -> LlmError {
    let error = payload
        .pointer("/response/error")
        .or_else(|| payload.get("error"))
        .filter(|error| error.is_object())
        .cloned()
        .unwrap_or_else(|| payload.clone());
    // A failed response names a code; it decides whether a retry may help: a server error or
    // a rate limit may pass, anything else (an invalid prompt or image) will not.
    let text = |key: &str| error.get(key).and_then(Value::as_str).map(str::to_owned);
    let code = text("code");
    let message = text("message").unwrap_or_else(|| "the response failed".to_owned());
    let retry = matches!(
        code.as_deref(),
        Some("server_error" | "rate_limit_exceeded")
    );
    let mut failed = ProviderError::new(
        Protocol::OpenAiResponses.name(),
        None,
        text("type"),
        code,
        message,
        &payload.to_string(),
    );
    failed.should_retry = Some(retry);
    failed.into()
}

/// The deltas of a finished output item that streams do not send piece by piece (and, for a
/// whole body, every item).
fn item_deltas(item: &Value, key: u64, whole: bool, out: &mut Vec<Delta>) {
    match item.get("type").and_then(Value::as_str) {
        Some("reasoning") => {
            let summary: String = item
                .get("summary")
                .and_then(Value::as_array)
                .map(|parts| {
                    parts
                        .iter()
                        .filter_map(|part| part.get("text").and_then(Value::as_str))
                        .collect::<Vec<_>>()
                        .join("\n\n")
                })
                .unwrap_or_default();
            if whole && !summary.is_empty() {
                out.push(Delta::Thinking(summary.clone()));
            }
            match reasoning_signature(item) {
                Some(signature) if !summary.is_empty() => {
                    out.push(Delta::ThinkingSignature(signature));
                }
                Some(signature) => out.push(Delta::RedactedThinking(signature)),
                None => {}
            }
            out.push(Delta::BlockEnd);
        }
        Some("message") if whole => {
            for part in item
                .get("content")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(text) = part.get("text").and_then(Value::as_str) {
                    out.push(Delta::Text(text.to_owned()));
                }
            }
            out.push(Delta::BlockEnd);
        }
        Some("message") => out.push(Delta::BlockEnd),
        Some("function_call") if whole => {
            let arguments = item
                .get("arguments")
                .and_then(Value::as_str)
                .unwrap_or("{}");
            out.push(Delta::ToolCallStart {
                key,
                id: item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                name: item.get("name").and_then(Value::as_str).map(str::to_owned),
            });
            out.push(Delta::ToolCallArguments {
                key,
                fragment: arguments.to_owned(),
            });
        }
        _ => {}
    }
}

/// A stateful decoder of one streamed response.
#[derive(Debug, Default)]
pub(crate) struct StreamDecoder {
    /// Function calls whose arguments came as deltas.
    argued: HashSet<u64>,
    /// Whether the model called a function.
    called: bool,
}

impl StreamDecoder {
    /// Decodes one named SSE event.
    pub(crate) fn decode(
        &mut self,
        event: &str,
        data: &str,
        out: &mut Vec<Delta>,
    ) -> Result<(), LlmError> {
        if data.trim().is_empty() || data.trim() == "[DONE]" {
            return Ok(());
        }
        let payload: Value = parse_json(Protocol::OpenAiResponses, data)?;
        let kind = payload
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event)
            .to_owned();
        let key = payload
            .get("output_index")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        match kind.as_str() {
            "response.created" => {
                out.push(meta(payload.get("response").unwrap_or(&Value::Null)));
            }
            "response.output_text.delta" | "response.refusal.delta" => {
                if let Some(delta) = payload.get("delta").and_then(Value::as_str) {
                    out.push(Delta::Text(delta.to_owned()));
                }
            }
            "response.reasoning_summary_text.delta" | "response.reasoning_text.delta" => {
                if let Some(delta) = payload.get("delta").and_then(Value::as_str) {
                    out.push(Delta::Thinking(delta.to_owned()));
                }
            }
            "response.reasoning_summary_part.added"
                if payload.get("summary_index").and_then(Value::as_u64) > Some(0) =>
            {
                out.push(Delta::Thinking("\n\n".into()));
            }
            "response.output_item.added" => {
                let item = payload.get("item").cloned().unwrap_or(Value::Null);
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    self.called = true;
                    out.push(Delta::ToolCallStart {
                        key,
                        id: item
                            .get("call_id")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        name: item.get("name").and_then(Value::as_str).map(str::to_owned),
                    });
                }
            }
            "response.function_call_arguments.delta" => {
                if let Some(delta) = payload.get("delta").and_then(Value::as_str) {
                    self.argued.insert(key);
                    out.push(Delta::ToolCallArguments {
                        key,
                        fragment: delta.to_owned(),
                    });
                }
            }
            "response.output_item.done" => {
                let item = payload.get("item").cloned().unwrap_or(Value::Null);
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    self.called = true;
                    if !self.argued.contains(&key) {
                        // Arguments that never came as deltas come whole here.
                        item_deltas(&item, key, true, out);
                    }
                } else {
                    item_deltas(&item, key, false, out);
                }
            }
            "response.completed" | "response.incomplete" => {
                let response = payload.get("response").cloned().unwrap_or(Value::Null);
                if let Some(usage) = usage(&response) {
                    out.push(Delta::Usage(usage));
                }
                out.push(Delta::Stop(stop_reason(&response, self.called)));
                out.push(Delta::Done);
            }
            "response.failed" | "error" => return Err(failure(&payload)),
            _ => {}
        }
        Ok(())
    }
}

/// Decodes a whole (non-streamed) response.
pub(crate) fn decode_body(body: &[u8]) -> Result<Vec<Delta>, LlmError> {
    let response: Value = parse_body(Protocol::OpenAiResponses, body)?;
    if response.get("status").and_then(Value::as_str) == Some("failed")
        || response.get("error").is_some_and(|error| error.is_object())
    {
        return Err(failure(&json!({"response": response})));
    }
    let Some(output) = response.get("output").and_then(Value::as_array) else {
        return Err(LlmError::MalformedResponse {
            detail: "openai-responses body has no `output`".into(),
            raw: truncate(&String::from_utf8_lossy(body), 1024),
        });
    };
    let mut out = vec![meta(&response)];
    let mut called = false;
    for (index, item) in output.iter().enumerate() {
        called |= item.get("type").and_then(Value::as_str) == Some("function_call");
        item_deltas(item, index as u64, true, &mut out);
    }
    if let Some(usage) = usage(&response) {
        out.push(Delta::Usage(usage));
    }
    out.push(Delta::Stop(stop_reason(&response, called)));
    out.push(Delta::Done);
    Ok(out)
}
