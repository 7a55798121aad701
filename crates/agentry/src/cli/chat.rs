//! `agentry chat`: an interactive conversation in the terminal, saved as a session.
//!
//! Line editing and history come from rustyline (history kept in the data folder's
//! `chat_history`). Ctrl-C during a turn cancels that turn and returns to the prompt; Ctrl-C at
//! the prompt clears the line; Ctrl-D or `/exit` quits. `--session ID` continues a session.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use futures::StreamExt;
use rustyline::error::ReadlineError;

use agentry_core::session::{BusyPolicy, SessionManager};
use agentry_core::{RunRequest, RunStream, Runtime};
use agentry_types::{Message, SessionId};

use agentry_server::ToolEnvironment;
use agentry_server::routes::agents::AgentRun;

use super::data::DataArgs;
use super::output::Printer;
use super::profile::Profile;
use super::sessions::{open_session, session_manager};

#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    profile: Profile,
    /// Continue this session.
    #[arg(long, value_name = "ID", conflicts_with = "ephemeral")]
    session: Option<SessionId>,
    /// Keep nothing: no session is saved.
    #[arg(long)]
    ephemeral: bool,
    /// Talk with this saved agent (`agentry agents`): its model, tools, prompt and limits.
    #[arg(long, value_name = "ID", conflicts_with_all = ["model_name", "provider", "base_url"])]
    agent: Option<String>,
}

/// Where the turns go: a saved session, or a conversation kept in memory.
enum Conversation {
    Session(SessionManager, SessionId),
    Ephemeral(Runtime, Vec<Message>),
}

impl Conversation {
    async fn turn(
        &mut self,
        text: &str,
        profile: &Profile,
        agent: Option<&AgentRun>,
    ) -> anyhow::Result<RunStream> {
        let request = match agent {
            Some(run) => super::agents::request(run, text),
            None => {
                let mut request = RunRequest::text(text);
                request.system = profile.system.clone();
                request.params = profile.params();
                request
            }
        };
        Ok(match self {
            Self::Session(manager, session) => {
                manager.send(*session, request, BusyPolicy::Reject).await?
            }
            Self::Ephemeral(runtime, history) => {
                runtime.stream(request.with_history(history.clone()))?
            }
        })
    }

    fn after(&mut self, messages: Vec<Message>) {
        if let Self::Ephemeral(_, history) = self {
            *history = messages;
        }
    }
}

pub(crate) async fn chat(args: ChatArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let mut agent_run = None;
    let (mut conversation, profile) = if let Some(id) = &args.agent {
        let store = data.open_store().await?;
        let agent = super::agents::load(&store, id).await?;
        if args.ephemeral {
            let (runtime, run) =
                super::agents::runtime(&store, &agent, &ToolEnvironment::default()).await?;
            agent_run = Some(run);
            (Conversation::Ephemeral(runtime, Vec::new()), args.profile)
        } else {
            let (manager, run) =
                super::agents::session_manager(&store, &agent, args.profile.sandbox, data).await?;
            agent_run = Some(run);
            let (session, profile) =
                open_session(&store, args.session, args.profile, "chat", None).await?;
            eprintln!("session: {session}");
            (Conversation::Session(manager, session), profile)
        }
    } else if args.ephemeral {
        let store = if args.profile.uses_mcp() {
            Some(data.open_store().await?)
        } else {
            None
        };
        (
            Conversation::Ephemeral(
                args.profile.runtime(store.as_ref(), None).await?,
                Vec::new(),
            ),
            args.profile,
        )
    } else {
        let store = data.open_store().await?;
        let (session, profile) =
            open_session(&store, args.session, args.profile, "chat", None).await?;
        eprintln!("session: {session}");
        (
            Conversation::Session(session_manager(&store, &profile, data).await?, session),
            profile,
        )
    };
    let mut editor = rustyline::DefaultEditor::new()?;
    let history = history_file(data);
    if let Some(path) = &history {
        // A missing or unreadable history file just means no history yet.
        let _ = editor.load_history(path);
    }
    eprintln!("agentry chat — Ctrl-C cancels a turn, Ctrl-D or /exit quits.");
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
        let mut stream = conversation
            .turn(text, &profile, agent_run.as_ref())
            .await?;
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
        // Keep the turn, whatever its end: the repair pass closes any call left unanswered.
        conversation.after(stream.finish().await?.state.messages);
    }
    if let Some(path) = &history {
        let _ = editor.save_history(path);
    }
    Ok(ExitCode::SUCCESS)
}

fn history_file(data: &DataArgs) -> Option<PathBuf> {
    let home = data.home().ok()?;
    std::fs::create_dir_all(&home).ok()?;
    Some(home.join("chat_history"))
}
