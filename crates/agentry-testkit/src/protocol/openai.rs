//! OpenAI chat completions request invariants: tool call / tool result pairing and JSON-string
//! arguments.

use serde_json::Value;

use super::{messages_of, role_of, tool_calls_of};

/// Tool calls of one assistant message still waiting for their `tool` messages.
struct PendingCalls {
    assistant_index: usize,
    unanswered: Vec<String>,
}

impl PendingCalls {
    fn report_unanswered(&self, when: &str, out: &mut Vec<String>) {
        if !self.unanswered.is_empty() {
            out.push(format!(
                "messages[{}]: tool calls {:?} are not answered {when}",
                self.assistant_index, self.unanswered
            ));
        }
    }
}

pub(super) fn check(body: &Value, out: &mut Vec<String>) {
    let Some(messages) = messages_of(body, out) else {
        return;
    };
    let mut pending: Option<PendingCalls> = None;
    for (index, message) in messages.iter().enumerate() {
        if role_of(message) == "tool" {
            answer(index, message, pending.as_mut(), out);
            continue;
        }
        if let Some(calls) = pending.take() {
            calls.report_unanswered(&format!("before messages[{index}]"), out);
        }
        if role_of(message) == "assistant" {
            pending = assistant_calls(index, message, out);
        }
    }
    if let Some(calls) = pending {
        calls.report_unanswered("by the end of the request", out);
    }
}

fn answer(
    index: usize,
    message: &Value,
    pending: Option<&mut PendingCalls>,
    out: &mut Vec<String>,
) {
    let Some(id) = message.get("tool_call_id").and_then(Value::as_str) else {
        out.push(format!(
            "messages[{index}]: tool message has no string `tool_call_id`"
        ));
        return;
    };
    match pending {
        None => out.push(format!(
            "messages[{index}]: tool message answers {id:?} but no assistant tool call precedes it"
        )),
        Some(calls) => match calls.unanswered.iter().position(|pending| pending == id) {
            Some(position) => {
                calls.unanswered.remove(position);
            }
            None => out.push(format!(
                "messages[{index}]: tool_call_id {id:?} does not answer an unanswered call of \
                 messages[{}]",
                calls.assistant_index
            )),
        },
    }
}

fn assistant_calls(index: usize, message: &Value, out: &mut Vec<String>) -> Option<PendingCalls> {
    let calls = tool_calls_of(message);
    if calls.is_empty() {
        return None;
    }
    let mut unanswered = Vec::with_capacity(calls.len());
    for (call_index, call) in calls.iter().enumerate() {
        let at = format!("messages[{index}].tool_calls[{call_index}]");
        match call.get("id").and_then(Value::as_str) {
            Some(id) => unanswered.push(id.to_owned()),
            None => out.push(format!("{at}: missing string `id`")),
        }
        match call.pointer("/function/arguments") {
            Some(Value::String(arguments)) => {
                if serde_json::from_str::<Value>(arguments).is_err() {
                    out.push(format!(
                        "{at}: function.arguments {arguments:?} is not valid JSON"
                    ));
                }
            }
            Some(other) => out.push(format!(
                "{at}: function.arguments must be a JSON-encoded string, got {other}"
            )),
            None => out.push(format!("{at}: missing function.arguments")),
        }
    }
    Some(PendingCalls {
        assistant_index: index,
        unanswered,
    })
}
