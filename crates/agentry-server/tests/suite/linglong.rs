//! The seed system's API under `/linglong`, with the seed's own shapes: its README's streaming
//! request verbatim, stateless multi-turn histories, its answer and stream, its catalogue and
//! session routes, its errors, and a real seed client (its `example_stream_as_infer.py`).

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, start};

/// Registers the README's model (`qwen3-14b`) through the seed's own route, pointing at the
/// mock, and a `web_search` tool.
async fn readme_catalogue(server: &Server) {
    let (status, body) = server
        .post(
            "/linglong/v1/models",
            json!({
                "model_id": "qwen3-14b",
                "api_base": server.mock.openai_base_url(),
                "model_name": "qwen3:14b",
                "api_protocol": "openai",
                "model_type": "llm",
                "generate_params": {"temperature": 0.7},
            }),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        body,
        json!({"status": "registered", "model_id": "qwen3-14b"})
    );
    server
        .state
        .app.parts().store
        .put_config(
            agentry_store::ConfigKind::Tool,
            "web_search",
            &json!({"kind": "command", "name": "web_search", "description": "Search the web.",
                    "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                    "program": "/bin/sh", "args": ["-c", "cat > /dev/null; echo 'AI news: all good'"]}),
        )
        .await
        .unwrap();
    server.state.app.reload_runtime().await.unwrap();
}

/// A streamed answer's `data:` payloads, in order.
async fn stream(server: &Server, body: Value) -> (Option<String>, String, Vec<String>) {
    let response = server
        .http
        .post(format!("{}/linglong/v1/infer/stream", server.url))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let session = response
        .headers()
        .get("x-session-id")
        .map(|value| value.to_str().unwrap().to_owned());
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let text = response.text().await.unwrap();
    let data = text
        .split("\n\n")
        .filter(|event| !event.is_empty())
        .map(|event| {
            event
                .strip_prefix("data: ")
                .unwrap_or_else(|| panic!("not a data event: {event:?}"))
                .to_owned()
        })
        .collect();
    (session, content_type, data)
}

#[tokio::test]
async fn the_readme_streaming_request_works_verbatim() {
    let server = start().await;
    readme_catalogue(&server).await;
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "web_search",
        json!({"query": "latest AI news"}),
    )));
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("Here is the latest AI news.").with_usage(40, 8),
    ));
    // The README's request, as written there.
    let readme: Value = serde_json::from_str(
        r#"{
  "model_id": "qwen3-14b",
  "tool_ids": ["web_search"],
  "messages": [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Search for the latest AI news."}
  ],
  "stream": true,
  "max_tool_rounds": 10,
  "session_id": "new"
}"#,
    )
    .unwrap();
    let (session, content_type, data) = stream(&server, readme).await;
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let session = session.expect("X-Session-Id");
    assert_eq!(data.last().unwrap(), "[DONE]");
    let frames: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    // A tool-call fragment with its index, the tool's result, a usage message per round, the
    // answer's deltas, and the session last.
    let call = frames
        .iter()
        .find(|f| f.get("tool_calls").is_some())
        .unwrap();
    assert_eq!(call["role"], "assistant");
    assert_eq!(call["tool_calls"][0]["_index"], 0);
    assert_eq!(call["tool_calls"][0]["name"], "web_search");
    let tool = frames.iter().find(|f| f["role"] == "tool").unwrap();
    assert_eq!(tool["name"], "web_search");
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("AI news: all good")
    );
    let usages: Vec<Value> = frames
        .iter()
        .filter(|f| f["role"] == "usage")
        .map(|f| {
            assert_eq!(f["name"], "round");
            serde_json::from_str(f["content"].as_str().unwrap()).unwrap()
        })
        .collect();
    assert_eq!(usages.len(), 2, "{frames:#?}");
    assert_eq!(usages[1]["prompt_tokens"], 40);
    assert_eq!(usages[1]["completion_tokens"], 8);
    assert!(usages[1]["overall_ms"].is_number());
    assert!(usages[0].get("overall_ms").is_none());
    let text: String = frames
        .iter()
        .filter(|f| f["role"] == "assistant")
        .filter_map(|f| f["content"].as_str())
        .collect();
    assert_eq!(text, "Here is the latest AI news.");
    assert_eq!(frames.last().unwrap(), &json!({"session_id": session}));
    // The model saw the system prompt, the user message and the tool; the session holds the
    // conversation, in the seed's shape.
    let first = &server.mock.requests()[0].body;
    assert_eq!(first["messages"][0]["role"], "system");
    assert_eq!(
        first["messages"][0]["content"],
        "You are a helpful assistant."
    );
    assert_eq!(first["tools"][0]["function"]["name"], "web_search");
    let (status, shown) = server
        .get(&format!("/linglong/v1/sessions/{session}"))
        .await;
    assert_eq!(status, 200, "{shown}");
    let roles: Vec<&str> = shown["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "assistant"]);
    assert_eq!(shown["meta"]["session_id"], session);
    server.mock.check_protocol().unwrap();
}

#[tokio::test]
async fn a_stateless_history_reaches_the_model_intact() {
    let server = start().await;
    server.mock.enqueue(Reply::scripted(
        ScriptedTurn::text("You asked about Oslo.").with_usage(50, 5),
    ));
    let history = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"name": "current_time", "arguments": "{}"}
        ]},
        {"role": "tool", "name": "current_time", "content": "12:00"},
        {"role": "assistant", "content": "It is noon; cold.", "thinking": "check time"},
        {"role": "user", "content": "What did I ask?"}
    ]);
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "messages": history}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["success"], true);
    assert!(body.get("session_id").is_none());
    assert!(body.get("error").is_none());
    let messages = body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 1, "{body}");
    assert_eq!(messages[0]["role"], "assistant");
    assert_eq!(messages[0]["content"], "You asked about Oslo.");
    assert_eq!(body["stat"]["prompt_tokens"], 50);
    assert_eq!(messages[0]["stat"], body["stat"]);
    // The model got the whole conversation, calls and results paired, in order.
    let sent = &server.mock.requests()[0].body["messages"];
    let roles: Vec<&str> = sent
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "assistant", "user"]
    );
    assert_eq!(
        sent[3]["tool_call_id"], sent[2]["tool_calls"][0]["id"],
        "{sent:#}"
    );
    assert_eq!(sent[5]["content"], "What did I ask?");
    server.mock.check_protocol().unwrap();
    // Nothing stored.
    let (_, sessions) = server.get("/linglong/v1/sessions").await;
    assert_eq!(sessions["sessions"], json!([]));
}

#[tokio::test]
async fn a_failed_run_is_the_seeds_error() {
    let server = start().await;
    server.mock.enqueue(Reply::error(
        400,
        json!({"error": {"message": "bad things", "type": "invalid_request_error"}}),
    ));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "text": "Hi"}),
        )
        .await;
    assert_eq!(status, 500, "{body}");
    assert_eq!(body["success"], false);
    assert!(
        body["error"].as_str().unwrap().starts_with("Error: "),
        "{body}"
    );
    assert!(
        body["error_code"]
            .as_str()
            .unwrap()
            .chars()
            .all(|c| c.is_ascii_uppercase() || c == '_')
    );
    // Streamed: the error as assistant text, then [DONE].
    server.mock.enqueue(Reply::error(
        400,
        json!({"error": {"message": "bad things", "type": "invalid_request_error"}}),
    ));
    let (_, _, data) = stream(&server, json!({"model_id": "mock", "text": "Hi"})).await;
    assert_eq!(data.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(error["role"], "assistant");
    assert!(error["content"].as_str().unwrap().starts_with("Error: "));
}

#[tokio::test]
async fn bad_requests_get_the_seeds_error_and_store_nothing() {
    let server = start().await;
    for (body, status, expected) in [
        (
            json!({"model_id": "mock", "text": "x", "temperature": 1}),
            400,
            "unknown field",
        ),
        (json!({"model_id": "nope", "text": "x"}), 400, "nope"),
        (
            json!({"model_id": "mock", "messages": [{"role": "tool", "name": "t", "content": "r"}]}),
            400,
            "no call of the tool",
        ),
        (
            json!({"model_id": "mock", "session_id": "new", "messages": [
                {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                {"role": "user", "content": "c"}]}),
            400,
            "comes from the session",
        ),
        (
            json!({"model_id": "mock", "text": "x", "session_id": "0190a9a8-0000-7000-8000-000000000000"}),
            404,
            "no session",
        ),
        (
            json!({"model_id": "mock", "continue": true, "session_id": "new"}),
            400,
            "continue",
        ),
    ] {
        let (got, answer) = server.post("/linglong/v1/infer", body.clone()).await;
        assert_eq!(got, status, "{body} → {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(expected),
            "{body} → {answer}"
        );
        assert!(answer["error_code"].is_string());
    }
    let (status, answer) = server
        .raw(reqwest::Method::POST, "/linglong/v1/infer", "{not json")
        .await;
    assert_eq!(status, 400, "{answer}");
    assert!(answer["error"].as_str().unwrap().contains("JSON"));
    let (_, sessions) = server.get("/linglong/v1/sessions").await;
    assert_eq!(sessions["sessions"], json!([]));
    assert!(server.mock.requests().is_empty());
}

#[tokio::test]
async fn the_catalogue_routes_speak_the_seeds_shapes() {
    let server = start().await;
    // Models: registered with a key (kept sealed, listed masked), updated under a new id,
    // deleted.
    let model = json!({"model_id": "gpt", "api_base": "https://api.example.com/v1",
                       "model_name": "gpt-x", "api_key": "sk-secret", "api_protocol": "openai"});
    let (status, body) = server.post("/linglong/v1/models", model.clone()).await;
    assert_eq!(status, 201, "{body}");
    let (_, list) = server.get("/linglong/v1/models").await;
    let gpt = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["model_id"] == "gpt")
        .unwrap()
        .clone();
    assert_eq!(gpt["api_key"], "***");
    assert_eq!(gpt["api_base"], "https://api.example.com/v1");
    assert_eq!(gpt["api_protocol"], "openai");
    assert!(!list.to_string().contains("sk-secret"));
    let mut renamed = model.clone();
    renamed["model_id"] = json!("gpt2");
    renamed["api_key"] = json!("***");
    let (status, body) = server
        .raw(
            reqwest::Method::PUT,
            "/linglong/v1/models/gpt",
            &renamed.to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"status": "updated", "model_id": "gpt2"}));
    let (_, list) = server.get("/linglong/v1/models").await;
    let ids: Vec<&str> = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["model_id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"gpt2") && !ids.contains(&"gpt"), "{ids:?}");
    assert_eq!(
        list["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["model_id"] == "gpt2")
            .unwrap()["api_key"],
        "***",
        "the key is kept"
    );
    let (status, body) = server
        .raw(reqwest::Method::DELETE, "/linglong/v1/models/gpt2", "")
        .await;
    assert_eq!(
        (status, body),
        (200, json!({"status": "deleted", "model_id": "gpt2"}))
    );
    let (status, body) = server
        .raw(reqwest::Method::DELETE, "/linglong/v1/models/gpt2", "")
        .await;
    assert_eq!(status, 404, "{body}");
    assert!(body["error"].is_string());
    let (status, body) = server
        .post(
            "/linglong/v1/models",
            json!({"model_id": "x", "api_base": "http://h"}),
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("Missing required field: model_name"))
    );

    // Templates, used by an inference's message.
    let (status, body) = server
        .post(
            "/linglong/v1/prompt-templates",
            json!({"template_id": "summarize", "content": "Summarize in {{language}}: {{text}}"}),
        )
        .await;
    assert_eq!(
        (status, body),
        (
            201,
            json!({"status": "created", "template_id": "summarize"})
        )
    );
    let (_, list) = server.get("/linglong/v1/prompt-templates").await;
    assert_eq!(
        list["templates"],
        json!([{"template_id": "summarize", "content": "Summarize in {{language}}: {{text}}"}])
    );
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Short.")));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "messages": [{"role": "user", "prompt_template": "summarize",
                   "arguments": {"language": "English", "text": "a long article"}}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        server.mock.requests()[0].body["messages"][0]["content"],
        "Summarize in English: a long article"
    );
    let (status, body) = server
        .raw(
            reqwest::Method::PUT,
            "/linglong/v1/prompt-templates/summarize",
            &json!({"content": "In {{language}}"}).to_string(),
        )
        .await;
    assert_eq!(
        (status, body),
        (
            200,
            json!({"status": "updated", "template_id": "summarize"})
        )
    );
    let (status, _) = server
        .raw(
            reqwest::Method::DELETE,
            "/linglong/v1/prompt-templates/summarize",
            "",
        )
        .await;
    assert_eq!(status, 200);

    // Tools: listed by id, called directly.
    let (_, tools) = server.get("/linglong/v1/tools").await;
    let time = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tool_id"] == "current_time")
        .unwrap();
    assert_eq!(time["name"], "current_time");
    assert!(time["parameters"].is_object());
    let (status, body) = server
        .post(
            "/linglong/v1/tools/call",
            json!({"tool_id": "current_time", "arguments": {}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["result"].as_str().unwrap().len() > 5, "{body}");
    let (status, body) = server
        .post("/linglong/v1/tools/call", json!({"arguments": {}}))
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("Missing required field: tool_id"))
    );
}

#[tokio::test]
async fn sessions_are_listed_titled_continued_and_deleted() {
    let server = start().await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Hello there.")));
    let (status, first) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "text": "Hi", "session_id": "new"}),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    let session = first["session_id"].as_str().unwrap().to_owned();
    // The next turn continues the session: the model sees the earlier turns.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Still here.")));
    let (status, second) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "messages": [{"role": "user", "content": "Again"}], "session_id": session}),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["messages"][0]["content"], "Still here.");
    assert!(
        server.mock.requests()[1]
            .body
            .to_string()
            .contains("Hello there.")
    );
    let (_, list) = server.get("/linglong/v1/sessions").await;
    assert_eq!(list["sessions"][0]["session_id"], session);
    let (status, titled) = server
        .post(
            &format!("/linglong/v1/sessions/{session}/generate-title"),
            json!({"title": "Greetings"}),
        )
        .await;
    assert_eq!(
        (status, titled),
        (
            200,
            json!({"status": "success", "session_id": session, "title": "Greetings"})
        )
    );
    server.mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "A title from the model",
    )));
    let (status, titled) = server
        .post(
            &format!("/linglong/v1/sessions/{session}/generate-title"),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{titled}");
    assert_eq!(titled["title"], "A title from the model");
    let (status, body) = server
        .raw(
            reqwest::Method::DELETE,
            &format!("/linglong/v1/sessions/{session}"),
            "",
        )
        .await;
    assert_eq!(
        (status, body),
        (200, json!({"status": "deleted", "session_id": session}))
    );
    let (status, _) = server
        .get(&format!("/linglong/v1/sessions/{session}"))
        .await;
    assert_eq!(status, 404);
}

#[tokio::test]
async fn the_seed_api_needs_a_key_once_keys_exist() {
    let server = start().await;
    let admin = agentry_app::auth::create_key(&server.state.app.parts().store, "admin")
        .await
        .unwrap();
    server.state.auth.refresh();
    for path in [
        "/linglong/v1/models",
        "/linglong/v1/sessions",
        "/linglong/v1/tools",
    ] {
        let (status, _) = server.get(path).await;
        assert_eq!(status, 401, "{path}");
    }
    let response = server
        .http
        .get(format!("{}/linglong/v1/models", server.url))
        .bearer_auth(&admin.key)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
}

/// The seed's own client (`examples/example_stream_as_infer.py`, unchanged): its stream put
/// together and its `/v1/infer` answer agree, through a tool round.
#[tokio::test]
async fn the_seeds_own_client_reads_stream_and_answer_alike() {
    let server = start().await;
    for _ in 0..2 {
        server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "current_time",
            json!({}),
        )));
        server.mock.enqueue(Reply::scripted(
            ScriptedTurn::text("It is about noon.").with_usage(30, 6),
        ));
    }
    let client = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/linglong");
    let script = format!(
        r#"
import json, sys
sys.path.insert(0, {client:?})
import example_stream_as_infer as seed
url = {url:?}
streamed = seed.infer_via_stream(url, "mock", text="What time is it?", tool_ids=["current_time"])
direct = seed.infer_direct(url, "mock", text="What time is it?", tool_ids=["current_time"])
print(json.dumps({{"streamed": streamed, "direct": direct}}))
"#,
        url = format!("{}/linglong", server.url),
    );
    let output = tokio::process::Command::new("python3")
        .arg("-c")
        .arg(script)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let both: Value = serde_json::from_slice(&output.stdout).unwrap();
    let (streamed, direct) = (&both["streamed"], &both["direct"]);
    assert_eq!(streamed["success"], true, "{both:#}");
    assert_eq!(direct["success"], true, "{both:#}");
    let roles = |answer: &Value| -> Vec<String> {
        answer["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap_or("").to_owned())
            .collect()
    };
    assert_eq!(
        roles(streamed),
        ["assistant", "tool", "assistant"],
        "{both:#}"
    );
    assert_eq!(roles(direct), roles(streamed));
    for answer in [streamed, direct] {
        assert_eq!(
            answer["messages"][0]["tool_calls"][0]["name"],
            "current_time"
        );
        assert_eq!(answer["messages"][2]["content"], "It is about noon.");
        // The last round's stat carries the run's totals: both rounds.
        assert!(
            answer["stat"]["total_all_tokens"].as_u64().unwrap() >= 36,
            "{answer:#}"
        );
        assert!(answer["stat"]["overall_ms"].is_number(), "{answer:#}");
    }
    assert_eq!(streamed["stat"]["completion_tokens"], 6);
    assert_eq!(direct["stat"]["completion_tokens"], 6);
    server.mock.check_protocol().unwrap();
}

#[tokio::test]
async fn a_python_function_tool_registers_and_runs_out_of_process() {
    let server = start().await;
    let folder = tempfile::tempdir().unwrap();
    let file = folder.path().join("math_tools.py");
    std::fs::write(
        &file,
        "import math\n\ndef add(a, b):\n    return a + b\n\ndef explode(**arguments):\n    raise ValueError('no luck')\n",
    )
    .unwrap();
    let path = file.display().to_string();
    let tool = |name: &str, function: &str| {
        json!({"tool_type": "function", "name": name, "description": "Adds two numbers.",
               "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                              "required": ["a", "b"]},
               "function_file_path": path, "function_name": function})
    };
    let (status, body) = server.post("/linglong/v1/tools", tool("add", "add")).await;
    assert_eq!(
        (status, &body),
        (201, &json!({"status": "registered", "tool_id": "add"}))
    );
    let (status, body) = server
        .post(
            "/linglong/v1/tools/call",
            json!({"tool_id": "add", "arguments": {"a": 2, "b": 3}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], "5");
    // The seed's id for it (`function-<name>`) works in a run; the model sees the result.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "add",
        json!({"a": 20, "b": 22}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("42.")));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "text": "Add", "tool_ids": ["function-add"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["messages"][1]["content"], "42");
    // An exception fails the call with its message.
    let (status, _) = server
        .post("/linglong/v1/tools", tool("explode", "explode"))
        .await;
    assert_eq!(status, 201);
    let (status, body) = server
        .post(
            "/linglong/v1/tools/call",
            json!({"tool_id": "explode", "arguments": {"a": 1, "b": 2}}),
        )
        .await;
    assert!(status >= 400, "{status} {body}");
    assert!(
        body["error"].as_str().unwrap().contains("no luck"),
        "{body}"
    );
    // Listed, replaced, deleted one by one and in a batch.
    let (_, tools) = server.get("/linglong/v1/tools").await;
    assert!(
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["tool_id"] == "add")
    );
    let (status, body) = server
        .raw(
            reqwest::Method::DELETE,
            "/linglong/v1/tools/batch",
            &json!({"tool_ids": ["explode", "nope", "current_time"]}).to_string(),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        json!({"deleted": ["explode"], "not_found": ["nope"], "skipped": ["current_time"]})
    );
    let (status, body) = server
        .raw(
            reqwest::Method::DELETE,
            "/linglong/v1/tools/function-add",
            "",
        )
        .await;
    assert_eq!(
        (status, body),
        (200, json!({"status": "deleted", "tool_id": "function-add"}))
    );
    // Bad definitions: typed 400s, nothing saved.
    for (mut body, expected) in [
        (tool("x", "missing"), "no top-level function"),
        (tool("x", "not a name"), "identifier"),
        (json!({"tool_type": "mcp", "name": "x"}), "/v1/tools/mcp"),
    ] {
        let (status, answer) = server.post("/linglong/v1/tools", body.clone()).await;
        assert_eq!(status, 400, "{body} → {answer}");
        assert!(
            answer["error"].as_str().unwrap().contains(expected),
            "{answer}"
        );
        body["function_file_path"] = json!("relative.py");
        if body["tool_type"] == "function" {
            let (status, answer) = server.post("/linglong/v1/tools", body).await;
            assert_eq!(status, 400);
            assert!(
                answer["error"].as_str().unwrap().contains("absolute"),
                "{answer}"
            );
        }
    }
    let (_, tools) = server.get("/linglong/v1/tools").await;
    assert!(!tools.to_string().contains("\"x\""));
}

#[tokio::test]
async fn function_tools_never_run_on_the_host_unasked() {
    let server =
        super::support::start_with(|_| agentry_app::ToolEnvironment::default(), |_| {}).await;
    let folder = tempfile::tempdir().unwrap();
    let file = folder.path().join("f.py");
    std::fs::write(&file, "def f():\n    return 1\n").unwrap();
    let (status, body) = server
        .post(
            "/linglong/v1/tools",
            json!({"tool_type": "function", "name": "f", "description": "d",
                   "parameters": {"type": "object", "properties": {}},
                   "function_file_path": file.display().to_string(), "function_name": "f"}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert!(body["error"].as_str().unwrap().contains("host"), "{body}");
}

#[tokio::test]
async fn env_holds_sealed_keys_and_detect_names_what_is_used() {
    let server = start().await;
    let (status, body) = server
        .post(
            "/linglong/v1/env",
            json!({"key": "SEARCH_TOKEN", "value": "abcdefghijklmnopqrstuvwxyz"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["env"]["SEARCH_TOKEN"], "…wxyz");
    assert!(!body.to_string().contains("abcdefgh"));
    let (status, _) = server
        .post(
            "/linglong/v1/models",
            json!({"model_id": "gpt", "api_base": "https://api.example.com/v1",
                   "model_name": "gpt-x", "api_key": "sk-0123456789abcdefghij"}),
        )
        .await;
    assert_eq!(status, 201);
    let (status, detected) = server.post("/linglong/v1/env/detect", json!({})).await;
    assert_eq!(status, 200, "{detected}");
    assert!(
        detected["keys"]
            .as_array()
            .unwrap()
            .contains(&json!("GPT_API_KEY")),
        "{detected}"
    );
    let (_, env) = server.get("/linglong/v1/env").await;
    assert!(env["env"].get("GPT_API_KEY").is_some(), "{env}");
    let (status, body) = server
        .raw(reqwest::Method::DELETE, "/linglong/v1/env/SEARCH_TOKEN", "")
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body["env"].get("SEARCH_TOKEN").is_none(), "{body}");
    let (status, body) = server.post("/linglong/v1/env", json!({"value": "v"})).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("Missing required field: key"))
    );
    // Agentry's `hosts` bind a key set through the seed's route (issue 47): sealed with it,
    // listed by the native API; a bad host is refused and nothing is written.
    let (status, body) = server
        .post(
            "/linglong/v1/env",
            json!({"key": "BOUND_TOKEN", "value": "b-1", "hosts": ["api.example.com"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let (_, native) = server.get("/v1/env").await;
    let bound = native["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|secret| secret["name"] == "BOUND_TOKEN")
        .cloned()
        .unwrap_or_else(|| panic!("{native}"));
    assert_eq!(bound["hosts"], json!(["api.example.com"]), "{native}");
    let (status, _) = server
        .post(
            "/linglong/v1/env",
            json!({"key": "OTHER_TOKEN", "value": "o", "hosts": ["https://x.example.com/path"]}),
        )
        .await;
    assert_eq!(status, 400);
    let (_, listed) = server.get("/linglong/v1/env").await;
    assert!(listed["env"].get("OTHER_TOKEN").is_none(), "{listed}");
    let (status, hello) = server.get("/linglong/v1/setup").await;
    assert_eq!(status, 200, "{hello}");
    assert_eq!(hello["name"], "agentry");
    assert_eq!(hello["api"], "/linglong/v1");
    let (status, _) = server.get("/linglong/v1/setup?op=export").await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn mcp_servers_register_list_and_delete_in_the_seeds_shapes() {
    let server = super::support::start_sandboxed().await;
    let spec = super::support::mcp_servers().everything();
    let document =
        json!({"mcpServers": {"everything": {"command": spec.program, "args": spec.args}}});
    let (status, body) = server.post("/linglong/v1/tools/mcp", document).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["registered_servers"], json!(["everything"]));
    assert!(
        body["registered_tools"].as_array().unwrap().len() >= 3,
        "{body}"
    );
    let (_, listed) = server.get("/linglong/v1/mcp-servers").await;
    assert!(listed["mcpServers"]["everything"].is_object(), "{listed}");
    let (status, body) = server
        .raw(
            reqwest::Method::DELETE,
            "/linglong/v1/mcp-servers/everything",
            "",
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["server_name"], "everything");
    assert!(!body["deleted_tools"].as_array().unwrap().is_empty());
    let (status, body) = server
        .post("/linglong/v1/tools/mcp", json!({"servers": {}}))
        .await;
    assert_eq!(status, 400, "{body}");
}

/// Issue 48, the seed's clients unchanged: on a server whose commands run in sandboxes (the
/// default), a Python function tool runs from `/tools/call` and from a stateless `infer` (each
/// call in a scratch sandbox of its own; it said "this run has no workspace"), the tool is
/// saved under its explicit `tool_id`, and registering it (or a template) again overwrites it,
/// as the seed does (it was 409).
#[tokio::test]
async fn the_seeds_function_tools_run_sandboxed_without_a_session_and_re_posting_overwrites() {
    let server = super::support::start_with_workspaces().await;
    let folder = tempfile::tempdir().unwrap();
    let file = folder.path().join("calc.py");
    std::fs::write(
        &file,
        "def add(a, b):\n    return a + b\n\ndef mul(a, b):\n    return a * b\n",
    )
    .unwrap();
    let path = file.display().to_string();
    let tool = |function: &str| {
        json!({"tool_id": "calc", "tool_type": "function", "name": "add", "description": "Calculates.",
               "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                              "required": ["a", "b"]},
               "function_file_path": path, "function_name": function})
    };
    let (status, body) = server.post("/linglong/v1/tools", tool("add")).await;
    assert_eq!(
        (status, &body),
        (201, &json!({"status": "registered", "tool_id": "calc"}))
    );
    let call = json!({"tool_id": "calc", "arguments": {"a": 6, "b": 7}});
    let (status, body) = server.post("/linglong/v1/tools/call", call.clone()).await;
    assert_eq!((status, &body["result"]), (200, &json!("13")), "{body}");
    // Registered again with another function: replaced.
    let (status, body) = server.post("/linglong/v1/tools", tool("mul")).await;
    assert_eq!((status, &body["tool_id"]), (201, &json!("calc")), "{body}");
    let (status, body) = server.post("/linglong/v1/tools/call", call).await;
    assert_eq!((status, &body["result"]), (200, &json!("42")), "{body}");
    // A stateless run calls it too; the model sees its result.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "calc",
        json!({"a": 2, "b": 21}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("It is 42.")));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "text": "Multiply", "tool_ids": ["calc"]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = server.mock.requests()[1].body.to_string();
    assert!(sent.contains("\"42\""), "{sent}");
    // No scratch sandbox is left behind.
    let sandboxes = server.state.app.parts().tools.sandboxes.as_ref().unwrap();
    assert_eq!(sandboxes.len(), 0);
    // A template saved twice is replaced, not refused.
    for content in ["First {{x}}", "Second {{x}}"] {
        let (status, body) = server
            .post(
                "/linglong/v1/prompt-templates",
                json!({"template_id": "twice", "content": content}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let (_, list) = server.get("/linglong/v1/prompt-templates").await;
    assert_eq!(
        list["templates"],
        json!([{"template_id": "twice", "content": "Second {{x}}"}])
    );
}

/// Issue 48, the seed's clients unchanged: a system message may name a prompt template with
/// its arguments (it was refused); the model gets it rendered as the system prompt.
#[tokio::test]
async fn a_system_message_may_name_a_prompt_template() {
    let server = start().await;
    let (status, _) = server
        .post(
            "/linglong/v1/prompt-templates",
            json!({"template_id": "persona", "content": "You are {{ name }}, terse."}),
        )
        .await;
    assert_eq!(status, 201);
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Aye.")));
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "messages": [
                {"role": "system", "content": "Answer in English."},
                {"role": "system", "prompt_template": "persona", "arguments": {"name": "Ada"}},
                {"role": "user", "content": "Hello"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let sent = server.mock.requests()[0].body.to_string();
    assert!(
        sent.contains("Answer in English.\\n\\nYou are Ada, terse."),
        "{sent}"
    );
    // An unknown template is refused before anything runs.
    let (status, body) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "messages": [
                {"role": "system", "prompt_template": "nope"},
                {"role": "user", "content": "Hello"}]}),
        )
        .await;
    assert!((400..500).contains(&status), "{status} {body}");
    assert_eq!(server.mock.requests().len(), 1);
}

/// Issue 48: the README's agents routes, in the seed's shapes: saved, listed, read, updated
/// field by field (the rest kept), and deleted; a new agent needs its id and model.
#[tokio::test]
async fn agents_are_saved_listed_updated_and_deleted_in_the_seeds_shapes() {
    let server = start().await;
    let agent = json!({
        "agent_id": "architect",
        "model_id": "mock",
        "nickname": "Architect",
        "tool_ids": ["current_time"],
        "template_id": null,
        "template_arguments": {},
        "system_prompt": "You plan work.",
        "myself_view": "I plan; others build.",
        "description": "Plans a task and hands out its parts.",
        "avatar": "data:image/png;base64,AAAA",
    });
    let (status, saved) = server.post("/linglong/v1/agents", agent.clone()).await;
    assert_eq!(status, 201, "{saved}");
    let mut expected = agent.clone();
    expected["template_id"] = Value::Null;
    assert_eq!(saved, expected);
    let (status, list) = server.get("/linglong/v1/agents").await;
    assert_eq!(status, 200);
    assert_eq!(list["agents"], json!([expected]));
    // The same agent through Agentry's own API.
    let (_, native) = server.get("/v1/agents/architect").await;
    assert_eq!(
        native["description"],
        "Plans a task and hands out its parts."
    );
    assert_eq!(native["system"], "You plan work.");
    // An update changes only what it names.
    let response = server
        .http
        .put(format!("{}/linglong/v1/agents/architect", server.url))
        .json(&json!({"nickname": "Planner", "last_modified": "2026-04-29T10:00:00"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let updated: Value = response.json().await.unwrap();
    assert_eq!(updated["nickname"], "Planner");
    assert_eq!(updated["system_prompt"], "You plan work.");
    assert_eq!(updated["tool_ids"], json!(["current_time"]));
    let (_, read) = server.get("/linglong/v1/agents/architect").await;
    assert_eq!(read, updated);
    // The agent runs through the seed's infer.
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("A plan.")));
    let (status, answer) = server
        .post(
            "/linglong/v1/infer",
            json!({"agent_ids": ["architect"], "text": "Plan a picnic"}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert!(
        server.mock.requests()[0]
            .body
            .to_string()
            .contains("You plan work.")
    );
    // Refusals: a new agent without a model, an unknown field, a path/body mismatch.
    let (status, body) = server
        .post("/linglong/v1/agents", json!({"agent_id": "x"}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("model_id"),
        "{body}"
    );
    let (status, _) = server
        .post(
            "/linglong/v1/agents",
            json!({"agent_id": "y", "model_id": "mock", "colour": "red"}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .raw(
            reqwest::Method::PUT,
            "/linglong/v1/agents/architect",
            r#"{"agent_id": "other"}"#,
        )
        .await;
    assert_eq!(status, 400);
    let (status, body) = server
        .raw(reqwest::Method::DELETE, "/linglong/v1/agents/architect", "")
        .await;
    assert_eq!(
        (status, body),
        (200, json!({"status": "deleted", "agent_id": "architect"}))
    );
    let (status, _) = server.get("/linglong/v1/agents/architect").await;
    assert_eq!(status, 404);
}

/// The `data:` payloads of an SSE response as they arrive, one JSON value each.
fn data_events(response: reqwest::Response) -> tokio::sync::mpsc::UnboundedReceiver<Value> {
    let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut response = response;
        let mut buffer = String::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let event: String = buffer.drain(..end + 2).collect();
                for line in event.lines() {
                    if let Some(data) = line.strip_prefix("data: ")
                        && let Ok(value) = serde_json::from_str(data)
                    {
                        let _ = sender.send(value);
                    }
                }
            }
        }
    });
    receiver
}

/// The next payload that `wanted` accepts (others are skipped), within ten seconds.
async fn next_matching(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Value>,
    wanted: impl Fn(&Value) -> bool,
) -> Value {
    tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            let event = events.recv().await.expect("the feed ended");
            if wanted(&event) {
                return event;
            }
        }
    })
    .await
    .expect("no such event on the feed")
}

/// Issue 48: the seed's session status feed (`GET /v1/sessions/events`: an `init` map, then
/// `message` and `title_update` events as unnamed `data:` events) and its read mark.
#[tokio::test]
async fn the_status_feed_and_the_read_mark_speak_the_seeds_shapes() {
    let server = start().await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("First.")));
    let (_, first) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "text": "Hi", "session_id": "new"}),
        )
        .await;
    let earlier = first["session_id"].as_str().unwrap().to_owned();
    let response = server
        .http
        .get(format!("{}/linglong/v1/sessions/events", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut events = data_events(response);
    let init = next_matching(&mut events, |_| true).await;
    assert_eq!(init["event"], "init", "{init}");
    assert_eq!(init["sessions"][&earlier], "success", "{init}");

    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Second.")));
    let (_, second) = server
        .post(
            "/linglong/v1/infer",
            json!({"model_id": "mock", "text": "Again", "session_id": "new"}),
        )
        .await;
    let session = second["session_id"].as_str().unwrap().to_owned();
    let of_session = |status: &'static str| {
        let session = session.clone();
        move |event: &Value| {
            event["event"] == "message"
                && event["session_id"] == session.as_str()
                && event["status"] == status
        }
    };
    next_matching(&mut events, of_session("streaming")).await;
    next_matching(&mut events, of_session("success")).await;
    let (status, _) = server
        .post(
            &format!("/linglong/v1/sessions/{session}/generate-title"),
            json!({"title": "Picnic"}),
        )
        .await;
    assert_eq!(status, 200);
    let titled = next_matching(&mut events, |event| event["event"] == "title_update").await;
    assert_eq!(
        titled,
        json!({"event": "title_update", "session_id": session, "title": "Picnic"})
    );

    // The read mark.
    let (_, listed) = server.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(listed["session"]["unread"], true, "{listed}");
    let (status, body) = server
        .post(&format!("/linglong/v1/sessions/{session}/read"), json!({}))
        .await;
    assert_eq!(
        (status, body),
        (200, json!({"status": "success", "session_id": session}))
    );
    let (_, listed) = server.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(listed["session"]["unread"], false, "{listed}");
    let (status, _) = server
        .post(
            "/linglong/v1/sessions/00000000-0000-7000-8000-000000000000/read",
            json!({}),
        )
        .await;
    assert_eq!(status, 404);
}
