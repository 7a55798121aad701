//! Resource exhaustion: the attempt is contained or the command stopped, the runtime lives on
//! and says why.

use std::time::Duration;

use agentry_sandbox::{ExecRequest, LimitsMode};

use super::common::*;

#[tokio::test]
async fn fork_bomb_is_contained() {
    let (sb, _dir) = sandbox_with(|s| s.limits.max_processes = Some(64)).await;
    let out = sb
        // The waiting shell forks once, for the bomb, while slots are free, then becomes the
        // sleep (`exec`, no fork): a bomb that has taken every process slot cannot end it early
        // ("Cannot fork") before the timeout.
        .run(
            ExecRequest::shell("(b() { b | b & }; b) & exec sleep 30")
                .timeout(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert!(out.status.timed_out, "{out:?}");
    // The sandbox still serves; the bomb is gone.
    let out = sh(&sb, "ls /proc | grep -c '^[0-9]'").await;
    assert!(out.status.success(), "{out:?}");
    let n: usize = out.stdout_str().trim().parse().unwrap();
    assert!(n < 10, "the bomb's processes are gone ({n} left)");
    sb.close().await;
}

#[tokio::test]
async fn memory_hog_is_stopped_and_reported() {
    let (sb, _dir) = sandbox_with(|s| s.limits.memory_bytes = Some(128 << 20)).await;
    let out = py(
        &sb,
        "b = bytearray(1 << 30)\nb[::4096] = b'x' * len(b[::4096])\nprint('allocated')",
    )
    .await;
    assert!(!out.status.success());
    assert!(!out.stdout_str().contains("allocated"));
    match sb.report().limits {
        LimitsMode::CgroupV1 | LimitsMode::CgroupV2 => {
            assert!(out.status.out_of_memory, "{out:?}");
            assert_eq!(out.status.signal, Some(libc::SIGKILL));
        }
        LimitsMode::Rlimit => assert!(out.stderr_str().contains("MemoryError"), "{out:?}"),
    }
    assert!(sh(&sb, "echo alive").await.status.success());
    sb.close().await;
}

#[tokio::test]
async fn cpu_spin_is_stopped() {
    let (sb, _dir) = sandbox_with(|s| s.limits.cpu_time = Some(Duration::from_secs(1))).await;
    let out = sb
        .run(ExecRequest::shell("while :; do :; done").timeout(Duration::from_secs(20)))
        .await
        .unwrap();
    assert_eq!(out.status.signal, Some(libc::SIGXCPU), "{out:?}");
    assert!(!out.status.timed_out);
    // And a spin under a wall-clock timeout.
    let out = sb
        .run(ExecRequest::shell("while :; do :; done").timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(out.status.timed_out);
    sb.close().await;
}

#[tokio::test]
async fn disk_fill_is_contained() {
    let (sb, dir) = sandbox_with(|s| {
        s.limits.tmp_size = 8 << 20;
        s.limits.file_size = Some(16 << 20);
    })
    .await;
    let out = sh(&sb, "dd if=/dev/zero of=/tmp/fill bs=1M count=64").await;
    assert_ne!(out.status.code, Some(0));
    assert!(out.stderr_str().contains("No space left"), "{out:?}");
    let out = sb
        .run(ExecRequest::new([
            "dd",
            "if=/dev/zero",
            "of=/workspace/fill",
            "bs=1M",
            "count=64",
        ]))
        .await
        .unwrap();
    assert_eq!(out.status.signal, Some(libc::SIGXFSZ), "{out:?}");
    assert!(std::fs::metadata(dir.path().join("fill")).unwrap().len() <= 16 << 20);
    assert!(sh(&sb, "rm /tmp/fill && echo ok").await.status.success());
    sb.close().await;
}

#[tokio::test]
async fn fd_exhaustion_is_contained() {
    let (sb, _dir) = sandbox_with(|s| s.limits.open_files = Some(64)).await;
    let out = py(
        &sb,
        "import os\nfds = []\ntry:\n    while True: fds.append(os.open('/dev/null', os.O_RDONLY))\n\
         except OSError as e:\n    print(len(fds), e.errno)",
    )
    .await;
    let text = out.stdout_str();
    let mut it = text.split_whitespace();
    let opened: usize = it.next().unwrap().parse().unwrap();
    assert!(opened <= 64, "{text}");
    assert_eq!(it.next().unwrap(), libc::EMFILE.to_string());
    assert!(sh(&sb, "echo alive").await.status.success());
    sb.close().await;
}

#[tokio::test]
async fn double_forked_daemon_is_killed_at_timeout() {
    let (sb, _dir) = sandbox().await;
    let out = sb
        .run(
            ExecRequest::shell("(setsid sh -c 'sleep 1000' &); (sleep 999 &); sleep 1000")
                .timeout(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    assert!(out.status.timed_out);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let out = sh(&sb, "cat /proc/[0-9]*/comm").await;
    assert!(
        !out.stdout_str().lines().any(|l| l == "sleep"),
        "{}",
        out.stdout_str()
    );
    sb.close().await;
}
