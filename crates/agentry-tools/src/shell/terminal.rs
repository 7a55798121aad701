//! The `terminal` tool: persistent shells in the session's sandbox, on real terminals (PTYs)
//! that people can attach to as well (`/v1/terminals`, the console's terminal panel).
//!
//! Each terminal is a bash on a PTY, registered in the shared [`PtyTerminals`] under the
//! session, with the terminal's echo and bash's line editing, prompts and history expansion
//! off, so what comes back is what the commands printed. After the input of a call the tool
//! sends a marker command printing a fresh nonce and `$?`; output is read until that marker
//! comes back (the command finished, with that exit code), the output goes quiet for
//! `wait_secs`, or the shell ends. A command still running keeps its place: the next call (with
//! no input) reads on. What the model is sent has escape sequences and carriage returns taken
//! out.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_sandbox::{ExecRequest, ExitStatus, SandboxPool, TtySize};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio::sync::Notify;
use tokio::sync::broadcast::error::RecvError;

use super::exec::sandbox_error;
use super::pty::{Opener, PtyTerminal, PtyTerminals};
use super::{ShellToolsConfig, TERMINAL, head_and_tail, sandbox_for, shell};
use agentry_core::tool::{FunctionTool, ToolContext, ToolError, ToolOutput};

/// The most unread output a terminal keeps (older output is dropped, and the drop announced).
const MAX_BUFFERED: usize = 1024 * 1024;
/// The longest `wait_secs`.
const MAX_WAIT: Duration = Duration::from_secs(300);
/// How long a call with no input waits for output to go quiet by default.
const DEFAULT_WAIT: Duration = Duration::from_secs(5);
/// How long one call may read, however chatty the command.
const MAX_READ: Duration = Duration::from_secs(600);
/// What the shell prints once the terminal's echo is off and it is about to start.
const READY: &[u8] = b"\x1eready\x1e\n";
/// How long a new shell may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// The agent's terminals are wide, so that long lines do not wrap.
const SIZE: TtySize = TtySize {
    cols: 200,
    rows: 50,
};

/// Arguments of `terminal`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct TerminalArguments {
    /// What to type: one or more shell commands (a newline is added). Leave it out to read
    /// more output of a command still running.
    #[serde(default)]
    input: Option<String>,
    /// Which terminal (default "main"); a new name opens a new one.
    #[serde(default)]
    terminal: Option<String>,
    /// Seconds of silence after which the output so far is returned while the command runs on
    /// (default 5; at most 300).
    #[serde(default)]
    wait_secs: Option<f64>,
    /// Close this terminal (its shell and everything it started are killed).
    #[serde(default)]
    close: bool,
}

/// Output a terminal's shell wrote and nobody read yet.
#[derive(Default)]
struct Buffer {
    data: Vec<u8>,
    dropped: u64,
    ended: Option<ExitStatus>,
}

/// One persistent shell.
struct Terminal {
    pty: Arc<PtyTerminal>,
    registry: PtyTerminals,
    buffer: Mutex<Buffer>,
    changed: Notify,
    /// Markers sent whose command has not finished yet.
    pending: Mutex<Vec<String>>,
    last_used: Mutex<Instant>,
}

impl Terminal {
    fn buffer(&self) -> std::sync::MutexGuard<'_, Buffer> {
        self.buffer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn ended(&self) -> Option<ExitStatus> {
        self.buffer().ended.clone()
    }

    fn touch(&self) {
        *self
            .last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        self.pty.touch();
    }

    /// Kills the shell and takes its terminal off the shared registry.
    fn close(&self) {
        self.registry.close(self.pty.id());
    }

    fn idle_for(&self) -> Duration {
        self.last_used
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .elapsed()
    }
}

type Terminals = Arc<Mutex<HashMap<(PathBuf, String), Arc<Terminal>>>>;

/// The `terminal` tool.
pub(super) fn terminal(
    sandboxes: SandboxPool,
    registry: PtyTerminals,
    config: Arc<ShellToolsConfig>,
) -> FunctionTool {
    let terminals: Terminals = Arc::default();
    FunctionTool::new(
        TERMINAL,
        "Types commands into a persistent shell (bash) in this session's sandbox and returns \
         what it printed. Unlike exec, the shell keeps its state between calls: the working \
         directory, variables, functions, activated environments and background jobs. Output \
         is returned when the command finishes (with its exit code) or after wait_secs of \
         silence while it keeps running; call again without input to read more. Several \
         terminals can be open at once (by name); close=true ends one.",
        move |arguments: TerminalArguments, context: ToolContext| {
            let sandboxes = sandboxes.clone();
            let config = Arc::clone(&config);
            let terminals = Arc::clone(&terminals);
            let registry = registry.clone();
            async move {
                call(
                    &sandboxes, &registry, &config, &terminals, arguments, context,
                )
                .await
            }
        },
    )
    .with_timeout(MAX_READ + Duration::from_secs(30))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
}

async fn call(
    sandboxes: &SandboxPool,
    registry: &PtyTerminals,
    config: &ShellToolsConfig,
    terminals: &Terminals,
    arguments: TerminalArguments,
    context: ToolContext,
) -> Result<ToolOutput, ToolError> {
    let name = arguments.terminal.unwrap_or_else(|| "main".to_owned());
    if !valid_name(&name) {
        return Err(ToolError::InvalidArguments(format!(
            "invalid terminal name {name:?}: use 1 to 32 letters, digits, '-' or '_'"
        )));
    }
    let wait = match arguments.wait_secs {
        Some(secs) if !(secs.is_finite() && secs > 0.0) => {
            return Err(ToolError::InvalidArguments(
                "wait_secs must be a positive number".into(),
            ));
        }
        Some(secs) => Duration::from_secs_f64(secs).min(MAX_WAIT),
        None => DEFAULT_WAIT,
    };
    if let Some(input) = &arguments.input
        && input.contains('\0')
    {
        return Err(ToolError::InvalidArguments(
            "the input contains a NUL byte".into(),
        ));
    }
    let workspace = context.workspace.clone().ok_or_else(|| {
        ToolError::Failed(
            "this run has no workspace: terminals run only in a session's sandbox".into(),
        )
    })?;
    let key = (workspace.clone(), name.clone());
    if arguments.close {
        let removed = lock(terminals).remove(&key);
        return Ok(ToolOutput::text(match removed {
            Some(terminal) => {
                terminal.close();
                format!("terminal {name:?} closed")
            }
            None => format!("there is no terminal {name:?}"),
        }));
    }
    let mut notes = String::new();
    let existing = lock(terminals).get(&key).cloned();
    let terminal = match existing {
        Some(terminal) => match terminal.ended() {
            None => terminal,
            Some(status) => {
                let _ = writeln!(
                    notes,
                    "[the shell of terminal {name:?} had ended ({}); a new one was started: \
                     its state (directory, variables, jobs) is gone]",
                    ended_text(&status)
                );
                lock(terminals).remove(&key);
                open(sandboxes, registry, config, terminals, key, &context).await?
            }
        },
        None => {
            let open_here = lock(terminals)
                .keys()
                .filter(|(ws, _)| *ws == workspace)
                .count();
            if open_here >= config.max_terminals {
                return Err(ToolError::Failed(format!(
                    "{open_here} terminals are open, the most a session may have: close one \
                     with close=true"
                )));
            }
            open(sandboxes, registry, config, terminals, key, &context).await?
        }
    };
    terminal.touch();
    let sent = match &arguments.input {
        Some(input) => {
            let marker = format!("__agentry_done_{:016x}", fastrand::u64(..));
            let script = format!("{input}\nprintf '\\n%s:%s\\n' '{marker}' \"$?\"\n");
            lock(&terminal.pending).push(marker);
            terminal
                .pty
                .input(script.as_bytes())
                .await
                .map_err(|error| ToolError::Failed(format!("the shell is gone: {error}")))?;
            true
        }
        None => false,
    };
    let started = Instant::now();
    let (output, finished) = read(&terminal, wait, &context).await?;
    let output = plain(&output);
    terminal.touch();
    let (text, cut) = head_and_tail(&output, config.max_output_bytes);
    let mut result = notes;
    result.push_str(text.trim_end_matches('\n'));
    if cut {
        result.push_str("\n[the output was shortened]");
    }
    let dropped = std::mem::take(&mut terminal.buffer().dropped);
    if dropped > 0 {
        let _ = write!(
            result,
            "\n[{dropped} bytes of earlier output were dropped unread]"
        );
    }
    let waited = started.elapsed().as_secs_f64();
    let status = match finished {
        Finished::Exit(code) => format!("[exit code {code}]"),
        Finished::ShellEnded(status) => {
            lock(terminals).retain(|_, t| !Arc::ptr_eq(t, &terminal));
            terminal.close();
            format!(
                "[the shell ended ({}); the next call starts a new one]",
                ended_text(&status)
            )
        }
        Finished::Quiet if sent || !lock(&terminal.pending).is_empty() => format!(
            "[still running after {waited:.1} s; call terminal again without input to read \
             more, or close=true to kill it]"
        ),
        Finished::Quiet => "[no command running]".to_owned(),
    };
    if !result.is_empty() {
        result.push('\n');
    }
    result.push_str(&status);
    Ok(ToolOutput::text(result))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn ended_text(status: &ExitStatus) -> String {
    if let Some(reason) = &status.sandbox_closed {
        return format!("the sandbox stopped: {reason}");
    }
    match (status.code, status.signal) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "ended".to_owned(),
    }
}

/// Starts a shell for `key` on a terminal in the session's sandbox, and the tasks that read its
/// output and close it when idle.
async fn open(
    sandboxes: &SandboxPool,
    registry: &PtyTerminals,
    config: &ShellToolsConfig,
    terminals: &Terminals,
    key: (PathBuf, String),
    context: &ToolContext,
) -> Result<Arc<Terminal>, ToolError> {
    let sandbox = sandbox_for(sandboxes, context).await?;
    // The terminal's echo goes off before the shell reads anything, then the shell starts
    // without line editing (it would echo), prompts or history expansion.
    let start = if shell() == "/bin/sh" {
        "exec /bin/sh".to_owned()
    } else {
        "exec /bin/bash --norc --noprofile --noediting +H".to_owned()
    };
    let script = format!("stty -echo; printf '\\036ready\\036\\n'; {start}");
    let mut request = ExecRequest::new(["/bin/sh", "-c", &script]);
    for (name, value) in [
        ("PS1", ""),
        ("PS2", ""),
        ("PAGER", "cat"),
        ("GIT_PAGER", "cat"),
    ] {
        request.env.insert(name.into(), value.into());
    }
    let session = context.caller.as_ref().and_then(|caller| caller.session);
    let pty = registry
        .open(
            &sandbox,
            session,
            Opener::Agent(key.1.clone()),
            request,
            SIZE,
        )
        .await
        .map_err(sandbox_error)?;
    let (_, mut feed) = pty.follow();
    let terminal = Arc::new(Terminal {
        pty,
        registry: registry.clone(),
        buffer: Mutex::new(Buffer::default()),
        changed: Notify::new(),
        pending: Mutex::new(Vec::new()),
        last_used: Mutex::new(Instant::now()),
    });
    let reader = Arc::downgrade(&terminal);
    tokio::spawn(async move {
        loop {
            let received = feed.recv().await;
            let Some(terminal) = reader.upgrade() else {
                return;
            };
            match received {
                Ok(chunk) => {
                    let mut buffer = terminal.buffer();
                    buffer.data.extend_from_slice(&chunk);
                    if buffer.data.len() > MAX_BUFFERED {
                        let excess = buffer.data.len() - MAX_BUFFERED;
                        buffer.data.drain(..excess);
                        buffer.dropped += excess as u64;
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    terminal.buffer().dropped += missed;
                }
                Err(RecvError::Closed) => {
                    let status = terminal.pty.ended().await.unwrap_or(ExitStatus {
                        code: None,
                        signal: None,
                        timed_out: false,
                        killed: false,
                        out_of_memory: false,
                        sandbox_closed: Some("its output ended".into()),
                    });
                    terminal.buffer().ended = Some(status);
                    terminal.changed.notify_waiters();
                    return;
                }
            }
            terminal.changed.notify_waiters();
        }
    });
    ready(&terminal, context).await?;
    // Closes the terminal once unused for the idle timeout (it would keep its sandbox alive).
    let watched = Arc::downgrade(&terminal);
    let idle = config.terminal_idle_timeout;
    let local = Arc::downgrade(terminals);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(idle.min(Duration::from_secs(30))).await;
            let Some(terminal) = watched.upgrade() else {
                return;
            };
            if terminal.ended().is_some() {
                return;
            }
            // A person attached keeps it open.
            if terminal.idle_for() >= idle && terminal.pty.clients() == 0 {
                terminal.close();
                if let Some(local) = local.upgrade() {
                    lock(&local).retain(|_, t| !Arc::ptr_eq(t, &terminal));
                }
                return;
            }
        }
    });
    lock(terminals).insert(key, Arc::clone(&terminal));
    Ok(terminal)
}

/// Waits for a new shell's ready line, and drops it (and anything before it).
async fn ready(terminal: &Terminal, context: &ToolContext) -> Result<(), ToolError> {
    let started = Instant::now();
    loop {
        let notified = terminal.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let mut buffer = terminal.buffer();
            let data = std::mem::take(&mut buffer.data);
            let text = data
                .iter()
                .copied()
                .filter(|&byte| byte != b'\r')
                .collect::<Vec<u8>>();
            if let Some(at) = find(&text, READY) {
                buffer.data = text[at + READY.len()..].to_vec();
                return Ok(());
            }
            buffer.data = data;
            if let Some(status) = &buffer.ended {
                return Err(ToolError::Failed(format!(
                    "the shell could not start ({})",
                    ended_text(status)
                )));
            }
        }
        let Some(left) = START_TIMEOUT.checked_sub(started.elapsed()) else {
            terminal.close();
            return Err(ToolError::Failed("the shell did not start in time".into()));
        };
        tokio::select! {
            biased;
            () = context.cancel.cancelled() => {
                terminal.close();
                return Err(ToolError::Cancelled);
            }
            () = &mut notified => {}
            () = tokio::time::sleep(left) => {}
        }
    }
}

/// What a terminal printed, as text for the model: escape sequences (colours, cursor moves,
/// titles) and carriage returns taken out.
fn plain(output: &[u8]) -> Vec<u8> {
    strip_ansi_escapes::strip(output)
        .into_iter()
        .filter(|&byte| byte != b'\r')
        .collect()
}

enum Finished {
    /// A command's marker came back with this exit code.
    Exit(i32),
    /// The shell is gone.
    ShellEnded(ExitStatus),
    /// The output went quiet (or the read ran long) with a command still running.
    Quiet,
}

/// Takes the terminal's output until the last pending command finishes, the output goes quiet
/// for `wait`, or the shell ends.
async fn read(
    terminal: &Terminal,
    wait: Duration,
    context: &ToolContext,
) -> Result<(Vec<u8>, Finished), ToolError> {
    let started = Instant::now();
    let mut output = Vec::new();
    let mut last_code = None;
    loop {
        let notified = terminal.changed.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let ended = {
            let mut buffer = terminal.buffer();
            let grew = !buffer.data.is_empty();
            output.append(&mut buffer.data);
            if grew {
                last_code = take_markers(terminal, &mut output).or(last_code);
            }
            buffer.ended.clone()
        };
        if lock(&terminal.pending).is_empty()
            && let Some(code) = last_code
        {
            return Ok((output, Finished::Exit(code)));
        }
        if let Some(status) = ended {
            return Ok((output, Finished::ShellEnded(status)));
        }
        if started.elapsed() >= MAX_READ {
            return Ok((output, Finished::Quiet));
        }
        tokio::select! {
            biased;
            () = context.cancel.cancelled() => return Err(ToolError::Cancelled),
            () = &mut notified => {}
            () = tokio::time::sleep(wait) => return Ok((output, Finished::Quiet)),
        }
    }
}

/// Removes the marker lines of finished commands from `output` (with the newline printed
/// before each), and returns the exit code of the last one found.
fn take_markers(terminal: &Terminal, output: &mut Vec<u8>) -> Option<i32> {
    let mut pending = lock(&terminal.pending);
    let mut code = None;
    let mut index = 0;
    while index < pending.len() {
        let marker = format!("\n{}:", pending[index]);
        let Some(at) = find(output, marker.as_bytes()) else {
            index += 1;
            continue;
        };
        let rest = &output[at + marker.len()..];
        let Some(end) = rest.iter().position(|&b| b == b'\n') else {
            // The line is not complete yet: wait for its newline.
            index += 1;
            continue;
        };
        code = std::str::from_utf8(&rest[..end])
            .ok()
            .and_then(|text| text.trim().parse().ok());
        output.drain(at..at + marker.len() + end + 1);
        pending.remove(index);
    }
    code
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
