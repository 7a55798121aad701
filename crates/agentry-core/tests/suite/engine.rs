//! The tool loop end to end against the mock provider, in all three protocols.

use std::time::Duration;

use agentry_core::{RunLimits, RunRequest};
use agentry_testkit::{MockProvider, Reply, ScriptedToolCall, ScriptedTurn};
use agentry_types::{Message, RunEvent, RunStopReason};
use serde_json::json;

use super::support::{PROTOCOLS, ProbeTool, builder, limits, result_texts, run_collect};

#[tokio::test]
async fn a_two_round_tool_loop() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(
            ScriptedTurn::tool_call("lookup", json!({"id": 7})).with_usage(30, 5),
        ));
        mock.enqueue(Reply::scripted(
            ScriptedTurn::text("Item 7 is a teapot.").with_usage(50, 6),
        ));
        let tool = ProbeTool::lookup();
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap().limits(limits());
        let runtime = builder.build();
        let request = RunRequest::text("What is item 7?").with_system("Use tools.");
        let (events, output) = run_collect(&runtime, request).await;

        assert_eq!(output.stop_reason, RunStopReason::Completed, "{protocol:?}");
        assert_eq!(output.text, "Item 7 is a teapot.");
        assert_eq!(output.rounds, 2);
        assert_eq!(output.usage.input_tokens, 80);
        assert_eq!(output.usage.output_tokens, 11);
        assert_eq!(tool.executions().len(), 1);
        assert_eq!(tool.executions()[0].arguments, json!({"id": 7}));

        // Events: started, then round 1 (message, usage, tool), round 2, finished.
        assert!(matches!(events.first(), Some(RunEvent::RunStarted { .. })));
        let kinds: Vec<&str> = events
            .iter()
            .filter_map(|e| match e {
                RunEvent::AssistantMessage { .. } => Some("assistant"),
                RunEvent::ToolCallStarted { .. } => Some("tool_started"),
                RunEvent::ToolResult { .. } => Some("tool_result"),
                RunEvent::Usage { .. } => Some("usage"),
                RunEvent::RunFinished { .. } => Some("finished"),
                _ => None,
            })
            .collect();
        assert_eq!(
            kinds,
            [
                "assistant",
                "usage",
                "tool_started",
                "tool_result",
                "assistant",
                "usage",
                "finished"
            ]
        );
        assert!(
            events
                .iter()
                .any(|e| matches!(e, RunEvent::TextDelta { .. }))
        );
        match events.last() {
            Some(RunEvent::RunFinished {
                stop_reason,
                text,
                rounds,
                ..
            }) => {
                assert_eq!(*stop_reason, RunStopReason::Completed);
                assert_eq!(text, "Item 7 is a teapot.");
                assert_eq!(*rounds, 2);
            }
            other => panic!("{other:?}"),
        }
        // The second request carries the tool result; every request is a valid history.
        let requests = mock.requests();
        assert_eq!(requests.len(), 2);
        assert!(requests[1].body.to_string().contains("echo"));
        mock.check_protocol()
            .unwrap_or_else(|v| panic!("{protocol:?}: {v:?}"));
        // The final state holds the whole conversation.
        assert_eq!(output.state.messages.len(), 5);
        assert!(matches!(output.state.messages[0], Message::System { .. }));
    }
}

#[tokio::test]
async fn parallel_tool_calls_really_overlap() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        let mut turn = ScriptedTurn::default();
        for id in 0..3 {
            turn = turn.with_scripted_call(
                ScriptedToolCall::new("lookup", json!({"id": id})).with_id(format!("call_{id}")),
            );
        }
        mock.enqueue(Reply::scripted(turn));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("done")));
        let tool = ProbeTool::lookup().sleeping(Duration::from_millis(300));
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap().limits(limits());
        let (events, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
        assert_eq!(output.stop_reason, RunStopReason::Completed, "{protocol:?}");
        let runs = tool.executions();
        assert_eq!(runs.len(), 3);
        // Every call started before any call ended: they ran at the same time.
        let last_start = runs.iter().map(|r| r.started).max().unwrap();
        let first_end = runs.iter().map(|r| r.ended).min().unwrap();
        assert!(
            last_start < first_end,
            "{protocol:?}: calls did not overlap"
        );
        // Results reach the model in the order of the calls.
        let results: Vec<String> = output
            .state
            .messages
            .iter()
            .filter_map(|m| match m {
                Message::Tool(r) => Some(r.text_content()),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 3);
        for (id, text) in results.iter().enumerate() {
            assert!(text.contains(&format!("\"id\":{id}")), "{text}");
        }
        assert_eq!(result_texts(&events).len(), 3);
        mock.check_protocol().unwrap();
    }
}

#[tokio::test]
async fn parallelism_is_bounded() {
    let mock = MockProvider::start().await.unwrap();
    let mut turn = ScriptedTurn::default();
    for id in 0..6 {
        turn = turn.with_tool_call("lookup", json!({"id": id}));
    }
    mock.enqueue(Reply::scripted(turn));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("done")));
    let tool = ProbeTool::lookup().sleeping(Duration::from_millis(150));
    let mut builder = builder(&mock, agentry_llm::Protocol::OpenAi);
    builder.tool(tool.clone()).unwrap().limits(RunLimits {
        max_parallel_tools: 2,
        ..limits()
    });
    let (_, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
    assert_eq!(output.stop_reason, RunStopReason::Completed);
    let runs = tool.executions();
    assert_eq!(runs.len(), 6);
    // At no instant were more than two calls running.
    for probe in &runs {
        let overlapping = runs
            .iter()
            .filter(|r| r.started <= probe.started && probe.started < r.ended)
            .count();
        assert!(overlapping <= 2, "{overlapping} calls overlapped");
    }
}

#[tokio::test]
async fn invalid_arguments_are_corrected_by_the_model() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "lookup",
            json!({"id": "seven"}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "lookup",
            json!({"id": 7}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("Found it.")));
        let tool = ProbeTool::lookup();
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap().limits(limits());
        let (events, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
        assert_eq!(output.stop_reason, RunStopReason::Completed, "{protocol:?}");
        assert_eq!(output.text, "Found it.");
        // The tool ran once, with the corrected arguments.
        let runs = tool.executions();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].arguments, json!({"id": 7}));
        let results = result_texts(&events);
        assert!(results[0].1, "the first result is an error");
        assert!(
            results[0].0.contains("/id"),
            "the error names the path: {}",
            results[0].0
        );
        assert!(!results[1].1);
        // The model saw the error in its second request.
        assert!(mock.requests()[1].body.to_string().contains("/id"));
        mock.check_protocol().unwrap();
    }
}

#[tokio::test]
async fn an_unknown_tool_is_an_error_result_not_a_crash() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "no_such_tool",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Sorry.")));
    let mut builder = builder(&mock, agentry_llm::Protocol::Anthropic);
    builder.tool(ProbeTool::lookup()).unwrap();
    let (events, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
    assert_eq!(output.stop_reason, RunStopReason::Completed);
    let results = result_texts(&events);
    assert!(results[0].1 && results[0].0.contains("no_such_tool"));
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn a_model_error_fails_the_run_with_a_typed_error() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::error(
        401,
        json!({"error": {"message": "bad key", "type": "invalid_api_key"}}),
    ));
    let (events, output) = run_collect(
        &builder(&mock, agentry_llm::Protocol::OpenAi).build(),
        RunRequest::text("go"),
    )
    .await;
    assert_eq!(output.stop_reason, RunStopReason::Error);
    let error = output.error.unwrap();
    assert_eq!(error.code, agentry_types::ErrorCode::Authentication);
    assert!(matches!(events.last(), Some(RunEvent::RunFailed { .. })));
}

#[tokio::test]
async fn a_finished_state_resumes_as_a_new_turn() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("first")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("second")));
    let runtime = builder(&mock, agentry_llm::Protocol::OpenAi).build();
    let (_, first) = run_collect(&runtime, RunRequest::text("one")).await;
    let history = first.state.messages.clone();
    let (_, second) = run_collect(&runtime, RunRequest::text("two").with_history(history)).await;
    assert_eq!(second.text, "second");
    assert_eq!(second.state.messages.len(), 4);
    let sent = mock.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(sent, 3);
}

#[tokio::test]
async fn a_mid_run_state_resumes_where_it_stopped() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("resumed answer")));
    let tool = ProbeTool::lookup();
    let mut builder = builder(&mock, agentry_llm::Protocol::Anthropic);
    builder.tool(tool.clone()).unwrap();
    let runtime = builder.build();
    // Take the run to "tools requested", serialise it, and resume from the JSON.
    let mut state = runtime.prepare(RunRequest::text("go")).unwrap();
    let agentry_core::Step::CallModel(request) = state.next_step() else {
        panic!()
    };
    let model = super::support::model(&mock, agentry_llm::Protocol::Anthropic);
    let response = agentry_llm::collect_response(agentry_llm::ModelClient::stream(
        &model,
        request,
        agentry_llm::CancellationToken::new(),
    ))
    .await
    .unwrap();
    state.on_model_response(&response);
    let stored = serde_json::to_string(&state).unwrap();
    let restored: agentry_core::RunState = serde_json::from_str(&stored).unwrap();
    let output = runtime.resume(restored).unwrap().finish().await.unwrap();
    assert_eq!(output.text, "resumed answer");
    assert_eq!(tool.executions().len(), 1);
    mock.check_protocol().unwrap();
}
