//! `agentry mcp add|list|check|rm`: servers saved in the data folder, checked by starting them.

use std::path::Path;
use std::process::Output;

use agentry_testkit::mcp::McpServers;
use serde_json::json;

async fn agentry(home: &Path, args: &[&str]) -> anyhow::Result<Output> {
    Ok(tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("AGENTRY_DATABASE_URL")
        .output()
        .await?)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Saves the `everything` test server in the data folder `home` (`agentry mcp add`).
async fn add_everything(home: &Path) -> anyhow::Result<()> {
    let spec = McpServers::locate()?.everything();
    let program = spec.program.to_string_lossy().into_owned();
    let mut add = vec!["mcp", "add", "everything", "--no-check", "--"];
    add.push(&program);
    add.extend(spec.args.iter().map(String::as_str));
    assert!(agentry(home, &add).await?.status.success());
    Ok(())
}

/// The names of the tools a model request offered.
fn offered_tools(body: &serde_json::Value) -> Vec<&str> {
    body["tools"]
        .as_array()
        .map(|tools| {
            tools
                .iter()
                .filter_map(|tool| tool["function"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// The content of the first tool result a model request sent back, as JSON text.
fn tool_result_sent(body: &serde_json::Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|messages| messages.iter().find(|message| message["role"] == "tool"))
        .map(|message| message["content"].to_string())
        .unwrap_or_default()
}

#[tokio::test]
async fn mcp_servers_are_added_checked_listed_and_removed() -> anyhow::Result<()> {
    let home = tempfile::tempdir()?;
    let spec = McpServers::locate()?.everything();
    let program = spec.program.to_string_lossy().into_owned();
    let mut args = vec!["mcp", "add", "everything", "--env", "GREETING=hi", "--"];
    args.push(&program);
    args.extend(spec.args.iter().map(String::as_str));
    let added = agentry(home.path(), &args).await?;
    assert!(added.status.success(), "{}", text(&added.stderr));
    let shown = text(&added.stdout);
    assert!(
        shown.contains("everything: connected (2025-11-25)"),
        "{shown}"
    );
    assert!(shown.contains("everything__get-sum"), "{shown}");

    let listed = agentry(home.path(), &["mcp", "list"]).await?;
    assert!(
        text(&listed.stdout).contains("everything  "),
        "{}",
        text(&listed.stdout)
    );

    let checked = agentry(home.path(), &["mcp", "check", "everything"]).await?;
    assert!(checked.status.success());
    assert!(text(&checked.stdout).contains("everything__echo"));

    // Several at once from the usual JSON file; a broken one fails its check, loudly.
    let file = home.path().join("servers.json");
    std::fs::write(
        &file,
        json!({"mcpServers": {
            "again": {"command": program, "args": spec.args},
            "broken": {"command": "/nonexistent/server", "connect_timeout_ms": 2000}
        }})
        .to_string(),
    )?;
    let from_file = agentry(
        home.path(),
        &["mcp", "add", "--file", &file.to_string_lossy()],
    )
    .await?;
    assert!(!from_file.status.success());
    assert!(text(&from_file.stdout).contains("again: connected"));
    assert!(
        text(&from_file.stderr).contains("broken: could not connect"),
        "{}",
        text(&from_file.stderr)
    );

    let removed = agentry(home.path(), &["mcp", "rm", "broken"]).await?;
    assert!(removed.status.success());
    let listed = text(&agentry(home.path(), &["mcp", "list"]).await?.stdout);
    assert!(listed.contains("again") && listed.contains("everything"));
    assert!(!listed.contains("broken"), "{listed}");

    // Bad input is refused before anything is saved.
    for bad in [
        vec!["mcp", "add", "a__b", "--", "x"],
        vec!["mcp", "add", "h", "--url", "ftp://x/"],
        vec!["mcp", "add", "s", "--secret", "K=NOT_SET", "--", "x"],
        vec!["mcp", "add", "n"],
        vec!["mcp", "rm", "nope"],
    ] {
        let refused = agentry(home.path(), &bad).await?;
        assert!(!refused.status.success(), "{bad:?} was accepted");
    }
    let listed = text(&agentry(home.path(), &["mcp", "list"]).await?.stdout);
    assert_eq!(listed.lines().count(), 2, "{listed}");
    Ok(())
}

#[tokio::test]
async fn serve_imports_mcp_json_starts_its_servers_and_stops_them_with_itself() -> anyhow::Result<()>
{
    use tokio::io::AsyncBufReadExt;

    let home = tempfile::tempdir()?;
    // The server runs in a sandbox of its own: the installed servers are shown inside
    // read-only, at their canonical path.
    let root = std::fs::canonicalize(McpServers::locate()?.root())?;
    let spec = McpServers::at(&root)?.everything();
    std::fs::write(
        home.path().join("mcp.json"),
        json!({"mcpServers": {"everything": {"command": spec.program, "args": spec.args}}})
            .to_string(),
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home.path())
        .args(["serve", &format!("127.0.0.1:{port}"), "--sandbox", "native"])
        .arg("--sandbox-ro-mount")
        .arg(&root)
        .env_remove("AGENTRY_DATABASE_URL")
        .env_remove("AGENTRY_ALLOW_HOST_COMMANDS")
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdout = tokio::io::BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?,
    )
    .lines();
    // Listening, console, data, sandbox, fetch, requests, approvals, then the import.
    let mut said = Vec::new();
    while said.len() < 8 {
        let line = tokio::time::timeout(std::time::Duration::from_secs(20), stdout.next_line())
            .await??
            .ok_or_else(|| anyhow::anyhow!("serve exited: {said:?}"))?;
        said.push(line);
    }
    assert!(
        said.iter()
            .any(|line| line.starts_with("mcp: 1 server(s) imported from")),
        "{said:?}"
    );

    let http = agentry_llm::http_client(std::time::Duration::from_secs(5))?;
    let base = format!("http://127.0.0.1:{port}");
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    let pid = loop {
        let servers: serde_json::Value = http
            .get(format!("{base}/v1/mcp-servers"))
            .send()
            .await?
            .json()
            .await?;
        let server = &servers["servers"][0];
        if server["state"] == "connected" {
            assert!(server["tool_count"].as_u64().unwrap_or(0) >= 13, "{server}");
            assert_eq!(server["sandboxed"], true, "{server}");
            break server["pid"].as_u64().unwrap_or(0);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "never connected: {servers}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(pid > 0);

    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().unwrap_or(0).to_string()])
        .status()?;
    assert!(status.success());
    let exit = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait()).await??;
    assert!(exit.success(), "{exit:?}");
    // Its MCP server went with it.
    let gone = !Path::new(&format!("/proc/{pid}")).exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat"))?.contains(") Z ");
    assert!(gone, "the MCP server outlived agentry serve");
    Ok(())
}

#[tokio::test]
async fn run_offers_a_saved_mcp_servers_tools_with_the_mcp_flag() -> anyhow::Result<()> {
    use agentry_testkit::{MockProvider, Reply, ScriptedTurn};

    let home = tempfile::tempdir()?;
    add_everything(home.path()).await?;

    let mock = MockProvider::start().await?;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "everything__get-sum",
        json!({"a": 19, "b": 23}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It is 42.")));
    let base_url = mock.openai_base_url();
    let run = agentry(
        home.path(),
        &[
            "run",
            "19 + 23?",
            "--provider",
            "openai",
            "--base-url",
            &base_url,
            "--model-name",
            "m",
            "--mcp",
            "everything",
        ],
    )
    .await?;
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout).contains("It is 42."),
        "{}",
        text(&run.stdout)
    );
    let requests = mock.requests();
    let offered = offered_tools(&requests[0].body);
    assert!(offered.contains(&"everything__get-sum"), "{offered:?}");
    let tool_result = tool_result_sent(&requests[1].body);
    assert!(tool_result.contains("42"), "{tool_result}");

    // A server that is not saved is a clear error before any model call.
    let missing = agentry(
        home.path(),
        &[
            "run",
            "x",
            "--provider",
            "openai",
            "--base-url",
            &base_url,
            "--model-name",
            "m",
            "--mcp",
            "nope",
            "--ephemeral",
        ],
    )
    .await?;
    assert!(!missing.status.success());
    assert!(
        text(&missing.stderr).contains("no saved MCP server \"nope\""),
        "{}",
        text(&missing.stderr)
    );
    assert_eq!(mock.requests().len(), 2);
    Ok(())
}

/// `agentry run --agent` (through the application since issue 49) offers the agent's saved MCP
/// servers' tools, and starts those servers as the CLI always has: on the host, the operator's
/// own choice on their own terminal (the app alone would refuse a stdio server with no sandbox).
#[tokio::test]
async fn run_as_an_agent_offers_its_mcp_servers_tools() -> anyhow::Result<()> {
    use agentry_testkit::{MockProvider, Reply, ScriptedTurn};

    let home = tempfile::tempdir()?;
    add_everything(home.path()).await?;
    let mock = MockProvider::start().await?;
    let store = agentry_store::Store::open_home(home.path()).await?;
    store
        .put_config(
            agentry_store::ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(),
                    "model_name": "m"}),
        )
        .await?;
    store.close().await;
    let file = home.path().join("summer.json");
    std::fs::write(
        &file,
        json!({"id": "summer", "model_id": "mock", "mcp_servers": ["everything"]}).to_string(),
    )?;
    let added = agentry(
        home.path(),
        &["agents", "add", "--file", file.to_str().unwrap()],
    )
    .await?;
    assert!(added.status.success(), "{}", text(&added.stderr));

    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "everything__get-sum",
        json!({"a": 19, "b": 23}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text("It is 42.")));
    let run = agentry(home.path(), &["run", "--agent", "summer", "19 + 23?"]).await?;
    assert!(run.status.success(), "{}", text(&run.stderr));
    assert!(
        text(&run.stdout).contains("It is 42."),
        "{}",
        text(&run.stdout)
    );
    let requests = mock.requests();
    let offered = offered_tools(&requests[0].body);
    assert!(offered.contains(&"everything__get-sum"), "{offered:?}");
    let tool_result = tool_result_sent(&requests[1].body);
    assert!(tool_result.contains("42"), "{tool_result}");
    Ok(())
}
