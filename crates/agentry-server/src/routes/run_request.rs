//! A run as a client submits it over `/v1`: the body of `POST /v1/infer`, `POST /v1/runs`, a
//! schedule's `run` and a group's message, read into the app's [`RunSpec`] here, once. The
//! request accepts the Python service's shapes (`model_id`, `tool_ids`, `text` or `messages`
//! with `prompt_template` and `arguments`, `session_id` where `"new"` creates one,
//! `max_tool_rounds`). Several `agent_ids` make a group chat (`InferRequest::group_post`).

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;
use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema, Type};

use agentry_app::auth::Principal;
use agentry_app::domain::core::session::BusyPolicy;
use agentry_app::domain::core::{Input, RunRequest};
use agentry_app::domain::llm::GenerationParams;
use agentry_app::group::GroupPost;
use agentry_app::ids::parse_session_id;
use agentry_app::runs::{RunSpec, SessionChoice, Target};
use agentry_app::{App, AppError};
use agentry_types::{ContentPart, ImageSource};

/// A message of an inference request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InferMessage {
    /// `user` or `system`.
    #[serde(default = "user_role")]
    #[schema(default = "user", pattern = "^(user|system)$")]
    pub role: String,
    /// Text, or a list of `{"type": "text"|"image_url", …}` parts.
    #[serde(default)]
    #[schema(schema_with = message_content_schema)]
    pub content: Option<Value>,
    /// Images: `data:` URLs or `http(s)` URLs.
    #[serde(default)]
    pub images: Vec<String>,
    /// Audio: base64 bytes (WAV) or a `data:audio/<format>;base64,` URL. Passed to models
    /// labelled `audio`; for others transcribed by the speech model (the agent's, else the one
    /// labelled `speech`) when there is one.
    #[serde(default)]
    pub audio: Option<String>,
    /// A prompt template to render as this message.
    #[serde(default)]
    pub prompt_template: Option<String>,
    /// The template's arguments.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub arguments: serde_json::Map<String, Value>,
    /// Accepted for compatibility and ignored.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub timestamp: Option<Value>,
}

fn user_role() -> String {
    "user".into()
}

/// An inference request.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InferRequest {
    /// The model id (default: the first registered model).
    #[serde(default)]
    pub model_id: Option<String>,
    /// The tools offered, by name: exactly these (an agent's when the request names none);
    /// `["*"]` offers every registered tool. Default: none.
    #[serde(default)]
    pub tool_ids: Option<Vec<String>>,
    /// Shorthand for one user message.
    #[serde(default)]
    pub text: Option<String>,
    /// The new messages.
    #[serde(default)]
    pub messages: Vec<InferMessage>,
    /// `"new"`, an existing session id, or absent for an ephemeral run.
    #[serde(default)]
    #[schema(pattern = "^(new|[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12})$")]
    pub session_id: Option<String>,
    /// A system prompt (a session keeps the one it started with).
    #[serde(default)]
    pub system: Option<String>,
    /// Tool rounds allowed.
    #[serde(default)]
    pub max_tool_rounds: Option<u32>,
    /// Generation parameters (`max_tokens`, `temperature`, `top_p`, `stop`, `thinking`, and
    /// provider-specific fields).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub params: Option<GenerationParams>,
    /// What to do if the session has a run in progress (default: reject).
    #[serde(default)]
    #[schema(value_type = Option<BusyPolicyName>)]
    pub policy: Option<BusyPolicy>,
    /// Cancel the run when the client disconnects.
    #[serde(default)]
    pub cancel_on_disconnect: bool,
    /// Run as this saved agent: its model and fallbacks, tools, skills and MCP servers' tools,
    /// system prompt or template, parameters and limits (the request's `model_id`, `tool_ids`,
    /// `system`, `max_tool_rounds` and `params` win where given; a request naming its own model
    /// does not use the agent's fallbacks). Several agents: a group chat (see `/v1/groups`) in
    /// a new group session (`session_id` absent or `"new"`) or the group session named.
    #[serde(default)]
    pub agent_ids: Option<Vec<String>>,
    /// Group chat: rounds one message may lead to, for a new group (default 5).
    #[serde(default)]
    #[schema(minimum = 1, maximum = 50)]
    pub max_rounds: Option<u32>,
    /// Which tool calls wait for a person's approval (`always`, `never` or a rule per tool; over
    /// the agent's policy, per tool). A call that needs approval suspends the run (session
    /// status `waiting`) until `POST /v1/runs/{run_id}/approvals` decides it; such runs need a
    /// session.
    #[serde(default)]
    #[schema(value_type = Option<agentry_app::schema::ApprovalPolicyDoc>)]
    pub approvals: Option<agentry_app::domain::core::approval::ApprovalPolicy>,
    /// Run as this saved agent (the same as `agent_ids` with one id).
    #[serde(default)]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub agent_id: Option<String>,
    /// The user the request is for: a saved agent's memories about this user join its own in
    /// the system prompt. A `user` key's end users are its own (another key's `alice` is
    /// another person); an admin may name a key's as `<key id>:<name>`.
    #[serde(default)]
    #[schema(pattern = "^([A-Za-z0-9_.-]{1,64}:)?[A-Za-z0-9_.-]{1,64}$")]
    pub user: Option<String>,
    /// How the run compacts its context (`threshold`, `keep_recent`, `summary_model`,
    /// `summary_tokens`, `enabled`; default: the agent's, else the server's).
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub compaction: Option<agentry_app::domain::core::context::CompactionSettings>,
    /// Background runs only (`POST /v1/runs`): where to POST, signed, when the run stops
    /// (`http(s)`; see `POST /v1/webhook-secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 2048)]
    pub webhook_url: Option<String>,
}

/// Turns message content into parts.
fn content_parts(message: &InferMessage) -> Result<Vec<ContentPart>, AppError> {
    let mut parts = Vec::new();
    match &message.content {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => parts.push(ContentPart::text(text.clone())),
        Some(Value::Array(items)) => {
            for item in items {
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = item.get("text").and_then(Value::as_str).ok_or_else(|| {
                            AppError::bad_request("a text part needs a string `text`")
                        })?;
                        parts.push(ContentPart::text(text));
                    }
                    Some("image_url") => {
                        let url = item
                            .pointer("/image_url/url")
                            .or_else(|| item.get("image_url"))
                            .and_then(Value::as_str)
                            .ok_or_else(|| {
                                AppError::bad_request("an image part needs `image_url.url`")
                            })?;
                        parts.push(image(url)?);
                    }
                    Some("input_audio") => {
                        let (Some(data), Some(format)) = (
                            item.pointer("/input_audio/data").and_then(Value::as_str),
                            item.pointer("/input_audio/format").and_then(Value::as_str),
                        ) else {
                            return Err(AppError::bad_request(
                                "an audio part needs `input_audio.data` (base64) and \
                                 `input_audio.format`",
                            ));
                        };
                        let part = audio_format(format)
                            .and_then(|format| base64_audio(format, data))
                            .map_err(AppError::bad_request)?;
                        parts.push(part);
                    }
                    other => {
                        return Err(AppError::bad_request(format!(
                            "unknown content part type {other:?} (expected text, image_url or \
                             input_audio)"
                        )));
                    }
                }
            }
        }
        Some(other) => {
            return Err(AppError::bad_request(format!(
                "message content must be a string or a list of parts, not {other}"
            )));
        }
    }
    for url in &message.images {
        parts.push(image(url)?);
    }
    if let Some(audio) = &message.audio {
        parts.push(audio_part(audio).map_err(AppError::bad_request)?);
    }
    Ok(parts)
}

/// Audio as the seed sends it: base64 bytes (WAV), or a `data:audio/<format>;base64,` URL
/// (`audio/mpeg` is `mp3`, `audio/x-wav` is `wav`, codec parameters are dropped).
pub fn audio_part(audio: &str) -> Result<ContentPart, String> {
    let (format, data) = match audio.strip_prefix("data:") {
        Some(rest) => {
            let (media_type, data) = rest
                .split_once(";base64,")
                .ok_or("an audio data URL must be base64")?;
            let media_type = media_type.split(';').next().unwrap_or_default();
            let format = media_type
                .strip_prefix("audio/")
                .ok_or("an audio data URL must have an audio/ media type")?;
            (audio_format(format.trim_start_matches("x-"))?, data)
        }
        None => ("wav".to_owned(), audio),
    };
    base64_audio(format, data)
}

/// A format name as a file extension (`mpeg` is `mp3`), checked.
fn audio_format(format: &str) -> Result<String, String> {
    let format = match format.to_ascii_lowercase().as_str() {
        "mpeg" => "mp3".to_owned(),
        other => other.to_owned(),
    };
    if format.is_empty() || format.len() > 16 || !format.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(format!("unknown audio format {format:?}"));
    }
    Ok(format)
}

fn base64_audio(format: String, data: &str) -> Result<ContentPart, String> {
    let valid = !data.is_empty()
        && data
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'='));
    if !valid {
        return Err("audio must be base64".into());
    }
    Ok(ContentPart::Audio {
        format,
        data: data.to_owned(),
    })
}

/// An image part from a URL: an `https://` URL as it is, or a base64 `data:` URL decoded.
pub fn image(url: &str) -> Result<ContentPart, AppError> {
    if let Some(rest) = url.strip_prefix("data:") {
        let (media_type, data) = rest
            .split_once(";base64,")
            .ok_or_else(|| AppError::bad_request("a data URL image must be base64"))?;
        return Ok(ContentPart::Image {
            source: ImageSource::Base64 {
                media_type: media_type.to_owned(),
                data: data.to_owned(),
            },
        });
    }
    if url.starts_with("http://") || url.starts_with("https://") {
        return Ok(ContentPart::Image {
            source: ImageSource::Url {
                url: url.to_owned(),
            },
        });
    }
    Err(AppError::bad_request(
        "an image must be a data: or http(s) URL",
    ))
}

impl InferRequest {
    /// Whether the request names several agents: a group chat.
    pub fn is_group(&self) -> bool {
        self.agent_ids.as_ref().is_some_and(|ids| ids.len() > 1)
    }

    /// The run this request asks for, read by the request's own rules (one agent, one new user
    /// message, `text` or `messages`); the rest is checked by [`agentry_app::runs::prepare`].
    pub fn into_spec(self) -> Result<RunSpec, AppError> {
        let mut body = self;
        let agent_id = match (body.agent_id.take(), body.agent_ids.as_deref()) {
            (None, None | Some([])) => None,
            (None, Some([id])) => Some(id.clone()),
            (Some(id), None | Some([])) => Some(id),
            (Some(id), Some([other])) if *other == id => Some(id),
            (Some(_), Some([_])) => {
                return Err(AppError::bad_request(
                    "`agent_id` and `agent_ids` name different agents: give one",
                ));
            }
            (_, Some(_)) => {
                return Err(AppError::bad_request(
                    "several agents make a group chat: `POST /v1/infer` or `/v1/groups`",
                ));
            }
        };
        if body.max_rounds.is_some() {
            return Err(AppError::bad_request(
                "`max_rounds` is for group chats (several `agent_ids`)",
            ));
        }
        let mut system = body.system.take();
        let mut user_turns = Vec::new();
        for message in &body.messages {
            match message.role.as_str() {
                "system" => {
                    let text = message
                        .content
                        .as_ref()
                        .and_then(Value::as_str)
                        .ok_or_else(|| {
                            AppError::bad_request("a system message needs string content")
                        })?;
                    system = Some(text.to_owned());
                }
                "user" => user_turns.push(message),
                other => {
                    return Err(AppError::bad_request(format!(
                        "messages may be `user` or `system`, not {other:?}: the conversation comes \
                     from the session"
                    )));
                }
            }
        }
        if user_turns.len() > 1 {
            return Err(AppError::bad_request(
                "send one new user message per request; earlier turns come from the session",
            ));
        }
        let input = match (user_turns.first(), &body.text) {
            (Some(_), Some(_)) => {
                return Err(AppError::bad_request("give `text` or `messages`, not both"));
            }
            (None, Some(text)) => Some(Input::Text { text: text.clone() }),
            (Some(message), None) => Some(match &message.prompt_template {
                Some(template) => Input::Template {
                    template: template.clone(),
                    arguments: message.arguments.clone(),
                },
                None => Input::Content {
                    content: content_parts(message)?,
                },
            }),
            (None, None) => None,
        };
        let session = match body.session_id.as_deref() {
            None => SessionChoice::Ephemeral,
            Some("new") => SessionChoice::New,
            Some(id) => SessionChoice::Existing(parse_session_id(id)?),
        };
        Ok(RunSpec {
            agent_id,
            model_id: body.model_id,
            system,
            tool_ids: body.tool_ids,
            params: body.params,
            max_tool_rounds: body.max_tool_rounds,
            approvals: body.approvals,
            compaction: body.compaction,
            user: body.user,
            history: Vec::new(),
            input,
            session,
            client_tools: Vec::new(),
            policy: body.policy.unwrap_or(BusyPolicy::Reject),
            webhook_url: body.webhook_url,
        })
    }
}

/// Checks a request for a run now (not a background one) and prepares it (resolving its agent,
/// creating the session for `"new"`): [`InferRequest::into_spec`], then
/// [`agentry_app::runs::prepare`]. Also returns what to do when the session is busy.
pub(crate) async fn prepare_submission(
    app: &App,
    caller: &Principal,
    body: InferRequest,
) -> Result<(Target, RunRequest, BusyPolicy), AppError> {
    if body.webhook_url.is_some() {
        return Err(AppError::bad_request(
            "`webhook_url` is for background runs: submit with `POST /v1/runs`",
        ));
    }
    let spec = body.into_spec()?;
    let policy = spec.policy;
    let (target, request) = Box::pin(agentry_app::runs::prepare(app, caller, spec)).await?;
    Ok((target, request, policy))
}

/// A message's content: text, or a list of `text` / `image_url` parts.
pub fn message_content_schema() -> Schema {
    let part = ObjectBuilder::new()
        .property(
            "type",
            ObjectBuilder::new()
                .schema_type(Type::String)
                .enum_values(Some(["text", "image_url", "input_audio"])),
        )
        .required("type")
        .description(Some(
            "`{\"type\": \"text\", \"text\": …}`, `{\"type\": \"image_url\", \"image_url\": \
             {\"url\": …}}` (a `data:` or `http(s)` URL) or `{\"type\": \"input_audio\", \
             \"input_audio\": {\"data\": <base64>, \"format\": \"wav\"}}`.",
        ));
    OneOfBuilder::new()
        .item(ObjectBuilder::new().schema_type(Type::String))
        .item(ArrayBuilder::new().items(part))
        .item(ObjectBuilder::new().schema_type(Type::Null))
        .description(Some("Text, or a list of parts."))
        .into()
}

/// The run policies for a session that is busy.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum BusyPolicyName {
    /// Refuse (409), naming the running run.
    Reject,
    /// Run after the current run.
    Enqueue,
    /// Cancel the current run at its next step, then run.
    Interrupt,
}

impl InferRequest {
    /// A request that names several `agent_ids`: the message it posts to a group chat. A new
    /// group session when `session_id` is absent or `"new"` (with `max_rounds`), else the group
    /// session named. Fields that configure one run (`model_id`, `tool_ids`, `system`, …) do not
    /// apply: each member runs as its saved agent.
    pub(crate) fn group_post(&self) -> Result<GroupPost, AppError> {
        for (field, given) in [
            ("model_id", self.model_id.is_some()),
            ("tool_ids", self.tool_ids.is_some()),
            ("system", self.system.is_some()),
            ("max_tool_rounds", self.max_tool_rounds.is_some()),
            ("params", self.params.is_some()),
            ("approvals", self.approvals.is_some()),
            ("compaction", self.compaction.is_some()),
            ("agent_id", self.agent_id.is_some()),
            ("webhook_url", self.webhook_url.is_some()),
        ] {
            if given {
                return Err(AppError::bad_request(format!(
                    "`{field}` does not apply to a group chat: each member runs as its saved agent"
                )));
            }
        }
        let text = match (&self.text, self.messages.as_slice()) {
            (Some(text), []) => text.clone(),
            (None, [message]) if message.role == "user" && message.prompt_template.is_none() => {
                match &message.content {
                    Some(Value::String(text))
                        if message.images.is_empty() && message.audio.is_none() =>
                    {
                        text.clone()
                    }
                    _ => {
                        return Err(AppError::bad_request(
                            "a group chat message is text: `text`, or one user message with string \
                             content",
                        ));
                    }
                }
            }
            (Some(_), _) => {
                return Err(AppError::bad_request("give `text` or `messages`, not both"));
            }
            _ => {
                return Err(AppError::bad_request(
                    "a group chat takes one user message (`text`, or one message in `messages`)",
                ));
            }
        };
        let session = match self.session_id.as_deref() {
            None | Some("new") => SessionChoice::New,
            Some(id) => SessionChoice::Existing(parse_session_id(id)?),
        };
        Ok(GroupPost {
            agent_ids: self.agent_ids.clone().unwrap_or_default(),
            max_rounds: self.max_rounds,
            session,
            text,
            user: self.user.clone(),
        })
    }
}
