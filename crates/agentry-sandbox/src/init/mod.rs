//! The sandbox's agent: the runtime's executable re-executed in init mode.
//!
//! A binary that can start sandboxes calls [`maybe_run_init`] first thing in `main`. When the
//! process was started as a sandbox agent (its first argument is [`INIT_ARG`]), the call never
//! returns; otherwise it returns at once.
//!
//! Native mode, three processes:
//! - the **keeper** is the process the runtime spawned, already inside the new user, mount, net,
//!   ipc, uts and cgroup namespaces (the runtime unshared them before exec and wrote its uid/gid
//!   maps). It becomes ns-root, forks PID 1 of the new pid namespace, reports its host pid and
//!   waits for it. It dies with the runtime (`PR_SET_PDEATHSIG`), and PID 1 dies with it, which
//!   tears the whole pid namespace down: a runtime crash leaves nothing running.
//! - **PID 1** builds the root ([`rootfs`]), brings loopback up, sets rlimits, drops every
//!   capability, sets `no_new_privs`, starts the proxy bridge when the network is an allow-list
//!   (`bridge`), applies Landlock and seccomp to itself ([`confine`]), then serves requests on
//!   the socket.
//! - one **exec reaper** per command: a child of PID 1 and a subreaper, so everything the command
//!   starts (double-forked daemons included) stays its descendant; it reports the command's exit
//!   and lives until the last descendant is gone. Killing a command kills that whole tree.
//!
//! Local mode: the spawned process serves directly, with rlimits only.

mod bridge;
mod confine;
mod rootfs;

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use crate::protocol::{
    InitConfig, InitMode, MAX_MESSAGE, Message, Op, RemoteError, ReplyBody, Request, Rlimits,
    kind_of, recv_json, send_json,
};
use crate::report::{DirEntry, FileStat, InitReport};

/// The first argument that starts an executable as a sandbox agent.
pub const INIT_ARG: &str = "__agentry-sandbox-init";
/// The descriptor the control socket is inherited on.
pub(crate) const SOCKET_FD: RawFd = 3;

/// Runs the sandbox agent and exits if this process was started as one; returns otherwise.
/// Call it first thing in `main`, before any thread is started.
pub fn maybe_run_init() {
    let mut args = std::env::args_os();
    let _ = args.next();
    if args.next().as_deref() != Some(OsStr::new(INIT_ARG)) {
        return;
    }
    let code = run();
    std::process::exit(code);
}

fn run() -> i32 {
    sys_close_others();
    // SAFETY: the runtime passed the socket on this descriptor, and nothing else in this fresh
    // process owns it.
    let sock = unsafe { OwnedFd::from_raw_fd(SOCKET_FD) };
    let _ = nix::fcntl::fcntl(
        &sock,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    let mut buf = vec![0u8; MAX_MESSAGE];
    let (cfg, fds) = match recv_json::<InitConfig>(&sock, &mut buf) {
        Ok(Some(v)) => v,
        _ => return 1,
    };
    let mut fds = fds.into_iter();
    let Some(workspace) = fds.next() else {
        fail(&sock, "no workspace descriptor".into());
        return 1;
    };
    let proxy_dir = fds.next();
    if cfg.proxy_dir.is_some() != proxy_dir.is_some()
        || (cfg.mode == InitMode::Local && proxy_dir.is_some())
    {
        fail(&sock, "bad proxy folder descriptor".into());
        return 1;
    }
    match cfg.mode {
        InitMode::Local => {
            if let Err(e) = local_setup(&cfg) {
                fail(&sock, e);
                return 1;
            }
            drop(workspace);
            let _ = send_json(
                sock.as_raw_fd(),
                &Message::Ready {
                    report: local_report(),
                },
                &[],
            );
            serve(sock, &cfg)
        }
        InitMode::Native => keeper(sock, cfg, workspace, proxy_dir),
    }
}

fn sys_close_others() {
    crate::sys::close_from(SOCKET_FD as u32 + 1);
}

fn fail(sock: &OwnedFd, error: String) {
    let _ = send_json(sock.as_raw_fd(), &Message::SetupFailed { error }, &[]);
}

fn local_report() -> InitReport {
    InitReport {
        namespaces: Vec::new(),
        landlock: "not_enforced".into(),
        seccomp: false,
        no_new_privs: false,
        capabilities_dropped: false,
        network_off: false,
        network: "host".into(),
        proxy_bridge: None,
    }
}

fn set_pdeathsig() -> Result<(), String> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_PDEATHSIG: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The agent's own rlimits (inherited by everything): no core dumps, open files.
fn apply_rlimits(cfg: &InitConfig) -> Result<(), String> {
    use crate::sys::set_rlimit;
    let e = |what: &str, e: std::io::Error| format!("setrlimit {what}: {e}");
    set_rlimit(libc::RLIMIT_CORE, 0).map_err(|x| e("core", x))?;
    if let Some(v) = cfg.rlimits.nofile {
        set_rlimit(libc::RLIMIT_NOFILE, v).map_err(|x| e("nofile", x))?;
    }
    Ok(())
}

/// Each command's rlimits: file size, CPU time (SIGXCPU at the limit, SIGKILL a second later),
/// address space (rlimit-only mode).
fn apply_command_rlimits(r: &Rlimits) {
    use crate::sys::set_rlimit;
    if let Some(v) = r.fsize {
        let _ = set_rlimit(libc::RLIMIT_FSIZE, v);
    }
    if let Some(v) = r.cpu_seconds {
        let lim = libc::rlimit {
            rlim_cur: v,
            rlim_max: v.saturating_add(1),
        };
        // SAFETY: setrlimit reads the struct we pass by reference.
        unsafe { libc::setrlimit(libc::RLIMIT_CPU, &lim) };
    }
    if let Some(v) = r.address_space {
        let _ = set_rlimit(libc::RLIMIT_AS, v);
    }
}

fn local_setup(cfg: &InitConfig) -> Result<(), String> {
    set_pdeathsig()?;
    if nix::unistd::getppid().as_raw() != cfg.runtime_pid {
        return Err("the runtime is gone".into());
    }
    apply_rlimits(cfg)
}

/// The keeper: inside the new namespaces (not the pid one: its first child is PID 1 there).
fn keeper(sock: OwnedFd, cfg: InitConfig, workspace: OwnedFd, proxy_dir: Option<OwnedFd>) -> i32 {
    // SAFETY: unshare with integer flags; this process is single-threaded, as a new user
    // namespace requires.
    if unsafe { libc::unshare(crate::sys::NAMESPACE_FLAGS) } != 0 {
        fail(
            &sock,
            format!("unshare: {}", std::io::Error::last_os_error()),
        );
        return 1;
    }
    // A bind mount's source must belong to our mount namespace: reopen the workspace here, and
    // check it is the folder the runtime opened (the path could have been swapped meanwhile).
    // Still host uid here (before the maps), so the path is as reachable as for the runtime.
    let workspace = match reopen_dir("workspace", &cfg.workspace, &workspace) {
        Ok(fd) => fd,
        Err(e) => {
            fail(&sock, e);
            return 1;
        }
    };
    let proxy_dir = match (&cfg.proxy_dir, &proxy_dir) {
        (Some(path), Some(fd)) => match reopen_dir("proxy folder", path, fd) {
            Ok(fd) => Some(fd),
            Err(e) => {
                fail(&sock, e);
                return 1;
            }
        },
        _ => None,
    };
    if send_json(sock.as_raw_fd(), &Message::Unshared, &[]).is_err() {
        return 1;
    }
    let mut buf = [0u8; 64];
    match crate::protocol::recv_raw(
        sock.as_raw_fd(),
        &mut buf,
        nix::sys::socket::MsgFlags::empty(),
    ) {
        Ok(Some(_)) => {}
        _ => return 1,
    }
    // Become ns-root: the runtime mapped ns uid/gid 0 to the sandbox's outer ids.
    if let Err(e) = nix::unistd::setresgid(0.into(), 0.into(), 0.into())
        .and_then(|()| nix::unistd::setresuid(0.into(), 0.into(), 0.into()))
    {
        fail(&sock, format!("become ns-root: {e}"));
        return 1;
    }
    // A credential change clears the parent-death signal: set it again, then make sure the
    // runtime did not die in between.
    if let Err(e) = set_pdeathsig() {
        fail(&sock, e);
        return 1;
    }
    if nix::unistd::getppid().as_raw() != cfg.runtime_pid {
        return 1;
    }
    let (alive_r, alive_w) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => {
            fail(&sock, format!("pipe: {e}"));
            return 1;
        }
    };
    // SAFETY: this process is single-threaded (a fresh exec that started no thread), so the
    // child may run arbitrary code after fork.
    match unsafe { fork() } {
        Err(e) => {
            fail(&sock, format!("fork PID 1: {e}"));
            1
        }
        Ok(ForkResult::Child) => {
            drop(alive_w);
            if let Err(e) = set_pdeathsig() {
                fail(&sock, e);
                return 1;
            }
            // The keeper may have died before PR_SET_PDEATHSIG: then the pipe is hung up.
            let mut fds = [PollFd::new(alive_r.as_fd(), PollFlags::POLLIN)];
            if poll(&mut fds, PollTimeout::ZERO)
                .map(|n| n > 0)
                .unwrap_or(true)
            {
                return 1;
            }
            drop(alive_r);
            pid1(sock, cfg, workspace, proxy_dir)
        }
        Ok(ForkResult::Parent { child }) => {
            drop(alive_r);
            drop(workspace);
            drop(proxy_dir);
            let _ = send_json(
                sock.as_raw_fd(),
                &Message::Keeper {
                    pid: child.as_raw(),
                },
                &[],
            );
            drop(sock);
            loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => return code,
                    Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
                    Ok(_) => continue,
                    Err(nix::errno::Errno::EINTR) => continue,
                    Err(_) => return 1,
                }
            }
        }
    }
}

/// Opens a folder the runtime passed again, from our own mount namespace, and checks it is the
/// same one (the path could have been swapped meanwhile).
fn reopen_dir(what: &str, path: &Path, host: &OwnedFd) -> Result<OwnedFd, String> {
    use nix::fcntl::{OFlag, open};
    use nix::sys::stat::{Mode, fstat};
    let fd = open(
        path,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::empty(),
    )
    .map_err(|e| format!("open {what} {}: {e}", path.display()))?;
    let (a, b) = (
        fstat(&fd).map_err(|e| format!("stat {what}: {e}"))?,
        fstat(host).map_err(|e| format!("stat {what}: {e}"))?,
    );
    if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino) {
        return Err(format!(
            "{what} {} changed while the sandbox started",
            path.display()
        ));
    }
    Ok(fd)
}

/// PID 1: build, confine, serve.
fn pid1(sock: OwnedFd, cfg: InitConfig, workspace: OwnedFd, proxy_dir: Option<OwnedFd>) -> i32 {
    match setup_native(&cfg, workspace, proxy_dir) {
        Ok(report) => {
            if send_json(sock.as_raw_fd(), &Message::Ready { report }, &[]).is_err() {
                return 1;
            }
            serve(sock, &cfg)
        }
        Err(e) => {
            fail(&sock, e);
            1
        }
    }
}

fn setup_native(
    cfg: &InitConfig,
    workspace: OwnedFd,
    proxy_dir: Option<OwnedFd>,
) -> Result<InitReport, String> {
    nix::unistd::sethostname(&cfg.hostname).map_err(|e| format!("sethostname: {e}"))?;
    rootfs::build(cfg, &workspace, proxy_dir.as_ref())?;
    drop(workspace);
    let proxied = proxy_dir.is_some();
    drop(proxy_dir);
    crate::sys::loopback_up().map_err(|e| format!("loopback up: {e}"))?;
    let bridge = if proxied { Some(bridge::bind()?) } else { None };
    apply_rlimits(cfg)?;
    crate::sys::drop_all_capabilities().map_err(|e| format!("drop capabilities: {e}"))?;
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
    }
    // Not dumpable: commands cannot read PID 1's memory or descriptors through /proc.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // Before PID 1's own Landlock domain exists: the bridge gets a domain of its own, out of
    // reach of the commands' signals.
    if let Some(listener) = bridge {
        bridge::spawn(listener)?;
    }
    let ws = cfg.workspace_mount.as_str();
    let landlock = confine::landlock(&[ws, "/tmp", "/dev"])?;
    confine::seccomp()?;
    Ok(InitReport {
        namespaces: crate::sys::NAMESPACE_NAMES
            .iter()
            .map(|s| s.to_string())
            .collect(),
        landlock,
        seccomp: true,
        no_new_privs: true,
        capabilities_dropped: true,
        network_off: !proxied,
        network: if proxied { "allow_list" } else { "off" }.into(),
        proxy_bridge: proxied.then(|| crate::proxy::BRIDGE_ADDR.to_string()),
    })
}

/// Where relative paths and commands start.
fn base_dir(cfg: &InitConfig) -> PathBuf {
    match cfg.mode {
        InitMode::Native => PathBuf::from(&cfg.workspace_mount),
        InitMode::Local => cfg.workspace.clone(),
    }
}

fn resolve(cfg: &InitConfig, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base_dir(cfg).join(p)
    }
}

fn remote(what: &str, path: &str, e: std::io::Error) -> RemoteError {
    RemoteError {
        errno: e.raw_os_error(),
        message: format!("{what} {path}: {e}"),
    }
}

/// The request loop of PID 1 (or of the local agent).
fn serve(sock: OwnedFd, cfg: &InitConfig) -> i32 {
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGCHLD);
    if sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None).is_err() {
        return 1;
    }
    let Ok(sigfd) = SignalFd::with_flags(&mask, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
    else {
        return 1;
    };
    let mut execs: HashMap<u64, Pid> = HashMap::new();
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let (sock_ready, sig_ready) = {
            let mut fds = [
                PollFd::new(sock.as_fd(), PollFlags::POLLIN),
                PollFd::new(sigfd.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => return 1,
            }
            let ready = |f: &PollFd<'_>| f.revents().is_some_and(|r| !r.is_empty());
            (ready(&fds[0]), ready(&fds[1]))
        };
        if sig_ready {
            while let Ok(Some(_)) = sigfd.read_signal() {}
            reap(&sock, &mut execs);
        }
        if !sock_ready {
            continue;
        }
        let (req, fds) = match recv_json::<Request>(&sock, &mut buf) {
            Ok(Some(v)) => v,
            // The runtime is gone or closed us: stop everything.
            _ => {
                shutdown(&execs);
                return 0;
            }
        };
        if matches!(req.op, Op::Shutdown) {
            shutdown(&execs);
            let _ = send_json(
                sock.as_raw_fd(),
                &Message::Reply {
                    id: req.id,
                    result: Ok(ReplyBody::Done),
                },
                &[],
            );
            return 0;
        }
        let (result, reply_fd) = handle(&sock, cfg, &mut execs, req.op, fds);
        let raw: Vec<RawFd> = reply_fd.iter().map(|f| f.as_raw_fd()).collect();
        if send_json(
            sock.as_raw_fd(),
            &Message::Reply { id: req.id, result },
            &raw,
        )
        .is_err()
        {
            shutdown(&execs);
            return 1;
        }
    }
}

fn reap(sock: &OwnedFd, execs: &mut HashMap<u64, Pid>) {
    loop {
        match waitpid(None::<Pid>, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(status) => {
                let Some(pid) = status.pid() else { continue };
                let done: Vec<u64> = execs
                    .iter()
                    .filter(|(_, p)| **p == pid)
                    .map(|(e, _)| *e)
                    .collect();
                for exec in done {
                    execs.remove(&exec);
                    let _ = send_json(sock.as_raw_fd(), &Message::Reaped { exec }, &[]);
                }
            }
        }
    }
}

fn shutdown(execs: &HashMap<u64, Pid>) {
    for pid in execs.values() {
        crate::sys::kill_descendants(pid.as_raw());
        let _ = nix::sys::signal::kill(*pid, Signal::SIGKILL);
    }
}

type Handled = (Result<ReplyBody, RemoteError>, Option<OwnedFd>);

fn handle(
    sock: &OwnedFd,
    cfg: &InitConfig,
    execs: &mut HashMap<u64, Pid>,
    op: Op,
    fds: Vec<OwnedFd>,
) -> Handled {
    match op {
        Op::Exec {
            exec,
            argv,
            env,
            cwd,
            stdin,
            tty,
        } => (
            spawn_exec(sock, cfg, execs, exec, argv, env, cwd, stdin, tty, fds),
            None,
        ),
        Op::Kill { exec } => {
            if let Some(pid) = execs.get(&exec) {
                crate::sys::kill_descendants(pid.as_raw());
            }
            (Ok(ReplyBody::Done), None)
        }
        Op::OpenRead { path } => match open_read(cfg, &path) {
            Ok(fd) => (Ok(ReplyBody::Fd), Some(fd)),
            Err(e) => (Err(e), None),
        },
        Op::OpenWrite { path, append, mode } => match open_write(cfg, &path, append, mode) {
            Ok(fd) => (Ok(ReplyBody::Fd), Some(fd)),
            Err(e) => (Err(e), None),
        },
        Op::List { path } => match list(cfg, &path) {
            Ok(fd) => (Ok(ReplyBody::Fd), Some(fd)),
            Err(e) => (Err(e), None),
        },
        Op::Stat { path } => (
            std::fs::symlink_metadata(resolve(cfg, &path))
                .map(|m| ReplyBody::Stat {
                    stat: stat_of(&resolve(cfg, &path), &m),
                })
                .map_err(|e| remote("stat", &path, e)),
            None,
        ),
        Op::Remove { path, recursive } => {
            let p = resolve(cfg, &path);
            let r = match std::fs::symlink_metadata(&p) {
                Ok(m) if m.is_dir() && recursive => std::fs::remove_dir_all(&p),
                Ok(m) if m.is_dir() => std::fs::remove_dir(&p),
                Ok(_) => std::fs::remove_file(&p),
                Err(e) => Err(e),
            };
            (
                r.map(|()| ReplyBody::Done)
                    .map_err(|e| remote("remove", &path, e)),
                None,
            )
        }
        Op::Mkdir { path, parents } => {
            let p = resolve(cfg, &path);
            let r = if parents {
                std::fs::create_dir_all(&p)
            } else {
                std::fs::create_dir(&p)
            };
            (
                r.map(|()| ReplyBody::Done)
                    .map_err(|e| remote("mkdir", &path, e)),
                None,
            )
        }
        Op::Shutdown => (Ok(ReplyBody::Done), None),
    }
}

fn stat_of(path: &Path, m: &std::fs::Metadata) -> FileStat {
    FileStat {
        kind: kind_of(m.mode()),
        size: m.size(),
        mode: m.mode() & 0o7777,
        modified: m.mtime(),
        symlink_target: m
            .file_type()
            .is_symlink()
            .then(|| {
                std::fs::read_link(path)
                    .ok()
                    .map(|t| t.to_string_lossy().into_owned())
            })
            .flatten(),
    }
}

fn check_regular(file: &std::fs::File, path: &str) -> Result<(), RemoteError> {
    let m = file.metadata().map_err(|e| remote("stat", path, e))?;
    if m.is_dir() {
        return Err(RemoteError {
            errno: Some(libc::EISDIR),
            message: format!("{path}: is a directory"),
        });
    }
    if !m.is_file() {
        return Err(RemoteError {
            errno: Some(libc::EINVAL),
            message: format!("{path}: not a regular file"),
        });
    }
    Ok(())
}

fn open_read(cfg: &InitConfig, path: &str) -> Result<OwnedFd, RemoteError> {
    // Non-blocking, so a FIFO cannot hang the agent; anything but a regular file is refused.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(resolve(cfg, path))
        .map_err(|e| remote("open", path, e))?;
    check_regular(&file, path)?;
    Ok(file.into())
}

fn open_write(
    cfg: &InitConfig,
    path: &str,
    append: bool,
    mode: u32,
) -> Result<OwnedFd, RemoteError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .append(append)
        .mode(mode & 0o777)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(resolve(cfg, path))
        .map_err(|e| remote("open", path, e))?;
    check_regular(&file, path)?;
    if !append {
        file.set_len(0).map_err(|e| remote("truncate", path, e))?;
    }
    Ok(file.into())
}

fn list(cfg: &InitConfig, path: &str) -> Result<OwnedFd, RemoteError> {
    let dir = resolve(cfg, path);
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| remote("list", path, e))? {
        let entry = entry.map_err(|e| remote("list", path, e))?;
        let p = entry.path();
        let Ok(m) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        entries.push(DirEntry {
            name: entry.file_name().to_string_lossy().into_owned(),
            stat: stat_of(&p, &m),
        });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    let body = serde_json::to_vec(&entries).map_err(|e| RemoteError {
        errno: None,
        message: format!("list {path}: {e}"),
    })?;
    let memfd = nix::sys::memfd::memfd_create(c"list", nix::sys::memfd::MFdFlags::MFD_CLOEXEC)
        .map_err(|e| remote("memfd", path, e.into()))?;
    let mut file = std::fs::File::from(memfd);
    file.write_all(&body).map_err(|e| remote("list", path, e))?;
    Ok(file.into())
}

/// Finds a program in `PATH` as the command's environment gives it.
fn find_program(name: &str, env: &[(String, String)]) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name));
    }
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.as_str())
        .unwrap_or("/usr/bin:/bin");
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| {
            nix::unistd::access(p.as_path(), nix::unistd::AccessFlags::X_OK).is_ok() && p.is_file()
        })
}

fn cstr(s: &[u8]) -> Result<CString, RemoteError> {
    CString::new(s).map_err(|_| RemoteError {
        errno: Some(libc::EINVAL),
        message: "NUL byte in a string".into(),
    })
}

#[allow(clippy::too_many_arguments)]
fn spawn_exec(
    sock: &OwnedFd,
    cfg: &InitConfig,
    execs: &mut HashMap<u64, Pid>,
    exec: u64,
    argv: Vec<String>,
    env: Vec<(String, String)>,
    cwd: Option<String>,
    stdin: bool,
    tty: bool,
    fds: Vec<OwnedFd>,
) -> Result<ReplyBody, RemoteError> {
    let want = if stdin { 3 } else { 2 };
    if fds.len() != want || argv.is_empty() {
        return Err(RemoteError {
            errno: Some(libc::EINVAL),
            message: "bad exec request".into(),
        });
    }
    let mut all_env = cfg.env.clone();
    for (key, value) in env {
        // A command's variable replaces the base one (a duplicate would be read first-wins by
        // some programs and last-wins by others).
        match all_env.iter_mut().find(|(k, _)| *k == key) {
            Some(slot) => slot.1 = value,
            None => all_env.push((key, value)),
        }
    }
    let program = find_program(&argv[0], &all_env);
    let argv_c = argv
        .iter()
        .map(|a| cstr(a.as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let env_c = all_env
        .iter()
        .map(|(k, v)| cstr(format!("{k}={v}").as_bytes()))
        .collect::<Result<Vec<_>, _>>()?;
    let dir = match cwd {
        Some(c) => resolve(cfg, &c),
        None => base_dir(cfg),
    };
    let dir_c = cstr(dir.as_os_str().as_bytes())?;
    let prog_c = match &program {
        Some(p) => Some(cstr(p.as_os_str().as_bytes())?),
        None => None,
    };
    let local = cfg.mode == InitMode::Local;
    // SAFETY: the agent is single-threaded, so the child may run arbitrary code after fork.
    match unsafe { fork() } {
        Err(e) => Err(RemoteError {
            errno: Some(e as i32),
            message: format!("fork: {e}"),
        }),
        Ok(ForkResult::Parent { child }) => {
            drop(fds);
            execs.insert(exec, child);
            Ok(ReplyBody::Done)
        }
        Ok(ForkResult::Child) => {
            let code = exec_reaper(
                sock,
                exec,
                local,
                tty,
                &cfg.rlimits,
                fds,
                &argv[0],
                prog_c,
                argv_c,
                env_c,
                dir_c,
            );
            // SAFETY: leaving the forked child without running the parent's destructors or atexit.
            unsafe { libc::_exit(code) }
        }
    }
}

/// The per-command reaper: a subreaper that starts the command, reports its exit, and stays
/// until every descendant is gone.
#[allow(clippy::too_many_arguments)]
fn exec_reaper(
    sock: &OwnedFd,
    exec: u64,
    local: bool,
    tty: bool,
    rlimits: &Rlimits,
    fds: Vec<OwnedFd>,
    name: &str,
    prog: Option<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    dir: CString,
) -> i32 {
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if local {
        let _ = set_pdeathsig();
    }
    // SAFETY: this process is a single-threaded fork of the agent.
    let child = match unsafe { fork() } {
        Err(_) => return 1,
        Ok(ForkResult::Child) => {
            apply_command_rlimits(rlimits);
            let code = exec_child(local, tty, &fds, name, prog, argv, env, dir);
            // SAFETY: leaving the forked child after a failed exec.
            unsafe { libc::_exit(code) }
        }
        Ok(ForkResult::Parent { child }) => child,
    };
    drop(fds);
    loop {
        match waitpid(None::<Pid>, None) {
            Ok(status) => {
                if status.pid() == Some(child) {
                    let (code, signal) = match status {
                        WaitStatus::Exited(_, c) => (Some(c), None),
                        WaitStatus::Signaled(_, s, _) => (None, Some(s as i32)),
                        _ => continue,
                    };
                    let _ = send_json(
                        sock.as_raw_fd(),
                        &Message::Exited { exec, code, signal },
                        &[],
                    );
                }
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return 0, // ECHILD: the last descendant is gone
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn exec_child(
    local: bool,
    tty: bool,
    fds: &[OwnedFd],
    name: &str,
    prog: Option<CString>,
    argv: Vec<CString>,
    env: Vec<CString>,
    dir: CString,
) -> i32 {
    let _ = nix::unistd::setsid();
    let (stdin, stdout, stderr) = match fds {
        [i, o, e] => (Some(i.as_raw_fd()), o.as_raw_fd(), e.as_raw_fd()),
        [o, e] => (None, o.as_raw_fd(), e.as_raw_fd()),
        _ => return 126,
    };
    // SAFETY: dup2 and open on descriptors this process owns; the sources stay open until exec.
    unsafe {
        match stdin {
            Some(fd) => libc::dup2(fd, 0),
            None => {
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY);
                if null > 0 {
                    libc::dup2(null, 0);
                    libc::close(null);
                }
                0
            }
        };
        libc::dup2(stdout, 1);
        libc::dup2(stderr, 2);
    }
    if tty {
        // SAFETY: an ioctl on this process's own stdin, which is the terminal's slave; after
        // `setsid` above the process leads a session without a terminal, so this gives it one
        // (job control, ^C as SIGINT, SIGWINCH on resize).
        unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) };
    }
    // The agent blocks SIGCHLD and Rust ignores SIGPIPE, and whatever started the server may
    // have ignored more (`nohup` SIGHUP, a shell's background job SIGINT and SIGQUIT; ignored
    // signals outlive exec): commands get a clean slate, as a login shell would give them (else
    // ^C on a terminal interrupts nothing).
    let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None);
    for signal in 1..=libc::SIGRTMAX() {
        // SAFETY: resetting a signal disposition to its default in the forked child before
        // exec; `signal` is async-signal-safe, and one it refuses (SIGKILL, SIGSTOP, glibc's own
        // real-time signals) is left as it is.
        unsafe { libc::signal(signal, libc::SIG_DFL) };
    }
    if local {
        let _ = set_pdeathsig();
    }
    let mut err = std::io::stderr();
    if let Err(e) = nix::unistd::chdir(dir.as_c_str()) {
        let _ = writeln!(err, "agentry-sandbox: cd {}: {e}", dir.to_string_lossy());
        return 127;
    }
    let Some(prog) = prog else {
        let _ = writeln!(err, "agentry-sandbox: {name}: command not found");
        return 127;
    };
    let e = nix::unistd::execve(&prog, &argv, &env).err();
    let _ = writeln!(
        err,
        "agentry-sandbox: {name}: {}",
        e.map(|e| e.desc()).unwrap_or("exec failed")
    );
    match e {
        Some(nix::errno::Errno::ENOENT) => 127,
        _ => 126,
    }
}
