//! OpenAI chat completions rendering: `chat.completion` JSON, or `chat.completion.chunk` SSE
//! ending in `data: [DONE]`.

use serde_json::{Value, json};

use super::{
    CREATED_UNIX, RenderedTurn, TurnRequest, json_fragments, push_sse_data, text_fragments,
};
use crate::script::ScriptedTurn;

const ID_PREFIX: &str = "call_";

pub(super) fn render(turn: &ScriptedTurn, request: &TurnRequest) -> RenderedTurn {
    if request.stream {
        RenderedTurn::sse(stream(turn, request))
    } else {
        RenderedTurn::json(&whole(turn, request))
    }
}

fn finish_reason(turn: &ScriptedTurn) -> &str {
    match &turn.stop_reason {
        Some(reason) => reason,
        None if turn.tool_calls.is_empty() => "stop",
        None => "tool_calls",
    }
}

fn completion_id(request: &TurnRequest) -> String {
    format!("chatcmpl-mock{}", request.sequence)
}

fn usage(turn: &ScriptedTurn) -> Value {
    json!({
        "prompt_tokens": turn.input_tokens,
        "completion_tokens": turn.output_tokens,
        "total_tokens": turn.input_tokens + turn.output_tokens,
    })
}

fn whole(turn: &ScriptedTurn, request: &TurnRequest) -> Value {
    let mut message = json!({
        "role": "assistant",
        "content": turn.visible_text(),
        "refusal": null,
    });
    if let Some(thinking) = turn.visible_thinking() {
        message["reasoning_content"] = json!(thinking);
    }
    if !turn.tool_calls.is_empty() {
        let calls: Vec<Value> = turn
            .tool_calls
            .iter()
            .enumerate()
            .map(|(index, call)| {
                json!({
                    "id": turn.call_id(index, ID_PREFIX),
                    "type": "function",
                    "function": { "name": call.name, "arguments": call.arguments.to_string() },
                })
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": completion_id(request),
        "object": "chat.completion",
        "created": CREATED_UNIX,
        "model": request.model,
        "system_fingerprint": "fp_mock",
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": finish_reason(turn),
        }],
        "usage": usage(turn),
    })
}

/// Builds the `chat.completion.chunk` envelopes of one response.
struct ChunkWriter<'a> {
    id: String,
    request: &'a TurnRequest,
    out: String,
}

impl ChunkWriter<'_> {
    fn push(&mut self, delta: Value, finish_reason: Option<&str>) {
        let chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": CREATED_UNIX,
            "model": self.request.model,
            "system_fingerprint": "fp_mock",
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        });
        push_sse_data(&mut self.out, &chunk);
    }
}

fn stream(turn: &ScriptedTurn, request: &TurnRequest) -> String {
    let mut writer = ChunkWriter {
        id: completion_id(request),
        request,
        out: String::with_capacity(1024),
    };
    let first_content = turn.visible_text().map(|_| "");
    writer.push(
        json!({ "role": "assistant", "content": first_content }),
        None,
    );
    if let Some(thinking) = turn.visible_thinking() {
        for fragment in text_fragments(thinking) {
            writer.push(json!({ "reasoning_content": fragment }), None);
        }
    }
    if let Some(text) = turn.visible_text() {
        for fragment in text_fragments(text) {
            writer.push(json!({ "content": fragment }), None);
        }
    }
    for (index, call) in turn.tool_calls.iter().enumerate() {
        writer.push(
            json!({ "tool_calls": [{
                "index": index,
                "id": turn.call_id(index, ID_PREFIX),
                "type": "function",
                "function": { "name": call.name, "arguments": "" },
            }]}),
            None,
        );
        let arguments = call.arguments.to_string();
        for fragment in json_fragments(&arguments) {
            writer.push(
                json!({ "tool_calls": [{ "index": index, "function": { "arguments": fragment } }]}),
                None,
            );
        }
    }
    writer.push(json!({}), Some(finish_reason(turn)));
    if request.include_usage {
        let chunk = json!({
            "id": writer.id,
            "object": "chat.completion.chunk",
            "created": CREATED_UNIX,
            "model": request.model,
            "system_fingerprint": "fp_mock",
            "choices": [],
            "usage": usage(turn),
        });
        push_sse_data(&mut writer.out, &chunk);
    }
    writer.out.push_str("data: [DONE]\n\n");
    writer.out
}
