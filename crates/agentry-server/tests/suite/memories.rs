//! Agents' long-term memories over the API: add (de-duplicated), list, search, edit, delete.

use reqwest::Method;
use serde_json::json;

use super::support::start;

#[tokio::test]
async fn an_agents_memories_are_added_searched_edited_and_deleted() {
    let server = start().await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "keeper", "model_id": "mock", "nickname": "Keeper"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");

    let (status, tea) = server
        .post(
            "/v1/agents/keeper/memories",
            json!({"kind": "preference", "text": "Alice prefers green tea.", "user": "alice"}),
        )
        .await;
    assert_eq!(status, 201, "{tea}");
    assert_eq!(tea["agent_id"], "keeper");
    assert_eq!(tea["user"], "alice");
    assert_eq!(tea["kind"], "preference");
    // The same memory again: refreshed, not duplicated.
    let (status, again) = server
        .post(
            "/v1/agents/keeper/memories",
            json!({"kind": "preference", "text": "alice prefers GREEN tea", "user": "alice"}),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["id"], tea["id"]);
    let (status, deploy) = server
        .post(
            "/v1/agents/keeper/memories",
            json!({"kind": "decision", "text": "Releases go out on Tuesdays"}),
        )
        .await;
    assert_eq!(status, 201, "{deploy}");

    // Scopes: the agent's own memories, and Alice's.
    let (_, own) = server.get("/v1/agents/keeper/memories").await;
    assert_eq!(own["memories"].as_array().unwrap().len(), 1, "{own}");
    assert_eq!(own["memories"][0]["text"], "Releases go out on Tuesdays");
    let (_, alice) = server.get("/v1/agents/keeper/memories?user=alice").await;
    assert_eq!(alice["memories"].as_array().unwrap().len(), 1, "{alice}");
    // Search, stemmed.
    let (status, found) = server
        .get("/v1/agents/keeper/memories?q=releasing&limit=5")
        .await;
    assert_eq!(status, 200, "{found}");
    assert_eq!(found["memories"][0]["id"], deploy["id"]);
    let (_, none) = server.get("/v1/agents/keeper/memories?q=coffee").await;
    assert_eq!(none["memories"], json!([]));

    // Edit and delete.
    let id = tea["id"].as_u64().unwrap();
    let (status, edited) = server
        .raw(
            Method::PATCH,
            &format!("/v1/memories/{id}"),
            r#"{"text": "Alice prefers black tea"}"#,
        )
        .await;
    assert_eq!(status, 200, "{edited}");
    assert_eq!(edited["text"], "Alice prefers black tea");
    assert_eq!(edited["kind"], "preference", "the kind is kept");
    let (_, read) = server.get(&format!("/v1/memories/{id}")).await;
    assert_eq!(read["text"], "Alice prefers black tea");
    let (status, _) = server
        .raw(Method::DELETE, &format!("/v1/memories/{id}"), "")
        .await;
    assert_eq!(status, 204);
    let (status, _) = server.get(&format!("/v1/memories/{id}")).await;
    assert_eq!(status, 404);

    // Bad input: unknown agent, bad user, empty text, unknown kind, a search with no words.
    let (status, _) = server.get("/v1/agents/nobody/memories").await;
    assert_eq!(status, 404);
    let (status, _) = server.get("/v1/agents/keeper/memories?user=a%20b").await;
    assert_eq!(status, 400);
    for body in [
        json!({"kind": "fact", "text": ""}),
        json!({"kind": "rumour", "text": "x"}),
        json!({"kind": "fact", "text": "x", "extra": 1}),
    ] {
        let (status, error) = server.post("/v1/agents/keeper/memories", body).await;
        assert_eq!(status, 400, "{error}");
    }
    let (status, _) = server.get("/v1/agents/keeper/memories?q=%3F%21").await;
    assert_eq!(status, 400);
    let (status, _) = server.get("/v1/memories/not-a-number").await;
    assert_eq!(status, 400);
}
