//! Long-term memories of saved agents: list, search, add, edit, delete.
//!
//! `GET /v1/agents/{id}/memories` lists an agent's memories (or one user's, with `user`), or
//! searches them with `q` (full text, stemmed, best matches first); `POST` adds one (a memory
//! saying the same as one already kept refreshes it: 200 instead of 201);
//! `GET|PATCH|DELETE /v1/memories/{memory_id}` read, edit and delete one.

use axum::Json;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::domain::store::{MemoryKind, MemoryRecord, MemoryScope, NewMemory};

use super::config::{ApiJson, ApiPath};
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{AgentPath, BadRequest, JsonBodyErrors, NotFound};
use crate::state::AppState;
use agentry_app::auth::Principal;
use agentry_app::config::check_name;

/// The memory routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_memories, add_memory))
        .routes(routes!(get_memory, edit_memory, delete_memory))
}

/// What a memory records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MemoryKindName {
    /// Something true about the user, the project or the world.
    Fact,
    /// How someone likes things done.
    Preference,
    /// Something decided.
    Decision,
}

impl From<MemoryKindName> for MemoryKind {
    fn from(kind: MemoryKindName) -> Self {
        match kind {
            MemoryKindName::Fact => Self::Fact,
            MemoryKindName::Preference => Self::Preference,
            MemoryKindName::Decision => Self::Decision,
        }
    }
}

/// A stored memory.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Memory {
    /// Its id.
    pub id: u64,
    /// The agent it belongs to.
    pub agent_id: String,
    /// The user it is about, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// What it records.
    #[schema(value_type = MemoryKindName)]
    pub kind: MemoryKind,
    /// The statement.
    pub text: String,
    /// The session it was learnt in.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub source_session: Option<agentry_types::SessionId>,
    /// When first stored (Unix ms).
    pub created_at: u64,
    /// When last stored again or edited (Unix ms).
    pub updated_at: u64,
}

impl From<MemoryRecord> for Memory {
    fn from(record: MemoryRecord) -> Self {
        Self {
            id: record.id,
            agent_id: record.scope.agent,
            user: record.scope.user,
            kind: record.kind,
            text: record.text,
            source_session: record.source_session,
            created_at: record.created_at,
            updated_at: record.updated_at,
        }
    }
}

/// Memories.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct MemoryList {
    /// The memories, newest (or best matching) first.
    pub memories: Vec<Memory>,
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct MemoryQuery {
    /// One user's memories with the agent (default: the agent's own): a name, or a key's end
    /// user as `<key id>:<name>`.
    #[param(pattern = "^([A-Za-z0-9_.-]{1,64}:)?[A-Za-z0-9_.-]{1,64}$")]
    user: Option<String>,
    /// Words to search for (any may match, stemmed); absent lists everything.
    #[param(min_length = 1, max_length = 1000)]
    q: Option<String>,
    /// At most this many (clamped to 1..=1000).
    #[serde(default = "default_limit")]
    #[param(default = 100, minimum = 1)]
    limit: usize,
}

fn default_limit() -> usize {
    100
}

/// A memory to add.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewMemoryBody {
    /// What it records.
    pub kind: MemoryKindName,
    /// The statement (1 to 2,000 characters).
    #[schema(min_length = 1, max_length = 2000)]
    pub text: String,
    /// The user it is about, if any: a name, or a key's end user as `<key id>:<name>`.
    #[serde(default)]
    #[schema(pattern = "^([A-Za-z0-9_.-]{1,64}:)?[A-Za-z0-9_.-]{1,64}$")]
    pub user: Option<String>,
}

/// A memory's new content.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemoryEdit {
    /// What it records (default: unchanged).
    #[serde(default)]
    pub kind: Option<MemoryKindName>,
    /// The new statement.
    #[schema(min_length = 1, max_length = 2000)]
    pub text: String,
}

/// The memory a route acts on.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct MemoryPath {
    /// The memory's id.
    #[param(minimum = 1)]
    pub memory_id: u64,
}

async fn known_agent(state: &AppState, id: &str) -> Result<(), ApiError> {
    check_name("agent", id)?;
    if state.app.memories().agent_exists(id).await? {
        Ok(())
    } else {
        Err(ApiError::not_found(format!("no agent {id:?}")))
    }
}

/// The memories of `agent`, or of its end user `user` as `caller` names them (an admin:
/// `alice`, or a key's `<key id>:alice`).
fn scope(caller: &Principal, agent: String, user: Option<String>) -> Result<MemoryScope, ApiError> {
    let user = user.map(|user| caller.end_user(&user)).transpose()?;
    Ok(MemoryScope { agent, user })
}

/// An agent's memories, or those matching a search.
#[utoipa::path(
    get,
    path = "/v1/agents/{id}/memories",
    tag = "agents",
    operation_id = "list_agent_memories",
    params(AgentPath, MemoryQuery),
    responses(
        (status = 200, description = "The memories.", body = MemoryList),
        BadRequest,
        NotFound,
    )
)]
async fn list_memories(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<MemoryQuery>, QueryRejection>,
) -> Result<Json<MemoryList>, ApiError> {
    let Query(query) = query?;
    known_agent(&state, &id).await?;
    let scope = scope(&caller, id, query.user)?;
    let records = state
        .app
        .memories()
        .list(&scope, query.q.as_deref(), query.limit)
        .await?;
    Ok(Json(MemoryList {
        memories: records.into_iter().map(Memory::from).collect(),
    }))
}

/// Adds a memory to an agent (or refreshes the one saying the same).
#[utoipa::path(
    post,
    path = "/v1/agents/{id}/memories",
    tag = "agents",
    operation_id = "add_agent_memory",
    params(AgentPath),
    request_body = NewMemoryBody,
    responses(
        (status = 201, description = "Added.", body = Memory),
        (status = 200, description = "The same memory was already kept; refreshed.", body = Memory),
        JsonBodyErrors,
        NotFound,
    )
)]
async fn add_memory(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<NewMemoryBody>,
) -> Result<Response, ApiError> {
    known_agent(&state, &id).await?;
    let (record, created) = state
        .app
        .memories()
        .remember(NewMemory {
            scope: scope(&caller, id, body.user)?,
            kind: body.kind.into(),
            text: body.text,
            source_session: None,
        })
        .await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(Memory::from(record))).into_response())
}

async fn stored(state: &AppState, id: u64) -> Result<MemoryRecord, ApiError> {
    state
        .app
        .memories()
        .get(id)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no memory {id}")))
}

/// One memory.
#[utoipa::path(
    get,
    path = "/v1/memories/{memory_id}",
    tag = "agents",
    operation_id = "get_memory",
    params(MemoryPath),
    responses(
        (status = 200, description = "The memory.", body = Memory),
        BadRequest,
        NotFound,
    )
)]
async fn get_memory(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
) -> Result<Json<Memory>, ApiError> {
    Ok(Json(stored(&state, id).await?.into()))
}

/// Edits a memory.
#[utoipa::path(
    patch,
    path = "/v1/memories/{memory_id}",
    tag = "agents",
    operation_id = "edit_memory",
    params(MemoryPath),
    request_body = MemoryEdit,
    responses(
        (status = 200, description = "Edited.", body = Memory),
        JsonBodyErrors,
        NotFound,
    )
)]
async fn edit_memory(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
    ApiJson(edit): ApiJson<MemoryEdit>,
) -> Result<Json<Memory>, ApiError> {
    let current = stored(&state, id).await?;
    let kind = edit.kind.map_or(current.kind, MemoryKind::from);
    let record = state
        .app
        .memories()
        .edit(id, kind, &edit.text)
        .await?
        .ok_or_else(|| ApiError::not_found(format!("no memory {id}")))?;
    Ok(Json(record.into()))
}

/// Deletes a memory.
#[utoipa::path(
    delete,
    path = "/v1/memories/{memory_id}",
    tag = "agents",
    operation_id = "delete_memory",
    params(MemoryPath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_memory(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<u64>,
) -> Result<StatusCode, ApiError> {
    if state.app.memories().delete(id).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found(format!("no memory {id}")))
    }
}
