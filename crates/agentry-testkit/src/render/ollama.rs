//! Ollama native rendering: NDJSON chunks (the default) or one JSON object, for `/api/chat`
//! (`message.*`) and `/api/generate` (`response`).

use serde_json::{Map, Value, json};

use super::{CREATED_RFC3339, RenderedTurn, TurnRequest, push_ndjson_line, text_fragments};
use crate::script::ScriptedTurn;

pub(super) fn render(turn: &ScriptedTurn, request: &TurnRequest) -> RenderedTurn {
    if request.stream {
        RenderedTurn {
            content_type: "application/x-ndjson",
            body: stream(turn, request),
        }
    } else {
        RenderedTurn {
            content_type: "application/json; charset=utf-8",
            body: whole(turn, request).to_string(),
        }
    }
}

fn done_reason(turn: &ScriptedTurn) -> &str {
    turn.stop_reason.as_deref().unwrap_or("stop")
}

fn tool_calls(turn: &ScriptedTurn) -> Value {
    turn.tool_calls
        .iter()
        .map(|call| json!({ "function": { "name": call.name, "arguments": call.arguments } }))
        .collect()
}

/// One output line: a chat `message` or a generate `response`, plus `done: false`.
fn partial(
    request: &TurnRequest,
    content: &str,
    thinking: Option<&str>,
    calls: Option<Value>,
) -> Value {
    let mut line = Map::new();
    line.insert("model".into(), json!(request.model));
    line.insert("created_at".into(), json!(CREATED_RFC3339));
    if request.generate {
        line.insert("response".into(), json!(content));
        if let Some(thinking) = thinking {
            line.insert("thinking".into(), json!(thinking));
        }
    } else {
        let mut message = json!({ "role": "assistant", "content": content });
        if let Some(thinking) = thinking {
            message["thinking"] = json!(thinking);
        }
        if let Some(calls) = calls {
            message["tool_calls"] = calls;
        }
        line.insert("message".into(), message);
    }
    line.insert("done".into(), json!(false));
    Value::Object(line)
}

/// Marks a line as the last one: `done: true` with the stop reason and eval statistics.
fn finish(mut line: Value, turn: &ScriptedTurn) -> Value {
    line["done_reason"] = json!(done_reason(turn));
    line["done"] = json!(true);
    line["total_duration"] = json!(1_000_000);
    line["load_duration"] = json!(100_000);
    line["prompt_eval_count"] = json!(turn.input_tokens);
    line["prompt_eval_duration"] = json!(200_000);
    line["eval_count"] = json!(turn.output_tokens);
    line["eval_duration"] = json!(700_000);
    line
}

fn whole(turn: &ScriptedTurn, request: &TurnRequest) -> Value {
    let calls = (!turn.tool_calls.is_empty()).then(|| tool_calls(turn));
    let line = partial(
        request,
        turn.visible_text().unwrap_or_default(),
        turn.visible_thinking(),
        calls,
    );
    finish(line, turn)
}

fn stream(turn: &ScriptedTurn, request: &TurnRequest) -> String {
    let mut out = String::with_capacity(1024);
    if let Some(thinking) = turn.visible_thinking() {
        for fragment in text_fragments(thinking) {
            push_ndjson_line(&mut out, &partial(request, "", Some(fragment), None));
        }
    }
    if let Some(text) = turn.visible_text() {
        for fragment in text_fragments(text) {
            push_ndjson_line(&mut out, &partial(request, fragment, None, None));
        }
    }
    if !turn.tool_calls.is_empty() && !request.generate {
        let calls = tool_calls(turn);
        push_ndjson_line(&mut out, &partial(request, "", None, Some(calls)));
    }
    push_ndjson_line(&mut out, &finish(partial(request, "", None, None), turn));
    out
}
