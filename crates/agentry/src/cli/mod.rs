//! Command-line arguments and the commands they run.

mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Agentry: a durable, fast runtime for AI agents.
#[derive(Debug, Parser)]
#[command(name = "agentry", version, about)]
pub(crate) struct Cli {
    /// More log output on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Send one prompt to a model and stream the answer.
    Run(run::RunArgs),
}

/// Runs the chosen command.
pub(crate) async fn execute(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(args).await,
    }
}
