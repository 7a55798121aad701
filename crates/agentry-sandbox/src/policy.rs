//! What a sandbox should be: backend choice, workspace, environment, network and limits.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which backend runs sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// Namespaces, a new root, Landlock, seccomp, cgroups (Linux; the default).
    Native,
    /// Plain child processes with rlimits and timeouts. **No isolation**: for development only.
    Local,
}

/// Backend configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxConfig {
    /// The backend.
    pub backend: BackendKind,
    /// The executable that serves as the sandbox's agent: it must call
    /// [`crate::init::maybe_run_init`] first thing in `main`. Default: the current executable.
    pub init_exe: Option<PathBuf>,
    /// When the runtime runs as root, sandbox `n` runs as outer uid/gid `uid_base + n`, never 0.
    pub uid_base: u32,
    /// How many sandboxes may exist at once (the number of outer uids reserved).
    pub max_sandboxes: u32,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            backend: BackendKind::Native,
            init_exe: None,
            uid_base: 100_000,
            max_sandboxes: 65_536,
        }
    }
}

/// The network a sandbox gets.
///
/// Serialised as `"off"` or `{"allow_list": {"domains": ["example.com", "*.example.org"],
/// "allow_private": false}}` (`allow_private` may be left out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkPolicy {
    /// A network namespace with only loopback, up (the default).
    #[default]
    Off,
    /// Still a network namespace with only loopback, plus an HTTP proxy on the host that reaches
    /// only the listed domains (native backend). Inside, `127.0.0.1:3128` leads to the proxy and
    /// `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` (and their lower-case forms) point there, with
    /// `NO_PROXY=localhost,127.0.0.1,::1`. The proxy forwards plain `http://` requests and
    /// tunnels anything else through `CONNECT` (https), to any port of an allowed host. Clients
    /// that ignore the proxy variables reach nothing: the namespace has no route out.
    ///
    /// The proxy resolves names on the host and connects to the addresses it checked (no second
    /// lookup). It does not look inside tunnels: a TLS client can still name another host in its
    /// SNI or `Host` header to a server on the list (domain fronting through a shared CDN).
    AllowList {
        /// The hosts that may be reached: `example.com` (that name exactly), `*.example.com`
        /// (every subdomain of example.com at any depth, not example.com itself), or an IP
        /// address written exactly (`203.0.113.7`, `::1` or `[::1]`); an IP literal that is not
        /// listed is refused even when a listed name resolves to it. Matching ignores case and a
        /// trailing dot.
        domains: Vec<String>,
        /// Let the proxy connect to loopback, private, link-local and other non-public addresses
        /// (a listed name that resolves to one, or a listed IP literal). Off by default, so a
        /// listed name cannot be pointed at the host or its network (SSRF); meant for tests and
        /// local development against servers on the host.
        #[serde(default)]
        allow_private: bool,
    },
}

impl NetworkPolicy {
    /// A policy allowing `domains`, public addresses only.
    pub fn allow_list<I, S>(domains: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        NetworkPolicy::AllowList {
            domains: domains.into_iter().map(Into::into).collect(),
            allow_private: false,
        }
    }

    /// Checks the policy without starting anything: every allow-list entry must be a domain, a
    /// `*.` wildcard domain or an IP address ([`SandboxError::InvalidRequest`] names the bad one).
    pub fn validate(&self) -> crate::error::Result<()> {
        match self {
            NetworkPolicy::Off => Ok(()),
            NetworkPolicy::AllowList {
                domains,
                allow_private,
            } => crate::proxy::AllowList::new(domains, *allow_private).map(drop),
        }
    }
}

/// Resource limits. `None` leaves a limit off.
///
/// The defaults bound every sandbox: 1 GiB of memory, 256 processes, one core's worth of CPU
/// (100%), a day's lifetime ([`DEFAULT_WALL_TIME`]; a pool remakes a session's sandbox on its
/// next use), 1 GiB files, 1024 open files and a 256 MiB `/tmp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory of the whole sandbox (cgroups), or of each process (rlimit fallback), in bytes.
    pub memory_bytes: Option<u64>,
    /// Processes (and threads) in the sandbox.
    pub max_processes: Option<u64>,
    /// CPU share in percent of one core (cgroups only, where the cpu controller is available;
    /// elsewhere it is not enforced).
    pub cpu_percent: Option<u32>,
    /// CPU time of each process (`RLIMIT_CPU`).
    pub cpu_time: Option<Duration>,
    /// Wall-clock lifetime of the sandbox: it is killed when it runs out.
    pub wall_time: Option<Duration>,
    /// Largest file a process may write, in bytes (`RLIMIT_FSIZE`).
    pub file_size: Option<u64>,
    /// Open files per process (`RLIMIT_NOFILE`).
    pub open_files: Option<u64>,
    /// Size of the sandbox's `/tmp` (a tmpfs), in bytes.
    pub tmp_size: u64,
}

/// The default CPU share: one core.
pub const DEFAULT_CPU_PERCENT: u32 = 100;

/// The default lifetime of a sandbox: a day.
pub const DEFAULT_WALL_TIME: Duration = Duration::from_secs(24 * 60 * 60);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            memory_bytes: Some(1 << 30),
            max_processes: Some(256),
            cpu_percent: Some(DEFAULT_CPU_PERCENT),
            cpu_time: None,
            wall_time: Some(DEFAULT_WALL_TIME),
            file_size: Some(1 << 30),
            open_files: Some(1024),
            tmp_size: 256 << 20,
        }
    }
}

/// One sandbox's specification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxSpec {
    /// The host folder mounted read-write (created if missing). When the runtime runs as root,
    /// it is chowned to the sandbox's outer uid.
    pub workspace: PathBuf,
    /// Where the workspace appears inside (native), and the default working directory.
    pub workspace_mount: String,
    /// Extra host paths bound read-only at the same place inside (native).
    pub ro_mounts: Vec<PathBuf>,
    /// Environment added to the minimal base (`PATH`, `HOME`, `LANG`, `TMPDIR`). Nothing of the
    /// runtime's own environment is passed.
    pub env: BTreeMap<String, String>,
    /// The network.
    pub network: NetworkPolicy,
    /// Resource limits.
    pub limits: Limits,
    /// Close the sandbox after this long without a request and with no command running (or
    /// pause it: [`SandboxSpec::on_idle`]).
    pub idle_timeout: Option<Duration>,
    /// What the idle timeout does: close the sandbox (the default), or pause it where the host
    /// can, to be resumed by itself on the next command or file operation.
    #[serde(default)]
    pub on_idle: IdleAction,
    /// The hostname inside.
    pub hostname: String,
    /// Hide the host's `/usr/local` (an empty read-only folder inside, native). Off by default:
    /// many images keep their tools there (the official Python images, say); turn it on where
    /// `/usr/local` holds host configuration or credentials.
    #[serde(default)]
    pub hide_usr_local: bool,
}

impl SandboxSpec {
    /// A specification with defaults around a workspace folder.
    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        SandboxSpec {
            workspace: workspace.into(),
            workspace_mount: "/workspace".into(),
            ro_mounts: Vec::new(),
            env: BTreeMap::new(),
            network: NetworkPolicy::Off,
            limits: Limits::default(),
            idle_timeout: None,
            on_idle: IdleAction::Close,
            hostname: "sandbox".into(),
            hide_usr_local: false,
        }
    }
}

/// What a sandbox's idle timeout does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IdleAction {
    /// Close it: its processes end and its slot is freed.
    #[default]
    Close,
    /// Pause it (its processes frozen, memory kept): the next command or file operation
    /// resumes it first. Where the host has no cgroup freezer for it, it is closed instead.
    /// A paused sandbox still ends at its wall-time limit.
    Pause,
}

/// A command to run in a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    /// Program and arguments; the program is looked up in `PATH` unless it holds a `/`.
    pub argv: Vec<String>,
    /// Environment added for this command.
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the workspace).
    pub cwd: Option<String>,
    /// Give the command a stdin pipe (otherwise stdin is `/dev/null`).
    pub stdin: bool,
    /// Kill the command (and everything it started) after this long.
    pub timeout: Option<Duration>,
}

impl ExecRequest {
    /// A command from its argv.
    pub fn new<I, S>(argv: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ExecRequest {
            argv: argv.into_iter().map(Into::into).collect(),
            env: BTreeMap::new(),
            cwd: None,
            stdin: false,
            timeout: None,
        }
    }

    /// `/bin/sh -c <script>`.
    pub fn shell(script: impl Into<String>) -> Self {
        Self::new(["/bin/sh".to_string(), "-c".to_string(), script.into()])
    }

    /// Sets the timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Asks for a stdin pipe.
    pub fn with_stdin(mut self) -> Self {
        self.stdin = true;
        self
    }

    /// Sets the working directory.
    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(key.into(), value.into());
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn network_policy_wire_shape() {
        assert_eq!(
            serde_json::to_value(NetworkPolicy::Off).unwrap(),
            serde_json::json!("off")
        );
        let allow = NetworkPolicy::allow_list(["example.com", "*.example.org"]);
        assert_eq!(
            serde_json::to_value(&allow).unwrap(),
            serde_json::json!({"allow_list": {"domains": ["example.com", "*.example.org"], "allow_private": false}})
        );
        let parsed: NetworkPolicy =
            serde_json::from_value(serde_json::json!({"allow_list": {"domains": ["a.test"]}}))
                .unwrap();
        assert_eq!(parsed, NetworkPolicy::allow_list(["a.test"]));
        assert_eq!(NetworkPolicy::default(), NetworkPolicy::Off);
    }
}
