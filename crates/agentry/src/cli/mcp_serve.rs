//! `agentry mcp serve`: Agentry as an MCP server on stdin and stdout, for MCP clients that
//! launch their servers as programs. Each saved agent is a tool (`ask_<agent id>`: a message
//! in, the agent's final answer out, with progress notifications while it runs); with
//! `--expose-tools` the registered tools are offered too.
//!
//! stdout carries JSON-RPC and nothing else: logs go to stderr (see `main.rs`) and nothing here
//! prints. Runs are durable sessions in the data folder, like `agentry serve`'s. A call the
//! client cancels (or abandons by going away) cancels its run. On SIGINT/SIGTERM, or once the
//! client has gone, live runs get a short grace period; any still going stay in flight in the
//! log and resume at the next `agentry serve`.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use agentry_app::App;
use agentry_app::mcp_server::{McpServer, identity};

use super::data::DataArgs;

/// How long live runs get to finish once the client has gone.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Flags of `agentry mcp serve`.
#[derive(Debug, Args)]
pub(crate) struct McpServeArgs {
    /// Also offer the registered tools (besides the agents), called directly.
    #[arg(long)]
    expose_tools: bool,
}

pub(crate) async fn run(args: McpServeArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    agentry_app::mcp_tools::import_servers_file(&store, &data.home()?).await?;
    let mut app = App::new(store).await?;
    app.expose_tools_over_mcp(args.expose_tools);
    tracing::info!(
        home = %data.home()?.display(),
        expose_tools = args.expose_tools,
        "serving MCP on stdio"
    );
    // A signal stops serving the way `agentry serve` stops: runs in flight are left to
    // start-up recovery rather than cancelled.
    tokio::spawn({
        let shutdown = app.shutdown_signal().clone();
        async move {
            super::serve::wait_for_signal().await;
            shutdown.cancel();
        }
    });
    let backend = Arc::new(McpServer::new(app.clone()));
    let served = agentry_app::domain::mcp::server::serve_stdio(
        backend,
        identity(),
        app.shutdown_signal().clone(),
    )
    .await;
    app.shut_down();
    let runs = app.drain(SHUTDOWN_GRACE).await;
    if runs > 0 {
        tracing::warn!(
            runs,
            "stopping with runs in flight; they resume at the next `agentry serve`"
        );
    }
    served?;
    Ok(ExitCode::SUCCESS)
}
