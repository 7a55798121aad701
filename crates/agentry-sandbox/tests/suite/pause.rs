//! Pause and resume: a paused sandbox's processes get no CPU and keep their state, commands and
//! file operations are refused while it is paused, resume goes on where it stopped, and closing
//! a paused sandbox leaves nothing behind. Where the host gives the sandbox no freezer (no
//! cgroups: the unprivileged run), pausing is a typed error and the sandbox keeps working.

use std::time::{Duration, Instant};

use agentry_sandbox::{ExecRequest, SandboxError};

use super::common::*;

/// CPU time (user + system, in clock ticks) the processes `pids` have used.
fn cpu_ticks(pids: &[i32]) -> u64 {
    pids.iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .map(|stat| {
            // The fields after the command name (which may hold spaces) close with `)`.
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // utime and stime: fields 14 and 15 of the whole line, 12 and 13 after `)`.
            fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
        })
        .sum()
}

/// The number the counting process last wrote (0 before its first write).
fn count(dir: &std::path::Path) -> u64 {
    std::fs::read_to_string(dir.join("count"))
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(0)
}

/// A process that counts, about a millisecond of CPU at a time, and writes where it is every
/// 10 ms (busy enough to use CPU, idle enough to leave the suite's other tests theirs).
const COUNTER: &str = r#"
import os, time
i = 0
while True:
    for _ in range(20000):
        i += 1
    open("count.tmp", "w").write(str(i))
    os.replace("count.tmp", "count")
    time.sleep(0.01)
"#;

#[tokio::test]
async fn a_paused_sandbox_gets_no_cpu_and_resumes_where_it_stopped() {
    let (sb, dir) = sandbox().await;
    if !sb.can_pause() {
        eprintln!("no cgroup freezer for this sandbox: pausing must be a typed error");
        assert!(
            matches!(sb.pause().await, Err(SandboxError::Unsupported(_))),
            "pausing without a freezer"
        );
        assert!(!sb.is_paused());
        assert_eq!(
            sh(&sb, "echo still here").await.stdout_str(),
            "still here\n"
        );
        sb.close().await;
        return;
    }
    let counter = sb
        .exec(ExecRequest::new(["/usr/bin/python3", "-c", COUNTER]))
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(dir.path()) == 0 {
        assert!(Instant::now() < deadline, "the counter never wrote");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    sb.pause().await.unwrap();
    assert!(sb.is_paused());
    let pids = sb.host_pids();
    assert!(
        !pids.is_empty(),
        "the sandbox's processes are in its cgroup"
    );
    let (ticks, counted) = (cpu_ticks(&pids), count(dir.path()));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(cpu_ticks(&pids), ticks, "a paused sandbox used CPU");
    assert_eq!(
        count(dir.path()),
        counted,
        "a paused process went on counting"
    );

    // Nothing runs in a paused sandbox: it says so at once instead of waiting.
    assert!(matches!(
        sb.exec(ExecRequest::shell("true")).await,
        Err(SandboxError::Paused)
    ));
    assert!(matches!(
        sb.read_file("count", 1024).await,
        Err(SandboxError::Paused)
    ));
    // Pausing again changes nothing.
    sb.pause().await.unwrap();
    assert!(sb.is_paused());

    sb.resume().await.unwrap();
    assert!(!sb.is_paused());
    // The same processes go on (nothing was restarted), counting and using CPU again (a clock
    // tick is 10 ms of it: under load the first writes can come sooner).
    let deadline = Instant::now() + Duration::from_secs(20);
    while count(dir.path()) <= counted || cpu_ticks(&pids) <= ticks {
        assert!(
            Instant::now() < deadline,
            "the counter did not go on after resume"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sb.host_pids(), pids);
    assert_eq!(sh(&sb, "echo running").await.stdout_str(), "running\n");
    counter.kill();
    sb.close().await;
}

#[tokio::test]
async fn closing_a_paused_sandbox_leaves_no_process() {
    let (sb, _dir) = sandbox().await;
    if !sb.can_pause() {
        assert!(matches!(
            sb.resume().await,
            Err(SandboxError::Unsupported(_))
        ));
        sb.close().await;
        return;
    }
    let _sleeper = sb.exec(ExecRequest::new(["sleep", "300"])).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while sb.host_pids().len() < 2 {
        assert!(Instant::now() < deadline, "the sleeper never started");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pids = sb.host_pids();
    sb.pause().await.unwrap();
    sb.close().await;
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} of a paused sandbox outlived its close"
        );
    }
    assert!(matches!(
        sb.resume().await,
        Err(SandboxError::Closed { .. })
    ));
}

/// A sandbox's CPU time (its dead processes' included) and memory are read from its cgroups;
/// under rlimits there is nothing to read and the usage says so (`None`), never a made-up 0.
#[tokio::test]
async fn a_sandboxs_cpu_and_memory_are_metered() {
    let (sb, _dir) = sandbox().await;
    let before = sb.usage();
    if sb.report().limits == agentry_sandbox::LimitsMode::Rlimit {
        assert_eq!(before, agentry_sandbox::ResourceUsage::default());
        sb.close().await;
        return;
    }
    // About 300 ms of CPU in a process that then exits.
    let out = py(
        &sb,
        "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass",
    )
    .await;
    assert!(out.status.success(), "{out:?}");
    let after = sb.usage();
    let used = after.cpu_nanos.unwrap() - before.cpu_nanos.unwrap();
    assert!(
        used >= 250_000_000,
        "{used} ns of CPU counted for about 300 ms used"
    );
    assert!(after.memory_bytes.unwrap() > 0, "{after:?}");
    sb.close().await;
}

/// With `on_idle: pause`, the idle timeout pauses the sandbox (its background process stops
/// counting) instead of closing it, and the next command resumes it by itself: the same process
/// goes on counting. A pause by request is not undone that way. Without a freezer the idle
/// timeout closes the sandbox, as it does by default.
#[tokio::test]
async fn an_idle_sandbox_pauses_and_the_next_command_resumes_it() {
    let (sb, dir) = sandbox_with(|spec| {
        spec.idle_timeout = Some(Duration::from_millis(600));
        spec.on_idle = agentry_sandbox::IdleAction::Pause;
    })
    .await;
    if !sb.can_pause() {
        eprintln!("no cgroup freezer for this sandbox: the idle timeout closes it");
        let deadline = Instant::now() + Duration::from_secs(10);
        while sb.closed_reason().is_none() {
            assert!(Instant::now() < deadline, "the idle sandbox never closed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(!sb.is_paused());
        return;
    }
    // A counter left running in the background: the shell that starts it returns at once, so
    // the sandbox is idle (no command of ours in flight) while the counter counts.
    let started = sh(
        &sb,
        &format!(
            "nohup /usr/bin/python3 -c '{}' > /dev/null 2>&1 &",
            COUNTER.replace('\'', "\"")
        ),
    )
    .await;
    assert!(started.status.success(), "{started:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !sb.is_paused() {
        assert!(Instant::now() < deadline, "the idle sandbox never paused");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sb.is_paused_on_idle());
    assert!(sb.closed_reason().is_none(), "paused, not closed");
    let frozen_at = count(dir.path());
    assert!(frozen_at > 0, "the counter counted before the pause");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        count(dir.path()),
        frozen_at,
        "a paused counter does not count"
    );

    // The next command resumes the sandbox first, and the same counter goes on.
    assert_eq!(sh(&sb, "echo awake").await.stdout_str(), "awake\n");
    assert!(!sb.is_paused());
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(dir.path()) <= frozen_at {
        assert!(Instant::now() < deadline, "the counter never went on");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A pause by request stays until a resume by request.
    sb.pause().await.unwrap();
    assert!(!sb.is_paused_on_idle());
    assert!(matches!(
        sb.run(ExecRequest::shell("true")).await,
        Err(SandboxError::Paused)
    ));
    sb.resume().await.unwrap();
    assert_eq!(sh(&sb, "echo again").await.stdout_str(), "again\n");
    sb.close().await;
}
