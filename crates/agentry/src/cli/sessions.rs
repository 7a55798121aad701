//! `agentry sessions …`: list, show, resume, fork, title, search, remove and prune sessions.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;

use agentry_app::domain::core::session::{SessionManager, replay};
use agentry_app::domain::store::{NewSession, SessionQuery, Store};
use agentry_types::{AssistantPart, ContentPart, Message, SessionId};

use super::app_error;
use super::data::DataArgs;
use super::output::print_run;
use super::profile::{METADATA_KEY, Profile};
use agentry_app::elicitation::Elicitations;
use agentry_app::{App, StoreLog, ToolEnvironment};

#[derive(Debug, Args)]
pub(crate) struct SessionsArgs {
    #[command(subcommand)]
    command: SessionsCommand,
}

#[derive(Debug, Subcommand)]
enum SessionsCommand {
    /// List sessions, most recently active first.
    List {
        /// Only sessions with this status (idle, running, interrupted, failed).
        #[arg(long)]
        status: Option<String>,
        /// At most this many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// Show a session's conversation (marks it read).
    Show {
        /// The session.
        id: SessionId,
        /// Print the raw event log, one JSON object per line.
        #[arg(long)]
        events: bool,
    },
    /// Continue the run that was in flight when the process stopped.
    Resume {
        /// The session.
        id: SessionId,
        #[command(flatten)]
        profile: Profile,
        /// One JSON object per line for every event.
        #[arg(long)]
        json: bool,
    },
    /// Resume every run that was in flight when a process stopped (after a crash or a reboot).
    /// Run it once at start-up, while no other agentry process is working on the sessions.
    Recover {
        /// One JSON object per line for every event.
        #[arg(long)]
        json: bool,
    },
    /// Start a new session from any point of another (time travel); the history is shared, not
    /// copied.
    Fork {
        /// The session to fork.
        id: SessionId,
        /// The last event to keep (default: all of them).
        #[arg(long)]
        at: Option<u64>,
    },
    /// Give a session a title: the one given, or one the model writes.
    Title {
        /// The session.
        id: SessionId,
        /// The title (omit to have the model write one).
        title: Option<String>,
        #[command(flatten)]
        profile: Profile,
    },
    /// Find sessions whose messages contain TEXT.
    Search {
        /// The text.
        text: String,
        /// At most this many hits.
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// Delete a session and its events.
    Rm {
        /// The session.
        id: SessionId,
    },
    /// Delete expired sessions, and finished ones older than N days.
    Prune {
        /// Also delete sessions with no activity for this many days.
        #[arg(long, value_name = "DAYS")]
        older_than_days: Option<u64>,
    },
}

/// Opens `session` (its saved profile under the given flags), or creates a new one saving them.
pub(crate) async fn open_session(
    store: &Store,
    session: Option<SessionId>,
    flags: Profile,
    first_prompt: &str,
    ttl_days: Option<u64>,
) -> anyhow::Result<(SessionId, Profile)> {
    if let Some(id) = session {
        let record = store
            .session(id)
            .await?
            .with_context(|| format!("no session {id}"))?;
        let profile = flags.over(Profile::from_metadata(&record.metadata));
        return Ok((id, profile));
    }
    let mut new = NewSession::new();
    new.title = Some(first_prompt.chars().take(80).collect());
    new.metadata = json!({ METADATA_KEY: flags.to_saved() });
    new.expires_at = ttl_days.map(|days| agentry_app::clock::now_ms() + days * 24 * 3600 * 1000);
    let record = store.create_session(new).await?;
    Ok((record.id, flags))
}

/// The session to continue (its saved profile under `flags`) or a new one, with a session
/// manager for it. The model is settled first (the saved default when none is named) and a new
/// session is created only once the manager is built, so a run that cannot start (no model, a
/// bad tool) leaves no empty session behind.
pub(crate) async fn session_with_manager(
    store: &Store,
    session: Option<SessionId>,
    flags: Profile,
    first_prompt: &str,
    ttl_days: Option<u64>,
    data: &DataArgs,
    elicitations: Option<&Elicitations>,
) -> anyhow::Result<(SessionId, Profile, SessionManager)> {
    let mut profile = match session {
        Some(id) => {
            let record = store
                .session(id)
                .await?
                .with_context(|| format!("no session {id}"))?;
            flags.over(Profile::from_metadata(&record.metadata))
        }
        None => flags,
    };
    profile.choose_model(store).await?;
    let manager = session_manager(store, &profile, data, elicitations).await?;
    let (session, profile) = open_session(store, session, profile, first_prompt, ttl_days).await?;
    Ok((session, profile, manager))
}

/// A session manager over the store, with the profile's model and tools.
///
/// Sessions get workspaces under the data folder and, unless the profile turns it off, a
/// sandbox for the tools that run commands.
pub(crate) async fn session_manager(
    store: &Store,
    profile: &Profile,
    data: &DataArgs,
    elicitations: Option<&Elicitations>,
) -> anyhow::Result<SessionManager> {
    let mut environment = profile
        .network
        .environment(profile.sandbox_mode(), &data.home()?)?;
    environment.elicitations = elicitations.cloned();
    let manager = SessionManager::new(
        profile.runtime(Some(store), Some(&environment)).await?,
        Arc::new(StoreLog::new(store.clone())),
    );
    Ok(match environment.workspaces {
        Some(root) => manager.with_workspaces(root),
        None => manager,
    })
}

/// The application over the data folder for commands about stored sessions: nothing runs (no
/// MCP server starts); the sessions' workspaces, and their file journals, are the data folder's
/// (`agentry serve`'s default).
async fn sessions_app(store: Store, data: &DataArgs) -> anyhow::Result<App> {
    let environment = ToolEnvironment {
        workspaces: Some(data.home()?.join("workspaces")),
        ..ToolEnvironment::default()
    };
    App::builder(store)
        .tools(environment)
        .mcp(agentry_app::McpStart::None)
        .build()
        .await
        .map_err(app_error)
}

pub(crate) async fn sessions(args: SessionsArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    match args.command {
        SessionsCommand::List {
            status,
            limit,
            json,
        } => {
            let query = SessionQuery {
                status,
                limit,
                ..SessionQuery::default()
            };
            for record in store.list_sessions(&query).await? {
                if json {
                    println!(
                        "{}",
                        json!({
                            "id": record.id, "title": record.title, "status": record.status,
                            "last_activity": record.last_activity, "events": record.last_seq,
                            "unread": record.unread(), "parent": record.parent.map(|(id, seq)| json!({"id": id, "seq": seq})),
                        })
                    );
                } else {
                    println!(
                        "{}  {:<11} {}{:>5} events  {}",
                        record.id,
                        record.status,
                        if record.unread() { "● " } else { "  " },
                        record.last_seq,
                        record.title.as_deref().unwrap_or("")
                    );
                }
            }
        }
        SessionsCommand::Show { id, events } => {
            let record = store
                .session(id)
                .await?
                .with_context(|| format!("no session {id}"))?;
            let log = StoreLog::new(store.clone());
            let stored = agentry_app::domain::core::session::SessionLog::load(&log, id).await?;
            if events {
                for (seq, event) in &stored {
                    println!("{}", json!({"seq": seq, "event": event}));
                }
            } else {
                println!(
                    "{}  {}  {}",
                    record.id,
                    record.status,
                    record.title.as_deref().unwrap_or("")
                );
                for message in replay(&stored).messages {
                    println!("{}", describe(&message));
                }
            }
            store.mark_read(id, record.last_seq).await?;
        }
        SessionsCommand::Resume { id, profile, json } => {
            let record = store
                .session(id)
                .await?
                .with_context(|| format!("no session {id}"))?;
            let profile = profile.over(Profile::from_metadata(&record.metadata));
            let manager = session_manager(&store, &profile, data, None).await?;
            match manager.resume(id).await? {
                Some(stream) => return print_run(stream, json).await,
                None => eprintln!("session {id} has no interrupted run to resume"),
            }
        }
        SessionsCommand::Recover { json } => {
            let query = SessionQuery {
                status: Some("running".into()),
                limit: usize::MAX,
                ..SessionQuery::default()
            };
            let mut worst = ExitCode::SUCCESS;
            for record in store.list_sessions(&query).await? {
                let profile = Profile::from_metadata(&record.metadata);
                let manager = session_manager(&store, &profile, data, None).await?;
                eprintln!("session: {}", record.id);
                if let Some(stream) = manager.resume(record.id).await? {
                    let code = print_run(stream, json).await?;
                    if code != ExitCode::SUCCESS {
                        worst = code;
                    }
                }
            }
            return Ok(worst);
        }
        SessionsCommand::Fork { id, at } => {
            // As `POST /v1/sessions/{id}/fork` does (a fork taken mid-run is marked interrupted,
            // not a crashed run to recover).
            let app = sessions_app(store.clone(), data).await?;
            let record = app
                .sessions()
                .record(&id.to_string())
                .await
                .map_err(app_error)?;
            let fork = app
                .sessions()
                .fork(&record, at, None)
                .await
                .map_err(app_error)?;
            app.shut_down();
            println!("{}", fork.session.id);
        }
        SessionsCommand::Title { id, title, profile } => {
            let record = store
                .session(id)
                .await?
                .with_context(|| format!("no session {id}"))?;
            let title = match title {
                Some(title) => title,
                None => {
                    let profile = profile.over(Profile::from_metadata(&record.metadata));
                    agentry_app::titles::generate_title(
                        &store,
                        &profile.runtime(Some(&store), None).await?,
                        id,
                        None,
                        None,
                    )
                    .await
                    .map_err(super::app_error)?
                }
            };
            store.set_title(id, &title).await?;
            println!("{title}");
        }
        SessionsCommand::Search { text, limit } => {
            for hit in store.search(&text, limit).await? {
                println!("{}  #{:<5} {}", hit.session_id, hit.seq, hit.snippet);
            }
        }
        SessionsCommand::Rm { id } => {
            // As `DELETE /v1/sessions/{id}` does: the session's file journal goes with it.
            let app = sessions_app(store.clone(), data).await?;
            app.sessions()
                .record(&id.to_string())
                .await
                .map_err(app_error)?;
            app.sessions().delete(id).await.map_err(app_error)?;
            app.shut_down();
        }
        SessionsCommand::Prune { older_than_days } => {
            let older_than = older_than_days.map(|days| Duration::from_secs(days * 24 * 3600));
            let removed = store.prune(older_than).await?;
            println!("removed {removed} session(s)");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// One line per message, for `sessions show`.
fn describe(message: &Message) -> String {
    match message {
        Message::System { text } => format!("system: {text}"),
        Message::User { content } => {
            let text: Vec<String> = content
                .iter()
                .map(|part| match part {
                    ContentPart::Text { text } => text.clone(),
                    ContentPart::Image { .. } => "[image]".into(),
                    ContentPart::Audio { .. } => "[audio]".into(),
                })
                .collect();
            format!("user: {}", text.join(" "))
        }
        Message::Assistant { content } => {
            let parts: Vec<String> = content
                .iter()
                .map(|part| match part {
                    AssistantPart::Text { text } => text.clone(),
                    AssistantPart::Thinking(_) => "[thinking]".into(),
                    AssistantPart::ToolCall(call) => format!("→ {}({})", call.name, call.arguments),
                })
                .collect();
            format!("assistant: {}", parts.join(" "))
        }
        Message::Tool(result) => {
            let text = result.text_content();
            let first: String = text
                .lines()
                .next()
                .unwrap_or_default()
                .chars()
                .take(120)
                .collect();
            format!("tool {}: {first}", result.call_id)
        }
    }
}
