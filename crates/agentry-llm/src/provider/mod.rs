//! The wire protocols (three model APIs, and remote agents over A2A): request encoding,
//! response decoding, error bodies.
//!
//! Each protocol module turns a [`crate::ModelRequest`] into its JSON body, and decodes its
//! stream events (SSE or NDJSON) and whole bodies into normalised deltas. Everything
//! protocol-specific lives here and nowhere else.

pub mod a2a;
pub mod anthropic;
pub mod ollama;
pub mod openai;
pub mod openai_responses;

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::delta::Delta;
use crate::error::{LlmError, ProviderError, truncate};

/// A provider wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// OpenAI chat completions, and the many OpenAI-compatible servers.
    #[serde(
        rename = "openai",
        alias = "openai-compatible",
        alias = "openai_compatible"
    )]
    OpenAi,
    /// OpenAI's Responses API (`/responses`): stateless, encrypted reasoning kept across turns.
    #[serde(rename = "openai-responses", alias = "openai_responses")]
    OpenAiResponses,
    /// Anthropic Messages.
    Anthropic,
    /// Ollama's native `/api/chat`.
    Ollama,
    /// A remote agent over A2A (JSON-RPC, 1.0 or 0.3 as its card says): its endpoint is the
    /// base URL.
    A2a,
}

impl Protocol {
    /// The protocol's short name, as used in configuration and errors.
    pub fn name(self) -> &'static str {
        match self {
            Self::OpenAi => "openai",
            Self::OpenAiResponses => "openai-responses",
            Self::Anthropic => "anthropic",
            Self::Ollama => "ollama",
            Self::A2a => "a2a",
        }
    }

    /// How the protocol frames a streamed body.
    pub(crate) fn framing(self) -> Framing {
        match self {
            Self::OpenAi | Self::OpenAiResponses | Self::Anthropic | Self::A2a => Framing::Sse,
            Self::Ollama => Framing::Ndjson,
        }
    }

    /// The default base URL of the protocol's reference service.
    pub fn default_base_url(self) -> &'static str {
        match self {
            Self::OpenAi | Self::OpenAiResponses => "https://api.openai.com/v1",
            Self::Anthropic => "https://api.anthropic.com/v1",
            Self::Ollama => "http://localhost:11434",
            // An agent's endpoint has no default: it is configured.
            Self::A2a => "",
        }
    }

    /// The environment variable holding the API key by default (`None` for Ollama).
    pub fn default_api_key_env(self) -> Option<&'static str> {
        match self {
            Self::OpenAi | Self::OpenAiResponses => Some("OPENAI_API_KEY"),
            Self::Anthropic => Some("ANTHROPIC_API_KEY"),
            Self::Ollama | Self::A2a => None,
        }
    }

    /// Decodes a whole (non-streamed) response body.
    pub(crate) fn decode_body(self, body: &[u8]) -> Result<Vec<Delta>, LlmError> {
        match self {
            Self::OpenAi => openai::decode_body(parse_body(self, body)?),
            Self::OpenAiResponses => openai_responses::decode_body(body),
            Self::Anthropic => anthropic::decode_body(parse_body(self, body)?),
            Self::Ollama => ollama::decode_body(body),
            Self::A2a => a2a::decode_body(body),
        }
    }
}

impl std::str::FromStr for Protocol {
    type Err = LlmError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "openai" | "openai-compatible" | "openai_compatible" => Ok(Self::OpenAi),
            "openai-responses" | "openai_responses" => Ok(Self::OpenAiResponses),
            "anthropic" => Ok(Self::Anthropic),
            "ollama" => Ok(Self::Ollama),
            "a2a" => Ok(Self::A2a),
            other => Err(LlmError::Configuration(format!(
                "unknown provider {other:?}: expected openai, openai-responses, anthropic, ollama or a2a"
            ))),
        }
    }
}

/// How a streamed body is cut into events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// Server-sent events.
    Sse,
    /// One JSON object per line.
    Ndjson,
}

/// A stateful decoder of one streamed response.
pub(crate) enum StreamDecoder {
    OpenAi(openai::StreamDecoder),
    OpenAiResponses(openai_responses::StreamDecoder),
    Anthropic(anthropic::StreamDecoder),
    Ollama(ollama::StreamDecoder),
    A2a(a2a::StreamDecoder),
}

impl StreamDecoder {
    pub(crate) fn new(protocol: Protocol) -> Self {
        match protocol {
            Protocol::OpenAi => Self::OpenAi(openai::StreamDecoder::default()),
            Protocol::OpenAiResponses => {
                Self::OpenAiResponses(openai_responses::StreamDecoder::default())
            }
            Protocol::Anthropic => Self::Anthropic(anthropic::StreamDecoder::default()),
            Protocol::Ollama => Self::Ollama(ollama::StreamDecoder::default()),
            Protocol::A2a => Self::A2a(a2a::StreamDecoder::default()),
        }
    }

    /// Decodes one SSE event (or, for NDJSON, one line given as `data`).
    pub(crate) fn decode(
        &mut self,
        event: &str,
        data: &str,
        out: &mut Vec<Delta>,
    ) -> Result<(), LlmError> {
        match self {
            Self::OpenAi(decoder) => decoder.decode(data, out),
            Self::OpenAiResponses(decoder) => decoder.decode(event, data, out),
            Self::Anthropic(decoder) => decoder.decode(event, data, out),
            Self::Ollama(decoder) => decoder.decode(data, out),
            Self::A2a(decoder) => decoder.decode(data, out),
        }
    }
}

/// Whether a thinking part's signature or redacted data is the opaque state of a protocol that
/// keeps its own (the Responses API's reasoning, an A2A context): never sent to a provider
/// whose thinking signatures are its own (Anthropic).
pub(crate) fn foreign_opaque(data: &str) -> bool {
    data.starts_with(openai_responses::OPAQUE_PREFIX) || data.starts_with(a2a::CONTEXT_PREFIX)
}

/// Parses a JSON payload of a stream, with a clear error naming the protocol.
pub(crate) fn parse_json<'a, T: Deserialize<'a>>(
    protocol: Protocol,
    data: &'a str,
) -> Result<T, LlmError> {
    serde_json::from_str(data).map_err(|error| LlmError::MalformedResponse {
        detail: format!("{} stream event is not valid: {error}", protocol.name()),
        raw: truncate(data, 1024),
    })
}

/// Parses a whole response body into the protocol's typed shape.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned>(
    protocol: Protocol,
    body: &[u8],
) -> Result<T, LlmError> {
    serde_json::from_slice(body).map_err(|error| LlmError::MalformedResponse {
        detail: format!("{} response body is not valid: {error}", protocol.name()),
        raw: truncate(&String::from_utf8_lossy(body), 1024),
    })
}

/// Tools in the `{"type": "function", "function": {…}}` shape OpenAI and Ollama share.
pub(crate) fn function_tools(tools: &[agentry_types::ToolSpec]) -> serde_json::Value {
    tools
        .iter()
        .map(|tool| {
            serde_json::json!({
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                }
            })
        })
        .collect()
}

/// Writes the sampling parameters every protocol names the same way (temperature, top_p),
/// the stop sequences under the protocol's own key, and the caller's extra fields.
pub(crate) fn insert_sampling(
    target: &mut serde_json::Map<String, serde_json::Value>,
    params: &crate::request::GenerationParams,
    stop_key: &str,
) {
    if let Some(temperature) = params.temperature {
        target.insert("temperature".into(), serde_json::json!(temperature));
    }
    if let Some(top_p) = params.top_p {
        target.insert("top_p".into(), serde_json::json!(top_p));
    }
    if !params.stop.is_empty() {
        target.insert(stop_key.into(), serde_json::json!(params.stop));
    }
}

/// Builds the typed error for a non-success HTTP answer.
///
/// Understands every error shape seen in recorded traffic: OpenAI's `{"error": {message, type,
/// code}}` (code a string, a number or null), Anthropic's `{"type": "error", "error": {type,
/// message}}`, Ollama's `{"error": "text"}`, llama.cpp's numeric codes, and plain text.
pub(crate) fn error_from_response(
    protocol: Protocol,
    status: u16,
    headers: &http::HeaderMap,
    body: &[u8],
) -> LlmError {
    let raw = String::from_utf8_lossy(body);
    let (error_type, error_code, message) = parse_error_body(&raw);
    let message = message.unwrap_or_else(|| {
        if raw.trim().is_empty() {
            format!("HTTP {status} with an empty body")
        } else {
            truncate(raw.trim(), 512)
        }
    });
    let mut error = ProviderError::new(
        protocol.name(),
        Some(status),
        error_type,
        error_code,
        message,
        &raw,
    );
    error.retry_after = retry_after(headers);
    error.should_retry = headers
        .get("x-should-retry")
        .and_then(|value| value.to_str().ok())
        .and_then(|value| match value.trim() {
            "true" => Some(true),
            "false" => Some(false),
            _ => None,
        });
    error.into()
}

/// Builds the typed error for an error reported inside a stream.
pub(crate) fn error_in_stream(protocol: Protocol, payload: &str) -> LlmError {
    let (error_type, error_code, message) = parse_error_body(payload);
    ProviderError::new(
        protocol.name(),
        None,
        error_type,
        error_code,
        message.unwrap_or_else(|| truncate(payload, 512)),
        payload,
    )
    .into()
}

/// Extracts (type, code, message) from any known error body shape.
fn parse_error_body(raw: &str) -> (Option<String>, Option<String>, Option<String>) {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(raw) else {
        return (None, None, None);
    };
    let text = |value: Option<&serde_json::Value>| -> Option<String> {
        match value? {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    };
    match value.get("error") {
        Some(serde_json::Value::String(message)) => (None, None, Some(message.clone())),
        Some(error @ serde_json::Value::Object(_)) => (
            text(error.get("type")),
            text(error.get("code")),
            text(error.get("message")),
        ),
        _ => (
            text(value.get("type")).filter(|kind| kind != "error"),
            text(value.get("code")),
            text(value.get("message")).or_else(|| text(value.get("detail"))),
        ),
    }
}

/// The delay a provider asked for: `retry-after-ms` (milliseconds), else `retry-after`
/// (seconds, or an HTTP date).
pub(crate) fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    if let Some(ms) = header("retry-after-ms").and_then(|v| v.trim().parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    let value = header("retry-after")?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let when = httpdate::parse_http_date(value).ok()?;
    Some(
        when.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols_serialise_by_their_names() {
        for protocol in [
            Protocol::OpenAi,
            Protocol::OpenAiResponses,
            Protocol::Anthropic,
            Protocol::Ollama,
            Protocol::A2a,
        ] {
            let json = serde_json::to_value(protocol).unwrap();
            assert_eq!(json, protocol.name());
            assert_eq!(serde_json::from_value::<Protocol>(json).unwrap(), protocol);
        }
        let compatible: Protocol = serde_json::from_str("\"openai-compatible\"").unwrap();
        assert_eq!(compatible, Protocol::OpenAi);
    }

    #[test]
    fn retry_after_forms() {
        let mut headers = http::HeaderMap::new();
        headers.insert("retry-after", http::HeaderValue::from_static("16"));
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(16)));
        headers.insert("retry-after-ms", http::HeaderValue::from_static("250"));
        assert_eq!(retry_after(&headers), Some(Duration::from_millis(250)));
        let mut dated = http::HeaderMap::new();
        dated.insert(
            "retry-after",
            http::HeaderValue::from_static("Wed, 21 Oct 2015 07:28:00 GMT"),
        );
        assert_eq!(retry_after(&dated), Some(Duration::ZERO));
    }

    #[test]
    fn error_shapes() {
        assert_eq!(
            parse_error_body(r#"{"error":"model 'x' not found"}"#),
            (None, None, Some("model 'x' not found".into()))
        );
        assert_eq!(
            parse_error_body(r#"{"error":{"code":400,"message":"m","type":"t"}}"#),
            (Some("t".into()), Some("400".into()), Some("m".into()))
        );
        assert_eq!(parse_error_body("<html>"), (None, None, None));
    }
}
