//! What the mock answers: [`Reply`] (content plus delivery options) and [`Chunking`] (how the
//! body is cut into writes), and turning a reply into an HTTP response.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, StatusCode};

use crate::fixture::Fixture;
use crate::render::{TurnRequest, render};
use crate::script::ScriptedTurn;

/// Headers that describe one hop's framing rather than the message; never replayed because the
/// mock frames bodies itself (and may re-chunk them).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// How long a cut reply waits after its last chunk before aborting, so the server flushes the
/// bytes that were sent before the connection drops.
const CUT_FLUSH_GRACE: Duration = Duration::from_millis(5);

/// How a reply body is cut into separate writes.
///
/// Offsets are byte offsets: cuts may split UTF-8 characters, SSE lines and JSON tokens.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Chunking {
    /// One write with the whole body.
    #[default]
    Whole,
    /// Writes of `n` bytes (the last may be shorter); `Every(0)` behaves as `Every(1)`.
    Every(usize),
    /// Cuts at these byte offsets (unsorted, duplicate and out-of-range offsets are ignored).
    At(Vec<usize>),
    /// One write per server-sent event: cuts after every blank line (`\n\n`), so with
    /// [`Reply::paced`] each event of a streamed reply arrives `pace` after the previous one.
    SseEvents,
    /// Writes of seeded pseudo-random sizes between 1 and `max` bytes (`max` 0 behaves as 1).
    Random {
        /// Seed for the size sequence; the same seed gives the same cuts.
        seed: u64,
        /// Largest write size.
        max: usize,
    },
}

impl Chunking {
    /// The byte offsets, strictly inside `0..len` and increasing, where a body of `len` bytes
    /// is cut.
    ///
    /// [`Chunking::SseEvents`] cuts where the body's events end, which its length alone does not
    /// tell: it has no offsets here.
    pub fn cut_offsets(&self, len: usize) -> Vec<usize> {
        match self {
            Chunking::Whole | Chunking::SseEvents => Vec::new(),
            Chunking::Every(n) => (1..len.div_ceil((*n).max(1)))
                .map(|k| k * (*n).max(1))
                .collect(),
            Chunking::At(offsets) => {
                let mut cuts: Vec<usize> = offsets
                    .iter()
                    .copied()
                    .filter(|&o| o > 0 && o < len)
                    .collect();
                cuts.sort_unstable();
                cuts.dedup();
                cuts
            }
            Chunking::Random { seed, max } => {
                let mut rng = fastrand::Rng::with_seed(*seed);
                let mut cuts = Vec::new();
                let mut at = 0;
                loop {
                    at += rng.usize(1..=(*max).max(1));
                    if at >= len {
                        break cuts;
                    }
                    cuts.push(at);
                }
            }
        }
    }

    /// Cuts `body` into the chunks that are written one by one.
    fn split(&self, body: &Bytes) -> Vec<Bytes> {
        let mut chunks = Vec::new();
        let mut start = 0;
        let cuts = match self {
            Chunking::SseEvents => body
                .windows(2)
                .enumerate()
                .filter(|(at, pair)| pair == b"\n\n" && at + 2 < body.len())
                .map(|(at, _)| at + 2)
                .collect(),
            _ => self.cut_offsets(body.len()),
        };
        for cut in cuts {
            chunks.push(body.slice(start..cut));
            start = cut;
        }
        if start < body.len() {
            chunks.push(body.slice(start..));
        }
        chunks
    }
}

/// A response to serve, built fluently:
/// `Reply::fixture(f).chunked(Chunking::Every(7)).paced(Duration::from_millis(5))`.
///
/// Cloning is cheap (the content is shared), so a reply can serve as a fallback for every
/// request of a benchmark.
#[derive(Debug, Clone)]
pub struct Reply {
    content: ReplyContent,
    extra_headers: Vec<(String, String)>,
    chunking: Chunking,
    pace: Option<Duration>,
    header_delay: Option<Duration>,
    cut_after: Option<usize>,
}

#[derive(Debug, Clone)]
enum ReplyContent {
    /// A fixed status, headers and body (fixtures, errors, raw replies).
    Fixed(Arc<FixedResponse>),
    /// A turn rendered for each request's protocol.
    Scripted(Arc<ScriptedTurn>),
}

#[derive(Debug)]
struct FixedResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Bytes,
}

impl Reply {
    fn new(content: ReplyContent) -> Self {
        Reply {
            content,
            extra_headers: Vec::new(),
            chunking: Chunking::Whole,
            pace: None,
            header_delay: None,
            cut_after: None,
        }
    }

    /// Replays a recorded exchange exactly: status, headers (except hop-by-hop framing headers
    /// such as `content-length`), body bytes.
    pub fn fixture(fixture: Fixture) -> Self {
        Reply::raw(fixture.status, fixture.headers, fixture.body)
    }

    /// A scripted turn, rendered in the protocol the request's path implies, streamed or not
    /// as the request asks.
    pub fn scripted(turn: ScriptedTurn) -> Self {
        Reply::new(ReplyContent::Scripted(Arc::new(turn)))
    }

    /// An error with a JSON body (`content-type: application/json`).
    pub fn error(status: u16, body: serde_json::Value) -> Self {
        Reply::raw(
            status,
            vec![("content-type".to_owned(), "application/json".to_owned())],
            body.to_string(),
        )
    }

    /// Any status, headers and body. Hop-by-hop framing headers (`content-length`,
    /// `transfer-encoding`, `connection`, ...) are dropped; the server frames the body itself.
    pub fn raw(status: u16, headers: Vec<(String, String)>, body: impl Into<String>) -> Self {
        Reply::new(ReplyContent::Fixed(Arc::new(FixedResponse {
            status,
            headers,
            body: Bytes::from(body.into()),
        })))
    }

    /// Adds a header, replacing any header of the same name (e.g. `retry-after`).
    pub fn with_header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_headers.push((name.into(), value.into()));
        self
    }

    /// Sets how the body is cut into writes.
    pub fn chunked(mut self, chunking: Chunking) -> Self {
        self.chunking = chunking;
        self
    }

    /// Sends the body's chunks `pace` apart: the `k`-th at `k × pace` after the first, as a
    /// model server generates at its own rate whatever its client does; a chunk that falls
    /// behind that schedule (a busy machine woke the mock late) goes at once, so lateness does
    /// not add up from chunk to chunk.
    pub fn paced(mut self, pace: Duration) -> Self {
        self.pace = Some(pace);
        self
    }

    /// Waits `delay` before sending the status line and headers.
    pub fn delay_headers(mut self, delay: Duration) -> Self {
        self.header_delay = Some(delay);
        self
    }

    /// Sends only the first `bytes` body bytes, then aborts the connection without ending the
    /// body cleanly, so the client sees an incomplete message rather than EOF. When `bytes` is
    /// at least the body length, the whole body is sent and the ending is still withheld.
    pub fn cut_after(mut self, bytes: usize) -> Self {
        self.cut_after = Some(bytes);
        self
    }

    /// Builds the response to a request (`turn_request` is `None` when the path implies no
    /// protocol), waiting out the header delay first.
    pub(crate) async fn respond(&self, turn_request: Option<&TurnRequest>) -> Response {
        let (status, headers, body) = match self.head_and_body(turn_request) {
            Ok(parts) => parts,
            Err(message) => return mock_error(&message),
        };
        if let Some(delay) = self.header_delay {
            tokio::time::sleep(delay).await;
        }
        let mut response = Response::new(self.body(body));
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        response
    }

    fn head_and_body(
        &self,
        turn_request: Option<&TurnRequest>,
    ) -> Result<(StatusCode, HeaderMap, Bytes), String> {
        let mut headers = HeaderMap::new();
        let (status, body) = match &self.content {
            ReplyContent::Fixed(fixed) => {
                for (name, value) in &fixed.headers {
                    if !is_hop_by_hop(name) {
                        let (name, value) = header(name, value)?;
                        headers.append(name, value);
                    }
                }
                let status = StatusCode::from_u16(fixed.status)
                    .map_err(|_| format!("invalid status {}", fixed.status))?;
                (status, fixed.body.clone())
            }
            ReplyContent::Scripted(turn) => {
                let request = turn_request.ok_or_else(|| {
                    "a scripted turn needs a protocol path (.../chat/completions, .../messages, \
                     /api/chat or /api/generate)"
                        .to_owned()
                })?;
                let rendered = render(turn, request);
                headers.insert(
                    CONTENT_TYPE,
                    HeaderValue::from_static(rendered.content_type),
                );
                (StatusCode::OK, Bytes::from(rendered.body))
            }
        };
        for (name, value) in &self.extra_headers {
            let (name, value) = header(name, value)?;
            headers.insert(name, value);
        }
        Ok((status, headers, body))
    }

    /// The response body: one frame when possible, otherwise a stream of chunks.
    fn body(&self, body: Bytes) -> Body {
        let body = match self.cut_after {
            Some(limit) if limit < body.len() => body.slice(..limit),
            _ => body,
        };
        let chunks = self.chunking.split(&body);
        if self.cut_after.is_none() && chunks.len() <= 1 {
            return Body::from(body);
        }
        Body::from_stream(chunk_stream(chunks, self.pace, self.cut_after.is_some()))
    }
}

/// Yields `chunks` one by one, `pace` apart (on a schedule from the first, see
/// [`Reply::paced`]), then either ends or (when `cut`) fails, which makes the server abort the
/// connection mid-body.
fn chunk_stream(
    chunks: Vec<Bytes>,
    pace: Option<Duration>,
    cut: bool,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    struct Progress {
        chunks: std::vec::IntoIter<Bytes>,
        pace: Option<Duration>,
        /// When the next chunk is due (none before the first).
        due: Option<tokio::time::Instant>,
        cut: bool,
    }
    let progress = Progress {
        chunks: chunks.into_iter(),
        pace,
        due: None,
        cut,
    };
    futures::stream::unfold(progress, |mut progress| async move {
        if let Some(chunk) = progress.chunks.next() {
            if let Some(due) = progress.due {
                tokio::time::sleep_until(due).await;
            }
            if let Some(pace) = progress.pace {
                let sent = progress.due.unwrap_or_else(tokio::time::Instant::now);
                progress.due = Some(sent + pace);
            }
            return Some((Ok(chunk), progress));
        }
        if progress.cut {
            progress.cut = false;
            let grace = progress.pace.unwrap_or_default().max(CUT_FLUSH_GRACE);
            tokio::time::sleep(grace).await;
            let error = std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "agentry-testkit: reply cut short",
            );
            return Some((Err(error), progress));
        }
        None
    })
}

fn is_hop_by_hop(name: &str) -> bool {
    HOP_BY_HOP.iter().any(|h| h.eq_ignore_ascii_case(name))
}

fn header(name: &str, value: &str) -> Result<(HeaderName, HeaderValue), String> {
    let header_name =
        HeaderName::try_from(name).map_err(|_| format!("invalid header name {name:?}"))?;
    let header_value =
        HeaderValue::try_from(value).map_err(|_| format!("invalid value for header {name:?}"))?;
    Ok((header_name, header_value))
}

/// A 500 response in the OpenAI error shape, explaining a problem with the mock's own setup.
pub(crate) fn mock_error(message: &str) -> Response {
    let body = serde_json::json!({
        "error": { "message": format!("agentry-testkit: {message}"), "type": "mock_error" }
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cuts_at_multiples() {
        assert_eq!(Chunking::Every(3).cut_offsets(10), [3, 6, 9]);
        assert_eq!(Chunking::Every(5).cut_offsets(10), [5]);
        assert_eq!(Chunking::Every(0).cut_offsets(3), [1, 2]);
        assert!(Chunking::Whole.cut_offsets(10).is_empty());
    }

    #[test]
    fn at_ignores_out_of_range_and_duplicates() {
        assert_eq!(
            Chunking::At(vec![7, 0, 3, 3, 12, 10]).cut_offsets(10),
            [3, 7]
        );
    }

    #[test]
    fn random_is_seeded_and_bounded() {
        let chunking = Chunking::Random { seed: 9, max: 4 };
        let cuts = chunking.cut_offsets(100);
        assert_eq!(cuts, chunking.cut_offsets(100));
        let mut previous = 0;
        for cut in cuts {
            assert!((1..=4).contains(&(cut - previous)));
            previous = cut;
        }
        assert!(100 - previous <= 4);
    }

    #[test]
    fn split_reassembles() {
        let body = Bytes::from_static("héllo wörld".as_bytes());
        let chunks = Chunking::Every(2).split(&body);
        assert_eq!(chunks.len(), body.len().div_ceil(2));
        assert_eq!(chunks.concat(), body.to_vec());
    }

    #[test]
    fn sse_events_are_one_write_each() {
        let body = Bytes::from_static(b"data: a\n\ndata: b\n\ndata: [DONE]\n\n");
        let chunks = Chunking::SseEvents.split(&body);
        assert_eq!(
            chunks,
            vec![
                Bytes::from_static(b"data: a\n\n"),
                Bytes::from_static(b"data: b\n\n"),
                Bytes::from_static(b"data: [DONE]\n\n"),
            ]
        );
    }
}
