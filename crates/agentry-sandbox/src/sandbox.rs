//! A sandbox: the E2B-like surface (exec with streaming output, stdin, timeouts, kill; files;
//! close) over the agent connection, the same for every backend.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::sync::mpsc;

use crate::cgroup::Cgroups;
use crate::conn::{Conn, RawExit};
use crate::error::{Result, SandboxError};
use crate::exit::ExitStatus;
use crate::launch::Slots;
use crate::policy::{BackendKind, ExecRequest, IdleAction};
use crate::protocol::{Op, ReplyBody};
use crate::proxy::Proxy;
use crate::report::{DirEntry, FileStat, LimitsMode, SandboxReport};

/// Streamed output and the end of a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    /// A chunk of standard output.
    Stdout(Vec<u8>),
    /// A chunk of standard error.
    Stderr(Vec<u8>),
    /// The command ended; the last event.
    Exit(ExitStatus),
}

/// Everything a command printed, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    /// Standard output.
    pub stdout: Vec<u8>,
    /// Standard error.
    pub stderr: Vec<u8>,
    /// How it ended.
    pub status: ExitStatus,
}

impl ExecOutput {
    /// Standard output as (lossy) UTF-8.
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Standard error as (lossy) UTF-8.
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// A running command. Dropping the handle leaves the command running (a background process);
/// [`ExecHandle::kill`] or the timeout stops it with everything it started.
pub struct ExecHandle {
    id: u64,
    events: mpsc::Receiver<ExecEvent>,
    stdin: Option<pipe::Sender>,
    control: mpsc::UnboundedSender<()>,
}

impl std::fmt::Debug for ExecHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecHandle")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ExecHandle {
    /// The command's id in its sandbox.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next output chunk, or the exit (then `None` after it).
    pub async fn next(&mut self) -> Option<ExecEvent> {
        self.events.recv().await
    }

    /// The stdin pipe (when asked for with [`ExecRequest::with_stdin`]); drop it to send EOF.
    pub fn take_stdin(&mut self) -> Option<pipe::Sender> {
        self.stdin.take()
    }

    /// Kills the command and every process it started (daemons included).
    pub fn kill(&self) {
        let _ = self.control.send(());
    }

    /// Turns the command into a byte stream: its standard output as an [`AsyncRead`]
    /// ([`ExecStdout`]), its stdin pipe (when asked for with [`ExecRequest::with_stdin`]), and its
    /// standard error as chunks on a channel. For long-lived programs spoken to over stdio (an
    /// MCP server). The stream ends (EOF) when the command exits.
    ///
    /// [`AsyncRead`]: tokio::io::AsyncRead
    pub fn into_stdio(
        mut self,
    ) -> (
        ExecStdout,
        Option<pipe::Sender>,
        mpsc::UnboundedReceiver<Vec<u8>>,
    ) {
        let stdin = self.stdin.take();
        let (stderr_tx, stderr_rx) = mpsc::unbounded_channel();
        let reader = ExecStdout {
            handle: self,
            pending: Vec::new(),
            offset: 0,
            stderr: stderr_tx,
            exit: None,
        };
        (reader, stdin, stderr_rx)
    }

    /// Waits for the end, collecting the output.
    pub async fn wait(mut self) -> Result<ExecOutput> {
        drop(self.stdin.take());
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        while let Some(ev) = self.events.recv().await {
            match ev {
                ExecEvent::Stdout(b) => stdout.extend_from_slice(&b),
                ExecEvent::Stderr(b) => stderr.extend_from_slice(&b),
                ExecEvent::Exit(status) => {
                    return Ok(ExecOutput {
                        stdout,
                        stderr,
                        status,
                    });
                }
            }
        }
        Err(SandboxError::Closed {
            reason: "the command's output task ended".into(),
        })
    }
}

/// A running command's standard output as a byte stream ([`ExecHandle::into_stdio`]). It ends
/// (EOF) when the command exits; [`ExecStdout::exit_status`] then says how. Dropping it leaves the
/// command running; [`ExecStdout::kill`] stops it.
pub struct ExecStdout {
    handle: ExecHandle,
    pending: Vec<u8>,
    offset: usize,
    stderr: mpsc::UnboundedSender<Vec<u8>>,
    exit: Option<ExitStatus>,
}

impl std::fmt::Debug for ExecStdout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecStdout")
            .field("id", &self.handle.id)
            .field("exit", &self.exit)
            .finish_non_exhaustive()
    }
}

impl ExecStdout {
    /// How the command ended, once the stream has ended.
    pub fn exit_status(&self) -> Option<&ExitStatus> {
        self.exit.as_ref()
    }

    /// Kills the command and every process it started.
    pub fn kill(&self) {
        self.handle.kill();
    }
}

impl tokio::io::AsyncRead for ExecStdout {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        let this = self.get_mut();
        loop {
            if this.offset < this.pending.len() {
                let n = buf.remaining().min(this.pending.len() - this.offset);
                buf.put_slice(&this.pending[this.offset..this.offset + n]);
                this.offset += n;
                return Poll::Ready(Ok(()));
            }
            if this.exit.is_some() {
                return Poll::Ready(Ok(()));
            }
            match this.handle.events.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(ExecEvent::Stdout(chunk))) => {
                    this.pending = chunk;
                    this.offset = 0;
                }
                Poll::Ready(Some(ExecEvent::Stderr(chunk))) => {
                    let _ = this.stderr.send(chunk);
                }
                Poll::Ready(Some(ExecEvent::Exit(status))) => this.exit = Some(status),
                Poll::Ready(None) => {
                    this.exit = Some(ExitStatus {
                        code: None,
                        signal: None,
                        timed_out: false,
                        killed: false,
                        out_of_memory: false,
                        sandbox_closed: Some("the command's output task ended".into()),
                    });
                }
            }
        }
    }
}

/// What closing a sandbox must undo.
pub(crate) struct Teardown {
    /// The process the runtime spawned (keeper or local agent).
    pub(crate) child: std::process::Child,
    pub(crate) native: bool,
    pub(crate) cgroups: Arc<Cgroups>,
    pub(crate) slot: Option<u32>,
    /// The network proxy (allow-list network): stopped, and its folder removed, when dropped.
    pub(crate) proxy: Option<Proxy>,
}

impl Teardown {
    /// Kills the sandbox and waits until nothing of it is left: no process, no cgroup, no slot,
    /// no proxy.
    fn run(mut self, pid1: Option<i32>) {
        // A paused sandbox is thawed first: under cgroup v1 a frozen process does not die of
        // SIGKILL until it thaws.
        if self.cgroups.is_frozen() {
            let _ = self.cgroups.set_frozen(false);
        }
        // Native: killing PID 1 tears its pid namespace down; the keeper reaps it and exits, and
        // PID 1 is reaped only once every process of its namespace is gone. Without a PID 1
        // (setup failed early) the keeper itself is killed.
        match pid1.filter(|_| self.native) {
            Some(pid) => {
                // SAFETY: kill with integer arguments only.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            None => {
                let _ = self.child.kill();
            }
        }
        let _ = self.child.wait();
        self.cgroups.remove();
        if let Some(slot) = self.slot {
            Slots::release(slot);
        }
        drop(self.proxy.take());
    }
}

pub(crate) struct Inner {
    pub(crate) conn: Arc<Conn>,
    pub(crate) report: SandboxReport,
    pub(crate) workspace: PathBuf,
    pub(crate) teardown: Mutex<Option<Teardown>>,
    pub(crate) cgroups: Arc<Cgroups>,
    pub(crate) last_activity: Mutex<Instant>,
    pub(crate) running: std::sync::atomic::AtomicUsize,
    pub(crate) created: Instant,
    /// Paused by its idle timeout (not by a request): the next operation resumes it.
    pub(crate) paused_on_idle: std::sync::atomic::AtomicBool,
    /// Held while the idle timeout decides to pause and pauses, and while an operation resumes
    /// a sandbox paused on idle and counts as activity: an operation either sees the sandbox
    /// paused (and resumes it) or makes it not idle, never reaches a sandbox frozen behind it.
    pub(crate) pause_gate: Mutex<()>,
}

impl Inner {
    pub(crate) fn touch(&self) {
        *self.last_activity.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }

    /// Counts as activity, for an operation that needs the sandbox running: one paused by its
    /// idle timeout is resumed first; one paused by a request answers [`SandboxError::Paused`]
    /// at once instead of waiting on its frozen agent.
    fn touch_running(&self) -> Result<()> {
        let _gate = self.pause_gate.lock().unwrap_or_else(|p| p.into_inner());
        if self.cgroups.is_frozen() {
            if !self.paused_on_idle.load(Ordering::SeqCst) {
                return Err(SandboxError::Paused);
            }
            // Thawing is a write and a read of the freezer's state (a fraction of a millisecond).
            self.cgroups.set_frozen(false)?;
            self.paused_on_idle.store(false, Ordering::SeqCst);
        }
        self.touch();
        Ok(())
    }

    /// Pauses the sandbox if it is still idle (`after` without activity, nothing running);
    /// answers whether it did. Blocking: the freezer's state is written and waited for.
    fn pause_if_idle(&self, after: Duration) -> std::io::Result<bool> {
        let _gate = self.pause_gate.lock().unwrap_or_else(|p| p.into_inner());
        let last = *self.last_activity.lock().unwrap_or_else(|p| p.into_inner());
        if self.running.load(Ordering::SeqCst) != 0
            || last.elapsed() < after
            || self.cgroups.is_frozen()
        {
            return Ok(false);
        }
        self.cgroups.set_frozen(true)?;
        self.paused_on_idle.store(true, Ordering::SeqCst);
        Ok(true)
    }

    fn take_teardown(&self) -> Option<Teardown> {
        self.teardown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }

    async fn close(&self, reason: &str) {
        if self.report.backend == BackendKind::Local && self.conn.closed_reason().is_none() {
            // No pid namespace to empty: the local agent kills every command tree itself.
            let shutdown = self.conn.request(Op::Shutdown, &[]);
            let _ = tokio::time::timeout(Duration::from_secs(2), shutdown).await;
        }
        self.conn.set_reason(reason);
        if let Some(t) = self.take_teardown() {
            let pid1 = self.conn.pid1();
            let _ = tokio::task::spawn_blocking(move || t.run(pid1)).await;
        }
        // Everything is dead: the connection ends (and its reader lets the socket go) at once.
        let mut closed = self.conn.closed_watch();
        let _ = tokio::time::timeout(Duration::from_secs(1), closed.wait_for(|c| *c)).await;
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(t) = self.take_teardown() {
            let pid1 = self.conn.pid1();
            let _ = std::thread::Builder::new()
                .name("agentry-sandbox-teardown".into())
                .spawn(move || t.run(pid1));
        }
    }
}

/// A sandbox. Cloning shares it; it is closed by [`Sandbox::close`], by its idle timeout or
/// wall-time limit, or when the last clone is dropped.
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sandbox")
            .field("report", &self.inner.report)
            .finish_non_exhaustive()
    }
}

fn pipe_pair() -> Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

impl Sandbox {
    pub(crate) fn new(
        inner: Inner,
        idle: Option<(Duration, IdleAction)>,
        wall: Option<Duration>,
    ) -> Sandbox {
        let inner = Arc::new(inner);
        tokio::spawn(supervise(
            Arc::downgrade(&inner),
            inner.conn.clone(),
            idle,
            wall,
        ));
        Sandbox { inner }
    }

    /// What this sandbox got: backend, isolation, outer uid, limits, policy, warnings.
    pub fn report(&self) -> &SandboxReport {
        &self.inner.report
    }

    /// The backend that made it.
    pub fn backend(&self) -> BackendKind {
        self.inner.report.backend
    }

    /// The host folder of the workspace.
    pub fn workspace(&self) -> &Path {
        &self.inner.workspace
    }

    /// Why the sandbox closed, once it has.
    pub fn closed_reason(&self) -> Option<String> {
        self.inner
            .conn
            .closed_reason()
            .filter(|_| *self.inner.conn.closed_watch().borrow())
    }

    /// The host pid of the sandbox's PID 1 (native), for diagnostics.
    pub fn pid1(&self) -> Option<i32> {
        self.inner.conn.pid1()
    }

    /// Whether this sandbox can be paused on this host (it has a cgroup freezer).
    pub fn can_pause(&self) -> bool {
        self.inner.cgroups.can_freeze()
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.inner.cgroups.is_frozen()
    }

    /// Whether it was paused by its idle timeout ([`IdleAction::Pause`]), so that the next
    /// command or file operation resumes it, rather than by [`Sandbox::pause`].
    pub fn is_paused_on_idle(&self) -> bool {
        self.is_paused() && self.inner.paused_on_idle.load(Ordering::SeqCst)
    }

    /// Pauses the sandbox: every process in it is frozen (no CPU; memory, files and open
    /// connections kept) until [`Sandbox::resume`]. Commands and file operations are refused
    /// with [`SandboxError::Paused`] meanwhile, and a paused sandbox is not closed for being
    /// idle. Pausing a paused sandbox does nothing. [`SandboxError::Unsupported`] where the host
    /// has no cgroup freezer for it.
    pub async fn pause(&self) -> Result<()> {
        self.freeze(true).await
    }

    /// Pauses the sandbox as its idle timeout would ([`IdleAction::Pause`]): the next command
    /// or file operation resumes it by itself. For a sandbox made again after a restart that
    /// was paused that way before.
    pub async fn pause_until_used(&self) -> Result<()> {
        self.freeze(true).await?;
        self.inner.paused_on_idle.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Resumes a paused sandbox: its processes go on where they stopped. Resuming a running
    /// sandbox does nothing.
    pub async fn resume(&self) -> Result<()> {
        self.freeze(false).await?;
        self.inner.touch();
        Ok(())
    }

    async fn freeze(&self, frozen: bool) -> Result<()> {
        // A pause or resume by request replaces one by the idle timeout: a sandbox paused on
        // request stays paused until resumed on request.
        self.inner.paused_on_idle.store(false, Ordering::SeqCst);
        if let Some(reason) = self.inner.conn.closed_reason() {
            return Err(SandboxError::Closed { reason });
        }
        if !self.inner.cgroups.can_freeze() {
            return Err(SandboxError::Unsupported(
                "pausing needs a cgroup freezer, and this sandbox has none (no cgroups for it on \
                 this host: its limits are rlimits)"
                    .into(),
            ));
        }
        let cgroups = self.inner.cgroups.clone();
        tokio::task::spawn_blocking(move || cgroups.set_frozen(frozen))
            .await
            .map_err(|e| SandboxError::Io(std::io::Error::other(e)))??;
        Ok(())
    }

    /// What the sandbox's processes have used: CPU time (dead processes included) and memory
    /// now, where its cgroups tell (`None` under rlimits).
    pub fn usage(&self) -> crate::ResourceUsage {
        self.inner.cgroups.usage()
    }

    /// The host pids of the sandbox's processes, where it has cgroups (for diagnostics and
    /// metering).
    pub fn host_pids(&self) -> Vec<i32> {
        self.inner.cgroups.pids()
    }

    /// Marks the sandbox in use while the guard lives, for work that reaches its processes
    /// without a command of ours (a kernel in it, talked to over a socket in its workspace): it
    /// counts as a running command, so the idle timeout waits, and one paused by its idle
    /// timeout is resumed first. [`SandboxError::Paused`] when paused by a request.
    pub fn in_use(&self) -> Result<InUse> {
        self.inner.touch_running()?;
        self.inner.running.fetch_add(1, Ordering::SeqCst);
        Ok(InUse {
            inner: Arc::clone(&self.inner),
        })
    }

    /// Starts a command. Output streams through the handle.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecHandle> {
        if req.argv.is_empty() {
            return Err(SandboxError::InvalidRequest("empty argv".into()));
        }
        self.inner.touch_running()?;
        let conn = self.inner.conn.clone();
        let (out_r, out_w) = pipe_pair()?;
        let (err_r, err_w) = pipe_pair()?;
        let stdin = if req.stdin { Some(pipe_pair()?) } else { None };
        let mut fds: Vec<RawFd> = Vec::new();
        if let Some((r, _)) = &stdin {
            fds.push(r.as_raw_fd());
        }
        fds.push(out_w.as_raw_fd());
        fds.push(err_w.as_raw_fd());
        let exec = conn.next_id();
        let exit_rx = conn.register_exit(exec);
        let started = Instant::now();
        let oom_before = self.inner.cgroups.oom_kills();
        let op = Op::Exec {
            exec,
            argv: req.argv.clone(),
            env: req.env.into_iter().collect(),
            cwd: req.cwd.clone(),
            stdin: req.stdin,
            tty: false,
        };
        if let Err(e) = conn.request(op, &fds).await {
            conn.forget_exit(exec);
            return Err(e);
        }
        drop((out_w, err_w));
        let stdin_tx = match stdin {
            Some((r, w)) => {
                drop(r);
                Some(pipe::Sender::from_owned_fd(w)?)
            }
            None => None,
        };
        let stdout = pipe::Receiver::from_owned_fd(out_r)?;
        let stderr = pipe::Receiver::from_owned_fd(err_r)?;
        let (tx, rx) = mpsc::channel(64);
        let (control_tx, control_rx) = mpsc::unbounded_channel();
        let deadline = req.timeout.map(|t| started + t);
        self.inner
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let span = exec_span(&req.argv, exec);
        tokio::spawn(tracing::Instrument::instrument(
            pump(
                self.inner.clone(),
                exec,
                stdout,
                stderr,
                exit_rx,
                tx,
                control_rx,
                deadline.map(tokio::time::Instant::from_std),
                oom_before,
            ),
            span,
        ));
        Ok(ExecHandle {
            id: exec,
            events: rx,
            stdin: stdin_tx,
            control: control_tx,
        })
    }

    /// Starts a command on a new pseudo-terminal of `size` (an interactive shell, a REPL, a
    /// full-screen program): it is the command's controlling terminal and its stdin, stdout and
    /// stderr; `TERM` is `xterm-256color` unless the request sets it. The request's timeout
    /// does not apply (a terminal lives until it is killed or its program exits).
    pub async fn exec_tty(
        &self,
        req: ExecRequest,
        size: crate::tty::TtySize,
    ) -> Result<crate::tty::TtyProcess> {
        if req.argv.is_empty() {
            return Err(SandboxError::InvalidRequest("empty argv".into()));
        }
        self.inner.touch_running()?;
        let conn = self.inner.conn.clone();
        let pair = crate::tty::open_pair(size)?;
        let exec = conn.next_id();
        let exit_rx = conn.register_exit(exec);
        let mut env = req.env;
        env.entry("TERM".into())
            .or_insert_with(|| "xterm-256color".into());
        let op = Op::Exec {
            exec,
            argv: req.argv,
            env: env.into_iter().collect(),
            cwd: req.cwd,
            stdin: true,
            tty: true,
        };
        self.inner
            .running
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let inner = self.inner.clone();
        let on_exit = Box::new(move || {
            inner
                .running
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            inner.touch();
        });
        let started = crate::tty::start(conn, exec, op, pair, exit_rx, on_exit).await;
        if started.is_err() {
            self.inner
                .running
                .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
        started
    }

    /// Runs a command to the end and collects its output.
    pub async fn run(&self, req: ExecRequest) -> Result<ExecOutput> {
        self.exec(req).await?.wait().await
    }

    /// Reads a regular file (path inside the sandbox; relative to the workspace), up to `max` bytes.
    pub async fn read_file(&self, path: &str, max: u64) -> Result<Vec<u8>> {
        self.inner.touch_running()?;
        let (_, mut fds) = self
            .inner
            .conn
            .request(Op::OpenRead { path: path.into() }, &[])
            .await?;
        let fd = fds
            .pop()
            .ok_or_else(|| SandboxError::Setup("no descriptor in the reply".into()))?;
        read_fd(fd, max).await
    }

    /// Creates or replaces a regular file with `data` (mode 0644).
    pub async fn write_file(&self, path: &str, data: &[u8]) -> Result<()> {
        self.inner.touch_running()?;
        let op = Op::OpenWrite {
            path: path.into(),
            append: false,
            mode: 0o644,
        };
        let (_, mut fds) = self.inner.conn.request(op, &[]).await?;
        let fd = fds
            .pop()
            .ok_or_else(|| SandboxError::Setup("no descriptor in the reply".into()))?;
        let data = data.to_vec();
        tokio::task::spawn_blocking(move || std::fs::File::from(fd).write_all(&data))
            .await
            .map_err(|e| SandboxError::Io(std::io::Error::other(e)))??;
        Ok(())
    }

    /// Lists a directory (entries sorted by name; symlinks not followed).
    pub async fn list(&self, path: &str) -> Result<Vec<DirEntry>> {
        self.inner.touch_running()?;
        let (_, mut fds) = self
            .inner
            .conn
            .request(Op::List { path: path.into() }, &[])
            .await?;
        let fd = fds
            .pop()
            .ok_or_else(|| SandboxError::Setup("no descriptor in the reply".into()))?;
        let body = tokio::task::spawn_blocking(move || {
            let mut f = std::fs::File::from(fd);
            let mut body = Vec::new();
            std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(0))?;
            f.read_to_end(&mut body)?;
            Ok::<_, std::io::Error>(body)
        })
        .await
        .map_err(|e| SandboxError::Io(std::io::Error::other(e)))??;
        serde_json::from_slice(&body).map_err(|e| SandboxError::Setup(format!("bad listing: {e}")))
    }

    /// `lstat` of a path.
    pub async fn stat(&self, path: &str) -> Result<FileStat> {
        self.inner.touch_running()?;
        match self
            .inner
            .conn
            .request(Op::Stat { path: path.into() }, &[])
            .await?
            .0
        {
            ReplyBody::Stat { stat } => Ok(stat),
            other => Err(SandboxError::Setup(format!("unexpected reply {other:?}"))),
        }
    }

    /// Removes a file or symlink, or a directory (with its contents when `recursive`).
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<()> {
        self.inner.touch_running()?;
        self.inner
            .conn
            .request(
                Op::Remove {
                    path: path.into(),
                    recursive,
                },
                &[],
            )
            .await
            .map(|_| ())
    }

    /// Makes a directory (and its parents when `parents`).
    pub async fn mkdir(&self, path: &str, parents: bool) -> Result<()> {
        self.inner.touch_running()?;
        self.inner
            .conn
            .request(
                Op::Mkdir {
                    path: path.into(),
                    parents,
                },
                &[],
            )
            .await
            .map(|_| ())
    }

    /// Kills everything in the sandbox and removes what it left on the host (cgroups, slot).
    /// Later calls fail with [`SandboxError::Closed`].
    pub async fn close(&self) {
        self.inner.close("closed").await;
    }
}

async fn read_fd(fd: OwnedFd, max: u64) -> Result<Vec<u8>> {
    tokio::task::spawn_blocking(move || {
        let mut buf = Vec::new();
        std::fs::File::from(fd)
            .take(max.saturating_add(1))
            .read_to_end(&mut buf)?;
        if buf.len() as u64 > max {
            return Err(SandboxError::TooLarge { limit: max });
        }
        Ok(buf)
    })
    .await
    .map_err(|e| SandboxError::Io(std::io::Error::other(e)))?
}

/// Reads a command's pipes into events until its first process exits (then drains what is
/// already buffered: a daemon holding the pipes must not keep the command "running").
#[allow(clippy::too_many_arguments)]
async fn pump(
    inner: Arc<Inner>,
    exec: u64,
    mut stdout: pipe::Receiver,
    mut stderr: pipe::Receiver,
    mut exit_rx: tokio::sync::oneshot::Receiver<RawExit>,
    tx: mpsc::Sender<ExecEvent>,
    mut control: mpsc::UnboundedReceiver<()>,
    deadline: Option<tokio::time::Instant>,
    oom_before: u64,
) {
    let mut out_open = true;
    let mut err_open = true;
    let mut timed_out = false;
    let mut killed = false;
    let mut kill_sent = false;
    let mut control_open = true;
    let mut ob = vec![0u8; 32 * 1024];
    let mut eb = vec![0u8; 32 * 1024];
    let conn = inner.conn.clone();
    let kill = |conn: Arc<Conn>| {
        tokio::spawn(async move {
            let _ = conn.request(Op::Kill { exec }, &[]).await;
        });
    };
    let exit = loop {
        let sleep = async {
            match deadline {
                Some(d) if !kill_sent => tokio::time::sleep_until(d).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            r = stdout.read(&mut ob), if out_open => match r {
                Ok(0) | Err(_) => out_open = false,
                Ok(n) => { let _ = tx.send(ExecEvent::Stdout(ob[..n].to_vec())).await; }
            },
            r = stderr.read(&mut eb), if err_open => match r {
                Ok(0) | Err(_) => err_open = false,
                Ok(n) => { let _ = tx.send(ExecEvent::Stderr(eb[..n].to_vec())).await; }
            },
            r = &mut exit_rx => break r.ok(),
            () = sleep => {
                timed_out = true;
                kill_sent = true;
                kill(conn.clone());
            }
            c = control.recv(), if control_open => match c {
                Some(()) => {
                    if !kill_sent {
                        killed = true;
                        kill_sent = true;
                        kill(conn.clone());
                    }
                }
                None => control_open = false,
            },
        }
    };
    // Drain what the command wrote before it exited.
    for (rx, is_out) in [(&mut stdout, true), (&mut stderr, false)] {
        let open = if is_out { out_open } else { err_open };
        if !open {
            continue;
        }
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // A plain read: tokio's try_read answers WouldBlock until the reactor has seen the
            // pipe become readable, which may not have happened yet.
            match nix::unistd::read(&*rx, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let chunk = buf[..n].to_vec();
                    let ev = if is_out {
                        ExecEvent::Stdout(chunk)
                    } else {
                        ExecEvent::Stderr(chunk)
                    };
                    let _ = tx.send(ev).await;
                }
            }
        }
    }
    let status = match exit {
        Some(raw) => {
            let out_of_memory = raw.signal == Some(libc::SIGKILL)
                && !kill_sent
                && inner.cgroups.oom_kills() > oom_before;
            ExitStatus {
                code: raw.code,
                signal: raw.signal,
                timed_out,
                killed,
                out_of_memory,
                sandbox_closed: None,
            }
        }
        None => {
            let oom = inner.cgroups.oom_kills() > oom_before;
            let reason = inner
                .conn
                .closed_reason()
                .unwrap_or_else(|| "the sandbox's agent exited".into());
            ExitStatus {
                code: None,
                signal: Some(libc::SIGKILL),
                timed_out,
                killed,
                out_of_memory: oom,
                sandbox_closed: Some(if oom {
                    format!("{reason} (out of memory)")
                } else {
                    reason
                }),
            }
        }
    };
    inner
        .running
        .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    inner.touch();
    end_exec_span(&tracing::Span::current(), &status);
    let _ = tx.send(ExecEvent::Exit(status)).await;
}

/// The trace target the process exports (`agentry_core::telemetry::TARGET`; this crate does not
/// depend on core).
const TRACE_TARGET: &str = "agentry::trace";

/// The span of one command, from its start to its exit, under the span that started it (a tool
/// call's): `exec <program>`, with the program's name only — its arguments may hold secrets.
fn exec_span(argv: &[String], exec: u64) -> tracing::Span {
    let program = argv
        .first()
        .map(|program| program.rsplit('/').next().unwrap_or(program))
        .unwrap_or_default();
    tracing::info_span!(
        target: TRACE_TARGET,
        "sandbox_exec",
        otel.name = %format!("exec {program}"),
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        process.executable.name = program,
        process.exit.code = tracing::field::Empty,
        agentry.sandbox.exec_id = exec as i64,
    )
}

/// Records how the command ended on its span: a code other than 0, a signal, a timeout or a
/// closed sandbox is the span's error.
fn end_exec_span(span: &tracing::Span, status: &ExitStatus) {
    if let Some(code) = status.code {
        span.record("process.exit.code", i64::from(code));
    }
    let failure = if status.timed_out {
        Some("timed out".to_owned())
    } else if status.out_of_memory {
        Some("out of memory".to_owned())
    } else if let Some(reason) = &status.sandbox_closed {
        Some(reason.clone())
    } else if let Some(signal) = status.signal {
        Some(format!("killed by signal {signal}"))
    } else {
        status
            .code
            .filter(|code| *code != 0)
            .map(|code| format!("exit code {code}"))
    };
    if let Some(failure) = failure {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", failure.as_str());
    }
}

/// The sandbox in use ([`Sandbox::in_use`]) until dropped.
#[derive(Debug)]
pub struct InUse {
    inner: Arc<Inner>,
}

impl Drop for InUse {
    fn drop(&mut self) {
        self.inner.running.fetch_sub(1, Ordering::SeqCst);
        self.inner.touch();
    }
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("workspace", &self.workspace)
            .finish_non_exhaustive()
    }
}

/// Closes the sandbox when its agent dies, when it has been idle too long, or when its wall time
/// runs out.
async fn supervise(
    inner: Weak<Inner>,
    conn: Arc<Conn>,
    idle: Option<(Duration, IdleAction)>,
    wall: Option<Duration>,
) {
    let mut closed = conn.closed_watch();
    drop(conn);
    loop {
        let tick = tokio::time::sleep(Duration::from_millis(50));
        tokio::select! {
            r = closed.changed() => {
                if r.is_err() || *closed.borrow() {
                    // The agent is gone (killed, crashed, or closed): clean up what is left.
                    if let Some(inner) = inner.upgrade() {
                        inner.close("the sandbox's agent exited").await;
                    }
                    return;
                }
            }
            () = tick => {
                let Some(inner) = inner.upgrade() else { return };
                if wall.is_some_and(|wall| inner.created.elapsed() >= wall) {
                    inner.close("wall-time limit reached").await;
                    return;
                }
                // A paused sandbox is kept, not closed (or paused again) for being idle.
                if let Some((after, action)) = idle.filter(|_| !inner.cgroups.is_frozen()) {
                    let last = *inner.last_activity.lock().unwrap_or_else(|p| p.into_inner());
                    if inner.running.load(Ordering::SeqCst) == 0 && last.elapsed() >= after {
                        if action == IdleAction::Pause && inner.cgroups.can_freeze() {
                            let pausing = inner.clone();
                            let paused = tokio::task::spawn_blocking(move || pausing.pause_if_idle(after)).await;
                            if matches!(paused, Ok(Ok(_))) {
                                continue;
                            }
                        }
                        inner.close("idle timeout").await;
                        return;
                    }
                }
            }
        }
    }
}

/// Builds the base environment every command gets: the minimal base, then `network` (the proxy
/// variables), then the spec's `extra`; a later variable replaces an earlier one of the same name.
pub(crate) fn base_env(
    home: &str,
    network: &[(String, String)],
    extra: &BTreeMap<String, String>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = vec![
        (
            "PATH".to_string(),
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ),
        ("HOME".to_string(), home.to_string()),
        ("LANG".to_string(), "C.UTF-8".to_string()),
        ("TMPDIR".to_string(), "/tmp".to_string()),
    ];
    let later = network
        .iter()
        .cloned()
        .chain(extra.iter().map(|(k, v)| (k.clone(), v.clone())));
    for (key, value) in later {
        match env.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => env.push((key, value)),
        }
    }
    env
}

/// Whether a limits mode is weaker than cgroups (for warnings).
pub(crate) fn limits_warning(mode: LimitsMode) -> Option<String> {
    (mode == LimitsMode::Rlimit).then(|| {
        "limits are rlimits only: memory is capped per process (address space), processes per sandbox user".to_string()
    })
}
