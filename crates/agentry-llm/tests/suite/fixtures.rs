//! Every recorded exchange in `shared/fixtures/providers` replayed through its adapter, with the
//! parsed result asserted: text, thinking, tool calls with exact arguments, usage and stop
//! reason, or the typed error with its code and retry decision.

use std::time::Duration;

use agentry_llm::LlmError;
use agentry_testkit::Fixture;
use agentry_types::{AssistantPart, ErrorCode, ModelEvent, StopReason, Thinking, Usage};
use serde_json::json;

use super::support::replay;

/// The fixtures this file has a test for. A new fixture must get a test here.
const COVERED: &[&str] = &[
    "anthropic/error_400_invalid_request",
    "anthropic/error_429_rate_limit",
    "anthropic/error_529_overloaded",
    "anthropic/messages_parallel_tool_use_nonstream",
    "anthropic/messages_thinking_stream",
    "anthropic/messages_thinking_tool_use_nonstream",
    "anthropic/messages_tool_use_nonstream",
    "anthropic/messages_tool_use_stream",
    "anthropic/messages_tool_use_stream_max_tokens_cut",
    "local/llama_cpp_python_chat_stream_text",
    "local/llama_server_chat_stream_usage_timings",
    "local/llama_server_error_400_context_exceeded",
    "ollama/chat_nonstream_tool_calls",
    "ollama/chat_stream_text",
    "ollama/chat_stream_tool_calls",
    "ollama/generate_stream_midstream_error",
    "openai/chat_parallel_tool_calls_nonstream",
    "openai/chat_parallel_tool_calls_stream",
    "openai/chat_reasoning_model_o3_mini_nonstream",
    "openai/chat_stream_finish_length",
    "openai/chat_tool_call_nonstream",
    "openai/chat_tool_call_stream_strict",
    "openai/error_400_context_length_exceeded",
    "openai/error_400_unsupported_system_role",
    "openai_compat/deepseek_reasoning_content_stream",
    "openai_compat/deepseek_reasoning_tool_calls_nonstream",
    "openai_compat/groq_error_400_tool_use_failed",
    "openai_compat/ollama_v1_tool_call_reasoning_nonstream",
];

#[test]
fn every_fixture_has_a_test() {
    let mut names: Vec<String> = Fixture::all()
        .expect("fixtures load")
        .into_iter()
        .map(|fixture| fixture.name)
        .collect();
    names.sort();
    let covered: Vec<String> = COVERED.iter().map(|name| name.to_string()).collect();
    assert_eq!(names, covered);
}

fn usage(input: u64, output: u64, cached: u64, reasoning: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cached_input_tokens: cached,
        cache_creation_input_tokens: 0,
        reasoning_tokens: reasoning,
    }
}

fn calls(response: &agentry_types::ModelResponse) -> Vec<(String, String, serde_json::Value)> {
    response
        .tool_calls()
        .into_iter()
        .map(|call| (call.id.clone(), call.name.clone(), call.arguments.clone()))
        .collect()
}

fn provider_error(error: &LlmError) -> &agentry_llm::ProviderError {
    error
        .provider_error()
        .unwrap_or_else(|| panic!("expected a provider error, got {error:?}"))
}

// ---- Anthropic ----

#[tokio::test]
async fn anthropic_error_400_invalid_request() {
    let (outcome, _mock) = replay("anthropic/error_400_invalid_request").await;
    let error = outcome.error();
    assert_eq!(error.code(), ErrorCode::InvalidRequest);
    assert!(!error.is_retryable());
    let detail = provider_error(error);
    assert_eq!(detail.status, Some(400));
    assert_eq!(detail.error_type.as_deref(), Some("invalid_request_error"));
    assert!(
        detail
            .message
            .starts_with("This model does not support effort level 'xhigh'")
    );
    assert!(detail.raw_body.contains("req_011Ca7jT9AHpgXgdv8igm4z9"));
}

#[tokio::test]
async fn anthropic_error_429_rate_limit() {
    let (outcome, _mock) = replay("anthropic/error_429_rate_limit").await;
    let error = outcome.error();
    assert_eq!(error.code(), ErrorCode::RateLimited);
    assert!(error.is_retryable());
    assert_eq!(error.retry_after(), Some(Duration::from_secs(16)));
    let detail = provider_error(error);
    assert_eq!(detail.status, Some(429));
    assert_eq!(detail.should_retry, Some(true));
    assert_eq!(detail.error_type.as_deref(), Some("rate_limit_error"));
    assert!(detail.message.contains("40,000 input tokens per minute"));
}

#[tokio::test]
async fn anthropic_error_529_overloaded() {
    let (outcome, _mock) = replay("anthropic/error_529_overloaded").await;
    let error = outcome.error();
    assert_eq!(error.code(), ErrorCode::Overloaded);
    assert!(error.is_retryable());
    assert_eq!(error.retry_after(), None);
    let detail = provider_error(error);
    assert_eq!(detail.status, Some(529));
    assert_eq!(detail.message, "Overloaded");
}

#[tokio::test]
async fn anthropic_parallel_tool_use_nonstream() {
    let (outcome, _mock) = replay("anthropic/messages_parallel_tool_use_nonstream").await;
    let response = outcome.response();
    assert!(
        response
            .text()
            .starts_with("I'll help you find out who is the youngest")
    );
    let names = calls(response);
    assert_eq!(
        names,
        vec![
            (
                "toolu_0167cfEnoQaPviGdVXA95zcu".into(),
                "retrieve_entity_info".into(),
                json!({"name": "Alice"})
            ),
            (
                "toolu_01EEe2V5HD1Ac4rKiUR4HD2T".into(),
                "retrieve_entity_info".into(),
                json!({"name": "Bob"})
            ),
            (
                "toolu_01XFyAjstT3966qvRynZyVPo".into(),
                "retrieve_entity_info".into(),
                json!({"name": "Charlie"})
            ),
            (
                "toolu_013mnQZbgtK2oe3Mo3XKJsx3".into(),
                "retrieve_entity_info".into(),
                json!({"name": "Daisy"})
            ),
        ]
    );
    assert!(matches!(response.content[0], AssistantPart::Text { .. }));
    assert_eq!(response.usage, usage(423, 202, 0, 0));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    assert_eq!(response.id.as_deref(), Some("msg_011S3wxtqL5CVescWqS3zeg2"));
    assert_eq!(response.model.as_deref(), Some("claude-haiku-4-5-20251001"));
}

#[tokio::test]
async fn anthropic_thinking_stream() {
    let (outcome, _mock) = replay("anthropic/messages_thinking_stream").await;
    let response = outcome.response();
    assert_eq!(response.content.len(), 2);
    match &response.content[0] {
        AssistantPart::Thinking(Thinking::Text { text, signature }) => {
            assert!(
                text.starts_with("This is a straightforward question about pedestrian safety. ")
            );
            assert_eq!(text.chars().count(), 202);
            let signature = signature.as_deref().expect("signature kept");
            assert_eq!(signature.len(), 504);
            assert!(signature.starts_with("EvMCCkYICxgCKkCHP2cS"));
            assert!(signature.ends_with("UhjfQYAQ=="));
        }
        other => panic!("expected signed thinking first, got {other:?}"),
    }
    let text = response.text();
    assert!(text.starts_with("Here are the basic steps for safely crossing the street:\n\n"));
    assert!(text.ends_with("prioritize safety over speed when crossing streets."));
    assert_eq!(text.chars().count(), 1021);
    // The live deltas add up to the same text and thinking.
    assert_eq!(outcome.streamed_text(), text);
    assert_eq!(outcome.streamed_thinking(), response.thinking());
    assert_eq!(response.usage, usage(43, 282, 0, 0));
    assert_eq!(response.stop_reason, StopReason::EndTurn);
}

#[tokio::test]
async fn anthropic_thinking_tool_use_nonstream() {
    let (outcome, _mock) = replay("anthropic/messages_thinking_tool_use_nonstream").await;
    let response = outcome.response();
    match &response.content[0] {
        AssistantPart::Thinking(Thinking::Text { text, signature }) => {
            assert!(text.starts_with("The user is asking about the largest city"));
            assert!(
                signature
                    .as_deref()
                    .is_some_and(|s| s.starts_with("EqEECkYICxgCKkAo3UA4"))
            );
        }
        other => panic!("expected signed thinking first, got {other:?}"),
    }
    assert!(
        matches!(&response.content[1], AssistantPart::Text { text } if text.starts_with("I'll help you find the largest city"))
    );
    assert_eq!(
        calls(response),
        vec![(
            "toolu_01YGzqpRE16Vricda3Aqcejo".into(),
            "get_user_country".into(),
            json!({})
        )]
    );
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn anthropic_tool_use_nonstream() {
    let (outcome, _mock) = replay("anthropic/messages_tool_use_nonstream").await;
    let response = outcome.response();
    assert_eq!(response.text(), "");
    assert_eq!(
        calls(response),
        vec![(
            "toolu_01WN4AuToBnJyXNQXwQBBebj".into(),
            "get_weather".into(),
            json!({"city": "Paris"})
        )]
    );
    assert_eq!(response.usage, usage(572, 53, 0, 0));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn anthropic_tool_use_stream() {
    let (outcome, _mock) = replay("anthropic/messages_tool_use_stream").await;
    let response = outcome.response();
    assert_eq!(
        response.text(),
        "I'll check the current weather in Paris for you."
    );
    assert_eq!(
        calls(response),
        vec![(
            "toolu_01NRLabsLyVHZPKxbKvkfSMn".into(),
            "get_weather".into(),
            json!({"location": "Paris"})
        )]
    );
    assert_eq!(response.usage, usage(377, 65, 0, 0));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    // Live tool-call deltas: first the id and name, then argument fragments that add up.
    let mut arguments = String::new();
    let mut saw_name = false;
    for event in &outcome.events {
        if let ModelEvent::ToolCallDelta {
            index,
            name,
            arguments: fragment,
            ..
        } = event
        {
            assert_eq!(*index, 0);
            saw_name |= name.as_deref() == Some("get_weather");
            arguments.push_str(fragment);
        }
    }
    assert!(saw_name);
    assert_eq!(arguments, "{\"location\": \"Paris\"}");
    assert!(outcome.events.iter().any(
        |e| matches!(e, ModelEvent::ToolCall { index: 0, call } if call.name == "get_weather")
    ));
}

#[tokio::test]
async fn anthropic_tool_input_cut_off_by_max_tokens() {
    let (outcome, _mock) = replay("anthropic/messages_tool_use_stream_max_tokens_cut").await;
    // The text streamed before the cut is shown live...
    assert!(
        outcome
            .streamed_text()
            .starts_with("I'll create a comprehensive tax guide")
    );
    // ...but the truncated call is a typed error, never a silently truncated call.
    match outcome.error() {
        LlmError::InvalidToolArguments {
            id,
            name,
            cut_off,
            raw,
            ..
        } => {
            assert_eq!(id, "toolu_01EKqbqmZrGRXy18eN7m9kvY");
            assert_eq!(name, "make_file");
            assert!(*cut_off);
            assert!(raw.ends_with("\"Filing taxes"));
        }
        other => panic!("expected InvalidToolArguments, got {other:?}"),
    }
    assert_eq!(outcome.error().code(), ErrorCode::InvalidToolArguments);
    assert!(!outcome.error().is_retryable());
}

// ---- llama.cpp and llama-cpp-python (OpenAI-compatible) ----

#[tokio::test]
async fn llama_cpp_python_stream_without_usage() {
    let (outcome, _mock) = replay("local/llama_cpp_python_chat_stream_text").await;
    let response = outcome.response();
    assert_eq!(
        response.text(),
        "Hello, welcome to my little corner of the world!"
    );
    assert_eq!(response.usage, Usage::default());
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(response.model.as_deref(), Some("smol"));
}

#[tokio::test]
async fn llama_server_stream_with_usage_and_timings() {
    let (outcome, _mock) = replay("local/llama_server_chat_stream_usage_timings").await;
    let response = outcome.response();
    assert_eq!(
        response.text(),
        "Hello, welcome to my little corner of the world."
    );
    assert_eq!(response.usage, usage(36, 12, 24, 0));
    assert_eq!(response.stop_reason, StopReason::EndTurn);
}

#[tokio::test]
async fn llama_server_context_exceeded_with_numeric_code() {
    let (outcome, _mock) = replay("local/llama_server_error_400_context_exceeded").await;
    let error = outcome.error();
    assert_eq!(error.code(), ErrorCode::ContextLengthExceeded);
    assert!(error.is_context_too_long());
    assert!(!error.is_retryable());
    let detail = provider_error(error);
    assert_eq!(detail.error_code.as_deref(), Some("400"));
    assert_eq!(
        detail.error_type.as_deref(),
        Some("exceed_context_size_error")
    );
    assert!(detail.raw_body.contains("\"n_ctx\":4096"));
}

// ---- Ollama native ----

#[tokio::test]
async fn ollama_nonstream_tool_calls_get_stable_ids() {
    let (first, _mock) = replay("ollama/chat_nonstream_tool_calls").await;
    let (second, _mock2) = replay("ollama/chat_nonstream_tool_calls").await;
    let response = first.response();
    let found = calls(response);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1, "get_weather");
    assert_eq!(found[0].2, json!({"city": "Tokyo"}));
    assert!(found[0].0.starts_with("call_"));
    assert_eq!(
        found[0].0,
        calls(second.response())[0].0,
        "ids are stable across replays"
    );
    assert_eq!(response.usage, usage(169, 18, 0, 0));
    // Ollama says "stop" even when it calls tools.
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn ollama_stream_text() {
    let (outcome, _mock) = replay("ollama/chat_stream_text").await;
    let response = outcome.response();
    assert_eq!(response.text(), "The");
    assert_eq!(response.usage, usage(26, 282, 0, 0));
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    assert_eq!(response.model.as_deref(), Some("llama3.2"));
}

#[tokio::test]
async fn ollama_stream_tool_calls() {
    let (outcome, _mock) = replay("ollama/chat_stream_tool_calls").await;
    let response = outcome.response();
    let found = calls(response);
    assert_eq!(found.len(), 1);
    assert_eq!(
        (found[0].1.as_str(), &found[0].2),
        ("get_weather", &json!({"city": "Tokyo"}))
    );
    assert_eq!(response.usage, usage(169, 15, 0, 0));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn ollama_midstream_error_under_http_200() {
    let (outcome, _mock) = replay("ollama/generate_stream_midstream_error").await;
    assert_eq!(outcome.streamed_text(), " Yes.Ican");
    let error = outcome.error();
    assert_eq!(error.code(), ErrorCode::ProviderError);
    let detail = provider_error(error);
    assert_eq!(detail.status, None);
    assert_eq!(
        detail.message,
        "an error was encountered while running the model"
    );
}

// ---- OpenAI ----

#[tokio::test]
async fn openai_parallel_tool_calls_nonstream() {
    let (outcome, _mock) = replay("openai/chat_parallel_tool_calls_nonstream").await;
    let response = outcome.response();
    assert_eq!(
        calls(response),
        vec![
            (
                "call_fdNz3vOBKYgOIpMdWotB9MjY".into(),
                "GetWeatherArgs".into(),
                json!({"city": "Edinburgh", "country": "GB", "units": "c"})
            ),
            (
                "call_h1DWI1POMJLb0KwIyQHWXD4p".into(),
                "get_stock_price".into(),
                json!({"ticker": "AAPL", "exchange": "NASDAQ"})
            ),
        ]
    );
    assert_eq!(response.usage, usage(149, 60, 0, 0));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn openai_parallel_tool_calls_stream() {
    let (outcome, _mock) = replay("openai/chat_parallel_tool_calls_stream").await;
    let response = outcome.response();
    assert_eq!(
        calls(response),
        vec![
            (
                "call_JMW1whyEaYG438VE1OIflxA2".into(),
                "GetWeatherArgs".into(),
                json!({"city": "Edinburgh", "country": "GB", "units": "c"})
            ),
            (
                "call_DNYTawLBoN8fj3KN6qU9N1Ou".into(),
                "get_stock_price".into(),
                json!({"ticker": "AAPL", "exchange": "NASDAQ"})
            ),
        ]
    );
    assert_eq!(response.usage, usage(149, 60, 0, 0));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
    let indices: Vec<usize> = outcome
        .events
        .iter()
        .filter_map(|e| match e {
            ModelEvent::ToolCall { index, .. } => Some(*index),
            _ => None,
        })
        .collect();
    assert_eq!(indices, vec![0, 1]);
}

#[tokio::test]
async fn openai_reasoning_model_nonstream() {
    let (outcome, _mock) = replay("openai/chat_reasoning_model_o3_mini_nonstream").await;
    let response = outcome.response();
    assert_eq!(response.text(), "Hello there! How can I help you today?");
    assert_eq!(response.usage, usage(7, 87, 0, 64));
    assert_eq!(response.stop_reason, StopReason::EndTurn);
}

#[tokio::test]
async fn openai_stream_finish_length() {
    let (outcome, _mock) = replay("openai/chat_stream_finish_length").await;
    let response = outcome.response();
    assert_eq!(response.text(), "{\"");
    assert_eq!(response.usage, usage(79, 1, 0, 0));
    assert_eq!(response.stop_reason, StopReason::MaxTokens);
}

#[tokio::test]
async fn openai_tool_call_nonstream() {
    let (outcome, _mock) = replay("openai/chat_tool_call_nonstream").await;
    let response = outcome.response();
    assert_eq!(
        calls(response),
        vec![(
            "call_aDdJTteHrpMdhdkEkyxjxEHH".into(),
            "get_weather".into(),
            json!({"city": "Paris"})
        )]
    );
    assert_eq!(response.text(), "");
    assert_eq!(response.usage, usage(132, 23, 0, 0));
    assert_eq!(response.model.as_deref(), Some("gpt-5-mini-2025-08-07"));
}

#[tokio::test]
async fn openai_strict_tool_call_stream() {
    let (outcome, _mock) = replay("openai/chat_tool_call_stream_strict").await;
    let response = outcome.response();
    assert_eq!(
        calls(response),
        vec![(
            "call_CTf1nWJLqSeRgDqaCG27xZ74".into(),
            "get_weather".into(),
            json!({"city": "San Francisco", "state": "CA"})
        )]
    );
    assert_eq!(response.usage, usage(48, 19, 0, 0));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn openai_context_length_exceeded() {
    let (outcome, _mock) = replay("openai/error_400_context_length_exceeded").await;
    let error = outcome.error();
    assert_eq!(error.code(), ErrorCode::ContextLengthExceeded);
    assert!(error.is_context_too_long());
    assert!(!error.is_retryable());
    assert_eq!(error.status(), Some(400));
    assert!(
        provider_error(error)
            .message
            .starts_with("This model's maximum context length is 4097 tokens")
    );
}

#[tokio::test]
async fn openai_unsupported_system_role() {
    let (outcome, _mock) = replay("openai/error_400_unsupported_system_role").await;
    let error = outcome.error();
    assert_eq!(error.code(), ErrorCode::InvalidRequest);
    assert!(!error.is_retryable());
    let detail = provider_error(error);
    assert_eq!(detail.error_code.as_deref(), Some("unsupported_value"));
    assert_eq!(detail.error_type.as_deref(), Some("invalid_request_error"));
}

// ---- OpenAI-compatible ----

#[tokio::test]
async fn deepseek_reasoning_content_stream() {
    let (outcome, _mock) = replay("openai_compat/deepseek_reasoning_content_stream").await;
    let response = outcome.response();
    assert_eq!(response.text(), "Hello there! 😊 How can I help you today?");
    let thinking = response.thinking();
    assert!(thinking.starts_with("Hmm, the user just said \"Hello\". It's a simple greeting but "));
    assert_eq!(thinking.chars().count(), 882);
    assert!(matches!(
        &response.content[0],
        AssistantPart::Thinking(Thinking::Text {
            signature: None,
            ..
        })
    ));
    assert_eq!(response.usage, usage(6, 212, 0, 198));
    assert_eq!(response.stop_reason, StopReason::EndTurn);
}

#[tokio::test]
async fn deepseek_reasoning_with_tool_calls_nonstream() {
    let (outcome, _mock) = replay("openai_compat/deepseek_reasoning_tool_calls_nonstream").await;
    let response = outcome.response();
    assert!(
        response
            .thinking()
            .starts_with("The user wants to play a dice game.")
    );
    assert_eq!(response.text(), "Let me load the dice rolling capability!");
    assert_eq!(
        calls(response),
        vec![(
            "call_00_sXqYgMESDht75NCLLZtt9804".into(),
            "load_capability".into(),
            json!({"id": "DICE_ROLL"})
        )]
    );
    assert_eq!(response.usage, usage(563, 116, 512, 60));
    assert_eq!(response.stop_reason, StopReason::ToolUse);
}

#[tokio::test]
async fn groq_tool_use_failed() {
    let (outcome, _mock) = replay("openai_compat/groq_error_400_tool_use_failed").await;
    let error = outcome.error();
    assert_eq!(error.code(), ErrorCode::InvalidRequest);
    assert!(!error.is_retryable());
    let detail = provider_error(error);
    assert_eq!(detail.error_code.as_deref(), Some("tool_use_failed"));
    assert!(detail.raw_body.contains("failed_generation"));
}

#[tokio::test]
async fn ollama_v1_reasoning_field_and_tool_call() {
    let (outcome, _mock) = replay("openai_compat/ollama_v1_tool_call_reasoning_nonstream").await;
    let response = outcome.response();
    assert!(
        response
            .thinking()
            .starts_with("The conversation: user asked \"What is the capital of France?\"")
    );
    assert_eq!(response.text(), "");
    assert_eq!(
        calls(response),
        vec![(
            "call_o2vnpxrw".into(),
            "final_result".into(),
            json!({"city": "Paris", "country": "France"})
        )]
    );
    assert_eq!(response.usage, usage(206, 194, 0, 0));
}
