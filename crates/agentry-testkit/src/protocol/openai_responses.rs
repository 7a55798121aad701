//! OpenAI Responses request invariants: `input` is an array of items; every
//! `function_call_output` answers a pending `function_call` (by `call_id`, once); a `reasoning`
//! item carries its `encrypted_content` (requests are stateless).

use serde_json::Value;

pub(super) fn check(body: &Value, out: &mut Vec<String>) {
    let Some(input) = body.get("input").and_then(Value::as_array) else {
        out.push("`input` is missing or not an array".to_owned());
        return;
    };
    // Calls waiting for their output (an id may come again in a later turn).
    let mut pending: Vec<&str> = Vec::new();
    for (index, item) in input.iter().enumerate() {
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            Some("function_call") => match item.get("call_id").and_then(Value::as_str) {
                Some(id) => pending.push(id),
                None => out.push(format!("input[{index}]: a function_call without `call_id`")),
            },
            Some("function_call_output") => {
                let id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                match pending.iter().position(|waiting| *waiting == id) {
                    Some(position) => {
                        pending.remove(position);
                    }
                    None => out.push(format!(
                        "input[{index}]: function_call_output {id:?} answers no pending call"
                    )),
                }
            }
            Some("reasoning") => {
                if item
                    .get("encrypted_content")
                    .and_then(Value::as_str)
                    .is_none()
                {
                    out.push(format!(
                        "input[{index}]: a reasoning item without `encrypted_content` (stateless)"
                    ));
                }
            }
            Some("message") | None => {
                if item.get("role").and_then(Value::as_str).is_none() {
                    out.push(format!("input[{index}]: a message without `role`"));
                }
            }
            Some(other) => out.push(format!("input[{index}]: unknown item type {other:?}")),
        }
    }
}
