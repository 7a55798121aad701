//! Run control: approvals (`GET`/`POST /v1/runs/{run_id}/approvals`, and a session's pending
//! calls at `GET /v1/sessions/{id}/approvals`), `interrupt`, `pause`, `resume` and `abort`.
//!
//! The same approval routes list and answer MCP servers' requests for input made during the
//! run's tool calls (`elicitations`, see [`agentry_app::elicitation`]): those are live, not durable.
//!
//! A run is found by its id: first among the runs live or queued in this process, then in the
//! log (the `run_started` event that names it), so a run waiting for approval or paused is
//! found after a restart too. Every action goes through the `SessionManager`; a run that goes on
//! (approved, resumed) is handed to the hub like any other and streams to the session's
//! subscribers (`GET /v1/sessions/{id}/stream`).

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::domain::core::approval::ApprovalDecision;
use agentry_app::domain::mcp::ElicitationAnswer;
use agentry_types::{ApprovalVerdict, PendingApproval, RunId, SessionId};

use super::config::{ApiJson, ApiPath};
use super::infer::parse_session_id;
use crate::error::ApiError;
use crate::openapi::{BadRequest, Conflict, JsonBodyErrors, NotFound, SessionPath};
use crate::state::AppState;
use agentry_app::ops::{Op, OpOutcome};

/// The run-control routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_approvals, decide))
        .routes(routes!(session_approvals))
        .routes(routes!(interrupt))
        .routes(routes!(pause))
        .routes(routes!(resume))
        .routes(routes!(abort))
}

// --- documentation shapes ---

/// The run a route acts on.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct RunPath {
    /// The run's id: a UUIDv7, lowercase and hyphenated (`run_id` of `POST /v1/infer`, or of
    /// the session's `run_started` event).
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub run_id: String,
}

/// A tool call waiting for a decision.
#[derive(Debug, Clone, ToSchema)]
pub struct PendingCall {
    /// The call as the model asked for it: `id`, `name`, `arguments`.
    #[schema(value_type = Object)]
    pub call: Value,
    /// Why it needs approval.
    pub reason: String,
}

/// An MCP server's request for input, made during one of the run's tool calls, waiting for a
/// person. Answer with `POST /v1/runs/{run_id}/approvals` and `elicitation_id`: `approve` with
/// `content` (a form's answer, matching `requested_schema`; nothing for a URL request once the
/// page was visited) or `reject` (declined: the tool goes on without it).
#[derive(Debug, Clone, ToSchema)]
pub struct PendingElicitation {
    /// The request's id.
    pub elicitation_id: String,
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: Option<String>,
    /// The tool call in flight that the request belongs to.
    pub call_id: String,
    /// That call's tool.
    pub tool: String,
    /// The MCP server asking.
    pub server: String,
    /// What it asks, for a person.
    pub message: String,
    /// `form` or `url`.
    #[schema(pattern = "^(form|url)$")]
    pub mode: String,
    /// For a form: the JSON Schema of the answer.
    #[schema(value_type = Option<Object>)]
    pub requested_schema: Option<Value>,
    /// For a URL request: the page to visit.
    pub url: Option<String>,
    /// For a URL request: the server's id for it.
    pub elicitation_id_on_server: Option<String>,
    /// When it was asked (Unix milliseconds).
    pub created_at_ms: u64,
}

/// The calls of a run that wait for a decision.
#[derive(Debug, Clone, ToSchema)]
pub struct ApprovalList {
    /// The run (absent when the session has no waiting run).
    pub run_id: Option<String>,
    /// Its session.
    pub session_id: String,
    /// `waiting` when calls or elicitations wait; else the session's status.
    pub status: String,
    /// The undecided calls.
    pub pending: Vec<PendingCall>,
    /// MCP servers' requests for input waiting (live only).
    pub elicitations: Vec<PendingElicitation>,
}

/// A decision on one waiting call.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// The call's id (`pending[].call.id`).
    #[schema(min_length = 1)]
    pub call_id: String,
    /// `approve`, `reject` or `edit`.
    #[schema(value_type = String, pattern = "^(approve|reject|edit)$")]
    pub decision: ApprovalVerdict,
    /// Why; for `reject` the model reads it as the call's error result.
    #[serde(default)]
    #[schema(max_length = 4096)]
    pub reason: Option<String>,
    /// For `edit` (required): the arguments to run the call with, checked against the tool's
    /// schema.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub arguments: Option<Value>,
}

/// `POST /v1/runs/{run_id}/approvals`: one decision, or several in `decisions`; or the answer
/// to one MCP elicitation (`elicitation_id`, `decision` `approve` with `content`, or `reject`).
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// Several decisions, committed together.
    #[serde(default)]
    pub decisions: Option<Vec<DecisionBody>>,
    /// One decision: the call's id.
    #[serde(default)]
    pub call_id: Option<String>,
    /// One decision: `approve`, `reject` or `edit`.
    #[serde(default)]
    #[schema(value_type = Option<String>, pattern = "^(approve|reject|edit)$")]
    pub decision: Option<ApprovalVerdict>,
    /// One decision: why.
    #[serde(default)]
    pub reason: Option<String>,
    /// One decision: edited arguments.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub arguments: Option<Value>,
    /// An MCP elicitation to answer (`elicitations[].elicitation_id`) instead of a call.
    #[serde(default)]
    #[schema(min_length = 1)]
    pub elicitation_id: Option<String>,
    /// The answer to a form elicitation with `approve`: an object matching its
    /// `requested_schema`.
    #[serde(default)]
    #[schema(value_type = Option<Object>)]
    pub content: Option<Value>,
}

/// What the decisions led to.
#[derive(Debug, Clone, ToSchema)]
pub struct DecideOutcome {
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: String,
    /// `running` (every call decided: the run went on) or `waiting` (calls or elicitations
    /// remain).
    pub status: String,
    /// The calls still waiting.
    pub pending: Vec<PendingCall>,
    /// The elicitations still waiting.
    pub elicitations: Vec<PendingElicitation>,
    /// Where to follow the run.
    pub stream: String,
}

/// What a control action did: the body the control routes answer with.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct ControlOutcome {
    /// The run.
    #[schema(value_type = String)]
    pub run_id: RunId,
    /// Its session.
    #[schema(value_type = String)]
    pub session_id: SessionId,
    /// `interrupt`, `pause`, `resume` or `abort`.
    pub action: &'static str,
    /// For `pause`: `pausing` (the run stops before its next model call, then `paused`); for
    /// `resume`: `running`; for `interrupt` and `abort`: `interrupted`.
    pub status: &'static str,
    /// For `abort`: how many queued messages of the session were dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped_queued: Option<u64>,
    /// Where to follow the run.
    pub stream: String,
}

// --- helpers ---

fn parse_run_id(id: &str) -> Result<RunId, ApiError> {
    RunId::parse(id).map_err(|error| ApiError::bad_request(format!("invalid run id: {error}")))
}

/// The session of `run_id` (see [`agentry_app::App::locate`]).
pub(crate) async fn locate(state: &AppState, run_id: RunId) -> Result<SessionId, ApiError> {
    Ok(state.app.locate(run_id).await?)
}

fn pending_json(pending: &[PendingApproval]) -> Vec<Value> {
    pending
        .iter()
        .map(|p| json!({"call": p.call, "reason": p.reason}))
        .collect()
}

/// What of `run_id` waits for a person: its undecided calls and its open MCP elicitations.
async fn waiting_for(
    state: &AppState,
    session: SessionId,
    run_id: RunId,
) -> Result<(Vec<PendingApproval>, Vec<Value>), ApiError> {
    let pending = state.app.pending_of(session, run_id).await?;
    Ok((pending, state.elicitations.for_run(run_id)))
}

/// The body of a command's answer: the approval routes' (`DecideOutcome`) or the control
/// routes' (`RunControl`).
fn outcome_body(outcome: &OpOutcome) -> Value {
    let mut body = approvals_body(
        Some(outcome.run_id),
        outcome.session_id,
        outcome.status.as_str(),
        &outcome.pending,
        outcome.elicitations.clone(),
    );
    body["stream"] = json!(stream_path(outcome.session_id));
    body
}

/// The body the approval routes answer with (`ApprovalList`, and `DecideOutcome` less its
/// `stream`).
fn approvals_body(
    run_id: Option<RunId>,
    session: SessionId,
    status: &str,
    pending: &[PendingApproval],
    elicitations: Vec<Value>,
) -> Value {
    json!({
        "run_id": run_id,
        "session_id": session,
        "status": status,
        "pending": pending_json(pending),
        "elicitations": elicitations,
    })
}

fn stream_path(session: SessionId) -> String {
    format!("/v1/sessions/{session}/stream")
}

// --- routes ---

/// The calls of a run that wait for a person's decision.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}/approvals",
    tag = "runs",
    operation_id = "list_approvals",
    params(RunPath),
    responses(
        (status = 200, description = "The undecided calls (empty when the run does not wait).",
         body = ApprovalList),
        BadRequest,
        NotFound,
    )
)]
async fn list_approvals(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
) -> Result<Json<Value>, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    let session = locate(&state, run_id).await?;
    let (pending, elicitations) = waiting_for(&state, session, run_id).await?;
    let status = if !pending.is_empty() || !elicitations.is_empty() {
        "waiting".to_owned()
    } else if state.hub.is_live(session) {
        "running".to_owned()
    } else {
        state
            .store
            .session(session)
            .await?
            .map_or_else(|| "idle".to_owned(), |record| record.status)
    };
    Ok(Json(approvals_body(
        Some(run_id),
        session,
        &status,
        &pending,
        elicitations,
    )))
}

/// The calls of a session's run that wait for a person's decision.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/approvals",
    tag = "runs",
    operation_id = "session_approvals",
    params(SessionPath),
    responses(
        (status = 200, description = "The waiting run and its undecided calls (no `run_id` and \
         no calls when no run waits).", body = ApprovalList),
        BadRequest,
        NotFound,
    )
)]
async fn session_approvals(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    let session = parse_session_id(&id)?;
    let record = state
        .store
        .session(session)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no session {session}")))?;
    let waiting = state.sessions.pending_approvals(session).await?;
    let (asking_run, elicitations) = state.elicitations.for_session(session);
    let status = if waiting.is_some() || !elicitations.is_empty() {
        "waiting".to_owned()
    } else if state.hub.is_live(session) {
        "running".to_owned()
    } else {
        record.status
    };
    let (run_id, pending) = match waiting {
        Some((run_id, pending)) => (Some(run_id), pending),
        None => (asking_run, Vec::new()),
    };
    Ok(Json(approvals_body(
        run_id,
        session,
        &status,
        &pending,
        elicitations,
    )))
}

/// Decides waiting calls: approve, reject (the model reads the reason as the call's error
/// result) or edit the arguments (checked against the tool's schema).
///
/// The decisions are committed together (`approval_decided` events). Once every waiting call
/// of the round is decided, the run goes on in its session with the same id, streaming to the
/// session's subscribers.
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/approvals",
    tag = "runs",
    operation_id = "decide_approvals",
    params(RunPath),
    request_body = DecideBody,
    responses(
        (status = 200, description = "Recorded; `status` says whether the run went on.",
         body = DecideOutcome),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn decide(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
    ApiJson(body): ApiJson<DecideBody>,
) -> Result<Json<Value>, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    if body.elicitation_id.is_some() || body.content.is_some() {
        return answer_elicitation(&state, run_id, body).await;
    }
    let decisions = decisions_of(body)?;
    let outcome = state.submit(Op::Decide { run_id, decisions }).await?;
    Ok(Json(outcome_body(&outcome)))
}

/// Answers one MCP elicitation of a live run: `approve` (with `content` for a form) accepts,
/// `reject` declines.
async fn answer_elicitation(
    state: &AppState,
    run_id: RunId,
    body: DecideBody,
) -> Result<Json<Value>, ApiError> {
    let Some(id) = body.elicitation_id else {
        return Err(ApiError::bad_request(
            "`content` answers an elicitation: give its `elicitation_id` too",
        ));
    };
    if body.decisions.is_some() || body.call_id.is_some() || body.arguments.is_some() {
        return Err(ApiError::bad_request(
            "answer an elicitation (`elicitation_id`, `decision`, `content`) or decide calls, \
             not both in one request",
        ));
    }
    let answer = match body.decision {
        Some(ApprovalVerdict::Approve) => {
            ElicitationAnswer::Accept(body.content.unwrap_or(Value::Null))
        }
        Some(ApprovalVerdict::Reject) if body.content.is_none() => ElicitationAnswer::Decline,
        Some(ApprovalVerdict::Reject) => {
            return Err(ApiError::bad_request(
                "a rejected elicitation takes no `content`",
            ));
        }
        Some(ApprovalVerdict::Edit) => {
            return Err(ApiError::bad_request(
                "an elicitation is answered with `approve` (and `content`) or `reject`, not `edit`",
            ));
        }
        None => return Err(ApiError::bad_request("`decision` is required")),
    };
    let outcome = state
        .submit(Op::AnswerElicitation {
            run_id,
            elicitation_id: id,
            answer,
        })
        .await?;
    Ok(Json(outcome_body(&outcome)))
}

fn decisions_of(body: DecideBody) -> Result<Vec<ApprovalDecision>, ApiError> {
    let single = body.call_id.is_some()
        || body.decision.is_some()
        || body.reason.is_some()
        || body.arguments.is_some();
    let list = match (body.decisions, single) {
        (Some(_), true) => {
            return Err(ApiError::bad_request(
                "give one decision (`call_id`, `decision`, …) or `decisions`, not both",
            ));
        }
        (Some(list), false) => list,
        (None, true) => vec![DecisionBody {
            call_id: body
                .call_id
                .ok_or_else(|| ApiError::bad_request("`call_id` is required"))?,
            decision: body
                .decision
                .ok_or_else(|| ApiError::bad_request("`decision` is required"))?,
            reason: body.reason,
            arguments: body.arguments,
        }],
        (None, false) => {
            return Err(ApiError::bad_request(
                "no decision: give `call_id` and `decision`, or `decisions`",
            ));
        }
    };
    if list.is_empty() {
        return Err(ApiError::bad_request("`decisions` is empty"));
    }
    let mut decisions = Vec::with_capacity(list.len());
    for (index, item) in list.into_iter().enumerate() {
        if decisions
            .iter()
            .any(|d: &ApprovalDecision| d.call_id == item.call_id)
        {
            return Err(ApiError::bad_request(format!(
                "call {:?} is decided twice",
                item.call_id
            )));
        }
        let decision = ApprovalDecision {
            call_id: item.call_id,
            decision: item.decision,
            reason: item.reason,
            arguments: item.arguments,
        };
        decision
            .check()
            .map_err(|error| ApiError::bad_request(format!("decision {index}: {error}")))?;
        decisions.push(decision);
    }
    Ok(decisions)
}

/// Interrupts a run: a live run's current step is cancelled (the model call and the tools in
/// flight) and the run ends `cancelled`; a waiting or paused run ends `cancelled` at once. The
/// session stays usable.
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/interrupt",
    tag = "runs",
    operation_id = "interrupt_run",
    params(RunPath),
    responses(
        (status = 200, description = "The run was interrupted.", body = ControlOutcome),
        BadRequest,
        NotFound,
        Conflict,
    )
)]
async fn interrupt(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
) -> Result<Json<ControlOutcome>, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    let outcome = state.submit(Op::Interrupt { run_id }).await?;
    Ok(Json(control(&outcome, "interrupt", "interrupted")))
}

/// Pauses a live run at its next safe point: before its next model call, once the round in
/// progress has finished. The run then commits `run_paused` and the session's status is
/// `paused`, across restarts too, until `POST /v1/runs/{run_id}/resume`.
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/pause",
    tag = "runs",
    operation_id = "pause_run",
    params(RunPath),
    responses(
        (status = 202, description = "The run will pause at its next safe point.",
         body = ControlOutcome),
        BadRequest,
        NotFound,
        Conflict,
    )
)]
async fn pause(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    let outcome = state.submit(Op::Pause { run_id }).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(control(&outcome, "pause", "pausing")),
    )
        .into_response())
}

/// Resumes a paused run where it stopped: same session, same run id.
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/resume",
    tag = "runs",
    operation_id = "resume_run",
    params(RunPath),
    responses(
        (status = 200, description = "The run goes on; follow it at `stream`.",
         body = ControlOutcome),
        BadRequest,
        NotFound,
        Conflict,
    )
)]
async fn resume(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
) -> Result<Json<ControlOutcome>, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    let outcome = state.submit(Op::Resume { run_id }).await?;
    Ok(Json(control(&outcome, "resume", "running")))
}

/// Aborts a run: interrupts it (live, waiting or paused) and drops every message queued in its
/// session behind it (`policy: enqueue`); nothing of the dropped ones is committed.
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/abort",
    tag = "runs",
    operation_id = "abort_run",
    params(RunPath),
    responses(
        (status = 200, description = "The run was aborted.", body = ControlOutcome),
        BadRequest,
        NotFound,
        Conflict,
    )
)]
async fn abort(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
) -> Result<Json<ControlOutcome>, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    let outcome = state.submit(Op::Abort { run_id }).await?;
    Ok(Json(control(&outcome, "abort", "interrupted")))
}

/// The body of a control route's answer: the action taken and the status it leads to
/// (`pausing` until the round ends).
fn control(outcome: &OpOutcome, action: &'static str, status: &'static str) -> ControlOutcome {
    ControlOutcome {
        run_id: outcome.run_id,
        session_id: outcome.session_id,
        action,
        status,
        dropped_queued: outcome
            .dropped_queued
            .map(|dropped| u64::try_from(dropped).unwrap_or(u64::MAX)),
        stream: stream_path(outcome.session_id),
    }
}
