//! Standalone sandboxes: the ones clients make through `/v1/sandboxes` (an E2B-like surface),
//! apart from the per-session sandboxes of the built-in tools ([`agentry_sandbox::SandboxPool`]).
//!
//! [`SandboxRegistry`] holds them by id (a UUIDv7). Each gets a fresh workspace folder under a
//! server-owned root, removed when the sandbox closes, and keeps the background processes
//! started in it ([`Process`]). At most [`MAX_SANDBOXES`] are open at once. A sandbox that closes
//! by itself (idle timeout, wall-time limit, its agent died) leaves the registry within a second,
//! its workspace with it. The server closes every one at shutdown ([`SandboxRegistry::close_all`]).
//!
//! A snapshot ([`Snapshot`]) keeps a copy of a sandbox's workspace under the root's
//! `.snapshots/<id>/` (its files and a `snapshot.json`); it outlives the sandbox and the server,
//! and a new sandbox can start from it (a fork). The host copies the workspace only while the
//! sandbox is paused: with its processes running, one could swap a folder or file for a link to
//! a host path between the copy's look and its read, and the copy would take the host's file (a
//! host without a cgroup freezer cannot take snapshots). A snapshot is written under a
//! temporary name and renamed whole, so a failed one leaves nothing.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use crate::clock::{millis, now_ms};
use std::time::{Duration, Instant};

use crate::error::Failure;
use serde_json::json;
use tokio::sync::{Notify, watch};
use uuid::Uuid;

use agentry_sandbox::{
    Backend, ExecEvent, ExecHandle, ExitStatus, Sandbox, SandboxError, SandboxSpec,
};

use crate::error::AppError;
pub use crate::sandbox_errors::{sandbox_error, unavailable};
use agentry_tools::shell::kernel::KernelSlot;

/// How many standalone sandboxes may exist at once.
pub const MAX_SANDBOXES: usize = 64;

/// How many background processes may run at once in one sandbox.
pub const MAX_BACKGROUND: usize = 64;

/// How many finished background processes a sandbox remembers (the oldest are forgotten).
pub const KEPT_FINISHED: usize = 32;

/// How much of each of stdout and stderr is kept for a command (bytes); the rest is dropped and
/// the output marked truncated.
pub const OUTPUT_CAP: usize = 1 << 20;

/// The folder under the root that keeps the snapshots.
const SNAPSHOTS: &str = ".snapshots";

/// The folder under the root that keeps the records of paused sandboxes, which outlive a
/// restart of the server (`<id>.json`).
const PAUSED: &str = ".paused";

/// Removes what a server that stopped (or crashed) left in the sandboxes folder `root`: the
/// workspaces of sandboxes that were not paused. The snapshots, the records of paused
/// sandboxes and their workspaces stay, for [`SandboxRegistry::restore`]. For a server's start
/// only: a live server's workspaces would go too.
pub fn remove_stale_workspaces(root: &Path) -> std::io::Result<()> {
    let kept: Vec<String> = paused_records(root)
        .iter()
        .map(|record| record.id.to_string())
        .collect();
    let entries = match std::fs::read_dir(root) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error),
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == SNAPSHOTS || name == PAUSED || kept.contains(&name) {
            continue;
        }
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    // A snapshot a crash left half-written.
    if let Ok(partials) = std::fs::read_dir(root.join(SNAPSHOTS)) {
        for partial in partials.flatten() {
            if partial
                .file_name()
                .to_string_lossy()
                .starts_with(".partial-")
            {
                std::fs::remove_dir_all(partial.path())?;
            }
        }
    }
    Ok(())
}

/// The records of the sandboxes paused under `root` (unreadable ones left out).
fn paused_records(root: &Path) -> Vec<PausedRecord> {
    std::fs::read_dir(root.join(PAUSED))
        .map(|entries| {
            entries
                .flatten()
                .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "json"))
                .filter_map(|entry| std::fs::read(entry.path()).ok())
                .filter_map(|bytes| serde_json::from_slice(&bytes).ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Where the record of the paused sandbox `id` is kept under `root`.
fn paused_record(root: &Path, id: Uuid) -> PathBuf {
    root.join(PAUSED).join(format!("{id}.json"))
}

/// What a paused sandbox needs to be made again after a restart, over its workspace.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct PausedRecord {
    id: Uuid,
    created_at: u64,
    owner: Option<String>,
    spec: SandboxSpec,
    /// Paused by its idle timeout (woken by its next use) rather than by a request.
    on_idle: bool,
}

/// The most a snapshot may hold (its files' bytes).
pub const MAX_SNAPSHOT_BYTES: u64 = 4 << 30;

/// How many snapshots one owner (an API key, or the operator) may keep.
pub const MAX_SNAPSHOTS_PER_OWNER: usize = 32;

/// How many bytes of snapshots one owner may keep, all together (the default quota).
pub const SNAPSHOT_QUOTA_BYTES: u64 = 16 << 30;

/// A snapshot of a standalone sandbox's workspace.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Snapshot {
    /// Its id (a UUIDv7).
    pub id: Uuid,
    /// The sandbox it was taken of.
    pub sandbox_id: Uuid,
    /// When it was taken, Unix milliseconds.
    pub created_at: u64,
    /// Its files' bytes.
    pub bytes: u64,
    /// Its files, folders and links.
    pub entries: u64,
    /// Who it belongs to (the key that owns the sandbox; `None`: the operator).
    pub owner: Option<String>,
}

/// Copies the tree `from` into the existing folder `to` (files, folders with their modes,
/// symbolic links as links; sockets and pipes are left out); answers the bytes and entries
/// copied. Fails once more than `max` bytes would be copied.
fn copy_tree(from: &Path, to: &Path, max: u64) -> std::io::Result<(u64, u64)> {
    use std::os::unix::fs::PermissionsExt;
    let (mut bytes, mut entries) = (0u64, 0u64);
    let mut pending = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((source, target)) = pending.pop() {
        for entry in std::fs::read_dir(&source)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let (from, to) = (entry.path(), target.join(entry.file_name()));
            if kind.is_symlink() {
                std::os::unix::fs::symlink(std::fs::read_link(&from)?, &to)?;
            } else if kind.is_dir() {
                std::fs::create_dir(&to)?;
                let mode = entry.metadata()?.permissions().mode();
                std::fs::set_permissions(&to, std::fs::Permissions::from_mode(mode))?;
                pending.push((from, to));
            } else if kind.is_file() {
                bytes += entry.metadata()?.len();
                if bytes > max {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::FileTooLarge,
                        format!("more than {max} bytes"),
                    ));
                }
                std::fs::copy(&from, &to)?;
            } else {
                continue;
            }
            entries += 1;
        }
    }
    Ok((bytes, entries))
}

fn no_snapshot(id: &str) -> AppError {
    AppError::not_found(format!("no snapshot {id}"))
}

/// How often closed sandboxes are looked for.
const SWEEP_EVERY: Duration = Duration::from_millis(500);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A command's output, kept up to a cap.
#[derive(Debug, Clone, Default)]
pub struct CappedOutput {
    /// The bytes kept.
    pub bytes: Vec<u8>,
    /// Whether bytes past the cap were dropped.
    pub truncated: bool,
}

impl CappedOutput {
    /// Appends a chunk, keeping at most `cap` bytes in all.
    pub fn push(&mut self, chunk: &[u8], cap: usize) {
        let room = cap.saturating_sub(self.bytes.len());
        if chunk.len() > room {
            self.truncated = true;
        }
        self.bytes
            .extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or_default());
    }

    /// The bytes as (lossy) UTF-8.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes).into_owned()
    }
}

/// What a background process has printed so far, and how it ended.
#[derive(Debug, Clone, Default)]
pub struct ProcessOutput {
    /// Standard output (the first [`OUTPUT_CAP`] bytes).
    pub stdout: CappedOutput,
    /// Standard error (the first [`OUTPUT_CAP`] bytes).
    pub stderr: CappedOutput,
    /// How it ended; `None` while it runs.
    pub exit: Option<ExitStatus>,
    /// How long it ran (so far), in milliseconds.
    pub duration_ms: u64,
}

/// A background process of a standalone sandbox.
#[derive(Debug)]
pub struct Process {
    /// Its id (a UUIDv7).
    pub id: Uuid,
    /// What runs.
    pub argv: Vec<String>,
    /// When it started, Unix milliseconds.
    pub started_at: u64,
    started: Instant,
    output: Mutex<ProcessOutput>,
    kill: Notify,
    done: watch::Sender<bool>,
}

impl Process {
    /// Its output so far and, once it ended, its exit.
    pub fn output(&self) -> ProcessOutput {
        let mut output = lock(&self.output).clone();
        if output.exit.is_none() {
            output.duration_ms = millis(self.started.elapsed());
        }
        output
    }

    /// Whether it still runs.
    pub fn running(&self) -> bool {
        !*self.done.borrow()
    }

    /// Kills it and everything it started.
    pub fn kill(&self) {
        self.kill.notify_one();
    }

    /// Waits up to `limit` for it to end; whether it has.
    pub async fn wait(&self, limit: Duration) -> bool {
        let mut done = self.done.subscribe();
        tokio::time::timeout(limit, done.wait_for(|done| *done))
            .await
            .is_ok_and(|result| result.is_ok())
    }

    /// Collects the handle's events until the command ends, killing it when asked.
    async fn pump(self: Arc<Self>, mut handle: ExecHandle) {
        loop {
            tokio::select! {
                event = handle.next() => match event {
                    Some(ExecEvent::Stdout(chunk)) => lock(&self.output).stdout.push(&chunk, OUTPUT_CAP),
                    Some(ExecEvent::Stderr(chunk)) => lock(&self.output).stderr.push(&chunk, OUTPUT_CAP),
                    Some(ExecEvent::Exit(status)) => {
                        self.finish(status);
                        break;
                    }
                    None => {
                        self.finish(ExitStatus {
                            code: None,
                            signal: None,
                            timed_out: false,
                            killed: false,
                            out_of_memory: false,
                            sandbox_closed: Some("the command's output ended".into()),
                        });
                        break;
                    }
                },
                () = self.kill.notified() => handle.kill(),
            }
        }
    }

    fn finish(&self, status: ExitStatus) {
        {
            let mut output = lock(&self.output);
            output.exit = Some(status);
            output.duration_ms = millis(self.started.elapsed());
        }
        self.done.send_replace(true);
    }
}

/// One standalone sandbox.
#[derive(Debug)]
pub struct Standalone {
    /// Its id (a UUIDv7).
    pub id: Uuid,
    /// The sandbox.
    pub sandbox: Sandbox,
    /// When it was made, Unix milliseconds.
    pub created_at: u64,
    /// The specification it was made from (its workspace is the host folder).
    pub spec: SandboxSpec,
    /// Who it belongs to (the id of the API key that made it; `None`: the operator).
    pub owner: Option<String>,
    /// Whether it was made again after a restart of the server (its files survived; its
    /// processes did not).
    pub restored: bool,
    processes: Mutex<Processes>,
    /// Its code interpreter's kernel, started on first use.
    pub(crate) kernel: KernelSlot,
}

#[derive(Debug, Default)]
struct Processes {
    by_id: BTreeMap<Uuid, Arc<Process>>,
    /// Background commands being started (counted against [`MAX_BACKGROUND`]).
    starting: usize,
}

/// A place for one background process, taken before it starts.
#[derive(Debug)]
pub struct BackgroundSlot<'a> {
    owner: &'a Standalone,
    used: bool,
}

impl Drop for BackgroundSlot<'_> {
    fn drop(&mut self) {
        if !self.used {
            let mut processes = lock(&self.owner.processes);
            processes.starting = processes.starting.saturating_sub(1);
        }
    }
}

impl Standalone {
    fn new(
        id: Uuid,
        sandbox: Sandbox,
        created_at: u64,
        spec: SandboxSpec,
        owner: Option<String>,
        restored: bool,
    ) -> Self {
        Self {
            id,
            sandbox,
            created_at,
            spec,
            owner,
            restored,
            processes: Mutex::new(Processes::default()),
            kernel: KernelSlot::default(),
        }
    }

    /// The host folder of its workspace.
    pub fn workspace(&self) -> &Path {
        &self.spec.workspace
    }

    /// Takes a place for a background process: 429 when [`MAX_BACKGROUND`] already run.
    pub fn reserve_background(&self) -> Result<BackgroundSlot<'_>, AppError> {
        let mut processes = lock(&self.processes);
        let running = processes.by_id.values().filter(|p| p.running()).count();
        if running + processes.starting >= MAX_BACKGROUND {
            return Err(AppError::new(
                Failure::TooMany,
                "too_many_processes",
                format!(
                    "this sandbox already runs {MAX_BACKGROUND} background processes: kill one first"
                ),
            ));
        }
        processes.starting += 1;
        Ok(BackgroundSlot {
            owner: self,
            used: false,
        })
    }

    /// Adopts a started command as a background process, collecting its output.
    pub fn adopt(
        &self,
        mut slot: BackgroundSlot<'_>,
        handle: ExecHandle,
        argv: Vec<String>,
        started: Instant,
    ) -> Arc<Process> {
        let (done, _) = watch::channel(false);
        let process = Arc::new(Process {
            id: Uuid::now_v7(),
            argv,
            started_at: now_ms().saturating_sub(millis(started.elapsed())),
            started,
            output: Mutex::new(ProcessOutput::default()),
            kill: Notify::new(),
            done,
        });
        tokio::spawn(Arc::clone(&process).pump(handle));
        let mut processes = lock(&self.processes);
        slot.used = true;
        processes.starting = processes.starting.saturating_sub(1);
        processes.by_id.insert(process.id, Arc::clone(&process));
        // Forget the oldest finished ones past the number kept.
        let finished: Vec<Uuid> = processes
            .by_id
            .values()
            .filter(|p| !p.running())
            .map(|p| p.id)
            .collect();
        for id in finished
            .iter()
            .take(finished.len().saturating_sub(KEPT_FINISHED))
        {
            processes.by_id.remove(id);
        }
        process
    }

    /// The background processes still running, oldest first.
    pub fn running_processes(&self) -> Vec<Arc<Process>> {
        lock(&self.processes)
            .by_id
            .values()
            .filter(|p| p.running())
            .cloned()
            .collect()
    }

    /// One background process (running, or finished and still remembered).
    pub fn process(&self, id: Uuid) -> Option<Arc<Process>> {
        lock(&self.processes).by_id.get(&id).cloned()
    }
}

/// The standalone sandboxes by id. Cheap to clone.
#[derive(Debug, Clone)]
pub struct SandboxRegistry {
    inner: Arc<RegistryInner>,
}

#[derive(Debug)]
struct RegistryInner {
    /// Where workspaces are made.
    root: PathBuf,
    /// How many may be open at once.
    max: usize,
    /// Whether `root` is ours (the default under the temporary folder), removed when empty.
    own_root: bool,
    slots: Mutex<Slots>,
    sweeping: AtomicBool,
    /// How many bytes of snapshots one owner may keep.
    snapshot_quota: u64,
}

/// A sandbox being made, counted against the registry's maximum until dropped.
struct Creating {
    inner: Arc<RegistryInner>,
}

impl Drop for Creating {
    fn drop(&mut self) {
        let mut slots = lock(&self.inner.slots);
        slots.creating = slots.creating.saturating_sub(1);
    }
}

#[derive(Debug, Default)]
struct Slots {
    sandboxes: HashMap<Uuid, Arc<Standalone>>,
    /// Sandboxes being made (counted against [`MAX_SANDBOXES`]).
    creating: usize,
}

impl SandboxRegistry {
    /// A registry making workspaces under `root`; without one, under
    /// `<temporary folder>/agentry-sandboxes-<pid>`.
    pub fn new(root: Option<PathBuf>) -> Self {
        Self::with_max(root, MAX_SANDBOXES)
    }

    /// This registry with `bytes` as each owner's snapshot quota instead of
    /// [`SNAPSHOT_QUOTA_BYTES`] (a registry not yet shared).
    pub fn with_snapshot_quota(mut self, bytes: u64) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.snapshot_quota = bytes;
        }
        self
    }

    /// How many bytes of snapshots one owner may keep.
    pub fn snapshot_quota(&self) -> u64 {
        self.inner.snapshot_quota
    }

    /// A registry allowing `max` open sandboxes (at least one) instead of [`MAX_SANDBOXES`].
    pub fn with_max(root: Option<PathBuf>, max: usize) -> Self {
        let own_root = root.is_none();
        let root = root.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("agentry-sandboxes-{}", std::process::id()))
        });
        Self {
            inner: Arc::new(RegistryInner {
                root,
                max: max.max(1),
                own_root,
                slots: Mutex::new(Slots::default()),
                sweeping: AtomicBool::new(false),
                snapshot_quota: SNAPSHOT_QUOTA_BYTES,
            }),
        }
    }

    /// How many sandboxes may be open at once.
    pub fn max(&self) -> usize {
        self.inner.max
    }

    /// The folder workspaces are made in.
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    /// Makes a sandbox with `backend` from `spec`, in a fresh workspace (the spec's workspace is
    /// replaced). 429 when [`SandboxRegistry::max`] are open.
    pub async fn create(
        &self,
        backend: &Arc<dyn Backend>,
        spec: SandboxSpec,
        owner: Option<String>,
        from: Option<Snapshot>,
    ) -> Result<Arc<Standalone>, AppError> {
        self.sweep().await;
        let place = {
            let mut slots = lock(&self.inner.slots);
            let max = self.inner.max;
            if slots.sandboxes.len() + slots.creating >= max {
                return Err(AppError::new(
                    Failure::TooMany,
                    "too_many_sandboxes",
                    format!(
                        "{max} sandboxes are open, the most this server allows: delete one first \
                         (DELETE /v1/sandboxes/{{id}})"
                    ),
                )
                .with_details(json!({ "max_sandboxes": max })));
            }
            slots.creating += 1;
            Creating {
                inner: Arc::clone(&self.inner),
            }
        };
        // Made in a task of its own, so a client that goes away cannot leave a half-made
        // sandbox behind: it is registered (and listed), and closes when idle.
        let registry = self.clone();
        let backend = Arc::clone(backend);
        tokio::spawn(async move {
            let place = place;
            let mut spec = spec;
            let (id, sandbox) = registry.make(&backend, &mut spec, from.as_ref()).await?;
            let entry = Arc::new(Standalone::new(id, sandbox, now_ms(), spec, owner, false));
            lock(&registry.inner.slots)
                .sandboxes
                .insert(id, Arc::clone(&entry));
            drop(place);
            registry.start_sweeping();
            Ok(entry)
        })
        .await
        .map_err(|error| AppError::internal(format!("making a sandbox failed: {error}")))?
    }

    async fn make(
        &self,
        backend: &Arc<dyn Backend>,
        spec: &mut SandboxSpec,
        from: Option<&Snapshot>,
    ) -> Result<(Uuid, Sandbox), AppError> {
        let id = Uuid::now_v7();
        let workspace = self.inner.root.join(id.to_string());
        let folder = workspace.clone();
        let files = from.map(|snapshot| self.snapshot_folder(snapshot.id).join("files"));
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&folder)?;
            if let Some(files) = files {
                copy_tree(&files, &folder, u64::MAX)?;
            }
            Ok::<_, std::io::Error>(())
        })
        .await
        .map_err(|error| AppError::internal(error.to_string()))?
        .map_err(|error| {
            unavailable(format!(
                "cannot make the sandbox's workspace {}: {error}",
                workspace.display()
            ))
        })?;
        spec.workspace = workspace.clone();
        match backend.create(spec.clone()).await {
            Ok(sandbox) => Ok((id, sandbox)),
            Err(error) => {
                remove_workspace(workspace).await;
                Err(match error {
                    SandboxError::Setup(message) | SandboxError::Unavailable(message) => {
                        unavailable(format!("cannot make a sandbox: {message}"))
                    }
                    SandboxError::Io(error) => {
                        unavailable(format!("cannot make a sandbox: {error}"))
                    }
                    other => sandbox_error(other),
                })
            }
        }
    }

    fn snapshot_folder(&self, id: Uuid) -> PathBuf {
        self.inner.root.join(SNAPSHOTS).join(id.to_string())
    }

    /// Takes a snapshot of `entry`'s workspace, with the sandbox paused meanwhile (resumed after,
    /// unless it was paused already): no process of it runs while the host copies its files.
    /// 503 `not_supported` where the sandbox cannot be paused.
    pub async fn snapshot(&self, entry: &Standalone) -> Result<Snapshot, AppError> {
        if !entry.sandbox.can_pause() {
            return Err(AppError::new(
                Failure::Unavailable,
                "not_supported",
                "a snapshot is taken with the sandbox paused, and this host has no cgroup \
                 freezer for it (its limits are rlimits)",
            ));
        }
        let owned: Vec<Snapshot> = self
            .snapshots()
            .await?
            .into_iter()
            .filter(|snapshot| snapshot.owner == entry.owner)
            .collect();
        let kept = owned.len();
        let used: u64 = owned.iter().map(|snapshot| snapshot.bytes).sum();
        let room = self.inner.snapshot_quota.saturating_sub(used);
        // A snapshot may take what the owner's quota has left, and at most the per-snapshot cap.
        let max_bytes = room.min(MAX_SNAPSHOT_BYTES);
        let over_quota = || {
            AppError::new(
                Failure::TooLarge,
                "snapshot_quota_exceeded",
                format!(
                    "this key's snapshots hold {used} bytes of its {} byte quota, and this \
                     sandbox's workspace does not fit in the rest: delete snapshots first \
                     (DELETE /v1/sandbox-snapshots/{{id}})",
                    self.inner.snapshot_quota
                ),
            )
            .with_details(json!({"used_bytes": used, "quota_bytes": self.inner.snapshot_quota}))
        };
        if kept >= MAX_SNAPSHOTS_PER_OWNER {
            return Err(AppError::new(
                Failure::TooMany,
                "too_many_snapshots",
                format!(
                    "{kept} snapshots are kept for this key, the most it may keep: delete one \
                     first (DELETE /v1/sandbox-snapshots/{{id}})"
                ),
            ));
        }
        let pause = !entry.sandbox.is_paused();
        if pause {
            entry.sandbox.pause().await.map_err(sandbox_error)?;
        }
        let id = Uuid::now_v7();
        let (source, folder) = (entry.workspace().to_path_buf(), self.snapshot_folder(id));
        let partial = self
            .inner
            .root
            .join(SNAPSHOTS)
            .join(format!(".partial-{id}"));
        let snapshot = Snapshot {
            id,
            sandbox_id: entry.id,
            created_at: now_ms(),
            bytes: 0,
            entries: 0,
            owner: entry.owner.clone(),
        };
        let written = {
            let partial = partial.clone();
            let mut snapshot = snapshot;
            tokio::task::spawn_blocking(move || {
                std::fs::create_dir_all(partial.join("files"))?;
                (snapshot.bytes, snapshot.entries) =
                    copy_tree(&source, &partial.join("files"), max_bytes)?;
                let record = serde_json::to_vec_pretty(&snapshot).map_err(std::io::Error::other)?;
                std::fs::write(partial.join("snapshot.json"), record)?;
                std::fs::rename(&partial, &folder)?;
                Ok::<_, std::io::Error>(snapshot)
            })
            .await
        };
        if pause {
            entry.sandbox.resume().await.map_err(sandbox_error)?;
        }
        let failure = match written {
            Ok(Ok(written)) => return Ok(written),
            Ok(Err(error))
                if error.kind() == std::io::ErrorKind::FileTooLarge
                    && max_bytes < MAX_SNAPSHOT_BYTES =>
            {
                over_quota()
            }
            Ok(Err(error)) if error.kind() == std::io::ErrorKind::FileTooLarge => AppError::new(
                Failure::TooLarge,
                "snapshot_too_large",
                format!(
                    "the sandbox's workspace holds more than {MAX_SNAPSHOT_BYTES} bytes, the most \
                     a snapshot takes"
                ),
            ),
            Ok(Err(error)) => unavailable(format!("cannot write the snapshot: {error}")),
            Err(error) => AppError::internal(error.to_string()),
        };
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(partial)).await;
        Err(failure)
    }

    /// Every snapshot kept, oldest first.
    pub async fn snapshots(&self) -> Result<Vec<Snapshot>, AppError> {
        let folder = self.inner.root.join(SNAPSHOTS);
        tokio::task::spawn_blocking(move || {
            let mut found: Vec<Snapshot> = match std::fs::read_dir(&folder) {
                Ok(entries) => entries
                    .flatten()
                    .filter_map(|entry| std::fs::read(entry.path().join("snapshot.json")).ok())
                    .filter_map(|record| serde_json::from_slice(&record).ok())
                    .collect(),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(error) => {
                    return Err(unavailable(format!("cannot read the snapshots: {error}")));
                }
            };
            found.sort_by_key(|snapshot: &Snapshot| snapshot.id);
            Ok(found)
        })
        .await
        .map_err(|error| AppError::internal(error.to_string()))?
    }

    /// The snapshot `id`: 404 when there is none.
    pub async fn find_snapshot(&self, id: &str) -> Result<Snapshot, AppError> {
        let parsed = Uuid::parse_str(id).map_err(|_| no_snapshot(id))?;
        let record = self.snapshot_folder(parsed).join("snapshot.json");
        let read = tokio::task::spawn_blocking(move || std::fs::read(record))
            .await
            .map_err(|error| AppError::internal(error.to_string()))?;
        match read {
            Ok(record) => serde_json::from_slice(&record)
                .map_err(|error| AppError::internal(format!("snapshot {id}: {error}"))),
            Err(_) => Err(no_snapshot(id)),
        }
    }

    /// Deletes the snapshot `id` (sandboxes started from it keep their own copies).
    pub async fn delete_snapshot(&self, snapshot: &Snapshot) -> Result<(), AppError> {
        let folder = self.snapshot_folder(snapshot.id);
        tokio::task::spawn_blocking(move || std::fs::remove_dir_all(folder))
            .await
            .map_err(|error| AppError::internal(error.to_string()))?
            .map_err(|error| unavailable(format!("cannot delete the snapshot: {error}")))
    }

    /// The open sandbox `id`: 404 when there is none (or it has closed).
    pub fn get(&self, id: Uuid) -> Result<Arc<Standalone>, AppError> {
        let entry = lock(&self.inner.slots).sandboxes.get(&id).cloned();
        match entry {
            Some(entry) if entry.sandbox.closed_reason().is_none() => Ok(entry),
            _ => Err(AppError::not_found(format!("no sandbox {id}"))),
        }
    }

    /// The open sandboxes, oldest first.
    pub fn list(&self) -> Vec<Arc<Standalone>> {
        let mut open: Vec<Arc<Standalone>> = lock(&self.inner.slots)
            .sandboxes
            .values()
            .filter(|entry| entry.sandbox.closed_reason().is_none())
            .cloned()
            .collect();
        open.sort_by_key(|entry| entry.id);
        open
    }

    /// How many sandboxes are open.
    pub fn len(&self) -> usize {
        self.list().len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Closes sandbox `id` (every process in it) and removes its workspace: 404 when there is
    /// none.
    pub async fn remove(&self, id: Uuid) -> Result<(), AppError> {
        let entry = lock(&self.inner.slots).sandboxes.remove(&id);
        let Some(entry) = entry else {
            return Err(AppError::not_found(format!("no sandbox {id}")));
        };
        let closed_before = entry.sandbox.closed_reason().is_some();
        close(&self.inner, &entry).await;
        if closed_before {
            return Err(AppError::not_found(format!("no sandbox {id}")));
        }
        Ok(())
    }

    /// Closes every sandbox and removes their workspaces (at shutdown); a paused one keeps its
    /// workspace and a record, and is made again, paused, when a server starts over this folder
    /// ([`SandboxRegistry::restore`]). Its processes end either way.
    pub async fn close_all(&self) {
        let entries: Vec<Arc<Standalone>> = lock(&self.inner.slots)
            .sandboxes
            .drain()
            .map(|(_, entry)| entry)
            .collect();
        let keep = !self.inner.own_root;
        futures::future::join_all(entries.iter().map(|entry| async move {
            if keep && entry.sandbox.is_paused() && self.record_paused(entry).await.is_ok() {
                entry.sandbox.close().await;
            } else {
                close(&self.inner, entry).await;
            }
        }))
        .await;
        if self.inner.own_root {
            // A root of our own is temporary: its snapshots go with it.
            let snapshots = self.inner.root.join(SNAPSHOTS);
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(snapshots)).await;
            let root = self.inner.root.clone();
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir(root)).await;
        }
    }

    /// Writes the record a paused sandbox is made again from after a restart.
    async fn record_paused(&self, entry: &Standalone) -> std::io::Result<()> {
        let record = PausedRecord {
            id: entry.id,
            created_at: entry.created_at,
            owner: entry.owner.clone(),
            spec: entry.spec.clone(),
            on_idle: entry.sandbox.is_paused_on_idle(),
        };
        let path = paused_record(&self.inner.root, entry.id);
        let bytes = serde_json::to_vec_pretty(&record).map_err(std::io::Error::other)?;
        tokio::task::spawn_blocking(move || {
            let folder = path.parent().unwrap_or(Path::new("."));
            std::fs::create_dir_all(folder)?;
            let partial = path.with_extension("partial");
            std::fs::write(&partial, bytes)?;
            std::fs::rename(partial, path)
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// Records a sandbox paused by a request, so that it comes back after a restart (a
    /// temporary root keeps nothing); a failure to write is logged, the pause stands.
    pub async fn keep_paused(&self, entry: &Standalone) {
        if self.inner.own_root {
            return;
        }
        if let Err(error) = self.record_paused(entry).await {
            tracing::warn!(sandbox = %entry.id, "cannot record the paused sandbox: {error}");
        }
    }

    /// Forgets a paused sandbox's record (it was resumed or deleted).
    pub async fn forget_paused(&self, id: Uuid) {
        forget_paused(&self.inner.root, id).await;
    }

    /// Makes again, over their workspaces and paused as they were, the sandboxes that were
    /// paused when a server last stopped over this folder: their files are there, their
    /// processes are not. A record whose workspace is gone, or that cannot be made again, is
    /// dropped with a warning. Answers how many came back.
    pub async fn restore(&self, backend: &Arc<dyn Backend>) -> usize {
        let root = self.inner.root.clone();
        let records = tokio::task::spawn_blocking(move || paused_records(&root))
            .await
            .unwrap_or_default();
        let mut restored = 0;
        for record in records {
            let id = record.id;
            if !record.spec.workspace.is_dir()
                || lock(&self.inner.slots).sandboxes.len() >= self.inner.max
            {
                tracing::warn!(sandbox = %id, "a paused sandbox's workspace is gone, or the registry is full: not restored");
                self.forget_paused(id).await;
                continue;
            }
            let sandbox = match backend.create(record.spec.clone()).await {
                Ok(sandbox) => sandbox,
                Err(error) => {
                    tracing::warn!(sandbox = %id, "a paused sandbox could not be made again: {error}");
                    continue;
                }
            };
            let paused = if record.on_idle {
                sandbox.pause_until_used().await
            } else {
                sandbox.pause().await
            };
            if let Err(error) = paused {
                tracing::warn!(sandbox = %id, "a restored sandbox could not be paused: {error}");
            }
            let entry = Arc::new(Standalone::new(
                id,
                sandbox,
                record.created_at,
                record.spec,
                record.owner,
                true,
            ));
            lock(&self.inner.slots).sandboxes.insert(id, entry);
            restored += 1;
        }
        if restored > 0 {
            self.start_sweeping();
        }
        restored
    }

    /// Forgets the sandboxes that closed by themselves, removing their workspaces.
    async fn sweep(&self) {
        sweep(&self.inner).await;
    }

    fn start_sweeping(&self) {
        if self.inner.sweeping.swap(true, Ordering::SeqCst) {
            return;
        }
        let registry: Weak<RegistryInner> = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(SWEEP_EVERY).await;
                let Some(inner) = registry.upgrade() else {
                    return;
                };
                sweep(&inner).await;
            }
        });
    }
}

async fn sweep(inner: &RegistryInner) {
    let closed: Vec<Arc<Standalone>> = {
        let mut slots = lock(&inner.slots);
        let ids: Vec<Uuid> = slots
            .sandboxes
            .values()
            .filter(|entry| entry.sandbox.closed_reason().is_some())
            .map(|entry| entry.id)
            .collect();
        ids.iter()
            .filter_map(|id| slots.sandboxes.remove(id))
            .collect()
    };
    for entry in closed {
        tracing::debug!(sandbox = %entry.id, reason = ?entry.sandbox.closed_reason(), "sandbox closed");
        close(inner, &entry).await;
    }
}

/// Closes a sandbox and removes its workspace (and its record, were it paused at a restart).
async fn close(inner: &RegistryInner, entry: &Standalone) {
    entry.sandbox.close().await;
    remove_workspace(entry.workspace().to_path_buf()).await;
    forget_paused(&inner.root, entry.id).await;
}

/// Removes the record of the paused sandbox `id`, if there is one.
async fn forget_paused(root: &Path, id: Uuid) {
    let record = paused_record(root, id);
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(record)).await;
}

async fn remove_workspace(path: PathBuf) {
    let shown = path.display().to_string();
    let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(path)).await;
    match removed {
        Ok(Ok(())) => {}
        Ok(Err(error)) if error.kind() == std::io::ErrorKind::NotFound => {}
        Ok(Err(error)) => {
            tracing::warn!("cannot remove the sandbox workspace {shown}: {error}");
        }
        Err(error) => tracing::warn!("cannot remove the sandbox workspace {shown}: {error}"),
    }
}
