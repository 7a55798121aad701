//! `agentry agents list|show|add|rm` on the data folder's store, and `agentry run --agent` /
//! `agentry chat --agent` running as a saved agent against the mock provider.

use std::path::Path;
use std::process::Output;

use agentry_store::{ConfigKind, Store};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};

async fn agentry(home: &Path, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("AGENTRY_DATABASE_URL")
        .env_remove("OPENAI_API_KEY")
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `agentry chat --agent <agent>` in `home`, typing `input`.
async fn chat_as(home: &Path, agent: &str, input: &[u8]) -> Output {
    super::approvals::chat(home, &["--agent".as_ref(), agent.as_ref()], input).await
}

/// A data folder whose store has two models on the mock: `mock` (provider name `m`) and
/// `backup` (`b`).
async fn home_with_models(mock: &MockProvider) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    for (id, name) in [("mock", "m"), ("backup", "b")] {
        store
            .put_config(
                ConfigKind::Model,
                id,
                &json!({"id": id, "protocol": "openai", "base_url": mock.openai_base_url(),
                        "model_name": name}),
            )
            .await
            .unwrap();
    }
    store.close().await;
    home
}

fn models_called(mock: &MockProvider) -> Vec<String> {
    mock.requests()
        .iter()
        .map(|r| r.body["model"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn tools_offered(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn agents_are_added_listed_shown_and_removed() {
    let mock = MockProvider::start().await.unwrap();
    let home = home_with_models(&mock).await;
    let home = home.path();
    let added = agentry(
        home,
        &[
            "agents",
            "add",
            "--id",
            "writer",
            "--model",
            "mock",
            "--fallback",
            "backup",
            "--tool",
            "current_time",
            "--system",
            "Be brief.",
            "--label",
            "docs",
            "--max-tool-calls",
            "3",
            "--max-tokens",
            "900",
            "--wall-time-secs",
            "30",
        ],
    )
    .await;
    assert!(added.status.success(), "{}", text(&added.stderr));

    let again = agentry(
        home,
        &["agents", "add", "--id", "writer", "--model", "mock"],
    )
    .await;
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("already exists"),
        "{}",
        text(&again.stderr)
    );

    // Checked like the API: an unknown model or a bad limit is refused, nothing saved.
    let bad = agentry(home, &["agents", "add", "--id", "bad", "--model", "gpt-9"]).await;
    assert!(!bad.status.success());
    assert!(text(&bad.stderr).contains("gpt-9"), "{}", text(&bad.stderr));
    let bad = agentry(
        home,
        &[
            "agents",
            "add",
            "--id",
            "bad",
            "--model",
            "mock",
            "--max-tool-calls",
            "0",
        ],
    )
    .await;
    assert!(
        text(&bad.stderr).contains("max_tool_calls"),
        "{}",
        text(&bad.stderr)
    );

    // From a file, in the API's shape.
    let file = home.join("reader.json");
    std::fs::write(
        &file,
        json!({"id": "reader", "model_id": "backup", "nickname": "Reed",
               "limits": {"max_tool_rounds": 2}})
        .to_string(),
    )
    .unwrap();
    let added = agentry(home, &["agents", "add", "--file", file.to_str().unwrap()]).await;
    assert!(added.status.success(), "{}", text(&added.stderr));

    let listed = agentry(home, &["agents", "list"]).await;
    let listed = text(&listed.stdout);
    assert!(listed.contains("writer\tmock\t[docs]"), "{listed}");
    assert!(listed.contains("reader\tbackup\tReed"), "{listed}");
    assert!(!listed.contains("bad"), "{listed}");

    let shown = agentry(home, &["agents", "show", "writer"]).await;
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown["fallback_model_ids"], json!(["backup"]));
    assert_eq!(shown["tool_ids"], json!(["current_time"]));
    assert_eq!(shown["system"], "Be brief.");
    assert_eq!(
        shown["limits"],
        json!({"max_tool_calls": 3, "max_tokens": 900, "wall_time_secs": 30})
    );

    let removed = agentry(home, &["agents", "rm", "reader"]).await;
    assert!(removed.status.success());
    let removed = agentry(home, &["agents", "rm", "reader"]).await;
    assert!(!removed.status.success());
    let listed = agentry(home, &["agents", "list", "--json"]).await;
    assert_eq!(text(&listed.stdout).lines().count(), 1);
    // Nothing reached the model.
    assert_eq!(mock.request_count(), 0);
}

#[tokio::test]
async fn run_as_an_agent_uses_its_models_tools_prompt_and_quota() {
    let mock = MockProvider::start().await.unwrap();
    let home = home_with_models(&mock).await;
    let home = home.path();
    let added = agentry(
        home,
        &[
            "agents",
            "add",
            "--id",
            "timer",
            "--model",
            "mock",
            "--fallback",
            "backup",
            "--tool",
            "current_time",
            "--system",
            "You keep time.",
            "--max-tool-calls",
            "1",
        ],
    )
    .await;
    assert!(added.status.success(), "{}", text(&added.stderr));

    // The primary model is missing at the provider; the backup asks for two calls, one over
    // the quota.
    mock.enqueue(Reply::error(
        404,
        json!({"error": {"message": "no such model", "code": "model_not_found"}}),
    ));
    mock.enqueue(Reply::scripted(
        ScriptedTurn::tool_call("current_time", json!({}))
            .with_tool_call("current_time", json!({})),
    ));
    let output = agentry(home, &["run", "--agent", "timer", "What time is it?"]).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(3), "{stderr}");
    assert!(stderr.contains("max_tool_calls"), "{stderr}");
    assert!(stderr.contains("session: "), "{stderr}");
    assert_eq!(models_called(&mock), ["m", "b"]);
    let sent = &mock.requests()[1].body;
    assert_eq!(sent["messages"][0]["content"], "You keep time.");
    assert_eq!(tools_offered(sent), ["current_time"]);

    // Ephemeral, completing: exit 0 with the answer.
    mock.take_requests();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Noon.")));
    let output = agentry(home, &["run", "--agent", "timer", "--ephemeral", "Time?"]).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("Noon."));
    assert_eq!(models_called(&mock), ["m"]);

    // An unknown agent is a clear error before any model call.
    mock.take_requests();
    let output = agentry(home, &["run", "--agent", "nobody", "x"]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("no agent \"nobody\""),
        "{}",
        text(&output.stderr)
    );
    assert_eq!(mock.request_count(), 0);
}

#[tokio::test]
async fn chat_as_an_agent_keeps_its_prompt_across_turns() {
    let mock = MockProvider::start().await.unwrap();
    let home = home_with_models(&mock).await;
    let added = agentry(
        home.path(),
        &[
            "agents", "add", "--id", "kind", "--model", "backup", "--system", "Be kind.",
        ],
    )
    .await;
    assert!(added.status.success(), "{}", text(&added.stderr));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Hello, Ada.")));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("You are Ada.")));
    let output = chat_as(home.path(), "kind", b"I am Ada.\nWho am I?\n/exit\n").await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains("You are Ada."));
    assert_eq!(models_called(&mock), ["b", "b"]);
    let messages = mock.requests()[1].body["messages"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(messages.len(), 4);
    assert_eq!(messages[0]["content"], "Be kind.");
    assert_eq!(messages[3]["content"], "Who am I?");
    assert!(tools_offered(&mock.requests()[1].body).is_empty());
}

/// `agentry run --agent` goes through the same agent-to-run path as the HTTP API: the agent's
/// long-term memories join its system prompt, in a session run and an ephemeral one.
#[tokio::test]
async fn a_cli_run_as_an_agent_gets_its_memories() {
    let mock = MockProvider::start().await.unwrap();
    let home = home_with_models(&mock).await;
    let home = home.path();
    let added = agentry(
        home,
        &[
            "agents",
            "add",
            "--id",
            "keeper",
            "--model",
            "mock",
            "--system",
            "You help.",
        ],
    )
    .await;
    assert!(added.status.success(), "{}", text(&added.stderr));
    let store = Store::open_home(home).await.unwrap();
    store
        .remember(agentry_store::NewMemory {
            scope: agentry_store::MemoryScope::agent("keeper"),
            kind: agentry_store::MemoryKind::Preference,
            text: "The team deploys on Tuesdays only.".into(),
            source_session: None,
        })
        .await
        .unwrap();
    store.close().await;

    for extra in [&[][..], &["--ephemeral"][..]] {
        mock.take_requests();
        mock.enqueue(Reply::scripted(ScriptedTurn::text("Tuesday.")));
        let mut args = vec!["run", "--agent", "keeper"];
        args.extend_from_slice(extra);
        args.push("When do we deploy?");
        let output = agentry(home, &args).await;
        assert!(output.status.success(), "{}", text(&output.stderr));
        let sent = &mock.requests()[0].body;
        let system = sent["messages"][0]["content"].as_str().unwrap_or_default();
        assert!(system.starts_with("You help."), "{extra:?}: {system}");
        assert!(system.contains("<memories>"), "{extra:?}: {system}");
        assert!(
            system.contains("The team deploys on Tuesdays only."),
            "{extra:?}: {system}"
        );
    }
}

/// An agent whose sessions share one workspace (`"workspace": "agent"`) works in it from the
/// command line too, as through `POST /v1/infer` (issue 49: `run --agent` and `chat --agent` in
/// a session go through the application; each session had a workspace of its own before): a
/// second session, made by `ask`, reads what the first wrote. Two sessions, both the
/// application's.
async fn an_agent_from_the_cli_works_in_its_shared_workspace(
    ask: impl AsyncFn(&Path, &'static str) -> Output,
) {
    let mock = MockProvider::start().await.unwrap();
    let home = home_with_models(&mock).await;
    let home = home.path();
    let file = home.join("notes.json");
    std::fs::write(
        &file,
        json!({"id": "notes", "model_id": "mock", "workspace": "agent",
               "tool_ids": ["write_file", "read_file"]})
        .to_string(),
    )
    .unwrap();
    let added = agentry(home, &["agents", "add", "--file", file.to_str().unwrap()]).await;
    assert!(added.status.success(), "{}", text(&added.stderr));

    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "write_file",
        json!({"path": "todo.txt", "content": "buy milk\n"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Noted.")));
    let output = ask(home, "Note: buy milk").await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("Noted."),
        "{}",
        text(&output.stdout)
    );
    assert!(
        text(&output.stderr).contains("session: "),
        "{}",
        text(&output.stderr)
    );

    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "read_file",
        json!({"path": "todo.txt"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Milk.")));
    let output = ask(home, "What is on my list?").await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    // The model saw the file the first session wrote, read in the second.
    let requests = mock.requests();
    let sent = requests.last().unwrap().body.to_string();
    assert!(sent.contains("buy milk"), "{sent}");
    let store = Store::open_home(home).await.unwrap();
    let sessions = store
        .list_sessions(&agentry_store::SessionQuery::default())
        .await
        .unwrap();
    assert_eq!(sessions.len(), 2);
    store.close().await;
}

#[tokio::test]
async fn a_cli_run_as_an_agent_works_in_its_shared_workspace() {
    an_agent_from_the_cli_works_in_its_shared_workspace(async |home, prompt| {
        agentry(home, &["run", "--agent", "notes", prompt]).await
    })
    .await;
}

#[tokio::test]
async fn a_chat_as_an_agent_works_in_its_shared_workspace() {
    an_agent_from_the_cli_works_in_its_shared_workspace(async |home, prompt| {
        chat_as(home, "notes", format!("{prompt}\n/exit\n").as_bytes()).await
    })
    .await;
}

/// `agentry sessions rm` removes a session as `DELETE /v1/sessions/{id}` does (issue 49: it
/// deleted only the store's rows): the file journal its runs kept of what their tools changed
/// goes with it. And a removed session is not found again.
#[tokio::test]
async fn removing_a_session_from_the_cli_forgets_its_file_journal() {
    let mock = MockProvider::start().await.unwrap();
    let home = home_with_models(&mock).await;
    let home = home.path();
    let file = home.join("writer.json");
    std::fs::write(
        &file,
        json!({"id": "writer", "model_id": "mock", "tool_ids": ["write_file"]}).to_string(),
    )
    .unwrap();
    let added = agentry(home, &["agents", "add", "--file", file.to_str().unwrap()]).await;
    assert!(added.status.success(), "{}", text(&added.stderr));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "write_file",
        json!({"path": "a.txt", "content": "hello\n"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Written.")));
    let output = agentry(home, &["run", "--agent", "writer", "Write a.txt."]).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let session = text(&output.stderr)
        .lines()
        .find_map(|line| line.strip_prefix("session: ").map(str::to_owned))
        .expect("the run names its session");
    let journal = home.join("workspaces").join(".journal").join(&session);
    assert!(journal.is_dir(), "no journal at {}", journal.display());
    let removed = agentry(home, &["sessions", "rm", &session]).await;
    assert!(removed.status.success(), "{}", text(&removed.stderr));
    assert!(
        !journal.exists(),
        "the journal stays at {}",
        journal.display()
    );
    let again = agentry(home, &["sessions", "rm", &session]).await;
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("no session"),
        "{}",
        text(&again.stderr)
    );
}

/// `agentry agents add` checks an agent as `POST /v1/agents` does (issue 49: it checked only
/// the names): a webhook to a loopback address is refused, and so is a second default A2A agent.
#[tokio::test]
async fn agents_add_checks_what_the_api_checks() {
    let mock = MockProvider::start().await.unwrap();
    let home = home_with_models(&mock).await;
    let home = home.path();
    let add = |name: &str, agent: Value| {
        let file = home.join(format!("{name}.json"));
        std::fs::write(&file, agent.to_string()).unwrap();
        async move { agentry(home, &["agents", "add", "--file", file.to_str().unwrap()]).await }
    };
    let hooked = add(
        "hooked",
        json!({"id": "hooked", "model_id": "mock", "webhook_url": "http://127.0.0.1:9/hook"}),
    )
    .await;
    assert!(!hooked.status.success());
    assert!(
        text(&hooked.stderr).contains("loopback or private address"),
        "{}",
        text(&hooked.stderr)
    );
    let first = add(
        "first",
        json!({"id": "first", "model_id": "mock", "a2a": {"default": true}}),
    )
    .await;
    assert!(first.status.success(), "{}", text(&first.stderr));
    let second = add(
        "second",
        json!({"id": "second", "model_id": "mock", "a2a": {"default": true}}),
    )
    .await;
    assert!(!second.status.success());
    assert!(
        text(&second.stderr).contains("default A2A agent already"),
        "{}",
        text(&second.stderr)
    );
    // One JSON object a line.
    let listed = agentry(home, &["agents", "list", "--json"]).await;
    let ids: Vec<String> = text(&listed.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str::<Value>(line).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids, ["first"]);
}

/// `agentry run --agent ID --ephemeral` goes through the application as a stateless
/// `POST /v1/infer` does (issue 49; it built a runtime of its own, without the agent's sandbox
/// or shared workspace and without the checks): a run whose calls may wait for a person's
/// approval needs a session and is refused before any model call, and an agent whose sessions
/// share one workspace reads it without a session too.
#[tokio::test]
async fn an_ephemeral_cli_run_as_an_agent_is_checked_and_works_as_over_http() {
    let mock = MockProvider::start().await.unwrap();
    let home = home_with_models(&mock).await;
    let home = home.path();
    let add = async |definition: serde_json::Value| {
        let file = home.join("agent.json");
        std::fs::write(&file, definition.to_string()).unwrap();
        let added = agentry(home, &["agents", "add", "--file", file.to_str().unwrap()]).await;
        assert!(added.status.success(), "{}", text(&added.stderr));
    };
    add(
        json!({"id": "careful", "model_id": "mock", "tool_ids": ["current_time"],
               "approvals": {"tools": {"current_time": "always"}}}),
    )
    .await;
    let output = agentry(home, &["run", "--agent", "careful", "--ephemeral", "Time?"]).await;
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("needs a session"), "{stderr}");
    assert_eq!(mock.request_count(), 0, "refused before any model call");

    add(
        json!({"id": "notes", "model_id": "mock", "workspace": "agent",
               "tool_ids": ["write_file", "read_file"]}),
    )
    .await;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "write_file",
        json!({"path": "todo.txt", "content": "buy milk\n"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Noted.")));
    let output = agentry(home, &["run", "--agent", "notes", "Note: buy milk"]).await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "read_file",
        json!({"path": "todo.txt"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("Milk.")));
    let output = agentry(
        home,
        &[
            "run",
            "--agent",
            "notes",
            "--ephemeral",
            "What is on my list?",
        ],
    )
    .await;
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(!stderr.contains("session: "), "{stderr}");
    assert!(text(&output.stdout).contains("Milk."));
    let requests = mock.requests();
    let sent = requests.last().unwrap().body.to_string();
    assert!(
        sent.contains("buy milk"),
        "the shared workspace's file was read: {sent}"
    );
}
