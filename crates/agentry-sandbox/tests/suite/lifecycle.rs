//! Lifecycle: many create/close cycles leave nothing behind; a killed runtime takes its
//! sandboxes with it; two sandboxes cannot see each other.

use std::io::BufRead;
use std::time::{Duration, Instant};

use agentry_sandbox::{ExecRequest, SandboxSpec};

use super::common::*;

/// The create/close cycles the leak test runs (the issue asks for 500; on the 2-core CI machine
/// they take about 10 s, so all 500 run).
const CYCLES: usize = 500;

fn our_cgroups() -> Vec<String> {
    let prefix = format!("agentry-sbx-{}-", std::process::id());
    let mut found = Vec::new();
    fn walk(dir: &std::path::Path, prefix: &str, found: &mut Vec<String>, depth: usize) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if !e.file_type().map(|t| t.is_dir()).unwrap_or(false) || depth > 6 {
                continue;
            }
            if e.file_name().to_string_lossy().starts_with(prefix) {
                found.push(p.display().to_string());
            }
            walk(&p, prefix, found, depth + 1);
        }
    }
    walk(
        std::path::Path::new("/sys/fs/cgroup"),
        &prefix,
        &mut found,
        0,
    );
    found
}

fn children_of_us() -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rsplit_once(')')
                        .map(|(_, r)| r.split_whitespace().nth(1).map(str::to_string))
                })
                .flatten()
                .and_then(|p| p.parse::<i32>().ok())
                == Some(me)
        })
        .collect()
}

/// Entries of the temp folder a sandbox could have left (named after agentry; the tempdirs other
/// tests make and remove beside this one are not counted, nor the network proxy folders of
/// other test processes, `agentry-proxy-<their pid>-…`).
fn our_temp_entries() -> Vec<String> {
    let ours = format!("agentry-proxy-{}-", std::process::id());
    let mut v: Vec<String> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("agentry"))
        .filter(|n| !n.starts_with("agentry-proxy-") || n.starts_with(&ours))
        .collect();
    v.sort();
    v
}

fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test]
async fn create_close_cycles_leave_nothing_behind() {
    let backend = native();
    let dir = tempfile::tempdir().unwrap();
    let mounts_before = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let tmp_before = our_temp_entries();
    // Warm up once (the spawner thread, the runtime's lazy state), then count.
    let sb = backend.create(SandboxSpec::new(dir.path())).await.unwrap();
    sb.close().await;
    let fds_before = fd_count();
    let start = Instant::now();
    for i in 0..CYCLES {
        let sb = backend.create(SandboxSpec::new(dir.path())).await.unwrap();
        if i % 50 == 0 {
            let out = sb.run(ExecRequest::shell("echo hi")).await.unwrap();
            assert_eq!(out.stdout_str(), "hi\n");
        }
        sb.close().await;
    }
    let elapsed = start.elapsed();
    eprintln!("{CYCLES} create/close cycles in {elapsed:?}");
    assert!(our_cgroups().is_empty(), "{:?}", our_cgroups());
    assert!(children_of_us().is_empty(), "{:?}", children_of_us());
    // The last connection's reader task lets its socket go just after close returns.
    let deadline = Instant::now() + Duration::from_secs(2);
    while fd_count() != fds_before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(fd_count(), fds_before, "no descriptor leaked");
    assert_eq!(
        std::fs::read_to_string("/proc/self/mountinfo").unwrap(),
        mounts_before
    );
    assert_eq!(our_temp_entries(), tmp_before, "no temp folder left behind");
}

#[tokio::test]
async fn dropping_a_sandbox_cleans_up_too() {
    let (sb, _dir) = sandbox().await;
    let pid1 = sb.pid1().unwrap();
    assert!(sh(&sb, "setsid sleep 1000 &").await.status.success());
    drop(sb);
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{pid1}")).exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!std::path::Path::new(&format!("/proc/{pid1}")).exists());
}

/// Host processes running exactly `sleep <seconds>`.
fn processes_with(seconds: &str) -> usize {
    let want = format!("sleep\0{seconds}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .filter(|c| c.as_slice() == want.as_bytes())
        .count()
}

#[test]
fn sigkill_of_the_runtime_kills_its_sandboxes() {
    let dir = tempfile::tempdir().unwrap();
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_agentry-sandbox-probe"))
        .args([
            "hold",
            init_exe().to_str().unwrap(),
            dir.path().to_str().unwrap(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let parsed = line
        .trim()
        .strip_prefix("pid1 ")
        .and_then(|p| p.parse::<i32>().ok());
    let Some(pid1) = parsed.filter(|p| *p > 0) else {
        let _ = holder.kill();
        let _ = holder.wait();
        panic!("the holder did not start its sandbox: {line:?}");
    };
    // The command and its setsid'd daemon, found by the holder's pid in their arguments.
    let marker_daemon = format!("1001{}", holder.id());
    let marker_cmd = format!("1002{}", holder.id());
    let deadline = Instant::now() + Duration::from_secs(5);
    while (processes_with(&marker_daemon) == 0 || processes_with(&marker_cmd) == 0)
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    let running = (processes_with(&marker_daemon), processes_with(&marker_cmd));
    if running != (1, 1) {
        let _ = holder.kill();
        let _ = holder.wait();
        panic!("the sandbox's processes did not start: {running:?}");
    }
    assert!(std::path::Path::new(&format!("/proc/{pid1}")).exists());
    holder.kill().unwrap(); // SIGKILL
    holder.wait().unwrap();
    let gone = || {
        processes_with(&marker_daemon) == 0
            && processes_with(&marker_cmd) == 0
            && !std::path::Path::new(&format!("/proc/{pid1}")).exists()
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        gone(),
        "PID 1, the command and its daemon died with the runtime"
    );
}

#[tokio::test]
async fn two_sandboxes_cannot_see_each_other() {
    let (a, dir_a) = sandbox().await;
    let (b, _dir_b) = sandbox().await;
    assert!(
        sh(&a, "echo secret > mine.txt; setsid sleep 1000 &")
            .await
            .status
            .success()
    );
    // B sees neither A's processes nor its files, and cannot signal them.
    let out = sh(&b, "cat /proc/[0-9]*/comm").await;
    assert!(
        !out.stdout_str().lines().any(|l| l == "sleep"),
        "{}",
        out.stdout_str()
    );
    let a_path = dir_a.path().join("mine.txt");
    assert_ne!(
        sh(&b, &format!("cat {}", a_path.display()))
            .await
            .status
            .code,
        Some(0)
    );
    assert!(b.read_file(a_path.to_str().unwrap(), 100).await.is_err());
    let _ = sh(&b, "kill -9 -1").await;
    let out = sh(&a, "cat /proc/[0-9]*/comm").await;
    assert!(
        out.stdout_str().lines().any(|l| l == "sleep"),
        "A's daemon survived B's kill -9 -1"
    );
    if is_root() {
        assert_ne!(
            a.report().outer_uid,
            b.report().outer_uid,
            "each sandbox has its own outer uid"
        );
    }
    a.close().await;
    b.close().await;
}

/// Our own cgroup directory in the v1 memory hierarchy, if we may write there.
fn own_memory_cgroup() -> Option<std::path::PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let path = text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| path.to_owned())
    })?;
    let dir = std::path::Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/'));
    nix::unistd::access(&dir, nix::unistd::AccessFlags::W_OK)
        .is_ok()
        .then_some(dir)
}

#[test]
fn leftovers_of_a_dead_runtime_are_swept_when_a_backend_starts() {
    // A pid that no longer runs: a child that has exited and been reaped.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let temp = std::env::temp_dir();
    let stale_proxy = temp.join(format!("agentry-proxy-{dead}-0-test"));
    std::fs::create_dir_all(&stale_proxy).unwrap();
    std::fs::write(stale_proxy.join("proxy.sock"), b"").unwrap();
    // A live runtime's folder (ours) is left alone.
    let live_proxy = temp.join(format!("agentry-proxy-{}-9999-test", std::process::id()));
    std::fs::create_dir_all(&live_proxy).unwrap();
    let stale_cgroup = own_memory_cgroup().map(|parent| {
        let dir = parent.join(format!("agentry-sbx-{dead}-0"));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    });
    if is_root() {
        assert!(
            stale_cgroup.is_some(),
            "as root, this host has writable v1 cgroups"
        );
    }

    let _backend = native();

    assert!(
        !stale_proxy.exists(),
        "the dead runtime's proxy folder went"
    );
    assert!(live_proxy.exists(), "a live runtime's folder stays");
    std::fs::remove_dir_all(&live_proxy).unwrap();
    if let Some(dir) = stale_cgroup {
        assert!(!dir.exists(), "the dead runtime's cgroup went");
    }
}
