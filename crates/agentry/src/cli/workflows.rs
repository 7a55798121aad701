//! `agentry workflows list|show|add|rm|run|runs|status`: workflows on the data folder's store.
//! `add` and `run` take a definition file in JSON or YAML; `run` saves it (a new version when
//! it changed), starts a run in this process and prints each step as it changes, asking on the
//! terminal when an approval or a signal is waited for. A run this command leaves unfinished
//! (Ctrl-C) is resumed by `agentry serve` at its next start.

use std::collections::BTreeMap;
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{Map, Value};

use agentry_app::App;
use agentry_app::auth::Principal;
use agentry_app::workflows::{StepState, WorkflowDefinition, WorkflowRun, WorkflowState};

use super::app_error;
use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct WorkflowsArgs {
    #[command(subcommand)]
    command: WorkflowsCommand,
}

#[derive(Debug, Subcommand)]
enum WorkflowsCommand {
    /// List the saved workflows.
    List,
    /// Print a workflow's definition (JSON).
    Show {
        /// Its id.
        id: String,
    },
    /// Save a workflow from a JSON or YAML file (a new version when one of its id exists).
    Add {
        /// The definition file.
        file: PathBuf,
    },
    /// Delete a workflow (its runs stay).
    Rm {
        /// Its id.
        id: String,
    },
    /// Run a workflow — a saved one by id, or a definition file (saved first) — and follow it.
    Run {
        /// A workflow id, or a JSON or YAML definition file.
        workflow: String,
        /// An input value, `KEY=VALUE` (the value is read as JSON when it parses, else as text;
        /// repeatable).
        #[arg(long = "input", short = 'i', value_name = "KEY=VALUE")]
        inputs: Vec<String>,
        /// The whole input as a JSON object.
        #[arg(long, conflicts_with = "inputs")]
        input_json: Option<String>,
        /// Approve every approval step without asking (for scripts).
        #[arg(long)]
        yes: bool,
    },
    /// The runs of a workflow (or of every workflow), newest first.
    Runs {
        /// Only this workflow's.
        id: Option<String>,
    },
    /// A run's state and steps (JSON).
    Status {
        /// The run's id.
        run: String,
    },
}

/// A definition from a file: YAML (`.yaml`, `.yml`) or JSON.
fn read_definition(path: &Path) -> anyhow::Result<WorkflowDefinition> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let yaml = matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("yaml" | "yml")
    );
    if yaml {
        serde_norway::from_str(&text)
            .with_context(|| format!("{} is not a valid workflow (YAML)", path.display()))
    } else {
        serde_json::from_str(&text)
            .with_context(|| format!("{} is not a valid workflow (JSON)", path.display()))
    }
}

/// The input from `KEY=VALUE` pairs or one JSON object.
pub(crate) fn input(inputs: &[String], json: Option<&str>) -> anyhow::Result<Value> {
    if let Some(json) = json {
        let value: Value = serde_json::from_str(json).context("--input-json is not JSON")?;
        anyhow::ensure!(value.is_object(), "--input-json must be a JSON object");
        return Ok(value);
    }
    let mut object = Map::new();
    for pair in inputs {
        let (key, value) = pair
            .split_once('=')
            .with_context(|| format!("--input {pair:?}: expected KEY=VALUE"))?;
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::String(value.to_owned()));
        object.insert(key.to_owned(), value);
    }
    Ok(Value::Object(object))
}

/// Saves `definition`: created, or replaced when it differs from the saved one.
async fn save(app: &App, definition: WorkflowDefinition) -> anyhow::Result<WorkflowDefinition> {
    match app.workflows().get(&definition.id).await {
        Ok(saved) => {
            let mut same = definition.clone();
            same.version = saved.version;
            if same == saved {
                return Ok(saved);
            }
            app.workflows()
                .replace(&saved.id, definition)
                .await
                .map_err(app_error)
        }
        Err(_) => app.workflows().create(definition).await.map_err(app_error),
    }
}

fn state_name<T: serde::Serialize>(state: T) -> String {
    serde_json::to_value(state)
        .ok()
        .and_then(|value| value.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn mark(state: StepState) -> &'static str {
    match state {
        StepState::Pending => "·",
        StepState::Running => "▶",
        StepState::Waiting => "⏸",
        StepState::Succeeded => "✓",
        StepState::Failed => "✗",
        StepState::Skipped => "↷",
        StepState::Cancelled => "⊘",
    }
}

/// One line for a step that changed.
fn step_line(id: &str, step: &agentry_app::workflows::StepRun) -> String {
    let mut line = format!("{} {id}  {}", mark(step.state), state_name(step.state));
    if step.attempts > 1 {
        line.push_str(&format!(" (attempt {})", step.attempts));
    }
    if let (Some(start), Some(end)) = (step.started_at, step.finished_at) {
        line.push_str(&format!(
            "  {:.1} s",
            end.saturating_sub(start) as f64 / 1000.0
        ));
    }
    if let Some(error) = &step.error {
        line.push_str(&format!("  {error}"));
    }
    line
}

/// Asks on the terminal; `None` when there is no terminal to ask on.
fn ask(question: &str) -> Option<String> {
    if !std::io::stdin().is_terminal() {
        return None;
    }
    eprint!("{question} ");
    std::io::stderr().flush().ok();
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer).ok()?;
    Some(answer.trim().to_owned())
}

/// Exit code when the run waits for a person and nobody can be asked here.
const WAITS: u8 = 3;

/// Follows a run until it ends, printing each step as it changes and asking for what it waits
/// for (approvals are taken as given with `yes`). Exit code 0 when it succeeded, 1 when it did
/// not, 3 when it waits for a person and there is no terminal to ask on.
async fn follow(app: &App, run_id: &str, yes: bool) -> anyhow::Result<ExitCode> {
    let operator = Principal::operator();
    let started = Instant::now();
    let mut seen: BTreeMap<String, (StepState, u32)> = BTreeMap::new();
    let mut asked: BTreeMap<String, bool> = BTreeMap::new();
    loop {
        let run: WorkflowRun = app
            .workflows()
            .run(&operator, run_id)
            .await
            .map_err(app_error)?;
        // In the definition's order.
        let order: Vec<&String> = run.definition.steps.iter().map(|step| &step.id).collect();
        for (id, step) in order
            .into_iter()
            .filter_map(|id| run.steps.get(id).map(|step| (id, step)))
        {
            let now = (step.state, step.attempts);
            if seen.get(id) != Some(&now) {
                seen.insert(id.clone(), now);
                if step.state != StepState::Pending || step.attempts > 0 {
                    eprintln!("{}", step_line(id, step));
                }
            }
            if step.state != StepState::Waiting || asked.contains_key(id) {
                continue;
            }
            let kind = run
                .definition
                .steps
                .iter()
                .find(|s| &s.id == id)
                .map(|s| s.kind.clone())
                .unwrap_or_default();
            match kind.as_str() {
                "approval" => {
                    asked.insert(id.clone(), true);
                    let message = step.message.clone().unwrap_or_default();
                    if yes {
                        eprintln!("{message}\napproved ({id}, --yes)");
                        app.workflows()
                            .decide_step(
                                &operator,
                                run_id,
                                id,
                                true,
                                Some("approved with --yes".into()),
                            )
                            .await
                            .map_err(app_error)?;
                        continue;
                    }
                    match ask(&format!("{message}\napprove {id}? [y/N]")) {
                        Some(answer) => {
                            let approved = matches!(answer.as_str(), "y" | "Y" | "yes");
                            let comment = if approved {
                                None
                            } else {
                                ask("why (optional):").filter(|c| !c.is_empty())
                            };
                            app.workflows()
                                .decide_step(&operator, run_id, id, approved, comment)
                                .await
                                .map_err(app_error)?;
                        }
                        None => {
                            eprintln!(
                                "{id} waits for a person, and there is no terminal to ask on: the \
                                 run stays waiting; `agentry serve` on this data folder resumes it \
                                 (POST /v1/workflow-runs/{run_id}/approve), or run this on a \
                                 terminal, or with --yes"
                            );
                            return Ok(ExitCode::from(WAITS));
                        }
                    }
                }
                "signal" => {
                    asked.insert(id.clone(), true);
                    let name = run
                        .definition
                        .steps
                        .iter()
                        .find(|s| &s.id == id)
                        .and_then(|s| s.fields.get("name"))
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned();
                    let Some(payload) = ask(&format!(
                        "{id} waits for the signal {name:?}; its payload (JSON, empty for null):"
                    )) else {
                        eprintln!(
                            "{id} waits for the signal {name:?}, and there is no terminal to ask \
                             on: the run stays waiting; `agentry serve` on this data folder \
                             resumes it (POST /v1/workflow-runs/{run_id}/signal)"
                        );
                        return Ok(ExitCode::from(WAITS));
                    };
                    {
                        let payload = if payload.is_empty() {
                            Value::Null
                        } else {
                            serde_json::from_str(&payload).unwrap_or(Value::String(payload))
                        };
                        app.workflows()
                            .signal(&operator, run_id, &name, payload)
                            .await
                            .map_err(app_error)?;
                    }
                }
                _ => {}
            }
        }
        if run.state.is_final() {
            eprintln!(
                "run {run_id} {} in {:.1} s",
                state_name(run.state),
                started.elapsed().as_secs_f64()
            );
            if let Some(error) = &run.error {
                eprintln!("{error}");
            }
            if let Some(output) = &run.output {
                println!("{}", serde_json::to_string_pretty(output)?);
            }
            return Ok(if run.state == WorkflowState::Succeeded {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            });
        }
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
}

pub(crate) async fn workflows(args: WorkflowsArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    let app = App::new(store).await.map_err(app_error)?;
    match args.command {
        WorkflowsCommand::List => {
            for workflow in app.workflows().list().await.map_err(app_error)?.workflows {
                println!(
                    "{}\tv{}\t{} steps\t{}",
                    workflow.id,
                    workflow.version,
                    workflow.steps.len(),
                    workflow.description.unwrap_or_default()
                );
            }
        }
        WorkflowsCommand::Show { id } => {
            let workflow = app.workflows().get(&id).await.map_err(app_error)?;
            println!("{}", serde_json::to_string_pretty(&workflow)?);
        }
        WorkflowsCommand::Add { file } => {
            let saved = save(&app, read_definition(&file)?).await?;
            println!("{} v{}", saved.id, saved.version);
        }
        WorkflowsCommand::Rm { id } => app.workflows().delete(&id).await.map_err(app_error)?,
        WorkflowsCommand::Run {
            workflow,
            inputs,
            input_json,
            yes,
        } => {
            let input = input(&inputs, input_json.as_deref())?;
            let path = Path::new(&workflow);
            let id = if path.is_file() {
                let saved = save(&app, read_definition(path)?).await?;
                eprintln!("workflow {} v{}", saved.id, saved.version);
                saved.id
            } else {
                workflow
            };
            // Agent steps are background runs: this process works the queue while it follows.
            let worker = app.start_worker();
            let run = app
                .workflows()
                .start(&Principal::operator(), &id, input)
                .await
                .map_err(app_error)?;
            eprintln!("run {}", run.run_id);
            let code = follow(&app, &run.run_id, yes).await;
            app.shut_down();
            worker.abort();
            return code;
        }
        WorkflowsCommand::Runs { id } => {
            for run in app
                .workflows()
                .runs(&Principal::operator(), id.as_deref())
                .await
                .map_err(app_error)?
                .runs
            {
                println!(
                    "{}\t{} v{}\t{}\t{} s ago",
                    run.run_id,
                    run.workflow_id,
                    run.version,
                    state_name(run.state),
                    agentry_app::clock::now_ms().saturating_sub(run.created_at) / 1000
                );
            }
        }
        WorkflowsCommand::Status { run } => {
            let run = app
                .workflows()
                .run(&Principal::operator(), &run)
                .await
                .map_err(app_error)?;
            println!("{}", serde_json::to_string_pretty(&run)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}
