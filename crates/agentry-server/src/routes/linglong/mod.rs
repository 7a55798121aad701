//! The seed system's API (Linglong's README) under `/linglong`: a seed client works by changing
//! only its server URL to `http://host:port/linglong`. Parse, hand to the app
//! ([`agentry_app::linglong`]), render in the seed's shapes:
//!
//! - `POST /linglong/v1/infer` answers `{"success", "messages", "session_id"?, "error"?,
//!   "error_code"?, "stat"?}` (500 when the run failed, as the seed does);
//! - `POST /linglong/v1/infer/stream` sends `data: <message JSON>` per stream message,
//!   `data: {"session_id"}` for a session, and `data: [DONE]` last (header `X-Session-Id`);
//! - `POST /linglong/v1/infer/abort`, and the models, tools (Python function tools included),
//!   MCP servers, prompt templates, agents, env (keys), sessions (with the status feed
//!   `GET /v1/sessions/events` and the read mark) and setup routes of its README;
//! - its terminals: `GET /v1/terminals` (`{"terminals": [{"terminal_id", "session_id"}]}`),
//!   `DELETE /v1/terminals/{id}` (a terminal's id, or a session's, with or without `:auto`),
//!   and `WS /v1/terminals/ws?terminal_id=<session>[:auto]&cols&rows` (the session's terminal,
//!   made when it has none; `{"__terminal_id"}` first, output as text frames, `{"__resize":
//!   true, "cols", "rows"}` resizes, anything else is keystrokes);
//! - its file journals and revoke (a conflict is its `409 {"error": "JournalConflict",
//!   "message", "files", "can_force": true}`);
//! - its workspace file manager ([`workspace`]), whose uploads also speak tus 1.0 ([`tus`]).
//!
//! Errors are the seed's `{"error": "<message>"}` (with an `error_code`), with Agentry's
//! statuses. Bodies are read as JSON whatever their content type, as the seed reads them. These
//! routes are not in Agentry's OpenAPI document: the seed's README is their reference.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use futures::StreamExt;
use serde_json::{Value, json};

use agentry_app::error::AppError;
use agentry_app::linglong::request::SeedInferRequest;

pub(crate) mod tus;
pub(crate) mod workspace;

use axum::response::sse::{Event, KeepAlive, Sse};

use crate::authorization::Caller;
use crate::error::ApiError;
use crate::routes::status::FeedItem;
use crate::state::AppState;

/// Where the seed's API is served.
pub const PREFIX: &str = "/linglong";

/// The seed's routes, under [`PREFIX`].
pub fn routes() -> Router<AppState> {
    let v1 = Router::new()
        .route("/infer", post(infer))
        .route("/infer/stream", post(infer_stream))
        .route("/infer/abort", post(abort))
        .route("/models", get(models).post(create_model))
        .route("/models/{id}", put(update_model).delete(delete_model))
        .route("/prompt-templates", get(templates).post(create_template))
        .route(
            "/prompt-templates/{id}",
            put(update_template).delete(delete_template),
        )
        .route("/tools", get(tools).post(create_tool))
        .route("/tools/{id}", put(update_tool).delete(delete_tool))
        .route("/tools/batch", delete(delete_tools))
        .route("/tools/call", post(call_tool))
        .route("/tools/mcp", post(register_mcp))
        .route("/tools/skill", post(register_skill))
        .route("/mcp-servers", get(mcp_servers))
        .route("/mcp-servers/{name}", delete(delete_mcp_server))
        .route("/env", get(env).post(set_env))
        .route("/env/detect", post(detect_env))
        .route("/env/{key}", delete(delete_env))
        .route("/agents", get(agents).post(create_agent))
        .route(
            "/agents/{id}",
            get(agent).put(update_agent).delete(delete_agent),
        )
        .route("/setup", get(setup))
        .merge(workspace::routes())
        .merge(tus::routes())
        .route("/sessions", get(sessions))
        .route("/sessions/events", get(status_feed))
        .route("/sessions/{id}", get(session).delete(delete_session))
        .route("/sessions/{id}/read", post(mark_read))
        .route("/sessions/{id}/generate-title", post(generate_title))
        .route("/sessions/{id}/revoke", post(revoke))
        .route("/sessions/{id}/file-journals", get(file_journals))
        .route(
            "/sessions/{id}/file-journals/{turn}",
            get(file_journal_diff),
        )
        .route("/terminals", get(terminals))
        .route("/terminals/ws", get(terminal_socket))
        .route("/terminals/{id}", delete(close_terminal));
    Router::new().nest(&format!("{PREFIX}/v1"), v1)
}

/// An error in the seed's shape: `{"error": "<message>", "error_code": "<code>"}`.
pub(super) struct SeedError(ApiError);

impl From<AppError> for SeedError {
    fn from(error: AppError) -> Self {
        Self(ApiError::from(error))
    }
}

impl IntoResponse for SeedError {
    fn into_response(self) -> Response {
        let status = self.0.status;
        let body = json!({"error": self.0.message, "error_code": self.0.code.to_uppercase()});
        (status, Json(body)).into_response()
    }
}

pub(super) type Answer = Result<Response, SeedError>;

/// The body as JSON (`null` when empty), whatever its content type.
pub(super) fn json_body(body: &Bytes) -> Result<Value, SeedError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(body)
        .map_err(|error| AppError::bad_request(format!("Invalid JSON body: {error}")).into())
}

fn infer_request(body: &Bytes) -> Result<SeedInferRequest, SeedError> {
    serde_json::from_value(json_body(body)?).map_err(|error| {
        AppError::bad_request(format!("Invalid inference request: {error}")).into()
    })
}

pub(super) fn ok(body: Value) -> Answer {
    Ok(Json(body).into_response())
}

async fn infer(State(state): State<AppState>, Caller(caller): Caller, body: Bytes) -> Answer {
    let request = infer_request(&body)?;
    let answer = Box::pin(state.seed_infer(&caller, request)).await?;
    let status = if answer.success {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    Ok((status, Json(answer.body)).into_response())
}

async fn infer_stream(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Bytes,
) -> Answer {
    let request = infer_request(&body)?;
    let start = Box::pin(state.seed_start(&caller, request)).await?;
    let session = start.session_id;
    let lines = start
        .frames()
        .map(|frame| Ok::<_, std::convert::Infallible>(Bytes::from(format!("data: {frame}\n\n"))))
        .chain(futures::stream::once(async {
            Ok(Bytes::from_static(b"data: [DONE]\n\n"))
        }));
    let mut response = axum::body::Body::from_stream(lines).into_response();
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    if let Some(session) = session
        && let Ok(value) = HeaderValue::from_str(&session.to_string())
    {
        headers.insert("x-session-id", value);
    }
    Ok(response)
}

/// `{"session_id", "forced"?}`: cancels the session's live run.
async fn abort(State(state): State<AppState>, Caller(caller): Caller, body: Bytes) -> Answer {
    let body = json_body(&body)?;
    let id = body
        .get("session_id")
        .and_then(Value::as_str)
        .ok_or_else(|| AppError::bad_request("Missing required field: session_id"))?;
    let session = agentry_app::ids::parse_session_id(id)?;
    state.check_session_access(&caller, session).await?;
    let aborted = state.hub.cancel(session) || state.groups.cancel(session);
    ok(json!({"status": if aborted { "aborted" } else { "idle" }, "session_id": session}))
}

async fn models(State(state): State<AppState>) -> Answer {
    ok(state.seed_models().await?)
}

async fn create_model(State(state): State<AppState>, body: Bytes) -> Answer {
    let (status, body) = Box::pin(state.seed_save_model(None, json_body(&body)?)).await?;
    with_status(status, body)
}

async fn update_model(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let (status, body) = Box::pin(state.seed_save_model(Some(&id), json_body(&body)?)).await?;
    with_status(status, body)
}

async fn delete_model(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(state.seed_delete_model(&id).await?)
}

/// The body with the status the app chose.
fn with_status(status: u16, body: Value) -> Answer {
    Ok((
        StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
        Json(body),
    )
        .into_response())
}

async fn agents(State(state): State<AppState>) -> Answer {
    ok(state.seed_agents().await?)
}

async fn agent(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(state.seed_agent(&id).await?)
}

async fn create_agent(State(state): State<AppState>, body: Bytes) -> Answer {
    let (status, body) = Box::pin(state.seed_save_agent(None, json_body(&body)?)).await?;
    with_status(status, body)
}

async fn update_agent(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let (status, body) = Box::pin(state.seed_save_agent(Some(&id), json_body(&body)?)).await?;
    with_status(status, body)
}

async fn delete_agent(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(state.seed_delete_agent(&id).await?)
}

async fn mark_read(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    ok(state.seed_mark_read(&caller, &id).await?)
}

/// `GET /v1/sessions/events`: the seed's status feed, `data: <JSON>` events without a name:
/// `{"event": "init", "sessions": {id: status}}` first (and again after a gap, so a slow
/// client is whole again), then `{"event": "message", "session_id", "status"}` and
/// `{"event": "title_update", "session_id", "title"}` as they happen.
async fn status_feed(State(state): State<AppState>, Caller(caller): Caller) -> Answer {
    let init = state.seed_status_init(&caller).await?;
    let changes = crate::routes::status::visible_changes(state.clone(), caller.clone());
    let events = async_stream::stream! {
        yield Ok::<_, std::convert::Infallible>(Event::default().data(init.to_string()));
        futures::pin_mut!(changes);
        while let Some(item) = changes.next().await {
            match item {
                FeedItem::Change(change) => {
                    if let Some(event) = agentry_app::linglong::agents::seed_status_event(&change) {
                        yield Ok(Event::default().data(event.to_string()));
                    }
                }
                FeedItem::Lagged(_) => {
                    if let Ok(init) = state.seed_status_init(&caller).await {
                        yield Ok(Event::default().data(init.to_string()));
                    }
                }
                FeedItem::Shutdown => break,
            }
        }
    };
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

async fn templates(State(state): State<AppState>) -> Answer {
    ok(state.seed_templates().await?)
}

async fn create_template(State(state): State<AppState>, body: Bytes) -> Answer {
    let body = Box::pin(state.seed_save_template(None, json_body(&body)?)).await?;
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn update_template(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    ok(Box::pin(state.seed_save_template(Some(&id), json_body(&body)?)).await?)
}

async fn delete_template(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(state.seed_delete_template(&id).await?)
}

async fn tools(State(state): State<AppState>) -> Answer {
    ok(state.seed_tools().await?)
}

async fn call_tool(State(state): State<AppState>, body: Bytes) -> Answer {
    ok(state.seed_call_tool(json_body(&body)?).await?)
}

async fn sessions(State(state): State<AppState>, Caller(caller): Caller) -> Answer {
    ok(state.seed_sessions(&caller).await?)
}

async fn session(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    ok(Box::pin(state.seed_session(&caller, &id)).await?)
}

async fn delete_session(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    ok(Box::pin(state.seed_delete_session(&caller, &id)).await?)
}

async fn generate_title(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    ok(Box::pin(state.seed_generate_title(&caller, &id, json_body(&body)?)).await?)
}

async fn revoke(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    match Box::pin(state.seed_revoke(&caller, &id, json_body(&body)?)).await {
        Ok(body) => ok(body),
        Err(error) if error.code == "journal_conflict" => {
            let files = error
                .details
                .as_ref()
                .and_then(|details| details.get("files").cloned())
                .unwrap_or_else(|| json!([]));
            let body = json!({
                "error": "JournalConflict",
                "message": error.message,
                "files": files,
                "can_force": true,
            });
            Ok((StatusCode::CONFLICT, Json(body)).into_response())
        }
        Err(error) => Err(error.into()),
    }
}

async fn file_journals(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    ok(Box::pin(state.seed_file_journals(&caller, &id)).await?)
}

async fn file_journal_diff(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path((id, turn)): Path<(String, String)>,
) -> Answer {
    ok(Box::pin(state.seed_file_journal_diff(&caller, &id, &turn)).await?)
}

async fn terminals(State(state): State<AppState>, Caller(caller): Caller) -> Answer {
    let listed = state.list_terminals(&caller, None).await?;
    let terminals: Vec<Value> = listed
        .into_iter()
        .map(|t| json!({"terminal_id": t.terminal_id, "session_id": t.session_id}))
        .collect();
    ok(json!({"terminals": terminals}))
}

async fn close_terminal(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    let missing = || AppError::not_found(format!("Terminal not found: {id}"));
    if state.terminal(&caller, &id).await.is_ok() {
        state.close_terminal(&caller, &id).await?;
        return ok(json!({"status": "deleted", "terminal_id": id}));
    }
    // A session's terminal, named by the session (`<session>:auto` or bare).
    let session = id.strip_suffix(":auto").unwrap_or(&id);
    let listed = state
        .list_terminals(&caller, Some(session))
        .await
        .map_err(|_| missing())?;
    if listed.is_empty() {
        return Err(missing().into());
    }
    for terminal in listed {
        state.close_terminal(&caller, &terminal.terminal_id).await?;
    }
    ok(json!({"status": "deleted", "terminal_id": id}))
}

#[derive(Debug, serde::Deserialize)]
struct TerminalSocketQuery {
    terminal_id: Option<String>,
    cols: Option<u16>,
    rows: Option<u16>,
    /// The seed's workspace folder: a session's workspace is its own here.
    #[allow(dead_code)]
    workspace: Option<String>,
}

async fn terminal_socket(
    State(state): State<AppState>,
    Caller(caller): Caller,
    query: Result<Query<TerminalSocketQuery>, axum::extract::rejection::QueryRejection>,
    upgrade: Result<
        axum::extract::ws::WebSocketUpgrade,
        axum::extract::ws::rejection::WebSocketUpgradeRejection,
    >,
) -> Answer {
    let Query(query) = query.map_err(|rejection| AppError::bad_request(rejection.body_text()))?;
    let upgrade = crate::routes::terminals::websocket(upgrade)?;
    let Some(named) = query.terminal_id else {
        return Err(
            AppError::bad_request("Failed to create terminal: terminal_id is required").into(),
        );
    };
    let session = named.split(':').next().unwrap_or_default();
    let terminal = state
        .session_terminal(&caller, session, query.cols, query.rows)
        .await?;
    let flavour = crate::routes::terminals::Flavour::Seed;
    Ok(crate::routes::terminals::serve_socket(
        &state, &terminal, upgrade, flavour,
    ))
}

async fn create_tool(State(state): State<AppState>, body: Bytes) -> Answer {
    let body = Box::pin(state.seed_save_tool(None, json_body(&body)?)).await?;
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn update_tool(State(state): State<AppState>, Path(id): Path<String>, body: Bytes) -> Answer {
    ok(Box::pin(state.seed_save_tool(Some(&id), json_body(&body)?)).await?)
}

async fn delete_tool(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(state.seed_delete_tool(&id).await?)
}

async fn delete_tools(State(state): State<AppState>, body: Bytes) -> Answer {
    ok(state.seed_delete_tools(json_body(&body)?).await?)
}

async fn register_mcp(State(state): State<AppState>, body: Bytes) -> Answer {
    let keys_exist = state
        .auth
        .enabled()
        .await
        .map_err(|error| AppError::internal(error.to_string()))?;
    ok(state
        .seed_register_mcp(json_body(&body)?, keys_exist)
        .await?)
}

async fn register_skill(State(state): State<AppState>, body: Bytes) -> Answer {
    let body = state.seed_register_skill(json_body(&body)?).await?;
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn mcp_servers(State(state): State<AppState>) -> Answer {
    ok(state.seed_mcp_servers())
}

async fn delete_mcp_server(State(state): State<AppState>, Path(name): Path<String>) -> Answer {
    ok(state.seed_delete_mcp_server(&name).await?)
}

async fn env(State(state): State<AppState>) -> Answer {
    ok(state.seed_env().await?)
}

async fn set_env(State(state): State<AppState>, body: Bytes) -> Answer {
    ok(state.seed_set_env(json_body(&body)?).await?)
}

async fn delete_env(State(state): State<AppState>, Path(key): Path<String>) -> Answer {
    ok(state.seed_delete_env(&key).await?)
}

async fn detect_env(State(state): State<AppState>) -> Answer {
    ok(state.seed_detect_env().await?)
}

#[derive(Debug, serde::Deserialize)]
struct SetupQuery {
    op: Option<String>,
}

async fn setup(
    query: Result<Query<SetupQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(|error| AppError::bad_request(error.body_text()))?;
    ok(agentry_app::linglong::seed_setup(query.op.as_deref())?)
}
