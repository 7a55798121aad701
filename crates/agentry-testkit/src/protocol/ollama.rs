//! Ollama native chat request invariants: tool messages follow an assistant message with
//! tool calls (no more of them than calls), and tool call arguments are JSON objects.

use serde_json::Value;

use super::{messages_of, role_of, tool_calls_of};

/// Calls of the latest assistant message not yet matched by a tool message.
struct OpenCalls {
    assistant_index: usize,
    remaining: usize,
}

pub(super) fn check(body: &Value, out: &mut Vec<String>) {
    // `/api/generate` bodies carry a prompt instead of a conversation.
    if body.get("messages").is_none() && body.get("prompt").is_some() {
        return;
    }
    let Some(messages) = messages_of(body, out) else {
        return;
    };
    let mut open: Option<OpenCalls> = None;
    for (index, message) in messages.iter().enumerate() {
        if role_of(message) == "tool" {
            match open.as_mut() {
                Some(calls) if calls.remaining > 0 => calls.remaining -= 1,
                Some(calls) => out.push(format!(
                    "messages[{index}]: more tool messages than the tool calls of messages[{}]",
                    calls.assistant_index
                )),
                None => out.push(format!(
                    "messages[{index}]: tool message does not follow an assistant message with \
                     tool_calls"
                )),
            }
            continue;
        }
        open = None;
        if role_of(message) != "assistant" {
            continue;
        }
        let calls = tool_calls_of(message);
        for (call_index, call) in calls.iter().enumerate() {
            match call.pointer("/function/arguments") {
                Some(Value::Object(_)) => {}
                Some(other) => out.push(format!(
                    "messages[{index}].tool_calls[{call_index}]: function.arguments must be a \
                     JSON object, got {other}"
                )),
                None => out.push(format!(
                    "messages[{index}].tool_calls[{call_index}]: missing function.arguments"
                )),
            }
        }
        if !calls.is_empty() {
            open = Some(OpenCalls {
                assistant_index: index,
                remaining: calls.len(),
            });
        }
    }
}
