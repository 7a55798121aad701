//! A limited `user` key stays within its limits on every path that chooses an agent, a model
//! or a tool: each test is named after its path, and drives it with a key limited to the agent
//! `helper`, the model `mock` and the tool `current_time`, against an administrator's agents,
//! models and tools (the second security review's N1).

use agentry_app::auth::KeyLimits;
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::security::{as_key, with_keys};
use super::support::{Server, start};

/// A server with the administrator's agents (`helper`, the key's; `shared` and `roamer`, not
/// the key's), a second model `other` on the same mock, and the limited key.
async fn limited_server() -> (Server, String, String) {
    let server = start().await;
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": "other", "protocol": "openai", "model_name": "o",
                   "base_url": server.mock.openai_base_url()}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    for agent in [
        json!({"id": "helper", "model_id": "mock", "a2a": {},
               "tool_ids": ["current_time", "delegate", "talk_to"]}),
        json!({"id": "shared", "model_id": "mock", "a2a": {}, "tool_ids": ["slow"]}),
        json!({"id": "roamer", "model_id": "other"}),
    ] {
        let (status, body) = server.post("/v1/agents", agent).await;
        assert_eq!(status, 201, "{body}");
    }
    let (admin, user, _) = with_keys(
        &server,
        KeyLimits {
            agents: Some(vec!["helper".into(), "roamer".into()]),
            models: Some(vec!["mock".into()]),
            tools: Some(vec!["current_time".into()]),
            quotas: None,
        },
    )
    .await;
    (server, admin, user)
}

/// `POST /v1/infer` with `body` as `key`.
async fn infer(server: &Server, key: &str, body: Value) -> (u16, Value) {
    as_key(server, key, "POST", "/v1/infer", body).await
}

/// The names of the tools the mock's `request`-th call was offered.
fn offered(server: &Server, request: usize) -> Vec<String> {
    let mut names: Vec<String> = server.mock.requests()[request].body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|tool| tool["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

fn assert_denied(status: u16, answer: &Value, what: &str) {
    assert_eq!(status, 403, "{answer}");
    assert!(answer.to_string().contains(what), "{what}: {answer}");
}

#[tokio::test]
async fn infer_as_an_allowed_agent_only_narrows_its_tools() {
    let (server, admin, user) = limited_server().await;
    // The request's tools never replace the agent's: `*`, or a tool the agent lacks, is refused.
    // (`*` offers every registered tool: here the agent's and the command tool `slow`.)
    for (tools, refused) in [
        (json!(["*"]), "slow"),
        (json!(["slow", "current_time"]), "slow"),
    ] {
        let (status, answer) = infer(
            &server,
            &user,
            json!({"text": "hi", "agent_id": "helper", "tool_ids": tools}),
        )
        .await;
        assert_denied(status, &answer, "may not use the tools");
        assert!(answer.to_string().contains(refused), "{answer}");
    }
    assert!(server.mock.requests().is_empty(), "no model was called");
    // Narrowing the agent's own tools is fine.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, answer) = infer(
        &server,
        &user,
        json!({"text": "hi", "agent_id": "helper", "tool_ids": ["delegate"]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(offered(&server, 0), ["delegate"]);
    // An administrator's request still replaces the agent's tools, as documented.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, answer) = infer(
        &server,
        &admin,
        json!({"text": "hi", "agent_id": "helper", "tool_ids": ["slow"]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(offered(&server, 1), ["slow"]);
}

#[tokio::test]
async fn infer_holds_the_model_it_really_calls() {
    let (server, admin, user) = limited_server().await;
    // An allowed agent on a model outside the key's list; a request overriding an allowed
    // agent's model; a default model outside the list.
    for body in [
        json!({"text": "hi", "agent_id": "roamer"}),
        json!({"text": "hi", "agent_id": "helper", "model_id": "other"}),
    ] {
        let (status, answer) = as_key(&server, &user, "POST", "/v1/infer", body).await;
        assert_denied(status, &answer, "may not use the model \\\"other\\\"");
    }
    let (status, body) = as_key(
        &server,
        &admin,
        "PUT",
        "/v1/models/other",
        json!({"id": "other", "protocol": "openai", "model_name": "o", "default": true,
               "base_url": server.mock.openai_base_url()}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, answer) = as_key(&server, &user, "POST", "/v1/infer", json!({"text": "hi"})).await;
    assert_denied(status, &answer, "may not use the model \\\"other\\\"");
    // An agent's fallbacks are models it calls too.
    let (status, body) = as_key(
        &server,
        &admin,
        "PUT",
        "/v1/agents/helper",
        json!({"id": "helper", "model_id": "mock", "fallback_model_ids": ["other"],
               "tool_ids": ["current_time"]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, answer) = infer(&server, &user, json!({"text": "hi", "agent_id": "helper"})).await;
    assert_denied(status, &answer, "may not use the model \\\"other\\\"");
    assert!(server.mock.requests().is_empty(), "no model was called");
}

#[tokio::test]
async fn background_runs_hold_the_same_limits() {
    let (server, _, user) = limited_server().await;
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        "/v1/runs",
        json!({"text": "hi", "agent_id": "helper", "tool_ids": ["*"]}),
    )
    .await;
    assert_denied(status, &answer, "may not use the tools");
    let (_, listed) = as_key(&server, &user, "GET", "/v1/runs", json!({})).await;
    assert_eq!(listed["runs"], json!([]), "nothing was queued: {listed}");
}

/// Runs `call` as the limited key's `helper`, whose model calls `tool` with `arguments`, and
/// returns the tool's result as the model read it.
async fn tool_result(server: &Server, user: &str, tool: &str, arguments: Value) -> String {
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::tool_call(tool, arguments)));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("done")));
    let (status, answer) = infer(
        server,
        user,
        json!({"text": "go", "agent_id": "helper", "session_id": "new"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let requests = server.mock.requests();
    let last = &requests.last().unwrap().body;
    let message = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap_or_else(|| panic!("a tool message in {last}"));
    message["content"].to_string()
}

#[tokio::test]
async fn delegate_reaches_no_agent_and_no_model_outside_the_key() {
    let (server, _, user) = limited_server().await;
    // Another saved agent; the caller's agent on a model outside the key's list; an allowed
    // agent on such a model: each refused before a sub-agent runs.
    for (n, (arguments, refusal)) in [
        (
            json!({"task": "write the file", "agent": "shared"}),
            "may not run as the agent",
        ),
        (
            json!({"task": "say hi", "model": "other"}),
            "may not use the model",
        ),
        (
            json!({"task": "say hi", "agent": "roamer"}),
            "may not use the model",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let result = tool_result(&server, &user, "delegate", arguments).await;
        assert!(result.contains(refusal), "{result}");
        assert_eq!(
            server.mock.requests().len(),
            2 * (n + 1),
            "no sub-agent ran"
        );
    }
    let (_, sessions) = as_key(&server, &user, "GET", "/v1/sessions", json!({})).await;
    assert_eq!(
        sessions["sessions"].as_array().unwrap().len(),
        3,
        "no child session was created: {sessions}"
    );
}

#[tokio::test]
async fn talk_to_reaches_no_agent_outside_the_key() {
    let (server, _, user) = limited_server().await;
    let result = tool_result(
        &server,
        &user,
        "talk_to",
        json!({"agents": ["shared"], "message": "run slow"}),
    )
    .await;
    assert!(result.contains("may not run as the agent"), "{result}");
    assert_eq!(server.mock.requests().len(), 2, "no sub-agent ran");
}

#[tokio::test]
async fn session_titles_use_only_the_keys_models() {
    let (server, _, user) = limited_server().await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, answer) = infer(&server, &user, json!({"text": "hi", "session_id": "new"})).await;
    assert_eq!(status, 200, "{answer}");
    let session = answer["session_id"].as_str().unwrap().to_owned();
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        &format!("/v1/sessions/{session}/title"),
        json!({"model_id": "other"}),
    )
    .await;
    assert_denied(status, &answer, "may not use the model");
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        &format!("/linglong/v1/sessions/{session}/generate-title"),
        json!({"model_id": "other"}),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert_eq!(
        server.mock.requests().len(),
        1,
        "only the run called a model"
    );
    // On its own model it works.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Greetings")));
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        &format!("/v1/sessions/{session}/title"),
        json!({"model_id": "mock"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["title"], "Greetings");
}

#[tokio::test]
async fn openai_chat_completions_hold_the_keys_models_and_agents() {
    let (server, _, user) = limited_server().await;
    for model in ["other", "agent:shared", "agent:roamer"] {
        let (status, answer) = as_key(
            &server,
            &user,
            "POST",
            "/openai/v1/chat/completions",
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
        assert_eq!(status, 403, "{model}: {answer}");
    }
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        "/openai/v1/responses",
        json!({"model": "other", "input": "hi"}),
    )
    .await;
    assert_eq!(status, 403, "{answer}");
    assert!(server.mock.requests().is_empty(), "no model was called");
}

#[tokio::test]
async fn linglong_infer_holds_the_keys_limits() {
    let (server, _, user) = limited_server().await;
    for body in [
        json!({"text": "hi", "model_id": "other"}),
        json!({"text": "hi", "tool_ids": ["slow"]}),
        json!({"text": "hi", "agent_ids": ["shared"]}),
    ] {
        let (status, answer) =
            as_key(&server, &user, "POST", "/linglong/v1/infer", body.clone()).await;
        assert_eq!(status, 403, "{body}: {answer}");
    }
    assert!(server.mock.requests().is_empty(), "no model was called");
}

#[tokio::test]
async fn a2a_runs_only_the_keys_agents() {
    let (server, _, user) = limited_server().await;
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        "/a2a/shared",
        json!({"jsonrpc": "2.0", "id": "r1", "method": "message/send", "params": {"message":
               {"role": "user", "messageId": "m1", "parts": [{"kind": "text", "text": "hi"}]}}}),
    )
    .await;
    assert!(
        status == 403 || answer.get("error").is_some(),
        "{status}: {answer}"
    );
    assert!(answer.get("result").is_none(), "{answer}");
    assert!(server.mock.requests().is_empty(), "no model was called");
    // Nor is its card readable (issue 47): it is not found for this key, as an agent that is
    // not published; an allowed agent's card is.
    let (status, answer) = as_key(
        &server,
        &user,
        "GET",
        "/a2a/shared/.well-known/agent-card.json",
        Value::Null,
    )
    .await;
    assert_eq!(status, 404, "{answer}");
    let (status, answer) = as_key(
        &server,
        &user,
        "GET",
        "/a2a/helper/.well-known/agent-card.json",
        Value::Null,
    )
    .await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test]
async fn group_members_run_within_the_keys_limits() {
    let (server, _, user) = limited_server().await;
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        "/v1/groups",
        json!({"members": ["helper", "shared"]}),
    )
    .await;
    assert_denied(status, &answer, "may not run as the agent");
    // `roamer` is an allowed agent on a model outside the key's list.
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        "/v1/groups",
        json!({"members": ["helper", "roamer"]}),
    )
    .await;
    assert_eq!(status, 201, "{answer}");
    let session = answer["session_id"].as_str().unwrap().to_owned();
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        &format!("/v1/groups/{session}/messages"),
        json!({"text": "hello all"}),
    )
    .await;
    assert_denied(status, &answer, "may not use the model \\\"other\\\"");
    assert!(server.mock.requests().is_empty(), "no model was called");
}

/// The system prompt of the mock's `request`-th call.
fn system_prompt(server: &Server, request: usize) -> String {
    let body = &server.mock.requests()[request].body;
    body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn end_users_belong_to_the_key_that_names_them() {
    let (server, admin, user) = limited_server().await;
    let key_id = user.split('_').nth(1).unwrap().to_owned();
    // The administrator's end user `alice`, and the limited key's own `alice`.
    for (who, text) in [
        ("alice".to_owned(), "Alice bank PIN is 4321"),
        (format!("{key_id}:alice"), "Alice likes green tea"),
    ] {
        let (status, body) = as_key(
            &server,
            &admin,
            "POST",
            "/v1/agents/helper/memories",
            json!({"kind": "fact", "text": text, "user": who}),
        )
        .await;
        assert_eq!(status, 201, "{body}");
    }
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, answer) = infer(
        &server,
        &user,
        json!({"text": "what do you know about me?", "agent_id": "helper", "user": "alice"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let prompt = system_prompt(&server, 0);
    assert!(prompt.contains("Alice likes green tea"), "{prompt}");
    assert!(
        !prompt.contains("4321"),
        "another namespace's alice leaked: {prompt}"
    );
    // The key cannot step into another namespace by naming it.
    let (status, answer) = infer(
        &server,
        &user,
        json!({"text": "hi", "agent_id": "helper", "user": format!("{key_id}:alice")}),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    // The administrator acts for any end user: its own `alice`, or the key's.
    for (who, expected, absent) in [
        ("alice".to_owned(), "4321", "green tea"),
        (format!("{key_id}:alice"), "green tea", "4321"),
    ] {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
        let (status, answer) = infer(
            &server,
            &admin,
            json!({"text": "what do you know about me?", "agent_id": "helper", "user": who}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
        let prompt = system_prompt(&server, server.mock.requests().len() - 1);
        assert!(prompt.contains(expected), "{who}: {prompt}");
        assert!(!prompt.contains(absent), "{who}: {prompt}");
    }
}

/// Under `--sandbox local` a command is a shell on the host, as the server's user: a `user` key
/// gets no terminal, no sandbox and no tool that runs commands there, while an admin keeps them
/// (the second security review's N16).
#[tokio::test]
async fn without_isolation_a_user_key_gets_no_shell() {
    use agentry_sandbox::{BackendKind, SandboxConfig, SandboxPool, SandboxSpec};
    let server = super::support::start_with(
        |home| {
            let backend = agentry_sandbox::backend(SandboxConfig {
                backend: BackendKind::Local,
                init_exe: Some(super::support::sandbox_init_exe()),
                ..Default::default()
            })
            .unwrap();
            agentry_app::ToolEnvironment {
                workspaces: Some(home.join("workspaces")),
                sandboxes: Some(SandboxPool::new(
                    backend,
                    SandboxSpec::new(home.join("placeholder")),
                )),
                sandbox_root: Some(home.join("sandboxes")),
                ..Default::default()
            }
        },
        |_| {},
    )
    .await;
    let (admin, user, _) = with_keys(&server, KeyLimits::default()).await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, answer) = infer(&server, &user, json!({"text": "hi", "session_id": "new"})).await;
    assert_eq!(status, 200, "{answer}");
    let session = answer["session_id"].as_str().unwrap().to_owned();
    for (method, path, body) in [
        ("POST", "/v1/sandboxes".to_owned(), json!({})),
        (
            "POST",
            "/v1/terminals".to_owned(),
            json!({"session_id": session}),
        ),
        (
            "POST",
            "/v1/infer".to_owned(),
            json!({"text": "hi", "tool_ids": ["exec"]}),
        ),
        (
            "POST",
            "/v1/infer".to_owned(),
            json!({"text": "hi", "tool_ids": ["*"]}),
        ),
    ] {
        let (status, answer) = as_key(&server, &user, method, &path, body).await;
        assert_eq!(status, 403, "{method} {path}: {answer}");
        assert!(
            answer.to_string().contains("without isolation"),
            "{method} {path}: {answer}"
        );
    }
    assert_eq!(
        server.mock.requests().len(),
        1,
        "only the first run called a model"
    );
    // Tools that run no command are still the key's.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, answer) = infer(
        &server,
        &user,
        json!({"text": "hi", "tool_ids": ["current_time"]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    // An admin keeps its sandboxes.
    let (status, answer) = as_key(&server, &admin, "POST", "/v1/sandboxes", json!({})).await;
    assert_eq!(status, 201, "{answer}");
    server.close_sandboxes().await;
}

/// A configured tool's definition may carry literal credentials (an HTTP tool's headers, a
/// command tool's environment): a `user` key reads its summary, an admin the definition (the
/// second security review's N7).
#[tokio::test]
async fn tool_definitions_with_credentials_are_summaries_for_user_keys() {
    let (server, admin, user) = limited_server().await;
    for definition in [
        json!({"kind": "http", "name": "crm", "description": "The CRM.",
               "url": "https://crm.example.com/api", "method": "POST",
               "headers": {"authorization": "Bearer crm-literal-token-123456"}}),
        json!({"kind": "command", "name": "deploy", "description": "Deploys.",
               "program": "/bin/true", "env": {"DEPLOY_TOKEN": "ghp_literalDeployToken999"}}),
    ] {
        let (status, body) = as_key(&server, &admin, "POST", "/v1/tools", definition).await;
        assert_eq!(status, 201, "{body}");
    }
    for (name, secret) in [
        ("crm", "crm-literal-token-123456"),
        ("deploy", "ghp_literalDeployToken999"),
    ] {
        let (status, shown) = as_key(
            &server,
            &user,
            "GET",
            &format!("/v1/tools/{name}"),
            json!({}),
        )
        .await;
        assert_eq!(status, 200, "{shown}");
        assert_eq!(shown["name"], name, "{shown}");
        assert!(!shown.to_string().contains(secret), "{name}: {shown}");
        let (status, full) = as_key(
            &server,
            &admin,
            "GET",
            &format!("/v1/tools/{name}"),
            json!({}),
        )
        .await;
        assert_eq!(status, 200, "{full}");
        assert!(
            full.to_string().contains(secret),
            "the admin reads it: {full}"
        );
    }
}

/// A server with native sandboxes, an admin key, and two `user` keys with these quotas.
async fn quota_server(
    quotas: agentry_app::key_quotas::KeyQuotas,
) -> (Server, String, String, String) {
    use agentry_app::auth::{KeyRole, create_key, create_key_with};
    let server = super::support::start_with(super::support::native_sandboxes, |_| {}).await;
    let admin = create_key(&server.state.app.parts().store, "admin")
        .await
        .unwrap();
    let limits = KeyLimits {
        quotas: Some(quotas),
        ..KeyLimits::default()
    };
    let a = create_key_with(
        &server.state.app.parts().store,
        "a",
        KeyRole::User,
        limits.clone(),
    )
    .await
    .unwrap();
    let b = create_key_with(&server.state.app.parts().store, "b", KeyRole::User, limits)
        .await
        .unwrap();
    server.state.auth.refresh();
    (server, admin.key, a.key, b.key)
}

fn assert_quota(status: u16, answer: &Value, quota: &str) {
    assert_eq!(status, 429, "{answer}");
    assert_eq!(answer["error"]["code"], "quota_exceeded", "{answer}");
    assert_eq!(answer["error"]["details"]["quota"], quota, "{answer}");
}

/// Per-key quotas (the second security review's N8): a key at its limit gets 429 naming the
/// quota, with `Retry-After`; another key is unaffected; the pools keep places for admins.
#[tokio::test]
async fn a_key_at_its_quota_is_refused_and_no_other_key_is() {
    let (server, admin, a, b) = quota_server(agentry_app::key_quotas::KeyQuotas {
        sandboxes: Some(2),
        sessions_per_minute: Some(2),
        ..Default::default()
    })
    .await;
    // Sandboxes: two, then 429; the other key still gets its own.
    for _ in 0..2 {
        let (status, answer) = as_key(&server, &a, "POST", "/v1/sandboxes", json!({})).await;
        assert_eq!(status, 201, "{answer}");
    }
    let response = server
        .http
        .post(format!("{}/v1/sandboxes", server.url))
        .bearer_auth(&a)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 429);
    assert!(response.headers().contains_key("retry-after"));
    let answer: Value = response.json().await.unwrap();
    assert_quota(429, &answer, "sandboxes");
    let (status, answer) = as_key(&server, &b, "POST", "/v1/sandboxes", json!({})).await;
    assert_eq!(status, 201, "{answer}");
    // New sessions: two a minute.
    for _ in 0..2 {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
        let (status, answer) = infer(
            &server,
            &a,
            json!({"text": "hi", "model_id": "mock", "session_id": "new"}),
        )
        .await;
        assert_eq!(status, 200, "{answer}");
    }
    let (status, answer) = infer(
        &server,
        &a,
        json!({"text": "hi", "model_id": "mock", "session_id": "new"}),
    )
    .await;
    assert_quota(status, &answer, "sessions_per_minute");
    assert_eq!(
        server.mock.requests().len(),
        2,
        "the refused run called no model"
    );
    // The key's use against each quota.
    let key_id = a.split('_').nth(1).unwrap();
    let (status, shown) = as_key(
        &server,
        &admin,
        "GET",
        &format!("/v1/api-keys/{key_id}"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(
        shown["quotas"]["sandboxes"],
        json!({"used": 2, "limit": 2}),
        "{shown}"
    );
    assert_eq!(
        shown["quotas"]["sessions_per_minute"],
        json!({"used": 2, "limit": 2}),
        "{shown}"
    );
    assert_eq!(
        shown["quotas"]["live_runs"]["limit"], 16,
        "the default: {shown}"
    );
    server.close_sandboxes().await;
}

#[tokio::test]
async fn user_keys_leave_the_pools_last_places_to_admins() {
    let (server, admin, a, _) = quota_server(agentry_app::key_quotas::KeyQuotas {
        sandboxes: Some(1000),
        ..Default::default()
    })
    .await;
    let max = server.state.app.parts().sandboxes.max();
    let reserve = agentry_app::quotas::ADMIN_RESERVE;
    for n in 0..max - reserve {
        let (status, answer) = as_key(&server, &a, "POST", "/v1/sandboxes", json!({})).await;
        assert_eq!(status, 201, "sandbox {n}: {answer}");
    }
    let (status, answer) = as_key(&server, &a, "POST", "/v1/sandboxes", json!({})).await;
    assert_quota(status, &answer, "sandboxes");
    let (status, answer) = as_key(&server, &admin, "POST", "/v1/sandboxes", json!({})).await;
    assert_eq!(status, 201, "the admin's reserve holds: {answer}");
    server.close_sandboxes().await;
}

#[tokio::test]
async fn runs_going_and_tokens_of_the_day_are_held_to_their_quotas() {
    let (server, _, a, b) = quota_server(agentry_app::key_quotas::KeyQuotas {
        live_runs: Some(1),
        tokens_per_day: Some(100),
        ..Default::default()
    })
    .await;
    // One run going: the key's next is refused, the other key's goes.
    server.mock.enqueue(
        Reply::scripted(ScriptedTurn::text("slow").with_usage(40, 20))
            .delay_headers(std::time::Duration::from_millis(1500)),
    );
    let first = {
        let server_url = server.url.clone();
        let http = server.http.clone();
        let key = a.clone();
        tokio::spawn(async move {
            http.post(format!("{server_url}/v1/infer"))
                .bearer_auth(key)
                .json(&json!({"text": "hi", "model_id": "mock", "session_id": "new"}))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (status, answer) = infer(&server, &a, json!({"text": "again", "model_id": "mock"})).await;
    assert_quota(status, &answer, "live_runs");
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("other").with_usage(1, 1),
    ));
    let (status, answer) = infer(&server, &b, json!({"text": "hi", "model_id": "mock"})).await;
    assert_eq!(status, 200, "another key's run goes: {answer}");
    assert_eq!(first.await.unwrap(), 200);
    // 60 tokens used (the ledger charges runs in sessions); one more run of 60 goes past the
    // day's 100, and then no more.
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("more").with_usage(40, 20),
    ));
    let (status, answer) = infer(
        &server,
        &a,
        json!({"text": "more", "model_id": "mock", "session_id": "new"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = infer(
        &server,
        &a,
        json!({"text": "more", "model_id": "mock", "session_id": "new"}),
    )
    .await;
    assert_quota(status, &answer, "tokens_per_day");
}

/// `sessions_per_minute` holds over every node sharing the database: each counts the sessions
/// the store holds, not only the ones it made (a key could create its quota on every node).
#[tokio::test]
async fn the_sessions_of_a_minute_are_counted_over_every_node() {
    let (server, _, a, _) = quota_server(agentry_app::key_quotas::KeyQuotas {
        sessions_per_minute: Some(2),
        ..Default::default()
    })
    .await;
    // A second node on the same store.
    let other = agentry_server::AppState::with_tools(
        server.state.app.parts().store.clone(),
        super::support::host_commands(server.home.path()),
    )
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let other_url = format!("http://{}", listener.local_addr().unwrap());
    let router = agentry_server::router(other);
    tokio::spawn(async move {
        axum::serve(
            listener,
            router.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });
    for url in [&server.url, &other_url] {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
        let response = server
            .http
            .post(format!("{url}/v1/infer"))
            .bearer_auth(&a)
            .json(&json!({"text": "hi", "model_id": "mock", "session_id": "new"}))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200, "{url}");
    }
    // The first node made one of the two: the key's third of the minute is refused there.
    let (status, answer) = infer(
        &server,
        &a,
        json!({"text": "hi", "model_id": "mock", "session_id": "new"}),
    )
    .await;
    assert_quota(status, &answer, "sessions_per_minute");
    let wait = answer["error"]["details"]["retry_after_secs"]
        .as_u64()
        .unwrap();
    assert!((1..=60).contains(&wait), "{answer}");
}

/// Waits until `key`'s own usage report counts `tokens` (input and output) in all.
async fn wait_for_tokens(server: &Server, key: &str, tokens: u64) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (status, report) = as_key(server, key, "GET", "/v1/usage", json!({})).await;
        assert_eq!(status, 200, "{report}");
        let total = &report["total"];
        let counted = total["input_tokens"].as_u64().unwrap_or(0)
            + total["output_tokens"].as_u64().unwrap_or(0);
        if counted == tokens {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the key's report counts {counted} tokens, not {tokens}: {report}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A run without a session is charged to the key that started it like one in a session: its
/// tokens show in the key's usage report and count against its `tokens_per_day` (the ledger
/// held only sessions' calls, so stateless runs were free of the quota).
#[tokio::test]
async fn stateless_runs_count_against_the_keys_tokens_of_the_day() {
    let (server, _, a, b) = quota_server(agentry_app::key_quotas::KeyQuotas {
        tokens_per_day: Some(100),
        ..Default::default()
    })
    .await;
    // `/v1/infer` without a session, then OpenAI chat without one: 60 tokens each.
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("one").with_usage(40, 20),
    ));
    let (status, answer) = infer(&server, &a, json!({"text": "hi", "model_id": "mock"})).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["session_id"].is_null(), "a stateless run: {answer}");
    wait_for_tokens(&server, &a, 60).await;
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("two").with_usage(40, 20),
    ));
    let (status, answer) = as_key(
        &server,
        &a,
        "POST",
        "/openai/v1/chat/completions",
        json!({"model": "mock", "messages": [{"role": "user", "content": "hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    wait_for_tokens(&server, &a, 120).await;
    // Past the day's 100: the key's next run is refused, stateless or not; the other key's
    // day is its own.
    for body in [
        json!({"text": "hi", "model_id": "mock"}),
        json!({"text": "hi", "model_id": "mock", "session_id": "new"}),
    ] {
        let (status, answer) = infer(&server, &a, body).await;
        assert_quota(status, &answer, "tokens_per_day");
    }
    wait_for_tokens(&server, &b, 0).await;
}

/// Continuing a session starts a run on the default model: it is held to the key's grant like
/// any other run.
#[tokio::test]
async fn continuing_a_session_holds_the_keys_models() {
    let (server, admin, user) = limited_server().await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let (status, answer) = infer(
        &server,
        &user,
        json!({"text": "hi", "model_id": "mock", "session_id": "new"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    let session = answer["session_id"].as_str().unwrap().to_owned();
    let (status, body) = as_key(
        &server,
        &admin,
        "PUT",
        "/v1/models/other",
        json!({"id": "other", "protocol": "openai", "model_name": "o", "default": true,
               "base_url": server.mock.openai_base_url()}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, answer) = as_key(
        &server,
        &user,
        "POST",
        &format!("/v1/sessions/{session}/continue"),
        json!({}),
    )
    .await;
    assert_denied(status, &answer, "may not use the model \\\"other\\\"");
    assert_eq!(
        server.mock.requests().len(),
        1,
        "only the first run called a model"
    );
}
