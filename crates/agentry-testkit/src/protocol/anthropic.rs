//! Anthropic Messages request invariants: user/assistant roles only, `max_tokens`, tool_use /
//! tool_result pairing across adjacent messages, signed thinking blocks.

use serde_json::Value;

use super::{messages_of, role_of};

/// `tool_use` ids of the latest assistant message, which the next user message must answer.
struct ExpectedResults {
    assistant_index: usize,
    ids: Vec<String>,
}

pub(super) fn check(body: &Value, out: &mut Vec<String>) {
    if body.get("max_tokens").is_none_or(Value::is_null) {
        out.push("`max_tokens` is required".to_owned());
    }
    let Some(messages) = messages_of(body, out) else {
        return;
    };
    let mut expected: Option<ExpectedResults> = None;
    for (index, message) in messages.iter().enumerate() {
        let blocks = blocks_of(message);
        check_thinking_blocks(index, blocks, out);
        match role_of(message) {
            "user" => {
                check_tool_results(index, blocks, expected.take(), out);
            }
            "assistant" => {
                if let Some(previous) = expected.take() {
                    report_unanswered(&previous, &format!("before messages[{index}]"), out);
                }
                if blocks.iter().any(|b| block_type(b) == "tool_result") {
                    out.push(format!(
                        "messages[{index}]: tool_result blocks belong in user messages"
                    ));
                }
                let ids: Vec<String> = blocks
                    .iter()
                    .filter(|b| block_type(b) == "tool_use")
                    .filter_map(|b| b.get("id").and_then(Value::as_str).map(str::to_owned))
                    .collect();
                if !ids.is_empty() {
                    expected = Some(ExpectedResults {
                        assistant_index: index,
                        ids,
                    });
                }
            }
            other => out.push(format!(
                "messages[{index}]: role {other:?} is not allowed (only user and assistant; \
                 system prompts go in the top-level `system` field)"
            )),
        }
    }
    if let Some(previous) = expected {
        report_unanswered(&previous, "by the end of the request", out);
    }
}

fn check_tool_results(
    index: usize,
    blocks: &[Value],
    expected: Option<ExpectedResults>,
    out: &mut Vec<String>,
) {
    let mut unanswered = expected.as_ref().map_or_else(Vec::new, |e| e.ids.clone());
    for block in blocks.iter().filter(|b| block_type(b) == "tool_result") {
        let Some(id) = block.get("tool_use_id").and_then(Value::as_str) else {
            out.push(format!(
                "messages[{index}]: tool_result has no string `tool_use_id`"
            ));
            continue;
        };
        match unanswered.iter().position(|pending| pending == id) {
            Some(position) => {
                unanswered.remove(position);
            }
            None => out.push(format!(
                "messages[{index}]: tool_result for {id:?} does not answer an unanswered tool_use \
                 of the immediately preceding assistant message"
            )),
        }
    }
    if let Some(expected) = expected {
        let remaining = ExpectedResults {
            assistant_index: expected.assistant_index,
            ids: unanswered,
        };
        report_unanswered(&remaining, &format!("in messages[{index}]"), out);
    }
}

fn check_thinking_blocks(index: usize, blocks: &[Value], out: &mut Vec<String>) {
    for (block_index, block) in blocks.iter().enumerate() {
        let (field, kind) = match block_type(block) {
            "thinking" => ("signature", "thinking"),
            "redacted_thinking" => ("data", "redacted_thinking"),
            _ => continue,
        };
        let present = block
            .get(field)
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty());
        if !present {
            out.push(format!(
                "messages[{index}].content[{block_index}]: {kind} block without a non-empty \
                 `{field}`"
            ));
        }
    }
}

fn report_unanswered(expected: &ExpectedResults, when: &str, out: &mut Vec<String>) {
    if !expected.ids.is_empty() {
        out.push(format!(
            "messages[{}]: tool_use {:?} not answered {when}",
            expected.assistant_index, expected.ids
        ));
    }
}

/// Content blocks of a message; a plain string content has none.
fn blocks_of(message: &Value) -> &[Value] {
    message
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn block_type(block: &Value) -> &str {
    block
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default()
}
