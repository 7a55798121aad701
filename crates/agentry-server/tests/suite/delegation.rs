//! Sub-agents: `delegate` (own model, a subset of the caller's tools, nested and streamed,
//! linked child sessions, cancellation, depth limit) and `talk_to` (saved agents in parallel,
//! results in order, failures as entries, no self-targeting).

use std::time::Duration;

use agentry_app::ToolEnvironment;
use agentry_app::delegation::DelegationHandle;
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_tools::DelegationConfig;
use serde_json::{Value, json};

use super::support::{Received, Server, start, start_with};

/// Registers a model `id` served by `base_url` under the provider name `name`.
async fn model(server: &Server, id: &str, name: &str, base_url: &str) {
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": id, "protocol": "openai", "base_url": base_url, "model_name": name}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

async fn agent(server: &Server, agent: Value) {
    let (status, body) = server.post("/v1/agents", agent).await;
    assert_eq!(status, 201, "{body}");
}

/// The names of the tools a recorded OpenAI request offered.
fn offered(body: &Value) -> Vec<String> {
    let mut names: Vec<String> = body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The system prompt of a recorded OpenAI request.
fn system(body: &Value) -> String {
    assert_eq!(body["messages"][0]["role"], "system", "{body}");
    body["messages"][0]["content"].as_str().unwrap().to_owned()
}

/// The text of the last tool message of a recorded OpenAI request.
fn last_tool_message(body: &Value) -> String {
    let message = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("a tool message in {body}"));
    match &message["content"] {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

async fn session(server: &Server, id: &str) -> Value {
    let (status, body) = server.get(&format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// Waits until the session's log has a `run_finished`, and returns it.
async fn run_finished(server: &Server, id: &str) -> Value {
    for _ in 0..200 {
        let (status, body) = server.get(&format!("/v1/sessions/{id}/events")).await;
        assert_eq!(status, 200, "{body}");
        if let Some(end) = body["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["event"]["type"] == "run_finished")
        {
            return end["event"].clone();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("session {id} never finished its run");
}

#[tokio::test]
async fn delegation_two_levels_deep_with_different_models() {
    let server = start().await;
    let base = server.mock.openai_base_url();
    model(&server, "deep", "m-deep", &base).await;
    model(&server, "deeper", "m-deeper", &base).await;
    let mock = &server.mock;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "delegate",
        json!({"task": "Find out the time.", "model": "deep",
               "tools": ["delegate", "current_time"], "context": "The user is in a hurry."}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "delegate",
        json!({"task": "Call current_time and say it.", "model": "deeper",
               "tools": ["current_time"]}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It is noon.")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "Deep says: it is noon.",
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Noon, then.")));

    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(
                json!({"session_id": "new", "model_id": "mock", "text": "What time is it?",
                        "tool_ids": ["delegate", "current_time", "slow"]}),
            ),
            None,
        )
        .await;
    let parent = stream.session.clone().unwrap();
    let events: Vec<Received> = stream.rest().await;
    let end = events.last().unwrap();
    assert_eq!(end.name, "run.finished", "{events:?}");

    // Each level ran on its own model, with the tools it was given.
    let requests = mock.requests();
    assert_eq!(requests.len(), 6);
    let models: Vec<&str> = requests
        .iter()
        .map(|r| r.body["model"].as_str().unwrap())
        .collect();
    assert_eq!(
        models,
        ["m", "m-deep", "m-deeper", "m-deeper", "m-deep", "m"]
    );
    assert_eq!(
        offered(&requests[0].body),
        ["current_time", "delegate", "slow"]
    );
    assert_eq!(offered(&requests[1].body), ["current_time", "delegate"]);
    assert_eq!(offered(&requests[2].body), ["current_time"]);
    // The caller's tool table (names and descriptions) is in the child's system prompt.
    let child_system = system(&requests[1].body);
    assert!(child_system.contains("| slow |"), "{child_system}");
    assert!(child_system.contains("| delegate | Hands a self-contained task"));
    assert!(child_system.contains("The user is in a hurry."));
    assert_eq!(
        requests[1].body["messages"][1]["content"],
        "Find out the time."
    );
    let grandchild_system = system(&requests[2].body);
    assert!(grandchild_system.contains("| delegate |"));
    assert!(grandchild_system.contains("| current_time |"));
    assert!(
        !grandchild_system.contains("| slow |"),
        "{grandchild_system}"
    );
    // Each child's answer is its caller's tool result.
    assert!(last_tool_message(&requests[4].body).contains("It is noon."));
    assert!(last_tool_message(&requests[5].body).contains("Deep says: it is noon."));
    mock.check_protocol().unwrap();

    // Progress streamed to the parent's clients as nested events, two levels deep.
    let nested: Vec<&Value> = events
        .iter()
        .filter(|e| e.name == "nested")
        .map(|e| &e.data)
        .collect();
    assert!(!nested.is_empty(), "{events:?}");
    assert!(
        nested
            .iter()
            .all(|n| n["depth"] == 1 && n["type"] == "nested")
    );
    let child = nested[0]["session_id"].as_str().unwrap().to_owned();
    assert_eq!(nested[0]["event"]["type"], "run_started");
    assert!(nested.iter().any(|n| n["event"]["type"] == "text_delta"));
    assert!(
        nested.iter().any(|n| n["event"]["type"] == "run_finished"
            && n["event"]["text"] == "Deep says: it is noon.")
    );
    let deeper: Vec<&Value> = nested
        .iter()
        .filter(|n| n["event"]["type"] == "nested")
        .map(|n| &n["event"])
        .collect();
    assert!(deeper.iter().all(|n| n["depth"] == 2));
    assert!(
        deeper
            .iter()
            .any(|n| n["event"]["type"] == "tool_call_started"
                && n["event"]["call"]["name"] == "current_time")
    );
    let grandchild = deeper[0]["session_id"].as_str().unwrap().to_owned();
    assert_ne!(child, grandchild);

    // The children are linked sessions.
    let shown = session(&server, &parent).await;
    assert!(shown["delegation"].is_null());
    let children = shown["children"].as_array().unwrap();
    assert_eq!(children.len(), 1, "{shown}");
    assert_eq!(children[0]["session_id"], child.as_str());
    assert_eq!(children[0]["tool"], "delegate");
    assert_eq!(children[0]["stop_reason"], "completed");
    let shown_child = session(&server, &child).await;
    let link = &shown_child["delegation"];
    assert_eq!(link["parent_session_id"], parent.as_str());
    assert_eq!(link["depth"], 1);
    assert_eq!(link["tool"], "delegate");
    assert_eq!(shown_child["session"]["status"], "idle");
    assert_eq!(
        shown_child["children"][0]["session_id"],
        grandchild.as_str()
    );
    let shown_grandchild = session(&server, &grandchild).await;
    assert_eq!(
        shown_grandchild["delegation"]["parent_session_id"],
        child.as_str()
    );
    assert_eq!(shown_grandchild["delegation"]["depth"], 2);
    let messages = shown_grandchild["messages"].as_array().unwrap();
    assert_eq!(
        messages.last().unwrap()["content"][0]["text"],
        "It is noon."
    );
}

#[tokio::test]
async fn cancelling_the_caller_cancels_its_sub_agent() {
    let server = start().await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "delegate",
        json!({"task": "Take your time."}),
    )));
    server.mock.enqueue(
        Reply::scripted(ScriptedTurn::text("Too late.")).delay_headers(Duration::from_secs(30)),
    );
    let mut stream = server
        .sse(
            "/v1/infer/stream",
            Some(
                json!({"session_id": "new", "model_id": "mock", "text": "go",
                        "tool_ids": ["delegate"]}),
            ),
            None,
        )
        .await;
    let parent = stream.session.clone().unwrap();
    let child = loop {
        let event = stream.next().await.expect("a nested run start");
        if event.name == "nested" && event.data["event"]["type"] == "run_started" {
            break event.data["session_id"].as_str().unwrap().to_owned();
        }
    };
    // The child is blocked on its slow model call.
    for _ in 0..200 {
        if server.mock.request_count() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(server.mock.request_count(), 2);
    // The child is live in its own session too.
    let live = session(&server, &child).await;
    assert_eq!(live["session"]["status"], "running");
    assert!(live["run_id"].is_string(), "{live}");
    let (status, body) = server
        .post("/v1/infer/abort", json!({"session_id": parent}))
        .await;
    assert_eq!((status, body["aborted"].clone()), (200, json!(true)));
    let rest = stream.rest().await;
    let end = rest.last().unwrap();
    assert_eq!(end.data["event"]["stop_reason"], "cancelled", "{rest:?}");

    let child_end = run_finished(&server, &child).await;
    assert_eq!(child_end["stop_reason"], "cancelled", "{child_end}");
    let shown = session(&server, &child).await;
    assert_eq!(shown["session"]["status"], "interrupted");
    assert_eq!(shown["delegation"]["parent_session_id"], parent.as_str());
    // Nothing more was asked of the model.
    assert_eq!(server.mock.request_count(), 2);
}

#[tokio::test]
async fn talk_to_runs_agents_in_parallel_and_joins_results_in_order() {
    let server = start().await;
    let delay = Duration::from_millis(1500);
    let mocks = [
        MockProvider::start().await.unwrap(),
        MockProvider::start().await.unwrap(),
        MockProvider::start().await.unwrap(),
    ];
    for (mock, id) in mocks.iter().zip(["ma", "mb", "mc"]) {
        model(&server, id, &format!("model-{id}"), &mock.openai_base_url()).await;
    }
    agent(
        &server,
        json!({"id": "alpha", "nickname": "Alpha", "model_id": "ma",
                          "labels": ["team"], "system": "You are Alpha."}),
    )
    .await;
    agent(
        &server,
        json!({"id": "beta", "model_id": "mb", "labels": ["team"]}),
    )
    .await;
    agent(
        &server,
        json!({"id": "gamma", "model_id": "mc", "labels": ["ops"]}),
    )
    .await;
    agent(
        &server,
        json!({"id": "boss", "model_id": "mock", "tool_ids": ["talk_to"],
                          "labels": ["team"]}),
    )
    .await;
    mocks[0].enqueue(Reply::scripted(ScriptedTurn::text("A is fine.")).delay_headers(delay));
    mocks[1].enqueue(
        Reply::error(
            400,
            json!({"error": {"message": "beta's model refuses", "type": "invalid_request_error"}}),
        )
        .delay_headers(delay),
    );
    mocks[2].enqueue(Reply::scripted(ScriptedTurn::text("C is fine.")).delay_headers(delay));
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "talk_to",
        // The label `team` names alpha, beta and the caller itself, which is left out.
        json!({"agents": ["team", "gamma"], "message": "Status?"}),
    )));
    server.mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "Two of three are fine.",
    )));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "agent_id": "boss", "text": "Ask the team."}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "Two of three are fine.");

    // All three were asked before any of them could answer: they ran concurrently.
    let arrivals: Vec<std::time::Instant> = mocks
        .iter()
        .map(|mock| {
            let requests = mock.requests();
            assert_eq!(requests.len(), 1);
            requests[0].received_at
        })
        .collect();
    let first = *arrivals.iter().min().unwrap();
    let last = *arrivals.iter().max().unwrap();
    assert!(
        last.duration_since(first) < delay,
        "the agents ran one after another: {:?}",
        last.duration_since(first)
    );
    let asked = &mocks[0].requests()[0].body;
    assert_eq!(asked["model"], "model-ma");
    assert_eq!(system(asked), "You are Alpha.");
    let message = asked["messages"][1]["content"].as_str().unwrap();
    assert!(
        message.contains("agent \"boss\"") && message.ends_with("Status?"),
        "{message}"
    );

    // One joined result, in the targets' order, the failure as an entry.
    let requests = server.mock.requests();
    assert_eq!(requests.len(), 2);
    let result = last_tool_message(&requests[1].body);
    let a = result.find("**Alpha** (alpha): A is fine.").expect(&result);
    let b = result.find("**beta** (beta): error:").expect(&result);
    let c = result.find("**gamma** (gamma): C is fine.").expect(&result);
    assert!(a < b && b < c, "{result}");
    assert!(result.contains("beta's model refuses"), "{result}");
    assert!(!result.contains("(boss)"), "{result}");

    let parent = body["session_id"].as_str().unwrap();
    let shown = session(&server, parent).await;
    let children = shown["children"].as_array().unwrap();
    let agents: Vec<&str> = children
        .iter()
        .map(|c| c["agent_id"].as_str().unwrap())
        .collect();
    assert_eq!(agents, ["alpha", "beta", "gamma"]);
    assert!(children[1]["error"].is_string());
    assert!(children[0]["error"].is_null());
    for child in children {
        let shown = session(&server, child["session_id"].as_str().unwrap()).await;
        assert_eq!(shown["delegation"]["tool"], "talk_to");
        assert_eq!(shown["delegation"]["agent_id"], child["agent_id"]);
        assert_eq!(shown["delegation"]["parent_session_id"], parent);
    }
    let beta = session(&server, children[1]["session_id"].as_str().unwrap()).await;
    assert_eq!(beta["session"]["status"], "failed");
}

#[tokio::test]
async fn talk_to_refuses_to_target_the_caller() {
    let server = start().await;
    agent(
        &server,
        json!({"id": "boss", "nickname": "Chief", "model_id": "mock",
                          "tool_ids": ["talk_to"]}),
    )
    .await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "talk_to",
        json!({"agents": ["chief"], "message": "Hello me."}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("I cannot.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "boss", "text": "Talk to yourself."}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let tool = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert_eq!(tool["is_error"], true, "{tool}");
    assert!(tool.to_string().contains("cannot talk_to itself"), "{tool}");
    // No child run was started: only the caller's two model calls.
    assert_eq!(server.mock.request_count(), 2);
}

#[tokio::test]
async fn delegation_stops_at_the_depth_limit() {
    let server = start_with(
        |_| ToolEnvironment {
            delegation: DelegationHandle::new(DelegationConfig {
                max_depth: 1,
                ..DelegationConfig::default()
            }),
            ..ToolEnvironment::default()
        },
        |_| {},
    )
    .await;
    let mock = &server.mock;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "delegate",
        json!({"task": "Level one."}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "delegate",
        json!({"task": "Level two."}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "I had to do it myself.",
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Done.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "go",
                   "tool_ids": ["delegate"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "Done.");
    let requests = mock.requests();
    assert_eq!(requests.len(), 4);
    // The child (depth 1) was refused a grandchild with a clear error result.
    let refused = last_tool_message(&requests[2].body);
    assert!(
        refused.contains("delegation depth limit (1) is reached"),
        "{refused}"
    );
    assert!(last_tool_message(&requests[3].body).contains("I had to do it myself."));
    let shown = session(&server, body["session_id"].as_str().unwrap()).await;
    let children = shown["children"].as_array().unwrap();
    assert_eq!(children.len(), 1);
    let child = session(&server, children[0]["session_id"].as_str().unwrap()).await;
    assert_eq!(child["delegation"]["depth"], 1);
    assert!(child["children"].as_array().unwrap().is_empty());
}

#[tokio::test]
async fn a_sub_agent_is_held_to_its_callers_approvals() {
    let server = start().await;
    let mock = &server.mock;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "delegate",
        json!({"task": "What time is it?", "tools": ["current_time"]}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "The helper is waiting.",
    )));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "go",
                   "tool_ids": ["delegate", "current_time"],
                   "approvals": {"tools": {"current_time": "always"}}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "The helper is waiting.");
    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    let result = last_tool_message(&requests[2].body);
    assert!(result.contains("is waiting"), "{result}");
    let shown = session(&server, body["session_id"].as_str().unwrap()).await;
    let child = session(
        &server,
        shown["children"][0]["session_id"].as_str().unwrap(),
    )
    .await;
    // The call waits for a person in the child's session; it did not run.
    assert_eq!(child["session"]["status"], "waiting");
}
