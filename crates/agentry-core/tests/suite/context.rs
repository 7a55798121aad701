//! Context compaction end to end: a 300-turn run kept under a small window with incremental
//! summaries, no tool pair ever split, recovery from a context-length error (once, never in a
//! loop), and the compaction carried to the session's next run.

use std::sync::{Arc, Mutex};

use agentry_core::context::CompactionSettings;
use agentry_core::session::{BusyPolicy, MemoryLog, SessionLog, SessionManager};
use agentry_core::{RunRequest, Runtime};
use agentry_llm::{
    HttpModelClient, ModelClient, ModelContext, ModelRequest, ModelStream, Protocol,
    ProviderConfig, RetryPolicy, TransportConfig,
};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::{ErrorCode, Message, ModelResponse, RunStopReason, SessionEvent};
use anyhow::{Context as _, Result, ensure};
use futures::future::BoxFuture;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::support::{ProbeTool, limits};

fn client(mock: &MockProvider, name: &str, window: u64) -> HttpModelClient {
    HttpModelClient::new(
        ProviderConfig::new(Protocol::OpenAi, name)
            .with_base_url(mock.openai_base_url())
            .with_context_window(window)
            .with_transport(TransportConfig {
                retry: RetryPolicy::none(),
                ..TransportConfig::default()
            }),
    )
    .unwrap()
}

/// A model client that counts every request it is sent with the model's own counter.
#[derive(Clone)]
struct Counting {
    inner: HttpModelClient,
    sent: Arc<Mutex<Vec<(u64, usize)>>>,
}

impl Counting {
    fn record(&self, request: &ModelRequest) {
        let counter = self.inner.context().counter;
        self.sent
            .lock()
            .unwrap()
            .push((counter.count_request(request), request.messages.len()));
    }
}

impl ModelClient for Counting {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ModelStream {
        self.record(&request);
        self.inner.stream(request, cancel)
    }

    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ModelResponse, agentry_llm::LlmError>> {
        self.record(&request);
        self.inner.complete(request, cancel)
    }

    fn context(&self) -> ModelContext {
        self.inner.context()
    }
}

fn compacted(events: &[(u64, SessionEvent)]) -> Vec<SessionEvent> {
    events
        .iter()
        .filter(|(_, e)| matches!(e, SessionEvent::ContextCompacted { .. }))
        .map(|(_, e)| e.clone())
        .collect()
}

#[tokio::test]
async fn a_300_turn_run_stays_under_a_small_window_with_incremental_summaries() -> Result<()> {
    const TURNS: usize = 300;
    const WINDOW: u64 = 1_500;
    let main = MockProvider::start().await?;
    let summaries = MockProvider::start().await?;
    for i in 0..TURNS {
        main.enqueue(Reply::scripted(
            ScriptedTurn::text(format!("Looking up item {i} of the inventory now."))
                .with_tool_call("lookup", json!({"id": i})),
        ));
    }
    main.enqueue(Reply::scripted(ScriptedTurn::text("All items checked.")));
    summaries.set_fallback(Reply::scripted(ScriptedTurn::text(
        "SUMMARY: the assistant is looking up inventory items one by one.",
    )));

    let counting = Counting {
        inner: client(&main, "m", WINDOW),
        sent: Arc::default(),
    };
    let mut builder = Runtime::builder();
    builder
        .model_arc("main", Arc::new(counting.clone()))
        .model("summariser", client(&summaries, "s", 8_192))
        .default_model("main")
        .tool(ProbeTool::lookup())?;
    builder.limits(agentry_core::RunLimits {
        max_tool_rounds: 1_000,
        ..limits()
    });
    builder.compaction(CompactionSettings {
        keep_recent: 4,
        summary_model: Some("summariser".into()),
        summary_tokens: 200,
        ..CompactionSettings::default()
    });
    let log = Arc::new(MemoryLog::default());
    let manager = SessionManager::new(builder.build(), log.clone());
    let session = manager.create_session().await?;
    let output = manager
        .send(
            session,
            RunRequest::text("Check every item of the inventory.").with_system("You are careful."),
            BusyPolicy::Reject,
        )
        .await?
        .finish()
        .await?;
    ensure!(output.stop_reason == RunStopReason::Completed, "{output:?}");
    ensure!(output.text == "All items checked.");

    // Every request stayed under the threshold of the window, and the conversation kept
    // growing in the log while the requests did not.
    let sent = counting.sent.lock().unwrap().clone();
    ensure!(sent.len() == TURNS + 1, "{} model calls", sent.len());
    let budget = (WINDOW as f64 * 0.8) as u64;
    for (i, (tokens, _)) in sent.iter().enumerate() {
        ensure!(*tokens <= budget, "request {i} took {tokens} tokens");
    }
    // The window, not the conversation's 602 messages, bounds what is sent.
    let longest = sent.iter().map(|(_, n)| *n).max().unwrap_or(0);
    ensure!(longest < 100, "a request had {longest} messages");
    // No tool call was ever separated from its result.
    main.check_protocol()
        .map_err(|violations| anyhow::anyhow!("{violations:?}"))?;
    let events = log.load(session).await?;
    let compactions = compacted(&events);
    ensure!(compactions.len() >= 10, "{} compactions", compactions.len());
    let mut previous_cut = 0;
    for event in &compactions {
        let SessionEvent::ContextCompacted {
            covered,
            summary,
            summary_model,
            tokens_after,
            dropped_messages,
            ..
        } = event
        else {
            unreachable!();
        };
        ensure!(dropped_messages.is_none(), "summarised, nothing dropped");
        ensure!(*covered > previous_cut, "cuts only move forward");
        previous_cut = *covered;
        ensure!(summary.as_deref().is_some_and(|s| s.starts_with("SUMMARY")));
        ensure!(summary_model.as_deref() == Some("summariser"));
        ensure!(*tokens_after <= budget);
    }
    // The original messages are all still in the log.
    let messages = agentry_core::session::replay(&events).messages;
    ensure!(messages.len() == 2 + 2 * TURNS + 1, "{}", messages.len());

    // Incremental: each summary request holds the previous summary and only turns no earlier
    // summary request held.
    let requests = summaries.requests();
    ensure!(requests.len() == compactions.len());
    let mut seen_items = std::collections::BTreeSet::new();
    for (k, request) in requests.iter().enumerate() {
        let prompt = request.body["messages"][1]["content"]
            .as_str()
            .context("the summary prompt")?
            .to_owned();
        ensure!(
            (k > 0) == prompt.contains("The summary so far"),
            "request {k}: {prompt}"
        );
        for i in 0..TURNS {
            if prompt.contains(&format!("{{\"id\":{i}}}")) {
                ensure!(seen_items.insert(i), "item {i} was summarised twice");
            }
        }
    }
    ensure!(
        seen_items.len() > TURNS / 2,
        "{} items summarised",
        seen_items.len()
    );
    Ok(())
}

#[tokio::test]
async fn a_context_length_error_compacts_once_and_retries_once() -> Result<()> {
    let mock = MockProvider::start().await?;
    let too_long = || {
        Reply::error(
            400,
            json!({"error": {
                "message": "This model's maximum context length is 8192 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded"
            }}),
        )
    };
    let mut builder = Runtime::builder();
    builder.model("main", client(&mock, "m", 100_000));
    builder.compaction(CompactionSettings {
        keep_recent: 2,
        ..CompactionSettings::default()
    });
    let runtime = builder.build();
    let mut history = vec![Message::system("Be brief.")];
    for i in 0..8 {
        history.push(Message::user(format!("question {i}")));
        history.push(Message::assistant(format!("answer {i}")));
    }

    // The provider refuses once: the history is compacted (no summary model: dropped with a
    // marker) and the call is made again, once.
    mock.enqueue(too_long());
    mock.enqueue(Reply::scripted(ScriptedTurn::text("fine now")));
    let output = runtime
        .run(RunRequest::text("last question").with_history(history.clone()))
        .await?;
    ensure!(output.text == "fine now", "{output:?}");
    let requests = mock.take_requests();
    ensure!(requests.len() == 2);
    let first = requests[0].body["messages"]
        .as_array()
        .context("messages")?
        .len();
    let second = requests[1].body["messages"]
        .as_array()
        .context("messages")?;
    ensure!(second.len() < first, "{} then {}", first, second.len());
    ensure!(
        second[0]["content"] == "Be brief.",
        "the system prompt stays"
    );
    ensure!(
        second[1]["content"]
            .to_string()
            .contains("were removed to fit the model's context window"),
        "{}",
        second[1]
    );
    ensure!(
        second
            .last()
            .is_some_and(|m| m["content"] == "last question")
    );
    ensure!(
        output
            .state
            .compaction
            .as_ref()
            .is_some_and(|c| c.dropped > 0)
    );

    // Refused again after the compaction: the run fails with the provider's error; no third
    // call, no loop.
    mock.enqueue(too_long());
    mock.enqueue(too_long());
    mock.enqueue(Reply::scripted(ScriptedTurn::text("never sent")));
    let output = runtime
        .run(RunRequest::text("last question").with_history(history))
        .await?;
    ensure!(output.stop_reason == RunStopReason::Error, "{output:?}");
    ensure!(
        output
            .error
            .as_ref()
            .is_some_and(|e| e.code == ErrorCode::ContextLengthExceeded)
    );
    ensure!(mock.take_requests().len() == 2);
    ensure!(mock.pending_replies() == 1);
    Ok(())
}

#[tokio::test]
async fn the_next_run_of_a_session_starts_from_the_compacted_view() -> Result<()> {
    let mock = MockProvider::start().await?;
    let mut builder = Runtime::builder();
    builder.model("main", client(&mock, "m", 100_000));
    builder.compaction(CompactionSettings {
        keep_recent: 1,
        ..CompactionSettings::default()
    });
    let log = Arc::new(MemoryLog::default());
    let manager = SessionManager::new(builder.build(), log.clone());
    let session = manager.create_session().await?;
    for i in 0..3 {
        mock.enqueue(Reply::scripted(ScriptedTurn::text(format!("answer {i}"))));
        manager
            .send(
                session,
                RunRequest::text(format!("question {i}")),
                BusyPolicy::Reject,
            )
            .await?
            .finish()
            .await?;
    }
    // The provider refuses the fourth run's first call: the compaction is recorded.
    mock.enqueue(Reply::error(
        400,
        json!({"error": {"message": "too long", "code": "context_length_exceeded"}}),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("answer 3")));
    manager
        .send(session, RunRequest::text("question 3"), BusyPolicy::Reject)
        .await?
        .finish()
        .await?;
    let events = log.load(session).await?;
    ensure!(compacted(&events).len() == 1);
    // No summary model: the event says which messages were dropped, and that no summary
    // describes them.
    let SessionEvent::ContextCompacted {
        covered,
        summary,
        summary_model,
        dropped,
        dropped_messages: Some(gone),
        ..
    } = &compacted(&events)[0]
    else {
        anyhow::bail!("the compaction does not record what it dropped: {events:?}");
    };
    ensure!(summary.is_none() && summary_model.is_none());
    ensure!(
        gone.start == 0 && gone.end == *covered,
        "{gone:?}, covered {covered}"
    );
    ensure!(gone.count == gone.end - gone.start && gone.count == *dropped);
    // Three runs of two messages and the fourth question; the last turn stays.
    ensure!((2..=6).contains(&gone.count), "{gone:?}");
    let recorded = serde_json::to_value(&compacted(&events)[0])?;
    ensure!(
        recorded["dropped_messages"] == json!({"count": gone.count, "start": 0, "end": covered}),
        "{recorded}"
    );
    // The fifth run (nothing refused) sends the compacted view straight away.
    mock.take_requests();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("answer 4")));
    let output = manager
        .send(session, RunRequest::text("question 4"), BusyPolicy::Reject)
        .await?
        .finish()
        .await?;
    ensure!(output.text == "answer 4");
    let sent = mock.take_requests();
    let messages = sent[0].body["messages"].as_array().context("messages")?;
    let text = serde_json::to_string(messages)?;
    ensure!(!text.contains("question 0"), "{text}");
    ensure!(text.contains("were removed"), "{text}");
    ensure!(text.contains("question 4"));
    // Replay still has every message.
    let all = agentry_core::session::replay(&events).messages;
    ensure!(serde_json::to_string(&all)?.contains("question 0"));
    Ok(())
}
