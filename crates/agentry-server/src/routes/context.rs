//! `GET /v1/sessions/{id}/context`: what the session's next model call would contain, and how
//! many tokens each part takes, counted with the model's tokenizer (tiktoken for OpenAI models,
//! the calibrated estimate elsewhere) against its context window.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use utoipa::IntoParams;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::context_report::ContextReport;
use agentry_app::ids::parse_session_id;

use crate::error::ApiError;
use crate::openapi::{BadRequest, NotFound, SessionPath};
use crate::state::AppState;

/// The context route.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(session_context))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ContextQuery {
    /// Count for this model (default: the model of the session's latest run).
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    model: Option<String>,
}

/// What the session's next model call would contain, part by part, in tokens.
#[utoipa::path(
    get,
    path = "/v1/sessions/{id}/context",
    tag = "sessions",
    operation_id = "get_session_context",
    params(SessionPath, ContextQuery),
    responses(
        (status = 200, description = "The next call's parts and their tokens.", body = ContextReport),
        BadRequest,
        NotFound,
    )
)]
async fn session_context(
    State(state): State<AppState>,
    Path(id): Path<String>,
    query: Result<Query<ContextQuery>, QueryRejection>,
) -> Result<Json<ContextReport>, ApiError> {
    let Query(query) = query?;
    let id = parse_session_id(&id)?;
    Ok(Json(state.app.context_report(id, query.model).await?))
}
