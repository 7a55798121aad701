//! The sandbox's filesystem, built by PID 1 in its own mount namespace: a tmpfs root with
//! read-only system folders, a synthesised /etc, a fresh /proc, a minimal /dev, a size-capped
//! /tmp and the workspace read-write, and (allow-list network) the proxy's socket folder
//! read-only; then `pivot_root` and the old root detached.
//!
//! Host-wide `/proc` files that say something about the host's kernel, keys or devices
//! ([`MASKED_PROC_FILES`]: kernel symbols, `kcore`, keys, timers…) are covered with
//! `/dev/null`, and such folders ([`MASKED_PROC_DIRS`]) with an empty read-only tmpfs, as
//! container runtimes do. The host's `/usr/local` can be hidden the same way
//! ([`crate::SandboxSpec::hide_usr_local`]).

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::statvfs::{FsFlags, statvfs};

use crate::protocol::InitConfig;

/// Where the new root is assembled: our private view of /tmp (the host's /tmp is hidden from
/// this mount namespace only). The workspace is bound through its descriptor, so a workspace
/// under /tmp is still reachable.
const STAGE: &str = "/tmp";

fn err(what: &str, path: &Path, e: impl std::fmt::Display) -> String {
    format!("{what} {}: {e}", path.display())
}

fn mkdir_all(path: &Path) -> Result<(), String> {
    std::fs::create_dir_all(path).map_err(|e| err("mkdir", path, e))
}

/// Re-mounts a bind read-only (or not), keeping the flags the kernel locks on mounts that came
/// from a more privileged namespace (noexec, noatime…): dropping them would be refused.
fn remount_bind(target: &Path, read_only: bool) -> Result<(), String> {
    let st = statvfs(target).map_err(|e| err("statvfs", target, e))?;
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    let f = st.flags();
    if f.contains(FsFlags::ST_NOEXEC) {
        flags |= MsFlags::MS_NOEXEC;
    }
    if f.contains(FsFlags::ST_NOATIME) {
        flags |= MsFlags::MS_NOATIME;
    }
    if f.contains(FsFlags::ST_NODIRATIME) {
        flags |= MsFlags::MS_NODIRATIME;
    }
    if f.contains(FsFlags::ST_RELATIME) {
        flags |= MsFlags::MS_RELATIME;
    }
    mount(None::<&str>, target, None::<&str>, flags, None::<&str>)
        .map_err(|e| err("remount", target, e))
}

fn bind(src: &Path, target: &Path, read_only: bool) -> Result<(), String> {
    mount(
        Some(src),
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| err("bind", src, e))?;
    remount_bind(target, read_only)
}

/// Binds a host path read-only at the same place under `root` (a symlink is copied as a symlink).
fn mirror_ro(root: &Path, host: &Path) -> Result<(), String> {
    let Ok(meta) = std::fs::symlink_metadata(host) else {
        return Ok(());
    };
    let rel = host.strip_prefix("/").unwrap_or(host);
    let target = root.join(rel);
    if let Some(parent) = target.parent() {
        mkdir_all(parent)?;
    }
    if meta.file_type().is_symlink() {
        let link = std::fs::read_link(host).map_err(|e| err("readlink", host, e))?;
        return symlink(&link, &target).map_err(|e| err("symlink", &target, e));
    }
    if meta.is_dir() {
        mkdir_all(&target)?;
    } else {
        std::fs::File::create(&target).map_err(|e| err("create", &target, e))?;
    }
    bind(host, &target, true)
}

/// Opens each read-only mount the operator asked for (symlinks followed): its path, a
/// descriptor, and whether it is a folder. One that does not exist is an error, never skipped.
fn open_ro_mounts(paths: &[PathBuf]) -> Result<Vec<(PathBuf, OwnedFd, bool)>, String> {
    use nix::fcntl::{OFlag, open};
    paths
        .iter()
        .map(|path| {
            if !path.is_absolute() {
                return Err(format!(
                    "read-only mount {} is not absolute",
                    path.display()
                ));
            }
            let fd = open(
                path,
                OFlag::O_PATH | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| err("open the read-only mount", path, e))?;
            let is_dir = nix::sys::stat::fstat(&fd)
                .map_err(|e| err("stat the read-only mount", path, e))?
                .st_mode
                & nix::libc::S_IFMT
                == nix::libc::S_IFDIR;
            Ok((path.clone(), fd, is_dir))
        })
        .collect()
}

/// `/proc` files covered with `/dev/null` (those the kernel has).
pub(crate) const MASKED_PROC_FILES: &[&str] = &[
    "kallsyms",
    "kcore",
    "keys",
    "key-users",
    "modules",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "latency_stats",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "sysrq-trigger",
    "config.gz",
];

/// `/proc` folders covered with an empty read-only tmpfs (those the kernel has).
pub(crate) const MASKED_PROC_DIRS: &[&str] = &["acpi", "asound", "scsi", "driver"];

/// Covers a folder with an empty read-only tmpfs.
fn mask_dir(target: &Path) -> Result<(), String> {
    mount(
        Some("tmpfs"),
        target,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC | MsFlags::MS_RDONLY,
        Some("mode=0555,size=4k"),
    )
    .map_err(|e| err("mask", target, e))
}

/// Masks the host-wide files and folders of the sandbox's `/proc` (mounted at `proc`), with
/// `null` (the sandbox's `/dev/null`) over each file.
fn mask_proc(proc: &Path, null: &Path) -> Result<(), String> {
    for name in MASKED_PROC_FILES {
        let target = proc.join(name);
        if std::fs::symlink_metadata(&target).is_ok_and(|meta| meta.is_file()) {
            // A plain bind, as for the /dev nodes: a read gives nothing, a write goes nowhere.
            mount(
                Some(null),
                &target,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .map_err(|e| err("mask", &target, e))?;
        }
    }
    for name in MASKED_PROC_DIRS {
        let target = proc.join(name);
        if std::fs::symlink_metadata(&target).is_ok_and(|meta| meta.is_dir()) {
            mask_dir(&target)?;
        }
    }
    Ok(())
}

const PASSWD: &str = "root:x:0:0:sandbox:/workspace:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
const GROUP: &str = "root:x:0:\nnogroup:x:65534:\n";
const NSSWITCH: &str = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\nprotocols: files\nservices: files\n";
const RESOLV: &str = "# The network is off in this sandbox.\noptions timeout:1 attempts:1\n";

/// Builds the root and pivots into it. `workspace` is a descriptor of the host workspace folder,
/// `proxy_dir` one of the host folder holding the network proxy's socket.
pub(crate) fn build(
    cfg: &InitConfig,
    workspace: &OwnedFd,
    proxy_dir: Option<&OwnedFd>,
) -> Result<(), String> {
    let root = PathBuf::from(STAGE);
    // The operator's read-only mounts are opened first: the stage covers /tmp, where some may
    // be (a clone of a repository under /tmp, say), and the sandbox's own /tmp covers them too
    // unless they go on top of it.
    let extras = open_ro_mounts(&cfg.ro_mounts)?;
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(|e| format!("make / private: {e}"))?;
    mount(
        Some("tmpfs"),
        &root,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=0755,size=16m"),
    )
    .map_err(|e| err("mount tmpfs", &root, e))?;

    // System folders, read-only: /usr, and /bin, /lib… as the host has them (symlinks into /usr
    // on a merged-/usr system, else binds).
    mirror_ro(&root, Path::new("/usr"))?;
    if cfg.hide_usr_local {
        let local = root.join("usr/local");
        if std::fs::symlink_metadata(&local).is_ok_and(|meta| meta.is_dir()) {
            mask_dir(&local)?;
        }
    }
    for dir in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        mirror_ro(&root, Path::new(dir))?;
    }

    // A synthesised /etc: nothing of the host's users, hosts or resolver; only public files.
    let etc = root.join("etc");
    mkdir_all(&etc)?;
    let passwd = PASSWD.replace("/workspace", &cfg.workspace_mount);
    let hosts = format!("127.0.0.1 localhost {0}\n::1 localhost {0}\n", cfg.hostname);
    for (name, body) in [
        ("passwd", passwd.as_str()),
        ("group", GROUP),
        ("hosts", hosts.as_str()),
        ("resolv.conf", RESOLV),
        ("nsswitch.conf", NSSWITCH),
        ("hostname", &format!("{}\n", cfg.hostname)),
    ] {
        std::fs::write(etc.join(name), body).map_err(|e| err("write", &etc.join(name), e))?;
    }
    for public in [
        "/etc/ssl",
        "/etc/ca-certificates",
        "/etc/alternatives",
        "/etc/ld.so.cache",
        "/etc/localtime",
    ] {
        mirror_ro(&root, Path::new(public))?;
    }

    // A minimal /dev: device binds (never nodev), the usual links, a small /dev/shm.
    let dev = root.join("dev");
    mkdir_all(&dev)?;
    mount(
        Some("tmpfs"),
        &dev,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
        Some("mode=0755,size=64k"),
    )
    .map_err(|e| err("mount tmpfs", &dev, e))?;
    for node in ["null", "zero", "full", "random", "urandom"] {
        let target = dev.join(node);
        std::fs::File::create(&target).map_err(|e| err("create", &target, e))?;
        let host = Path::new("/dev").join(node);
        mount(
            Some(&host),
            &target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|e| err("bind", &host, e))?;
    }
    for (link, to) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(to, dev.join(link)).map_err(|e| err("symlink", &dev.join(link), e))?;
    }
    let shm = dev.join("shm");
    mkdir_all(&shm)?;
    mount(
        Some("tmpfs"),
        &shm,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some("mode=1777,size=64m"),
    )
    .map_err(|e| err("mount tmpfs", &shm, e))?;

    // A size-capped /tmp.
    let tmp = root.join("tmp");
    mkdir_all(&tmp)?;
    let opts = format!("mode=1777,size={}", cfg.tmp_size.max(4096));
    mount(
        Some("tmpfs"),
        &tmp,
        Some("tmpfs"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        Some(opts.as_str()),
    )
    .map_err(|e| err("mount tmpfs", &tmp, e))?;

    // The operator's read-only mounts, through the descriptors opened before the stage, on top
    // of /tmp when they are under it.
    for (path, fd, is_dir) in &extras {
        let target = root.join(path.strip_prefix("/").unwrap_or(path));
        if let Some(parent) = target.parent() {
            mkdir_all(parent)?;
        }
        if *is_dir {
            mkdir_all(&target)?;
        } else if std::fs::symlink_metadata(&target).is_err() {
            std::fs::File::create(&target).map_err(|e| err("create", &target, e))?;
        }
        let src = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        bind(&src, &target, true)?;
    }

    // The workspace, read-write, through the descriptor the runtime opened.
    let ws_rel = cfg.workspace_mount.trim_start_matches('/');
    if ws_rel.is_empty() || ws_rel.split('/').any(|c| c == ".." || c == ".") {
        return Err(format!("bad workspace mount point {}", cfg.workspace_mount));
    }
    let ws = root.join(ws_rel);
    mkdir_all(&ws)?;
    let src = PathBuf::from(format!("/proc/self/fd/{}", workspace.as_raw_fd()));
    bind(&src, &ws, false)?;

    // The network proxy's socket folder, read-only (connecting to a socket needs no write access
    // to its mount).
    if let Some(dir) = proxy_dir {
        let target = root.join(crate::proxy::INSIDE_DIR.trim_start_matches('/'));
        mkdir_all(&target)?;
        let src = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd()));
        bind(&src, &target, true)?;
    }

    // A fresh /proc of the new pid namespace.
    let proc = root.join("proc");
    mkdir_all(&proc)?;
    mount(
        Some("proc"),
        &proc,
        Some("proc"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|e| err("mount proc", &proc, e))?;
    mask_proc(&proc, &dev.join("null"))?;

    // Into the new root; the old one is detached entirely.
    nix::unistd::chdir(&root).map_err(|e| err("chdir", &root, e))?;
    nix::unistd::pivot_root(".", ".").map_err(|e| format!("pivot_root: {e}"))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(|e| format!("detach the old root: {e}"))?;
    nix::unistd::chdir("/").map_err(|e| format!("chdir /: {e}"))?;
    remount_bind(Path::new("/dev"), true)?;
    remount_bind(Path::new("/"), true)?;
    Ok(())
}
