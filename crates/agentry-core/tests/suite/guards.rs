//! Every guard of a run, against the mock provider: tool timeouts, loop detection (direct and
//! alternating), max rounds, the deadline, and cancellation mid-stream and mid-tool.

use std::time::{Duration, Instant};

use agentry_core::{LoopLimits, RunLimits, RunRequest};
use agentry_testkit::{Chunking, Fixture, MockProvider, Reply, ScriptedTurn};
use agentry_types::{RunEvent, RunStopReason};
use futures::StreamExt;
use serde_json::json;

use super::support::{PROTOCOLS, ProbeTool, builder, limits, result_texts, run_collect};

#[tokio::test]
async fn a_tool_over_its_timeout_returns_an_error_and_the_run_goes_on() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "lookup",
            json!({"id": 1}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("The lookup timed out.")));
        // The tool's own timeout (200 ms) overrides the run's default (10 s).
        let tool = ProbeTool::lookup()
            .sleeping(Duration::from_secs(30))
            .with_timeout(Duration::from_millis(200));
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap().limits(limits());
        let started = Instant::now();
        let (events, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(output.stop_reason, RunStopReason::Completed, "{protocol:?}");
        let results = result_texts(&events);
        assert!(results[0].1);
        assert!(results[0].0.contains("timed out"), "{}", results[0].0);
        assert!(tool.executions().is_empty(), "the tool never finished");
        mock.check_protocol().unwrap();
    }
}

#[tokio::test]
async fn direct_repetition_is_warned_then_stopped() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.set_fallback(Reply::scripted(ScriptedTurn::tool_call(
            "lookup",
            json!({"id": 3}),
        )));
        let tool = ProbeTool::lookup();
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap().limits(limits());
        let (events, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
        assert_eq!(
            output.stop_reason,
            RunStopReason::LoopDetected,
            "{protocol:?}"
        );
        assert!(output.note.unwrap().contains("lookup"));
        let results = result_texts(&events);
        // Calls 1 and 2 are plain, call 3 carries the warning, call 4 stops the run unrun.
        assert_eq!(results.len(), 3);
        assert!(!results[1].0.contains("warning"));
        assert!(results[2].0.contains("warning"), "{}", results[2].0);
        assert_eq!(tool.executions().len(), 3);
        assert_eq!(mock.request_count(), 4);
        assert!(matches!(
            events.last(),
            Some(RunEvent::RunFinished {
                stop_reason: RunStopReason::LoopDetected,
                ..
            })
        ));
        mock.check_protocol().unwrap();
    }
}

#[tokio::test]
async fn alternating_calls_are_a_loop_too() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        for _ in 0..6 {
            mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
                "lookup",
                json!({"id": 1}),
            )));
            mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
                "lookup",
                json!({"id": 2}),
            )));
        }
        let mut builder = builder(&mock, protocol);
        builder.tool(ProbeTool::lookup()).unwrap().limits(limits());
        let (events, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
        assert_eq!(
            output.stop_reason,
            RunStopReason::LoopDetected,
            "{protocol:?}"
        );
        // A, B, A, B, A(warn), B(warn), A(stop).
        let results = result_texts(&events);
        assert_eq!(results.len(), 6);
        assert!(results[4].0.contains("warning") && results[5].0.contains("warning"));
        mock.check_protocol().unwrap();
    }
}

#[tokio::test]
async fn max_tool_rounds_stops_the_run() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        for id in 0..10 {
            mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
                "lookup",
                json!({"id": id}),
            )));
        }
        let tool = ProbeTool::lookup();
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap().limits(RunLimits {
            max_tool_rounds: 3,
            ..limits()
        });
        let (_, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
        assert_eq!(output.stop_reason, RunStopReason::MaxRounds, "{protocol:?}");
        assert_eq!(tool.executions().len(), 3);
        assert_eq!(output.rounds, 4);
        mock.check_protocol().unwrap();
    }
}

#[tokio::test]
async fn the_deadline_stops_a_run_stuck_in_a_tool() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "lookup",
            json!({"id": 1}),
        )));
        let tool = ProbeTool::lookup().sleeping(Duration::from_secs(30));
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap().limits(RunLimits {
            deadline: Some(Duration::from_millis(400)),
            ..limits()
        });
        let started = Instant::now();
        let (_, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
        assert_eq!(output.stop_reason, RunStopReason::Deadline, "{protocol:?}");
        assert!(started.elapsed() < Duration::from_secs(10));
        // The running tool was told to stop.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*tool.cancelled.lock().unwrap(), 1);
    }
}

#[tokio::test]
async fn the_deadline_stops_a_slow_model_stream() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(
        Reply::fixture(Fixture::named("openai_compat/deepseek_reasoning_content_stream").unwrap())
            .chunked(Chunking::Every(300))
            .paced(Duration::from_millis(100)),
    );
    let mut builder = builder(&mock, agentry_llm::Protocol::OpenAi);
    builder.limits(RunLimits {
        deadline: Some(Duration::from_millis(500)),
        ..limits()
    });
    let (_, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
    assert_eq!(output.stop_reason, RunStopReason::Deadline);
}

#[tokio::test]
async fn cancellation_mid_stream_ends_the_run_promptly() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(
            Reply::scripted(ScriptedTurn::text("word ".repeat(200)))
                .chunked(Chunking::Every(40))
                .paced(Duration::from_millis(50)),
        );
        let runtime = builder(&mock, protocol).build();
        let mut stream = runtime.stream(RunRequest::text("go")).unwrap();
        let mut cancelled_at = None;
        let mut last = None;
        while let Some(event) = stream.next().await {
            if matches!(event, RunEvent::TextDelta { .. }) && cancelled_at.is_none() {
                stream.cancel();
                cancelled_at = Some(Instant::now());
            }
            last = Some(event);
        }
        let waited = cancelled_at.expect("saw a delta").elapsed();
        assert!(
            waited < Duration::from_secs(3),
            "{protocol:?}: took {waited:?}"
        );
        assert!(matches!(
            last,
            Some(RunEvent::RunFinished {
                stop_reason: RunStopReason::Cancelled,
                ..
            })
        ));
        let output = stream.finish().await.unwrap();
        assert_eq!(output.stop_reason, RunStopReason::Cancelled);
    }
}

#[tokio::test]
async fn cancellation_mid_tool_reaches_the_tool() {
    for protocol in PROTOCOLS {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "lookup",
            json!({"id": 1}),
        )));
        let tool = ProbeTool::lookup().sleeping(Duration::from_secs(30));
        let mut builder = builder(&mock, protocol);
        builder.tool(tool.clone()).unwrap().limits(limits());
        let runtime = builder.build();
        let mut stream = runtime.stream(RunRequest::text("go")).unwrap();
        let mut cancelled_at = None;
        while let Some(event) = stream.next().await {
            if matches!(event, RunEvent::ToolCallStarted { .. }) {
                // Give the tool task a moment to start waiting.
                tokio::time::sleep(Duration::from_millis(50)).await;
                stream.cancel();
                cancelled_at = Some(Instant::now());
            }
        }
        assert!(cancelled_at.expect("tool started").elapsed() < Duration::from_secs(3));
        let output = stream.finish().await.unwrap();
        assert_eq!(output.stop_reason, RunStopReason::Cancelled, "{protocol:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(*tool.cancelled.lock().unwrap(), 1, "{protocol:?}");
        assert!(tool.executions().is_empty());
    }
}

#[tokio::test]
async fn dropping_the_stream_cancels_the_run() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 1}),
    )));
    let tool = ProbeTool::lookup().sleeping(Duration::from_secs(30));
    let mut builder = builder(&mock, agentry_llm::Protocol::OpenAi);
    builder.tool(tool.clone()).unwrap();
    let runtime = builder.build();
    let mut stream = runtime.stream(RunRequest::text("go")).unwrap();
    while let Some(event) = stream.next().await {
        if matches!(event, RunEvent::ToolCallStarted { .. }) {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(stream);
    let started = Instant::now();
    while *tool.cancelled.lock().unwrap() == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "the tool was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn loop_limits_are_configurable() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::tool_call(
        "lookup",
        json!({"id": 3}),
    )));
    let tool = ProbeTool::lookup();
    let mut builder = builder(&mock, agentry_llm::Protocol::OpenAi);
    builder.tool(tool.clone()).unwrap().limits(RunLimits {
        loops: LoopLimits {
            window: 5,
            warn_at: 2,
            stop_at: 2,
        },
        ..limits()
    });
    let (_, output) = run_collect(&builder.build(), RunRequest::text("go")).await;
    assert_eq!(output.stop_reason, RunStopReason::LoopDetected);
    assert_eq!(tool.executions().len(), 1);
}
