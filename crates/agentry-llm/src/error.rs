//! The model layer's typed errors.
//!
//! Every failure is an [`LlmError`] with a stable [`ErrorCode`], a retry decision and, for
//! provider errors, the HTTP status, the provider's own error type/code/message and the raw body
//! (truncated), so callers can tell a rate limit from a context overflow without string matching.

use std::time::Duration;

use agentry_types::{ErrorCode, ErrorInfo};

/// How much of a provider's raw error body is kept.
pub const RAW_BODY_LIMIT: usize = 4096;

/// A failure of a model call.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum LlmError {
    /// The provider answered with an error, as an HTTP status or inside the stream.
    #[error("{0}")]
    Provider(Box<ProviderError>),
    /// The connection could not be made, or broke while reading.
    #[error("connection to the provider failed: {message}")]
    Connection {
        /// What went wrong, from the HTTP client.
        message: String,
    },
    /// A timeout expired.
    #[error("{kind} timeout after {after:?}")]
    Timeout {
        /// Which timeout.
        kind: TimeoutKind,
        /// Its configured length.
        after: Duration,
    },
    /// The stream ended before the provider said the response was complete.
    #[error("the stream ended before the response was complete ({detail})")]
    StreamEndedEarly {
        /// What was missing.
        detail: String,
    },
    /// The provider sent something its protocol does not allow.
    #[error("malformed response from the provider: {detail}")]
    MalformedResponse {
        /// What was wrong.
        detail: String,
        /// The offending payload, truncated.
        raw: String,
    },
    /// A tool call's arguments are not a JSON object.
    #[error(
        "tool call {name} ({id}) has invalid arguments{}: {detail}",
        if *.cut_off { " (cut off by the output token limit)" } else { "" }
    )]
    InvalidToolArguments {
        /// The call's id.
        id: String,
        /// The tool's name.
        name: String,
        /// The raw arguments text, truncated.
        raw: String,
        /// Whether the output token limit cut the arguments short.
        cut_off: bool,
        /// Why they do not parse.
        detail: String,
    },
    /// The caller cancelled the call.
    #[error("the model call was cancelled")]
    Cancelled,
    /// The client is configured wrongly.
    #[error("invalid model configuration: {0}")]
    Configuration(String),
}

/// Which timeout expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutKind {
    /// Establishing the connection.
    Connect,
    /// Waiting for the response headers and first body bytes.
    FirstByte,
    /// Waiting between two chunks of the body.
    Idle,
    /// The whole call.
    Total,
}

impl std::fmt::Display for TimeoutKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Connect => "connect",
            Self::FirstByte => "first-byte",
            Self::Idle => "idle",
            Self::Total => "total",
        })
    }
}

/// An error the provider reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderError {
    /// Which protocol answered (`openai`, `anthropic`, `ollama`).
    pub provider: &'static str,
    /// The HTTP status, or `None` for an error reported inside a successful stream.
    pub status: Option<u16>,
    /// The stable code this error maps to.
    pub code: ErrorCode,
    /// The provider's error type (`rate_limit_error`, `invalid_request_error`).
    pub error_type: Option<String>,
    /// The provider's error code (`context_length_exceeded`, or a number as text).
    pub error_code: Option<String>,
    /// The provider's message.
    pub message: String,
    /// The raw body, truncated to [`RAW_BODY_LIMIT`] bytes.
    pub raw_body: String,
    /// How long the provider asked us to wait (`retry-after-ms` / `retry-after`).
    pub retry_after: Option<Duration>,
    /// The provider's explicit retry advice (`x-should-retry`).
    pub should_retry: Option<bool>,
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => write!(f, "{} answered HTTP {status}", self.provider)?,
            None => write!(f, "{} reported an error in the stream", self.provider)?,
        }
        if let Some(kind) = self.error_type.as_deref().or(self.error_code.as_deref()) {
            write!(f, " ({kind})")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl ProviderError {
    /// Builds a provider error and derives its stable code from the status, type, code and
    /// message.
    pub fn new(
        provider: &'static str,
        status: Option<u16>,
        error_type: Option<String>,
        error_code: Option<String>,
        message: String,
        raw_body: &str,
    ) -> Self {
        let code = classify(
            status,
            error_type.as_deref(),
            error_code.as_deref(),
            &message,
        );
        Self {
            provider,
            status,
            code,
            error_type,
            error_code,
            message,
            raw_body: truncate(raw_body, RAW_BODY_LIMIT),
            retry_after: None,
            should_retry: None,
        }
    }

    /// Whether trying the same request again may succeed.
    pub fn is_retryable(&self) -> bool {
        if let Some(status) = self.status {
            if matches!(status, 400 | 401 | 403 | 404 | 413 | 422) {
                return false;
            }
            if let Some(advice) = self.should_retry {
                return advice;
            }
            return matches!(status, 408 | 409 | 425 | 429 | 500..=599);
        }
        if let Some(advice) = self.should_retry {
            return advice;
        }
        matches!(
            self.code,
            ErrorCode::RateLimited | ErrorCode::Overloaded | ErrorCode::ProviderError
        )
    }
}

/// Derives the stable code of a provider error.
fn classify(
    status: Option<u16>,
    error_type: Option<&str>,
    error_code: Option<&str>,
    message: &str,
) -> ErrorCode {
    if is_context_overflow(error_type, error_code, message) {
        return ErrorCode::ContextLengthExceeded;
    }
    match (status, error_type) {
        (_, Some("overloaded_error")) | (Some(529), _) => ErrorCode::Overloaded,
        (_, Some("rate_limit_error")) | (Some(429), _) => ErrorCode::RateLimited,
        (Some(401), _) | (_, Some("authentication_error")) => ErrorCode::Authentication,
        (Some(403), _) | (_, Some("permission_error")) => ErrorCode::PermissionDenied,
        (Some(404), _) | (_, Some("not_found_error")) => ErrorCode::NotFound,
        (Some(413), _) | (_, Some("request_too_large")) => ErrorCode::RequestTooLarge,
        (Some(422), _) => ErrorCode::Unprocessable,
        (Some(408 | 409 | 425), _) => ErrorCode::Conflict,
        (Some(400..=499), _) => ErrorCode::InvalidRequest,
        (Some(_), _) | (None, _) => ErrorCode::ProviderError,
    }
}

/// Whether an error says the prompt does not fit the model's context window. Providers spell
/// this many ways; these are the ones seen in real traffic.
fn is_context_overflow(error_type: Option<&str>, error_code: Option<&str>, message: &str) -> bool {
    const CODES: [&str; 3] = [
        "context_length_exceeded",
        "exceed_context_size_error",
        "string_above_max_length",
    ];
    if [error_type, error_code]
        .into_iter()
        .flatten()
        .any(|value| CODES.contains(&value))
    {
        return true;
    }
    let message = message.to_ascii_lowercase();
    [
        "maximum context length",
        "context length",
        "context window",
        "context size",
        "prompt is too long",
        "input is too long",
        "too many tokens",
    ]
    .iter()
    .any(|needle| message.contains(needle))
}

/// Cuts `text` to at most `limit` bytes on a character boundary.
pub(crate) fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_owned();
    }
    let mut end = limit;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

impl LlmError {
    /// The stable code of this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::Provider(error) => error.code,
            Self::Connection { .. } => ErrorCode::Connection,
            Self::Timeout { .. } => ErrorCode::Timeout,
            Self::StreamEndedEarly { .. } => ErrorCode::StreamEndedEarly,
            Self::MalformedResponse { .. } => ErrorCode::MalformedResponse,
            Self::InvalidToolArguments { .. } => ErrorCode::InvalidToolArguments,
            Self::Cancelled => ErrorCode::Cancelled,
            Self::Configuration(_) => ErrorCode::Configuration,
        }
    }

    /// Whether the same request may succeed if tried again. (The transport retries only
    /// before the first output token, whatever this says.)
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Provider(error) => error.is_retryable(),
            Self::Connection { .. } | Self::StreamEndedEarly { .. } => true,
            Self::Timeout { kind, .. } => *kind != TimeoutKind::Total,
            Self::MalformedResponse { .. }
            | Self::InvalidToolArguments { .. }
            | Self::Cancelled
            | Self::Configuration(_) => false,
        }
    }

    /// Whether the prompt was too long for the model's context window, so that compacting the
    /// history and trying again may succeed.
    pub fn is_context_too_long(&self) -> bool {
        self.code() == ErrorCode::ContextLengthExceeded
    }

    /// The provider's requested delay before a retry, if it gave one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Provider(error) => error.retry_after,
            _ => None,
        }
    }

    /// The HTTP status, for provider errors.
    pub fn status(&self) -> Option<u16> {
        match self {
            Self::Provider(error) => error.status,
            _ => None,
        }
    }

    /// The provider error, if this is one.
    pub fn provider_error(&self) -> Option<&ProviderError> {
        match self {
            Self::Provider(error) => Some(error),
            _ => None,
        }
    }

    /// The error as it leaves the process.
    pub fn info(&self) -> ErrorInfo {
        ErrorInfo {
            code: self.code(),
            message: self.to_string(),
            retryable: self.is_retryable(),
            status: self.status(),
        }
    }
}

impl From<ProviderError> for LlmError {
    fn from(error: ProviderError) -> Self {
        Self::Provider(Box::new(error))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(status: Option<u16>, kind: Option<&str>, message: &str) -> ProviderError {
        ProviderError::new(
            "openai",
            status,
            kind.map(str::to_owned),
            None,
            message.to_owned(),
            message,
        )
    }

    #[test]
    fn statuses_that_must_never_be_retried() {
        for status in [400, 401, 403, 404, 413, 422] {
            let mut error = provider(Some(status), None, "no");
            error.should_retry = Some(true);
            assert!(!error.is_retryable(), "{status}");
        }
        for status in [408, 409, 425, 429, 500, 502, 503, 529] {
            assert!(provider(Some(status), None, "x").is_retryable(), "{status}");
        }
        let mut advised = provider(Some(500), None, "x");
        advised.should_retry = Some(false);
        assert!(!advised.is_retryable());
    }

    #[test]
    fn context_overflow_is_recognised_in_its_many_spellings() {
        assert_eq!(
            provider(
                Some(400),
                None,
                "prompt is too long: 210000 tokens > 200000 maximum"
            )
            .code,
            ErrorCode::ContextLengthExceeded
        );
        assert_eq!(
            provider(Some(400), Some("exceed_context_size_error"), "x").code,
            ErrorCode::ContextLengthExceeded
        );
        assert_eq!(
            provider(Some(400), None, "bad role").code,
            ErrorCode::InvalidRequest
        );
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h…");
        assert_eq!(truncate("abc", 10), "abc");
    }
}
