//! Command-line arguments and the commands they run.

mod chat;
mod model;
mod output;
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
    /// Run one task: the model calls tools until it has an answer.
    Run(run::RunArgs),
    /// Talk with a model in the terminal (line editing and history; Ctrl-C cancels a turn).
    Chat(chat::ChatArgs),
}

/// Runs the chosen command.
pub(crate) async fn execute(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run(args) => run::run(args).await,
        Command::Chat(args) => chat::chat(args).await,
    }
}
