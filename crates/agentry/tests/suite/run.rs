//! `agentry run` end to end: the real binary against the mock provider.

use std::process::Output;

use agentry_testkit::{Fixture, MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};

/// Runs the binary with `args` and a clean environment for API keys.
async fn agentry(args: Vec<String>, env: &[(&str, &str)]) -> Output {
    // Each call gets its own data folder: nothing is written to the real ~/.agentry.
    let home = tempfile::tempdir().unwrap();
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"));
    command
        .arg("--home")
        .arg(home.path())
        .env_remove("AGENTRY_DATABASE_URL")
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env("NO_COLOR", "1");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().await.expect("agentry runs")
}

fn args(provider: &str, base_url: String, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "run".into(),
        "What is the weather?".into(),
        "--provider".into(),
        provider.into(),
        "--base-url".into(),
        base_url,
        "--model-name".into(),
        "test-model".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[tokio::test]
async fn streams_text_and_prints_usage() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("It is sunny in Paris.")
            .with_thinking("Check the sky.", "sig")
            .with_usage(11, 7),
    ));
    let output = agentry(
        args(
            "anthropic",
            mock.anthropic_base_url(),
            &["--system", "Be brief."],
        ),
        &[("ANTHROPIC_API_KEY", "sk-ant-test")],
    )
    .await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "stderr: {stderr}");
    assert!(stdout.contains("Check the sky."), "{stdout}");
    assert!(stdout.contains("It is sunny in Paris."), "{stdout}");
    assert!(
        stderr.contains("11 in") && stderr.contains("7 out"),
        "{stderr}"
    );
    let request = &mock.requests()[0];
    assert_eq!(request.header("x-api-key"), Some("sk-ant-test"));
    assert_eq!(request.body["system"], json!("Be brief."));
    assert_eq!(request.body["model"], json!("test-model"));
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn json_mode_prints_one_object_per_event() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::fixture(
        Fixture::named("openai/chat_tool_call_stream_strict").unwrap(),
    ));
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "I have no weather tool.",
    )));
    let output = agentry(
        args(
            "openai",
            mock.openai_base_url(),
            &["--json", "--api-key-env", "MY_KEY"],
        ),
        &[("MY_KEY", "sk-custom")],
    )
    .await;
    assert!(output.status.success());
    let lines: Vec<Value> = String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("every line is JSON"))
        .collect();
    // Persisted runs report each committed step too; the run itself starts once.
    assert_eq!(lines[0]["type"], "committed");
    assert_eq!(lines[0]["event"]["type"], "run_started");
    assert_eq!(
        lines.iter().filter(|l| l["type"] == "run_started").count(),
        1
    );
    assert!(lines.iter().any(|l| l["type"] == "tool_call_delta"));
    let started = lines
        .iter()
        .find(|l| l["type"] == "tool_call_started")
        .expect("a tool call");
    assert_eq!(started["call"]["name"], "get_weather");
    assert_eq!(
        started["call"]["arguments"],
        json!({"city": "San Francisco", "state": "CA"})
    );
    // The tool was not offered: the model gets an error result, and the run goes on.
    let result = lines.iter().find(|l| l["type"] == "tool_result").unwrap();
    assert_eq!(result["result"]["is_error"], true);
    let last = lines.last().unwrap();
    assert_eq!(last["type"], "run_finished");
    assert_eq!(last["stop_reason"], "completed");
    assert_eq!(last["text"], "I have no weather tool.");
    assert_eq!(last["rounds"], 2);
    assert_eq!(
        mock.requests()[0].header("authorization"),
        Some("Bearer sk-custom")
    );
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn built_in_tools_run_in_the_loop() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It is now.")));
    let output = agentry(
        args(
            "anthropic",
            mock.anthropic_base_url(),
            &["--tool", "current_time"],
        ),
        &[],
    )
    .await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{stdout}");
    assert!(stdout.contains("→ current_time({})"), "{stdout}");
    assert!(stdout.contains("← "), "{stdout}");
    assert!(stdout.contains("It is now."));
    let first = &mock.requests()[0].body;
    assert_eq!(first["tools"][0]["name"], "current_time");
    // The second request carries the real time the tool returned.
    assert!(mock.requests()[1].body.to_string().contains("unix"));
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn skills_are_offered_by_summary() {
    let folder = tempfile::tempdir().unwrap();
    std::fs::write(
        folder.path().join("SKILL.md"),
        "---\nname: haiku\ndescription: Write a haiku.\n---\nFive, seven, five syllables.\n",
    )
    .unwrap();
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let skill = folder.path().to_str().unwrap().to_owned();
    let output = agentry(
        args("ollama", mock.ollama_base_url(), &["--skill", &skill]),
        &[],
    )
    .await;
    assert!(output.status.success());
    let tools = &mock.requests()[0].body["tools"];
    assert_eq!(tools[0]["function"]["name"], "haiku");
    assert_eq!(tools[0]["function"]["description"], "Write a haiku.");
    assert!(!tools.to_string().contains("syllables"));
}

#[tokio::test]
async fn a_guard_stop_exits_3_with_the_reason() {
    let mock = MockProvider::start().await.unwrap();
    for i in 0..5 {
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "current_time",
            json!({"timezone": format!("+0{i}:00")}),
        )));
    }
    let output = agentry(
        args(
            "openai",
            mock.openai_base_url(),
            &["--tool", "current_time", "--max-rounds", "2"],
        ),
        &[],
    )
    .await;
    assert_eq!(output.status.code(), Some(3));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("max_rounds"), "{stderr}");
    assert!(stderr.contains("stopped:"), "{stderr}");
    assert_eq!(mock.request_count(), 3);
}

#[tokio::test]
async fn an_unknown_built_in_is_rejected_with_the_list() {
    let output = agentry(
        args(
            "openai",
            "http://127.0.0.1:9/v1".into(),
            &["--tool", "rm_rf"],
        ),
        &[],
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("rm_rf") && stderr.contains("current_time"),
        "{stderr}"
    );
}

#[tokio::test]
async fn ollama_needs_no_key() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::fixture(
        Fixture::named("ollama/chat_stream_text").unwrap(),
    ));
    let output = agentry(args("ollama", mock.ollama_base_url(), &[]), &[]).await;
    assert!(output.status.success());
    assert_eq!(String::from_utf8(output.stdout).unwrap().trim(), "The");
    assert_eq!(mock.requests()[0].header("authorization"), None);
    assert_eq!(mock.requests()[0].path, "/api/chat");
}

#[tokio::test]
async fn a_failed_call_exits_non_zero_with_a_one_line_reason() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::fixture(
        Fixture::named("openai/error_400_context_length_exceeded").unwrap(),
    ));
    let output = agentry(args("openai", mock.openai_base_url(), &[]), &[]).await;
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    let reason: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("agentry:"))
        .collect();
    assert_eq!(reason.len(), 1, "{stderr}");
    assert!(reason[0].contains("context_length_exceeded"), "{stderr}");
    assert!(reason[0].contains("HTTP 400"), "{stderr}");
}

#[tokio::test]
async fn json_mode_reports_errors_as_json_too() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::error(
        401,
        json!({"error": {"message": "bad key", "type": "invalid_api_key"}}),
    ));
    let output = agentry(args("openai", mock.openai_base_url(), &["--json"]), &[]).await;
    assert_eq!(output.status.code(), Some(1));
    let last: Value = serde_json::from_str(
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(last["type"], "run_failed");
    assert_eq!(last["stop_reason"], "error");
    assert_eq!(last["error"]["code"], "authentication");
    assert_eq!(last["error"]["retryable"], false);
    assert_eq!(mock.request_count(), 1);
}

#[tokio::test]
async fn a_named_key_variable_must_exist() {
    let output = agentry(
        args(
            "openai",
            "http://127.0.0.1:9/v1".into(),
            &["--api-key-env", "AGENTRY_TEST_MISSING_KEY"],
        ),
        &[],
    )
    .await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        String::from_utf8(output.stderr)
            .unwrap()
            .contains("AGENTRY_TEST_MISSING_KEY")
    );
}

#[tokio::test]
async fn bad_arguments_are_rejected() {
    let output = agentry(args("gemini", "http://127.0.0.1:9".into(), &[]), &[]).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8(output.stderr)
            .unwrap()
            .contains("unknown provider")
    );
}

#[tokio::test]
async fn tools_defined_in_a_file_run_in_the_loop() {
    let folder = tempfile::tempdir().unwrap();
    let script = folder.path().join("shout.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nread input\necho \"{\\\"heard\\\": $input}\"\n",
    )
    .unwrap();
    let tools = folder.path().join("tools.json");
    std::fs::write(
        &tools,
        serde_json::to_string(&json!([{
            "kind": "command",
            "name": "shout",
            "description": "Echo the arguments back",
            "program": "/bin/sh",
            "args": [script],
            // The script lives outside any workspace, where the sandbox cannot see it.
            "host": true,
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}
        }]))
        .unwrap(),
    )
    .unwrap();
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "shout",
        json!({"word": "hi"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("done")));
    let output = agentry(
        args(
            "openai",
            mock.openai_base_url(),
            &["--tools-file", tools.to_str().unwrap()],
        ),
        &[],
    )
    .await;
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success(), "{stdout}");
    assert_eq!(
        mock.requests()[0].body["tools"][0]["function"]["name"],
        "shout"
    );
    // The command received the arguments on stdin and its JSON output went back to the model.
    assert!(
        mock.requests()[1].body.to_string().contains("heard"),
        "{}",
        mock.requests()[1].body
    );
    assert!(mock.requests()[1].body.to_string().contains("hi"));
}

/// A plain-text page on loopback that answers every connection (one request each).
async fn page_server() -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buffer = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buffer[..n]),
                    }
                }
                let body = "hello from the page";
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{address}/page")
}

#[tokio::test]
async fn fetch_follows_the_network_flags_and_is_off_without_them() {
    let url = page_server().await;
    for (flags, expected) in [
        (vec![], "refused: fetching is off"),
        (
            vec!["--allow-domain", "127.0.0.1"],
            "loopback, private or link-local",
        ),
        (
            vec!["--allow-domain", "example.com", "--fetch-network", "off"],
            "refused: fetching is off",
        ),
        (
            vec!["--allow-domain", "127.0.0.1", "--allow-private"],
            "hello from the page",
        ),
    ] {
        let mock = MockProvider::start().await.unwrap();
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "fetch",
            json!({"url": url}),
        )));
        mock.enqueue(Reply::scripted(ScriptedTurn::text("Read it.")));
        let mut extra = vec!["--tool", "fetch"];
        extra.extend(flags.iter().copied());
        let output = agentry(args("openai", mock.openai_base_url(), &extra), &[]).await;
        let stdout = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(output.status.success(), "{flags:?}: {stdout}\n{stderr}");
        let result = mock.requests()[1].body.to_string();
        assert!(result.contains(expected), "{flags:?}: {result}");
    }
}

#[tokio::test]
async fn usage_reports_what_runs_spent_by_model() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("one").with_usage(1000, 100),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::text("two").with_usage(2000, 0),
    ));
    let home = tempfile::tempdir().unwrap();
    let agentry = |args: Vec<String>| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"));
        command
            .arg("--home")
            .arg(home.path())
            .env_remove("AGENTRY_DATABASE_URL")
            .env_remove("OPENAI_API_KEY")
            .env("NO_COLOR", "1")
            .args(args);
        async move { command.output().await.expect("agentry runs") }
    };
    for _ in 0..2 {
        // gpt-4o-mini has a published price: $0.15 in, $0.60 out per million tokens.
        let output = agentry(vec![
            "run".into(),
            "hi".into(),
            "--provider".into(),
            "openai".into(),
            "--base-url".into(),
            mock.openai_base_url(),
            "--model-name".into(),
            "gpt-4o-mini".into(),
        ])
        .await;
        assert!(output.status.success(), "{output:?}");
    }
    let output = agentry(vec![
        "usage".into(),
        "--by".into(),
        "model,day".into(),
        "--json".into(),
    ])
    .await;
    assert!(output.status.success(), "{output:?}");
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(report["total"]["runs"], 2, "{report}");
    assert_eq!(report["total"]["input_tokens"], 3000);
    let cost = report["total"]["cost_usd"].as_f64().unwrap();
    let expected = (3000.0 * 0.15 + 100.0 * 0.6) / 1e6;
    assert!((cost - expected).abs() < 1e-12, "{cost} {report}");
    assert_eq!(report["groups"].as_array().unwrap().len(), 1);
    // The table: a header, one group, the total.
    let output = agentry(vec!["usage".into(), "--by".into(), "day".into()]).await;
    let table = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(
        lines[0].starts_with("day") && lines[0].contains("cost"),
        "{table}"
    );
    assert!(
        lines[2].starts_with("total") && lines[2].contains("$0.000510"),
        "{table}"
    );
    // A bad dimension is refused with the reason.
    let output = agentry(vec!["usage".into(), "--by".into(), "colour".into()]).await;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("colour"));
    // Budgets: added, listed, removed.
    let output = agentry(vec![
        "budgets".into(),
        "add".into(),
        "cap".into(),
        "--agent".into(),
        "writer".into(),
        "--limit".into(),
        "2.5".into(),
        "--period".into(),
        "week".into(),
    ])
    .await;
    assert!(output.status.success(), "{output:?}");
    let output = agentry(vec!["budgets".into(), "list".into()]).await;
    let listed = String::from_utf8(output.stdout).unwrap();
    assert!(
        listed.contains("cap  agent writer  $0.0000 of $2.5000 per week"),
        "{listed}"
    );
    let output = agentry(vec!["budgets".into(), "rm".into(), "cap".into()]).await;
    assert!(output.status.success(), "{output:?}");
}

/// Issue 48: `run` and `chat` use the data folder's default saved model (the one `serve`
/// registered, with its saved secret) when no model flag is given, `--model ID` picks another
/// saved one and a continued session keeps it, `agentry models` lists them; with no model at
/// all, the run fails before any session is made.
#[tokio::test]
async fn runs_use_the_saved_default_model_and_model_picks_another() {
    let mock = MockProvider::start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    {
        let store = agentry_store::Store::open_home(home.path()).await.unwrap();
        store
            .put_secret("MOCK_KEY", "sk-saved-0123456789")
            .await
            .unwrap();
        let models =
            agentry_app::config::ConfigRepo::<agentry_app::model_config::ModelConfig>::new(&store);
        for (id, name) in [("first", "first-model"), ("second", "second-model")] {
            let model = serde_json::from_value(json!({"id": id, "protocol": "openai",
                "base_url": mock.openai_base_url(), "model_name": name,
                "api_key_secret": "MOCK_KEY"}))
            .unwrap();
            models.put(id, &model).await.unwrap();
        }
    }
    let agentry = |args: &[&str]| {
        let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"));
        command
            .arg("--home")
            .arg(home.path())
            .env_remove("AGENTRY_DATABASE_URL")
            .env_remove("OPENAI_API_KEY")
            .env("NO_COLOR", "1")
            .args(args);
        async move { command.output().await.expect("agentry runs") }
    };
    let session_of = |output: &Output| {
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .find_map(|line| line.strip_prefix("session: "))
            .expect("a session line")
            .to_owned()
    };
    mock.enqueue(Reply::scripted(ScriptedTurn::text("from the default")));
    let output = agentry(&["run", "hi"]).await;
    assert!(output.status.success(), "{output:?}");
    assert!(String::from_utf8_lossy(&output.stdout).contains("from the default"));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("from the second")));
    let output = agentry(&["run", "hi", "--model", "second"]).await;
    assert!(output.status.success(), "{output:?}");
    let session = session_of(&output);
    mock.enqueue(Reply::scripted(ScriptedTurn::text("still the second")));
    let output = agentry(&["run", "again", "--session", &session]).await;
    assert!(output.status.success(), "{output:?}");
    let requests = mock.take_requests();
    let names: Vec<&str> = requests
        .iter()
        .map(|request| request.body["model"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["first-model", "second-model", "second-model"]);
    assert_eq!(
        requests[0].header("authorization"),
        Some("Bearer sk-saved-0123456789")
    );
    let listed = agentry(&["models"]).await;
    let listed = String::from_utf8(listed.stdout).unwrap();
    let lines: Vec<&str> = listed.lines().collect();
    assert!(
        lines[0].starts_with("* first ") && lines[0].contains("first-model"),
        "{listed}"
    );
    assert!(lines[1].starts_with("  second "), "{listed}");
    let output = agentry(&["run", "hi", "--model", "nope"]).await;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("no saved model \"nope\""));

    // No saved model, no flag: a clear failure, and no session left behind.
    let empty = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(empty.path())
        .env_remove("AGENTRY_DATABASE_URL")
        .args(["run", "hi"])
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("no model") && stderr.contains("--model ID"),
        "{stderr}"
    );
    let listed = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(empty.path())
        .env_remove("AGENTRY_DATABASE_URL")
        .args(["sessions", "list"])
        .output()
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&listed.stdout).trim(),
        "",
        "a session was left"
    );
}
