//! Real MCP servers for tests and benchmarks: finding the reference servers that
//! `scripts/install-mcp-servers` installs, the command lines that launch them over stdio
//! ([`LaunchSpec`]), and a running streamable HTTP server ([`HttpMcpServer`]).
//!
//! The install tree (`target/mcp-servers` of the workspace, or wherever `AGENTRY_MCP_SERVERS`
//! points) holds
//!
//! - `npm/`: `@modelcontextprotocol/server-everything`, `server-filesystem` and `server-memory`,
//!   run with the `node` found on `PATH`;
//! - `venv/`: a Python venv with the official `mcp` SDK and `mcp-server-time`, `mcp-server-fetch`.
//!
//! [`McpServers::locate`] fails, naming the install script, when any of it is missing: a test
//! that needs a real server never skips silently.
//!
//! ```no_run
//! # async fn demo() -> Result<(), agentry_testkit::mcp::McpServersError> {
//! use agentry_testkit::mcp::McpServers;
//!
//! let servers = McpServers::locate()?;
//! let spec = servers.everything(); // node .../server-everything/dist/index.js stdio
//! let mut child = spec.command().spawn().map_err(|source| {
//!     agentry_testkit::mcp::McpServersError::Spawn { program: spec.program.clone(), source }
//! })?;
//! let http = servers.start_everything_http().await?;
//! // POST JSON-RPC to http.url() ...
//! # let _ = child.start_kill();
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};

/// Environment variable that overrides where the installed MCP servers are looked up.
pub const MCP_SERVERS_ENV: &str = "AGENTRY_MCP_SERVERS";

/// How long [`McpServers::start_everything_http`] waits for the server to accept connections.
/// Node starts it in about 0.3 s on an idle machine; a busy CI machine is several times slower.
pub const HTTP_START_TIMEOUT: Duration = Duration::from_secs(20);

/// The install script, named in every "not installed" error.
const INSTALL_SCRIPT: &str = "scripts/install-mcp-servers";

/// The node scripts of the three npm servers, relative to the install root.
const EVERYTHING_JS: &str =
    "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js";
const FILESYSTEM_JS: &str =
    "npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js";
const MEMORY_JS: &str = "npm/node_modules/@modelcontextprotocol/server-memory/dist/index.js";
/// The venv's programs, relative to the install root.
const PYTHON: &str = "venv/bin/python";
const TIME_BIN: &str = "venv/bin/mcp-server-time";
const FETCH_BIN: &str = "venv/bin/mcp-server-fetch";

/// How many fresh ports [`McpServers::start_everything_http`] tries when another process takes
/// the one it picked before node binds it.
const PORT_ATTEMPTS: usize = 3;
/// How much of the HTTP server's stderr is kept (the tail), for error messages.
const STDERR_TAIL: usize = 8 * 1024;

/// Errors from finding and starting the MCP servers.
#[derive(Debug, thiserror::Error)]
pub enum McpServersError {
    /// Some of the install tree is missing.
    #[error(
        "MCP servers are not installed under {root}: missing {list}; run {INSTALL_SCRIPT} \
         (scripts/test does) or point {MCP_SERVERS_ENV} at an install",
        list = path_list(.missing)
    )]
    NotInstalled {
        /// The install root that was searched.
        root: PathBuf,
        /// Every expected file that is not there.
        missing: Vec<PathBuf>,
    },
    /// No `node` program on `PATH` (the npm servers need it).
    #[error("no `node` on PATH: the npm MCP servers need Node.js (see {INSTALL_SCRIPT})")]
    NodeNotFound,
    /// No free loopback port could be reserved.
    #[error("cannot pick a free loopback port: {0}")]
    Port(#[source] io::Error),
    /// A server process could not be started or watched.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The program that was run.
        program: PathBuf,
        /// The underlying IO error.
        #[source]
        source: io::Error,
    },
    /// The HTTP server exited before it accepted a connection.
    #[error(
        "the everything MCP server exited with {status} before listening on port {port}; its stderr: {stderr:?}"
    )]
    Exited {
        /// How it exited.
        status: ExitStatus,
        /// The port it was told to listen on.
        port: u16,
        /// The tail of its stderr.
        stderr: String,
    },
    /// The HTTP server did not accept a connection in time.
    #[error(
        "the everything MCP server did not accept connections on 127.0.0.1:{port} within {timeout:?}; its stderr: {stderr:?}"
    )]
    StartTimeout {
        /// The port it was told to listen on.
        port: u16,
        /// How long it was given.
        timeout: Duration,
        /// The tail of its stderr.
        stderr: String,
    },
}

/// `a, b, c` for an error message.
fn path_list(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|path| path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How to launch one stdio MCP server: run `program` with `args`, adding `env` to the inherited
/// environment, and speak newline-delimited JSON-RPC on its stdin and stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LaunchSpec {
    /// The program, an absolute path when the install root is absolute.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Variables to set on top of the inherited environment.
    pub env: Vec<(String, String)>,
}

impl LaunchSpec {
    /// A tokio command for this launch: program, arguments and environment set, nothing else
    /// (the caller picks stdio, `kill_on_drop`, ...).
    pub fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args);
        command.envs(self.env.iter().map(|(name, value)| (name, value)));
        command
    }
}

impl fmt::Display for LaunchSpec {
    /// Shell-like: `NAME=value program arg ...` (unquoted; for logs and messages).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, value) in &self.env {
            write!(f, "{name}={value} ")?;
        }
        write!(f, "{}", self.program.display())?;
        for arg in &self.args {
            write!(f, " {arg}")?;
        }
        Ok(())
    }
}

/// The installed MCP servers.
#[derive(Debug, Clone)]
pub struct McpServers {
    root: PathBuf,
    node: PathBuf,
}

impl McpServers {
    /// Finds the servers: under `AGENTRY_MCP_SERVERS` when it is set and non-empty, else under
    /// `<workspace root>/target/mcp-servers`. Fails when any server, the venv's Python, or `node`
    /// is missing.
    pub fn locate() -> Result<McpServers, McpServersError> {
        McpServers::at(default_root())
    }

    /// Finds the servers under `root` (an install made by `scripts/install-mcp-servers`), and
    /// `node` on `PATH`.
    pub fn at(root: impl Into<PathBuf>) -> Result<McpServers, McpServersError> {
        let root = root.into();
        let missing: Vec<PathBuf> = [
            EVERYTHING_JS,
            FILESYSTEM_JS,
            MEMORY_JS,
            PYTHON,
            TIME_BIN,
            FETCH_BIN,
        ]
        .iter()
        .map(|relative| root.join(relative))
        .filter(|path| !path.is_file())
        .collect();
        if !missing.is_empty() {
            return Err(McpServersError::NotInstalled { root, missing });
        }
        let node = find_on_path("node").ok_or(McpServersError::NodeNotFound)?;
        Ok(McpServers { root, node })
    }

    /// The install root (holding `npm/` and `venv/`).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The `node` program the npm servers run with (found on `PATH`).
    pub fn node(&self) -> &Path {
        &self.node
    }

    /// The venv's Python: it has the official `mcp` SDK (`mcp.client.stdio`,
    /// `mcp.client.streamable_http`), for driving an MCP server with an independent client.
    pub fn python(&self) -> PathBuf {
        self.root.join(PYTHON)
    }

    /// `node .../server-everything/dist/index.js stdio`: the reference server exercising every
    /// protocol feature (tools such as `echo`, `get-sum`, `trigger-long-running-operation`;
    /// prompts; resources; logging).
    pub fn everything(&self) -> LaunchSpec {
        self.node_spec(EVERYTHING_JS, vec!["stdio".to_owned()], Vec::new())
    }

    /// `node .../server-filesystem/dist/index.js <dir>`: file tools confined to `dir` (a
    /// non-UTF-8 path is passed lossily).
    pub fn filesystem(&self, dir: &Path) -> LaunchSpec {
        self.node_spec(FILESYSTEM_JS, vec![lossy(dir)], Vec::new())
    }

    /// `MEMORY_FILE_PATH=<file> node .../server-memory/dist/index.js`: a knowledge graph kept in
    /// `file` (JSON lines; created on the first write; a non-UTF-8 path is passed lossily).
    pub fn memory(&self, file: &Path) -> LaunchSpec {
        let env = vec![("MEMORY_FILE_PATH".to_owned(), lossy(file))];
        self.node_spec(MEMORY_JS, Vec::new(), env)
    }

    /// `mcp-server-time --local-timezone UTC`: `get_current_time` and `convert_time`.
    pub fn time(&self) -> LaunchSpec {
        LaunchSpec {
            program: self.root.join(TIME_BIN),
            args: vec!["--local-timezone".to_owned(), "UTC".to_owned()],
            env: Vec::new(),
        }
    }

    /// `mcp-server-fetch --ignore-robots-txt`: the `fetch` tool. Without `--allow-private-ips`
    /// it refuses loopback and private addresses with an `isError: true` result, a real tool
    /// error that tests can provoke offline.
    pub fn fetch(&self) -> LaunchSpec {
        LaunchSpec {
            program: self.root.join(FETCH_BIN),
            args: vec!["--ignore-robots-txt".to_owned()],
            env: Vec::new(),
        }
    }

    /// Starts `PORT=<port> node .../server-everything/dist/index.js streamableHttp` on a free
    /// port and waits (at most [`HTTP_START_TIMEOUT`]) until `127.0.0.1:<port>` accepts TCP
    /// connections. The endpoint is [`HttpMcpServer::url`]; dropping the value kills the server.
    ///
    /// Needs a tokio runtime with IO and time enabled (it reads the server's stderr in a task).
    pub async fn start_everything_http(&self) -> Result<HttpMcpServer, McpServersError> {
        let mut attempt = 1;
        loop {
            match self.try_start_everything_http().await {
                // Another process took the port between our probe and node's bind: pick again.
                Err(McpServersError::Exited { ref stderr, .. })
                    if attempt < PORT_ATTEMPTS && stderr.contains("already in use") =>
                {
                    attempt += 1;
                }
                result => return result,
            }
        }
    }

    async fn try_start_everything_http(&self) -> Result<HttpMcpServer, McpServersError> {
        let port = free_port().map_err(McpServersError::Port)?;
        let spec = self.node_spec(
            EVERYTHING_JS,
            vec!["streamableHttp".to_owned()],
            vec![("PORT".to_owned(), port.to_string())],
        );
        // The server logs every request on stdout: nothing reads it, so it goes nowhere rather
        // than into a pipe that could fill up. It stays in our process group (it does not fork),
        // so a test runner that kills a test's group on timeout kills it too.
        let mut child = spec
            .command()
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| McpServersError::Spawn {
                program: spec.program.clone(),
                source,
            })?;
        let stderr = Arc::new(Mutex::new(String::new()));
        let mut reader = child
            .stderr
            .take()
            .map(|pipe| tokio::spawn(keep_tail(pipe, Arc::clone(&stderr))));
        let mut server = HttpMcpServer {
            url: format!("http://127.0.0.1:{port}/mcp"),
            port,
            child,
            stderr,
        };

        let started = Instant::now();
        loop {
            let status = server
                .child
                .try_wait()
                .map_err(|source| McpServersError::Spawn {
                    program: spec.program.clone(),
                    source,
                })?;
            if let Some(status) = status {
                // Let the reader take in what the process wrote before it died (it ends at EOF,
                // at once unless something the process started still holds the pipe).
                if let Some(reader) = reader.take() {
                    let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
                }
                return Err(McpServersError::Exited {
                    status,
                    port,
                    stderr: server.stderr(),
                });
            }
            if tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
                .await
                .is_ok()
            {
                return Ok(server);
            }
            if started.elapsed() >= HTTP_START_TIMEOUT {
                return Err(McpServersError::StartTimeout {
                    port,
                    timeout: HTTP_START_TIMEOUT,
                    stderr: server.stderr(),
                });
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn node_spec(&self, script: &str, args: Vec<String>, env: Vec<(String, String)>) -> LaunchSpec {
        let mut all_args = vec![lossy(&self.root.join(script))];
        all_args.extend(args);
        LaunchSpec {
            program: self.node.clone(),
            args: all_args,
            env,
        }
    }
}

/// A running `server-everything` speaking MCP streamable HTTP on a loopback port. Dropping it
/// kills the server.
#[derive(Debug)]
pub struct HttpMcpServer {
    url: String,
    port: u16,
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl HttpMcpServer {
    /// The MCP endpoint, `http://127.0.0.1:<port>/mcp` (POST, GET and DELETE).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The port it listens on (on every interface; use 127.0.0.1).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, `None` once it has been reaped.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// What the server wrote on stderr so far (the last 8 KiB); on a good start it is
    /// `MCP Streamable HTTP Server listening on port <port>`.
    pub fn stderr(&self) -> String {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for HttpMcpServer {
    fn drop(&mut self) {
        // SIGKILL now; tokio reaps the process in the background (`kill_on_drop` is also set).
        let _ = self.child.start_kill();
    }
}

/// `AGENTRY_MCP_SERVERS`, or `<workspace root>/target/mcp-servers`.
fn default_root() -> PathBuf {
    match std::env::var_os(MCP_SERVERS_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/mcp-servers"),
    }
}

/// The first executable file called `name` in a `PATH` directory.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

#[cfg(unix)]
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|meta| meta.is_file() && meta.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn is_executable(path: &Path) -> bool {
    path.is_file()
}

/// A loopback port that was free a moment ago.
fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn lossy(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// Reads `pipe` to its end, keeping the last [`STDERR_TAIL`] bytes (whole lines) in `tail`.
async fn keep_tail(pipe: ChildStderr, tail: Arc<Mutex<String>>) {
    let mut lines = BufReader::new(pipe).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
        if !tail.is_empty() {
            tail.push('\n');
        }
        tail.push_str(&line);
        if tail.len() > STDERR_TAIL {
            let mut cut = tail.len() - STDERR_TAIL;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail.drain(..cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_spec_displays_like_a_shell_line() {
        let spec = LaunchSpec {
            program: PathBuf::from("/usr/bin/node"),
            args: vec!["server.js".to_owned(), "stdio".to_owned()],
            env: vec![("MEMORY_FILE_PATH".to_owned(), "/tmp/m.jsonl".to_owned())],
        };
        assert_eq!(
            spec.to_string(),
            "MEMORY_FILE_PATH=/tmp/m.jsonl /usr/bin/node server.js stdio"
        );
    }

    #[test]
    fn a_missing_install_names_the_script_and_every_missing_file() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("no-such-mcp-servers");
        let error = McpServers::at(&root).expect_err("nothing is installed there");
        let McpServersError::NotInstalled { missing, .. } = &error else {
            panic!("unexpected error: {error}");
        };
        assert_eq!(missing.len(), 6);
        let message = error.to_string();
        assert!(message.contains("scripts/install-mcp-servers"), "{message}");
        assert!(
            message.contains("server-everything/dist/index.js"),
            "{message}"
        );
        assert!(message.contains("venv/bin/mcp-server-fetch"), "{message}");
    }
}
