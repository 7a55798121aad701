//! The embeddable runtime: register models, tools, skills and templates once, then run
//! requests — `run` for the final result, `stream` for the live event stream.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agentry_llm::{GenerationParams, ModelClient};
use agentry_types::{
    ContentPart, ErrorInfo, Message, ModelPrice, RunEvent, RunId, RunStopReason, Usage,
};
use futures::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::budget::BudgetGate;
use crate::context::{Compaction, CompactionSettings, ContextPolicy};
use crate::driver::Driver;
use crate::engine::{Phase, RunLimits, RunState};
use crate::events::{EventReceiver, EventSink};
use crate::fallback::FallbackModelClient;
use crate::media::{MediaAdapter, MediaCache, MediaRoute};
use crate::network::NetworkCheck;
use crate::skill::Skill;
use crate::template::{TemplateError, TemplateStore};
use crate::tool::{ApprovalDefaults, ResultFormat, Tool, ToolError, ToolRegistry, ToolRisk};

/// Events buffered between a run and a slow reader before the run waits.
pub(crate) const EVENT_BUFFER: usize = 256;

/// Why a run could not start (or be collected).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunError {
    /// No model is registered under this id.
    #[error("no model is registered as {0:?}")]
    UnknownModel(String),
    /// The runtime has no model at all.
    #[error("no model is registered")]
    NoModel,
    /// The request has no input and no history.
    #[error("the request has no input")]
    EmptyInput,
    /// A template could not be rendered.
    #[error(transparent)]
    Template(#[from] TemplateError),
    /// A tool could not be found or registered.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// The approval policy is invalid.
    #[error(transparent)]
    Approval(#[from] crate::approval::ApprovalError),
    /// A `<file>` in the message cannot be attached.
    #[error(transparent)]
    File(#[from] crate::file_refs::FileRefError),
    /// The compaction settings are invalid.
    #[error("invalid compaction settings: {0}")]
    Compaction(String),
    /// A network policy narrowing the run's `fetch` is invalid.
    #[error("invalid network policy: {0}")]
    Network(#[from] crate::network::NetworkPolicyError),
    /// The run's task ended abnormally (a bug).
    #[error("the run's task failed: {0}")]
    Task(String),
    /// A client tool is invalid (its name is taken by another tool of the run).
    #[error("invalid client tool: {0}")]
    ClientTool(String),
    /// The run names an agent, model or tool its caller's grant does not hold.
    #[error(transparent)]
    Denied(#[from] crate::access::AccessDenied),
}

/// The new user turn of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Input {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// Text, images and audio.
    Content {
        /// The parts.
        content: Vec<ContentPart>,
    },
    /// A named prompt template filled with arguments.
    Template {
        /// The template's name.
        template: String,
        /// Values for its `{{placeholders}}`.
        #[serde(default)]
        arguments: serde_json::Map<String, serde_json::Value>,
    },
}

/// What to run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRequest {
    /// A session to create with the run's first write, for a run in a session nobody has
    /// created yet (the application chose a new one): one commit instead of two, and no read
    /// of a log known to be empty. Never stored: a queued run's session is created before the
    /// run is queued.
    #[serde(skip)]
    pub new_session: Option<crate::session::NewSessionInfo>,
    /// The model id (default: the runtime's default model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Models tried in order when a call to the model fails before any output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    /// A system prompt, placed first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Earlier conversation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<Message>,
    /// The new user turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Input>,
    /// The tools offered, by name; `"*"` offers every registered tool (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
    /// Generation parameters.
    #[serde(default)]
    pub params: GenerationParams,
    /// Guards (default: the runtime's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<RunLimits>,
    /// The root of the run's workspace, the only folder the workspace tools may touch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<PathBuf>,
    /// Which tool calls wait for a person's approval (default: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<crate::approval::ApprovalPolicy>,
    /// The saved agent the run runs as, if any (`talk_to` refuses to target it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Narrowings of the `fetch` tool's network policy for this run (a saved agent's `network`,
    /// a delegating run's): a host must pass each of them as well as the tool's own policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<crate::network::NetworkPolicy>,
    /// What the run's caller may use (`None`: everything): checked on the resolved run, and
    /// carried to the sub-agents it starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<crate::access::Grant>,
    /// How this run compacts (default: the runtime's settings).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<CompactionSettings>,
    /// What earlier compactions of the history did (a session passes its latest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compacted: Option<Compaction>,
    /// Long-term memories for the system prompt of every call (never stored in the log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// The user the run is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The vision model that describes images when the run's model is not labelled
    /// [`vision`](crate::media::VISION) (default: the model labelled
    /// [`read-image`](crate::media::READ_IMAGE), if any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision_model: Option<String>,
    /// The speech model that transcribes audio when the run's model is not labelled
    /// [`audio`](crate::media::AUDIO) (default: the model labelled
    /// [`speech`](crate::media::SPEECH), if any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speech_model: Option<String>,
    /// Tools the caller runs itself (an OpenAI-compatible client's `tools`): offered to the
    /// model beside the run's own; when the model calls one, the run ends with
    /// [`RunStopReason::ToolCalls`](agentry_types::RunStopReason::ToolCalls) and the calls in
    /// its last message, for the caller to answer in its next request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<agentry_types::ToolSpec>,
    /// The API key a run without a session is charged to (a session's runs are charged to the
    /// session's owner). The engine only carries it, for whoever records the run's usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

impl RunRequest {
    /// A request with a text input.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            input: Some(Input::Text { text: text.into() }),
            ..Self::default()
        }
    }

    /// A request whose input is a rendered template.
    pub fn template(
        template: impl Into<String>,
        arguments: serde_json::Map<String, serde_json::Value>,
    ) -> Self {
        Self {
            input: Some(Input::Template {
                template: template.into(),
                arguments,
            }),
            ..Self::default()
        }
    }

    /// Sets the model.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sets the models tried when the model fails before any output.
    pub fn with_fallbacks(mut self, models: Vec<String>) -> Self {
        self.fallback_models = models;
        self
    }

    /// Sets the system prompt.
    pub fn with_system(mut self, system: impl Into<String>) -> Self {
        self.system = Some(system.into());
        self
    }

    /// Offers only these tools.
    pub fn with_tools(mut self, tools: Vec<String>) -> Self {
        self.tools = Some(tools);
        self
    }

    /// Sets the guards.
    pub fn with_limits(mut self, limits: RunLimits) -> Self {
        self.limits = Some(limits);
        self
    }

    /// Continues a conversation.
    pub fn with_history(mut self, history: Vec<Message>) -> Self {
        self.history = history;
        self
    }

    /// Sets the workspace root for the workspace tools.
    pub fn with_workspace(mut self, workspace: impl Into<PathBuf>) -> Self {
        self.workspace = Some(workspace.into());
        self
    }
}

/// The outcome of a run.
#[derive(Debug, Clone)]
pub struct RunOutput {
    /// The run's id.
    pub run_id: RunId,
    /// Why it ended.
    pub stop_reason: RunStopReason,
    /// The final answer (empty unless completed).
    pub text: String,
    /// Tokens over all rounds.
    pub usage: Usage,
    /// Model calls made.
    pub rounds: u32,
    /// The error, when the run failed.
    pub error: Option<ErrorInfo>,
    /// Why a guard stopped the run, when one did.
    pub note: Option<String>,
    /// Set when the run stopped without ending: its calls wait for approval (`waiting`:
    /// decide them with [`RunState::decide`] and [`Runtime::resume`] the state, or through the
    /// session manager) or it was paused (`paused`). `stop_reason` means nothing then.
    pub suspended: Option<agentry_types::SuspendStatus>,
    /// The final state: the whole conversation, resumable.
    pub state: RunState,
}

impl RunOutput {
    fn from_state(state: RunState) -> Self {
        let (stop_reason, error, note) = match &state.phase {
            Phase::Finished {
                reason,
                error,
                note,
            } => (*reason, error.clone(), note.clone()),
            _ => (RunStopReason::Error, None, None),
        };
        let suspended = match &state.phase {
            Phase::Finished { .. } => None,
            Phase::AwaitingApproval { .. } => Some(agentry_types::SuspendStatus::Waiting),
            _ => Some(agentry_types::SuspendStatus::Paused),
        };
        Self {
            suspended,
            run_id: state.run_id,
            stop_reason,
            text: state.final_text(),
            usage: state.usage,
            rounds: state.round,
            error,
            note,
            state,
        }
    }
}

/// A running run's events. Dropping it cancels the run unless it was detached.
pub struct RunStream {
    events: EventReceiver,
    /// Told when the first event is read ([`RunStream::first_event`]).
    first_event: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<RunState>>,
    cancel: CancellationToken,
}

impl RunStream {
    pub(crate) fn new(
        events: EventReceiver,
        task: JoinHandle<RunState>,
        cancel: CancellationToken,
    ) -> Self {
        Self {
            events,
            first_event: None,
            task: Some(task),
            cancel,
        }
    }

    /// Resolves once whoever reads this stream has read its first event (or its end). A
    /// session run's first event comes after its start is committed (or its start failed), so
    /// a new session exists in the log by then. The stream can be handed on (to the hub) and
    /// the wait done elsewhere: the run does not depend on the waiter.
    pub fn first_event(&mut self) -> oneshot::Receiver<()> {
        let (sender, receiver) = oneshot::channel();
        self.first_event = Some(sender);
        receiver
    }

    /// Hands every event of the run to `tap` instead of this stream: the events not read yet
    /// now, in this task, then each as it is sent, in the task that sends it (the run's
    /// driver, a tool). For a reader that only fans events out: it saves waking a task of its
    /// own for every event. `tap` must be quick and must not wait; a [`first_event`](Self::first_event)
    /// waiter is told after the tap's first event. The stream yields nothing more;
    /// [`finish`](Self::finish) still waits for the run's end. A second tap is ignored
    /// (returns false).
    pub fn tap(&mut self, tap: impl Fn(RunEvent) + Send + Sync + 'static) -> bool {
        let tap: crate::events::Tap = match self.first_event.take() {
            None => Box::new(move |event| tap(*event)),
            Some(first_event) => {
                let first_event = std::sync::Mutex::new(Some(first_event));
                Box::new(move |event| {
                    tap(*event);
                    if let Some(first_event) = first_event
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .take()
                    {
                        let _ = first_event.send(());
                    }
                })
            }
        };
        self.events.tap(tap)
    }

    /// The token that cancels this run.
    pub fn cancel_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Cancels the run; it ends at once with `cancelled`.
    pub fn cancel(&self) {
        self.cancel.cancel();
    }

    /// Reads the remaining events and returns the outcome.
    pub async fn finish(mut self) -> Result<RunOutput, RunError> {
        while self.events.recv().await.is_some() {}
        let task = self
            .task
            .take()
            .ok_or_else(|| RunError::Task("already finished".into()))?;
        let state = task
            .await
            .map_err(|error| RunError::Task(error.to_string()))?;
        Ok(RunOutput::from_state(state))
    }

    /// Lets the run go on without this stream (events are dropped); returns its task.
    pub fn detach(mut self) -> Option<JoinHandle<RunState>> {
        self.task.take()
    }
}

impl Stream for RunStream {
    type Item = RunEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<RunEvent>> {
        let polled = self
            .events
            .poll_recv(cx)
            .map(|event| event.map(|event| *event));
        if polled.is_ready()
            && let Some(first_event) = self.first_event.take()
        {
            let _ = first_event.send(());
        }
        polled
    }
}

impl Drop for RunStream {
    fn drop(&mut self) {
        if self.task.is_some() {
            self.cancel.cancel();
        }
    }
}

/// Models, tools, skills and templates, ready to run requests. Cheap to clone.
#[derive(Clone)]
pub struct Runtime {
    inner: Arc<Inner>,
}

struct Inner {
    models: BTreeMap<String, Arc<dyn ModelClient>>,
    labels: BTreeMap<String, Vec<String>>,
    media_cache: Arc<MediaCache>,
    default_model: Option<String>,
    tools: ToolRegistry,
    templates: TemplateStore,
    limits: RunLimits,
    compaction: CompactionSettings,
    approval_defaults: ApprovalDefaults,
    network_check: Option<NetworkCheck>,
    prices: BTreeMap<String, ModelPrice>,
    budget: Option<Arc<dyn BudgetGate>>,
}

/// Builds a [`Runtime`].
#[derive(Default)]
pub struct RuntimeBuilder {
    models: BTreeMap<String, Arc<dyn ModelClient>>,
    labels: BTreeMap<String, Vec<String>>,
    media_cache: Option<Arc<MediaCache>>,
    default_model: Option<String>,
    tools: ToolRegistry,
    templates: TemplateStore,
    limits: RunLimits,
    compaction: CompactionSettings,
    approval_defaults: ApprovalDefaults,
    network_check: Option<NetworkCheck>,
    prices: BTreeMap<String, ModelPrice>,
    budget: Option<Arc<dyn BudgetGate>>,
}

impl RuntimeBuilder {
    /// Registers a model under `id`; the first one registered is the default.
    pub fn model(&mut self, id: impl Into<String>, client: impl ModelClient) -> &mut Self {
        self.model_arc(id, Arc::new(client))
    }

    /// Registers a shared model client.
    pub fn model_arc(&mut self, id: impl Into<String>, client: Arc<dyn ModelClient>) -> &mut Self {
        let id = id.into();
        self.default_model.get_or_insert_with(|| id.clone());
        self.models.insert(id, client);
        self
    }

    /// Labels the model registered as `id` with what it can do ([`crate::media::VISION`],
    /// [`crate::media::AUDIO`], …) and what it is for ([`crate::media::READ_IMAGE`],
    /// [`crate::media::SPEECH`], [`crate::media::SUMMARY`]); a request may also name a model by
    /// a label (the first model, by id, that carries it).
    pub fn model_labels(&mut self, id: impl Into<String>, labels: Vec<String>) -> &mut Self {
        self.labels.insert(id.into(), labels);
        self
    }

    /// Sets what the model registered as `id` costs: each of its calls records its cost.
    pub fn model_price(&mut self, id: impl Into<String>, price: ModelPrice) -> &mut Self {
        self.prices.insert(id.into(), price);
        self
    }

    /// Sets the gate every run asks before each model call (see [`crate::budget`]).
    pub fn budget_gate(&mut self, gate: Arc<dyn BudgetGate>) -> &mut Self {
        self.budget_gate_opt(Some(gate))
    }

    /// Sets (or, with `None`, removes) the gate every run asks before each model call.
    pub fn budget_gate_opt(&mut self, gate: Option<Arc<dyn BudgetGate>>) -> &mut Self {
        self.budget = gate;
        self
    }

    /// Shares the cache of image descriptions and transcripts (default: a new one), so a
    /// rebuilt runtime does not describe the same images again.
    pub fn media_cache(&mut self, cache: Arc<MediaCache>) -> &mut Self {
        self.media_cache = Some(cache);
        self
    }

    /// Chooses the default model.
    pub fn default_model(&mut self, id: impl Into<String>) -> &mut Self {
        self.default_model = Some(id.into());
        self
    }

    /// Registers a tool.
    pub fn tool(&mut self, tool: impl Tool) -> Result<&mut Self, ToolError> {
        self.tools.register(tool)?;
        Ok(self)
    }

    /// Registers a shared tool.
    pub fn tool_arc(&mut self, tool: Arc<dyn Tool>) -> Result<&mut Self, ToolError> {
        self.tools.register_arc(tool)?;
        Ok(self)
    }

    /// Whether a tool (or skill) is registered under `name`.
    pub fn tools_contain(&self, name: &str) -> bool {
        self.tools.contains(name)
    }

    /// Registers a skill: the model first sees its name and description only.
    pub fn skill(&mut self, skill: Skill) -> Result<&mut Self, ToolError> {
        self.tools.register(skill)?;
        Ok(self)
    }

    /// Adds a prompt template.
    pub fn template(
        &mut self,
        name: impl Into<String>,
        source: impl Into<String>,
    ) -> Result<&mut Self, TemplateError> {
        self.templates.add(name, source)?;
        Ok(self)
    }

    /// Sets the default guards.
    pub fn limits(&mut self, limits: RunLimits) -> &mut Self {
        self.limits = limits;
        self
    }

    /// Sets how conversations are compacted to fit each model's window (default: at 80% of
    /// the window, the last 6 units kept, old turns dropped as no summary model is named).
    pub fn compaction(&mut self, settings: CompactionSettings) -> &mut Self {
        self.compaction = settings;
        self
    }

    /// Sets which tools need a person's approval when a run's own policy does not say
    /// (default: every tool that runs on the host, see [`ApprovalDefaults`]).
    pub fn approval_defaults(&mut self, defaults: ApprovalDefaults) -> &mut Self {
        self.approval_defaults = defaults;
        self
    }

    /// Sets how a run's network narrowings ([`RunRequest::network`]) are checked before it
    /// starts: the check of the tool that enforces them (`agentry_tools::validate_network_policy`
    /// for `fetch`). Without one they are not checked up front; `fetch` still refuses an invalid
    /// one when it is called.
    pub fn network_check(&mut self, check: NetworkCheck) -> &mut Self {
        self.network_check = Some(check);
        self
    }

    /// Builds the runtime.
    pub fn build(&mut self) -> Runtime {
        let builder = std::mem::take(self);
        Runtime {
            inner: Arc::new(Inner {
                models: builder.models,
                labels: builder.labels,
                media_cache: builder.media_cache.unwrap_or_default(),
                default_model: builder.default_model,
                tools: builder.tools,
                templates: builder.templates,
                limits: builder.limits,
                compaction: builder.compaction,
                approval_defaults: builder.approval_defaults,
                network_check: builder.network_check,
                prices: builder.prices,
                budget: builder.budget,
            }),
        }
    }
}

impl Runtime {
    /// A builder.
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder::default()
    }

    /// The registered tools.
    pub fn tools(&self) -> &ToolRegistry {
        &self.inner.tools
    }

    /// The registered templates.
    pub fn templates(&self) -> &TemplateStore {
        &self.inner.templates
    }

    /// What the model registered as `id` (or labelled `id`) costs, when a price is set.
    pub fn price_of(&self, id: &str) -> Option<ModelPrice> {
        let id = self.resolve_model_id(id).unwrap_or(id);
        self.inner.prices.get(id).copied()
    }

    /// What a run of `state` is accounted with: its model's catalogue id and price, and the
    /// budget gate.
    pub(crate) fn accounting(&self, state: &RunState) -> crate::driver::Accounting {
        crate::driver::Accounting {
            model_id: self.resolve_model_id(&state.model).map(str::to_owned),
            price: self.price_of(&state.model),
            budget: self.budget_gate(),
        }
    }

    /// The gate runs ask before each model call, when one is set.
    pub fn budget_gate(&self) -> Option<Arc<dyn BudgetGate>> {
        self.inner.budget.clone()
    }

    /// Runs a request to its end.
    pub async fn run(&self, request: RunRequest) -> Result<RunOutput, RunError> {
        self.stream(request)?.finish().await
    }

    /// Starts a request and returns its live events.
    pub fn stream(&self, request: RunRequest) -> Result<RunStream, RunError> {
        let state = self.prepare(request)?;
        self.resume(state)
    }

    /// Continues a run from a stored state (a finished one just reports its end again).
    pub fn resume(&self, state: RunState) -> Result<RunStream, RunError> {
        let model = self.client_for(&state)?;
        let tools = self.inner.tools.clone();
        let (sink, events) = EventSink::channel(EVENT_BUFFER);
        let cancel = CancellationToken::new();
        let summarizer = self.summarizer_for(&state);
        let driver = Driver::new(model, tools, sink, cancel.clone())
            .summarizer(summarizer)
            .accounting(self.accounting(&state));
        let task = tokio::spawn(tracing::Instrument::in_current_span(driver.run(state)));
        Ok(RunStream::new(events, task, cancel))
    }

    /// Calls a tool directly, without a model; with [`ResultFormat::Json`] the result is parsed
    /// as JSON (also out of a fenced code block) or a clear error says it is not JSON.
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: serde_json::Value,
        format: ResultFormat,
    ) -> Result<serde_json::Value, ToolError> {
        self.inner
            .tools
            .call_direct(name, arguments, format, self.inner.limits.tool_timeout)
            .await
    }

    /// The id of the model runs use when their request names none.
    pub fn default_model_id(&self) -> Option<&str> {
        self.inner.default_model.as_deref()
    }

    /// The prompt template `name` filled with `arguments` (a system prompt named by template,
    /// say); the same rendering, limits and errors as a run's templated input.
    pub fn render_template(
        &self,
        name: &str,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, RunError> {
        Ok(self.inner.templates.render(name, arguments)?)
    }

    /// The model client registered as `id`.
    pub fn model_client(&self, id: &str) -> Result<Arc<dyn ModelClient>, RunError> {
        self.model(id)
    }

    /// The client a run calls: its model, wrapped with its fallback models when it has any,
    /// and with the models that describe images and transcribe audio for it when its
    /// [`MediaRoute`] names any.
    pub fn client_for(&self, state: &RunState) -> Result<Arc<dyn ModelClient>, RunError> {
        let primary = self.model(&state.model)?;
        let client = if state.fallback_models.is_empty() {
            primary
        } else {
            let mut models = vec![(state.model.clone(), primary)];
            for id in &state.fallback_models {
                models.push((id.clone(), self.model(id)?));
            }
            Arc::new(FallbackModelClient::new(models))
        };
        if state.media.is_empty() {
            return Ok(client);
        }
        let stand_in = |id: &Option<String>| -> Result<_, RunError> {
            id.as_ref()
                .map(|id| Ok((id.clone(), self.model(id)?)))
                .transpose()
        };
        Ok(Arc::new(MediaAdapter::new(
            client,
            stand_in(&state.media.describe_images)?,
            stand_in(&state.media.transcribe_audio)?,
            Arc::clone(&self.inner.media_cache),
        )))
    }

    /// The labels of the model registered as `id` (empty when it has none or is unknown).
    pub fn model_labels(&self, id: &str) -> &[String] {
        let id = self.resolve_model_id(id).unwrap_or(id);
        self.inner.labels.get(id).map_or(&[], Vec::as_slice)
    }

    /// The first model, by id, labelled `label`.
    pub fn labelled(&self, label: &str) -> Option<&str> {
        self.inner
            .labels
            .iter()
            .find(|(id, labels)| {
                self.inner.models.contains_key(*id) && labels.iter().any(|l| l == label)
            })
            .map(|(id, _)| id.as_str())
    }

    /// The id of the model `name` means: the model registered under it, else the first model
    /// labelled so.
    pub fn resolve_model_id<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        if self.inner.models.contains_key(name) {
            Some(name)
        } else {
            self.labelled(name)
        }
    }

    /// Which models stand in for `model` on images and audio: `vision_model` / `speech_model`
    /// when named (each must be registered), else the models labelled `read-image` and
    /// `speech`; none for what `model` takes itself.
    pub fn media_route(
        &self,
        model: &str,
        vision_model: Option<&str>,
        speech_model: Option<&str>,
    ) -> Result<MediaRoute, RunError> {
        let labels = self.model_labels(model);
        let pick = |named: Option<&str>, label: &str| -> Result<Option<String>, RunError> {
            match named {
                Some(id) => {
                    self.model(id)?;
                    Ok(Some(id.to_owned()))
                }
                None => Ok(self.labelled(label).map(str::to_owned)),
            }
        };
        let describe_images = if crate::media::sees_images(labels) {
            None
        } else {
            pick(vision_model, crate::media::READ_IMAGE)?
        };
        let transcribe_audio = if crate::media::hears_audio(labels) {
            None
        } else {
            pick(speech_model, crate::media::SPEECH)?
        };
        // A model never stands in for itself.
        let resolved = self.resolve_model_id(model);
        let other =
            |id: Option<String>| id.filter(|id| Some(id.as_str()) != resolved && id != model);
        Ok(MediaRoute {
            describe_images: other(describe_images),
            transcribe_audio: other(transcribe_audio),
        })
    }

    /// The context policy of runs on `model` (`None` when compaction is off or the model is
    /// unknown), from the runtime's settings or `settings`.
    pub fn context_policy(
        &self,
        model: &str,
        settings: Option<&CompactionSettings>,
    ) -> Option<ContextPolicy> {
        let window = self.model(model).ok()?.context().window;
        settings.unwrap_or(&self.inner.compaction).policy(window)
    }

    /// The runtime's compaction settings.
    pub fn compaction(&self) -> &CompactionSettings {
        &self.inner.compaction
    }

    /// The client that writes the run's compaction summaries, when its context policy names a
    /// registered model.
    pub fn summarizer_for(&self, state: &RunState) -> Option<Arc<dyn ModelClient>> {
        let id = state.context.as_ref()?.summary_model.as_deref()?;
        self.model(id).ok()
    }

    pub(crate) fn model(&self, id: &str) -> Result<Arc<dyn ModelClient>, RunError> {
        self.resolve_model_id(id)
            .and_then(|id| self.inner.models.get(id))
            .cloned()
            .ok_or_else(|| RunError::UnknownModel(id.to_owned()))
    }

    /// Turns a request into the initial run state.
    pub fn prepare(&self, request: RunRequest) -> Result<RunState, RunError> {
        let model = match request.model {
            Some(model) => model,
            None => self.inner.default_model.clone().ok_or(RunError::NoModel)?,
        };
        // A model outside the caller's grant is refused before it is looked up (whether it
        // exists is none of the caller's business); the whole run is checked once resolved.
        if let Some(grant) = &request.grant {
            for model in std::iter::once(&model).chain(&request.fallback_models) {
                grant.check_model(model)?;
            }
        }
        self.model(&model)?;
        for fallback in &request.fallback_models {
            self.model(fallback)?;
        }
        let mut messages = Vec::with_capacity(request.history.len() + 2);
        // A conversation keeps the system prompt it started with.
        let has_system = matches!(request.history.first(), Some(Message::System { .. }));
        if let Some(system) = request.system.filter(|_| !has_system) {
            messages.push(Message::system(system));
        }
        messages.extend(request.history);
        let mut input = match request.input {
            Some(Input::Text { text }) => Some(Message::user(text)),
            Some(Input::Content { content }) => Some(Message::User { content }),
            Some(Input::Template {
                template,
                arguments,
            }) => {
                let text = self.inner.templates.render(&template, &arguments)?;
                Some(Message::user(text))
            }
            None => None,
        };
        if let Some(input) = input.as_mut() {
            crate::file_refs::expand_file_refs(
                std::slice::from_mut(input),
                request.workspace.as_deref(),
                crate::file_refs::FileRefLimits::default(),
            )?;
        }
        messages.extend(input);
        if !messages
            .iter()
            .any(|m| !matches!(m, Message::System { .. }))
        {
            return Err(RunError::EmptyInput);
        }
        // Least privilege: a run is offered exactly the tools it names, every tool only when it
        // names `"*"`, and none when it names none.
        let mut tools = match &request.tools {
            Some(names) => self.inner.tools.subset(names)?.specs(),
            None => Vec::new(),
        };
        let mut client_tools = Vec::new();
        for spec in request.client_tools {
            if tools.iter().any(|offered| offered.name == spec.name)
                || client_tools.contains(&spec.name)
            {
                return Err(RunError::ClientTool(format!(
                    "{:?} is the name of another tool of the run",
                    spec.name
                )));
            }
            client_tools.push(spec.name.clone());
            tools.push(spec);
        }
        let limits = request.limits.unwrap_or_else(|| self.inner.limits.clone());
        let mut state = RunState::new(model, messages, tools, request.params, limits);
        state.client_tools = client_tools;
        if let Some(approvals) = request.approvals {
            approvals.validate()?;
            state.approvals = approvals;
        }
        // Tools whose risk the operator wants a person to approve ask unless the run's policy
        // says otherwise.
        let offered: Vec<(String, ToolRisk)> = state
            .tools
            .iter()
            .filter_map(|spec| {
                let tool = self.inner.tools.get(&spec.name)?;
                Some((spec.name.clone(), tool.risk()))
            })
            .collect();
        state.approvals = self.inner.approval_defaults.apply(
            std::mem::take(&mut state.approvals),
            offered.iter().map(|(name, risk)| (name.as_str(), *risk)),
        );
        if let Some(settings) = &request.compaction {
            settings.validate().map_err(RunError::Compaction)?;
        }
        if let Some(check) = self.inner.network_check {
            for policy in &request.network {
                check(policy)?;
            }
        }
        state.context = self.context_policy(&state.model, request.compaction.as_ref());
        if let Some(summary_model) = state
            .context
            .as_ref()
            .and_then(|policy| policy.summary_model.as_deref())
        {
            self.model(summary_model)?;
        }
        state.compaction = request.compacted;
        state.memory = request.memory;
        state.user = request.user;
        state.workspace = request.workspace;
        state.fallback_models = request.fallback_models;
        state.agent_id = request.agent_id;
        state.network = request.network;
        state.media = self.media_route(
            &state.model,
            request.vision_model.as_deref(),
            request.speech_model.as_deref(),
        )?;
        if let Some(grant) = request.grant.filter(|grant| !grant.is_unlimited()) {
            let summary = request
                .compaction
                .as_ref()
                .and_then(|settings| settings.summary_model.as_deref());
            grant.check_run(
                &state,
                [
                    request.vision_model.as_deref(),
                    request.speech_model.as_deref(),
                    summary,
                ]
                .into_iter()
                .flatten(),
            )?;
            grant.check_commands(offered.iter().map(|(name, risk)| {
                (
                    name.as_str(),
                    risk.class == crate::tool::RiskClass::RunsCommands,
                )
            }))?;
            state.grant = Some(grant);
        }
        Ok(state)
    }
}
