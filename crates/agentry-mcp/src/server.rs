//! Agentry as an MCP server, over stdio ([`serve_stdio`]) and streamable HTTP
//! ([`McpHttpService`]).
//!
//! The protocol (negotiation, sessions, JSON-RPC, cancellation) is rmcp's; what the server
//! offers comes from an [`McpBackend`] that the HTTP crate implements over its state: a list of
//! [`ServedTool`]s and a way to call one. A call gets a [`ProgressSink`] that sends
//! `notifications/progress` to the client when its request carried a `progressToken`, and a
//! cancellation token that fires when the client sends `notifications/cancelled` (or, on a
//! one-shot stateless HTTP request, when the client drops the response).
//!
//! Protocol revisions: everything rmcp knows. A client that starts with `initialize`
//! (2024-11-05 up to 2025-11-25) gets a stateful session (`Mcp-Session-Id`; `GET` opens the
//! server's stream, `DELETE` ends the session); a 2026-07-28 client sends self-contained
//! requests that are served statelessly.

use std::convert::Infallible;
use std::fmt::Display;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body_util::combinators::BoxBody;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ProgressToken,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, Peer, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

/// A tool the server offers.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedTool {
    /// The name clients call it by.
    pub name: String,
    /// A display title.
    pub title: Option<String>,
    /// What it does, for the calling model.
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    pub input_schema: Value,
    /// JSON Schema of the structured result, when it returns one.
    pub output_schema: Option<Value>,
}

/// What a call returns to the client.
#[derive(Debug, Clone, PartialEq)]
pub struct ServedResult {
    /// The text content (the agent's answer, the tool's result, or what went wrong).
    pub text: String,
    /// Structured content (matching the tool's output schema, when it declares one).
    pub structured: Option<Value>,
    /// Whether the call failed; the client's model sees the text as an error it may act on.
    pub is_error: bool,
}

impl ServedResult {
    /// A successful text result.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            structured: None,
            is_error: false,
        }
    }

    /// A failed call, explained by `text`.
    pub fn error(text: impl Into<String>) -> Self {
        Self {
            text: text.into(),
            structured: None,
            is_error: true,
        }
    }

    /// Adds structured content.
    pub fn with_structured(mut self, structured: Value) -> Self {
        self.structured = Some(structured);
        self
    }
}

/// Why the backend could not list or call its tools.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// No tool has this name (a JSON-RPC "invalid params" error).
    #[error("unknown tool: {0:?}")]
    UnknownTool(String),
    /// The arguments are not valid; sent as an error result so the caller can correct them.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The server failed (a JSON-RPC internal error).
    #[error("{0}")]
    Internal(String),
}

/// What Agentry's MCP server offers: implemented by the HTTP crate over its state.
pub trait McpBackend: Send + Sync + 'static {
    /// The tools offered now (asked on every `tools/list`, so changes show at once).
    fn list_tools(&self) -> BoxFuture<'_, Result<Vec<ServedTool>, BackendError>>;

    /// Calls the tool `name` with `arguments` (a JSON object; `{}` when the client sent none).
    ///
    /// `progress` reports steps to the client; `cancel` fires when the client cancels the
    /// request. Failures of the call itself belong in an error [`ServedResult`]; `Err` is for
    /// an unknown tool, arguments that cannot be used, or a server failure.
    fn call_tool(
        &self,
        name: String,
        arguments: Value,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'_, Result<ServedResult, BackendError>>;
}

/// Sends progress notifications for one call, when the client asked for them (its request
/// carried a `progressToken`); otherwise reports go nowhere. Cheap to clone.
#[derive(Clone, Default)]
pub struct ProgressSink {
    inner: Option<Arc<ProgressInner>>,
}

struct ProgressInner {
    peer: Peer<RoleServer>,
    token: ProgressToken,
    steps: AtomicU64,
}

impl std::fmt::Debug for ProgressSink {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ProgressSink")
            .field("enabled", &self.is_enabled())
            .field("steps", &self.steps())
            .finish()
    }
}

impl ProgressSink {
    /// A sink that sends nothing (the client asked for no progress).
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Whether reports reach the client.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// How many steps were reported so far.
    pub fn steps(&self) -> u64 {
        self.inner
            .as_ref()
            .map_or(0, |inner| inner.steps.load(Ordering::Relaxed))
    }

    /// Reports one more step: a notification whose `progress` counts the steps so far (no
    /// total: how many a run takes is not known in advance) with `message`. A client that went
    /// away is not an error: the report is dropped.
    pub async fn report(&self, message: impl Into<String>) {
        let Some(inner) = &self.inner else {
            return;
        };
        let step = inner.steps.fetch_add(1, Ordering::Relaxed) + 1;
        let params =
            ProgressNotificationParam::new(inner.token.clone(), step as f64).with_message(message);
        if let Err(error) = inner.peer.notify_progress(params).await {
            tracing::debug!("progress notification not sent: {error}");
        }
    }
}

/// Who the server says it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerIdentity {
    /// The implementation name (`serverInfo.name`).
    pub name: String,
    /// Its version.
    pub version: String,
    /// Instructions for the client's model (`instructions` of the `initialize` result).
    pub instructions: Option<String>,
}

impl Default for ServerIdentity {
    fn default() -> Self {
        Self {
            name: "agentry".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            instructions: None,
        }
    }
}

/// The rmcp handler over a backend.
#[derive(Clone)]
struct Handler {
    backend: Arc<dyn McpBackend>,
    identity: Arc<ServerIdentity>,
}

impl Handler {
    fn new(backend: Arc<dyn McpBackend>, identity: ServerIdentity) -> Self {
        Self {
            backend,
            identity: Arc::new(identity),
        }
    }
}

/// A JSON object out of a schema value (`{}` for anything else, which a backend never gives).
fn schema_object(schema: Value) -> JsonObject {
    match schema {
        Value::Object(object) => object,
        _ => JsonObject::new(),
    }
}

fn to_rmcp_tool(tool: ServedTool) -> Tool {
    let mut converted = Tool::new(
        tool.name,
        tool.description,
        schema_object(tool.input_schema),
    );
    if let Some(title) = tool.title {
        converted = converted.with_title(title);
    }
    if let Some(output) = tool.output_schema {
        converted = converted.with_raw_output_schema(Arc::new(schema_object(output)));
    }
    converted
}

fn to_rmcp_result(result: ServedResult) -> CallToolResult {
    let content = vec![ContentBlock::text(result.text)];
    let mut converted = if result.is_error {
        CallToolResult::error(content)
    } else {
        CallToolResult::success(content)
    };
    converted.structured_content = result.structured;
    converted
}

impl ServerHandler for Handler {
    fn get_info(&self) -> ServerConfig {
        let mut config = ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                self.identity.name.clone(),
                self.identity.version.clone(),
            ));
        if let Some(instructions) = &self.identity.instructions {
            config = config.with_instructions(instructions.clone());
        }
        config
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self
            .backend
            .list_tools()
            .await
            .map_err(|error| ErrorData::internal_error(error.to_string(), None))?;
        Ok(ListToolsResult::with_all_items(
            tools.into_iter().map(to_rmcp_tool).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let progress = match context.meta.get_progress_token() {
            Some(token) => ProgressSink {
                inner: Some(Arc::new(ProgressInner {
                    peer: context.peer.clone(),
                    token,
                    steps: AtomicU64::new(0),
                })),
            },
            None => ProgressSink::disabled(),
        };
        let arguments = Value::Object(request.arguments.unwrap_or_default());
        let outcome = self
            .backend
            .call_tool(
                request.name.into_owned(),
                arguments,
                progress,
                context.ct.clone(),
            )
            .await;
        match outcome {
            Ok(result) => Ok(to_rmcp_result(result).into()),
            Err(BackendError::InvalidArguments(message)) => Ok(to_rmcp_result(
                ServedResult::error(format!("invalid arguments: {message}")),
            )
            .into()),
            Err(error @ BackendError::UnknownTool(_)) => {
                Err(ErrorData::invalid_params(error.to_string(), None))
            }
            Err(BackendError::Internal(message)) => Err(ErrorData::internal_error(message, None)),
        }
    }
}

/// Why serving over stdio stopped with an error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The client went away or misbehaved before the session was set up.
    #[error("the MCP session could not start: {0}")]
    Initialize(String),
    /// The session's task failed.
    #[error("the MCP session failed: {0}")]
    Session(String),
}

/// Serves `backend` on this process's stdin and stdout until the client closes stdin (or
/// `shutdown` is cancelled). Nothing else may write to stdout meanwhile: it carries JSON-RPC.
pub async fn serve_stdio(
    backend: Arc<dyn McpBackend>,
    identity: ServerIdentity,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    let handler = Handler::new(backend, identity);
    let running = handler
        .serve_with_ct(rmcp::transport::io::stdio(), shutdown)
        .await
        .map_err(|error| ServeError::Initialize(error.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|error| ServeError::Session(error.to_string()))?;
    Ok(())
}

/// How the streamable HTTP endpoint behaves.
#[derive(Debug, Clone, Default)]
pub struct HttpOptions {
    /// Who the server says it is.
    pub identity: ServerIdentity,
    /// Browser origins allowed to call the endpoint (`scheme://host[:port]`). A request
    /// carrying any other `Origin` is refused with 403, which is what stops DNS-rebinding
    /// attacks; clients that send no `Origin` (every non-browser client) are not affected.
    pub allowed_origins: Vec<String>,
    /// The embedding server checks every request's `Origin` itself (it knows its own origin,
    /// which this endpoint cannot): `allowed_origins` is then not used.
    pub origins_checked: bool,
    /// Cancelled when the server shuts down: open streams end and sessions close, so a graceful
    /// shutdown does not wait on them.
    pub shutdown: CancellationToken,
    /// How often an idle SSE stream gets a keep-alive comment (default 15 s).
    pub keep_alive: Option<Duration>,
}

/// The body of [`McpHttpService`]'s responses.
pub type McpHttpBody = BoxBody<Bytes, Infallible>;

/// The MCP endpoint over streamable HTTP, for any path of an HTTP server: `POST` carries
/// JSON-RPC messages (answered as JSON or an SSE stream with progress notifications before the
/// response), `GET` opens a session's server-to-client stream and `DELETE` ends a session.
/// Host and authentication checks are the embedding server's: only the `Origin` is checked
/// here. Cheap to clone.
#[derive(Clone)]
pub struct McpHttpService {
    inner: StreamableHttpService<Handler, LocalSessionManager>,
}

impl std::fmt::Debug for McpHttpService {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("McpHttpService")
            .finish_non_exhaustive()
    }
}

impl McpHttpService {
    /// The endpoint over `backend`.
    pub fn new(backend: Arc<dyn McpBackend>, options: HttpOptions) -> Self {
        let handler = Handler::new(backend, options.identity);
        let config = StreamableHttpServerConfig::default().disable_allowed_hosts();
        let config = if options.origins_checked {
            config.disable_allowed_origins()
        } else {
            config
                .with_allowed_origins(options.allowed_origins)
                .enforce_origin_validation()
        };
        let config = config
            .with_cancellation_token(options.shutdown)
            .with_sse_keep_alive(Some(options.keep_alive.unwrap_or(Duration::from_secs(15))));
        let inner = StreamableHttpService::new(
            move || Ok(handler.clone()),
            Arc::new(LocalSessionManager::default()),
            config,
        );
        Self { inner }
    }

    /// Answers one HTTP request.
    pub async fn handle<B>(&self, request: http::Request<B>) -> http::Response<McpHttpBody>
    where
        B: http_body::Body + Send + 'static,
        B::Data: Send + 'static,
        B::Error: Display,
    {
        let ends_session = request.method() == http::Method::DELETE;
        let mut response = self.inner.handle(request).await;
        // A session ended: 200, which MCP clients take as success (the SDKs log a 202 as a
        // failed termination).
        if ends_session && response.status() == http::StatusCode::ACCEPTED {
            *response.status_mut() = http::StatusCode::OK;
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use rmcp::model::{ClientRequest, Request, ServerResult};
    use rmcp::service::{NotificationContext, PeerRequestOptions};
    use rmcp::{ClientHandler, RoleClient};
    use serde_json::json;
    use tokio::sync::Notify;

    use super::*;

    /// `echo` reports two steps and echoes `text`; `wait` waits for its cancellation.
    #[derive(Default)]
    struct Echo {
        cancelled: Notify,
    }

    impl McpBackend for Echo {
        fn list_tools(&self) -> BoxFuture<'_, Result<Vec<ServedTool>, BackendError>> {
            Box::pin(async {
                Ok(vec![ServedTool {
                    name: "echo".into(),
                    title: Some("Echo".into()),
                    description: "Echoes.".into(),
                    input_schema: json!({"type": "object", "properties": {"text": {"type": "string"}}}),
                    output_schema: None,
                }])
            })
        }

        fn call_tool(
            &self,
            name: String,
            arguments: Value,
            progress: ProgressSink,
            cancel: CancellationToken,
        ) -> BoxFuture<'_, Result<ServedResult, BackendError>> {
            Box::pin(async move {
                match name.as_str() {
                    "echo" => {
                        let Some(text) = arguments["text"].as_str() else {
                            return Err(BackendError::InvalidArguments(
                                "`text` is required".into(),
                            ));
                        };
                        progress.report("first").await;
                        progress.report("second").await;
                        Ok(ServedResult::text(text)
                            .with_structured(json!({"steps": progress.steps()})))
                    }
                    "wait" => {
                        cancel.cancelled().await;
                        self.cancelled.notify_one();
                        Ok(ServedResult::error("cancelled"))
                    }
                    _ => Err(BackendError::UnknownTool(name)),
                }
            })
        }
    }

    #[derive(Default)]
    struct Client {
        progress: Mutex<Vec<(f64, Option<String>)>>,
    }

    impl ClientHandler for Client {
        async fn on_progress(
            &self,
            params: ProgressNotificationParam,
            _context: NotificationContext<RoleClient>,
        ) {
            self.progress
                .lock()
                .unwrap()
                .push((params.progress, params.message));
        }
    }

    fn call(name: &str, arguments: Value) -> ClientRequest {
        let Value::Object(arguments) = arguments else {
            panic!("arguments must be an object");
        };
        ClientRequest::CallToolRequest(Request::new(
            CallToolRequestParams::new(name.to_owned()).with_arguments(arguments),
        ))
    }

    #[tokio::test]
    async fn a_session_lists_calls_with_progress_and_cancels() {
        let backend = Arc::new(Echo::default());
        let (server_io, client_io) = tokio::io::duplex(64 * 1024);
        let handler = Handler::new(backend.clone(), ServerIdentity::default());
        tokio::spawn(async move {
            let running = handler.serve(server_io).await.unwrap();
            running.waiting().await.unwrap();
        });
        let client = Client::default().serve(client_io).await.unwrap();
        let info = client.peer_info().unwrap();
        assert_eq!(info.server_info.as_ref().unwrap().name, "agentry");

        let tools = client.list_all_tools().await.unwrap();
        assert_eq!(tools.len(), 1);
        assert_eq!(tools[0].name, "echo");
        assert_eq!(tools[0].title.as_deref(), Some("Echo"));

        // A call with a progress token gets a notification per step, counting up.
        let handle = client
            .send_cancellable_request(
                call("echo", json!({"text": "hi"})),
                PeerRequestOptions::no_options(),
            )
            .await
            .unwrap();
        let ServerResult::CallToolResult(result) = handle.await_response().await.unwrap() else {
            panic!("a tool result");
        };
        assert_eq!(result.is_error, Some(false));
        assert_eq!(result.content[0].as_text().unwrap().text, "hi");
        assert_eq!(result.structured_content, Some(json!({"steps": 2})));
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            *client.service().progress.lock().unwrap(),
            [
                (1.0, Some("first".to_owned())),
                (2.0, Some("second".to_owned()))
            ]
        );

        // Invalid arguments are an error result; an unknown tool is a protocol error.
        let result = client
            .call_tool(CallToolRequestParams::new("echo").with_arguments(JsonObject::new()))
            .await
            .unwrap();
        assert_eq!(result.is_error, Some(true));
        assert_eq!(
            result.content[0].as_text().unwrap().text,
            "invalid arguments: `text` is required"
        );
        let error = client
            .call_tool(CallToolRequestParams::new("nothing"))
            .await
            .unwrap_err();
        assert!(error.to_string().contains("unknown tool"), "{error}");

        // notifications/cancelled reaches the backend's token.
        let handle = client
            .send_cancellable_request(call("wait", json!({})), PeerRequestOptions::no_options())
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        handle.cancel(Some("enough".into())).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), backend.cancelled.notified())
            .await
            .expect("the backend saw the cancellation");
    }
}
