//! OpenAI Responses rendering: a `response` object, or its named events (`response.created`,
//! `response.output_item.added`, the text / reasoning-summary / arguments deltas,
//! `response.output_item.done`, `response.completed`).

use serde_json::{Value, json};

use super::{
    CREATED_UNIX, RenderedTurn, TurnRequest, json_fragments, push_sse_event, text_fragments,
};
use crate::script::ScriptedTurn;

const ID_PREFIX: &str = "call_";

pub(super) fn render(turn: &ScriptedTurn, request: &TurnRequest) -> RenderedTurn {
    if request.stream {
        RenderedTurn::sse(stream(turn, request))
    } else {
        RenderedTurn::json(&response(turn, request, true))
    }
}

/// The output items of the turn: reasoning, message, function calls.
fn items(turn: &ScriptedTurn, request: &TurnRequest) -> Vec<Value> {
    let sequence = request.sequence;
    let mut items = Vec::new();
    if let Some(thinking) = turn.visible_thinking() {
        let encrypted = turn
            .thinking_signature
            .clone()
            .unwrap_or_else(|| format!("enc_mock{sequence}"));
        items.push(json!({
            "type": "reasoning",
            "id": format!("rs_mock{sequence}"),
            "summary": [{"type": "summary_text", "text": thinking}],
            "encrypted_content": encrypted,
        }));
    }
    if let Some(text) = turn.visible_text() {
        items.push(json!({
            "type": "message",
            "id": format!("msg_mock{sequence}"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }));
    }
    for (index, call) in turn.tool_calls.iter().enumerate() {
        items.push(json!({
            "type": "function_call",
            "id": format!("fc_mock{sequence}_{index}"),
            "call_id": turn.call_id(index, ID_PREFIX),
            "name": call.name,
            "arguments": call.arguments.to_string(),
            "status": "completed",
        }));
    }
    items
}

/// The `response` object: finished (with its output and usage) or just created.
fn response(turn: &ScriptedTurn, request: &TurnRequest, finished: bool) -> Value {
    let incomplete = turn.stop_reason.as_deref() == Some("max_output_tokens");
    let status = match (finished, incomplete) {
        (false, _) => "in_progress",
        (true, true) => "incomplete",
        (true, false) => "completed",
    };
    let mut response = json!({
        "id": format!("resp_mock{}", request.sequence),
        "object": "response",
        "created_at": CREATED_UNIX,
        "status": status,
        "model": request.model,
        "output": if finished { json!(items(turn, request)) } else { json!([]) },
        "usage": null,
        "incomplete_details": null,
    });
    if finished {
        response["usage"] = json!({
            "input_tokens": turn.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": turn.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": turn.input_tokens + turn.output_tokens,
        });
        if incomplete {
            response["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
    }
    response
}

/// Writes the named events with their sequence numbers.
struct EventWriter {
    sequence: u64,
    out: String,
}

impl EventWriter {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        push_sse_event(&mut self.out, kind, &data);
    }
}

fn stream(turn: &ScriptedTurn, request: &TurnRequest) -> String {
    let mut writer = EventWriter {
        sequence: 0,
        out: String::with_capacity(2048),
    };
    writer.push(
        "response.created",
        json!({"response": response(turn, request, false)}),
    );
    for (index, item) in items(turn, request).into_iter().enumerate() {
        let id = item["id"].clone();
        let mut added = item.clone();
        match item["type"].as_str() {
            Some("reasoning") => {
                added["summary"] = json!([]);
                writer.push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                );
                let text = item["summary"][0]["text"].as_str().unwrap_or_default();
                for fragment in text_fragments(text) {
                    writer.push(
                        "response.reasoning_summary_text.delta",
                        json!({"item_id": id, "output_index": index, "summary_index": 0, "delta": fragment}),
                    );
                }
            }
            Some("message") => {
                added["content"] = json!([]);
                writer.push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                );
                let text = item["content"][0]["text"].as_str().unwrap_or_default();
                for fragment in text_fragments(text) {
                    writer.push(
                        "response.output_text.delta",
                        json!({"item_id": id, "output_index": index, "content_index": 0, "delta": fragment}),
                    );
                }
            }
            _ => {
                added["arguments"] = json!("");
                writer.push(
                    "response.output_item.added",
                    json!({"output_index": index, "item": added}),
                );
                let arguments = item["arguments"].as_str().unwrap_or_default().to_owned();
                for fragment in json_fragments(&arguments) {
                    writer.push(
                        "response.function_call_arguments.delta",
                        json!({"item_id": id, "output_index": index, "delta": fragment}),
                    );
                }
            }
        }
        writer.push(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }
    let finished = response(turn, request, true);
    let kind = if finished["status"] == "incomplete" {
        "response.incomplete"
    } else {
        "response.completed"
    };
    writer.push(kind, json!({"response": finished}));
    writer.out
}
