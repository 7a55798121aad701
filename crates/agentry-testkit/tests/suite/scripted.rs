//! Scripted turns rendered in the OpenAI, Anthropic and Ollama protocols, streamed and not;
//! each test parses the wire output and reassembles what a client would see.

use std::collections::BTreeMap;

use agentry_testkit::{MockProvider, Reply, ScriptedToolCall, ScriptedTurn};
use serde_json::{Value, json};

use super::client::http_client;
use super::wire::{parse_ndjson, parse_sse};

const THINKING: &str = "The user wants the weather in two cities, so I call the tool twice.";
const SIGNATURE: &str = "EqQBCkYIARgCIkB0c2lnbmF0dXJl";
const TEXT: &str = "Let me check the weather in both cities.";

/// Thinking, text and two tool calls (one with a generated id, one explicit, non-ASCII args).
fn rich_turn() -> ScriptedTurn {
    ScriptedTurn::text(TEXT)
        .with_thinking(THINKING, SIGNATURE)
        .with_tool_call("get_weather", json!({"city": "Paris", "units": "c"}))
        .with_scripted_call(
            ScriptedToolCall::new("get_time", json!({"city": "Zürich"})).with_id("call_explicit"),
        )
        .with_usage(120, 45)
}

struct Served {
    status: u16,
    content_type: String,
    body: String,
}

async fn serve(turn: ScriptedTurn, path: &str, request: Value) -> Served {
    let mock = MockProvider::start().await.expect("start mock");
    mock.enqueue(Reply::scripted(turn));
    let response = http_client()
        .post(format!("{}{path}", mock.base_url()))
        .json(&request)
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.text().await.expect("body");
    Served {
        status,
        content_type,
        body,
    }
}

/// A reassembled tool call: id, name, concatenated arguments, number of argument fragments.
#[derive(Debug, Default)]
struct StreamedCall {
    id: String,
    name: String,
    arguments: String,
    fragments: usize,
}

// ---------------------------------------------------------------- OpenAI

#[derive(Debug, Default)]
struct OpenAiStream {
    role: Option<String>,
    reasoning: String,
    content: String,
    content_fragments: usize,
    calls: BTreeMap<u64, StreamedCall>,
    finish_reason: Option<String>,
    usage: Option<Value>,
}

fn reassemble_openai(body: &str) -> OpenAiStream {
    let events = parse_sse(body);
    assert_eq!(
        events.last().map(|e| e.data.as_str()),
        Some("[DONE]"),
        "must end with [DONE]"
    );
    let mut stream = OpenAiStream::default();
    for event in &events[..events.len() - 1] {
        assert!(event.event.is_none());
        let chunk = event.json();
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            assert_eq!(chunk["choices"], json!([]), "usage chunk has no choices");
            stream.usage = Some(usage.clone());
        }
        let Some(choice) = chunk["choices"].get(0) else {
            continue;
        };
        let delta = &choice["delta"];
        if let Some(role) = delta["role"].as_str() {
            assert!(stream.role.is_none(), "role sent twice");
            stream.role = Some(role.to_owned());
        }
        if let Some(reasoning) = delta["reasoning_content"].as_str() {
            stream.reasoning.push_str(reasoning);
        }
        if let Some(content) = delta["content"].as_str().filter(|c| !c.is_empty()) {
            stream.content.push_str(content);
            stream.content_fragments += 1;
        }
        for call in delta["tool_calls"].as_array().into_iter().flatten() {
            let index = call["index"].as_u64().expect("tool call index");
            let entry = stream.calls.entry(index).or_default();
            if let Some(id) = call["id"].as_str() {
                assert_eq!(call["type"], "function");
                assert_eq!(
                    call["function"]["arguments"], "",
                    "first delta has empty arguments"
                );
                entry.id = id.to_owned();
                entry.name = call["function"]["name"].as_str().expect("name").to_owned();
            } else if let Some(fragment) = call["function"]["arguments"].as_str() {
                entry.arguments.push_str(fragment);
                entry.fragments += 1;
            }
        }
        if let Some(reason) = choice["finish_reason"].as_str() {
            stream.finish_reason = Some(reason.to_owned());
        }
    }
    stream
}

#[tokio::test]
async fn openai_stream_reassembles_thinking_text_tool_calls_and_usage() {
    let request = json!({
        "model": "gpt-4o", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "Weather in Paris and Zürich?"}],
    });
    let served = serve(rich_turn(), "/v1/chat/completions", request).await;
    assert_eq!(served.status, 200);
    assert!(served.content_type.starts_with("text/event-stream"));
    let stream = reassemble_openai(&served.body);
    assert_eq!(stream.role.as_deref(), Some("assistant"));
    assert_eq!(stream.reasoning, THINKING);
    assert_eq!(stream.content, TEXT);
    assert!(
        stream.content_fragments >= 2,
        "text must be split into several deltas"
    );
    assert_eq!(stream.calls.len(), 2);
    let first = &stream.calls[&0];
    assert_eq!(
        (first.id.as_str(), first.name.as_str()),
        ("call_1", "get_weather")
    );
    assert!(first.fragments >= 2, "arguments must be split");
    let first_args: Value = serde_json::from_str(&first.arguments).expect("json arguments");
    assert_eq!(first_args, json!({"city": "Paris", "units": "c"}));
    let second = &stream.calls[&1];
    assert_eq!(
        (second.id.as_str(), second.name.as_str()),
        ("call_explicit", "get_time")
    );
    let second_args: Value = serde_json::from_str(&second.arguments).expect("json arguments");
    assert_eq!(second_args, json!({"city": "Zürich"}));
    assert_eq!(stream.finish_reason.as_deref(), Some("tool_calls"));
    let usage = stream.usage.expect("usage chunk");
    assert_eq!(
        usage,
        json!({"prompt_tokens": 120, "completion_tokens": 45, "total_tokens": 165})
    );
    assert!(
        served.body.contains(r#""model":"gpt-4o""#),
        "model is echoed"
    );
}

#[tokio::test]
async fn openai_stream_without_include_usage_sends_no_usage_chunk() {
    let request = json!({"model": "gpt-4o", "stream": true, "messages": []});
    let served = serve(
        ScriptedTurn::text("Hello there!"),
        "/v1/chat/completions",
        request,
    )
    .await;
    let stream = reassemble_openai(&served.body);
    assert_eq!(stream.content, "Hello there!");
    assert_eq!(stream.finish_reason.as_deref(), Some("stop"));
    assert!(stream.usage.is_none());
    assert!(stream.calls.is_empty());
}

#[tokio::test]
async fn openai_non_stream_is_a_chat_completion() {
    let request = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let served = serve(rich_turn(), "/v1/chat/completions", request).await;
    assert_eq!(served.content_type, "application/json");
    let completion: Value = serde_json::from_str(&served.body).expect("json");
    assert_eq!(completion["object"], "chat.completion");
    let choice = &completion["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let message = &choice["message"];
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"], TEXT);
    assert_eq!(message["reasoning_content"], THINKING);
    let calls = message["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["id"], "call_1");
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments = calls[0]["function"]["arguments"]
        .as_str()
        .expect("arguments are a string");
    assert_eq!(
        serde_json::from_str::<Value>(arguments).expect("json"),
        json!({"city": "Paris", "units": "c"})
    );
    assert_eq!(calls[1]["id"], "call_explicit");
    assert_eq!(
        completion["usage"],
        json!({"prompt_tokens": 120, "completion_tokens": 45, "total_tokens": 165})
    );
}

#[tokio::test]
async fn openai_tool_only_turn_has_null_content_and_text_turn_has_no_tool_calls() {
    let served = serve(
        ScriptedTurn::tool_call("lookup", json!({})),
        "/v1/chat/completions",
        json!({"stream": false}),
    )
    .await;
    let completion: Value = serde_json::from_str(&served.body).expect("json");
    assert!(completion["choices"][0]["message"]["content"].is_null());
    assert_eq!(
        completion["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        "{}"
    );

    let served = serve(
        ScriptedTurn::text("done"),
        "/v1/chat/completions",
        json!({}),
    )
    .await;
    let completion: Value = serde_json::from_str(&served.body).expect("json");
    assert_eq!(completion["choices"][0]["finish_reason"], "stop");
    assert!(
        completion["choices"][0]["message"]
            .get("tool_calls")
            .is_none()
    );
    assert_eq!(
        completion["model"], "mock-model",
        "default model when the request names none"
    );
}

// ---------------------------------------------------------------- Anthropic

#[derive(Debug, Default)]
struct AnthropicBlock {
    kind: String,
    id: String,
    name: String,
    text: String,
    thinking: String,
    signature: String,
    partial_json: Vec<String>,
    fragments: usize,
    stopped: bool,
}

#[derive(Debug, Default)]
struct AnthropicStream {
    input_tokens: Option<u64>,
    blocks: Vec<AnthropicBlock>,
    pings: usize,
    stop_reason: Option<String>,
    output_tokens: Option<u64>,
    event_names: Vec<String>,
}

fn reassemble_anthropic(body: &str) -> AnthropicStream {
    let mut stream = AnthropicStream::default();
    for event in parse_sse(body) {
        let name = event
            .event
            .clone()
            .expect("every Anthropic SSE message names its event");
        let data = event.json();
        assert_eq!(data["type"], name.as_str(), "event name matches data.type");
        stream.event_names.push(name.clone());
        let index = data["index"]
            .as_u64()
            .map(|i| usize::try_from(i).expect("index"));
        match name.as_str() {
            "message_start" => {
                assert_eq!(data["message"]["role"], "assistant");
                stream.input_tokens = data["message"]["usage"]["input_tokens"].as_u64();
            }
            "content_block_start" => {
                let index = index.expect("index");
                assert_eq!(index, stream.blocks.len(), "blocks are numbered in order");
                let block = &data["content_block"];
                stream.blocks.push(AnthropicBlock {
                    kind: block["type"].as_str().expect("type").to_owned(),
                    id: block["id"].as_str().unwrap_or_default().to_owned(),
                    name: block["name"].as_str().unwrap_or_default().to_owned(),
                    ..AnthropicBlock::default()
                });
                if block["type"] == "tool_use" {
                    assert_eq!(block["input"], json!({}));
                }
            }
            "content_block_delta" => {
                let block = &mut stream.blocks[index.expect("index")];
                assert!(!block.stopped);
                let delta = &data["delta"];
                match delta["type"].as_str().expect("delta type") {
                    "text_delta" => {
                        block.text.push_str(delta["text"].as_str().expect("text"));
                        block.fragments += 1;
                    }
                    "thinking_delta" => {
                        block
                            .thinking
                            .push_str(delta["thinking"].as_str().expect("thinking"));
                        block.fragments += 1;
                    }
                    "signature_delta" => {
                        block
                            .signature
                            .push_str(delta["signature"].as_str().expect("signature"));
                    }
                    "input_json_delta" => block.partial_json.push(
                        delta["partial_json"]
                            .as_str()
                            .expect("partial_json")
                            .to_owned(),
                    ),
                    other => panic!("unexpected delta type {other}"),
                }
            }
            "content_block_stop" => stream.blocks[index.expect("index")].stopped = true,
            "ping" => stream.pings += 1,
            "message_delta" => {
                stream.stop_reason = data["delta"]["stop_reason"].as_str().map(str::to_owned);
                stream.output_tokens = data["usage"]["output_tokens"].as_u64();
            }
            "message_stop" => {}
            other => panic!("unexpected event {other}"),
        }
    }
    stream
}

#[tokio::test]
async fn anthropic_stream_reassembles_thinking_text_tool_use_and_usage() {
    let request = json!({
        "model": "claude-sonnet-4-0", "max_tokens": 1024, "stream": true,
        "messages": [{"role": "user", "content": "Weather?"}],
    });
    let served = serve(rich_turn(), "/v1/messages", request).await;
    assert_eq!(served.status, 200);
    assert!(served.content_type.starts_with("text/event-stream"));
    let stream = reassemble_anthropic(&served.body);
    assert_eq!(
        stream.event_names.first().map(String::as_str),
        Some("message_start")
    );
    assert_eq!(
        stream.event_names.last().map(String::as_str),
        Some("message_stop")
    );
    assert_eq!(stream.pings, 1);
    assert_eq!(stream.input_tokens, Some(120));
    let kinds: Vec<&str> = stream.blocks.iter().map(|b| b.kind.as_str()).collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use", "tool_use"]);
    assert!(
        stream.blocks.iter().all(|b| b.stopped),
        "every block is stopped"
    );

    let thinking = &stream.blocks[0];
    assert_eq!(thinking.thinking, THINKING);
    assert!(thinking.fragments >= 2);
    assert_eq!(thinking.signature, SIGNATURE);

    let text = &stream.blocks[1];
    assert_eq!(text.text, TEXT);
    assert!(text.fragments >= 2);

    for (block, (id, name, input)) in stream.blocks[2..].iter().zip([
        (
            "toolu_1",
            "get_weather",
            json!({"city": "Paris", "units": "c"}),
        ),
        ("call_explicit", "get_time", json!({"city": "Zürich"})),
    ]) {
        assert_eq!((block.id.as_str(), block.name.as_str()), (id, name));
        assert_eq!(block.partial_json[0], "", "first partial_json is empty");
        assert!(
            block.partial_json.len() >= 3,
            "JSON split into 2+ fragments after the empty one"
        );
        let parsed: Value = serde_json::from_str(&block.partial_json.concat()).expect("json input");
        assert_eq!(parsed, input);
    }
    assert_eq!(stream.stop_reason.as_deref(), Some("tool_use"));
    assert_eq!(stream.output_tokens, Some(45));
}

#[tokio::test]
async fn anthropic_non_stream_is_a_message() {
    let request = json!({"model": "claude-sonnet-4-0", "max_tokens": 1024, "messages": []});
    let served = serve(rich_turn(), "/v1/messages", request).await;
    assert_eq!(served.content_type, "application/json");
    let message: Value = serde_json::from_str(&served.body).expect("json");
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["model"], "claude-sonnet-4-0");
    assert_eq!(message["stop_reason"], "tool_use");
    assert_eq!(message["usage"]["input_tokens"], 120);
    assert_eq!(message["usage"]["output_tokens"], 45);
    let content = message["content"].as_array().expect("content");
    assert_eq!(content.len(), 4);
    assert_eq!(
        content[0],
        json!({"type": "thinking", "thinking": THINKING, "signature": SIGNATURE})
    );
    assert_eq!(content[1], json!({"type": "text", "text": TEXT}));
    assert_eq!(
        content[2],
        json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris", "units": "c"}})
    );
    assert_eq!(content[3]["id"], "call_explicit");
}

#[tokio::test]
async fn anthropic_text_turn_ends_the_turn() {
    let request = json!({"max_tokens": 10, "stream": true, "messages": []});
    let served = serve(
        ScriptedTurn::text("Hi there").with_usage(3, 2),
        "/v1/messages",
        request,
    )
    .await;
    let stream = reassemble_anthropic(&served.body);
    assert_eq!(stream.blocks.len(), 1);
    assert_eq!(stream.blocks[0].text, "Hi there");
    assert_eq!(stream.stop_reason.as_deref(), Some("end_turn"));
    assert_eq!(stream.pings, 1);
}

// ---------------------------------------------------------------- Ollama

#[derive(Debug, Default)]
struct OllamaStream {
    thinking: String,
    content: String,
    content_fragments: usize,
    tool_calls: Vec<Value>,
    done_reason: Option<String>,
    prompt_eval_count: Option<u64>,
    eval_count: Option<u64>,
}

fn reassemble_ollama(body: &str) -> OllamaStream {
    let lines = parse_ndjson(body);
    let (last, rest) = lines.split_last().expect("at least one line");
    assert_eq!(last["done"], true);
    let mut stream = OllamaStream::default();
    for line in rest {
        assert_eq!(line["done"], false);
        let message = &line["message"];
        assert_eq!(message["role"], "assistant");
        if let Some(thinking) = message["thinking"].as_str() {
            stream.thinking.push_str(thinking);
        }
        if let Some(content) = message["content"].as_str().filter(|c| !c.is_empty()) {
            stream.content.push_str(content);
            stream.content_fragments += 1;
        }
        if let Some(calls) = message["tool_calls"].as_array() {
            stream.tool_calls.extend(calls.iter().cloned());
        }
    }
    stream.done_reason = last["done_reason"].as_str().map(str::to_owned);
    stream.prompt_eval_count = last["prompt_eval_count"].as_u64();
    stream.eval_count = last["eval_count"].as_u64();
    stream
}

#[tokio::test]
async fn ollama_streams_ndjson_by_default() {
    let request = json!({"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]});
    let served = serve(rich_turn(), "/api/chat", request).await;
    assert_eq!(served.status, 200);
    assert_eq!(served.content_type, "application/x-ndjson");
    let stream = reassemble_ollama(&served.body);
    assert_eq!(stream.thinking, THINKING);
    assert_eq!(stream.content, TEXT);
    assert!(stream.content_fragments >= 2);
    assert_eq!(
        stream.tool_calls,
        [
            json!({"function": {"name": "get_weather", "arguments": {"city": "Paris", "units": "c"}}}),
            json!({"function": {"name": "get_time", "arguments": {"city": "Zürich"}}}),
        ],
        "whole calls, object arguments, no ids"
    );
    assert_eq!(stream.done_reason.as_deref(), Some("stop"));
    assert_eq!(stream.prompt_eval_count, Some(120));
    assert_eq!(stream.eval_count, Some(45));
}

#[tokio::test]
async fn ollama_non_stream_is_one_done_object() {
    let request = json!({"model": "llama3.2", "stream": false, "messages": []});
    let served = serve(rich_turn(), "/api/chat", request).await;
    assert!(served.content_type.starts_with("application/json"));
    let reply: Value = serde_json::from_str(&served.body).expect("one JSON object");
    assert_eq!(reply["done"], true);
    assert_eq!(reply["model"], "llama3.2");
    assert_eq!(reply["message"]["content"], TEXT);
    assert_eq!(reply["message"]["thinking"], THINKING);
    assert_eq!(
        reply["message"]["tool_calls"][1]["function"]["arguments"]["city"],
        "Zürich"
    );
    assert!(reply["message"]["tool_calls"][0].get("id").is_none());
    assert_eq!(reply["done_reason"], "stop");
    assert_eq!(reply["prompt_eval_count"], 120);
    assert_eq!(reply["eval_count"], 45);
}

#[tokio::test]
async fn ollama_generate_streams_response_fragments() {
    let served = serve(
        ScriptedTurn::text("Why yes, it is."),
        "/api/generate",
        json!({"prompt": "?"}),
    )
    .await;
    let lines = parse_ndjson(&served.body);
    let text: String = lines
        .iter()
        .filter_map(|l| l["response"].as_str())
        .collect();
    assert_eq!(text, "Why yes, it is.");
    assert!(lines.len() >= 3);
    assert_eq!(lines.last().expect("last")["done"], true);
}

// ---------------------------------------------------------------- all protocols

#[tokio::test]
async fn stop_reason_override_is_used_verbatim() {
    let openai = serve(
        ScriptedTurn::text("cut").with_stop_reason("length"),
        "/v1/chat/completions",
        json!({"stream": true}),
    )
    .await;
    assert_eq!(
        reassemble_openai(&openai.body).finish_reason.as_deref(),
        Some("length")
    );

    let anthropic = serve(
        ScriptedTurn::tool_call("f", json!({"a": 1})).with_stop_reason("max_tokens"),
        "/v1/messages",
        json!({"stream": true, "max_tokens": 5}),
    )
    .await;
    assert_eq!(
        reassemble_anthropic(&anthropic.body).stop_reason.as_deref(),
        Some("max_tokens")
    );

    let ollama = serve(
        ScriptedTurn::text("cut").with_stop_reason("length"),
        "/api/chat",
        json!({}),
    )
    .await;
    assert_eq!(
        reassemble_ollama(&ollama.body).done_reason.as_deref(),
        Some("length")
    );
}

#[tokio::test]
async fn the_same_scripted_reply_follows_each_requests_protocol() {
    let mock = MockProvider::start().await.expect("start mock");
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("same words")));
    let client = http_client();
    let urls = [
        (
            format!("{}/chat/completions", mock.openai_base_url()),
            "text/event-stream",
        ),
        (
            format!("{}/messages", mock.anthropic_base_url()),
            "text/event-stream",
        ),
        (
            format!("{}/api/chat", mock.ollama_base_url()),
            "application/x-ndjson",
        ),
    ];
    for (url, content_type) in urls {
        let response = client
            .post(&url)
            .json(&json!({"stream": true, "max_tokens": 5}))
            .send()
            .await
            .expect("send");
        let returned = response.headers()["content-type"]
            .to_str()
            .expect("ascii")
            .to_owned();
        assert!(returned.starts_with(content_type), "{url}: {returned}");
    }
}

#[tokio::test]
async fn scripted_reply_on_a_path_without_protocol_is_a_mock_error() {
    let served = serve(ScriptedTurn::text("hi"), "/v1/embeddings", json!({})).await;
    assert_eq!(served.status, 500);
    let body: Value = serde_json::from_str(&served.body).expect("json");
    assert_eq!(body["error"]["type"], "mock_error");
}
