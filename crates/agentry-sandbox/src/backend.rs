//! Backends behind one trait, chosen by configuration.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::cgroup::Cgroups;
use crate::conn::Conn;
use crate::error::{Result, SandboxError};
use crate::launch::{LaunchParams, Slots, launch};
use crate::policy::{BackendKind, NetworkPolicy, SandboxConfig, SandboxSpec};
use crate::protocol::{InitConfig, InitMode, Rlimits};
use crate::proxy::{AllowList, PROXY_URL, Proxy, proxy_env};
use crate::report::{Capabilities, LimitsMode, NetworkMode, NetworkReport, SandboxReport};
use crate::sandbox::{Inner, Sandbox, Teardown, base_env, limits_warning};

/// How long an agent may take to build its sandbox.
const SETUP_TIMEOUT: Duration = Duration::from_secs(20);

/// Makes sandboxes.
#[async_trait]
pub trait Backend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// What isolation this backend gives on this host.
    fn capabilities(&self) -> &Capabilities;

    /// Creates a sandbox and waits until it serves.
    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox>;
}

/// The backend `config` names. The native backend refuses to start where the host cannot give
/// its isolation (it never falls back silently); the local backend always starts and logs that
/// it isolates nothing.
pub fn backend(config: SandboxConfig) -> Result<Arc<dyn Backend>> {
    Ok(match config.backend {
        BackendKind::Native => Arc::new(NativeBackend::new(config)?),
        BackendKind::Local => Arc::new(LocalBackend::new(config)?),
    })
}

fn init_exe(config: &SandboxConfig) -> Result<PathBuf> {
    match &config.init_exe {
        Some(p) => Ok(p.clone()),
        None => Ok(std::env::current_exe()?),
    }
}

/// The native Linux backend: namespaces, a new root, Landlock, seccomp, cgroups.
#[derive(Debug)]
pub struct NativeBackend {
    config: SandboxConfig,
    init_exe: PathBuf,
    caps: Capabilities,
}

impl NativeBackend {
    /// Probes the host; fails when user namespaces are unavailable.
    pub fn new(config: SandboxConfig) -> Result<Self> {
        let caps = Capabilities::probe();
        if !caps.native_available {
            return Err(SandboxError::Unavailable(format!(
                "the native sandbox needs user namespaces: {}",
                caps.warnings.join("; ")
            )));
        }
        let swept = crate::cgroup::sweep_stale() + crate::proxy::sweep_stale();
        if swept > 0 {
            tracing::info!(
                swept,
                "removed what earlier runtimes' sandboxes left behind"
            );
        }
        Ok(NativeBackend {
            init_exe: init_exe(&config)?,
            config,
            caps,
        })
    }
}

/// The local development backend: plain child processes with rlimits and timeouts. **No
/// isolation**: commands run as the runtime's user, see its files, and reach its network.
#[derive(Debug)]
pub struct LocalBackend {
    init_exe: PathBuf,
    caps: Capabilities,
}

impl LocalBackend {
    /// Makes the backend (it logs a warning: nothing is isolated).
    pub fn new(config: SandboxConfig) -> Result<Self> {
        tracing::warn!("the local sandbox backend isolates nothing: use it for development only");
        Ok(LocalBackend {
            init_exe: init_exe(&config)?,
            caps: Capabilities::probe(),
        })
    }
}

/// An `O_PATH` descriptor of a folder, to pass to the agent.
fn open_path(dir: &Path) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    Ok(std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
        .open(dir)?
        .into())
}

fn prepare_workspace(path: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(path)?;
    Ok(std::fs::canonicalize(path)?)
}

/// Gives the workspace tree to the sandbox's outer uid (symlinks are not followed).
fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    use std::os::unix::fs::MetadataExt;
    if meta.uid() != uid || meta.gid() != gid {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    }
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

fn rlimits(spec: &SandboxSpec, mode: LimitsMode) -> Rlimits {
    let l = &spec.limits;
    Rlimits {
        nofile: l.open_files,
        fsize: l.file_size,
        cpu_seconds: l.cpu_time.map(|d| d.as_secs().max(1)),
        address_space: if mode == LimitsMode::Rlimit {
            l.memory_bytes
        } else {
            None
        },
    }
}

/// A sandbox's network, set up on the host side.
struct Network {
    report: NetworkReport,
    /// Variables every command gets (the proxy's).
    env: Vec<(String, String)>,
    proxy: Option<Proxy>,
    warning: Option<String>,
}

/// Checks the network policy and, for a native allow-list, starts the sandbox's proxy.
fn network(spec: &SandboxSpec, mode: InitMode, outer: (u32, u32)) -> Result<Network> {
    let NetworkPolicy::AllowList {
        domains,
        allow_private,
    } = &spec.network
    else {
        return Ok(match mode {
            InitMode::Native => Network {
                report: NetworkReport::off(),
                env: Vec::new(),
                proxy: None,
                warning: None,
            },
            InitMode::Local => Network {
                report: NetworkReport {
                    mode: NetworkMode::Host,
                    ..NetworkReport::off()
                },
                env: Vec::new(),
                proxy: None,
                warning: None,
            },
        });
    };
    let allow = AllowList::new(domains, *allow_private)?;
    let mut report = NetworkReport {
        mode: NetworkMode::AllowList,
        allowed_domains: allow.domains().to_vec(),
        allow_private: allow.allow_private(),
        proxy_url: Some(PROXY_URL.to_string()),
    };
    match mode {
        InitMode::Native => {
            let owner = nix::unistd::geteuid().is_root().then_some(outer);
            Ok(Network {
                report,
                env: proxy_env(),
                proxy: Some(Proxy::start(allow, owner)?),
                warning: None,
            })
        }
        InitMode::Local => {
            report.mode = NetworkMode::Host;
            report.proxy_url = None;
            Ok(Network {
                report,
                env: Vec::new(),
                proxy: None,
                warning: Some(
                    "local backend: the network allow-list is not enforced (commands reach the \
                     runtime's whole network)"
                        .into(),
                ),
            })
        }
    }
}

struct Start {
    mode: InitMode,
    init_exe: PathBuf,
    workspace: PathBuf,
    home: String,
    cgroups: Cgroups,
    outer: (u32, u32),
    slot: Option<u32>,
}

async fn start(
    spec: &SandboxSpec,
    s: Start,
    backend: BackendKind,
    mut warnings: Vec<String>,
) -> Result<Sandbox> {
    let limits_mode = s.cgroups.mode;
    if let Some(w) = limits_warning(limits_mode) {
        warnings.push(w);
    }
    let cgroups = Arc::new(s.cgroups);
    let release = |cgroups: &Arc<Cgroups>, slot: Option<u32>| {
        cgroups.remove();
        if let Some(slot) = slot {
            Slots::release(slot);
        }
    };
    let net = match network(spec, s.mode, s.outer) {
        Ok(n) => n,
        Err(e) => {
            release(&cgroups, s.slot);
            return Err(e);
        }
    };
    warnings.extend(net.warning.clone());
    let ws_fd: std::os::fd::OwnedFd = match std::fs::File::open(&s.workspace) {
        Ok(f) => f.into(),
        Err(e) => {
            release(&cgroups, s.slot);
            return Err(e.into());
        }
    };
    let proxy_fd = match net.proxy.as_ref().map(|p| open_path(p.dir())).transpose() {
        Ok(fd) => fd,
        Err(e) => {
            release(&cgroups, s.slot);
            return Err(e.into());
        }
    };
    let init = InitConfig {
        mode: s.mode,
        runtime_pid: std::process::id() as i32,
        workspace: s.workspace.clone(),
        workspace_mount: spec.workspace_mount.clone(),
        hostname: spec.hostname.clone(),
        env: base_env(&s.home, &net.env, &spec.env),
        rlimits: rlimits(spec, limits_mode),
        tmp_size: spec.limits.tmp_size,
        ro_mounts: spec.ro_mounts.clone(),
        hide_usr_local: spec.hide_usr_local,
        proxy_dir: net.proxy.as_ref().map(|p| p.dir().to_path_buf()),
    };
    let params = LaunchParams {
        init_exe: s.init_exe,
        mode: s.mode,
        cgroup_procs: cgroups.procs_files(),
        nproc: if limits_mode == LimitsMode::Rlimit {
            spec.limits.max_processes
        } else {
            None
        },
        outer_id: s.outer,
        config: init,
        workspace: ws_fd,
        proxy_dir: proxy_fd,
    };
    let launched = match launch(params).await {
        Ok(l) => l,
        Err(e) => {
            release(&cgroups, s.slot);
            return Err(e);
        }
    };
    let teardown = Teardown {
        child: launched.child,
        native: s.mode == InitMode::Native,
        cgroups: cgroups.clone(),
        slot: s.slot,
        proxy: net.proxy,
    };
    let (conn, ready) = match Conn::start(launched.sock) {
        Ok(v) => v,
        Err(e) => {
            let _ = tokio::task::spawn_blocking(move || drop_teardown(teardown)).await;
            return Err(e);
        }
    };
    let inner = Inner {
        conn: conn.clone(),
        report: SandboxReport {
            backend,
            isolated: backend == BackendKind::Native,
            outer_uid: s.outer.0,
            limits: limits_mode,
            network: net.report,
            policy: None,
            warnings,
        },
        workspace: s.workspace,
        teardown: Mutex::new(Some(teardown)),
        cgroups,
        last_activity: Mutex::new(Instant::now()),
        running: std::sync::atomic::AtomicUsize::new(0),
        created: Instant::now(),
        paused_on_idle: std::sync::atomic::AtomicBool::new(false),
        pause_gate: Mutex::new(()),
    };
    let outcome = tokio::time::timeout(SETUP_TIMEOUT, ready).await;
    let report = match outcome {
        Ok(Ok(Ok(report))) => report,
        Ok(Ok(Err(e))) => {
            conn.set_reason("setup failed");
            drop(inner);
            return Err(SandboxError::Setup(e));
        }
        Ok(Err(_)) => {
            drop(inner);
            return Err(SandboxError::Setup(
                "the sandbox's agent exited during setup".into(),
            ));
        }
        Err(_) => {
            drop(inner);
            return Err(SandboxError::Setup(
                "the sandbox's agent did not become ready in time".into(),
            ));
        }
    };
    let mut inner = inner;
    if backend == BackendKind::Native {
        if report.landlock != "fully_enforced" {
            inner
                .report
                .warnings
                .push(format!("Landlock is {}", report.landlock));
        }
        if inner.report.network.mode == NetworkMode::AllowList && report.proxy_bridge.is_none() {
            drop(inner);
            return Err(SandboxError::Setup(
                "the sandbox's agent did not start the network proxy bridge".into(),
            ));
        }
        inner.report.policy = Some(report);
    }
    Ok(Sandbox::new(
        inner,
        spec.idle_timeout.map(|after| (after, spec.on_idle)),
        spec.limits.wall_time,
    ))
}

fn drop_teardown(t: Teardown) {
    let mut t = t;
    let _ = t.child.kill();
    let _ = t.child.wait();
    t.cgroups.remove();
    if let Some(slot) = t.slot {
        Slots::release(slot);
    }
}

#[async_trait]
impl Backend for NativeBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Native
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        if !spec.workspace_mount.starts_with('/') {
            return Err(SandboxError::InvalidRequest(
                "workspace_mount must be absolute".into(),
            ));
        }
        let workspace = prepare_workspace(&spec.workspace)?;
        let root = nix::unistd::geteuid().is_root();
        let (outer, slot) = if root {
            let slot = Slots::take(self.config.max_sandboxes).ok_or_else(|| {
                SandboxError::Unavailable("every sandbox uid slot is in use".into())
            })?;
            let id = self.config.uid_base.saturating_add(slot);
            if id == 0 {
                Slots::release(slot);
                return Err(SandboxError::InvalidRequest(
                    "uid_base maps a sandbox to root".into(),
                ));
            }
            // A large workspace takes a while to walk: off the async threads.
            let tree = workspace.clone();
            let chowned = tokio::task::spawn_blocking(move || chown_tree(&tree, id, id))
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            if let Err(e) = chowned {
                Slots::release(slot);
                return Err(SandboxError::Setup(format!("chown the workspace: {e}")));
            }
            ((id, id), Some(slot))
        } else {
            (
                (
                    nix::unistd::getuid().as_raw(),
                    nix::unistd::getgid().as_raw(),
                ),
                None,
            )
        };
        let cgroups = Cgroups::create(&spec.limits);
        let mut warnings = self.caps.warnings.clone();
        warnings.retain(|w| !w.contains("no writable cgroup"));
        let s = Start {
            mode: InitMode::Native,
            init_exe: self.init_exe.clone(),
            workspace,
            home: spec.workspace_mount.clone(),
            cgroups,
            outer,
            slot,
        };
        start(&spec, s, BackendKind::Native, warnings).await
    }
}

#[async_trait]
impl Backend for LocalBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Local
    }

    fn capabilities(&self) -> &Capabilities {
        &self.caps
    }

    async fn create(&self, spec: SandboxSpec) -> Result<Sandbox> {
        let workspace = prepare_workspace(&spec.workspace)?;
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let s = Start {
            mode: InitMode::Local,
            init_exe: self.init_exe.clone(),
            home: workspace.to_string_lossy().into_owned(),
            workspace,
            cgroups: Cgroups::create(&spec.limits),
            outer: (uid, gid),
            slot: None,
        };
        let warnings = vec!["local backend: no isolation (commands run as the runtime's user, with its files and network)".to_string()];
        start(&spec, s, BackendKind::Local, warnings).await
    }
}
