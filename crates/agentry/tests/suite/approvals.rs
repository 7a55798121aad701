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
