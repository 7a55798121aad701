//! Sandbox routes: an E2B-like surface over the sandboxes of `agentry-sandbox`.
//!
//! - `GET /v1/sandbox/capabilities`: what isolation this host gives, which backend is
//!   configured, and whether sandboxes are enabled (and why not).
//! - `/v1/sandboxes`: create (a fresh workspace each, optional environment and limits), list,
//!   show, delete (close). Registry: [`agentry_app::sandboxes`].
//! - `POST /v1/sandboxes/{id}/exec`: run a command (`argv`, or a `command` line for `/bin/sh
//!   -c`) with optional environment, working directory, stdin and timeout; wait for it (JSON),
//!   stream it (`"stream": true`: server-sent events `stdout`, `stderr`, then `exit`), or start
//!   it in the background (`"background": true`: `202` with its `exec_id`). A waiting or
//!   streaming command is killed when its client goes away.
//! - `/v1/sandboxes/{id}/processes`: background processes: list the running ones, read one's
//!   output so far and status, kill one (with everything it started).
//! - `/v1/sandboxes/{id}/files`: read (raw bytes), write (the raw body), delete, list, stat,
//!   mkdir. Paths are the sandbox's own (relative ones from its workspace), resolved inside it
//!   by its agent, so a symlink cannot lead out.
//!
//! When the server has no sandboxes (`ToolEnvironment::sandboxes` is `None`) every route but
//! the capabilities answers `503 sandboxes_disabled`.

use std::convert::Infallible;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::io::AsyncWriteExt;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;
use uuid::Uuid;

use agentry_app::domain::sandbox::{
    Capabilities, DirEntry, ExecEvent, ExecHandle, ExitStatus, FileStat, SandboxPool,
    SandboxReport, SandboxSpec,
};

use super::config::{ApiJson, ApiPath};
use super::serde_name;
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{
    BadRequest, Conflict, FileTooLarge, Forbidden, JsonBodyErrors, NotFound, SandboxUnavailable,
    TooManyRequests,
};
use crate::state::AppState;
use agentry_app::clock::millis;
use agentry_app::sandbox_requests::{
    CreateSandboxRequest, ExecBody, check_path, command, sandbox_spec,
};
use agentry_app::sandboxes::{CappedOutput, OUTPUT_CAP, Process, Standalone, sandbox_error};

/// The largest file read or written through the API (bytes).
pub const FILE_LIMIT: usize = 16 * 1024 * 1024;

/// How long killing a background process waits for it to end before answering.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// The sandbox routes.
pub fn routes() -> OpenApiRouter<AppState> {
    // Files are written from the raw body: up to FILE_LIMIT, not the API's JSON limit.
    let files = OpenApiRouter::new()
        .routes(routes!(read_file, write_file, delete_file))
        .layer(DefaultBodyLimit::max(FILE_LIMIT));
    OpenApiRouter::new()
        .routes(routes!(capabilities))
        .routes(routes!(list_sandboxes, create_sandbox))
        .routes(routes!(get_sandbox, delete_sandbox))
        .routes(routes!(exec))
        .routes(routes!(list_processes))
        .routes(routes!(get_process))
        .routes(routes!(kill_process))
        .routes(routes!(list_files))
        .routes(routes!(stat_file))
        .routes(routes!(make_directory))
        .merge(files)
}

// --- parameters ---

/// The sandbox a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SandboxPath {
    /// The sandbox's id: a UUIDv7, lowercase and hyphenated.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub id: String,
}

/// The background process a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProcessPath {
    /// The sandbox's id: a UUIDv7, lowercase and hyphenated.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub id: String,
    /// The process's id (`exec_id`): a UUIDv7, lowercase and hyphenated.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub exec_id: String,
}

/// A path inside the sandbox.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// The path inside the sandbox: absolute, or relative to its workspace (1 to 4096 bytes,
    /// no NUL).
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")]
    pub path: String,
}

/// A directory inside the sandbox.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The directory: absolute, or relative to the workspace (default: the workspace).
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")]
    pub path: Option<String>,
}

/// What to delete inside the sandbox.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// The path: absolute, or relative to the workspace.
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")]
    pub path: String,
    /// Delete a directory with its contents (otherwise only an empty one).
    #[serde(default)]
    #[param(default = false)]
    pub recursive: bool,
}

// --- bodies ---

/// The body of `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// The directory: absolute, or relative to the workspace (no NUL).
    #[schema(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")]
    pub path: String,
    /// Make missing parents too (and succeed if it exists).
    #[serde(default)]
    pub parents: bool,
}

/// Raw bytes (`application/octet-stream`): a binary string in the document.
#[derive(Debug, Clone, Copy)]
pub struct Binary;

impl utoipa::PartialSchema for Binary {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .description(Some("Raw bytes."))
            .into()
    }
}

impl ToSchema for Binary {
    fn name() -> std::borrow::Cow<'static, str> {
        "Binary".into()
    }
}

// --- answers ---

/// What isolation this host gives, as probed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct HostCapabilities {
    /// The operating system (`linux`, …).
    pub os: String,
    /// The server runs as root (sandboxes then run as an unprivileged outer uid).
    pub running_as_root: bool,
    /// User namespaces (with mount, pid, net, ipc and uts namespaces inside) can be made.
    pub user_namespaces: bool,
    /// The kernel's Landlock ABI version, if Landlock is enabled.
    pub landlock_abi: Option<u32>,
    /// seccomp filters are available.
    pub seccomp: bool,
    /// The cgroup interface the server may use: `v2`, `v1` or `none`.
    pub cgroup: String,
    /// How a native sandbox's limits are enforced here: `cgroup_v2`, `cgroup_v1` or `rlimit`.
    pub limits: String,
    /// The native backend can run here.
    pub native_available: bool,
    /// Anything weaker than the full design, in words.
    pub warnings: Vec<String>,
}

/// `GET /v1/sandbox/capabilities`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxCapabilities {
    /// Whether `/v1/sandboxes` can make sandboxes.
    pub enabled: bool,
    /// The configured backend: `native` (isolated) or `local` (no isolation, development
    /// only); `null` when sandboxes are disabled.
    pub backend: Option<String>,
    /// Why sandboxes are disabled.
    pub disabled_reason: Option<String>,
    /// How many standalone sandboxes may be open at once.
    pub max_sandboxes: usize,
    /// How many are open now.
    pub open_sandboxes: usize,
    /// The limits a new sandbox gets unless it asks for others (when enabled).
    pub default_limits: Option<LimitsView>,
    /// What the host gives.
    pub host: HostCapabilities,
    /// Whether commands may run on the host without isolation (`--allow-host-commands`):
    /// command tools and stdio MCP servers that say `"host": true`, and all of them when there
    /// is no sandbox. When `false`, those are refused.
    pub allow_host_commands: bool,
    /// Where stdio MCP servers run: `sandbox` (each in a sandbox of its own), `host` (no
    /// sandbox, host commands allowed) or `refused`.
    pub mcp_stdio: String,
    /// Where command tools run: `sandbox` (the session's), `host` (no sandbox, host commands
    /// allowed) or `refused`.
    pub command_tools: String,
}

/// A sandbox's limits.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct LimitsView {
    /// Memory, bytes.
    pub memory_bytes: Option<u64>,
    /// Processes and threads.
    pub max_processes: Option<u64>,
    /// CPU share, percent of one core.
    pub cpu_percent: Option<u32>,
    /// CPU time per process, seconds.
    pub cpu_time_secs: Option<u64>,
    /// Lifetime, seconds.
    pub wall_time_secs: Option<u64>,
    /// Idle time before it is closed, seconds.
    pub idle_timeout_secs: Option<u64>,
    /// Largest file a process may write, bytes.
    pub file_size_bytes: Option<u64>,
    /// Open files per process.
    pub open_files: Option<u64>,
    /// Size of `/tmp`, bytes.
    pub tmp_size_bytes: u64,
}

/// The policy a native sandbox's agent reports after building it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PolicyView {
    /// The namespaces it runs in.
    pub namespaces: Vec<String>,
    /// Landlock: `fully_enforced`, `partially_enforced` or `not_enforced`.
    pub landlock: String,
    /// A seccomp deny-list is installed.
    pub seccomp: bool,
    /// `no_new_privs` is set.
    pub no_new_privs: bool,
    /// Every capability is dropped.
    pub capabilities_dropped: bool,
    /// Only loopback is up and no proxy runs: nothing outside is reachable.
    pub network_off: bool,
    /// The network as the agent set it up: `off`, `allow_list` or `host`.
    pub network: String,
    /// Where the bridge to the host's allow-list proxy listens inside, when one runs.
    pub proxy_bridge: Option<String>,
}

/// The network a sandbox got.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct NetworkView {
    /// `off` (loopback only), `allow_list` (loopback plus an HTTP proxy reaching only
    /// `allowed_domains`) or `host` (local backend: the server's own network, unrestricted).
    pub mode: String,
    /// The domains the proxy reaches.
    pub allowed_domains: Vec<String>,
    /// The proxy may connect to loopback and private addresses.
    pub allow_private: bool,
    /// The proxy's URL as commands see it (also in their `HTTP_PROXY`).
    pub proxy_url: Option<String>,
}

/// What one sandbox got.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ReportView {
    /// `native` or `local`.
    pub backend: String,
    /// `false` for the local backend: commands run as plain processes of the server's user.
    pub isolated: bool,
    /// The uid its processes have on the host.
    pub outer_uid: u32,
    /// How its limits are enforced: `cgroup_v2`, `cgroup_v1` or `rlimit`.
    pub limits: String,
    /// The network it got.
    pub network: NetworkView,
    /// The policy inside (native only).
    pub policy: Option<PolicyView>,
    /// Anything weaker than the full design, in words.
    pub warnings: Vec<String>,
}

/// A standalone sandbox.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxView {
    /// Its id (UUIDv7).
    pub id: String,
    /// When it was made, Unix milliseconds.
    pub created_at: u64,
    /// Where its workspace is inside, and commands' default working directory.
    pub workspace_mount: String,
    /// What it got: backend, isolation, limits mode, policy, warnings.
    pub report: ReportView,
    /// Its limits.
    pub limits: LimitsView,
    /// How many background processes run in it.
    pub running_processes: usize,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct SandboxList {
    /// The open sandboxes, oldest first.
    pub sandboxes: Vec<SandboxView>,
}

/// What a command printed and how it ended (`POST /v1/sandboxes/{id}/exec`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExecResult {
    /// Standard output (UTF-8, invalid bytes replaced), its first 1 MiB.
    pub stdout: String,
    /// Standard error, likewise.
    pub stderr: String,
    /// Whether stdout went past 1 MiB (the rest is dropped).
    pub stdout_truncated: bool,
    /// Whether stderr went past 1 MiB.
    pub stderr_truncated: bool,
    /// The exit code, if it exited (127: not found, 126: not executable).
    pub exit_code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Killed because its timeout ran out.
    pub timed_out: bool,
    /// Killed on request.
    pub killed: bool,
    /// Killed by the sandbox's out-of-memory killer.
    pub out_of_memory: bool,
    /// The sandbox went away while it ran; why.
    pub sandbox_closed: Option<String>,
    /// How long it ran, milliseconds.
    pub duration_ms: u64,
}

/// How a command ended (the `exit` event's data, and a finished background process's `exit`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ExitView {
    /// The exit code, if it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Killed because its timeout ran out.
    pub timed_out: bool,
    /// Killed on request.
    pub killed: bool,
    /// Killed by the sandbox's out-of-memory killer.
    pub out_of_memory: bool,
    /// The sandbox went away while it ran; why.
    pub sandbox_closed: Option<String>,
    /// How long it ran, milliseconds.
    pub duration_ms: u64,
}

/// The events of a streamed command.
#[derive(Debug, Clone, Copy, ToSchema)]
pub enum ExecStreamEventName {
    /// A chunk of standard output: `{"text"}` (UTF-8; a character split across chunks is sent
    /// whole with the next one).
    #[schema(rename = "stdout")]
    Stdout,
    /// A chunk of standard error: `{"text"}`.
    #[schema(rename = "stderr")]
    Stderr,
    /// The command ended (last): an `ExitView`.
    #[schema(rename = "exit")]
    Exit,
}

/// One server-sent event of a streamed command.
#[derive(Debug, Clone, ToSchema)]
pub struct ExecStreamEvent {
    /// The event's name.
    pub event: ExecStreamEventName,
    /// Its data: one JSON document.
    pub data: String,
}

/// A background command started (`202`).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct BackgroundStarted {
    /// The sandbox.
    pub sandbox_id: String,
    /// The process's id, for `/v1/sandboxes/{id}/processes/{exec_id}`.
    pub exec_id: String,
    /// What runs.
    pub argv: Vec<String>,
    /// When it started, Unix milliseconds.
    pub started_at: u64,
}

/// A background process as listed.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProcessSummary {
    /// Its id.
    pub exec_id: String,
    /// What runs.
    pub argv: Vec<String>,
    /// When it started, Unix milliseconds.
    pub started_at: u64,
    /// Whether it still runs.
    pub running: bool,
}

/// `GET /v1/sandboxes/{id}/processes`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProcessList {
    /// The running background processes, oldest first.
    pub processes: Vec<ProcessSummary>,
}

/// A background process: its output so far and its status.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ProcessDetail {
    /// Its id.
    pub exec_id: String,
    /// What runs.
    pub argv: Vec<String>,
    /// When it started, Unix milliseconds.
    pub started_at: u64,
    /// Whether it still runs.
    pub running: bool,
    /// Standard output so far (UTF-8, invalid bytes replaced), its first 1 MiB.
    pub stdout: String,
    /// Standard error so far, likewise.
    pub stderr: String,
    /// Whether stdout went past 1 MiB.
    pub stdout_truncated: bool,
    /// Whether stderr went past 1 MiB.
    pub stderr_truncated: bool,
    /// How long it has run (or ran), milliseconds.
    pub duration_ms: u64,
    /// How it ended; `null` while it runs.
    pub exit: Option<ExitView>,
}

/// Metadata of one path inside the sandbox (symlinks are not followed).
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct FileStatView {
    /// The path asked for.
    pub path: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size, bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub modified: i64,
    /// A symlink's target.
    pub symlink_target: Option<String>,
}

/// One entry of a directory.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DirEntryView {
    /// The file name.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Size, bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub modified: i64,
    /// A symlink's target.
    pub symlink_target: Option<String>,
}

/// `GET /v1/sandboxes/{id}/files/list`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct DirListing {
    /// The directory listed.
    pub path: String,
    /// Its entries, by name.
    pub entries: Vec<DirEntryView>,
}

// --- conversions ---

/// The snake_case name serde gives a unit enum value.
fn host_view(capabilities: &Capabilities) -> HostCapabilities {
    HostCapabilities {
        os: capabilities.os.clone(),
        running_as_root: capabilities.running_as_root,
        user_namespaces: capabilities.user_namespaces,
        landlock_abi: capabilities.landlock_abi,
        seccomp: capabilities.seccomp,
        cgroup: serde_name(&capabilities.cgroup),
        limits: serde_name(&capabilities.limits),
        native_available: capabilities.native_available,
        warnings: capabilities.warnings.clone(),
    }
}

fn limits_view(spec: &SandboxSpec) -> LimitsView {
    let limits = &spec.limits;
    LimitsView {
        memory_bytes: limits.memory_bytes,
        max_processes: limits.max_processes,
        cpu_percent: limits.cpu_percent,
        cpu_time_secs: limits.cpu_time.map(|time| time.as_secs()),
        wall_time_secs: limits.wall_time.map(|time| time.as_secs()),
        idle_timeout_secs: spec.idle_timeout.map(|time| time.as_secs()),
        file_size_bytes: limits.file_size,
        open_files: limits.open_files,
        tmp_size_bytes: limits.tmp_size,
    }
}

fn report_view(report: &SandboxReport) -> ReportView {
    ReportView {
        backend: serde_name(&report.backend),
        isolated: report.isolated,
        outer_uid: report.outer_uid,
        limits: serde_name(&report.limits),
        network: NetworkView {
            mode: serde_name(&report.network.mode),
            allowed_domains: report.network.allowed_domains.clone(),
            allow_private: report.network.allow_private,
            proxy_url: report.network.proxy_url.clone(),
        },
        policy: report.policy.as_ref().map(|policy| PolicyView {
            namespaces: policy.namespaces.clone(),
            landlock: policy.landlock.clone(),
            seccomp: policy.seccomp,
            no_new_privs: policy.no_new_privs,
            capabilities_dropped: policy.capabilities_dropped,
            network_off: policy.network_off,
            network: policy.network.clone(),
            proxy_bridge: policy.proxy_bridge.clone(),
        }),
        warnings: report.warnings.clone(),
    }
}

fn sandbox_view(entry: &Standalone) -> SandboxView {
    SandboxView {
        id: entry.id.to_string(),
        created_at: entry.created_at,
        workspace_mount: entry.spec.workspace_mount.clone(),
        report: report_view(entry.sandbox.report()),
        limits: limits_view(&entry.spec),
        running_processes: entry.running_processes().len(),
    }
}

fn exit_view(status: &ExitStatus, duration_ms: u64) -> ExitView {
    ExitView {
        exit_code: status.code,
        signal: status.signal,
        timed_out: status.timed_out,
        killed: status.killed,
        out_of_memory: status.out_of_memory,
        sandbox_closed: status.sandbox_closed.clone(),
        duration_ms,
    }
}

fn process_detail(process: &Process) -> ProcessDetail {
    let output = process.output();
    ProcessDetail {
        exec_id: process.id.to_string(),
        argv: process.argv.clone(),
        started_at: process.started_at,
        running: output.exit.is_none(),
        stdout: output.stdout.text(),
        stderr: output.stderr.text(),
        stdout_truncated: output.stdout.truncated,
        stderr_truncated: output.stderr.truncated,
        duration_ms: output.duration_ms,
        exit: output
            .exit
            .as_ref()
            .map(|status| exit_view(status, output.duration_ms)),
    }
}

fn stat_view(path: &str, stat: &FileStat) -> FileStatView {
    FileStatView {
        path: path.to_owned(),
        kind: serde_name(&stat.kind),
        size: stat.size,
        mode: stat.mode,
        modified: stat.modified,
        symlink_target: stat.symlink_target.clone(),
    }
}

fn entry_view(entry: &DirEntry) -> DirEntryView {
    DirEntryView {
        name: entry.name.clone(),
        kind: serde_name(&entry.stat.kind),
        size: entry.stat.size,
        mode: entry.stat.mode,
        modified: entry.stat.modified,
        symlink_target: entry.stat.symlink_target.clone(),
    }
}

// --- checks ---

/// The pool whose backend makes sandboxes: `503 sandboxes_disabled` without one.
fn pool(state: &AppState) -> Result<&SandboxPool, ApiError> {
    state.tools.sandboxes.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "sandboxes_disabled",
            "this server runs without sandboxes (see GET /v1/sandbox/capabilities)",
        )
    })
}

/// Parses an id of the form the API hands out: a UUIDv7, lowercase and hyphenated.
fn parse_id(kind: &str, value: &str) -> Result<Uuid, ApiError> {
    let invalid = || {
        let shown: String = value.chars().take(64).collect();
        ApiError::bad_request(format!(
            "invalid {kind} id {shown:?}: expected a UUIDv7 such as \
             01890a5d-ac96-774b-bcce-b302099a8057"
        ))
    };
    if value.len() != 36 {
        return Err(invalid());
    }
    let id = Uuid::try_parse(value).map_err(|_| invalid())?;
    if id.get_version_num() != 7 || id.hyphenated().to_string() != value {
        return Err(invalid());
    }
    Ok(id)
}

/// The open sandbox a route names: 503 when disabled, 400 for a bad id, 404 when unknown.
fn sandbox(state: &AppState, id: &str) -> Result<std::sync::Arc<Standalone>, ApiError> {
    pool(state)?;
    let id = parse_id("sandbox", id)?;
    Ok(state.sandboxes.get(id)?)
}

fn body_rejection(rejection: BytesRejection) -> ApiError {
    let code = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        "request_too_large"
    } else {
        "invalid_request"
    };
    ApiError::new(rejection.status(), code, rejection.body_text())
}

// --- running commands ---

/// A command a request waits for or streams: killed if the request goes away first.
struct Foreground {
    handle: ExecHandle,
    started: Instant,
    ended: bool,
}

impl Drop for Foreground {
    fn drop(&mut self) {
        if !self.ended {
            self.handle.kill();
        }
    }
}

/// Writes `input` to the command's stdin, then closes it.
fn feed_stdin(handle: &mut ExecHandle, input: Option<String>) {
    if let (Some(mut pipe), Some(input)) = (handle.take_stdin(), input) {
        tokio::spawn(async move {
            // A command that exits without reading it all closes the pipe: not an error.
            let _ = pipe.write_all(input.as_bytes()).await;
            let _ = pipe.shutdown().await;
        });
    }
}

/// The status reported when a command's events end without an exit.
fn lost_exit() -> ExitStatus {
    ExitStatus {
        code: None,
        signal: None,
        timed_out: false,
        killed: false,
        out_of_memory: false,
        sandbox_closed: Some("the command's output ended without an exit".into()),
    }
}

async fn wait_for(mut running: Foreground) -> ExecResult {
    let mut stdout = CappedOutput::default();
    let mut stderr = CappedOutput::default();
    let status = loop {
        match running.handle.next().await {
            Some(ExecEvent::Stdout(chunk)) => stdout.push(&chunk, OUTPUT_CAP),
            Some(ExecEvent::Stderr(chunk)) => stderr.push(&chunk, OUTPUT_CAP),
            Some(ExecEvent::Exit(status)) => break status,
            None => break lost_exit(),
        }
    };
    running.ended = true;
    let duration_ms = millis(running.started.elapsed());
    ExecResult {
        stdout: stdout.text(),
        stderr: stderr.text(),
        stdout_truncated: stdout.truncated,
        stderr_truncated: stderr.truncated,
        exit_code: status.code,
        signal: status.signal,
        timed_out: status.timed_out,
        killed: status.killed,
        out_of_memory: status.out_of_memory,
        sandbox_closed: status.sandbox_closed,
        duration_ms,
    }
}

/// Turns bytes into text chunk by chunk, holding back a character split across chunks.
#[derive(Debug, Default)]
struct Utf8Chunks {
    pending: Vec<u8>,
}

impl Utf8Chunks {
    fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(valid) => {
                    text.push_str(valid);
                    self.pending.clear();
                    return text;
                }
                Err(error) => {
                    let valid = error.valid_up_to();
                    text.push_str(&String::from_utf8_lossy(
                        self.pending.get(..valid).unwrap_or_default(),
                    ));
                    match error.error_len() {
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..(valid + bad).min(self.pending.len()));
                        }
                        None => {
                            // An incomplete character at the end: wait for the rest.
                            self.pending.drain(..valid);
                            return text;
                        }
                    }
                }
            }
        }
    }

    fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

fn text_event(name: &'static str, text: String) -> Event {
    Event::default()
        .event(name)
        .data(json!({ "text": text }).to_string())
}

fn stream_of(mut running: Foreground) -> Response {
    let events = async_stream::stream! {
        let mut stdout = Utf8Chunks::default();
        let mut stderr = Utf8Chunks::default();
        let status = loop {
            match running.handle.next().await {
                Some(ExecEvent::Stdout(chunk)) => {
                    let text = stdout.push(&chunk);
                    if !text.is_empty() {
                        yield Ok::<Event, Infallible>(text_event("stdout", text));
                    }
                }
                Some(ExecEvent::Stderr(chunk)) => {
                    let text = stderr.push(&chunk);
                    if !text.is_empty() {
                        yield Ok(text_event("stderr", text));
                    }
                }
                Some(ExecEvent::Exit(status)) => break status,
                None => break lost_exit(),
            }
        };
        running.ended = true;
        for (name, rest) in [("stdout", stdout.finish()), ("stderr", stderr.finish())] {
            if !rest.is_empty() {
                yield Ok(text_event(name, rest));
            }
        }
        let exit = exit_view(&status, millis(running.started.elapsed()));
        let data = serde_json::to_string(&exit).unwrap_or_else(|_| "{}".to_owned());
        yield Ok(Event::default().event("exit").data(data));
    };
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

// --- handlers ---

/// What sandboxes this server can make.
///
/// The host's isolation as probed (user namespaces, Landlock, seccomp, cgroups), the backend
/// configured (`native`, `local` or none), whether `/v1/sandboxes` is enabled and, when it is
/// not, why.
#[utoipa::path(
    get,
    path = "/v1/sandbox/capabilities",
    tag = "sandboxes",
    operation_id = "sandbox_capabilities",
    responses((status = 200, description = "What this server can give.", body = SandboxCapabilities))
)]
async fn capabilities(
    State(state): State<AppState>,
) -> Result<Json<SandboxCapabilities>, ApiError> {
    let pool = state.tools.sandboxes.as_ref();
    let host = match pool {
        Some(pool) => pool.backend().capabilities().clone(),
        None => probed().await?,
    };
    Ok(Json(SandboxCapabilities {
        enabled: pool.is_some(),
        backend: pool.map(|pool| serde_name(&pool.backend().kind())),
        disabled_reason: pool.is_none().then(|| {
            "this server was started without a sandbox backend (`ToolEnvironment::sandboxes` is \
             not set)"
                .to_owned()
        }),
        max_sandboxes: state.sandboxes.max(),
        open_sandboxes: state.sandboxes.len(),
        default_limits: pool.map(|pool| limits_view(pool.template())),
        host: host_view(&host),
        allow_host_commands: state.tools.allow_host_commands,
        mcp_stdio: placement(pool.is_some(), state.tools.allow_host_commands),
        command_tools: placement(
            state.tools.command_sandboxes().is_some(),
            state.tools.allow_host_commands,
        ),
    }))
}

/// Where commands without `"host": true` run.
fn placement(sandbox: bool, allow_host: bool) -> String {
    match (sandbox, allow_host) {
        (true, _) => "sandbox",
        (false, true) => "host",
        (false, false) => "refused",
    }
    .to_owned()
}

/// The host's capabilities, probed once (the probe starts a short-lived child).
async fn probed() -> Result<Capabilities, ApiError> {
    static PROBED: tokio::sync::OnceCell<Capabilities> = tokio::sync::OnceCell::const_new();
    PROBED
        .get_or_try_init(|| async {
            tokio::task::spawn_blocking(Capabilities::probe)
                .await
                .map_err(|error| {
                    ApiError::internal(format!("the capability probe failed: {error}"))
                })
        })
        .await
        .cloned()
}

/// Creates a sandbox.
///
/// It gets a fresh, empty workspace (removed when it closes), the server's default limits
/// unless `limits` names others, and `env` added to every command's environment. The body is a
/// JSON object; `{}` takes every default. At most 64 sandboxes are open at once (`429` past
/// that); an idle sandbox is closed after its idle timeout (15 minutes by default).
#[utoipa::path(
    post,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    operation_id = "create_sandbox",
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created and ready.", body = SandboxView,
         links(
             ("get_sandbox" = (operation_id = "get_sandbox", parameters(("id" = "$response.body#/id")))),
             ("delete_sandbox" = (operation_id = "delete_sandbox", parameters(("id" = "$response.body#/id")))),
             ("sandbox_exec" = (operation_id = "sandbox_exec", parameters(("id" = "$response.body#/id")))),
             ("list_sandbox_processes" = (operation_id = "list_sandbox_processes", parameters(("id" = "$response.body#/id")))),
             ("read_sandbox_file" = (operation_id = "read_sandbox_file", parameters(("id" = "$response.body#/id")))),
             ("write_sandbox_file" = (operation_id = "write_sandbox_file", parameters(("id" = "$response.body#/id")))),
             ("delete_sandbox_file" = (operation_id = "delete_sandbox_file", parameters(("id" = "$response.body#/id")))),
             ("list_sandbox_files" = (operation_id = "list_sandbox_files", parameters(("id" = "$response.body#/id")))),
             ("stat_sandbox_file" = (operation_id = "stat_sandbox_file", parameters(("id" = "$response.body#/id")))),
             ("make_sandbox_directory" = (operation_id = "make_sandbox_directory", parameters(("id" = "$response.body#/id")))),
         )),
        JsonBodyErrors,
        TooManyRequests,
        SandboxUnavailable,
    )
)]
async fn create_sandbox(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(request): ApiJson<CreateSandboxRequest>,
) -> Result<Response, ApiError> {
    let pool = pool(&state)?;
    let spec = sandbox_spec(pool, request)?;
    let entry = state
        .sandboxes
        .create(pool.backend(), spec, caller.owner())
        .await?;
    Ok((StatusCode::CREATED, Json(sandbox_view(&entry))).into_response())
}

/// The open sandboxes.
#[utoipa::path(
    get,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    operation_id = "list_sandboxes",
    responses(
        (status = 200, description = "The open sandboxes, oldest first.", body = SandboxList),
        SandboxUnavailable,
    )
)]
async fn list_sandboxes(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<SandboxList>, ApiError> {
    pool(&state)?;
    let sandboxes = state
        .sandboxes
        .list()
        .iter()
        .filter(|entry| caller.may_see(entry.owner.as_deref()))
        .map(|entry| sandbox_view(entry))
        .collect();
    Ok(Json(SandboxList { sandboxes }))
}

/// One sandbox.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    operation_id = "get_sandbox",
    params(SandboxPath),
    responses(
        (status = 200, description = "The sandbox.", body = SandboxView),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn get_sandbox(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxView>, ApiError> {
    let entry = sandbox(&state, &id)?;
    Ok(Json(sandbox_view(&entry)))
}

/// Closes a sandbox: every process in it is killed and its workspace removed.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    operation_id = "delete_sandbox",
    params(SandboxPath),
    responses(
        (status = 204, description = "Closed."),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn delete_sandbox(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    pool(&state)?;
    let id = parse_id("sandbox", &id)?;
    state.sandboxes.remove(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Runs a command in a sandbox.
///
/// Give exactly one of `argv` and `command` (a line for `/bin/sh -c`). By default the request
/// waits for the end and answers its output (each stream's first 1 MiB) and exit. With
/// `"stream": true` it answers server-sent events instead: `stdout` and `stderr` (data:
/// `{"text": …}`) as the command prints, then `exit` (an `ExitView`) last. A command the
/// request waits for or streams is killed with everything it started when the client goes away.
/// With `"background": true` it answers `202` at once; see `/v1/sandboxes/{id}/processes`.
/// A program that cannot be found exits with 127; its error is on stderr.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec",
    tag = "sandboxes",
    operation_id = "sandbox_exec",
    params(SandboxPath),
    request_body = ExecBody,
    responses(
        (status = 200, description = "The command ended (JSON), or its events (`\"stream\": true`).",
         content(
             (ExecResult = "application/json"),
             (ExecStreamEvent = "text/event-stream"),
         )),
        (status = 202, description = "Started in the background.", body = BackgroundStarted,
         links(
             ("get_sandbox_process" = (operation_id = "get_sandbox_process", parameters(
                 ("id" = "$response.body#/sandbox_id"), ("exec_id" = "$response.body#/exec_id")))),
             ("kill_sandbox_process" = (operation_id = "kill_sandbox_process", parameters(
                 ("id" = "$response.body#/sandbox_id"), ("exec_id" = "$response.body#/exec_id")))),
         )),
        JsonBodyErrors,
        NotFound,
        TooManyRequests,
        SandboxUnavailable,
    )
)]
async fn exec(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ExecBody>,
) -> Result<Response, ApiError> {
    let entry = sandbox(&state, &id)?;
    let command = command(body)?;
    let slot = if command.background {
        Some(entry.reserve_background()?)
    } else {
        None
    };
    let argv = command.request.argv.clone();
    let started = Instant::now();
    let mut handle = entry
        .sandbox
        .exec(command.request)
        .await
        .map_err(sandbox_error)?;
    feed_stdin(&mut handle, command.stdin);
    if let Some(slot) = slot {
        let process = entry.adopt(slot, handle, argv, started);
        let body = BackgroundStarted {
            sandbox_id: entry.id.to_string(),
            exec_id: process.id.to_string(),
            argv: process.argv.clone(),
            started_at: process.started_at,
        };
        return Ok((StatusCode::ACCEPTED, Json(body)).into_response());
    }
    let running = Foreground {
        handle,
        started,
        ended: false,
    };
    if command.stream {
        Ok(stream_of(running))
    } else {
        Ok(Json(wait_for(running).await).into_response())
    }
}

/// The background processes running in a sandbox.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes",
    tag = "sandboxes",
    operation_id = "list_sandbox_processes",
    params(SandboxPath),
    responses(
        (status = 200, description = "The running background processes, oldest first.", body = ProcessList),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn list_processes(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ProcessList>, ApiError> {
    let entry = sandbox(&state, &id)?;
    let processes = entry
        .running_processes()
        .iter()
        .map(|process| ProcessSummary {
            exec_id: process.id.to_string(),
            argv: process.argv.clone(),
            started_at: process.started_at,
            running: process.running(),
        })
        .collect();
    Ok(Json(ProcessList { processes }))
}

fn process_of(
    state: &AppState,
    id: &str,
    exec_id: &str,
) -> Result<std::sync::Arc<Process>, ApiError> {
    let entry = sandbox(state, id)?;
    let exec_id = parse_id("process", exec_id)?;
    entry.process(exec_id).ok_or_else(|| {
        ApiError::not_found(format!(
            "no background process {exec_id} in sandbox {id} (finished ones are kept a while)"
        ))
    })
}

/// A background process: its output so far and its status.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{exec_id}",
    tag = "sandboxes",
    operation_id = "get_sandbox_process",
    params(ProcessPath),
    responses(
        (status = 200, description = "The process.", body = ProcessDetail),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn get_process(
    State(state): State<AppState>,
    ApiPath((id, exec_id)): ApiPath<(String, String)>,
) -> Result<Json<ProcessDetail>, ApiError> {
    let process = process_of(&state, &id, &exec_id)?;
    Ok(Json(process_detail(&process)))
}

/// Kills a background process and everything it started, and waits up to 5 s for its end.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{exec_id}/kill",
    tag = "sandboxes",
    operation_id = "kill_sandbox_process",
    params(ProcessPath),
    responses(
        (status = 200, description = "Killed (or it had ended): its status now.", body = ProcessDetail),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn kill_process(
    State(state): State<AppState>,
    ApiPath((id, exec_id)): ApiPath<(String, String)>,
) -> Result<Json<ProcessDetail>, ApiError> {
    let process = process_of(&state, &id, &exec_id)?;
    if process.running() {
        process.kill();
        process.wait(KILL_WAIT).await;
    }
    Ok(Json(process_detail(&process)))
}

/// Reads a regular file (up to 16 MiB) as raw bytes.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files",
    tag = "sandboxes",
    operation_id = "read_sandbox_file",
    params(SandboxPath, FileQuery),
    responses(
        (status = 200, description = "The file's bytes.", body = inline(Binary),
         content_type = "application/octet-stream"),
        BadRequest,
        Forbidden,
        NotFound,
        FileTooLarge,
        SandboxUnavailable,
    )
)]
async fn read_file(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let entry = sandbox(&state, &id)?;
    let Query(query) = query?;
    check_path("`path`", &query.path)?;
    let bytes = entry
        .sandbox
        .read_file(&query.path, FILE_LIMIT as u64)
        .await
        .map_err(sandbox_error)?;
    Ok(([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response())
}

/// Creates or replaces a regular file with the raw request body (up to 16 MiB; mode 0644).
///
/// Its folder must exist (`POST /v1/sandboxes/{id}/files/mkdir`).
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/files",
    tag = "sandboxes",
    operation_id = "write_sandbox_file",
    params(SandboxPath, FileQuery),
    request_body(content = inline(Binary), content_type = "application/octet-stream",
                 description = "The file's new contents."),
    responses(
        (status = 204, description = "Written."),
        BadRequest,
        Forbidden,
        NotFound,
        Conflict,
        FileTooLarge,
        SandboxUnavailable,
    )
)]
async fn write_file(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    let entry = sandbox(&state, &id)?;
    let Query(query) = query?;
    check_path("`path`", &query.path)?;
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "file_too_large",
                format!("a file written through the API has at most {FILE_LIMIT} bytes"),
            )
        } else {
            body_rejection(rejection)
        }
    })?;
    entry
        .sandbox
        .write_file(&query.path, &body)
        .await
        .map_err(sandbox_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes a file, a symlink, or a directory (with its contents when `recursive`).
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/files",
    tag = "sandboxes",
    operation_id = "delete_sandbox_file",
    params(SandboxPath, DeleteQuery),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        Forbidden,
        NotFound,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn delete_file(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let entry = sandbox(&state, &id)?;
    let Query(query) = query?;
    check_path("`path`", &query.path)?;
    entry
        .sandbox
        .remove(&query.path, query.recursive)
        .await
        .map_err(sandbox_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists a directory (entries by name; symlinks are not followed).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/list",
    tag = "sandboxes",
    operation_id = "list_sandbox_files",
    params(SandboxPath, ListQuery),
    responses(
        (status = 200, description = "The directory's entries.", body = DirListing),
        BadRequest,
        Forbidden,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn list_files(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<DirListing>, ApiError> {
    let entry = sandbox(&state, &id)?;
    let Query(query) = query?;
    let path = query
        .path
        .unwrap_or_else(|| entry.spec.workspace_mount.clone());
    check_path("`path`", &path)?;
    let entries = entry.sandbox.list(&path).await.map_err(sandbox_error)?;
    Ok(Json(DirListing {
        path,
        entries: entries.iter().map(entry_view).collect(),
    }))
}

/// The metadata of a path (`lstat`: a symlink is described, not followed).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/stat",
    tag = "sandboxes",
    operation_id = "stat_sandbox_file",
    params(SandboxPath, FileQuery),
    responses(
        (status = 200, description = "The path's metadata.", body = FileStatView),
        BadRequest,
        Forbidden,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn stat_file(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Json<FileStatView>, ApiError> {
    let entry = sandbox(&state, &id)?;
    let Query(query) = query?;
    check_path("`path`", &query.path)?;
    let stat = entry
        .sandbox
        .stat(&query.path)
        .await
        .map_err(sandbox_error)?;
    Ok(Json(stat_view(&query.path, &stat)))
}

/// Makes a directory (and its missing parents with `parents`).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/files/mkdir",
    tag = "sandboxes",
    operation_id = "make_sandbox_directory",
    params(SandboxPath),
    request_body = MkdirRequest,
    responses(
        (status = 201, description = "Made (with `parents`: or it existed)."),
        JsonBodyErrors,
        Forbidden,
        NotFound,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn make_directory(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<MkdirRequest>,
) -> Result<StatusCode, ApiError> {
    let entry = sandbox(&state, &id)?;
    check_path("`path`", &request.path)?;
    entry
        .sandbox
        .mkdir(&request.path, request.parents)
        .await
        .map_err(sandbox_error)?;
    Ok(StatusCode::CREATED)
}
