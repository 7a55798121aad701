//! Agents: saved, validated, and used by `agent_ids` in inference.

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::json;

use super::support::start;

#[tokio::test]
async fn agents_are_saved_checked_and_used_for_inference() {
    let server = start().await;
    let agent = json!({
        "id": "timekeeper",
        "nickname": "Tim",
        "model_id": "mock",
        "tool_ids": ["current_time"],
        "system_prompt": "You keep time.",
        "labels": ["ops"],
        "max_tool_rounds": 3
    });
    let (status, body) = server.post("/v1/agents", agent.clone()).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["system"], "You keep time.");
    let (status, _) = server.post("/v1/agents", agent.clone()).await;
    assert_eq!(status, 409);
    let (_, list) = server.get("/v1/agents").await;
    assert_eq!(list["agents"].as_array().unwrap().len(), 1);

    // Inference as the agent: its model, only its tools, its system prompt.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("It is late.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "agent_ids": ["timekeeper"], "text": "Time?"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = &server.mock.requests()[0].body;
    assert_eq!(sent["messages"][0]["content"], "You keep time.");
    let tools: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["current_time"]);

    // Replace, read back, delete.
    let mut changed = agent.clone();
    changed["nickname"] = json!("Timothy");
    let response = server
        .http
        .put(format!("{}/v1/agents/timekeeper", server.url))
        .json(&changed)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let (_, read) = server.get("/v1/agents/timekeeper").await;
    assert_eq!(read["nickname"], "Timothy");
    let (status, _) = server
        .raw(reqwest::Method::DELETE, "/v1/agents/timekeeper", "")
        .await;
    assert_eq!(status, 204);
    let (status, _) = server.get("/v1/agents/timekeeper").await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn bad_agents_are_refused_and_nothing_is_written() {
    let server = start().await;
    for (agent, needle) in [
        (json!({"id": "a", "model_id": "gpt-9"}), "gpt-9"),
        (
            json!({"id": "a", "model_id": "mock", "tool_ids": ["rm_rf"]}),
            "rm_rf",
        ),
        (
            json!({"id": "../x", "model_id": "mock"}),
            "invalid agent name",
        ),
        (
            json!({"id": "a", "model_id": "mock", "colour": "red"}),
            "unknown field",
        ),
        (json!({"id": "a", "model_id": 5}), "invalid type"),
        (
            json!({"id": "a", "model_id": "mock", "nickname": ""}),
            "nickname",
        ),
    ] {
        let (status, body) = server.post("/v1/agents", agent.clone()).await;
        assert_eq!(status, 400, "{agent}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(needle),
            "{agent}: {body}"
        );
    }
    let (_, list) = server.get("/v1/agents").await;
    assert_eq!(list["agents"].as_array().unwrap().len(), 0);
    let (status, _) = server
        .post("/v1/infer", json!({"agent_ids": ["nobody"], "text": "x"}))
        .await;
    assert_eq!(status, 400);
    let (status, body) = server
        .post("/v1/infer", json!({"agent_ids": ["a", "b"], "text": "x"}))
        .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("one agent")
    );
}
