//! Wire protocols the mock speaks ([`Protocol`]) and the invariants a well-formed request must
//! satisfy in each of them ([`check_request`]).

mod anthropic;
mod ollama;
mod openai;
mod openai_responses;

use std::fmt;

use serde_json::Value;

/// A model provider wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// OpenAI chat completions (`.../chat/completions`), also spoken by OpenAI-compatible servers.
    OpenAi,
    /// OpenAI Responses (`.../responses`).
    OpenAiResponses,
    /// Anthropic Messages (`.../messages`).
    Anthropic,
    /// Ollama native (`/api/chat`, `/api/generate`).
    Ollama,
}

impl Protocol {
    /// Infers the protocol from a request path (a query string, if present, is ignored).
    ///
    /// `.../chat/completions` is OpenAI, `.../responses` OpenAI Responses, `.../messages` is
    /// Anthropic, `.../api/chat` and
    /// `.../api/generate` are Ollama; anything else is `None`.
    pub fn from_path(path: &str) -> Option<Protocol> {
        let path = path.split_once('?').map_or(path, |(p, _)| p);
        let path = path.trim_end_matches('/');
        if path.ends_with("/chat/completions") {
            Some(Protocol::OpenAi)
        } else if path.ends_with("/responses") {
            Some(Protocol::OpenAiResponses)
        } else if path.ends_with("/messages") {
            Some(Protocol::Anthropic)
        } else if path.ends_with("/api/chat") || path.ends_with("/api/generate") {
            Some(Protocol::Ollama)
        } else {
            None
        }
    }

    /// Short lowercase name: `openai`, `anthropic` or `ollama`.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::OpenAi => "openai",
            Protocol::OpenAiResponses => "openai-responses",
            Protocol::Anthropic => "anthropic",
            Protocol::Ollama => "ollama",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A broken protocol invariant in a request body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request {request_index} ({protocol}): {message}")]
pub struct ProtocolViolation {
    /// Position of the request among those the mock received (0 from [`check_request`], which
    /// sees a single body).
    pub request_index: usize,
    /// The protocol whose rules were broken.
    pub protocol: Protocol,
    /// What is wrong, naming the offending message (e.g. `messages[3]: ...`).
    pub message: String,
}

/// Checks one request body against `protocol`'s conversation invariants.
///
/// Returns every violation found (empty when the body is well-formed). `request_index` is 0 in
/// the results; [`crate::MockProvider::check_protocol`] fills in real positions.
pub fn check_request(protocol: Protocol, body: &Value) -> Vec<ProtocolViolation> {
    let mut messages = Vec::new();
    if !body.is_object() {
        messages.push("request body is not a JSON object".to_owned());
    } else {
        match protocol {
            Protocol::OpenAi => openai::check(body, &mut messages),
            Protocol::OpenAiResponses => openai_responses::check(body, &mut messages),
            Protocol::Anthropic => anthropic::check(body, &mut messages),
            Protocol::Ollama => ollama::check(body, &mut messages),
        }
    }
    messages
        .into_iter()
        .map(|message| ProtocolViolation {
            request_index: 0,
            protocol,
            message,
        })
        .collect()
}

/// The request's `messages` array, or a violation saying it is missing.
fn messages_of<'a>(body: &'a Value, out: &mut Vec<String>) -> Option<&'a Vec<Value>> {
    let messages = body.get("messages").and_then(Value::as_array);
    if messages.is_none() {
        out.push("`messages` is missing or not an array".to_owned());
    }
    messages
}

/// The `role` of a message, or `""` when absent.
fn role_of(message: &Value) -> &str {
    message
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A message's `tool_calls`, empty when absent.
fn tool_calls_of(message: &Value) -> &[Value] {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}
