//! Prometheus metrics, served as text at `GET /metrics`.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use agentry_types::{RunEvent, SessionEvent};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StopLabel {
    stop_reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabel {
    method: String,
    status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MethodLabel {
    method: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    runs_started: Counter,
    runs_finished: Family<StopLabel, Counter>,
    rounds: Counter,
    tool_calls: Family<OutcomeLabel, Counter>,
    http_requests: Family<HttpLabel, Counter>,
    http_latency: Family<MethodLabel, Histogram, fn() -> Histogram>,
    active_streams: Gauge<i64, std::sync::atomic::AtomicI64>,
    live_runs: Gauge<i64, std::sync::atomic::AtomicI64>,
    tokens: Family<OutcomeLabel, Counter<u64, AtomicU64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("agentry");
        let metrics = Self {
            registry: Registry::default(),
            runs_started: Counter::default(),
            runs_finished: Family::default(),
            rounds: Counter::default(),
            tool_calls: Family::default(),
            http_requests: Family::default(),
            http_latency: Family::new_with_constructor(latency_histogram),
            active_streams: Gauge::default(),
            live_runs: Gauge::default(),
            tokens: Family::default(),
        };
        registry.register("runs_started", "Runs started", metrics.runs_started.clone());
        registry.register(
            "runs_finished",
            "Runs ended, by stop reason",
            metrics.runs_finished.clone(),
        );
        registry.register("rounds", "Model calls completed", metrics.rounds.clone());
        registry.register(
            "tool_calls",
            "Tool calls completed, by outcome",
            metrics.tool_calls.clone(),
        );
        registry.register(
            "tokens",
            "Tokens used, by direction",
            metrics.tokens.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests, by method and status",
            metrics.http_requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency until the response head",
            metrics.http_latency.clone(),
        );
        registry.register(
            "active_streams",
            "Open SSE streams",
            metrics.active_streams.clone(),
        );
        registry.register("live_runs", "Runs in progress", metrics.live_runs.clone());
        Self {
            registry,
            ..metrics
        }
    }
}

impl Metrics {
    /// Counts what a run event says happened.
    pub fn observe(&self, event: &RunEvent) {
        match event {
            RunEvent::Committed {
                event: SessionEvent::RunStarted { .. },
                ..
            }
            | RunEvent::RunStarted { .. } => {}
            RunEvent::Usage { usage, .. } => {
                self.rounds.inc();
                self.tokens
                    .get_or_create(&OutcomeLabel {
                        outcome: "input".into(),
                    })
                    .inc_by(usage.input_tokens);
                self.tokens
                    .get_or_create(&OutcomeLabel {
                        outcome: "output".into(),
                    })
                    .inc_by(usage.output_tokens);
            }
            RunEvent::ToolResult { result, .. } => {
                let outcome = if result.is_error { "error" } else { "ok" };
                self.tool_calls
                    .get_or_create(&OutcomeLabel {
                        outcome: outcome.into(),
                    })
                    .inc();
            }
            RunEvent::RunFinished { stop_reason, .. } | RunEvent::RunFailed { stop_reason, .. } => {
                self.runs_finished
                    .get_or_create(&StopLabel {
                        stop_reason: stop_reason.as_str().into(),
                    })
                    .inc();
            }
            _ => {}
        }
    }

    /// A run was started.
    pub fn run_started(&self) {
        self.runs_started.inc();
        self.live_runs.inc();
    }

    /// A run ended.
    pub fn run_ended(&self) {
        self.live_runs.dec();
    }

    /// An HTTP request was answered.
    pub fn http(&self, method: &str, status: u16, elapsed: Duration) {
        self.http_requests
            .get_or_create(&HttpLabel {
                method: method.into(),
                status: status.to_string(),
            })
            .inc();
        self.http_latency
            .get_or_create(&MethodLabel {
                method: method.into(),
            })
            .observe(elapsed.as_secs_f64());
    }

    /// An SSE stream opened; the returned guard closes it when dropped.
    pub fn stream_opened(self: &std::sync::Arc<Self>) -> StreamGuard {
        self.active_streams.inc();
        StreamGuard(std::sync::Arc::clone(self))
    }

    /// The metrics in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if prometheus_client::encoding::text::encode(&mut text, &self.registry).is_err() {
            return String::from("# metrics could not be encoded\n");
        }
        text
    }
}

/// The hub reports its runs here: started, each event, ended.
impl agentry_app::hub::RunObserver for Metrics {
    fn run_started(&self) {
        Metrics::run_started(self);
    }

    fn observe(&self, event: &RunEvent) {
        Metrics::observe(self, event);
    }

    fn run_ended(&self) {
        Metrics::run_ended(self);
    }
}

/// Counts an open SSE stream until dropped.
pub struct StreamGuard(std::sync::Arc<Metrics>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.active_streams.dec();
    }
}
