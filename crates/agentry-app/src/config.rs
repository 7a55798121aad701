//! Configuration documents: the checks every saved name passes, and the sandboxes configured
//! command tools run in.

use serde::Serialize;
use serde_json::Value;

use crate::environment::ToolEnvironment;
use crate::error::AppError;

/// Checks a model or secret name: 1 to 64 characters of `A-Z a-z 0-9 _ . -` (the store's rule).
pub fn check_name(what: &str, name: &str) -> Result<(), AppError> {
    let valid = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        let shown: String = name.chars().take(64).collect();
        Err(AppError::bad_request(format!(
            "invalid {what} name {shown:?}: use 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' \
             and '-'"
        )))
    }
}

/// A value as the JSON document the store keeps.
pub fn to_document<T: Serialize>(value: &T) -> Result<Value, AppError> {
    serde_json::to_value(value).map_err(|error| AppError::internal(error.to_string()))
}

/// The sandboxes command tools run in: the sessions' (when runs have workspaces to run them in).
pub fn command_sandboxes(tools: &ToolEnvironment) -> Option<&agentry_sandbox::SandboxPool> {
    tools
        .sandboxes
        .as_ref()
        .filter(|_| tools.workspaces.is_some())
}
