//! The wire protocol between the runtime and the sandbox's agent (its PID 1).
//!
//! Both ends hold one `SOCK_SEQPACKET` unix socket of a socketpair the runtime made before
//! starting the agent: every message is one datagram (JSON), delivered whole and in order, and
//! may carry file descriptors (`SCM_RIGHTS`). Output never crosses this socket: for every exec the
//! runtime makes the pipes, passes the child's ends in, and reads the other ends itself, so output
//! streams straight into tokio. Files are opened by the agent (inside the sandbox's view and
//! policy) and the opened descriptor is passed back for the runtime to read or write.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};
use serde::{Deserialize, Serialize};

use crate::report::{FileKind, FileStat, InitReport};

/// The largest message either side sends or accepts.
pub(crate) const MAX_MESSAGE: usize = 64 * 1024;
/// The most descriptors one message carries.
const MAX_FDS: usize = 4;

/// How the agent sets itself up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum InitMode {
    /// Namespaces, a new root, Landlock, seccomp, capabilities dropped.
    Native,
    /// No isolation: a plain child process of the runtime.
    Local,
}

/// rlimits the agent applies to itself (and so to everything it starts).
/// Applied to each command (not to the long-lived agent, whose CPU time would add up).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct Rlimits {
    pub(crate) nofile: Option<u64>,
    pub(crate) fsize: Option<u64>,
    pub(crate) cpu_seconds: Option<u64>,
    pub(crate) address_space: Option<u64>,
}

/// The first message: everything the agent needs to build the sandbox. The workspace
/// descriptor (opened by the runtime) travels with it, then the proxy folder's, if any.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct InitConfig {
    pub(crate) mode: InitMode,
    /// The runtime's pid, to detect a runtime that died before `PR_SET_PDEATHSIG` held.
    pub(crate) runtime_pid: i32,
    /// Host path of the workspace (local mode: the working directory).
    pub(crate) workspace: PathBuf,
    /// Where the workspace appears inside the sandbox (native mode).
    pub(crate) workspace_mount: String,
    pub(crate) hostname: String,
    /// The base environment of every command.
    pub(crate) env: Vec<(String, String)>,
    pub(crate) rlimits: Rlimits,
    /// Size of the sandbox's `/tmp` in bytes.
    pub(crate) tmp_size: u64,
    /// Extra host paths bound read-only at the same place inside.
    pub(crate) ro_mounts: Vec<PathBuf>,
    /// Hide the host's `/usr/local` behind an empty read-only folder (native).
    #[serde(default)]
    pub(crate) hide_usr_local: bool,
    /// Native, allow-list network: the host folder of the proxy's socket (its descriptor travels
    /// second, after the workspace's). The agent mounts it inside and runs the bridge.
    pub(crate) proxy_dir: Option<PathBuf>,
}

/// A request from the runtime, answered by a [`Message::Reply`] with the same `id`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Request {
    pub(crate) id: u64,
    pub(crate) op: Op,
}

/// What the runtime asks of the agent.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(crate) enum Op {
    /// Start a command. Descriptors: stdin (if `stdin`), stdout, stderr. With `tty` the three
    /// are a pseudo-terminal's slave, which becomes the command's controlling terminal.
    Exec {
        exec: u64,
        argv: Vec<String>,
        env: Vec<(String, String)>,
        cwd: Option<String>,
        stdin: bool,
        #[serde(default)]
        tty: bool,
    },
    /// Kill a command and every process it started, daemons included.
    Kill { exec: u64 },
    /// Open a regular file for reading; the reply carries the descriptor.
    OpenRead { path: String },
    /// Create or truncate (or append to) a regular file; the reply carries the descriptor.
    OpenWrite {
        path: String,
        append: bool,
        mode: u32,
    },
    /// List a directory; the reply carries a memfd holding the JSON entries.
    List { path: String },
    /// `lstat` a path.
    Stat { path: String },
    /// Remove a file, a symlink or an (empty unless `recursive`) directory.
    Remove { path: String, recursive: bool },
    /// Make a directory.
    Mkdir { path: String, parents: bool },
    /// Kill everything and exit.
    Shutdown,
}

/// A successful reply's body.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum ReplyBody {
    Done,
    /// The command started; `pid` is as seen inside the sandbox.
    Started {
        pid: i32,
    },
    /// The descriptor travels with the message.
    Fd,
    Stat {
        stat: FileStat,
    },
}

/// A failed request: the errno (when there is one) and a message.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct RemoteError {
    pub(crate) errno: Option<i32>,
    pub(crate) message: String,
}

/// What the agent sends.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Message {
    /// From the keeper: it made its namespaces and waits for its uid/gid maps (then a "go").
    Unshared,
    /// From the outer keeper process: the host pid of the sandbox's PID 1.
    Keeper { pid: i32 },
    /// The sandbox is built and serving.
    Ready { report: InitReport },
    /// Building the sandbox failed.
    SetupFailed { error: String },
    /// The answer to a request.
    Reply {
        id: u64,
        result: Result<ReplyBody, RemoteError>,
    },
    /// A command's reaper ended (normally after its `Exited`; alone if a command killed it).
    Reaped { exec: u64 },
    /// A command's first process exited (its daemons may live on).
    Exited {
        exec: u64,
        code: Option<i32>,
        signal: Option<i32>,
    },
}

/// Sends one message with descriptors. Blocking or not depends on the socket.
pub(crate) fn send_raw(sock: RawFd, body: &[u8], fds: &[RawFd]) -> nix::Result<()> {
    let iov = [IoSlice::new(body)];
    let cmsg = [ControlMessage::ScmRights(fds)];
    let cmsgs: &[ControlMessage<'_>] = if fds.is_empty() { &[] } else { &cmsg };
    let sent = sendmsg::<()>(sock, &iov, cmsgs, MsgFlags::MSG_NOSIGNAL, None)?;
    if sent != body.len() {
        return Err(nix::errno::Errno::EMSGSIZE);
    }
    Ok(())
}

/// Serialises and sends one value.
pub(crate) fn send_json<T: Serialize>(sock: RawFd, value: &T, fds: &[RawFd]) -> nix::Result<()> {
    let body = serde_json::to_vec(value).map_err(|_| nix::errno::Errno::EINVAL)?;
    if body.len() > MAX_MESSAGE {
        return Err(nix::errno::Errno::EMSGSIZE);
    }
    send_raw(sock, &body, fds)
}

/// Receives one message: `Ok(None)` at end of stream. Received descriptors are close-on-exec.
pub(crate) fn recv_raw(
    sock: RawFd,
    buf: &mut [u8],
    flags: MsgFlags,
) -> nix::Result<Option<(usize, Vec<OwnedFd>)>> {
    let mut cmsg_buf = nix::cmsg_space!([RawFd; MAX_FDS]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<()>(
        sock,
        &mut iov,
        Some(&mut cmsg_buf),
        flags | MsgFlags::MSG_CMSG_CLOEXEC,
    )?;
    let mut fds = Vec::new();
    for cmsg in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            for fd in received {
                // SAFETY: the kernel just installed this descriptor in our table for us; nothing
                // else owns it, so wrapping it transfers ownership exactly once.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    let bytes = msg.bytes;
    if bytes == 0 && fds.is_empty() {
        return Ok(None);
    }
    if msg.flags.contains(MsgFlags::MSG_TRUNC) || msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(nix::errno::Errno::EMSGSIZE);
    }
    Ok(Some((bytes, fds)))
}

/// Blocking receive of one JSON message (the agent's side).
pub(crate) fn recv_json<T: for<'de> Deserialize<'de>>(
    sock: &OwnedFd,
    buf: &mut [u8],
) -> nix::Result<Option<(T, Vec<OwnedFd>)>> {
    loop {
        match recv_raw(sock.as_raw_fd(), buf, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(None) => return Ok(None),
            Ok(Some((n, fds))) => {
                let value =
                    serde_json::from_slice(&buf[..n]).map_err(|_| nix::errno::Errno::EBADMSG)?;
                return Ok(Some((value, fds)));
            }
        }
    }
}

/// `FileKind` from a mode.
pub(crate) fn kind_of(mode: u32) -> FileKind {
    match mode & libc::S_IFMT {
        libc::S_IFREG => FileKind::File,
        libc::S_IFDIR => FileKind::Dir,
        libc::S_IFLNK => FileKind::Symlink,
        _ => FileKind::Other,
    }
}
