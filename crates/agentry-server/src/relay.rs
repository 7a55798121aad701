//! Requests about a run that is live on another node of the cluster, passed to that node.
//!
//! A run executes on one node (the one whose process holds its session); its live deltas and
//! its in-memory controls (interrupt, pause, abort, an MCP server's question) are there. A
//! client may be attached to any node: when the run is not live here but on another live node,
//! the stream or the command is forwarded there as it came — the client's own credentials, its
//! `Last-Event-ID` — and the answer (an SSE stream included) comes back byte for byte. A
//! forwarded request carries [`RELAYED`] and is never forwarded again, so two nodes that
//! disagree about a run cannot bounce it between them.

use std::sync::OnceLock;
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, header};
use axum::response::Response;

use crate::error::ApiError;

/// The header a forwarded request carries: the node that forwarded it.
pub const RELAYED: &str = "x-agentry-relayed-by";

/// The request headers that travel with a forwarded request.
const FORWARDED: [&str; 6] = [
    "authorization",
    "cookie",
    "content-type",
    "accept",
    "user-agent",
    "last-event-id",
];

/// The response headers that come back.
const RETURNED: [HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::CACHE_CONTROL,
    header::RETRY_AFTER,
];

fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::Client::builder()
            // A node's answer goes where it was asked, nowhere else.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .build()
            .unwrap_or_default()
    })
}

/// Whether `headers` are a request another node forwarded here.
pub fn was_relayed(headers: &HeaderMap) -> bool {
    headers.contains_key(RELAYED)
}

/// Sends `method path_and_query` with `body` to the node at `address`, with the client's
/// headers, and answers what it answers. `node` names this node in [`RELAYED`].
pub async fn forward(
    address: &str,
    node: &str,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Result<Response, ApiError> {
    let url = format!("http://{address}{path_and_query}");
    let mut request = client().request(method, &url).header(RELAYED, node);
    for name in FORWARDED {
        for value in headers.get_all(name) {
            request = request.header(name, value);
        }
    }
    if !body.is_empty() {
        request = request.body(body);
    }
    let upstream = request.send().await.map_err(|error| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "node_unreachable",
            format!("the node running this run ({address}) did not answer: {error}"),
        )
    })?;
    let mut response = Response::builder().status(upstream.status().as_u16());
    for name in RETURNED {
        for value in upstream.headers().get_all(&name) {
            response = response.header(&name, value);
        }
    }
    response
        .body(Body::from_stream(upstream.bytes_stream()))
        .map_err(|error| ApiError::internal(format!("cannot relay the answer: {error}")))
}
