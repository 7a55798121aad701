//! Stable error codes shared by every layer.
//!
//! Libraries define their own `thiserror` enums; each maps to one [`ErrorCode`] whose string form
//! never changes, so HTTP clients, stored events and scripts can match on it.

use serde::{Deserialize, Serialize};

/// A stable, machine-readable error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request was malformed or refused as invalid (HTTP 400).
    InvalidRequest,
    /// Credentials missing or wrong (HTTP 401).
    Authentication,
    /// Credentials lack permission (HTTP 403).
    PermissionDenied,
    /// The model or endpoint does not exist (HTTP 404).
    NotFound,
    /// The request body is too large (HTTP 413).
    RequestTooLarge,
    /// The request was understood but cannot be processed (HTTP 422).
    Unprocessable,
    /// The prompt does not fit the model's context window.
    ContextLengthExceeded,
    /// Rate limited (HTTP 429).
    RateLimited,
    /// The provider is overloaded (HTTP 529, Anthropic `overloaded_error`).
    Overloaded,
    /// The provider failed (HTTP 5xx, or an error reported inside a stream).
    ProviderError,
    /// A conflict or a too-early request the provider asks us to repeat (HTTP 408/409/425).
    Conflict,
    /// A connect, first-byte, idle or total timeout expired.
    Timeout,
    /// The connection could not be made or broke.
    Connection,
    /// The stream ended before the provider said it was complete.
    StreamEndedEarly,
    /// The provider sent something that is not valid for its protocol.
    MalformedResponse,
    /// Tool-call arguments are not a JSON object, or were cut off.
    InvalidToolArguments,
    /// The caller cancelled the operation.
    Cancelled,
    /// The configuration is wrong (unknown provider, missing key).
    Configuration,
    /// The server's storage is full (a full disk, PostgreSQL's `disk_full`): nothing was
    /// written, and the same request may succeed once there is room (HTTP 507).
    StorageFull,
    /// A bug in Agentry.
    Internal,
}

impl ErrorCode {
    /// The code's stable string form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::Authentication => "authentication",
            Self::PermissionDenied => "permission_denied",
            Self::NotFound => "not_found",
            Self::RequestTooLarge => "request_too_large",
            Self::Unprocessable => "unprocessable",
            Self::ContextLengthExceeded => "context_length_exceeded",
            Self::RateLimited => "rate_limited",
            Self::Overloaded => "overloaded",
            Self::ProviderError => "provider_error",
            Self::Conflict => "conflict",
            Self::Timeout => "timeout",
            Self::Connection => "connection",
            Self::StreamEndedEarly => "stream_ended_early",
            Self::MalformedResponse => "malformed_response",
            Self::InvalidToolArguments => "invalid_tool_arguments",
            Self::Cancelled => "cancelled",
            Self::Configuration => "configuration",
            Self::StorageFull => "storage_full",
            Self::Internal => "internal",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error as it leaves the process: code, message, and whether trying again may help.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorInfo {
    /// The stable code.
    pub code: ErrorCode,
    /// A message a person can act on.
    pub message: String,
    /// Whether the same request may succeed later.
    pub retryable: bool,
    /// The HTTP status the provider answered with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_serialise_as_their_stable_strings() {
        for code in [
            ErrorCode::RateLimited,
            ErrorCode::ContextLengthExceeded,
            ErrorCode::StreamEndedEarly,
            ErrorCode::StorageFull,
        ] {
            let json = serde_json::to_value(code).unwrap();
            assert_eq!(json, code.as_str());
        }
    }
}
