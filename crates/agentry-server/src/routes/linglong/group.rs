//! The seed's group chats: `/v1/infer` and `/v1/infer/stream` naming two or more `agent_ids`.
//! The exchange runs as Agentry's own group chat ([`agentry_app::group`]: members woken by
//! `@mentions`, each in a session of its own, in parallel within a round) and is answered in the
//! seed's shapes: every member's stream messages carry its `agent_id` (and, for its assistant
//! messages, its nickname as `name`), members' messages interleave as they come, a member that
//! fails says so in an `Error: …` message of its own while the others go on, and the answer's
//! turns are grouped by member in the order they first spoke. A group chat is durable here: it
//! always has a session (`"new"` when the request names none), whose id the answer gives.

use std::collections::HashMap;

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

use agentry_types::SessionId;

use super::frames::{SeedError, SeedFrames, merge_turns};
use super::request::{DEFAULT_MAX_TOOL_ROUNDS, SeedInferRequest};
use agentry_app::App;
use agentry_app::AppError;
use agentry_app::auth::Principal;
use agentry_app::group::GroupLive;

/// A group exchange that has started: its live events, and the members' display names.
pub struct SeedGroup {
    /// The group session.
    pub session_id: SessionId,
    /// Its events, to the exchange's end.
    pub events: BoxStream<'static, Result<std::sync::Arc<GroupLive>, AppError>>,
    /// Each member's name in messages: its nickname, else its id.
    pub names: HashMap<String, String>,
}

/// Turns a group exchange's events into the seed's stream messages, one mapper per member.
#[derive(Debug, Default)]
pub struct GroupFrames {
    members: HashMap<String, SeedFrames>,
    names: HashMap<String, String>,
    /// Set once the exchange's end was seen.
    pub ended: bool,
    /// The members that failed, in order.
    pub errors: Vec<SeedError>,
}

impl GroupFrames {
    /// A mapper for a group whose members are called `names`.
    pub fn new(names: HashMap<String, String>) -> Self {
        Self {
            names,
            ..Self::default()
        }
    }

    /// The seed's messages for one event of the exchange.
    pub fn map(&mut self, live: &GroupLive) -> Vec<Value> {
        match live {
            GroupLive::Member {
                agent_id, event, ..
            } => {
                let mapper = self
                    .members
                    .entry(agent_id.clone())
                    .or_insert_with(|| SeedFrames::new(true, DEFAULT_MAX_TOOL_ROUNDS));
                let had_error = mapper.error.is_some();
                let mut frames = mapper.map(event);
                if !had_error && let Some(error) = &mapper.error {
                    self.errors.push(error.clone());
                }
                // A member's run ending is not the exchange's end.
                mapper.ended = false;
                let name = self
                    .names
                    .get(agent_id)
                    .cloned()
                    .unwrap_or_else(|| agent_id.clone());
                for frame in &mut frames {
                    frame["agent_id"] = json!(agent_id);
                    if frame["role"] == "assistant" {
                        frame["name"] = json!(name);
                    }
                }
                frames
            }
            live => {
                if agentry_app::group::is_end(live) {
                    self.ended = true;
                }
                Vec::new()
            }
        }
    }
}

/// The seed's answer turns of a group exchange: each member's turns merged, members in the
/// order they first spoke; and the last usage seen.
pub fn group_turns(frames: &[Value], timestamp: &str) -> (Vec<Value>, Option<Value>) {
    let mut order: Vec<&str> = Vec::new();
    for frame in frames {
        if let Some(agent) = frame["agent_id"].as_str()
            && !order.contains(&agent)
        {
            order.push(agent);
        }
    }
    let mut turns = Vec::new();
    let mut stat = None;
    for agent in order {
        let own: Vec<Value> = frames
            .iter()
            .filter(|frame| frame["agent_id"].as_str() == Some(agent))
            .cloned()
            .collect();
        let name = own
            .iter()
            .find_map(|frame| frame["name"].as_str().map(str::to_owned));
        let (merged, last) = merge_turns(&own, timestamp);
        stat = last.or(stat);
        for mut turn in merged {
            turn["agent_id"] = json!(agent);
            if turn["role"] == "assistant"
                && let Some(name) = &name
            {
                turn["name"] = json!(name);
            }
            turns.push(turn);
        }
    }
    (turns, stat)
}

/// Posts a seed request naming several agents to their group session (a new one unless it
/// names one) and follows the exchange.
pub(super) async fn seed_group_start(
    app: &App,
    caller: &Principal,
    body: &SeedInferRequest,
) -> Result<SeedGroup, AppError> {
    if body.continue_run {
        return Err(AppError::bad_request(
            "`continue` is for one agent's session, not a group chat",
        ));
    }
    if body.model_id.is_some() || !body.tool_ids.is_empty() || body.max_tool_rounds.is_some() {
        return Err(AppError::bad_request(
            "`model_id`, `tool_ids` and `max_tool_rounds` do not apply to a group chat: each \
             member runs as its saved agent",
        ));
    }
    body.conversation(false)?;
    // The seed reads the last user message; `text` is its shorthand.
    let text = match &body.text {
        Some(text) => text.clone(),
        None => body
            .messages
            .iter()
            .rev()
            .find(|message| message.role == "user")
            .and_then(|message| message.content.as_ref())
            .and_then(Value::as_str)
            .map(str::to_owned)
            .ok_or_else(|| AppError::bad_request("a group chat takes a user message with text"))?,
    };
    let request: crate::routes::run_request::InferRequest = serde_json::from_value(json!({
        "agent_ids": body.agent_ids,
        "text": text,
        "session_id": body.session_id.as_deref().filter(|id| !id.is_empty()).unwrap_or("new"),
    }))
    .map_err(|error| AppError::bad_request(error.to_string()))?;
    let agents = agentry_app::group::check_members(app, &body.agent_ids).await?;
    let names = agents
        .into_iter()
        .map(|agent| {
            let name = agent.nickname.clone().unwrap_or_else(|| agent.id.clone());
            (agent.id, name)
        })
        .collect();
    let (session, started) = Box::pin(app.submit(agentry_app::ops::PostToGroup {
        caller: caller.clone(),
        post: request.group_post()?,
    }))
    .await?;
    let events = agentry_app::group::follow(
        app.clone(),
        session,
        started.first_seq.saturating_sub(1),
        Some((started.run_id, started.events)),
    )
    .boxed();
    Ok(SeedGroup {
        session_id: session,
        events,
        names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_are_grouped_by_member_in_the_order_they_first_spoke() {
        let frames = vec![
            json!({"role": "assistant", "content": "Hi", "agent_id": "b", "name": "Bee"}),
            json!({"role": "assistant", "content": "Yo", "agent_id": "a", "name": "Ay"}),
            json!({"role": "assistant", "content": " there", "agent_id": "b", "name": "Bee"}),
        ];
        let (turns, _) = group_turns(&frames, "t");
        let shown: Vec<(&str, &str, &str)> = turns
            .iter()
            .map(|t| {
                (
                    t["agent_id"].as_str().unwrap(),
                    t["name"].as_str().unwrap(),
                    t["content"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(shown, [("b", "Bee", "Hi there"), ("a", "Ay", "Yo")]);
    }
}
