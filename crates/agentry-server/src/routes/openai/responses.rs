//! OpenAI's Responses API served by Agentry (`/openai/v1/responses`): a response is a run.
//!
//! Stored by default (`store` absent or `true`): the run is durable in a session, its response
//! id is `resp_<run id>`, and `previous_response_id` continues the session behind that response
//! (only the new input is read; the conversation comes from the session) — after a restart too,
//! since everything is in the log. `GET /responses/{id}` rebuilds a stored response from the
//! log; a new stored response may also bring the whole earlier conversation in `input` (it
//! starts its session). `store: false` runs statelessly and keeps nothing: the whole
//! conversation comes in `input`. Either way function tools the client declares work as in chat
//! completions: a call ends the response with a `function_call` item, and the next request
//! brings its `function_call_output` (with the whole input, or after `previous_response_id`).
//! `input` is a string or a list of items: messages (`role` with text, `input_text`,
//! `output_text`, `input_image` parts), `function_call`, `function_call_output`, and `reasoning`
//! items sent back as they came (skipped: reasoning is not replayed to the model).

use serde::Deserialize;
use serde_json::{Value, json};

use crate::routes::linglong::request::{SeedConversation, SeedMessage, conversation_of};
use agentry_app::App;
use agentry_app::auth::Principal;
use agentry_app::clock::now_ms;
use agentry_app::domain::llm::{GenerationParams, ThinkingConfig};
use agentry_app::outcome::RunOutcome;
use agentry_app::runs::{SessionChoice, Target};
use agentry_types::{AssistantPart, Message, RunId, SessionEvent, ToolCall, ToolSpec, Usage};

use super::chat::{
    ChatRun, OpenAiError, OpenAiRun, client_tool_calls, last_answer, model_or_agent, prepare_run,
    reasoning_of,
};

/// The prefix of a response id (then the run's id).
pub const RESPONSE_PREFIX: &str = "resp_";

/// `POST /openai/v1/responses`. Other fields OpenAI defines are accepted and ignored.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponsesRequest {
    /// A registered model's id, or `agent:<id>`.
    pub model: String,
    /// A string, or a list of input items.
    #[serde(default)]
    pub input: Option<Value>,
    /// The system prompt (a new conversation's).
    #[serde(default)]
    pub instructions: Option<String>,
    /// The stored response this one continues.
    #[serde(default)]
    pub previous_response_id: Option<String>,
    /// Keep the response (default: yes).
    #[serde(default)]
    pub store: Option<bool>,
    /// Stream the response's events.
    #[serde(default)]
    pub stream: bool,
    /// Function tools the client runs (`{"type": "function", "name", "description",
    /// "parameters"}`), with `store: false`.
    #[serde(default)]
    pub tools: Option<Vec<Value>>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Output bound.
    #[serde(default)]
    pub max_output_tokens: Option<u32>,
    /// `{"effort": "low" | "medium" | "high"}`.
    #[serde(default)]
    pub reasoning: Option<Value>,
    /// The end user.
    #[serde(default)]
    pub user: Option<String>,
}

/// A message's content in the chat-completions shape the conversation reader takes.
fn chat_content(content: &Value) -> Result<Value, String> {
    match content {
        Value::String(_) | Value::Null => Ok(content.clone()),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("type").and_then(Value::as_str) {
                Some("input_text" | "output_text" | "text") => Ok(json!({
                    "type": "text",
                    "text": part.get("text").and_then(Value::as_str).unwrap_or_default(),
                })),
                Some("input_image") => {
                    let url = part
                        .get("image_url")
                        .and_then(Value::as_str)
                        .ok_or("an input_image needs an `image_url`")?;
                    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
                }
                other => Err(format!("unknown content part type {other:?}")),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        _ => Err("content is a string or a list of parts".into()),
    }
}

/// `input` as the conversation reader's messages.
fn input_messages(input: Option<&Value>) -> Result<Vec<SeedMessage>, OpenAiError> {
    let invalid = |message: String| OpenAiError::invalid("input", message);
    let items = match input {
        None | Some(Value::Null) => return Err(invalid("`input` is missing".into())),
        Some(Value::String(text)) => {
            return Ok(vec![SeedMessage {
                role: "user".into(),
                content: Some(Value::String(text.clone())),
                ..SeedMessage::default()
            }]);
        }
        Some(Value::Array(items)) => items,
        Some(_) => return Err(invalid("`input` is a string or a list of items".into())),
    };
    let mut messages: Vec<SeedMessage> = Vec::new();
    for (index, item) in items.iter().enumerate() {
        let at = |problem: &str| invalid(format!("input[{index}]: {problem}"));
        let kind = item
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("message");
        match kind {
            "message" => {
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .ok_or_else(|| at("a message needs a `role`"))?;
                let role = if role == "developer" { "system" } else { role };
                let content = chat_content(item.get("content").unwrap_or(&Value::Null))
                    .map_err(|problem| at(&problem))?;
                messages.push(SeedMessage {
                    role: role.into(),
                    content: Some(content),
                    ..SeedMessage::default()
                });
            }
            "function_call" => {
                let call = json!({
                    "id": item.get("call_id").cloned().unwrap_or(Value::Null),
                    "function": {
                        "name": item.get("name").cloned().unwrap_or(Value::Null),
                        "arguments": item.get("arguments").cloned().unwrap_or(Value::Null),
                    },
                });
                // Calls of one turn are one assistant message.
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" => {
                        last.tool_calls.get_or_insert_with(Vec::new).push(call);
                    }
                    _ => messages.push(SeedMessage {
                        role: "assistant".into(),
                        tool_calls: Some(vec![call]),
                        ..SeedMessage::default()
                    }),
                }
            }
            "function_call_output" => {
                let output = match item.get("output") {
                    Some(Value::String(text)) => Value::String(text.clone()),
                    Some(other) => Value::String(other.to_string()),
                    None => return Err(at("a function_call_output needs an `output`")),
                };
                messages.push(SeedMessage {
                    role: "tool".into(),
                    content: Some(output),
                    tool_call_id: item
                        .get("call_id")
                        .and_then(Value::as_str)
                        .map(str::to_owned),
                    ..SeedMessage::default()
                });
            }
            // A reasoning item from an earlier response (`to_input_list()` sends them back):
            // the model's reasoning is not replayed to it, so there is nothing to take.
            "reasoning" => {}
            other => return Err(at(&format!("unknown item type {other:?}"))),
        }
    }
    Ok(messages)
}

/// `input` read as a whole conversation (earlier turns, then the new message or tool results).
fn whole_conversation(messages: &[SeedMessage]) -> Result<SeedConversation, OpenAiError> {
    conversation_of(messages, true).map_err(|error| OpenAiError::invalid("input", error.message))
}

/// The `function_call_output` items continuing a stored response, as tool results answering
/// the calls it ended on.
fn tool_results(outputs: Vec<SeedMessage>) -> Result<Vec<Message>, OpenAiError> {
    outputs
        .into_iter()
        .map(|output| {
            let call_id = output.tool_call_id.ok_or_else(|| {
                OpenAiError::invalid("input", "a function_call_output needs its `call_id`")
            })?;
            let text = match output.content {
                Some(Value::String(text)) => text,
                Some(other) => other.to_string(),
                None => String::new(),
            };
            Ok(Message::Tool(agentry_types::ToolResult::text(
                call_id, text,
            )))
        })
        .collect()
}

/// The client's function tools (the Responses API's flat shape) in chat completions' shape.
fn chat_tools(tools: &[Value]) -> Vec<Value> {
    tools
        .iter()
        .map(|tool| {
            json!({"type": tool.get("type").cloned().unwrap_or(Value::Null), "function": {
                "name": tool.get("name").cloned().unwrap_or(Value::Null),
                "description": tool.get("description").cloned().unwrap_or(Value::Null),
                "parameters": tool.get("parameters").cloned().unwrap_or(Value::Null),
            }})
        })
        .collect()
}

/// A response id's run.
pub fn run_of_response(id: &str) -> Result<RunId, OpenAiError> {
    id.strip_prefix(RESPONSE_PREFIX)
        .and_then(|run| RunId::parse(run).ok())
        .ok_or_else(|| {
            OpenAiError::without_code(
                404,
                "invalid_request_error",
                None,
                format!("no response {id:?}"),
            )
        })
}

/// Checks a Responses request for `caller` and prepares its run.
pub async fn prepare(
    app: &App,
    caller: &Principal,
    body: ResponsesRequest,
) -> Result<ChatRun, OpenAiError> {
    let store = body.store.unwrap_or(true);
    let (agent_id, model_id) = model_or_agent(app, &body.model).await?;
    let mut messages = input_messages(body.input.as_ref())?;
    if let Some(instructions) = &body.instructions {
        messages.insert(
            0,
            SeedMessage {
                role: "system".into(),
                content: Some(Value::String(instructions.clone())),
                ..SeedMessage::default()
            },
        );
    }
    let tools = body.tools.unwrap_or_default();
    let client_tools: Vec<ToolSpec> = super::chat::client_tools(&chat_tools(&tools))?;
    let (choice, conversation) = match (&body.previous_response_id, store) {
        (Some(_), false) => {
            return Err(OpenAiError::invalid(
                "previous_response_id",
                "`store: false` keeps nothing: send the whole conversation in `input` \
                 instead of `previous_response_id`",
            ));
        }
        (Some(previous), true) => {
            let run = run_of_response(previous)?;
            let no_such = || {
                OpenAiError::without_code(
                    404,
                    "invalid_request_error",
                    Some("previous_response_id"),
                    format!("no response {previous:?}"),
                )
            };
            let session = app.locate(run).await.map_err(|_| no_such())?;
            app.check_session_access(caller, session)
                .await
                .map_err(|_| no_such())?;
            // The session has the conversation; the input brings the new message and the
            // results of the client's tools the previous response called.
            let (results, rest): (Vec<SeedMessage>, Vec<SeedMessage>) = messages
                .into_iter()
                .partition(|message| message.role == "tool");
            let mut conversation = conversation_of(&rest, false)
                .map_err(|error| OpenAiError::invalid("input", error.message))?;
            conversation.history = tool_results(results)?;
            (SessionChoice::Existing(session), conversation)
        }
        // A new stored response may bring earlier turns (clients that send the whole
        // conversation each time): they start its session.
        (None, true) => (SessionChoice::New, self::whole_conversation(&messages)?),
        (None, false) => (
            SessionChoice::Ephemeral,
            self::whole_conversation(&messages)?,
        ),
    };
    let params = GenerationParams {
        max_tokens: body.max_output_tokens,
        temperature: body.temperature,
        top_p: body.top_p,
        thinking: body
            .reasoning
            .as_ref()
            .and_then(|reasoning| reasoning.get("effort"))
            .and_then(Value::as_str)
            .map(|effort| ThinkingConfig {
                budget_tokens: None,
                effort: Some(effort.to_owned()),
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
            include_usage: true,
        },
    ))
    .await
}

/// A stored response, rebuilt from its session's log.
pub async fn stored(app: &App, caller: &Principal, id: &str) -> Result<Value, OpenAiError> {
    let run = run_of_response(id)?;
    let not_found = || {
        OpenAiError::without_code(
            404,
            "invalid_request_error",
            None,
            format!("no response {id:?}"),
        )
    };
    let session = app.locate(run).await.map_err(|_| not_found())?;
    app.check_session_access(caller, session)
        .await
        .map_err(|_| not_found())?;
    let events = Box::pin(app.sessions().events(session, 0)).await?.events;
    let mut model = String::new();
    let mut content: Vec<AssistantPart> = Vec::new();
    let mut finished = None;
    let mut created_at = 0;
    let mut previous = None;
    let mut last_run = None;
    for stored in events {
        let event = stored.event;
        if let SessionEvent::RunStarted { run_id, .. } = &event
            && *run_id != run
        {
            last_run = Some(*run_id);
        }
        if event.run_id() != run {
            continue;
        }
        match event {
            SessionEvent::RunStarted { model: used, .. } => {
                model = used;
                created_at = stored.at / 1000;
                previous = last_run;
            }
            SessionEvent::AssistantMessage { content: parts, .. } => content = parts,
            SessionEvent::RunFinished {
                stop_reason,
                usage,
                error,
                ..
            } => finished = Some((stop_reason, usage, error)),
            _ => {}
        }
    }
    let text = Message::Assistant {
        content: content.clone(),
    }
    .answer_text()
    .unwrap_or_default();
    let reasoning = reasoning_of(&content);
    let (status, usage, error) = match finished {
        Some((_, usage, Some(error))) => ("failed", usage, Some(error)),
        Some((_, usage, None)) => ("completed", usage, None),
        None => ("in_progress", Usage::default(), None),
    };
    Ok(response_object(&ResponseParts {
        id: id.to_owned(),
        model,
        created_at,
        status,
        text: &text,
        reasoning: &reasoning,
        calls: &[],
        usage: &usage,
        previous: previous.map(|run| format!("{RESPONSE_PREFIX}{run}")),
        store: true,
        error: error.map(|error| json!({"code": error.code, "message": error.message})),
    }))
}

/// What a response object is made of.
pub struct ResponseParts<'a> {
    /// `resp_<run id>`.
    pub id: String,
    /// The model as named.
    pub model: String,
    /// Unix seconds.
    pub created_at: u64,
    /// `completed`, `in_progress` or `failed`.
    pub status: &'a str,
    /// The answer.
    pub text: &'a str,
    /// Readable reasoning.
    pub reasoning: &'a str,
    /// The client tools called: `(call id, name, arguments as JSON text)`.
    pub calls: &'a [&'a ToolCall],
    /// Tokens.
    pub usage: &'a Usage,
    /// The response continued.
    pub previous: Option<String>,
    /// Whether it is kept.
    pub store: bool,
    /// The error of a failed one.
    pub error: Option<Value>,
}

/// A `response` object.
pub fn response_object(parts: &ResponseParts<'_>) -> Value {
    let mut output = Vec::new();
    if !parts.reasoning.is_empty() {
        output.push(reasoning_item(&parts.id, Some(parts.reasoning)));
    }
    if !parts.text.is_empty() || parts.calls.is_empty() {
        output.push(message_item(&parts.id, parts.text, "completed"));
    }
    for call in parts.calls {
        output.push(call_item(call, &call.arguments.to_string(), "completed"));
    }
    json!({
        "id": parts.id,
        "object": "response",
        "created_at": parts.created_at,
        "status": parts.status,
        "model": parts.model,
        "output": output,
        "output_text": parts.text,
        "previous_response_id": parts.previous,
        "store": parts.store,
        "error": parts.error,
        "incomplete_details": null,
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "usage": {
            "input_tokens": parts.usage.input_tokens,
            "input_tokens_details": {"cached_tokens": parts.usage.cached_input_tokens},
            "output_tokens": parts.usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": parts.usage.reasoning_tokens},
            "total_tokens": parts.usage.input_tokens + parts.usage.output_tokens,
        },
    })
}

/// The assistant message item of response `id`.
pub fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": format!("msg_{id}"), "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// The response a finished run makes.
pub fn response_of(
    run: &ChatRun,
    outcome: &RunOutcome,
    previous: Option<String>,
) -> Result<Value, OpenAiError> {
    if let Some(error) = &outcome.error {
        return Err(OpenAiError::without_code(
            502,
            "api_error",
            None,
            error.message.clone(),
        ));
    }
    let content = last_answer(&outcome.messages);
    let calls = if outcome.stop_reason == "tool_calls" {
        client_tool_calls(content, &run.client_tools)
    } else {
        Vec::new()
    };
    let id = match (outcome.session_id, outcome.run_id) {
        (Some(_), Some(run)) => format!("{RESPONSE_PREFIX}{run}"),
        (_, run) => format!(
            "{RESPONSE_PREFIX}{}",
            run.map_or_else(|| RunId::new().to_string(), |id| id.to_string())
        ),
    };
    Ok(response_object(&ResponseParts {
        id,
        model: run.model.clone(),
        created_at: now_ms() / 1000,
        status: "completed",
        text: &outcome.text,
        reasoning: &reasoning_of(content),
        calls: &calls,
        usage: &outcome.usage,
        previous,
        store: outcome.session_id.is_some(),
        error: None,
    }))
}

/// The reasoning item of response `id`.
fn reasoning_item(id: &str, text: Option<&str>) -> Value {
    let summary = match text {
        Some(text) => json!([{"type": "summary_text", "text": text}]),
        None => json!([]),
    };
    json!({"type": "reasoning", "id": format!("rs_{id}"), "summary": summary})
}

/// The item of a call to one of the client's tools.
fn call_item(call: &ToolCall, arguments: &str, status: &str) -> Value {
    json!({"type": "function_call", "id": format!("fc_{}", call.id), "call_id": call.id,
           "name": call.name, "arguments": arguments, "status": status})
}

/// An output item of a streamed response, in the order it was opened.
#[derive(Debug, Clone, PartialEq)]
enum Item {
    /// The model's readable reasoning.
    Reasoning,
    /// The answer.
    Message,
    /// A call to one of the client's tools (its call id).
    Call(String),
}

/// Turns a run's events into the Responses API's stream events, as OpenAI's own stream and the
/// official SDKs' stream helpers (`responses.stream()`) expect them: `response.created` (no
/// output yet) and `response.in_progress`; then each output item at its own `output_index`,
/// opened with `response.output_item.added` and closed with `response.output_item.done` — the
/// reasoning (`response.reasoning_summary_text.delta`), the message
/// (`response.output_text.delta` per fragment) and each call of a client tool
/// (`response.function_call_arguments.delta`/`.done`); then `response.completed` whose
/// `output` holds the same items at the same indexes (or `response.failed`).
#[derive(Debug)]
pub struct ResponseEvents {
    id: String,
    model: String,
    previous: Option<String>,
    store: bool,
    client_tools: Vec<String>,
    created_at: u64,
    sequence: u64,
    text: String,
    reasoning: String,
    last: Vec<AssistantPart>,
    started: bool,
    /// The items opened so far; an item's position is its `output_index`.
    items: Vec<Item>,
    /// Whether the reasoning item is open (taking deltas).
    reasoning_open: bool,
    /// The run reached its end.
    pub done: bool,
}

impl ResponseEvents {
    /// The stream of `run`'s response (`previous`: the response it continues).
    pub fn new(run: &ChatRun, previous: Option<String>) -> Self {
        Self {
            id: format!("{RESPONSE_PREFIX}{}", RunId::new()),
            model: run.model.clone(),
            previous,
            store: matches!(run.target, Target::Session(_)),
            client_tools: run.client_tools.clone(),
            created_at: now_ms() / 1000,
            sequence: 0,
            text: String::new(),
            reasoning: String::new(),
            last: Vec::new(),
            started: false,
            items: Vec::new(),
            reasoning_open: false,
            done: false,
        }
    }

    fn event(&mut self, kind: &str, mut data: Value) -> (String, Value) {
        if let Some(object) = data.as_object_mut() {
            object.insert("type".into(), Value::String(kind.to_owned()));
            object.insert("sequence_number".into(), json!(self.sequence));
        }
        self.sequence += 1;
        (kind.to_owned(), data)
    }

    fn calls(&self) -> Vec<&ToolCall> {
        client_tool_calls(&self.last, &self.client_tools)
    }

    /// The final form of each item opened, at its index.
    fn output(&self) -> Vec<Value> {
        let calls = self.calls();
        self.items
            .iter()
            .map(|item| match item {
                Item::Reasoning => reasoning_item(&self.id, Some(&self.reasoning)),
                Item::Message => message_item(&self.id, &self.text, "completed"),
                Item::Call(call_id) => calls
                    .iter()
                    .find(|call| &call.id == call_id)
                    .map_or(Value::Null, |call| {
                        call_item(call, &call.arguments.to_string(), "completed")
                    }),
            })
            .collect()
    }

    fn whole(&self, status: &str, usage: &Usage, error: Option<Value>) -> Value {
        let mut response = response_object(&ResponseParts {
            id: self.id.clone(),
            model: self.model.clone(),
            created_at: self.created_at,
            status,
            text: &self.text,
            reasoning: &self.reasoning,
            calls: &[],
            usage,
            previous: self.previous.clone(),
            store: self.store,
            error,
        });
        response["output"] = Value::Array(if status == "in_progress" {
            Vec::new()
        } else {
            self.output()
        });
        response
    }

    fn start(&mut self, out: &mut Vec<(String, Value)>) {
        if self.started {
            return;
        }
        self.started = true;
        let created = self.whole("in_progress", &Usage::default(), None);
        out.push(self.event("response.created", json!({"response": created})));
        out.push(self.event("response.in_progress", json!({"response": created})));
    }

    /// Opens the next output item; its index.
    fn open_item(&mut self, item: Item, added: Value, out: &mut Vec<(String, Value)>) -> usize {
        let index = self.items.len();
        self.items.push(item);
        out.push(self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        ));
        index
    }

    fn index_of(&self, item: &Item) -> Option<usize> {
        self.items.iter().position(|opened| opened == item)
    }

    fn open_reasoning(&mut self, out: &mut Vec<(String, Value)>) -> usize {
        let added = reasoning_item(&self.id, None);
        let index = self.open_item(Item::Reasoning, added, out);
        self.reasoning_open = true;
        let item_id = format!("rs_{}", self.id);
        out.push(self.event(
            "response.reasoning_summary_part.added",
            json!({"item_id": item_id, "output_index": index, "summary_index": 0,
                   "part": {"type": "summary_text", "text": ""}}),
        ));
        index
    }

    fn close_reasoning(&mut self, out: &mut Vec<(String, Value)>) {
        let Some(index) = self
            .index_of(&Item::Reasoning)
            .filter(|_| self.reasoning_open)
        else {
            return;
        };
        self.reasoning_open = false;
        let item_id = format!("rs_{}", self.id);
        let text = self.reasoning.clone();
        out.push(self.event(
            "response.reasoning_summary_text.done",
            json!({"item_id": item_id, "output_index": index, "summary_index": 0,
                   "text": text}),
        ));
        out.push(self.event(
            "response.reasoning_summary_part.done",
            json!({"item_id": item_id, "output_index": index, "summary_index": 0,
                   "part": {"type": "summary_text", "text": text}}),
        ));
        let item = reasoning_item(&self.id, Some(&text));
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }

    fn open_message(&mut self, out: &mut Vec<(String, Value)>) -> usize {
        if let Some(index) = self.index_of(&Item::Message) {
            return index;
        }
        self.close_reasoning(out);
        let added = json!({"type": "message", "id": format!("msg_{}", self.id),
            "status": "in_progress", "role": "assistant", "content": []});
        let index = self.open_item(Item::Message, added, out);
        let item_id = format!("msg_{}", self.id);
        out.push(self.event(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}}),
        ));
        index
    }

    fn close_message(&mut self, index: usize, out: &mut Vec<(String, Value)>) {
        let item_id = format!("msg_{}", self.id);
        let text = self.text.clone();
        out.push(self.event(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                   "text": text}),
        ));
        out.push(self.event(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0,
                   "part": {"type": "output_text", "text": text, "annotations": []}}),
        ));
        let item = message_item(&self.id, &text, "completed");
        out.push(self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        ));
    }

    /// Closes every item at the run's end, opening first what the deltas never did (a
    /// reasoning or an answer that came whole, the client's calls).
    fn finish_items(&mut self, out: &mut Vec<(String, Value)>) {
        self.close_reasoning(out);
        if !self.reasoning.is_empty() && self.index_of(&Item::Reasoning).is_none() {
            self.open_reasoning(out);
            self.close_reasoning(out);
        }
        let calls: Vec<ToolCall> = self.calls().into_iter().cloned().collect();
        let opened = self.index_of(&Item::Message);
        if opened.is_some() || !self.text.is_empty() || calls.is_empty() {
            let index = self.open_message(out);
            self.close_message(index, out);
        }
        for call in calls {
            let index = self.open_item(
                Item::Call(call.id.clone()),
                call_item(&call, "", "in_progress"),
                out,
            );
            let item_id = format!("fc_{}", call.id);
            let arguments = call.arguments.to_string();
            out.push(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": index, "delta": arguments}),
            ));
            out.push(self.event(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": index, "arguments": arguments}),
            ));
            let item = call_item(&call, &arguments, "completed");
            out.push(self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            ));
        }
    }

    /// The stream events `event` makes: `(name, data)`.
    pub fn map(&mut self, event: &agentry_types::RunEvent) -> Vec<(String, Value)> {
        use agentry_types::RunEvent;
        let mut out = Vec::new();
        match event {
            RunEvent::RunStarted { run_id } => {
                self.id = format!("{RESPONSE_PREFIX}{run_id}");
                self.start(&mut out);
            }
            RunEvent::ThinkingDelta { text } => {
                self.start(&mut out);
                self.reasoning.push_str(text);
                // Reasoning streams while no answer has begun; later rounds' reasoning joins
                // the item's final text.
                if self.index_of(&Item::Message).is_none() {
                    let index = match self.index_of(&Item::Reasoning) {
                        Some(index) if self.reasoning_open => Some(index),
                        Some(_) => None,
                        None => Some(self.open_reasoning(&mut out)),
                    };
                    if let Some(index) = index {
                        let item_id = format!("rs_{}", self.id);
                        out.push(self.event(
                            "response.reasoning_summary_text.delta",
                            json!({"item_id": item_id, "output_index": index,
                                   "summary_index": 0, "delta": text}),
                        ));
                    }
                }
            }
            RunEvent::TextDelta { text } => {
                self.start(&mut out);
                let index = self.open_message(&mut out);
                self.text.push_str(text);
                let item_id = format!("msg_{}", self.id);
                out.push(self.event(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": index, "content_index": 0,
                           "delta": text}),
                ));
            }
            RunEvent::AssistantMessage { content, .. } => {
                self.last.clone_from(content);
                // The answer is the last round's text (earlier rounds' go with their calls).
                self.text = Message::Assistant {
                    content: content.clone(),
                }
                .answer_text()
                .unwrap_or_default();
                let reasoning = reasoning_of(content);
                if self.reasoning.is_empty() && !reasoning.is_empty() {
                    self.reasoning = reasoning;
                }
            }
            RunEvent::RunFinished { usage, .. } | RunEvent::RunSuspended { usage, .. } => {
                self.start(&mut out);
                self.done = true;
                self.finish_items(&mut out);
                let whole = self.whole("completed", usage, None);
                out.push(self.event("response.completed", json!({"response": whole})));
            }
            RunEvent::RunFailed { error, .. } => {
                self.start(&mut out);
                self.done = true;
                let whole = self.whole(
                    "failed",
                    &Usage::default(),
                    Some(json!({"code": error.code, "message": error.message})),
                );
                out.push(self.event("response.failed", json!({"response": whole})));
            }
            _ => {}
        }
        out
    }
}
