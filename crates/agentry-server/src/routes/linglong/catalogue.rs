//! The seed's catalogue and session routes in its shapes, over Agentry's own services: models
//! (`{"model_id", "api_base", "model_name", "api_key", "model_type", "api_protocol", "labels",
//! "generate_params"}`), prompt templates (`{"template_id", "content"}`), tools (`{"tool_id",
//! "tool_type", "name", "description", "parameters"}`, a direct call answering `{"result"}`),
//! and sessions (the index entries, a conversation as `{"meta", "messages"}`, a title).
//!
//! Differences, on purpose: an `api_key` is kept as a sealed secret (`<MODEL>_API_KEY`) and
//! listed as `"***"`, never in clear; sessions are Agentry's (UUID ids); checks are Agentry's
//! (a model's URL and name are checked before it is saved).

use serde_json::{Map, Value, json};

use agentry_app::domain::core::tool::ResultFormat;
use agentry_app::domain::store::SessionQuery;
use agentry_types::{AssistantPart, ContentPart, ImageSource, Message, SessionId, Thinking};

use agentry_app::App;
use agentry_app::auth::Principal;
use agentry_app::model_config::ModelConfig;
use agentry_app::runtime::TemplateConfig;
use agentry_app::{AppError, Failure};

/// What the seed lists for a model.
fn model_entry(model: &ModelConfig) -> Value {
    json!({
        "model_id": model.id,
        "api_base": model.base_url.clone().unwrap_or_else(|| model.protocol.default_base_url().to_owned()),
        "model_name": model.model_name,
        "api_key": if model.api_key_secret.is_some() { "***" } else { "" },
        "model_type": if agentry_app::domain::core::media::sees_images(&model.labels) { "vlm" } else { "llm" },
        "labels": model.labels,
        "api_protocol": model.protocol.name(),
        "generate_params": serde_json::to_value(&model.params).unwrap_or_else(|_| json!({})),
    })
}

/// A field the seed requires, as its message names it.
pub(super) fn required<'a>(
    body: &'a Map<String, Value>,
    field: &str,
) -> Result<&'a Value, AppError> {
    body.get(field)
        .filter(|value| !value.is_null())
        .ok_or_else(|| AppError::bad_request(format!("Missing required field: {field}")))
}

/// A string field.
pub(super) fn text<'a>(
    body: &'a Map<String, Value>,
    field: &str,
) -> Result<Option<&'a str>, AppError> {
    match body.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text)),
        Some(_) => Err(AppError::bad_request(format!("`{field}` must be a string"))),
    }
}

/// The name of the secret a model's inline key is kept in.
fn key_secret(model_id: &str) -> String {
    let id: String = model_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("{id}_API_KEY")
}

/// Checks the body has `fields` only.
pub(super) fn known_fields(body: &Map<String, Value>, fields: &[&str]) -> Result<(), AppError> {
    match body.keys().find(|key| !fields.contains(&key.as_str())) {
        Some(key) => Err(AppError::bad_request(format!(
            "unknown field `{key}` (expected one of {})",
            fields.join(", ")
        ))),
        None => Ok(()),
    }
}

pub(super) fn object(body: Value) -> Result<Map<String, Value>, AppError> {
    match body {
        Value::Object(map) => Ok(map),
        _ => Err(AppError::bad_request("the body must be a JSON object")),
    }
}

const MODEL_FIELDS: &[&str] = &[
    "model_id",
    "api_base",
    "model_name",
    "api_key",
    "model_type",
    "api_protocol",
    "generate_params",
    "labels",
];

/// `GET /v1/models`: `{"models": [...]}`.
pub async fn seed_models(app: &App) -> Result<Value, AppError> {
    let models = app.models().list().await?.models;
    Ok(json!({"models": models.iter().map(model_entry).collect::<Vec<_>>()}))
}

/// `POST /v1/models` (registers, replacing a model of that id: 201) and
/// `PUT /v1/models/{id}` (`Some(id)`: that model, which must exist, renamed if the body's
/// id differs: 200). Answers the HTTP status and the body.
pub async fn seed_save_model(
    app: &App,
    existing: Option<&str>,
    body: Value,
) -> Result<(u16, Value), AppError> {
    let body = object(body)?;
    known_fields(&body, MODEL_FIELDS)?;
    for field in ["model_id", "api_base", "model_name"] {
        required(&body, field)?;
    }
    let id = text(&body, "model_id")?.unwrap_or_default().to_owned();
    if let Some(model_type) = text(&body, "model_type")?
        && !matches!(model_type, "llm" | "vlm")
    {
        return Err(AppError::bad_request("`model_type` must be llm or vlm"));
    }
    let mut config = json!({
        "id": id,
        "protocol": text(&body, "api_protocol")?.unwrap_or("openai"),
        "base_url": text(&body, "api_base")?,
        "model_name": text(&body, "model_name")?,
    });
    if let Some(params) = body.get("generate_params").filter(|p| !p.is_null()) {
        config["params"] = params.clone();
    }
    // Labels as a list or one string; the older `model_type: "vlm"` is the `vlm` label.
    let mut labels = match body.get("labels") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(text)) => vec![Value::String(text.clone())],
        Some(Value::Array(list)) => list.clone(),
        Some(_) => {
            return Err(AppError::bad_request(
                "`labels` must be a list of strings or a string",
            ));
        }
    };
    if text(&body, "model_type")? == Some("vlm") {
        labels.push(json!(agentry_app::domain::core::media::VLM));
    }
    if !labels.is_empty() {
        let text: Vec<String> = labels
            .iter()
            .map(|label| {
                label.as_str().map(str::to_owned).ok_or_else(|| {
                    AppError::bad_request("`labels` must be a list of strings or a string")
                })
            })
            .collect::<Result<_, _>>()?;
        config["labels"] = json!(text.join(","));
    }
    let key = text(&body, "api_key")?.filter(|key| !key.is_empty() && *key != "***");
    let secret = key_secret(&id);
    let keeps_secret = match existing {
        Some(old) => app
            .models()
            .get(old)
            .await?
            .api_key_secret
            .filter(|_| text(&body, "api_key").ok().flatten() == Some("***")),
        None => None,
    };
    if let Some(key) = key {
        app.secrets()
            .set(&[(secret.clone(), key.to_owned())])
            .await?;
        config["api_key_secret"] = json!(secret);
    } else if let Some(kept) = keeps_secret {
        config["api_key_secret"] = json!(kept);
    }
    let (status, code) = match existing {
        Some(old) => {
            Box::pin(app.models().replace(old, config)).await?;
            ("updated", 200)
        }
        None => {
            match app.models().get(&id).await {
                Ok(_) => Box::pin(app.models().replace(&id, config)).await?,
                Err(_) => app.models().create(config).await?,
            };
            ("registered", 201)
        }
    };
    Ok((code, json!({"status": status, "model_id": id})))
}

/// `DELETE /v1/models/{id}`.
pub async fn seed_delete_model(app: &App, id: &str) -> Result<Value, AppError> {
    app.models().delete(id).await?;
    Ok(json!({"status": "deleted", "model_id": id}))
}

/// `GET /v1/prompt-templates`: `{"templates": [{"template_id", "content"}]}`.
pub async fn seed_templates(app: &App) -> Result<Value, AppError> {
    let templates = app.templates().list().await?.templates;
    Ok(json!({"templates": templates
        .iter()
        .map(|t| json!({"template_id": t.name, "content": t.template}))
        .collect::<Vec<_>>()}))
}

/// `POST /v1/prompt-templates` and `PUT /v1/prompt-templates/{id}`.
pub async fn seed_save_template(
    app: &App,
    existing: Option<&str>,
    body: Value,
) -> Result<Value, AppError> {
    let body = object(body)?;
    known_fields(&body, &["template_id", "content"])?;
    let name = match existing {
        Some(old) => text(&body, "template_id")?.unwrap_or(old).to_owned(),
        None => {
            required(&body, "template_id")?;
            text(&body, "template_id")?.unwrap_or_default().to_owned()
        }
    };
    if existing.is_none() {
        required(&body, "content")?;
    }
    let template = TemplateConfig {
        name: name.clone(),
        template: text(&body, "content")?.unwrap_or_default().to_owned(),
    };
    match existing {
        Some(old) => {
            Box::pin(app.templates().replace(old, &template)).await?;
            Ok(json!({"status": "updated", "template_id": name}))
        }
        None => {
            // As the seed: saving a template that exists replaces it.
            let saved = match app.templates().get(&name).await {
                Ok(_) => true,
                Err(error) if error.failure == Failure::NotFound => false,
                Err(error) => return Err(error),
            };
            if saved {
                Box::pin(app.templates().replace(&name, &template)).await?;
            } else {
                app.templates().create(&template).await?;
            }
            Ok(json!({"status": "created", "template_id": name}))
        }
    }
}

/// `DELETE /v1/prompt-templates/{id}`.
pub async fn seed_delete_template(app: &App, id: &str) -> Result<Value, AppError> {
    app.templates().delete(id).await?;
    Ok(json!({"status": "deleted", "template_id": id}))
}

/// `GET /v1/tools`: `{"tools": [...]}`, each tool's id its name (a skill's
/// `skill-<name>`, with its `skill_dir`).
pub async fn seed_tools(app: &App) -> Result<Value, AppError> {
    let tools = app.tools().list().await?.tools;
    let skills = app.skills().list().await?.skills;
    Ok(json!({"tools": tools.iter().map(|tool| {
        let mut entry = json!({
            "tool_id": tool.name,
            "tool_type": match tool.kind { "mcp" => "mcp", "skill" => "skill", _ => "function" },
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
            "builtin": tool.kind == "builtin",
        });
        if let Some(skill) = skills.iter().find(|s| tool.kind == "skill" && s.name == tool.name) {
            entry["tool_id"] = json!(format!("skill-{}", skill.name));
            entry["skill_dir"] = json!(skill.path);
        }
        entry
    }).collect::<Vec<_>>()}))
}

/// `POST /v1/tools/call`: `{"tool_id", "arguments", "format"?}` → `{"result"}` (the result's
/// text, or with `"format": "json"` the result parsed).
pub async fn seed_call_tool(app: &App, body: Value) -> Result<Value, AppError> {
    let body = object(body)?;
    known_fields(&body, &["tool_id", "arguments", "format"])?;
    let tool = text(&body, "tool_id")?
        .filter(|id| !id.is_empty())
        .ok_or_else(|| AppError::bad_request("Missing required field: tool_id"))?;
    let arguments = match body.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(arguments)) => Value::Object(arguments.clone()),
        Some(_) => {
            return Err(AppError::bad_request(
                "Field 'arguments' must be a JSON object",
            ));
        }
    };
    let format = match text(&body, "format")? {
        None | Some("text") => ResultFormat::Text,
        Some("json") => ResultFormat::Json,
        Some(other) => {
            return Err(AppError::bad_request(format!(
                "`format` must be text or json, not {other:?}"
            )));
        }
    };
    let result = app.tools().call(tool, arguments, format).await?;
    Ok(json!({"result": result}))
}

/// `GET /v1/sessions`: `{"sessions": [{"session_id", "title", "created_at",
/// "last_inference_at", "status"}]}`, the caller's, most recent first.
pub async fn seed_sessions(app: &App, caller: &Principal) -> Result<Value, AppError> {
    let query = SessionQuery {
        status: None,
        owner: caller.owner_filter(),
        limit: 1000,
        offset: 0,
    };
    let sessions = app.sessions().list(&query).await?.sessions;
    Ok(json!({"sessions": sessions.iter().map(|s| json!({
        "session_id": s.id,
        "title": s.title.clone().unwrap_or_else(|| s.id.to_string()),
        "created_at": seed_time(s.created_at),
        "last_inference_at": seed_time(s.last_activity),
        "status": s.status,
    })).collect::<Vec<_>>()}))
}

/// `GET /v1/sessions/{id}`: `{"meta": {...}, "messages": [turns]}`.
pub async fn seed_session(app: &App, caller: &Principal, id: &str) -> Result<Value, AppError> {
    let record = app.sessions().record(id).await?;
    app.check_session_access(caller, record.id).await?;
    // When each user message was sent: the key that names its turn (revoke, file journals).
    let (detail, user_times) = Box::pin(app.session_detail_with_times(record.clone())).await?;
    let timestamp = seed_time(record.last_activity);
    let mut user_times = user_times.into_iter();
    let messages: Vec<Value> = detail
        .messages
        .iter()
        .map(|message| match message {
            Message::User { .. } => {
                let sent = user_times
                    .next()
                    .and_then(agentry_app::turn_files::turn_time)
                    .unwrap_or_else(|| timestamp.clone());
                seed_turn(message, &sent)
            }
            _ => seed_turn(message, &timestamp),
        })
        .collect();
    Ok(json!({
        "meta": {
            "session_id": record.id,
            "title": record.title,
            "created_at": seed_time(record.created_at),
            "updated_at": timestamp,
            "turn_count": messages.len(),
        },
        "messages": messages,
    }))
}

/// `DELETE /v1/sessions/{id}`.
pub async fn seed_delete_session(
    app: &App,
    caller: &Principal,
    id: &str,
) -> Result<Value, AppError> {
    let session = seed_session_id(app, caller, id).await?;
    Box::pin(app.sessions().delete(session)).await?;
    Ok(json!({"status": "deleted", "session_id": session}))
}

/// `POST /v1/sessions/{id}/generate-title`: `{"title"?}` sets it, else the default model
/// writes one → `{"status": "success", "session_id", "title"}`.
pub async fn seed_generate_title(
    app: &App,
    caller: &Principal,
    id: &str,
    body: Value,
) -> Result<Value, AppError> {
    let session = seed_session_id(app, caller, id).await?;
    let body = match body {
        Value::Null => Map::new(),
        other => object(other)?,
    };
    known_fields(&body, &["title", "model_id"])?;
    let title = text(&body, "title")?
        .map(str::trim)
        .filter(|title| !title.is_empty())
        .map(str::to_owned);
    let model = text(&body, "model_id")?.map(str::to_owned);
    let outcome = Box::pin(app.sessions().retitle(caller, session, title, model)).await?;
    Ok(json!({"status": "success", "session_id": session, "title": outcome.title}))
}

async fn seed_session_id(app: &App, caller: &Principal, id: &str) -> Result<SessionId, AppError> {
    let session = agentry_app::ids::parse_session_id(id)?;
    app.check_session_access(caller, session).await?;
    Ok(session)
}

/// Unix milliseconds as the seed writes times (`%Y-%m-%dT%H:%M:%S`, UTC here).
pub(super) fn seed_time(millis: u64) -> String {
    i64::try_from(millis)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|time| time.format("%Y-%m-%dT%H:%M:%S").to_string())
        .unwrap_or_default()
}

/// A message of the conversation as the seed's turn.
fn seed_turn(message: &Message, timestamp: &str) -> Value {
    match message {
        Message::System { text } => {
            json!({"role": "system", "content": text, "timestamp": timestamp})
        }
        Message::User { content } => {
            let mut text = String::new();
            let mut images = Vec::new();
            for part in content {
                match part {
                    ContentPart::Text { text: piece } => text.push_str(piece),
                    ContentPart::Image { source } => images.push(match source {
                        ImageSource::Url { url } => url.clone(),
                        ImageSource::Base64 { media_type, data } => {
                            format!("data:{media_type};base64,{data}")
                        }
                    }),
                    ContentPart::Audio { .. } => {}
                }
            }
            let mut turn = json!({"role": "user", "content": text, "timestamp": timestamp});
            if !images.is_empty() {
                turn["images"] = json!(images);
            }
            turn
        }
        Message::Assistant { content } => {
            let mut text = String::new();
            let mut thinking = String::new();
            let mut calls = Vec::new();
            for part in content {
                match part {
                    AssistantPart::Text { text: piece } => text.push_str(piece),
                    AssistantPart::Thinking(Thinking::Text { text: piece, .. }) => {
                        thinking.push_str(piece);
                    }
                    AssistantPart::Thinking(Thinking::Redacted { .. }) => {}
                    AssistantPart::ToolCall(call) => calls.push(json!({
                        "id": call.id,
                        "name": call.name,
                        "arguments": call.arguments.to_string(),
                    })),
                }
            }
            let mut turn = json!({"role": "assistant", "content": text, "timestamp": timestamp});
            if !thinking.is_empty() {
                turn["thinking"] = json!(thinking);
            }
            if !calls.is_empty() {
                turn["tool_calls"] = json!(calls);
            }
            turn
        }
        Message::Tool(result) => json!({
            "role": "tool",
            "content": result.text_content(),
            "name": result.name.clone().unwrap_or_default(),
            "tool_use_id": result.call_id,
            "timestamp": timestamp,
        }),
    }
}
