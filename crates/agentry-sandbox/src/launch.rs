//! Starting an agent process. Every spawn happens on one dedicated thread that lives as long as
//! the runtime: `PR_SET_PDEATHSIG` fires when the *thread* that forked a child exits, so spawning
//! from a tokio worker or blocking thread could kill a sandbox when that thread retires.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock, mpsc};

use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use tokio::sync::oneshot;

use crate::error::{Result, SandboxError};
use crate::init::{INIT_ARG, SOCKET_FD};
use crate::protocol::{InitConfig, InitMode, MAX_MESSAGE, Message, recv_raw, send_json, send_raw};

type Job = Box<dyn FnOnce() + Send>;

fn spawner() -> &'static Mutex<mpsc::Sender<Job>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        let spawned = std::thread::Builder::new()
            .name("agentry-sandbox-spawner".into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "could not start the sandbox spawner thread");
        }
        Mutex::new(tx)
    })
}

/// The sandbox agent's argv[0] (what `/proc/1/cmdline` shows inside).
pub(crate) const INIT_ARGV0: &str = "agentry-sandbox";
/// Runs `f` on the spawner thread.
async fn on_spawner<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let (tx, rx) = oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(f());
    });
    spawner()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .send(job)
        .map_err(|_| SandboxError::Setup("the sandbox spawner thread is gone".into()))?;
    rx.await
        .map_err(|_| SandboxError::Setup("the sandbox spawner thread is gone".into()))
}

/// What to start.
pub(crate) struct LaunchParams {
    pub(crate) init_exe: PathBuf,
    pub(crate) mode: InitMode,
    /// `cgroup.procs` files the child writes itself into before anything else.
    pub(crate) cgroup_procs: Vec<PathBuf>,
    /// `RLIMIT_NPROC`, set before the user namespace exists (rlimit-only mode).
    pub(crate) nproc: Option<u64>,
    /// Native: the outer uid/gid that ns-root maps to.
    pub(crate) outer_id: (u32, u32),
    /// The agent's configuration, sent first.
    pub(crate) config: InitConfig,
    /// The workspace folder, sent with the configuration.
    pub(crate) workspace: OwnedFd,
    /// The network proxy's socket folder (allow-list network), sent after the workspace.
    pub(crate) proxy_dir: Option<OwnedFd>,
}

/// A started agent: the process the runtime spawned (the keeper, or the local agent) and the
/// runtime's end of the socket.
pub(crate) struct Launched {
    pub(crate) child: Child,
    pub(crate) sock: OwnedFd,
}

pub(crate) async fn launch(params: LaunchParams) -> Result<Launched> {
    on_spawner(move || launch_blocking(params)).await?
}

fn cstring(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| SandboxError::InvalidRequest("NUL in a path".into()))
}

fn launch_blocking(params: LaunchParams) -> Result<Launched> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )?;
    let procs = params
        .cgroup_procs
        .iter()
        .map(|p| cstring(p))
        .collect::<Result<Vec<_>>>()?;
    let native = params.mode == InitMode::Native;
    let root = nix::unistd::geteuid().is_root();
    let runtime_pid = nix::unistd::getpid().as_raw();
    let nproc = params.nproc;
    let their_fd = theirs.as_raw_fd();
    let mut cmd = Command::new(&params.init_exe);
    // A neutral argv[0]: the sandbox can read its PID 1's /proc/1/cmdline, which would otherwise
    // show the host path of the binary.
    cmd.arg0(INIT_ARGV0)
        .arg(INIT_ARG)
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: the closure runs in the forked child before exec and makes only async-signal-safe
    // raw syscalls (prctl, getppid, setgroups, open, write, close, setrlimit, unshare, dup2,
    // fcntl) on values prepared before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            let last = std::io::Error::last_os_error;
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(last());
            }
            if libc::getppid() != runtime_pid {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            // Drop supplementary groups before the user namespace (and setgroups=deny) exists,
            // or gid 0 would stay in the list.
            if native && root && libc::setgroups(0, std::ptr::null()) != 0 {
                return Err(last());
            }
            for p in &procs {
                let fd = libc::open(p.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(last());
                }
                let ok = libc::write(fd, b"0".as_ptr().cast(), 1) == 1;
                libc::close(fd);
                if !ok {
                    return Err(last());
                }
            }
            if let Some(n) = nproc {
                let lim = libc::rlimit {
                    rlim_cur: n,
                    rlim_max: n,
                };
                if libc::setrlimit(libc::RLIMIT_NPROC, &lim) != 0 {
                    return Err(last());
                }
            }
            if their_fd == SOCKET_FD {
                if libc::fcntl(SOCKET_FD, libc::F_SETFD, 0) != 0 {
                    return Err(last());
                }
            } else if libc::dup2(their_fd, SOCKET_FD) < 0 {
                return Err(last());
            }
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .map_err(|e| SandboxError::Setup(format!("start {}: {e}", params.init_exe.display())))?;
    drop(theirs);
    let mut child = child;
    let handshake = (|| -> Result<()> {
        let mut fds = vec![params.workspace.as_raw_fd()];
        fds.extend(params.proxy_dir.as_ref().map(|d| d.as_raw_fd()));
        send_json(ours.as_raw_fd(), &params.config, &fds)?;
        if native {
            // The keeper unshares its namespaces itself (a process keeps its capabilities in a
            // new user namespace only until it execs), then waits for its maps.
            match recv_blocking(&ours)? {
                Message::Unshared => {}
                Message::SetupFailed { error } => return Err(SandboxError::Setup(error)),
                other => return Err(SandboxError::Setup(format!("unexpected message {other:?}"))),
            }
            write_id_maps(child.id(), root, params.outer_id)
                .map_err(|e| SandboxError::Setup(format!("write uid/gid maps: {e}")))?;
            send_raw(ours.as_raw_fd(), b"\"go\"", &[])?;
        }
        Ok(())
    })();
    if let Err(e) = handshake {
        let _ = child.kill();
        let _ = child.wait();
        return Err(e);
    }
    Ok(Launched { child, sock: ours })
}

/// Waits (10 s at most) for one message from a freshly started agent.
fn recv_blocking(sock: &OwnedFd) -> Result<Message> {
    use std::os::fd::AsFd;
    let mut fds = [nix::poll::PollFd::new(
        sock.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(10_000u16))? == 0 {
        return Err(SandboxError::Setup(
            "the sandbox's agent did not answer".into(),
        ));
    }
    let mut buf = vec![0u8; MAX_MESSAGE];
    match recv_raw(
        sock.as_raw_fd(),
        &mut buf,
        nix::sys::socket::MsgFlags::MSG_DONTWAIT,
    )? {
        Some((n, _)) => serde_json::from_slice(&buf[..n])
            .map_err(|e| SandboxError::Setup(format!("malformed message from the agent: {e}"))),
        None => Err(SandboxError::Setup(
            "the sandbox's agent exited during setup".into(),
        )),
    }
}

/// Maps ns-root to the sandbox's outer ids: an unprivileged uid of its own when the runtime is
/// root (never root itself), else the runtime's own uid.
fn write_id_maps(pid: u32, root: bool, (uid, gid): (u32, u32)) -> std::io::Result<()> {
    let base = PathBuf::from(format!("/proc/{pid}"));
    if root && (uid == 0 || gid == 0) {
        return Err(std::io::Error::other("refusing to map a sandbox to root"));
    }
    std::fs::write(base.join("setgroups"), "deny")?;
    std::fs::write(base.join("uid_map"), format!("0 {uid} 1\n"))?;
    std::fs::write(base.join("gid_map"), format!("0 {gid} 1\n"))?;
    Ok(())
}

/// Outer-uid slots of the sandboxes alive in this process.
pub(crate) struct Slots;

static SLOTS: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

impl Slots {
    /// Takes the lowest free slot below `max`.
    pub(crate) fn take(max: u32) -> Option<u32> {
        let mut used = SLOTS.lock().unwrap_or_else(|p| p.into_inner());
        let slot = (0..max).find(|s| !used.contains(s))?;
        used.insert(slot);
        Some(slot)
    }

    /// Gives a slot back.
    pub(crate) fn release(slot: u32) {
        SLOTS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&slot);
    }
}
