//! `agentry chat` asks inline when a turn's tool call waits for approval.

use std::process::Stdio;

use agentry_store::{ConfigKind, Store};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::json;
use tokio::io::AsyncWriteExt;

/// Runs `agentry --home <home> <args>` and checks it succeeded.
async fn configure(home: &std::path::Path, args: &[&std::ffi::OsStr]) {
    let done = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("AGENTRY_DATABASE_URL")
        .output()
        .await
        .unwrap();
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
}

/// Runs `agentry chat <args>` in `home` with `input` as what the person types.
pub(super) async fn chat(
    home: &std::path::Path,
    args: &[&std::ffi::OsStr],
    input: &[u8],
) -> std::process::Output {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("chat")
        .args(args)
        .env_remove("AGENTRY_DATABASE_URL")
        .env("AGENTRY_HOME", home)
        .env("NO_COLOR", "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input).await.unwrap();
    drop(stdin);
    tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("chat ended")
        .unwrap()
}

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
    configure(
        home.path(),
        &[
            "agents".as_ref(),
            "add".as_ref(),
            "--file".as_ref(),
            agent.as_os_str(),
        ],
    )
    .await;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "current_time",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Then I will not look.")));
    let output = chat(
        home.path(),
        &["--agent".as_ref(), "careful".as_ref()],
        b"What time is it?\nn\nnot now, thanks\n/exit\n",
    )
    .await;
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
    configure(
        home.path(),
        &[
            "mcp".as_ref(),
            "add".as_ref(),
            "probe".as_ref(),
            "--no-check".as_ref(),
            "--".as_ref(),
            python.as_os_str(),
            script.as_ref(),
        ],
    )
    .await;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "probe__book",
        json!({}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Your table is booked.")));
    let base_url = mock.openai_base_url();
    // The turn, "y" to answer, then the fields in the schema's order (date, then seats: "four"
    // is refused as not an integer and asked again).
    let output = chat(
        home.path(),
        &[
            "--provider".as_ref(),
            "openai".as_ref(),
            "--base-url".as_ref(),
            base_url.as_ref(),
            "--model-name".as_ref(),
            "m".as_ref(),
            "--mcp".as_ref(),
            "probe".as_ref(),
        ],
        b"Book me a table\ny\n2026-12-24\nfour\n4\n/exit\n",
    )
    .await;
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
