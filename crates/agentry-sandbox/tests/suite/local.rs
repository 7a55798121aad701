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

/// A pool holds at most its maximum of open sandboxes: one more workspace is refused with a
/// typed error until one closes; a workspace that has one keeps getting it.
#[tokio::test]
async fn a_pool_refuses_sandboxes_beyond_its_maximum() {
    use agentry_sandbox::{DEFAULT_MAX_SANDBOXES, SandboxError, SandboxPool};
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(
        SandboxPool::new(local(), SandboxSpec::new(dir.path())).max_sandboxes(),
        DEFAULT_MAX_SANDBOXES
    );
    let pool = SandboxPool::with_max_sandboxes(local(), SandboxSpec::new(dir.path()), 2);
    assert_eq!(pool.max_sandboxes(), 2);
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    for workspace in [&a, &b] {
        std::fs::create_dir_all(workspace).unwrap();
    }
    std::fs::create_dir_all(&c).unwrap();
    let first = pool.get(&a).await.unwrap();
    pool.get(&b).await.unwrap();
    match pool.get(&c).await {
        Err(error @ SandboxError::PoolFull { max: 2 }) => {
            assert!(
                error.to_string().contains("2 sandboxes are open"),
                "{error}"
            );
        }
        Err(other) => panic!("expected a full pool, got {other:?}"),
        Ok(_) => panic!("expected a full pool, got a sandbox"),
    }
    assert_eq!(pool.len(), 2);
    // A workspace that has a sandbox still gets it.
    let again = pool.get(&a).await.unwrap();
    assert!(again.closed_reason().is_none());
    assert_eq!(again.workspace(), first.workspace());
    // Once one closes there is room again.
    first.close().await;
    let third = pool.get(&c).await.unwrap();
    assert!(third.closed_reason().is_none());
    assert_eq!(pool.len(), 2);
    pool.close_all().await;
}
