//! The sandbox service every front-end uses: what this host can isolate, standalone sandboxes
//! as the API shows them, commands run in the foreground (waited for or streamed) or the
//! background, and files inside a sandbox. The registry itself is [`crate::sandboxes`]; the
//! checks of requests are [`crate::sandbox_requests`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use serde::Serialize;
use tokio::io::AsyncWriteExt;
use uuid::Uuid;

use agentry_sandbox::{
    Capabilities, DirEntry, ExecEvent, ExecHandle, ExitStatus, FileStat, SandboxPool,
    SandboxReport, SandboxSpec,
};

use crate::App;
use crate::clock::millis;
use crate::code_interpreter;
pub use crate::code_interpreter::{CodeEvent, CodeRequest};
use crate::error::{AppError, Failure};
use crate::sandbox_requests::{
    CreateSandboxRequest, ExecBody, OnIdle, check_path, command, sandbox_spec,
};
use crate::sandboxes::{CappedOutput, OUTPUT_CAP, Process, Snapshot, Standalone, sandbox_error};
use crate::schema::serde_name;
pub use agentry_tools::shell::kernel::{CodeError, CodeOutput, CodeResult};

/// The largest file read or written through the API (bytes).
pub const FILE_LIMIT: usize = 16 * 1024 * 1024;

/// How long killing a background process waits for it to end before answering.
const KILL_WAIT: Duration = Duration::from_secs(5);

// --- answers ---

/// What isolation this host gives, as probed.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// Whether it is paused (`POST /v1/sandboxes/{id}/pause`): its processes are frozen, and
    /// commands and file operations are refused (409 `sandbox_paused`) until it is resumed.
    pub paused: bool,
    /// Whether its idle timeout paused it (`on_idle: pause`): the next command or file
    /// operation resumes it by itself, where one paused by request answers 409.
    pub paused_on_idle: bool,
    /// What its idle timeout does: `close` or `pause`.
    pub on_idle: OnIdle,
    /// Whether it was paused when the server last stopped and was made again, paused, over its
    /// workspace when it started: its files survived, its processes did not.
    pub restored: bool,
    /// CPU time its processes have used, dead ones included, seconds (null where the host gives
    /// it no cgroups).
    pub cpu_seconds: Option<f64>,
    /// Memory charged to it now, its files' page cache included, bytes (null where the host
    /// gives it no cgroups).
    pub memory_bytes: Option<u64>,
}

/// A snapshot of a sandbox's workspace (`POST /v1/sandboxes/{id}/snapshots`): kept until it is
/// deleted, across restarts of the server; `POST /v1/sandboxes` with its id starts a sandbox
/// from a copy of it.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotView {
    /// Its id (UUIDv7).
    pub id: String,
    /// The sandbox it was taken of.
    pub sandbox_id: String,
    /// When it was taken, Unix milliseconds.
    pub created_at: u64,
    /// Its files' bytes.
    pub bytes: u64,
    /// Its files, folders and links.
    pub entries: u64,
}

impl From<&Snapshot> for SnapshotView {
    fn from(snapshot: &Snapshot) -> Self {
        Self {
            id: snapshot.id.to_string(),
            sandbox_id: snapshot.sandbox_id.to_string(),
            created_at: snapshot.created_at,
            bytes: snapshot.bytes,
            entries: snapshot.entries,
        }
    }
}

/// `GET /v1/sandbox-snapshots`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SnapshotList {
    /// The snapshots, oldest first.
    pub snapshots: Vec<SnapshotView>,
    /// The bytes the caller's key's snapshots hold (the operator's, without keys).
    pub used_bytes: u64,
    /// How many bytes of snapshots a key may keep, all together (413
    /// `snapshot_quota_exceeded` past it).
    pub quota_bytes: u64,
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SandboxList {
    /// The open sandboxes, oldest first.
    pub sandboxes: Vec<SandboxView>,
}

/// What a command printed and how it ended (`POST /v1/sandboxes/{id}/exec`).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ExecResult {
    /// Standard output (UTF-8, invalid bytes replaced), its first 1 MiB.
    pub stdout: String,
    /// Standard error, likewise.
    pub stderr: String,
    /// Whether stdout went past 1 MiB (the rest is dropped).
    pub stdout_truncated: bool,
    /// Whether stderr went past 1 MiB.
    pub stderr_truncated: bool,
    /// How it ended (exit code 127: not found, 126: not executable).
    #[serde(flatten)]
    pub exit: ExitView,
}

/// How a command ended (the `exit` event's data, and a finished background process's `exit`).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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

/// A background command started (`202`).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ProcessList {
    /// The running background processes, oldest first.
    pub processes: Vec<ProcessSummary>,
}

/// A background process: its output so far and its status.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DirListing {
    /// The directory listed.
    pub path: String,
    /// Its entries, by name.
    pub entries: Vec<DirEntryView>,
}
// --- conversions ---

/// The host's capabilities as the API shows them.
pub fn host_view(capabilities: &Capabilities) -> HostCapabilities {
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

/// A sandbox's limits as the API shows them.
pub fn limits_view(spec: &SandboxSpec) -> LimitsView {
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

/// What a sandbox got, as the API shows it.
pub fn report_view(report: &SandboxReport) -> ReportView {
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

/// A standalone sandbox as the API shows it.
pub fn sandbox_view(entry: &Standalone) -> SandboxView {
    let usage = entry.sandbox.usage();
    SandboxView {
        id: entry.id.to_string(),
        created_at: entry.created_at,
        workspace_mount: entry.spec.workspace_mount.clone(),
        report: report_view(entry.sandbox.report()),
        limits: limits_view(&entry.spec),
        running_processes: entry.running_processes().len(),
        paused: entry.sandbox.is_paused(),
        paused_on_idle: entry.sandbox.is_paused_on_idle(),
        on_idle: entry.spec.on_idle.into(),
        restored: entry.restored,
        cpu_seconds: usage.cpu_nanos.map(|nanos| nanos as f64 / 1e9),
        memory_bytes: usage.memory_bytes,
    }
}

/// How a command ended, as the API shows it.
pub fn exit_view(status: &ExitStatus, duration_ms: u64) -> ExitView {
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

/// A background process as the API shows it.
pub fn process_detail(process: &Process) -> ProcessDetail {
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

/// A path's metadata as the API shows it.
pub fn stat_view(path: &str, stat: &FileStat) -> FileStatView {
    FileStatView {
        path: path.to_owned(),
        kind: serde_name(&stat.kind),
        size: stat.size,
        mode: stat.mode,
        modified: stat.modified,
        symlink_target: stat.symlink_target.clone(),
    }
}

/// A directory entry as the API shows it.
pub fn entry_view(entry: &DirEntry) -> DirEntryView {
    DirEntryView {
        name: entry.name.clone(),
        kind: serde_name(&entry.stat.kind),
        size: entry.stat.size,
        mode: entry.stat.mode,
        modified: entry.stat.modified,
        symlink_target: entry.stat.symlink_target.clone(),
    }
}

// --- running commands ---

// --- running commands ---

/// A command a client waits for or streams: killed if the client goes away first (dropped
/// before its end).
pub struct ForegroundCommand {
    handle: ExecHandle,
    started: Instant,
    ended: bool,
}

impl Drop for ForegroundCommand {
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

impl ForegroundCommand {
    /// Waits for the command's end: its output (each stream's first [`OUTPUT_CAP`] bytes) and
    /// how it ended.
    pub async fn wait(mut self) -> ExecResult {
        let mut stdout = CappedOutput::default();
        let mut stderr = CappedOutput::default();
        let status = loop {
            match self.handle.next().await {
                Some(ExecEvent::Stdout(chunk)) => stdout.push(&chunk, OUTPUT_CAP),
                Some(ExecEvent::Stderr(chunk)) => stderr.push(&chunk, OUTPUT_CAP),
                Some(ExecEvent::Exit(status)) => break status,
                None => break lost_exit(),
            }
        };
        self.ended = true;
        ExecResult {
            stdout: stdout.text(),
            stderr: stderr.text(),
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            exit: exit_view(&status, millis(self.started.elapsed())),
        }
    }

    /// The command's output as it comes, as text (a character split across chunks comes whole
    /// with the next one), then how it ended. Dropping the stream early kills the command.
    pub fn output(mut self) -> impl Stream<Item = CommandOutput> + Send + 'static {
        async_stream::stream! {
            let mut stdout = Utf8Chunks::default();
            let mut stderr = Utf8Chunks::default();
            let status = loop {
                match self.handle.next().await {
                    Some(ExecEvent::Stdout(chunk)) => {
                        let text = stdout.push(&chunk);
                        if !text.is_empty() {
                            yield CommandOutput::Stdout(text);
                        }
                    }
                    Some(ExecEvent::Stderr(chunk)) => {
                        let text = stderr.push(&chunk);
                        if !text.is_empty() {
                            yield CommandOutput::Stderr(text);
                        }
                    }
                    Some(ExecEvent::Exit(status)) => break status,
                    None => break lost_exit(),
                }
            };
            self.ended = true;
            let rest = stdout.finish();
            if !rest.is_empty() {
                yield CommandOutput::Stdout(rest);
            }
            let rest = stderr.finish();
            if !rest.is_empty() {
                yield CommandOutput::Stderr(rest);
            }
            yield CommandOutput::Exit(exit_view(&status, millis(self.started.elapsed())));
        }
    }
}

/// One piece of a streamed command's output.
#[derive(Debug, Clone)]
pub enum CommandOutput {
    /// Text on standard output.
    Stdout(String),
    /// Text on standard error.
    Stderr(String),
    /// The command ended (last).
    Exit(ExitView),
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

// --- the service ---

/// Parses an id of the form the API hands out: a UUIDv7, lowercase and hyphenated.
pub fn parse_id(kind: &str, value: &str) -> Result<Uuid, AppError> {
    let invalid = || {
        let shown: String = value.chars().take(64).collect();
        AppError::bad_request(format!(
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
async fn probed() -> Result<Capabilities, AppError> {
    static PROBED: tokio::sync::OnceCell<Capabilities> = tokio::sync::OnceCell::const_new();
    PROBED
        .get_or_try_init(|| async {
            tokio::task::spawn_blocking(Capabilities::probe)
                .await
                .map_err(|error| {
                    AppError::internal(format!("the capability probe failed: {error}"))
                })
        })
        .await
        .cloned()
}

/// How a command was started.
pub enum Started {
    /// In the background: see `Sandboxes::process`.
    Background(BackgroundStarted),
    /// In the foreground: the caller waits for it or streams it.
    Foreground {
        /// The running command.
        command: ForegroundCommand,
        /// The request asked for its output as it comes.
        stream: bool,
    },
}

impl App {
    /// Whether commands run isolated, in sandboxes that are not `--sandbox local`: without
    /// isolation (`local`, or host commands with no sandbox) a command is a shell on the host,
    /// as the server's user, which reaches the database, the secret key and every API key.
    pub fn commands_isolated(&self) -> bool {
        self.parts
            .tools
            .sandboxes
            .as_ref()
            .is_some_and(|pool| pool.backend().kind() != agentry_sandbox::BackendKind::Local)
    }

    /// Refuses a `user` key a terminal, a sandbox or a command where commands run without
    /// isolation: there it would hold what an admin holds.
    pub fn check_commands_isolated(&self, caller: &crate::auth::Principal) -> Result<(), AppError> {
        if caller.is_admin() || self.commands_isolated() {
            return Ok(());
        }
        Err(AppError::new(
            Failure::Forbidden,
            "isolation_required",
            "this server runs commands without isolation (`--sandbox local`, or no sandbox): \
             terminals, sandboxes and commands are for admin keys only",
        ))
    }

    /// What a run `caller` starts may use: its grant, and where commands run without
    /// isolation, no tool that runs them for a `user` key.
    pub fn run_grant(
        &self,
        caller: &crate::auth::Principal,
    ) -> Option<agentry_core::access::Grant> {
        caller.grant().map(|mut grant| {
            grant.no_commands = !self.commands_isolated();
            grant
        })
    }

    /// The pool whose backend makes sandboxes: `503 sandboxes_disabled` without one.
    pub fn sandbox_pool(&self) -> Result<&SandboxPool, AppError> {
        self.parts.tools.sandboxes.as_ref().ok_or_else(|| {
            AppError::new(
                Failure::Unavailable,
                "sandboxes_disabled",
                "this server runs without sandboxes (see GET /v1/sandbox/capabilities)",
            )
        })
    }
}

/// The standalone sandboxes: made, used and closed by a client, apart from any run.
pub struct Sandboxes<'a> {
    app: &'a App,
}

impl App {
    /// The standalone sandboxes: made, used and closed by a client, apart from any run.
    pub fn sandboxes(&self) -> Sandboxes<'_> {
        Sandboxes { app: self }
    }
}

impl Sandboxes<'_> {
    /// Whether `caller` may see the standalone sandbox `id`; true when there is none (the
    /// route answers 404 then).
    pub fn may_see(&self, caller: &crate::auth::Principal, id: uuid::Uuid) -> bool {
        self.app
            .parts
            .sandboxes
            .get(id)
            .map_or(true, |sandbox| caller.may_see(sandbox.owner.as_deref()))
    }

    /// The open sandbox `id` names: 503 when disabled, 400 for a bad id, 404 when unknown.
    pub fn get(&self, id: &str) -> Result<Arc<Standalone>, AppError> {
        self.app.sandbox_pool()?;
        self.app.parts.sandboxes.get(parse_id("sandbox", id)?)
    }

    /// What sandboxes this app can make, and where commands run.
    pub async fn capabilities(&self) -> Result<SandboxCapabilities, AppError> {
        let pool = self.app.parts.tools.sandboxes.as_ref();
        let host = match pool {
            Some(pool) => pool.backend().capabilities().clone(),
            None => probed().await?,
        };
        Ok(SandboxCapabilities {
            enabled: pool.is_some(),
            backend: pool.map(|pool| serde_name(&pool.backend().kind())),
            disabled_reason: pool.is_none().then(|| {
                "this server was started without a sandbox backend (`ToolEnvironment::sandboxes` \
                 is not set)"
                    .to_owned()
            }),
            max_sandboxes: self.app.parts.sandboxes.max(),
            open_sandboxes: self.app.parts.sandboxes.len(),
            default_limits: pool.map(|pool| limits_view(pool.template())),
            host: host_view(&host),
            allow_host_commands: self.app.parts.tools.allow_host_commands,
            mcp_stdio: placement(pool.is_some(), self.app.parts.tools.allow_host_commands),
            command_tools: placement(
                self.app.parts.tools.command_sandboxes().is_some(),
                self.app.parts.tools.allow_host_commands,
            ),
        })
    }

    /// Makes a standalone sandbox for `caller` (its owner).
    pub async fn create(
        &self,
        caller: &crate::auth::Principal,
        request: CreateSandboxRequest,
    ) -> Result<SandboxView, AppError> {
        let pool = self.app.sandbox_pool()?;
        self.app.check_commands_isolated(caller)?;
        self.app.check_sandbox_quota(caller).await?;
        let owner = caller.owner();
        let from = match request.snapshot_id.as_deref() {
            Some(id) => Some(self.visible_snapshot(caller, id).await?),
            None => None,
        };
        let spec = sandbox_spec(pool, request)?;
        let entry = self
            .app
            .parts
            .sandboxes
            .create(pool.backend(), spec, owner, from)
            .await?;
        Ok(sandbox_view(&entry))
    }

    /// The open sandboxes `may_see` lets through, oldest first.
    pub fn list(&self, may_see: impl Fn(Option<&str>) -> bool) -> Result<SandboxList, AppError> {
        self.app.sandbox_pool()?;
        let sandboxes = self
            .app
            .parts
            .sandboxes
            .list()
            .iter()
            .filter(|entry| may_see(entry.owner.as_deref()))
            .map(|entry| sandbox_view(entry))
            .collect();
        Ok(SandboxList { sandboxes })
    }

    /// Takes a snapshot of a sandbox's workspace (paused meanwhile); it belongs to the sandbox's
    /// owner.
    pub async fn snapshot(&self, id: &str) -> Result<SnapshotView, AppError> {
        let entry = self.get(id)?;
        let snapshot = self.app.parts.sandboxes.snapshot(&entry).await?;
        Ok(SnapshotView::from(&snapshot))
    }

    /// The snapshots `caller` may see, oldest first.
    pub async fn snapshots(
        &self,
        caller: &crate::auth::Principal,
    ) -> Result<SnapshotList, AppError> {
        self.app.sandbox_pool()?;
        let registry = &self.app.parts.sandboxes;
        let snapshots = registry.snapshots().await?;
        let own = caller.owner();
        Ok(SnapshotList {
            used_bytes: snapshots
                .iter()
                .filter(|snapshot| snapshot.owner == own)
                .map(|snapshot| snapshot.bytes)
                .sum(),
            quota_bytes: registry.snapshot_quota(),
            snapshots: snapshots
                .iter()
                .filter(|snapshot| caller.may_see(snapshot.owner.as_deref()))
                .map(SnapshotView::from)
                .collect(),
        })
    }

    async fn visible_snapshot(
        &self,
        caller: &crate::auth::Principal,
        id: &str,
    ) -> Result<Snapshot, AppError> {
        let snapshot = self.app.parts.sandboxes.find_snapshot(id).await?;
        if caller.may_see(snapshot.owner.as_deref()) {
            Ok(snapshot)
        } else {
            Err(AppError::not_found(format!("no snapshot {id}")))
        }
    }

    /// The snapshot `id`, if `caller` may see it (404 otherwise).
    pub async fn get_snapshot(
        &self,
        caller: &crate::auth::Principal,
        id: &str,
    ) -> Result<SnapshotView, AppError> {
        self.app.sandbox_pool()?;
        Ok(SnapshotView::from(
            &self.visible_snapshot(caller, id).await?,
        ))
    }

    /// Deletes the snapshot `id`, if `caller` may see it; sandboxes started from it keep their
    /// own copies.
    pub async fn delete_snapshot(
        &self,
        caller: &crate::auth::Principal,
        id: &str,
    ) -> Result<(), AppError> {
        self.app.sandbox_pool()?;
        let snapshot = self.visible_snapshot(caller, id).await?;
        self.app.parts.sandboxes.delete_snapshot(&snapshot).await
    }

    /// Pauses a sandbox: every process in it is frozen (no CPU; memory, files and connections
    /// kept) until it is resumed; a paused sandbox is not closed for being idle. Pausing a
    /// paused one changes nothing. 503 `not_supported` where the host has no cgroup freezer for
    /// it.
    pub async fn pause(&self, id: &str) -> Result<SandboxView, AppError> {
        let entry = self.get(id)?;
        entry.sandbox.pause().await.map_err(sandbox_error)?;
        // Recorded now, so it comes back paused even after a crash of the server.
        self.app.parts.sandboxes.keep_paused(&entry).await;
        Ok(sandbox_view(&entry))
    }

    /// Resumes a paused sandbox: its processes go on where they stopped. Resuming a running one
    /// changes nothing.
    pub async fn resume(&self, id: &str) -> Result<SandboxView, AppError> {
        let entry = self.get(id)?;
        entry.sandbox.resume().await.map_err(sandbox_error)?;
        self.app.parts.sandboxes.forget_paused(entry.id).await;
        Ok(sandbox_view(&entry))
    }

    /// Runs code in the sandbox's Python kernel (started on first use, kept between calls):
    /// what it printed and displayed, the value of its last expression, its error. At the
    /// timeout the code is interrupted and the kernel stays; a kernel that dies fails the call
    /// (409 `kernel_died`) and the next call starts a new one; 503 `kernel_unavailable` when
    /// no kernel can start (no `ipykernel` for the configured Python).
    pub async fn run_code(&self, id: &str, request: CodeRequest) -> Result<CodeResult, AppError> {
        let entry = self.get(id)?;
        let call = code_interpreter::check(request)?;
        Box::pin(code_interpreter::run(&entry, &self.kernel_python(), call)).await
    }

    /// [`Sandboxes::run_code`], streamed: each output as the kernel sends it, then how the call
    /// ended. The request is checked (and the sandbox found) before anything streams; the code
    /// runs to its end even if the listener goes away.
    pub fn run_code_streaming(
        &self,
        id: &str,
        request: CodeRequest,
    ) -> Result<impl futures::Stream<Item = CodeEvent> + Send + 'static, AppError> {
        let entry = self.get(id)?;
        let mut call = code_interpreter::check(request)?;
        let python = self.kernel_python();
        let (live, mut outputs) = tokio::sync::mpsc::unbounded_channel();
        call.live = Some(live);
        let (end, ended) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let result = Box::pin(code_interpreter::run(&entry, &python, call)).await;
            let _ = end.send(result);
        });
        Ok(async_stream::stream! {
            while let Some(output) = outputs.recv().await {
                yield CodeEvent::Output(output);
            }
            yield match ended.await {
                Ok(Ok(result)) => CodeEvent::Done(Box::new(result)),
                Ok(Err(error)) => CodeEvent::Failed(error),
                Err(_) => CodeEvent::Failed(AppError::internal("the code's task ended early")),
            };
        })
    }

    /// The Python kernels start with (`--kernel-python`, else the sandbox's `python3`).
    fn kernel_python(&self) -> String {
        self.app
            .parts
            .tools
            .kernel_python
            .clone()
            .unwrap_or_else(|| agentry_tools::shell::kernel::DEFAULT_KERNEL_PYTHON.to_owned())
    }

    /// Closes a sandbox: every process in it is killed and its workspace removed.
    pub async fn close(&self, id: &str) -> Result<(), AppError> {
        self.app.sandbox_pool()?;
        self.app
            .parts
            .sandboxes
            .remove(parse_id("sandbox", id)?)
            .await
    }

    /// Starts a command in a sandbox: in the background (kept in the sandbox's process list),
    /// or in the foreground for the caller to wait for or stream.
    pub async fn exec(&self, id: &str, body: ExecBody) -> Result<Started, AppError> {
        let entry = self.get(id)?;
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
            return Ok(Started::Background(BackgroundStarted {
                sandbox_id: entry.id.to_string(),
                exec_id: process.id.to_string(),
                argv: process.argv.clone(),
                started_at: process.started_at,
            }));
        }
        Ok(Started::Foreground {
            command: ForegroundCommand {
                handle,
                started,
                ended: false,
            },
            stream: command.stream,
        })
    }

    /// The background processes running in a sandbox, oldest first.
    pub fn processes(&self, id: &str) -> Result<ProcessList, AppError> {
        let processes = self
            .get(id)?
            .running_processes()
            .iter()
            .map(|process| ProcessSummary {
                exec_id: process.id.to_string(),
                argv: process.argv.clone(),
                started_at: process.started_at,
                running: process.running(),
            })
            .collect();
        Ok(ProcessList { processes })
    }

    fn process_of(&self, id: &str, exec_id: &str) -> Result<Arc<Process>, AppError> {
        let entry = self.get(id)?;
        let exec_id = parse_id("process", exec_id)?;
        entry.process(exec_id).ok_or_else(|| {
            AppError::not_found(format!(
                "no background process {exec_id} in sandbox {id} (finished ones are kept a while)"
            ))
        })
    }

    /// A background process: its output so far and its status.
    pub fn process(&self, id: &str, exec_id: &str) -> Result<ProcessDetail, AppError> {
        let process = self.process_of(id, exec_id)?;
        Ok(process_detail(&process))
    }

    /// Kills a background process and everything it started, and waits a while for its end.
    pub async fn kill_process(&self, id: &str, exec_id: &str) -> Result<ProcessDetail, AppError> {
        let process = self.process_of(id, exec_id)?;
        if process.running() {
            process.kill();
            process.wait(KILL_WAIT).await;
        }
        Ok(process_detail(&process))
    }

    /// A regular file's bytes (up to [`FILE_LIMIT`]).
    pub async fn read_file(&self, id: &str, path: &str) -> Result<Vec<u8>, AppError> {
        let entry = self.get(id)?;
        check_path("`path`", path)?;
        entry
            .sandbox
            .read_file(path, FILE_LIMIT as u64)
            .await
            .map_err(sandbox_error)
    }

    /// Creates or replaces a regular file (its folder must exist).
    pub async fn write_file(&self, id: &str, path: &str, bytes: &[u8]) -> Result<(), AppError> {
        let entry = self.get(id)?;
        check_path("`path`", path)?;
        entry
            .sandbox
            .write_file(path, bytes)
            .await
            .map_err(sandbox_error)
    }

    /// Deletes a file, a symlink, or a directory (with its contents when `recursive`).
    pub async fn delete_file(&self, id: &str, path: &str, recursive: bool) -> Result<(), AppError> {
        let entry = self.get(id)?;
        check_path("`path`", path)?;
        entry
            .sandbox
            .remove(path, recursive)
            .await
            .map_err(sandbox_error)
    }

    /// Lists a directory (the workspace when `path` is `None`).
    pub async fn list_files(&self, id: &str, path: Option<String>) -> Result<DirListing, AppError> {
        let entry = self.get(id)?;
        let path = path.unwrap_or_else(|| entry.spec.workspace_mount.clone());
        check_path("`path`", &path)?;
        let entries = entry.sandbox.list(&path).await.map_err(sandbox_error)?;
        Ok(DirListing {
            path,
            entries: entries.iter().map(entry_view).collect(),
        })
    }

    /// A path's metadata (a symlink is described, not followed).
    pub async fn stat_file(&self, id: &str, path: &str) -> Result<FileStatView, AppError> {
        let entry = self.get(id)?;
        check_path("`path`", path)?;
        let stat = entry.sandbox.stat(path).await.map_err(sandbox_error)?;
        Ok(stat_view(path, &stat))
    }

    /// Makes a directory (and its missing parents with `parents`).
    pub async fn make_directory(
        &self,
        id: &str,
        path: &str,
        parents: bool,
    ) -> Result<(), AppError> {
        let entry = self.get(id)?;
        check_path("`path`", path)?;
        entry
            .sandbox
            .mkdir(path, parents)
            .await
            .map_err(sandbox_error)
    }
}
