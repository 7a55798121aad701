//! Folds normalised deltas into live events and the final response.
//!
//! One accumulator serves every provider. It keeps the assistant message's parts in the order
//! the model produced them, merges tool-call fragments by the provider's index (tolerating ids
//! and names repeated on every fragment), and at the end parses each call's arguments. A stream
//! that never said it was complete, or arguments that do not parse, become typed errors: a call
//! is never silently truncated.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use agentry_types::{
    AssistantPart, ModelEvent, ModelResponse, StopReason, Thinking, ToolCall, Usage,
};

use crate::delta::{Delta, UsageUpdate};
use crate::error::{LlmError, truncate};

/// A part of the message under construction.
#[derive(Debug)]
enum Part {
    Text(String),
    Thinking {
        text: String,
        signature: Option<String>,
    },
    Redacted(String),
    Tool(ToolSlot),
}

#[derive(Debug)]
struct ToolSlot {
    /// Position among this response's tool calls.
    position: usize,
    id: Option<String>,
    name: String,
    arguments: String,
    whole: Option<serde_json::Value>,
}

/// Accumulates one response.
#[derive(Debug)]
pub(crate) struct Accumulator {
    id: Option<String>,
    model: Option<String>,
    parts: Vec<Part>,
    /// The text or thinking part that further fragments extend.
    open: Option<usize>,
    /// Provider index → position in `parts`.
    tools: HashMap<u64, usize>,
    tool_count: usize,
    usage: Usage,
    stop: Option<StopReason>,
    done: bool,
}

impl Accumulator {
    pub(crate) fn new() -> Self {
        Self {
            id: None,
            model: None,
            parts: Vec::new(),
            open: None,
            tools: HashMap::new(),
            tool_count: 0,
            usage: Usage::default(),
            stop: None,
            done: false,
        }
    }

    /// Whether the provider has said the response is complete.
    pub(crate) fn is_done(&self) -> bool {
        self.done
    }

    /// Applies one delta; live events for display are appended to `out`.
    pub(crate) fn push(&mut self, delta: Delta, out: &mut Vec<ModelEvent>) {
        match delta {
            Delta::Meta { id, model } => {
                self.id = self.id.take().or(id);
                self.model = self.model.take().or(model);
            }
            Delta::Text(text) => {
                if text.is_empty() {
                    return;
                }
                match self.open.and_then(|i| self.parts.get_mut(i)) {
                    Some(Part::Text(existing)) => existing.push_str(&text),
                    _ => self.open_part(Part::Text(text.clone())),
                }
                out.push(ModelEvent::TextDelta { text });
            }
            Delta::Thinking(text) => {
                if text.is_empty() {
                    return;
                }
                match self.open.and_then(|i| self.parts.get_mut(i)) {
                    Some(Part::Thinking { text: existing, .. }) => existing.push_str(&text),
                    _ => self.open_part(Part::Thinking {
                        text: text.clone(),
                        signature: None,
                    }),
                }
                out.push(ModelEvent::ThinkingDelta { text });
            }
            Delta::ThinkingSignature(signature) => {
                match self.open.and_then(|i| self.parts.get_mut(i)) {
                    Some(Part::Thinking {
                        signature: slot, ..
                    }) => {
                        slot.get_or_insert_with(String::new).push_str(&signature);
                    }
                    _ => self.parts.push(Part::Thinking {
                        text: String::new(),
                        signature: Some(signature),
                    }),
                }
            }
            Delta::RedactedThinking(data) => {
                self.open = None;
                self.parts.push(Part::Redacted(data));
            }
            Delta::BlockEnd => self.open = None,
            Delta::ToolCallStart { key, id, name } => self.tool_start(key, id, name, out),
            Delta::ToolCallArguments { key, fragment } => {
                let index = self.tool_slot(key);
                if let Some(Part::Tool(slot)) = self.parts.get_mut(index) {
                    if fragment.is_empty() {
                        return;
                    }
                    slot.arguments.push_str(&fragment);
                    out.push(ModelEvent::ToolCallDelta {
                        index: slot.position,
                        id: None,
                        name: None,
                        arguments: fragment,
                    });
                }
            }
            Delta::ToolCallWhole {
                key,
                id,
                name,
                arguments,
            } => {
                self.open = None;
                let position = self.tool_count;
                self.tool_count += 1;
                out.push(ModelEvent::ToolCallDelta {
                    index: position,
                    id: id.clone(),
                    name: Some(name.clone()),
                    arguments: arguments.to_string(),
                });
                self.parts.push(Part::Tool(ToolSlot {
                    position,
                    id,
                    name,
                    arguments: String::new(),
                    whole: Some(arguments),
                }));
                self.tools.insert(key, self.parts.len() - 1);
            }
            Delta::Usage(update) => self.apply_usage(update),
            Delta::Stop(reason) => self.stop = Some(reason),
            Delta::Done => self.done = true,
        }
    }

    fn open_part(&mut self, part: Part) {
        self.parts.push(part);
        self.open = Some(self.parts.len() - 1);
    }

    /// The `parts` index of the tool call with this provider key, made if new.
    fn tool_slot(&mut self, key: u64) -> usize {
        if let Some(&index) = self.tools.get(&key) {
            return index;
        }
        self.new_tool_slot(key, None, String::new())
    }

    fn new_tool_slot(&mut self, key: u64, id: Option<String>, name: String) -> usize {
        self.open = None;
        let position = self.tool_count;
        self.tool_count += 1;
        self.parts.push(Part::Tool(ToolSlot {
            position,
            id,
            name,
            arguments: String::new(),
            whole: None,
        }));
        let index = self.parts.len() - 1;
        self.tools.insert(key, index);
        index
    }

    fn tool_start(
        &mut self,
        key: u64,
        id: Option<String>,
        name: Option<String>,
        out: &mut Vec<ModelEvent>,
    ) {
        let id = id.filter(|id| !id.is_empty());
        let name = name.filter(|name| !name.is_empty());
        if let Some(&index) = self.tools.get(&key)
            && let Some(Part::Tool(slot)) = self.parts.get_mut(index)
        {
            {
                // Some servers send every call at index 0: a different id means a new call.
                let new_call = matches!((&slot.id, &id), (Some(old), Some(new)) if old != new);
                if !new_call {
                    let mut changed = false;
                    if slot.id.is_none() && id.is_some() {
                        slot.id.clone_from(&id);
                        changed = true;
                    }
                    if let Some(name) = &name {
                        // Servers that repeat the name on every fragment send it whole; the
                        // rare ones that stream it send pieces that differ.
                        if slot.name != *name {
                            slot.name.push_str(name);
                            changed = true;
                        }
                    }
                    if changed {
                        out.push(ModelEvent::ToolCallDelta {
                            index: slot.position,
                            id,
                            name,
                            arguments: String::new(),
                        });
                    }
                    return;
                }
            }
        }
        let index = self.new_tool_slot(key, id.clone(), name.clone().unwrap_or_default());
        if let Some(Part::Tool(slot)) = self.parts.get(index) {
            out.push(ModelEvent::ToolCallDelta {
                index: slot.position,
                id,
                name,
                arguments: String::new(),
            });
        }
    }

    fn apply_usage(&mut self, update: UsageUpdate) {
        let usage = &mut self.usage;
        let pairs = [
            (&mut usage.input_tokens, update.input_tokens),
            (&mut usage.output_tokens, update.output_tokens),
            (&mut usage.cached_input_tokens, update.cached_input_tokens),
            (
                &mut usage.cache_creation_input_tokens,
                update.cache_creation_input_tokens,
            ),
            (&mut usage.reasoning_tokens, update.reasoning_tokens),
        ];
        for (slot, value) in pairs {
            if let Some(value) = value {
                *slot = value;
            }
        }
    }

    /// Ends the response: parses every tool call, appends the complete-call events and the
    /// final [`ModelEvent::Completed`] to `out`, and returns the response.
    pub(crate) fn finish(self, out: &mut Vec<ModelEvent>) -> Result<ModelResponse, LlmError> {
        if !self.done && self.stop.is_none() {
            let detail = if self.parts.is_empty() {
                "no content and no end marker".to_owned()
            } else {
                format!(
                    "{} part(s) received, then the stream stopped without an end marker",
                    self.parts.len()
                )
            };
            return Err(LlmError::StreamEndedEarly { detail });
        }
        let has_tools = self.tool_count > 0;
        let stop = match self.stop {
            None | Some(StopReason::EndTurn) if has_tools => StopReason::ToolUse,
            None => StopReason::EndTurn,
            Some(reason) => reason,
        };
        let cut_off = stop == StopReason::MaxTokens;
        let response_id = self.id.clone().unwrap_or_default();
        let mut content = Vec::with_capacity(self.parts.len());
        for part in self.parts {
            content.push(match part {
                Part::Text(text) => AssistantPart::Text { text },
                Part::Thinking { text, signature } => {
                    AssistantPart::Thinking(Thinking::Text { text, signature })
                }
                Part::Redacted(data) => AssistantPart::Thinking(Thinking::Redacted { data }),
                Part::Tool(slot) => {
                    let index = slot.position;
                    let call = finish_tool(slot, &response_id, cut_off)?;
                    out.push(ModelEvent::ToolCall {
                        index,
                        call: call.clone(),
                    });
                    AssistantPart::ToolCall(call)
                }
            });
        }
        let response = ModelResponse {
            id: self.id,
            model: self.model,
            content,
            usage: self.usage,
            stop_reason: stop,
        };
        out.push(ModelEvent::Completed {
            response: response.clone(),
        });
        Ok(response)
    }
}

fn finish_tool(slot: ToolSlot, response_id: &str, cut_off: bool) -> Result<ToolCall, LlmError> {
    let ToolSlot {
        position,
        id,
        name,
        arguments,
        whole,
    } = slot;
    let id = id.unwrap_or_else(|| derived_call_id(response_id, position, &name, &arguments));
    if name.is_empty() {
        return Err(LlmError::MalformedResponse {
            detail: format!("tool call {id} has no name"),
            raw: truncate(&arguments, 512),
        });
    }
    let invalid = |detail: String| LlmError::InvalidToolArguments {
        id: id.clone(),
        name: name.clone(),
        raw: truncate(&arguments, 2048),
        cut_off,
        detail,
    };
    let value = match whole {
        Some(value) => value,
        // A tool with no arguments is still a call (Anthropic sends no fragment, or "").
        None if arguments.trim().is_empty() => serde_json::Value::Object(Default::default()),
        None => serde_json::from_str(&arguments).map_err(|error| invalid(error.to_string()))?,
    };
    let value = match value {
        serde_json::Value::Null => serde_json::Value::Object(Default::default()),
        serde_json::Value::Object(_) => value,
        other => {
            return Err(invalid(format!(
                "expected a JSON object, got {}",
                json_kind(&other)
            )));
        }
    };
    Ok(ToolCall {
        id,
        name,
        arguments: value,
    })
}

fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A stable id for a call the provider gave none: the same stream always yields the same id,
/// and calls of different responses differ.
pub(crate) fn derived_call_id(salt: &str, position: usize, name: &str, arguments: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (salt, position, name, arguments).hash(&mut hasher);
    format!("call_{:016x}", hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(deltas: Vec<Delta>) -> (Vec<ModelEvent>, Result<ModelResponse, LlmError>) {
        let mut acc = Accumulator::new();
        let mut out = Vec::new();
        for delta in deltas {
            acc.push(delta, &mut out);
        }
        let result = acc.finish(&mut out);
        (out, result)
    }

    #[test]
    fn keeps_part_order_and_merges_fragments() {
        let (events, result) = run(vec![
            Delta::Thinking("a".into()),
            Delta::Thinking("b".into()),
            Delta::ThinkingSignature("sig".into()),
            Delta::Text("x".into()),
            Delta::Text("y".into()),
            Delta::ToolCallStart {
                key: 0,
                id: Some("c1".into()),
                name: Some("f".into()),
            },
            Delta::ToolCallArguments {
                key: 0,
                fragment: "{\"a\"".into(),
            },
            Delta::ToolCallStart {
                key: 0,
                id: Some("c1".into()),
                name: Some("f".into()),
            },
            Delta::ToolCallArguments {
                key: 0,
                fragment: ":1}".into(),
            },
            Delta::Done,
        ]);
        let response = result.unwrap();
        assert_eq!(response.thinking(), "ab");
        assert_eq!(response.text(), "xy");
        assert_eq!(response.tool_calls()[0].arguments, json!({"a": 1}));
        assert_eq!(response.tool_calls()[0].name, "f");
        assert_eq!(response.stop_reason, StopReason::ToolUse);
        assert!(
            matches!(&response.content[0], AssistantPart::Thinking(Thinking::Text { signature: Some(s), .. }) if s == "sig")
        );
        assert!(matches!(events.last(), Some(ModelEvent::Completed { .. })));
        let calls = events
            .iter()
            .filter(|e| matches!(e, ModelEvent::ToolCall { .. }))
            .count();
        assert_eq!(calls, 1);
    }

    #[test]
    fn a_different_id_at_the_same_index_is_a_new_call() {
        let (_, result) = run(vec![
            Delta::ToolCallStart {
                key: 0,
                id: Some("a".into()),
                name: Some("f".into()),
            },
            Delta::ToolCallArguments {
                key: 0,
                fragment: "{}".into(),
            },
            Delta::ToolCallStart {
                key: 0,
                id: Some("b".into()),
                name: Some("g".into()),
            },
            Delta::ToolCallArguments {
                key: 0,
                fragment: "{\"x\":2}".into(),
            },
            Delta::Stop(StopReason::ToolUse),
        ]);
        let response = result.unwrap();
        let calls = response.tool_calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].name, "g");
        assert_eq!(calls[1].arguments, json!({"x": 2}));
    }

    #[test]
    fn missing_end_marker_is_an_error() {
        let (_, result) = run(vec![Delta::Text("partial".into())]);
        assert!(matches!(result, Err(LlmError::StreamEndedEarly { .. })));
    }

    #[test]
    fn truncated_arguments_are_reported_as_cut_off() {
        let (_, result) = run(vec![
            Delta::ToolCallStart {
                key: 1,
                id: Some("t".into()),
                name: Some("f".into()),
            },
            Delta::ToolCallArguments {
                key: 1,
                fragment: "{\"a\": [1,".into(),
            },
            Delta::Stop(StopReason::MaxTokens),
            Delta::Done,
        ]);
        match result {
            Err(LlmError::InvalidToolArguments { cut_off, name, .. }) => {
                assert!(cut_off);
                assert_eq!(name, "f");
            }
            other => panic!("expected invalid arguments, got {other:?}"),
        }
    }

    #[test]
    fn no_argument_call_gets_an_empty_object_and_missing_ids_are_stable() {
        let deltas = || {
            vec![
                Delta::ToolCallStart {
                    key: 0,
                    id: None,
                    name: Some("now".into()),
                },
                Delta::Done,
            ]
        };
        let first = run(deltas()).1.unwrap();
        let second = run(deltas()).1.unwrap();
        assert_eq!(first.tool_calls()[0].arguments, json!({}));
        assert_eq!(first.tool_calls()[0].id, second.tool_calls()[0].id);
        assert!(first.tool_calls()[0].id.starts_with("call_"));
    }

    #[test]
    fn non_object_arguments_are_rejected() {
        let (_, result) = run(vec![
            Delta::ToolCallStart {
                key: 0,
                id: Some("c".into()),
                name: Some("f".into()),
            },
            Delta::ToolCallArguments {
                key: 0,
                fragment: "[1]".into(),
            },
            Delta::Done,
        ]);
        assert!(matches!(
            result,
            Err(LlmError::InvalidToolArguments { cut_off: false, .. })
        ));
    }
}
