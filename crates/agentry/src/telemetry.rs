//! Logs and traces of the process.
//!
//! Logs go to stderr as text or JSON lines (`--log-format`), filtered by `RUST_LOG` (default:
//! warnings; `-v` info, `-vv` debug). JSON lines carry the fields of the spans they happen in
//! (a run's id, its session, the request's id).
//!
//! Traces: when an OTLP endpoint is configured (`--otlp-endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_SDK_DISABLED=true`
//! turns it off), the spans of `agentry::trace` (requests, runs, model and tool calls — see
//! `agentry_app::domain::core::telemetry`) are exported in batches over OTLP/HTTP (`http/protobuf`, or
//! `http/json` with `OTEL_EXPORTER_OTLP_PROTOCOL`) or OTLP/gRPC (`grpc`, through tonic on a
//! one-thread runtime of its own: [`GrpcExporter`]), the service named by `OTEL_SERVICE_NAME`
//! (default `agentry`), and W3C trace context is read from requests and written on outgoing
//! ones. With nothing configured no exporter, propagator or layer exists.

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Whether the operator asked for JSON lines (`--log-format json`): then [`say`] and [`warn`]
/// write JSON log lines too, and every line on both streams is JSON.
static JSON_LINES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `message` as the line it is printed as: as is, or a JSON log line of `level`.
fn line(level: &str, message: &str) -> String {
    if !JSON_LINES.load(std::sync::atomic::Ordering::Relaxed) {
        return message.to_owned();
    }
    serde_json::json!({
        "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "level": level,
        "target": "agentry",
        "message": message,
    })
    .to_string()
}

/// A line for the operator on stdout (the server's banner): as is, or as a JSON log line.
pub(crate) fn say(message: &str) {
    println!("{}", line("INFO", message));
}

/// A line for the operator on stderr: as is, or as a JSON log line of `level`.
pub(crate) fn tell(level: &str, message: &str) {
    eprintln!("{}", line(level, message));
}

/// What the command line says about logs and traces.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    pub(crate) verbosity: u8,
    pub(crate) format: LogFormat,
    pub(crate) otlp_endpoint: Option<String>,
    pub(crate) capture_content: bool,
}

/// The trace pipeline, flushed at exit.
pub(crate) struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends what is buffered and stops the exporter.
    pub(crate) fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(error) = provider.shutdown()
        {
            tell(
                "WARN",
                &format!("agentry: the last traces could not be exported: {error}"),
            );
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name)
        .ok()
        .map(|value| value.trim().to_owned())
        .filter(|value| !value.is_empty())
}

/// The OTLP endpoint traces go to, if any: the flag, else the standard variables.
fn endpoint(options: &Options) -> Option<String> {
    if env("OTEL_SDK_DISABLED").is_some_and(|value| value.eq_ignore_ascii_case("true")) {
        return None;
    }
    if let Some(flag) = &options.otlp_endpoint {
        return Some(flag.clone());
    }
    env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// Sets up logging, and tracing when configured.
pub(crate) fn init(options: &Options) -> anyhow::Result<Telemetry> {
    JSON_LINES.store(
        options.format == LogFormat::Json,
        std::sync::atomic::Ordering::Relaxed,
    );
    let default = match options.verbosity {
        0 => "warn",
        1 => "info",
        _ => "debug",
    };
    let logs_filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        // JSON lines carry the run they belong to: the run spans are on for them.
        let runs = if options.format == LogFormat::Json {
            format!(",{}=info", agentry_app::domain::core::telemetry::TARGET)
        } else {
            String::new()
        };
        tracing_subscriber::EnvFilter::new(format!("{default}{runs}"))
    });
    let logs = match options.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .boxed(),
    }
    .with_filter(logs_filter);
    let capture = options.capture_content
        || env("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT")
            .is_some_and(|value| value.eq_ignore_ascii_case("true"));
    agentry_app::domain::core::telemetry::set_capture_content(capture);
    let Some(endpoint) = endpoint(options) else {
        tracing_subscriber::registry().with(logs).try_init()?;
        return Ok(Telemetry { provider: None });
    };
    // The exporter's HTTP client speaks TLS with the process's crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let protocol = env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|| env("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_else(|| "http/protobuf".to_owned());
    let protocol = match protocol.as_str() {
        "http/protobuf" => Some(opentelemetry_otlp::Protocol::HttpBinary),
        "http/json" => Some(opentelemetry_otlp::Protocol::HttpJson),
        "grpc" => None,
        other => anyhow::bail!(
            "OTLP protocol {other:?} is not supported: use http/protobuf (the default), \
             http/json or grpc"
        ),
    };
    let mut resource = opentelemetry_sdk::Resource::builder();
    if env("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name("agentry");
    }
    let provider = SdkTracerProvider::builder().with_resource(resource.build());
    let provider = match protocol {
        Some(protocol) => {
            let mut exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(protocol);
            if options.otlp_endpoint.is_some() {
                // Like the standard variable: the base URL, traces under `/v1/traces`.
                let base = endpoint.trim_end_matches('/');
                let url = if base.ends_with("/v1/traces") {
                    base.to_owned()
                } else {
                    format!("{base}/v1/traces")
                };
                exporter = exporter.with_endpoint(url);
            }
            let exporter = exporter
                .build()
                .with_context(|| format!("cannot export traces to {endpoint}"))?;
            provider.with_batch_exporter(exporter).build()
        }
        None => {
            let exporter = GrpcExporter::new(options.otlp_endpoint.as_deref())
                .with_context(|| format!("cannot export traces over gRPC to {endpoint}"))?;
            provider.with_batch_exporter(exporter).build()
        }
    };
    let tracer = provider.tracer("agentry");
    opentelemetry::global::set_text_map_propagator(
        opentelemetry_sdk::propagation::TraceContextPropagator::new(),
    );
    opentelemetry::global::set_tracer_provider(provider.clone());
    let traces = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::Targets::new().with_target(
            agentry_app::domain::core::telemetry::TARGET,
            tracing::Level::INFO,
        ));
    tracing_subscriber::registry()
        .with(logs)
        .with(traces)
        .try_init()?;
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// OTLP/gRPC: tonic's exporter with the Tokio runtime its channel needs. The SDK's batch
/// processor exports from a thread of its own, outside any runtime, so each export is driven
/// to completion on this exporter's one-thread runtime.
#[derive(Debug)]
struct GrpcExporter {
    runtime: Option<tokio::runtime::Runtime>,
    inner: opentelemetry_otlp::SpanExporter,
}

impl GrpcExporter {
    /// The exporter to `endpoint` (default: the standard variables, else
    /// `http://localhost:4317`).
    fn new(endpoint: Option<&str>) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("otlp-grpc")
            .enable_all()
            .build()
            .context("cannot start the gRPC exporter's runtime")?;
        let built = {
            let _inside = runtime.enter();
            let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            if let Some(endpoint) = endpoint {
                exporter = exporter.with_endpoint(endpoint);
            }
            exporter.build()
        };
        match built {
            Ok(inner) => Ok(Self {
                runtime: Some(runtime),
                inner,
            }),
            Err(error) => {
                // A runtime cannot be dropped where blocking is not allowed (the CLI's own
                // runtime): let it go in the background.
                runtime.shutdown_background();
                Err(error.into())
            }
        }
    }
}

impl Drop for GrpcExporter {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl opentelemetry_sdk::trace::SpanExporter for GrpcExporter {
    fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> impl std::future::Future<Output = opentelemetry_sdk::error::OTelSdkResult> + Send {
        // Called on the batch processor's own thread: blocking on the runtime is its design.
        let result = match &self.runtime {
            Some(runtime) => runtime.block_on(self.inner.export(batch)),
            None => Err(opentelemetry_sdk::error::OTelSdkError::AlreadyShutdown),
        };
        std::future::ready(result)
    }

    fn shutdown_with_timeout(
        &self,
        timeout: std::time::Duration,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.inner.set_resource(resource);
    }
}
