//! Shared helpers: the installed servers, a manager with one server added and ready.

use std::time::Duration;

use agentry_mcp::{McpManager, McpServerConfig, ServerState, ValueSource};
use agentry_testkit::mcp::{LaunchSpec, McpServers};

/// Generous: the Python servers take over a second to start on two busy cores.
pub(super) const READY: Duration = Duration::from_secs(60);

pub(super) fn servers() -> anyhow::Result<McpServers> {
    Ok(McpServers::locate()?)
}

/// The configuration that launches `spec` over stdio.
pub(super) fn stdio(spec: &LaunchSpec) -> McpServerConfig {
    let mut config = McpServerConfig::stdio(spec.program.to_string_lossy(), spec.args.clone());
    for (name, value) in &spec.env {
        config = config.with_env(name, ValueSource::Literal(value.clone()));
    }
    config
}

fn no_secrets(_: &str) -> Option<String> {
    None
}

/// A manager with `config` added as `name`, connected.
pub(super) async fn connected(name: &str, config: McpServerConfig) -> anyhow::Result<McpManager> {
    // These tests are about the protocol, not about where servers run: on the host, allowed
    // explicitly (the sandboxed path has tests of its own).
    let manager = McpManager::with_stdio(agentry_mcp::StdioPolicy::host());
    manager.add(name, config, &no_secrets).await?;
    let status = manager.wait_ready(name, READY).await?;
    anyhow::ensure!(
        status.state == ServerState::Connected,
        "{name} did not connect: {status:?}"
    );
    Ok(manager)
}

/// Adds a server to an existing manager and waits for it.
pub(super) async fn add_connected(
    manager: &McpManager,
    name: &str,
    config: McpServerConfig,
) -> anyhow::Result<()> {
    manager.add(name, config, &no_secrets).await?;
    let status = manager.wait_ready(name, READY).await?;
    anyhow::ensure!(
        status.state == ServerState::Connected,
        "{name} did not connect: {status:?}"
    );
    Ok(())
}

/// The text parts of a result, joined.
pub(super) fn text(result: &agentry_mcp::McpToolResult) -> String {
    result
        .content
        .iter()
        .filter_map(|part| match part {
            agentry_types::ToolResultPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Polls `condition` every 20 ms for up to `limit`.
pub(super) async fn eventually(
    limit: Duration,
    mut condition: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + limit;
    while !condition() {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// Calls `echo` on `server` and returns the text it answered.
pub(super) async fn echo(
    manager: &McpManager,
    server: &str,
    message: &str,
) -> anyhow::Result<String> {
    let result = manager
        .call_tool(
            server,
            "echo",
            serde_json::json!({ "message": message }),
            agentry_mcp::CallOptions::default(),
        )
        .await?;
    Ok(text(&result))
}
