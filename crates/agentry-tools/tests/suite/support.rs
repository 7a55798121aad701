//! Shared helpers: runtimes pointed at the mock provider.

use std::time::Duration;

use agentry_core::{RunLimits, RunOutput, RunRequest, Runtime, RuntimeBuilder};
use agentry_llm::{HttpModelClient, Protocol, ProviderConfig, RetryPolicy, TransportConfig};
use agentry_testkit::MockProvider;
use agentry_types::RunEvent;
use futures::StreamExt;

pub const PROTOCOLS: [Protocol; 4] = [
    Protocol::OpenAi,
    Protocol::OpenAiResponses,
    Protocol::Anthropic,
    Protocol::Ollama,
];

/// A model client for `protocol` pointed at the mock.
pub fn model(mock: &MockProvider, protocol: Protocol) -> HttpModelClient {
    let base = match protocol {
        Protocol::OpenAi | Protocol::OpenAiResponses => mock.openai_base_url(),
        Protocol::Anthropic => mock.anthropic_base_url(),
        Protocol::Ollama => mock.ollama_base_url(),
        Protocol::A2a => unreachable!("the mock speaks model APIs, not A2A"),
    };
    let transport = TransportConfig {
        retry: RetryPolicy::none(),
        ..TransportConfig::default()
    };
    HttpModelClient::new(
        ProviderConfig::new(protocol, "test-model")
            .with_base_url(base)
            .with_transport(transport),
    )
    .unwrap()
}

/// A runtime builder with the mock's model registered as `mock`.
pub fn builder(mock: &MockProvider, protocol: Protocol) -> RuntimeBuilder {
    let mut builder = Runtime::builder();
    builder.model("mock", model(mock, protocol));
    builder
}

/// Limits for tests: short tool timeout, generous deadline.
pub fn limits() -> RunLimits {
    RunLimits {
        tool_timeout: Duration::from_secs(10),
        deadline: Some(Duration::from_secs(60)),
        ..RunLimits::default()
    }
}

/// Runs a request, collecting every event.
pub async fn run_collect(runtime: &Runtime, request: RunRequest) -> (Vec<RunEvent>, RunOutput) {
    let mut stream = runtime.stream(request).unwrap();
    let mut events = Vec::new();
    while let Some(event) = stream.next().await {
        events.push(event);
    }
    let output = stream.finish().await.unwrap();
    (events, output)
}

/// The texts of every tool result event, in order.
pub fn result_texts(events: &[RunEvent]) -> Vec<(String, bool)> {
    events
        .iter()
        .filter_map(|event| match event {
            RunEvent::ToolResult { result, .. } => Some((result.text_content(), result.is_error)),
            _ => None,
        })
        .collect()
}
