//! A stateful Python kernel in a sandbox, spoken to with the Jupyter messaging protocol
//! (`jupyter-protocol`, `jupyter-zmq-client`: the runtimed project's crates, ZeroMQ in pure
//! Rust): the code interpreter behind `POST /v1/sandboxes/{id}/code` and the `run_code` tool.
//!
//! The kernel is the real `ipykernel`, started inside the sandbox on first use with ZeroMQ's
//! `ipc` transport: its sockets are files in the sandbox's workspace (`.kernels/<id>/k-1` …),
//! which the server reaches through the workspace's host folder — no network between the two,
//! the sandbox's own network namespace stays closed. Variables live between calls; a call
//! collects the kernel's stdout and stderr, its rich results (PNG and SVG charts, HTML and JSON
//! tables, plain text) and its error with the traceback. A call past its timeout interrupts the
//! kernel (the code gets `KeyboardInterrupt`, the kernel and its state stay); a kernel that
//! dies is noticed by its heartbeat, the call fails with `kernel_died`, and the next call
//! starts a new one. A kernel whose sandbox was closed and made again is replaced the same way.

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
use serde::Serialize;
use serde_json::Value;

use agentry_sandbox::{ExecRequest, Sandbox, SandboxError};

/// The Python a kernel starts with when the server names none: the sandbox's own `python3`,
/// which needs `ipykernel` installed.
pub const DEFAULT_KERNEL_PYTHON: &str = "python3";
/// How long a call may run when it says nothing.
pub const DEFAULT_CODE_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest a call may ask for.
pub const MAX_CODE_TIMEOUT: Duration = Duration::from_secs(3600);
/// The largest piece of code accepted, in bytes.
pub const MAX_CODE_BYTES: usize = 1024 * 1024;
/// The most output one call keeps, in bytes (text and encoded images together); past it,
/// later outputs are dropped and the result says so.
pub const MAX_OUTPUT_BYTES: usize = 16 * 1024 * 1024;
/// How long a new kernel may take to start.
const KERNEL_START: Duration = Duration::from_secs(60);
/// How long an interrupted call may take to stop before its kernel counts as stuck.
const INTERRUPT_GRACE: Duration = Duration::from_secs(5);
/// How often a running call checks that its kernel is alive.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
/// The longest socket path Linux takes (`sun_path` is 108 bytes, with its NUL).
const MAX_SOCKET_PATH: usize = 107;

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
    /// How long the kernel itself was busy with it (from its `busy` to its `idle` status, by
    /// the kernel's clock), milliseconds.
    pub kernel_ms: Option<f64>,
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
pub struct Kernel {
    shell: ClientShellConnection,
    iopub: ClientIoPubConnection,
    control: ClientControlConnection,
    info: ConnectionInfo,
    /// The kernel's pid inside the sandbox.
    pid: u32,
    /// The sandbox it runs in (its PID 1 on the host): a sandbox made again needs a new kernel.
    sandbox: Option<i32>,
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
pub type KernelSlot = tokio::sync::Mutex<Option<Kernel>>;

/// One call: the code and how long it may run before it is interrupted.
#[derive(Debug, Clone)]
pub struct CodeCall {
    /// The code.
    pub code: String,
    /// Interrupt it after this long.
    pub timeout: Duration,
}

/// Why a call did not run to an answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// The sandbox refused (paused by a request, closed…).
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
    /// No kernel could start, or it does not answer.
    #[error("{0}")]
    Unavailable(String),
    /// The kernel died while running the code; the next call starts a new one.
    #[error(
        "the kernel died while running the code (its process ended: the code may have exited it, \
         or run out of memory); the next call starts a new one, and earlier variables are gone"
    )]
    Died,
    /// The code ran past its timeout and did not stop when interrupted; the kernel was ended.
    #[error(
        "the code ran past its timeout ({0:?}) and did not stop when interrupted: the kernel was \
         ended, and the next call starts a new one (earlier variables are gone)"
    )]
    Stuck(Duration),
}

/// Where a sandbox's kernel lives: its folder inside the sandbox and on the host.
pub struct KernelHome<'a> {
    /// The sandbox.
    pub sandbox: &'a Sandbox,
    /// The workspace's host folder.
    pub workspace: &'a Path,
    /// Where the workspace is inside.
    pub mount: &'a str,
    /// The Python that runs `ipykernel`, as the sandbox sees it.
    pub python: &'a str,
}

/// Runs `call` in the sandbox's kernel, starting one when there is none (or it died, or the
/// sandbox was made again).
pub async fn run(
    home: KernelHome<'_>,
    slot: &KernelSlot,
    call: CodeCall,
) -> Result<CodeResult, KernelError> {
    let started = Instant::now();
    // In use while the call runs: the idle timeout waits, and a sandbox its idle timeout
    // paused is resumed first (one paused by a request refuses).
    let _in_use = home.sandbox.in_use()?;
    let mut kernel = slot.lock().await;
    if kernel
        .as_ref()
        .is_some_and(|kernel| kernel.sandbox != home.sandbox.pid1())
    {
        *kernel = None;
    }
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

/// Starts `ipykernel` in the sandbox, in the background (it is not a command the idle timeout
/// waits for), and connects to it once it has written its connection file.
async fn start(home: &KernelHome<'_>) -> Result<Kernel, KernelError> {
    let name = format!("{:012x}", fastrand::u64(..) >> 16);
    let inside = format!("{}/.kernels/{name}", home.mount.trim_end_matches('/'));
    let outside = home.workspace.join(".kernels").join(name);
    let socket = outside.join("k-99");
    if socket.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(KernelError::Unavailable(format!(
            "the sandbox's folder is too deep for the kernel's sockets ({} is over \
             {MAX_SOCKET_PATH} bytes): use a shorter sandboxes folder",
            socket.display()
        )));
    }
    let script = "mkdir -p \"$1\" && nohup \"$2\" -m ipykernel_launcher -f \"$1/connection.json\" \
                  --transport=ipc --ip=\"$1/k\" > \"$1/kernel.log\" 2>&1 < /dev/null & echo $!";
    let launched = home
        .sandbox
        .run(
            ExecRequest::new(["/bin/sh", "-c", script, "sh", &inside, home.python])
                .timeout(Duration::from_secs(20)),
        )
        .await?;
    let pid: u32 = launched.stdout_str().trim().parse().map_err(|_| {
        KernelError::Unavailable(format!(
            "the kernel did not start: {}",
            launched.stderr_str().trim()
        ))
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
            .await?
            .status
            .success();
        if exited || Instant::now() >= deadline {
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(KernelError::Unavailable(format!(
                "the Python kernel ({} -m ipykernel_launcher) did not start{}: {}",
                home.python,
                if exited { "" } else { " in time" },
                if tail.is_empty() {
                    "it wrote nothing".to_owned()
                } else {
                    tail.join(" | ")
                }
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut info = info;
    info.ip = outside.join("k").to_string_lossy().into_owned();
    connect(info, pid, home.sandbox.pid1()).await
}

/// The kernel's connection file, once it is whole.
async fn read_connection(path: &Path) -> Option<ConnectionInfo> {
    let text = tokio::fs::read(path).await.ok()?;
    serde_json::from_slice(&text).ok()
}

fn broken(error: impl std::fmt::Display) -> KernelError {
    KernelError::Unavailable(format!("the kernel does not answer: {error}"))
}

/// Connects to a started kernel and waits until it answers, its output channel included.
async fn connect(
    info: ConnectionInfo,
    pid: u32,
    sandbox: Option<i32>,
) -> Result<Kernel, KernelError> {
    let session = format!("{:032x}", fastrand::u128(..));
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
        sandbox,
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
async fn execute(kernel: &mut Kernel, call: &CodeCall) -> Result<CodeResult, KernelError> {
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
    let mut busy_at = None;
    let kernel_ms: Option<f64>;
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
                let at = message.header.date;
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
                            traceback: error.traceback.iter().map(strip_ansi_escapes::strip_str).collect(),
                        });
                    }
                    JupyterMessageContent::ExecuteInput(input) => {
                        execution_count = Some(input.execution_count.value() as u64);
                    }
                    JupyterMessageContent::Status(status)
                        if status.execution_state == ExecutionState::Busy => busy_at = Some(at),
                    JupyterMessageContent::Status(status)
                        if status.execution_state == ExecutionState::Idle => {
                        kernel_ms = busy_at.and_then(|busy| (at - busy).num_microseconds()).map(|micros| micros as f64 / 1000.0);
                        break;
                    }
                    _ => {}
                }
            }
            () = tokio::time::sleep_until(deadline) => {
                if timed_out {
                    return Err(KernelError::Stuck(call.timeout));
                }
                timed_out = true;
                deadline = tokio::time::Instant::now() + INTERRUPT_GRACE;
                let interrupt: JupyterMessage = InterruptRequest {}.into();
                kernel.control.send(interrupt).await.map_err(broken)?;
            }
            _ = heartbeat.tick() => {
                if !alive(&kernel.info).await {
                    return Err(KernelError::Died);
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
        kernel_ms,
    })
}
