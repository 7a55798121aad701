//! What each adapter sends: snapshots of the request for a conversation with a system prompt,
//! an image, tool calls, tool results and thinking, plus the testkit's protocol checks on it.

use agentry_llm::{
    GenerationParams, HttpModelClient, ModelRequest, Protocol, ProviderConfig, ThinkingConfig,
    encode_request,
};
use agentry_testkit::check_request;
use agentry_types::{
    AssistantPart, ContentPart, ImageSource, Message, Thinking, ToolCall, ToolResult,
    ToolResultPart, ToolSpec,
};
use serde_json::json;

fn weather_tool() -> ToolSpec {
    ToolSpec::new(
        "get_weather",
        "Current weather for a city",
        json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        }),
    )
}

/// A conversation exercising every part type.
fn conversation(inline_image: bool) -> ModelRequest {
    let image = if inline_image {
        ImageSource::Base64 {
            media_type: "image/png".into(),
            data: "iVBORw0KGgo=".into(),
        }
    } else {
        ImageSource::Url {
            url: "https://example.com/paris.jpg".into(),
        }
    };
    ModelRequest::new(vec![
        Message::system("You are a weather assistant."),
        Message::User {
            content: vec![
                ContentPart::text("What is the weather where this photo was taken?"),
                ContentPart::Image { source: image },
            ],
        },
        Message::Assistant {
            content: vec![
                AssistantPart::Thinking(Thinking::Text {
                    text: "The photo shows the Eiffel Tower, so Paris.".into(),
                    signature: Some("c2lnbmF0dXJlLWJ5dGVz".into()),
                }),
                AssistantPart::Thinking(Thinking::Redacted {
                    data: "ZW5jcnlwdGVk".into(),
                }),
                AssistantPart::Text {
                    text: "Let me check Paris.".into(),
                },
                AssistantPart::ToolCall(ToolCall::new(
                    "call_1",
                    "get_weather",
                    json!({"city": "Paris"}),
                )),
                AssistantPart::ToolCall(ToolCall::new(
                    "call_2",
                    "get_weather",
                    json!({"city": "Lyon"}),
                )),
            ],
        },
        Message::Tool(ToolResult {
            call_id: "call_1".into(),
            name: Some("get_weather".into()),
            content: vec![ToolResultPart::Json {
                value: json!({"temp_c": 18, "sky": "clear"}),
            }],
            is_error: false,
        }),
        Message::Tool(ToolResult {
            name: Some("get_weather".into()),
            ..ToolResult::error("call_2", "weather service timed out")
        }),
        Message::user("And tomorrow?"),
    ])
    .with_tools(vec![weather_tool()])
    .with_params(GenerationParams {
        max_tokens: Some(1024),
        temperature: Some(0.5),
        stop: vec!["END".into()],
        ..GenerationParams::default()
    })
}

fn config(protocol: Protocol) -> ProviderConfig {
    ProviderConfig::new(protocol, "test-model").with_base_url("http://127.0.0.1:9")
}

fn testkit_protocol(protocol: Protocol) -> agentry_testkit::Protocol {
    match protocol {
        Protocol::OpenAi => agentry_testkit::Protocol::OpenAi,
        Protocol::OpenAiResponses => agentry_testkit::Protocol::OpenAiResponses,
        Protocol::Anthropic => agentry_testkit::Protocol::Anthropic,
        Protocol::Ollama => agentry_testkit::Protocol::Ollama,
        Protocol::A2a => {
            panic!("the mock speaks model APIs, not A2A (the HTTP crate's suite/a2a.rs)")
        }
    }
}

fn encode_checked(protocol: Protocol, request: &ModelRequest, stream: bool) -> serde_json::Value {
    let body = encode_request(&config(protocol), request, stream).expect("encodes");
    let violations = check_request(testkit_protocol(protocol), &body);
    assert!(violations.is_empty(), "{protocol:?}: {violations:?}");
    body
}

#[test]
fn openai_request() {
    insta::assert_json_snapshot!(encode_checked(Protocol::OpenAi, &conversation(true), true));
}

#[test]
fn anthropic_request() {
    let mut request = conversation(false);
    request.params.thinking = Some(ThinkingConfig {
        budget_tokens: Some(2048),
        effort: None,
    });
    request.params.max_tokens = None;
    insta::assert_json_snapshot!(encode_checked(Protocol::Anthropic, &request, true));
}

#[test]
fn ollama_request() {
    let mut request = conversation(true);
    request.params.thinking = Some(ThinkingConfig {
        budget_tokens: None,
        effort: None,
    });
    insta::assert_json_snapshot!(encode_checked(Protocol::Ollama, &request, true));
}

#[test]
fn non_streaming_requests_say_so() {
    let request = conversation(true);
    let openai = encode_checked(Protocol::OpenAi, &request, false);
    assert_eq!(openai["stream"], json!(false));
    assert!(openai.get("stream_options").is_none());
    let anthropic = encode_checked(Protocol::Anthropic, &request, false);
    assert!(anthropic.get("stream").is_none());
    let ollama = encode_checked(Protocol::Ollama, &request, false);
    assert_eq!(ollama["stream"], json!(false));
}

#[test]
fn anthropic_gets_a_default_max_tokens_above_the_thinking_budget() {
    let mut request = ModelRequest::new(vec![Message::user("hi")]);
    let body = encode_checked(Protocol::Anthropic, &request, true);
    assert_eq!(
        body["max_tokens"],
        json!(agentry_llm::provider::anthropic::DEFAULT_MAX_TOKENS)
    );
    request.params.thinking = Some(ThinkingConfig {
        budget_tokens: Some(16_000),
        effort: None,
    });
    let body = encode_checked(Protocol::Anthropic, &request, true);
    assert!(body["max_tokens"].as_u64().unwrap() > 16_000);
}

#[test]
fn unsigned_thinking_is_not_sent_to_anthropic_but_replayed_to_deepseek_when_asked() {
    let request = ModelRequest::new(vec![
        Message::user("hi"),
        Message::Assistant {
            content: vec![
                AssistantPart::Thinking(Thinking::Text {
                    text: "from another provider".into(),
                    signature: None,
                }),
                AssistantPart::Text {
                    text: "hello".into(),
                },
            ],
        },
        Message::user("again"),
    ]);
    let anthropic = encode_checked(Protocol::Anthropic, &request, true);
    assert_eq!(
        anthropic["messages"][1]["content"],
        json!([{"type": "text", "text": "hello"}])
    );

    let openai = encode_checked(Protocol::OpenAi, &request, true);
    assert!(openai["messages"][1].get("reasoning_content").is_none());
    let mut deepseek = config(Protocol::OpenAi);
    deepseek.openai.replay_reasoning = true;
    let body = encode_request(&deepseek, &request, true).unwrap();
    assert_eq!(
        body["messages"][1]["reasoning_content"],
        json!("from another provider")
    );
}

#[test]
fn openai_max_tokens_field_depends_on_the_server() {
    let request = ModelRequest::new(vec![Message::user("hi")]).with_params(GenerationParams {
        max_tokens: Some(5),
        ..GenerationParams::default()
    });
    let openai = ProviderConfig::new(Protocol::OpenAi, "gpt-5-mini");
    let body = encode_request(&openai, &request, false).unwrap();
    assert_eq!(body["max_completion_tokens"], json!(5));
    let local = config(Protocol::OpenAi);
    let body = encode_request(&local, &request, false).unwrap();
    assert_eq!(body["max_tokens"], json!(5));
}

#[test]
fn unsupported_inputs_are_clear_configuration_errors() {
    let audio = ModelRequest::new(vec![Message::User {
        content: vec![ContentPart::Audio {
            format: "wav".into(),
            data: "UklGRg==".into(),
        }],
    }]);
    let error = encode_request(&config(Protocol::Anthropic), &audio, true).unwrap_err();
    assert_eq!(error.code(), agentry_types::ErrorCode::Configuration);
    let url_image = conversation(false);
    let error = encode_request(&config(Protocol::Ollama), &url_image, true).unwrap_err();
    assert!(error.to_string().contains("base64"));
    // OpenAI takes audio as input_audio.
    let body = encode_checked(Protocol::OpenAi, &audio, true);
    assert_eq!(
        body["messages"][0]["content"][0]["type"],
        json!("input_audio")
    );
}

#[test]
fn invalid_configuration_is_rejected_before_any_request() {
    for (base_url, model) in [("not a url", "m"), ("ftp://host", "m"), ("http://h", " ")] {
        let config = ProviderConfig::new(Protocol::OpenAi, model).with_base_url(base_url);
        let error = HttpModelClient::new(config).unwrap_err();
        assert_eq!(
            error.code(),
            agentry_types::ErrorCode::Configuration,
            "{base_url}"
        );
    }
    let key = agentry_llm::ApiKey::new("sk-secret");
    assert!(!format!("{key:?}").contains("secret"));
}

/// Chat completions take images only from the user: a tool result's image goes to a model that
/// takes images as a user message after the tool messages (one message for a round's results,
/// in order), and to other models not at all (their tool message shows a placeholder).
#[test]
fn tool_result_images_follow_as_a_user_message_for_models_that_take_images() {
    let chart = |data: &str| ToolResultPart::Image {
        source: ImageSource::Base64 {
            media_type: "image/png".into(),
            data: data.into(),
        },
    };
    let request = ModelRequest::new(vec![
        Message::user("Plot it."),
        Message::Assistant {
            content: vec![
                AssistantPart::ToolCall(ToolCall::new("c1", "run_code", json!({"code": "a"}))),
                AssistantPart::ToolCall(ToolCall::new("c2", "run_code", json!({"code": "b"}))),
            ],
        },
        Message::Tool(ToolResult {
            call_id: "c1".into(),
            name: None,
            content: vec![ToolResultPart::Text { text: "one".into() }, chart("AAAA")],
            is_error: false,
        }),
        Message::Tool(ToolResult {
            call_id: "c2".into(),
            name: None,
            content: vec![chart("BBBB")],
            is_error: false,
        }),
        Message::Assistant {
            content: vec![AssistantPart::Text {
                text: "Done.".into(),
            }],
        },
    ]);
    let mut seeing = config(Protocol::OpenAi);
    seeing.openai.tool_images_as_user = true;
    let body = encode_request(&seeing, &request, false).unwrap();
    let roles: Vec<&str> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "tool", "tool", "user", "assistant"]
    );
    let images = &body["messages"][4]["content"];
    assert_eq!(images[1]["image_url"]["url"], "data:image/png;base64,AAAA");
    assert_eq!(images[2]["image_url"]["url"], "data:image/png;base64,BBBB");
    assert_eq!(body["messages"][2]["content"], "one\n[image: image/png]");

    let blind = encode_request(&config(Protocol::OpenAi), &request, false).unwrap();
    assert_eq!(blind["messages"].as_array().unwrap().len(), 5);
    assert!(!blind.to_string().contains("image_url"));
}
