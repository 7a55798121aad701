//! The driver of one workflow run: the IO loop around its [`Machine`] (see the module docs of
//! [`super`]). It hands the machine what happens — the run taken up, an attempt's end, a
//! message from its inbox, a timer — and carries out what the machine answers: runs attempts
//! (tools, agents as background runs, fan-outs, sub-workflows), records each transition as an
//! event, aborts and cancels.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::task::JoinSet;

use agentry_core::tool::ResultFormat;

use super::definition::{
    AgentStep, MAX_MAP_ITEMS, StepErrorKind, StepKind, ToolStep, environment, render,
};
use super::machine::{
    Attempt, Command, Event, Header, Machine, Start, StepError, changes, next_wake,
};
use super::{Message, WorkflowRun, WorkflowState};
use crate::App;
use crate::auth::Principal;
use crate::clock::now_ms;
use crate::config::ConfigRepo;
use crate::ops::Enqueue;
use crate::run_spec::{RunSpec, SessionChoice};
use agentry_types::SessionId;

/// Starts the driver of `run_id` unless one runs in this process.
pub(super) fn spawn(app: App, run_id: String) {
    let Some(inbox) = app.parts.workflows.register(&run_id) else {
        return;
    };
    // One trace per run's driving (under the request that started it, if any): its steps'
    // spans below it.
    let span = tracing::info_span!(
        target: agentry_core::telemetry::TARGET,
        "invoke_workflow",
        agentry.workflow.run_id = run_id.as_str(),
    );
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            if let Err(error) = drive(&app, &run_id, inbox).await {
                tracing::error!(run = %run_id, "a workflow run's driver stopped: {error}");
            }
            app.parts.workflows.unregister(&run_id);
        },
        span,
    ));
}

/// What the driver has recorded of its run.
struct Book {
    /// The run-level fields as last written.
    header: Header,
    /// The number the next step event gets.
    next_seq: u64,
}

/// Records what changed since the last call: each changed step as an event, and a change of
/// the run itself as one more, appended in one transaction; when the run itself changed, the
/// whole document is written again as a snapshot naming the last event it includes. Another
/// driver having appended first (a second process on the same run) stops this one.
async fn save(app: &App, run: &mut WorkflowRun, book: &mut Book) -> Result<(), String> {
    run.updated_at = now_ms();
    let at = run.updated_at;
    let header = Header::of(run);
    let (events, run_changed) = changes(run, &book.header, at);
    let events = events
        .iter()
        .map(serde_json::to_value)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| error.to_string())?;
    if !events.is_empty() {
        let first = book.next_seq;
        // The document names the last event it holds.
        run.seq = first + events.len() as u64 - 1;
        // The document, when the run itself changed, commits with the events: a driver whose
        // events are refused (another took the run over) writes no document either, and stops.
        let snapshot = if run_changed {
            Some(serde_json::to_value(&*run).map_err(|error| error.to_string())?)
        } else {
            None
        };
        app.parts
            .store
            .append_workflow_events_and_snapshot(&run.run_id, first, &events, snapshot.as_ref())
            .await
            .map_err(|error| error.to_string())?;
        book.next_seq = run.seq + 1;
        if run_changed {
            book.header = header;
        }
    }
    app.parts.workflows.changed(&run.run_id);
    if run.state.is_final() {
        // Once per run, event and URL, whoever saves the end (the outbox keeps the first).
        app.tell_workflow_webhook(run).await;
    }
    Ok(())
}

async fn drive(
    app: &App,
    run_id: &str,
    mut inbox: tokio::sync::mpsc::UnboundedReceiver<Message>,
) -> Result<(), String> {
    let Some(mut run) = app
        .workflows()
        .stored_run(run_id)
        .await
        .map_err(|error| error.message)?
    else {
        return Err("its document is gone".into());
    };
    let mut book = Book {
        header: Header::of(&run),
        next_seq: run.seq + 1,
    };
    let mut machine = Machine::new(&run);
    let mut tasks: JoinSet<Attempt> = JoinSet::new();
    let mut event = Event::Resumed;
    loop {
        for command in machine.handle(&mut run, event, now_ms()) {
            match command {
                Command::Start(start) => start_attempt(app, &run, start, &mut tasks),
                Command::Save => save(app, &mut run, &mut book).await?,
                Command::AbortAttempts => tasks.abort_all(),
                Command::CancelStepWork => cancel_step_work(app, &run).await,
                Command::Stop => return Ok(()),
            }
        }
        // Sleep until a step ends, a message arrives, or the next wake-up time.
        let sleep = next_wake(&run).map(|at| Duration::from_millis(at.saturating_sub(now_ms())));
        event = tokio::select! {
            Some(done) = tasks.join_next(), if !tasks.is_empty() => match done {
                Ok(done) => Event::Attempt(done),
                // An attempt's task that panicked: look again.
                Err(_) => Event::Tick,
            },
            message = inbox.recv() => match message {
                Some(message) => Event::Message(message),
                None => return Ok(()),
            },
            _ = tokio::time::sleep(sleep.unwrap_or(Duration::from_secs(3600))), if sleep.is_some() => {
                Event::Tick
            }
            _ = app.parts.shutdown.cancelled() => return Ok(()),
        };
    }
}

/// Runs an attempt the machine started, in a task of its own under the step's span, within
/// its timeout.
fn start_attempt(app: &App, run: &WorkflowRun, start: Start, tasks: &mut JoinSet<Attempt>) {
    let Start {
        step,
        attempt,
        kind,
        scope,
        timeout,
    } = start;
    let span = step_span(&run.workflow_id, &run.run_id, &step, &kind, attempt);
    let traced = span.clone();
    let job = Job {
        app: app.clone(),
        run_id: run.run_id.clone(),
        owner: run.owner.clone(),
        step: step.clone(),
        attempt,
        depth: run.depth,
        scope,
    };
    tasks.spawn(tracing::Instrument::instrument(
        async move {
            let work = job.run(kind);
            let attempt = match timeout {
                Some(limit) => match tokio::time::timeout(limit, work).await {
                    Ok(attempt) => attempt,
                    Err(_) => Attempt {
                        step,
                        result: Err(StepError::new(
                            StepErrorKind::Timeout,
                            format!("timed out after {}s", limit.as_secs()),
                        )),
                        sessions: Vec::new(),
                    },
                },
                None => work.await,
            };
            if let Err(error) = &attempt.result {
                traced.record("otel.status_code", "error");
                traced.record("otel.status_description", error.message.as_str());
            }
            attempt
        },
        span,
    ));
}

/// Stops the work a cancelled run's steps started elsewhere: its agent steps' runs and its
/// sub-workflows.
async fn cancel_step_work(app: &App, run: &WorkflowRun) {
    for run_id in running_runs(app, run).await {
        if let Err(error) = app.background_runs().cancel(run_id).await {
            tracing::warn!("cannot cancel a workflow step's run: {}", error.message);
        }
    }
    if let Ok(children) = ConfigRepo::<WorkflowRun>::new(&app.parts.store)
        .list()
        .await
    {
        for (_, child) in children {
            if child.parent.as_deref() == Some(run.run_id.as_str()) && !child.state.is_final() {
                app.parts.workflows.send(&child.run_id, Message::Cancel);
            }
        }
    }
}

/// The background runs of the steps running now (found by their idempotency keys' prefix).
async fn running_runs(app: &App, run: &WorkflowRun) -> Vec<agentry_types::RunId> {
    let prefix = format!("workflow:{}:", run.run_id);
    let mut ids = Vec::new();
    for state in [
        agentry_store::RunState::Running,
        agentry_store::RunState::Queued,
        agentry_store::RunState::Waiting,
    ] {
        let query = agentry_store::RunQuery {
            state: Some(state),
            background: Some(true),
            limit: 1000,
            ..agentry_store::RunQuery::default()
        };
        if let Ok(runs) = app.parts.store.list_runs(&query).await {
            ids.extend(
                runs.into_iter()
                    .filter(|record| {
                        record
                            .idempotency_key
                            .as_deref()
                            .is_some_and(|key| key.contains(&prefix))
                    })
                    .map(|record| record.id),
            );
        }
    }
    ids
}

/// The span of one attempt of a step (`workflow_step <step>`), in the trace export's target.
fn step_span(
    workflow: &str,
    run: &str,
    step: &str,
    kind: &StepKind,
    attempt: u32,
) -> tracing::Span {
    let kind = match kind {
        StepKind::Tool(_) => "tool",
        StepKind::Agent(_) => "agent",
        StepKind::Map { .. } => "map",
        StepKind::Workflow { .. } => "workflow",
        StepKind::Loop { .. } => "loop",
        StepKind::Parallel { .. } => "parallel",
        StepKind::Switch { .. } => "switch",
        StepKind::Approval { .. } => "approval",
        StepKind::Wait { .. } => "wait",
        StepKind::Signal { .. } => "signal",
    };
    tracing::info_span!(
        target: agentry_core::telemetry::TARGET,
        "workflow_step",
        otel.name = %format!("workflow_step {step}"),
        otel.status_code = tracing::field::Empty,
        otel.status_description = tracing::field::Empty,
        agentry.workflow.id = workflow,
        agentry.workflow.run_id = run,
        agentry.workflow.step = step,
        agentry.workflow.step_kind = kind,
        agentry.workflow.attempt = i64::from(attempt),
    )
}

/// One attempt of a running step.
struct Job {
    app: App,
    run_id: String,
    /// The key that started the run: its agent steps run as that key is when they run.
    owner: Option<String>,
    step: String,
    attempt: u32,
    /// How deep the run is (its sub-workflows are one deeper).
    depth: u32,
    scope: Arc<Value>,
}

impl Job {
    async fn run(&self, kind: StepKind) -> Attempt {
        let mut sessions = Vec::new();
        let result = self.kind(&kind, &self.scope, "", &mut sessions).await;
        Attempt {
            step: self.step.clone(),
            result,
            sessions,
        }
    }

    /// Runs one kind; `slot` names the map item or loop iteration it runs for (`""`, `"3"`,
    /// `"3.1"`…), which keys its background run or sub-workflow.
    async fn kind(
        &self,
        kind: &StepKind,
        scope: &Value,
        slot: &str,
        sessions: &mut Vec<String>,
    ) -> Result<Value, StepError> {
        let nested = |index: usize| {
            if slot.is_empty() {
                index.to_string()
            } else {
                format!("{slot}.{index}")
            }
        };
        match kind {
            StepKind::Tool(tool) => self.tool(tool, scope).await,
            StepKind::Agent(agent) => self.agent(agent, scope, slot, sessions).await,
            StepKind::Workflow { workflow, input } => {
                self.workflow(workflow, input, scope, slot).await
            }
            StepKind::Loop { max, until, step } => {
                let env = environment();
                let mut last = Value::Null;
                for iteration in 0..*max as usize {
                    let mut scope = scope.clone();
                    scope["iteration"] = json!(iteration);
                    scope["last"] = last.clone();
                    let mut iteration_sessions = Vec::new();
                    last = Box::pin(self.kind(
                        step,
                        &scope,
                        &nested(iteration),
                        &mut iteration_sessions,
                    ))
                    .await
                    .map_err(|error| error.within(format!("iteration {iteration}")))?;
                    sessions.extend(iteration_sessions);
                    scope["last"] = last.clone();
                    if env
                        .truthy(until, &scope)
                        .map_err(|error| StepError::expression(format!("`until`: {error}")))?
                    {
                        return Ok(last);
                    }
                }
                Err(StepError::new(
                    StepErrorKind::LoopExhausted,
                    format!("`until` was not true after {max} iterations"),
                ))
            }
            StepKind::Map {
                items,
                concurrency,
                step,
            } => {
                let env = environment();
                let list = match env
                    .evaluate(items, scope)
                    .map_err(|error| StepError::expression(format!("`items`: {error}")))?
                {
                    Value::Array(list) => list,
                    other => {
                        return Err(StepError::expression(format!(
                            "`items` gave {}, not a list",
                            kind_name(&other)
                        )));
                    }
                };
                if list.len() > MAX_MAP_ITEMS {
                    return Err(StepError::expression(format!(
                        "`items` has {} items; at most {MAX_MAP_ITEMS}",
                        list.len()
                    )));
                }
                let results: Vec<(Result<Value, StepError>, Vec<String>)> =
                    futures::stream::iter(list.into_iter().enumerate())
                        .map(|(index, value)| {
                            let mut scope = scope.clone();
                            scope["item"] = value;
                            scope["index"] = json!(index);
                            async move {
                                let mut sessions = Vec::new();
                                let result = Box::pin(self.kind(
                                    step,
                                    &scope,
                                    &nested(index),
                                    &mut sessions,
                                ))
                                .await;
                                (result, sessions)
                            }
                        })
                        .buffered(*concurrency)
                        .collect()
                        .await;
                let mut outputs = Vec::with_capacity(results.len());
                for (index, (result, item_sessions)) in results.into_iter().enumerate() {
                    sessions.extend(item_sessions);
                    outputs.push(result.map_err(|error| error.within(format!("item {index}")))?);
                }
                Ok(Value::Array(outputs))
            }
            StepKind::Parallel {
                branches,
                concurrency,
            } => {
                let results: Vec<(Result<Value, StepError>, Vec<String>)> =
                    futures::stream::iter(0..branches.len())
                        .map(|index| {
                            let branch = &branches[index].1;
                            let slot = nested(index);
                            async move {
                                let mut sessions = Vec::new();
                                let result =
                                    Box::pin(self.kind(branch, scope, &slot, &mut sessions)).await;
                                (result, sessions)
                            }
                        })
                        .buffered(*concurrency)
                        .collect()
                        .await;
                let mut outputs = Map::with_capacity(results.len());
                for ((name, _), (result, branch_sessions)) in branches.iter().zip(results) {
                    sessions.extend(branch_sessions);
                    outputs.insert(
                        name.clone(),
                        result.map_err(|error| error.within(format!("branch {name}")))?,
                    );
                }
                Ok(Value::Object(outputs))
            }
            StepKind::Switch { .. } => Err(StepError::internal("a switch is decided, not run")),
            StepKind::Approval { .. } | StepKind::Wait { .. } | StepKind::Signal { .. } => Err(
                StepError::internal("this kind of step waits; it is not run"),
            ),
        }
    }

    async fn tool(&self, tool: &ToolStep, scope: &Value) -> Result<Value, StepError> {
        let env = environment();
        let arguments = render(&env, &tool.arguments, scope)
            .map_err(|e| StepError::expression(format!("`arguments`: {e}")))?;
        if !arguments.is_object() {
            return Err(StepError::expression("`arguments` must give an object"));
        }
        let result = self
            .app
            .tools()
            .call(&tool.tool, arguments, ResultFormat::Text)
            .await
            .map_err(|error| StepError::new(StepErrorKind::Tool, error.message))?;
        // A result that is JSON is kept as JSON, so later steps can reach into it.
        Ok(match &result {
            Value::String(text) => serde_json::from_str(text.trim()).unwrap_or(result),
            _ => result,
        })
    }

    async fn agent(
        &self,
        agent: &AgentStep,
        scope: &Value,
        slot: &str,
        sessions: &mut Vec<String>,
    ) -> Result<Value, StepError> {
        let env = environment();
        let prompt = match render(&env, &Value::String(agent.prompt.clone()), scope)
            .map_err(|e| StepError::expression(format!("`prompt`: {e}")))?
        {
            Value::String(text) => text,
            other => other.to_string(),
        };
        let key = match slot {
            "" => format!("workflow:{}:{}:{}", self.run_id, self.step, self.attempt),
            slot => format!(
                "workflow:{}:{}:{}:{slot}",
                self.run_id, self.step, self.attempt
            ),
        };
        let Some(schema) = &agent.output_schema else {
            let (_, text) = self
                .agent_turn(agent, prompt, SessionChoice::New, key, sessions)
                .await?;
            return Ok(Value::String(text));
        };
        let validator = jsonschema::validator_for(schema)
            .map_err(|error| StepError::internal(error.to_string()))?;
        let schema_text =
            serde_json::to_string_pretty(schema).map_err(|e| StepError::internal(e.to_string()))?;
        let prompt = format!(
            "{prompt}\n\nAnswer with only a JSON value, no other text, that matches this JSON \
             Schema:\n```json\n{schema_text}\n```"
        );
        let (session, mut text) = self
            .agent_turn(agent, prompt, SessionChoice::New, key.clone(), sessions)
            .await?;
        // A wrong answer goes back to the agent, in its session, with what is wrong.
        let mut repairs = 0;
        loop {
            let problem = match parse_json_answer(&text) {
                None => format!("it is not JSON: {text:.200}"),
                Some(parsed) => {
                    let wrong = validator.iter_errors(&parsed).next().map(|error| {
                        format!(
                            "it does not match the schema at {:?}: {error}",
                            error.instance_path().to_string()
                        )
                    });
                    match wrong {
                        None => return Ok(parsed),
                        Some(problem) => problem,
                    }
                }
            };
            if repairs >= agent.repair_attempts {
                return Err(StepError::new(
                    StepErrorKind::InvalidOutput,
                    format!(
                        "agent {:?}: the answer cannot be used ({} repair{} asked): {problem}",
                        agent.agent,
                        repairs,
                        if repairs == 1 { "" } else { "s" }
                    ),
                ));
            }
            repairs += 1;
            let ask = format!(
                "Your answer cannot be used: {problem}. Answer again with only the JSON value \
                 that matches the schema."
            );
            (_, text) = self
                .agent_turn(
                    agent,
                    ask,
                    SessionChoice::Existing(session),
                    format!("{key}:repair{repairs}"),
                    sessions,
                )
                .await?;
        }
    }

    /// One turn of an agent step as a background run (`text`, in `session`) under the
    /// idempotency key `key`, followed to its end: its session and answer.
    async fn agent_turn(
        &self,
        agent: &AgentStep,
        text: String,
        session: SessionChoice,
        key: String,
        sessions: &mut Vec<String>,
    ) -> Result<(SessionId, String), StepError> {
        let failed = |message: String| StepError::new(StepErrorKind::Agent, message);
        let spec = RunSpec {
            agent_id: Some(agent.agent.clone()),
            input: Some(agentry_core::Input::Text { text }),
            session,
            ..RunSpec::default()
        };
        let caller = self
            .app
            .principal_of_owner(self.owner.as_deref())
            .await
            .map_err(|error| failed(error.message))?;
        let enqueue = Enqueue {
            caller,
            spec,
            idempotency_key: Some(key),
            priority: 0,
        };
        let (view, _) = Box::pin(self.app.submit(enqueue))
            .await
            .map_err(|error| failed(error.message))?;
        let run_session = view.session_id;
        let session = run_session.to_string();
        if !sessions.contains(&session) {
            sessions.push(session.clone());
        }
        let view = loop {
            let view = self
                .app
                .background_runs()
                .wait(view.run_id, Duration::from_secs(30))
                .await
                .map_err(|error| failed(error.message))?;
            if view.state.is_final() {
                break view;
            }
        };
        let outcome = view.outcome.unwrap_or(Value::Null);
        if view.state != agentry_store::RunState::Succeeded {
            let error = outcome
                .pointer("/error/message")
                .and_then(Value::as_str)
                .or_else(|| outcome.get("stop_reason").and_then(Value::as_str))
                .unwrap_or("the agent's run did not succeed");
            return Err(failed(format!("agent {:?}: {error}", agent.agent)));
        }
        let text = outcome
            .get("text")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        Ok((run_session, text))
    }
}

impl Job {
    /// A sub-workflow: started once under an id derived from this step's attempt and slot (so
    /// a resumed parent finds it again), then followed until it ends.
    async fn workflow(
        &self,
        workflow: &str,
        input: &Value,
        scope: &Value,
        slot: &str,
    ) -> Result<Value, StepError> {
        let failed = |message: String| StepError::new(StepErrorKind::Workflow, message);
        let env = environment();
        let input = render(&env, input, scope)
            .map_err(|e| StepError::expression(format!("`input`: {e}")))?;
        let child = child_id(&self.run_id, &self.step, self.attempt, slot);
        let operator = Principal::operator();
        let exists = ConfigRepo::<WorkflowRun>::new(&self.app.parts.store)
            .get(&child)
            .await
            .map_err(|error| StepError::internal(error.message))?
            .is_some();
        if !exists {
            self.app
                .workflows()
                .start_run(
                    &operator,
                    workflow,
                    input,
                    Some((self.run_id.clone(), self.depth + 1)),
                    Some(child.clone()),
                )
                .await
                .map_err(|error| failed(format!("workflow {workflow:?}: {}", error.message)))?;
        } else {
            // After a restart: make sure the child goes on too.
            spawn(self.app.clone(), child.clone());
        }
        loop {
            let run = self
                .app
                .workflows()
                .run(&operator, &child)
                .await
                .map_err(|error| StepError::internal(error.message))?;
            match run.state {
                WorkflowState::Succeeded => return Ok(run.output.unwrap_or(Value::Null)),
                WorkflowState::Failed | WorkflowState::Cancelled => {
                    return Err(failed(format!(
                        "workflow {workflow:?} (run {child}) {}: {}",
                        if run.state == WorkflowState::Failed {
                            "failed"
                        } else {
                            "was cancelled"
                        },
                        run.error.unwrap_or_default()
                    )));
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }
}

/// The id of the sub-workflow run a step's attempt (and slot) starts.
fn child_id(run: &str, step: &str, attempt: u32, slot: &str) -> String {
    super::derived_run_id(&[run, step, &attempt.to_string(), slot])
}

/// JSON in an answer: the whole text, or the first fenced code block.
fn parse_json_answer(text: &str) -> Option<Value> {
    let trimmed = text.trim();
    if let Ok(value) = serde_json::from_str(trimmed) {
        return Some(value);
    }
    let start = trimmed.find("```")?;
    let rest = &trimmed[start + 3..];
    let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
    let end = rest.find("```")?;
    serde_json::from_str(rest[..end].trim()).ok()
}

fn kind_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
