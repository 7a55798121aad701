//! The seed system's API (Linglong, the Python agent service whose README Agentry implements)
//! under `/linglong`: a seed client works by changing only its server URL to
//! `http://host:port/linglong`; Agentry's own `/v1` keeps its richer shapes. Parse into the
//! app's requests, hand to the app, render in the seed's shapes:
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
//! The wire lives in the modules here: [`request`] (the seed's inference request and its
//! conversation: stateless multi-turn histories with tool calls and results, or a message for
//! a session), [`frames`] (a run's events as the seed's stream messages, and its answer's
//! turns), [`runs`] (starting runs), [`group`] (group chats), and [`catalogue`], [`agents`],
//! [`tools`], [`env`], [`mcp`], [`journal`] (its configuration routes over the app's services:
//! models, templates, tools and Python function tools, sessions, keys, MCP servers, file
//! journals).
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

use self::request::SeedInferRequest;
use agentry_app::error::AppError;

pub mod agents;
pub mod catalogue;
pub mod env;
pub mod frames;
pub mod group;
pub mod journal;
pub mod mcp;
pub mod request;
pub mod runs;
pub mod tools;
pub(crate) mod tus;
pub(crate) mod workspace;

use axum::response::sse::{Event, KeepAlive, Sse};

use crate::authorization::Caller;
use crate::error::ApiError;
use crate::routes::status::FeedItem;
use crate::state::AppState;

/// Where the seed's API is served.
pub const PREFIX: &str = crate::prefixes::LINGLONG;

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
    let answer = Box::pin(runs::seed_infer(&state.app, &caller, request)).await?;
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
    let start = Box::pin(runs::seed_start(&state.app, &caller, request)).await?;
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
    state.app.check_session_access(&caller, session).await?;
    let aborted = state
        .app
        .submit(agentry_app::ops::StopSession {
            session_id: session,
        })
        .await?;
    ok(json!({"status": if aborted { "aborted" } else { "idle" }, "session_id": session}))
}

async fn models(State(state): State<AppState>) -> Answer {
    ok(catalogue::seed_models(&state.app).await?)
}

async fn create_model(State(state): State<AppState>, body: Bytes) -> Answer {
    let (status, body) = Box::pin(catalogue::seed_save_model(
        &state.app,
        None,
        json_body(&body)?,
    ))
    .await?;
    with_status(status, body)
}

async fn update_model(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let (status, body) = Box::pin(catalogue::seed_save_model(
        &state.app,
        Some(&id),
        json_body(&body)?,
    ))
    .await?;
    with_status(status, body)
}

async fn delete_model(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(catalogue::seed_delete_model(&state.app, &id).await?)
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
    ok(agents::seed_agents(&state.app).await?)
}

async fn agent(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(agents::seed_agent(&state.app, &id).await?)
}

async fn create_agent(State(state): State<AppState>, body: Bytes) -> Answer {
    let (status, body) =
        Box::pin(agents::seed_save_agent(&state.app, None, json_body(&body)?)).await?;
    with_status(status, body)
}

async fn update_agent(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    let (status, body) = Box::pin(agents::seed_save_agent(
        &state.app,
        Some(&id),
        json_body(&body)?,
    ))
    .await?;
    with_status(status, body)
}

async fn delete_agent(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(agents::seed_delete_agent(&state.app, &id).await?)
}

async fn mark_read(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    ok(agents::seed_mark_read(&state.app, &caller, &id).await?)
}

/// `GET /v1/sessions/events`: the seed's status feed, `data: <JSON>` events without a name:
/// `{"event": "init", "sessions": {id: status}}` first (and again after a gap, so a slow
/// client is whole again), then `{"event": "message", "session_id", "status"}` and
/// `{"event": "title_update", "session_id", "title"}` as they happen.
async fn status_feed(State(state): State<AppState>, Caller(caller): Caller) -> Answer {
    let init = agents::seed_status_init(&state.app, &caller).await?;
    let changes = crate::routes::status::visible_changes(state.clone(), caller.clone());
    let events = async_stream::stream! {
        yield Ok::<_, std::convert::Infallible>(Event::default().data(init.to_string()));
        futures::pin_mut!(changes);
        while let Some(item) = changes.next().await {
            match item {
                FeedItem::Change(change) => {
                    if let Some(event) = agents::seed_status_event(&change) {
                        yield Ok(Event::default().data(event.to_string()));
                    }
                }
                FeedItem::Lagged(_) => {
                    if let Ok(init) = agents::seed_status_init(&state.app, &caller).await {
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
    ok(catalogue::seed_templates(&state.app).await?)
}

async fn create_template(State(state): State<AppState>, body: Bytes) -> Answer {
    let body = Box::pin(catalogue::seed_save_template(
        &state.app,
        None,
        json_body(&body)?,
    ))
    .await?;
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn update_template(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    ok(Box::pin(catalogue::seed_save_template(
        &state.app,
        Some(&id),
        json_body(&body)?,
    ))
    .await?)
}

async fn delete_template(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(catalogue::seed_delete_template(&state.app, &id).await?)
}

async fn tools(State(state): State<AppState>) -> Answer {
    ok(catalogue::seed_tools(&state.app).await?)
}

async fn call_tool(State(state): State<AppState>, body: Bytes) -> Answer {
    ok(catalogue::seed_call_tool(&state.app, json_body(&body)?).await?)
}

async fn sessions(State(state): State<AppState>, Caller(caller): Caller) -> Answer {
    ok(catalogue::seed_sessions(&state.app, &caller).await?)
}

async fn session(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    ok(Box::pin(catalogue::seed_session(&state.app, &caller, &id)).await?)
}

async fn delete_session(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    ok(Box::pin(catalogue::seed_delete_session(&state.app, &caller, &id)).await?)
}

async fn generate_title(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    ok(Box::pin(catalogue::seed_generate_title(
        &state.app,
        &caller,
        &id,
        json_body(&body)?,
    ))
    .await?)
}

async fn revoke(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    body: Bytes,
) -> Answer {
    match Box::pin(journal::seed_revoke(
        &state.app,
        &caller,
        &id,
        json_body(&body)?,
    ))
    .await
    {
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
    ok(Box::pin(journal::seed_file_journals(&state.app, &caller, &id)).await?)
}

async fn file_journal_diff(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path((id, turn)): Path<(String, String)>,
) -> Answer {
    ok(Box::pin(journal::seed_file_journal_diff(
        &state.app, &caller, &id, &turn,
    ))
    .await?)
}

async fn terminals(State(state): State<AppState>, Caller(caller): Caller) -> Answer {
    let listed = state.app.terminals().list(&caller, None).await?;
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
    if state.app.terminals().get(&caller, &id).await.is_ok() {
        state.app.terminals().close(&caller, &id).await?;
        return ok(json!({"status": "deleted", "terminal_id": id}));
    }
    // A session's terminal, named by the session (`<session>:auto` or bare).
    let session = id.strip_suffix(":auto").unwrap_or(&id);
    let listed = state
        .app
        .terminals()
        .list(&caller, Some(session))
        .await
        .map_err(|_| missing())?;
    if listed.is_empty() {
        return Err(missing().into());
    }
    for terminal in listed {
        state
            .app
            .terminals()
            .close(&caller, &terminal.terminal_id)
            .await?;
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
        .app
        .terminals()
        .of_session(&caller, session, query.cols, query.rows)
        .await?;
    let flavour = crate::routes::terminals::Flavour::Seed;
    Ok(crate::routes::terminals::serve_socket(
        &state, &terminal, upgrade, flavour,
    ))
}

async fn create_tool(State(state): State<AppState>, body: Bytes) -> Answer {
    let body = Box::pin(tools::seed_save_tool(&state.app, None, json_body(&body)?)).await?;
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn update_tool(State(state): State<AppState>, Path(id): Path<String>, body: Bytes) -> Answer {
    ok(Box::pin(tools::seed_save_tool(
        &state.app,
        Some(&id),
        json_body(&body)?,
    ))
    .await?)
}

async fn delete_tool(State(state): State<AppState>, Path(id): Path<String>) -> Answer {
    ok(tools::seed_delete_tool(&state.app, &id).await?)
}

async fn delete_tools(State(state): State<AppState>, body: Bytes) -> Answer {
    ok(tools::seed_delete_tools(&state.app, json_body(&body)?).await?)
}

async fn register_mcp(State(state): State<AppState>, body: Bytes) -> Answer {
    let keys_exist = state
        .auth
        .enabled()
        .await
        .map_err(|error| AppError::internal(error.to_string()))?;
    ok(mcp::seed_register_mcp(&state.app, json_body(&body)?, keys_exist).await?)
}

async fn register_skill(State(state): State<AppState>, body: Bytes) -> Answer {
    let body = tools::seed_register_skill(&state.app, json_body(&body)?).await?;
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

async fn mcp_servers(State(state): State<AppState>) -> Answer {
    ok(mcp::seed_mcp_servers(&state.app))
}

async fn delete_mcp_server(State(state): State<AppState>, Path(name): Path<String>) -> Answer {
    ok(mcp::seed_delete_mcp_server(&state.app, &name).await?)
}

async fn env(State(state): State<AppState>) -> Answer {
    ok(env::seed_env(&state.app).await?)
}

async fn set_env(State(state): State<AppState>, body: Bytes) -> Answer {
    ok(env::seed_set_env(&state.app, json_body(&body)?).await?)
}

async fn delete_env(State(state): State<AppState>, Path(key): Path<String>) -> Answer {
    ok(env::seed_delete_env(&state.app, &key).await?)
}

async fn detect_env(State(state): State<AppState>) -> Answer {
    ok(env::seed_detect_env(&state.app).await?)
}

#[derive(Debug, serde::Deserialize)]
struct SetupQuery {
    op: Option<String>,
}

async fn setup(
    query: Result<Query<SetupQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let Query(query) = query.map_err(|error| AppError::bad_request(error.body_text()))?;
    ok(runs::seed_setup(query.op.as_deref())?)
}
