//! `agentry chat` with piped input: turns share one conversation.

use std::process::Stdio;

use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use tokio::io::AsyncWriteExt;

#[tokio::test]
async fn turns_share_the_conversation_and_exit_ends_the_session() {
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Hello, Ada.")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "You said your name is Ada.",
    )));
    let home = tempfile::tempdir().unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .args([
            "chat",
            "--provider",
            "openai",
            "--model-name",
            "m",
            "--base-url",
        ])
        .arg(mock.openai_base_url())
        .args(["--system", "Be kind."])
        .env_remove("OPENAI_API_KEY")
        .env("AGENTRY_HOME", home.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"I am Ada.\nWhat is my name?\n/exit\n")
        .await
        .unwrap();
    drop(stdin);
    let output = child.wait_with_output().await.unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("Hello, Ada.") && stdout.contains("You said your name is Ada."));
    let requests = mock.requests();
    assert_eq!(requests.len(), 2);
    // The second turn carries the first: system, user, assistant, user.
    let messages = requests[1].body["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[0]["content"], "Be kind.");
    assert_eq!(messages[2]["content"], "Hello, Ada.");
    assert_eq!(messages[3]["content"], "What is my name?");
    // History was saved for the next session.
    let history = std::fs::read_to_string(home.path().join("chat_history")).unwrap();
    assert!(history.contains("What is my name?"));
}
