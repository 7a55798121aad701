//! What an MCP tool call costs through Agentry beyond the server's own time.
//!
//! For each transport, the same `echo` call on the same real server (server-everything) is
//! timed two ways: with a minimal raw JSON-RPC client written here (newline-delimited JSON on the
//! child's pipes; plain HTTP POSTs with the session header), which is as close to "the server's
//! own time" as a client gets, and through [`McpManager::call_tool`]. The difference is
//! Agentry's overhead (rmcp, supervision, progress routing, result conversion).
//!
//! Run: `cargo bench -p agentry-mcp --bench call` (needs `scripts/install-mcp-servers`).
//! `AGENTRY_BENCH_CALLS` sets the calls per measurement (default 2000).

use std::process::Stdio;
use std::time::{Duration, Instant};

use agentry_mcp::{CallOptions, McpManager, McpServerConfig, ServerState};
use agentry_testkit::mcp::McpServers;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

struct Summary {
    p50: Duration,
    p99: Duration,
}

fn summarise(mut samples: Vec<Duration>) -> Summary {
    samples.sort();
    Summary {
        p50: percentile(&samples, 0.50),
        p99: percentile(&samples, 0.99),
    }
}

fn micros(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e6
}

fn row(transport: &str, raw: &Summary, ours: &Summary) {
    println!(
        "| {transport:<15} | {:>8.0} | {:>8.0} | {:>8.0} | {:>8.0} | {:>9.0} | {:>9.0} |",
        micros(raw.p50),
        micros(raw.p99),
        micros(ours.p50),
        micros(ours.p99),
        micros(ours.p50.saturating_sub(raw.p50)),
        micros(ours.p99.saturating_sub(raw.p99)),
    );
}

/// A raw stdio client: one child, requests written as lines, answers read as lines.
async fn raw_stdio(servers: &McpServers, calls: usize) -> Result<Vec<Duration>> {
    let spec = servers.everything();
    let mut child = spec
        .command()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let mut lines = BufReader::new(child.stdout.take().ok_or("no stdout")?).lines();
    let mut next_id = 0u64;
    let mut request = async |method: &str, params: Value| -> Result<Value> {
        if method.starts_with("notifications/") {
            let line = json!({"jsonrpc": "2.0", "method": method});
            stdin.write_all(format!("{line}\n").as_bytes()).await?;
            return Ok(Value::Null);
        }
        next_id += 1;
        let line = json!({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params});
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        loop {
            let answer = lines.next_line().await?.ok_or("the server exited")?;
            let value: Value = serde_json::from_str(&answer)?;
            if value["id"] == json!(next_id) {
                return Ok(value);
            }
        }
    };
    request(
        "initialize",
        json!({"protocolVersion": "2025-11-25", "capabilities": {},
               "clientInfo": {"name": "bench", "version": "0"}}),
    )
    .await?;
    request("notifications/initialized", Value::Null).await?;
    let mut samples = Vec::with_capacity(calls);
    for index in 0..calls + calls / 10 {
        let started = Instant::now();
        let answer = request(
            "tools/call",
            json!({"name": "echo", "arguments": {"message": "bench"}}),
        )
        .await?;
        let elapsed = started.elapsed();
        if answer["result"]["content"][0]["text"] != "Echo: bench" {
            return Err(format!("unexpected answer {answer}").into());
        }
        if index >= calls / 10 {
            samples.push(elapsed);
        }
    }
    Ok(samples)
}

/// A raw HTTP client: initialize, then one POST per call, reading the whole (SSE) body.
async fn raw_http(url: &str, calls: usize) -> Result<Vec<Duration>> {
    let http = reqwest::Client::builder().tcp_nodelay(true).build()?;
    let accept = "application/json, text/event-stream";
    let initialised = http
        .post(url)
        .header("accept", accept)
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                      "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "bench", "version": "0"}}}))
        .send()
        .await?;
    let session = initialised
        .headers()
        .get("mcp-session-id")
        .ok_or("no session id")?
        .to_str()?
        .to_owned();
    initialised.bytes().await?;
    http.post(url)
        .header("accept", accept)
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-11-25")
        .json(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .send()
        .await?
        .bytes()
        .await?;
    let mut samples = Vec::with_capacity(calls);
    for index in 0..calls + calls / 10 {
        let started = Instant::now();
        let body = http
            .post(url)
            .header("accept", accept)
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
            .json(
                &json!({"jsonrpc": "2.0", "id": index + 2, "method": "tools/call",
                          "params": {"name": "echo", "arguments": {"message": "bench"}}}),
            )
            .send()
            .await?
            .text()
            .await?;
        let elapsed = started.elapsed();
        if !body.contains("Echo: bench") {
            return Err(format!("unexpected answer {body}").into());
        }
        if index >= calls / 10 {
            samples.push(elapsed);
        }
    }
    Ok(samples)
}

async fn through_manager(config: McpServerConfig, calls: usize) -> Result<Vec<Duration>> {
    // The benchmark measures the protocol path: the server runs on the host, as asked here.
    let manager = McpManager::with_stdio(agentry_mcp::StdioPolicy::host());
    manager.add("bench", config, &|_| None).await?;
    let status = manager.wait_ready("bench", Duration::from_secs(60)).await?;
    if status.state != ServerState::Connected {
        return Err(format!("the server did not connect: {status:?}").into());
    }
    let mut samples = Vec::with_capacity(calls);
    for index in 0..calls + calls / 10 {
        let started = Instant::now();
        let result = manager
            .call_tool(
                "bench",
                "echo",
                json!({"message": "bench"}),
                CallOptions::default(),
            )
            .await?;
        let elapsed = started.elapsed();
        if result.is_error {
            return Err(format!("unexpected result {result:?}").into());
        }
        if index >= calls / 10 {
            samples.push(elapsed);
        }
    }
    manager.shutdown().await;
    Ok(samples)
}

#[tokio::main]
async fn main() -> Result<()> {
    let calls: usize = std::env::var("AGENTRY_BENCH_CALLS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(2000);
    let servers = McpServers::locate()?;
    println!(
        "MCP tool call overhead: `echo` on server-everything, {calls} calls each (after 10% warm-up), µs"
    );
    println!();
    println!(
        "| transport       | raw p50  | raw p99  | ours p50 | ours p99 | +p50      | +p99      |"
    );
    println!(
        "|-----------------|----------|----------|----------|----------|-----------|-----------|"
    );

    let spec = servers.everything();
    let stdio_config = McpServerConfig::stdio(spec.program.to_string_lossy(), spec.args.clone());
    let raw = summarise(raw_stdio(&servers, calls).await?);
    let ours = summarise(through_manager(stdio_config, calls).await?);
    row("stdio", &raw, &ours);

    let http = servers.start_everything_http().await?;
    let raw = summarise(raw_http(http.url(), calls).await?);
    let ours = summarise(through_manager(McpServerConfig::http(http.url()), calls).await?);
    row("streamable HTTP", &raw, &ours);
    Ok(())
}
