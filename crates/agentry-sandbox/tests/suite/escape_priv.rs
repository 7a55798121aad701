//! Privilege escapes: each attempt fails (EPERM, ENOSYS, or the process is killed).

use agentry_sandbox::ExecRequest;

use super::common::*;

/// Python: call a raw syscall and print "ret errno".
fn syscall_probe(call: &str) -> String {
    format!(
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\nr = {call}\nprint(r, ctypes.get_errno())"
    )
}

async fn expect_eperm(sb: &agentry_sandbox::Sandbox, call: &str) {
    let out = py(sb, &syscall_probe(call)).await;
    assert_eq!(
        out.stdout_str().trim(),
        format!("-1 {}", libc::EPERM),
        "{call}: {}",
        out.stderr_str()
    );
}

#[tokio::test]
async fn privileged_syscalls_are_denied() {
    let (sb, _dir) = sandbox().await;
    // mount, nested namespaces, ptrace, io_uring, bpf, keyctl, userfaultfd, perf, chroot.
    expect_eperm(&sb, "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)").await;
    expect_eperm(&sb, "libc.unshare(0x10000000)").await; // CLONE_NEWUSER
    expect_eperm(&sb, "libc.unshare(0x40000000)").await; // CLONE_NEWNET
    expect_eperm(&sb, "libc.ptrace(0, 0, 0, 0)").await; // PTRACE_TRACEME
    expect_eperm(&sb, "libc.ptrace(16, 1, 0, 0)").await; // PTRACE_ATTACH to PID 1
    expect_eperm(&sb, "libc.syscall(425, 8, None)").await; // io_uring_setup
    expect_eperm(&sb, "libc.syscall(321, 0, None, 0)").await; // bpf
    expect_eperm(&sb, "libc.syscall(250, 0, 0, 0, 0, 0)").await; // keyctl
    expect_eperm(&sb, "libc.syscall(323, 0)").await; // userfaultfd
    expect_eperm(&sb, "libc.syscall(298, None, 0, -1, -1, 0)").await; // perf_event_open
    expect_eperm(&sb, "libc.chroot(b'/tmp')").await;
    // clone with a namespace flag (fork-like clone of a new user namespace).
    expect_eperm(&sb, "libc.syscall(56, 0x10000000 | 17, 0, 0, 0, 0)").await;
    // clone3 is ENOSYS so libc falls back to clone; threads still work.
    let out = py(&sb, &syscall_probe("libc.syscall(435, None, 0)")).await;
    assert_eq!(out.stdout_str().trim(), format!("-1 {}", libc::ENOSYS));
    let out = py(&sb, "import threading\nt = threading.Thread(target=lambda: print('thread ran'))\nt.start(); t.join()").await;
    assert_eq!(out.stdout_str(), "thread ran\n");
    // The util-linux tools fail too.
    assert_ne!(sh(&sb, "unshare -r true").await.status.code, Some(0));
    sb.close().await;
}

#[tokio::test]
async fn no_capabilities_no_setuid() {
    let (sb, _dir) = sandbox().await;
    let out = sh(
        &sb,
        "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status",
    )
    .await;
    let status = out.stdout_str();
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert!(
            status.contains(&format!("{cap}:\t0000000000000000")),
            "{status}"
        );
    }
    assert!(status.contains("NoNewPrivs:\t1"), "{status}");
    assert!(status.contains("Seccomp:\t2"), "{status}");
    // Changing identity fails: uid 0 is the only id of the namespace (EINVAL for any other), and
    // supplementary groups are locked (setgroups=deny, no CAP_SETGID). setuid bits are ignored
    // (nosuid mounts, no_new_privs).
    let out = py(&sb, "import os\ntry:\n    os.setuid(1234); print('changed')\nexcept OSError as e:\n    print('denied', e.errno)").await;
    assert_eq!(out.stdout_str().trim(), format!("denied {}", libc::EINVAL));
    let out = py(&sb, "import os\ntry:\n    os.setgroups([0]); print('changed')\nexcept OSError as e:\n    print('denied', e.errno)").await;
    assert_eq!(out.stdout_str().trim(), format!("denied {}", libc::EPERM));
    let out = py(
        &sb,
        "import os\nfor p in ['/workspace', '/tmp', '/usr']:\n    print(p, bool(os.statvfs(p).f_flag & os.ST_NOSUID))",
    )
    .await;
    assert_eq!(out.stdout_str(), "/workspace True\n/tmp True\n/usr True\n");
    // Device nodes cannot be made.
    assert_ne!(sh(&sb, "mknod /tmp/sda b 8 0").await.status.code, Some(0));
    assert_ne!(
        sh(&sb, "ls /dev/kvm /dev/sda /sys/kernel")
            .await
            .status
            .code,
        Some(0)
    );
    sb.close().await;
}

#[tokio::test]
async fn i386_syscalls_kill_the_process() {
    let (sb, dir) = sandbox().await;
    let probe = env!("CARGO_BIN_EXE_agentry-sandbox-probe");
    std::fs::copy(probe, dir.path().join("probe")).unwrap();
    if is_root() {
        let uid = sb.report().outer_uid;
        std::os::unix::fs::lchown(dir.path().join("probe"), Some(uid), Some(uid)).unwrap();
    }
    let out = sb
        .run(ExecRequest::new(["/workspace/probe", "int80"]))
        .await
        .unwrap();
    assert_eq!(out.status.signal, Some(libc::SIGSYS), "{out:?}");
    assert!(!out.stdout_str().contains("survived"));
    // Control: the same binary on the host survives.
    let host = std::process::Command::new(probe)
        .arg("int80")
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&host.stdout).contains("survived"));
    sb.close().await;
}
