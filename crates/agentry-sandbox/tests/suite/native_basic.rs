//! The native backend's basic behaviour: exec, streaming, stdin, files, timeouts, reports.

use std::time::{Duration, Instant};

use agentry_sandbox::{Capabilities, ExecEvent, ExecRequest, FileKind, SandboxError};
use tokio::io::AsyncWriteExt;

use super::common::*;

#[tokio::test]
async fn echo_output_and_exit_code() {
    let (sb, _dir) = sandbox().await;
    let out = sh(&sb, "echo hello; echo oops >&2; exit 3").await;
    assert_eq!(out.stdout_str(), "hello\n");
    assert_eq!(out.stderr_str(), "oops\n");
    assert_eq!(out.status.code, Some(3));
    assert!(!out.status.timed_out && !out.status.killed && !out.status.out_of_memory);
    let report = sb.report();
    assert!(report.isolated);
    assert_ne!(report.outer_uid, 0, "a sandbox never runs as host root");
    let policy = report.policy.as_ref().unwrap();
    assert!(
        policy.seccomp && policy.no_new_privs && policy.capabilities_dropped && policy.network_off
    );
    assert_eq!(policy.landlock, "fully_enforced");
    sb.close().await;
}

#[tokio::test]
async fn environment_is_minimal_and_workspace_is_cwd() {
    let (sb, _dir) = sandbox().await;
    let out = sb
        .run(ExecRequest::new(["/usr/bin/env"]).env("EXTRA", "1"))
        .await
        .unwrap();
    let mut keys: Vec<&str> = out
        .stdout_str()
        .leak()
        .lines()
        .map(|l| l.split('=').next().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["EXTRA", "HOME", "LANG", "PATH", "TMPDIR"]);
    let out = sh(&sb, "pwd; hostname; id -u").await;
    assert_eq!(out.stdout_str(), "/workspace\nsandbox\n0\n");
    sb.close().await;
}

#[tokio::test]
async fn output_streams_before_exit() {
    let (sb, _dir) = sandbox().await;
    let mut h = sb
        .exec(ExecRequest::shell("echo first; sleep 5; echo second"))
        .await
        .unwrap();
    let start = Instant::now();
    let first = h.next().await.unwrap();
    assert_eq!(first, ExecEvent::Stdout(b"first\n".to_vec()));
    assert!(
        start.elapsed() < Duration::from_secs(4),
        "the first line came before the command ended"
    );
    h.kill();
    let out = h.wait().await.unwrap();
    assert!(out.status.killed, "{out:?}");
    assert_eq!(out.status.signal, Some(9), "{out:?}");
    sb.close().await;
}

#[tokio::test]
async fn stdin_is_piped() {
    let (sb, _dir) = sandbox().await;
    let mut h = sb
        .exec(ExecRequest::new(["/usr/bin/tr", "a-z", "A-Z"]).with_stdin())
        .await
        .unwrap();
    let mut stdin = h.take_stdin().unwrap();
    stdin.write_all(b"hello sandbox").await.unwrap();
    drop(stdin);
    let out = h.wait().await.unwrap();
    assert_eq!(out.stdout_str(), "HELLO SANDBOX");
    assert!(out.status.success());
    sb.close().await;
}

#[tokio::test]
async fn a_command_is_a_byte_stream_for_programs_spoken_to_over_stdio() {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let (sb, _dir) = sandbox().await;
    let h = sb
        .exec(
            ExecRequest::shell(
                "echo ready >&2; while read line; do echo \"got $line\"; done; exit 3",
            )
            .with_stdin(),
        )
        .await
        .unwrap();
    let (stdout, stdin, mut stderr) = h.into_stdio();
    let mut stdin = stdin.unwrap();
    let mut lines = tokio::io::BufReader::new(stdout);
    for word in ["one", "two"] {
        stdin
            .write_all(format!("{word}\n").as_bytes())
            .await
            .unwrap();
        let mut line = String::new();
        lines.read_line(&mut line).await.unwrap();
        assert_eq!(line, format!("got {word}\n"));
    }
    // Standard error arrives on its own channel, not in the stream.
    let mut err = Vec::new();
    while !err.ends_with(b"ready\n") {
        err.extend(
            tokio::time::timeout(Duration::from_secs(5), stderr.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    // EOF on stdin ends the program; the stream ends and says how.
    drop(stdin);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), lines.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty(), "{rest:?}");
    let status = lines.get_ref().exit_status().cloned().unwrap();
    assert_eq!(status.code, Some(3), "{status:?}");
    sb.close().await;
}

#[tokio::test]
async fn timeout_kills_and_says_so() {
    let (sb, _dir) = sandbox().await;
    let start = Instant::now();
    let out = sb
        .run(ExecRequest::shell("sleep 30").timeout(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(out.status.timed_out, "{out:?}");
    assert_eq!(out.status.signal, Some(9), "{out:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    sb.close().await;
}

#[tokio::test]
async fn missing_program_is_127_and_background_process_does_not_block() {
    let (sb, _dir) = sandbox().await;
    let out = sb.run(ExecRequest::new(["no-such-program"])).await.unwrap();
    assert_eq!(out.status.code, Some(127));
    assert!(
        out.stderr_str().contains("command not found"),
        "{}",
        out.stderr_str()
    );
    // A daemon keeps the pipes open; the command still ends when its first process does.
    let start = Instant::now();
    let out = sh(&sb, "setsid sleep 1000 & echo started").await;
    assert_eq!(out.stdout_str(), "started\n");
    assert!(start.elapsed() < Duration::from_secs(5));
    // The background process lives on (on a loaded machine it may not have exec'd `sleep` yet).
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = sh(&sb, "cat /proc/[0-9]*/comm").await;
    while !out.stdout_str().lines().any(|l| l == "sleep") && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        out = sh(&sb, "cat /proc/[0-9]*/comm").await;
    }
    assert!(
        out.stdout_str().lines().any(|l| l == "sleep"),
        "{}",
        out.stdout_str()
    );
    sb.close().await;
}

#[tokio::test]
async fn files_api_round_trip() {
    let (sb, dir) = sandbox().await;
    sb.mkdir("a/b", true).await.unwrap();
    sb.write_file("a/b/hello.txt", b"hi there").await.unwrap();
    assert_eq!(
        sb.read_file("a/b/hello.txt", 1024).await.unwrap(),
        b"hi there"
    );
    assert_eq!(
        sb.read_file("/workspace/a/b/hello.txt", 1024)
            .await
            .unwrap(),
        b"hi there"
    );
    assert_eq!(
        std::fs::read(dir.path().join("a/b/hello.txt")).unwrap(),
        b"hi there"
    );
    let st = sb.stat("a/b/hello.txt").await.unwrap();
    assert_eq!((st.kind, st.size), (FileKind::File, 8));
    let list = sb.list("a").await.unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(
        (list[0].name.as_str(), list[0].stat.kind),
        ("b", FileKind::Dir)
    );
    assert!(matches!(
        sb.read_file("a/b/hello.txt", 3).await,
        Err(SandboxError::TooLarge { limit: 3 })
    ));
    let err = sb.read_file("a/b", 10).await.unwrap_err();
    assert_eq!(err.errno(), Some(libc::EISDIR));
    assert!(
        sb.remove("a", false).await.is_err(),
        "a non-empty folder needs recursive"
    );
    sb.remove("a", true).await.unwrap();
    assert_eq!(sb.stat("a").await.unwrap_err().errno(), Some(libc::ENOENT));
    // Commands see what the API wrote, and the other way round.
    sb.write_file("x.sh", b"echo from-file").await.unwrap();
    assert_eq!(sh(&sb, "sh x.sh > y.txt").await.status.code, Some(0));
    assert_eq!(sb.read_file("y.txt", 100).await.unwrap(), b"from-file\n");
    sb.close().await;
}

#[tokio::test]
async fn closed_sandbox_refuses_requests() {
    let (sb, _dir) = sandbox().await;
    sb.close().await;
    let err = sb.run(ExecRequest::shell("true")).await.unwrap_err();
    assert!(matches!(err, SandboxError::Closed { .. }), "{err:?}");
    assert_eq!(sb.closed_reason().as_deref(), Some("closed"));
}

#[tokio::test]
async fn idle_sandbox_is_reaped() {
    let (sb, _dir) = sandbox_with(|s| s.idle_timeout = Some(Duration::from_millis(300))).await;
    assert!(sh(&sb, "true").await.status.success());
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(sb.closed_reason().as_deref(), Some("idle timeout"));
    assert!(sb.run(ExecRequest::shell("true")).await.is_err());
}

#[tokio::test]
async fn wall_time_limit_stops_the_sandbox() {
    let (sb, _dir) = sandbox_with(|s| s.limits.wall_time = Some(Duration::from_millis(500))).await;
    let out = sb.run(ExecRequest::shell("sleep 30")).await.unwrap();
    assert_eq!(
        out.status.sandbox_closed.as_deref(),
        Some("wall-time limit reached")
    );
    assert_eq!(out.status.signal, Some(9));
}

#[tokio::test]
async fn capabilities_probe_reports_this_host() {
    let caps = Capabilities::probe();
    let json = serde_json::to_value(&caps).unwrap();
    assert_eq!(json["os"], "linux");
    assert!(caps.user_namespaces && caps.native_available, "{caps:?}");
    assert!(caps.seccomp);
    assert!(caps.landlock_abi.unwrap_or(0) >= 6, "{caps:?}");
    assert_eq!(caps.running_as_root, is_root());
}

#[tokio::test]
async fn signals_the_server_ignored_are_not_ignored_by_commands() {
    // Started with `nohup` or as a shell's background job, the server ignores SIGHUP, SIGINT and
    // SIGQUIT, and ignored signals outlive exec: a command must not inherit that (^C on a
    // terminal would interrupt nothing).
    use nix::sys::signal::{SigHandler, Signal, signal};
    let ignored = [Signal::SIGHUP, Signal::SIGINT, Signal::SIGQUIT];
    let before: Vec<SigHandler> = ignored
        .iter()
        // SAFETY: SIG_IGN installs no handler; the test restores what it replaced.
        .map(|&sig| unsafe { signal(sig, SigHandler::SigIgn) }.unwrap())
        .collect();
    for backend in [native(), local()] {
        let dir = tempfile::tempdir().unwrap();
        let sb = backend
            .create(agentry_sandbox::SandboxSpec::new(dir.path()))
            .await
            .unwrap();
        let out = sh(&sb, "grep -E '^Sig(Ign|Blk):' /proc/self/status").await;
        let masks: Vec<u64> = out
            .stdout_str()
            .lines()
            .map(|line| u64::from_str_radix(line.split('\t').nth(1).unwrap(), 16).unwrap())
            .collect();
        // Bit n is signal n + 1. glibc keeps signals 32 and 33 for itself and refuses to
        // change them (a test runner may leave 32 ignored); every other one is the default.
        const GLIBC_OWN: u64 = (1 << 31) | (1 << 32);
        let kind = backend.kind();
        assert_eq!(masks[0], 0, "signals blocked in {kind:?}: {out:?}");
        assert_eq!(
            masks[1] & !GLIBC_OWN,
            0,
            "signals ignored in {kind:?}: {out:?}"
        );
        sb.close().await;
    }
    for (sig, handler) in ignored.into_iter().zip(before) {
        // SAFETY: puts back the disposition this test replaced.
        unsafe { signal(sig, handler) }.unwrap();
    }
}
