//! Terminal routes: PTY shells in a session's sandbox (`/v1/terminals`: open, list, show,
//! close) and the WebSocket a terminal is driven through (`/v1/terminals/{id}/ws`), which the
//! seed's `/linglong/v1/terminals/ws` shares ([`socket`]).
//!
//! **The socket.** On connect the server sends a text frame `{"type": "attached",
//! "terminal_id", "cols", "rows"}`, then what the terminal showed so far (its scrollback, as
//! binary frames), then its output as it comes (binary frames, raw bytes). When the program ends
//! a text frame `{"type": "exit", "code", "signal"}` comes and the socket closes. The client
//! sends keystrokes as binary frames, or as text frames; a text frame that is a JSON object
//! `{"type": "resize", "cols", "rows"}` (or the seed's `{"__resize": true, "cols", "rows"}`)
//! resizes, and `{"type": "input", "data"}` is input. A dropped connection leaves the terminal
//! running: connecting again shows the scrollback and goes on.

use axum::Json;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::ws::rejection::WebSocketUpgradeRejection;
use axum::extract::ws::{CloseFrame, Message, Utf8Bytes, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::error::RecvError;
use tokio_util::sync::CancellationToken;
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::terminals::{Attachment, PtyTerminal, TerminalInfo, info};

use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{BadRequest, NotFound, PayloadTooLarge, ServiceUnavailable, TooManyRequests};
use crate::state::AppState;

/// The terminal routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, open))
        .routes(routes!(show, close))
        // A WebSocket: OpenAPI cannot describe its frames (the module's documentation does).
        .route("/v1/terminals/{id}/ws", axum::routing::get(attach))
}

#[derive(Debug, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    /// Only this session's terminals.
    session_id: Option<String>,
}

/// `GET /v1/terminals`.
#[derive(Debug, serde::Serialize, ToSchema)]
struct TerminalList {
    /// The terminals, oldest first.
    terminals: Vec<TerminalInfo>,
}

/// Lists the open terminals (of one session, when named).
#[utoipa::path(
    get,
    path = "/v1/terminals",
    tag = "terminals",
    operation_id = "list_terminals",
    params(ListQuery),
    responses(
        (status = 200, description = "The terminals.", body = TerminalList),
        BadRequest,
        NotFound,
    )
)]
async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<TerminalList>, ApiError> {
    let Query(query) = query?;
    let terminals = state
        .app
        .terminals()
        .list(&caller, query.session_id.as_deref())
        .await?;
    Ok(Json(TerminalList { terminals }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct OpenBody {
    /// The session whose sandbox it runs in.
    session_id: String,
    /// Columns (default 80).
    #[schema(minimum = 1, maximum = 1000)]
    cols: Option<u16>,
    /// Rows (default 24).
    #[schema(minimum = 1, maximum = 1000)]
    rows: Option<u16>,
    /// The program and its arguments (default: `/bin/bash -l`).
    #[schema(min_items = 1)]
    command: Option<Vec<String>>,
}

/// Opens a terminal: a program (a login shell by default) on a pseudo-terminal in the
/// session's sandbox. Drive it through `/v1/terminals/{id}/ws`.
#[utoipa::path(
    post,
    path = "/v1/terminals",
    tag = "terminals",
    operation_id = "open_terminal",
    request_body = OpenBody,
    responses(
        (status = 201, description = "Opened.", body = TerminalInfo),
        BadRequest,
        PayloadTooLarge,
        NotFound,
        TooManyRequests,
        ServiceUnavailable,
    )
)]
async fn open(
    State(state): State<AppState>,
    Caller(caller): Caller,
    body: Result<axum::body::Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body.map_err(|rejection| {
        ApiError::new(rejection.status(), "invalid_request", rejection.body_text())
    })?;
    let body: OpenBody = serde_json::from_slice(&body)
        .map_err(|error| ApiError::bad_request(format!("invalid JSON body: {error}")))?;
    let terminal = state
        .app
        .terminals()
        .open(
            &caller,
            &body.session_id,
            body.cols,
            body.rows,
            body.command,
        )
        .await?;
    Ok((StatusCode::CREATED, Json(shown(&terminal)?)).into_response())
}

/// A terminal as the API shows it.
fn shown(terminal: &PtyTerminal) -> Result<TerminalInfo, ApiError> {
    info(terminal).ok_or_else(|| ApiError::internal("a terminal outside any session".to_owned()))
}

/// A terminal's path parameter.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct TerminalPath {
    /// The terminal's id.
    #[allow(dead_code)]
    id: String,
}

/// Shows a terminal.
#[utoipa::path(
    get,
    path = "/v1/terminals/{id}",
    tag = "terminals",
    operation_id = "get_terminal",
    params(TerminalPath),
    responses(
        (status = 200, description = "The terminal.", body = TerminalInfo),
        NotFound,
    )
)]
async fn show(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<Json<TerminalInfo>, ApiError> {
    let terminal = state.app.terminals().get(&caller, &id).await?;
    Ok(Json(shown(&terminal)?))
}

/// Closes a terminal: its program and everything it started are killed.
#[utoipa::path(
    delete,
    path = "/v1/terminals/{id}",
    tag = "terminals",
    operation_id = "close_terminal",
    params(TerminalPath),
    responses(
        (status = 204, description = "Closed."),
        NotFound,
    )
)]
async fn close(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    state.app.terminals().close(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Attaches to a terminal over a WebSocket (see the module's documentation for the frames).
/// Without a WebSocket upgrade this is a 400. Not in the OpenAPI document.
async fn attach(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let upgrade = websocket(upgrade)?;
    let terminal = state.app.terminals().get(&caller, &id).await?;
    Ok(serve_socket(&state, &terminal, upgrade, Flavour::Agentry))
}

/// The WebSocket upgrade a terminal socket needs, checked before anything is opened or resized:
/// a plain GET (an `<img>` on any page) starts nothing (the second security review's N11).
pub(crate) fn websocket(
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<WebSocketUpgrade, agentry_app::error::AppError> {
    upgrade.map_err(|rejection| {
        agentry_app::error::AppError::bad_request(format!(
            "this is a WebSocket endpoint ({}): connect with `Upgrade: websocket`",
            rejection.body_text()
        ))
    })
}

/// Upgrades to the WebSocket `terminal` is driven through.
pub(crate) fn serve_socket(
    state: &AppState,
    terminal: &std::sync::Arc<PtyTerminal>,
    upgrade: WebSocketUpgrade,
    flavour: Flavour,
) -> Response {
    let attachment = terminal.attach();
    let shutdown = state.app.shutdown_signal().clone();
    upgrade.on_upgrade(move |socket| socket_loop(socket, attachment, flavour, shutdown))
}

/// Whose frames a socket speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flavour {
    /// Agentry's: binary output, JSON control messages (module documentation).
    Agentry,
    /// The seed's: `{"__terminal_id"}` first, then output as text frames (UTF-8), no exit
    /// message.
    Seed,
}

/// Serves one attachment until the client leaves, the program ends or the server stops.
pub(crate) async fn socket_loop(
    socket: WebSocket,
    mut attachment: Attachment,
    flavour: Flavour,
    shutdown: CancellationToken,
) {
    let (mut sink, mut stream) = socket.split();
    let terminal = std::sync::Arc::clone(&attachment.terminal);
    let size = terminal.size();
    let hello = match flavour {
        Flavour::Agentry => json!({
            "type": "attached",
            "terminal_id": terminal.id(),
            "cols": size.cols,
            "rows": size.rows,
        }),
        Flavour::Seed => json!({"__terminal_id": terminal.id()}),
    };
    if sink
        .send(Message::Text(hello.to_string().into()))
        .await
        .is_err()
    {
        return;
    }
    let mut text = Utf8Carry::default();
    let frame = |bytes: axum::body::Bytes, text: &mut Utf8Carry| match flavour {
        Flavour::Agentry => Some(Message::Binary(bytes)),
        Flavour::Seed => text.push(&bytes).map(|t| Message::Text(Utf8Bytes::from(t))),
    };
    let scrollback = std::mem::take(&mut attachment.scrollback);
    if !scrollback.is_empty()
        && let Some(message) = frame(scrollback, &mut text)
        && sink.send(message).await.is_err()
    {
        return;
    }
    loop {
        tokio::select! {
            () = shutdown.cancelled() => {
                let _ = sink.send(Message::Close(Some(CloseFrame {
                    code: 1001,
                    reason: "the server is stopping".into(),
                }))).await;
                return;
            }
            output = attachment.output.recv() => match output {
                Ok(bytes) => {
                    if let Some(message) = frame(bytes, &mut text)
                        && sink.send(message).await.is_err()
                    {
                        return;
                    }
                }
                // A client too slow to keep up misses what it could not take.
                Err(RecvError::Lagged(_)) => {}
                Err(RecvError::Closed) => break,
            },
            incoming = stream.next() => match incoming {
                Some(Ok(Message::Binary(bytes))) => {
                    if terminal.input(&bytes).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Text(text))) => {
                    if control(&terminal, text.as_str()).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Ping(_) | Message::Pong(_))) => {}
                Some(Ok(Message::Close(_)) | Err(_)) | None => return,
            },
        }
    }
    // The program ended.
    let status = terminal.ended().await;
    if flavour == Flavour::Agentry {
        let code = status.as_ref().and_then(|s| s.code);
        let signal = status.as_ref().and_then(|s| s.signal);
        let end = json!({"type": "exit", "code": code, "signal": signal});
        let _ = sink.send(Message::Text(end.to_string().into())).await;
    }
    let _ = sink
        .send(Message::Close(Some(CloseFrame {
            code: 1000,
            reason: "the program ended".into(),
        })))
        .await;
}

/// A text frame from the client: a resize, an input message, or keystrokes.
async fn control(terminal: &PtyTerminal, text: &str) -> Result<(), String> {
    if text.starts_with('{')
        && let Ok(Value::Object(message)) = serde_json::from_str::<Value>(text)
    {
        let number = |key: &str| {
            message
                .get(key)
                .and_then(Value::as_u64)
                .map(|n| u16::try_from(n).unwrap_or(u16::MAX))
        };
        let kind = message.get("type").and_then(Value::as_str);
        if kind == Some("resize") || message.contains_key("__resize") {
            if let (Some(cols), Some(rows)) = (number("cols"), number("rows")) {
                terminal
                    .resize(cols, rows)
                    .map_err(|error| error.to_string())?;
            }
            return Ok(());
        }
        if kind == Some("input") {
            let data = message.get("data").and_then(Value::as_str).unwrap_or("");
            return terminal
                .input(data.as_bytes())
                .await
                .map_err(|error| error.to_string());
        }
    }
    terminal
        .input(text.as_bytes())
        .await
        .map_err(|error| error.to_string())
}

/// Turns byte chunks into text without splitting a character across two frames (an
/// incomplete sequence at a chunk's end waits for the next; invalid bytes become U+FFFD).
#[derive(Debug, Default)]
struct Utf8Carry {
    pending: Vec<u8>,
}

impl Utf8Carry {
    fn push(&mut self, bytes: &[u8]) -> Option<String> {
        self.pending.extend_from_slice(bytes);
        let cut = match std::str::from_utf8(&self.pending) {
            Ok(_) => self.pending.len(),
            Err(error) if error.error_len().is_none() => error.valid_up_to(),
            Err(_) => self.pending.len(),
        };
        let rest = self.pending.split_off(cut);
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending = rest;
        (!text.is_empty()).then_some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::Utf8Carry;

    #[test]
    fn characters_are_never_split_across_frames() {
        let mut carry = Utf8Carry::default();
        let bytes = "héllo ✓".as_bytes();
        let (first, second) = bytes.split_at(2); // inside the é
        assert_eq!(carry.push(first).as_deref(), Some("h"));
        assert_eq!(carry.push(second).as_deref(), Some("éllo ✓"));
        assert_eq!(carry.push(b"\xff!").as_deref(), Some("\u{fffd}!"));
        assert_eq!(carry.push(&"✓".as_bytes()[..1]), None);
    }
}
