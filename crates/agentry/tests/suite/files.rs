//! `agentry files ls|get|put|rm` on a session's workspace, end to end.

use std::path::Path;
use std::process::Output;

use agentry_testkit::{MockProvider, Reply, ScriptedTurn};

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

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test]
async fn files_go_in_and_out_of_a_sessions_workspace() {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let mock = MockProvider::start().await.unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Ready.")));
    let base = mock.openai_base_url();
    let run = agentry(
        home,
        &[
            "run",
            "Hello",
            "--provider",
            "openai",
            "--base-url",
            &base,
            "--model-name",
            "m",
        ],
    )
    .await;
    assert!(run.status.success(), "{}", text(&run.stderr));
    let session = text(&run.stderr)
        .lines()
        .find_map(|line| line.strip_prefix("session: ").map(str::to_owned))
        .expect("a session line");
    let local = home.join("report.csv");
    std::fs::write(&local, "a,b\n1,2\n").unwrap();
    let put = agentry(
        home,
        &[
            "files",
            "put",
            &session,
            local.to_str().unwrap(),
            "data/report.csv",
        ],
    )
    .await;
    assert!(put.status.success(), "{}", text(&put.stderr));
    assert_eq!(
        std::fs::read_to_string(
            home.join("workspaces")
                .join(&session)
                .join("data/report.csv")
        )
        .unwrap(),
        "a,b\n1,2\n"
    );
    let ls = agentry(home, &["files", "ls", &session]).await;
    assert!(ls.status.success(), "{}", text(&ls.stderr));
    assert!(text(&ls.stdout).contains("data/"), "{}", text(&ls.stdout));
    let ls = agentry(home, &["files", "ls", &session, "data", "--json"]).await;
    let entry: serde_json::Value =
        serde_json::from_str(text(&ls.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(entry["path"], "data/report.csv");
    assert_eq!(entry["size"], 8);
    let get = agentry(home, &["files", "get", &session, "data/report.csv", "-"]).await;
    assert!(get.status.success(), "{}", text(&get.stderr));
    assert_eq!(text(&get.stdout), "a,b\n1,2\n");
    // Paths stay inside the workspace.
    for args in [
        vec!["files", "get", session.as_str(), "../../secret", "-"],
        vec!["files", "rm", session.as_str(), "/etc/passwd"],
        vec!["files", "ls", "not-a-session"],
    ] {
        let refused = agentry(home, &args).await;
        assert!(!refused.status.success(), "{args:?}");
        assert!(!text(&refused.stderr).is_empty());
    }
    let rm = agentry(home, &["files", "rm", &session, "data"]).await;
    assert!(rm.status.success(), "{}", text(&rm.stderr));
    assert!(!home.join("workspaces").join(&session).join("data").exists());
}
