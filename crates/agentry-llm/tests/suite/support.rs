//! Shared helpers: clients pointed at the mock, fixture replay.

use std::time::Duration;

use agentry_llm::{
    CancellationToken, HttpModelClient, LlmError, ModelClient, ModelRequest, Protocol,
    ProviderConfig, RetryPolicy, TransportConfig,
};
use agentry_testkit::{Fixture, MockProvider, Reply};
use agentry_types::{Message, ModelEvent, ModelResponse};
use futures::StreamExt;

/// The protocol a fixture was recorded in.
pub fn protocol_of(fixture: &Fixture) -> Protocol {
    match fixture.provider.as_str() {
        "anthropic" => Protocol::Anthropic,
        "ollama" => Protocol::Ollama,
        _ => Protocol::OpenAi,
    }
}

pub fn base_url(mock: &MockProvider, protocol: Protocol) -> String {
    match protocol {
        Protocol::OpenAi | Protocol::OpenAiResponses => mock.openai_base_url(),
        Protocol::Anthropic => mock.anthropic_base_url(),
        Protocol::Ollama => mock.ollama_base_url(),
        Protocol::A2a => {
            panic!("the mock speaks model APIs, not A2A (the HTTP crate's suite/a2a.rs)")
        }
    }
}

/// Transport settings for tests: short backoffs so retries are quick.
pub fn fast_transport() -> TransportConfig {
    TransportConfig {
        connect_timeout: Duration::from_secs(5),
        first_byte_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(10),
        total_timeout: Some(Duration::from_secs(60)),
        retry: RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(50),
            max_retry_after: Duration::from_secs(5),
        },
    }
}

pub fn client_with(
    mock: &MockProvider,
    protocol: Protocol,
    transport: TransportConfig,
) -> HttpModelClient {
    let config = ProviderConfig::new(protocol, "test-model")
        .with_base_url(base_url(mock, protocol))
        .with_api_key("sk-test")
        .with_transport(transport);
    HttpModelClient::new(config).expect("valid config")
}

pub fn client(mock: &MockProvider, protocol: Protocol) -> HttpModelClient {
    client_with(mock, protocol, fast_transport())
}

pub fn hello() -> ModelRequest {
    ModelRequest::new(vec![Message::user("hello")])
}

/// Every event of a streamed call, and how it ended.
pub struct Outcome {
    pub events: Vec<ModelEvent>,
    pub result: Result<ModelResponse, LlmError>,
}

impl Outcome {
    pub fn response(&self) -> &ModelResponse {
        match &self.result {
            Ok(response) => response,
            Err(error) => panic!("expected a response, got {error:?}"),
        }
    }

    pub fn error(&self) -> &LlmError {
        match &self.result {
            Ok(response) => panic!("expected an error, got {response:?}"),
            Err(error) => error,
        }
    }

    pub fn streamed_text(&self) -> String {
        self.events
            .iter()
            .filter_map(|event| match event {
                ModelEvent::TextDelta { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    pub fn streamed_thinking(&self) -> String {
        self.events
            .iter()
            .filter_map(|event| match event {
                ModelEvent::ThinkingDelta { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

pub async fn stream_outcome(client: &HttpModelClient, request: ModelRequest) -> Outcome {
    let mut stream = client.stream(request, CancellationToken::new());
    let mut events = Vec::new();
    while let Some(item) = stream.next().await {
        match item {
            Ok(ModelEvent::Completed { response }) => {
                events.push(ModelEvent::Completed {
                    response: response.clone(),
                });
                return Outcome {
                    events,
                    result: Ok(response),
                };
            }
            Ok(event) => events.push(event),
            Err(error) => {
                return Outcome {
                    events,
                    result: Err(error),
                };
            }
        }
    }
    panic!("the stream ended without a completed response or an error");
}

/// Replays a fixture through the client of its protocol: streamed fixtures through `stream`,
/// whole bodies through `complete`. Retries are off so an error fixture is seen as it is.
pub async fn replay(name: &str) -> (Outcome, MockProvider) {
    let fixture = Fixture::named(name).expect("fixture exists");
    let protocol = protocol_of(&fixture);
    let streaming = fixture.is_streaming();
    let mock = MockProvider::start().await.expect("mock starts");
    mock.enqueue(Reply::fixture(fixture));
    let transport = TransportConfig {
        retry: RetryPolicy::none(),
        ..fast_transport()
    };
    let client = client_with(&mock, protocol, transport);
    let outcome = if streaming {
        stream_outcome(&client, hello()).await
    } else {
        Outcome {
            events: Vec::new(),
            result: client.complete(hello(), CancellationToken::new()).await,
        }
    };
    assert_eq!(mock.request_count(), 1, "exactly one request for {name}");
    (outcome, mock)
}
