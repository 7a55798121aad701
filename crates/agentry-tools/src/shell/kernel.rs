//! A stateful Python kernel in a sandbox, spoken to with the Jupyter messaging protocol
//! (`jupyter-protocol`, `jupyter-zmq-client`: the runtimed project's crates, ZeroMQ in pure
//! Rust): the code interpreter behind `POST /v1/sandboxes/{id}/code` and the `run_code` tool.
//!
//! The kernel is the real `ipykernel`, started inside the sandbox on first use with ZeroMQ's
//! `ipc` transport: its sockets are files in the sandbox's workspace (`.kernels/<id>/k-1` …),
//! which the server reaches through the workspace's host folder — no network between the two,
//! the sandbox's own network namespace stays closed. The sandbox owns those files, so the server
//! never follows them to the host's: the kernel's log and connection file are read beneath the
//! workspace only, and its folder is opened without following a link, held, made the host's
//! (when the server runs as root) and connected through (`/proc/self/fd/N/k-1`). Variables live between calls; a call
//! collects the kernel's stdout and stderr, its rich results (PNG and SVG charts, HTML and JSON
//! tables, plain text) and its error with the traceback. A call past its timeout interrupts the
//! kernel (the code gets `KeyboardInterrupt`, the kernel and its state stay); a kernel that
//! dies is noticed by its heartbeat, the call fails with `kernel_died`, and the next call
//! starts a new one. A kernel whose sandbox was closed and made again is replaced the same way.

use std::collections::BTreeMap;
use std::io::Read;
use std::os::fd::AsRawFd;
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

use agentry_core::workspace::Root;
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
    /// The kernel's folder, held open: its sockets are reached through this descriptor
    /// (`/proc/self/fd/N/k-1`), never through the workspace's paths, which the sandbox can
    /// change.
    folder: std::os::fd::OwnedFd,
}

impl Drop for Kernel {
    /// Empties the kernel's folder (its sockets, connection file and log) through the held
    /// descriptor, so dead kernels leave nothing in a session's workspace but an empty folder.
    fn drop(&mut self) {
        let Ok(entries) = rustix::fs::Dir::read_from(&self.folder) else {
            return;
        };
        let names: Vec<std::ffi::CString> = entries
            .flatten()
            .map(|entry| entry.file_name().to_owned())
            .filter(|name| name.as_bytes() != b"." && name.as_bytes() != b"..")
            .collect();
        for name in names {
            let _ =
                rustix::fs::unlinkat(&self.folder, name.as_c_str(), rustix::fs::AtFlags::empty());
        }
    }
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
    /// Where each output goes as soon as the kernel sends it (a streamed call), besides the
    /// result.
    pub live: Option<tokio::sync::mpsc::UnboundedSender<CodeOutput>>,
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
    let folder = Path::new(".kernels").join(&name);
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
    // The kernel's files are the sandbox's: they are read beneath the workspace only (a link
    // out of it is refused), never followed to the host's files.
    let root =
        Root::open(home.workspace).map_err(|error| KernelError::Unavailable(error.to_string()))?;
    let deadline = Instant::now() + KERNEL_START;
    let info = loop {
        if let Some(info) = read_beneath(&root, &folder.join("connection.json"))
            .and_then(|bytes| serde_json::from_slice::<ConnectionInfo>(&bytes).ok())
        {
            break info;
        }
        let exited = !home
            .sandbox
            .run(ExecRequest::new(["kill", "-0", &pid.to_string()]))
            .await?
            .status
            .success();
        if exited || Instant::now() >= deadline {
            let log = read_beneath(&root, &folder.join("kernel.log")).unwrap_or_default();
            let log = String::from_utf8_lossy(&log);
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
    let pinned = sockets_folder(home.workspace, &folder, &info)?;
    let mut info = info;
    info.ip = format!("/proc/self/fd/{}/k", pinned.as_raw_fd());
    connect(info, pid, home.sandbox.pid1(), pinned).await
}

/// At most this much of a kernel's file is read (its connection file, its log).
const MAX_KERNEL_FILE: u64 = 1 << 20;

/// A file of the kernel's, read beneath the workspace (links out of it refused).
fn read_beneath(root: &Root, relative: &Path) -> Option<Vec<u8>> {
    let (file, _) = root.open_read(relative, "the kernel's file").ok()?;
    let mut bytes = Vec::new();
    file.take(MAX_KERNEL_FILE).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// The kernel's folder, opened beneath the workspace without following any link and held:
/// where the server runs as root, it is then made the host's (owner root, mode 0755), so the
/// sandbox can no longer add, remove or swap its entries; each socket is checked to be one
/// (not a link to a socket of the host's). Connections then go through the descriptor.
fn sockets_folder(
    workspace: &Path,
    folder: &Path,
    info: &ConnectionInfo,
) -> Result<std::os::fd::OwnedFd, KernelError> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
    let refused = |what: String| KernelError::Unavailable(format!("the kernel's folder {what}"));
    let workspace = rustix::fs::open(
        workspace,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| refused(format!("cannot be opened: {errno}")))?;
    let dir = rustix::fs::openat2(
        &workspace,
        folder,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|errno| {
        refused(format!(
            "cannot be opened without following a link: {errno}"
        ))
    })?;
    if rustix::process::geteuid().is_root() {
        rustix::fs::fchown(
            &dir,
            Some(rustix::fs::Uid::ROOT),
            Some(rustix::fs::Gid::ROOT),
        )
        .and_then(|()| rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o755)))
        .map_err(|errno| refused(format!("cannot be made the host's: {errno}")))?;
    }
    for port in [
        info.shell_port,
        info.iopub_port,
        info.stdin_port,
        info.control_port,
        info.hb_port,
    ] {
        let name = format!("k-{port}");
        let stat = rustix::fs::statat(&dir, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|errno| refused(format!("has no socket {name}: {errno}")))?;
        if FileType::from_raw_mode(stat.st_mode) != FileType::Socket {
            return Err(refused(format!("holds {name}, which is not a socket")));
        }
    }
    Ok(dir)
}

fn broken(error: impl std::fmt::Display) -> KernelError {
    KernelError::Unavailable(format!("the kernel does not answer: {error}"))
}

/// Connects to a started kernel and waits until it answers, its output channel included.
async fn connect(
    info: ConnectionInfo,
    pid: u32,
    sandbox: Option<i32>,
    folder: std::os::fd::OwnedFd,
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
        folder,
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
    live: Option<tokio::sync::mpsc::UnboundedSender<CodeOutput>>,
}

impl Collected {
    fn push(&mut self, output: CodeOutput) {
        if let Some(live) = &self.live
            && live.send(output.clone()).is_err()
        {
            // The listener went away; the call goes on to its end for the kernel's sake.
            self.live = None;
        }
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
    let mut collected = Collected {
        live: call.live.clone(),
        ..Collected::default()
    };
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
