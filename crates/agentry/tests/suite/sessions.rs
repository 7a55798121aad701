//! `agentry run` persisting sessions, and `agentry sessions …`, end to end.

use std::path::Path;
use std::process::Output;

use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::Value;

async fn agentry(home: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("AGENTRY_DATABASE_URL")
        .output()
        .await
        .unwrap()
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).to_string()
}

fn session_of(output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    stderr
        .lines()
        .find_map(|line| line.strip_prefix("session: "))
        .unwrap_or_else(|| panic!("no session line in {stderr}"))
        .to_owned()
}

#[tokio::test]
async fn sessions_persist_continue_fork_and_go() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Paris is the capital.")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "About 2.1 million people.",
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("A forked answer.")));
    let base = mock.openai_base_url();
    let model = [
        "--provider",
        "openai",
        "--base-url",
        &base,
        "--model-name",
        "m",
    ];

    let mut first_args = vec!["run", "What is the capital of France?"];
    first_args.extend(model);
    let first = agentry(home, &first_args).await;
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let session = session_of(&first);

    // Continue it: the saved profile supplies the model; the history comes from the log.
    let second = agentry(
        home,
        &["run", "How many people live there?", "--session", &session],
    )
    .await;
    assert!(
        second.status.success(),
        "{}",
        String::from_utf8_lossy(&second.stderr)
    );
    assert_eq!(session_of(&second), session);
    let sent = mock.requests()[1].body.to_string();
    assert!(sent.contains("capital of France") && sent.contains("Paris is the capital."));

    // list / show
    let list = agentry(home, &["sessions", "list", "--json"]).await;
    let rows: Vec<Value> = stdout(&list)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["id"], session.as_str());
    assert_eq!(rows[0]["status"], "idle");
    assert_eq!(rows[0]["unread"], true);
    assert_eq!(rows[0]["title"], "What is the capital of France?");
    let events = rows[0]["events"].as_u64().unwrap();
    let show = stdout(&agentry(home, &["sessions", "show", &session]).await);
    assert!(show.contains("user: How many people live there?"), "{show}");
    assert!(
        show.contains("assistant: About 2.1 million people."),
        "{show}"
    );
    let list = agentry(home, &["sessions", "list", "--json"]).await;
    assert!(
        stdout(&list).contains("\"unread\":false"),
        "show marks it read"
    );

    // fork right after the first run's end (time travel), then continue the fork
    let log = stdout(&agentry(home, &["sessions", "show", &session, "--events"]).await);
    let first_end = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["event"]["type"] == "run_finished")
        .unwrap()["seq"]
        .as_u64()
        .unwrap();
    let fork = agentry(
        home,
        &["sessions", "fork", &session, "--at", &first_end.to_string()],
    )
    .await;
    assert!(
        fork.status.success(),
        "{}",
        String::from_utf8_lossy(&fork.stderr)
    );
    let fork_id = stdout(&fork).trim().to_owned();
    assert_ne!(fork_id, session);
    let third = agentry(home, &["run", "And Germany?", "--session", &fork_id]).await;
    assert!(third.status.success());
    let sent = mock.requests()[2].body.to_string();
    assert!(
        sent.contains("Paris is the capital.") && !sent.contains("million"),
        "{sent}"
    );
    mock.check_protocol().unwrap();

    // title, search
    let titled = agentry(home, &["sessions", "title", &session, "Capitals"]).await;
    assert_eq!(stdout(&titled).trim(), "Capitals");
    let found = stdout(&agentry(home, &["sessions", "search", "million"]).await);
    assert!(
        found.contains(&session) && !found.contains(&fork_id),
        "{found}"
    );

    // rm: the fork keeps its shared history
    assert!(
        agentry(home, &["sessions", "rm", &session])
            .await
            .status
            .success()
    );
    let fork_show = stdout(&agentry(home, &["sessions", "show", &fork_id]).await);
    assert!(fork_show.contains("Paris is the capital.") && fork_show.contains("A forked answer."));
    assert!(
        !agentry(home, &["sessions", "rm", &session])
            .await
            .status
            .success()
    );
    assert!(events > 0);
}

#[tokio::test]
async fn ephemeral_runs_leave_nothing_and_prune_removes_expired() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("ok")));
    let base = mock.openai_base_url();
    let run = |extra: &'static [&'static str]| {
        let base = base.clone();
        async move {
            let mut args = vec![
                "run",
                "hi",
                "--provider",
                "openai",
                "--base-url",
                &base,
                "--model-name",
                "m",
            ];
            args.extend(extra);
            agentry(home, &args).await
        }
    };
    let ephemeral = run(&["--ephemeral"]).await;
    assert!(ephemeral.status.success());
    assert!(!String::from_utf8_lossy(&ephemeral.stderr).contains("session:"));
    assert_eq!(
        stdout(&agentry(home, &["sessions", "list"]).await).trim(),
        ""
    );

    let kept = session_of(&run(&[]).await);
    let expiring = session_of(&run(&["--ttl-days", "0"]).await);
    let pruned = stdout(&agentry(home, &["sessions", "prune"]).await);
    assert!(pruned.contains("removed 1"), "{pruned}");
    let list = stdout(&agentry(home, &["sessions", "list"]).await);
    assert!(list.contains(&kept) && !list.contains(&expiring));
    let pruned = stdout(&agentry(home, &["sessions", "prune", "--older-than-days", "0"]).await);
    assert!(pruned.contains("removed 1"), "{pruned}");
}

#[tokio::test]
async fn bad_session_ids_are_rejected_and_nothing_is_written() {
    let home = tempfile::tempdir().unwrap();
    for bad in ["../../etc/passwd", "1700000000", "new"] {
        let output = agentry(home.path(), &["sessions", "show", bad]).await;
        assert_eq!(output.status.code(), Some(2), "{bad}");
        assert!(String::from_utf8_lossy(&output.stderr).contains("invalid session id"));
    }
    assert!(!home.path().join("agentry.db").exists());
}

#[tokio::test]
async fn the_model_writes_a_title_and_recover_finishes_interrupted_runs() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Use a sieve.")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "\"Finding prime numbers\"",
    )));
    let base = mock.openai_base_url();
    let run = agentry(
        home,
        &[
            "run",
            "How do I find primes?",
            "--provider",
            "openai",
            "--base-url",
            &base,
            "--model-name",
            "m",
        ],
    )
    .await;
    let session = session_of(&run);
    let titled = agentry(home, &["sessions", "title", &session]).await;
    assert!(
        titled.status.success(),
        "{}",
        String::from_utf8_lossy(&titled.stderr)
    );
    assert_eq!(stdout(&titled).trim(), "Finding prime numbers");
    let prompt = mock.requests()[1].body.to_string();
    assert!(
        prompt.contains("How do I find primes?") && prompt.contains("title"),
        "{prompt}"
    );
    let list = stdout(&agentry(home, &["sessions", "list"]).await);
    assert!(list.contains("Finding prime numbers"));
    // Nothing is in flight: recover has nothing to do.
    let recovered = agentry(home, &["sessions", "recover"]).await;
    assert!(recovered.status.success());
    assert!(!String::from_utf8_lossy(&recovered.stderr).contains("session:"));
}
