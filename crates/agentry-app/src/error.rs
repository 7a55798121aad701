//! The application's error: what failed, in terms every front-end can render. HTTP maps a
//! [`Failure`] to a status, the CLI prints the message, MCP reports it as a tool error; the
//! stable `code` string is the same everywhere.

use serde_json::json;

use agentry_core::RunError;
use agentry_core::session::SessionError;
use agentry_core::template::TemplateError;
use agentry_core::tool::ToolError;
use agentry_store::StoreError;
use agentry_types::ErrorCode;

/// What kind of failure an [`AppError`] is: the caller's mistake, a missing or conflicting
/// thing, a refusal, an exhausted limit, or a failure of ours or of something we depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Failure {
    /// The input is malformed or refused as invalid (HTTP 400).
    Invalid,
    /// No credentials, or wrong ones (401).
    Unauthenticated,
    /// The caller may not do this (403).
    Forbidden,
    /// The thing named does not exist, or is not the caller's (404).
    NotFound,
    /// The thing exists already, or is in a state that does not allow this (409).
    Conflict,
    /// Too large: a file, a body, a full disk (413).
    TooLarge,
    /// A limit on how many or how often (429).
    TooMany,
    /// A bug or a failing dependency of ours, never bad input (500).
    Internal,
    /// A model, tool or server we called failed (502).
    Upstream,
    /// The capability is not available on this host or in this configuration (503).
    Unavailable,
    /// Something we waited for took too long (504).
    Timeout,
    /// The server's storage has no room (a full disk): nothing was written (507).
    StorageFull,
}

impl Failure {
    /// The [`ErrorCode`] this kind of failure is reported under when no finer code applies.
    pub fn error_code(self) -> ErrorCode {
        match self {
            Self::Invalid => ErrorCode::InvalidRequest,
            Self::Unauthenticated => ErrorCode::Authentication,
            Self::Forbidden => ErrorCode::PermissionDenied,
            Self::NotFound => ErrorCode::NotFound,
            Self::Conflict => ErrorCode::Conflict,
            Self::TooLarge => ErrorCode::RequestTooLarge,
            Self::TooMany => ErrorCode::RateLimited,
            Self::Internal => ErrorCode::Internal,
            Self::Upstream => ErrorCode::ProviderError,
            Self::Unavailable => ErrorCode::Configuration,
            Self::Timeout => ErrorCode::Timeout,
            Self::StorageFull => ErrorCode::StorageFull,
        }
    }
}

/// An application error: its kind, a stable code (`invalid_request`, `queue_full`,
/// `sandbox_closed`, …), a message a person can act on, and optional structured detail.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct AppError {
    /// What kind of failure it is.
    pub failure: Failure,
    /// The stable code clients match on.
    pub code: &'static str,
    /// What went wrong, for a person.
    pub message: String,
    /// Extra structured detail.
    pub details: Option<serde_json::Value>,
}

impl AppError {
    /// An error of this kind, code and message.
    pub fn new(failure: Failure, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            failure,
            code,
            message: message.into(),
            details: None,
        }
    }

    /// `invalid_request`: the caller's input is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(Failure::Invalid, "invalid_request", message)
    }

    /// `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Failure::NotFound, "not_found", message)
    }

    /// `conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(Failure::Conflict, "conflict", message)
    }

    /// `permission_denied`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(Failure::Forbidden, "permission_denied", message)
    }

    /// `internal`: a bug or a failing dependency, never bad input.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(Failure::Internal, "internal", message)
    }

    /// `storage_full`: the server's storage has no room; nothing of the request was written.
    pub fn storage_full(message: impl Into<String>) -> Self {
        Self::new(
            Failure::StorageFull,
            "storage_full",
            format!(
                "the server's storage is full, nothing was written (try again once there is \
                 room): {}",
                message.into()
            ),
        )
    }

    /// Adds details.
    pub fn with_details(mut self, details: serde_json::Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The [`ErrorCode`] of this error's kind.
    pub fn error_code(&self) -> ErrorCode {
        self.failure.error_code()
    }
}

impl From<StoreError> for AppError {
    fn from(error: StoreError) -> Self {
        match &error {
            _ if error.is_storage_full() => Self::storage_full(error.to_string()),
            StoreError::NotFound(_) => Self::not_found(error.to_string()),
            StoreError::Conflict(_) => Self::conflict(error.to_string()),
            StoreError::InvalidInput(_) => Self::bad_request(error.to_string()),
            _ => Self::internal(error.to_string()),
        }
    }
}

impl From<agentry_core::access::AccessDenied> for AppError {
    fn from(error: agentry_core::access::AccessDenied) -> Self {
        Self::forbidden(error.to_string())
    }
}

impl From<RunError> for AppError {
    fn from(error: RunError) -> Self {
        match &error {
            RunError::UnknownModel(_) | RunError::NoModel => Self::bad_request(error.to_string()),
            RunError::EmptyInput => Self::bad_request(error.to_string()),
            RunError::Template(TemplateError::NotFound(_)) => Self::not_found(error.to_string()),
            RunError::Template(_) => Self::bad_request(error.to_string()),
            RunError::Tool(_) | RunError::Approval(_) => Self::bad_request(error.to_string()),
            RunError::File(_) | RunError::Compaction(_) | RunError::ClientTool(_) => {
                Self::bad_request(error.to_string())
            }
            RunError::Denied(_) => Self::forbidden(error.to_string()),
            _ => Self::internal(error.to_string()),
        }
    }
}

impl From<SessionError> for AppError {
    fn from(error: SessionError) -> Self {
        match error {
            SessionError::Busy { session, run_id } => {
                Self::conflict(format!("session {session} has a run in progress"))
                    .with_details(json!({"session_id": session, "run_id": run_id}))
            }
            SessionError::QueueFull { session, max } => Self::new(
                Failure::TooMany,
                "queue_full",
                SessionError::QueueFull { session, max }.to_string(),
            )
            .with_details(json!({"session_id": session, "max_queued_runs": max})),
            SessionError::Run(error) => error.into(),
            SessionError::Log(agentry_core::session::LogError::NotFound(session)) => {
                Self::not_found(format!("no session {session}"))
            }
            SessionError::Log(agentry_core::session::LogError::Full(reason)) => {
                Self::storage_full(reason)
            }
            SessionError::Log(agentry_core::session::LogError::Held { session, reason }) => {
                Self::conflict(format!(
                    "session {session} has a run in progress on another node ({reason})"
                ))
                .with_details(json!({"session_id": session}))
            }
            SessionError::NoSuchRun { session, run_id } => Self::not_found(format!(
                "run {run_id} is not in progress, waiting or paused in session {session}"
            ))
            .with_details(json!({"session_id": session, "run_id": run_id})),
            SessionError::WrongState { run_id, state } => {
                Self::conflict(format!("run {run_id} {state}"))
                    .with_details(json!({"run_id": run_id}))
            }
            SessionError::Approval(error) => match error {
                agentry_core::approval::ApprovalError::AlreadyDecided(_)
                | agentry_core::approval::ApprovalError::NotWaiting => {
                    Self::conflict(error.to_string())
                }
                other => Self::bad_request(other.to_string()),
            },
            other => Self::internal(other.to_string()),
        }
    }
}

impl From<ToolError> for AppError {
    fn from(error: ToolError) -> Self {
        match &error {
            ToolError::NotFound(_) => Self::not_found(error.to_string()),
            ToolError::InvalidArguments(_) | ToolError::Registration(_) => {
                Self::bad_request(error.to_string())
            }
            ToolError::Timeout(_) => Self::new(Failure::Timeout, "timeout", error.to_string()),
            _ => Self::new(Failure::Upstream, "tool_failed", error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_run_queue_is_too_many() {
        let session = agentry_types::SessionId::new();
        let error = AppError::from(SessionError::QueueFull { session, max: 16 });
        assert_eq!(error.failure, Failure::TooMany);
        assert_eq!(error.code, "queue_full");
        assert_eq!(error.error_code(), ErrorCode::RateLimited);
        assert!(
            error.message.contains("16 runs queued"),
            "{}",
            error.message
        );
        assert_eq!(
            error.details,
            Some(json!({"session_id": session, "max_queued_runs": 16}))
        );
    }

    #[test]
    fn a_tool_timeout_is_a_timeout() {
        let error = AppError::from(ToolError::Timeout(std::time::Duration::from_secs(3)));
        assert_eq!(error.failure, Failure::Timeout);
        assert_eq!(error.code, "timeout");
    }
}
