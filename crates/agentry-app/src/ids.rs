//! Ids as clients send them: parsed into the typed ids, with a clear error for anything that
//! is not one (a UUIDv7, lowercase and hyphenated).

use agentry_types::{RunId, SessionId};

use crate::error::AppError;

/// Parses a session id from a client, with a clear error.
pub fn parse_session_id(id: &str) -> Result<SessionId, AppError> {
    SessionId::parse(id).map_err(|error| AppError::bad_request(error.to_string()))
}

/// Parses a run id from a client, with a clear error.
pub fn parse_run_id(id: &str) -> Result<RunId, AppError> {
    RunId::parse(id).map_err(|error| AppError::bad_request(format!("invalid run id: {error}")))
}
