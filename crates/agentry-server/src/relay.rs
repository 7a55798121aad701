//! Requests about a run that is live on another node of the cluster, passed to that node.
//!
//! A run executes on one node (the one whose process holds its session); its live deltas and
//! its in-memory controls (interrupt, pause, abort, an MCP server's question) are there. A
//! client may be attached to any node: when the run is not live here but on another live node,
//! the stream or the command is forwarded there — its body, its `Last-Event-ID` — and the
//! answer (an SSE stream included) comes back byte for byte. A forwarded request carries
//! [`RELAYED`] and is never forwarded again, so two nodes that disagree about a run cannot
//! bounce it between them.
//!
//! The client's credentials never travel: a key or a console cookie stays on the node it was
//! given to. The forwarded request carries instead an [`ASSERTION`]: "this node vouches for key
//! K, for this method on this path, until T", signed with a key every node derives from the
//! shared secret key file (`secret.key`, which the nodes of a cluster share for the secrets
//! anyway). The receiving node checks it and that K is still active. So whoever can read the
//! traffic between nodes (on plain `http://` addresses; `--advertise-addr https://…` puts it
//! in TLS) sees at most a one-minute assertion for one request, never a key; whoever can write
//! the nodes table still chooses where nodes send requests — write access to the database is
//! control of the cluster.

use std::sync::OnceLock;
use std::time::Duration;

use agentry_app::auth::Principal;
use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, header};
use axum::response::Response;
use base64::Engine as _;
use hmac::Mac as _;

use crate::error::ApiError;
use crate::state::AppState;

/// The header a forwarded request carries: the node that forwarded it.
pub const RELAYED: &str = "x-agentry-relayed-by";

/// The header a forwarded request proves its caller with: `v1;<key id>;<expiry, Unix
/// ms>;<signature>` (see the module's docs).
pub const ASSERTION: &str = "x-agentry-relay-assertion";

/// How long an assertion is good for after it is made (it is checked once, when the request
/// arrives; a stream it opened runs on).
const ASSERTION_TTL: Duration = Duration::from_secs(60);

/// What the assertions' key is derived for.
const ASSERTION_PURPOSE: &str = "cluster-relay-assertion";

/// The request headers that travel with a forwarded request (never `authorization` or
/// `cookie`: see [`ASSERTION`]).
const FORWARDED: [&str; 4] = ["content-type", "accept", "user-agent", "last-event-id"];

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The signature of an assertion for `key_id` on `method path_and_query` until `expires`.
fn signature(
    state: &AppState,
    key_id: &str,
    expires: u64,
    method: &Method,
    path_and_query: &str,
) -> Result<HmacSha256, ApiError> {
    let key = state
        .auth
        .derived_key(ASSERTION_PURPOSE)
        .map_err(|error| ApiError::internal(error.to_string()))?;
    let mut mac =
        HmacSha256::new_from_slice(&key).map_err(|error| ApiError::internal(error.to_string()))?;
    mac.update(format!("v1\n{key_id}\n{expires}\n{method}\n{path_and_query}").as_bytes());
    Ok(mac)
}

/// The assertion for `caller` making `method path_and_query`; `None` for the operator of a
/// server without keys (the other node has none either, and needs none).
fn assertion(
    state: &AppState,
    caller: &Principal,
    method: &Method,
    path_and_query: &str,
) -> Result<Option<String>, ApiError> {
    let Some(key_id) = &caller.key_id else {
        return Ok(None);
    };
    let expires = agentry_app::clock::now_ms().saturating_add(millis(ASSERTION_TTL));
    let signed = signature(state, key_id, expires, method, path_and_query)?;
    let encoded =
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(signed.finalize().into_bytes());
    Ok(Some(format!("v1;{key_id};{expires};{encoded}")))
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// The caller another node vouches for with `assertion` on `method path_and_query`: `None`
/// when the assertion is malformed, for another request, expired, forged, or its key is no
/// longer active.
pub async fn verify(
    state: &AppState,
    assertion: &str,
    method: &Method,
    path_and_query: &str,
) -> Result<Option<Principal>, ApiError> {
    let mut parts = assertion.split(';');
    let (Some("v1"), Some(key_id), Some(expires), Some(encoded), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return Ok(None);
    };
    let Ok(expires) = expires.parse::<u64>() else {
        return Ok(None);
    };
    let now = agentry_app::clock::now_ms();
    if expires < now || expires > now.saturating_add(millis(ASSERTION_TTL) * 2) {
        return Ok(None);
    }
    let Ok(tag) = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(encoded) else {
        return Ok(None);
    };
    // Compared in constant time.
    if signature(state, key_id, expires, method, path_and_query)?
        .verify_slice(&tag)
        .is_err()
    {
        return Ok(None);
    }
    state
        .auth
        .active_key(key_id)
        .await
        .map_err(|error| ApiError::internal(error.to_string()))
}

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

/// Where a node at `address` answers `path_and_query`: the address as advertised, with its
/// scheme (`https://node-2:8443`), or `http://` before a bare `host:port`.
fn node_url(address: &str, path_and_query: &str) -> String {
    if address.starts_with("https://") || address.starts_with("http://") {
        format!("{}{path_and_query}", address.trim_end_matches('/'))
    } else {
        format!("http://{address}{path_and_query}")
    }
}

/// Sends `method path_and_query` for `caller` with `body` to the node at `address`, with the
/// client's content headers and an [`ASSERTION`] for `caller` in place of its credentials, and
/// answers what it answers. [`RELAYED`] names this node.
pub async fn forward(
    state: &AppState,
    caller: &Principal,
    address: &str,
    method: Method,
    path_and_query: &str,
    headers: &HeaderMap,
    body: Vec<u8>,
) -> Result<Response, ApiError> {
    let url = node_url(address, path_and_query);
    let node = state.app.queue_settings().node_id;
    let mut request = client()
        .request(method.clone(), &url)
        .header(RELAYED, node.as_str());
    if let Some(assertion) = assertion(state, caller, &method, path_and_query)? {
        request = request.header(ASSERTION, assertion);
    }
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
