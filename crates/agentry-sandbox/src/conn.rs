//! The runtime's end of the agent socket: requests with replies, command exits, and the end of
//! the connection (the agent died or was killed).

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use nix::sys::socket::MsgFlags;
use tokio::io::unix::AsyncFd;
use tokio::sync::{oneshot, watch};

use crate::error::{Result, SandboxError};
use crate::protocol::{
    MAX_MESSAGE, Message, Op, RemoteError, ReplyBody, Request, recv_raw, send_raw,
};
use crate::report::InitReport;

/// A command's first process ended: exit code or signal.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RawExit {
    pub(crate) code: Option<i32>,
    pub(crate) signal: Option<i32>,
}

/// Fires with the agent's report once it serves, or its setup error.
pub(crate) type ReadyRx = oneshot::Receiver<std::result::Result<InitReport, String>>;

type Reply = (std::result::Result<ReplyBody, RemoteError>, Vec<OwnedFd>);

#[derive(Default)]
struct Tables {
    pending: HashMap<u64, oneshot::Sender<Reply>>,
    exits: HashMap<u64, oneshot::Sender<RawExit>>,
    ready: Option<oneshot::Sender<std::result::Result<InitReport, String>>>,
    keeper_child: Option<i32>,
    closed: Option<String>,
}

/// The connection.
pub(crate) struct Conn {
    sock: AsyncFd<OwnedFd>,
    next_id: AtomicU64,
    tables: Mutex<Tables>,
    closed_tx: watch::Sender<bool>,
}

fn lock(m: &Mutex<Tables>) -> MutexGuard<'_, Tables> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Conn {
    /// Wraps a connected socket and starts its reader; `ready` fires with the agent's report.
    pub(crate) fn start(sock: OwnedFd) -> Result<(Arc<Conn>, ReadyRx)> {
        nix::fcntl::fcntl(
            &sock,
            nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
        )?;
        let (ready_tx, ready_rx) = oneshot::channel();
        let (closed_tx, _) = watch::channel(false);
        let conn = Arc::new(Conn {
            // SAFETY: an OwnedFd returns the same open descriptor from as_raw_fd for its whole
            // life, and the AsyncFd owns it.
            sock: unsafe { AsyncFd::register(sock) }.map_err(std::io::Error::from)?,
            next_id: AtomicU64::new(1),
            tables: Mutex::new(Tables {
                ready: Some(ready_tx),
                ..Tables::default()
            }),
            closed_tx,
        });
        tokio::spawn(reader(conn.clone()));
        Ok((conn, ready_rx))
    }

    /// The host pid of PID 1 (native), as the keeper reported it.
    pub(crate) fn pid1(&self) -> Option<i32> {
        lock(&self.tables).keeper_child
    }

    /// Why the connection ended, once it has.
    pub(crate) fn closed_reason(&self) -> Option<String> {
        lock(&self.tables).closed.clone()
    }

    /// Records why the sandbox is closing (the first reason wins).
    pub(crate) fn set_reason(&self, reason: &str) {
        let mut t = lock(&self.tables);
        if t.closed.is_none() {
            t.closed = Some(reason.to_string());
        }
    }

    /// A receiver that turns `true` when the connection ends.
    pub(crate) fn closed_watch(&self) -> watch::Receiver<bool> {
        self.closed_tx.subscribe()
    }

    fn closed_error(&self) -> SandboxError {
        SandboxError::Closed {
            reason: self
                .closed_reason()
                .unwrap_or_else(|| "the sandbox's agent exited".into()),
        }
    }

    /// Registers interest in a command's exit before it is started.
    pub(crate) fn register_exit(&self, exec: u64) -> oneshot::Receiver<RawExit> {
        let (tx, rx) = oneshot::channel();
        lock(&self.tables).exits.insert(exec, tx);
        rx
    }

    /// Forgets a command's exit (the start failed).
    pub(crate) fn forget_exit(&self, exec: u64) {
        lock(&self.tables).exits.remove(&exec);
    }

    /// A fresh id for a request or a command.
    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Sends a request (with descriptors) and waits for its reply.
    pub(crate) async fn request(&self, op: Op, fds: &[RawFd]) -> Result<(ReplyBody, Vec<OwnedFd>)> {
        let id = self.next_id();
        let body = serde_json::to_vec(&Request { id, op })
            .map_err(|e| SandboxError::InvalidRequest(e.to_string()))?;
        if body.len() > MAX_MESSAGE {
            return Err(SandboxError::InvalidRequest(format!(
                "request of {} bytes is over the {MAX_MESSAGE}-byte limit (pass large input on stdin)",
                body.len()
            )));
        }
        let (tx, rx) = oneshot::channel();
        {
            let mut t = lock(&self.tables);
            if t.closed.is_some() {
                drop(t);
                return Err(self.closed_error());
            }
            t.pending.insert(id, tx);
        }
        loop {
            let mut guard = match self.sock.writable().await {
                Ok(g) => g,
                Err(e) => {
                    lock(&self.tables).pending.remove(&id);
                    return Err(e.into());
                }
            };
            match guard.try_io(|inner| {
                send_raw(inner.as_raw_fd(), &body, fds).map_err(std::io::Error::from)
            }) {
                Ok(Ok(())) => break,
                Ok(Err(_)) => {
                    lock(&self.tables).pending.remove(&id);
                    return Err(self.closed_error());
                }
                Err(_would_block) => continue,
            }
        }
        match rx.await {
            Ok((Ok(body), fds)) => Ok((body, fds)),
            Ok((Err(e), _)) => Err(SandboxError::Remote {
                errno: e.errno,
                message: e.message,
            }),
            Err(_) => Err(self.closed_error()),
        }
    }

    fn dispatch(&self, msg: Message, fds: Vec<OwnedFd>) {
        let mut t = lock(&self.tables);
        match msg {
            Message::Unshared => {}
            Message::Keeper { pid } => t.keeper_child = Some(pid),
            Message::Ready { report } => {
                if let Some(tx) = t.ready.take() {
                    let _ = tx.send(Ok(report));
                }
            }
            Message::SetupFailed { error } => {
                if let Some(tx) = t.ready.take() {
                    let _ = tx.send(Err(error));
                }
            }
            Message::Reply { id, result } => {
                if let Some(tx) = t.pending.remove(&id) {
                    let _ = tx.send((result, fds));
                }
            }
            Message::Reaped { exec } => {
                // The reaper died before reporting (a command killed it): the status is lost.
                if let Some(tx) = t.exits.remove(&exec) {
                    let _ = tx.send(RawExit {
                        code: None,
                        signal: Some(libc::SIGKILL),
                    });
                }
            }
            Message::Exited { exec, code, signal } => {
                if let Some(tx) = t.exits.remove(&exec) {
                    let _ = tx.send(RawExit { code, signal });
                }
            }
        }
    }

    fn finish(&self) {
        let mut t = lock(&self.tables);
        if t.closed.is_none() {
            t.closed = Some("the sandbox's agent exited".into());
        }
        // Dropping the senders fails every waiter with the reason above.
        t.pending.clear();
        t.exits.clear();
        t.ready = None;
        drop(t);
        self.closed_tx.send_replace(true);
    }
}

async fn reader(conn: Arc<Conn>) {
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        let mut guard = match conn.sock.readable().await {
            Ok(g) => g,
            Err(_) => break,
        };
        let got = guard.try_io(|inner| {
            recv_raw(inner.as_raw_fd(), &mut buf, MsgFlags::MSG_DONTWAIT)
                .map_err(std::io::Error::from)
        });
        match got {
            Err(_would_block) => continue,
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Ok(Err(_)) | Ok(Ok(None)) => break,
            Ok(Ok(Some((n, fds)))) => match serde_json::from_slice::<Message>(&buf[..n]) {
                Ok(msg) => conn.dispatch(msg, fds),
                Err(e) => {
                    tracing::warn!(error = %e, "malformed message from a sandbox agent");
                    conn.set_reason("the sandbox's agent sent a malformed message");
                    break;
                }
            },
        }
    }
    conn.finish();
}
