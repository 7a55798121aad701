//! What the host offers ([`Capabilities`]) and what one sandbox got ([`SandboxReport`]): both
//! serialisable, for `agentry doctor` and the HTTP API. A weaker fallback is always visible here.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::policy::BackendKind;

/// How resource limits are enforced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitsMode {
    /// cgroup v2 (`memory.max`, `pids.max`, `cpu.max`) plus rlimits.
    CgroupV2,
    /// cgroup v1 hierarchies (memory, pids, cpu) plus rlimits.
    CgroupV1,
    /// rlimits only: per-process memory (address space), processes per sandbox uid, CPU time,
    /// file size, open files. Weaker: memory is per process, not per sandbox.
    Rlimit,
}

/// The cgroup support this host gives the current user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupSupport {
    /// A writable cgroup v2 tree with the memory and pids controllers.
    V2,
    /// Writable cgroup v1 memory and pids hierarchies below our own cgroups.
    V1,
    /// Nothing we may write to.
    None,
}

/// What isolation this host really gives, as probed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The operating system (`linux`, …).
    pub os: String,
    /// The runtime runs as root (sandboxes then run as an unprivileged outer uid).
    pub running_as_root: bool,
    /// A user namespace, with mount, pid, net, ipc and uts namespaces inside it, can be made.
    pub user_namespaces: bool,
    /// The kernel's Landlock ABI version, if Landlock is enabled.
    pub landlock_abi: Option<u32>,
    /// seccomp filters are available.
    pub seccomp: bool,
    /// Which cgroup interface the runtime can use for limits.
    pub cgroup: CgroupSupport,
    /// The limits a native sandbox gets here.
    pub limits: LimitsMode,
    /// The native backend is usable.
    pub native_available: bool,
    /// Human-readable notes on anything weaker than the full design.
    pub warnings: Vec<String>,
}

/// The policy the agent reports after building the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitReport {
    /// Namespaces the sandbox runs in.
    pub namespaces: Vec<String>,
    /// Landlock: `fully_enforced`, `partially_enforced` or `not_enforced`.
    pub landlock: String,
    /// A seccomp deny-list is installed.
    pub seccomp: bool,
    /// `no_new_privs` is set.
    pub no_new_privs: bool,
    /// Every capability (effective, permitted, inheritable, ambient, bounding) is dropped.
    pub capabilities_dropped: bool,
    /// Only loopback is up and no proxy runs: nothing outside is reachable.
    pub network_off: bool,
    /// The network as the agent set it up: `off`, `allow_list` (loopback plus the proxy bridge)
    /// or `host` (local backend: the runtime's own network).
    pub network: String,
    /// Where the bridge to the host's allow-list proxy listens inside (`127.0.0.1:3128`), when
    /// one runs.
    pub proxy_bridge: Option<String>,
}

/// Which network a sandbox has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NetworkMode {
    /// Loopback only.
    Off,
    /// Loopback only, plus an HTTP proxy that reaches only the allowed domains.
    AllowList,
    /// The runtime's own network, unrestricted (local backend).
    Host,
}

/// The network policy a sandbox got, so it is never silent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkReport {
    /// The mode.
    pub mode: NetworkMode,
    /// The allow-list the proxy enforces (normalised: lower case, no trailing dot).
    pub allowed_domains: Vec<String>,
    /// The proxy may connect to loopback, private and link-local addresses.
    pub allow_private: bool,
    /// The proxy URL as the sandbox's commands see it (also in their `HTTP_PROXY` etc.).
    pub proxy_url: Option<String>,
}

impl NetworkReport {
    /// No network.
    pub fn off() -> Self {
        NetworkReport {
            mode: NetworkMode::Off,
            allowed_domains: Vec::new(),
            allow_private: false,
            proxy_url: None,
        }
    }
}

/// What one sandbox got.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxReport {
    /// The backend that made it.
    pub backend: BackendKind,
    /// `false` for the local backend: commands run as plain processes of the runtime's user.
    pub isolated: bool,
    /// The uid the sandbox's processes have outside (on the host).
    pub outer_uid: u32,
    /// How limits are enforced.
    pub limits: LimitsMode,
    /// The network it got.
    pub network: NetworkReport,
    /// The policy inside (native only).
    pub policy: Option<InitReport>,
    /// Anything weaker than the full design, in words.
    pub warnings: Vec<String>,
}

/// The type of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed by `stat` or `list`).
    Symlink,
    /// Anything else (device, FIFO, socket).
    Other,
}

/// Metadata of one path, as seen inside the sandbox (`lstat`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStat {
    /// The type.
    pub kind: FileKind,
    /// Size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, seconds since the epoch.
    pub modified: i64,
    /// A symlink's target.
    pub symlink_target: Option<String>,
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// The file name.
    pub name: String,
    /// Its metadata.
    pub stat: FileStat,
}

impl Capabilities {
    /// Probes the host: namespaces (by really making them in a short-lived child), Landlock's ABI,
    /// seccomp, cgroups, and whether the runtime runs as root.
    pub fn probe() -> Capabilities {
        let running_as_root = nix::unistd::geteuid().is_root();
        let user_namespaces = crate::sys::probe_namespaces();
        let landlock_abi = crate::sys::landlock_abi();
        let seccomp = crate::sys::seccomp_available();
        let cgroup = crate::cgroup::probe();
        let limits = match cgroup {
            CgroupSupport::V2 => LimitsMode::CgroupV2,
            CgroupSupport::V1 => LimitsMode::CgroupV1,
            CgroupSupport::None => LimitsMode::Rlimit,
        };
        let mut warnings = Vec::new();
        if !user_namespaces {
            warnings.push("user namespaces are unavailable: the native backend cannot run".into());
        }
        match landlock_abi {
            None => warnings
                .push("Landlock is unavailable: filesystem policy relies on mounts only".into()),
            Some(abi) if abi < 6 => warnings.push(format!(
                "Landlock ABI {abi} < 6: no scoping of abstract unix sockets and signals"
            )),
            Some(_) => {}
        }
        if !seccomp {
            warnings.push("seccomp is unavailable: no syscall deny-list".into());
        }
        if cgroup == CgroupSupport::None {
            warnings.push(
                "no writable cgroup: limits fall back to rlimits (memory per process, not per sandbox)"
                    .into(),
            );
        }
        if !Path::new("/proc/self/ns/user").exists() {
            warnings.push("/proc/self/ns/user is missing".into());
        }
        Capabilities {
            os: std::env::consts::OS.into(),
            running_as_root,
            user_namespaces,
            landlock_abi,
            seccomp,
            cgroup,
            limits,
            native_available: user_namespaces && cfg!(target_os = "linux"),
            warnings,
        }
    }
}
