//! Robustness: a crashed server restarts and its call in flight fails clearly; deadlines (idle,
//! extended by progress, and the hard cap); cancellation; a server that hangs or cannot start
//! never holds up another; removal stops the process.

use std::time::{Duration, Instant};

use agentry_mcp::{CallOptions, McpError, McpManager, McpServerConfig, ServerState};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::support::{READY, add_connected, connected, echo, eventually, servers, stdio, text};

fn process_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

#[tokio::test]
async fn killing_the_server_mid_call_fails_that_call_and_the_next_succeeds_after_the_restart()
-> anyhow::Result<()> {
    let servers = servers()?;
    let manager = connected("everything", stdio(&servers.everything())).await?;
    let pid = manager
        .status("everything")?
        .pid
        .ok_or_else(|| anyhow::anyhow!("no pid"))?;

    let caller = manager.clone();
    let in_flight = tokio::spawn(async move {
        caller
            .call_tool(
                "everything",
                "trigger-long-running-operation",
                json!({"duration": 10, "steps": 10}),
                CallOptions::default(),
            )
            .await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()?;

    let failed = tokio::time::timeout(Duration::from_secs(5), in_flight).await??;
    match failed {
        Err(McpError::ServerExited { server }) => assert_eq!(server, "everything"),
        other => panic!("expected ServerExited, got {other:?}"),
    }
    // The next call waits for the restart and succeeds, on a new process.
    assert_eq!(echo(&manager, "everything", "again").await?, "Echo: again");
    let status = manager.status("everything")?;
    assert_eq!(status.state, ServerState::Connected);
    assert!(status.restarts >= 1, "{status:?}");
    assert_ne!(status.pid, Some(pid));
    assert!(!process_alive(pid));
    Ok(())
}

#[tokio::test]
async fn deadlines_progress_extends_the_idle_one_but_not_the_cap() -> anyhow::Result<()> {
    let servers = servers()?;
    let manager = connected("everything", stdio(&servers.everything())).await?;

    // One step of 3 s: no progress before the 400 ms idle deadline.
    let started = Instant::now();
    let idle = manager
        .call_tool(
            "everything",
            "trigger-long-running-operation",
            json!({"duration": 3, "steps": 1}),
            CallOptions {
                timeout: Some(Duration::from_millis(400)),
                ..CallOptions::default()
            },
        )
        .await;
    assert!(
        matches!(idle, Err(McpError::Timeout { after, .. }) if after == Duration::from_millis(400)),
        "{idle:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    // Progress every 300 ms keeps a 1 s idle deadline alive, but the 1.5 s cap ends it.
    let started = Instant::now();
    let capped = manager
        .call_tool(
            "everything",
            "trigger-long-running-operation",
            json!({"duration": 6, "steps": 20}),
            CallOptions {
                timeout: Some(Duration::from_secs(1)),
                max_duration: Some(Duration::from_millis(1500)),
                ..CallOptions::default()
            },
        )
        .await;
    assert!(
        matches!(capped, Err(McpError::Timeout { after, .. }) if after == Duration::from_millis(1500)),
        "{capped:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(4));

    // The server is still fine.
    assert_eq!(echo(&manager, "everything", "ok").await?, "Echo: ok");
    Ok(())
}

#[tokio::test]
async fn cancelling_ends_the_call_at_once_and_the_server_goes_on() -> anyhow::Result<()> {
    let servers = servers()?;
    let manager = connected("everything", stdio(&servers.everything())).await?;
    let cancel = CancellationToken::new();
    let stopper = cancel.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        stopper.cancel();
    });
    let started = Instant::now();
    let outcome = manager
        .call_tool(
            "everything",
            "trigger-long-running-operation",
            json!({"duration": 10, "steps": 5}),
            CallOptions {
                cancel,
                ..CallOptions::default()
            },
        )
        .await;
    assert!(matches!(outcome, Err(McpError::Cancelled)), "{outcome:?}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(echo(&manager, "everything", "after").await?, "Echo: after");
    Ok(())
}

#[tokio::test]
async fn a_hanging_or_missing_server_never_holds_up_another() -> anyhow::Result<()> {
    let servers = servers()?;
    // About supervision, not placement: servers run on the host, allowed explicitly.
    let manager = McpManager::with_stdio(agentry_mcp::StdioPolicy::host());
    // Starts but never answers `initialize`.
    let hanging =
        McpServerConfig::stdio("sleep", ["600"]).with_connect_timeout(Duration::from_millis(700));
    manager.add("hanging", hanging, &|_| None).await?;
    manager
        .add(
            "missing",
            McpServerConfig::stdio("/nonexistent/mcp-server", Vec::<String>::new()),
            &|_| None,
        )
        .await?;
    add_connected(&manager, "everything", stdio(&servers.everything())).await?;

    let started = Instant::now();
    assert_eq!(
        echo(&manager, "everything", "unaffected").await?,
        "Echo: unaffected"
    );
    assert!(started.elapsed() < Duration::from_secs(2));

    let hanging = manager.wait_ready("hanging", READY).await?;
    assert_ne!(hanging.state, ServerState::Connected);
    assert!(
        hanging
            .last_error
            .as_deref()
            .unwrap_or_default()
            .contains("initialising"),
        "{hanging:?}"
    );
    eventually(Duration::from_secs(20), || {
        manager.status("missing").is_ok_and(|status| {
            status.state == ServerState::Failed
                && status
                    .last_error
                    .as_deref()
                    .unwrap_or_default()
                    .contains("cannot run")
        })
    })
    .await?;
    let refused = manager
        .call_tool("missing", "anything", json!({}), CallOptions::default())
        .await;
    assert!(
        matches!(refused, Err(McpError::Unavailable { .. })),
        "{refused:?}"
    );
    assert!(
        manager
            .tools()
            .iter()
            .all(|tool| tool.server == "everything"),
        "only the connected server has tools"
    );
    Ok(())
}

#[tokio::test]
async fn concurrent_callers_share_one_process_and_removal_stops_it() -> anyhow::Result<()> {
    let servers = servers()?;
    let manager = connected("everything", stdio(&servers.everything())).await?;
    let pid = manager
        .status("everything")?
        .pid
        .ok_or_else(|| anyhow::anyhow!("no pid"))?;
    let calls = (0..20).map(|i| {
        let manager = manager.clone();
        async move {
            manager
                .call_tool(
                    "everything",
                    "get-sum",
                    json!({"a": i, "b": 1}),
                    CallOptions::default(),
                )
                .await
        }
    });
    for (i, result) in futures::future::join_all(calls)
        .await
        .into_iter()
        .enumerate()
    {
        assert!(text(&result?).contains(&(i + 1).to_string()));
    }
    assert_eq!(manager.status("everything")?.pid, Some(pid));
    manager.remove("everything").await?;
    eventually(Duration::from_secs(5), || !process_alive(pid)).await?;
    assert!(matches!(
        manager.status("everything"),
        Err(McpError::UnknownServer(_))
    ));
    Ok(())
}

#[tokio::test]
async fn restart_on_request_starts_a_new_process() -> anyhow::Result<()> {
    let servers = servers()?;
    let manager = connected("everything", stdio(&servers.everything())).await?;
    let before = manager.status("everything")?;
    manager.restart("everything")?;
    eventually(Duration::from_secs(30), || {
        manager.status("everything").is_ok_and(|status| {
            status.state == ServerState::Connected && status.restarts == before.restarts + 1
        })
    })
    .await?;
    let after = manager.status("everything")?;
    assert_ne!(after.pid, before.pid);
    if let Some(pid) = before.pid {
        eventually(Duration::from_secs(5), || !process_alive(pid)).await?;
    }
    Ok(())
}

/// Issue 48: a stdio server that exits before it answers says why: the end of its stderr is in
/// its error (the status `GET /v1/mcp-servers` shows), not only "connection closed".
#[tokio::test]
async fn a_server_that_cannot_start_shows_the_end_of_its_stderr() -> anyhow::Result<()> {
    let manager = McpManager::with_stdio(agentry_mcp::StdioPolicy::host());
    let script = "for n in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22; do \
                  echo \"noise $n\" >&2; done; \
                  echo 'ModuleNotFoundError: No module named mcp_server_missing' >&2; exit 1";
    manager
        .add(
            "broken",
            McpServerConfig::stdio("/bin/sh", ["-c", script]),
            &|_| None,
        )
        .await?;
    let status = manager.wait_ready("broken", READY).await?;
    assert_ne!(status.state, ServerState::Connected);
    let error = status.last_error.unwrap_or_default();
    assert!(
        error.contains("ModuleNotFoundError: No module named mcp_server_missing"),
        "{error}"
    );
    // The last lines only.
    assert!(
        error.contains("noise 22") && !error.contains("noise 2\n"),
        "{error}"
    );
    Ok(())
}
