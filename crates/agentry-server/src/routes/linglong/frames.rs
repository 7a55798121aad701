//! A run's events as the seed's clients read them, and the seed's answer built from them.
//!
//! [`SeedFrames`] turns each [`RunEvent`] into the seed's stream messages (what its
//! `/v1/infer/stream` sends as `data: <message JSON>`):
//! - `{"role": "assistant", "content": <delta>}`, with `"thinking": <delta>` for reasoning, or
//!   `"tool_calls": [{"_index", "id"?, "name"?, "arguments"}]` for a fragment of a call;
//! - `{"role": "tool", "content", "name", "tool_use_id"}` for a tool's result;
//! - `{"role": "usage", "name": "round", "content": "<stat JSON>"}` after each model call: the
//!   round's and the run's tokens, `net_ms`, `total_ms`, `ttft_ms`, and `overall_ms` on the
//!   last round;
//! - a run that fails or is stopped by a guard ends with `{"role": "assistant", "content":
//!   "Error: …"}` — the seed reports errors as assistant text starting with `Error:`.
//!
//! [`merge_turns`] folds those messages into the seed's conversation turns, which is what its
//! `/v1/infer` answers (the seed builds that answer from its own stream the same way).

use std::time::Instant;

use serde_json::{Map, Value, json};

use agentry_types::{
    AssistantPart, RunEvent, RunStopReason, SessionEvent, SuspendStatus, ToolResult, Usage,
};

/// How a seed run ended badly: the `Error: …` text and a code in the seed's style.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedError {
    /// The assistant text, starting with `Error:`.
    pub text: String,
    /// An upper-case code (`MAX_ROUNDS`, `PROVIDER_UNAVAILABLE`, …).
    pub code: String,
}

/// Turns a run's events into the seed's stream messages.
#[derive(Debug)]
pub struct SeedFrames {
    /// Whether the run is in a session (its steps arrive as committed events).
    session: bool,
    max_tool_rounds: u32,
    started: Instant,
    round_started: Instant,
    first_token: Option<Instant>,
    model_done: Option<Instant>,
    /// Whether the stateless round whose usage comes next called no tool.
    round_is_last: bool,
    total: Usage,
    /// The highest committed seq seen (a session run's steps may arrive twice after a lag).
    pub last_seq: u64,
    /// Set once the run's end was mapped.
    pub ended: bool,
    /// Why the run ended badly, if it did.
    pub error: Option<SeedError>,
    /// The last round's stat.
    pub stat: Option<Value>,
}

impl SeedFrames {
    /// A mapper for a run in a session (`session`) or a stateless one.
    pub fn new(session: bool, max_tool_rounds: u32) -> Self {
        let now = Instant::now();
        Self {
            session,
            max_tool_rounds,
            started: now,
            round_started: now,
            first_token: None,
            model_done: None,
            round_is_last: false,
            total: Usage::default(),
            last_seq: 0,
            ended: false,
            error: None,
            stat: None,
        }
    }

    /// The seed's messages for one event (none for events its clients do not see).
    pub fn map(&mut self, event: &RunEvent) -> Vec<Value> {
        match event {
            RunEvent::TextDelta { text } => {
                self.first_token.get_or_insert_with(Instant::now);
                vec![json!({"role": "assistant", "content": text})]
            }
            RunEvent::ThinkingDelta { text } => {
                self.first_token.get_or_insert_with(Instant::now);
                vec![json!({"role": "assistant", "content": "", "thinking": text})]
            }
            RunEvent::ToolCallDelta {
                index,
                id,
                name,
                arguments,
            } => {
                let mut call = Map::new();
                call.insert("_index".into(), json!(index));
                if let Some(id) = id {
                    call.insert("id".into(), json!(id));
                }
                if let Some(name) = name {
                    call.insert("name".into(), json!(name));
                }
                call.insert("arguments".into(), json!(arguments));
                vec![json!({"role": "assistant", "content": "", "tool_calls": [call]})]
            }
            RunEvent::Committed { seq, event } => {
                if *seq <= self.last_seq {
                    return Vec::new();
                }
                self.last_seq = *seq;
                match event {
                    SessionEvent::AssistantMessage { content, usage, .. } => {
                        self.model_done = Some(Instant::now());
                        vec![self.usage(usage, last_round(content))]
                    }
                    SessionEvent::ToolCallResult { result, .. } => vec![tool(result)],
                    _ => Vec::new(),
                }
            }
            // A stateless run's steps (a session run's arrive committed, above).
            RunEvent::AssistantMessage { content, .. } if !self.session => {
                self.model_done = Some(Instant::now());
                // Its usage follows; remember whether this was the last round.
                self.round_is_last = last_round(content);
                Vec::new()
            }
            RunEvent::Usage { usage, .. } if !self.session => {
                vec![self.usage(usage, self.round_is_last)]
            }
            RunEvent::ToolResult { result, .. } if !self.session => vec![tool(result)],
            RunEvent::RunFinished { stop_reason, .. } => self.end(match stop_reason {
                RunStopReason::Completed | RunStopReason::Cancelled => None,
                RunStopReason::MaxRounds => Some(SeedError {
                    text: format!(
                        "Error: maximum tool-call rounds ({}) reached.",
                        self.max_tool_rounds
                    ),
                    code: "MAX_TOOL_ROUNDS".into(),
                }),
                other => Some(SeedError {
                    text: format!("Error: the run was stopped ({}).", other.as_str()),
                    code: other.as_str().to_uppercase(),
                }),
            }),
            RunEvent::RunFailed {
                stop_reason, error, ..
            } => self.end(
                (*stop_reason != RunStopReason::Cancelled).then(|| SeedError {
                    text: format!("Error: {}", error.message),
                    code: error.code.as_str().to_uppercase(),
                }),
            ),
            RunEvent::RunSuspended {
                run_id,
                status,
                pending,
                ..
            } => self.end(Some(match status {
                SuspendStatus::Waiting => SeedError {
                    text: format!(
                        "Error: the run waits for approval of {} tool call(s): decide them \
                         with POST /v1/runs/{run_id}/approvals",
                        pending.len()
                    ),
                    code: "WAITING_FOR_APPROVAL".into(),
                },
                SuspendStatus::Paused => SeedError {
                    text: format!(
                        "Error: the run is paused: resume it with POST /v1/runs/{run_id}/resume"
                    ),
                    code: "PAUSED".into(),
                },
            })),
            _ => Vec::new(),
        }
    }

    /// The end of the run: its error message, if it had one.
    fn end(&mut self, error: Option<SeedError>) -> Vec<Value> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        let frames = error
            .iter()
            .map(|error| json!({"role": "assistant", "content": error.text}))
            .collect();
        self.error = error;
        frames
    }

    /// The usage message of a round that used `usage`, and starts the next round's clock.
    fn usage(&mut self, usage: &Usage, last: bool) -> Value {
        self.total.add(usage);
        let now = Instant::now();
        let ms = |from: Instant, to: Instant| {
            (to.duration_since(from).as_secs_f64() * 10_000.0).round() / 10.0
        };
        let net = ms(self.round_started, self.model_done.unwrap_or(now));
        let mut stat = json!({
            "prompt_tokens": usage.input_tokens,
            "completion_tokens": usage.output_tokens,
            "total_tokens": usage.total_tokens(),
            "total_prompt_tokens": self.total.input_tokens,
            "total_completion_tokens": self.total.output_tokens,
            "total_all_tokens": self.total.total_tokens(),
            "net_ms": net,
            "total_ms": ms(self.round_started, now),
        });
        if let Some(first) = self.first_token {
            stat["ttft_ms"] = json!(ms(self.round_started, first));
        }
        if last {
            stat["overall_ms"] = json!(ms(self.started, now));
        }
        self.round_started = now;
        self.first_token = None;
        self.model_done = None;
        let frame = json!({"role": "usage", "name": "round", "content": stat.to_string()});
        self.stat = Some(stat);
        frame
    }
}

/// Whether a round's answer ends the run (it calls no tool).
fn last_round(content: &[AssistantPart]) -> bool {
    !content
        .iter()
        .any(|part| matches!(part, AssistantPart::ToolCall(_)))
}

/// A tool's result as the seed's tool message.
fn tool(result: &ToolResult) -> Value {
    json!({
        "role": "tool",
        "content": result.text_content(),
        "name": result.name.clone().unwrap_or_default(),
        "tool_use_id": result.call_id,
    })
}

/// Folds the seed's stream messages into its conversation turns: an assistant's deltas into
/// one turn (text, `thinking`, and `tool_calls` put together by `_index`) that a tool result or
/// the end closes, each tool result a turn; usage messages give the last turn its `stat`.
/// Answers the turns and the last round's stat.
pub fn merge_turns(frames: &[Value], timestamp: &str) -> (Vec<Value>, Option<Value>) {
    let mut turns = Vec::new();
    let mut open: Option<Assistant> = None;
    let mut stat = None;
    for frame in frames {
        match frame.get("role").and_then(Value::as_str) {
            Some("assistant") => open.get_or_insert_with(Assistant::default).add(frame),
            Some("tool") => {
                if let Some(turn) = open.take() {
                    turns.push(turn.into_turn(timestamp, None));
                }
                let mut turn = frame.clone();
                turn["timestamp"] = json!(timestamp);
                turns.push(turn);
            }
            Some("usage") => {
                stat = frame
                    .get("content")
                    .and_then(Value::as_str)
                    .and_then(|text| serde_json::from_str::<Value>(text).ok());
            }
            _ => {}
        }
    }
    if let Some(turn) = open.take() {
        turns.push(turn.into_turn(timestamp, stat.clone()));
    }
    (turns, stat)
}

/// An assistant turn being put together from deltas.
#[derive(Debug, Default)]
struct Assistant {
    content: String,
    thinking: String,
    calls: Vec<Map<String, Value>>,
}

impl Assistant {
    fn add(&mut self, frame: &Value) {
        if let Some(text) = frame.get("content").and_then(Value::as_str) {
            self.content.push_str(text);
        }
        if let Some(text) = frame.get("thinking").and_then(Value::as_str) {
            self.thinking.push_str(text);
        }
        for delta in frame
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = delta
                .get("_index")
                .and_then(Value::as_u64)
                .and_then(|index| usize::try_from(index).ok())
                .unwrap_or(self.calls.len());
            while self.calls.len() <= index {
                let mut call = Map::new();
                call.insert("name".into(), json!(""));
                call.insert("arguments".into(), json!(""));
                self.calls.push(call);
            }
            let call = &mut self.calls[index];
            if let Some(id) = delta.get("id").and_then(Value::as_str) {
                call.insert("id".into(), json!(id));
            }
            for field in ["name", "arguments"] {
                if let Some(piece) = delta.get(field).and_then(Value::as_str) {
                    let joined = format!(
                        "{}{piece}",
                        call.get(field).and_then(Value::as_str).unwrap_or("")
                    );
                    call.insert(field.into(), json!(joined));
                }
            }
        }
    }

    fn into_turn(self, timestamp: &str, stat: Option<Value>) -> Value {
        let mut turn =
            json!({"role": "assistant", "content": self.content, "timestamp": timestamp});
        if !self.thinking.is_empty() {
            turn["thinking"] = json!(self.thinking);
        }
        if !self.calls.is_empty() {
            turn["tool_calls"] = Value::Array(self.calls.into_iter().map(Value::Object).collect());
        }
        if let Some(stat) = stat {
            turn["stat"] = stat;
        }
        turn
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_types::ToolCall;

    #[test]
    fn a_tool_loop_maps_and_merges_like_the_seed() {
        let mut frames = SeedFrames::new(false, 20);
        let mut sent = Vec::new();
        for event in [
            RunEvent::ToolCallDelta {
                index: 0,
                id: Some("c1".into()),
                name: Some("add".into()),
                arguments: "{\"a\":".into(),
            },
            RunEvent::ToolCallDelta {
                index: 0,
                id: None,
                name: None,
                arguments: " 1}".into(),
            },
            RunEvent::AssistantMessage {
                round: 1,
                content: vec![AssistantPart::ToolCall(ToolCall::new(
                    "c1",
                    "add",
                    json!({"a": 1}),
                ))],
                stop_reason: agentry_types::StopReason::ToolUse,
            },
            RunEvent::Usage {
                round: 1,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 2,
                    ..Usage::default()
                },
                model: None,
                first_output_ms: None,
                duration_ms: None,
            },
            RunEvent::ToolResult {
                result: {
                    let mut result = ToolResult::text("c1", "2");
                    result.name = Some("add".into());
                    result
                },
                duration_ms: 1,
            },
            RunEvent::TextDelta {
                text: "It is ".into(),
            },
            RunEvent::TextDelta { text: "2.".into() },
            RunEvent::AssistantMessage {
                round: 2,
                content: vec![AssistantPart::Text {
                    text: "It is 2.".into(),
                }],
                stop_reason: agentry_types::StopReason::EndTurn,
            },
            RunEvent::Usage {
                round: 2,
                usage: Usage {
                    input_tokens: 15,
                    output_tokens: 3,
                    ..Usage::default()
                },
                model: None,
                first_output_ms: None,
                duration_ms: None,
            },
        ] {
            sent.extend(frames.map(&event));
        }
        assert_eq!(sent.len(), 7, "{sent:#?}");
        assert_eq!(
            sent[0],
            json!({"role": "assistant", "content": "", "tool_calls": [{"_index": 0, "id": "c1", "name": "add", "arguments": "{\"a\":"}]})
        );
        assert_eq!(
            sent[3],
            json!({"role": "tool", "content": "2", "name": "add", "tool_use_id": "c1"})
        );
        let last: Value = serde_json::from_str(sent[6]["content"].as_str().unwrap()).unwrap();
        assert_eq!(last["total_all_tokens"], 30);
        assert!(last.get("overall_ms").is_some());
        let first: Value = serde_json::from_str(sent[2]["content"].as_str().unwrap()).unwrap();
        assert!(first.get("overall_ms").is_none());
        let (turns, stat) = merge_turns(&sent, "t");
        assert_eq!(turns.len(), 3, "{turns:#?}");
        assert_eq!(
            turns[0]["tool_calls"],
            json!([{"id": "c1", "name": "add", "arguments": "{\"a\": 1}"}])
        );
        assert_eq!(turns[1]["role"], "tool");
        assert_eq!(turns[2]["content"], "It is 2.");
        assert_eq!(turns[2]["stat"], stat.unwrap());
        assert!(frames.error.is_none());
    }

    #[test]
    fn guards_and_failures_end_with_error_text() {
        let mut frames = SeedFrames::new(true, 3);
        let sent = frames.map(&RunEvent::RunFinished {
            stop_reason: RunStopReason::MaxRounds,
            text: String::new(),
            usage: Usage::default(),
            rounds: 4,
        });
        assert_eq!(
            sent,
            vec![
                json!({"role": "assistant", "content": "Error: maximum tool-call rounds (3) reached."})
            ]
        );
        assert_eq!(frames.error.as_ref().unwrap().code, "MAX_TOOL_ROUNDS");
        // The end is mapped once.
        assert!(
            frames
                .map(&RunEvent::RunFinished {
                    stop_reason: RunStopReason::Completed,
                    text: String::new(),
                    usage: Usage::default(),
                    rounds: 4,
                })
                .is_empty()
        );
    }
}
