//! Command-line arguments and the commands they run.

mod agents;
mod chat;
mod data;
mod files;
mod keys;
mod mcp;
mod mcp_serve;
mod models;
mod output;
mod profile;
mod run;
mod sandbox;
mod schedules;
mod serve;
mod sessions;
mod usage;
mod workflows;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Agentry: a durable, fast runtime for AI agents.
#[derive(Debug, Parser)]
#[command(name = "agentry", version, about)]
pub(crate) struct Cli {
    /// More log output on stderr (-v info, -vv debug); RUST_LOG overrides.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
    /// How logs are written on stderr: `text`, or `json` (one object per line with the time,
    /// level, target, message and the run's ids).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "text",
        env = "AGENTRY_LOG_FORMAT"
    )]
    pub(crate) log_format: crate::telemetry::LogFormat,
    /// Export traces over OTLP to this collector (as `OTEL_EXPORTER_OTLP_ENDPOINT`, which is
    /// read too, with the other `OTEL_*` variables); no export when neither is set.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) otlp_endpoint: Option<String>,
    /// Record message contents on trace spans (prompts, answers, tool arguments and results;
    /// off by default; also `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true`).
    #[arg(long, global = true)]
    pub(crate) trace_content: bool,
    #[command(flatten)]
    data: data::DataArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the HTTP API (default 127.0.0.1:7988) on the data folder's database.
    Serve(serve::ServeArgs),
    /// Run one task: the model calls tools until it has an answer. Saved as a session.
    Run(run::RunArgs),
    /// Talk with a model in the terminal (line editing and history; Ctrl-C cancels a turn).
    Chat(chat::ChatArgs),
    /// The saved models `run` and `chat` use (the default one, or `--model ID`).
    Models(models::ModelsArgs),
    /// Saved agents: list, show, add, rm (`run --agent` and `chat --agent` run as one).
    Agents(agents::AgentsArgs),
    /// Inspect and manage saved sessions.
    Sessions(sessions::SessionsArgs),
    /// A session's workspace files: ls, get, put, rm.
    Files(files::FilesArgs),
    /// Manage the API keys of `agentry serve`.
    Keys(keys::KeysArgs),
    /// Schedules `agentry serve` fires: list, add, show, rm, runs.
    Schedules(schedules::SchedulesArgs),
    /// Tokens and cost of model calls over a time range, grouped by agent, model, session,
    /// API key or day.
    Usage(usage::UsageArgs),
    /// Spending budgets of agents and API keys: list, add, rm.
    Budgets(usage::BudgetsArgs),
    /// Workflows: list, show, add (JSON or YAML), rm, run (followed step by step), runs, status.
    Workflows(workflows::WorkflowsArgs),
    /// MCP servers: add, list, remove, restart; `mcp serve` offers Agentry's agents over stdio.
    Mcp(mcp::McpArgs),
    /// Say what isolation this host gives sandboxes (namespaces, Landlock, seccomp, cgroups).
    Doctor(sandbox::DoctorArgs),
}

/// Runs the chosen command.
/// An application error as the CLI reports it: its message, without the stable code.
pub(crate) fn app_error(error: agentry_app::AppError) -> anyhow::Error {
    anyhow::anyhow!(error.message)
}

pub(crate) async fn execute(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Serve(args) => serve::run(args, &cli.data).await,
        Command::Run(args) => run::run(args, &cli.data).await,
        Command::Chat(args) => chat::chat(args, &cli.data).await,
        Command::Agents(args) => agents::agents(args, &cli.data).await,
        Command::Sessions(args) => sessions::sessions(args, &cli.data).await,
        Command::Files(args) => files::files(args, &cli.data).await,
        Command::Keys(args) => keys::keys(args, &cli.data).await,
        Command::Models(args) => models::models(args, &cli.data).await,
        Command::Schedules(args) => schedules::schedules(args, &cli.data).await,
        Command::Usage(args) => usage::usage(args, &cli.data).await,
        Command::Budgets(args) => usage::budgets(args, &cli.data).await,
        Command::Workflows(args) => workflows::workflows(args, &cli.data).await,
        Command::Mcp(args) => mcp::mcp(args, &cli.data).await,
        Command::Doctor(args) => sandbox::doctor(args, &cli.data).await,
    }
}
