//! `agentry chat`: an interactive conversation in the terminal, saved as a session.
//!
//! Line editing and history come from rustyline (history kept in the data folder's
//! `chat_history`). Ctrl-C during a turn cancels that turn and returns to the prompt; Ctrl-C at
//! the prompt clears the line; Ctrl-D or `/exit` quits. `--session ID` continues a session.
//! When a turn's tool calls wait for approval (an agent's `approvals` policy), chat asks for
//! each inline: `y` approves, `n` rejects (with a reason the model reads), `e` edits the
//! arguments (JSON), and the run goes on. When an MCP server asks for input during a tool call
//! (elicitation), chat asks for it inline too: each field of a form, or a page to visit.
//!
//! `--agent` in a session goes through the application exactly as `POST /v1/infer` does (the
//! agent's checks and shared workspace, the fenced log, the app's hub for its sub-agents), and
//! its decisions as `POST /v1/runs/{id}/approvals` does.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use futures::StreamExt;
use rustyline::error::ReadlineError;

use agentry_app::domain::core::approval::ApprovalDecision;
use agentry_app::domain::core::session::{BusyPolicy, SessionManager};
use agentry_app::domain::core::{RunStream, Runtime};
use agentry_types::{
    ApprovalVerdict, Message, PendingApproval, RunEvent, RunId, SessionId, SuspendStatus,
};

use agentry_app::agents::AgentRun;
use agentry_app::auth::Principal;
use agentry_app::domain::mcp::ElicitationAnswer;
use agentry_app::domain::store::Store;
use agentry_app::elicitation::Elicitations;
use agentry_app::follow::{FollowFrom, Followed};
use agentry_app::ops::Op;
use agentry_app::runs::{RunSpec, SessionChoice, Target, prepare};
use agentry_app::{App, ToolEnvironment};

use super::app_error;
use super::data::DataArgs;
use super::output::Printer;
use super::profile::Profile;
use super::sessions::session_with_manager;

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

/// Where the turns go: a saved agent's session through the application, a saved session on
/// this command's own runtime (a model and tools named by flags), or a conversation kept in
/// memory.
enum Conversation {
    Agent {
        app: App,
        agent: String,
        /// None until the first turn makes it.
        session: Option<SessionId>,
    },
    Session(SessionManager, SessionId),
    Ephemeral(Runtime, Vec<Message>),
}

/// A turn's events as chat reads them: a run of this command's runtime, or a run of the
/// application followed as the HTTP API follows it.
enum TurnEvents {
    Runtime(RunStream),
    App {
        events: Followed,
        app: App,
        session: SessionId,
        /// The last committed event seen: where a run continued after decisions is followed
        /// from.
        last_seq: u64,
    },
}

impl TurnEvents {
    async fn next(&mut self) -> Option<anyhow::Result<Arc<RunEvent>>> {
        match self {
            Self::Runtime(stream) => stream.next().await.map(|event| Ok(Arc::new(event))),
            Self::App {
                events, last_seq, ..
            } => {
                let event = events.next().await?.map_err(app_error);
                if let Ok(event) = &event
                    && let RunEvent::Committed { seq, .. } = event.as_ref()
                {
                    *last_seq = *seq;
                }
                Some(event)
            }
        }
    }

    /// Stops the run (Ctrl-C).
    fn cancel(&self) {
        match self {
            Self::Runtime(stream) => stream.cancel_token().cancel(),
            Self::App { app, session, .. } => super::output::stop_session(app, *session),
        }
    }

    /// What the turn left: the run's state on this command's runtime; nothing for the
    /// application's (its log has it).
    async fn finish(self) -> anyhow::Result<Finished> {
        Ok(match self {
            Self::Runtime(stream) => Finished::State(Box::new(stream.finish().await?.state)),
            Self::App { last_seq, .. } => Finished::Logged { last_seq },
        })
    }
}

/// What a turn left.
enum Finished {
    State(Box<agentry_app::domain::core::RunState>),
    Logged { last_seq: u64 },
}

/// A turn's request on this command's runtime: as the agent (with its memories), or with the
/// profile's flags.
async fn request_of(
    text: &str,
    profile: &Profile,
    agent: Option<&(Store, AgentRun)>,
) -> anyhow::Result<agentry_app::domain::core::RunRequest> {
    Ok(match agent {
        Some((store, run)) => super::agents::request(store, run, text).await?,
        None => profile.request(text),
    })
}

impl Conversation {
    async fn turn(
        &mut self,
        text: &str,
        profile: &Profile,
        agent: Option<&(Store, AgentRun)>,
    ) -> anyhow::Result<TurnEvents> {
        let (app, agent_id, session) = match self {
            Self::Agent {
                app,
                agent,
                session,
            } => (app, agent, session),
            Self::Session(manager, session) => {
                let request = request_of(text, profile, agent).await?;
                let stream = manager.send(*session, request, BusyPolicy::Reject).await?;
                return Ok(TurnEvents::Runtime(stream));
            }
            Self::Ephemeral(runtime, history) => {
                let request = request_of(text, profile, agent).await?;
                let stream = runtime.stream(request.with_history(history.clone()))?;
                return Ok(TurnEvents::Runtime(stream));
            }
        };
        {
            let input = RunSpec {
                agent_id: Some(agent_id.clone()),
                input: Some(agentry_app::domain::core::Input::Text { text: text.into() }),
                session: session.map_or(SessionChoice::New, SessionChoice::Existing),
                ..RunSpec::default()
            };
            let (target, request) = Box::pin(prepare(app, &Principal::operator(), input))
                .await
                .map_err(app_error)?;
            let Target::Session(id) = target else {
                anyhow::bail!("a chat turn was prepared without its session");
            };
            if session.replace(id).is_none() {
                eprintln!("session: {id}");
            }
            let events = Box::pin(app.start_followed(id, request, BusyPolicy::Reject))
                .await
                .map_err(app_error)?;
            Ok(TurnEvents::App {
                events,
                app: app.clone(),
                session: id,
                last_seq: 0,
            })
        }
    }

    /// Continues a run whose calls waited, with these decisions.
    async fn decided(
        &mut self,
        run_id: RunId,
        finished: Finished,
        decisions: Vec<ApprovalDecision>,
    ) -> anyhow::Result<Option<TurnEvents>> {
        match (self, finished) {
            (Self::Agent { app, .. }, Finished::Logged { last_seq }) => {
                let decided = Box::pin(app.submit(Op::Decide { run_id, decisions }))
                    .await
                    .map_err(app_error)?;
                if !decided.pending.is_empty() {
                    return Ok(None);
                }
                let session = decided.session_id;
                let events = Box::pin(app.follow(session, FollowFrom::After(last_seq)))
                    .await
                    .map_err(app_error)?;
                Ok(Some(TurnEvents::App {
                    events,
                    app: app.clone(),
                    session,
                    last_seq,
                }))
            }
            (Self::Session(manager, session), _) => Ok(manager
                .decide(*session, run_id, decisions)
                .await?
                .stream
                .map(TurnEvents::Runtime)),
            (Self::Ephemeral(runtime, _), Finished::State(state)) => {
                let mut state = *state;
                for decision in decisions {
                    if let Some(arguments) = &decision.arguments {
                        let name = state
                            .pending_approvals()
                            .into_iter()
                            .find(|p| p.call.id == decision.call_id)
                            .map(|p| p.call.name)
                            .unwrap_or_default();
                        runtime.tools().validate(&name, arguments)?;
                    }
                    state.decide(decision)?;
                }
                Ok(Some(TurnEvents::Runtime(runtime.resume(state)?)))
            }
            _ => anyhow::bail!("the turn's run is not this conversation's"),
        }
    }

    /// Keeps what a turn left (an ephemeral conversation's history).
    fn after(&mut self, finished: Finished) {
        if let (Self::Ephemeral(_, history), Finished::State(state)) = (self, finished) {
            *history = state.messages;
        }
    }
}

pub(crate) async fn chat(args: ChatArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let mut agent_run = None;
    // MCP servers' requests for input during this chat's runs, answered inline.
    let elicitations = Elicitations::default();
    let asking = ToolEnvironment {
        elicitations: Some(elicitations.clone()),
        ..ToolEnvironment::default()
    };
    let (mut conversation, profile) = if let Some(id) = &args.agent {
        let store = data.open_store().await?;
        let agent = super::agents::load(&store, id).await?;
        if args.ephemeral {
            let (runtime, run) = super::agents::runtime(&store, &agent, &asking).await?;
            agent_run = Some((store, run));
            (Conversation::Ephemeral(runtime, Vec::new()), args.profile)
        } else {
            let asked = Some(elicitations.clone());
            let app = super::agents::agent_app(store, &agent, &args.profile, data, asked).await?;
            if let Some(session) = args.session {
                eprintln!("session: {session}");
            }
            let conversation = Conversation::Agent {
                app,
                agent: agent.id.clone(),
                session: args.session,
            };
            (conversation, args.profile)
        }
    } else if args.ephemeral {
        let store = if args.profile.uses_store() {
            Some(data.open_store().await?)
        } else {
            None
        };
        (
            Conversation::Ephemeral(
                args.profile.runtime(store.as_ref(), Some(&asking)).await?,
                Vec::new(),
            ),
            args.profile,
        )
    } else {
        let store = data.open_store().await?;
        let (session, profile, manager) = session_with_manager(
            &store,
            args.session,
            args.profile,
            "chat",
            None,
            data,
            Some(&elicitations),
        )
        .await?;
        eprintln!("session: {session}");
        (Conversation::Session(manager, session), profile)
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
        let mut turn = conversation
            .turn(text, &profile, agent_run.as_ref())
            .await?;
        loop {
            let mut printer = Printer::new(false);
            let mut waiting = None;
            loop {
                tokio::select! {
                    event = turn.next() => match event {
                        Some(event) => {
                            let event = event?;
                            printer.event(&event)?;
                            if let Some(asked) = elicitation_in(&event) {
                                editor = answer_elicitation(editor, &elicitations, asked).await?;
                            }
                            if let RunEvent::RunSuspended { run_id, status: SuspendStatus::Waiting, pending, .. } = event.as_ref() {
                                waiting = Some((*run_id, pending.clone()));
                            }
                        }
                        None => break,
                    },
                    _ = tokio::signal::ctrl_c() => {
                        turn.cancel();
                        eprintln!("\n(cancelled)");
                    }
                }
            }
            let finished = turn.finish().await?;
            let Some((run_id, pending)) = waiting else {
                // Keep the turn, whatever its end: the repair pass closes any call left
                // unanswered.
                conversation.after(finished);
                break;
            };
            let (returned, decisions) = ask_decisions(editor, &pending).await?;
            editor = returned;
            match conversation.decided(run_id, finished, decisions).await {
                Ok(Some(next)) => turn = next,
                Ok(None) => break,
                Err(error) => {
                    // The run keeps waiting (POST /v1/runs/{run_id}/approvals can decide it).
                    eprintln!("agentry: {error:#}");
                    break;
                }
            }
        }
    }
    if let Some(path) = &history {
        let _ = editor.save_history(path);
    }
    if let Conversation::Agent { app, .. } = conversation {
        app.close().await;
    }
    Ok(ExitCode::SUCCESS)
}

/// Reads one line off the async worker threads; `None` on Ctrl-C or Ctrl-D.
async fn read_line(
    mut editor: rustyline::DefaultEditor,
    prompt: String,
) -> anyhow::Result<(rustyline::DefaultEditor, Option<String>)> {
    let (editor, line) = tokio::task::spawn_blocking(move || {
        let line = editor.readline(&prompt);
        (editor, line)
    })
    .await?;
    match line {
        Ok(line) => Ok((editor, Some(line))),
        Err(ReadlineError::Interrupted | ReadlineError::Eof) => Ok((editor, None)),
        Err(error) => Err(error.into()),
    }
}

/// Asks about each waiting call: `y` approves, `n` rejects with a reason, `e` edits the
/// arguments. Ctrl-C or Ctrl-D rejects.
async fn ask_decisions(
    mut editor: rustyline::DefaultEditor,
    pending: &[PendingApproval],
) -> anyhow::Result<(rustyline::DefaultEditor, Vec<ApprovalDecision>)> {
    let mut decisions = Vec::with_capacity(pending.len());
    for waiting in pending {
        eprintln!(
            "{}({}) needs approval: {}",
            waiting.call.name, waiting.call.arguments, waiting.reason
        );
        let decision = loop {
            let (returned, answer) = read_line(editor, "approve? [y/n/e] ".into()).await?;
            editor = returned;
            let answer = answer.unwrap_or_else(|| "n".into());
            match answer.trim() {
                "y" | "yes" => {
                    break ApprovalDecision {
                        call_id: waiting.call.id.clone(),
                        decision: ApprovalVerdict::Approve,
                        reason: None,
                        arguments: None,
                    };
                }
                "n" | "no" => {
                    let (returned, reason) = read_line(editor, "reason: ".into()).await?;
                    editor = returned;
                    break ApprovalDecision {
                        call_id: waiting.call.id.clone(),
                        decision: ApprovalVerdict::Reject,
                        reason: reason.filter(|r| !r.trim().is_empty()),
                        arguments: None,
                    };
                }
                "e" | "edit" => {
                    let (returned, json) = read_line(editor, "arguments (JSON): ".into()).await?;
                    editor = returned;
                    match serde_json::from_str::<serde_json::Value>(json.as_deref().unwrap_or("")) {
                        Ok(arguments @ serde_json::Value::Object(_)) => {
                            break ApprovalDecision {
                                call_id: waiting.call.id.clone(),
                                decision: ApprovalVerdict::Edit,
                                reason: None,
                                arguments: Some(arguments),
                            };
                        }
                        _ => eprintln!("the arguments must be a JSON object"),
                    }
                }
                _ => eprintln!("answer y (approve), n (reject) or e (edit the arguments)"),
            }
        };
        decisions.push(decision);
    }
    Ok((editor, decisions))
}

/// An MCP server's request for input in `event`, a sub-agent's (nested) included.
fn elicitation_in(event: &RunEvent) -> Option<&RunEvent> {
    match event {
        RunEvent::ElicitationRequested { .. } => Some(event),
        RunEvent::Nested { event, .. } => elicitation_in(event),
        _ => None,
    }
}

/// Asks the person for what an MCP server requests, and answers it: `y` fills the form in (or
/// says the page was visited), `n` declines, `c` cancels. Ctrl-C or Ctrl-D declines.
async fn answer_elicitation(
    mut editor: rustyline::DefaultEditor,
    elicitations: &Elicitations,
    asked: &RunEvent,
) -> anyhow::Result<rustyline::DefaultEditor> {
    let RunEvent::ElicitationRequested {
        elicitation_id,
        server,
        message,
        requested_schema,
        url,
        ..
    } = asked
    else {
        return Ok(editor);
    };
    let Some(run_id) = elicitations.run_of(elicitation_id) else {
        return Ok(editor);
    };
    eprintln!("\n{server} asks: {message}");
    if let Some(url) = url {
        eprintln!("  open {url}");
    }
    loop {
        let prompt = if url.is_some() {
            "done? [y = visited / n = decline / c = cancel] "
        } else {
            "answer? [y/n/c] "
        };
        let (returned, choice) = read_line(editor, prompt.into()).await?;
        editor = returned;
        let answer = match choice.as_deref().map(str::trim) {
            Some("y" | "yes") => match requested_schema {
                Some(schema) => {
                    let (returned, content) = fill_form(editor, schema).await?;
                    editor = returned;
                    match content {
                        Some(content) => ElicitationAnswer::Accept(content),
                        None => ElicitationAnswer::Decline,
                    }
                }
                None => ElicitationAnswer::Accept(serde_json::Value::Null),
            },
            Some("c" | "cancel") => ElicitationAnswer::Cancel,
            Some("n" | "no") | None => ElicitationAnswer::Decline,
            Some(_) => {
                eprintln!("answer y, n or c");
                continue;
            }
        };
        match elicitations.answer(run_id, elicitation_id, answer).await {
            Ok(()) => return Ok(editor),
            Err(agentry_app::elicitation::ElicitationError::Invalid(why)) => {
                eprintln!("{why}");
            }
            // Answered elsewhere, or the call ended.
            Err(error) => {
                eprintln!("{error}");
                return Ok(editor);
            }
        }
    }
}

/// Reads each field of a form (a flat object schema); `None` when the person stops (Ctrl-C).
async fn fill_form(
    mut editor: rustyline::DefaultEditor,
    schema: &serde_json::Value,
) -> anyhow::Result<(rustyline::DefaultEditor, Option<serde_json::Value>)> {
    use serde_json::Value;
    let required: Vec<&str> = schema["required"]
        .as_array()
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut content = serde_json::Map::new();
    let Some(properties) = schema["properties"].as_object() else {
        return Ok((editor, Some(Value::Object(content))));
    };
    for (name, field) in properties {
        let kind = field["type"].as_str().unwrap_or("string");
        let choices = field_choices(field);
        let mut label = field["title"].as_str().unwrap_or(name).to_owned();
        if let Some(description) = field["description"].as_str() {
            label = format!("{label} ({description})");
        }
        if !choices.is_empty() {
            label = format!("{label} [{}]", choices.join(", "));
        }
        if let Some(default) = field.get("default") {
            label = format!("{label} (default {default})");
        }
        let required = required.contains(&name.as_str());
        loop {
            let mark = if required { "*" } else { "" };
            let (returned, line) = read_line(editor, format!("  {label}{mark}: ")).await?;
            editor = returned;
            let Some(line) = line else {
                return Ok((editor, None));
            };
            let line = line.trim();
            if line.is_empty() {
                if let Some(default) = field.get("default") {
                    content.insert(name.clone(), default.clone());
                    break;
                }
                if required {
                    eprintln!("  {name} is required");
                    continue;
                }
                break;
            }
            let value = match kind {
                "boolean" => match line {
                    "y" | "yes" | "true" => Some(Value::Bool(true)),
                    "n" | "no" | "false" => Some(Value::Bool(false)),
                    _ => None,
                },
                "integer" => line.parse::<i64>().ok().map(Value::from),
                "number" => line.parse::<f64>().ok().map(Value::from),
                "array" => Some(Value::Array(
                    line.split(',')
                        .map(|item| Value::String(item.trim().to_owned()))
                        .filter(|item| item.as_str().is_some_and(|s| !s.is_empty()))
                        .collect(),
                )),
                _ => Some(Value::String(line.to_owned())),
            };
            match value {
                Some(value) => {
                    content.insert(name.clone(), value);
                    break;
                }
                None => eprintln!("  that is not a valid {kind}"),
            }
        }
    }
    Ok((editor, Some(serde_json::Value::Object(content))))
}

/// The values a field may take, when it lists them (`enum`, `oneOf`/`anyOf` of `const`s, for
/// itself or its items).
fn field_choices(field: &serde_json::Value) -> Vec<String> {
    let of = |schema: &serde_json::Value| -> Vec<String> {
        if let Some(values) = schema["enum"].as_array() {
            return values
                .iter()
                .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
                .collect();
        }
        ["oneOf", "anyOf"]
            .iter()
            .filter_map(|key| schema[*key].as_array())
            .flatten()
            .filter_map(|choice| choice["const"].as_str().map(str::to_owned))
            .collect()
    };
    let own = of(field);
    if own.is_empty() {
        of(&field["items"])
    } else {
        own
    }
}

fn history_file(data: &DataArgs) -> Option<PathBuf> {
    let home = data.home().ok()?;
    std::fs::create_dir_all(&home).ok()?;
    Some(home.join("chat_history"))
}
