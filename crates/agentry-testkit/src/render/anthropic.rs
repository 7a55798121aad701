//! Anthropic Messages rendering: a `message` JSON, or the `message_start` ... `message_stop`
//! SSE event sequence with thinking, text and tool_use content blocks.

use serde_json::{Value, json};

use super::{RenderedTurn, TurnRequest, json_fragments, push_sse_event, text_fragments};
use crate::script::ScriptedTurn;

const ID_PREFIX: &str = "toolu_";

pub(super) fn render(turn: &ScriptedTurn, request: &TurnRequest) -> RenderedTurn {
    if request.stream {
        RenderedTurn::sse(stream(turn, request))
    } else {
        RenderedTurn::json(&whole(turn, request))
    }
}

fn stop_reason(turn: &ScriptedTurn) -> &str {
    match &turn.stop_reason {
        Some(reason) => reason,
        None if turn.tool_calls.is_empty() => "end_turn",
        None => "tool_use",
    }
}

fn message_id(request: &TurnRequest) -> String {
    format!("msg_mock{}", request.sequence)
}

fn whole(turn: &ScriptedTurn, request: &TurnRequest) -> Value {
    let mut content = Vec::new();
    if let Some(thinking) = turn.visible_thinking() {
        content.push(json!({
            "type": "thinking",
            "thinking": thinking,
            "signature": turn.thinking_signature.as_deref().unwrap_or_default(),
        }));
    }
    if let Some(text) = turn.visible_text() {
        content.push(json!({ "type": "text", "text": text }));
    }
    for (index, call) in turn.tool_calls.iter().enumerate() {
        content.push(json!({
            "type": "tool_use",
            "id": turn.call_id(index, ID_PREFIX),
            "name": call.name,
            "input": call.arguments,
        }));
    }
    json!({
        "id": message_id(request),
        "type": "message",
        "role": "assistant",
        "model": request.model,
        "content": content,
        "stop_reason": stop_reason(turn),
        "stop_sequence": null,
        "usage": {
            "input_tokens": turn.input_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "output_tokens": turn.output_tokens,
        },
    })
}

/// Writes the content block events, numbering blocks and placing the `ping`.
struct BlockWriter {
    out: String,
    next_index: usize,
    pinged: bool,
}

impl BlockWriter {
    fn event(&mut self, event: &str, data: &Value) {
        push_sse_event(&mut self.out, event, data);
    }

    /// Starts a block; the first block start is followed by a `ping`, as the real API does.
    fn start(&mut self, block: Value) -> usize {
        let index = self.next_index;
        self.next_index += 1;
        self.event(
            "content_block_start",
            &json!({ "type": "content_block_start", "index": index, "content_block": block }),
        );
        self.ping_once();
        index
    }

    fn delta(&mut self, index: usize, delta: Value) {
        self.event(
            "content_block_delta",
            &json!({ "type": "content_block_delta", "index": index, "delta": delta }),
        );
    }

    fn stop(&mut self, index: usize) {
        self.event(
            "content_block_stop",
            &json!({ "type": "content_block_stop", "index": index }),
        );
    }

    fn ping_once(&mut self) {
        if !self.pinged {
            self.pinged = true;
            self.event("ping", &json!({ "type": "ping" }));
        }
    }
}

fn stream(turn: &ScriptedTurn, request: &TurnRequest) -> String {
    let mut writer = BlockWriter {
        out: String::with_capacity(2048),
        next_index: 0,
        pinged: false,
    };
    writer.event(
        "message_start",
        &json!({
            "type": "message_start",
            "message": {
                "id": message_id(request),
                "type": "message",
                "role": "assistant",
                "model": request.model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {
                    "input_tokens": turn.input_tokens,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                    "output_tokens": 1,
                },
            },
        }),
    );
    if let Some(thinking) = turn.visible_thinking() {
        let index = writer.start(json!({ "type": "thinking", "thinking": "", "signature": "" }));
        for fragment in text_fragments(thinking) {
            writer.delta(
                index,
                json!({ "type": "thinking_delta", "thinking": fragment }),
            );
        }
        if let Some(signature) = &turn.thinking_signature {
            writer.delta(
                index,
                json!({ "type": "signature_delta", "signature": signature }),
            );
        }
        writer.stop(index);
    }
    if let Some(text) = turn.visible_text() {
        let index = writer.start(json!({ "type": "text", "text": "" }));
        for fragment in text_fragments(text) {
            writer.delta(index, json!({ "type": "text_delta", "text": fragment }));
        }
        writer.stop(index);
    }
    for (call_index, call) in turn.tool_calls.iter().enumerate() {
        let index = writer.start(json!({
            "type": "tool_use",
            "id": turn.call_id(call_index, ID_PREFIX),
            "name": call.name,
            "input": {},
        }));
        writer.delta(
            index,
            json!({ "type": "input_json_delta", "partial_json": "" }),
        );
        let input = call.arguments.to_string();
        for fragment in json_fragments(&input) {
            writer.delta(
                index,
                json!({ "type": "input_json_delta", "partial_json": fragment }),
            );
        }
        writer.stop(index);
    }
    writer.ping_once();
    writer.event(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": { "stop_reason": stop_reason(turn), "stop_sequence": null },
            "usage": { "output_tokens": turn.output_tokens },
        }),
    );
    writer.event("message_stop", &json!({ "type": "message_stop" }));
    writer.out
}
