//! The workflow engine's decisions as a pure state machine — event in, commands out — as the
//! run engine's are. Given a run's document and one thing that happened (the driver took the
//! run up, an attempt of a step ended, a message came, time passed), [`Machine::handle`]
//! changes the document and answers what the driver must do, in order: start attempts, save,
//! abort what runs, stop. It reads no clock (`now` is an input) and does no IO; the driver in
//! the engine module runs the attempts, writes the events, and sleeps until something happens
//! or [`next_wake`].

use std::sync::Arc;
use std::time::Duration;

use agentry_core::template::Expressions;
use serde_json::{Map, Value, json};

use super::definition::{FailureHandlers, StepErrorKind, StepKind, environment, render};
use super::{Decision, Message, StepRun, StepState, WorkflowEvent, WorkflowRun, WorkflowState};

/// What one attempt of a step gave.
#[derive(Debug)]
pub(super) struct Attempt {
    /// The step.
    pub(super) step: String,
    /// Its output, or why it failed.
    pub(super) result: Result<Value, StepError>,
    /// The sessions its agent runs used.
    pub(super) sessions: Vec<String>,
}

/// Why an attempt failed: its kind (what a retry policy's `on` names) and what happened.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct StepError {
    pub(super) kind: StepErrorKind,
    pub(super) message: String,
}

impl StepError {
    pub(super) fn new(kind: StepErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// A failed template or expression (or one that gave the wrong kind of value).
    pub(super) fn expression(message: impl Into<String>) -> Self {
        Self::new(StepErrorKind::Expression, message)
    }

    pub(super) fn internal(message: impl Into<String>) -> Self {
        Self::new(StepErrorKind::Internal, message)
    }

    /// The same failure, said to be within `place` (a map item, a loop iteration, a branch).
    pub(super) fn within(self, place: impl std::fmt::Display) -> Self {
        Self {
            kind: self.kind,
            message: format!("{place}: {}", self.message),
        }
    }
}

/// What happened to a run, as its driver tells the machine.
#[derive(Debug)]
pub(super) enum Event {
    /// The driver took the run up: it started, or resumes after a restart (steps a crash left
    /// running start again; an agent step re-attaches to its run).
    Resumed,
    /// An attempt of a step ended.
    Attempt(Attempt),
    /// A message came: a decision, a signal, a cancel.
    Message(Message),
    /// Time passed: the timers that are due fire (waits, approval timeouts, retries).
    Tick,
}

/// What the machine asks of its driver, in order.
#[derive(Debug)]
pub(super) enum Command {
    /// Run an attempt of a step (a tool, an agent, a fan-out, a sub-workflow); its end comes
    /// back as [`Event::Attempt`].
    Start(Start),
    /// Record what changed: each changed step as an event, and the run's document when the
    /// run itself changed.
    Save,
    /// Abort the attempts running now.
    AbortAttempts,
    /// Stop the work the steps started elsewhere (agent steps' runs, sub-workflows): the run
    /// was cancelled.
    CancelStepWork,
    /// The run ended (or had ended): stop driving it.
    Stop,
}

/// An attempt of a step, to run.
#[derive(Debug)]
pub(super) struct Start {
    /// The step.
    pub(super) step: String,
    /// Which attempt (1, 2, …).
    pub(super) attempt: u32,
    /// What it does.
    pub(super) kind: StepKind,
    /// What its templates see.
    pub(super) scope: Arc<Value>,
    /// How long it may take.
    pub(super) timeout: Option<Duration>,
}

/// The machine of one run: what it keeps between events (the template environment, the
/// failure handlers, and what templates see of the run, brought up to date as steps change).
pub(super) struct Machine {
    env: Expressions,
    handlers: FailureHandlers,
    scope: Arc<Value>,
}

impl Machine {
    /// The machine of `run`.
    pub(super) fn new(run: &WorkflowRun) -> Self {
        Self {
            env: environment(),
            handlers: run.definition.failure_handlers(),
            scope: Arc::new(context(run)),
        }
    }

    /// Takes `event`, which happened at `now` (Unix milliseconds): changes `run` and answers
    /// what the driver must do, in order. At most one `Save`, the first place one is asked for:
    /// `run` has taken every change before the driver carries out any command, so one save
    /// records them all (a second one recorded the run's end twice, and a reader between the
    /// two saw a document behind its events).
    pub(super) fn handle(&mut self, run: &mut WorkflowRun, event: Event, now: u64) -> Vec<Command> {
        let mut commands = self.take_event(run, event, now);
        let mut saved = false;
        commands.retain(|command| {
            !matches!(command, Command::Save) || !std::mem::replace(&mut saved, true)
        });
        commands
    }

    /// [`Machine::handle`], before its saves are made one.
    fn take_event(&mut self, run: &mut WorkflowRun, event: Event, now: u64) -> Vec<Command> {
        let mut commands = Vec::new();
        match event {
            Event::Resumed => {
                for (id, step) in run.steps.iter_mut() {
                    if step.state == StepState::Running {
                        step.state = StepState::Pending;
                        step.attempts = step.attempts.saturating_sub(1);
                        run.dirty.insert(id.clone());
                        run.stale.insert(id.clone());
                    }
                }
            }
            Event::Attempt(done) => {
                record(run, done, now);
                commands.push(Command::Save);
            }
            Event::Message(Message::Cancel) => {
                finish(run, WorkflowState::Cancelled, now);
                commands.extend([
                    Command::AbortAttempts,
                    Command::CancelStepWork,
                    Command::Save,
                    Command::Stop,
                ]);
                return commands;
            }
            Event::Message(message) => {
                take(run, message, now);
                commands.push(Command::Save);
            }
            Event::Tick => {
                wake(run, now);
                commands.push(Command::Save);
            }
        }
        if run.state.is_final() {
            commands.push(Command::Stop);
            return commands;
        }
        self.advance(run, now, &mut commands);
        commands
    }

    /// Starts (or settles) every step whose dependencies are done, then ends the run when a
    /// step failed unhandled or every step is done.
    fn advance(&mut self, run: &mut WorkflowRun, now: u64, commands: &mut Vec<Command>) {
        let mut changed = false;
        for index in 0..run.definition.steps.len() {
            // Only a pending step whose time has come goes further (checked before any copy:
            // this runs at every event, over every step).
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
            if !needs.iter().all(|need| done(run, &self.handlers, need)) {
                continue;
            }
            changed = true;
            if not_taken(run, &self.handlers, &id, &needs) {
                skip(step_mut(run, &id), now, true);
                continue;
            }
            let scope = refreshed(run, &mut self.scope);
            let kind = match definition.step_kind(index) {
                Ok(kind) => kind,
                Err(error) => {
                    fail_step(run, &id, StepError::internal(error.message), now);
                    continue;
                }
            };
            if let Some(when) = &definition.when {
                match self.env.truthy(when, &scope) {
                    Ok(true) => {}
                    Ok(false) => {
                        // A switch that does not run takes none of its ways.
                        let switch = matches!(kind, StepKind::Switch { .. });
                        skip(step_mut(run, &id), now, switch);
                        continue;
                    }
                    Err(error) => {
                        let error = StepError::expression(format!("`when`: {error}"));
                        fail_step(run, &id, error, now);
                        continue;
                    }
                }
            }
            let attempt = {
                let step = step_mut(run, &id);
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
                    let message = match render(&self.env, &Value::String(message), &scope) {
                        Ok(Value::String(text)) => text,
                        Ok(other) => other.to_string(),
                        Err(error) => {
                            let error = StepError::expression(format!("`message`: {error}"));
                            fail_step(run, &id, error, now);
                            continue;
                        }
                    };
                    let step = step_mut(run, &id);
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
                        match self.env.truthy(&case.when, &scope) {
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
                            fail_step(run, &id, error, now);
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
                            skip(step_mut(run, &way), now, true);
                        }
                    }
                    let output = json!({"case": case, "next": next});
                    succeed(step_mut(run, &id), output, now);
                }
                StepKind::Wait { seconds } => {
                    let step = step_mut(run, &id);
                    step.state = StepState::Waiting;
                    step.wake_at = Some(now + seconds * 1000);
                }
                StepKind::Signal { name } => {
                    let queued = run
                        .signals
                        .get_mut(&name)
                        .and_then(|queue| (!queue.is_empty()).then(|| queue.remove(0)));
                    let step = step_mut(run, &id);
                    match queued {
                        Some(payload) => succeed(step, payload, now),
                        None => step.state = StepState::Waiting,
                    }
                }
                kind => {
                    step_mut(run, &id).state = StepState::Running;
                    commands.push(Command::Start(Start {
                        step: id,
                        attempt,
                        kind,
                        scope,
                        timeout: definition.timeout_secs.map(Duration::from_secs),
                    }));
                }
            }
        }
        // A failed step fails the workflow: the rest is cancelled.
        if let Some((id, error)) = run
            .steps
            .iter()
            .find(|(id, step)| {
                step.state == StepState::Failed && self.handlers.handler_of(id).is_none()
            })
            .map(|(id, step)| (id.clone(), step.error.clone().unwrap_or_default()))
        {
            finish(run, WorkflowState::Failed, now);
            run.error = Some(format!("step {id:?} failed: {error}"));
            commands.extend([Command::AbortAttempts, Command::Save, Command::Stop]);
            return;
        }
        let any = |state: StepState| run.steps.values().any(|step| step.state == state);
        let (running, waiting, pending) = (
            any(StepState::Running),
            any(StepState::Waiting),
            any(StepState::Pending),
        );
        if !running && !waiting && !pending {
            let output = match &run.definition.output {
                Some(template) => render(&self.env, template, &context(run)),
                None => Ok(last_output(run)),
            };
            match output {
                Ok(output) => {
                    run.output = Some(output);
                    finish(run, WorkflowState::Succeeded, now);
                }
                Err(error) => {
                    run.error = Some(format!("output: {error}"));
                    finish(run, WorkflowState::Failed, now);
                }
            }
            commands.extend([Command::Save, Command::Stop]);
            return;
        }
        run.state = if running || (pending && !waiting) {
            WorkflowState::Running
        } else {
            WorkflowState::Waiting
        };
        if changed {
            commands.push(Command::Save);
        }
    }
}

/// When the next timer of `run` is due (a wait, an approval's timeout, a retry's backoff).
pub(super) fn next_wake(run: &WorkflowRun) -> Option<u64> {
    run.steps
        .values()
        .filter(|step| matches!(step.state, StepState::Waiting | StepState::Pending))
        .filter_map(|step| step.wake_at)
        .min()
}

/// The run-level fields whose change makes the driver write the whole document (rare: the
/// run starts waiting, is signalled, ends); step transitions are events.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Header {
    state: WorkflowState,
    output: Option<Value>,
    error: Option<String>,
    signals: std::collections::BTreeMap<String, Vec<Value>>,
    finished_at: Option<u64>,
}

impl Header {
    pub(super) fn of(run: &WorkflowRun) -> Self {
        Self {
            state: run.state,
            output: run.output.clone(),
            error: run.error.clone(),
            signals: run.signals.clone(),
            finished_at: run.finished_at,
        }
    }
}

/// What to record since `recorded` (the run-level fields as last written): each step changed
/// since the last call, as an event, then the run's own when it changed or ended; `true` when
/// the run itself changed (its document is then written again).
pub(super) fn changes(
    run: &mut WorkflowRun,
    recorded: &Header,
    at: u64,
) -> (Vec<WorkflowEvent>, bool) {
    let run_changed = Header::of(run) != *recorded || run.state.is_final();
    let mut events: Vec<WorkflowEvent> = std::mem::take(&mut run.dirty)
        .into_iter()
        .filter_map(|step| {
            let state = run.steps.get(&step)?.clone();
            Some(WorkflowEvent::Step {
                step,
                run: state,
                at,
            })
        })
        .collect();
    if run_changed {
        events.push(WorkflowEvent::Run {
            state: run.state,
            output: run.output.clone(),
            error: run.error.clone(),
            finished_at: run.finished_at,
            at,
        });
    }
    (events, run_changed)
}

/// Takes a decision or a signal (a cancel ends the run in [`Machine::handle`]).
fn take(run: &mut WorkflowRun, message: Message, now: u64) {
    match message {
        Message::Decide {
            step,
            approved,
            comment,
        } => {
            let step = step_mut(run, &step);
            if step.state == StepState::Waiting {
                decide(step, approved, comment, false, now);
            }
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
                Some(id) => succeed(step_mut(run, &id), payload, now),
                None => run.signals.entry(name).or_default().push(payload),
            }
        }
        Message::Cancel => {}
    }
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

fn succeed(step: &mut StepRun, output: Value, now: u64) {
    step.state = StepState::Succeeded;
    step.output = Some(output);
    step.finished_at = Some(now);
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

fn fail_step(run: &mut WorkflowRun, id: &str, error: StepError, now: u64) {
    let step = step_mut(run, id);
    step.state = StepState::Failed;
    step.error = Some(error.message);
    step.error_kind = Some(error.kind);
    step.finished_at = Some(now);
}

/// Ends the run: the steps not ended are cancelled (each recorded as a step event, so a reader
/// that applies the events before the final snapshot is written sees them ended too).
fn finish(run: &mut WorkflowRun, state: WorkflowState, now: u64) {
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
fn record(run: &mut WorkflowRun, done: Attempt, now: u64) {
    let policy = run
        .definition
        .steps
        .iter()
        .find(|step| step.id == done.step)
        .and_then(|step| step.retry.clone());
    let step = step_mut(run, &done.step);
    step.sessions.extend(done.sessions);
    match done.result {
        Ok(output) => succeed(step, output, now),
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
                step.wake_at = Some(now + (backoff * 1000.0) as u64);
            } else {
                step.state = StepState::Failed;
                step.finished_at = Some(now);
            }
        }
    }
}

/// Timers that are due: a `wait` ends, an approval's timeout decides, a retry becomes ready.
fn wake(run: &mut WorkflowRun, now: u64) {
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
            "wait" => succeed(step, json!({"waited_until": now}), now),
            "approval" => {
                let approve = approve_on_timeout
                    .iter()
                    .any(|(step, approve)| step == &id && *approve);
                decide(step, approve, None, true, now);
            }
            _ => {}
        }
    }
}

fn decide(step: &mut StepRun, approved: bool, comment: Option<String>, timed_out: bool, now: u64) {
    let decision = Decision {
        approved,
        comment,
        at: now,
        timed_out,
    };
    if approved {
        let output = json!({"approved": true, "comment": decision.comment});
        step.decision = Some(decision);
        succeed(step, output, now);
    } else {
        step.state = StepState::Failed;
        step.error_kind = Some(StepErrorKind::Rejected);
        step.error = Some(match (&decision.comment, timed_out) {
            (_, true) => "no decision before the timeout".to_owned(),
            (Some(comment), false) => format!("rejected: {comment}"),
            (None, false) => "rejected".to_owned(),
        });
        step.decision = Some(decision);
        step.finished_at = Some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workflows::WorkflowDefinition;

    /// A new run of `definition`, as it is stored when it starts.
    fn run_of(definition: Value, input: Value) -> WorkflowRun {
        let definition: WorkflowDefinition = serde_json::from_value(definition).unwrap();
        WorkflowRun::new("run-1".into(), definition, input, 0)
    }

    /// A machine driven as the engine drives it, with nothing run: the attempts it starts are
    /// kept, and each save records its events as the engine's does.
    struct Driven {
        machine: Machine,
        run: WorkflowRun,
        stored: WorkflowRun,
        recorded: Vec<WorkflowEvent>,
        header: Header,
        started: Vec<Start>,
    }

    impl Driven {
        fn new(definition: Value, input: Value) -> Self {
            let run = run_of(definition, input);
            Self {
                machine: Machine::new(&run),
                header: Header::of(&run),
                stored: run.clone(),
                run,
                recorded: Vec::new(),
                started: Vec::new(),
            }
        }

        /// Hands the machine `event` at `now`; answers the commands' names in order.
        fn handle(&mut self, event: Event, now: u64) -> Vec<&'static str> {
            let commands = self.machine.handle(&mut self.run, event, now);
            commands
                .into_iter()
                .map(|command| match command {
                    Command::Start(start) => {
                        self.started.push(start);
                        "start"
                    }
                    Command::Save => {
                        let (events, run_changed) = changes(&mut self.run, &self.header, now);
                        self.recorded.extend(events);
                        if run_changed {
                            self.header = Header::of(&self.run);
                        }
                        "save"
                    }
                    Command::AbortAttempts => "abort",
                    Command::CancelStepWork => "cancel",
                    Command::Stop => "stop",
                })
                .collect()
        }

        /// The last attempt started: its step and attempt number.
        fn last_start(&self) -> (&str, u32) {
            let start = self.started.last().expect("an attempt was started");
            (start.step.as_str(), start.attempt)
        }

        fn step(&self, id: &str) -> &StepRun {
            &self.run.steps[id]
        }

        /// The run rebuilt from its stored document and the events recorded since: what a
        /// reader, or a driver resumed after a crash, sees. It must be the run itself.
        fn assert_replays(&self) {
            let mut replayed = self.stored.clone();
            for (index, event) in self.recorded.iter().enumerate() {
                replayed
                    .apply(index as u64 + 1, serde_json::to_value(event).unwrap())
                    .unwrap();
            }
            assert_eq!(replayed.steps, self.run.steps);
            assert_eq!(replayed.state, self.run.state);
            assert_eq!(replayed.output, self.run.output);
            assert_eq!(replayed.error, self.run.error);
            assert_eq!(replayed.finished_at, self.run.finished_at);
        }
    }

    fn ok(step: &str, output: Value) -> Event {
        Event::Attempt(Attempt {
            step: step.into(),
            result: Ok(output),
            sessions: Vec::new(),
        })
    }

    fn failed(step: &str, kind: StepErrorKind) -> Event {
        Event::Attempt(Attempt {
            step: step.into(),
            result: Err(StepError::new(kind, "it broke")),
            sessions: Vec::new(),
        })
    }

    fn tool(id: &str) -> Value {
        json!({"id": id, "kind": "tool", "tool": "current_time"})
    }

    #[test]
    fn steps_run_after_what_they_need_and_the_last_ones_output_is_the_runs() {
        let mut driven = Driven::new(
            json!({"id": "w", "steps": [tool("a"), tool("b")]}),
            json!({}),
        );
        assert_eq!(driven.handle(Event::Resumed, 1_000), ["start", "save"]);
        assert_eq!(driven.last_start(), ("a", 1));
        assert_eq!(driven.step("b").state, StepState::Pending);
        assert_eq!(
            driven.handle(ok("a", json!({"x": 1})), 2_000),
            ["save", "start"]
        );
        assert_eq!(driven.last_start(), ("b", 1));
        // What b's templates see: a's output.
        let scope = &driven.started[1].scope;
        assert_eq!(scope["steps"]["a"]["output"], json!({"x": 1}));
        assert_eq!(
            driven.handle(ok("b", json!("done")), 3_000),
            ["save", "stop"]
        );
        assert_eq!(driven.run.state, WorkflowState::Succeeded);
        assert_eq!(driven.run.output, Some(json!("done")));
        assert_eq!(driven.run.finished_at, Some(3_000));
        assert_eq!(driven.step("a").finished_at, Some(2_000));
        // The run's end is recorded once.
        let ends = driven
            .recorded
            .iter()
            .filter(|event| matches!(event, WorkflowEvent::Run { state, .. } if state.is_final()))
            .count();
        assert_eq!(ends, 1, "{:?}", driven.recorded);
        driven.assert_replays();
    }

    #[test]
    fn a_failed_attempt_is_retried_after_its_backoff_until_its_attempts_run_out() {
        let mut step = tool("a");
        step["retry"] = json!({"attempts": 2, "backoff_secs": 1.0, "on": ["tool"]});
        let mut driven = Driven::new(json!({"id": "w", "steps": [step]}), json!({}));
        driven.handle(Event::Resumed, 1_000);
        assert_eq!(
            driven.handle(failed("a", StepErrorKind::Tool), 2_000),
            ["save"]
        );
        assert_eq!(driven.step("a").state, StepState::Pending);
        assert_eq!(next_wake(&driven.run), Some(3_000));
        // Not before its backoff.
        assert_eq!(driven.handle(Event::Tick, 2_500), ["save"]);
        assert_eq!(driven.started.len(), 1);
        assert_eq!(driven.handle(Event::Tick, 3_000), ["save", "start"]);
        assert_eq!(driven.last_start(), ("a", 2));
        let commands = driven.handle(failed("a", StepErrorKind::Tool), 4_000);
        assert_eq!(commands, ["save", "abort", "stop"]);
        assert_eq!(driven.run.state, WorkflowState::Failed);
        assert_eq!(
            driven.run.error.as_deref(),
            Some("step \"a\" failed: it broke")
        );
        driven.assert_replays();
    }

    #[test]
    fn a_failure_the_policy_does_not_name_is_not_retried() {
        let mut step = tool("a");
        step["retry"] = json!({"attempts": 3, "on": ["timeout"]});
        let mut driven = Driven::new(json!({"id": "w", "steps": [step]}), json!({}));
        driven.handle(Event::Resumed, 0);
        driven.handle(failed("a", StepErrorKind::Tool), 10);
        assert_eq!(driven.run.state, WorkflowState::Failed);
        assert_eq!(driven.step("a").attempts, 1);
        driven.assert_replays();
    }

    #[test]
    fn an_approval_waits_for_a_decision_and_a_rejection_fails_the_run() {
        let definition = json!({"id": "w", "steps": [
            {"id": "ok", "kind": "approval", "message": "Send {{ input.what }}?"},
            tool("send"),
        ]});
        let mut driven = Driven::new(definition.clone(), json!({"what": "mail"}));
        assert_eq!(driven.handle(Event::Resumed, 0), ["save"]);
        assert_eq!(driven.run.state, WorkflowState::Waiting);
        assert_eq!(driven.step("ok").message.as_deref(), Some("Send mail?"));
        assert_eq!(next_wake(&driven.run), None);
        let approve = Message::Decide {
            step: "ok".into(),
            approved: true,
            comment: Some("go".into()),
        };
        assert_eq!(
            driven.handle(Event::Message(approve), 5_000),
            ["save", "start"]
        );
        assert_eq!(driven.last_start(), ("send", 1));
        assert_eq!(
            driven.step("ok").output,
            Some(json!({"approved": true, "comment": "go"}))
        );
        driven.assert_replays();

        let mut rejected = Driven::new(definition, json!({"what": "mail"}));
        rejected.handle(Event::Resumed, 0);
        let reject = Message::Decide {
            step: "ok".into(),
            approved: false,
            comment: None,
        };
        let commands = rejected.handle(Event::Message(reject), 5_000);
        assert_eq!(commands, ["save", "abort", "stop"]);
        assert_eq!(
            rejected.step("ok").error_kind,
            Some(StepErrorKind::Rejected)
        );
        assert_eq!(rejected.step("send").state, StepState::Cancelled);
        assert!(rejected.started.is_empty());
        rejected.assert_replays();
    }

    #[test]
    fn an_approval_that_times_out_is_decided_by_its_policy() {
        let definition = json!({"id": "w", "steps": [
            {"id": "ok", "kind": "approval", "message": "Go?", "timeout_secs": 10,
             "on_timeout": "approve"},
        ]});
        let mut driven = Driven::new(definition, json!({}));
        driven.handle(Event::Resumed, 1_000);
        assert_eq!(next_wake(&driven.run), Some(11_000));
        driven.handle(Event::Tick, 10_999);
        assert_eq!(driven.step("ok").state, StepState::Waiting);
        assert_eq!(driven.handle(Event::Tick, 11_000), ["save", "stop"]);
        let decision = driven.step("ok").decision.clone().unwrap();
        assert!(decision.approved && decision.timed_out);
        assert_eq!(driven.run.state, WorkflowState::Succeeded);
        driven.assert_replays();
    }

    #[test]
    fn a_signal_that_comes_before_its_step_waits_is_kept_for_it() {
        let definition = json!({"id": "w", "steps": [
            {"id": "pause", "kind": "wait", "seconds": 5},
            {"id": "go", "kind": "signal", "name": "go"},
        ]});
        let mut driven = Driven::new(definition, json!({}));
        driven.handle(Event::Resumed, 0);
        assert_eq!(next_wake(&driven.run), Some(5_000));
        let signal = Message::Signal {
            name: "go".into(),
            payload: json!({"n": 7}),
        };
        driven.handle(Event::Message(signal), 1_000);
        assert_eq!(driven.run.signals["go"], [json!({"n": 7})]);
        assert_eq!(driven.handle(Event::Tick, 5_000), ["save", "stop"]);
        assert_eq!(
            driven.step("pause").output,
            Some(json!({"waited_until": 5_000}))
        );
        assert_eq!(driven.step("go").output, Some(json!({"n": 7})));
        assert!(driven.run.signals["go"].is_empty());
        assert_eq!(driven.run.output, Some(json!({"n": 7})));
        driven.assert_replays();
    }

    #[test]
    fn a_switch_runs_the_way_it_chooses_and_the_join_after_it() {
        let definition = json!({"id": "w", "steps": [
            {"id": "route", "kind": "switch",
             "cases": [{"when": "input.n > 1", "then": "big"}], "default": "small"},
            {"id": "big", "kind": "tool", "tool": "current_time", "needs": ["route"]},
            {"id": "small", "kind": "tool", "tool": "current_time", "needs": ["route"]},
            {"id": "end", "kind": "tool", "tool": "current_time", "needs": ["big", "small"]},
        ]});
        let mut driven = Driven::new(definition, json!({"n": 5}));
        driven.handle(Event::Resumed, 0);
        assert_eq!(
            driven.step("route").output,
            Some(json!({"case": 0, "next": "big"}))
        );
        assert_eq!(driven.last_start(), ("big", 1));
        let small = driven.step("small");
        assert!(small.state == StepState::Skipped && small.not_taken);
        driven.handle(ok("big", json!(1)), 10);
        assert_eq!(driven.last_start(), ("end", 1));
        driven.handle(ok("end", json!(2)), 20);
        assert_eq!(driven.run.state, WorkflowState::Succeeded);
        driven.assert_replays();
    }

    #[test]
    fn a_step_whose_when_is_false_is_skipped_and_a_bad_expression_fails_it() {
        let definition = json!({"id": "w", "steps": [
            {"id": "a", "kind": "tool", "tool": "current_time", "when": "input.go"},
            {"id": "b", "kind": "tool", "tool": "current_time", "needs": [], "when": "input.n > "},
        ]});
        let mut driven = Driven::new(definition, json!({"go": false}));
        let commands = driven.handle(Event::Resumed, 0);
        assert_eq!(commands, ["abort", "save", "stop"]);
        assert_eq!(driven.step("a").state, StepState::Skipped);
        assert_eq!(driven.step("b").error_kind, Some(StepErrorKind::Expression));
        assert!(driven.started.is_empty());
        driven.assert_replays();
    }

    #[test]
    fn a_cancel_aborts_the_attempts_stops_their_work_and_ends_the_run() {
        let mut driven = Driven::new(
            json!({"id": "w", "steps": [tool("a"), tool("b")]}),
            json!({}),
        );
        driven.handle(Event::Resumed, 0);
        let commands = driven.handle(Event::Message(Message::Cancel), 50);
        assert_eq!(commands, ["abort", "cancel", "save", "stop"]);
        assert_eq!(driven.run.state, WorkflowState::Cancelled);
        assert_eq!(driven.step("a").state, StepState::Cancelled);
        assert_eq!(driven.step("b").state, StepState::Cancelled);
        driven.assert_replays();
    }

    #[test]
    fn a_run_taken_up_again_restarts_the_steps_a_crash_left_running_and_an_ended_one_stops() {
        let mut driven = Driven::new(
            json!({"id": "w", "steps": [tool("a"), tool("b")]}),
            json!({}),
        );
        driven.handle(Event::Resumed, 0);
        driven.handle(ok("a", json!(1)), 10);
        // The process dies with b running; a new driver takes the run from what was recorded.
        driven.assert_replays();
        let mut resumed = Driven {
            machine: Machine::new(&driven.run),
            run: driven.run.clone(),
            stored: driven.stored.clone(),
            recorded: driven.recorded.clone(),
            header: driven.header.clone(),
            started: Vec::new(),
        };
        assert_eq!(resumed.step("b").state, StepState::Running);
        assert_eq!(resumed.handle(Event::Resumed, 100), ["start", "save"]);
        assert_eq!(resumed.last_start(), ("b", 1));
        resumed.handle(ok("b", json!(2)), 200);
        assert_eq!(resumed.run.state, WorkflowState::Succeeded);
        resumed.assert_replays();
        // An ended run taken up again does nothing.
        let mut ended = Machine::new(&resumed.run);
        let mut run = resumed.run.clone();
        let commands = ended.handle(&mut run, Event::Resumed, 300);
        assert!(matches!(commands.as_slice(), [Command::Stop]));
    }
}
