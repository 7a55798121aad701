//! The code interpreter: a stateful Python kernel in a standalone sandbox, spoken to with the
//! Jupyter messaging protocol (`jupyter-protocol`, `jupyter-zmq-client`: the runtimed project's
//! crates, ZeroMQ in pure Rust).
//!
//! The kernel is the real `ipykernel`, started inside the sandbox on first use with ZeroMQ's
//! `ipc` transport: its sockets are files in the sandbox's workspace (`.kernels/<id>/k-1` …),
//! which the server reaches through the workspace's host folder — no network between the two,
//! the sandbox's own network namespace stays closed. Variables live between calls; a call
//! collects the kernel's stdout and stderr, its rich results (PNG and SVG charts, HTML and JSON
//! tables, plain text) and its error with the traceback. A call past its timeout interrupts the
//! kernel (the code gets `KeyboardInterrupt`, the kernel and its state stay); a kernel that
//! dies is noticed by its heartbeat, the call fails with `kernel_died`, and the next call
//! starts a new one.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use jupyter_protocol::{
    ConnectionInfo, ExecuteRequest, ExecutionState, InterruptRequest, JupyterMessage,
    JupyterMessageContent, KernelInfoRequest, Stdio,
};
use jupyter_zmq_client::{
    ClientControlConnection, ClientIoPubConnection, ClientShellConnection,
    create_client_control_connection, create_client_heartbeat_connection,
    create_client_iopub_connection, create_client_shell_connection_with_identity,
    peer_identity_for_session,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentry_sandbox::{ExecRequest, Sandbox};

use crate::error::{AppError, Failure};
use crate::sandbox_errors::sandbox_error;

/// The Python a kernel starts with when the server names none: the sandbox's own `python3`,
/// which needs `ipykernel` installed.
pub(crate) const DEFAULT_KERNEL_PYTHON: &str = "python3";
/// How long a call may run when it says nothing.
pub(crate) const DEFAULT_CODE_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest a call may ask for.
pub(crate) const MAX_CODE_TIMEOUT: Duration = Duration::from_secs(3600);
/// The largest piece of code accepted, in bytes.
pub(crate) const MAX_CODE_BYTES: usize = 1024 * 1024;
/// The most output one call keeps, in bytes (text and encoded images together); past it,
/// later outputs are dropped and the result says so.
pub(crate) const MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;
/// How long a new kernel may take to start.
const KERNEL_START: Duration = Duration::from_secs(60);
/// How long an interrupted call may take to stop before its kernel counts as stuck.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// How often a running call checks that its kernel is alive.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// The longest socket path Linux takes (`sun_path` is 108 bytes, with its NUL).
const MAX_SOCKET_PATH: usize = 107;

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
}

/// What one call of the code interpreter produced.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeResult {
    /// What the code printed and displayed, in order.
    pub outputs: Vec<CodeOutput>,
    /// The exception the code raised, if it did (an interrupted call's is `KeyboardInterrupt`).
    pub error: Option<CodeError>,
    /// The kernel's execution counter after this call.
    pub execution_count: Option<u64>,
    /// Whether the call ran past its timeout and was interrupted.
    pub timed_out: bool,
    /// Whether outputs were dropped past the 16 MiB a call keeps.
    pub outputs_truncated: bool,
    /// Whether a new kernel was started for this call (the first call, or after one died):
    /// earlier variables are gone.
    pub kernel_started: bool,
    /// How long the call took, milliseconds.
    pub duration_ms: u64,
}

/// One output of a call.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CodeOutput {
    /// Text on stdout or stderr.
    Stream {
        /// `stdout` or `stderr`.
        name: String,
        /// The text.
        text: String,
    },
    /// Something displayed (`display(…)`, a matplotlib figure), as MIME type → data: images
    /// base64-encoded (`image/png`), text as text (`text/plain`, `text/html`,
    /// `image/svg+xml`), JSON as JSON.
    DisplayData {
        /// The representations, by MIME type.
        #[cfg_attr(feature = "openapi", schema(value_type = Object))]
        data: BTreeMap<String, Value>,
    },
    /// The value of the code's last expression, as [`CodeOutput::DisplayData`] shows data.
    Result {
        /// The representations, by MIME type.
        #[cfg_attr(feature = "openapi", schema(value_type = Object))]
        data: BTreeMap<String, Value>,
    },
}

/// An exception the code raised.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CodeError {
    /// Its type (`ZeroDivisionError`).
    pub name: String,
    /// Its message.
    pub value: String,
    /// The traceback, a line each, without terminal colours.
    pub traceback: Vec<String>,
}

/// A running kernel and the server's connections to it.
pub(crate) struct Kernel {
    shell: ClientShellConnection,
    iopub: ClientIoPubConnection,
    control: ClientControlConnection,
    info: ConnectionInfo,
    /// The kernel's pid inside the sandbox.
    pid: u32,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("ip", &self.info.ip)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// A sandbox's kernel, started on first use; one call at a time.
pub(crate) type KernelSlot = tokio::sync::Mutex<Option<Kernel>>;

/// The checked parts of a [`CodeRequest`].
pub(crate) struct CodeCall {
    pub(crate) code: String,
    pub(crate) timeout: Duration,
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
        Some(secs) if (1..=MAX_CODE_TIMEOUT.as_secs()).contains(&secs) => Duration::from_secs(secs),
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
    })
}

/// Where a sandbox's kernel lives: its folder inside the sandbox and on the host.
pub(crate) struct KernelHome<'a> {
    /// The sandbox.
    pub(crate) sandbox: &'a Sandbox,
    /// The workspace's host folder.
    pub(crate) workspace: &'a Path,
    /// Where the workspace is inside.
    pub(crate) mount: &'a str,
    /// The Python that runs `ipykernel`, as the sandbox sees it.
    pub(crate) python: &'a str,
}

/// Runs `call` in the sandbox's kernel, starting one when there is none (or it died).
pub(crate) async fn run(
    home: KernelHome<'_>,
    slot: &KernelSlot,
    call: CodeCall,
) -> Result<CodeResult, AppError> {
    let started = Instant::now();
    // In use while the call runs: the idle timeout waits, and a sandbox its idle timeout
    // paused is resumed first (one paused by a request answers 409).
    let _in_use = home.sandbox.in_use().map_err(sandbox_error)?;
    let mut kernel = slot.lock().await;
    let kernel_started = kernel.is_none();
    let running = match kernel.as_mut() {
        Some(running) => running,
        None => kernel.insert(start(&home).await?),
    };
    match execute(running, &call).await {
        Ok(mut result) => {
            result.kernel_started = kernel_started;
            result.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            Ok(result)
        }
        Err(stop) => {
            // The kernel is gone or stuck: end what is left of it, and start anew next time.
            if let Some(dead) = kernel.take() {
                let _ = home
                    .sandbox
                    .run(ExecRequest::new(["kill", "-KILL", &dead.pid.to_string()]))
                    .await;
            }
            Err(stop)
        }
    }
}

fn kernel_error(code: &'static str, message: impl Into<String>) -> AppError {
    AppError::new(Failure::Unavailable, code, message)
}

/// Starts `ipykernel` in the sandbox, in the background (it is not a command the idle timeout
/// waits for), and connects to it once it has written its connection file.
async fn start(home: &KernelHome<'_>) -> Result<Kernel, AppError> {
    let name = uuid::Uuid::now_v7().simple().to_string();
    let name = &name[name.len() - 12..];
    let inside = format!("{}/.kernels/{name}", home.mount.trim_end_matches('/'));
    let outside = home.workspace.join(".kernels").join(name);
    let socket = outside.join("k-99");
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(kernel_error(
            "kernel_unavailable",
            format!(
                "the sandbox's folder is too deep for the kernel's sockets ({} is over {MAX_SOCKET_PATH} bytes): use a shorter sandboxes folder",
                socket.display()
            ),
        ));
    }
    let script = "mkdir -p \"$1\" && nohup \"$2\" -m ipykernel_launcher -f \"$1/connection.json\" \
                  --transport=ipc --ip=\"$1/k\" > \"$1/kernel.log\" 2>&1 < /dev/null & echo $!";
    let launched = home
        .sandbox
        .run(
            ExecRequest::new(["/bin/sh", "-c", script, "sh", &inside, home.python])
                .timeout(Duration::from_secs(20)),
        )
        .await
        .map_err(sandbox_error)?;
    let pid: u32 = launched.stdout_str().trim().parse().map_err(|_| {
        kernel_error(
            "kernel_unavailable",
            format!("the kernel did not start: {}", launched.stderr_str().trim()),
        )
    })?;
    let deadline = Instant::now() + KERNEL_START;
    let info = loop {
        if let Some(info) = read_connection(&outside.join("connection.json")).await {
            break info;
        }
        let log = tokio::fs::read_to_string(outside.join("kernel.log"))
            .await
            .unwrap_or_default();
        let exited = !home
            .sandbox
            .run(ExecRequest::new(["kill", "-0", &pid.to_string()]))
            .await
            .map_err(sandbox_error)?
            .status
            .success();
        if exited || Instant::now() >= deadline {
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(kernel_error(
                "kernel_unavailable",
                format!(
                    "the Python kernel ({} -m ipykernel_launcher) did not start{}: {}",
                    home.python,
                    if exited { "" } else { " in time" },
                    if tail.is_empty() {
                        "it wrote nothing".to_owned()
                    } else {
                        tail.join(" | ")
                    }
                ),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut info = info;
    info.ip = outside.join("k").to_string_lossy().into_owned();
    connect(info, pid).await
}

/// The kernel's connection file, once it is whole.
async fn read_connection(path: &Path) -> Option<ConnectionInfo> {
    let text = tokio::fs::read(path).await.ok()?;
    serde_json::from_slice(&text).ok()
}

fn broken(error: impl std::fmt::Display) -> AppError {
    kernel_error(
        "kernel_unavailable",
        format!("the kernel does not answer: {error}"),
    )
}

/// Connects to a started kernel and waits until it answers, its output channel included.
async fn connect(info: ConnectionInfo, pid: u32) -> Result<Kernel, AppError> {
    let session = uuid::Uuid::new_v4().to_string();
    let identity = peer_identity_for_session(&session).map_err(broken)?;
    let shell = create_client_shell_connection_with_identity(&info, &session, identity)
        .await
        .map_err(broken)?;
    let iopub = create_client_iopub_connection(&info, "", &session)
        .await
        .map_err(broken)?;
    let control = create_client_control_connection(&info, &session)
        .await
        .map_err(broken)?;
    let mut kernel = Kernel {
        shell,
        iopub,
        control,
        info,
        pid,
    };
    // A subscription takes a moment to reach the kernel: ask for its info until an answer
    // shows on the output channel too (its `status` messages), so no output of the first call
    // is missed.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let request: JupyterMessage = KernelInfoRequest {}.into();
        let id = request.header.msg_id.clone();
        kernel.shell.send(request).await.map_err(broken)?;
        let seen = tokio::time::timeout(Duration::from_millis(500), async {
            loop {
                match kernel.iopub.read().await {
                    Ok(message) if parent_id(&message) == Some(id.as_str()) => return true,
                    Ok(_) => {}
                    Err(_) => return false,
                }
            }
        })
        .await
        .unwrap_or(false);
        // Its reply on the shell channel (each request gets one).
        let _ = tokio::time::timeout(Duration::from_secs(5), kernel.shell.read()).await;
        if seen {
            return Ok(kernel);
        }
        if Instant::now() >= deadline {
            return Err(broken("no output from the kernel"));
        }
    }
}

fn parent_id(message: &JupyterMessage) -> Option<&str> {
    message
        .parent_header
        .as_ref()
        .map(|header| header.msg_id.as_str())
}

/// Whether the kernel answers its heartbeat within a second.
async fn alive(info: &ConnectionInfo) -> bool {
    tokio::time::timeout(Duration::from_secs(1), async {
        let mut heart = create_client_heartbeat_connection(info).await.ok()?;
        heart.single_heartbeat().await.ok()
    })
    .await
    .ok()
    .flatten()
    .is_some()
}

/// What a call collects.
#[derive(Default)]
struct Collected {
    outputs: Vec<CodeOutput>,
    error: Option<CodeError>,
    bytes: usize,
    truncated: bool,
}

impl Collected {
    fn push(&mut self, output: CodeOutput) {
        let size = match &output {
            CodeOutput::Stream { text, .. } => text.len(),
            CodeOutput::DisplayData { data } | CodeOutput::Result { data } => {
                data.values().map(|value| value.to_string().len()).sum()
            }
        };
        if self.bytes + size > MAX_OUTPUT_BYTES {
            self.truncated = true;
            return;
        }
        self.bytes += size;
        // Consecutive text on one stream is one output.
        if let (
            CodeOutput::Stream { name, text },
            Some(CodeOutput::Stream {
                name: last_name,
                text: last_text,
            }),
        ) = (&output, self.outputs.last_mut())
            && name == last_name
        {
            last_text.push_str(text);
            return;
        }
        self.outputs.push(output);
    }
}

/// The representations of a display, by MIME type.
fn media(data: &jupyter_protocol::Media) -> BTreeMap<String, Value> {
    match serde_json::to_value(data) {
        Ok(Value::Object(map)) => map.into_iter().collect(),
        _ => BTreeMap::new(),
    }
}

/// Runs one call: sends the code, collects its outputs until the kernel is idle again,
/// interrupts it at the timeout. An error means the kernel is dead or stuck.
async fn execute(kernel: &mut Kernel, call: &CodeCall) -> Result<CodeResult, AppError> {
    let request: JupyterMessage = ExecuteRequest {
        code: call.code.clone(),
        silent: false,
        store_history: true,
        user_expressions: None,
        allow_stdin: false,
        stop_on_error: true,
    }
    .into();
    let id = request.header.msg_id.clone();
    kernel.shell.send(request).await.map_err(broken)?;
    let mut collected = Collected::default();
    let mut execution_count = None;
    let mut timed_out = false;
    let mut deadline = tokio::time::Instant::now() + call.timeout;
    let mut heartbeat = tokio::time::interval(HEARTBEAT_EVERY);
    heartbeat.tick().await;
    loop {
        tokio::select! {
            message = kernel.iopub.read() => {
                let message = message.map_err(broken)?;
                if parent_id(&message) != Some(id.as_str()) {
                    continue;
                }
                match message.content {
                    JupyterMessageContent::StreamContent(stream) => collected.push(CodeOutput::Stream {
                        name: match stream.name { Stdio::Stdout => "stdout", Stdio::Stderr => "stderr" }.to_owned(),
                        text: stream.text,
                    }),
                    JupyterMessageContent::DisplayData(display) => {
                        collected.push(CodeOutput::DisplayData { data: media(&display.data) });
                    }
                    JupyterMessageContent::ExecuteResult(result) => {
                        execution_count = Some(result.execution_count.value() as u64);
                        collected.push(CodeOutput::Result { data: media(&result.data) });
                    }
                    JupyterMessageContent::ErrorOutput(error) => {
                        collected.error = Some(CodeError {
                            name: error.ename,
                            value: error.evalue,
                            traceback: error.traceback.iter().map(|line| without_colours(line)).collect(),
                        });
                    }
                    JupyterMessageContent::ExecuteInput(input) => {
                        execution_count = Some(input.execution_count.value() as u64);
                    }
                    JupyterMessageContent::Status(status)
                        if status.execution_state == ExecutionState::Idle => break,
                    _ => {}
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                if timed_out {
                    return Err(kernel_error(
                        "kernel_stuck",
                        format!("the code ran past its timeout ({:?}) and did not stop when interrupted: the kernel was ended, and the next call starts a new one (earlier variables are gone)", call.timeout),
                    ));
                }
                timed_out = true;
                deadline = tokio::time::Instant::now() + INTERRUPT_GRACE;
                let interrupt: JupyterMessage = InterruptRequest {}.into();
                kernel.control.send(interrupt).await.map_err(broken)?;
            }
            _ = heartbeat.tick() => {
                if !alive(&kernel.info).await {
                    return Err(AppError::new(
                        Failure::Conflict,
                        "kernel_died",
                        "the kernel died while running the code (its process ended: the code may have exited it, or run out of memory); the next call starts a new one, and earlier variables are gone",
                    ));
                }
            }
        }
    }
    // The execute reply on the shell channel; replies to earlier requests are skipped.
    let reply = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match kernel.shell.read().await {
                Ok(message) if parent_id(&message) == Some(id.as_str()) => return Some(message),
                Ok(_) => {}
                Err(_) => return None,
            }
        }
    })
    .await
    .ok()
    .flatten();
    if let Some(JupyterMessageContent::ExecuteReply(reply)) = reply.map(|message| message.content) {
        execution_count = Some(reply.execution_count.value() as u64);
    }
    Ok(CodeResult {
        outputs: collected.outputs,
        error: collected.error,
        execution_count,
        timed_out,
        outputs_truncated: collected.truncated,
        kernel_started: false,
        duration_ms: 0,
    })
}

/// `text` without ANSI escape sequences (IPython colours its tracebacks).
fn without_colours(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' && chars.peek() == Some(&'[') {
            chars.next();
            // Parameters and intermediates, then one final byte in @..~.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colours_are_taken_out_of_tracebacks() {
        assert_eq!(
            without_colours("\u{1b}[0;31mZeroDivisionError\u{1b}[0m: division by zero"),
            "ZeroDivisionError: division by zero"
        );
        assert_eq!(without_colours("plain"), "plain");
    }

    #[test]
    fn requests_are_checked() {
        let request = |code: &str, language: Option<&str>, timeout: Option<u64>| CodeRequest {
            code: code.into(),
            language: language.map(Into::into),
            timeout_secs: timeout,
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
