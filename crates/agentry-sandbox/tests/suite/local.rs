//! The local backend: plain processes, no isolation, same API.

use std::time::Duration;

use agentry_sandbox::{BackendKind, ExecRequest, SandboxSpec};

use super::common::*;

#[tokio::test]
async fn local_backend_runs_commands_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let sb = local().create(SandboxSpec::new(dir.path())).await.unwrap();
    assert_eq!(sb.backend(), BackendKind::Local);
    assert!(!sb.report().isolated);
    assert!(
        sb.report()
            .warnings
            .iter()
            .any(|w| w.contains("no isolation"))
    );
    let out = sb
        .run(ExecRequest::shell("pwd; echo $HOME; exit 4"))
        .await
        .unwrap();
    let ws = std::fs::canonicalize(dir.path()).unwrap();
    assert_eq!(out.stdout_str(), format!("{0}\n{0}\n", ws.display()));
    assert_eq!(out.status.code, Some(4));
    // The environment is minimal here too.
    let out = sb.run(ExecRequest::new(["env"])).await.unwrap();
    assert!(!out.stdout_str().contains("CARGO"), "{}", out.stdout_str());
    sb.write_file("f.txt", b"local").await.unwrap();
    assert_eq!(std::fs::read(dir.path().join("f.txt")).unwrap(), b"local");
    assert_eq!(sb.read_file("f.txt", 100).await.unwrap(), b"local");
    // Timeouts kill the whole tree, daemons included.
    let marker = format!("sleep 100{}", std::process::id());
    let out = sb
        .run(
            ExecRequest::shell(format!("(setsid sh -c '{marker}' &); sleep 1000"))
                .timeout(Duration::from_millis(300)),
        )
        .await
        .unwrap();
    assert!(out.status.timed_out);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !host_cmdlines().iter().any(|c| c.contains(&marker)),
        "the daemon was killed"
    );
    sb.close().await;
}

fn host_cmdlines() -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .collect()
}
