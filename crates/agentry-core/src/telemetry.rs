//! The spans of a run, named and attributed after OpenTelemetry's GenAI semantic conventions:
//! `invoke_agent` per run, `chat` per model call and `execute_tool` per tool call, each the
//! child of the one before (a delegated run's `invoke_agent` is the child of the `delegate`
//! call's `execute_tool`: runs are spawned in the current span). They are `tracing` spans of
//! the target [`TARGET`]; the binary's OpenTelemetry layer, when one is configured, exports
//! them (`otel.name`, `otel.kind` and `otel.status_code` are that layer's conventions).
//! Nothing enables them otherwise, so they then cost nothing.
//!
//! Message contents (prompts, answers, tool arguments and results) are recorded only when
//! [`set_capture_content`] turned it on (off by default: they may hold anything).

use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Span;
use tracing::field::Empty;

use agentry_llm::{LlmError, ModelRequest};
use agentry_types::{ModelResponse, SessionId, ToolCall, ToolResult};

use crate::engine::RunState;

/// The target of every span here: what a subscriber enables to see runs.
pub const TARGET: &str = "agentry::trace";

static CAPTURE_CONTENT: AtomicBool = AtomicBool::new(false);

/// Records message contents on spans from now on (`gen_ai.input.messages`,
/// `gen_ai.output.messages`, tool arguments and results), or stops.
pub fn set_capture_content(capture: bool) {
    CAPTURE_CONTENT.store(capture, Ordering::Relaxed);
}

/// Whether message contents are recorded.
pub fn captures_content() -> bool {
    CAPTURE_CONTENT.load(Ordering::Relaxed)
}

/// A count as OpenTelemetry's integer (an `i64`; unsigned values would be exported as text).
fn tokens(count: u64) -> i64 {
    i64::try_from(count).unwrap_or(i64::MAX)
}

/// The span of a run (`invoke_agent <agent or model>`).
pub(crate) fn run_span(state: &RunState, session: Option<SessionId>) -> Span {
    let name = state.agent_id.as_deref().unwrap_or(&state.model);
    let span = tracing::info_span!(
        target: TARGET,
        "invoke_agent",
        otel.name = %format!("invoke_agent {name}"),
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = Empty,
        gen_ai.request.model = %state.model,
        gen_ai.conversation.id = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        agentry.run.id = %state.run_id,
        agentry.run.stop_reason = Empty,
        error.type = Empty,
    );
    if let Some(agent) = &state.agent_id {
        span.record("gen_ai.agent.name", agent.as_str());
    }
    if let Some(session) = session {
        span.record("gen_ai.conversation.id", tracing::field::display(session));
    }
    span
}

/// Records how a run ended (or stopped) on its span, and logs it (at `info`, in the span: a
/// JSON log line carries the run's ids).
pub(crate) fn end_run(span: &Span, state: &RunState) {
    span.record(
        "gen_ai.usage.input_tokens",
        tokens(state.usage.input_tokens),
    );
    span.record(
        "gen_ai.usage.output_tokens",
        tokens(state.usage.output_tokens),
    );
    let reason = state
        .stop_reason()
        .map_or("suspended", |reason| reason.as_str());
    if state.stop_reason().is_some() {
        span.record("agentry.run.stop_reason", reason);
    }
    span.in_scope(|| {
        tracing::info!(
            target: "agentry::run",
            stop_reason = reason,
            rounds = state.round,
            input_tokens = state.usage.input_tokens,
            output_tokens = state.usage.output_tokens,
            "run stopped"
        );
    });
    if let crate::engine::Phase::Finished {
        error: Some(error), ..
    } = &state.phase
    {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", error.message.as_str());
        span.record("error.type", error.code.as_str());
    }
}

/// The span of a model call (`chat <model>`), with the request's parameters (and, when
/// contents are captured, its messages).
pub(crate) fn chat_span(model: &str, request: &ModelRequest) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "chat",
        otel.name = %format!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.request.model = model,
        gen_ai.request.max_tokens = Empty,
        gen_ai.request.temperature = Empty,
        gen_ai.request.top_p = Empty,
        gen_ai.response.id = Empty,
        gen_ai.response.model = Empty,
        gen_ai.response.finish_reasons = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.input.messages = Empty,
        gen_ai.output.messages = Empty,
        error.type = Empty,
    );
    let params = &request.params;
    if let Some(max) = params.max_tokens {
        span.record("gen_ai.request.max_tokens", i64::from(max));
    }
    if let Some(temperature) = params.temperature {
        span.record("gen_ai.request.temperature", f64::from(temperature));
    }
    if let Some(top_p) = params.top_p {
        span.record("gen_ai.request.top_p", f64::from(top_p));
    }
    if captures_content()
        && let Ok(messages) = serde_json::to_string(&request.messages)
    {
        span.record("gen_ai.input.messages", messages.as_str());
    }
    span
}

/// Records a model call's answer, or its error, on its span.
pub(crate) fn end_chat(span: &Span, outcome: Result<&ModelResponse, &LlmError>) {
    match outcome {
        Ok(response) => {
            if let Some(id) = &response.id {
                span.record("gen_ai.response.id", id.as_str());
            }
            if let Some(model) = &response.model {
                span.record("gen_ai.response.model", model.as_str());
            }
            let reason = serde_json::to_value(&response.stop_reason)
                .ok()
                .and_then(|value| value.as_str().map(str::to_owned))
                .unwrap_or_else(|| format!("{:?}", response.stop_reason));
            span.record(
                "gen_ai.response.finish_reasons",
                format!("[{reason:?}]").as_str(),
            );
            span.record(
                "gen_ai.usage.input_tokens",
                tokens(response.usage.input_tokens),
            );
            span.record(
                "gen_ai.usage.output_tokens",
                tokens(response.usage.output_tokens),
            );
            if captures_content()
                && let Ok(content) = serde_json::to_string(&response.content)
            {
                span.record("gen_ai.output.messages", content.as_str());
            }
        }
        Err(error) => {
            let info = error.info();
            span.record("otel.status_code", "error");
            span.record("otel.status_description", info.message.as_str());
            span.record("error.type", info.code.as_str());
        }
    }
}

/// The span of a tool call (`execute_tool <tool>`).
pub(crate) fn tool_span(call: &ToolCall) -> Span {
    let span = tracing::info_span!(
        target: TARGET,
        "execute_tool",
        otel.name = %format!("execute_tool {}", call.name),
        otel.status_code = Empty,
        otel.status_description = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = call.name.as_str(),
        gen_ai.tool.call.id = call.id.as_str(),
        gen_ai.tool.type = "function",
        gen_ai.tool.call.arguments = Empty,
        gen_ai.tool.call.result = Empty,
        error.type = Empty,
    );
    if captures_content() {
        span.record(
            "gen_ai.tool.call.arguments",
            call.arguments.to_string().as_str(),
        );
    }
    span
}

/// Records a tool call's result on its span: an error result is the span's error.
pub(crate) fn end_tool(span: &Span, result: &ToolResult) {
    let text = || result.text_content();
    if result.is_error {
        span.record("otel.status_code", "error");
        span.record("otel.status_description", text().as_str());
        span.record("error.type", "tool_error");
    }
    if captures_content() {
        span.record("gen_ai.tool.call.result", text().as_str());
    }
}
