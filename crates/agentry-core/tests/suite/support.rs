//! Shared helpers: runtimes pointed at the mock provider, and small test tools.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_core::tool::{Tool, ToolContext, ToolError, ToolOutput};
use agentry_core::{RunLimits, RunOutput, RunRequest, Runtime, RuntimeBuilder};
use agentry_llm::{HttpModelClient, Protocol, ProviderConfig, RetryPolicy, TransportConfig};
use agentry_testkit::MockProvider;
use agentry_types::{RunEvent, ToolSpec};
use futures::StreamExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};

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

/// One execution of a [`ProbeTool`]: arguments and start/end instants.
#[derive(Debug, Clone)]
pub struct Execution {
    pub arguments: Value,
    pub started: Instant,
    pub ended: Instant,
    pub working_dir: Option<std::path::PathBuf>,
}

/// A tool that records every execution, optionally sleeping, and echoes its arguments.
#[derive(Clone)]
pub struct ProbeTool {
    spec: ToolSpec,
    sleep: Duration,
    timeout: Option<Duration>,
    pub executions: Arc<Mutex<Vec<Execution>>>,
    pub cancelled: Arc<Mutex<usize>>,
}

impl ProbeTool {
    /// `lookup(id: integer)`.
    pub fn lookup() -> Self {
        Self::new(
            "lookup",
            json!({
                "type": "object",
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
                "additionalProperties": false
            }),
        )
    }

    pub fn new(name: &str, parameters: Value) -> Self {
        Self {
            spec: ToolSpec::new(name, format!("The {name} test tool"), parameters),
            sleep: Duration::ZERO,
            timeout: None,
            executions: Arc::default(),
            cancelled: Arc::default(),
        }
    }

    pub fn sleeping(mut self, sleep: Duration) -> Self {
        self.sleep = sleep;
        self
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    pub fn executions(&self) -> Vec<Execution> {
        self.executions.lock().unwrap().clone()
    }
}

impl Tool for ProbeTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    fn call(
        &self,
        arguments: Value,
        context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let sleep = self.sleep;
        let executions = Arc::clone(&self.executions);
        let cancelled = Arc::clone(&self.cancelled);
        Box::pin(async move {
            let started = Instant::now();
            tokio::select! {
                _ = context.cancel.cancelled() => {
                    *cancelled.lock().unwrap() += 1;
                    return Err(ToolError::Cancelled);
                }
                _ = tokio::time::sleep(sleep) => {}
            }
            executions.lock().unwrap().push(Execution {
                arguments: arguments.clone(),
                started,
                ended: Instant::now(),
                working_dir: context.working_dir.clone(),
            });
            Ok(ToolOutput::json(json!({"echo": arguments})))
        })
    }
}
