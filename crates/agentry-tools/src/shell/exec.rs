//! The `exec` tool: one shell command in the session's sandbox.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agentry_sandbox::{ExecEvent, ExecRequest, ExitStatus, Sandbox, SandboxPool};
use schemars::JsonSchema;
use serde::Deserialize;

use super::{EXEC, ShellToolsConfig, file_stem, head_and_tail, sandbox_cwd, sandbox_for, shell};
use agentry_core::tool::{FunctionTool, ToolContext, ToolError, ToolOutput};

/// Where saved outputs and background logs go, relative to the workspace.
pub(super) const OUTPUT_DIR: &str = ".agentry/outputs";

/// Arguments of `exec`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ExecArguments {
    /// The shell command (bash), for example "ls -la" or "cargo test 2>&1 | tail -20".
    command: String,
    /// Seconds before the command and everything it started are killed (default 120).
    #[serde(default)]
    timeout_secs: Option<u64>,
    /// The working directory: relative to the workspace, or absolute inside the sandbox.
    #[serde(default)]
    cwd: Option<String>,
    /// Start it in the background and return at once (servers, watchers): its output goes to
    /// a log file in the workspace, and it runs until the sandbox closes or it is killed.
    #[serde(default)]
    background: bool,
}

/// The `exec` tool.
pub(super) fn exec(sandboxes: SandboxPool, config: Arc<ShellToolsConfig>) -> FunctionTool {
    let timeout = config.max_timeout + Duration::from_secs(30);
    FunctionTool::new(
        EXEC,
        "Runs a shell command (bash) in this session's sandbox, with the workspace as the \
         working directory, and returns its exit code and output. The sandbox has no network \
         unless configured, keeps files in the workspace between calls, and kills the command \
         at its timeout. Long output is shortened; the whole output is saved to a file in the \
         workspace named in the result. Use background=true for servers and other processes \
         that do not end.",
        move |arguments: ExecArguments, context: ToolContext| {
            let sandboxes = sandboxes.clone();
            let config = Arc::clone(&config);
            async move { run(&sandboxes, &config, arguments, context).await }
        },
    )
    .with_timeout(timeout)
}

async fn run(
    sandboxes: &SandboxPool,
    config: &ShellToolsConfig,
    arguments: ExecArguments,
    context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    if arguments.command.trim().is_empty() {
        return Err(ToolError::InvalidArguments("the command is empty".into()));
    }
    if arguments.command.contains('\0') {
        return Err(ToolError::InvalidArguments(
            "the command contains a NUL byte".into(),
        ));
    }
    let timeout = config.timeout(arguments.timeout_secs)?;
    let cwd = sandbox_cwd(sandboxes, &context, arguments.cwd.as_deref())?;
    let sandbox = sandbox_for(sandboxes, &context).await?;
    if arguments.background {
        let mount = &sandboxes.template().workspace_mount;
        return background(&sandbox, mount, &arguments.command, cwd, &context).await;
    }
    let mut request =
        ExecRequest::new([shell(), "-c", arguments.command.as_str()]).timeout(timeout);
    request.cwd = cwd;
    let started = Instant::now();
    let mut handle = sandbox.exec(request).await.map_err(sandbox_error)?;
    let mut stdout = Capture::new(config.max_saved_bytes);
    let mut stderr = Capture::new(config.max_saved_bytes);
    let status = loop {
        let event = tokio::select! {
            biased;
            () = context.cancel.cancelled() => {
                handle.kill();
                return Err(ToolError::Cancelled);
            }
            event = handle.next() => event,
        };
        match event {
            Some(ExecEvent::Stdout(chunk)) => stdout.push(&chunk),
            Some(ExecEvent::Stderr(chunk)) => stderr.push(&chunk),
            Some(ExecEvent::Exit(status)) => break status,
            None => {
                return Err(ToolError::Failed(
                    "the command's output ended without an exit status".into(),
                ));
            }
        }
    };
    let elapsed = started.elapsed();
    let (stdout_text, stdout_cut) = head_and_tail(&stdout.kept, config.max_output_bytes);
    let (stderr_text, stderr_cut) = head_and_tail(&stderr.kept, config.max_output_bytes);
    let mut text = describe(&status, timeout, elapsed);
    if !stdout.kept.is_empty() {
        let _ = write!(
            text,
            "\n--- stdout ---\n{}",
            stdout_text.trim_end_matches('\n')
        );
    }
    if !stderr.kept.is_empty() {
        let _ = write!(
            text,
            "\n--- stderr ---\n{}",
            stderr_text.trim_end_matches('\n')
        );
    }
    if stdout.kept.is_empty() && stderr.kept.is_empty() {
        text.push_str("\n(no output)");
    }
    if stdout_cut || stderr_cut {
        let stem = file_stem(&context.call_id);
        let saved = save_outputs(&sandbox, &stem, &stdout, &stderr).await;
        let _ = write!(
            text,
            "\n[the output was shortened: stdout {} bytes, stderr {} bytes in all. {saved}]",
            stdout.total, stderr.total
        );
    }
    Ok(ToolOutput::text(text))
}

/// Output of one stream: the first `cap` bytes, and how many there were.
struct Capture {
    kept: Vec<u8>,
    total: u64,
    cap: usize,
}

impl Capture {
    fn new(cap: usize) -> Self {
        Self {
            kept: Vec::new(),
            total: 0,
            cap,
        }
    }

    fn push(&mut self, chunk: &[u8]) {
        self.total = self.total.saturating_add(chunk.len() as u64);
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
}

/// The first line of the result: how the command ended.
fn describe(status: &ExitStatus, timeout: Duration, elapsed: Duration) -> String {
    let took = format!("{:.2} s", elapsed.as_secs_f64());
    if let Some(reason) = &status.sandbox_closed {
        return format!("the sandbox stopped while the command ran ({reason}) after {took}");
    }
    if status.timed_out {
        return format!(
            "timed out after {} s: the command and everything it started were killed",
            timeout.as_secs()
        );
    }
    if status.out_of_memory {
        return format!("killed by the sandbox's memory limit (out of memory) after {took}");
    }
    match (status.code, status.signal) {
        (Some(code), _) => format!("exit code {code} ({took})"),
        (None, Some(signal)) => format!("killed by signal {signal} after {took}"),
        (None, None) => format!("ended after {took}"),
    }
}

/// Saves the streams to the workspace and says where, or why they could not be saved.
async fn save_outputs(sandbox: &Sandbox, stem: &str, stdout: &Capture, stderr: &Capture) -> String {
    if let Err(error) = sandbox.mkdir(OUTPUT_DIR, true).await {
        return format!("The whole output could not be saved: {error}");
    }
    let mut saved = Vec::new();
    for (name, capture) in [("stdout", stdout), ("stderr", stderr)] {
        if capture.kept.is_empty() {
            continue;
        }
        let path = format!("{OUTPUT_DIR}/{stem}.{name}.txt");
        match sandbox.write_file(&path, &capture.kept).await {
            Ok(()) => saved.push(path),
            Err(error) => return format!("The whole output could not be saved: {error}"),
        }
    }
    let mut note = format!(
        "The whole output is in {} (read it with read_file, or grep it with exec)",
        saved.join(" and ")
    );
    if stdout.total > stdout.kept.len() as u64 || stderr.total > stderr.kept.len() as u64 {
        note.push_str(&format!(
            "; only its first {} bytes per stream were kept",
            stdout.cap
        ));
    }
    note
}

/// Starts the command in the background with its output going to a log file, and returns its
/// process id and the log's path.
async fn background(
    sandbox: &Sandbox,
    mount: &str,
    command: &str,
    cwd: Option<String>,
    context: &ToolContext,
) -> Result<ToolOutput, ToolError> {
    sandbox
        .mkdir(OUTPUT_DIR, true)
        .await
        .map_err(sandbox_error)?;
    let log = format!(
        "{OUTPUT_DIR}/{}.background.log",
        file_stem(&context.call_id)
    );
    let log_abs = format!("{mount}/{log}");
    // `setsid` detaches it from the launcher, whose exit then says nothing about it; the shell
    // prints the process id.
    let launcher = format!(
        "setsid {} -c \"$0\" >\"$1\" 2>&1 </dev/null & echo $!",
        shell()
    );
    let mut request =
        ExecRequest::new([shell(), "-c", launcher.as_str(), command, log_abs.as_str()])
            .timeout(Duration::from_secs(10));
    request.cwd = cwd;
    let output = sandbox.run(request).await.map_err(sandbox_error)?;
    if !output.status.success() {
        return Err(ToolError::Failed(format!(
            "the background command could not start: {}",
            output.stderr_str().trim()
        )));
    }
    let pid = output.stdout_str().trim().to_owned();
    Ok(ToolOutput::text(format!(
        "started in the background (pid {pid}); its output goes to {log} (read it with \
         read_file, or `tail {log}` with exec); stop it with `kill {pid}`"
    )))
}

/// A sandbox failure as a tool error.
pub(super) fn sandbox_error(error: agentry_sandbox::SandboxError) -> ToolError {
    ToolError::Failed(format!("the sandbox failed: {error}"))
}
