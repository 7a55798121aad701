//! Built-in tools that run commands in the session's sandbox.
//!
//! - `exec`: one shell command, to its end (or its timeout); output capped for the model, the
//!   whole output saved to a file in the workspace the model can read. `background: true` starts
//!   a long-lived process (a server, a watcher) whose output goes to a log file.
//! - `run_code`: Python in a Jupyter kernel kept per session ([`kernel`]), charts back as
//!   images.
//! - `terminal`: persistent shells that keep their state (working directory, variables,
//!   functions, background jobs) across calls; several per session, by name; output read until
//!   the command finishes or goes quiet. They run on real terminals ([`pty`]) that people can
//!   attach to.
//!
//! Both run in the sandbox of the run's workspace ([`SandboxPool::get`]): made on first use,
//! shared by every call of the session, closed when idle. Without a workspace they refuse to
//! work. The file tools ([`workspace`](crate::workspace)) see the same folder from the host.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use agentry_sandbox::{Sandbox, SandboxPool};

pub use pty::PtyTerminals;

use agentry_core::tool::{RiskClass, Tool, ToolContext, ToolError, ToolRisk};

mod code;
mod exec;
pub mod kernel;
pub mod pty;
mod terminal;

/// The name of the `exec` tool.
pub const EXEC: &str = "exec";
/// The name of the `terminal` tool.
pub const TERMINAL: &str = "terminal";
/// The name of the `run_code` tool.
pub const RUN_CODE: &str = "run_code";

/// Limits of the shell tools.
#[derive(Debug, Clone)]
pub struct ShellToolsConfig {
    /// `exec`'s timeout when the call names none.
    pub default_timeout: Duration,
    /// The longest timeout a call may ask for.
    pub max_timeout: Duration,
    /// The most bytes of each stream (stdout, stderr) shown to the model; the rest is in the
    /// saved output file.
    pub max_output_bytes: usize,
    /// The most bytes of each stream kept in the saved output file.
    pub max_saved_bytes: usize,
    /// The most terminals one session may have open.
    pub max_terminals: usize,
    /// A terminal unused this long is closed (its shell killed).
    pub terminal_idle_timeout: Duration,
    /// The Python `run_code`'s kernels start with, as the sandbox sees it (it needs
    /// `ipykernel`).
    pub kernel_python: String,
}

impl Default for ShellToolsConfig {
    fn default() -> Self {
        Self {
            default_timeout: Duration::from_secs(120),
            max_timeout: Duration::from_secs(3600),
            max_output_bytes: 12 * 1024,
            max_saved_bytes: 16 * 1024 * 1024,
            max_terminals: 8,
            terminal_idle_timeout: Duration::from_secs(30 * 60),
            kernel_python: kernel::DEFAULT_KERNEL_PYTHON.to_owned(),
        }
    }
}

impl ShellToolsConfig {
    /// A call's timeout: the one it asks for (at least a second, at most
    /// [`ShellToolsConfig::max_timeout`]), else the default.
    pub(crate) fn timeout(&self, requested_secs: Option<u64>) -> Result<Duration, ToolError> {
        match requested_secs {
            Some(0) => Err(ToolError::InvalidArguments(
                "timeout_secs must be at least 1".into(),
            )),
            Some(secs) => Ok(Duration::from_secs(secs).min(self.max_timeout)),
            None => Ok(self.default_timeout),
        }
    }
}

/// The shell tools (`exec`, `terminal`, `run_code`) over `sandboxes`, ready to register;
/// `terminal`'s shells are registered in `terminals` (where people can attach to them).
pub fn shell_tools(
    sandboxes: SandboxPool,
    terminals: PtyTerminals,
    config: ShellToolsConfig,
) -> Vec<Arc<dyn Tool>> {
    let python: Arc<str> = Arc::from(config.kernel_python.as_str());
    let config = Arc::new(config);
    vec![
        Arc::new(
            exec::exec(sandboxes.clone(), Arc::clone(&config))
                .with_risk(ToolRisk::of(RiskClass::RunsCommands)),
        ),
        Arc::new(
            code::run_code(sandboxes.clone(), Arc::clone(&config), python)
                .with_risk(ToolRisk::of(RiskClass::RunsCommands)),
        ),
        Arc::new(
            terminal::terminal(sandboxes, terminals, config)
                .with_risk(ToolRisk::of(RiskClass::RunsCommands)),
        ),
    ]
}

/// The sandbox of the call's workspace, made if needed.
pub(crate) async fn sandbox_for(
    sandboxes: &SandboxPool,
    context: &ToolContext,
) -> Result<Sandbox, ToolError> {
    let workspace = context.workspace.as_deref().ok_or_else(|| {
        ToolError::Failed(
            "this run has no workspace: commands run only in a session's sandbox".into(),
        )
    })?;
    sandboxes
        .get(workspace)
        .await
        .map_err(|error| ToolError::Failed(format!("the sandbox could not start: {error}")))
}

/// The working directory inside the sandbox for a call: `requested` (relative to the workspace,
/// or absolute inside the sandbox), else the run's working directory when it lies in the
/// workspace, else the workspace itself (`None`).
pub(crate) fn sandbox_cwd(
    sandboxes: &SandboxPool,
    context: &ToolContext,
    requested: Option<&str>,
) -> Result<Option<String>, ToolError> {
    let mount = &sandboxes.template().workspace_mount;
    if let Some(requested) = requested {
        if requested.contains('\0') {
            return Err(ToolError::InvalidArguments(
                "cwd contains a NUL byte".into(),
            ));
        }
        if requested.starts_with('/') {
            return Ok(Some(requested.to_owned()));
        }
        return Ok(Some(format!("{mount}/{requested}")));
    }
    let (Some(dir), Some(workspace)) = (&context.working_dir, &context.workspace) else {
        return Ok(None);
    };
    Ok(dir
        .strip_prefix(workspace)
        .ok()
        .filter(|relative| !relative.as_os_str().is_empty())
        .map(|relative| format!("{mount}/{}", relative.display())))
}

/// The shell commands run with: bash when the host has it (the sandbox sees the host's
/// `/usr`), else sh.
pub(crate) fn shell() -> &'static str {
    if Path::new("/usr/bin/bash").exists() || Path::new("/bin/bash").exists() {
        "/bin/bash"
    } else {
        "/bin/sh"
    }
}

/// A file name made of a call id: letters, digits, `-` and `_` only.
pub(crate) fn file_stem(call_id: &str) -> String {
    let stem: String = call_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect();
    if stem.is_empty() {
        "call".to_owned()
    } else {
        stem
    }
}

/// Text of at most `cap` bytes from `bytes`: all of it, or its head and tail with the number of
/// bytes left out between them.
pub(crate) fn head_and_tail(bytes: &[u8], cap: usize) -> (String, bool) {
    if bytes.len() <= cap {
        return (String::from_utf8_lossy(bytes).into_owned(), false);
    }
    let head = cap / 3;
    let tail = cap - head;
    let omitted = bytes.len() - head - tail;
    let text = format!(
        "{}\n[… {omitted} bytes left out …]\n{}",
        String::from_utf8_lossy(&bytes[..head]),
        String::from_utf8_lossy(&bytes[bytes.len() - tail..])
    );
    (text, true)
}
