//! Background runs: `POST /v1/runs` (the body of `/v1/infer`; `202` with the run at once),
//! `GET /v1/runs` (filtered, paginated; every run with a record, those started in their
//! sessions included), `GET /v1/runs/{run_id}`, `GET /v1/runs/{run_id}/wait`
//! (long poll), `GET /v1/runs/{run_id}/stream` (SSE, `Last-Event-ID`) and
//! `POST /v1/runs/{run_id}/cancel`. The queue, its worker and its rules are
//! [`agentry_app::queue`]'s; these routes parse, call and render.

use std::time::Duration;

use axum::Json;
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::run_request::InferRequest;
use agentry_app::domain::store::{RunQuery, RunState};
use agentry_app::ids::parse_run_id;
use agentry_app::ids::parse_session_id;
use agentry_app::ops::Enqueue;
use agentry_app::queue::{RunList, RunView};
use agentry_app::webhooks::{DeliveryList, WebhookSecret};

use super::config::ApiPath;
use super::runs::RunPath;
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{BadRequest, Conflict, JsonBodyErrors, NotFound, TooManyRequests};
use crate::state::AppState;

/// The longest a wait may last.
const MAX_WAIT_SECS: u64 = 300;

/// How long a stream waits for a queued run to start before it ends.
const START_WAIT: Duration = Duration::from_secs(60);

/// The background-run routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(submit, list))
        .routes(routes!(show))
        .routes(routes!(wait))
        .routes(routes!(stream))
        .routes(routes!(cancel))
        .routes(routes!(webhooks))
        .routes(routes!(rotate_secret))
}

/// Where a submitted run goes in the queue.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct SubmitQuery {
    /// Higher runs start first (-100 to 100).
    #[serde(default)]
    #[param(default = 0, minimum = -100, maximum = 100)]
    priority: i64,
}

/// Submits a run to the queue and answers at once.
///
/// The body is `POST /v1/infer`'s, checked the same way before anything is stored; without a
/// `session_id` the run gets a new session. An `Idempotency-Key` header makes retries safe: the
/// same key with the same body answers the run it made (`200`), with another body `409`. When
/// the queue is full the answer is `429` with `Retry-After`, and nothing is stored.
#[utoipa::path(
    post,
    path = "/v1/runs",
    tag = "runs",
    operation_id = "submit_run",
    params(
        SubmitQuery,
        ("Idempotency-Key" = Option<String>, Header,
         description = "1 to 255 characters: the same key returns the same run."),
    ),
    request_body = InferRequest,
    responses(
        (status = 202, description = "Queued.", body = RunView,
         links(
             ("get_run" = (operation_id = "get_run", parameters(("run_id" = "$response.body#/run_id")))),
             ("wait_run" = (operation_id = "wait_run", parameters(("run_id" = "$response.body#/run_id")))),
             ("cancel_run" = (operation_id = "cancel_run", parameters(("run_id" = "$response.body#/run_id")))),
         )),
        (status = 200, description = "Submitted before with this `Idempotency-Key`: that run.",
         body = RunView),
        JsonBodyErrors,
        NotFound,
        Conflict,
        TooManyRequests,
    )
)]
async fn submit(
    State(state): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    query: Result<Query<SubmitQuery>, QueryRejection>,
    body: Result<Json<InferRequest>, JsonRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let key = match headers.get("idempotency-key") {
        None => None,
        Some(value) => Some(
            value
                .to_str()
                .map_err(|_| ApiError::bad_request("`Idempotency-Key` must be visible ASCII"))?
                .to_owned(),
        ),
    };
    let Json(body) = body?;
    if body.is_group() {
        return Err(ApiError::bad_request(
            "a group chat cannot run in the background: use `POST /v1/infer` or `/v1/groups`",
        ));
    }
    if body.cancel_on_disconnect {
        return Err(ApiError::bad_request(
            "`cancel_on_disconnect` does not apply to a background run: cancel it with \
             `POST /v1/runs/{run_id}/cancel`",
        ));
    }
    let enqueue = Enqueue {
        caller,
        spec: body.into_spec()?,
        idempotency_key: key,
        priority: query.priority,
    };
    let (run, created) = Box::pin(state.app.submit(enqueue)).await?;
    let status = if created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    let location = HeaderValue::from_str(&format!("/v1/runs/{}", run.run_id))
        .map_err(|error| ApiError::internal(error.to_string()))?;
    Ok((status, [(header::LOCATION, location)], Json(run)).into_response())
}

/// Which runs to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this session's.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    session_id: Option<String>,
    /// Only runs as this agent.
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    agent_id: Option<String>,
    /// Only runs in this state.
    #[param(pattern = "^(queued|running|waiting|paused|succeeded|failed|cancelled)$")]
    state: Option<String>,
    /// Only runs this schedule fired.
    #[param(max_length = 64)]
    schedule_id: Option<String>,
    /// Only runs submitted at or after this time (Unix milliseconds).
    created_after: Option<u64>,
    /// Only runs submitted before this time (Unix milliseconds).
    created_before: Option<u64>,
    /// Only background runs (`true`), or only runs started in their sessions (`false`).
    background: Option<bool>,
    /// At most this many.
    #[serde(default = "default_limit")]
    #[param(default = 100, minimum = 1, maximum = 1000)]
    limit: usize,
    /// Skip this many first.
    #[serde(default)]
    #[param(default = 0)]
    offset: usize,
}

fn default_limit() -> usize {
    100
}

/// Runs, newest first: background runs and runs started in their sessions (a `user` key sees
/// its own).
#[utoipa::path(
    get,
    path = "/v1/runs",
    tag = "runs",
    operation_id = "list_runs",
    params(ListQuery),
    responses(
        (status = 200, description = "The runs.", body = RunList),
        BadRequest,
    )
)]
async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<RunList>, ApiError> {
    let Query(query) = query?;
    let run_state = match query.state.as_deref() {
        None => None,
        Some(name) => Some(RunState::parse(name).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown state {name:?}: queued, running, waiting, paused, succeeded, failed \
                 or cancelled"
            ))
        })?),
    };
    let session_id = query
        .session_id
        .as_deref()
        .map(parse_session_id)
        .transpose()?;
    let query = RunQuery {
        session_id,
        agent_id: query.agent_id,
        state: run_state,
        owner: caller.owner_filter(),
        schedule_id: query.schedule_id,
        created_after: query.created_after,
        created_before: query.created_before,
        background: query.background,
        limit: query.limit,
        offset: query.offset,
    };
    Ok(Json(state.app.background_runs().list(&query).await?))
}

/// A run (background or started in its session): its state, and its outcome once it stopped.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}",
    tag = "runs",
    operation_id = "get_run",
    params(RunPath),
    responses(
        (status = 200, description = "The run.", body = RunView),
        BadRequest,
        NotFound,
    )
)]
async fn show(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
) -> Result<Json<RunView>, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    Ok(Json(
        Box::pin(state.app.background_runs().get(run_id)).await?,
    ))
}

/// How long to wait.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct WaitQuery {
    /// Seconds to wait at most (0 to 300).
    #[serde(default = "default_wait")]
    #[param(default = 30, minimum = 0, maximum = 300)]
    timeout_secs: u64,
}

fn default_wait() -> u64 {
    30
}

/// Waits for a background run to stop (end, or wait for a person), up to `timeout_secs`, and
/// answers it as it is then.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}/wait",
    tag = "runs",
    operation_id = "wait_run",
    params(RunPath, WaitQuery),
    responses(
        (status = 200, description = "The run (check `state`: the wait may have timed out).",
         body = RunView),
        BadRequest,
        NotFound,
    )
)]
async fn wait(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
    query: Result<Query<WaitQuery>, QueryRejection>,
) -> Result<Json<RunView>, ApiError> {
    let Query(query) = query?;
    let run_id = parse_run_id(&path.run_id)?;
    if query.timeout_secs > MAX_WAIT_SECS {
        return Err(ApiError::bad_request(format!(
            "`timeout_secs` is at most {MAX_WAIT_SECS}"
        )));
    }
    let timeout = Duration::from_secs(query.timeout_secs);
    Ok(Json(
        Box::pin(state.app.background_runs().wait(run_id, timeout)).await?,
    ))
}

/// Where to start following.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct StreamQuery {
    /// Only events with a greater seq.
    #[serde(default)]
    #[param(default = 0)]
    after: u64,
}

/// Follows a background run: its session's events (named as in `POST /v1/infer/stream`) after
/// `Last-Event-ID` (or `after`), then live events until it stops. A queued run is waited for
/// (a minute at most) before the stream attaches.
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}/stream",
    tag = "runs",
    operation_id = "stream_run",
    params(
        RunPath,
        StreamQuery,
        ("Last-Event-ID" = Option<u64>, Header,
         description = "The last seq the client has (takes precedence over `after`)."),
    ),
    responses(
        (status = 200, description = "The run's events as server-sent events.",
         body = crate::openapi::RunStreamEvent, content_type = "text/event-stream"),
        BadRequest,
        NotFound,
    )
)]
async fn stream(
    State(state): State<AppState>,
    crate::authorization::Caller(caller): crate::authorization::Caller,
    ApiPath(path): ApiPath<RunPath>,
    headers: HeaderMap,
    query: Result<Query<StreamQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let run_id = parse_run_id(&path.run_id)?;
    let after = super::sse::resume_after(&headers, query.after)?;
    let run = Box::pin(
        state
            .app
            .background_runs()
            .wait_until_started(run_id, START_WAIT),
    )
    .await?;
    let path = format!("/v1/runs/{run_id}/stream?after={after}");
    if let Some(relayed) =
        super::sessions::relay_stream(&state, &caller, run.session_id, &path, &headers).await?
    {
        return Ok(relayed);
    }
    super::sessions::attach(state, run.session_id, after).await
}

/// Cancels a background run: a queued one at once, a running one at its next step, a waiting
/// or paused one at once (it ends `cancelled`).
#[utoipa::path(
    post,
    path = "/v1/runs/{run_id}/cancel",
    tag = "runs",
    operation_id = "cancel_run",
    params(RunPath),
    responses(
        (status = 200, description = "The run as it is now (`cancel_requested`).", body = RunView),
        BadRequest,
        NotFound,
    )
)]
async fn cancel(
    State(state): State<AppState>,
    crate::authorization::Caller(caller): crate::authorization::Caller,
    ApiPath(path): ApiPath<RunPath>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    // A run live on another node is cancelled there, at once (a run started in its session
    // has no lease whose renewal would carry the request).
    if let Some(relayed) =
        super::runs::on_owner(&state, &caller, run_id, &headers, "cancel").await?
    {
        return Ok(relayed);
    }
    Ok(Json(Box::pin(state.app.background_runs().cancel(run_id)).await?).into_response())
}

/// A background run's webhook deliveries, each with its attempts (status, error, duration).
#[utoipa::path(
    get,
    path = "/v1/runs/{run_id}/webhooks",
    tag = "runs",
    operation_id = "run_webhooks",
    params(RunPath),
    responses(
        (status = 200, description = "The deliveries, oldest first.", body = DeliveryList),
        BadRequest,
        NotFound,
    )
)]
async fn webhooks(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<RunPath>,
) -> Result<Json<DeliveryList>, ApiError> {
    let run_id = parse_run_id(&path.run_id)?;
    Ok(Json(Box::pin(state.app.run_webhooks(run_id)).await?))
}

/// Makes a new webhook signing secret and shows it this once; the previous one stops signing
/// at once. Receivers verify `webhook-signature` (Standard Webhooks) with it.
#[utoipa::path(
    post,
    path = "/v1/webhook-secret",
    tag = "runs",
    operation_id = "rotate_webhook_secret",
    responses((status = 201, description = "The new secret (not shown again).", body = WebhookSecret))
)]
async fn rotate_secret(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Response, ApiError> {
    let secret = state.app.rotate_webhook_secret(&caller).await?;
    Ok((StatusCode::CREATED, Json(secret)).into_response())
}
