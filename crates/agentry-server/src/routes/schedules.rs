//! Schedules: `/v1/schedules` (create, list), `/v1/schedules/{id}` (get, replace, delete) and
//! `/v1/schedules/{id}/runs` (the runs it fired). Admin keys only. How schedules fire is
//! [`agentry_app::schedules`]'.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::AppError;
use agentry_app::queue::RunList;
use agentry_app::schedules::{
    CatchUp, Overlap, ScheduleList, ScheduleSpec, ScheduleView, ScheduledRun, ScheduledWorkflow,
};

use super::config::{ApiJson, ApiPath};
use super::run_request::InferRequest;
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{BadRequest, JsonBodyErrors, NotFound};
use crate::state::AppState;

/// The schedule routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(show, replace, remove))
        .routes(routes!(runs))
}

/// The body of `POST /v1/schedules` and `PUT /v1/schedules/{id}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// A name for people (default: the expression or the interval).
    #[serde(default)]
    #[schema(max_length = 100)]
    pub name: Option<String>,
    /// A cron expression: 5 fields (minute hour day-of-month month day-of-week), or 6 with
    /// seconds first; names (`MON`, `JAN`), ranges, steps, lists, `L`, `W` and `#`. Give this or
    /// `interval_secs`.
    #[serde(default)]
    #[schema(max_length = 200)]
    pub cron: Option<String>,
    /// The IANA time zone the expression is read in (default `UTC`), e.g. `Europe/Paris`.
    #[serde(default)]
    #[schema(max_length = 64)]
    pub timezone: Option<String>,
    /// Seconds between fires (1 to a year), counted from the schedule's creation. Give this or
    /// `cron`.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 31_622_400)]
    pub interval_secs: Option<u64>,
    /// The run each fire submits: the body of `POST /v1/runs` (without `session_id` each run
    /// gets a new session). Give this or `workflow`.
    #[serde(default)]
    pub run: Option<InferRequest>,
    /// The workflow each fire starts instead of a run.
    #[serde(default)]
    pub workflow: Option<ScheduledWorkflow>,
    /// Whether it fires (default `true`).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// After downtime: `skip` the missed slots (default) or run `once` for them.
    #[serde(default)]
    pub catch_up: CatchUp,
    /// When the previous run still goes: `skip` the slot (default), `queue` the run, or
    /// `cancel` the previous.
    #[serde(default)]
    pub overlap: Overlap,
}

fn enabled() -> bool {
    true
}

impl ScheduleRequest {
    /// The schedule as the app takes it: the run read into its spec, beside the request as
    /// written (what the schedule shows back).
    fn into_spec(self) -> Result<ScheduleSpec, AppError> {
        let run = match self.run {
            None => None,
            Some(run) => {
                if run.is_group() {
                    return Err(AppError::bad_request(
                        "a schedule's run is one agent's (a group chat cannot run in the background)",
                    ));
                }
                if run.cancel_on_disconnect {
                    return Err(AppError::bad_request(
                        "`cancel_on_disconnect` does not apply to a scheduled run",
                    ));
                }
                let request = serde_json::to_value(&run).map_err(|error| {
                    AppError::internal(format!("cannot store the run: {error}"))
                })?;
                Some(ScheduledRun {
                    spec: run.into_spec()?,
                    request,
                })
            }
        };
        Ok(ScheduleSpec {
            name: self.name,
            cron: self.cron,
            timezone: self.timezone,
            interval_secs: self.interval_secs,
            run,
            workflow: self.workflow,
            enabled: self.enabled,
            catch_up: self.catch_up,
            overlap: self.overlap,
        })
    }
}

/// Reads a schedule's run as an earlier release stored it (the request alone), for
/// `Schedules::upgrade`.
pub fn stored_run_spec(
    request: &serde_json::Value,
) -> Result<agentry_app::runs::RunSpec, AppError> {
    let run: InferRequest = serde_json::from_value(request.clone())
        .map_err(|error| AppError::bad_request(format!("the stored run is unreadable: {error}")))?;
    run.into_spec()
}

/// The schedule a route acts on.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SchedulePath {
    /// Its id.
    #[param(max_length = 64)]
    pub id: String,
}

/// Creates a schedule: a cron expression in a time zone, or an interval, and the run each fire
/// submits to the queue. The expression, the zone and the run are checked first; nothing is
/// stored when one fails.
#[utoipa::path(
    post,
    path = "/v1/schedules",
    tag = "schedules",
    operation_id = "create_schedule",
    request_body = ScheduleRequest,
    responses(
        (status = 201, description = "Created, with its next fire times.", body = ScheduleView,
         links(
             ("get_schedule" = (operation_id = "get_schedule", parameters(("id" = "$response.body#/id")))),
             ("schedule_runs" = (operation_id = "schedule_runs", parameters(("id" = "$response.body#/id")))),
             ("delete_schedule" = (operation_id = "delete_schedule", parameters(("id" = "$response.body#/id")))),
         )),
        JsonBodyErrors,
        NotFound,
    )
)]
async fn create(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(request): ApiJson<ScheduleRequest>,
) -> Result<Response, ApiError> {
    let schedule = Box::pin(state.app.schedules().create(&caller, request.into_spec()?)).await?;
    Ok((StatusCode::CREATED, Json(schedule)).into_response())
}

/// The schedules, oldest first.
#[utoipa::path(
    get,
    path = "/v1/schedules",
    tag = "schedules",
    operation_id = "list_schedules",
    responses((status = 200, description = "The schedules.", body = ScheduleList))
)]
async fn list(State(state): State<AppState>) -> Result<Json<ScheduleList>, ApiError> {
    Ok(Json(state.app.schedules().list().await?))
}

/// A schedule, with its next fire times.
#[utoipa::path(
    get,
    path = "/v1/schedules/{id}",
    tag = "schedules",
    operation_id = "get_schedule",
    params(SchedulePath),
    responses(
        (status = 200, description = "The schedule.", body = ScheduleView),
        BadRequest,
        NotFound,
    )
)]
async fn show(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<SchedulePath>,
) -> Result<Json<ScheduleView>, ApiError> {
    Ok(Json(state.app.schedules().get(&path.id).await?))
}

/// Replaces a schedule's settings (enable or disable it with `enabled`); its next fire is
/// counted anew, its history stays.
#[utoipa::path(
    put,
    path = "/v1/schedules/{id}",
    tag = "schedules",
    operation_id = "replace_schedule",
    params(SchedulePath),
    request_body = ScheduleRequest,
    responses(
        (status = 200, description = "Replaced.", body = ScheduleView),
        JsonBodyErrors,
        NotFound,
    )
)]
async fn replace(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(path): ApiPath<SchedulePath>,
    ApiJson(request): ApiJson<ScheduleRequest>,
) -> Result<Json<ScheduleView>, ApiError> {
    Ok(Json(
        Box::pin(
            state
                .app
                .schedules()
                .replace(&caller, &path.id, request.into_spec()?),
        )
        .await?,
    ))
}

/// Deletes a schedule (the runs it fired stay).
#[utoipa::path(
    delete,
    path = "/v1/schedules/{id}",
    tag = "schedules",
    operation_id = "delete_schedule",
    params(SchedulePath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn remove(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<SchedulePath>,
) -> Result<StatusCode, ApiError> {
    state.app.schedules().delete(&path.id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How many runs to list.
#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct RunsQuery {
    /// At most this many.
    #[serde(default = "default_limit")]
    #[param(default = 100, minimum = 1, maximum = 1000)]
    limit: usize,
}

fn default_limit() -> usize {
    100
}

/// The runs a schedule fired, newest first.
#[utoipa::path(
    get,
    path = "/v1/schedules/{id}/runs",
    tag = "schedules",
    operation_id = "schedule_runs",
    params(SchedulePath, RunsQuery),
    responses(
        (status = 200, description = "Its runs.", body = RunList),
        BadRequest,
        NotFound,
    )
)]
async fn runs(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<SchedulePath>,
    query: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Json<RunList>, ApiError> {
    let Query(query) = query?;
    Ok(Json(
        state.app.schedules().runs(&path.id, query.limit).await?,
    ))
}
