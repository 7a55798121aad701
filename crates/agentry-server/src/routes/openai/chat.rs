//! Chat completions (`POST /openai/v1/chat/completions`) and the model list: the wire format,
//! read into an app [`RunSpec`] and rendered back from a run's events or outcome.
//!
//! A chat completion is a run: its `model` names a registered model, or a saved agent as
//! `agent:<id>` (whose own tools then run inside Agentry; only the answer comes back). The
//! request's `messages` are the conversation (system, user, assistant turns with their tool
//! calls, tool results), read as the seed's API reads them
//! ([`conversation_of`]). Stateless by default: nothing is stored. A
//! request may name a session instead (`x-agentry-session-id: new` or a session id, answered in
//! the same header): its run is durable, and only the system prompt and the last user message
//! of `messages` are used — the earlier turns come from the session.
//!
//! Errors come in OpenAI's shape (`{"error": {"message", "type", "param", "code"}}`, see
//! [`OpenAiError`]).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::routes::linglong::request::{SeedConversation, SeedMessage, conversation_of};
use agentry_app::auth::Principal;
use agentry_app::clock::now_ms;
use agentry_app::config::check_name;
use agentry_app::domain::core::RunRequest;
use agentry_app::domain::llm::{GenerationParams, ThinkingConfig};
use agentry_app::ids::parse_session_id;
use agentry_app::outcome::RunOutcome;
use agentry_app::runs::{RunSpec, SessionChoice, Target};
use agentry_app::{App, AppError, Failure};
use agentry_types::{AssistantPart, Message, RunEvent, ToolCall, ToolSpec, Usage};

/// The prefix naming a saved agent as a model.
pub const AGENT_PREFIX: &str = "agent:";

/// An error in OpenAI's shape, with its HTTP status.
#[derive(Debug, Clone)]
pub struct OpenAiError {
    /// The HTTP status.
    pub status: u16,
    /// The body: `{"error": {"message", "type", "param", "code"}}`.
    pub body: Value,
}

impl OpenAiError {
    fn new(
        status: u16,
        kind: &str,
        code: Option<&str>,
        param: Option<&str>,
        message: String,
    ) -> Self {
        Self {
            status,
            body: json!({"error": {"message": message, "type": kind, "param": param, "code": code}}),
        }
    }

    /// `404 model_not_found`.
    pub(crate) fn unknown_model(model: &str) -> Self {
        Self::new(
            404,
            "invalid_request_error",
            Some("model_not_found"),
            Some("model"),
            format!(
                "The model `{model}` does not exist: name a registered model, or a saved agent \
                 as `agent:<id>` (GET /openai/v1/models lists both)"
            ),
        )
    }

    /// An error of `status` and `kind` about `param`.
    pub(crate) fn without_code(
        status: u16,
        kind: &str,
        param: Option<&str>,
        message: String,
    ) -> Self {
        Self::new(status, kind, None, param, message)
    }

    /// A 400 about `param`.
    pub(crate) fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self::new(
            400,
            "invalid_request_error",
            None,
            Some(param),
            message.into(),
        )
    }
}

impl From<AppError> for OpenAiError {
    fn from(error: AppError) -> Self {
        let (status, kind) = match error.failure {
            Failure::Invalid => (400, "invalid_request_error"),
            Failure::Unauthenticated => (401, "authentication_error"),
            Failure::Forbidden => (403, "permission_error"),
            Failure::NotFound => (404, "invalid_request_error"),
            Failure::Conflict => (409, "invalid_request_error"),
            Failure::TooLarge => (413, "invalid_request_error"),
            Failure::TooMany => (429, "rate_limit_error"),
            Failure::Upstream => (502, "api_error"),
            Failure::Unavailable => (503, "api_error"),
            Failure::Timeout => (504, "api_error"),
            Failure::StorageFull => (507, "api_error"),
            Failure::Internal => (500, "api_error"),
        };
        Self::new(status, kind, Some(error.code), None, error.message)
    }
}

/// `stream_options` of a chat completion.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage.
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /openai/v1/chat/completions`. Fields OpenAI defines that Agentry does not use
/// (`logprobs`, `seed`, `metadata`, `store`, …) are accepted and ignored, as OpenAI-compatible
/// servers do.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatCompletionRequest {
    /// A registered model's id, or `agent:<id>`.
    pub model: String,
    /// The conversation.
    pub messages: Vec<Value>,
    /// Stream chunks as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// What the stream adds.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Tools the client runs itself (`{"type": "function", "function": {"name",
    /// "description", "parameters"}}`): when the model calls one, the completion ends with
    /// `finish_reason: "tool_calls"`, and the client's next request, with the results, goes on.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// `none` offers no client tool; any other choice is left to the model.
    #[serde(default)]
    pub tool_choice: Option<Value>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Output bound (older name).
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Output bound.
    #[serde(default)]
    pub max_completion_tokens: Option<u32>,
    /// Stop sequences: a string or a list.
    #[serde(default)]
    pub stop: Option<Value>,
    /// Choices asked for: only 1.
    #[serde(default)]
    pub n: Option<u32>,
    /// Reasoning effort (`low`, `medium`, `high`).
    #[serde(default)]
    pub reasoning_effort: Option<String>,
    /// The end user: a saved agent's memories about them join its prompt.
    #[serde(default)]
    pub user: Option<String>,
}

/// What a request of the OpenAI-compatible API asks to run, read from its own shape.
pub(crate) struct OpenAiRun {
    /// The agent it runs as.
    pub(crate) agent_id: Option<String>,
    /// Or the model it runs on.
    pub(crate) model_id: Option<String>,
    /// The conversation.
    pub(crate) conversation: SeedConversation,
    /// Sampling and limits.
    pub(crate) params: GenerationParams,
    /// The end user.
    pub(crate) user: Option<String>,
    /// Where it runs.
    pub(crate) session: SessionChoice,
    /// The client's tools.
    pub(crate) client_tools: Vec<ToolSpec>,
    /// The `model` as the client named it.
    pub(crate) model: String,
    /// Usage in the stream's last chunk.
    pub(crate) include_usage: bool,
}

/// A checked chat completion, ready to run.
#[derive(Debug)]
pub struct ChatRun {
    /// Where it runs.
    pub target: Target,
    /// The run.
    pub request: RunRequest,
    /// The `model` as the client named it (answered back).
    pub model: String,
    /// Usage goes in the stream's last chunk.
    pub include_usage: bool,
    /// The client's tools, by name.
    pub client_tools: Vec<String>,
}

/// The client's `tools` as tool specs, checked.
pub(crate) fn client_tools(tools: &[Value]) -> Result<Vec<ToolSpec>, OpenAiError> {
    let mut specs = Vec::with_capacity(tools.len());
    for (index, tool) in tools.iter().enumerate() {
        let param = format!("tools[{index}]");
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            return Err(OpenAiError::invalid(
                &param,
                format!("{param}: only `function` tools are supported"),
            ));
        }
        let function = tool.get("function").unwrap_or(&Value::Null);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|name| {
                !name.is_empty()
                    && name.len() <= 64
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
            })
            .ok_or_else(|| {
                OpenAiError::invalid(
                    &param,
                    format!("{param}: `function.name` must be 1 to 64 of a-z A-Z 0-9 _ -"),
                )
            })?;
        let parameters = match function.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
            Some(schema @ Value::Object(_)) => schema.clone(),
            Some(_) => {
                return Err(OpenAiError::invalid(
                    &param,
                    format!("{param}: `function.parameters` must be a JSON Schema object"),
                ));
            }
        };
        let description = function
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default();
        specs.push(ToolSpec::new(name, description, parameters));
    }
    Ok(specs)
}

/// One OpenAI message as the seed's conversation reader takes it (`developer` is `system`).
fn seed_message(index: usize, message: &Value) -> Result<SeedMessage, OpenAiError> {
    let param = format!("messages[{index}]");
    let object = message
        .as_object()
        .ok_or_else(|| OpenAiError::invalid(&param, format!("{param} must be an object")))?;
    let role = object
        .get("role")
        .and_then(Value::as_str)
        .ok_or_else(|| OpenAiError::invalid(&param, format!("{param} needs a `role`")))?;
    let role = if role == "developer" { "system" } else { role };
    let text = |key: &str| object.get(key).and_then(Value::as_str).map(str::to_owned);
    Ok(SeedMessage {
        role: role.to_owned(),
        content: object.get("content").cloned(),
        name: text("name"),
        tool_calls: object.get("tool_calls").and_then(Value::as_array).cloned(),
        tool_call_id: text("tool_call_id"),
        thinking: text("reasoning_content"),
        ..SeedMessage::default()
    })
}

/// The stop sequences of `stop`: a string or a list of strings.
fn stop_sequences(stop: Option<&Value>) -> Result<Vec<String>, OpenAiError> {
    match stop {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(one)) => Ok(vec![one.clone()]),
        Some(Value::Array(many)) if many.len() <= 4 => many
            .iter()
            .map(|item| {
                item.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| OpenAiError::invalid("stop", "`stop` holds strings"))
            })
            .collect(),
        Some(_) => Err(OpenAiError::invalid(
            "stop",
            "`stop` is a string or a list of at most 4 strings",
        )),
    }
}

/// `GET /openai/v1/models`: every registered model, then every saved agent as
/// `agent:<id>`.
pub async fn models(app: &App, caller: &Principal) -> Result<Value, OpenAiError> {
    let mut data = Vec::new();
    for model in app.models().list().await?.models {
        if caller.check_model(&model.id).is_ok() {
            data.push(
                json!({"id": model.id, "object": "model", "created": 0, "owned_by": "agentry"}),
            );
        }
    }
    let mut agents = app.agents().await?;
    agents.sort_by(|a, b| a.id.cmp(&b.id));
    for agent in agents {
        if caller.check_agent(&agent.id).is_ok() {
            data.push(
                json!({"id": format!("{AGENT_PREFIX}{}", agent.id), "object": "model",
                             "created": 0, "owned_by": "agentry"}),
            );
        }
    }
    Ok(json!({"object": "list", "data": data}))
}

/// Prepares a run of the OpenAI-compatible API (chat completions and responses alike).
pub(crate) async fn prepare_run(
    app: &App,
    caller: &Principal,
    run: OpenAiRun,
) -> Result<ChatRun, OpenAiError> {
    let input = RunSpec {
        agent_id: run.agent_id,
        model_id: run.model_id,
        system: run.conversation.system,
        params: Some(run.params),
        user: run.user.filter(|user| check_name("user", user).is_ok()),
        history: run.conversation.history,
        input: run.conversation.input,
        session: run.session,
        client_tools: run.client_tools.clone(),
        ..RunSpec::default()
    };
    let (target, request) = Box::pin(agentry_app::runs::prepare(app, caller, input)).await?;
    Ok(ChatRun {
        target,
        request,
        model: run.model,
        include_usage: run.include_usage,
        client_tools: run.client_tools.into_iter().map(|spec| spec.name).collect(),
    })
}

/// The agent (`agent:<id>`) or the model `model` names; `404 model_not_found` when none.
pub(crate) async fn model_or_agent(
    app: &App,
    model: &str,
) -> Result<(Option<String>, Option<String>), OpenAiError> {
    Ok(match model.strip_prefix(AGENT_PREFIX) {
        Some(agent) => {
            if check_name("agent", agent).is_err() {
                return Err(OpenAiError::unknown_model(model));
            }
            match app.agent(agent).await {
                Ok(_) => (Some(agent.to_owned()), None),
                Err(error) if error.failure == Failure::NotFound => {
                    return Err(OpenAiError::unknown_model(model));
                }
                Err(error) => return Err(error.into()),
            }
        }
        None if app.models().has(model) => (None, Some(model.to_owned())),
        None => return Err(OpenAiError::unknown_model(model)),
    })
}

/// Checks a chat completion for `caller` and prepares its run (`session`: the
/// `x-agentry-session-id` header, `new` or an id).
pub async fn prepare(
    app: &App,
    caller: &Principal,
    body: ChatCompletionRequest,
    session: Option<&str>,
) -> Result<ChatRun, OpenAiError> {
    if body.n.is_some_and(|n| n != 1) {
        return Err(OpenAiError::invalid(
            "n",
            "only one choice (`n: 1`) is supported",
        ));
    }
    let offered = body.tool_choice.as_ref().and_then(Value::as_str) != Some("none");
    let client_tools = match &body.tools {
        Some(tools) if offered => client_tools(tools)?,
        _ => Vec::new(),
    };
    if body.messages.is_empty() {
        return Err(OpenAiError::invalid("messages", "`messages` is empty"));
    }
    let (agent_id, model_id) = model_or_agent(app, &body.model).await?;
    let messages = body
        .messages
        .iter()
        .enumerate()
        .map(|(index, message)| seed_message(index, message))
        .collect::<Result<Vec<_>, _>>()?;
    let choice = match session {
        None => SessionChoice::Ephemeral,
        Some("new") => SessionChoice::New,
        Some(id) => SessionChoice::Existing(parse_session_id(id).map_err(OpenAiError::from)?),
    };
    let stateless = choice == SessionChoice::Ephemeral;
    let messages = if stateless {
        messages
    } else {
        // The session has the earlier turns: its system prompt and the new user message.
        let last_user = messages.iter().rposition(|message| message.role == "user");
        messages
            .into_iter()
            .enumerate()
            .filter(|(index, message)| message.role == "system" || Some(*index) == last_user)
            .map(|(_, message)| message)
            .collect()
    };
    let conversation = conversation_of(&messages, stateless)
        .map_err(|error| OpenAiError::invalid("messages", error.message))?;
    let params = GenerationParams {
        max_tokens: body.max_completion_tokens.or(body.max_tokens),
        temperature: body.temperature,
        top_p: body.top_p,
        stop: stop_sequences(body.stop.as_ref())?,
        thinking: body.reasoning_effort.map(|effort| ThinkingConfig {
            budget_tokens: None,
            effort: Some(effort),
        }),
        ..GenerationParams::default()
    };
    Box::pin(prepare_run(
        app,
        caller,
        OpenAiRun {
            agent_id,
            model_id,
            conversation,
            params,
            user: body.user,
            session: choice,
            client_tools,
            model: body.model,
            include_usage: body
                .stream_options
                .as_ref()
                .is_some_and(|options| options.include_usage),
        },
    ))
    .await
}

/// OpenAI's `finish_reason` for a run that stopped for `reason`.
pub fn finish_reason(reason: &str) -> &'static str {
    match reason {
        "completed" => "stop",
        "tool_calls" => "tool_calls",
        "quota_exceeded" | "budget_exceeded" | "max_rounds" => "length",
        _ => "stop",
    }
}

/// OpenAI's `usage` object.
pub(crate) fn usage_of(usage: &Usage) -> Value {
    json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_input_tokens},
        "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
    })
}

/// A completion's id, from its run's.
fn completion_id(run: Option<agentry_types::RunId>) -> String {
    format!(
        "chatcmpl-{}",
        run.map_or_else(
            || agentry_types::RunId::new().to_string(),
            |id| id.to_string()
        )
    )
}

/// The parts of the last assistant message of `messages` (empty when there is none).
pub(crate) fn last_answer(messages: &[Message]) -> &[AssistantPart] {
    messages
        .iter()
        .rev()
        .find_map(|message| match message {
            Message::Assistant { content } => Some(content.as_slice()),
            _ => None,
        })
        .unwrap_or_default()
}

/// The calls in `content` of the client's tools.
pub(crate) fn client_tool_calls<'a>(
    content: &'a [AssistantPart],
    client_tools: &[String],
) -> Vec<&'a ToolCall> {
    content
        .iter()
        .filter_map(|part| match part {
            AssistantPart::ToolCall(call) if client_tools.contains(&call.name) => Some(call),
            _ => None,
        })
        .collect()
}

/// The readable reasoning of a message's parts.
pub(crate) fn reasoning_of(content: &[AssistantPart]) -> String {
    content
        .iter()
        .filter_map(|part| match part {
            AssistantPart::Thinking(agentry_types::Thinking::Text { text, .. }) => {
                Some(text.as_str())
            }
            _ => None,
        })
        .collect()
}

/// The calls of `content` to the client's tools, as OpenAI's `tool_calls`.
fn client_calls(content: &[AssistantPart], client_tools: &[String]) -> Vec<Value> {
    client_tool_calls(content, client_tools)
        .into_iter()
        .enumerate()
        .map(|(index, call): (usize, &ToolCall)| {
            json!({"index": index, "id": call.id, "type": "function",
                   "function": {"name": call.name, "arguments": call.arguments.to_string()}})
        })
        .collect()
}

/// The `chat.completion` answering a run that ended as `outcome` (its calls of
/// `client_tools` as `tool_calls`); an error in OpenAI's shape when it failed.
pub fn chat_completion(
    model: &str,
    outcome: &RunOutcome,
    client_tools: &[String],
) -> Result<Value, OpenAiError> {
    if let Some(error) = &outcome.error {
        return Err(OpenAiError::new(
            502,
            "api_error",
            Some(error.code.as_str()),
            None,
            error.message.clone(),
        ));
    }
    if outcome.status.is_some() {
        return Err(OpenAiError::new(
            409,
            "invalid_request_error",
            Some("approval_required"),
            None,
            format!(
                "the run stopped for a person ({}): decide it with POST /v1/runs/{}/approvals",
                outcome.stop_reason,
                outcome.run_id.map(|id| id.to_string()).unwrap_or_default()
            ),
        ));
    }
    let last = last_answer(&outcome.messages);
    let reasoning = reasoning_of(last);
    let mut message = json!({"role": "assistant", "content": outcome.text, "refusal": null});
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    if outcome.stop_reason == "tool_calls" {
        let calls: Vec<Value> = client_calls(last, client_tools)
            .into_iter()
            .map(|mut call| {
                if let Some(object) = call.as_object_mut() {
                    object.remove("index");
                }
                call
            })
            .collect();
        message["tool_calls"] = Value::Array(calls);
        if outcome.text.is_empty() {
            message["content"] = Value::Null;
        }
    }
    Ok(json!({
        "id": completion_id(outcome.run_id),
        "object": "chat.completion",
        "created": now_ms() / 1000,
        "model": model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": finish_reason(&outcome.stop_reason),
            "logprobs": null,
        }],
        "usage": usage_of(&outcome.usage),
    }))
}

/// Turns a run's events into `chat.completion.chunk`s: a first chunk with the role, one per
/// text or reasoning fragment, then the finish (and the usage, when asked for). Tool calls the
/// run makes inside Agentry do not show: only the answer does.
#[derive(Debug)]
pub struct ChunkMapper {
    id: String,
    model: String,
    created: u64,
    include_usage: bool,
    client_tools: Vec<String>,
    started: bool,
    /// The last complete assistant message's parts (its tool calls, at the end).
    last: Vec<AssistantPart>,
    /// The run reached its end (finished, failed or stopped for a person).
    pub done: bool,
}

impl ChunkMapper {
    /// A mapper for the completion answered as `model`, whose client runs `client_tools`.
    pub fn new(model: &str, include_usage: bool, client_tools: Vec<String>) -> Self {
        Self {
            id: completion_id(None),
            model: model.to_owned(),
            created: now_ms() / 1000,
            include_usage,
            client_tools,
            started: false,
            last: Vec::new(),
            done: false,
        }
    }

    fn chunk(&self, delta: Value, finish: Option<&str>) -> Value {
        json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
        })
    }

    /// The chunks `event` makes (each one `data:` line's JSON).
    pub fn map(&mut self, event: &RunEvent) -> Vec<Value> {
        let mut out = Vec::new();
        let open = |this: &mut Self, out: &mut Vec<Value>| {
            if !this.started {
                this.started = true;
                out.push(this.chunk(json!({"role": "assistant", "content": ""}), None));
            }
        };
        match event {
            RunEvent::RunStarted { run_id } => {
                self.id = completion_id(Some(*run_id));
                open(self, &mut out);
            }
            RunEvent::TextDelta { text } => {
                open(self, &mut out);
                out.push(self.chunk(json!({"content": text}), None));
            }
            RunEvent::ThinkingDelta { text } => {
                open(self, &mut out);
                out.push(self.chunk(json!({"reasoning_content": text}), None));
            }
            RunEvent::AssistantMessage { content, .. } => {
                self.last.clone_from(content);
            }
            RunEvent::RunFinished {
                stop_reason, usage, ..
            } => {
                open(self, &mut out);
                if *stop_reason == agentry_types::RunStopReason::ToolCalls {
                    let calls = client_calls(&self.last, &self.client_tools);
                    out.push(self.chunk(json!({"tool_calls": calls}), None));
                }
                out.push(self.chunk(json!({}), Some(finish_reason(stop_reason.as_str()))));
                self.finish(usage, &mut out);
            }
            RunEvent::RunSuspended { usage, .. } => {
                open(self, &mut out);
                out.push(self.chunk(json!({}), Some("stop")));
                self.finish(usage, &mut out);
            }
            RunEvent::RunFailed { error, .. } => {
                self.done = true;
                out.push(
                    json!({"error": {"message": error.message, "type": "api_error",
                                          "param": null, "code": error.code}}),
                );
            }
            _ => {}
        }
        out
    }

    fn finish(&mut self, usage: &Usage, out: &mut Vec<Value>) {
        self.done = true;
        if self.include_usage {
            out.push(json!({
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage_of(usage),
            }));
        }
    }
}
