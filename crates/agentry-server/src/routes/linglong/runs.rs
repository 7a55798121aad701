//! The seed's two inference routes: [`seed_start`] checks a seed request and starts its run
//! (or continues a session's, or posts to a group chat), and [`SeedStart::frames`] /
//! [`seed_infer`] give what `/v1/infer/stream` and `/v1/infer` answer.

use std::sync::Arc;

use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};

use agentry_app::domain::core::session::BusyPolicy;
use agentry_types::{RunEvent, SessionId};

use super::frames::{SeedFrames, merge_turns};
use super::group;
use super::request::{DEFAULT_MAX_TOOL_ROUNDS, SeedInferRequest};
use agentry_app::App;
use agentry_app::AppError;
use agentry_app::auth::Principal;
use agentry_app::follow::FollowFrom;
use agentry_app::hub::Subscription;
use agentry_app::runs::{RunSpec, SessionChoice, Target, start_in_session};

/// A seed run that has started: its session (none when stateless) and its events.
pub struct SeedStart {
    /// The session it runs in.
    pub session_id: Option<SessionId>,
    /// The tool rounds it may take (for the seed's message when it takes them all).
    pub max_tool_rounds: u32,
    /// Its events, to its end.
    pub events: BoxStream<'static, Arc<RunEvent>>,
    /// A group chat's exchange instead (`events` is then empty).
    pub group: Option<group::SeedGroup>,
}

impl std::fmt::Debug for SeedStart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeedStart")
            .field("session_id", &self.session_id)
            .field("max_tool_rounds", &self.max_tool_rounds)
            .finish_non_exhaustive()
    }
}

/// What the seed's `/v1/infer` answers: `{"success", "messages", "session_id"?, "error"?,
/// "error_code"?, "stat"?}`; a run that failed is an HTTP 500 there.
#[derive(Debug, Clone, PartialEq)]
pub struct SeedAnswer {
    /// Whether the run ended without an error.
    pub success: bool,
    /// The body.
    pub body: Value,
}

impl SeedStart {
    /// The seed's stream messages: the run's, then (for a session) `{"session_id"}`. A run
    /// whose events end before its end (the server is shutting down) ends with `{"error"}`.
    pub fn frames(self) -> BoxStream<'static, Value> {
        let SeedStart {
            session_id,
            max_tool_rounds,
            mut events,
            group,
        } = self;
        if let Some(group) = group {
            return group_frames(group);
        }
        async_stream::stream! {
            let mut frames = SeedFrames::new(session_id.is_some(), max_tool_rounds);
            while let Some(event) = events.next().await {
                for frame in frames.map(&event) {
                    yield frame;
                }
                if frames.ended {
                    break;
                }
            }
            if !frames.ended {
                yield json!({"error": "the run stopped before its end (the server is shutting down)"});
            } else if let Some(session) = session_id {
                yield json!({"session_id": session});
            }
        }
        .boxed()
    }
}

/// A group exchange's stream messages, then `{"session_id"}` (or `{"error"}` when its events
/// end before its end).
fn group_frames(group: group::SeedGroup) -> BoxStream<'static, Value> {
    let group::SeedGroup {
        session_id,
        mut events,
        names,
    } = group;
    async_stream::stream! {
        let mut frames = group::GroupFrames::new(names);
        while let Some(live) = events.next().await {
            let Ok(live) = live else { break };
            for frame in frames.map(&live) {
                yield frame;
            }
            if frames.ended {
                break;
            }
        }
        if frames.ended {
            yield json!({"session_id": session_id});
        } else {
            yield json!({"error": "the group chat stopped before its end (the server is shutting down)"});
        }
    }
    .boxed()
}

/// Checks a seed inference request and starts its run: stateless, in a new session, in
/// the session named, or (`continue`) the session's interrupted run going on; or, naming
/// several agents, a group chat's exchange.
pub async fn seed_start(
    app: &App,
    caller: &Principal,
    body: SeedInferRequest,
) -> Result<SeedStart, AppError> {
    let agent_id = match body.agent_ids.as_slice() {
        [] => None,
        [id] => Some(id.clone()),
        _ => {
            let group = Box::pin(super::group::seed_group_start(app, caller, &body)).await?;
            return Ok(SeedStart {
                session_id: Some(group.session_id),
                max_tool_rounds: DEFAULT_MAX_TOOL_ROUNDS,
                events: futures::stream::empty().boxed(),
                group: Some(group),
            });
        }
    };
    if body.continue_run {
        return Box::pin(seed_continue(app, caller, &body)).await;
    }
    let session = match body.session_id.as_deref() {
        None | Some("") => SessionChoice::Ephemeral,
        Some("new") => SessionChoice::New,
        Some(id) => SessionChoice::Existing(agentry_app::ids::parse_session_id(id)?),
    };
    let mut conversation = body.conversation(session == SessionChoice::Ephemeral)?;
    // A system message naming a template: rendered now, after any system text.
    if let Some((template, arguments)) = conversation.system_template.take() {
        let rendered = app.templates().render(&template, &arguments)?;
        conversation.system = Some(match conversation.system.take() {
            Some(text) => format!("{text}\n\n{rendered}"),
            None => rendered,
        });
    }
    let max_tool_rounds = match (&agent_id, body.max_tool_rounds) {
        (_, Some(rounds)) => Some(rounds),
        (None, None) => Some(DEFAULT_MAX_TOOL_ROUNDS),
        (Some(_), None) => None,
    };
    let input = RunSpec {
        agent_id,
        model_id: body.model_id,
        system: conversation.system,
        tool_ids: (!body.tool_ids.is_empty()).then(|| seed_tool_names(app, &body.tool_ids)),
        max_tool_rounds,
        history: conversation.history,
        input: conversation.input,
        session,
        ..RunSpec::default()
    };
    let (target, request) = Box::pin(agentry_app::runs::prepare(app, caller, input)).await?;
    let max_tool_rounds = request
        .limits
        .as_ref()
        .map_or(DEFAULT_MAX_TOOL_ROUNDS, |limits| limits.max_tool_rounds);
    match target {
        Target::Ephemeral => {
            let run = app.stream_stateless(request)?;
            Ok(SeedStart {
                session_id: None,
                max_tool_rounds,
                events: run.map(Arc::new).boxed(),
                group: None,
            })
        }
        Target::Session(session) => {
            let subscription =
                Box::pin(start_in_session(app, session, request, BusyPolicy::Reject)).await?;
            Ok(SeedStart {
                session_id: Some(session),
                max_tool_rounds,
                events: followed(app, session, subscription),
                group: None,
            })
        }
    }
}

/// The tools seed ids name: the seed calls a function tool `function-<name>`.
fn seed_tool_names(app: &App, ids: &[String]) -> Vec<String> {
    ids.iter()
        .map(|id| {
            if app.tools().has(id) {
                id.clone()
            } else {
                super::tools::tool_name(id).to_owned()
            }
        })
        .collect()
}

/// `continue: true`: the named session's interrupted run goes on (or the model goes on
/// from its history).
async fn seed_continue(
    app: &App,
    caller: &Principal,
    body: &SeedInferRequest,
) -> Result<SeedStart, AppError> {
    if body.text.is_some() || !body.messages.is_empty() {
        return Err(AppError::bad_request(
            "`continue` goes on with the session as it is: send no new message",
        ));
    }
    let id = body
        .session_id
        .as_deref()
        .filter(|id| *id != "new")
        .ok_or_else(|| AppError::bad_request("`continue` needs the `session_id` to go on"))?;
    let record = app.sessions().record(id).await?;
    app.check_session_access(caller, record.id).await?;
    let subscription = Box::pin(app.sessions().go_on_followed(caller, &record)).await?;
    Ok(SeedStart {
        session_id: Some(record.id),
        max_tool_rounds: body.max_tool_rounds.unwrap_or(DEFAULT_MAX_TOOL_ROUNDS),
        events: followed(app, record.id, subscription),
        group: None,
    })
}

/// A session run's events from `subscription` to its end ([`App::follow`]: a subscriber
/// that fell behind is caught up from the log, text included); a log that cannot be read
/// ends them (the run goes on).
fn followed(
    app: &App,
    session: SessionId,
    subscription: Subscription,
) -> BoxStream<'static, Arc<RunEvent>> {
    let app = app.clone();
    async_stream::stream! {
        let first = None;
        let Ok(mut events) = Box::pin(app.follow(session, FollowFrom::Live { subscription, first })).await
        else {
            return;
        };
        while let Some(Ok(event)) = events.next().await {
            yield event;
        }
    }
    .boxed()
}

/// The seed's `/v1/infer`: runs the request to its end and answers the seed's body, the
/// turns merged from the same messages its stream would have sent.
pub async fn seed_infer(
    app: &App,
    caller: &Principal,
    body: SeedInferRequest,
) -> Result<SeedAnswer, AppError> {
    let SeedStart {
        session_id,
        max_tool_rounds,
        mut events,
        group,
    } = Box::pin(seed_start(app, caller, body)).await?;
    if let Some(group) = group {
        return Ok(seed_group_answer(group).await);
    }
    let mut frames = SeedFrames::new(session_id.is_some(), max_tool_rounds);
    let mut sent = Vec::new();
    while let Some(event) = events.next().await {
        sent.extend(frames.map(&event));
        if frames.ended {
            break;
        }
    }
    let (turns, stat) = merge_turns(&sent, &answer_time());
    Ok(seed_answer(
        turns,
        stat,
        session_id,
        frames.error.as_ref(),
        frames.ended,
    ))
}

/// When an answer's turns happened, as the seed writes it.
fn answer_time() -> String {
    chrono::Utc::now().format("%Y-%m-%dT%H:%M:%S").to_string()
}

/// The seed's `/v1/infer` body: `success: false` with the error (and its code) when the run
/// failed (`error`) or stopped before its end (not `ended`).
fn seed_answer(
    turns: Vec<Value>,
    stat: Option<Value>,
    session_id: Option<SessionId>,
    error: Option<&super::frames::SeedError>,
    ended: bool,
) -> SeedAnswer {
    let mut body = json!({"success": true, "messages": turns});
    if let Some(session) = session_id {
        body["session_id"] = json!(session);
    }
    let error = match (error, ended) {
        (Some(error), _) => Some((error.text.clone(), error.code.clone())),
        (None, true) => None,
        (None, false) => Some((
            "Error: the run stopped before its end (the server is shutting down)".to_owned(),
            "INTERRUPTED".to_owned(),
        )),
    };
    if let Some((text, code)) = &error {
        body["success"] = json!(false);
        body["error"] = json!(text);
        body["error_code"] = json!(code);
    }
    if let Some(stat) = stat {
        body["stat"] = stat;
    }
    SeedAnswer {
        success: error.is_none(),
        body,
    }
}

/// The seed's `/v1/infer` answer for a group exchange: every member's turns (grouped by member,
/// in the order they first spoke), `success: false` with the first member's error when one
/// failed.
async fn seed_group_answer(group: group::SeedGroup) -> SeedAnswer {
    let group::SeedGroup {
        session_id,
        mut events,
        names,
    } = group;
    let mut frames = group::GroupFrames::new(names);
    let mut sent = Vec::new();
    while let Some(Ok(live)) = events.next().await {
        sent.extend(frames.map(&live));
        if frames.ended {
            break;
        }
    }
    let (turns, stat) = group::group_turns(&sent, &answer_time());
    seed_answer(
        turns,
        stat,
        Some(session_id),
        frames.errors.first(),
        frames.ended,
    )
}

/// `GET /v1/setup`: the seed's `op=hello` (the default) — who answers and where its API is. The
/// seed's installer export and update push (`op=export`, `op=push`) copy its Python sources;
/// Agentry is one binary (`cargo install`, or the release archive), so they are refused.
pub fn seed_setup(op: Option<&str>) -> Result<Value, AppError> {
    match op {
        None | Some("" | "hello") => Ok(json!({
            "status": "ok",
            "name": "agentry",
            "version": env!("CARGO_PKG_VERSION"),
            "api": "/linglong/v1",
        })),
        Some(other) => Err(AppError::bad_request(format!(
            "op={other} is not served: Agentry installs as one binary (only op=hello)"
        ))),
    }
}
