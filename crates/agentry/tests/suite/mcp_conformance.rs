//! The MCP project's own conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! `scripts/install-mcp-servers`, run on the Node it brings): its server scenarios against
//! `agentry serve`'s `/mcp`, its client scenarios against Agentry's MCP client (the CLI's
//! `mcp add` and `mcp call`, through `tests/mcp_conformance/client.sh`). The scenarios that do
//! not apply to a server offering agents as tools, and why, are listed in the README.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use agentry_testkit::mcp::McpServers;
use serde_json::{Value, json};

/// The server scenarios that apply to `/mcp`: the handshake, ping, listing tools, several SSE
/// streams at once, and DNS-rebinding protection (Host and Origin checks).
const SERVER_SCENARIOS: &[&str] = &[
    "server-initialize",
    "ping",
    "tools-list",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
];

/// The client scenarios that apply to Agentry's MCP client: the handshake, calling a tool, and
/// resuming an SSE stream the server closed (after its `retry` delay, with `Last-Event-ID`).
const CLIENT_SCENARIOS: &[&str] = &["initialize", "tools_call", "sse-retry"];

/// The suite's CLI: Node and its script.
fn conformance() -> (PathBuf, PathBuf) {
    let npm = McpServers::locate()
        .unwrap()
        .root()
        .join("npm/node_modules");
    let node = npm.join("node/bin/node");
    let script = npm.join("@modelcontextprotocol/conformance/dist/index.js");
    assert!(
        node.exists() && script.exists(),
        "the conformance suite is not installed (scripts/install-mcp-servers)"
    );
    (node, script)
}

/// Every check the suite wrote under `results` (one folder per scenario run).
fn checks(results: &Path) -> Vec<Value> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir(results).unwrap() {
        let file = entry.unwrap().path().join("checks.json");
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|error| panic!("{}: {error}", file.display()));
        let checks: Vec<Value> = serde_json::from_str(&text).unwrap();
        all.extend(checks);
    }
    all
}

/// Runs one scenario; asserts the suite passed it and that every check it made succeeded.
async fn run_scenario(mode: &str, scenario: &str, target: &[&str]) {
    let (node, script) = conformance();
    let results = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(&node)
        .arg(&script)
        .arg(mode)
        .args(target)
        .args(["--scenario", scenario, "-o"])
        .arg(results.path())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let checks = checks(results.path());
    let failed: Vec<&Value> = checks
        .iter()
        .filter(|check| matches!(check["status"].as_str(), Some("FAILURE" | "WARNING")))
        .collect();
    assert!(
        failed.is_empty(),
        "{mode} scenario {scenario}: {failed:#?}\n{said}"
    );
    assert!(
        checks.iter().any(|check| check["status"] == "SUCCESS"),
        "{mode} scenario {scenario} checked nothing: {said}"
    );
    assert!(
        output.status.success(),
        "{mode} scenario {scenario}: {said}"
    );
}

#[tokio::test]
async fn the_mcp_conformance_suites_server_scenarios_pass_against_mcp() {
    let home = tempfile::tempdir().unwrap();
    let port = super::processes::free_port();
    let mut server = super::processes::serve(home.path(), port, &[]);
    super::processes::listening(&mut server).await;
    let base = format!("http://127.0.0.1:{port}");
    let http = agentry_llm::http_client(std::time::Duration::from_secs(10)).unwrap();
    // An agent, so that the tools listed are real ones (`ask_helper`), with a model to name.
    let model = http
        .post(format!("{base}/v1/models"))
        .json(&json!({"id": "m", "protocol": "openai", "base_url": "http://127.0.0.1:9/v1", "model_name": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(model.status().as_u16(), 201);
    let agent = http
        .post(format!("{base}/v1/agents"))
        .json(&json!({"id": "helper", "model_id": "m", "system_prompt": "You help."}))
        .send()
        .await
        .unwrap();
    assert!(agent.status().is_success(), "{:?}", agent.text().await);
    let url = format!("{base}/mcp");
    for scenario in SERVER_SCENARIOS {
        run_scenario("server", scenario, &["--url", &url]).await;
    }
    server.kill().await.unwrap();
}

#[tokio::test]
async fn the_mcp_conformance_suites_client_scenarios_pass_against_agentrys_client() {
    let client = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_conformance/client.sh");
    let command = format!("sh {} {}", client.display(), env!("CARGO_BIN_EXE_agentry"));
    for scenario in CLIENT_SCENARIOS {
        run_scenario("client", scenario, &["--command", &command]).await;
    }
}
