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
    // Several agents make a group chat, whose members must exist.
    let (status, body) = server
        .post("/v1/infer", json!({"agent_ids": ["a", "b"], "text": "x"}))
        .await;
    assert_eq!(status, 400);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no agent \"a\"")
    );
}

/// A second model on the mock, `backup` (provider model name `b`).
async fn add_backup_model(server: &super::support::Server) {
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": "backup", "protocol": "openai", "base_url": server.mock.openai_base_url(),
                   "model_name": "b"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

/// A skill folder `<dir>/<name>` with a SKILL.md.
fn skill(dir: &std::path::Path, name: &str) -> String {
    let folder = dir.join(name);
    std::fs::create_dir_all(&folder).unwrap();
    std::fs::write(
        folder.join("SKILL.md"),
        format!("---\nname: {name}\ndescription: The {name} skill.\n---\nDo it well.\n"),
    )
    .unwrap();
    folder.to_string_lossy().into_owned()
}

fn tool_names(body: &serde_json::Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn an_agent_applies_fallbacks_skills_a_template_and_its_limits() {
    let server = start().await;
    add_backup_model(&server).await;
    let (status, body) = server
        .post(
            "/v1/prompt-templates",
            json!({"name": "persona", "template": "You are {{ who }}."}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    // Under the data folder's `skills`, where the server allows skill folders.
    let skill_path = skill(&server.home.path().join("skills"), "summarise");
    let agent = json!({
        "id": "writer",
        "model_id": "mock",
        "labels": ["docs"],
        "fallback_model_ids": ["backup"],
        "tool_ids": ["current_time"],
        "skills": [skill_path],
        "prompt_template": "persona",
        "template_arguments": {"who": "a careful writer"},
        "params": {"max_tokens": 500},
        "limits": {"max_tool_rounds": 4, "max_tokens": 300, "max_tool_calls": 5,
                   "wall_time_secs": 60}
    });
    let (status, body) = server.post("/v1/agents", agent.clone()).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body, agent);
    let (_, read) = server.get("/v1/agents/writer").await;
    assert_eq!(read, agent);

    // The primary model is not found at the provider: the backup answers.
    server.mock.enqueue(Reply::error(
        404,
        json!({"error": {"message": "no such model", "type": "invalid_request_error",
                         "code": "model_not_found"}}),
    ));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Written.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "agent_id": "writer", "text": "Write."}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "Written.");
    let requests = server.mock.requests();
    let models: Vec<&str> = requests
        .iter()
        .map(|r| r.body["model"].as_str().unwrap())
        .collect();
    assert_eq!(models, ["m", "b"]);
    let sent = &requests[1].body;
    assert_eq!(sent["messages"][0]["content"], "You are a careful writer.");
    let mut tools = tool_names(sent);
    tools.sort();
    assert_eq!(tools, ["current_time", "summarise"]);
    // The per-call cap is the smaller of the agent's params and its token quota.
    let cap = sent["max_completion_tokens"]
        .as_u64()
        .or(sent["max_tokens"].as_u64());
    assert_eq!(cap, Some(300));

    // The limits reach the run (recorded with it in the session's log).
    let session = body["session_id"].as_str().unwrap();
    let (_, events) = server.get(&format!("/v1/sessions/{session}/events")).await;
    let started = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"].clone())
        .find(|e| e["type"] == "run_started")
        .unwrap();
    assert_eq!(started["limits"]["max_tool_rounds"], 4, "{events}");
    assert_eq!(started["limits"]["max_output_tokens"], 300);
    assert_eq!(started["limits"]["max_tool_calls"], 5);
    assert_eq!(started["limits"]["deadline"], 60_000);
    assert_eq!(started["fallback_models"], json!(["backup"]));

    // A request naming its own model and tools overrides the agent (and drops its fallbacks).
    server.mock.take_requests();
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_ids": ["writer"], "model_id": "backup", "tool_ids": [], "text": "x"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = &server.mock.requests()[0].body;
    assert_eq!(sent["model"], "b");
    assert!(tool_names(sent).is_empty());
}

#[tokio::test]
async fn an_agents_quotas_stop_its_runs_with_a_clear_reason() {
    let server = start().await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "caller", "model_id": "mock", "tool_ids": ["current_time"],
                   "limits": {"max_tool_calls": 2}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    server
        .mock
        .set_fallback(Reply::scripted(ScriptedTurn::tool_call(
            "current_time",
            json!({}),
        )));
    let (status, body) = server
        .post("/v1/infer", json!({"agent_id": "caller", "text": "go"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stop_reason"], "quota_exceeded");
    let results = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .count();
    assert_eq!(results, 2, "{body}");
    assert_eq!(server.mock.request_count(), 3);

    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "talker", "model_id": "mock", "tool_ids": ["current_time"],
                   "limits": {"max_tokens": 25}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    server.mock.take_requests();
    server.mock.set_fallback(Reply::scripted(
        ScriptedTurn::tool_call("current_time", json!({})).with_usage(5, 10),
    ));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "agent_id": "talker", "text": "go"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["stop_reason"], "quota_exceeded");
    assert_eq!(body["usage"]["output_tokens"], 30);
    let caps: Vec<u64> = server
        .mock
        .requests()
        .iter()
        .map(|r| {
            r.body["max_completion_tokens"]
                .as_u64()
                .or(r.body["max_tokens"].as_u64())
                .unwrap()
        })
        .collect();
    assert_eq!(caps, [25, 15, 5]);
}

#[tokio::test]
async fn new_agent_fields_are_validated_and_old_agents_still_load() {
    let server = start().await;
    add_backup_model(&server).await;
    let missing = server
        .home
        .path()
        .join("skills/nothing")
        .to_string_lossy()
        .into_owned();
    for (agent, needle) in [
        (
            json!({"id": "a", "model_id": "mock", "fallback_model_ids": ["gone"]}),
            "gone",
        ),
        (
            json!({"id": "a", "model_id": "mock", "fallback_model_ids": ["mock"]}),
            "own fallback",
        ),
        (
            json!({"id": "a", "model_id": "mock", "fallback_model_ids": ["backup", "backup"]}),
            "twice",
        ),
        (
            json!({"id": "a", "model_id": "mock", "skills": [missing]}),
            "skill",
        ),
        (
            json!({"id": "a", "model_id": "mock", "mcp_servers": ["nowhere"]}),
            "not configured",
        ),
        (
            json!({"id": "a", "model_id": "mock", "mcp_servers": ["a__b"]}),
            "mcp_servers",
        ),
        (
            json!({"id": "a", "model_id": "mock", "prompt_template": "none"}),
            "none",
        ),
        (
            json!({"id": "a", "model_id": "mock", "system": "x", "prompt_template": "t"}),
            "not both",
        ),
        (
            json!({"id": "a", "model_id": "mock", "template_arguments": {"x": 1}}),
            "needs a `prompt_template`",
        ),
        (
            json!({"id": "a", "model_id": "mock", "limits": {"max_tokens": 0}}),
            "max_tokens",
        ),
        (
            json!({"id": "a", "model_id": "mock", "limits": {"max_tool_calls": 0}}),
            "max_tool_calls",
        ),
        (
            json!({"id": "a", "model_id": "mock", "limits": {"wall_time_secs": 0}}),
            "wall_time_secs",
        ),
        (
            json!({"id": "a", "model_id": "mock", "limits": {"rounds": 3}}),
            "unknown field",
        ),
        (
            json!({"id": "a", "model_id": "mock", "max_tool_rounds": 2,
                   "limits": {"max_tool_rounds": 3}}),
            "disagree",
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

    // An agent stored before the new fields existed loads and runs with its old limits.
    server
        .state
        .app
        .parts()
        .store
        .put_config(
            agentry_store::ConfigKind::Agent,
            "old",
            &json!({"id": "old", "model_id": "mock", "tool_ids": [], "labels": [],
                    "max_tool_rounds": 1, "params": {}}),
        )
        .await
        .unwrap();
    let (status, read) = server.get("/v1/agents/old").await;
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["max_tool_rounds"], 1);
    assert!(read.get("limits").is_none());
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("still here")));
    let (status, body) = server
        .post("/v1/infer", json!({"agent_id": "old", "text": "x"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "still here");
    assert!(tool_names(&server.mock.requests()[0].body).is_empty());

    // `agent_id` and `agent_ids` must agree.
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"agent_id": "old", "agent_ids": ["other"], "text": "x"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
}

#[tokio::test]
async fn an_agent_gets_the_tools_of_its_mcp_servers() {
    let server = super::support::start_sandboxed().await;
    let spec = super::support::mcp_servers().everything();
    let (status, body) = server
        .post(
            "/v1/tools/mcp",
            json!({"mcpServers": {"everything": {"command": spec.program, "args": spec.args}}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "mcp-user", "model_id": "mock", "tool_ids": ["current_time"],
                   "mcp_servers": ["everything"]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "everything__echo",
        json!({"message": "hello"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("echoed")));
    let (status, body) = server
        .post("/v1/infer", json!({"agent_id": "mcp-user", "text": "echo"}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "echoed");
    let tools = tool_names(&server.mock.requests()[0].body);
    assert!(tools.contains(&"current_time".to_owned()), "{tools:?}");
    assert!(tools.contains(&"everything__echo".to_owned()), "{tools:?}");
    assert!(
        tools
            .iter()
            .all(|t| t == "current_time" || t.starts_with("everything__")),
        "{tools:?}"
    );
    let result = server.mock.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap();
    assert!(result["content"].to_string().contains("hello"), "{result}");
}

/// Skill folders must be inside the data folder's `skills` (or a configured root): a folder
/// elsewhere, reached through `..` or through a symlink, is a 400 naming the rule, and nothing
/// is saved.
#[tokio::test]
async fn skill_folders_outside_the_skill_roots_are_refused() {
    let server = start().await;
    let root = server.home.path().join("skills");
    let inside = skill(&root, "inside");
    let elsewhere = tempfile::tempdir().unwrap();
    let outside = skill(elsewhere.path(), "outside");
    // From `<home>/skills` up to `/` with `..`, then down to the other folder.
    let mut dotted = root.clone();
    for _ in 1..root.components().count() {
        dotted.push("..");
    }
    let dotted = dotted
        .join(elsewhere.path().strip_prefix("/").unwrap())
        .join("outside")
        .to_string_lossy()
        .into_owned();
    let linked = root.join("linked");
    std::os::unix::fs::symlink(&outside, &linked).unwrap();
    let linked = linked.to_string_lossy().into_owned();
    for path in [&outside, &dotted, &linked, &"/etc".to_owned()] {
        let (status, body) = server
            .post(
                "/v1/agents",
                json!({"id": "a", "model_id": "mock", "skills": [path]}),
            )
            .await;
        assert_eq!(status, 400, "{path}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("outside the allowed skill folders")
                && message.contains(&root.display().to_string()),
            "{path}: {message}"
        );
    }
    let (status, body) = server.get("/v1/agents/a").await;
    assert_eq!(status, 404, "{body}");
    // Inside, it is accepted.
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "a", "model_id": "mock", "skills": [inside]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

/// A page on loopback, for `fetch`.
async fn page_server() -> String {
    let app = axum::Router::new().route(
        "/page",
        axum::routing::get(|| async { "hello from the page" }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/page")
}

#[tokio::test]
async fn an_agents_network_setting_narrows_fetch() {
    use agentry_tools::{FetchConfig, NetworkPolicy};
    // The operator lets `fetch` reach the test server (on loopback, so named as a private host).
    let server = super::support::start_with(
        |home| agentry_app::ToolEnvironment {
            workspaces: Some(home.join("workspaces")),
            fetch: FetchConfig {
                policy: NetworkPolicy::Allow(vec!["127.0.0.1".into()]),
                private_hosts: vec!["127.0.0.1".into()],
                ..FetchConfig::default()
            },
            ..Default::default()
        },
        |_| {},
    )
    .await;
    let url = page_server().await;

    // A bad setting is refused with the field named.
    for (network, needle) in [
        (json!({"allow": ["exa mple.com"]}), "`network`"),
        (json!({"allow": ["a.*.b"]}), "a.*.b"),
        (json!("sometimes"), "unknown variant"),
    ] {
        let agent = json!({"id": "bad", "model_id": "mock", "network": network});
        let (status, body) = server.post("/v1/agents", agent).await;
        assert_eq!(status, 400, "{network}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(needle),
            "{network}: {body}"
        );
    }

    for (id, network) in [
        ("open", None),
        ("narrow", Some(json!({"allow": ["docs.rs"]}))),
        ("offline", Some(json!("off"))),
    ] {
        let mut agent = json!({"id": id, "model_id": "mock", "tool_ids": ["fetch"]});
        if let Some(network) = &network {
            agent["network"] = network.clone();
        }
        let (status, body) = server.post("/v1/agents", agent).await;
        assert!(status == 200 || status == 201, "{id}: {body}");
        let (_, read) = server.get(&format!("/v1/agents/{id}")).await;
        assert_eq!(read.get("network"), network.as_ref(), "{id}: {read}");
    }

    for (id, expected) in [
        ("open", "hello from the page"),
        (
            "narrow",
            "127.0.0.1 is not on this agent's network allow-list",
        ),
        ("offline", "fetching is off for this agent"),
    ] {
        server.mock.clear_queue();
        let before = server.mock.request_count();
        server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "fetch",
            json!({"url": url}),
        )));
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text("done")));
        let (status, body) = server
            .post(
                "/v1/infer",
                json!({"agent_id": id, "text": "read the page"}),
            )
            .await;
        assert_eq!(status, 200, "{id}: {body}");
        let requests = server.mock.requests();
        assert_eq!(requests.len(), before + 2, "{id}");
        let result = requests[before + 1].body.to_string();
        assert!(result.contains(expected), "{id}: {result}");
    }
}
