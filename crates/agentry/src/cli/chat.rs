//! `agentry chat`: an interactive conversation in the terminal.
//!
//! Line editing and history come from rustyline (history kept in `AGENTRY_HOME/chat_history`,
//! default `~/.agentry`). Ctrl-C during a turn cancels that turn and returns to the prompt;
//! Ctrl-C at the prompt clears the line; Ctrl-D or `/exit` quits.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use futures::StreamExt;
use rustyline::error::ReadlineError;

use agentry_core::RunRequest;
use agentry_types::Message;

use super::model::{AgentArgs, ModelArgs};
use super::output::Printer;

#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    agent: AgentArgs,
}

fn history_file() -> Option<PathBuf> {
    let home = std::env::var_os("AGENTRY_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".agentry")))?;
    std::fs::create_dir_all(&home).ok()?;
    Some(home.join("chat_history"))
}

pub(crate) async fn chat(args: ChatArgs) -> anyhow::Result<ExitCode> {
    let runtime = args.agent.runtime(args.model.client()?)?;
    let mut editor = rustyline::DefaultEditor::new()?;
    let history = history_file();
    if let Some(path) = &history {
        // A missing or unreadable history file just means no history yet.
        let _ = editor.load_history(path);
    }
    eprintln!("agentry chat — Ctrl-C cancels a turn, Ctrl-D or /exit quits.");
    let mut conversation: Vec<Message> = Vec::new();
    loop {
        // rustyline blocks; keep it off the async worker threads.
        let (returned, line) = tokio::task::spawn_blocking(move || {
            let line = editor.readline("› ");
            (editor, line)
        })
        .await?;
        editor = returned;
        let line = match line {
            Ok(line) => line,
            Err(ReadlineError::Interrupted) => continue,
            Err(ReadlineError::Eof) => break,
            Err(error) => return Err(error.into()),
        };
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        if text == "/exit" || text == "/quit" {
            break;
        }
        let _ = editor.add_history_entry(text);

        let mut request = RunRequest::text(text).with_history(conversation.clone());
        request.system = args.agent.system.clone();
        request.params = args.model.params();
        let mut stream = runtime.stream(request)?;
        let cancel = stream.cancel_token();
        let mut printer = Printer::new(false);
        loop {
            tokio::select! {
                event = stream.next() => match event {
                    Some(event) => printer.event(&event)?,
                    None => break,
                },
                _ = tokio::signal::ctrl_c() => {
                    cancel.cancel();
                    eprintln!("\n(cancelled)");
                }
            }
        }
        let output = stream.finish().await?;
        // Keep the turn, whatever its end: the repair pass closes any call left unanswered.
        let mut messages = output.state.messages;
        if args.agent.system.is_some() && !messages.is_empty() {
            messages.remove(0);
        }
        conversation = messages;
    }
    if let Some(path) = &history {
        let _ = editor.save_history(path);
    }
    Ok(ExitCode::SUCCESS)
}
