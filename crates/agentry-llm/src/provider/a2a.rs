//! A remote agent over A2A (the Agent2Agent protocol, JSON-RPC, v1.0 or v0.3) as a model: the
//! conversation's latest user turn becomes an A2A message (`message/stream`, or `message/send`
//! when not streamed; 1.0's `SendStreamingMessage` / `SendMessage`) to the agent's endpoint,
//! and its task's answer comes back as text.
//!
//! Which version: the agent card's (`<endpoint>/.well-known/agent-card.json`, read once per
//! client): 1.0 when it lists a JSON-RPC interface of 1.x — what new clients prefer, and all a
//! 1.0-only server answers — else 0.3. A request is made in 0.3's shape and put in 1.0's on the
//! way out ([`A2aVersion::V1_0`]); a 1.0 answer (results wrapped by what they hold, `TASK_STATE_*`
//! states, parts and roles without kinds) is read in 0.3's shape on the way in.
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

/// The A2A versions this client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum A2aVersion {
    /// 0.3: `message/send`, `kind`-tagged objects.
    V0_3,
    /// 1.0: `SendMessage`, results wrapped by what they hold, `TASK_STATE_*`.
    V1_0,
}

impl A2aVersion {
    /// The `A2A-Version` header's value.
    pub fn header(self) -> &'static str {
        match self {
            Self::V0_3 => "0.3",
            Self::V1_0 => "1.0",
        }
    }

    /// The version an agent card says to speak: 1.0 when it lists a JSON-RPC interface of 1.x,
    /// else 0.3 (a 0.3 card names its version at the top, `protocolVersion`).
    pub fn of_card(card: &Value) -> Self {
        let speaks_1 = card
            .get("supportedInterfaces")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|interface| {
                let binding = interface
                    .get("protocolBinding")
                    .and_then(Value::as_str)
                    .unwrap_or("JSONRPC");
                let version = interface
                    .get("protocolVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                binding.eq_ignore_ascii_case("JSONRPC")
                    && (version == "1" || version.starts_with("1."))
            });
        if speaks_1 { Self::V1_0 } else { Self::V0_3 }
    }
}

/// Where an agent's card is, beside its JSON-RPC endpoint.
pub(crate) fn card_url(endpoint: &str) -> String {
    format!(
        "{}/.well-known/agent-card.json",
        endpoint.trim_end_matches('/')
    )
}

/// Reads the agent card at `endpoint` (with the client's headers: a card may need its key) and
/// answers the version it says to speak: 0.3 when the agent has no card there (a 4xx answer,
/// or one that is not a card); `None` when the card could not be asked for (a network error,
/// a timeout, a 5xx), to be asked again next time.
pub(crate) async fn discover_version(
    http: &reqwest::Client,
    endpoint: &str,
    headers: &reqwest::header::HeaderMap,
    timeout: std::time::Duration,
) -> Option<A2aVersion> {
    let mut headers = headers.clone();
    headers.remove(reqwest::header::CONTENT_TYPE);
    let response = tokio::time::timeout(
        timeout,
        http.get(card_url(endpoint)).headers(headers).send(),
    )
    .await
    .ok()?
    .ok()?;
    let status = response.status();
    if status.is_server_error() {
        return None;
    }
    if !status.is_success() {
        return Some(A2aVersion::V0_3);
    }
    let card = tokio::time::timeout(timeout, response.json::<Value>())
        .await
        .ok()?;
    Some(card.map_or(A2aVersion::V0_3, |card| A2aVersion::of_card(&card)))
}

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

/// Encodes the request in `version`'s shape (see [`encode`]).
pub(crate) fn encode_version(
    config: &ProviderConfig,
    request: &ModelRequest,
    stream: bool,
    version: A2aVersion,
) -> Result<Value, LlmError> {
    Ok(from_v03(encode(config, request, stream)?, version))
}

/// A request made in 0.3's shape, in `version`'s.
pub(crate) fn from_v03(body: Value, version: A2aVersion) -> Value {
    match version {
        A2aVersion::V0_3 => body,
        A2aVersion::V1_0 => request_to_v10(body),
    }
}

/// A 0.3 `message/send` or `message/stream` call in 1.0's shape: the method renamed, the
/// message's role and parts without kinds, `blocking` as `returnImmediately`.
fn request_to_v10(mut body: Value) -> Value {
    let method = match body["method"].as_str() {
        Some("message/stream") => "SendStreamingMessage",
        _ => "SendMessage",
    };
    body["method"] = json!(method);
    if let Some(Value::Object(message)) = body.pointer_mut("/params/message") {
        message.remove("kind");
        message.insert("role".into(), json!("ROLE_USER"));
        if let Some(Value::Array(parts)) = message.get_mut("parts") {
            for part in parts.iter_mut() {
                *part = part_to_v10(part);
            }
        }
    }
    if let Some(Value::Object(configuration)) = body.pointer_mut("/params/configuration")
        && let Some(blocking) = configuration.remove("blocking")
    {
        let immediately = !blocking.as_bool().unwrap_or(true);
        configuration.insert("returnImmediately".into(), json!(immediately));
    }
    body
}

/// A 0.3 part (`kind`, a `file` object) as 1.0's (a text, data, `raw` or `url` part).
fn part_to_v10(part: &Value) -> Value {
    match part.get("kind").and_then(Value::as_str) {
        Some("file") => {
            let file = part.get("file").cloned().unwrap_or(Value::Null);
            let mut v10 = serde_json::Map::new();
            for (from, to) in [("bytes", "raw"), ("uri", "url"), ("mimeType", "mediaType")] {
                if let Some(value) = file.get(from) {
                    v10.insert(to.into(), value.clone());
                }
            }
            Value::Object(v10)
        }
        _ => {
            let mut v10 = part.clone();
            if let Value::Object(map) = &mut v10 {
                map.remove("kind");
            }
            v10
        }
    }
}

/// A 1.0 result in 0.3's shape: a `task`, `message`, `statusUpdate` or `artifactUpdate` wrapper
/// unwrapped and tagged with its kind, `TASK_STATE_*` states and `ROLE_*` roles renamed, parts
/// tagged; a status update that ends or interrupts the task marked `final`. `None` for a 0.3
/// result.
fn result_to_v03(result: &Value) -> Option<Value> {
    let object = result
        .as_object()
        .filter(|object| !object.contains_key("kind"))?;
    let (wrapper, inner) = object.iter().next().filter(|_| object.len() == 1)?;
    let kind = match wrapper.as_str() {
        "task" => "task",
        "message" => "message",
        "statusUpdate" => "status-update",
        "artifactUpdate" => "artifact-update",
        _ => return None,
    };
    let mut v03 = inner.clone();
    v03["kind"] = json!(kind);
    match kind {
        "message" => message_to_v03(&mut v03),
        _ => {
            if let Some(status) = v03.get_mut("status") {
                status_to_v03(status);
            }
            if let Some(Value::Array(history)) = v03.get_mut("history") {
                history.iter_mut().for_each(message_to_v03);
            }
            if let Some(Value::Array(artifacts)) = v03.get_mut("artifacts") {
                artifacts.iter_mut().for_each(artifact_to_v03);
            }
            if let Some(artifact) = v03.get_mut("artifact") {
                artifact_to_v03(artifact);
            }
        }
    }
    if kind == "status-update" && v03.get("final").is_none() {
        let state = v03.pointer("/status/state").and_then(Value::as_str);
        let ends = !matches!(state, Some("submitted" | "working") | None);
        v03["final"] = json!(ends);
    }
    Some(v03)
}

/// A 1.0 state (`TASK_STATE_INPUT_REQUIRED`) as 0.3 names it (`input-required`).
fn state_to_v03(state: &str) -> String {
    state.strip_prefix("TASK_STATE_").map_or_else(
        || state.to_owned(),
        |rest| rest.to_ascii_lowercase().replace('_', "-"),
    )
}

fn status_to_v03(status: &mut Value) {
    if let Some(state) = status.get("state").and_then(Value::as_str) {
        status["state"] = json!(state_to_v03(state));
    }
    if let Some(message) = status.get_mut("message") {
        message_to_v03(message);
    }
}

fn message_to_v03(message: &mut Value) {
    let Value::Object(map) = message else {
        return;
    };
    map.insert("kind".into(), json!("message"));
    if let Some(role) = map.get("role").and_then(Value::as_str) {
        let role = match role {
            "ROLE_USER" => "user",
            "ROLE_AGENT" => "agent",
            other => other,
        };
        map.insert("role".into(), json!(role));
    }
    if let Some(Value::Array(parts)) = map.get_mut("parts") {
        parts.iter_mut().for_each(part_to_v03);
    }
}

fn artifact_to_v03(artifact: &mut Value) {
    if let Some(Value::Array(parts)) = artifact.get_mut("parts") {
        parts.iter_mut().for_each(part_to_v03);
    }
}

/// A 1.0 part as 0.3's: text and data as they are with their kind, `raw` or `url` as a file.
fn part_to_v03(part: &mut Value) {
    let Value::Object(map) = part else {
        return;
    };
    if map.contains_key("kind") {
        return;
    }
    if map.contains_key("text") {
        map.insert("kind".into(), json!("text"));
    } else if map.contains_key("data") {
        map.insert("kind".into(), json!("data"));
    } else {
        let mut file = serde_json::Map::new();
        for (from, to) in [("raw", "bytes"), ("url", "uri"), ("mediaType", "mimeType")] {
            if let Some(value) = map.remove(from) {
                file.insert(to.into(), value);
            }
        }
        map.insert("kind".into(), json!("file"));
        map.insert("file".into(), Value::Object(file));
    }
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

    /// One result: a task, a message, or a task's update (in 1.0's shape or 0.3's).
    fn result(&mut self, result: &Value, out: &mut Vec<Delta>) -> Result<(), LlmError> {
        let converted = result_to_v03(result);
        let result = converted.as_ref().unwrap_or(result);
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
    fn the_card_says_which_version_to_speak() {
        let interface = |version: &str| json!({"url": "http://x/", "protocolBinding": "JSONRPC", "protocolVersion": version});
        let only_1 = json!({"supportedInterfaces": [interface("1.0")]});
        let both = json!({"supportedInterfaces": [interface("0.3"), interface("1.0")]});
        let only_03 = json!({"supportedInterfaces": [interface("0.3")]});
        let old = json!({"protocolVersion": "0.3.0", "url": "http://x/"});
        let grpc = json!({"supportedInterfaces": [
            {"url": "x", "protocolBinding": "GRPC", "protocolVersion": "1.0"}]});
        assert_eq!(A2aVersion::of_card(&only_1), A2aVersion::V1_0);
        assert_eq!(A2aVersion::of_card(&both), A2aVersion::V1_0);
        assert_eq!(A2aVersion::of_card(&only_03), A2aVersion::V0_3);
        assert_eq!(A2aVersion::of_card(&old), A2aVersion::V0_3);
        assert_eq!(A2aVersion::of_card(&grpc), A2aVersion::V0_3);
        assert_eq!(
            card_url("http://h/a2a/x/"),
            "http://h/a2a/x/.well-known/agent-card.json"
        );
    }

    #[test]
    fn a_1_0_request_has_1_0_names_roles_and_parts() {
        let config = ProviderConfig::new(Protocol::A2a, "agent");
        let request = ModelRequest::new(vec![Message::User {
            content: vec![
                ContentPart::text("Look"),
                ContentPart::Image {
                    source: ImageSource::Url {
                        url: "https://x/cat.png".into(),
                    },
                },
            ],
        }]);
        let body = encode_version(&config, &request, true, A2aVersion::V1_0).unwrap();
        assert_eq!(body["method"], "SendStreamingMessage");
        let message = &body["params"]["message"];
        assert_eq!(message["role"], "ROLE_USER");
        assert!(message.get("kind").is_none(), "{body}");
        assert_eq!(
            message["parts"],
            json!([{"text": "Look"}, {"url": "https://x/cat.png"}])
        );
        assert_eq!(body["params"]["configuration"]["returnImmediately"], false);
        assert!(body["params"]["configuration"].get("blocking").is_none());
        let whole = encode_version(&config, &request, false, A2aVersion::V1_0).unwrap();
        assert_eq!(whole["method"], "SendMessage");
    }

    #[test]
    fn a_1_0_stream_and_a_1_0_answer_are_read() {
        // As the `a2a-sdk` 1.x server streams (its events, trimmed).
        let events = [
            json!({"task": {"id": "t", "contextId": "c", "status": {"state": "TASK_STATE_SUBMITTED"},
                            "history": [{"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "hi"}]}]}}),
            json!({"statusUpdate": {"taskId": "t", "contextId": "c",
                                    "status": {"state": "TASK_STATE_WORKING"}}}),
            json!({"artifactUpdate": {"taskId": "t", "contextId": "c",
                                      "artifact": {"artifactId": "a", "parts": [{"text": "HEL"}]}}}),
            json!({"artifactUpdate": {"taskId": "t", "contextId": "c", "append": true, "lastChunk": true,
                                      "artifact": {"artifactId": "a", "parts": [{"text": "LO"}]}}}),
            json!({"statusUpdate": {"taskId": "t", "contextId": "c",
                                    "status": {"state": "TASK_STATE_COMPLETED"}}}),
        ];
        let deltas = decode_all(&events).unwrap();
        assert_eq!(texts(&deltas), "HELLO");
        assert!(deltas.contains(&Delta::RedactedThinking("a2a-context:c".into())));
        assert!(deltas.contains(&Delta::Done));
        // A question ends the answer; a failure is the agent's error.
        let asked = decode_all(&[json!({"statusUpdate": {"taskId": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"messageId": "q",
                "role": "ROLE_AGENT", "parts": [{"text": "Which city?"}]}}}})])
        .unwrap();
        assert_eq!(texts(&asked), "Which city?");
        let failed = decode_all(&[json!({"statusUpdate": {"taskId": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_FAILED", "message": {"messageId": "f",
                "role": "ROLE_AGENT", "parts": [{"text": "out of cheese"}]}}}})])
        .unwrap_err();
        assert!(failed.to_string().contains("out of cheese"), "{failed}");
        // `SendMessage`'s whole answer: a task, or a message.
        let task = json!({"jsonrpc": "2.0", "id": 1, "result": {"task": {"id": "t", "contextId": "c",
            "status": {"state": "TASK_STATE_COMPLETED"},
            "artifacts": [{"artifactId": "a", "parts": [{"text": "Done."}, {"data": {"n": 1}}]}]}}});
        let deltas = decode_body(task.to_string().as_bytes()).unwrap();
        assert_eq!(texts(&deltas), "Done.{\"n\":1}");
        let message = json!({"jsonrpc": "2.0", "id": 1, "result": {"message": {"messageId": "m",
            "contextId": "c", "role": "ROLE_AGENT", "parts": [{"text": "Hi"}]}}});
        assert_eq!(
            texts(&decode_body(message.to_string().as_bytes()).unwrap()),
            "Hi"
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
