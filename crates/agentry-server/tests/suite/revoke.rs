//! The per-turn file journal over HTTP: what each turn's tools changed (file tools and a shell
//! command in the sandbox alike), its diff, revoking a turn (files back byte for byte, the
//! conversation cut), conflicts, the seed's shapes, and the `undo` tool.

use std::collections::BTreeMap;
use std::path::PathBuf;

use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, start_with_workspaces};

use agentry_testkit::folder::snapshot as tree;

/// Runs one turn of `session` ("new" for a new one) that makes `calls` rounds, then answers.
async fn turn(server: &Server, session: &str, text: &str, rounds: Vec<ScriptedTurn>) -> String {
    for round in rounds {
        server.mock.enqueue(Reply::scripted(round));
    }
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("done")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": session, "model_id": "mock", "text": text}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "done", "{body}");
    body["session_id"].as_str().unwrap().to_owned()
}

fn workspace_of(server: &Server, session: &str) -> PathBuf {
    server
        .state
        .app
        .parts()
        .sessions
        .workspace(session.parse().unwrap())
        .unwrap()
}

/// The first turn writes two files; the second edits one, creates a file in a new folder, and
/// (through the sandbox's shell) deletes the other and writes a binary file.
async fn two_turns(server: &Server) -> (String, PathBuf, BTreeMap<String, String>) {
    let session = turn(
        server,
        "new",
        "make files",
        vec![
            ScriptedTurn::tool_call(
                "write_file",
                json!({"path": "a.txt", "content": "alpha\nbeta\n"}),
            )
            .with_tool_call(
                "write_file",
                json!({"path": "keep.txt", "content": "keep me\n"}),
            ),
        ],
    )
    .await;
    let workspace = workspace_of(server, &session);
    let after_first = tree(&workspace);
    assert_eq!(after_first.len(), 2, "{after_first:?}");
    turn(
        server,
        &session,
        "change them",
        vec![
            ScriptedTurn::tool_call(
                "edit_file",
                json!({"path": "a.txt", "old_text": "alpha", "new_text": "ALPHA"}),
            )
            .with_tool_call("write_file", json!({"path": "out/new.txt", "content": "new\n"})),
            ScriptedTurn::tool_call(
                "exec",
                json!({"command": "rm keep.txt && mkdir -p bin && printf '\\377\\376' > bin/x.bin"}),
            ),
        ],
    )
    .await;
    (session, workspace, after_first)
}

/// A turn that creates, edits and deletes files (with the file tools and a shell command) is
/// listed with its changes and diff, then revoked: the workspace equals its earlier state byte
/// for byte, and the conversation (what the model is sent next) no longer holds the turn.
#[tokio::test]
async fn a_revoked_turn_restores_the_files_and_the_conversation() {
    let server = start_with_workspaces().await;
    let (session, workspace, after_first) = two_turns(&server).await;
    assert_ne!(tree(&workspace), after_first);
    assert!(!workspace.join("keep.txt").exists());

    let (status, listed) = server
        .get(&format!("/v1/sessions/{session}/file-journals"))
        .await;
    assert_eq!(status, 200, "{listed}");
    let turns = listed["turns"].as_array().unwrap();
    assert_eq!(turns.len(), 2, "{listed}");
    let changes: BTreeMap<&str, &str> = turns[1]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap(),
                f["change_type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        changes,
        BTreeMap::from([
            ("a.txt", "modified"),
            ("bin", "added"),
            ("bin/x.bin", "added"),
            ("keep.txt", "deleted"),
            ("out", "added"),
            ("out/new.txt", "added"),
        ]),
        "{listed}"
    );
    let second = turns[1]["run_id"].as_str().unwrap().to_owned();

    let (status, diff) = server
        .get(&format!("/v1/sessions/{session}/file-journals/{second}"))
        .await;
    assert_eq!(status, 200, "{diff}");
    let file = |path: &str| -> Value {
        diff["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == path)
            .cloned()
            .unwrap_or_else(|| panic!("{path} in {diff}"))
    };
    let edited = file("a.txt");
    assert_eq!(edited["baseline"], "alpha\nbeta\n");
    assert_eq!(edited["after"], "ALPHA\nbeta\n");
    let text = edited["diff"].as_str().unwrap();
    assert!(text.starts_with("--- a/a.txt\n+++ b/a.txt\n"), "{text}");
    assert!(text.contains("\n-alpha\n+ALPHA\n beta\n"), "{text}");
    assert_eq!(
        file("out/new.txt")["diff"],
        "--- /dev/null\n+++ b/out/new.txt\n@@ -0,0 +1 @@\n+new\n"
    );
    assert_eq!(file("bin/x.bin")["binary"], true);

    let (status, revoked) = server
        .post(
            &format!("/v1/sessions/{session}/revoke"),
            json!({"run_id": second}),
        )
        .await;
    assert_eq!(status, 200, "{revoked}");
    assert_eq!(
        tree(&workspace),
        after_first,
        "the files are back byte for byte"
    );
    assert_eq!(revoked["runs"], json!([second]));
    assert!(revoked["removed_count"].as_u64().unwrap() >= 4, "{revoked}");
    let restored = revoked["files"]["restored"].as_array().unwrap();
    assert!(restored.contains(&json!("keep.txt")), "{revoked}");

    let (_, shown) = server.get(&format!("/v1/sessions/{session}")).await;
    let conversation = shown["messages"].to_string();
    assert!(conversation.contains("make files"), "{conversation}");
    assert!(!conversation.contains("change them"), "{conversation}");
    // The revoked turn is gone from the journal, and from what the model is sent next.
    let (_, listed) = server
        .get(&format!("/v1/sessions/{session}/file-journals"))
        .await;
    assert_eq!(listed["turns"].as_array().unwrap().len(), 1, "{listed}");
    let before = server.mock.requests().len();
    turn(&server, &session, "again", vec![]).await;
    let sent = server.mock.requests()[before].body.to_string();
    assert!(
        sent.contains("make files") && sent.contains("again"),
        "{sent}"
    );
    assert!(
        !sent.contains("change them") && !sent.contains("ALPHA"),
        "{sent}"
    );
    server.mock.check_protocol().unwrap();

    // Unknown turns, bad bodies.
    let (status, body) = server
        .post(
            &format!("/v1/sessions/{session}/revoke"),
            json!({"run_id": second}),
        )
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_turn", "{body}");
    let (status, body) = server
        .post(
            &format!("/v1/sessions/{session}/revoke"),
            json!({"when": 1}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = server
        .get(&format!("/v1/sessions/{session}/file-journals/nonsense"))
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "unknown_turn", "{body}");
    server.close_sandboxes().await;
}

/// The seed's routes: user messages carry their own times, which are the turn keys; a file
/// changed by hand since is a `JournalConflict` (nothing done) until forced; an unknown time
/// is a 400.
#[tokio::test]
async fn seed_revoke_by_timestamp_with_a_conflict_then_forced() {
    let server = start_with_workspaces().await;
    let (session, workspace, after_first) = two_turns(&server).await;
    let (status, shown) = server
        .get(&format!("/linglong/v1/sessions/{session}"))
        .await;
    assert_eq!(status, 200, "{shown}");
    let times: Vec<String> = shown["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["timestamp"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(times.len(), 2, "{shown}");
    assert_ne!(times[0], times[1]);

    let (status, keys) = server
        .get(&format!("/linglong/v1/sessions/{session}/file-journals"))
        .await;
    assert_eq!(status, 200, "{keys}");
    assert_eq!(keys["turn_keys"], json!(times), "{keys}");
    let encoded = times[1].replace(':', "%3A");
    let (status, diff) = server
        .get(&format!(
            "/linglong/v1/sessions/{session}/file-journals/{encoded}"
        ))
        .await;
    assert_eq!(status, 200, "{diff}");
    assert_eq!(diff["turn_key"], times[1].as_str());
    assert!(
        diff["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "keep.txt" && f["change_type"] == "deleted"),
        "{diff}"
    );

    // Someone edits a file the turn wrote.
    std::fs::write(workspace.join("out/new.txt"), "by hand\n").unwrap();
    let by_hand = tree(&workspace);
    let revoke = |body: Value| {
        let path = format!("/linglong/v1/sessions/{session}/revoke");
        let server = &server;
        async move { server.post(&path, body).await }
    };
    let (status, conflict) = revoke(json!({"session_id": session, "timestamp": times[1]})).await;
    assert_eq!(status, 409, "{conflict}");
    assert_eq!(conflict["error"], "JournalConflict");
    assert_eq!(conflict["files"], json!(["out/new.txt"]));
    assert_eq!(conflict["can_force"], true);
    assert_eq!(tree(&workspace), by_hand, "nothing was restored");

    let (status, unknown) = revoke(json!({"timestamp": "2001-01-01T00:00:00"})).await;
    assert_eq!(status, 400, "{unknown}");
    let (status, missing) = revoke(json!({})).await;
    assert_eq!(status, 400, "{missing}");
    assert!(
        missing["error"].as_str().unwrap().contains("timestamp"),
        "{missing}"
    );

    let (status, done) = revoke(json!({"timestamp": times[1], "forced": true})).await;
    assert_eq!(status, 200, "{done}");
    assert_eq!(done["status"], "success");
    assert_eq!(done["journal"]["revoked"], true, "{done}");
    assert_eq!(tree(&workspace), after_first);
    let (_, shown) = server
        .get(&format!("/linglong/v1/sessions/{session}"))
        .await;
    let users = shown["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .count();
    assert_eq!(users, 1, "{shown}");

    // Revoking the first turn too, keeping the files: only the conversation goes back.
    let (status, kept) = revoke(json!({"timestamp": times[0], "keep_files": true})).await;
    assert_eq!(status, 200, "{kept}");
    assert_eq!(kept["journal"]["kept_files"], true, "{kept}");
    assert_eq!(tree(&workspace), after_first);
    let (_, keys) = server
        .get(&format!("/linglong/v1/sessions/{session}/file-journals"))
        .await;
    assert_eq!(keys["turn_keys"], json!([]), "{keys}");
    server.close_sandboxes().await;
}

/// The `undo` tool puts back what the latest turn that changed files did, within a run, and
/// leaves the conversation alone.
#[tokio::test]
async fn the_undo_tool_puts_the_latest_turns_files_back() {
    let server = start_with_workspaces().await;
    let (session, workspace, after_first) = two_turns(&server).await;
    turn(
        &server,
        &session,
        "undo that",
        vec![ScriptedTurn::tool_call("undo", json!({}))],
    )
    .await;
    assert_eq!(tree(&workspace), after_first);
    let sent = server.mock.requests().last().unwrap().body.to_string();
    assert!(sent.contains("undone"), "{sent}");
    assert!(
        sent.contains("change them"),
        "the conversation stays: {sent}"
    );
    // Then the first turn's; then nothing is left to undo.
    turn(
        &server,
        &session,
        "and that",
        vec![ScriptedTurn::tool_call("undo", json!({}))],
    )
    .await;
    assert!(tree(&workspace).is_empty(), "{:?}", tree(&workspace));
    turn(
        &server,
        &session,
        "more",
        vec![ScriptedTurn::tool_call("undo", json!({}))],
    )
    .await;
    let sent = server.mock.requests().last().unwrap().body.to_string();
    assert!(sent.contains("nothing to undo"), "{sent}");
    server.mock.check_protocol().unwrap();
    server.close_sandboxes().await;
}
