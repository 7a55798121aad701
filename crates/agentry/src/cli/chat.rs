//! `agentry chat`: an interactive conversation in the terminal, saved as a session.
//!
//! Line editing and history come from rustyline (history kept in the data folder's
//! `chat_history`). Ctrl-C during a turn cancels that turn and returns to the prompt; Ctrl-C at
//! the prompt clears the line; Ctrl-D or `/exit` quits. `--session ID` continues a session.
//! When a turn's tool calls wait for approval (an agent's `approvals` policy), chat asks for
//! each inline: `y` approves, `n` rejects (with a reason the model reads), `e` edits the
//! arguments (JSON), and the run goes on. When an MCP server asks for input during a tool call
//! (elicitation), chat asks for it inline too: each field of a form, or a page to visit.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use futures::StreamExt;
use rustyline::error::ReadlineError;

use agentry_core::approval::ApprovalDecision;
use agentry_core::session::{BusyPolicy, SessionManager};
use agentry_core::{RunStream, Runtime};
use agentry_types::{
    ApprovalVerdict, Message, PendingApproval, RunEvent, RunId, SessionId, SuspendStatus,
};

use agentry_app::ToolEnvironment;
use agentry_app::agents::AgentRun;
use agentry_app::elicitation::Elicitations;
use agentry_mcp::ElicitationAnswer;
use agentry_store::Store;

use super::data::DataArgs;
use super::output::Printer;
use super::profile::Profile;
use super::sessions::{open_session, session_with_manager};

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
        agent: Option<&(Store, AgentRun)>,
    ) -> anyhow::Result<RunStream> {
        let request = match agent {
            Some((store, run)) => super::agents::request(store, run, text).await?,
            None => profile.request(text),
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

    /// Continues a run whose calls waited, with these decisions.
    async fn decided(
        &mut self,
        run_id: RunId,
        mut state: agentry_core::RunState,
        decisions: Vec<ApprovalDecision>,
    ) -> anyhow::Result<Option<RunStream>> {
        match self {
            Self::Session(manager, session) => {
                Ok(manager.decide(*session, run_id, decisions).await?.stream)
            }
            Self::Ephemeral(runtime, _) => {
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
                Ok(Some(runtime.resume(state)?))
            }
        }
    }

    fn after(&mut self, messages: Vec<Message>) {
        if let Self::Ephemeral(_, history) = self {
            *history = messages;
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
            let (manager, run) = super::agents::session_manager(
                &store,
                &agent,
                args.profile.sandbox,
                &args.profile.network,
                data,
                Some(&elicitations),
            )
            .await?;
            let (session, profile) =
                open_session(&store, args.session, args.profile, "chat", None).await?;
            agent_run = Some((store, run));
            eprintln!("session: {session}");
            (Conversation::Session(manager, session), profile)
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
        let mut stream = conversation
            .turn(text, &profile, agent_run.as_ref())
            .await?;
        loop {
            let cancel = stream.cancel_token();
            let mut printer = Printer::new(false);
            let mut waiting = None;
            loop {
                tokio::select! {
                    event = stream.next() => match event {
                        Some(event) => {
                            printer.event(&event)?;
                            if let Some(asked) = elicitation_in(&event) {
                                editor = answer_elicitation(editor, &elicitations, asked).await?;
                            }
                            if let RunEvent::RunSuspended { run_id, status: SuspendStatus::Waiting, pending, .. } = &event {
                                waiting = Some((*run_id, pending.clone()));
                            }
                        }
                        None => break,
                    },
                    _ = tokio::signal::ctrl_c() => {
                        cancel.cancel();
                        eprintln!("\n(cancelled)");
                    }
                }
            }
            let output = stream.finish().await?;
            let Some((run_id, pending)) = waiting else {
                // Keep the turn, whatever its end: the repair pass closes any call left
                // unanswered.
                conversation.after(output.state.messages);
                break;
            };
            let (returned, decisions) = ask_decisions(editor, &pending).await?;
            editor = returned;
            match conversation.decided(run_id, output.state, decisions).await {
                Ok(Some(next)) => stream = next,
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
