//! `agentry run`: one task, run to its answer, streamed to the terminal.

use std::process::ExitCode;

use clap::Args;
use futures::StreamExt;

use agentry_core::RunRequest;

use super::model::{AgentArgs, ModelArgs};
use super::output::{Printer, exit_code};

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The task.
    prompt: String,
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    agent: AgentArgs,
    /// Print one JSON object per line for every event instead of text.
    #[arg(long)]
    json: bool,
}

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let runtime = args.agent.runtime(args.model.client()?)?;
    let mut request = RunRequest::text(&args.prompt);
    request.system = args.agent.system.clone();
    request.params = args.model.params();
    let mut stream = runtime.stream(request)?;
    let cancel = stream.cancel_token();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    let mut printer = Printer::new(args.json);
    while let Some(event) = stream.next().await {
        printer.event(&event)?;
    }
    let output = stream.finish().await?;
    if let Some(note) = &output.note {
        eprintln!("agentry: stopped: {note}");
    }
    Ok(ExitCode::from(exit_code(output.stop_reason)))
}
