//! The sandbox from the binary: `agentry doctor`, and `agentry run --tool exec --tool terminal`
//! whose commands run in the session's sandbox (PID 1 being the `agentry` binary itself), in the
//! session's workspace under the data folder.

use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::processes::{free_port, listening, serve_command};

#[tokio::test]
async fn doctor_reports_the_hosts_isolation_and_runs_a_sandbox() {
    let home = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["doctor", "--json", "--try-sandbox"])
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["capabilities"]["native_available"], json!(true));
    assert_eq!(report["capabilities"]["user_namespaces"], json!(true));
    assert_eq!(report["trial"]["ok"], json!(true), "{report}");
    assert_eq!(report["trial"]["sandbox"]["isolated"], json!(true));
    assert_eq!(report["trial"]["sandbox"]["backend"], json!("native"));
    // The human form names the same facts.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .arg("doctor")
        .output()
        .await
        .unwrap();
    let text = String::from_utf8(output.stdout).unwrap();
    assert!(text.contains("native sandbox:    available"), "{text}");
}

#[tokio::test]
async fn a_saved_run_executes_commands_in_its_sessions_sandbox() {
    let home = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "exec",
        json!({"command": "echo sandboxed > proof.txt; hostname; cat /proc/1/cmdline | tr '\\0' ' '"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "terminal",
        json!({"input": "cat proof.txt"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Done.")));
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .env_remove("AGENTRY_DATABASE_URL")
        .args([
            "run",
            "prove it",
            "--provider",
            "openai",
            "--base-url",
            &mock.openai_base_url(),
            "--model-name",
            "m",
            "--api-key-env",
            "AGENTRY_TEST_KEY",
            "--tool",
            "exec",
            "--tool",
            "terminal",
            "--json",
        ])
        .env("AGENTRY_TEST_KEY", "sk-test")
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let session = stderr
        .lines()
        .find_map(|line| line.strip_prefix("session: "))
        .expect("the session id is printed")
        .trim()
        .to_owned();
    // The command ran in the session's workspace, inside a sandbox whose PID 1 is agentry.
    let proof = home
        .path()
        .join("workspaces")
        .join(&session)
        .join("proof.txt");
    assert_eq!(std::fs::read_to_string(&proof).unwrap(), "sandboxed\n");
    let second = mock.requests()[1].body.to_string();
    assert!(second.contains("exit code 0"), "{second}");
    assert!(
        second.contains("sandbox\\n"),
        "the sandbox's hostname: {second}"
    );
    assert!(second.contains("__agentry-sandbox-init"), "{second}");
    let third = mock.requests()[2].body.to_string();
    assert!(third.contains("sandboxed\\n[exit code 0]"), "{third}");
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn command_tools_from_a_file_run_in_the_sandbox() {
    let home = tempfile::tempdir().unwrap();
    let folder = tempfile::tempdir().unwrap();
    let tools = folder.path().join("tools.json");
    std::fs::write(
        &tools,
        serde_json::to_string(&json!([{
            "kind": "command",
            "name": "where",
            "program": "/bin/sh",
            "args": ["-c", "read input; echo \"$input\" > seen.json; echo \"{\\\"host\\\": \\\"$(hostname)\\\", \\\"dir\\\": \\\"$PWD\\\"}\""],
        }]))
        .unwrap(),
    )
    .unwrap();
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "where",
        json!({"x": 1}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("ok")));
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .env_remove("AGENTRY_DATABASE_URL")
        .env("AGENTRY_TEST_KEY", "sk-test")
        .args([
            "run",
            "where are you",
            "--provider",
            "openai",
            "--base-url",
            &mock.openai_base_url(),
            "--model-name",
            "m",
            "--api-key-env",
            "AGENTRY_TEST_KEY",
            "--tools-file",
            tools.to_str().unwrap(),
        ])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "{stderr}");
    let session = stderr
        .lines()
        .find_map(|line| line.strip_prefix("session: "))
        .expect("the session id is printed")
        .trim()
        .to_owned();
    // The tool saw its arguments, ran in the sandbox (its hostname, its /workspace), and what it
    // wrote is in the session's workspace on the host.
    let second = mock.requests()[1].body.to_string();
    assert!(
        second.contains(r#"{\"dir\":\"/workspace\",\"host\":\"sandbox\"}"#),
        "{second}"
    );
    let seen = home
        .path()
        .join("workspaces")
        .join(&session)
        .join("seen.json");
    assert_eq!(std::fs::read_to_string(seen).unwrap(), "{\"x\":1}\n");
    mock.check_protocol().unwrap();
}

#[tokio::test]
async fn a_bad_network_allow_list_stops_serve_at_start() {
    let home = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["serve", "127.0.0.1:0", "--sandbox-allow-domain", "a.*.b"])
        .output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(
        stderr.contains("--allow-domain") && stderr.contains("\"a.*.b\""),
        "{stderr}"
    );
}

#[tokio::test]
async fn allow_host_commands_is_said_loudly_at_start_and_shown_in_the_capabilities() {
    use tokio::io::AsyncBufReadExt;
    let home = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args([
            "serve",
            &format!("127.0.0.1:{port}"),
            "--sandbox",
            "off",
            "--allow-host-commands",
        ])
        .env_remove("AGENTRY_DATABASE_URL")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    while !said
        .iter()
        .any(|line: &String| line.contains("WITHOUT ISOLATION"))
    {
        let line = tokio::time::timeout(std::time::Duration::from_secs(20), stderr.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap_or_else(|| panic!("serve ended without the notice: {said:?}"));
        said.push(line);
    }
    let notice = said.join("\n");
    assert!(notice.contains("--allow-host-commands"), "{notice}");
    assert!(notice.contains("ON THE HOST"), "{notice}");
    let http = agentry_llm::http_client(std::time::Duration::from_secs(5)).unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    let capabilities: serde_json::Value = loop {
        let answer = http
            .get(format!("http://127.0.0.1:{port}/v1/sandbox/capabilities"))
            .send()
            .await;
        if let Ok(answer) = answer {
            break answer.json().await.unwrap();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "serve never answered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(capabilities["allow_host_commands"], true, "{capabilities}");
    assert_eq!(capabilities["command_tools"], "host", "{capabilities}");
    child.kill().await.unwrap();
}

/// Starts `agentry serve` with a native sandbox and `extra` flags, runs `line` in a new sandbox
/// over the API, and returns its stdout.
async fn serve_and_run_in_a_sandbox(extra: &[&str], line: &str) -> String {
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = [&["--sandbox", "native"][..], extra].concat();
    let mut child = serve_command(home.path(), port, &args)
        .env_remove("AGENTRY_SANDBOX_SHOW_USR_LOCAL")
        .spawn()
        .unwrap();
    listening(&mut child).await;
    let http = agentry_llm::http_client(std::time::Duration::from_secs(5)).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let created: serde_json::Value = http
        .post(format!("{base}/v1/sandboxes"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}"));
    let result: serde_json::Value = http
        .post(format!("{base}/v1/sandboxes/{id}/exec"))
        .json(&json!({"command": line}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(result["exit_code"], 0, "{result}");
    child.kill().await.unwrap();
    result["stdout"].as_str().unwrap().to_owned()
}

/// The host's `/usr/local` (its own tools and their configuration) is hidden in the sandboxes
/// `agentry serve` makes unless `--sandbox-show-usr-local` says otherwise (the second security
/// review's N17).
#[tokio::test]
async fn serve_hides_the_hosts_usr_local_in_sandboxes_unless_told() {
    let host: usize = std::fs::read_dir("/usr/local").map_or(0, Iterator::count);
    let line = "ls -A /usr/local | wc -l";
    let hidden = serve_and_run_in_a_sandbox(&[], line).await;
    assert_eq!(hidden.trim(), "0", "/usr/local is empty inside");
    let shown = serve_and_run_in_a_sandbox(&["--sandbox-show-usr-local"], line).await;
    assert_eq!(
        shown.trim(),
        host.to_string(),
        "the host's /usr/local is shown"
    );
}

/// `agentry serve` killed with SIGKILL and started again over its data folder: a sandbox paused
/// before the crash is back, paused, with its files (its processes are not); a sandbox that was
/// running is gone with its workspace; the snapshots are kept.
#[tokio::test]
async fn a_paused_sandbox_and_the_snapshots_outlive_a_crashed_server() {
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let http = agentry_llm::http_client(std::time::Duration::from_secs(30)).unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let call = |method: reqwest::Method, path: String, body: Value| {
        let request = http.request(method, format!("{base}{path}")).json(&body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let mut first = serve_command(home.path(), port, &[]).spawn().unwrap();
    listening(&mut first).await;
    let (_, kept) = call(reqwest::Method::POST, "/v1/sandboxes".into(), json!({})).await;
    if kept["report"]["limits"] == "rlimit" {
        return; // No freezer on this host: nothing pauses.
    }
    let kept = kept["id"].as_str().unwrap().to_owned();
    let (_, running) = call(reqwest::Method::POST, "/v1/sandboxes".into(), json!({})).await;
    let running = running["id"].as_str().unwrap().to_owned();
    let (status, _) = call(
        reqwest::Method::POST,
        format!("/v1/sandboxes/{kept}/exec"),
        json!({"command": "echo survived > f.txt"}),
    )
    .await;
    assert_eq!(status, 200);
    let (status, snapshot) = call(
        reqwest::Method::POST,
        format!("/v1/sandboxes/{kept}/snapshots"),
        json!({}),
    )
    .await;
    assert_eq!(status, 201, "{snapshot}");
    let (status, _) = call(
        reqwest::Method::POST,
        format!("/v1/sandboxes/{kept}/pause"),
        json!({}),
    )
    .await;
    assert_eq!(status, 200);
    first.kill().await.unwrap();
    first.wait().await.unwrap();

    let mut second = serve_command(home.path(), port, &[]).spawn().unwrap();
    listening(&mut second).await;
    let (status, back) = call(
        reqwest::Method::GET,
        format!("/v1/sandboxes/{kept}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(
        (back["paused"].clone(), back["restored"].clone()),
        (json!(true), json!(true))
    );
    let (status, _) = call(
        reqwest::Method::GET,
        format!("/v1/sandboxes/{running}"),
        json!(null),
    )
    .await;
    assert_eq!(status, 404);
    assert!(!home.path().join("sandboxes").join(&running).exists());
    let (_, snapshots) = call(
        reqwest::Method::GET,
        "/v1/sandbox-snapshots".into(),
        json!(null),
    )
    .await;
    assert_eq!(
        snapshots["snapshots"][0]["id"], snapshot["id"],
        "{snapshots}"
    );
    call(
        reqwest::Method::POST,
        format!("/v1/sandboxes/{kept}/resume"),
        json!({}),
    )
    .await;
    let (status, read) = call(
        reqwest::Method::POST,
        format!("/v1/sandboxes/{kept}/exec"),
        json!({"command": "cat f.txt"}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(read["stdout"], "survived\n");
}
