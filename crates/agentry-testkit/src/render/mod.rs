//! Rendering a [`ScriptedTurn`] into the response body a real provider would send for a given
//! request: protocol from the path, streaming or not from the body.
//!
//! Output is deterministic for a given request sequence number (fixed timestamps, ids derived
//! from the sequence), so it can be snapshotted.

mod anthropic;
mod ollama;
mod openai;
mod openai_responses;

use serde_json::Value;

use crate::protocol::Protocol;
use crate::script::ScriptedTurn;

/// Unix time stamped on rendered responses (2025-01-01T00:00:00Z).
const CREATED_UNIX: u64 = 1_735_689_600;
/// RFC 3339 form of [`CREATED_UNIX`], for Ollama's `created_at`.
const CREATED_RFC3339: &str = "2025-01-01T00:00:00Z";
/// Model name used when the request does not name one.
const DEFAULT_MODEL: &str = "mock-model";

/// What rendering needs to know about the incoming request.
#[derive(Debug, Clone)]
pub(crate) struct TurnRequest {
    pub(crate) protocol: Protocol,
    /// Whether the client asked for a streamed response (protocol defaults applied).
    pub(crate) stream: bool,
    /// OpenAI `stream_options.include_usage`.
    pub(crate) include_usage: bool,
    /// Ollama `/api/generate` rather than `/api/chat`.
    pub(crate) generate: bool,
    /// The request's `model`, echoed back.
    pub(crate) model: String,
    /// Position of the request among those the mock received; used in response ids.
    pub(crate) sequence: usize,
}

impl TurnRequest {
    /// Reads the rendering-relevant fields of a request.
    pub(crate) fn new(protocol: Protocol, path: &str, body: &Value, sequence: usize) -> Self {
        let flag = |name: &str| body.get(name).and_then(Value::as_bool);
        let stream = match protocol {
            // Ollama streams unless told not to.
            Protocol::Ollama => flag("stream") != Some(false),
            Protocol::OpenAi | Protocol::OpenAiResponses | Protocol::Anthropic => {
                flag("stream") == Some(true)
            }
        };
        let include_usage = body
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let model = body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or(DEFAULT_MODEL)
            .to_owned();
        TurnRequest {
            protocol,
            stream,
            include_usage,
            generate: path.trim_end_matches('/').ends_with("/api/generate"),
            model,
            sequence,
        }
    }
}

/// A rendered response body and its content type.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RenderedTurn {
    pub(crate) content_type: &'static str,
    pub(crate) body: String,
}

impl RenderedTurn {
    /// A server-sent event stream.
    fn sse(body: String) -> Self {
        Self {
            content_type: "text/event-stream; charset=utf-8",
            body,
        }
    }

    /// A whole JSON body.
    fn json(body: &Value) -> Self {
        Self {
            content_type: "application/json",
            body: body.to_string(),
        }
    }
}

/// Renders `turn` as the response to `request`.
pub(crate) fn render(turn: &ScriptedTurn, request: &TurnRequest) -> RenderedTurn {
    match request.protocol {
        Protocol::OpenAi => openai::render(turn, request),
        Protocol::OpenAiResponses => openai_responses::render(turn, request),
        Protocol::Anthropic => anthropic::render(turn, request),
        Protocol::Ollama => ollama::render(turn, request),
    }
}

/// Splits text the way token streams arrive: a new fragment starts at each word (leading
/// whitespace included). Text without word breaks is cut in two, so any text of two or more
/// characters yields at least two fragments.
pub(crate) fn text_fragments(text: &str) -> Vec<&str> {
    let mut fragments = Vec::new();
    let mut start = 0;
    let mut previous_is_space = true;
    for (index, c) in text.char_indices() {
        let is_space = c.is_whitespace();
        if is_space && !previous_is_space && index > start {
            fragments.push(&text[start..index]);
            start = index;
        }
        previous_is_space = is_space;
    }
    if start < text.len() {
        fragments.push(&text[start..]);
    }
    if fragments.len() < 2 {
        return even_fragments(text, 2);
    }
    fragments
}

/// Splits serialized JSON into three roughly equal fragments (at least two when it has two or
/// more characters), cutting through keys and strings like real providers do.
pub(crate) fn json_fragments(json: &str) -> Vec<&str> {
    even_fragments(json, 3)
}

/// Splits `text` at char boundaries into at most `parts` non-empty pieces of similar size.
fn even_fragments(text: &str, parts: usize) -> Vec<&str> {
    let mut fragments = Vec::with_capacity(parts);
    let mut start = 0;
    for k in 1..parts {
        let mut cut = text.len() * k / parts;
        while cut < text.len() && !text.is_char_boundary(cut) {
            cut += 1;
        }
        if cut > start && cut < text.len() {
            fragments.push(&text[start..cut]);
            start = cut;
        }
    }
    if start < text.len() {
        fragments.push(&text[start..]);
    }
    fragments
}

/// Appends one SSE message made of a `data:` line.
fn push_sse_data(out: &mut String, data: &Value) {
    out.push_str("data: ");
    out.push_str(&data.to_string());
    out.push_str("\n\n");
}

/// Appends one SSE message with an `event:` line and a `data:` line.
fn push_sse_event(out: &mut String, event: &str, data: &Value) {
    out.push_str("event: ");
    out.push_str(event);
    out.push('\n');
    push_sse_data(out, data);
}

/// Appends one NDJSON line.
fn push_ndjson_line(out: &mut String, line: &Value) {
    out.push_str(&line.to_string());
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_fragments_keep_leading_spaces_and_reassemble() {
        let text = "Hello there, how are you?";
        let fragments = text_fragments(text);
        assert_eq!(fragments, ["Hello", " there,", " how", " are", " you?"]);
        assert_eq!(fragments.concat(), text);
    }

    #[test]
    fn single_word_is_cut_in_two_at_a_char_boundary() {
        let fragments = text_fragments("héé");
        assert_eq!(fragments.len(), 2);
        assert_eq!(fragments.concat(), "héé");
        assert_eq!(text_fragments("x"), ["x"]);
        assert!(text_fragments("").is_empty());
    }

    #[test]
    fn json_fragments_split_even_tiny_objects() {
        assert_eq!(json_fragments("{}"), ["{", "}"]);
        let json = r#"{"city":"Paris"}"#;
        let fragments = json_fragments(json);
        assert_eq!(fragments.len(), 3);
        assert_eq!(fragments.concat(), json);
    }
}
