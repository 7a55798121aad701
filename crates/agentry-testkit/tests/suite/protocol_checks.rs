//! Protocol invariant checks: valid conversations pass, and each rule's violation is caught.

use agentry_testkit::{MockProvider, Protocol, Reply, check_request};
use serde_json::{Value, json};

use super::client::http_client;

/// Asserts exactly one violation whose message contains `needle`.
fn assert_single_violation(protocol: Protocol, body: &Value, needle: &str) {
    let violations = check_request(protocol, body);
    assert_eq!(
        violations.len(),
        1,
        "expected one violation, got {violations:?}"
    );
    assert!(
        violations[0].message.contains(needle),
        "violation {:?} does not mention {needle:?}",
        violations[0].message
    );
    assert_eq!(violations[0].protocol, protocol);
}

// ---------------------------------------------------------------- OpenAI

fn openai_call(id: &str, arguments: Value) -> Value {
    json!({"id": id, "type": "function", "function": {"name": "get_weather", "arguments": arguments}})
}

fn openai_valid() -> Value {
    json!({"model": "gpt-4o", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": null, "tool_calls": [
            openai_call("call_a", json!("{\"city\":\"Paris\"}")),
            openai_call("call_b", json!("{}")),
        ]},
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
        {"role": "tool", "tool_call_id": "call_a", "content": "sun"},
        {"role": "assistant", "content": "Sun in Paris."},
        {"role": "user", "content": "thanks"},
    ]})
}

#[test]
fn openai_valid_conversation_passes() {
    assert_eq!(check_request(Protocol::OpenAi, &openai_valid()), []);
}

#[test]
fn openai_tool_result_must_answer_a_pending_call() {
    let mut body = openai_valid();
    body["messages"][3]["tool_call_id"] = json!("call_unknown");
    let violations = check_request(Protocol::OpenAi, &body);
    assert!(
        violations
            .iter()
            .any(|v| v.message.contains("call_unknown")),
        "{violations:?}"
    );
}

#[test]
fn openai_tool_message_without_a_preceding_call_is_caught() {
    let body = json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "tool", "tool_call_id": "call_a", "content": "orphan"},
    ]});
    assert_single_violation(Protocol::OpenAi, &body, "no assistant tool call precedes");
}

#[test]
fn openai_tool_message_answering_an_older_assistant_is_caught() {
    let body = json!({"messages": [
        {"role": "assistant", "tool_calls": [openai_call("call_old", json!("{}"))]},
        {"role": "tool", "tool_call_id": "call_old", "content": "done"},
        {"role": "assistant", "tool_calls": [openai_call("call_new", json!("{}"))]},
        {"role": "tool", "tool_call_id": "call_new", "content": "done"},
        {"role": "tool", "tool_call_id": "call_old", "content": "again"},
    ]});
    assert_single_violation(Protocol::OpenAi, &body, "\"call_old\" does not answer");
}

#[test]
fn openai_calls_must_be_answered_before_the_next_message() {
    let mut body = openai_valid();
    body["messages"].as_array_mut().expect("array").remove(4);
    assert_single_violation(Protocol::OpenAi, &body, "before messages[4]");
}

#[test]
fn openai_request_must_not_end_with_unanswered_calls() {
    let body = json!({"messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "tool_calls": [openai_call("call_a", json!("{}"))]},
    ]});
    assert_single_violation(Protocol::OpenAi, &body, "by the end of the request");
}

#[test]
fn openai_arguments_must_be_a_json_string() {
    let mut body = openai_valid();
    body["messages"][2]["tool_calls"][0]["function"]["arguments"] = json!({"city": "Paris"});
    assert_single_violation(Protocol::OpenAi, &body, "must be a JSON-encoded string");
    body["messages"][2]["tool_calls"][0]["function"]["arguments"] = json!("{\"city\": ");
    assert_single_violation(Protocol::OpenAi, &body, "is not valid JSON");
}

// ---------------------------------------------------------------- Anthropic

fn anthropic_valid() -> Value {
    json!({"model": "claude-sonnet-4-0", "max_tokens": 1024, "system": "be brief", "messages": [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "call the tool", "signature": "sig"},
            {"type": "redacted_thinking", "data": "opaque"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {"city": "Rome"}},
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_b", "content": "rain"},
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "sun"},
            {"type": "text", "text": "and?"},
        ]},
        {"role": "assistant", "content": "Sun in Paris, rain in Rome."},
        {"role": "user", "content": "thanks"},
    ]})
}

#[test]
fn anthropic_valid_conversation_passes() {
    assert_eq!(check_request(Protocol::Anthropic, &anthropic_valid()), []);
}

#[test]
fn anthropic_system_role_in_messages_is_caught() {
    let mut body = anthropic_valid();
    body["messages"]
        .as_array_mut()
        .expect("array")
        .insert(0, json!({"role": "system", "content": "x"}));
    assert_single_violation(Protocol::Anthropic, &body, "role \"system\" is not allowed");
}

#[test]
fn anthropic_max_tokens_is_required() {
    let mut body = anthropic_valid();
    body.as_object_mut().expect("object").remove("max_tokens");
    assert_single_violation(Protocol::Anthropic, &body, "`max_tokens` is required");
}

#[test]
fn anthropic_tool_result_must_answer_the_preceding_assistant() {
    let mut body = anthropic_valid();
    body["messages"][2]["content"][0]["tool_use_id"] = json!("toolu_other");
    let violations = check_request(Protocol::Anthropic, &body);
    assert!(
        violations
            .iter()
            .any(|v| v.message.contains("\"toolu_other\" does not answer")),
        "{violations:?}"
    );
    // toolu_b is then left unanswered as well.
    assert!(
        violations.iter().any(|v| v.message.contains("toolu_b")),
        "{violations:?}"
    );
}

#[test]
fn anthropic_tool_result_after_a_non_assistant_message_is_caught() {
    let body = json!({"max_tokens": 5, "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "x"}]},
    ]});
    assert_single_violation(Protocol::Anthropic, &body, "does not answer");
}

#[test]
fn anthropic_tool_use_must_be_answered_in_the_next_user_message() {
    let mut body = anthropic_valid();
    body["messages"][2]["content"]
        .as_array_mut()
        .expect("array")
        .remove(0);
    assert_single_violation(
        Protocol::Anthropic,
        &body,
        "tool_use [\"toolu_b\"] not answered in messages[2]",
    );
}

#[test]
fn anthropic_request_must_not_end_with_unanswered_tool_use() {
    let mut body = anthropic_valid();
    body["messages"].as_array_mut().expect("array").truncate(2);
    assert_single_violation(Protocol::Anthropic, &body, "by the end of the request");
}

#[test]
fn anthropic_thinking_needs_a_signature() {
    let mut body = anthropic_valid();
    body["messages"][1]["content"][0]["signature"] = json!("");
    assert_single_violation(
        Protocol::Anthropic,
        &body,
        "thinking block without a non-empty `signature`",
    );
    body["messages"][1]["content"][0]
        .as_object_mut()
        .expect("object")
        .remove("signature");
    assert_single_violation(Protocol::Anthropic, &body, "`signature`");
}

#[test]
fn anthropic_redacted_thinking_needs_data() {
    let mut body = anthropic_valid();
    body["messages"][1]["content"][1]
        .as_object_mut()
        .expect("object")
        .remove("data");
    assert_single_violation(
        Protocol::Anthropic,
        &body,
        "redacted_thinking block without a non-empty `data`",
    );
}

// ---------------------------------------------------------------- Ollama

fn ollama_call(arguments: Value) -> Value {
    json!({"function": {"name": "get_weather", "arguments": arguments}})
}

fn ollama_valid() -> Value {
    json!({"model": "llama3.2", "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            ollama_call(json!({"city": "Paris"})),
            ollama_call(json!({"city": "Rome"})),
        ]},
        {"role": "tool", "content": "sun", "tool_name": "get_weather"},
        {"role": "tool", "content": "rain", "tool_name": "get_weather"},
        {"role": "assistant", "content": "Sun and rain."},
    ]})
}

#[test]
fn ollama_valid_conversation_passes() {
    assert_eq!(check_request(Protocol::Ollama, &ollama_valid()), []);
    assert_eq!(
        check_request(Protocol::Ollama, &json!({"model": "m", "prompt": "hi"})),
        []
    );
}

#[test]
fn ollama_tool_message_must_follow_tool_calls() {
    let body = json!({"messages": [
        {"role": "user", "content": "hi"},
        {"role": "tool", "content": "orphan"},
    ]});
    assert_single_violation(
        Protocol::Ollama,
        &body,
        "does not follow an assistant message with tool_calls",
    );
}

#[test]
fn ollama_no_more_tool_messages_than_calls() {
    let mut body = ollama_valid();
    body["messages"]
        .as_array_mut()
        .expect("array")
        .insert(5, json!({"role": "tool", "content": "extra"}));
    assert_single_violation(
        Protocol::Ollama,
        &body,
        "more tool messages than the tool calls of messages[2]",
    );
}

#[test]
fn ollama_arguments_must_be_objects() {
    let mut body = ollama_valid();
    body["messages"][2]["tool_calls"][1]["function"]["arguments"] = json!("{\"city\":\"Rome\"}");
    assert_single_violation(Protocol::Ollama, &body, "must be a JSON object");
}

// ---------------------------------------------------------------- shared

#[test]
fn bodies_that_are_not_conversations_are_violations() {
    for protocol in [Protocol::OpenAi, Protocol::Anthropic, Protocol::Ollama] {
        assert_single_violation(protocol, &json!("plain text"), "not a JSON object");
    }
    assert_single_violation(
        Protocol::OpenAi,
        &json!({"model": "m"}),
        "`messages` is missing",
    );
}

#[tokio::test]
async fn mock_checks_every_recorded_request_and_reports_its_index() {
    let mock = MockProvider::start().await.expect("start mock");
    mock.set_fallback(Reply::raw(200, vec![], "{}"));
    let client = http_client();
    let mut bad_anthropic = anthropic_valid();
    bad_anthropic
        .as_object_mut()
        .expect("object")
        .remove("max_tokens");
    let posts = [
        (
            format!("{}/chat/completions", mock.openai_base_url()),
            openai_valid(),
        ),
        (
            format!("{}/v1/embeddings", mock.base_url()),
            json!("unchecked: no protocol"),
        ),
        (
            format!("{}/messages", mock.anthropic_base_url()),
            bad_anthropic,
        ),
        (
            format!("{}/api/chat", mock.ollama_base_url()),
            ollama_valid(),
        ),
    ];
    for (url, body) in &posts {
        client.post(url).json(body).send().await.expect("send");
    }
    let violations = mock.check_protocol().expect_err("one request is invalid");
    assert_eq!(violations.len(), 1, "{violations:?}");
    assert_eq!(violations[0].request_index, 2);
    assert_eq!(violations[0].protocol, Protocol::Anthropic);
    assert_eq!(
        violations[0].to_string(),
        "request 2 (anthropic): `max_tokens` is required"
    );

    let clean = MockProvider::start().await.expect("start mock");
    clean.set_fallback(Reply::raw(200, vec![], "{}"));
    client
        .post(format!("{}/api/chat", clean.ollama_base_url()))
        .json(&ollama_valid())
        .send()
        .await
        .expect("send");
    assert_eq!(clean.check_protocol(), Ok(()));
}
