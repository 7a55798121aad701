//! The code interpreter of standalone sandboxes (`POST /v1/sandboxes/{id}/code`): the request
//! checked, the sandbox's kernel ([`agentry_tools::shell::kernel`]) run, its failures as API
//! errors.

use serde::Deserialize;

use agentry_tools::shell::kernel::{
    self, CodeCall, CodeOutput, CodeResult, DEFAULT_CODE_TIMEOUT, KernelError, KernelHome,
    MAX_CODE_BYTES, MAX_CODE_TIMEOUT,
};

use crate::error::{AppError, Failure};
use crate::sandbox_errors::sandbox_error;
use crate::sandboxes::Standalone;

/// The body of `POST /v1/sandboxes/{id}/code`.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CodeRequest {
    /// The code to run, in the sandbox's kernel (variables, imports and functions stay for the
    /// next call).
    pub code: String,
    /// The kernel's language: `python` (the only one, and the default).
    #[serde(default)]
    pub language: Option<String>,
    /// Interrupt the code after this many seconds (default 60, at most 3600); the kernel and
    /// its variables stay.
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Answer server-sent events instead: each output (`output`, a `CodeOutput`) as the kernel
    /// sends it, then the whole result (`done`, a `CodeResult`) or the failure (`error`, an
    /// error body).
    #[serde(default)]
    pub stream: bool,
}

/// What a streamed call sends, in order: outputs as they come, then how it ended.
#[derive(Debug, Clone)]
pub enum CodeEvent {
    /// One output, as the kernel sent it.
    Output(CodeOutput),
    /// The call ended: everything it produced.
    Done(Box<CodeResult>),
    /// The call failed.
    Failed(AppError),
}

/// Checks a request: the language, the code's size, the timeout.
pub(crate) fn check(request: CodeRequest) -> Result<CodeCall, AppError> {
    if let Some(language) = request.language.as_deref()
        && !language.eq_ignore_ascii_case("python")
    {
        return Err(AppError::bad_request(format!(
            "language {language:?} has no kernel here: the code interpreter runs python"
        )));
    }
    if request.code.len() > MAX_CODE_BYTES {
        return Err(AppError::new(
            Failure::TooLarge,
            "request_too_large",
            format!("the code is over {MAX_CODE_BYTES} bytes"),
        ));
    }
    let timeout = match request.timeout_secs {
        None => DEFAULT_CODE_TIMEOUT,
        Some(secs) if (1..=MAX_CODE_TIMEOUT.as_secs()).contains(&secs) => {
            std::time::Duration::from_secs(secs)
        }
        Some(_) => {
            return Err(AppError::bad_request(format!(
                "timeout_secs is from 1 to {}",
                MAX_CODE_TIMEOUT.as_secs()
            )));
        }
    };
    Ok(CodeCall {
        code: request.code,
        timeout,
        live: None,
    })
}

/// Runs `call` in the kernel of the standalone sandbox `entry` (started with `python` when it
/// has none): a dead kernel is 409 `kernel_died`, one that cannot start or is stuck 503
/// `kernel_unavailable`, a sandbox's refusal its own error.
pub(crate) async fn run(
    entry: &Standalone,
    python: &str,
    call: CodeCall,
) -> Result<CodeResult, AppError> {
    let home = KernelHome {
        sandbox: &entry.sandbox,
        workspace: entry.workspace(),
        mount: &entry.spec.workspace_mount,
        python,
    };
    kernel::run(home, &entry.kernel, call)
        .await
        .map_err(|error| match error {
            KernelError::Sandbox(error) => sandbox_error(error),
            KernelError::Died => AppError::new(Failure::Conflict, "kernel_died", error.to_string()),
            other => AppError::new(
                Failure::Unavailable,
                "kernel_unavailable",
                other.to_string(),
            ),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_checked() {
        let request = |code: &str, language: Option<&str>, timeout: Option<u64>| CodeRequest {
            code: code.into(),
            language: language.map(Into::into),
            timeout_secs: timeout,
            stream: false,
        };
        assert!(check(request("1", Some("Python"), Some(5))).is_ok());
        assert!(check(request("1", Some("r"), None)).is_err());
        assert!(check(request("1", None, Some(0))).is_err());
        assert!(check(request("1", None, Some(3601))).is_err());
        assert!(check(request(&"x".repeat(MAX_CODE_BYTES + 1), None, None)).is_err());
        assert_eq!(
            check(request("1", None, None))
                .map(|call| call.timeout)
                .ok(),
            Some(DEFAULT_CODE_TIMEOUT)
        );
    }
}
