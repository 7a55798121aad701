//! `agentry chat` asks inline when a turn's tool call waits for approval.

use std::process::Stdio;

use agentry_store::{ConfigKind, Store};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::json;
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn chat_asks_before_a_call_that_needs_approval() {
    let mock = MockProvider::start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(),
                    "model_name": "m"}),
        )
        .await
        .unwrap();
    store.close().await;
    let agent = home.path().join("careful.json");
    std::fs::write(
        &agent,
        json!({"id": "careful", "model_id": "mock", "tool_ids": ["current_time"],
               "approvals": {"tools": {"current_time": "always"}}})
        .to_string(),
    )
    .unwrap();
    let added = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["agents", "add", "--file"])
        .arg(&agent)
        .env_remove("AGENTRY_DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Then I will not look.")));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(["chat", "--agent", "careful"])
        .env_remove("AGENTRY_DATABASE_URL")
        .env("AGENTRY_HOME", home.path())
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"What time is it?\nn\nnot now, thanks\n/exit\n")
        .await
        .unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("needs approval"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("Then I will not look."),
        "{stderr}"
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    let sent = requests[1].body.to_string();
    assert!(sent.contains("not now, thanks"), "{sent}");
}

/// An MCP server asking for input during a tool call: chat asks for each field inline, and the
/// server's tool gets the answer (its result reaches the model).
#[tokio::test]
async fn chat_asks_for_what_an_mcp_server_requests_during_a_call() {
    let mock = MockProvider::start().await.unwrap();
    let home = tempfile::tempdir().unwrap();
    let python = agentry_testkit::mcp::McpServers::locate().unwrap().python();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/elicit_probe_server.py");
    let added = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["mcp", "add", "probe", "--no-check", "--"])
        .arg(&python)
        .arg(script)
        .env_remove("AGENTRY_DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(
        added.status.success(),
        "{}",
        String::from_utf8_lossy(&added.stderr)
    );
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "probe__book",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Your table is booked.")));
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args(["chat", "--provider", "openai", "--base-url"])
        .arg(mock.openai_base_url())
        .args(["--model-name", "m", "--mcp", "probe"])
        .env_remove("AGENTRY_DATABASE_URL")
        .env("AGENTRY_HOME", home.path())
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The turn, "y" to answer, then the fields in the schema's order (date, then seats: "four"
    // is refused as not an integer and asked again).
    stdin
        .write_all(b"Book me a table\ny\n2026-12-24\nfour\n4\n/exit\n")
        .await
        .unwrap();
    drop(stdin);
    let output = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("chat ended")
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("probe asks: Which date, and how many seats?"),
        "{stdout}\n{stderr}"
    );
    assert!(stderr.contains("not a valid integer"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("Your table is booked."),
        "{stderr}"
    );
    let requests = mock.requests();
    assert_eq!(requests.len(), 2, "{stderr}");
    let sent = requests[1].body.to_string();
    assert!(sent.contains("booked 4 seats on 2026-12-24"), "{sent}");
}
