//! PTY terminals in sessions' sandboxes, shared by the `terminal` tool and the people who
//! attach to them (the API's `/v1/terminals` and its WebSocket, the console's terminal panel).
//!
//! A [`PtyTerminal`] keeps the last [`SCROLLBACK_BYTES`] of output; an [`Attachment`] gets that
//! first, then every later chunk, none lost or repeated in between (the two are taken under one
//! lock). [`PtyTerminal::subscribe`] gives the output from now on, to a reader that is not a
//! person (the `terminal` tool).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use agentry_sandbox::{ExecRequest, ExitStatus, Sandbox, SandboxError, TtyProcess, TtySize};
use agentry_types::SessionId;
use bytes::Bytes;
use tokio::sync::{broadcast, watch};

/// How much output a terminal keeps for a new attachment.
pub const SCROLLBACK_BYTES: usize = 256 * 1024;

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Who opened a terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Opener {
    /// A person, through the API.
    Person,
    /// The `terminal` tool, under this name.
    Agent(String),
}

/// One terminal.
pub struct PtyTerminal {
    id: String,
    session: Option<SessionId>,
    opener: Opener,
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

impl std::fmt::Debug for PtyTerminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PtyTerminal")
            .field("id", &self.id)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// An attachment to a terminal: what it showed so far, then its output as it comes. Dropping
/// it detaches (the terminal goes on).
#[derive(Debug)]
pub struct Attachment {
    /// The terminal.
    pub terminal: Arc<PtyTerminal>,
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

impl PtyTerminal {
    /// Its id (`term_…`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The session whose sandbox it runs in.
    pub fn session(&self) -> Option<SessionId> {
        self.session
    }

    /// Who opened it.
    pub fn opener(&self) -> &Opener {
        &self.opener
    }

    /// The program it runs.
    pub fn command(&self) -> &[String] {
        &self.command
    }

    /// When it was opened (Unix ms).
    pub fn created_at(&self) -> u64 {
        self.created_at
    }

    /// Its size.
    pub fn size(&self) -> TtySize {
        *locked(&self.size)
    }

    /// Attachments right now.
    pub fn clients(&self) -> usize {
        self.clients.load(Ordering::SeqCst)
    }

    /// Notes a use (input, an attachment): an idle terminal is closed.
    pub fn touch(&self) {
        *locked(&self.last_used) = Instant::now();
    }

    /// How long since it was last used.
    pub fn idle_for(&self) -> Duration {
        locked(&self.last_used).elapsed()
    }

    /// Sends keystrokes (or pasted text) to the program.
    pub async fn input(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.touch();
        self.process.write_all(bytes).await
    }

    /// Changes its size (clamped to 1..=1000 each way).
    pub fn resize(&self, cols: u16, rows: u16) -> Result<(), SandboxError> {
        let size = TtySize::clamped(cols, rows);
        self.process.resize(size)?;
        *locked(&self.size) = size;
        Ok(())
    }

    /// Kills its program and everything it started.
    pub fn kill(&self) {
        self.process.kill();
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

    /// What it showed so far and its output from then on (closed when the program ended), for
    /// a reader that is not a person (not counted as an attachment).
    pub fn follow(&self) -> (Bytes, broadcast::Receiver<Bytes>) {
        let output = locked(&self.output);
        let receiver = match &output.feed {
            Some(feed) => feed.subscribe(),
            None => broadcast::channel(1).1,
        };
        let (front, back) = output.scrollback.as_slices();
        (Bytes::from([front, back].concat()), receiver)
    }

    /// Attaches: the scrollback and the live output, neither losing nor repeating a byte.
    pub fn attach(self: &Arc<Self>) -> Attachment {
        let (scrollback, receiver) = self.follow();
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

/// The open terminals (cheap to clone: one shared registry).
#[derive(Debug, Clone, Default)]
pub struct PtyTerminals {
    open: Arc<Mutex<HashMap<String, Arc<PtyTerminal>>>>,
}

fn new_id() -> String {
    let mut id = String::from("term_");
    for _ in 0..3 {
        id.push_str(&format!("{:08x}", fastrand::u32(..)));
    }
    id
}

impl PtyTerminals {
    /// Starts `request` on a new terminal of `size` in `sandbox` and registers it.
    pub async fn open(
        &self,
        sandbox: &Sandbox,
        session: Option<SessionId>,
        opener: Opener,
        request: ExecRequest,
        size: TtySize,
    ) -> Result<Arc<PtyTerminal>, SandboxError> {
        let command = request.argv.clone();
        let process = sandbox.exec_tty(request, size).await?;
        let (ended_tx, ended) = watch::channel(None);
        let (feed, _) = broadcast::channel(1024);
        let terminal = Arc::new(PtyTerminal {
            id: new_id(),
            session,
            opener,
            command,
            created_at: now_ms(),
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
        locked(&self.open).insert(terminal.id.clone(), Arc::clone(&terminal));
        Ok(terminal)
    }

    /// The terminal `id`.
    pub fn get(&self, id: &str) -> Option<Arc<PtyTerminal>> {
        locked(&self.open).get(id).cloned()
    }

    /// Every open terminal, oldest first.
    pub fn all(&self) -> Vec<Arc<PtyTerminal>> {
        let mut all: Vec<Arc<PtyTerminal>> = locked(&self.open).values().cloned().collect();
        all.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        all
    }

    /// Kills the terminal `id`'s program and forgets it.
    pub fn close(&self, id: &str) -> Option<Arc<PtyTerminal>> {
        let removed = locked(&self.open).remove(id);
        if let Some(terminal) = &removed {
            terminal.kill();
        }
        removed
    }

    /// Closes terminals idle for `idle` with nobody attached, and forgets ended ones nobody
    /// watches.
    pub fn sweep(&self, idle: Duration) {
        locked(&self.open).retain(|_, terminal| {
            let watched = terminal.clients() > 0;
            if terminal.exit_status().is_some() {
                return watched;
            }
            if !watched && terminal.idle_for() >= idle {
                terminal.kill();
                return false;
            }
            true
        });
    }

    /// Kills every terminal (shutdown).
    pub fn close_all(&self) {
        for (_, terminal) in locked(&self.open).drain() {
            terminal.kill();
        }
    }
}
