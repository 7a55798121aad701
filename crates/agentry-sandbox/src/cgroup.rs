//! Per-sandbox cgroups, made by the runtime: v2 when the unified tree has the controllers, else
//! v1 hierarchies (created below our own cgroup of each hierarchy, as /proc/self/cgroup names it:
//! a memcg must nest under the one we are in), else none (rlimits only).

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
    parents.extend(["memory", "pids", "cpu"].into_iter().filter_map(v1_parent));
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
}

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
        }
    }

    fn create_v2(parent: &Path, name: &str, limits: &Limits) -> std::io::Result<Cgroups> {
        let dir = parent.join(name);
        std::fs::create_dir(&dir)?;
        let cg = Cgroups {
            mode: LimitsMode::CgroupV2,
            dirs: vec![dir.clone()],
            memory: Some(dir.clone()),
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
