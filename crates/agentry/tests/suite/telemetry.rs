//! Traces and logs of `agentry serve`: with `OTEL_EXPORTER_OTLP_ENDPOINT` set, a run's spans
//! reach an OTLP receiver (OTLP/HTTP with JSON bodies, read here) in one trace that continues
//! the caller's `traceparent` — request → `invoke_agent` → `chat` and `execute_tool` → the
//! delegated run's `invoke_agent` → its `chat` — with the GenAI attributes, and the model
//! provider is sent the trace context; `--log-format json` writes JSON lines carrying the run's
//! id; with nothing configured nothing is exported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_testkit::{MockProvider, OtlpReceiver, Reply, ScriptedTurn};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use super::processes::{free_port, serve, serve_command};

/// One exported span, flattened.
#[derive(Debug, Clone)]
struct Span {
    name: String,
    trace: String,
    id: String,
    parent: String,
    attributes: HashMap<String, Value>,
    status: Value,
}

impl Span {
    fn text(&self, key: &str) -> Option<&str> {
        self.attributes
            .get(key)
            .and_then(|value| value["stringValue"].as_str())
    }

    fn number(&self, key: &str) -> Option<i64> {
        let value = &self.attributes.get(key)?["intValue"];
        value
            .as_i64()
            .or_else(|| value.as_str().and_then(|text| text.parse().ok()))
    }
}

fn spans(bodies: &[Value]) -> Vec<Span> {
    let mut found = Vec::new();
    for body in bodies {
        for resource in body["resourceSpans"].as_array().into_iter().flatten() {
            for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                for span in scope["spans"].as_array().into_iter().flatten() {
                    found.push(Span {
                        name: span["name"].as_str().unwrap_or_default().to_owned(),
                        trace: span["traceId"].as_str().unwrap_or_default().to_lowercase(),
                        id: span["spanId"].as_str().unwrap_or_default().to_lowercase(),
                        parent: span["parentSpanId"]
                            .as_str()
                            .unwrap_or_default()
                            .to_lowercase(),
                        attributes: span["attributes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|attribute| {
                                (
                                    attribute["key"].as_str().unwrap().to_owned(),
                                    attribute["value"].clone(),
                                )
                            })
                            .collect(),
                        status: span["status"].clone(),
                    });
                }
            }
        }
    }
    found
}

fn service_names(bodies: &[Value]) -> Vec<String> {
    bodies
        .iter()
        .flat_map(|body| {
            body["resourceSpans"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .flat_map(|resource| {
            resource["resource"]["attributes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .filter(|attribute| attribute["key"] == "service.name")
        .filter_map(|attribute| {
            attribute["value"]["stringValue"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// `agentry serve` (stderr dropped, no host commands from the environment) with `extra`
/// arguments and `envs`, listening, with the mock registered as model `m`: the process, a
/// client and its base URL.
async fn traced_server(
    home: &std::path::Path,
    mock: &MockProvider,
    extra: &[&str],
    envs: &[(&str, String)],
) -> (tokio::process::Child, reqwest::Client, String) {
    let port = free_port();
    let mut command = serve_command(home, port, extra);
    command
        .env_remove("AGENTRY_ALLOW_HOST_COMMANDS")
        .stderr(std::process::Stdio::null());
    for (name, value) in envs {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    super::processes::listening(&mut child).await;
    let http = agentry_llm::http_client(Duration::from_secs(60)).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    add_model(&http, &base, mock).await;
    (child, http, base)
}

/// Registers the mock as model `m`.
async fn add_model(http: &reqwest::Client, base: &str, mock: &MockProvider) {
    post(
        http,
        &format!("{base}/v1/models"),
        json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "gpt-test"}),
    )
    .await;
}

async fn post(http: &reqwest::Client, url: &str, body: Value) -> Value {
    let response = http.post(url).json(&body).send().await.unwrap();
    let status = response.status();
    let answer: Value = response.json().await.unwrap_or(Value::Null);
    assert!(status.is_success(), "{url}: {status} {answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_trace_reaches_the_receiver_continuing_the_callers_and_logs_are_json() {
    let otlp = OtlpReceiver::start().await.unwrap();
    let mock = MockProvider::start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args([
            "serve",
            &format!("127.0.0.1:{port}"),
            "--log-format",
            "json",
            "-v",
        ])
        .env_remove("OPENAI_API_KEY")
        .env_remove("AGENTRY_DATABASE_URL")
        .env_remove("RUST_LOG")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env("OTEL_SERVICE_NAME", "agentry-under-test")
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let logs: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let kept = Arc::clone(&logs);
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            kept.lock().unwrap().push(line);
        }
    });
    // The banner on stdout is JSON lines too (issue 48), the first one saying it listens.
    let printed: Arc<Mutex<Vec<String>>> = Arc::default();
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(20), stdout.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let first: Value = serde_json::from_str(&first).unwrap();
    assert!(
        first["message"]
            .as_str()
            .unwrap()
            .starts_with("Agentry is listening"),
        "{first}"
    );
    let kept = Arc::clone(&printed);
    tokio::spawn(async move {
        while let Ok(Some(line)) = stdout.next_line().await {
            kept.lock().unwrap().push(line);
        }
    });
    let http = agentry_llm::http_client(Duration::from_secs(30)).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    add_model(&http, &base, &mock).await;
    post(
        &http,
        &format!("{base}/v1/agents"),
        json!({"id": "boss", "model_id": "m", "tool_ids": ["delegate", "current_time"]}),
    )
    .await;
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call(
            "delegate",
            json!({"task": "Tell the time.", "tools": ["current_time"]}),
        )
        .with_usage(40, 7),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("current_time", json!({})).with_usage(20, 3),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("It is noon.").with_usage(25, 4),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("Noon, they say.").with_usage(50, 5),
    ));
    let trace = format!("{:032x}", fastrand::u128(1..));
    let caller_span = format!("{:016x}", fastrand::u64(1..));
    let response = http
        .post(format!("{base}/v1/infer"))
        .header("traceparent", format!("00-{trace}-{caller_span}-01"))
        .json(&json!({"agent_id": "boss", "session_id": "new", "text": "What time is it?"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["text"], "Noon, they say.", "{answer}");
    let run_id = answer["run_id"].as_str().unwrap().to_owned();

    // Every span of the request arrives: the request, two runs, four model calls, three tools.
    let deadline = Instant::now() + Duration::from_secs(20);
    let found = loop {
        let found: Vec<Span> = spans(&otlp.json_bodies())
            .into_iter()
            .filter(|span| span.trace == trace)
            .collect();
        if found.len() >= 9 || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let names: Vec<&str> = found.iter().map(|span| span.name.as_str()).collect();
    let one = |name: &str| -> &Span {
        let matching: Vec<&Span> = found.iter().filter(|span| span.name == name).collect();
        assert_eq!(matching.len(), 1, "{name} in {names:?}");
        matching[0]
    };
    let request = one("POST /v1/infer");
    assert_eq!(request.parent, caller_span, "the caller's trace goes on");
    assert_eq!(request.text("http.route"), Some("/v1/infer"), "{request:?}");
    assert_eq!(
        request.number("http.response.status_code"),
        Some(200),
        "{request:?}"
    );
    let boss = one("invoke_agent boss");
    assert_eq!(boss.parent, request.id);
    assert_eq!(boss.text("gen_ai.operation.name"), Some("invoke_agent"));
    assert_eq!(boss.text("gen_ai.agent.name"), Some("boss"));
    assert_eq!(boss.text("agentry.run.id"), Some(run_id.as_str()));
    assert_eq!(
        boss.text("gen_ai.conversation.id"),
        answer["session_id"].as_str()
    );
    assert_eq!(
        boss.number("gen_ai.usage.input_tokens"),
        Some(90),
        "{boss:?}"
    );
    let chats: Vec<&Span> = found.iter().filter(|span| span.name == "chat m").collect();
    assert_eq!(chats.len(), 4, "{names:?}");
    let boss_chats: Vec<&&Span> = chats.iter().filter(|span| span.parent == boss.id).collect();
    assert_eq!(boss_chats.len(), 2, "{found:?}");
    let first = boss_chats
        .iter()
        .find(|span| span.number("gen_ai.usage.input_tokens") == Some(40))
        .unwrap_or_else(|| panic!("{boss_chats:?}"));
    assert_eq!(first.text("gen_ai.operation.name"), Some("chat"));
    assert_eq!(first.text("gen_ai.request.model"), Some("m"));
    assert_eq!(first.number("gen_ai.usage.output_tokens"), Some(7));
    assert!(
        first
            .text("gen_ai.response.finish_reasons")
            .is_some_and(|reasons| reasons.contains("tool_use")),
        "{first:?}"
    );
    // No content by default.
    assert!(first.text("gen_ai.input.messages").is_none(), "{first:?}");
    let delegate = one("execute_tool delegate");
    assert_eq!(delegate.parent, boss.id);
    assert_eq!(delegate.text("gen_ai.tool.name"), Some("delegate"));
    assert!(delegate.text("gen_ai.tool.call.id").is_some());
    // The delegated run hangs under the call that started it.
    let child_runs: Vec<&Span> = found
        .iter()
        .filter(|span| span.name.starts_with("invoke_agent") && span.id != boss.id)
        .collect();
    assert_eq!(child_runs.len(), 1, "{names:?}");
    let child_run = child_runs[0];
    assert_eq!(child_run.parent, delegate.id, "{child_run:?}");
    assert_eq!(
        chats
            .iter()
            .filter(|span| span.parent == child_run.id)
            .count(),
        2
    );
    let time = one("execute_tool current_time");
    assert_eq!(time.parent, child_run.id);
    assert!(
        time.status
            .get("code")
            .is_none_or(|code| code != 2 && code != "STATUS_CODE_ERROR")
    );
    assert_eq!(service_names(&otlp.json_bodies())[0], "agentry-under-test");

    // The provider was sent the trace: each model call's own span as the parent.
    let calls = mock.requests();
    assert_eq!(calls.len(), 4);
    for call in &calls {
        let traceparent = call
            .headers
            .iter()
            .find(|(name, _)| name == "traceparent")
            .map(|(_, value)| value.clone())
            .unwrap_or_else(|| panic!("no traceparent in {:?}", call.headers));
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts[1], trace, "{traceparent}");
        assert!(
            chats.iter().any(|span| span.id == parts[2]),
            "{traceparent}"
        );
    }

    // The logs are JSON lines, on both streams to the last one; the run's own line carries
    // its id (from its span).
    let pid = child.id().unwrap().to_string();
    std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let logs = logs.lock().unwrap().clone();
    assert!(!logs.is_empty());
    assert!(
        logs.last().unwrap().contains("agentry: stopped"),
        "{logs:?}"
    );
    let printed = printed.lock().unwrap().clone();
    assert!(printed.len() >= 5, "{printed:?}");
    for line in printed.iter().chain(&logs) {
        let parsed: Value = serde_json::from_str(line)
            .unwrap_or_else(|error| panic!("not a JSON line ({error}): {line}"));
        assert!(
            parsed["timestamp"].is_string() && parsed["level"].is_string(),
            "{line}"
        );
    }
    assert!(
        logs.iter()
            .any(|line| line.contains("run stopped") && line.contains(&run_id)),
        "{logs:?}"
    );
    // The request's lines, the run's included, carry the trace's id: logs and trace meet.
    let traced: Vec<&String> = logs
        .iter()
        .filter(|line| line.contains(&format!("\"trace_id\":\"{trace}\"")))
        .collect();
    assert!(
        traced.iter().any(|line| line.contains("run stopped")),
        "{logs:?}"
    );
    assert!(
        logs.iter()
            .any(|line| line.contains("finished processing request")),
        "{logs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_exported_when_no_endpoint_is_set() {
    // A receiver is up, but nothing names it.
    let otlp = OtlpReceiver::start().await.unwrap();
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("ok")));
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut child = serve(home.path(), port, &[]);
    super::processes::listening(&mut child).await;
    let http = agentry_llm::http_client(Duration::from_secs(30)).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    add_model(&http, &base, &mock).await;
    let answer = post(
        &http,
        &format!("{base}/v1/infer"),
        json!({"model_id": "m", "text": "hi"}),
    )
    .await;
    assert_eq!(answer["text"], "ok");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(otlp.json_bodies().is_empty());
    // And no trace context goes to the provider.
    let calls = mock.requests();
    assert!(
        calls[0]
            .headers
            .iter()
            .all(|(name, _)| name != "traceparent"),
        "{:?}",
        calls[0].headers
    );
}

/// Arize Phoenix (from the test venv) on free ports with its own working folder: its base URL.
async fn phoenix(dir: &std::path::Path) -> (String, tokio::process::Child) {
    let (base, _, child) = phoenix_with_grpc(dir).await;
    (base, child)
}

/// Arize Phoenix on free ports: its base URL and its OTLP/gRPC port.
async fn phoenix_with_grpc(dir: &std::path::Path) -> (String, u16, tokio::process::Child) {
    let servers = agentry_testkit::mcp::McpServers::locate()
        .expect("run scripts/install-mcp-servers first: the venv has Arize Phoenix");
    let program = servers.python().with_file_name("phoenix");
    let port = free_port();
    let grpc = free_port();
    let child = tokio::process::Command::new(program)
        .arg("serve")
        .env("PHOENIX_WORKING_DIR", dir)
        .env("PHOENIX_HOST", "127.0.0.1")
        .env("PHOENIX_PORT", port.to_string())
        .env("PHOENIX_GRPC_PORT", grpc.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let http = agentry_llm::http_client(Duration::from_secs(5)).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(response) = http.get(format!("{base}/healthz")).send().await
            && response.status().is_success()
        {
            return (base, grpc, child);
        }
        assert!(Instant::now() < deadline, "Phoenix did not start");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_land_in_arize_phoenix_with_mcp_and_delegated_runs() {
    let phoenix_dir = tempfile::tempdir().unwrap();
    let (phoenix_url, _phoenix) = phoenix(phoenix_dir.path()).await;
    let mock = MockProvider::start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    // The MCP reference server, run in a sandbox of its own (the installed servers are shown
    // inside read-only).
    let root =
        std::fs::canonicalize(agentry_testkit::mcp::McpServers::locate().unwrap().root()).unwrap();
    let spec = agentry_testkit::mcp::McpServers::at(&root)
        .unwrap()
        .everything();
    std::fs::write(
        home.path().join("mcp.json"),
        json!({"mcpServers": {"everything": {"command": spec.program, "args": spec.args}}})
            .to_string(),
    )
    .unwrap();
    let root_arg = root.to_string_lossy().into_owned();
    let (_child, http, base) = traced_server(
        home.path(),
        &mock,
        &["--sandbox", "native", "--sandbox-ro-mount", &root_arg],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix_url.clone()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ],
    )
    .await;
    // The agent can use the MCP server's tools once the server has started and the runtime
    // has them.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let response = http
            .post(format!("{base}/v1/agents"))
            .json(&json!({"id": "boss", "model_id": "m",
                          "tool_ids": ["everything__echo", "delegate"]}))
            .send()
            .await
            .unwrap();
        if response.status().is_success() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the MCP server's tools never came"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("everything__echo", json!({"message": "ping"})).with_usage(30, 6),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("delegate", json!({"task": "Say done.", "tools": []}))
            .with_usage(35, 6),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("done").with_usage(10, 1),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("All done.").with_usage(45, 3),
    ));
    let answer = post(
        &http,
        &format!("{base}/v1/infer"),
        json!({"agent_id": "boss", "session_id": "new", "text": "Echo, then delegate."}),
    )
    .await;
    assert_eq!(answer["text"], "All done.", "{answer}");
    let run_id = answer["run_id"].as_str().unwrap();

    // Phoenix has the run's trace: find it by the run's span, then read the whole trace.
    let deadline = Instant::now() + Duration::from_secs(30);
    let read = || {
        let http = http.clone();
        let url = format!("{phoenix_url}/v1/projects/default/spans?limit=1000");
        async move {
            let body: Value = http.get(url).send().await.unwrap().json().await.unwrap();
            body["data"].as_array().cloned().unwrap_or_default()
        }
    };
    let spans = loop {
        let all = read().await;
        let boss = all.iter().find(|span| span["name"] == "invoke_agent boss");
        if let Some(boss) = boss {
            let trace = boss["context"]["trace_id"].as_str().unwrap().to_owned();
            let spans: Vec<Value> = all
                .iter()
                .filter(|span| span["context"]["trace_id"] == trace.as_str())
                .cloned()
                .collect();
            // The request's own span ends (and is exported) last, after its response.
            let request = spans.iter().any(|span| span["name"] == "POST /v1/infer");
            if spans.len() >= 9 && request {
                break spans;
            }
        }
        assert!(
            Instant::now() < deadline,
            "Phoenix never had the run's spans: {all:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let named =
        |name: &str| -> Vec<&Value> { spans.iter().filter(|span| span["name"] == name).collect() };
    let id = |span: &Value| span["context"]["span_id"].as_str().unwrap().to_owned();
    let attribute = |span: &Value, key: &str| -> Value {
        // Phoenix answers attributes flat (`gen_ai.tool.name`) or nested by their dots.
        let attributes = &span["attributes"];
        if let Some(value) = attributes.get(key) {
            return value.clone();
        }
        key.split('.')
            .try_fold(attributes, |value, part| value.get(part))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let boss = named("invoke_agent boss")[0];
    assert_eq!(attribute(boss, "agentry.run.id"), json!(run_id), "{boss}");
    assert_eq!(
        attribute(boss, "gen_ai.operation.name"),
        "invoke_agent",
        "{boss}"
    );
    let request = named("POST /v1/infer")[0];
    assert_eq!(boss["parent_id"].as_str(), Some(id(request).as_str()));
    let echo = named("execute_tool everything__echo")[0];
    assert_eq!(echo["parent_id"].as_str(), Some(id(boss).as_str()));
    assert_eq!(
        attribute(echo, "gen_ai.tool.name"),
        "everything__echo",
        "{echo}"
    );
    let mcp = named("tools/call echo")[0];
    assert_eq!(mcp["parent_id"].as_str(), Some(id(echo).as_str()), "{mcp}");
    assert_eq!(attribute(mcp, "mcp.method.name"), "tools/call", "{mcp}");
    let delegate = named("execute_tool delegate")[0];
    let child_run = spans
        .iter()
        .find(|span| {
            span["name"]
                .as_str()
                .is_some_and(|name| name.starts_with("invoke_agent"))
                && span["name"] != "invoke_agent boss"
        })
        .unwrap_or_else(|| panic!("no delegated run in {spans:?}"));
    assert_eq!(child_run["parent_id"].as_str(), Some(id(delegate).as_str()));
    let chats = named("chat m");
    assert_eq!(chats.len(), 4, "{spans:?}");
    assert!(
        chats
            .iter()
            .any(|chat| attribute(chat, "gen_ai.usage.input_tokens") == json!(30)),
        "{chats:?}"
    );
    assert_eq!(
        chats
            .iter()
            .filter(|chat| chat["parent_id"].as_str() == Some(id(child_run).as_str()))
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_arize_phoenix_over_otlp_grpc() {
    let phoenix_dir = tempfile::tempdir().unwrap();
    let (phoenix_url, grpc, _phoenix) = phoenix_with_grpc(phoenix_dir.path()).await;
    let mock = MockProvider::start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let (_child, http, base) = traced_server(
        home.path(),
        &mock,
        &[],
        &[
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc".into()),
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://127.0.0.1:{grpc}"),
            ),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
            ("OTEL_SERVICE_NAME", "agentry-grpc".into()),
        ],
    )
    .await;
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("over grpc").with_usage(21, 4),
    ));
    let answer = post(
        &http,
        &format!("{base}/v1/infer"),
        json!({"session_id": "new", "text": "Hello over gRPC."}),
    )
    .await;
    assert_eq!(answer["text"], "over grpc", "{answer}");
    let run_id = answer["run_id"].as_str().unwrap().to_owned();
    // The run's span and its model call arrive in Phoenix through its gRPC receiver.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body: Value = http
            .get(format!(
                "{phoenix_url}/v1/projects/default/spans?limit=1000"
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let spans = body["data"].as_array().cloned().unwrap_or_default();
        let run = spans.iter().find(|span| {
            let attributes = &span["attributes"];
            attributes.get("agentry.run.id") == Some(&json!(run_id))
                || attributes["agentry"]["run"]["id"] == json!(run_id)
        });
        if let Some(run) = run {
            let trace = &run["context"]["trace_id"];
            let chat = spans
                .iter()
                .find(|span| span["context"]["trace_id"] == *trace && span["name"] == "chat m");
            if let Some(chat) = chat {
                assert_eq!(chat["parent_id"], run["context"]["span_id"], "{chat}");
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "Phoenix never had the run's spans over gRPC: {spans:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_commands_and_workflow_steps_have_spans() {
    let otlp = OtlpReceiver::start().await.unwrap();
    let mock = MockProvider::start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let (_child, http, base) = traced_server(
        home.path(),
        &mock,
        &["--sandbox", "native"],
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", otlp.endpoint().to_string()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json".into()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
        ],
    )
    .await;

    // A run whose command fails in the session's sandbox.
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "exec",
        json!({"command": "echo working; exit 3"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It failed.")));
    let answer = post(
        &http,
        &format!("{base}/v1/infer"),
        json!({"session_id": "new", "text": "run it", "tool_ids": ["exec"],
               "approvals": {"tools": {"exec": "never"}}}),
    )
    .await;
    assert_eq!(answer["text"], "It failed.", "{answer}");

    // A workflow of two tool steps.
    post(
        &http,
        &format!("{base}/v1/workflows"),
        json!({"id": "clock", "steps": [
            {"id": "first", "kind": "tool", "tool": "current_time"},
            {"id": "second", "kind": "tool", "tool": "current_time", "needs": ["first"]}
        ]}),
    )
    .await;
    let started = post(
        &http,
        &format!("{base}/v1/workflows/clock/runs"),
        json!({"input": {}}),
    )
    .await;
    let workflow_run = started["run_id"].as_str().unwrap().to_owned();

    let deadline = Instant::now() + Duration::from_secs(30);
    let found = loop {
        let found = spans(&otlp.json_bodies());
        let steps = found
            .iter()
            .filter(|span| span.name.starts_with("workflow_step "))
            .count();
        // A parent span closes (and is exported) after its children, perhaps in a later batch, and
        // the request span whenever its response is written: wait for all of them.
        let complete = steps >= 2
            && [
                "exec ",
                "execute_tool exec",
                "invoke_workflow",
                "POST /v1/workflows/{name}/runs",
            ]
            .iter()
            .all(|name| found.iter().any(|span| span.name.starts_with(name)));
        if complete || Instant::now() > deadline {
            break found;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let names: Vec<&str> = found.iter().map(|span| span.name.as_str()).collect();
    let exec = found
        .iter()
        .find(|span| span.name.starts_with("exec "))
        .unwrap_or_else(|| panic!("no command span in {names:?}"));
    assert_eq!(exec.number("process.exit.code"), Some(3), "{exec:?}");
    // The shell the command ran in, by name only.
    let shell = exec.text("process.executable.name").unwrap_or_default();
    assert!(shell == "bash" || shell == "sh", "{exec:?}");
    assert_eq!(exec.name, format!("exec {shell}"));
    assert!(
        exec.status["code"] == 2 || exec.status["code"] == "STATUS_CODE_ERROR",
        "a failed command is an error: {exec:?}"
    );
    // Its arguments (which may hold secrets) are not recorded.
    assert!(
        !exec
            .attributes
            .values()
            .any(|value| value.to_string().contains("working")),
        "{exec:?}"
    );
    let tool = found
        .iter()
        .find(|span| span.name == "execute_tool exec")
        .unwrap_or_else(|| panic!("no tool span in {names:?}"));
    assert_eq!(
        exec.parent, tool.id,
        "the command hangs under its tool call"
    );
    for step in ["first", "second"] {
        let span = found
            .iter()
            .find(|span| span.name == format!("workflow_step {step}"))
            .unwrap_or_else(|| panic!("no span of step {step} in {names:?}"));
        assert_eq!(span.text("agentry.workflow.id"), Some("clock"), "{span:?}");
        assert_eq!(
            span.text("agentry.workflow.run_id"),
            Some(workflow_run.as_str())
        );
        assert_eq!(span.text("agentry.workflow.step_kind"), Some("tool"));
        assert_eq!(span.number("agentry.workflow.attempt"), Some(1));
        // Both steps hang under the run's driver, which hangs under the request that started it.
        let driver = found
            .iter()
            .find(|candidate| candidate.id == span.parent)
            .unwrap_or_else(|| panic!("no parent of {span:?} in {names:?}"));
        assert_eq!(driver.name, "invoke_workflow", "{driver:?}");
        assert_eq!(
            driver.text("agentry.workflow.run_id"),
            Some(workflow_run.as_str())
        );
        let request = found.iter().find(|candidate| candidate.id == driver.parent);
        assert_eq!(
            request.map(|request| request.name.as_str()),
            Some("POST /v1/workflows/{name}/runs")
        );
    }
}
