//! Thin wrappers over the syscalls nix does not cover, and /proc helpers.

use std::collections::HashMap;
use std::sync::OnceLock;

/// The namespaces a native sandbox creates, by `clone` flag.
pub(crate) const NAMESPACE_FLAGS: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWCGROUP;

/// The namespaces' names, for reports.
pub(crate) const NAMESPACE_NAMES: [&str; 7] =
    ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"];

/// Whether a child can unshare every namespace a sandbox needs (tried for real, once).
pub(crate) fn probe_namespaces() -> bool {
    static RESULT: OnceLock<bool> = OnceLock::new();
    *RESULT.get_or_init(|| {
        // SAFETY: the child only makes raw syscalls (unshare, _exit), which are async-signal-safe,
        // so forking a multi-threaded process is sound; the parent reaps it below.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: raw syscalls in the forked child, see above.
            unsafe {
                let ok = libc::unshare(NAMESPACE_FLAGS) == 0;
                libc::_exit(if ok { 0 } else { 1 });
            }
        }
        if pid < 0 {
            return false;
        }
        let mut status = 0;
        loop {
            // SAFETY: waiting for our own child with a valid pointer to an int.
            let r = unsafe { libc::waitpid(pid, &mut status, 0) };
            if r == pid {
                break;
            }
            if r < 0 && nix::errno::Errno::last() != nix::errno::Errno::EINTR {
                return false;
            }
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0
    })
}

/// The kernel's Landlock ABI version, if Landlock is enabled.
pub(crate) fn landlock_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_long = 1;
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI version (or an
    // error); it reads no memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(r).ok().filter(|v| *v > 0)
}

/// Whether seccomp filters are available (the `Seccomp` line of /proc/self/status).
pub(crate) fn seccomp_available() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .map(|s| s.lines().any(|l| l.starts_with("Seccomp:")))
        .unwrap_or(false)
}

/// Sets an rlimit (soft = hard).
pub(crate) fn set_rlimit(resource: libc::__rlimit_resource_t, value: u64) -> std::io::Result<()> {
    let lim = libc::rlimit {
        rlim_cur: value,
        rlim_max: value,
    };
    // SAFETY: setrlimit reads the struct we pass by reference.
    if unsafe { libc::setrlimit(resource, &lim) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Drops every capability: bounding set, ambient set, and effective/permitted/inheritable.
pub(crate) fn drop_all_capabilities() -> std::io::Result<()> {
    for cap in 0..64 {
        // SAFETY: prctl with integer arguments only.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) };
        if r != 0 {
            if nix::errno::Errno::last() == nix::errno::Errno::EINVAL {
                break; // past the last capability this kernel knows
            }
            return Err(std::io::Error::last_os_error());
        }
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset reads a v3 header and two data structs, which we pass with the layout the
    // kernel expects (repr(C), two elements for version 3).
    if unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Brings the loopback interface up (inside a fresh network namespace).
pub(crate) fn loopback_up() -> std::io::Result<()> {
    // SAFETY: plain socket syscall.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: an all-zero ifreq is a valid value of this plain C struct.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    req.ifr_ifru.ifru_flags =
        (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the ifreq we pass; fd is the socket made above.
    let r = unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) };
    let err = std::io::Error::last_os_error();
    // SAFETY: closing the socket we own.
    unsafe { libc::close(fd) };
    if r != 0 {
        return Err(err);
    }
    Ok(())
}

/// Closes every descriptor from `first` up.
pub(crate) fn close_from(first: u32) {
    // SAFETY: close_range only closes descriptors; the caller owns none of them any more.
    unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0) };
}

/// Parent of every process, from /proc (`pid → ppid`).
fn process_parents() -> HashMap<i32, i32> {
    let mut map = HashMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return map;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<i32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid …": comm may hold spaces and parentheses, so cut at the last ')'.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        let mut fields = rest.split_whitespace();
        if fields.next() == Some("Z") {
            continue; // a zombie: nothing left to kill, its parent reaps it
        }
        if let Some(ppid) = fields.next().and_then(|s| s.parse::<i32>().ok()) {
            map.insert(pid, ppid);
        }
    }
    map
}

/// Every descendant of `root` (not `root` itself).
pub(crate) fn descendants(root: i32) -> Vec<i32> {
    let parents = process_parents();
    let mut out = Vec::new();
    for (&pid, _) in parents.iter() {
        let mut cur = pid;
        for _ in 0..4096 {
            match parents.get(&cur) {
                Some(&pp) if pp == root => {
                    out.push(pid);
                    break;
                }
                Some(&pp) if pp > 1 => cur = pp,
                _ => break,
            }
        }
    }
    out
}

/// Kills every descendant of `root` with SIGKILL until none is left. Orphans re-parent to `root`
/// (a subreaper), so a double-forked daemon stays a descendant and is found.
pub(crate) fn kill_descendants(root: i32) {
    for round in 0..200 {
        let found = descendants(root);
        if found.is_empty() {
            return;
        }
        // Stop them all first: a shell whose child died first could otherwise still exit on its
        // own (status 137) before its SIGKILL lands, and a stopped process cannot fork.
        for &pid in &found {
            // SAFETY: kill with integer arguments only.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
        for pid in found {
            // SAFETY: kill with integer arguments only.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        if round > 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Removes (with `remove`) the entries of `dir` named `<prefix><pid>-…` whose pid is not a live
/// process: what a runtime killed before its teardown left behind. Returns how many went.
pub(crate) fn remove_stale_entries(
    dir: &std::path::Path,
    prefix: &str,
    remove: impl Fn(&std::path::Path) -> std::io::Result<()>,
) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(prefix))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<i32>().ok())
        else {
            continue;
        };
        if pid <= 0 || pid_alive(pid) {
            continue;
        }
        if remove(&entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Whether a process with this pid exists (in our pid namespace).
fn pid_alive(pid: i32) -> bool {
    match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None) {
        Ok(()) => true,
        Err(nix::errno::Errno::ESRCH) => false,
        // EPERM: it exists, owned by someone else.
        Err(_) => true,
    }
}
