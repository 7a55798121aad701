//! Tools defined at run time that run a local program.
//!
//! With a sandbox ([`CommandTool::in_sandbox`], what `agentry serve` and `agentry run` do when
//! sandboxes are on) the program runs in the sandbox of the run's workspace. Without one it runs
//! on the host as the Agentry process's user, with its file system and network access (a
//! configured tool is built that way only when host commands are allowed: see
//! [`ToolDefinition::build_in`](crate::ToolDefinition::build_in)); then the
//! environment
//! is cleared to `PATH`, `HOME` and `LANG` plus the configured variables, so host secrets in
//! environment variables do not reach the program; the working directory comes from the run
//! (set on the child alone, never on this process); the child gets its own process group, and on
//! timeout or cancellation the whole group is killed.
//!
//! The call's arguments are written to the program's standard input as JSON; its standard output
//! is the result (JSON when it parses as JSON, text otherwise), cut at a byte cap; a non-zero exit
//! is a failure quoting the end of standard error.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use agentry_types::ToolSpec;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWriteExt as _};

use agentry_core::tool::registry::{TOOL_NAME_RULE, is_valid_tool_name};
use agentry_core::tool::result::{decode_cut_utf8, truncation_note};
use agentry_core::tool::{Tool, ToolContext, ToolError, ToolOutput};

/// The host environment variables a command sees (when the host has them).
const INHERITED_ENV: [&str; 3] = ["PATH", "HOME", "LANG"];

/// How much of the end of standard error a failure quotes.
const STDERR_TAIL_BYTES: usize = 2048;

/// The definition of a command tool.
#[derive(Debug, Clone)]
pub struct CommandToolConfig {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments (an object).
    pub parameters: Value,
    /// The program: a path, or a name looked up in `PATH`.
    pub program: PathBuf,
    /// Command-line arguments (fixed; the call's arguments arrive on standard input).
    pub args: Vec<String>,
    /// Environment variables set for the program, besides `PATH`, `HOME` and `LANG`.
    pub env: Vec<(String, String)>,
    /// The tool's timeout, overriding the run's default.
    pub timeout: Option<Duration>,
    /// The most bytes of standard output kept; the rest is cut with a note.
    pub max_output_bytes: usize,
}

/// A tool that runs a local program with the arguments as JSON on standard input.
///
/// In a sandbox when built with [`CommandTool::in_sandbox`]; otherwise on the host, with this
/// process's user's file system and network access and only the environment restricted (see
/// the [module documentation](self)).
#[derive(Debug, Clone)]
pub struct CommandTool {
    spec: ToolSpec,
    timeout: Option<Duration>,
    command: Arc<CommandToolConfig>,
    sandboxes: Option<agentry_sandbox::SandboxPool>,
}

impl CommandTool {
    /// Builds the tool.
    ///
    /// Fails with [`ToolError::Registration`] for an invalid name, an empty program, a NUL byte
    /// in an argument, an invalid environment variable name, or a zero output cap.
    pub fn new(config: CommandToolConfig) -> Result<CommandTool, ToolError> {
        let name = &config.name;
        let invalid =
            |reason: String| ToolError::Registration(format!("command tool {name:?}: {reason}"));
        if !is_valid_tool_name(name) {
            return Err(ToolError::Registration(format!(
                "invalid tool name {name:?}: a name is {TOOL_NAME_RULE}"
            )));
        }
        if config.program.as_os_str().is_empty() {
            return Err(invalid("the program is empty".into()));
        }
        if config.args.iter().any(|arg| arg.contains('\0')) {
            return Err(invalid("an argument contains a NUL byte".into()));
        }
        for (key, value) in &config.env {
            if key.is_empty() || key.contains(['=', '\0']) {
                return Err(invalid(format!(
                    "invalid environment variable name {key:?}"
                )));
            }
            if value.contains('\0') {
                return Err(invalid(format!(
                    "the value of environment variable {key:?} contains a NUL byte"
                )));
            }
        }
        if config.max_output_bytes == 0 {
            return Err(invalid("max_output_bytes must be at least 1".into()));
        }
        Ok(CommandTool {
            spec: ToolSpec::new(
                config.name.clone(),
                config.description.clone(),
                config.parameters.clone(),
            ),
            timeout: config.timeout,
            command: Arc::new(config),
            sandboxes: None,
        })
    }

    /// Runs the program in the sandbox of the run's workspace instead of on the host: it sees
    /// the sandbox's files (the host's system folders read-only, the workspace read-write), no
    /// host secret, and no network unless the sandbox allows it. The program must be visible
    /// there: a system program, or a path inside the workspace.
    #[must_use]
    pub fn in_sandbox(mut self, sandboxes: agentry_sandbox::SandboxPool) -> Self {
        self.sandboxes = Some(sandboxes);
        self
    }
}

impl Tool for CommandTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    /// Runs commands; on the host when it has no sandbox.
    fn risk(&self) -> agentry_core::tool::ToolRisk {
        let risk = agentry_core::tool::ToolRisk::of(agentry_core::tool::RiskClass::RunsCommands);
        if self.sandboxes.is_some() {
            risk
        } else {
            risk.on_host()
        }
    }

    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    fn call(
        &self,
        arguments: Value,
        context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let command = Arc::clone(&self.command);
        match self.sandboxes.clone() {
            Some(sandboxes) => {
                async move { run_sandboxed(&command, &sandboxes, &arguments, context).await }
                    .boxed()
            }
            None => async move { run(&command, &arguments, context).await }.boxed(),
        }
    }
}

async fn run(
    config: &CommandToolConfig,
    arguments: &Value,
    context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let program = config.program.display().to_string();
    let mut command = tokio::process::Command::new(&config.program);
    command.args(&config.args).env_clear();
    for key in INHERITED_ENV {
        if let Some(value) = std::env::var_os(key) {
            command.env(key, value);
        }
    }
    command.envs(config.env.iter().map(|(key, value)| (key, value)));
    if let Some(dir) = &context.working_dir {
        command.current_dir(dir);
    }
    command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    command.process_group(0);

    let mut child = command
        .spawn()
        .map_err(|error| ToolError::Failed(format!("cannot start {program:?}: {error}")))?;
    // Kills the child's process group if this future is dropped or stopped before it exits.
    let mut group = ProcessGroupGuard::new(child.id());

    let input = serde_json::to_vec(arguments)
        .map_err(|error| ToolError::Failed(format!("cannot encode the arguments: {error}")))?;
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let write_input = async move {
        if let Some(mut stdin) = stdin {
            // A program that exits without reading its input is not an error.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        }
    };
    let max_output = config.max_output_bytes;
    let work = async {
        let ((), stdout, stderr, status) = tokio::join!(
            write_input,
            read_head(stdout, max_output),
            read_tail(stderr, STDERR_TAIL_BYTES),
            child.wait(),
        );
        (stdout, stderr, status)
    };
    let (stdout, stderr, status) = tokio::select! {
        biased;
        () = context.cancel.cancelled() => return Err(ToolError::Cancelled),
        finished = work => finished,
    };
    let status = status
        .map_err(|error| ToolError::Failed(format!("waiting for {program:?} failed: {error}")))?;
    group.disarm();
    let (stdout, stdout_total) =
        stdout.map_err(|error| ToolError::Failed(format!("reading the output failed: {error}")))?;
    let stderr = stderr.unwrap_or_default();

    if !status.success() {
        let detail = stderr_detail(&stderr);
        return Err(ToolError::Failed(format!(
            "{program:?} {}; {detail}",
            describe_exit(status)
        )));
    }
    Ok(stdout_result(&stdout, stdout_total))
}

/// Runs the program in the sandbox of the call's workspace: the same contract as [`run`]
/// (arguments as JSON on standard input, standard output as the result, a failure quoting the
/// end of standard error). A call of a run without a workspace (a stateless run, a direct call
/// of the tool) gets a scratch workspace and sandbox of its own, gone when the call ends.
async fn run_sandboxed(
    config: &CommandToolConfig,
    sandboxes: &agentry_sandbox::SandboxPool,
    arguments: &Value,
    mut context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    if context.workspace.is_some() {
        return run_in_workspace(config, sandboxes, arguments, context).await;
    }
    let scratch = tempfile::Builder::new()
        .prefix("agentry-call-")
        .tempdir()
        .map_err(|error| {
            ToolError::Failed(format!(
                "cannot make a scratch workspace for the call: {error}"
            ))
        })?;
    context.workspace = Some(scratch.path().to_path_buf());
    context.working_dir = None;
    let outcome = run_in_workspace(config, sandboxes, arguments, context).await;
    sandboxes.close(scratch.path()).await;
    outcome
}

async fn run_in_workspace(
    config: &CommandToolConfig,
    sandboxes: &agentry_sandbox::SandboxPool,
    arguments: &Value,
    context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    use agentry_sandbox::{ExecEvent, ExecRequest};
    let program = config.program.display().to_string();
    let sandbox = crate::shell::sandbox_for(sandboxes, &context).await?;
    let mut argv = vec![program.clone()];
    argv.extend(config.args.iter().cloned());
    let mut request = ExecRequest::new(argv).with_stdin();
    request.env = config.env.iter().cloned().collect();
    request.cwd = crate::shell::sandbox_cwd(sandboxes, &context, None)?;
    let mut handle = sandbox
        .exec(request)
        .await
        .map_err(|error| ToolError::Failed(format!("cannot start {program:?}: {error}")))?;
    let input = serde_json::to_vec(arguments)
        .map_err(|error| ToolError::Failed(format!("cannot encode the arguments: {error}")))?;
    if let Some(mut stdin) = handle.take_stdin() {
        tokio::spawn(async move {
            // A program that exits without reading its input is not an error.
            let _ = stdin.write_all(&input).await;
            let _ = stdin.shutdown().await;
        });
    }
    let max_output = config.max_output_bytes;
    let mut stdout = Vec::new();
    let mut stdout_total = 0_usize;
    let mut stderr: Vec<u8> = Vec::new();
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
            Some(ExecEvent::Stdout(chunk)) => {
                stdout_total = stdout_total.saturating_add(chunk.len());
                let room = max_output.saturating_sub(stdout.len());
                stdout.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Some(ExecEvent::Stderr(chunk)) => {
                stderr.extend_from_slice(&chunk);
                if stderr.len() > STDERR_TAIL_BYTES {
                    stderr.drain(..stderr.len() - STDERR_TAIL_BYTES);
                }
            }
            Some(ExecEvent::Exit(status)) => break status,
            None => {
                return Err(ToolError::Failed(format!(
                    "{program:?}: the sandbox ended its output without an exit status"
                )));
            }
        }
    };
    if !status.success() {
        let detail = stderr_detail(&stderr);
        let how = match (&status.sandbox_closed, status.code, status.signal) {
            (Some(reason), _, _) => format!("stopped with its sandbox ({reason})"),
            (None, Some(127), _) => {
                "was not found in the sandbox (exit code 127): the program must be a system \
                 program or lie in the workspace (a tool definition with \"host\": true runs \
                 on the host, unsandboxed)"
                    .to_owned()
            }
            (None, Some(code), _) => format!("exited with code {code}"),
            (None, None, Some(signal)) => format!("was killed by signal {signal}"),
            (None, None, None) => "failed".to_owned(),
        };
        return Err(ToolError::Failed(format!("{program:?} {how}; {detail}")));
    }
    Ok(stdout_result(&stdout, stdout_total))
}

/// The result of a program that succeeded: its standard output as JSON when it parses as JSON,
/// as text otherwise (with a note when it was cut at the cap).
fn stdout_result(stdout: &[u8], total: usize) -> ToolOutput {
    let mut text = decode_cut_utf8(stdout);
    if total > stdout.len() {
        let note = truncation_note(text.len(), Some(total));
        text.push_str(&note);
        return ToolOutput::text(text);
    }
    match serde_json::from_str::<Value>(text.trim()) {
        Ok(value) if !text.trim().is_empty() => ToolOutput::json(value),
        _ => ToolOutput::text(text),
    }
}

/// What a failure says of the program's standard error (its end).
fn stderr_detail(stderr: &[u8]) -> String {
    let stderr = decode_cut_utf8(stderr);
    let stderr = stderr.trim();
    if stderr.is_empty() {
        "no error output".to_owned()
    } else {
        format!("error output ends with: {stderr}")
    }
}

fn describe_exit(status: ExitStatus) -> String {
    if let Some(code) = status.code() {
        return format!("exited with code {code}");
    }
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt as _;
        if let Some(signal) = status.signal() {
            return format!("was killed by signal {signal}");
        }
    }
    format!("failed ({status})")
}

/// Reads up to `cap` bytes and counts (and discards) the rest, so the program never blocks on a
/// full pipe. Returns the kept bytes and the total length.
async fn read_head(
    stream: Option<impl AsyncRead + Unpin>,
    cap: usize,
) -> std::io::Result<(Vec<u8>, usize)> {
    let mut kept = Vec::new();
    let mut total = 0_usize;
    let Some(mut stream) = stream else {
        return Ok((kept, total));
    };
    let mut buffer = vec![0_u8; 16 * 1024];
    loop {
        let read = stream.read(&mut buffer).await?;
        if read == 0 {
            return Ok((kept, total));
        }
        total = total.saturating_add(read);
        let room = cap.saturating_sub(kept.len());
        kept.extend_from_slice(&buffer[..read.min(room)]);
    }
}

/// Reads everything, keeping the last `cap` bytes.
async fn read_tail(stream: Option<impl AsyncRead + Unpin>, cap: usize) -> Option<Vec<u8>> {
    let mut stream = stream?;
    let mut tail = Vec::new();
    let mut buffer = vec![0_u8; 8 * 1024];
    loop {
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return Some(tail),
            Ok(read) => {
                tail.extend_from_slice(&buffer[..read]);
                if tail.len() > cap {
                    tail.drain(..tail.len() - cap);
                }
            }
        }
    }
}

/// Kills a child's process group when dropped, unless disarmed after the child exited.
struct ProcessGroupGuard {
    #[cfg_attr(not(unix), allow(dead_code))]
    leader: Option<u32>,
}

impl ProcessGroupGuard {
    fn new(leader: Option<u32>) -> Self {
        Self { leader }
    }

    fn disarm(&mut self) {
        self.leader = None;
    }
}

impl Drop for ProcessGroupGuard {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self
            .leader
            .and_then(|leader| i32::try_from(leader).ok())
            .and_then(rustix::process::Pid::from_raw)
        {
            // The group may already be gone; nothing more can be done then.
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}
