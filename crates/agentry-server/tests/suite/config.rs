//! The configuration routes (models, tools, prompt templates, secrets) over real HTTP.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentry_server::AppState;
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tempfile::TempDir;

/// A server on `127.0.0.1:0` over a fresh store, and a client for it.
struct Server {
    base: String,
    client: reqwest::Client,
    state: AppState,
    _home: TempDir,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A response: status and body (`Null` when empty; a string when not JSON).
struct Answer {
    status: StatusCode,
    body: Value,
    text: String,
}

impl Server {
    async fn start() -> Server {
        super::support::isolate_template_renders();
        let home = tempfile::tempdir().unwrap();
        let store = agentry_store::Store::open_home(home.path()).await.unwrap();
        // About the configuration API, not about where commands run: no sandbox, and the
        // command tools these tests define run on the host, allowed explicitly.
        let tools = agentry_app::ToolEnvironment {
            allow_host_commands: true,
            ..Default::default()
        };
        let state = AppState::with_tools(store, tools).await.unwrap();
        let app = agentry_server::router(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let client = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
        Server {
            base: format!("http://{addr}"),
            client,
            state,
            _home: home,
            task,
        }
    }

    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> Answer {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .timeout(Duration::from_secs(30));
        if let Some(body) = body {
            request = request.json(&body);
        }
        read(request.send().await.unwrap()).await
    }

    async fn send_raw(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        body: Vec<u8>,
    ) -> Answer {
        let response = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("content-type", content_type)
            .body(body)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .unwrap();
        read(response).await
    }

    async fn get(&self, path: &str) -> Answer {
        self.send(Method::GET, path, None).await
    }

    async fn post(&self, path: &str, body: Value) -> Answer {
        self.send(Method::POST, path, Some(body)).await
    }

    async fn put(&self, path: &str, body: Value) -> Answer {
        self.send(Method::PUT, path, Some(body)).await
    }

    async fn delete(&self, path: &str) -> Answer {
        self.send(Method::DELETE, path, None).await
    }
}

async fn read(response: reqwest::Response) -> Answer {
    let status = response.status();
    let text = response.text().await.unwrap();
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|_| Value::String(text.clone()))
    };
    Answer { status, body, text }
}

/// Asserts an error response: the status, a JSON body with `error.code` and `error.message`.
#[track_caller]
fn assert_error(reply: &Answer, status: StatusCode, code: &str) -> String {
    assert_eq!(reply.status, status, "body: {}", reply.text);
    let error = &reply.body["error"];
    assert_eq!(error["code"], code, "body: {}", reply.text);
    let message = error["message"].as_str().unwrap_or_default().to_owned();
    assert!(!message.is_empty(), "no message: {}", reply.text);
    message
}

#[track_caller]
fn assert_status(reply: &Answer, status: StatusCode) {
    assert_eq!(reply.status, status, "body: {}", reply.text);
}

fn names(list: &Value, key: &str, field: &str) -> Vec<String> {
    list[key]
        .as_array()
        .unwrap_or_else(|| panic!("no {key:?} array in {list}"))
        .iter()
        .map(|item| item[field].as_str().unwrap().to_owned())
        .collect()
}

fn openai_model(id: &str, mock: &MockProvider) -> Value {
    json!({"id": id, "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "gpt-mock"})
}

fn plain_model(id: &str) -> Value {
    json!({"id": id, "protocol": "anthropic", "model_name": "claude-mock",
           "base_url": "http://127.0.0.1:9/v1"})
}

/// Writes a shell script into `dir` and returns a command tool definition running it.
fn script_tool(dir: &Path, name: &str, script: &str) -> Value {
    let path: PathBuf = dir.join(format!("{name}.sh"));
    std::fs::write(&path, script).unwrap();
    json!({"kind": "command", "name": name, "description": format!("runs {name}.sh"),
           "program": "/bin/sh", "args": [path.display().to_string()]})
}

// --- models ---

#[tokio::test]
async fn models_are_created_listed_replaced_renamed_and_deleted() {
    let server = Server::start().await;
    let empty = server.get("/v1/models").await;
    assert_status(&empty, StatusCode::OK);
    assert_eq!(empty.body, json!({"models": []}));

    let created = server.post("/v1/models", plain_model("zeta")).await;
    assert_status(&created, StatusCode::CREATED);
    assert_eq!(created.body["id"], "zeta");
    assert_eq!(created.body["model_name"], "claude-mock");
    // The Python service's field names are accepted too.
    let python = server
        .post(
            "/v1/models",
            json!({"model_id": "alpha", "api_protocol": "openai-compatible",
                   "api_base": "https://llm.example/v1", "model_name": "m",
                   "generate_params": {"temperature": 0.5}}),
        )
        .await;
    assert_status(&python, StatusCode::CREATED);
    assert_eq!(python.body["id"], "alpha");
    assert_eq!(python.body["base_url"], "https://llm.example/v1");

    let list = server.get("/v1/models").await;
    assert_eq!(names(&list.body, "models", "id"), ["alpha", "zeta"]);

    let one = server.get("/v1/models/zeta").await;
    assert_status(&one, StatusCode::OK);
    assert_eq!(one.body, created.body);

    let duplicate = server.post("/v1/models", plain_model("zeta")).await;
    assert_error(&duplicate, StatusCode::CONFLICT, "conflict");

    // Replace in place.
    let mut changed = plain_model("zeta");
    changed["model_name"] = json!("claude-other");
    let replaced = server.put("/v1/models/zeta", changed).await;
    assert_status(&replaced, StatusCode::OK);
    assert_eq!(
        server.get("/v1/models/zeta").await.body["model_name"],
        "claude-other"
    );

    // Rename onto a taken id: refused; onto a free one: the old id is gone.
    let clash = server.put("/v1/models/zeta", plain_model("alpha")).await;
    assert_error(&clash, StatusCode::CONFLICT, "conflict");
    let renamed = server.put("/v1/models/zeta", plain_model("omega")).await;
    assert_status(&renamed, StatusCode::OK);
    assert_error(
        &server.get("/v1/models/zeta").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    let list = server.get("/v1/models").await;
    assert_eq!(names(&list.body, "models", "id"), ["alpha", "omega"]);
    let runtime = server.state.app.parts().sessions.runtime();
    assert!(runtime.model_client("omega").is_ok());
    assert!(runtime.model_client("zeta").is_err());

    // Replacing or deleting what does not exist.
    let missing = server.put("/v1/models/nope", plain_model("nope")).await;
    assert_error(&missing, StatusCode::NOT_FOUND, "not_found");
    assert_status(
        &server.delete("/v1/models/omega").await,
        StatusCode::NO_CONTENT,
    );
    assert_error(
        &server.delete("/v1/models/omega").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_error(
        &server.get("/v1/models/omega").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .model_client("omega")
            .is_err()
    );
}

#[tokio::test]
async fn bad_model_input_is_a_json_4xx_and_writes_nothing() {
    let server = Server::start().await;
    let cases: Vec<(&str, Value)> = vec![
        ("traversal id", json!({"id": "../../x", "model_name": "m"})),
        ("id with a space", json!({"id": "a b", "model_name": "m"})),
        ("empty id", json!({"id": "", "model_name": "m"})),
        ("long id", json!({"id": "x".repeat(65), "model_name": "m"})),
        (
            "unknown protocol",
            json!({"id": "m1", "protocol": "gopher", "model_name": "m"}),
        ),
        (
            "ftp base url",
            json!({"id": "m1", "base_url": "ftp://host/v1", "model_name": "m"}),
        ),
        (
            "relative base url",
            json!({"id": "m1", "base_url": "not a url", "model_name": "m"}),
        ),
        ("wrong type", json!({"id": "m1", "model_name": 5})),
        ("missing model_name", json!({"id": "m1"})),
        ("empty model_name", json!({"id": "m1", "model_name": " "})),
        (
            "unknown field",
            json!({"id": "m1", "model_name": "m", "colour": "red"}),
        ),
        ("not an object", json!(["m1"])),
    ];
    for (case, body) in cases {
        let reply = server.post("/v1/models", body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{case}: {}",
            reply.text
        );
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_request");
    }
    let unknown_protocol = server
        .post(
            "/v1/models",
            json!({"id": "m1", "protocol": "gopher", "model_name": "m"}),
        )
        .await;
    assert!(
        unknown_protocol.text.contains("gopher"),
        "{}",
        unknown_protocol.text
    );

    let missing_secret = server
        .post(
            "/v1/models",
            json!({"id": "m1", "model_name": "m", "api_key_secret": "NO_SUCH_KEY"}),
        )
        .await;
    let message = assert_error(&missing_secret, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(message.contains("NO_SUCH_KEY"), "{message}");

    let malformed = server
        .send_raw(
            Method::POST,
            "/v1/models",
            "application/json",
            b"{\"id\": ".to_vec(),
        )
        .await;
    assert_error(&malformed, StatusCode::BAD_REQUEST, "invalid_request");
    let not_json = server
        .send_raw(Method::POST, "/v1/models", "text/plain", b"id=m1".to_vec())
        .await;
    assert_error(
        &not_json,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "invalid_request",
    );

    // Bad ids in the path: percent-encoded traversal and spaces.
    for path in ["/v1/models/..%2F..%2Fx", "/v1/models/a%20b"] {
        assert_error(
            &server.get(path).await,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        );
        assert_error(
            &server.delete(path).await,
            StatusCode::BAD_REQUEST,
            "invalid_request",
        );
        let put = server.put(path, plain_model("ok")).await;
        assert_error(&put, StatusCode::BAD_REQUEST, "invalid_request");
    }

    assert_eq!(server.get("/v1/models").await.body, json!({"models": []}));
    assert!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .model_client("m1")
            .is_err()
    );
}

#[tokio::test]
async fn the_default_model_is_the_marked_one_else_the_first_registered() {
    let server = Server::start().await;
    // Registered zeta first, then alpha: zeta is the default, not the alphabetically first.
    for id in ["zeta", "alpha"] {
        assert_status(
            &server.post("/v1/models", plain_model(id)).await,
            StatusCode::CREATED,
        );
    }
    assert_eq!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .default_model_id(),
        Some("zeta")
    );
    // Replacing zeta keeps its place.
    let mut changed = plain_model("zeta");
    changed["model_name"] = json!("claude-other");
    assert_status(
        &server.put("/v1/models/zeta", changed).await,
        StatusCode::OK,
    );
    assert_eq!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .default_model_id(),
        Some("zeta")
    );
    // A model marked default wins, wherever it was registered.
    let mut marked = plain_model("mid");
    marked["default"] = json!(true);
    let created = server.post("/v1/models", marked).await;
    assert_status(&created, StatusCode::CREATED);
    assert_eq!(created.body["default"], true);
    assert_eq!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .default_model_id(),
        Some("mid")
    );
    // Unmarked models do not carry the field.
    assert!(
        server
            .get("/v1/models/zeta")
            .await
            .body
            .get("default")
            .is_none()
    );
    // Marking another one moves the mark: there is one default model.
    let mut alpha = plain_model("alpha");
    alpha["default"] = json!(true);
    assert_status(&server.put("/v1/models/alpha", alpha).await, StatusCode::OK);
    assert_eq!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .default_model_id(),
        Some("alpha")
    );
    assert!(
        server
            .get("/v1/models/mid")
            .await
            .body
            .get("default")
            .is_none()
    );
    let mut mid = plain_model("mid");
    mid["default"] = json!(true);
    assert_status(&server.put("/v1/models/mid", mid).await, StatusCode::OK);
    assert!(
        server
            .get("/v1/models/alpha")
            .await
            .body
            .get("default")
            .is_none()
    );
    assert_status(
        &server.delete("/v1/models/mid").await,
        StatusCode::NO_CONTENT,
    );
    assert_eq!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .default_model_id(),
        Some("zeta")
    );
}

#[tokio::test]
async fn a_registered_model_gets_the_context_window_its_provider_states() {
    let server = Server::start().await;
    let mock = MockProvider::start().await.unwrap();
    mock.set_model_metadata(json!({"object": "list", "data": [
        {"id": "gpt-mock", "object": "model", "owned_by": "vllm", "max_model_len": 24576},
    ]}));
    assert_status(
        &server
            .post("/v1/models", openai_model("served", &mock))
            .await,
        StatusCode::CREATED,
    );
    let client = server
        .state
        .app
        .parts()
        .sessions
        .runtime()
        .model_client("served")
        .unwrap();
    assert_eq!(client.context().window, 24_576);
    assert!(client.context().window_known);
    // A configured window wins.
    let mut configured = openai_model("fixed", &mock);
    configured["context_window"] = json!(10_000);
    assert_status(
        &server.post("/v1/models", configured).await,
        StatusCode::CREATED,
    );
    let runtime = server.state.app.parts().sessions.runtime();
    assert_eq!(
        runtime.model_client("fixed").unwrap().context().window,
        10_000
    );
    assert_eq!(
        runtime.model_client("served").unwrap().context().window,
        24_576
    );
    // Asked once for "served", however many times the runtime was rebuilt since.
    assert_eq!(mock.metadata_requests(), 1);
    // No model call was made or answered by the lookups.
    assert_eq!(mock.request_count(), 0);
}

#[tokio::test]
async fn a_registered_model_is_usable_at_once_and_its_connection_test_reaches_the_provider() {
    let server = Server::start().await;
    let mock = MockProvider::start().await.unwrap();

    // The key comes from a secret, set first.
    let secret = server
        .post(
            "/v1/env",
            json!({"name": "MOCK_KEY", "value": "sk-mock-0123456789"}),
        )
        .await;
    assert_status(&secret, StatusCode::NO_CONTENT);
    let mut model = openai_model("mock", &mock);
    model["api_key_secret"] = json!("MOCK_KEY");
    assert_status(&server.post("/v1/models", model).await, StatusCode::CREATED);
    assert!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .model_client("mock")
            .is_ok()
    );

    mock.enqueue(Reply::scripted(ScriptedTurn::text("pong")));
    let ok = server.post("/v1/models/mock/test", json!({})).await;
    assert_status(&ok, StatusCode::OK);
    assert_eq!(ok.body["ok"], true, "{}", ok.text);
    assert!(ok.body["latency_ms"].is_u64(), "{}", ok.text);
    assert_eq!(ok.body["model"], "gpt-mock");
    let requests = mock.take_requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].header("authorization"),
        Some("Bearer sk-mock-0123456789")
    );
    assert_eq!(requests[0].body["model"], "gpt-mock");
    assert_eq!(requests[0].body["messages"][0]["content"], "ping");

    // A failing provider is a 200 saying why, not a server error.
    mock.enqueue(Reply::error(
        401,
        json!({"error": {"message": "invalid api key", "type": "invalid_request_error",
                         "code": "invalid_api_key"}}),
    ));
    let failed = server.post("/v1/models/mock/test", json!({})).await;
    assert_status(&failed, StatusCode::OK);
    assert_eq!(failed.body["ok"], false, "{}", failed.text);
    assert_eq!(failed.body["error"]["status"], 401, "{}", failed.text);
    assert!(failed.body["error"]["code"].is_string(), "{}", failed.text);
    assert!(
        failed.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("invalid api key"),
        "{}",
        failed.text
    );

    let unknown = server.post("/v1/models/nope/test", json!({})).await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "not_found");
}

// --- tools ---

#[tokio::test]
async fn tools_list_builtins_and_configured_ones() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let list = server.get("/v1/tools").await;
    assert_status(&list, StatusCode::OK);
    let builtin = list.body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|tool| tool["name"] == "current_time")
        .cloned()
        .unwrap();
    assert_eq!(builtin["kind"], "builtin");
    assert!(builtin["parameters"].is_object());
    assert!(builtin["description"].is_string());
    assert!(builtin["idempotent"].is_boolean());

    let mut command = script_tool(dir.path(), "echo_args", "cat\n");
    command["idempotent"] = json!(true);
    let created = server.post("/v1/tools", command.clone()).await;
    assert_status(&created, StatusCode::CREATED);
    assert_eq!(created.body["name"], "echo_args");
    let http = json!({"kind": "http", "name": "search", "url": "https://wiki.example/api",
                      "description": "Search the wiki",
                      "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}});
    assert_status(&server.post("/v1/tools", http).await, StatusCode::CREATED);

    let list = server.get("/v1/tools").await;
    let tools = list.body["tools"].as_array().unwrap();
    let kind = |name: &str| {
        tools
            .iter()
            .find(|tool| tool["name"] == name)
            .map(|tool| (tool["kind"].clone(), tool["idempotent"].clone()))
    };
    assert_eq!(kind("current_time").unwrap().0, "builtin");
    assert_eq!(kind("echo_args"), Some((json!("command"), json!(true))));
    assert_eq!(kind("search"), Some((json!("http"), json!(false))));
    let search = tools.iter().find(|tool| tool["name"] == "search").unwrap();
    assert_eq!(search["description"], "Search the wiki");
    assert_eq!(search["parameters"]["properties"]["q"]["type"], "string");

    let definition = server.get("/v1/tools/echo_args").await;
    assert_status(&definition, StatusCode::OK);
    assert_eq!(definition.body["program"], "/bin/sh");
    assert_eq!(
        server.get("/v1/tools/current_time").await.body["kind"],
        "builtin"
    );
    assert_error(
        &server.get("/v1/tools/nope").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );

    let runtime = server.state.app.parts().sessions.runtime();
    assert!(runtime.tools().contains("echo_args"));
    assert!(runtime.tools().contains("search"));
}

#[tokio::test]
async fn tool_definitions_are_checked_before_they_are_stored() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    assert_status(
        &server
            .post("/v1/tools", script_tool(dir.path(), "taken", "cat\n"))
            .await,
        StatusCode::CREATED,
    );

    let conflict = server
        .post("/v1/tools", script_tool(dir.path(), "taken", "cat\n"))
        .await;
    assert_error(&conflict, StatusCode::CONFLICT, "conflict");
    let builtin = server
        .post(
            "/v1/tools",
            script_tool(dir.path(), "current_time", "cat\n"),
        )
        .await;
    assert_error(&builtin, StatusCode::CONFLICT, "conflict");

    let cases: Vec<(&str, Value)> = vec![
        (
            "traversal name",
            json!({"kind": "command", "name": "../../x", "program": "cat"}),
        ),
        (
            "name with a space",
            json!({"kind": "command", "name": "a b", "program": "cat"}),
        ),
        (
            "reserved name",
            json!({"kind": "command", "name": "batch", "program": "cat"}),
        ),
        (
            "reserved name",
            json!({"kind": "command", "name": "call", "program": "cat"}),
        ),
        ("unknown kind", json!({"kind": "ftp", "name": "x"})),
        ("missing kind", json!({"name": "x", "program": "cat"})),
        (
            "empty program",
            json!({"kind": "command", "name": "x", "program": ""}),
        ),
        (
            "wrong type",
            json!({"kind": "command", "name": "x", "program": "cat", "args": "-w"}),
        ),
        (
            "file url",
            json!({"kind": "http", "name": "x", "url": "file:///etc/passwd"}),
        ),
        (
            "schema not an object",
            json!({"kind": "command", "name": "x", "program": "cat",
                                        "parameters": {"type": "string"}}),
        ),
        (
            "schema that does not compile",
            json!({"kind": "command", "name": "x", "program": "cat",
                                        "parameters": {"type": "object", "minProperties": "two"}}),
        ),
    ];
    for (case, body) in cases {
        let reply = server.post("/v1/tools", body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{case}: {}",
            reply.text
        );
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_request");
    }
    let missing_secret = server
        .post(
            "/v1/tools",
            json!({"kind": "http", "name": "x", "url": "https://h.example/",
                   "headers": {"authorization": {"secret": "WIKI_TOKEN"}}}),
        )
        .await;
    let message = assert_error(&missing_secret, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(message.contains("WIKI_TOKEN"), "{message}");
    // With the secret set, the same definition is accepted.
    server
        .post("/v1/env", json!({"name": "WIKI_TOKEN", "value": "t0k3n"}))
        .await;
    let with_secret = server
        .post(
            "/v1/tools",
            json!({"kind": "http", "name": "x", "url": "https://h.example/",
                   "headers": {"authorization": {"secret": "WIKI_TOKEN"}}}),
        )
        .await;
    assert_status(&with_secret, StatusCode::CREATED);

    let malformed = server
        .send_raw(
            Method::POST,
            "/v1/tools",
            "application/json",
            b"{kind: command}".to_vec(),
        )
        .await;
    assert_error(&malformed, StatusCode::BAD_REQUEST, "invalid_request");

    let list = server.get("/v1/tools").await;
    let mut listed = names(&list.body, "tools", "name");
    listed.sort();
    assert_eq!(
        listed,
        ["current_time", "delegate", "taken", "talk_to", "x"]
    );
}

#[tokio::test]
async fn tools_are_replaced_renamed_and_deleted_but_builtins_are_fixed() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    for name in ["one", "two"] {
        let reply = server
            .post("/v1/tools", script_tool(dir.path(), name, "cat\n"))
            .await;
        assert_status(&reply, StatusCode::CREATED);
    }

    let mut changed = script_tool(dir.path(), "one", "cat\n");
    changed["description"] = json!("changed");
    let replaced = server.put("/v1/tools/one", changed).await;
    assert_status(&replaced, StatusCode::OK);
    assert_eq!(
        server.get("/v1/tools/one").await.body["description"],
        "changed"
    );

    let clash = server
        .put("/v1/tools/one", script_tool(dir.path(), "two", "cat\n"))
        .await;
    assert_error(&clash, StatusCode::CONFLICT, "conflict");
    let renamed = server
        .put("/v1/tools/one", script_tool(dir.path(), "three", "cat\n"))
        .await;
    assert_status(&renamed, StatusCode::OK);
    assert_error(
        &server.get("/v1/tools/one").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    let runtime = server.state.app.parts().sessions.runtime();
    assert!(runtime.tools().contains("three") && !runtime.tools().contains("one"));

    let missing = server
        .put("/v1/tools/nope", script_tool(dir.path(), "nope", "cat\n"))
        .await;
    assert_error(&missing, StatusCode::NOT_FOUND, "not_found");
    let bad = server
        .put(
            "/v1/tools/two",
            json!({"kind": "command", "name": "two", "program": ""}),
        )
        .await;
    assert_error(&bad, StatusCode::BAD_REQUEST, "invalid_request");

    let builtin_put = server
        .put(
            "/v1/tools/current_time",
            script_tool(dir.path(), "current_time", "cat\n"),
        )
        .await;
    assert_error(&builtin_put, StatusCode::BAD_REQUEST, "invalid_request");
    let builtin_delete = server.delete("/v1/tools/current_time").await;
    assert_error(&builtin_delete, StatusCode::BAD_REQUEST, "invalid_request");

    assert_status(
        &server.delete("/v1/tools/two").await,
        StatusCode::NO_CONTENT,
    );
    assert_error(
        &server.delete("/v1/tools/two").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_error(
        &server.delete("/v1/tools/..%2Fx").await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    assert!(
        !server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .tools()
            .contains("two")
    );
    let list = server.get("/v1/tools").await;
    let mut listed = names(&list.body, "tools", "name");
    listed.sort();
    assert_eq!(listed, ["current_time", "delegate", "talk_to", "three"]);
}

#[tokio::test]
async fn batch_delete_is_its_own_route() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    for name in ["a", "b", "c"] {
        let reply = server
            .post("/v1/tools", script_tool(dir.path(), name, "cat\n"))
            .await;
        assert_status(&reply, StatusCode::CREATED);
    }

    // A built-in or an invalid name refuses the whole batch.
    let builtin = server
        .send(
            Method::DELETE,
            "/v1/tools/batch",
            Some(json!({"ids": ["a", "current_time"]})),
        )
        .await;
    assert_error(&builtin, StatusCode::BAD_REQUEST, "invalid_request");
    let invalid = server
        .send(
            Method::DELETE,
            "/v1/tools/batch",
            Some(json!({"ids": ["a", "../x"]})),
        )
        .await;
    assert_error(&invalid, StatusCode::BAD_REQUEST, "invalid_request");
    let wrong_type = server
        .send(Method::DELETE, "/v1/tools/batch", Some(json!({"ids": "a"})))
        .await;
    assert_error(&wrong_type, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(
        names(&server.get("/v1/tools").await.body, "tools", "name").len(),
        6
    );

    // Not captured by /v1/tools/{name}: that would answer 404 for a tool named "batch".
    let deleted = server
        .send(
            Method::DELETE,
            "/v1/tools/batch",
            Some(json!({"ids": ["a", "b", "nope", "a"]})),
        )
        .await;
    assert_status(&deleted, StatusCode::OK);
    assert_eq!(
        deleted.body,
        json!({"deleted": ["a", "b"], "missing": ["nope"]})
    );
    let mut listed = names(&server.get("/v1/tools").await.body, "tools", "name");
    listed.sort();
    assert_eq!(listed, ["c", "current_time", "delegate", "talk_to"]);
    let runtime = server.state.app.parts().sessions.runtime();
    assert!(!runtime.tools().contains("a") && runtime.tools().contains("c"));
}

#[tokio::test]
async fn tools_defined_at_run_time_are_callable_at_once() {
    let server = Server::start().await;
    let dir = tempfile::tempdir().unwrap();
    let fenced =
        "input=$(cat)\nprintf 'Here it is:\\n```json\\n{\"echo\": %s}\\n```\\n' \"$input\"\n";
    let mut tool = script_tool(dir.path(), "fenced", fenced);
    tool["parameters"] = json!({"type": "object", "properties": {"n": {"type": "integer"}},
                                "required": ["n"]});
    assert_status(&server.post("/v1/tools", tool).await, StatusCode::CREATED);
    assert_status(
        &server
            .post(
                "/v1/tools",
                script_tool(dir.path(), "prose", "cat >/dev/null\necho just words\n"),
            )
            .await,
        StatusCode::CREATED,
    );
    assert_status(
        &server
            .post(
                "/v1/tools",
                script_tool(dir.path(), "broken", "echo oops >&2\nexit 3\n"),
            )
            .await,
        StatusCode::CREATED,
    );
    let mut slow = script_tool(dir.path(), "slow", "sleep 5\n");
    slow["timeout_ms"] = json!(200);
    assert_status(&server.post("/v1/tools", slow).await, StatusCode::CREATED);

    let json_result = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": "fenced", "arguments": {"n": 7}, "format": "json"}),
        )
        .await;
    assert_status(&json_result, StatusCode::OK);
    assert_eq!(json_result.body, json!({"result": {"echo": {"n": 7}}}));

    let text_result = server
        .post(
            "/v1/tools/call",
            json!({"name": "fenced", "arguments": {"n": 1}}),
        )
        .await;
    assert_status(&text_result, StatusCode::OK);
    assert!(
        text_result.body["result"]
            .as_str()
            .unwrap()
            .contains("```json")
    );

    let builtin = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": "current_time", "format": "json"}),
        )
        .await;
    assert_status(&builtin, StatusCode::OK);
    assert!(builtin.body["result"].is_object(), "{}", builtin.text);

    let not_json = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": "prose", "arguments": {}, "format": "json"}),
        )
        .await;
    let message = assert_error(&not_json, StatusCode::BAD_REQUEST, "result_not_json");
    assert!(message.contains("not JSON"), "{message}");

    let invalid = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": "fenced", "arguments": {"n": "seven"}}),
        )
        .await;
    let message = assert_error(&invalid, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(message.contains("/n"), "{message}");
    let unknown = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": "nope", "arguments": {}}),
        )
        .await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "not_found");
    let failed = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": "broken", "arguments": {}}),
        )
        .await;
    let message = assert_error(&failed, StatusCode::BAD_GATEWAY, "tool_failed");
    assert!(message.contains("oops"), "{message}");
    let timeout = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": "slow", "arguments": {}}),
        )
        .await;
    assert_error(&timeout, StatusCode::GATEWAY_TIMEOUT, "timeout");

    for body in [
        json!({"arguments": {}}),
        json!({"tool_id": "fenced", "format": "yaml"}),
        json!({"tool_id": 5}),
    ] {
        let reply = server.post("/v1/tools/call", body).await;
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_request");
    }

    // Deleted: gone from direct calls at once.
    assert_status(
        &server.delete("/v1/tools/fenced").await,
        StatusCode::NO_CONTENT,
    );
    let gone = server
        .post(
            "/v1/tools/call",
            json!({"tool_id": "fenced", "arguments": {"n": 1}}),
        )
        .await;
    assert_error(&gone, StatusCode::NOT_FOUND, "not_found");
}

// --- prompt templates ---

#[tokio::test]
async fn prompt_templates_round_trip_with_their_variables() {
    let server = Server::start().await;
    let created = server
        .post(
            "/v1/prompt-templates",
            json!({"name": "greet", "template": "Hello {{ name }}, welcome to {{ place }}."}),
        )
        .await;
    assert_status(&created, StatusCode::CREATED);
    assert_eq!(created.body["name"], "greet");
    // The Python service's field names.
    let aliased = server
        .post(
            "/v1/prompt-templates",
            json!({"id": "bye", "content": "Bye {{ who }}"}),
        )
        .await;
    assert_status(&aliased, StatusCode::CREATED);
    assert_eq!(
        aliased.body,
        json!({"name": "bye", "template": "Bye {{ who }}"})
    );

    let list = server.get("/v1/prompt-templates").await;
    assert_eq!(names(&list.body, "templates", "name"), ["bye", "greet"]);
    assert_eq!(
        server.get("/v1/prompt-templates/greet").await.body["template"],
        "Hello {{ name }}, welcome to {{ place }}."
    );
    let variables = server.get("/v1/prompt-templates/greet/variables").await;
    assert_status(&variables, StatusCode::OK);
    assert_eq!(variables.body, json!({"variables": ["name", "place"]}));
    assert!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .templates()
            .get("greet")
            .is_some()
    );

    let duplicate = server
        .post(
            "/v1/prompt-templates",
            json!({"name": "greet", "template": "x"}),
        )
        .await;
    assert_error(&duplicate, StatusCode::CONFLICT, "conflict");

    let replaced = server
        .put(
            "/v1/prompt-templates/greet",
            json!({"name": "greet", "template": "Hi {{ who }}"}),
        )
        .await;
    assert_status(&replaced, StatusCode::OK);
    assert_eq!(
        server
            .get("/v1/prompt-templates/greet/variables")
            .await
            .body,
        json!({"variables": ["who"]})
    );
    assert_eq!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .templates()
            .get("greet"),
        Some("Hi {{ who }}")
    );
    let clash = server
        .put(
            "/v1/prompt-templates/greet",
            json!({"name": "bye", "template": "x"}),
        )
        .await;
    assert_error(&clash, StatusCode::CONFLICT, "conflict");
    let renamed = server
        .put(
            "/v1/prompt-templates/greet",
            json!({"name": "hello", "template": "Hi {{ who }}"}),
        )
        .await;
    assert_status(&renamed, StatusCode::OK);
    assert_error(
        &server.get("/v1/prompt-templates/greet").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .templates()
            .get("hello")
            .is_some()
    );

    assert_status(
        &server.delete("/v1/prompt-templates/hello").await,
        StatusCode::NO_CONTENT,
    );
    assert_error(
        &server.delete("/v1/prompt-templates/hello").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_error(
        &server.get("/v1/prompt-templates/hello/variables").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    let missing = server
        .put(
            "/v1/prompt-templates/nope",
            json!({"name": "nope", "template": "x"}),
        )
        .await;
    assert_error(&missing, StatusCode::NOT_FOUND, "not_found");
    assert!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .templates()
            .get("hello")
            .is_none()
    );
}

#[tokio::test]
async fn bad_templates_are_refused_with_the_reason() {
    let server = Server::start().await;
    let broken = server
        .post(
            "/v1/prompt-templates",
            json!({"name": "broken", "template": "Hi {{ name "}),
        )
        .await;
    let message = assert_error(&broken, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(message.contains("does not compile"), "{message}");

    // A template that runs away whatever its arguments is refused at once, with the reason,
    // and the server keeps answering.
    let started = std::time::Instant::now();
    let runaway = server
        .post(
            "/v1/prompt-templates",
            json!({"name": "spin", "template":
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"}),
        )
        .await;
    let message = assert_error(&runaway, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(message.contains("too expensive"), "{message}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_error(
        &server.get("/v1/prompt-templates/spin").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );

    // One that grows a string past any bound in a few instructions (fuel cannot see it)
    // fails in its renderer, with the reason; the server's own memory does not grow.
    let before = super::support::peak_memory_bytes();
    let doubling = server
        .post(
            "/v1/prompt-templates",
            json!({"name": "doubling", "template":
                format!("{{% set a = 'x' * 100000000 %}}{}{{{{ a }}}}", "{% set a = a ~ a %}".repeat(5))}),
        )
        .await;
    let message = assert_error(&doubling, StatusCode::BAD_REQUEST, "invalid_request");
    assert!(message.contains("bytes of memory"), "{message}");
    let grown = super::support::peak_memory_bytes().saturating_sub(before);
    assert!(
        grown < 100 * 1024 * 1024,
        "the server grew by {grown} bytes"
    );
    assert_error(
        &server.get("/v1/prompt-templates/doubling").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );

    let cases: Vec<(&str, Value)> = vec![
        (
            "traversal name",
            json!({"name": "../../x", "template": "x"}),
        ),
        ("name with a space", json!({"name": "a b", "template": "x"})),
        ("empty name", json!({"name": "", "template": "x"})),
        ("wrong type", json!({"name": "t", "template": 5})),
        ("missing template", json!({"name": "t"})),
        (
            "unknown field",
            json!({"name": "t", "template": "x", "extra": 1}),
        ),
    ];
    for (case, body) in cases {
        let reply = server.post("/v1/prompt-templates", body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{case}: {}",
            reply.text
        );
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_request");
    }
    let malformed = server
        .send_raw(
            Method::POST,
            "/v1/prompt-templates",
            "application/json",
            b"[".to_vec(),
        )
        .await;
    assert_error(&malformed, StatusCode::BAD_REQUEST, "invalid_request");
    assert_error(
        &server.get("/v1/prompt-templates/a%20b").await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    assert_error(
        &server.get("/v1/prompt-templates/nope").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );

    // A replacement that does not compile keeps the old template.
    assert_status(
        &server
            .post(
                "/v1/prompt-templates",
                json!({"name": "ok", "template": "{{ a }}"}),
            )
            .await,
        StatusCode::CREATED,
    );
    let bad_put = server
        .put(
            "/v1/prompt-templates/ok",
            json!({"name": "ok", "template": "{% if %}"}),
        )
        .await;
    assert_error(&bad_put, StatusCode::BAD_REQUEST, "invalid_request");
    assert_eq!(
        server.get("/v1/prompt-templates/ok").await.body["template"],
        "{{ a }}"
    );
    assert_eq!(
        names(
            &server.get("/v1/prompt-templates").await.body,
            "templates",
            "name"
        ),
        ["ok"]
    );
}

// --- secrets ---

#[tokio::test]
async fn secrets_are_write_only() {
    let server = Server::start().await;
    let mock = MockProvider::start().await.unwrap();
    let value = "sk-live-SUPERSECRET-value-1234";
    let single = server
        .post("/v1/env", json!({"name": "API_KEY", "value": value}))
        .await;
    assert_status(&single, StatusCode::NO_CONTENT);
    let several = server
        .post(
            "/v1/env",
            json!({"vars": {"OTHER": "another-secret-value-5678", "SHORT": "abc"}}),
        )
        .await;
    assert_status(&several, StatusCode::OK);
    assert_eq!(several.body, json!({"set": ["OTHER", "SHORT"]}));

    // Used by a model and a tool: nothing that lists them shows a value.
    let mut model = openai_model("keyed", &mock);
    model["api_key_secret"] = json!("API_KEY");
    assert_status(&server.post("/v1/models", model).await, StatusCode::CREATED);
    let tool = json!({"kind": "http", "name": "keyed_tool", "url": "https://h.example/",
                      "headers": {"authorization": {"secret": "API_KEY"}}});
    assert_status(&server.post("/v1/tools", tool).await, StatusCode::CREATED);

    let list = server.get("/v1/env").await;
    assert_status(&list, StatusCode::OK);
    assert_eq!(
        names(&list.body, "secrets", "name"),
        ["API_KEY", "OTHER", "SHORT"]
    );
    let first = &list.body["secrets"][0];
    assert_eq!(first["masked"], "…1234");
    assert!(first["updated_at"].is_u64());
    assert_eq!(list.body["secrets"][2]["masked"], "…");
    for path in [
        "/v1/env",
        "/v1/models",
        "/v1/models/keyed",
        "/v1/tools",
        "/v1/tools/keyed_tool",
        "/v1/prompt-templates",
    ] {
        let reply = server.get(path).await;
        assert_status(&reply, StatusCode::OK);
        for secret in [value, "another-secret-value-5678", "SUPERSECRET"] {
            assert!(
                !reply.text.contains(secret),
                "{path} shows a secret: {}",
                reply.text
            );
        }
    }

    // Replacing a value keeps it hidden too.
    let replaced = server
        .post(
            "/v1/env",
            json!({"name": "API_KEY", "value": "sk-new-value-abcdefgh"}),
        )
        .await;
    assert_status(&replaced, StatusCode::NO_CONTENT);
    let list = server.get("/v1/env").await;
    assert!(!list.text.contains("sk-new-value-abcdefgh"));
    assert_eq!(list.body["secrets"][0]["masked"], "…efgh");

    assert_status(
        &server.delete("/v1/env/SHORT").await,
        StatusCode::NO_CONTENT,
    );
    assert_error(
        &server.delete("/v1/env/SHORT").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_eq!(
        names(&server.get("/v1/env").await.body, "secrets", "name"),
        ["API_KEY", "OTHER"]
    );
}

/// Security review 2, S6: a secret set with `hosts` goes only to those hosts; a model, tool or
/// MCP server that would send it elsewhere is refused, and the binding changes only with the
/// value.
#[tokio::test]
async fn a_secret_bound_to_hosts_is_sent_nowhere_else() {
    let server = Server::start().await;
    let mock = MockProvider::start().await.unwrap();
    let value = "sk-bound-0123456789abcdef";
    let bound = server
        .post(
            "/v1/env",
            json!({"name": "BOUND_KEY", "value": value, "hosts": ["127.0.0.1", "*.example.com"]}),
        )
        .await;
    assert_status(&bound, StatusCode::NO_CONTENT);
    let listed = server.get("/v1/env").await;
    assert_eq!(
        listed.body["secrets"][0]["hosts"],
        json!(["127.0.0.1", "*.example.com"])
    );
    assert!(!listed.text.contains(value));

    // To one of its hosts: the model is registered and its test carries the key.
    let mut model = openai_model("bound", &mock);
    model["api_key_secret"] = json!("BOUND_KEY");
    assert_status(&server.post("/v1/models", model).await, StatusCode::CREATED);
    mock.enqueue(Reply::scripted(ScriptedTurn::text("pong")));
    let ok = server.post("/v1/models/bound/test", json!({})).await;
    assert_eq!(ok.body["ok"], true, "{}", ok.text);
    assert_eq!(
        mock.take_requests()[0].header("authorization"),
        Some(&*format!("Bearer {value}"))
    );

    // The same provider under another name, an HTTP tool and an MCP server at other hosts: each
    // refused, naming the secret and never showing it (a process's environment is refused too:
    // the unit tests of `agentry_app::secrets`).
    let mut elsewhere = openai_model("elsewhere", &mock);
    elsewhere["base_url"] = json!(mock.openai_base_url().replace("127.0.0.1", "localhost"));
    elsewhere["api_key_secret"] = json!("BOUND_KEY");
    let tool = json!({"kind": "http", "name": "leaky", "url": "https://example.com.evil.test/",
                      "headers": {"authorization": {"secret": "BOUND_KEY"}}});
    let subdomain_tool = json!({"kind": "http", "name": "fine", "url": "https://api.example.com/",
                                "headers": {"authorization": {"secret": "BOUND_KEY"}}});
    let mcp = json!({"mcpServers": {"envy": {"url": "https://evil.test/mcp",
                                             "headers": {"authorization": {"secret": "BOUND_KEY"}}}}});
    for (path, body) in [
        ("/v1/models", elsewhere.clone()),
        ("/v1/tools", tool),
        ("/v1/tools/mcp", mcp),
    ] {
        let refused = server.post(path, body).await;
        let message = assert_error(&refused, StatusCode::FORBIDDEN, "secret_host_not_allowed");
        assert!(message.contains("BOUND_KEY"), "{path}: {message}");
        assert!(!refused.text.contains(value), "{path}: {}", refused.text);
    }
    assert_status(
        &server.post("/v1/tools", subdomain_tool).await,
        StatusCode::CREATED,
    );
    assert!(mock.take_requests().is_empty());

    // A model saved while the secret was unbound stops working once it is bound elsewhere:
    // its test is refused and the runtime no longer offers it.
    let unbound = server
        .post("/v1/env", json!({"name": "BOUND_KEY", "value": value}))
        .await;
    assert_status(&unbound, StatusCode::NO_CONTENT);
    assert!(
        server.get("/v1/env").await.body["secrets"][0]
            .get("hosts")
            .is_none()
    );
    assert_status(
        &server.post("/v1/models", elsewhere).await,
        StatusCode::CREATED,
    );
    let rebound = server
        .post(
            "/v1/env",
            json!({"name": "BOUND_KEY", "value": value, "hosts": ["127.0.0.1"]}),
        )
        .await;
    assert_status(&rebound, StatusCode::NO_CONTENT);
    assert!(
        server
            .state
            .app
            .parts()
            .sessions
            .runtime()
            .model_client("elsewhere")
            .is_err()
    );
    let test = server.post("/v1/models/elsewhere/test", json!({})).await;
    assert_error(&test, StatusCode::FORBIDDEN, "secret_host_not_allowed");
    assert!(mock.take_requests().is_empty());

    // Hosts are host names or addresses, given with one secret's value, never alone.
    for body in [
        json!({"name": "K", "value": "v", "hosts": ["https://api.example.com"]}),
        json!({"name": "K", "value": "v", "hosts": ["api.example.com:443"]}),
        json!({"name": "K", "value": "v", "hosts": []}),
        json!({"name": "K", "hosts": ["api.example.com"]}),
        json!({"vars": {"K": "v"}, "hosts": ["api.example.com"]}),
    ] {
        let refused = server.post("/v1/env", body.clone()).await;
        assert_status(&refused, StatusCode::BAD_REQUEST);
    }
    assert_eq!(
        names(&server.get("/v1/env").await.body, "secrets", "name"),
        ["BOUND_KEY"]
    );
}

#[tokio::test]
async fn bad_secrets_are_refused_and_nothing_is_written() {
    let server = Server::start().await;
    let cases: Vec<(&str, Value)> = vec![
        ("traversal name", json!({"name": "../../x", "value": "v"})),
        ("name with a space", json!({"name": "A B", "value": "v"})),
        ("empty name", json!({"name": "", "value": "v"})),
        ("long name", json!({"name": "K".repeat(129), "value": "v"})),
        ("empty value", json!({"name": "K", "value": ""})),
        ("no value", json!({"name": "K"})),
        (
            "both forms",
            json!({"name": "K", "value": "v", "vars": {"L": "w"}}),
        ),
        ("nothing", json!({})),
        ("empty vars", json!({"vars": {}})),
        (
            "one bad var",
            json!({"vars": {"GOOD": "v", "BAD NAME": "w"}}),
        ),
        ("one empty var", json!({"vars": {"GOOD": "v", "EMPTY": ""}})),
        ("wrong type", json!({"name": "K", "value": 5})),
        ("vars wrong type", json!({"vars": ["K"]})),
        (
            "unknown field",
            json!({"name": "K", "value": "v", "secret": true}),
        ),
    ];
    for (case, body) in cases {
        let reply = server.post("/v1/env", body).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{case}: {}",
            reply.text
        );
        assert_error(&reply, StatusCode::BAD_REQUEST, "invalid_request");
    }
    let malformed = server
        .send_raw(
            Method::POST,
            "/v1/env",
            "application/json",
            b"{\"name\": \"K\",".to_vec(),
        )
        .await;
    assert_error(&malformed, StatusCode::BAD_REQUEST, "invalid_request");
    assert_error(
        &server.delete("/v1/env/A%20B").await,
        StatusCode::BAD_REQUEST,
        "invalid_request",
    );
    assert_error(
        &server.delete("/v1/env/NOPE").await,
        StatusCode::NOT_FOUND,
        "not_found",
    );
    assert_eq!(server.get("/v1/env").await.body, json!({"secrets": []}));
}

// --- limits ---

#[tokio::test]
async fn an_oversized_body_is_a_json_413() {
    let server = Server::start().await;
    let big = "x".repeat(5 * 1024 * 1024);
    for path in ["/v1/prompt-templates", "/v1/tools", "/v1/models", "/v1/env"] {
        let body = serde_json::to_vec(&json!({"name": "big", "template": big})).unwrap();
        let reply = server
            .send_raw(Method::POST, path, "application/json", body)
            .await;
        assert_error(&reply, StatusCode::PAYLOAD_TOO_LARGE, "request_too_large");
    }
    assert_eq!(
        server.get("/v1/prompt-templates").await.body,
        json!({"templates": []})
    );
}
