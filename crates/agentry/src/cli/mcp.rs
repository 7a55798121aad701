//! `agentry mcp add|list|rm|restart|serve`: the MCP servers of the runtime.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    #[command(subcommand)]
    command: McpCommand,
}

#[derive(Debug, Subcommand)]
enum McpCommand {
    /// Offer the saved agents (and optionally the registered tools) as an MCP server on stdio.
    Serve(super::mcp_serve::McpServeArgs),
}

pub(crate) async fn mcp(args: McpArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        McpCommand::Serve(args) => super::mcp_serve::run(args, data).await,
    }
}
