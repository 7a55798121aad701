//! Minimal SSE and NDJSON parsers, so tests can reassemble what the mock streamed.

use serde_json::Value;

/// One server-sent event.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct SseEvent {
    pub(super) event: Option<String>,
    pub(super) data: String,
}

impl SseEvent {
    /// The data parsed as JSON.
    pub(super) fn json(&self) -> Value {
        serde_json::from_str(&self.data)
            .unwrap_or_else(|e| panic!("bad SSE data {:?}: {e}", self.data))
    }
}

/// Parses an SSE body: messages separated by blank lines, `event:` and `data:` fields.
pub(super) fn parse_sse(body: &str) -> Vec<SseEvent> {
    let mut events = Vec::new();
    for message in body.split("\n\n") {
        let mut event = None;
        let mut data: Vec<&str> = Vec::new();
        for line in message.lines() {
            if let Some(value) = line.strip_prefix("event:") {
                event = Some(value.trim().to_owned());
            } else if let Some(value) = line.strip_prefix("data:") {
                data.push(value.strip_prefix(' ').unwrap_or(value));
            }
        }
        if event.is_some() || !data.is_empty() {
            events.push(SseEvent {
                event,
                data: data.join("\n"),
            });
        }
    }
    events
}

/// Parses an NDJSON body into one JSON value per non-empty line.
pub(super) fn parse_ndjson(body: &str) -> Vec<Value> {
    body.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("bad NDJSON line {line:?}: {e}"))
        })
        .collect()
}

#[test]
fn sse_parser_handles_event_and_data_lines() {
    let events = parse_sse("event: ping\ndata: {\"type\": \"ping\"}\n\ndata: [DONE]\n\n");
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].event.as_deref(), Some("ping"));
    assert_eq!(events[0].json()["type"], "ping");
    assert_eq!(events[1].data, "[DONE]");
}
