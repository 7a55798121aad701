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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelTokenLabel {
    model: String,
    direction: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabel {
    code: String,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 18))
}

/// Model latencies: 1 ms to about 9 minutes.
fn model_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 20))
}

/// Output tokens per second: 1 to about 16,000.
fn throughput_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1.0, 2.0, 15))
}

/// Seconds a queued run waited for a worker: 1 ms to about 36 hours.
fn queue_wait_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 28))
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
    model_tokens: Family<ModelTokenLabel, Counter<u64, AtomicU64>>,
    model_first_output: Family<ModelLabel, Histogram, fn() -> Histogram>,
    model_duration: Family<ModelLabel, Histogram, fn() -> Histogram>,
    model_throughput: Family<ModelLabel, Histogram, fn() -> Histogram>,
    model_cost: Family<ModelLabel, Counter<f64, AtomicU64>>,
    runs_failed: Family<CodeLabel, Counter>,
    queue_depth: Gauge<i64, std::sync::atomic::AtomicI64>,
    queue_running: Gauge<i64, std::sync::atomic::AtomicI64>,
    queue_wait: Histogram,
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
            model_tokens: Family::default(),
            model_first_output: Family::new_with_constructor(model_latency_histogram),
            model_duration: Family::new_with_constructor(model_latency_histogram),
            model_throughput: Family::new_with_constructor(throughput_histogram),
            model_cost: Family::default(),
            runs_failed: Family::default(),
            queue_depth: Gauge::default(),
            queue_running: Gauge::default(),
            queue_wait: queue_wait_histogram(),
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
        registry.register(
            "model_tokens",
            "Tokens used, by model and direction (input, cached_input, output)",
            metrics.model_tokens.clone(),
        );
        registry.register(
            "model_time_to_first_output_seconds",
            "Time from a model call's start to its first streamed output, by model",
            metrics.model_first_output.clone(),
        );
        registry.register(
            "model_call_duration_seconds",
            "Time from a model call's start to its complete answer, by model",
            metrics.model_duration.clone(),
        );
        registry.register(
            "model_output_tokens_per_second",
            "Output tokens per second of generation (after the first output), by model",
            metrics.model_throughput.clone(),
        );
        registry.register(
            "model_cost_dollars",
            "US dollars spent on model calls with a known price, by model",
            metrics.model_cost.clone(),
        );
        registry.register(
            "runs_failed",
            "Runs that failed, by error code",
            metrics.runs_failed.clone(),
        );
        registry.register(
            "queue_depth",
            "Background runs waiting in the queue (all nodes)",
            metrics.queue_depth.clone(),
        );
        registry.register(
            "queue_running",
            "Background runs this process's worker holds",
            metrics.queue_running.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "How long a background run waited in the queue before a worker claimed it",
            metrics.queue_wait.clone(),
        );
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
            RunEvent::Usage {
                usage,
                model: Some(model),
                first_output_ms,
                duration_ms,
                ..
            } => {
                self.observe_call(usage, model, *first_output_ms, *duration_ms);
                self.observe_tokens(usage);
            }
            RunEvent::Committed {
                event:
                    SessionEvent::AssistantMessage {
                        model: Some(model),
                        cost_usd: Some(cost),
                        ..
                    },
                ..
            } => {
                self.model_cost
                    .get_or_create(&ModelLabel {
                        model: model.clone(),
                    })
                    .inc_by(*cost);
            }
            RunEvent::Usage { usage, .. } => self.observe_tokens(usage),
            RunEvent::ToolResult { result, .. } => {
                let outcome = if result.is_error { "error" } else { "ok" };
                self.tool_calls
                    .get_or_create(&OutcomeLabel {
                        outcome: outcome.into(),
                    })
                    .inc();
            }
            RunEvent::RunFailed {
                stop_reason, error, ..
            } => {
                self.runs_finished
                    .get_or_create(&StopLabel {
                        stop_reason: stop_reason.as_str().into(),
                    })
                    .inc();
                self.runs_failed
                    .get_or_create(&CodeLabel {
                        code: error.code.as_str().into(),
                    })
                    .inc();
            }
            RunEvent::RunFinished { stop_reason, .. } => {
                self.runs_finished
                    .get_or_create(&StopLabel {
                        stop_reason: stop_reason.as_str().into(),
                    })
                    .inc();
            }
            _ => {}
        }
    }

    /// Counts a model call's tokens.
    fn observe_tokens(&self, usage: &agentry_types::Usage) {
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

    /// Records a model call's tokens by model and its timings.
    fn observe_call(
        &self,
        usage: &agentry_types::Usage,
        model: &str,
        first_output_ms: Option<f64>,
        duration_ms: Option<f64>,
    ) {
        for (direction, count) in [
            ("input", usage.input_tokens),
            ("cached_input", usage.cached_input_tokens),
            ("output", usage.output_tokens),
        ] {
            self.model_tokens
                .get_or_create(&ModelTokenLabel {
                    model: model.into(),
                    direction: direction.into(),
                })
                .inc_by(count);
        }
        let label = ModelLabel {
            model: model.into(),
        };
        if let Some(first) = first_output_ms {
            self.model_first_output
                .get_or_create(&label)
                .observe(first / 1000.0);
        }
        if let Some(total) = duration_ms {
            self.model_duration
                .get_or_create(&label)
                .observe(total / 1000.0);
            // Generation time: after the first output when the call streamed, else all of it.
            let generating = (total - first_output_ms.unwrap_or(0.0)) / 1000.0;
            if usage.output_tokens > 0 && generating > 0.0 {
                self.model_throughput
                    .get_or_create(&label)
                    .observe(usage.output_tokens as f64 / generating);
            }
        }
    }

    /// The queue as it is now: runs waiting (on every node) and runs this worker holds.
    pub fn queue(&self, depth: &agentry_app::queue::QueueDepth) {
        self.queue_depth
            .set(i64::try_from(depth.queued).unwrap_or(i64::MAX));
        self.queue_running
            .set(i64::try_from(depth.running_here).unwrap_or(i64::MAX));
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

    fn run_dequeued(&self, waited: Duration) {
        self.queue_wait.observe(waited.as_secs_f64());
    }
}

/// Counts an open SSE stream until dropped.
pub struct StreamGuard(std::sync::Arc<Metrics>);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        self.0.active_streams.dec();
    }
}
