//! The run queue across processes: a second `agentry serve` on one SQLite data folder refuses
//! to start and says why; a background run whose server is killed (`kill -9`) mid-run is taken
//! over after its lease by the next server, and ends once.

use std::path::Path;
use std::time::Duration;

use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::processes::{free_port, listening, serve};

#[tokio::test]
async fn a_second_server_on_one_sqlite_folder_refuses_to_start_and_says_why() {
    let home = tempfile::tempdir().unwrap();
    let mut first = serve(home.path(), free_port(), &[]);
    listening(&mut first).await;
    let second = serve(home.path(), free_port(), &[])
        .wait_with_output()
        .await
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(
        stderr.contains("another `agentry serve` is using the data folder")
            && stderr.contains("PostgreSQL"),
        "{stderr}"
    );
    // The first still serves.
    assert!(first.try_wait().unwrap().is_none());
}

#[tokio::test]
async fn a_killed_servers_background_run_is_taken_over_after_its_lease_and_ends_once() {
    let home = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await.unwrap();
    // The first model call hangs long enough for the kill; later ones answer.
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("never seen")).delay_headers(Duration::from_secs(30)),
    );
    mock.set_fallback(Reply::scripted(ScriptedTurn::text(
        "finished after the crash",
    )));
    let http = agentry_llm::http_client(Duration::from_secs(30)).unwrap();

    let port = free_port();
    let mut first = serve(home.path(), port, &["--lease-secs", "3"]);
    listening(&mut first).await;
    let base = format!("http://127.0.0.1:{port}");
    let created = http
        .post(format!("{base}/v1/models"))
        .json(&json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status().as_u16(), 201);
    let run: Value = http
        .post(format!("{base}/v1/runs"))
        .json(&json!({"text": "survive"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    // Wait until the model call is in flight, then kill the server outright.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while mock.request_count() == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(mock.request_count(), 1);
    first.start_kill().unwrap();
    first.wait().await.unwrap();

    let port = free_port();
    let mut second = serve(home.path(), port, &["--lease-secs", "3"]);
    listening(&mut second).await;
    let base = format!("http://127.0.0.1:{port}");
    let done: Value = http
        .get(format!("{base}/v1/runs/{run_id}/wait?timeout_secs=25"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 2, "claimed again after the lease: {done}");
    assert_eq!(
        done["outcome"]["text"], "finished after the crash",
        "{done}"
    );
    // One run in the log, started once and finished once.
    let session = done["session_id"].as_str().unwrap();
    let events: Value = http
        .get(format!("{base}/v1/sessions/{session}/events"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "run_started").count(),
        1,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| **k == "run_finished").count(),
        1,
        "{kinds:?}"
    );
}

/// `agentry` on a data folder, waiting for it to end: (exit code, stdout, stderr).
async fn agentry(home: &Path, args: &[&str]) -> (i32, String, String) {
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("AGENTRY_DATABASE_URL")
        .output()
        .await
        .unwrap();
    (
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[tokio::test]
async fn schedules_are_added_listed_checked_and_removed_from_the_cli() {
    let home = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await.unwrap();
    let store = agentry_store::Store::open_home(home.path()).await.unwrap();
    store
        .put_config(
            agentry_store::ConfigKind::Model,
            "m",
            &json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "x"}),
        )
        .await
        .unwrap();
    store
        .put_config(
            agentry_store::ConfigKind::Workflow,
            "nightly",
            &json!({"id": "nightly", "input_schema": {"type": "object", "required": ["region"]},
                    "steps": [{"id": "pause", "kind": "wait", "seconds": 1}]}),
        )
        .await
        .unwrap();
    store.close().await;
    // A schedule that starts a workflow, its input from `--input`.
    let (code, workflow_schedule, stderr) = agentry(
        home.path(),
        &[
            "schedules",
            "add",
            "--every",
            "3600",
            "--workflow",
            "nightly",
            "--input",
            "region=eu",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let (_, shown, _) = agentry(
        home.path(),
        &["schedules", "show", workflow_schedule.trim()],
    )
    .await;
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(
        shown["workflow"],
        json!({"workflow_id": "nightly", "input": {"region": "eu"}})
    );
    let (code, _, stderr) = agentry(
        home.path(),
        &["schedules", "add", "--every", "60", "--workflow", "nightly"],
    )
    .await;
    assert_eq!(code, 1, "an input the schema refuses: {stderr}");
    assert!(stderr.contains("region"), "{stderr}");
    let (code, _, _) = agentry(home.path(), &["schedules", "rm", workflow_schedule.trim()]).await;
    assert_eq!(code, 0);
    let (code, id, stderr) = agentry(
        home.path(),
        &[
            "schedules",
            "add",
            "--cron",
            "0 9 * * MON-FRI",
            "--timezone",
            "Europe/Paris",
            "--model",
            "m",
            "--name",
            "standup",
            "Summarise yesterday.",
        ],
    )
    .await;
    assert_eq!(code, 0, "{stderr}");
    let id = id.trim().to_owned();
    assert!(stderr.contains("standup"), "{stderr}");
    let (code, listed, _) = agentry(home.path(), &["schedules", "list"]).await;
    assert_eq!(code, 0);
    assert!(
        listed.contains(&id) && listed.contains("Europe/Paris"),
        "{listed}"
    );
    let (code, shown, _) = agentry(home.path(), &["schedules", "show", &id]).await;
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&shown).unwrap();
    assert_eq!(shown["next_fires"].as_array().unwrap().len(), 5);
    // Bad input: a clear message, nothing stored.
    for args in [
        vec![
            "schedules",
            "add",
            "--cron",
            "61 * * * *",
            "--model",
            "m",
            "x",
        ],
        vec![
            "schedules",
            "add",
            "--cron",
            "0 9 * * *",
            "--timezone",
            "Mars/Base",
            "--model",
            "m",
            "x",
        ],
        vec!["schedules", "add", "--every", "60", "--model", "nope", "x"],
    ] {
        let (code, _, stderr) = agentry(home.path(), &args).await;
        assert_eq!(code, 1, "{args:?}: {stderr}");
        assert!(!stderr.is_empty());
    }
    let (code, _, stderr) = agentry(home.path(), &["schedules", "rm", &id]).await;
    assert_eq!(code, 0, "{stderr}");
    let (_, listed, _) = agentry(home.path(), &["schedules", "list"]).await;
    assert!(listed.trim().is_empty(), "{listed}");
}
