//! The real MCP servers that `scripts/install-mcp-servers` installs: every launch points at an
//! installed program and script, and the streamable HTTP server answers a raw `initialize`.

use std::path::Path;
use std::time::{Duration, Instant};

use agentry_testkit::mcp::{LaunchSpec, McpServers, McpServersError};
use anyhow::{Context, ensure};

use super::client::http_client;

/// A tiny `initialize` request, as any client would send first.
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"agentry-testkit","version":"0"}}}"#;

#[test]
fn every_stdio_launch_points_at_installed_files() -> anyhow::Result<()> {
    let servers = McpServers::locate()?;
    let scratch = servers.root().join("scratch-not-created");
    let specs: [(&str, LaunchSpec); 5] = [
        ("everything", servers.everything()),
        ("filesystem", servers.filesystem(&scratch)),
        ("memory", servers.memory(&scratch.join("memory.jsonl"))),
        ("time", servers.time()),
        ("fetch", servers.fetch()),
    ];
    for (name, spec) in &specs {
        ensure!(spec.program.is_file(), "{name}: no program at {spec}");
        if spec.program == servers.node() {
            let script = spec
                .args
                .first()
                .context("a node launch names its script")?;
            ensure!(Path::new(script).is_file(), "{name}: no script at {spec}");
        }
    }
    assert_eq!(specs[0].1.args.last().map(String::as_str), Some("stdio"));
    assert_eq!(
        specs[2].1.env,
        [(
            "MEMORY_FILE_PATH".to_owned(),
            scratch.join("memory.jsonl").display().to_string()
        )]
    );
    assert!(
        !specs[4]
            .1
            .args
            .iter()
            .any(|arg| arg == "--allow-private-ips"),
        "fetch must refuse loopback: {}",
        specs[4].1
    );
    ensure!(
        servers.python().is_file(),
        "no python at {}",
        servers.python().display()
    );
    Ok(())
}

#[tokio::test]
async fn everything_over_http_answers_initialize_with_a_session() -> anyhow::Result<()> {
    let servers = McpServers::locate()?;
    let server = servers.start_everything_http().await?;
    assert_eq!(
        server.url(),
        format!("http://127.0.0.1:{}/mcp", server.port())
    );

    let response = http_client()
        .post(server.url())
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(INITIALIZE)
        .send()
        .await?;
    assert_eq!(response.status(), 200);
    let session = response
        .headers()
        .get("mcp-session-id")
        .context("initialize must open a session")?
        .to_str()?
        .to_owned();
    ensure!(!session.is_empty(), "empty mcp-session-id");
    let body = response.text().await?;
    ensure!(
        body.contains(r#""serverInfo""#) && body.contains(r#""id":1"#),
        "not an initialize result: {body}"
    );
    ensure!(
        server.stderr().contains("listening on port"),
        "unexpected stderr: {}",
        server.stderr()
    );

    // Dropping the handle kills the server: the port stops accepting connections.
    let port = server.port();
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(10);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_ok()
    {
        ensure!(
            Instant::now() < deadline,
            "port {port} still open after the drop"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(())
}

#[tokio::test]
async fn two_http_servers_run_side_by_side() -> anyhow::Result<()> {
    let servers = McpServers::locate()?;
    let (first, second) = tokio::try_join!(
        servers.start_everything_http(),
        servers.start_everything_http()
    )?;
    assert_ne!(first.port(), second.port());
    Ok(())
}

#[tokio::test]
async fn a_server_that_dies_at_start_is_an_error_with_its_status_and_stderr() -> anyhow::Result<()>
{
    // A fake install whose everything server exits at once.
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mcp-servers-that-die");
    for relative in [
        "npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js",
        "npm/node_modules/@modelcontextprotocol/server-memory/dist/index.js",
        "venv/bin/python",
        "venv/bin/mcp-server-time",
        "venv/bin/mcp-server-fetch",
    ] {
        let path = root.join(relative);
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        std::fs::write(path, "")?;
    }
    let everything = root.join("npm/node_modules/@modelcontextprotocol/server-everything/dist");
    std::fs::create_dir_all(&everything)?;
    std::fs::write(
        everything.join("index.js"),
        "console.error('boom on ' + process.argv[2]); process.exit(3);\n",
    )?;

    let servers = McpServers::at(&root)?;
    let error = servers
        .start_everything_http()
        .await
        .err()
        .context("the server dies, so starting it must fail")?;
    let McpServersError::Exited { status, stderr, .. } = &error else {
        anyhow::bail!("unexpected error: {error}");
    };
    assert_eq!(status.code(), Some(3), "{error}");
    assert_eq!(stderr, "boom on streamableHttp", "{error}");
    Ok(())
}
