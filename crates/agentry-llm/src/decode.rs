//! Turns a response body's bytes into model events, whatever the protocol.
//!
//! Bytes may arrive cut anywhere (inside an SSE line, inside a UTF-8 character); the framing
//! layer (eventsource-stream for SSE, a line splitter for NDJSON) reassembles events, the
//! protocol's decoder normalises them, and the accumulator yields live deltas and, at the end,
//! complete tool calls and the final response.

use bytes::{Bytes, BytesMut};
use eventsource_stream::{EventStreamError, Eventsource};
use futures::{Stream, StreamExt};

use agentry_types::ModelEvent;

use crate::accumulator::Accumulator;
use crate::delta::Delta;
use crate::error::{LlmError, truncate};
use crate::provider::{Framing, Protocol, StreamDecoder};

/// Decodes a streamed response body of `protocol` into model events. The last item is either
/// [`ModelEvent::Completed`] or an error; a body that stops before the provider's end marker
/// yields [`LlmError::StreamEndedEarly`].
pub fn decode_stream<S>(
    protocol: Protocol,
    body: S,
) -> impl Stream<Item = Result<ModelEvent, LlmError>> + Send + 'static
where
    S: Stream<Item = Result<Bytes, LlmError>> + Send + 'static,
{
    async_stream::stream! {
        let mut decoder = StreamDecoder::new(protocol);
        let mut accumulator = Accumulator::new();
        let mut deltas: Vec<Delta> = Vec::new();
        let mut events: Vec<ModelEvent> = Vec::new();
        let mut frames = frames(protocol, body);
        while let Some(frame) = frames.next().await {
            let result = frame.and_then(|(event, data)| decoder.decode(&event, &data, &mut deltas));
            if let Err(error) = result {
                yield Err(error);
                return;
            }
            for delta in deltas.drain(..) {
                accumulator.push(delta, &mut events);
            }
            for event in events.drain(..) {
                yield Ok(event);
            }
            if accumulator.is_done() {
                break;
            }
        }
        match accumulator.finish(&mut events) {
            Ok(_) => {
                for event in events.drain(..) {
                    yield Ok(event);
                }
            }
            Err(error) => yield Err(error),
        }
    }
}

/// A stream of (event name, data) frames.
type Frames = std::pin::Pin<Box<dyn Stream<Item = Result<(String, String), LlmError>> + Send>>;

/// Cuts the body into (event name, data) frames.
fn frames<S>(protocol: Protocol, body: S) -> Frames
where
    S: Stream<Item = Result<Bytes, LlmError>> + Send + 'static,
{
    match protocol.framing() {
        Framing::Sse => Box::pin(body.eventsource().map(|event| match event {
            Ok(event) => Ok((event.event, event.data)),
            Err(EventStreamError::Transport(error)) => Err(error),
            Err(EventStreamError::Utf8(error)) => Err(LlmError::MalformedResponse {
                detail: format!("the event stream is not UTF-8: {error}"),
                raw: String::new(),
            }),
            Err(EventStreamError::Parser(error)) => Err(LlmError::MalformedResponse {
                detail: format!("the event stream is not valid SSE: {error}"),
                raw: String::new(),
            }),
        })),
        Framing::Ndjson => Box::pin(ndjson_lines(body)),
    }
}

/// Splits a byte stream into lines (the event name is empty).
fn ndjson_lines<S>(body: S) -> impl Stream<Item = Result<(String, String), LlmError>> + Send
where
    S: Stream<Item = Result<Bytes, LlmError>> + Send + 'static,
{
    async_stream::stream! {
        let mut buffer = BytesMut::new();
        futures::pin_mut!(body);
        loop {
            let chunk = body.next().await;
            let at_end = chunk.is_none();
            match chunk {
                Some(Ok(bytes)) => buffer.extend_from_slice(&bytes),
                Some(Err(error)) => {
                    yield Err(error);
                    return;
                }
                None => {}
            }
            while let Some(newline) = buffer.iter().position(|&b| b == b'\n') {
                let line = buffer.split_to(newline + 1);
                yield line_text(&line);
            }
            if at_end {
                if !buffer.iter().all(u8::is_ascii_whitespace) {
                    yield line_text(&buffer);
                }
                return;
            }
        }
    }
}

fn line_text(line: &[u8]) -> Result<(String, String), LlmError> {
    match std::str::from_utf8(line) {
        Ok(text) => Ok((String::new(), text.trim().to_owned())),
        Err(error) => Err(LlmError::MalformedResponse {
            detail: format!("NDJSON line is not UTF-8: {error}"),
            raw: truncate(&String::from_utf8_lossy(line), 256),
        }),
    }
}

/// Decodes a whole (non-streamed) response body into the final response.
pub(crate) fn decode_whole(
    protocol: Protocol,
    body: &[u8],
) -> Result<agentry_types::ModelResponse, LlmError> {
    let mut accumulator = Accumulator::new();
    let mut events = Vec::new();
    for delta in protocol.decode_body(body)? {
        accumulator.push(delta, &mut events);
    }
    accumulator.finish(&mut events)
}
