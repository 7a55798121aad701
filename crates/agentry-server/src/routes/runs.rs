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
//!
//! `interrupt`, `pause` and `abort` act on a live run: when it is live on another node of the
//! cluster, the request goes to that node ([`crate::relay`]).

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::approvals::{ApprovalList, ControlOutcome, DecideBody, DecideOutcome};
use agentry_app::auth::Principal;
use agentry_app::ids::parse_run_id;
use agentry_app::ids::parse_session_id;
use agentry_app::ops::Op;

use super::config::{ApiJson, ApiPath};
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{BadRequest, Conflict, JsonBodyErrors, NotFound, SessionPath};
use crate::state::AppState;

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
) -> Result<Json<ApprovalList>, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    Ok(Json(state.app.approvals_of_run(run_id).await?))
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
) -> Result<Json<ApprovalList>, ApiError> {
    let session = parse_session_id(&id)?;
    Ok(Json(state.app.approvals_of_session(session).await?))
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
    Caller(caller): Caller,
    ApiPath(path): ApiPath<RunPath>,
    headers: HeaderMap,
    ApiJson(body): ApiJson<DecideBody>,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    // An MCP server's question waits in the memory of the node running the call: the answer
    // goes there. (Decisions on waiting calls are durable: any node takes them.)
    if body.elicitation_id.is_some()
        && !crate::relay::was_relayed(&headers)
        && let Some(address) = state.app.remote_run_owner(run_id).await?
    {
        let json = serde_json::to_vec(&body)
            .map_err(|error| ApiError::internal(format!("cannot relay the answer: {error}")))?;
        let path = format!("/v1/runs/{run_id}/approvals");
        return crate::relay::forward(
            &state,
            &caller,
            &address,
            Method::POST,
            &path,
            &headers,
            json,
        )
        .await;
    }
    let outcome = Box::pin(state.app.submit(body.into_op(run_id)?)).await?;
    Ok(Json(DecideOutcome::from(outcome)).into_response())
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
    Caller(caller): Caller,
    ApiPath(path): ApiPath<RunPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    if let Some(relayed) = on_owner(&state, &caller, run_id, &headers, "interrupt").await? {
        return Ok(relayed);
    }
    let outcome = Box::pin(state.app.submit(Op::Interrupt { run_id })).await?;
    Ok(Json(ControlOutcome::new(&outcome, "interrupt", "interrupted")).into_response())
}

/// The answer of the node `run_id` is live on, asked to `action` it, when that is another node.
pub(crate) async fn on_owner(
    state: &AppState,
    caller: &Principal,
    run_id: agentry_types::RunId,
    headers: &HeaderMap,
    action: &str,
) -> Result<Option<Response>, ApiError> {
    if crate::relay::was_relayed(headers) {
        return Ok(None);
    }
    let Some(address) = state.app.remote_run_owner(run_id).await? else {
        return Ok(None);
    };
    let path = format!("/v1/runs/{run_id}/{action}");
    Ok(Some(
        crate::relay::forward(
            state,
            caller,
            &address,
            Method::POST,
            &path,
            headers,
            Vec::new(),
        )
        .await?,
    ))
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
    Caller(caller): Caller,
    ApiPath(path): ApiPath<RunPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    if let Some(relayed) = on_owner(&state, &caller, run_id, &headers, "pause").await? {
        return Ok(relayed);
    }
    let outcome = Box::pin(state.app.submit(Op::Pause { run_id })).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(ControlOutcome::new(&outcome, "pause", "pausing")),
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
    let outcome = Box::pin(state.app.submit(Op::Resume { run_id })).await?;
    Ok(Json(ControlOutcome::new(&outcome, "resume", "running")))
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
    Caller(caller): Caller,
    ApiPath(path): ApiPath<RunPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    if let Some(relayed) = on_owner(&state, &caller, run_id, &headers, "abort").await? {
        return Ok(relayed);
    }
    let outcome = Box::pin(state.app.submit(Op::Abort { run_id })).await?;
    Ok(Json(ControlOutcome::new(&outcome, "abort", "interrupted")).into_response())
}
