//! `GET /v1/sessions/{id}/context`: the next call's parts, counted with the model's tokenizer
//! against its configured window.

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::json;

use super::support::start;

#[tokio::test]
async fn the_next_calls_parts_are_counted_against_the_models_window() {
    let server = start().await;
    let mock_url = server.mock.openai_base_url();
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": "gpt", "protocol": "openai", "base_url": mock_url,
                   "model_name": "gpt-4o-mini", "context_window": 4096}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("The capital is Paris.")));
    let (status, run) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "gpt", "tool_ids": ["current_time"],
                   "system": "You answer geography questions.",
                   "text": "What is the capital of France?"}),
        )
        .await;
    assert_eq!(status, 200, "{run}");
    let session = run["session_id"].as_str().unwrap().to_owned();

    let (status, report) = server.get(&format!("/v1/sessions/{session}/context")).await;
    assert_eq!(status, 200, "{report}");
    assert_eq!(report["model"], "gpt");
    assert_eq!(report["window"], 4096);
    assert_eq!(report["window_known"], true);
    assert_eq!(report["compaction_threshold"], 3276);
    assert_eq!(report["tokenizer"], "o200k_base");
    let parts = report["parts"].as_array().unwrap();
    let kinds: Vec<&str> = parts.iter().map(|p| p["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["system", "user", "assistant", "tools"], "{report}");
    assert_eq!(parts[3]["count"], 1);
    assert_eq!(parts[3]["preview"], "current_time");
    assert!(
        parts[1]["preview"]
            .as_str()
            .unwrap()
            .contains("capital of France")
    );
    // "What is the capital of France?" is 7 o200k tokens, plus 4 for the message.
    assert_eq!(parts[1]["tokens"], 11, "{report}");
    let sum: u64 = parts.iter().map(|p| p["tokens"].as_u64().unwrap()).sum();
    assert_eq!(report["total_tokens"].as_u64().unwrap(), sum + 3);
    assert_eq!(report["fits"], true);

    // Counting for another model: the mock's "m" is unknown to tiktoken, so estimated.
    let (status, other) = server
        .get(&format!("/v1/sessions/{session}/context?model=mock"))
        .await;
    assert_eq!(status, 200, "{other}");
    assert_eq!(other["tokenizer"], "estimate");
    assert_eq!(other["window"], 8192);
    assert_eq!(other["window_known"], false);

    // Errors: an unknown session, a bad id, an unknown model, a fresh session without a model.
    let (status, _) = server
        .get("/v1/sessions/01900000-0000-7000-8000-000000000000/context")
        .await;
    assert_eq!(status, 404);
    let (status, _) = server.get("/v1/sessions/nope/context").await;
    assert_eq!(status, 400);
    let (status, _) = server
        .get(&format!("/v1/sessions/{session}/context?model=ghost"))
        .await;
    assert_eq!(status, 400);
    let fresh = server
        .state
        .app
        .parts()
        .store
        .create_session(agentry_store::NewSession::new())
        .await
        .unwrap();
    let (status, error) = server
        .get(&format!("/v1/sessions/{}/context", fresh.id))
        .await;
    assert_eq!(status, 400, "{error}");
    // A window below the minimum is refused when the model is saved.
    let (status, _) = server
        .post(
            "/v1/models",
            json!({"id": "tiny", "protocol": "openai", "base_url": mock_url,
                   "model_name": "x", "context_window": 10}),
        )
        .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn files_named_in_a_message_are_attached_from_the_sessions_workspace() {
    let server = super::support::start_with(
        |home| agentry_app::ToolEnvironment {
            workspaces: Some(home.join("workspaces")),
            ..Default::default()
        },
        |_| {},
    )
    .await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("hello")));
    let (status, run) = server
        .post("/v1/infer", json!({"session_id": "new", "text": "hi"}))
        .await;
    assert_eq!(status, 200, "{run}");
    let session = run["session_id"].as_str().unwrap().to_owned();
    let workspace = server.home.path().join("workspaces").join(&session);
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("notes.txt"), "the launch is on Friday\n").unwrap();
    std::fs::write(server.home.path().join("secret.txt"), "hunter2").unwrap();

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Friday.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": session, "text": "When? <file>notes.txt</file>"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = server.mock.requests().last().unwrap().body.clone();
    let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["content"],
        "When? <file path=\"notes.txt\">\nthe launch is on Friday\n</file>"
    );

    // Traversal is refused with a 400, and nothing is run or recorded.
    let (_, before) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let requests = server.mock.request_count();
    for path in ["../../secret.txt", "/etc/passwd", "missing.txt"] {
        let (status, error) = server
            .post(
                "/v1/infer",
                json!({"session_id": session, "text": format!("<file>{path}</file>")}),
            )
            .await;
        assert_eq!(status, 400, "{path}: {error}");
        assert!(error.to_string().contains(path), "{error}");
    }
    // Ephemeral runs have no workspace.
    let (status, _) = server
        .post("/v1/infer", json!({"text": "<file>notes.txt</file>"}))
        .await;
    assert_eq!(status, 400);
    let (_, after) = server.get(&format!("/v1/sessions/{session}/events")).await;
    assert_eq!(before, after);
    assert_eq!(server.mock.request_count(), requests);
}

#[tokio::test]
async fn an_agents_memories_join_its_system_prompt() {
    let server = start().await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "barista", "model_id": "mock", "system": "You serve drinks.",
                   "compaction": {"keep_recent": 3, "summary_model": "mock"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    for (text, user) in [
        ("Alice takes her tea without sugar", Some("alice")),
        ("Bob likes espresso", Some("bob")),
        ("The shop closes at six", None),
    ] {
        let mut memory = json!({"kind": "fact", "text": text});
        if let Some(user) = user {
            memory["user"] = json!(user);
        }
        let (status, _) = server.post("/v1/agents/barista/memories", memory).await;
        assert_eq!(status, 201);
    }
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Tea, no sugar.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "barista", "user": "alice", "text": "The usual tea?"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = server.mock.requests()[0].body.clone();
    let system = sent["messages"][0]["content"].as_str().unwrap().to_owned();
    assert!(
        system.starts_with("You serve drinks.\n\n<memories>"),
        "{system}"
    );
    assert!(system.contains("(about alice) Alice takes her tea without sugar"));
    assert!(system.contains("The shop closes at six"));
    assert!(
        !system.contains("espresso"),
        "another user's memories stay out"
    );

    // Bad compaction settings and a bad user are refused.
    let (status, _) = server
        .post(
            "/v1/agents",
            json!({"id": "bad", "model_id": "mock", "compaction": {"threshold": 3.0}}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post(
            "/v1/agents",
            json!({"id": "bad", "model_id": "mock", "compaction": {"summary_model": "ghost"}}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "barista", "user": "a/b", "text": "hi"}),
        )
        .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn a_context_length_error_compacts_with_the_agents_summary_model_and_keeps_memories() {
    let server = start().await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "scribe", "model_id": "mock",
                   "compaction": {"keep_recent": 1, "summary_model": "mock"}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Nice to meet you.")));
    let (status, run) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "agent_id": "scribe", "user": "u1",
                   "text": "My cat is called Miso."}),
        )
        .await;
    assert_eq!(status, 200, "{run}");
    let session = run["session_id"].as_str().unwrap().to_owned();
    for text in ["I live in Lyon.", "I prefer short answers."] {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text("Noted.")));
        let (status, _) = server
            .post(
                "/v1/infer",
                json!({"session_id": session, "agent_id": "scribe", "user": "u1", "text": text}),
            )
            .await;
        assert_eq!(status, 200);
    }
    // The provider says the context is too long; the summary model (the mock again) answers
    // with a summary and memories; the call is retried once.
    server.mock.enqueue(Reply::error(
        400,
        json!({"error": {"message": "context too long", "code": "context_length_exceeded"}}),
    ));
    server.mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "The user introduced their cat and city.\nMEMORIES:\n- fact: The user's cat is called Miso\n- preference: short answers",
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Miso, in Lyon.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": session, "agent_id": "scribe", "user": "u1",
                   "text": "What do you know about me?"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "Miso, in Lyon.", "{body}");
    let requests = server.mock.requests();
    let summary_request = &requests[requests.len() - 2].body;
    let prompt = summary_request["messages"][1]["content"].as_str().unwrap();
    assert!(prompt.contains("My cat is called Miso."), "{prompt}");
    let retried = requests.last().unwrap().body["messages"].to_string();
    assert!(retried.contains("The user introduced their cat and city."));
    assert!(!retried.contains("I live in Lyon."), "{retried}");

    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let compaction = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["event"]["type"] == "context_compacted" || e["type"] == "context_compacted")
        .cloned()
        .unwrap_or_else(|| panic!("no compaction in {events}"));
    assert!(
        compaction.to_string().contains("\"forced\":true"),
        "{compaction}"
    );

    let (_, memories) = server.get("/v1/agents/scribe/memories?user=u1").await;
    let texts: Vec<&str> = memories["memories"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["text"].as_str().unwrap())
        .collect();
    assert!(
        texts.contains(&"The user's cat is called Miso"),
        "{memories}"
    );
    assert!(texts.contains(&"short answers"), "{memories}");
    assert_eq!(memories["memories"][0]["source_session"], session.as_str());

    let (_, report) = server.get(&format!("/v1/sessions/{session}/context")).await;
    assert!(
        report["compacted_messages"].as_u64().unwrap() >= 4,
        "{report}"
    );
    assert_eq!(report["summary"], "The user introduced their cat and city.");

    // A fork keeps the real history and the compaction: its next run is sent the summary.
    let (status, fork) = server
        .post(&format!("/v1/sessions/{session}/fork"), json!({}))
        .await;
    assert_eq!(status, 201, "{fork}");
    let fork_id = fork["session"]["id"].as_str().unwrap().to_owned();
    let (_, shown) = server.get(&format!("/v1/sessions/{fork_id}")).await;
    assert!(shown["messages"].to_string().contains("I live in Lyon."));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Still Miso.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": fork_id, "agent_id": "scribe", "text": "And the cat?"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = server.mock.requests().last().unwrap().body["messages"].to_string();
    assert!(
        sent.contains("The user introduced their cat and city."),
        "{sent}"
    );
    assert!(!sent.contains("I live in Lyon."), "{sent}");
}
