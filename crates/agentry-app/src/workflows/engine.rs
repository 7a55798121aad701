//! The driver of one workflow run: starts ready steps, records each transition in the run's
//! document, retries failures by policy, wakes timers, takes decisions, signals and a cancel
//! from its inbox, and ends the run (see the module docs of [`super`]).

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::task::JoinSet;

use agentry_core::tool::ResultFormat;

use super::definition::{
    AgentStep, FailureHandlers, MAX_MAP_ITEMS, StepErrorKind, StepKind, ToolStep, environment,
    evaluate, render, truthy,
};
use super::{Decision, Message, StepRun, StepState, WorkflowEvent, WorkflowRun, WorkflowState};
use crate::App;
use crate::auth::Principal;
use crate::clock::now_ms;
use crate::config::ConfigRepo;

/// What one attempt of a step gave.
struct Attempt {
    step: String,
    result: Result<Value, StepError>,
    sessions: Vec<String>,
}

/// Why an attempt failed: its kind (what a retry policy's `on` names) and what happened.
#[derive(Debug, Clone, PartialEq)]
struct StepError {
    kind: StepErrorKind,
    message: String,
}

impl StepError {
    fn new(kind: StepErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A failed template or expression (or one that gave the wrong kind of value).
    fn expression(message: impl Into<String>) -> Self {
        Self::new(StepErrorKind::Expression, message)
    }

    fn internal(message: impl Into<String>) -> Self {
        Self::new(StepErrorKind::Internal, message)
    }

    /// The same failure, said to be within `place` (a map item, a loop iteration, a branch).
    fn within(self, place: impl std::fmt::Display) -> Self {
        Self {
            kind: self.kind,
            message: format!("{place}: {}", self.message),
        }
    }
}

/// Starts the driver of `run_id` unless one runs in this process.
pub(super) fn spawn(app: App, run_id: String) {
    let Some(inbox) = app.workflows.register(&run_id) else {
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
            app.workflows.unregister(&run_id);
        },
        span,
    ));
}

/// What templates and expressions see of a step: its `output`, `state` and `error`.
fn view(step: &StepRun) -> Value {
    json!({
        "output": step.output.clone().unwrap_or(Value::Null),
        "state": step.state,
        "error": step.error,
        "error_kind": step.error_kind,
    })
}

/// What templates and expressions see: `input`, and each step's view.
fn context(run: &WorkflowRun) -> Value {
    let steps: Map<String, Value> = run
        .steps
        .iter()
        .map(|(id, step)| (id.clone(), view(step)))
        .collect();
    json!({"input": run.input, "steps": steps, "workflow": {"run_id": run.run_id, "id": run.workflow_id}})
}

/// The context with the steps changed since the last call brought up to date: shared with the
/// steps that run (copied only when one still holds the previous one), so starting a step
/// costs what changed, not the whole run.
fn refreshed(run: &mut WorkflowRun, scope: &mut Arc<Value>) -> Arc<Value> {
    for id in std::mem::take(&mut run.stale) {
        if let Some(step) = run.steps.get(&id) {
            Arc::make_mut(scope)["steps"][id.as_str()] = view(step);
        }
    }
    Arc::clone(scope)
}

/// The run-level fields whose change makes the driver write the whole document (rare: the
/// run starts waiting, is signalled, ends); step transitions are events.
#[derive(Debug, Clone, PartialEq)]
struct Header {
    state: WorkflowState,
    output: Option<Value>,
    error: Option<String>,
    signals: std::collections::BTreeMap<String, Vec<Value>>,
    finished_at: Option<u64>,
}

impl Header {
    fn of(run: &WorkflowRun) -> Self {
        Self {
            state: run.state,
            output: run.output.clone(),
            error: run.error.clone(),
            signals: run.signals.clone(),
            finished_at: run.finished_at,
        }
    }
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
    let run_changed = header != book.header || run.state.is_final();
    let mut events = std::mem::take(&mut run.dirty)
        .into_iter()
        .filter_map(|step| {
            let state = run.steps.get(&step)?.clone();
            serde_json::to_value(WorkflowEvent::Step {
                step,
                run: state,
                at,
            })
            .ok()
        })
        .collect::<Vec<_>>();
    if run_changed {
        let event = WorkflowEvent::Run {
            state: run.state,
            output: run.output.clone(),
            error: run.error.clone(),
            finished_at: run.finished_at,
            at,
        };
        events.push(serde_json::to_value(event).map_err(|error| error.to_string())?);
    }
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
        app.store
            .append_workflow_events_and_snapshot(&run.run_id, first, &events, snapshot.as_ref())
            .await
            .map_err(|error| error.to_string())?;
        book.next_seq = run.seq + 1;
        if run_changed {
            book.header = header;
        }
    }
    app.workflows.changed(&run.run_id);
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
        .stored_workflow_run(run_id)
        .await
        .map_err(|error| error.message)?
    else {
        return Err("its document is gone".into());
    };
    let mut book = Book {
        header: Header::of(&run),
        next_seq: run.seq + 1,
    };
    let env = environment();
    let handlers = run.definition.failure_handlers();
    let mut shared_scope = Arc::new(context(&run));
    let mut tasks: JoinSet<Attempt> = JoinSet::new();
    // Steps a crash left running start again (an agent step re-attaches to its run).
    for (id, step) in run.steps.iter_mut() {
        if step.state == StepState::Running {
            step.state = StepState::Pending;
            step.attempts = step.attempts.saturating_sub(1);
            run.dirty.insert(id.clone());
            run.stale.insert(id.clone());
        }
    }
    loop {
        if run.state.is_final() {
            return Ok(());
        }
        // Start (or settle) every step whose dependencies are done.
        let mut changed = false;
        let now = now_ms();
        for index in 0..run.definition.steps.len() {
            // Only a pending step whose time has come goes further (checked before any copy:
            // this runs at every turn of the loop, over every step).
            let due = run
                .steps
                .get(&run.definition.steps[index].id)
                .is_some_and(|step| {
                    step.state == StepState::Pending && step.wake_at.is_none_or(|at| at <= now)
                });
            if !due {
                continue;
            }
            let definition = run.definition.steps[index].clone();
            let id = definition.id.clone();
            let needs = run.definition.needs_of(index);
            if !needs.iter().all(|need| done(&run, &handlers, need)) {
                continue;
            }
            if not_taken(&run, &handlers, &id, &needs) {
                skip(step_mut(&mut run, &id), now, true);
                changed = true;
                continue;
            }
            let scope = refreshed(&mut run, &mut shared_scope);
            let kind = match definition.step_kind(index) {
                Ok(kind) => kind,
                Err(error) => {
                    fail_step(&mut run, &id, StepError::internal(error.message));
                    changed = true;
                    continue;
                }
            };
            if let Some(when) = &definition.when {
                match truthy(&env, when, &scope) {
                    Ok(true) => {}
                    Ok(false) => {
                        // A switch that does not run takes none of its ways.
                        let switch = matches!(kind, StepKind::Switch { .. });
                        skip(step_mut(&mut run, &id), now, switch);
                        changed = true;
                        continue;
                    }
                    Err(error) => {
                        fail_step(
                            &mut run,
                            &id,
                            StepError::expression(format!("`when`: {error}")),
                        );
                        changed = true;
                        continue;
                    }
                }
            }
            changed = true;
            let attempt = {
                let step = step_mut(&mut run, &id);
                step.attempts += 1;
                step.started_at = Some(now);
                step.wake_at = None;
                step.error = None;
                step.error_kind = None;
                step.attempts
            };
            match kind {
                StepKind::Approval {
                    message,
                    timeout_secs,
                    ..
                } => {
                    let message = match render(&env, &Value::String(message), &scope) {
                        Ok(Value::String(text)) => text,
                        Ok(other) => other.to_string(),
                        Err(error) => {
                            fail_step(
                                &mut run,
                                &id,
                                StepError::expression(format!("`message`: {error}")),
                            );
                            continue;
                        }
                    };
                    let step = step_mut(&mut run, &id);
                    step.state = StepState::Waiting;
                    step.message = Some(message);
                    step.wake_at = timeout_secs.map(|secs| now + secs * 1000);
                }
                StepKind::Switch { cases, default } => {
                    let ways: Vec<String> = cases
                        .iter()
                        .map(|case| case.then.clone())
                        .chain(default.clone())
                        .collect();
                    let chosen = cases.iter().enumerate().find_map(|(n, case)| {
                        match truthy(&env, &case.when, &scope) {
                            Ok(false) => None,
                            Ok(true) => Some(Ok((json!(n), Some(case.then.clone())))),
                            Err(error) => Some(Err(StepError::expression(format!(
                                "`cases[{n}].when`: {error}"
                            )))),
                        }
                    });
                    let (case, next) = match chosen {
                        Some(Ok(chosen)) => chosen,
                        Some(Err(error)) => {
                            fail_step(&mut run, &id, error);
                            continue;
                        }
                        None => match default {
                            Some(target) => (json!("default"), Some(target)),
                            None => (Value::Null, None),
                        },
                    };
                    for way in ways {
                        let pending = run
                            .steps
                            .get(&way)
                            .is_some_and(|step| step.state == StepState::Pending);
                        if pending && Some(&way) != next.as_ref() {
                            skip(step_mut(&mut run, &way), now, true);
                        }
                    }
                    succeed(step_mut(&mut run, &id), json!({"case": case, "next": next}));
                }
                StepKind::Wait { seconds } => {
                    let step = step_mut(&mut run, &id);
                    step.state = StepState::Waiting;
                    step.wake_at = Some(now + seconds * 1000);
                }
                StepKind::Signal { name } => {
                    let queued = run
                        .signals
                        .get_mut(&name)
                        .and_then(|queue| (!queue.is_empty()).then(|| queue.remove(0)));
                    let step = step_mut(&mut run, &id);
                    match queued {
                        Some(payload) => succeed(step, payload),
                        None => step.state = StepState::Waiting,
                    }
                }
                kind => {
                    step_mut(&mut run, &id).state = StepState::Running;
                    let timeout = definition.timeout_secs.map(Duration::from_secs);
                    let step_id = id.clone();
                    let job = Job {
                        app: app.clone(),
                        run_id: run.run_id.clone(),
                        step: id.clone(),
                        attempt,
                        depth: run.depth,
                        scope,
                    };
                    let span = step_span(&run.workflow_id, &run.run_id, &id, &kind, attempt);
                    let traced = span.clone();
                    tasks.spawn(tracing::Instrument::instrument(
                        async move {
                            let work = job.run(kind);
                            let attempt = match timeout {
                                Some(limit) => match tokio::time::timeout(limit, work).await {
                                    Ok(attempt) => attempt,
                                    Err(_) => Attempt {
                                        step: step_id,
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
            }
        }
        // A failed step fails the workflow: the rest is cancelled.
        if let Some((id, error)) = run
            .steps
            .iter()
            .find(|(id, step)| step.state == StepState::Failed && handlers.handler_of(id).is_none())
            .map(|(id, step)| (id.clone(), step.error.clone().unwrap_or_default()))
        {
            tasks.abort_all();
            finish(&mut run, WorkflowState::Failed);
            run.error = Some(format!("step {id:?} failed: {error}"));
            return save(app, &mut run, &mut book).await;
        }
        let running = run
            .steps
            .values()
            .any(|step| step.state == StepState::Running);
        let waiting = run
            .steps
            .values()
            .any(|step| step.state == StepState::Waiting);
        let pending = run
            .steps
            .values()
            .any(|step| step.state == StepState::Pending);
        if !running && !waiting && !pending {
            let output = match &run.definition.output {
                Some(template) => render(&env, template, &context(&run)),
                None => Ok(last_output(&run)),
            };
            match output {
                Ok(output) => {
                    run.output = Some(output);
                    finish(&mut run, WorkflowState::Succeeded);
                }
                Err(error) => {
                    run.error = Some(format!("output: {error}"));
                    finish(&mut run, WorkflowState::Failed);
                }
            }
            return save(app, &mut run, &mut book).await;
        }
        run.state = if running || (pending && !waiting) {
            WorkflowState::Running
        } else {
            WorkflowState::Waiting
        };
        if changed {
            save(app, &mut run, &mut book).await?;
        }
        // Sleep until a step ends, a message arrives, or the next wake-up time.
        let next_wake = run
            .steps
            .values()
            .filter(|step| matches!(step.state, StepState::Waiting | StepState::Pending))
            .filter_map(|step| step.wake_at)
            .min();
        let sleep = next_wake.map(|at| Duration::from_millis(at.saturating_sub(now_ms())));
        tokio::select! {
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                let Ok(done) = done else { continue };
                record(&mut run, done);
                save(app, &mut run, &mut book).await?;
            }
            message = inbox.recv() => {
                let Some(message) = message else { return Ok(()) };
                if take(app, &mut run, message, &mut tasks).await {
                    return save(app, &mut run, &mut book).await;
                }
                save(app, &mut run, &mut book).await?;
            }
            _ = tokio::time::sleep(sleep.unwrap_or(Duration::from_secs(3600))), if sleep.is_some() => {
                wake(&mut run);
                save(app, &mut run, &mut book).await?;
            }
            _ = app.shutdown.cancelled() => return Ok(()),
        }
    }
}

/// The step `id`, marked changed (the next save records it).
fn step_mut<'a>(run: &'a mut WorkflowRun, id: &str) -> &'a mut StepRun {
    if !run.dirty.contains(id) {
        run.dirty.insert(id.to_owned());
    }
    if !run.stale.contains(id) {
        run.stale.insert(id.to_owned());
    }
    run.steps
        .entry(id.to_owned())
        .or_insert_with(StepRun::pending)
}

fn succeed(step: &mut StepRun, output: Value) {
    step.state = StepState::Succeeded;
    step.output = Some(output);
    step.finished_at = Some(now_ms());
    step.wake_at = None;
}

/// Skips a step: its `when` was false, or (`not_taken`) a switch chose another way, or every
/// step it needs was not taken.
fn skip(step: &mut StepRun, now: u64, not_taken: bool) {
    step.state = StepState::Skipped;
    step.not_taken = not_taken;
    step.finished_at = Some(now);
}

/// Whether a step others need is done for them: it succeeded, was skipped, or failed into its
/// handler's hands.
fn done(run: &WorkflowRun, handlers: &FailureHandlers, need: &str) -> bool {
    run.steps.get(need).is_some_and(|step| match step.state {
        StepState::Succeeded | StepState::Skipped => true,
        StepState::Failed => handlers.handler_of(need).is_some(),
        _ => false,
    })
}

/// Whether step `id`, its `needs` done, is not taken: it handles a failure that did not happen,
/// or every step it needs was not taken (a switch's other way, a failure another step handles).
/// A join that needs one step that ran, runs.
fn not_taken(run: &WorkflowRun, handlers: &FailureHandlers, id: &str, needs: &[String]) -> bool {
    let state_of = |step: &str| run.steps.get(step);
    if let Some(failing) = handlers.handled_by(id) {
        return state_of(failing).is_some_and(|step| step.state != StepState::Failed);
    }
    !needs.is_empty()
        && needs.iter().all(|need| {
            state_of(need).is_some_and(|step| match step.state {
                StepState::Skipped => step.not_taken,
                // Handled by another step (this one is not its handler: see above).
                StepState::Failed => handlers.handler_of(need).is_some(),
                _ => false,
            })
        })
}

fn fail_step(run: &mut WorkflowRun, id: &str, error: StepError) {
    let step = step_mut(run, id);
    step.state = StepState::Failed;
    step.error = Some(error.message);
    step.error_kind = Some(error.kind);
    step.finished_at = Some(now_ms());
}

/// Ends the run: the steps not ended are cancelled (each recorded as a step event, so a reader
/// that applies the events before the final snapshot is written sees them ended too).
fn finish(run: &mut WorkflowRun, state: WorkflowState) {
    let now = now_ms();
    for (id, step) in run.steps.iter_mut() {
        if !step.state.is_final() {
            step.state = StepState::Cancelled;
            step.finished_at = Some(now);
            run.dirty.insert(id.clone());
        }
    }
    run.state = state;
    run.finished_at = Some(now);
}

/// The output of the workflow's one end step, or every end step's output by id.
fn last_output(run: &WorkflowRun) -> Value {
    let ends = run.definition.ends();
    let outputs: Map<String, Value> = ends
        .iter()
        .map(|id| {
            (
                id.clone(),
                run.steps
                    .get(id)
                    .and_then(|step| step.output.clone())
                    .unwrap_or(Value::Null),
            )
        })
        .collect();
    match outputs.len() {
        1 => outputs
            .into_iter()
            .next()
            .map(|(_, v)| v)
            .unwrap_or(Value::Null),
        _ => Value::Object(outputs),
    }
}

/// Records an attempt's end: success, a retry (after its backoff), or a failure.
fn record(run: &mut WorkflowRun, done: Attempt) {
    let policy = run
        .definition
        .steps
        .iter()
        .find(|step| step.id == done.step)
        .and_then(|step| step.retry.clone());
    let step = step_mut(run, &done.step);
    step.sessions.extend(done.sessions);
    match done.result {
        Ok(output) => succeed(step, output),
        Err(error) => {
            // Tried again while attempts remain, if the policy retries this kind of failure.
            let retried = policy.as_ref().is_some_and(|policy| {
                step.attempts < policy.attempts
                    && policy
                        .on
                        .as_ref()
                        .is_none_or(|kinds| kinds.contains(&error.kind))
            });
            step.error = Some(error.message);
            step.error_kind = Some(error.kind);
            if retried {
                let backoff = policy.map_or(1.0, |policy| policy.backoff_secs)
                    * 2f64.powi(step.attempts.saturating_sub(1) as i32);
                step.state = StepState::Pending;
                step.wake_at = Some(now_ms() + (backoff * 1000.0) as u64);
            } else {
                step.state = StepState::Failed;
                step.finished_at = Some(now_ms());
            }
        }
    }
}

/// Timers that are due: a `wait` ends, an approval's timeout decides, a retry becomes ready.
fn wake(run: &mut WorkflowRun) {
    let now = now_ms();
    let approve_on_timeout: Vec<(String, bool)> = run
        .definition
        .steps
        .iter()
        .enumerate()
        .filter_map(|(index, step)| match step.step_kind(index) {
            Ok(StepKind::Approval {
                approve_on_timeout, ..
            }) => Some((step.id.clone(), approve_on_timeout)),
            _ => None,
        })
        .collect();
    let kinds: Vec<(String, String)> = run
        .definition
        .steps
        .iter()
        .map(|step| (step.id.clone(), step.kind.clone()))
        .collect();
    for (id, kind) in kinds {
        let due = run.steps.get(&id).is_some_and(|step| {
            step.state == StepState::Waiting && step.wake_at.is_some_and(|at| at <= now)
        });
        if !due {
            continue;
        }
        let step = step_mut(run, &id);
        match kind.as_str() {
            "wait" => succeed(step, json!({"waited_until": now})),
            "approval" => {
                let approve = approve_on_timeout
                    .iter()
                    .any(|(step, approve)| step == &id && *approve);
                decide(step, approve, None, true);
            }
            _ => {}
        }
    }
}

fn decide(step: &mut StepRun, approved: bool, comment: Option<String>, timed_out: bool) {
    let decision = Decision {
        approved,
        comment,
        at: now_ms(),
        timed_out,
    };
    if approved {
        let output = json!({"approved": true, "comment": decision.comment});
        step.decision = Some(decision);
        succeed(step, output);
    } else {
        step.state = StepState::Failed;
        step.error_kind = Some(StepErrorKind::Rejected);
        step.error = Some(match (&decision.comment, timed_out) {
            (_, true) => "no decision before the timeout".to_owned(),
            (Some(comment), false) => format!("rejected: {comment}"),
            (None, false) => "rejected".to_owned(),
        });
        step.decision = Some(decision);
        step.finished_at = Some(now_ms());
    }
}

/// Takes a message; `true` when it ended the run (a cancel).
async fn take(
    app: &App,
    run: &mut WorkflowRun,
    message: Message,
    tasks: &mut JoinSet<Attempt>,
) -> bool {
    match message {
        Message::Decide {
            step,
            approved,
            comment,
        } => {
            let step = step_mut(run, &step);
            if step.state == StepState::Waiting {
                decide(step, approved, comment, false);
            }
            false
        }
        Message::Signal { name, payload } => {
            let waiting = run
                .definition
                .steps
                .iter()
                .enumerate()
                .find(|(index, step)| {
                    run.steps.get(&step.id).map(|s| s.state) == Some(StepState::Waiting)
                        && matches!(step.step_kind(*index), Ok(StepKind::Signal { name: ref n }) if *n == name)
                })
                .map(|(_, step)| step.id.clone());
            match waiting {
                Some(id) => succeed(step_mut(run, &id), payload),
                None => run.signals.entry(name).or_default().push(payload),
            }
            false
        }
        Message::Cancel => {
            tasks.abort_all();
            // Agent steps' runs are stopped too.
            for run_id in running_runs(app, run).await {
                if let Err(error) = app.cancel_background(run_id).await {
                    tracing::warn!("cannot cancel a workflow step's run: {}", error.message);
                }
            }
            // Sub-workflows started by this run are cancelled too.
            if let Ok(children) = ConfigRepo::<WorkflowRun>::new(&app.store).list().await {
                for (_, child) in children {
                    if child.parent.as_deref() == Some(run.run_id.as_str())
                        && !child.state.is_final()
                    {
                        app.workflows.send(&child.run_id, Message::Cancel);
                    }
                }
            }
            finish(run, WorkflowState::Cancelled);
            true
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
        if let Ok(runs) = app.store.list_runs(&query).await {
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
                    if truthy(&env, until, &scope)
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
                let list = match evaluate(&env, items, scope)
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
            .call_tool(&tool.tool, arguments, ResultFormat::Text)
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
                .agent_turn(
                    agent,
                    json!({"text": prompt, "session_id": "new"}),
                    key,
                    sessions,
                )
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
            .agent_turn(
                agent,
                json!({"text": prompt, "session_id": "new"}),
                key.clone(),
                sessions,
            )
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
                    json!({"text": ask, "session_id": session}),
                    format!("{key}:repair{repairs}"),
                    sessions,
                )
                .await?;
        }
    }

    /// One turn of an agent step as a background run (`body`'s `text` in its `session_id`)
    /// under the idempotency key `key`, followed to its end: its session and answer.
    async fn agent_turn(
        &self,
        agent: &AgentStep,
        mut body: Value,
        key: String,
        sessions: &mut Vec<String>,
    ) -> Result<(String, String), StepError> {
        let failed = |message: String| StepError::new(StepErrorKind::Agent, message);
        body["agent_id"] = Value::String(agent.agent.clone());
        let body: crate::submission::InferRequest =
            serde_json::from_value(body).map_err(|error| StepError::internal(error.to_string()))?;
        let (view, _) = self
            .app
            .submit_background(&Principal::operator(), body, Some(key), 0)
            .await
            .map_err(|error| failed(error.message))?;
        let session = view.session_id.to_string();
        if !sessions.contains(&session) {
            sessions.push(session.clone());
        }
        let view = loop {
            let view = self
                .app
                .wait_for_run(view.run_id, Duration::from_secs(30))
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
        Ok((session, text))
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
        let exists = ConfigRepo::<WorkflowRun>::new(&self.app.store)
            .get(&child)
            .await
            .map_err(|error| StepError::internal(error.message))?
            .is_some();
        if !exists {
            self.app
                .start_workflow_run(
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
                .workflow_run(&operator, &child)
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
