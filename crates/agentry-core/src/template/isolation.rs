//! Renders out of process, where a template cannot take the server's memory.
//!
//! Fuel bounds how many instructions a render runs, but not what one instruction allocates:
//! `{% set a = a ~ a %}` doubles a string in a few instructions, so forty of them ask for a
//! terabyte. Rust cannot refuse an allocation without aborting the process, so renders run in
//! a renderer: the runtime's own executable re-executed with [`RENDERER_ARG`], its address
//! space capped (`RLIMIT_AS`) before it reads anything. A render that needs more dies there
//! (the allocation fails and the renderer aborts), and the caller gets a typed error
//! ([`Failure::OutOfMemory`]); a render past the wall-clock timeout has its renderer killed
//! ([`Failure::TimedOut`]). Renderers are kept warm in a small pool and a dead one is simply
//! replaced by the next call.
//!
//! The isolation is process-wide: [`isolate`] installs it once (the `agentry` binary does so
//! at start); until then, and in programs that never call it, renders run in-process under
//! fuel and output caps alone. A binary that installs it must call
//! `template::renderer::maybe_run_renderer` first thing in `main`; the renderer's side of the
//! wire is there.
//!
//! The wire between the runtime and a renderer is a Unix socket on the renderer's standard
//! input and output: one JSON [`Job`] a line in, one JSON [`Outcome`] a line out.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::TemplateError;

/// The first argument that starts an executable as a template renderer.
pub const RENDERER_ARG: &str = "__agentry-template-renderer";
/// The renderer's argv[0], what `ps` shows.
const RENDERER_ARGV0: &str = "agentry-template-renderer";
/// How many idle renderers are kept for the next calls.
const MAX_IDLE: usize = 4;
/// The largest answer a renderer may send, in bytes: a template's output is capped well below
/// it, and an expression's value (a list a workflow loops over) rarely comes near.
const MAX_ANSWER_BYTES: usize = 16 * 1024 * 1024;

/// How renders are isolated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsolationConfig {
    /// The executable started as a renderer: one that calls
    /// `template::renderer::maybe_run_renderer` first thing.
    pub executable: PathBuf,
    /// The renderer's address-space cap (`RLIMIT_AS`), its own code and libraries included.
    pub memory_bytes: u64,
    /// How long one render may take before its renderer is killed.
    pub timeout: Duration,
}

impl IsolationConfig {
    /// The default address-space cap: 512 MiB, of which the renderer itself takes a few tens.
    pub const DEFAULT_MEMORY_BYTES: u64 = 512 * 1024 * 1024;
    /// The default wall-clock limit of one render: fuel stops a busy render in milliseconds,
    /// so only a renderer stuck allocating comes near it.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

    /// Renders in `executable` with the default limits.
    pub fn new(executable: impl Into<PathBuf>) -> Self {
        Self {
            executable: executable.into(),
            memory_bytes: Self::DEFAULT_MEMORY_BYTES,
            timeout: Self::DEFAULT_TIMEOUT,
        }
    }
}

/// Why an isolated render did not answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The render needed more memory than the renderer may have.
    OutOfMemory {
        /// The renderer's address-space cap.
        max_bytes: u64,
    },
    /// The render ran past the timeout and its renderer was killed.
    TimedOut(Duration),
    /// The renderer could not be started, or broke the protocol.
    Broken(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OutOfMemory { max_bytes } => {
                write!(f, "it needs more than {max_bytes} bytes of memory")
            }
            Self::TimedOut(limit) => write!(f, "it ran longer than {limit:?}"),
            Self::Broken(reason) => write!(f, "the template renderer failed: {reason}"),
        }
    }
}

/// One render, sent to a renderer; it borrows what the caller has (a workflow's context can be
/// large) and owns what a renderer reads.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "job", rename_all = "snake_case")]
pub(crate) enum Job<'a> {
    /// A prompt template from a [`super::TemplateStore`].
    Template {
        name: Cow<'a, str>,
        source: Cow<'a, str>,
        arguments: Cow<'a, Map<String, Value>>,
        fuel: u64,
        max_output_bytes: usize,
    },
    /// A prompt template compiled and tried once with empty arguments, as
    /// [`super::TemplateStore::add`] does.
    Check {
        name: Cow<'a, str>,
        source: Cow<'a, str>,
        fuel: u64,
        max_output_bytes: usize,
    },
    /// The variables a prompt template reads.
    Variables {
        name: Cow<'a, str>,
        source: Cow<'a, str>,
    },
    /// Whether an expression parses.
    CheckExpression { expression: Cow<'a, str> },
    /// Whether a template text parses.
    CheckText { text: Cow<'a, str> },
    /// A text with `{{ … }}` parts, rendered by [`super::Expressions`].
    Text {
        text: Cow<'a, str>,
        context: Cow<'a, Value>,
    },
    /// An expression evaluated to JSON by [`super::Expressions`].
    Evaluate {
        expression: Cow<'a, str>,
        context: Cow<'a, Value>,
    },
    /// An expression's truthiness, by [`super::Expressions`].
    Truthy {
        expression: Cow<'a, str>,
        context: Cow<'a, Value>,
    },
}

/// A renderer's answer to a [`Job`], of the job's own kind.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "outcome", content = "result", rename_all = "snake_case")]
pub(crate) enum Outcome {
    Template(Result<String, TemplateError>),
    Checked(Result<(), TemplateError>),
    Variables(Result<BTreeSet<String>, TemplateError>),
    Parsed(Result<(), String>),
    Text(Result<String, String>),
    Evaluate(Result<Value, String>),
    Truthy(Result<bool, String>),
}

/// Installs out-of-process rendering for this process; the first call wins. Answers whether
/// this call's configuration is the one in force.
pub fn isolate(config: IsolationConfig) -> bool {
    let pool = POOL.get_or_init(|| Pool {
        config: config.clone(),
        idle: Mutex::new(Vec::new()),
    });
    pool.config == config
}

/// The isolation in force, if [`isolate`] was called.
pub fn isolation() -> Option<&'static IsolationConfig> {
    POOL.get().map(|pool| &pool.config)
}

static POOL: OnceLock<Pool> = OnceLock::new();

/// Runs `job` in a renderer; `None` when renders are not isolated in this process.
pub(crate) fn run(job: &Job<'_>) -> Option<Result<Outcome, Failure>> {
    POOL.get().map(|pool| pool.run(job))
}

struct Pool {
    config: IsolationConfig,
    idle: Mutex<Vec<Renderer>>,
}

impl Pool {
    fn run(&self, job: &Job<'_>) -> Result<Outcome, Failure> {
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let mut renderer = match idle {
            Some(renderer) => renderer,
            None => Renderer::start(&self.config)
                .map_err(|error| Failure::Broken(format!("cannot start it: {error}")))?,
        };
        let outcome = renderer.call(job, &self.config)?;
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        if idle.len() < MAX_IDLE {
            idle.push(renderer);
        }
        Ok(outcome)
    }
}

/// A running renderer and the runtime's end of its socket.
struct Renderer {
    child: Child,
    socket: BufReader<UnixStream>,
}

impl Renderer {
    fn start(config: &IsolationConfig) -> io::Result<Self> {
        let (ours, theirs) = UnixStream::pair()?;
        let theirs = OwnedFd::from(theirs);
        let child = Command::new(&config.executable)
            .arg0(RENDERER_ARGV0)
            .arg(RENDERER_ARG)
            .arg(config.memory_bytes.to_string())
            .env_clear()
            .stdin(Stdio::from(theirs.try_clone()?))
            .stdout(Stdio::from(theirs))
            .stderr(Stdio::null())
            .spawn()?;
        ours.set_read_timeout(Some(config.timeout))?;
        ours.set_write_timeout(Some(config.timeout))?;
        Ok(Self {
            child,
            socket: BufReader::new(ours),
        })
    }

    /// Sends `job` and reads its outcome. Any failure ends this renderer (dropped, it is
    /// killed and reaped), and says why: the renderer's own death by abort is an allocation
    /// that failed, a read past the timeout a render too slow.
    fn call(&mut self, job: &Job<'_>, config: &IsolationConfig) -> Result<Outcome, Failure> {
        let mut line =
            serde_json::to_vec(job).map_err(|error| Failure::Broken(error.to_string()))?;
        line.push(b'\n');
        let sent = self.socket.get_mut().write_all(&line);
        let mut answer = String::new();
        let read = sent.and_then(|()| {
            (&mut self.socket)
                .take(MAX_ANSWER_BYTES as u64 + 1)
                .read_line(&mut answer)
        });
        match read {
            Ok(0) => Err(self.death(config)),
            Ok(_) if !answer.ends_with('\n') => Err(Failure::Broken(format!(
                "its answer is longer than {MAX_ANSWER_BYTES} bytes"
            ))),
            Ok(_) => serde_json::from_str(&answer).map_err(|error| {
                Failure::Broken(format!("an answer that does not parse: {error}"))
            }),
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Err(Failure::TimedOut(config.timeout))
            }
            Err(_) => Err(self.death(config)),
        }
    }

    /// Why the renderer went away: waits for it and reads its end.
    fn death(&mut self, config: &IsolationConfig) -> Failure {
        match self.child.wait() {
            Ok(status) if status.signal() == Some(SIGABRT) => Failure::OutOfMemory {
                max_bytes: config.memory_bytes,
            },
            Ok(status) => Failure::Broken(format!("it ended ({status})")),
            Err(error) => Failure::Broken(error.to_string()),
        }
    }
}

/// SIGABRT's number on Linux (every architecture): how Rust ends a process whose allocation
/// failed.
const SIGABRT: i32 = 6;

impl Drop for Renderer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
