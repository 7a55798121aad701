//! The Responses API protocol against the mock: streamed text with usage, encrypted reasoning
//! kept and sent back byte for byte, parallel calls with arguments in pieces, images as
//! `input_image`, a length stop, and typed errors (an HTTP error body, an `error` event, a
//! malformed event).

use agentry_llm::{CancellationToken, LlmError, ModelClient, ModelRequest, Protocol};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::{
    AssistantPart, ContentPart, ImageSource, Message, StopReason, Thinking, ToolResult, ToolSpec,
};
use serde_json::json;

use super::support::{client, stream_outcome};

const RESPONSES: Protocol = Protocol::OpenAiResponses;

#[tokio::test]
async fn streamed_text_comes_with_its_usage_and_id() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("Hello from the Responses API.").with_usage(12, 6),
    ));
    let client = client(&mock, RESPONSES);
    let outcome = stream_outcome(&client, ModelRequest::new(vec![Message::user("Hi")])).await;
    let response = outcome.response().clone();
    assert_eq!(response.text(), "Hello from the Responses API.");
    let deltas = outcome
        .events
        .iter()
        .filter(|event| matches!(event, agentry_types::ModelEvent::TextDelta { .. }))
        .count();
    assert!(deltas >= 2, "{:?}", outcome.events);
    assert_eq!(outcome.streamed_text(), "Hello from the Responses API.");
    assert_eq!(response.usage.input_tokens, 12);
    assert_eq!(response.usage.output_tokens, 6);
    assert_eq!(response.id.as_deref(), Some("resp_mock0"));
    assert_eq!(response.stop_reason, StopReason::EndTurn);
    let requests = mock.requests();
    assert_eq!(requests[0].path, "/v1/responses");
    assert_eq!(requests[0].body["store"], false);
    assert_eq!(requests[0].body["stream"], true);
    assert_eq!(
        requests[0].body["input"],
        json!([{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}])
    );
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn encrypted_reasoning_is_sent_back_byte_for_byte_with_parallel_calls() {
    for streamed in [true, false] {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(
            ScriptedTurn::tool_call("get_weather", json!({"city": "Paris"}))
                .with_tool_call("get_weather", json!({"city": "Oslo"}))
                .with_thinking("Two cities to look up.", "gAAAA-encrypted+/=")
                .with_usage(20, 8),
        ));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("Sunny and cold.")));
        let client = client(&mock, RESPONSES);
        let tools = vec![ToolSpec::new(
            "get_weather",
            "Weather for a city",
            json!({"type": "object", "properties": {"city": {"type": "string"}}}),
        )];
        let ask = |messages: Vec<Message>| {
            let client = client.clone();
            let request = ModelRequest::new(messages).with_tools(tools.clone());
            async move {
                if streamed {
                    stream_outcome(&client, request).await.result
                } else {
                    client.complete(request, CancellationToken::new()).await
                }
            }
        };
        let mut messages = vec![Message::system("Be brief."), Message::user("Weather?")];
        let first = ask(messages.clone()).await.unwrap();
        assert_eq!(
            first.stop_reason,
            StopReason::ToolUse,
            "streamed={streamed}"
        );
        assert_eq!(first.thinking(), "Two cities to look up.");
        let calls = first.tool_calls();
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].arguments, json!({"city": "Paris"}));
        assert_eq!(calls[1].arguments, json!({"city": "Oslo"}));
        assert!(matches!(
            &first.content[0],
            AssistantPart::Thinking(Thinking::Text {
                signature: Some(_),
                ..
            })
        ));
        messages.push(first.to_message());
        for (call, result) in calls.iter().zip(["sunny", "cold"]) {
            messages.push(Message::Tool(ToolResult::text(call.id.clone(), result)));
        }
        let second = ask(messages).await.unwrap();
        assert_eq!(second.text(), "Sunny and cold.");
        mock.check_protocol()
            .unwrap_or_else(|violations| panic!("streamed={streamed}: {violations:?}"));
        let sent = &mock.requests()[1].body;
        let input = sent["input"].as_array().unwrap();
        let reasoning = input
            .iter()
            .find(|item| item["type"] == "reasoning")
            .unwrap_or_else(|| panic!("{sent}"));
        assert_eq!(reasoning["encrypted_content"], "gAAAA-encrypted+/=");
        assert_eq!(reasoning["id"], "rs_mock0");
        assert_eq!(
            reasoning["summary"],
            json!([{"type": "summary_text", "text": "Two cities to look up."}])
        );
        let kinds: Vec<&str> = input
            .iter()
            .map(|item| item["type"].as_str().unwrap_or("message"))
            .collect();
        assert_eq!(
            kinds,
            [
                "message",
                "message",
                "reasoning",
                "function_call",
                "function_call",
                "function_call_output",
                "function_call_output"
            ],
            "{sent}"
        );
        assert_eq!(sent["include"], json!(["reasoning.encrypted_content"]));
        assert_eq!(sent["tools"][0]["name"], "get_weather");
    }
}

#[tokio::test]
async fn images_go_as_input_image_and_a_length_stop_is_max_tokens() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("A cat, sitting").with_stop_reason("max_output_tokens"),
    ));
    let client = client(&mock, RESPONSES);
    let message = Message::User {
        content: vec![
            ContentPart::text("What is this?"),
            ContentPart::Image {
                source: ImageSource::Base64 {
                    media_type: "image/png".into(),
                    data: "iVBORw0KGgo=".into(),
                },
            },
        ],
    };
    let mut request = ModelRequest::new(vec![message]);
    request.params.max_tokens = Some(3);
    let response = client
        .complete(request, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(response.stop_reason, StopReason::MaxTokens);
    assert_eq!(response.text(), "A cat, sitting");
    let sent = &mock.requests()[0].body;
    assert_eq!(sent["max_output_tokens"], 3);
    assert_eq!(
        sent["input"][0]["content"][1],
        json!({"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="})
    );
}

#[tokio::test]
async fn errors_are_typed() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::error(
        400,
        json!({"error": {"message": "Invalid input: reasoning item missing", "type": "invalid_request_error", "code": "invalid_value"}}),
    ));
    let sse = |body: &str| {
        Reply::raw(
            200,
            vec![("content-type".into(), "text/event-stream".into())],
            body.to_owned(),
        )
    };
    mock.enqueue(sse(
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_1\"}}\n\n\
         event: response.failed\ndata: {\"type\":\"response.failed\",\"response\":{\"id\":\"resp_1\",\"status\":\"failed\",\"error\":{\"code\":\"invalid_prompt\",\"message\":\"The prompt was refused.\"}}}\n\n",
    ));
    mock.enqueue(sse("event: response.created\ndata: {not json\n\n"));
    let client = client(&mock, RESPONSES);
    let request = || ModelRequest::new(vec![Message::user("Hi")]);
    let first = client
        .complete(request(), CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        first.to_string().contains("reasoning item missing"),
        "{first}"
    );
    assert!(matches!(first, LlmError::Provider(_)), "{first:?}");
    let second = stream_outcome(&client, request()).await.result.unwrap_err();
    assert!(
        second.to_string().contains("The prompt was refused."),
        "{second}"
    );
    let third = stream_outcome(&client, request()).await.result.unwrap_err();
    assert!(
        matches!(third, LlmError::MalformedResponse { .. }),
        "{third:?}"
    );
}
