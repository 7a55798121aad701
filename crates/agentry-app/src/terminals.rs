//! Real terminals: PTY-backed shells in a session's sandbox, several per session, that people
//! attach to (the console's terminal panel, over a WebSocket) and re-attach to after a dropped
//! connection without losing what was shown.
//!
//! A [`Terminal`] keeps the last [`SCROLLBACK_BYTES`] of output; an attachment gets that first,
//! then every later chunk, with none lost or repeated in between (the two are taken under one
//! lock). A terminal lives until its shell exits, it is deleted, or it has had no attachment
//! and no input for [`IDLE_TIMEOUT`]; the sandbox stays up while it does.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentry_sandbox::{ExecRequest, ExitStatus, TtyProcess, TtySize};
use agentry_types::SessionId;
use bytes::Bytes;
use serde::Serialize;
use tokio::sync::{broadcast, watch};
use utoipa::ToSchema;

use crate::App;
use crate::auth::Principal;
use crate::error::{AppError, Failure};

/// How much output a terminal keeps for a new attachment.
pub const SCROLLBACK_BYTES: usize = 256 * 1024;
/// The most terminals one session may have open.
pub const MAX_PER_SESSION: usize = 8;
/// The most terminals open on the server.
pub const MAX_TERMINALS: usize = 64;
/// A terminal with no attachment and no input for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60 * 60);

/// What a terminal is, for listings.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TerminalInfo {
    /// Its id (`term_…`).
    pub terminal_id: String,
    /// The session whose sandbox it runs in.
    #[schema(value_type = String)]
    pub session_id: SessionId,
    /// The program it runs.
    pub command: Vec<String>,
    /// When it was opened (Unix ms).
    pub created_at: u64,
    /// Its size.
    pub cols: u16,
    /// Its size.
    pub rows: u16,
    /// Attachments right now.
    pub clients: usize,
    /// Whether its program still runs.
    pub alive: bool,
    /// The program's exit code, once it exited.
    pub exit_code: Option<i32>,
}

/// One terminal.
pub struct Terminal {
    id: String,
    session: SessionId,
    command: Vec<String>,
    created_at: u64,
    process: TtyProcess,
    size: Mutex<TtySize>,
    /// The last output, and the live feed; the feed is `None` once the program ended.
    output: Mutex<Output>,
    clients: AtomicUsize,
    last_used: Mutex<Instant>,
    ended: watch::Receiver<Option<ExitStatus>>,
}

struct Output {
    scrollback: VecDeque<u8>,
    feed: Option<broadcast::Sender<Bytes>>,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("id", &self.id)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// An attachment to a terminal: what it showed so far, then its output as it comes. Dropping
/// it detaches (the terminal goes on).
#[derive(Debug)]
pub struct Attachment {
    /// The terminal.
    pub terminal: Arc<Terminal>,
    /// The output kept so far.
    pub scrollback: Bytes,
    /// Later output; closed when the program ended.
    pub output: broadcast::Receiver<Bytes>,
}

impl Drop for Attachment {
    fn drop(&mut self) {
        self.terminal.clients.fetch_sub(1, Ordering::SeqCst);
        self.terminal.touch();
    }
}

impl Terminal {
    /// Its id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session it belongs to.
    pub fn session(&self) -> SessionId {
        self.session
    }

    fn touch(&self) {
        *locked(&self.last_used) = Instant::now();
    }

    /// What it is now.
    pub fn info(&self) -> TerminalInfo {
        let size = *locked(&self.size);
        let ended = self.ended.borrow().clone();
        TerminalInfo {
            terminal_id: self.id.clone(),
            session_id: self.session,
            command: self.command.clone(),
            created_at: self.created_at,
            cols: size.cols,
            rows: size.rows,
            clients: self.clients.load(Ordering::SeqCst),
            alive: ended.is_none(),
            exit_code: ended.and_then(|status| status.code),
        }
    }

    /// Sends keystrokes (or pasted text) to the program.
    pub async fn input(&self, bytes: &[u8]) -> Result<(), AppError> {
        self.touch();
        self.process
            .write_all(bytes)
            .await
            .map_err(|error| AppError::conflict(format!("the terminal has ended: {error}")))
    }

    /// Changes its size (clamped to 1..=1000 each way).
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), AppError> {
        let size = TtySize::clamped(cols, rows);
        self.process
            .resize(size)
            .map_err(|error| AppError::internal(format!("resizing the terminal: {error}")))?;
        *locked(&self.size) = size;
        Ok(())
    }

    /// How its program ended, once it has.
    pub fn exit_status(&self) -> Option<ExitStatus> {
        self.ended.borrow().clone()
    }

    /// Waits for its program to end.
    pub async fn ended(&self) -> Option<ExitStatus> {
        let mut ended = self.ended.clone();
        ended
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|status| status.clone())
    }

    /// Attaches: the scrollback and the live output, neither losing nor repeating a byte.
    pub fn attach(self: &Arc<Self>) -> Attachment {
        let output = locked(&self.output);
        let receiver = match &output.feed {
            Some(feed) => feed.subscribe(),
            None => {
                // Ended: a closed feed.
                let (closed, receiver) = broadcast::channel(1);
                drop(closed);
                receiver
            }
        };
        let (front, back) = output.scrollback.as_slices();
        let scrollback = Bytes::from([front, back].concat());
        drop(output);
        self.clients.fetch_add(1, Ordering::SeqCst);
        self.touch();
        Attachment {
            terminal: Arc::clone(self),
            scrollback,
            output: receiver,
        }
    }

    /// Reads the program's output into the scrollback and the feed until it ends.
    async fn pump(self: Arc<Self>, ended: watch::Sender<Option<ExitStatus>>) {
        let mut buffer = vec![0u8; 16 * 1024];
        loop {
            let read = match self.process.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            let chunk = Bytes::copy_from_slice(&buffer[..read]);
            let mut output = locked(&self.output);
            output.scrollback.extend(chunk.iter());
            let excess = output.scrollback.len().saturating_sub(SCROLLBACK_BYTES);
            output.scrollback.drain(..excess);
            if let Some(feed) = &output.feed {
                let _ = feed.send(chunk);
            }
        }
        let status = self.process.wait().await;
        locked(&self.output).feed = None;
        let _ = ended.send(Some(status));
    }
}

/// The open terminals.
#[derive(Debug, Clone, Default)]
pub struct Terminals {
    open: Arc<Mutex<HashMap<String, Arc<Terminal>>>>,
}

impl Terminals {
    fn get(&self, id: &str) -> Option<Arc<Terminal>> {
        locked(&self.open).get(id).cloned()
    }

    /// Closes terminals idle too long and forgets ended ones nobody watches.
    fn sweep(&self) {
        let mut open = locked(&self.open);
        open.retain(|_, terminal| {
            let watched = terminal.clients.load(Ordering::SeqCst) > 0;
            let idle = locked(&terminal.last_used).elapsed() >= IDLE_TIMEOUT;
            if terminal.exit_status().is_some() {
                return watched;
            }
            if idle && !watched {
                terminal.process.kill();
                return false;
            }
            true
        });
    }

    /// Kills every terminal (shutdown).
    pub fn close_all(&self) {
        for (_, terminal) in locked(&self.open).drain() {
            terminal.process.kill();
        }
    }
}

fn new_id() -> String {
    let mut bytes = [0u8; 12];
    // An id only needs to be unguessable enough not to collide; a failing RNG is unheard of.
    let _ = getrandom::fill(&mut bytes);
    let mut id = String::from("term_");
    for byte in bytes {
        id.push_str(&format!("{byte:02x}"));
    }
    id
}

impl App {
    /// Opens a terminal in `session`'s sandbox running `command` (default: an interactive
    /// `bash -l`), of `cols`×`rows` (default 80×24).
    pub async fn open_terminal(
        &self,
        caller: &Principal,
        session: &str,
        cols: Option<u16>,
        rows: Option<u16>,
        command: Option<Vec<String>>,
    ) -> Result<Arc<Terminal>, AppError> {
        let session = self.session_record(session).await?.id;
        self.check_session_access(caller, session).await?;
        let command = command.unwrap_or_else(|| vec!["/bin/bash".into(), "-l".into()]);
        if command.is_empty() || command.iter().any(|arg| arg.contains('\0')) {
            return Err(AppError::bad_request(
                "command must be a non-empty list of arguments without NUL bytes",
            ));
        }
        self.terminals.sweep();
        {
            let open = locked(&self.terminals.open);
            if open.len() >= MAX_TERMINALS {
                return Err(AppError::new(
                    Failure::TooMany,
                    "too_many_terminals",
                    format!("{MAX_TERMINALS} terminals are open on this server: close one first"),
                ));
            }
            let mine = open.values().filter(|t| t.session == session).count();
            if mine >= MAX_PER_SESSION {
                return Err(AppError::new(
                    Failure::TooMany,
                    "too_many_terminals",
                    format!(
                        "session {session} has {MAX_PER_SESSION} terminals open: close one first"
                    ),
                ));
            }
        }
        let (Some(pool), Some(workspace)) = (
            self.tools.command_sandboxes(),
            self.sessions.workspace(session),
        ) else {
            return Err(AppError::new(
                Failure::Unavailable,
                "terminals_off",
                "terminals run in the session's sandbox, and this server has none (start it \
                 with --sandbox native or local)",
            ));
        };
        std::fs::create_dir_all(&workspace)
            .map_err(|error| AppError::internal(format!("the session's workspace: {error}")))?;
        let sandbox = pool.get(&workspace).await.map_err(|error| {
            AppError::new(Failure::Unavailable, "sandbox_failed", error.to_string())
        })?;
        let size = TtySize::clamped(cols.unwrap_or(80), rows.unwrap_or(24));
        let process = sandbox
            .exec_tty(ExecRequest::new(command.clone()), size)
            .await
            .map_err(|error| {
                AppError::new(Failure::Unavailable, "sandbox_failed", error.to_string())
            })?;
        let (ended_tx, ended) = watch::channel(None);
        let (feed, _) = broadcast::channel(1024);
        let terminal = Arc::new(Terminal {
            id: new_id(),
            session,
            command,
            created_at: crate::clock::now_ms(),
            process,
            size: Mutex::new(size),
            output: Mutex::new(Output {
                scrollback: VecDeque::new(),
                feed: Some(feed),
            }),
            clients: AtomicUsize::new(0),
            last_used: Mutex::new(Instant::now()),
            ended,
        });
        tokio::spawn(Arc::clone(&terminal).pump(ended_tx));
        locked(&self.terminals.open).insert(terminal.id.clone(), Arc::clone(&terminal));
        Ok(terminal)
    }

    /// The terminals `caller` may see (of `session` only, when named), oldest first.
    pub async fn list_terminals(
        &self,
        caller: &Principal,
        session: Option<&str>,
    ) -> Result<Vec<TerminalInfo>, AppError> {
        self.terminals.sweep();
        let only = match session {
            Some(session) => {
                let id = self.session_record(session).await?.id;
                self.check_session_access(caller, id).await?;
                Some(id)
            }
            None => None,
        };
        let all: Vec<Arc<Terminal>> = locked(&self.terminals.open).values().cloned().collect();
        let mut listed = Vec::new();
        for terminal in all {
            if only.is_some_and(|id| id != terminal.session) {
                continue;
            }
            if self
                .check_session_access(caller, terminal.session)
                .await
                .is_ok()
            {
                listed.push(terminal.info());
            }
        }
        listed.sort_by(|a, b| (a.created_at, &a.terminal_id).cmp(&(b.created_at, &b.terminal_id)));
        Ok(listed)
    }

    /// The terminal `id`, if `caller` may use it (404 otherwise, as if it did not exist).
    pub async fn terminal(&self, caller: &Principal, id: &str) -> Result<Arc<Terminal>, AppError> {
        let missing = || AppError::not_found(format!("no terminal {id:?}"));
        let terminal = self.terminals.get(id).ok_or_else(missing)?;
        self.check_session_access(caller, terminal.session)
            .await
            .map_err(|_| missing())?;
        Ok(terminal)
    }

    /// Kills the terminal `id`'s program and forgets it.
    pub async fn close_terminal(&self, caller: &Principal, id: &str) -> Result<(), AppError> {
        let terminal = self.terminal(caller, id).await?;
        terminal.process.kill();
        locked(&self.terminals.open).remove(terminal.id());
        Ok(())
    }

    /// The seed's one terminal per session (`<session>:auto`): the session's oldest live
    /// terminal, or a new one.
    pub async fn session_terminal(
        &self,
        caller: &Principal,
        session: &str,
        cols: Option<u16>,
        rows: Option<u16>,
    ) -> Result<Arc<Terminal>, AppError> {
        let id = self.session_record(session).await?.id;
        self.check_session_access(caller, id).await?;
        let existing = {
            let open = locked(&self.terminals.open);
            let mut mine: Vec<&Arc<Terminal>> = open
                .values()
                .filter(|t| t.session == id && t.exit_status().is_none())
                .collect();
            mine.sort_by_key(|t| t.created_at);
            mine.first().map(|t| Arc::clone(t))
        };
        match existing {
            Some(terminal) => {
                if let (Some(cols), Some(rows)) = (cols, rows) {
                    terminal.resize(cols, rows)?;
                }
                Ok(terminal)
            }
            None => {
                self.open_terminal(caller, &id.to_string(), cols, rows, None)
                    .await
            }
        }
    }
}
