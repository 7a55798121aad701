//! The seed's inference request (`POST /v1/infer` and `/v1/infer/stream` of its README) and
//! how it becomes one of Agentry's runs.
//!
//! A stateless request carries the whole conversation in `messages`: system, user, assistant
//! turns with their tool calls, and tool results. They become the run's history; a last user
//! message is its new input (a conversation that ends with tool results lets the model answer
//! them). Tool results name their call by `tool_call_id` / `tool_use_id`, or, as the seed's
//! first clients did, only by the tool's `name`: such a result answers the earliest call of
//! that name still unanswered. In a session (`session_id`: `"new"` or an id) the conversation
//! comes from the session's log, so a request adds a system prompt and one user message at
//! most; `continue: true` with no message lets the session's interrupted run go on.

use serde::Deserialize;
use serde_json::Value;

use agentry_app::domain::core::Input;
use agentry_types::{AssistantPart, ContentPart, Message, Thinking, ToolCall, ToolResult};

use agentry_app::AppError;

/// The default of `max_tool_rounds`, as the seed's README version has it.
pub const DEFAULT_MAX_TOOL_ROUNDS: u32 = 20;

/// The seed's inference request.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedInferRequest {
    /// The model (required unless an agent is named).
    #[serde(default)]
    pub model_id: Option<String>,
    /// The tools offered, by id.
    #[serde(default)]
    pub tool_ids: Vec<String>,
    /// The conversation (stateless), or the new messages (in a session).
    #[serde(default)]
    pub messages: Vec<SeedMessage>,
    /// Shorthand for one user message.
    #[serde(default)]
    pub text: Option<String>,
    /// `"new"`, a session id, or absent (stateless).
    #[serde(default)]
    pub session_id: Option<String>,
    /// Tool rounds allowed (default 20).
    #[serde(default)]
    pub max_tool_rounds: Option<u32>,
    /// Accepted as the seed does: the endpoint decides whether the answer streams.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Let an interrupted session run go on (`session_id` names it, no new message).
    #[serde(default, rename = "continue")]
    pub continue_run: bool,
    /// Run as this saved agent (one id), or a group chat of these agents (several).
    #[serde(default)]
    pub agent_ids: Vec<String>,
    /// A working folder on the server; refused (runs use their session's workspace).
    #[serde(default)]
    pub workspace: Option<String>,
    /// An inline model configuration; refused (register the model first).
    #[serde(default)]
    pub model: Option<Value>,
}

/// One message of the seed's conversation (also the shape of the turns it answers with, so a
/// client may send an answer back as history).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SeedMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text (or, for a user, a list of `text` / `image_url` parts).
    #[serde(default)]
    pub content: Option<Value>,
    /// A tool result's tool name.
    #[serde(default)]
    pub name: Option<String>,
    /// An assistant turn's tool calls: `{id?, name, arguments}` (arguments as JSON text or an
    /// object), or OpenAI's `{id, type, function: {name, arguments}}`.
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// Images: `data:` URLs or `http(s)` URLs.
    #[serde(default)]
    pub images: Option<Vec<String>>,
    /// Audio: base64 (WAV), or a `data:audio/<format>;base64,` URL.
    #[serde(default)]
    pub audio: Option<String>,
    /// An assistant turn's reasoning.
    #[serde(default)]
    pub thinking: Option<String>,
    /// A prompt template to render as this (user) message.
    #[serde(default)]
    pub prompt_template: Option<String>,
    /// The template's arguments.
    #[serde(default)]
    pub arguments: Option<serde_json::Map<String, Value>>,
    /// The call a tool result answers (OpenAI's name).
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// The call a tool result answers (the seed's name).
    #[serde(default)]
    pub tool_use_id: Option<String>,
    /// Shown in the seed's turns; ignored.
    #[serde(default)]
    pub timestamp: Option<Value>,
    /// Shown in the seed's turns; ignored.
    #[serde(default)]
    pub stat: Option<Value>,
    /// Shown in the seed's turns; ignored.
    #[serde(default)]
    pub tool_id: Option<Value>,
    /// Shown in the seed's turns; ignored.
    #[serde(default)]
    pub agent_id: Option<Value>,
    /// Shown in the seed's turns; ignored.
    #[serde(default)]
    pub mentions: Option<Value>,
}

/// A seed request's conversation, in Agentry's terms.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeedConversation {
    /// The system prompt.
    pub system: Option<String>,
    /// A prompt template (and its arguments) a system message names: rendered into the system
    /// prompt, after its text.
    pub system_template: Option<(String, serde_json::Map<String, Value>)>,
    /// Earlier turns.
    pub history: Vec<Message>,
    /// The new user turn, when the conversation ends with one.
    pub input: Option<Input>,
}

impl SeedInferRequest {
    /// Checks the fields Agentry does not take and reads the conversation: the whole of it
    /// when `stateless`, else a system prompt and one user turn at most.
    pub fn conversation(&self, stateless: bool) -> Result<SeedConversation, AppError> {
        if self.model.is_some() {
            return Err(AppError::bad_request(
                "an inline `model` configuration is not accepted: register the model \
                 (POST /v1/models) and name it in `model_id`",
            ));
        }
        if self.workspace.is_some() {
            return Err(AppError::bad_request(
                "`workspace` is not accepted: a session's tools work in the session's own \
                 workspace",
            ));
        }
        if self.text.is_some() && !self.messages.is_empty() {
            return Err(AppError::bad_request("give `text` or `messages`, not both"));
        }
        if let Some(text) = &self.text {
            return Ok(SeedConversation {
                input: Some(Input::Text { text: text.clone() }),
                ..SeedConversation::default()
            });
        }
        conversation_of(&self.messages, stateless)
    }
}

/// Reads OpenAI-shaped `messages` (the seed's, and OpenAI's own chat completions): the system
/// prompt, the earlier turns (tool calls paired with their results) and the new user turn —
/// the whole conversation when `stateless`, else a system prompt and one user turn at most.
pub fn conversation_of(
    messages: &[SeedMessage],
    stateless: bool,
) -> Result<SeedConversation, AppError> {
    {
        let mut conversation = SeedConversation::default();
        let mut turns = Vec::new();
        let mut open_calls: Vec<ToolCall> = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let at = |problem: &str| AppError::bad_request(format!("messages[{index}]: {problem}"));
            match message.role.as_str() {
                "system" => {
                    if let Some(template) = &message.prompt_template {
                        if conversation.system_template.is_some() {
                            return Err(at("only one system message may name a prompt template"));
                        }
                        conversation.system_template = Some((
                            template.clone(),
                            message.arguments.clone().unwrap_or_default(),
                        ));
                        continue;
                    }
                    let text = plain_text(message.content.as_ref())
                        .ok_or_else(|| at("a system message needs text content"))?;
                    conversation.system = Some(match conversation.system.take() {
                        Some(earlier) => format!("{earlier}\n\n{text}"),
                        None => text,
                    });
                }
                "user" => turns.push(Turn::User(user_input(message).map_err(|e| at(&e))?)),
                "assistant" => {
                    let message = assistant(message, index).map_err(|e| at(&e))?;
                    open_calls.extend(message.tool_calls().cloned());
                    turns.push(Turn::Done(message));
                }
                "tool" => {
                    let call_id = match (&message.tool_call_id, &message.tool_use_id) {
                        (Some(id), _) | (None, Some(id)) => {
                            let position = open_calls
                                .iter()
                                .position(|call| &call.id == id)
                                .ok_or_else(|| at(&format!("no tool call {id:?} to answer")))?;
                            open_calls.remove(position).id
                        }
                        (None, None) => {
                            let name = message.name.as_deref().ok_or_else(|| {
                                at("a tool result needs `tool_call_id` or the tool's `name`")
                            })?;
                            let position = open_calls
                                .iter()
                                .position(|call| call.name == name)
                                .ok_or_else(|| {
                                    at(&format!("no call of the tool {name:?} to answer"))
                                })?;
                            open_calls.remove(position).id
                        }
                    };
                    let text = plain_text(message.content.as_ref()).unwrap_or_default();
                    let mut result = ToolResult::text(call_id, text);
                    result.name.clone_from(&message.name);
                    turns.push(Turn::Done(Message::Tool(result)));
                }
                other => {
                    return Err(at(&format!(
                        "unknown role {other:?} (system, user, assistant or tool)"
                    )));
                }
            }
        }
        // The last user turn is the new input; the turns before it are history.
        if let Some(Turn::User(_)) = turns.last()
            && let Some(Turn::User(input)) = turns.pop()
        {
            conversation.input = Some(input);
        }
        if !stateless {
            if !turns.is_empty() {
                return Err(AppError::bad_request(
                    "in a session the conversation comes from the session: send a system \
                     prompt and the new user message only (or no `session_id` for a \
                     stateless conversation)",
                ));
            }
            return Ok(conversation);
        }
        for turn in turns {
            conversation.history.push(match turn {
                Turn::Done(message) => message,
                Turn::User(input) => match input {
                    Input::Content { content } => Message::User { content },
                    Input::Text { text } => Message::user(text),
                    Input::Template { .. } => {
                        return Err(AppError::bad_request(
                            "only the last user message may name a prompt template",
                        ));
                    }
                },
            });
        }
        if conversation.input.is_none()
            && !matches!(conversation.history.last(), Some(Message::Tool(_)))
        {
            return Err(AppError::bad_request(
                "the conversation must end with a user message (or with tool results for the \
                 model to answer)",
            ));
        }
        Ok(conversation)
    }
}

enum Turn {
    User(Input),
    Done(Message),
}

/// A message's content as plain text: a string, or the text parts of a list joined.
fn plain_text(content: Option<&Value>) -> Option<String> {
    match content {
        None | Some(Value::Null) => Some(String::new()),
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Option<Vec<_>>>()
            .map(|texts| texts.concat()),
        Some(_) => None,
    }
}

/// A user message: a prompt template with its arguments, or text, images and audio.
fn user_input(message: &SeedMessage) -> Result<Input, String> {
    if let Some(template) = &message.prompt_template {
        return Ok(Input::Template {
            template: template.clone(),
            arguments: message.arguments.clone().unwrap_or_default(),
        });
    }
    let mut content = Vec::new();
    match &message.content {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => {
            if !text.is_empty() {
                content.push(ContentPart::text(text.clone()));
            }
        }
        Some(Value::Array(parts)) => {
            for part in parts {
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => content.push(ContentPart::text(
                        part.get("text")
                            .and_then(Value::as_str)
                            .ok_or("a text part needs a string `text`")?,
                    )),
                    Some("image_url") => content.push(
                        crate::routes::run_request::image(
                            part.pointer("/image_url/url")
                                .or_else(|| part.get("image_url"))
                                .and_then(Value::as_str)
                                .ok_or("an image part needs `image_url.url`")?,
                        )
                        .map_err(|error| error.message)?,
                    ),
                    other => {
                        return Err(format!(
                            "unknown content part type {other:?} (text or image_url)"
                        ));
                    }
                }
            }
        }
        Some(_) => return Err("content must be text or a list of parts".into()),
    }
    for url in message.images.iter().flatten() {
        content.push(crate::routes::run_request::image(url).map_err(|error| error.message)?);
    }
    if let Some(audio) = &message.audio {
        content.push(audio_part(audio)?);
    }
    if content.is_empty() {
        return Err("a user message needs content".into());
    }
    Ok(Input::Content { content })
}

use crate::routes::run_request::audio_part;

/// An assistant turn: its reasoning, text and tool calls (ids made up where the client gave
/// none, arguments parsed from JSON text).
fn assistant(message: &SeedMessage, index: usize) -> Result<Message, String> {
    let mut content = Vec::new();
    if let Some(thinking) = message.thinking.as_ref().filter(|t| !t.is_empty()) {
        content.push(AssistantPart::Thinking(Thinking::Text {
            text: thinking.clone(),
            signature: None,
        }));
    }
    let text = plain_text(message.content.as_ref()).ok_or("content must be text")?;
    if !text.is_empty() {
        content.push(AssistantPart::Text { text });
    }
    for (position, call) in message.tool_calls.iter().flatten().enumerate() {
        let function = call.get("function").unwrap_or(call);
        let name = function
            .get("name")
            .and_then(Value::as_str)
            .filter(|name| !name.is_empty())
            .ok_or("a tool call needs a `name`")?;
        let arguments = match function.get("arguments") {
            None | Some(Value::Null) => Value::Object(Default::default()),
            Some(Value::String(text)) if text.trim().is_empty() => {
                Value::Object(Default::default())
            }
            Some(Value::String(text)) => serde_json::from_str(text).map_err(|error| {
                format!("the arguments of the call to {name:?} are not JSON: {error}")
            })?,
            Some(value) => value.clone(),
        };
        if !arguments.is_object() {
            return Err(format!(
                "the arguments of the call to {name:?} must be an object"
            ));
        }
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty())
            .map_or_else(|| format!("call_{index}_{position}"), str::to_owned);
        content.push(AssistantPart::ToolCall(ToolCall::new(id, name, arguments)));
    }
    Ok(Message::Assistant { content })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(body: Value) -> SeedInferRequest {
        serde_json::from_value(body).unwrap()
    }

    #[test]
    fn a_stateless_history_keeps_calls_and_results_paired() {
        let body = request(json!({
            "model_id": "m",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"},
                    {"id": "c2", "type": "function", "function": {"name": "weather", "arguments": {"city": "Rome"}}}
                ]},
                {"role": "tool", "name": "weather", "content": "cold"},
                {"role": "tool", "tool_use_id": "c2", "name": "weather", "content": "warm"},
                {"role": "assistant", "content": "Cold and warm."},
                {"role": "user", "content": "Thanks"}
            ]
        }));
        let conversation = body.conversation(true).unwrap();
        assert_eq!(conversation.system.as_deref(), Some("Be brief."));
        assert_eq!(
            conversation.input,
            Some(Input::Content {
                content: vec![ContentPart::text("Thanks")]
            })
        );
        let history = &conversation.history;
        assert_eq!(history.len(), 5);
        let calls: Vec<&ToolCall> = history[1].tool_calls().collect();
        assert_eq!(calls[0].id, "call_2_0");
        assert_eq!(calls[0].arguments, json!({"city": "Oslo"}));
        assert_eq!(calls[1].id, "c2");
        let Message::Tool(first) = &history[2] else {
            panic!("{history:?}")
        };
        assert_eq!(first.call_id, "call_2_0");
        let Message::Tool(second) = &history[3] else {
            panic!("{history:?}")
        };
        assert_eq!(second.call_id, "c2");
    }

    #[test]
    fn bad_conversations_are_refused_with_where() {
        for (body, expected) in [
            (
                json!({"messages": [{"role": "tool", "name": "x", "content": "r"}]}),
                "no call of the tool",
            ),
            (
                json!({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}),
                "must end with a user message",
            ),
            (
                json!({"messages": [{"role": "robot", "content": "a"}]}),
                "unknown role",
            ),
            (
                json!({"messages": [{"role": "assistant", "tool_calls": [{"name": "t", "arguments": "{"}]}, {"role": "user", "content": "x"}]}),
                "not JSON",
            ),
            (
                json!({"text": "a", "messages": [{"role": "user", "content": "b"}]}),
                "not both",
            ),
            (json!({"text": "a", "workspace": "/etc"}), "workspace"),
            (
                json!({"messages": [{"role": "user", "content": "a", "audio": "not base64!"}]}),
                "base64",
            ),
        ] {
            let error = request(body.clone()).conversation(true).unwrap_err();
            assert!(
                error.message.contains(expected),
                "{body}: {}",
                error.message
            );
        }
    }

    #[test]
    fn a_session_takes_a_system_prompt_and_one_user_message() {
        let body = request(json!({
            "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": "Search for the latest AI news.", "audio": "UklGRg=="}
            ],
            "stream": true, "max_tool_rounds": 10, "session_id": "new"
        }));
        let conversation = body.conversation(false).unwrap();
        assert!(conversation.history.is_empty());
        let Some(Input::Content { content }) = conversation.input else {
            panic!()
        };
        assert_eq!(content.len(), 2);
        assert!(matches!(&content[1], ContentPart::Audio { format, .. } if format == "wav"));
        let two = request(json!({"messages": [
            {"role": "user", "content": "a"}, {"role": "user", "content": "b"}
        ]}));
        assert!(two.conversation(false).is_err());
    }
}
