//! Per-sandbox cgroups, made by the runtime: v2 when the unified tree has the controllers, else
//! v1 hierarchies (created below our own cgroup of each hierarchy, as /proc/self/cgroup names it:
//! a memcg must nest under the one we are in), else none (rlimits only). The freezer (v2's
//! `cgroup.freeze`, v1's freezer hierarchy) pauses every process of a sandbox at once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::policy::Limits;
use crate::report::{CgroupSupport, LimitsMode};

const ROOT: &str = "/sys/fs/cgroup";

/// Our own cgroup path in a v1 hierarchy (by controller name) or in v2 (`None`).
fn own_path(controller: Option<&str>) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        match controller {
            None if ctrls.is_empty() => return Some(path.to_string()),
            Some(c) if ctrls.split(',').any(|x| x == c) => return Some(path.to_string()),
            _ => {}
        }
    }
    None
}

fn writable(dir: &Path) -> bool {
    nix::unistd::access(dir, nix::unistd::AccessFlags::W_OK).is_ok()
}

fn v2_parent() -> Option<PathBuf> {
    let controllers = std::fs::read_to_string(Path::new(ROOT).join("cgroup.controllers")).ok()?;
    let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
    if !(has("memory") && has("pids")) {
        return None;
    }
    let own = own_path(None)?;
    let dir = Path::new(ROOT).join(own.trim_start_matches('/'));
    writable(&dir).then_some(dir)
}

fn v1_parent(controller: &str) -> Option<PathBuf> {
    let own = own_path(Some(controller))?;
    let dir = Path::new(ROOT)
        .join(controller)
        .join(own.trim_start_matches('/'));
    (dir.join("cgroup.procs").exists() && writable(&dir)).then_some(dir)
}

/// The prefix of every sandbox cgroup's name, followed by the runtime's pid.
pub(crate) const NAME_PREFIX: &str = "agentry-sbx-";

/// Removes the cgroups that runtimes no longer alive left behind (a runtime killed with
/// SIGKILL takes its sandboxes' processes with it, not their empty cgroup directories). Only
/// directories named for a dead pid are touched, and `rmdir` refuses a cgroup that still has
/// processes. Returns how many were removed.
pub(crate) fn sweep_stale() -> usize {
    let mut parents: Vec<PathBuf> = v2_parent().into_iter().collect();
    parents.extend(
        ["memory", "pids", "cpu", "cpuacct", "freezer"]
            .into_iter()
            .filter_map(v1_parent),
    );
    parents
        .iter()
        .map(|parent| {
            crate::sys::remove_stale_entries(parent, NAME_PREFIX, |p| std::fs::remove_dir(p))
        })
        .sum()
}

/// What this host lets us use.
pub(crate) fn probe() -> CgroupSupport {
    if v2_parent().is_some() {
        CgroupSupport::V2
    } else if v1_parent("memory").is_some() && v1_parent("pids").is_some() {
        CgroupSupport::V1
    } else {
        CgroupSupport::None
    }
}

/// One sandbox's cgroups; removed by [`Cgroups::remove`].
#[derive(Debug)]
pub(crate) struct Cgroups {
    pub(crate) mode: LimitsMode,
    /// Every directory made (v2: one; v1: one per hierarchy).
    dirs: Vec<PathBuf>,
    /// The memory cgroup, for OOM counts.
    memory: Option<PathBuf>,
    /// Where the sandbox is frozen and thawed; `None` where the host has no freezer for us.
    freezer: Option<Freezer>,
    /// Whether it is frozen now.
    frozen: std::sync::atomic::AtomicBool,
    /// v1: its cgroup in the cpuacct hierarchy (CPU time); v2 reads `cpu.stat` in its cgroup.
    cpuacct: Option<PathBuf>,
}

/// What a sandbox's processes have used, where its cgroups tell.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ResourceUsage {
    /// CPU time of every process it has run, dead ones included, in nanoseconds.
    pub cpu_nanos: Option<u64>,
    /// Memory charged to it now (the page cache its files use included), in bytes.
    pub memory_bytes: Option<u64>,
}

/// A sandbox's freezer.
#[derive(Debug)]
enum Freezer {
    /// v2: the sandbox's cgroup (`cgroup.freeze`, `cgroup.events`).
    V2(PathBuf),
    /// v1: its cgroup in the freezer hierarchy (`freezer.state`).
    V1(PathBuf),
}

/// How long freezing or thawing may take before it is an error.
const FREEZE_WAIT: Duration = Duration::from_secs(5);

fn write(dir: &Path, file: &str, value: &str) -> std::io::Result<()> {
    std::fs::write(dir.join(file), value)
}

impl Cgroups {
    /// Makes the cgroups for one sandbox and writes its limits; `Rlimit` mode when none can be made.
    pub(crate) fn create(limits: &Limits) -> Cgroups {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "{NAME_PREFIX}{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        if let Some(Ok(cg)) = v2_parent().map(|parent| Self::create_v2(&parent, &name, limits)) {
            return cg;
        }
        if let (Some(mem), Some(pids)) = (v1_parent("memory"), v1_parent("pids")) {
            let mut cg = Cgroups {
                mode: LimitsMode::CgroupV1,
                dirs: Vec::new(),
                memory: None,
                freezer: None,
                frozen: Default::default(),
                cpuacct: None,
            };
            let ok = (|| -> std::io::Result<()> {
                let m = mem.join(&name);
                std::fs::create_dir(&m)?;
                cg.dirs.push(m.clone());
                cg.memory = Some(m.clone());
                if let Some(bytes) = limits.memory_bytes {
                    write(&m, "memory.limit_in_bytes", &bytes.to_string())?;
                    // No swap beyond the limit, where swap accounting exists.
                    let _ = write(&m, "memory.memsw.limit_in_bytes", &bytes.to_string());
                    let _ = write(&m, "memory.swappiness", "0");
                }
                let p = pids.join(&name);
                std::fs::create_dir(&p)?;
                cg.dirs.push(p.clone());
                if let Some(n) = limits.max_processes {
                    write(&p, "pids.max", &n.to_string())?;
                }
                if let (Some(pct), Some(cpu)) = (limits.cpu_percent, v1_parent("cpu")) {
                    let c = cpu.join(&name);
                    std::fs::create_dir(&c)?;
                    cg.dirs.push(c.clone());
                    write(&c, "cpu.cfs_period_us", "100000")?;
                    write(&c, "cpu.cfs_quota_us", &(u64::from(pct) * 1000).to_string())?;
                }
                // CPU accounting where the host mounts it (it may share the cpu hierarchy).
                if let Some(acct) = v1_parent("cpuacct") {
                    let a = acct.join(&name);
                    if cg.dirs.contains(&a) || std::fs::create_dir(&a).is_ok() {
                        if !cg.dirs.contains(&a) {
                            cg.dirs.push(a.clone());
                        }
                        cg.cpuacct = Some(a);
                    }
                }
                // A freezer where the host mounts one: without it the sandbox works, but cannot
                // be paused.
                if let Some(freezer) = v1_parent("freezer") {
                    let f = freezer.join(&name);
                    if std::fs::create_dir(&f).is_ok() {
                        cg.dirs.push(f.clone());
                        cg.freezer = Some(Freezer::V1(f));
                    }
                }
                Ok(())
            })();
            if ok.is_ok() {
                return cg;
            }
            tracing::warn!(error = ?ok.err(), "cgroup v1 setup failed: falling back to rlimits");
            cg.remove();
        }
        Cgroups {
            mode: LimitsMode::Rlimit,
            dirs: Vec::new(),
            memory: None,
            freezer: None,
            frozen: Default::default(),
            cpuacct: None,
        }
    }

    fn create_v2(parent: &Path, name: &str, limits: &Limits) -> std::io::Result<Cgroups> {
        let dir = parent.join(name);
        std::fs::create_dir(&dir)?;
        let cg = Cgroups {
            mode: LimitsMode::CgroupV2,
            dirs: vec![dir.clone()],
            memory: Some(dir.clone()),
            // Every non-root v2 cgroup has `cgroup.freeze` (Linux 5.2 and later).
            freezer: dir
                .join("cgroup.freeze")
                .exists()
                .then(|| Freezer::V2(dir.clone())),
            frozen: Default::default(),
            cpuacct: None,
        };
        let res = (|| -> std::io::Result<()> {
            if let Some(bytes) = limits.memory_bytes {
                write(&dir, "memory.max", &bytes.to_string())?;
                let _ = write(&dir, "memory.swap.max", "0");
            }
            if let Some(n) = limits.max_processes {
                write(&dir, "pids.max", &n.to_string())?;
            }
            if let Some(pct) = limits.cpu_percent {
                // Without the cpu controller in this subtree there is no cpu.max: the CPU share
                // goes unenforced (as under cgroup v1 without a cpu hierarchy) rather than the
                // memory and process limits falling back to rlimits.
                if dir.join("cpu.max").exists() {
                    write(
                        &dir,
                        "cpu.max",
                        &format!("{} 100000", u64::from(pct) * 1000),
                    )?;
                } else {
                    tracing::warn!(
                        "cgroup v2 has no cpu controller here: the CPU share is not enforced"
                    );
                }
            }
            Ok(())
        })();
        match res {
            Ok(()) => Ok(cg),
            Err(e) => {
                cg.remove();
                Err(e)
            }
        }
    }

    /// Whether the sandbox can be frozen here.
    pub(crate) fn can_freeze(&self) -> bool {
        self.freezer.is_some()
    }

    /// Freezes every process of the sandbox (no CPU, memory kept) or thaws them, and waits until
    /// the kernel says it is done. Blocking (it polls the state): call it off the async threads.
    pub(crate) fn set_frozen(&self, frozen: bool) -> std::io::Result<()> {
        let Some(freezer) = &self.freezer else {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "no cgroup freezer for this sandbox",
            ));
        };
        let deadline = std::time::Instant::now() + FREEZE_WAIT;
        loop {
            let done = match freezer {
                Freezer::V2(dir) => {
                    write(dir, "cgroup.freeze", if frozen { "1" } else { "0" })?;
                    let events = std::fs::read_to_string(dir.join("cgroup.events"))?;
                    let want = if frozen { "frozen 1" } else { "frozen 0" };
                    events.lines().any(|line| line.trim() == want)
                }
                Freezer::V1(dir) => {
                    // Written again while the state is FREEZING: the kernel retries the
                    // processes it could not freeze yet.
                    let want = if frozen { "FROZEN" } else { "THAWED" };
                    write(dir, "freezer.state", want)?;
                    std::fs::read_to_string(dir.join("freezer.state"))?.trim() == want
                }
            };
            if done {
                self.frozen.store(frozen, Ordering::SeqCst);
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the sandbox's processes did not {} within {FREEZE_WAIT:?}",
                        if frozen { "freeze" } else { "thaw" }
                    ),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    /// What the sandbox's processes have used (`None` for what its cgroups do not tell).
    pub(crate) fn usage(&self) -> ResourceUsage {
        let read = |dir: &Path, file: &str| std::fs::read_to_string(dir.join(file)).ok();
        let number = |text: Option<String>| text.and_then(|t| t.trim().parse::<u64>().ok());
        match self.mode {
            LimitsMode::CgroupV2 => {
                let Some(dir) = self.dirs.first() else {
                    return ResourceUsage::default();
                };
                let cpu_nanos = read(dir, "cpu.stat").and_then(|stat| {
                    stat.lines().find_map(|line| {
                        let micros = line
                            .strip_prefix("usage_usec ")?
                            .trim()
                            .parse::<u64>()
                            .ok()?;
                        Some(micros * 1000)
                    })
                });
                ResourceUsage {
                    cpu_nanos,
                    memory_bytes: number(read(dir, "memory.current")),
                }
            }
            LimitsMode::CgroupV1 => ResourceUsage {
                cpu_nanos: self
                    .cpuacct
                    .as_deref()
                    .and_then(|dir| number(read(dir, "cpuacct.usage"))),
                memory_bytes: self
                    .memory
                    .as_deref()
                    .and_then(|dir| number(read(dir, "memory.usage_in_bytes"))),
            },
            LimitsMode::Rlimit => ResourceUsage::default(),
        }
    }

    /// Whether the sandbox is frozen now.
    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen.load(Ordering::SeqCst)
    }

    /// The host pids of the sandbox's processes (its cgroup's members; empty without cgroups).
    pub(crate) fn pids(&self) -> Vec<i32> {
        let Some(dir) = self.dirs.first() else {
            return Vec::new();
        };
        std::fs::read_to_string(dir.join("cgroup.procs"))
            .map(|text| text.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// The `cgroup.procs` files a new process writes itself into.
    pub(crate) fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// How many OOM kills the memory cgroup has seen.
    pub(crate) fn oom_kills(&self) -> u64 {
        let Some(dir) = &self.memory else { return 0 };
        let (file, key) = match self.mode {
            LimitsMode::CgroupV2 => ("memory.events", "oom_kill"),
            _ => ("memory.oom_control", "oom_kill"),
        };
        std::fs::read_to_string(dir.join(file))
            .ok()
            .and_then(|text| {
                text.lines().find_map(|l| {
                    let mut it = l.split_whitespace();
                    (it.next() == Some(key))
                        .then(|| it.next().and_then(|v| v.parse().ok()))
                        .flatten()
                })
            })
            .unwrap_or(0)
    }

    /// Removes the directories (retrying while the last processes finish exiting).
    pub(crate) fn remove(&self) {
        for dir in &self.dirs {
            for attempt in 0..200 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(e) => {
                        if attempt == 199 {
                            tracing::warn!(dir = %dir.display(), error = %e, "could not remove a sandbox cgroup");
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
    }
}
