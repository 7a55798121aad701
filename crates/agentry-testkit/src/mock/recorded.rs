//! What the mock remembers about each request it receives.

use std::time::Instant;

use serde_json::Value;

use crate::protocol::Protocol;

/// One request received by the mock, in arrival order.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedRequest {
    /// HTTP method, e.g. `POST`.
    pub method: String,
    /// Request path without the query string, e.g. `/v1/chat/completions`.
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// Request headers, names lowercased, in arrival order (repeated names grouped together).
    pub headers: Vec<(String, String)>,
    /// The body parsed as JSON, or `Value::String` holding the raw (lossily decoded) text when
    /// it is not JSON (an empty body is `Value::String("")`).
    pub body: Value,
    /// The protocol implied by the path, if any.
    pub protocol: Option<Protocol>,
    /// When the mock started handling the request (its head had arrived).
    pub received_at: Instant,
}

impl RecordedRequest {
    /// The first value of header `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}
