//! `agentry mcp serve` end to end: the real binary on stdio, driven by an independent MCP
//! client (the official Python `mcp` SDK, `agentry-server/tests/mcp_client.py`), its agent
//! answering from the mock provider.

use std::path::{Path, PathBuf};
use std::time::Duration;

use agentry_store::{ConfigKind, Store};
use agentry_testkit::mcp::McpServers;
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::SessionId;
use serde_json::{Value, json};

/// Saves a `mock` model and the agent `timekeeper` in the data folder `home`.
async fn save_agent(home: &Path, mock: &MockProvider) {
    let store = Store::open_home(home).await.unwrap();
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(),
                    "model_name": "m"}),
        )
        .await
        .unwrap();
    store
        .put_config(
            ConfigKind::Agent,
            "timekeeper",
            &json!({"id": "timekeeper", "model_id": "mock", "tool_ids": ["current_time"],
                    "system": "You keep time."}),
        )
        .await
        .unwrap();
    store.close().await;
}

/// Runs the Python client against `agentry --home HOME mcp serve EXTRA…` and returns what it
/// printed, asserting it succeeded.
async fn run_client(home: &Path, extra: &[&str], mode: &str, calls: Value) -> Value {
    let python = McpServers::locate()
        .expect("the MCP test servers (scripts/install-mcp-servers)")
        .python();
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../agentry-server/tests/mcp_client.py");
    let mut args = vec![
        "--home".to_owned(),
        home.display().to_string(),
        "mcp".to_owned(),
        "serve".to_owned(),
    ];
    args.extend(extra.iter().map(|arg| (*arg).to_owned()));
    let spec = json!({
        "transport": "stdio",
        "command": env!("CARGO_BIN_EXE_agentry"),
        "args": args,
        "mode": mode,
        "calls": calls,
    });
    let run = tokio::process::Command::new(python)
        .arg(script)
        .arg(spec.to_string())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(120), run)
        .await
        .expect("the MCP client finishes within 120 s")
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the MCP client failed: {stdout}\nstderr: {stderr}"
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|error| panic!("no JSON from the client ({error}): {stdout}"))
}

fn tool_names(output: &Value) -> Vec<&str> {
    output["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn an_mcp_client_on_stdio_asks_a_saved_agent() {
    let home = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await.unwrap();
    save_agent(home.path(), &mock).await;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It is late.")));

    let output = run_client(
        home.path(),
        &[],
        "legacy",
        json!([{"tool": "ask_timekeeper", "arguments": {"message": "What time is it?"}}]),
    )
    .await;
    assert_eq!(output["server_name"], "agentry");
    assert_eq!(output["protocol_version"], "2025-11-25");
    assert_eq!(tool_names(&output), ["ask_timekeeper"]);
    let call = &output["calls"][0];
    assert_eq!(call["result"]["isError"], false, "{call}");
    assert_eq!(call["result"]["content"][0]["text"], "It is late.");
    let progress: Vec<&str> = call["progress"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["message"].as_str().unwrap())
        .collect();
    assert_eq!(progress.len(), 5, "{progress:?}");
    assert_eq!(progress[2], "tool current_time started");
    eprintln!(
        "one agent call over stdio (two model rounds and a tool call against the mock): {:.3} s",
        call["seconds"].as_f64().unwrap()
    );

    // The model was called as the agent.
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].body["model"], "m");
    assert_eq!(requests[0].body["messages"][0]["content"], "You keep time.");
    assert_eq!(
        requests[0].body["messages"][1]["content"],
        "What time is it?"
    );
    mock.check_protocol().unwrap();

    // The run was saved as a session of the data folder, finished.
    let session = call["result"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    let record = store
        .session(SessionId::parse(session).unwrap())
        .await
        .unwrap()
        .expect("the session is stored");
    assert_eq!(record.title.as_deref(), Some("What time is it?"));
    store.close().await;

    // With --expose-tools the registered tools are offered and callable too (2026-07-28 this
    // time).
    let output = run_client(
        home.path(),
        &["--expose-tools"],
        "auto",
        json!([{"tool": "current_time", "arguments": {}}]),
    )
    .await;
    assert_eq!(output["protocol_version"], "2026-07-28");
    let names = tool_names(&output);
    assert!(names.contains(&"ask_timekeeper"), "{names:?}");
    assert!(names.contains(&"current_time"), "{names:?}");
    let call = &output["calls"][0];
    assert_eq!(call["result"]["isError"], false, "{call}");
    assert!(
        call["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains('T'),
        "{call}"
    );
    assert_eq!(
        mock.requests().len(),
        2,
        "a direct tool call needs no model"
    );
}

#[tokio::test]
async fn stdout_carries_json_rpc_only_and_logs_go_to_stderr() {
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

    let home = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await.unwrap();
    save_agent(home.path(), &mock).await;
    // `-v`: info logs, which must all go to stderr.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["-v", "mcp", "serve"])
        .env_remove("AGENTRY_DATABASE_URL")
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let messages = [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "probe", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
               "params": {"name": "ask_timekeeper", "arguments": {"message": ""}}}),
    ];
    for message in &messages {
        stdin
            .write_all(format!("{message}\n").as_bytes())
            .await
            .unwrap();
    }
    // Read the replies until the last one, then close stdin: the server exits.
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut lines = Vec::new();
    while !lines.iter().any(|line: &String| line.contains("\"id\":3")) {
        let line = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
            .await
            .expect("a reply within 30 s")
            .unwrap()
            .expect("stdout stays open until stdin closes");
        lines.push(line);
    }
    drop(stdin);
    while let Some(line) = stdout.next_line().await.unwrap() {
        lines.push(line);
    }
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("agentry mcp serve exits when stdin closes")
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let stderr = String::from_utf8(output.stderr).unwrap();
    let replies: Vec<Value> = lines
        .iter()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|error| panic!("a non-JSON line on stdout ({error}): {line:?}"))
        })
        .collect();
    assert!(
        replies.iter().all(|reply| reply["jsonrpc"] == "2.0"),
        "{replies:?}"
    );
    let by_id = |id: u64| {
        replies
            .iter()
            .find(|reply| reply["id"] == id)
            .unwrap_or_else(|| panic!("no reply {id}: {replies:?}"))
    };
    assert_eq!(by_id(1)["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(by_id(1)["result"]["serverInfo"]["name"], "agentry");
    assert_eq!(by_id(2)["result"]["tools"][0]["name"], "ask_timekeeper");
    assert_eq!(by_id(3)["result"]["isError"], true);
    assert!(
        by_id(3)["result"]["content"][0]["text"]
            .as_str()
            .unwrap()
            .contains("`message` is empty")
    );
    assert!(stderr.contains("serving MCP on stdio"), "{stderr}");
    assert!(mock.requests().is_empty());
}

/// One saved agent asked the same thing from the three front-ends — `agentry run --agent`,
/// `agentry mcp serve` and `POST /v1/infer` on `agentry serve` — is one run: the model gets the
/// same request (the agent's prompt with its memories, its tools, the message) and the session
/// logs the same events, because all three go through the app's one agent-to-run path.
#[tokio::test]
async fn an_agent_runs_alike_from_the_cli_mcp_and_http() {
    let home = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await.unwrap();
    save_agent(home.path(), &mock).await;
    let store = Store::open_home(home.path()).await.unwrap();
    store
        .remember(agentry_store::NewMemory {
            scope: agentry_store::MemoryScope::agent("timekeeper"),
            kind: agentry_store::MemoryKind::Fact,
            text: "The office clock runs five minutes fast.".into(),
            source_session: None,
        })
        .await
        .unwrap();
    store.close().await;
    let question = "What time is it?";
    let mut sessions = Vec::new();

    // The CLI.
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Noon.")));
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["run", "--agent", "timekeeper", question])
        .env_remove("AGENTRY_DATABASE_URL")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let id = stderr
        .lines()
        .find_map(|line| line.strip_prefix("session: "))
        .expect("the CLI names its session");
    sessions.push(SessionId::parse(id.trim()).unwrap());

    // MCP on stdio.
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Noon.")));
    let output = run_client(
        home.path(),
        &[],
        "legacy",
        json!([{"tool": "ask_timekeeper", "arguments": {"message": question}}]),
    )
    .await;
    let call = &output["calls"][0];
    assert_eq!(call["result"]["isError"], false, "{call}");
    let id = call["result"]["structuredContent"]["session_id"]
        .as_str()
        .unwrap();
    sessions.push(SessionId::parse(id).unwrap());

    // HTTP.
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Noon.")));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["serve", &format!("127.0.0.1:{port}")])
        .env_remove("AGENTRY_DATABASE_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let http = agentry_llm::http_client(Duration::from_secs(30)).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let mut ready = false;
    for _ in 0..200 {
        if http.get(format!("{base}/readyz")).send().await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "agentry serve did not start");
    let answer: Value = http
        .post(format!("{base}/v1/infer"))
        .json(&json!({"agent_id": "timekeeper", "text": question, "session_id": "new"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["text"], "Noon.", "{answer}");
    sessions.push(SessionId::parse(answer["session_id"].as_str().unwrap()).unwrap());
    server.start_kill().unwrap();
    server.wait().await.unwrap();

    // The same request reached the model each time.
    let requests = mock.requests();
    assert_eq!(requests.len(), 3);
    let system = requests[0].body["messages"][0]["content"]
        .as_str()
        .unwrap_or_default();
    assert!(system.starts_with("You keep time."), "{system}");
    assert!(
        system.contains("The office clock runs five minutes fast."),
        "{system}"
    );
    for request in &requests[1..] {
        assert_eq!(request.body["model"], requests[0].body["model"]);
        assert_eq!(request.body["messages"], requests[0].body["messages"]);
        assert_eq!(request.body["tools"], requests[0].body["tools"]);
    }

    // And each session logged the same events.
    let store = Store::open_home(home.path()).await.unwrap();
    let mut logs = Vec::new();
    for session in &sessions {
        let kinds: Vec<String> = store
            .events(*session, 0, usize::MAX)
            .await
            .unwrap()
            .into_iter()
            .map(|event| event.kind)
            .collect();
        logs.push(kinds);
    }
    store.close().await;
    assert!(
        logs[0].contains(&"run_finished".to_owned()),
        "{:?}",
        logs[0]
    );
    assert_eq!(logs[1], logs[0]);
    assert_eq!(logs[2], logs[0]);
}
