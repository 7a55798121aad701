//! The mock provider HTTP server: a loopback axum server that records every request, answers
//! each with the next queued [`Reply`] (or the fallback), and checks protocol invariants on
//! what it received.

mod recorded;
mod reply;

use std::collections::VecDeque;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use axum::Router;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::serve::ListenerExt;
use serde_json::Value;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use recorded::RecordedRequest;
pub use reply::{Chunking, Reply};

use crate::error::TestkitError;
use crate::protocol::{Protocol, ProtocolViolation, check_request};
use crate::render::TurnRequest;

/// A running mock provider on `127.0.0.1`.
///
/// Serves every path and method. Each request pops the next queued reply (FIFO); when the
/// queue is empty the fallback reply is served, and without one the answer is a 500
/// `mock_error`. Every request is recorded, including unanswered ones.
///
/// Model metadata requests (`GET …/models`, `POST …/api/show`, which clients send to learn a
/// model's context window) are the exception: they take no queued reply and are not recorded;
/// they get the listing set with [`MockProvider::set_model_metadata`], else a 404, and
/// [`MockProvider::metadata_requests`] counts them.
///
/// Clones share the same server; it shuts down when the last clone is dropped.
#[derive(Clone)]
pub struct MockProvider {
    inner: Arc<Running>,
}

struct Running {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _shutdown: DropGuard,
}

/// State shared between the handle and the request handler.
#[derive(Default)]
struct Shared {
    state: Mutex<MockState>,
}

#[derive(Default)]
struct MockState {
    queue: VecDeque<Reply>,
    fallback: Option<Reply>,
    requests: Vec<RecordedRequest>,
    metadata: Option<Value>,
    metadata_requests: usize,
}

impl Shared {
    /// Locks the state; a poisoned lock (a panicking test thread) is still usable because every
    /// update leaves the state consistent.
    fn lock(&self) -> MutexGuard<'_, MockState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl MockProvider {
    /// Binds `127.0.0.1:0` and starts serving on the current tokio runtime.
    pub async fn start() -> Result<MockProvider, TestkitError> {
        // A long accept queue: a thousand calls at once (the runs bench) must not wait out
        // TCP's one-second retransmission of a dropped connection.
        let listener = tokio::net::TcpSocket::new_v4()
            .and_then(|socket| {
                socket.bind((Ipv4Addr::LOCALHOST, 0).into())?;
                socket.listen(4096)
            })
            .map_err(TestkitError::Bind)?;
        let addr = listener.local_addr().map_err(TestkitError::Bind)?;
        let listener = listener.tap_io(|stream| {
            // Chunks are small, deliberate writes; do not let Nagle merge or delay them.
            if let Err(error) = stream.set_nodelay(true) {
                tracing::debug!(%error, "agentry-testkit: cannot set TCP_NODELAY");
            }
        });
        let shared = Arc::new(Shared::default());
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::clone(&shared));
        let shutdown = CancellationToken::new();
        let server = axum::serve(listener, app.into_make_service())
            .with_graceful_shutdown(shutdown.clone().cancelled_owned());
        tokio::spawn(async move {
            if let Err(error) = server.await {
                tracing::warn!(%error, "agentry-testkit: mock provider server failed");
            }
        });
        Ok(MockProvider {
            inner: Arc::new(Running {
                addr,
                shared,
                _shutdown: shutdown.drop_guard(),
            }),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    /// Base URL for OpenAI clients (`/v1`; the client appends `/chat/completions`).
    pub fn openai_base_url(&self) -> String {
        format!("{}/v1", self.base_url())
    }

    /// Base URL for Anthropic clients (`/v1`; the client appends `/messages`).
    pub fn anthropic_base_url(&self) -> String {
        format!("{}/v1", self.base_url())
    }

    /// Base URL for Ollama clients (the client appends `/api/chat`).
    pub fn ollama_base_url(&self) -> String {
        self.base_url()
    }

    /// Queues a reply; each incoming request takes the oldest queued reply.
    pub fn enqueue(&self, reply: Reply) {
        self.inner.shared.lock().queue.push_back(reply);
    }

    /// Sets the reply served (cloned) whenever the queue is empty.
    pub fn set_fallback(&self, reply: Reply) {
        self.inner.shared.lock().fallback = Some(reply);
    }

    /// Removes the fallback reply.
    pub fn clear_fallback(&self) {
        self.inner.shared.lock().fallback = None;
    }

    /// Sets the JSON body served (200) to model metadata requests: an OpenAI-compatible
    /// `GET …/models` listing, or an Ollama `POST /api/show` answer.
    pub fn set_model_metadata(&self, body: Value) {
        self.inner.shared.lock().metadata = Some(body);
    }

    /// How many model metadata requests were received so far.
    pub fn metadata_requests(&self) -> usize {
        self.inner.shared.lock().metadata_requests
    }

    /// Drops every queued reply not served yet.
    pub fn clear_queue(&self) {
        self.inner.shared.lock().queue.clear();
    }

    /// How many queued replies have not been served yet.
    pub fn pending_replies(&self) -> usize {
        self.inner.shared.lock().queue.len()
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner.shared.lock().requests.clone()
    }

    /// Removes and returns the requests recorded so far (later requests are numbered from 0
    /// again). Keeps memory flat in long benchmarks.
    pub fn take_requests(&self) -> Vec<RecordedRequest> {
        std::mem::take(&mut self.inner.shared.lock().requests)
    }

    /// How many requests were received so far.
    pub fn request_count(&self) -> usize {
        self.inner.shared.lock().requests.len()
    }

    /// Runs [`check_request`] on every recorded request whose path implies a protocol.
    pub fn check_protocol(&self) -> Result<(), Vec<ProtocolViolation>> {
        let state = self.inner.shared.lock();
        let violations: Vec<ProtocolViolation> = state
            .requests
            .iter()
            .enumerate()
            .filter_map(|(index, request)| request.protocol.map(|p| (index, p, &request.body)))
            .flat_map(|(index, protocol, body)| {
                check_request(protocol, body)
                    .into_iter()
                    .map(move |violation| ProtocolViolation {
                        request_index: index,
                        ..violation
                    })
            })
            .collect();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(violations)
        }
    }
}

impl fmt::Debug for MockProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MockProvider")
            .field("addr", &self.inner.addr)
            .finish_non_exhaustive()
    }
}

/// The catch-all handler: record the request, take a reply, answer.
async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let received_at = Instant::now();
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, usize::MAX).await {
        Ok(bytes) => bytes,
        Err(error) => return reply::mock_error(&format!("cannot read request body: {error}")),
    };
    let path = parts.uri.path().to_owned();
    if is_metadata_request(&parts.method, &path) {
        let metadata = {
            let mut state = shared.lock();
            state.metadata_requests += 1;
            state.metadata.clone()
        };
        return match metadata {
            Some(body) => axum::response::IntoResponse::into_response(axum::Json(body)),
            None => axum::response::IntoResponse::into_response((
                axum::http::StatusCode::NOT_FOUND,
                axum::Json(serde_json::json!({"error": "no model metadata set"})),
            )),
        };
    }
    let protocol = Protocol::from_path(&path);
    let body = parse_body(&bytes);
    let headers = parts
        .headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect();

    // Rendering needs a few body fields; read them before the body moves into the record.
    let mut turn_request = protocol.map(|p| TurnRequest::new(p, &path, &body, 0));
    let reply = {
        let mut state = shared.lock();
        if let Some(turn_request) = turn_request.as_mut() {
            turn_request.sequence = state.requests.len();
        }
        state.requests.push(RecordedRequest {
            method: parts.method.as_str().to_owned(),
            path,
            query: parts.uri.query().map(str::to_owned),
            headers,
            body,
            protocol,
            received_at,
        });
        state.queue.pop_front().or_else(|| state.fallback.clone())
    };
    match reply {
        Some(reply) => reply.respond(turn_request.as_ref()).await,
        None => reply::mock_error("no reply queued"),
    }
}

/// Whether a request asks for model metadata rather than a model turn.
fn is_metadata_request(method: &axum::http::Method, path: &str) -> bool {
    (method == axum::http::Method::GET && path.ends_with("/models"))
        || (method == axum::http::Method::POST && path.ends_with("/api/show"))
}

/// The body as JSON, or as a JSON string holding the raw text when it does not parse.
fn parse_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}
