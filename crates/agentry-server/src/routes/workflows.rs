//! The workflow routes: `/v1/workflows` (definitions: list, save, get, replace as a new
//! version, delete; start a run) and `/v1/workflow-runs` (list, get with every step's state,
//! follow as server-sent events, approve or reject a waiting step, send a signal, cancel,
//! retry from the failed steps). What a workflow is and how it runs
//! lives in [`agentry_app::workflows`].

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::Value;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::webhooks::DeliveryList;
use agentry_app::workflows::triggers::TriggerSecret;
use agentry_app::workflows::{WorkflowDefinition, WorkflowList, WorkflowRun, WorkflowRunList};

use super::config::{ApiJson, ApiPath, created};
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{BadRequest, Conflict, JsonBodyErrors, NamePath, NotFound};
use crate::state::AppState;

/// The workflow routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_workflows, create_workflow))
        .routes(routes!(workflow_schema))
        .routes(routes!(get_workflow, replace_workflow, delete_workflow))
        .routes(routes!(create_trigger, delete_trigger))
        .routes(routes!(start_run))
        .routes(routes!(list_runs))
        .routes(routes!(get_run))
        .routes(routes!(run_webhooks))
        .routes(routes!(approve_step))
        .routes(routes!(signal_run))
        .routes(routes!(cancel_run))
        .routes(routes!(retry_run))
        .routes(routes!(stream_run))
}

/// A workflow run named in a path.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
struct RunPath {
    /// The run's id.
    #[allow(dead_code)]
    id: String,
}

/// The JSON Schema of a workflow definition (what an editor can check before saving).
#[utoipa::path(
    get,
    path = "/v1/workflow-schema",
    tag = "workflows",
    operation_id = "workflow_schema",
    responses((status = 200, description = "The schema (JSON Schema 2020-12).", body = Object))
)]
async fn workflow_schema() -> Result<Json<Value>, ApiError> {
    Ok(Json(agentry_app::workflows::workflow_schema()?))
}

/// The workflows.
#[utoipa::path(
    get,
    path = "/v1/workflows",
    tag = "workflows",
    operation_id = "list_workflows",
    responses((status = 200, description = "The workflows, by id.", body = WorkflowList))
)]
async fn list_workflows(State(state): State<AppState>) -> Result<Json<WorkflowList>, ApiError> {
    Ok(Json(state.app.workflows().list().await?))
}

/// Saves a workflow (version 1), after checking it whole: problems are named by their path.
#[utoipa::path(
    post,
    path = "/v1/workflows",
    tag = "workflows",
    operation_id = "create_workflow",
    request_body = WorkflowDefinition,
    responses(
        (status = 201, description = "Saved.", body = WorkflowDefinition,
         links(
             ("get_workflow" = (operation_id = "get_workflow", parameters(("name" = "$response.body#/id")))),
             ("start_workflow" = (operation_id = "start_workflow", parameters(("name" = "$response.body#/id")))),
         )),
        JsonBodyErrors,
        Conflict,
    )
)]
async fn create_workflow(
    State(state): State<AppState>,
    ApiJson(definition): ApiJson<WorkflowDefinition>,
) -> Result<Response, ApiError> {
    Ok(created(state.app.workflows().create(definition).await?))
}

/// A workflow.
#[utoipa::path(
    get,
    path = "/v1/workflows/{name}",
    tag = "workflows",
    operation_id = "get_workflow",
    params(NamePath),
    responses(
        (status = 200, description = "The workflow.", body = WorkflowDefinition),
        BadRequest,
        NotFound,
    )
)]
async fn get_workflow(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<WorkflowDefinition>, ApiError> {
    Ok(Json(state.app.workflows().get(&name).await?))
}

/// Replaces a workflow with its next version (runs going on keep theirs).
#[utoipa::path(
    put,
    path = "/v1/workflows/{name}",
    tag = "workflows",
    operation_id = "replace_workflow",
    params(NamePath),
    request_body = WorkflowDefinition,
    responses(
        (status = 200, description = "Replaced.", body = WorkflowDefinition),
        JsonBodyErrors,
        NotFound,
    )
)]
async fn replace_workflow(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(definition): ApiJson<WorkflowDefinition>,
) -> Result<Json<WorkflowDefinition>, ApiError> {
    Ok(Json(
        state.app.workflows().replace(&name, definition).await?,
    ))
}

/// Deletes a workflow (its runs stay).
#[utoipa::path(
    delete,
    path = "/v1/workflows/{name}",
    tag = "workflows",
    operation_id = "delete_workflow",
    params(NamePath),
    responses((status = 204, description = "Deleted."), BadRequest, NotFound)
)]
async fn delete_workflow(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.workflows().delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Makes the workflow's trigger secret, or a new one (the old one stops working at once):
/// deliveries to `POST /hooks/workflows/{name}` signed with it (Standard Webhooks), or carrying
/// it as a bearer token, start runs. Shown once.
#[utoipa::path(
    post,
    path = "/v1/workflows/{name}/trigger",
    tag = "workflows",
    operation_id = "create_workflow_trigger",
    params(NamePath),
    responses(
        (status = 201, description = "The trigger's path and secret.", body = TriggerSecret),
        BadRequest,
        NotFound,
    )
)]
async fn create_trigger(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Response, ApiError> {
    let trigger = state.app.create_workflow_trigger(&name).await?;
    Ok((StatusCode::CREATED, Json(trigger)).into_response())
}

/// Removes the workflow's trigger: its URL accepts nothing from now on.
#[utoipa::path(
    delete,
    path = "/v1/workflows/{name}/trigger",
    tag = "workflows",
    operation_id = "delete_workflow_trigger",
    params(NamePath),
    responses((status = 204, description = "Removed."), BadRequest, NotFound)
)]
async fn delete_trigger(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.delete_workflow_trigger(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How a run starts.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct StartBody {
    /// The input (checked against the workflow's input schema).
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    input: Value,
    /// Where the run's end is told, instead of the workflow's own webhook (an http(s) URL;
    /// a signing secret must exist: `POST /v1/webhook-secret`).
    #[serde(default)]
    #[schema(max_length = 2048)]
    webhook_url: Option<String>,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// Starts a run; it goes on in the background (202 with the run).
#[utoipa::path(
    post,
    path = "/v1/workflows/{name}/runs",
    tag = "workflows",
    operation_id = "start_workflow",
    params(NamePath),
    request_body = StartBody,
    responses(
        (status = 202, description = "Started.", body = WorkflowRun,
         links(("get_workflow_run" = (operation_id = "get_workflow_run", parameters(("id" = "$response.body#/run_id")))))),
        JsonBodyErrors,
        NotFound,
    )
)]
async fn start_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(name): ApiPath<String>,
    ApiJson(body): ApiJson<StartBody>,
) -> Result<Response, ApiError> {
    let run = match &body.webhook_url {
        Some(url) => {
            Box::pin(
                state
                    .app
                    .workflows()
                    .start_with_webhook(&caller, &name, body.input, url),
            )
            .await?
        }
        None => {
            state
                .app
                .workflows()
                .start(&caller, &name, body.input)
                .await?
        }
    };
    Ok((StatusCode::ACCEPTED, Json(run)).into_response())
}

/// Which runs to list.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
struct RunsQuery {
    /// Only the runs of this workflow.
    #[param(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    workflow_id: Option<String>,
}

/// The caller's workflow runs, newest first.
#[utoipa::path(
    get,
    path = "/v1/workflow-runs",
    tag = "workflows",
    operation_id = "list_workflow_runs",
    params(RunsQuery),
    responses((status = 200, description = "The runs.", body = WorkflowRunList), BadRequest)
)]
async fn list_runs(
    State(state): State<AppState>,
    Caller(caller): Caller,
    query: Result<Query<RunsQuery>, QueryRejection>,
) -> Result<Json<WorkflowRunList>, ApiError> {
    let Query(query) = query?;
    Ok(Json(
        state
            .app
            .workflows()
            .runs(&caller, query.workflow_id.as_deref())
            .await?,
    ))
}

/// A run: its state, every step's state, attempts, times, output and error.
#[utoipa::path(
    get,
    path = "/v1/workflow-runs/{id}",
    tag = "workflows",
    operation_id = "get_workflow_run",
    params(RunPath),
    responses((status = 200, description = "The run.", body = WorkflowRun), NotFound)
)]
async fn get_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<WorkflowRun>, ApiError> {
    Ok(Json(state.app.workflows().run(&caller, &id).await?))
}

/// A run's webhook deliveries (its end, told to its webhook), each with its attempts.
#[utoipa::path(
    get,
    path = "/v1/workflow-runs/{id}/webhooks",
    tag = "workflows",
    operation_id = "workflow_run_webhooks",
    params(RunPath),
    responses(
        (status = 200, description = "The deliveries, oldest first.", body = DeliveryList),
        NotFound,
    )
)]
async fn run_webhooks(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<DeliveryList>, ApiError> {
    Ok(Json(state.app.workflow_run_webhooks(&caller, &id).await?))
}

/// A decision on an approval step.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    /// The approval step's id.
    step: String,
    /// Approve (default) or reject.
    #[serde(default = "yes")]
    approved: bool,
    /// Why.
    #[serde(default)]
    #[schema(max_length = 4000)]
    comment: Option<String>,
}

fn yes() -> bool {
    true
}

/// Approves or rejects a waiting approval step (a rejection fails it).
#[utoipa::path(
    post,
    path = "/v1/workflow-runs/{id}/approve",
    tag = "workflows",
    operation_id = "approve_workflow_step",
    params(RunPath),
    request_body = ApproveBody,
    responses(
        (status = 202, description = "Taken; the run goes on."),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn approve_step(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ApproveBody>,
) -> Result<StatusCode, ApiError> {
    state
        .app
        .workflows()
        .decide_step(&caller, &id, &body.step, body.approved, body.comment)
        .await?;
    Ok(StatusCode::ACCEPTED)
}

/// A signal.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SignalBody {
    /// Its name (what a `signal` step waits for).
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    name: String,
    /// What it carries (the step's output).
    #[serde(default)]
    #[schema(value_type = Object)]
    payload: Value,
}

/// Sends a signal to a run: the step waiting for it takes it, else it is kept for the first
/// step that will.
#[utoipa::path(
    post,
    path = "/v1/workflow-runs/{id}/signal",
    tag = "workflows",
    operation_id = "signal_workflow_run",
    params(RunPath),
    request_body = SignalBody,
    responses(
        (status = 202, description = "Taken."),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn signal_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<SignalBody>,
) -> Result<StatusCode, ApiError> {
    state
        .app
        .workflows()
        .signal(&caller, &id, &body.name, body.payload)
        .await?;
    Ok(StatusCode::ACCEPTED)
}

/// Cancels a run.
#[utoipa::path(
    post,
    path = "/v1/workflow-runs/{id}/cancel",
    tag = "workflows",
    operation_id = "cancel_workflow_run",
    params(RunPath),
    responses((status = 202, description = "Cancelling."), NotFound, Conflict)
)]
async fn cancel_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.workflows().cancel(&caller, &id).await?;
    Ok(StatusCode::ACCEPTED)
}

/// Runs a failed or cancelled run again from its failed and cancelled steps (the steps that
/// succeeded keep their outputs).
#[utoipa::path(
    post,
    path = "/v1/workflow-runs/{id}/retry",
    tag = "workflows",
    operation_id = "retry_workflow_run",
    params(RunPath),
    responses(
        (status = 202, description = "Running again.", body = WorkflowRun),
        NotFound,
        Conflict,
    )
)]
async fn retry_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let run = state.app.workflows().retry(&caller, &id).await?;
    Ok((StatusCode::ACCEPTED, Json(run)).into_response())
}

/// Follows a run: first an `event: run` with the whole run (as `GET` shows it), then each change
/// as it is recorded — `event: step` (`{"type": "step", "step", "run": the step's new state,
/// "at"}`) and `event: run` (`{"type": "run", "state", "output"?, "error"?, "finished_at"?,
/// "at"}`) — each with its number as the SSE id, until the run ends. With `Last-Event-ID`, only
/// the changes after that number come (no whole run first).
#[utoipa::path(
    get,
    path = "/v1/workflow-runs/{id}/stream",
    tag = "workflows",
    operation_id = "stream_workflow_run",
    params(RunPath),
    responses(
        (status = 200, description = "Server-sent events: `run` (the whole run first, then the \
         run's own changes) and `step` (a step's new state), numbered.",
         content_type = "text/event-stream", body = String),
        BadRequest,
        NotFound,
    )
)]
async fn stream_run(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    // An unknown run is a 404 before the stream opens.
    let run = state.app.workflows().run(&caller, &id).await?;
    let resume = super::sse::resume_after(&headers, u64::MAX)?;
    let events = async_stream::stream! {
        let mut changes = state.app.workflows().changes(&id);
        let mut seq = if resume == u64::MAX || resume > run.seq {
            let Ok(view) = serde_json::to_value(&run) else { return };
            yield Ok::<_, std::convert::Infallible>(
                Event::default().event("run").id(run.seq.to_string()).data(view.to_string()),
            );
            run.seq
        } else {
            resume
        };
        let mut ended = run.state.is_final() && seq >= run.seq;
        while !ended {
            let Ok(recorded) = state.app.workflows().events(&id, seq).await else { break };
            for (number, event) in recorded {
                let kind = event["type"].as_str().unwrap_or("step").to_owned();
                if kind == "run"
                    && event["state"]
                        .as_str()
                        .is_some_and(|s| matches!(s, "succeeded" | "failed" | "cancelled"))
                {
                    ended = true;
                }
                yield Ok(Event::default().event(kind).id(number.to_string()).data(event.to_string()));
                seq = number;
            }
            if ended {
                break;
            }
            // A change here, or a look every second (another process may drive the run).
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                _ = state.app.shutdown_signal().cancelled() => break,
            }
        }
    };
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}
