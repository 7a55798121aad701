//! The seed's agents, its session status feed and its read mark, over Agentry's own: an agent
//! is `{"agent_id", "model_id", "tool_ids", "template_id", "template_arguments",
//! "system_prompt", "nickname", "myself_view", "description", "avatar"}` (Agentry's
//! [`AgentConfig`], whose other settings a seed client neither sees nor loses on an update);
//! a status is `streaming`, `success` or `error`.

use serde_json::{Map, Value, json};

use agentry_types::SessionId;

use super::catalogue::{known_fields, object, required, text};
use agentry_app::App;
use agentry_app::AppError;
use agentry_app::agents::AgentConfig;
use agentry_app::auth::Principal;
use agentry_app::hub::{FeedStatus, StatusChange};

/// The fields of a seed agent (`last_modified` is the seed's own stamp: read, not kept).
const AGENT_FIELDS: &[&str] = &[
    "agent_id",
    "model_id",
    "tool_ids",
    "template_id",
    "template_arguments",
    "system_prompt",
    "nickname",
    "myself_view",
    "description",
    "avatar",
    "last_modified",
];

/// An agent as the seed shows it.
fn agent_entry(agent: &AgentConfig) -> Value {
    json!({
        "agent_id": agent.id,
        "model_id": agent.model_id,
        "tool_ids": agent.tool_ids,
        "template_id": agent.prompt_template,
        "template_arguments": agent.template_arguments,
        "system_prompt": agent.system.clone().unwrap_or_default(),
        "nickname": agent.nickname.clone().unwrap_or_default(),
        "myself_view": agent.myself_view.clone().unwrap_or_default(),
        "description": agent.description.clone().unwrap_or_default(),
        "avatar": agent.avatar.clone().unwrap_or_default(),
    })
}

/// An optional text field: absent, null or empty is none.
fn kept_text(body: &Map<String, Value>, field: &str) -> Result<Option<String>, AppError> {
    Ok(text(body, field)?
        .filter(|value| !value.is_empty())
        .map(str::to_owned))
}

/// Sets on `agent` what `body` says of each seed field it holds (an update touches only those).
fn apply(agent: &mut AgentConfig, body: &Map<String, Value>) -> Result<(), AppError> {
    if body.contains_key("model_id") {
        agent.model_id = text(body, "model_id")?.unwrap_or_default().to_owned();
    }
    if let Some(tools) = body.get("tool_ids") {
        agent.tool_ids = match tools {
            Value::Null => Vec::new(),
            other => serde_json::from_value(other.clone())
                .map_err(|_| AppError::bad_request("`tool_ids` must be a list of strings"))?,
        };
    }
    if body.contains_key("template_id") {
        agent.prompt_template = kept_text(body, "template_id")?;
    }
    if let Some(arguments) = body.get("template_arguments") {
        agent.template_arguments = match arguments {
            Value::Null => Map::new(),
            Value::Object(map) => map.clone(),
            _ => {
                return Err(AppError::bad_request(
                    "`template_arguments` must be an object",
                ));
            }
        };
    }
    if body.contains_key("system_prompt") {
        agent.system = kept_text(body, "system_prompt")?;
    }
    if body.contains_key("nickname") {
        agent.nickname = kept_text(body, "nickname")?;
    }
    if body.contains_key("myself_view") {
        agent.myself_view = kept_text(body, "myself_view")?;
    }
    if body.contains_key("description") {
        agent.description = kept_text(body, "description")?;
    }
    if body.contains_key("avatar") {
        agent.avatar = kept_text(body, "avatar")?;
    }
    Ok(())
}

/// A session's run status as the seed's feed names it.
fn seed_status(status: &str) -> &'static str {
    match status {
        "running" | "waiting" | "paused" => "streaming",
        "failed" | "interrupted" => "error",
        _ => "success",
    }
}

/// A status change as the seed's feed sends it (`data:` of an unnamed event), if it has one: a
/// run's status is `{"event": "message", "session_id", "status"}`, a new title
/// `{"event": "title_update", "session_id", "title"}`; a read mark is not the seed's news.
pub fn seed_status_event(change: &StatusChange) -> Option<Value> {
    match (change.status, &change.title) {
        (FeedStatus::Updated, Some(title)) => Some(json!({
            "event": "title_update",
            "session_id": change.session_id,
            "title": title,
        })),
        (FeedStatus::Updated, None) => None,
        (status, _) => Some(json!({
            "event": "message",
            "session_id": change.session_id,
            "status": seed_status(status.as_str()),
        })),
    }
}

/// `GET /v1/agents`: `{"agents": [...]}`.
pub async fn seed_agents(app: &App) -> Result<Value, AppError> {
    let agents = app.agents().await?;
    Ok(json!({"agents": agents.iter().map(agent_entry).collect::<Vec<_>>()}))
}

/// `GET /v1/agents/{id}`: the agent.
pub async fn seed_agent(app: &App, id: &str) -> Result<Value, AppError> {
    Ok(agent_entry(&app.agent(id).await?))
}

/// `POST /v1/agents` (`Some(id)` is `PUT /v1/agents/{id}`: only the fields the body holds
/// change): the agent as saved. A new agent needs `agent_id` and `model_id`.
pub async fn seed_save_agent(
    app: &App,
    existing: Option<&str>,
    body: Value,
) -> Result<(u16, Value), AppError> {
    let body = object(body)?;
    known_fields(&body, AGENT_FIELDS)?;
    match existing {
        Some(id) => {
            if let Some(other) = text(&body, "agent_id")?
                && other != id
            {
                return Err(AppError::bad_request(format!(
                    "`agent_id` {other:?} is not the agent of the path, {id:?}"
                )));
            }
            let mut agent = app.agent(id).await?;
            apply(&mut agent, &body)?;
            Box::pin(app.replace_agent(&agent)).await?;
            Ok((200, agent_entry(&agent)))
        }
        None => {
            required(&body, "agent_id")?;
            required(&body, "model_id")?;
            let id = text(&body, "agent_id")?.unwrap_or_default().to_owned();
            let mut agent: AgentConfig = serde_json::from_value(json!({"id": id, "model_id": ""}))
                .map_err(|error| AppError::internal(error.to_string()))?;
            apply(&mut agent, &body)?;
            app.create_agent(&agent).await?;
            Ok((201, agent_entry(&agent)))
        }
    }
}

/// `DELETE /v1/agents/{id}`.
pub async fn seed_delete_agent(app: &App, id: &str) -> Result<Value, AppError> {
    app.delete_agent(id).await?;
    Ok(json!({"status": "deleted", "agent_id": id}))
}

/// The first event of the seed's status feed: `{"event": "init", "sessions": {id: status}}`
/// for the caller's sessions.
pub async fn seed_status_init(app: &App, caller: &Principal) -> Result<Value, AppError> {
    let query = agentry_app::domain::store::SessionQuery {
        status: None,
        owner: caller.owner_filter(),
        limit: 1000,
        offset: 0,
    };
    let sessions = app.sessions().list(&query).await?.sessions;
    let statuses: Map<String, Value> = sessions
        .iter()
        .map(|session| {
            (
                session.id.to_string(),
                json!(seed_status(session.status.as_str())),
            )
        })
        .collect();
    Ok(json!({"event": "init", "sessions": statuses}))
}

/// `POST /v1/sessions/{id}/read`: marks the session read up to its last event.
pub async fn seed_mark_read(app: &App, caller: &Principal, id: &str) -> Result<Value, AppError> {
    let session: SessionId = agentry_app::ids::parse_session_id(id)?;
    app.check_session_access(caller, session).await?;
    let record = app.sessions().record(id).await?;
    app.sessions().mark_read(&record, None).await?;
    Ok(json!({"status": "success", "session_id": session}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_statuses_become_the_seeds_three() {
        assert_eq!(seed_status("running"), "streaming");
        assert_eq!(seed_status("waiting"), "streaming");
        assert_eq!(seed_status("failed"), "error");
        assert_eq!(seed_status("idle"), "success");
        let session = SessionId::new();
        let title = StatusChange {
            session_id: session,
            status: FeedStatus::Updated,
            stop_reason: None,
            title: Some("Cherries".into()),
        };
        assert_eq!(
            seed_status_event(&title),
            Some(json!({"event": "title_update", "session_id": session, "title": "Cherries"}))
        );
        let read = StatusChange {
            title: None,
            ..title
        };
        assert_eq!(seed_status_event(&read), None);
    }
}
