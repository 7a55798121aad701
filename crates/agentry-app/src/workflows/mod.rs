//! Workflows: durable graphs of tools, agents, fan-outs, approvals, timers and signals.
//!
//! A definition ([`definition::WorkflowDefinition`]) is stored like an agent (`/v1/workflows`),
//! versioned; a run ([`WorkflowRun`]) pins the definition it started with. Each step
//! transition (a step starting, ending, waiting, retried) is one small event in the store
//! (`workflow_events`, numbered per run: a second driver of the run is refused its first
//! append), so a step costs a row, not a rewrite of the run; a change of the run itself
//! (waiting, signalled, ended) is an event too, and then the run's document is rewritten as a
//! snapshot naming the last event it holds (`seq`). The run as read is the snapshot with the
//! later events applied; its stream sends the events as they come ([`WorkflowEvent`]). One driver task per live run ([`engine`], around the pure
//! state machine in [`machine`]) starts the steps whose dependencies are done, as many at once as are ready; agent steps are background runs on the run queue (their
//! idempotency key names the run, step and attempt, so a driver resumed after a crash finds the
//! run it had started instead of starting another). At start-up every unfinished run is resumed
//! from its document: finished steps are not run again; a step that was running is run again
//! (a tool step) or re-attached (an agent step). Approvals, signals and cancellations reach
//! the driver through the process's registry; a timer is a wake-up time in the document.

mod builder;
pub mod definition;
mod engine;
mod machine;
pub mod triggers;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::App;
use crate::auth::Principal;
use crate::config::{ConfigRepo, check_name};
use crate::error::{AppError, Failure};

pub use definition::WorkflowDefinition;

impl WorkflowDefinition {
    /// Checks a run's input: a JSON object that its input schema takes.
    pub fn check_input(&self, input: &Value) -> Result<(), AppError> {
        if !input.is_object() {
            return Err(AppError::bad_request("a workflow's input is a JSON object"));
        }
        if let Some(schema) = &self.input_schema {
            let validator = jsonschema::validator_for(schema).map_err(|error| {
                AppError::internal(format!("the stored input schema is invalid: {error}"))
            })?;
            if let Some(error) = validator.iter_errors(input).next() {
                return Err(AppError::new(
                    Failure::Invalid,
                    "invalid_input",
                    format!("input{}: {error}", error.instance_path()),
                ));
            }
        }
        Ok(())
    }
}

impl crate::config::ConfigDoc for WorkflowDefinition {
    const KIND: agentry_store::ConfigKind = agentry_store::ConfigKind::Workflow;
    const NOUN: &'static str = "workflow";
}

impl crate::config::ConfigDoc for WorkflowRun {
    const KIND: agentry_store::ConfigKind = agentry_store::ConfigKind::WorkflowRun;
    const NOUN: &'static str = "workflow run";
}

/// Where a workflow run is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WorkflowState {
    /// Steps are running.
    Running,
    /// Nothing runs: steps wait for a person, a timer or a signal.
    Waiting,
    /// Every step ended well.
    Succeeded,
    /// A step failed (after its retries).
    Failed,
    /// Cancelled.
    Cancelled,
}

impl WorkflowState {
    /// Whether the run has ended.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Cancelled)
    }
}

/// Where a step is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Not started (its dependencies are not done, or it waits to be retried).
    Pending,
    /// Running.
    Running,
    /// Waiting for a person, a timer or a signal.
    Waiting,
    /// Done, with its output.
    Succeeded,
    /// Failed (after its retries).
    Failed,
    /// Not run: its `when` was false, or a `switch` chose another way (`not_taken`).
    Skipped,
    /// Not run, or stopped: the workflow was cancelled or failed elsewhere.
    Cancelled,
}

impl StepState {
    /// Whether the step has ended.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            Self::Succeeded | Self::Failed | Self::Skipped | Self::Cancelled
        )
    }
}

/// A person's decision on an approval step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Decision {
    /// Approved or not.
    pub approved: bool,
    /// Why, if they said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comment: Option<String>,
    /// When (Unix milliseconds).
    pub at: u64,
    /// `true` when the timeout decided.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub timed_out: bool,
}

/// One step of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct StepRun {
    /// Where it is.
    pub state: StepState,
    /// Attempts started.
    pub attempts: u32,
    /// When the latest attempt started (Unix milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<u64>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// Not before this time (a retry's backoff, a timer's end, an approval's timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_at: Option<u64>,
    /// Its output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub output: Option<Value>,
    /// Why it failed (or why its last attempt did, while it waits to be retried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What kind of failure that was (what a retry policy's `on` names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub error_kind: Option<definition::StepErrorKind>,
    /// What an approval step asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// An approval's decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<Decision>,
    /// The sessions an agent step (or its map items) ran in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<String>,
    /// Skipped because a `switch` chose another way (or every step it needs was).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub not_taken: bool,
}

impl StepRun {
    fn pending() -> Self {
        Self {
            state: StepState::Pending,
            attempts: 0,
            started_at: None,
            finished_at: None,
            wake_at: None,
            output: None,
            error: None,
            error_kind: None,
            message: None,
            decision: None,
            sessions: Vec::new(),
            not_taken: false,
        }
    }
}

/// A run of a workflow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowRun {
    /// Its id.
    pub run_id: String,
    /// The workflow's id.
    pub workflow_id: String,
    /// The version it runs.
    pub version: u32,
    /// Where it is.
    pub state: WorkflowState,
    /// Its input.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub input: Value,
    /// Each step, by id.
    pub steps: BTreeMap<String, StepRun>,
    /// Its output, once it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub output: Option<Value>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Signals received that no step has taken yet, by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub signals: BTreeMap<String, Vec<Value>>,
    /// The run that started it as a step (a sub-workflow), and how deep it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// 0 for a run started by someone; one more per sub-workflow level.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub depth: u32,
    /// Who started it (a user key's id; none for an admin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// When it was started, updated and ended (Unix milliseconds).
    pub created_at: u64,
    /// Last change.
    pub updated_at: u64,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<u64>,
    /// The definition it runs (pinned at start).
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub definition: WorkflowDefinition,
    /// Where its end is told (its own, or its workflow's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
    /// The last step event the stored document includes: later step transitions are events in
    /// the store, applied when the run is read.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub seq: u64,
    /// Steps changed since the driver last recorded the run.
    #[serde(skip)]
    pub(crate) dirty: std::collections::BTreeSet<String>,
    /// Steps changed since the driver last refreshed what templates see of them.
    #[serde(skip)]
    pub(crate) stale: std::collections::BTreeSet<String>,
}

/// One change of a run, as the store keeps it and its stream sends it (`type`: `step` or
/// `run`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum WorkflowEvent {
    /// A step's whole new state.
    Step {
        /// The step.
        step: String,
        /// Its state after the change.
        run: StepRun,
        /// When (Unix milliseconds).
        at: u64,
    },
    /// The run's own new state (it started waiting, was signalled, ended).
    Run {
        /// Where it is.
        state: WorkflowState,
        /// Its output, once it succeeded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
        output: Option<Value>,
        /// Why it failed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
        /// When it ended.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        finished_at: Option<u64>,
        /// When (Unix milliseconds).
        at: u64,
    },
}

impl WorkflowRun {
    /// A new run `run_id` of `definition` at `now`, every step pending (started by an admin,
    /// at the top level: the caller sets `owner`, `parent` and `depth`).
    fn new(run_id: String, definition: WorkflowDefinition, input: Value, now: u64) -> Self {
        Self {
            run_id,
            parent: None,
            depth: 0,
            workflow_id: definition.id.clone(),
            version: definition.version,
            state: WorkflowState::Running,
            input,
            steps: definition
                .steps
                .iter()
                .map(|step| (step.id.clone(), StepRun::pending()))
                .collect(),
            output: None,
            error: None,
            signals: BTreeMap::new(),
            owner: None,
            created_at: now,
            updated_at: now,
            finished_at: None,
            webhook_url: definition.webhook_url.clone(),
            definition,
            seq: 0,
            dirty: Default::default(),
            stale: Default::default(),
        }
    }

    /// Applies the event number `seq`.
    fn apply(&mut self, seq: u64, event: Value) -> Result<(), AppError> {
        let event: WorkflowEvent = serde_json::from_value(event).map_err(|error| {
            AppError::internal(format!(
                "workflow run {}: event {seq} is unreadable: {error}",
                self.run_id
            ))
        })?;
        let at = match event {
            WorkflowEvent::Step { step, run, at } => {
                self.steps.insert(step, run);
                at
            }
            WorkflowEvent::Run {
                state,
                output,
                error,
                finished_at,
                at,
            } => {
                self.state = state;
                self.output = output;
                self.error = error;
                self.finished_at = finished_at;
                at
            }
        };
        self.updated_at = self.updated_at.max(at);
        self.seq = seq;
        Ok(())
    }
}

/// `GET /v1/workflows`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowList {
    /// The workflows, by id.
    pub workflows: Vec<WorkflowDefinition>,
}

/// `GET /v1/workflow-runs`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowRunList {
    /// The runs, newest first.
    pub runs: Vec<WorkflowRun>,
}

/// What reaches a live run's driver.
#[derive(Debug, Clone)]
pub(crate) enum Message {
    /// A person decided an approval step.
    Decide {
        step: String,
        approved: bool,
        comment: Option<String>,
    },
    /// A signal arrived.
    Signal { name: String, payload: Value },
    /// Stop.
    Cancel,
}

/// The live runs of this process: each driver's inbox, and a change counter per run that
/// followers (the SSE stream) wait on.
#[derive(Default)]
pub struct LiveWorkflows {
    drivers: Mutex<HashMap<String, mpsc::UnboundedSender<Message>>>,
    changes: Mutex<HashMap<String, tokio::sync::watch::Sender<u64>>>,
}

impl std::fmt::Debug for LiveWorkflows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveWorkflows").finish_non_exhaustive()
    }
}

impl LiveWorkflows {
    fn send(&self, run: &str, message: Message) -> bool {
        let drivers = self.drivers.lock().unwrap_or_else(PoisonError::into_inner);
        drivers
            .get(run)
            .is_some_and(|inbox| inbox.send(message).is_ok())
    }

    /// Registers a driver; `None` when one already drives this run.
    fn register(&self, run: &str) -> Option<mpsc::UnboundedReceiver<Message>> {
        let mut drivers = self.drivers.lock().unwrap_or_else(PoisonError::into_inner);
        if drivers.get(run).is_some_and(|inbox| !inbox.is_closed()) {
            return None;
        }
        let (inbox, messages) = mpsc::unbounded_channel();
        drivers.insert(run.to_owned(), inbox);
        Some(messages)
    }

    fn unregister(&self, run: &str) {
        self.drivers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run);
        // Followers see the last change, then their channel closes.
        self.changed(run);
        self.changes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(run);
    }

    /// Tells followers that the run's document changed.
    pub(crate) fn changed(&self, run: &str) {
        let changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = changes.get(run) {
            sender.send_modify(|count| *count += 1);
        }
    }

    /// A receiver that changes whenever the run's document does (while it is driven here).
    pub fn subscribe(&self, run: &str) -> tokio::sync::watch::Receiver<u64> {
        let mut changes = self.changes.lock().unwrap_or_else(PoisonError::into_inner);
        changes
            .entry(run.to_owned())
            .or_insert_with(|| tokio::sync::watch::channel(0).0)
            .subscribe()
    }
}

/// The JSON Schema of a workflow definition (`GET /v1/workflow-schema`), for editors and
/// checks before saving; the server checks more (dependencies, expressions, what exists).
pub fn workflow_schema() -> Result<Value, AppError> {
    serde_json::from_str(include_str!("schema.json"))
        .map_err(|error| AppError::internal(format!("the workflow schema is not JSON: {error}")))
}

/// A run id derived from `parts` (a hash of them, in a UUID's shape): the same parts, the same
/// id, so whatever starts a run from them (a sub-workflow step's attempt, a trigger's
/// delivery) finds it again instead of starting another.
pub(crate) fn derived_run_id(parts: &[&str]) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(parts.join("\0").as_bytes());
    let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn is_zero(depth: &u32) -> bool {
    *depth == 0
}

fn is_zero_u64(seq: &u64) -> bool {
    *seq == 0
}

/// How deep sub-workflows may nest.
pub const MAX_DEPTH: u32 = 8;

fn no_workflow(id: &str) -> AppError {
    AppError::not_found(format!("no workflow {id:?} (POST /v1/workflows)"))
}

fn no_run(id: &str) -> AppError {
    AppError::not_found(format!("no workflow run {id:?}"))
}

/// The workflows: their definitions, their runs and the decisions and signals runs wait for.
pub struct Workflows<'a> {
    app: &'a App,
}

impl App {
    /// The workflows: their definitions, their runs and the decisions and signals runs wait for.
    pub fn workflows(&self) -> Workflows<'_> {
        Workflows { app: self }
    }
}

impl Workflows<'_> {
    /// A receiver that changes whenever the workflow run `id`'s document does (while it is
    /// driven in this process).
    pub fn changes(&self, id: &str) -> tokio::sync::watch::Receiver<u64> {
        self.app.parts.workflows.subscribe(id)
    }

    /// Checks a definition against the runtime (its tools) and the saved agents.
    async fn check(&self, definition: &WorkflowDefinition) -> Result<(), AppError> {
        let runtime = self.app.parts.sessions.runtime();
        let agents: Vec<String> =
            ConfigRepo::<crate::agents::AgentConfig>::new(&self.app.parts.store)
                .list()
                .await?
                .into_iter()
                .map(|(name, _)| name)
                .collect();
        let workflows: Vec<String> = ConfigRepo::<WorkflowDefinition>::new(&self.app.parts.store)
            .list()
            .await?
            .into_iter()
            .map(|(name, _)| name)
            .collect();
        definition.check(
            |tool| runtime.tools().contains(tool),
            |agent| agents.iter().any(|name| name == agent),
            |workflow| workflows.iter().any(|name| name == workflow),
        )?;
        if let Some(url) = &definition.webhook_url {
            self.app.check_webhook(url, None).await.map_err(|error| {
                AppError::bad_request(format!("webhook_url: {}", error.message))
            })?;
        }
        Ok(())
    }

    /// Stores a new workflow (version 1).
    pub async fn create(
        &self,
        mut definition: WorkflowDefinition,
    ) -> Result<WorkflowDefinition, AppError> {
        definition.version = 1;
        self.check(&definition).await?;
        ConfigRepo::new(&self.app.parts.store)
            .create(&definition.id, &definition)
            .await?;
        Ok(definition)
    }

    /// Replaces a workflow: its next version (runs going on keep theirs).
    pub async fn replace(
        &self,
        id: &str,
        mut definition: WorkflowDefinition,
    ) -> Result<WorkflowDefinition, AppError> {
        let old = self.get(id).await?;
        if definition.id != id {
            return Err(AppError::bad_request(format!(
                "the body's id {:?} is not {id:?}",
                definition.id
            )));
        }
        definition.version = old.version + 1;
        self.check(&definition).await?;
        ConfigRepo::new(&self.app.parts.store)
            .put(id, &definition)
            .await?;
        Ok(definition)
    }

    /// A workflow.
    pub async fn get(&self, id: &str) -> Result<WorkflowDefinition, AppError> {
        check_name("workflow", id)?;
        ConfigRepo::new(&self.app.parts.store)
            .get(id)
            .await?
            .ok_or_else(|| no_workflow(id))
    }

    /// The workflows.
    pub async fn list(&self) -> Result<WorkflowList, AppError> {
        let workflows = ConfigRepo::<WorkflowDefinition>::new(&self.app.parts.store)
            .list()
            .await?
            .into_iter()
            .map(|(_, definition)| definition)
            .collect();
        Ok(WorkflowList { workflows })
    }

    /// Deletes a workflow (its runs stay).
    pub async fn delete(&self, id: &str) -> Result<(), AppError> {
        check_name("workflow", id)?;
        if !ConfigRepo::<WorkflowDefinition>::new(&self.app.parts.store)
            .delete(id)
            .await?
        {
            return Err(no_workflow(id));
        }
        Ok(())
    }

    /// Starts a run of workflow `id` with `input` (checked against its input schema); it goes
    /// on in the background.
    pub async fn start(
        &self,
        caller: &Principal,
        id: &str,
        input: Value,
    ) -> Result<WorkflowRun, AppError> {
        self.start_run(caller, id, input, None, None).await
    }

    /// Starts a run whose end is told to `webhook_url` (checked first: the URL, and that a
    /// signing secret exists) instead of the workflow's own webhook.
    pub async fn start_with_webhook(
        &self,
        caller: &Principal,
        id: &str,
        input: Value,
        webhook_url: &str,
    ) -> Result<WorkflowRun, AppError> {
        self.app
            .check_webhook(webhook_url, caller.key_id.as_deref())
            .await?;
        let mut run = self.new_run(caller, id, input, None, None).await?;
        run.webhook_url = Some(webhook_url.to_owned());
        self.launch_run(run).await
    }

    /// Starts a run; `parent` names the parent run and the depth (a sub-workflow step's), and
    /// `run_id` the run's id when it is derived (from the parent's step, so a resumed parent
    /// finds it again; from a trigger's delivery, so a delivery starts one run): 409 when a
    /// run has that id already.
    pub(crate) async fn start_run(
        &self,
        caller: &Principal,
        id: &str,
        input: Value,
        parent: Option<(String, u32)>,
        run_id: Option<String>,
    ) -> Result<WorkflowRun, AppError> {
        let run = self.new_run(caller, id, input, parent, run_id).await?;
        self.launch_run(run).await
    }

    /// A new run of workflow `id`, checked, not yet stored (see [`Self::start_workflow_run`]).
    async fn new_run(
        &self,
        caller: &Principal,
        id: &str,
        input: Value,
        parent: Option<(String, u32)>,
        run_id: Option<String>,
    ) -> Result<WorkflowRun, AppError> {
        let definition = self.get(id).await?;
        if parent.as_ref().is_some_and(|(_, depth)| *depth > MAX_DEPTH) {
            return Err(AppError::bad_request(format!(
                "sub-workflows nest at most {MAX_DEPTH} deep"
            )));
        }
        definition.check_input(&input)?;
        let now = crate::clock::now_ms();
        let (parent, depth) = match parent {
            Some((parent, depth)) => (Some(parent), depth),
            None => (None, 0),
        };
        let run_id = run_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
        Ok(WorkflowRun {
            parent,
            depth,
            owner: caller.owner(),
            ..WorkflowRun::new(run_id, definition, input, now)
        })
    }

    /// Stores a new run and starts its driver.
    async fn launch_run(&self, run: WorkflowRun) -> Result<WorkflowRun, AppError> {
        ConfigRepo::new(&self.app.parts.store)
            .create(&run.run_id, &run)
            .await?;
        engine::spawn(self.app.clone(), run.run_id.clone());
        Ok(run)
    }

    /// The events recorded for the workflow run `id` after `after`, in order, with their
    /// numbers (a caller that may read the run has been checked: `Workflows::run`).
    pub async fn events(
        &self,
        id: &str,
        after: u64,
    ) -> Result<Vec<(u64, serde_json::Value)>, AppError> {
        Ok(self.app.parts.store.workflow_events(id, after).await?)
    }

    /// A run, as its document says now.
    pub async fn run(&self, caller: &Principal, run_id: &str) -> Result<WorkflowRun, AppError> {
        // Run ids are UUIDs; anything else names no run.
        if uuid::Uuid::parse_str(run_id).is_err() {
            return Err(no_run(run_id));
        }
        let run = self
            .stored_run(run_id)
            .await?
            .filter(|run| caller.may_see(run.owner.as_deref()))
            .ok_or_else(|| no_run(run_id))?;
        Ok(run)
    }

    /// A run as stored: its document with the step events after it applied (an ended run's
    /// document holds them all).
    pub(crate) async fn stored_run(&self, run_id: &str) -> Result<Option<WorkflowRun>, AppError> {
        let Some(mut run) = ConfigRepo::<WorkflowRun>::new(&self.app.parts.store)
            .get(run_id)
            .await?
        else {
            return Ok(None);
        };
        self.catch_up(&mut run).await?;
        Ok(Some(run))
    }

    /// Applies the step events stored after `run`'s document.
    async fn catch_up(&self, run: &mut WorkflowRun) -> Result<(), AppError> {
        if !run.state.is_final() {
            for (seq, event) in self
                .app
                .parts
                .store
                .workflow_events(&run.run_id, run.seq)
                .await?
            {
                run.apply(seq, event)?;
            }
        }
        Ok(())
    }

    /// The caller's runs, newest first (of one workflow, when named).
    pub async fn runs(
        &self,
        caller: &Principal,
        workflow: Option<&str>,
    ) -> Result<WorkflowRunList, AppError> {
        let mut runs: Vec<WorkflowRun> = ConfigRepo::<WorkflowRun>::new(&self.app.parts.store)
            .list()
            .await?
            .into_iter()
            .map(|(_, run)| run)
            .filter(|run| caller.may_see(run.owner.as_deref()))
            .filter(|run| workflow.is_none_or(|id| run.workflow_id == id))
            .collect();
        for run in &mut runs {
            self.catch_up(run).await?;
        }
        runs.sort_by_key(|run| std::cmp::Reverse(run.created_at));
        Ok(WorkflowRunList { runs })
    }

    /// Sends `message` to a live run of the caller's: 409 when it has ended.
    async fn tell(
        &self,
        caller: &Principal,
        run_id: &str,
        message: Message,
    ) -> Result<WorkflowRun, AppError> {
        let run = self.run(caller, run_id).await?;
        if run.state.is_final() {
            return Err(AppError::conflict(format!(
                "the workflow run has ended ({})",
                serde_json::to_value(run.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            )));
        }
        if !self.app.parts.workflows.send(run_id, message.clone()) {
            // Its driver is not running here (it ended between the read and now, or the
            // process restarted): start one, then deliver.
            engine::spawn(self.app.clone(), run_id.to_owned());
            tokio::task::yield_now().await;
            if !self.app.parts.workflows.send(run_id, message) {
                return Err(AppError::new(
                    Failure::Unavailable,
                    "workflow_unavailable",
                    "the workflow run is not live on this server; try again",
                ));
            }
        }
        Ok(run)
    }

    /// Decides the approval step `step` of a run.
    pub async fn decide_step(
        &self,
        caller: &Principal,
        run_id: &str,
        step: &str,
        approved: bool,
        comment: Option<String>,
    ) -> Result<(), AppError> {
        let run = self.run(caller, run_id).await?;
        let Some(state) = run.steps.get(step) else {
            return Err(AppError::not_found(format!(
                "the workflow has no step {step:?}"
            )));
        };
        let index = run.definition.steps.iter().position(|s| s.id == step);
        let is_approval = index.is_some_and(|i| run.definition.steps[i].kind == "approval");
        if !is_approval {
            return Err(AppError::bad_request(format!(
                "step {step:?} is not an approval"
            )));
        }
        if state.state != StepState::Waiting {
            return Err(AppError::conflict(format!(
                "step {step:?} is not waiting for a decision"
            )));
        }
        self.tell(
            caller,
            run_id,
            Message::Decide {
                step: step.to_owned(),
                approved,
                comment,
            },
        )
        .await
        .map(|_| ())
    }

    /// Sends the signal `name` with `payload` to a run (kept until a step waits for it).
    pub async fn signal(
        &self,
        caller: &Principal,
        run_id: &str,
        name: &str,
        payload: Value,
    ) -> Result<(), AppError> {
        check_name("signal", name)?;
        self.tell(
            caller,
            run_id,
            Message::Signal {
                name: name.to_owned(),
                payload,
            },
        )
        .await
        .map(|_| ())
    }

    /// Cancels a run: running steps are stopped (agent steps' runs cancelled), the rest not run.
    pub async fn cancel(&self, caller: &Principal, run_id: &str) -> Result<(), AppError> {
        self.tell(caller, run_id, Message::Cancel).await.map(|_| ())
    }

    /// Runs a failed or cancelled run again from where it stopped: its failed and cancelled
    /// steps start over (with their attempts counted afresh), the steps that succeeded keep
    /// their outputs. 409 for a run that has not ended or that succeeded.
    pub async fn retry(&self, caller: &Principal, run_id: &str) -> Result<WorkflowRun, AppError> {
        let mut run = self.run(caller, run_id).await?;
        if !matches!(run.state, WorkflowState::Failed | WorkflowState::Cancelled) {
            return Err(AppError::conflict(
                "only a failed or cancelled run can be retried",
            ));
        }
        for step in run.steps.values_mut() {
            if matches!(step.state, StepState::Failed | StepState::Cancelled) {
                *step = StepRun::pending();
            }
        }
        run.state = WorkflowState::Running;
        run.error = None;
        run.finished_at = None;
        run.updated_at = crate::clock::now_ms();
        ConfigRepo::new(&self.app.parts.store)
            .put(run_id, &run)
            .await?;
        engine::spawn(self.app.clone(), run_id.to_owned());
        Ok(run)
    }

    /// At start-up: every unfinished run goes on. Returns how many.
    pub async fn resume(&self) -> usize {
        let runs = match ConfigRepo::<WorkflowRun>::new(&self.app.parts.store)
            .list()
            .await
        {
            Ok(runs) => runs,
            Err(error) => {
                tracing::error!("cannot list workflow runs: {}", error.message);
                return 0;
            }
        };
        let mut resumed = 0;
        for (_, run) in runs {
            if !run.state.is_final() {
                engine::spawn(self.app.clone(), run.run_id);
                resumed += 1;
            }
        }
        resumed
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    /// Whether `definition` matches the published schema.
    fn valid(definition: &serde_json::Value) -> bool {
        let schema = super::workflow_schema().unwrap();
        jsonschema::validator_for(&schema)
            .unwrap()
            .is_valid(definition)
    }

    #[test]
    fn the_published_schema_takes_what_the_server_takes_and_refuses_what_it_refuses() {
        let good = json!({"id": "all", "input_schema": {"type": "object"}, "steps": [
            {"id": "t", "kind": "tool", "tool": "echo", "arguments": {"x": "{{ input.x }}"}, "needs": []},
            {"id": "a", "kind": "agent", "agent": "w", "prompt": "hi", "output_schema": {"type": "object"}, "repair_attempts": 2,
             "retry": {"attempts": 2, "backoff_secs": 0.5}, "timeout_secs": 60},
            {"id": "s", "kind": "workflow", "workflow": "other", "input": {"n": 1}, "when": "true"},
            {"id": "m", "kind": "map", "items": "input.list", "concurrency": 3,
             "step": {"kind": "agent", "agent": "w", "prompt": "{{ item }}"}},
            {"id": "l", "kind": "loop", "max": 3, "until": "last", "step": {"kind": "tool", "tool": "echo"}},
            {"id": "p", "kind": "approval", "message": "ok?", "timeout_secs": 60, "on_timeout": "approve"},
            {"id": "w", "kind": "wait", "seconds": 1},
            {"id": "g", "kind": "signal", "name": "go"}
        ], "output": "{{ steps.g.output }}"});
        assert!(valid(&good));
        // And the server's parser takes it too.
        let parsed: super::WorkflowDefinition = serde_json::from_value(good.clone()).unwrap();
        for (index, step) in parsed.steps.iter().enumerate() {
            step.step_kind(index).unwrap();
        }
        for bad in [
            json!({"id": "x", "steps": []}),
            json!({"id": "x", "steps": [{"id": "a", "kind": "teleport"}]}),
            json!({"id": "x", "steps": [{"id": "a", "kind": "agent", "agent": "w"}]}),
            json!({"id": "x", "steps": [{"id": "a", "kind": "agent", "agent": "w", "prompt": "p", "repair_attempts": 6}]}),
            json!({"id": "x", "steps": [{"id": "a", "kind": "wait", "seconds": 1, "extra": true}]}),
            json!({"id": "x", "steps": [{"id": "a", "kind": "map", "items": "x", "step": {"kind": "wait", "seconds": 1}}]}),
            json!({"id": "x", "steps": [{"id": "a", "kind": "loop", "max": 0, "until": "true", "step": {"kind": "tool", "tool": "t"}}]}),
            json!({"id": "bad id!", "steps": [{"id": "a", "kind": "wait", "seconds": 1}]}),
            json!({"id": "x", "unknown": 1, "steps": [{"id": "a", "kind": "wait", "seconds": 1}]}),
        ] {
            assert!(!valid(&bad), "{bad}");
        }
    }
}
