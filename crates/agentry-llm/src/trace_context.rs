//! W3C trace context on outgoing requests: the current span's context (a run's model call, a
//! webhook delivery) written as `traceparent` / `tracestate`, so a provider or receiver that
//! traces continues the caller's trace. Without an OpenTelemetry layer and propagator (the
//! default) nothing is written.

use opentelemetry_http::HeaderInjector;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Writes the current span's trace context into `headers`.
pub fn inject(headers: &mut http::HeaderMap) {
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut HeaderInjector(headers));
    });
}
