//! `agentry mcp serve`: placeholder being written.

use std::process::ExitCode;

use clap::Args;

use super::data::DataArgs;

/// Flags of `agentry mcp serve`.
#[derive(Debug, Args)]
pub(crate) struct McpServeArgs {}

pub(crate) async fn run(_args: McpServeArgs, _data: &DataArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("agentry mcp serve is being written")
}
