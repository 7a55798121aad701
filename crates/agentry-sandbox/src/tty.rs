//! Commands on a pseudo-terminal: interactive shells, REPLs and full-screen programs.
//!
//! The host opens the PTY pair; the command's stdin, stdout and stderr are the slave (passed to
//! the sandbox's agent like any descriptor), which becomes its controlling terminal in a new
//! session. The host keeps the master: what the program writes is read from it, keystrokes are
//! written to it, and a resize is `TIOCSWINSZ` on it (the kernel sends the program SIGWINCH).
//!
//! A program can undo a resize without meaning to: GNU readline (bash, Python's REPL) reads the
//! size and writes it back each time it readies the terminal for a prompt, so a resize that lands
//! between the two is lost. A small task therefore checks the size a few times in the second
//! after each resize and sets it again where it differs.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::sync::{mpsc, watch};

use crate::conn::{Conn, RawExit};
use crate::error::{Result, SandboxError};
use crate::exit::ExitStatus;
use crate::protocol::Op;

/// A terminal's size in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TtySize {
    /// Columns.
    pub cols: u16,
    /// Rows.
    pub rows: u16,
}

impl Default for TtySize {
    fn default() -> Self {
        Self { cols: 80, rows: 24 }
    }
}

impl TtySize {
    /// A size with both sides clamped to 1..=1000.
    pub fn clamped(cols: u16, rows: u16) -> Self {
        Self {
            cols: cols.clamp(1, 1000),
            rows: rows.clamp(1, 1000),
        }
    }
}

/// A command running on a pseudo-terminal ([`Sandbox::exec_tty`](crate::Sandbox::exec_tty)).
/// Dropping it does not stop the command; [`TtyProcess::kill`] does.
pub struct TtyProcess {
    exec: u64,
    master: Arc<AsyncFd<OwnedFd>>,
    exit: watch::Receiver<Option<ExitStatus>>,
    control: mpsc::UnboundedSender<()>,
    wanted: watch::Sender<TtySize>,
}

impl std::fmt::Debug for TtyProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtyProcess")
            .field("exec", &self.exec)
            .finish_non_exhaustive()
    }
}

impl TtyProcess {
    /// The command's id in its sandbox.
    pub fn id(&self) -> u64 {
        self.exec
    }

    /// Reads what the program wrote; `Ok(0)` once it (and everything it started holding the
    /// terminal) is gone.
    pub async fn read(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        loop {
            let mut ready = self.master.readable().await?;
            match ready
                .try_io(|fd| nix::unistd::read(fd.get_ref(), buf).map_err(std::io::Error::from))
            {
                Ok(Ok(read)) => return Ok(read),
                // The slave side is closed everywhere: the program is gone.
                Ok(Err(error)) if error.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(error)) => return Err(error),
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes keystrokes (or pasted text) to the program.
    pub async fn write_all(&self, mut bytes: &[u8]) -> std::io::Result<()> {
        while !bytes.is_empty() {
            let mut ready = self.master.writable().await?;
            match ready
                .try_io(|fd| nix::unistd::write(fd.get_ref(), bytes).map_err(std::io::Error::from))
            {
                Ok(Ok(written)) => bytes = &bytes[written..],
                Ok(Err(error)) => return Err(error),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// Changes the terminal's size (the program gets SIGWINCH). For a second after, the size
    /// is checked again and set anew if the program wrote an older one back over it (see the
    /// module's doc).
    pub fn resize(&self, size: TtySize) -> Result<()> {
        set_size(self.master.get_ref(), size)?;
        self.wanted.send_replace(size);
        Ok(())
    }

    /// The terminal's size as the kernel has it now (what the program reads).
    pub fn size(&self) -> Result<TtySize> {
        get_size(self.master.get_ref())
    }

    /// Kills the program and everything it started.
    pub fn kill(&self) {
        let _ = self.control.send(());
    }

    /// How the program ended, once it has.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.exit.borrow().clone()
    }

    /// Waits for the program to end.
    pub async fn wait(&self) -> ExitStatus {
        let mut exit = self.exit.clone();
        match exit.wait_for(Option::is_some).await {
            Ok(status) => status.clone().unwrap_or_else(gone),
            Err(_) => gone(),
        }
    }
}

fn gone() -> ExitStatus {
    ExitStatus {
        code: None,
        signal: Some(libc::SIGKILL),
        timed_out: false,
        killed: false,
        out_of_memory: false,
        sandbox_closed: Some("the sandbox's agent exited".into()),
    }
}

/// When, after a resize, the size is checked again (each delay counted from the check before).
const RESIZE_CHECKS: [Duration; 3] = [
    Duration::from_millis(50),
    Duration::from_millis(200),
    Duration::from_millis(750),
];

/// Keeps the last size asked for: after each resize, checks the terminal's size at
/// [`RESIZE_CHECKS`] and sets it again where it differs. Ends with the [`TtyProcess`] (its
/// sender) or the terminal's descriptor.
async fn keep_size(master: Weak<AsyncFd<OwnedFd>>, mut wanted: watch::Receiver<TtySize>) {
    'resizes: while wanted.changed().await.is_ok() {
        for delay in RESIZE_CHECKS {
            tokio::time::sleep(delay).await;
            if wanted.has_changed().unwrap_or(false) {
                // A newer resize: its own checks start over.
                continue 'resizes;
            }
            let Some(master) = master.upgrade() else {
                return;
            };
            let size = *wanted.borrow();
            if get_size(master.get_ref()).is_ok_and(|now| now != size) {
                let _ = set_size(master.get_ref(), size);
            }
        }
    }
}

fn get_size(master: &OwnedFd) -> Result<TtySize> {
    let mut winsize = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which outlives the call; the
    // descriptor is the terminal's master, owned by the caller.
    let done = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCGWINSZ, &mut winsize) };
    if done < 0 {
        return Err(SandboxError::Io(std::io::Error::last_os_error()));
    }
    Ok(TtySize {
        cols: winsize.ws_col,
        rows: winsize.ws_row,
    })
}

fn set_size(master: &OwnedFd, size: TtySize) -> Result<()> {
    let winsize = libc::winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCSWINSZ reads one `winsize` through the pointer, which outlives the call; the
    // descriptor is the terminal's master, owned by the caller.
    let done = unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &winsize) };
    if done < 0 {
        return Err(SandboxError::Io(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// A pseudo-terminal pair just opened, and the size it was opened with.
pub(crate) struct Pair {
    master: OwnedFd,
    slave: OwnedFd,
    size: TtySize,
}

/// Opens a pseudo-terminal pair of `size`: the master non-blocking and both close-on-exec.
pub(crate) fn open_pair(size: TtySize) -> Result<Pair> {
    let winsize = nix::pty::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pair = nix::pty::openpty(Some(&winsize), None)
        .map_err(|errno| SandboxError::Io(std::io::Error::from(errno)))?;
    for fd in [&pair.master, &pair.slave] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .map_err(|errno| SandboxError::Io(std::io::Error::from(errno)))?;
    }
    let flags = nix::fcntl::fcntl(&pair.master, nix::fcntl::FcntlArg::F_GETFL)
        .map_err(|errno| SandboxError::Io(std::io::Error::from(errno)))?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(&pair.master, nix::fcntl::FcntlArg::F_SETFL(flags))
        .map_err(|errno| SandboxError::Io(std::io::Error::from(errno)))?;
    Ok(Pair {
        master: pair.master,
        slave: pair.slave,
        size,
    })
}

/// Starts `op` (an exec with `tty`) whose three descriptors are the pair's slave; answers the
/// process.
pub(crate) async fn start(
    conn: Arc<Conn>,
    exec: u64,
    op: Op,
    pair: Pair,
    mut exit_rx: tokio::sync::oneshot::Receiver<RawExit>,
    on_exit: Box<dyn FnOnce() + Send>,
) -> Result<TtyProcess> {
    let Pair {
        master,
        slave,
        size,
    } = pair;
    let raw = slave.as_raw_fd();
    if let Err(error) = conn.request(op, &[raw, raw, raw]).await {
        conn.forget_exit(exec);
        return Err(error);
    }
    drop(slave);
    // SAFETY: `master` is an `OwnedFd` moved into the `AsyncFd`: it stays open, and is the
    // same descriptor, until the `AsyncFd` drops it.
    let master =
        unsafe { AsyncFd::register_with_interest(master, Interest::READABLE | Interest::WRITABLE) }
            .map_err(|error| SandboxError::Io(error.into()))?;
    let master = Arc::new(master);
    let (exit_tx, exit) = watch::channel(None);
    let (control, mut control_rx) = mpsc::unbounded_channel();
    let (wanted, wanted_rx) = watch::channel(size);
    tokio::spawn(keep_size(Arc::downgrade(&master), wanted_rx));
    tokio::spawn(async move {
        let mut killed = false;
        let mut listening = true;
        let raw = loop {
            // Once asked, the kill is sent again every half second until the exit comes: one
            // sent before the program was started would find nothing to kill.
            let again = async {
                if killed {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                raw = &mut exit_rx => break raw.ok(),
                asked = control_rx.recv(), if listening => match asked {
                    Some(()) if !killed => {
                        killed = true;
                        let _ = conn.request(Op::Kill { exec }, &[]).await;
                    }
                    Some(()) => {}
                    // Nobody can ask for a kill any more: only the exit is awaited.
                    None => listening = false,
                },
                () = again => {
                    let _ = conn.request(Op::Kill { exec }, &[]).await;
                }
            }
        };
        let status = match raw {
            Some(raw) => ExitStatus {
                code: raw.code,
                signal: raw.signal,
                timed_out: false,
                killed,
                out_of_memory: false,
                sandbox_closed: None,
            },
            None => gone(),
        };
        on_exit();
        let _ = exit_tx.send(Some(status));
    });
    Ok(TtyProcess {
        exec,
        master,
        exit,
        control,
        wanted,
    })
}
