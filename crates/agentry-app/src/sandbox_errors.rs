//! How a failed sandbox operation reads in the API: each [`SandboxError`] as an [`AppError`]
//! with its status and code.

use serde_json::json;

use agentry_sandbox::SandboxError;

use crate::error::{AppError, Failure};

/// The API error for a failed sandbox operation: a missing path is a 404, a refused one a 403,
/// a conflicting one (or one in a paused sandbox) a 409, a full disk or an over-large file a
/// 413, a closed sandbox a 404, an unavailable backend (or a pause the host cannot do) a 503, a
/// full pool a 429; other failures inside the sandbox are the
/// request's (400).
pub fn sandbox_error(error: SandboxError) -> AppError {
    match error {
        SandboxError::Unavailable(message) => unavailable(message),
        SandboxError::Closed { reason } => AppError::new(
            Failure::NotFound,
            "sandbox_closed",
            format!("the sandbox is closed: {reason}"),
        )
        .with_details(json!({ "reason": reason })),
        SandboxError::InvalidRequest(message) => AppError::bad_request(message),
        SandboxError::TooLarge { limit } => AppError::new(
            Failure::TooLarge,
            "file_too_large",
            format!("the file is larger than {limit} bytes"),
        )
        .with_details(json!({ "limit": limit })),
        SandboxError::Remote { errno, message } => match errno {
            Some(errno) => errno_error(errno, message),
            None => AppError::bad_request(message),
        },
        SandboxError::Io(error) => match error.raw_os_error() {
            Some(errno) if kind_status(errno).0 == Failure::TooLarge => {
                errno_error(errno, error.to_string())
            }
            _ => AppError::internal(format!("sandbox io: {error}")),
        },
        SandboxError::Setup(message) => AppError::internal(format!("sandbox: {message}")),
        SandboxError::Paused => AppError::new(
            Failure::Conflict,
            "sandbox_paused",
            "the sandbox is paused: resume it first (`POST /v1/sandboxes/{id}/resume`)",
        ),
        SandboxError::Unsupported(message) => {
            AppError::new(Failure::Unavailable, "not_supported", message)
        }
        SandboxError::PoolFull { max } => AppError::new(
            Failure::TooMany,
            "too_many_sandboxes",
            SandboxError::PoolFull { max }.to_string(),
        )
        .with_details(json!({ "max_sandboxes": max })),
    }
}

/// 503 `sandbox_unavailable`.
pub fn unavailable(message: impl Into<String>) -> AppError {
    AppError::new(Failure::Unavailable, "sandbox_unavailable", message)
}

/// The status and code for an errno from inside a sandbox.
fn kind_status(errno: i32) -> (Failure, &'static str) {
    use std::io::ErrorKind;
    match std::io::Error::from_raw_os_error(errno).kind() {
        ErrorKind::NotFound | ErrorKind::NotADirectory => (Failure::NotFound, "not_found"),
        ErrorKind::PermissionDenied | ErrorKind::ReadOnlyFilesystem => {
            (Failure::Forbidden, "forbidden")
        }
        ErrorKind::AlreadyExists
        | ErrorKind::DirectoryNotEmpty
        | ErrorKind::ResourceBusy
        | ErrorKind::ExecutableFileBusy => (Failure::Conflict, "conflict"),
        ErrorKind::StorageFull | ErrorKind::QuotaExceeded | ErrorKind::FileTooLarge => {
            (Failure::TooLarge, "no_space")
        }
        _ => (Failure::Invalid, "invalid_request"),
    }
}

fn errno_error(errno: i32, message: String) -> AppError {
    let (status, code) = kind_status(errno);
    AppError::new(status, code, message).with_details(json!({ "errno": errno }))
}
