//! Usage and budgets: `GET /v1/usage` (the usage ledger summed over a time range, grouped; a
//! `user` key sees its own calls) and `/v1/budgets` (spending budgets of agents and API keys;
//! admin keys only). What they compute is [`agentry_app::usage`]'.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::usage::{BudgetConfig, BudgetList, BudgetView, UsageReport, UsageRequest};

use super::config::{ApiJson, ApiPath};
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{BadRequest, Conflict, JsonBodyErrors, NotFound};
use crate::state::AppState;

/// The usage and budget routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(usage))
        .routes(routes!(create_budget, list_budgets))
        .routes(routes!(show_budget, replace_budget, delete_budget))
}

/// The budget a route acts on.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct BudgetPath {
    /// Its name.
    #[param(max_length = 64)]
    pub name: String,
}

/// Tokens and cost of every model call in a time range, grouped by agent, model, session, API
/// key and/or UTC day (`group_by=day,agent`), with the range's total. Costs come from each
/// model's price when the call was made; calls of models without one are counted in
/// `unpriced_calls`.
#[utoipa::path(
    get,
    path = "/v1/usage",
    tag = "usage",
    operation_id = "usage",
    params(UsageRequest),
    responses(
        (status = 200, description = "The report.", body = UsageReport),
        BadRequest,
    )
)]
async fn usage(
    State(state): State<AppState>,
    Caller(caller): Caller,
    query: Result<Query<UsageRequest>, QueryRejection>,
) -> Result<Json<UsageReport>, ApiError> {
    let Query(request) = query?;
    Ok(Json(state.app.usage(&caller, request).await?))
}

/// Creates a budget: what one agent's runs, or one API key's, may spend per day, week, month
/// or in total. A run it counts stops with `budget_exceeded` before its next model call once
/// the period's spending has reached the limit.
#[utoipa::path(
    post,
    path = "/v1/budgets",
    tag = "usage",
    operation_id = "create_budget",
    request_body = BudgetConfig,
    responses(
        (status = 201, description = "Created, with what its period spent so far.", body = BudgetView),
        JsonBodyErrors,
        Conflict,
    )
)]
async fn create_budget(
    State(state): State<AppState>,
    ApiJson(budget): ApiJson<BudgetConfig>,
) -> Result<Response, ApiError> {
    let view = state.app.budgets().create(budget).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// The budgets, by name, each with what its current period spent.
#[utoipa::path(
    get,
    path = "/v1/budgets",
    tag = "usage",
    operation_id = "list_budgets",
    responses((status = 200, description = "The budgets.", body = BudgetList))
)]
async fn list_budgets(State(state): State<AppState>) -> Result<Json<BudgetList>, ApiError> {
    Ok(Json(state.app.budgets().list().await?))
}

/// A budget, with what its current period spent.
#[utoipa::path(
    get,
    path = "/v1/budgets/{name}",
    tag = "usage",
    operation_id = "get_budget",
    params(BudgetPath),
    responses(
        (status = 200, description = "The budget.", body = BudgetView),
        BadRequest,
        NotFound,
    )
)]
async fn show_budget(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<BudgetPath>,
) -> Result<Json<BudgetView>, ApiError> {
    Ok(Json(state.app.budgets().get(&path.name).await?))
}

/// Replaces (or renames) a budget.
#[utoipa::path(
    put,
    path = "/v1/budgets/{name}",
    tag = "usage",
    operation_id = "replace_budget",
    params(BudgetPath),
    request_body = BudgetConfig,
    responses(
        (status = 200, description = "Replaced.", body = BudgetView),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn replace_budget(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<BudgetPath>,
    ApiJson(budget): ApiJson<BudgetConfig>,
) -> Result<Json<BudgetView>, ApiError> {
    Ok(Json(
        Box::pin(state.app.budgets().replace(&path.name, budget)).await?,
    ))
}

/// Deletes a budget (what was spent stays in the ledger).
#[utoipa::path(
    delete,
    path = "/v1/budgets/{name}",
    tag = "usage",
    operation_id = "delete_budget",
    params(BudgetPath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_budget(
    State(state): State<AppState>,
    ApiPath(path): ApiPath<BudgetPath>,
) -> Result<StatusCode, ApiError> {
    state.app.budgets().delete(&path.name).await?;
    Ok(StatusCode::NO_CONTENT)
}
