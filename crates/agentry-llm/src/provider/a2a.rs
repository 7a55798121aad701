//! A remote agent over A2A (the Agent2Agent protocol, v0.3 JSON-RPC) as a model: the
//! conversation's latest user turn becomes an A2A message (`message/stream`, or `message/send`
//! when not streamed) to the agent's endpoint, and its task's answer comes back as text.
//!
//! The remote agent keeps the conversation: its `contextId` is kept in the answer as an opaque
//! redacted-thinking part (`a2a-context:<id>`, never shown) and sent with the next turn, so
//! only the new user message travels. A first turn of a conversation that began elsewhere
//! carries the earlier turns as a transcript, and system text as instructions.
//!
//! Streamed answers: `artifact-update` text is the answer's text (a chunk that replaces an
//! artifact adds only what it adds to what was streamed); the final `status-update` ends it —
//! `completed`, or `input-required` / `auth-required` (the agent's question is the answer);
//! `failed`, `rejected` and `canceled` are typed errors with the agent's message; JSON-RPC
//! errors are provider errors. The agent may also answer with a message instead of a task.

use std::collections::HashMap;

use agentry_types::{AssistantPart, ContentPart, ImageSource, Message, StopReason, Thinking};
use serde_json::{Value, json};

use super::{Protocol, error_in_stream, parse_body, parse_json};
use crate::config::ProviderConfig;
use crate::delta::Delta;
use crate::error::{LlmError, truncate};
use crate::request::ModelRequest;

/// The prefix of the opaque part that keeps the remote agent's `contextId`.
pub const CONTEXT_PREFIX: &str = "a2a-context:";

/// The protocol version sent in the `A2A-Version` header.
pub(crate) const VERSION: &str = "0.3";

/// A random id shaped like a UUID.
fn random_id() -> String {
    let hex = format!("{:032x}", fastrand::u128(..));
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The remote agent's context kept in an assistant message, if any.
fn context_of(message: &Message) -> Option<&str> {
    let Message::Assistant { content } = message else {
        return None;
    };
    content.iter().find_map(|part| match part {
        AssistantPart::Thinking(Thinking::Redacted { data }) => data.strip_prefix(CONTEXT_PREFIX),
        _ => None,
    })
}

/// A user turn's parts as A2A parts: text as text, images as files (by URL or inline), audio
/// as an inline file.
fn user_parts(content: &[ContentPart]) -> Vec<Value> {
    content
        .iter()
        .map(|part| match part {
            ContentPart::Text { text } => json!({"kind": "text", "text": text}),
            ContentPart::Image { source } => match source {
                ImageSource::Url { url } => json!({"kind": "file", "file": {"uri": url}}),
                ImageSource::Base64 { media_type, data } => {
                    json!({"kind": "file", "file": {"bytes": data, "mimeType": media_type}})
                }
            },
            ContentPart::Audio { format, data } => {
                json!({"kind": "file", "file": {"bytes": data, "mimeType": format!("audio/{format}")}})
            }
        })
        .collect()
}

/// A message's text for a transcript.
fn transcript_line(message: &Message) -> Option<String> {
    match message {
        Message::User { content } => {
            let text: Vec<&str> = content
                .iter()
                .filter_map(|part| match part {
                    ContentPart::Text { text } => Some(text.as_str()),
                    _ => None,
                })
                .collect();
            Some(format!("user: {}", text.join("\n")))
        }
        Message::Assistant { .. } => message
            .answer_text()
            .filter(|text| !text.is_empty())
            .map(|text| format!("agent: {text}")),
        Message::Tool(result) => Some(format!("tool result: {}", result.text_content())),
        Message::System { .. } => None,
    }
}

/// Encodes the request as a JSON-RPC `message/stream` (or `message/send`) call.
pub(crate) fn encode(
    _config: &ProviderConfig,
    request: &ModelRequest,
    stream: bool,
) -> Result<Value, LlmError> {
    let messages = &request.messages;
    let Some(last) = messages
        .iter()
        .rposition(|message| matches!(message, Message::User { .. }))
    else {
        return Err(LlmError::Configuration(
            "a remote A2A agent is asked with a user message: the conversation has none".into(),
        ));
    };
    if messages[last + 1..]
        .iter()
        .any(|message| matches!(message, Message::Tool(_)))
    {
        return Err(LlmError::Configuration(
            "a remote A2A agent runs its own tools: it takes no tool results".into(),
        ));
    }
    let Message::User { content } = &messages[last] else {
        return Err(LlmError::Configuration("no user message".into()));
    };
    let context = messages[..last].iter().rev().find_map(context_of);
    let mut parts = Vec::new();
    if context.is_none() {
        // The remote agent has not seen this conversation: its instructions and earlier turns
        // come with the message.
        let system: Vec<&str> = messages
            .iter()
            .filter_map(|message| match message {
                Message::System { text } if !text.trim().is_empty() => Some(text.as_str()),
                _ => None,
            })
            .collect();
        if !system.is_empty() {
            parts.push(
                json!({"kind": "text", "text": format!("Instructions:\n{}", system.join("\n\n"))}),
            );
        }
        let earlier: Vec<String> = messages[..last]
            .iter()
            .filter_map(transcript_line)
            .collect();
        if !earlier.is_empty() {
            parts.push(json!({"kind": "text",
                              "text": format!("The conversation so far:\n{}", earlier.join("\n"))}));
        }
    }
    parts.extend(user_parts(content));
    let mut message = json!({
        "kind": "message",
        "role": "user",
        "messageId": random_id(),
        "parts": parts,
    });
    if let Some(context) = context {
        message["contextId"] = json!(context);
    }
    Ok(json!({
        "jsonrpc": "2.0",
        "id": random_id(),
        "method": if stream { "message/stream" } else { "message/send" },
        "params": {
            "message": message,
            "configuration": {
                "blocking": true,
                "acceptedOutputModes": ["text/plain", "text", "application/json"],
            },
        },
    }))
}

/// The text of A2A parts: text parts as they are, data parts as JSON.
fn parts_text(parts: Option<&Value>) -> String {
    parts
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|part| match part.get("kind").and_then(Value::as_str) {
                    Some("text") => part.get("text").and_then(Value::as_str).map(str::to_owned),
                    Some("data") => part.get("data").map(Value::to_string),
                    _ => None,
                })
                .collect::<Vec<_>>()
                .join("")
        })
        .unwrap_or_default()
}

/// A task failing, rejected or cancelled by the remote agent, as a provider error.
fn task_error(state: &str, status: &Value) -> LlmError {
    let said = parts_text(
        status
            .get("message")
            .and_then(|message| message.get("parts")),
    );
    let message = if said.is_empty() {
        format!("the remote agent's task is {state}")
    } else {
        format!("the remote agent's task is {state}: {said}")
    };
    error_in_stream(
        Protocol::A2a,
        &json!({"error": {"type": format!("task_{state}"), "message": message}}).to_string(),
    )
}

/// A stateful decoder of one streamed answer (also used for a whole body's one result).
#[derive(Debug, Default)]
pub(crate) struct StreamDecoder {
    /// The context was announced (as the opaque part).
    context_sent: bool,
    /// The text each artifact has given so far.
    artifacts: HashMap<String, String>,
    /// Any answer text was given.
    answered: bool,
}

impl StreamDecoder {
    /// Decodes one SSE event's data: a JSON-RPC response.
    pub(crate) fn decode(&mut self, data: &str, out: &mut Vec<Delta>) -> Result<(), LlmError> {
        if data.trim().is_empty() {
            return Ok(());
        }
        let response: Value = parse_json(Protocol::A2a, data)?;
        self.response(&response, data, out)
    }

    fn response(
        &mut self,
        response: &Value,
        raw: &str,
        out: &mut Vec<Delta>,
    ) -> Result<(), LlmError> {
        if let Some(error) = response.get("error").filter(|error| !error.is_null()) {
            return Err(error_in_stream(
                Protocol::A2a,
                &json!({"error": {
                    "code": error.get("code"),
                    "message": error.get("message").and_then(Value::as_str).unwrap_or("the remote agent refused the call"),
                }})
                .to_string(),
            ));
        }
        let Some(result) = response.get("result").filter(|result| result.is_object()) else {
            return Err(LlmError::MalformedResponse {
                detail: "a2a answer has neither `result` nor `error`".into(),
                raw: truncate(raw, 1024),
            });
        };
        self.result(result, out)
    }

    /// Announces the remote context once, first.
    fn context(&mut self, result: &Value, out: &mut Vec<Delta>) {
        if self.context_sent {
            return;
        }
        let Some(context) = result.get("contextId").and_then(Value::as_str) else {
            return;
        };
        self.context_sent = true;
        let id = result
            .get("taskId")
            .or_else(|| result.get("id"))
            .or_else(|| result.get("messageId"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        out.push(Delta::Meta { id, model: None });
        out.push(Delta::RedactedThinking(format!(
            "{CONTEXT_PREFIX}{context}"
        )));
        out.push(Delta::BlockEnd);
    }

    fn text(&mut self, text: String, out: &mut Vec<Delta>) {
        if !text.is_empty() {
            self.answered = true;
            out.push(Delta::Text(text));
        }
    }

    fn finish(&mut self, out: &mut Vec<Delta>) {
        out.push(Delta::Stop(StopReason::EndTurn));
        out.push(Delta::Done);
    }

    /// A task's status: the end for a final one.
    fn status(&mut self, status: &Value, last: bool, out: &mut Vec<Delta>) -> Result<(), LlmError> {
        let state = status
            .get("state")
            .and_then(Value::as_str)
            .unwrap_or("unknown");
        match state {
            "completed" => {
                if !self.answered {
                    let said = parts_text(status.get("message").and_then(|m| m.get("parts")));
                    self.text(said, out);
                }
                self.finish(out);
            }
            "input-required" | "auth-required" => {
                // The agent's question is its answer; the next user turn answers it.
                let said = parts_text(status.get("message").and_then(|m| m.get("parts")));
                let said = if said.is_empty() {
                    format!("(the remote agent needs {})", state.replace('-', " "))
                } else {
                    said
                };
                if self.answered {
                    self.text(format!("\n\n{said}"), out);
                } else {
                    self.text(said, out);
                }
                self.finish(out);
            }
            "failed" | "rejected" | "canceled" => return Err(task_error(state, status)),
            _ if last => {
                return Err(LlmError::MalformedResponse {
                    detail: format!("the remote agent's stream ended with its task {state}"),
                    raw: truncate(&status.to_string(), 1024),
                });
            }
            _ => {}
        }
        Ok(())
    }

    /// One result: a task, a message, or a task's update.
    fn result(&mut self, result: &Value, out: &mut Vec<Delta>) -> Result<(), LlmError> {
        let kind = result
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_else(|| {
                if result.get("messageId").is_some() {
                    "message"
                } else if result.get("taskId").is_some() && result.get("final").is_some() {
                    "status-update"
                } else {
                    "task"
                }
            });
        self.context(result, out);
        match kind {
            "message" => {
                let text = parts_text(result.get("parts"));
                self.text(text, out);
                self.finish(out);
            }
            "task" => {
                let status = result.get("status").cloned().unwrap_or(Value::Null);
                let state = status
                    .get("state")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if matches!(state, "completed" | "input-required" | "auth-required")
                    && !self.answered
                {
                    let text: Vec<String> = result
                        .get("artifacts")
                        .and_then(Value::as_array)
                        .map(|artifacts| {
                            artifacts
                                .iter()
                                .map(|artifact| parts_text(artifact.get("parts")))
                                .filter(|text| !text.is_empty())
                                .collect()
                        })
                        .unwrap_or_default();
                    self.text(text.join("\n\n"), out);
                }
                if !matches!(state, "submitted" | "working" | "") {
                    self.status(&status, true, out)?;
                }
            }
            "artifact-update" => {
                let artifact = result.get("artifact").cloned().unwrap_or(Value::Null);
                let id = artifact
                    .get("artifactId")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                let text = parts_text(artifact.get("parts"));
                let append = result
                    .get("append")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let so_far = self.artifacts.entry(id).or_default();
                let new = if append || so_far.is_empty() {
                    so_far.push_str(&text);
                    text
                } else if let Some(rest) = text.strip_prefix(so_far.as_str()) {
                    // The whole artifact again: only what it adds is new.
                    let rest = rest.to_owned();
                    so_far.clone_from(&text);
                    rest
                } else {
                    // A replacement that does not extend what was streamed: what was streamed
                    // stands (a stream cannot take text back).
                    so_far.clone_from(&text);
                    String::new()
                };
                self.text(new, out);
            }
            "status-update" => {
                let last = result
                    .get("final")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let status = result.get("status").cloned().unwrap_or(Value::Null);
                self.status(&status, last, out)?;
            }
            other => {
                tracing::debug!(
                    kind = other,
                    "an A2A stream event of an unknown kind was skipped"
                );
            }
        }
        Ok(())
    }
}

/// Decodes a whole `message/send` answer.
pub(crate) fn decode_body(body: &[u8]) -> Result<Vec<Delta>, LlmError> {
    let response: Value = parse_body(Protocol::A2a, body)?;
    let mut out = Vec::new();
    let mut decoder = StreamDecoder::default();
    decoder.response(&response, &String::from_utf8_lossy(body), &mut out)?;
    if !out.contains(&Delta::Done) {
        return Err(LlmError::MalformedResponse {
            detail: "the remote agent answered a task that has not ended (it did not block)".into(),
            raw: truncate(&String::from_utf8_lossy(body), 1024),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(events: &[Value]) -> Result<Vec<Delta>, LlmError> {
        let mut decoder = StreamDecoder::default();
        let mut out = Vec::new();
        for event in events {
            decoder.decode(
                &json!({"jsonrpc": "2.0", "id": 1, "result": event}).to_string(),
                &mut out,
            )?;
        }
        Ok(out)
    }

    fn texts(deltas: &[Delta]) -> String {
        deltas
            .iter()
            .filter_map(|delta| match delta {
                Delta::Text(text) => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_streamed_task_gives_its_text_once_and_keeps_its_context() {
        let update = |text: &str, append: bool| {
            json!({"kind": "artifact-update", "taskId": "t", "contextId": "c",
                   "artifact": {"artifactId": "a", "parts": [{"kind": "text", "text": text}]},
                   "append": append})
        };
        let deltas = decode_all(&[
            json!({"kind": "task", "id": "t", "contextId": "c", "status": {"state": "submitted"}}),
            json!({"kind": "status-update", "taskId": "t", "contextId": "c", "final": false,
                   "status": {"state": "working"}}),
            update("Hello ", false),
            update("world", true),
            // The whole artifact again at the end: nothing new.
            update("Hello world", false),
            json!({"kind": "status-update", "taskId": "t", "contextId": "c", "final": true,
                   "status": {"state": "completed"}}),
        ])
        .unwrap();
        assert_eq!(texts(&deltas), "Hello world");
        assert!(deltas.contains(&Delta::RedactedThinking("a2a-context:c".into())));
        assert_eq!(deltas.last(), Some(&Delta::Done));
    }

    #[test]
    fn failures_and_questions_end_the_answer() {
        let failed = decode_all(&[
            json!({"kind": "status-update", "taskId": "t", "contextId": "c",
            "final": true, "status": {"state": "failed",
            "message": {"kind": "message", "role": "agent", "messageId": "m",
                        "parts": [{"kind": "text", "text": "out of cheese"}]}}}),
        ])
        .unwrap_err();
        assert!(failed.to_string().contains("out of cheese"), "{failed}");
        let asked = decode_all(&[json!({"kind": "task", "id": "t", "contextId": "c",
            "status": {"state": "input-required",
                       "message": {"kind": "message", "role": "agent", "messageId": "m",
                                   "parts": [{"kind": "text", "text": "Which city?"}]}}})])
        .unwrap();
        assert_eq!(texts(&asked), "Which city?");
        let message = decode_all(
            &[json!({"kind": "message", "role": "agent", "messageId": "m",
            "contextId": "c", "parts": [{"kind": "text", "text": "Hi"}]})],
        )
        .unwrap();
        assert_eq!(texts(&message), "Hi");
        let mut decoder = StreamDecoder::default();
        let error = decoder
            .decode(
                r#"{"jsonrpc": "2.0", "id": 1, "error": {"code": -32001, "message": "no task"}}"#,
                &mut Vec::new(),
            )
            .unwrap_err();
        assert!(error.to_string().contains("no task"), "{error}");
        assert!(decoder.decode("{not json", &mut Vec::new()).is_err());
    }

    #[test]
    fn the_next_turn_sends_only_the_new_message_in_the_remote_context() {
        let config = ProviderConfig::new(Protocol::A2a, "agent");
        let first = ModelRequest::new(vec![Message::system("Be kind."), Message::user("Hi")]);
        let body = encode(&config, &first, true).unwrap();
        assert_eq!(body["method"], "message/stream");
        let parts = body["params"]["message"]["parts"].as_array().unwrap();
        assert_eq!(parts.len(), 2, "{body}");
        assert!(body["params"]["message"].get("contextId").is_none());
        let answer = Message::Assistant {
            content: vec![
                AssistantPart::Thinking(Thinking::Redacted {
                    data: "a2a-context:c1".into(),
                }),
                AssistantPart::Text {
                    text: "Hello".into(),
                },
            ],
        };
        let second = ModelRequest::new(vec![
            Message::system("Be kind."),
            Message::user("Hi"),
            answer,
            Message::user("Again"),
        ]);
        let body = encode(&config, &second, false).unwrap();
        assert_eq!(body["method"], "message/send");
        assert_eq!(body["params"]["message"]["contextId"], "c1");
        assert_eq!(
            body["params"]["message"]["parts"],
            json!([{"kind": "text", "text": "Again"}])
        );
    }

    #[test]
    fn other_protocols_opaque_state_never_reaches_anthropic() {
        let answer = Message::Assistant {
            content: vec![
                AssistantPart::Thinking(Thinking::Redacted {
                    data: "a2a-context:c1".into(),
                }),
                AssistantPart::Thinking(Thinking::Text {
                    text: "summary".into(),
                    signature: Some(
                        "openai-responses:{\"id\":\"rs_1\",\"encrypted_content\":\"e\"}".into(),
                    ),
                }),
                AssistantPart::Thinking(Thinking::Text {
                    text: "own".into(),
                    signature: Some("anthropic-signature".into()),
                }),
                AssistantPart::Text {
                    text: "Hello".into(),
                },
            ],
        };
        let request = ModelRequest::new(vec![Message::user("Hi"), answer, Message::user("Again")]);
        let config = ProviderConfig::new(Protocol::Anthropic, "claude");
        let body = crate::provider::anthropic::encode(&config, &request, false).unwrap();
        assert_eq!(
            body["messages"][1]["content"],
            json!([
                {"type": "thinking", "thinking": "own", "signature": "anthropic-signature"},
                {"type": "text", "text": "Hello"}
            ]),
            "{body}"
        );
    }
}
