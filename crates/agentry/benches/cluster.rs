//! Cluster benchmark: several `agentry serve` nodes (this build's release binary) on one
//! PostgreSQL database (a fresh one, dropped at the end). Prints one table; asserts nothing.
//!
//! `cargo bench -p agentry --bench cluster` (needs `AGENTRY_TEST_DATABASE_URL` or PostgreSQL on
//! 127.0.0.1:5432 with a database `test`, and `psql`).
//!
//! - **throughput**: 400 durable runs (`POST /v1/infer` in a new session, one call of the
//!   zero-latency mock), 20 clients spread round-robin over 1, 2 and 3 nodes; runs/s, p50 and
//!   p99.
//! - **failover**: 20 times, a background run whose model call hangs is started, its node is
//!   killed (`kill -9`), and the time until another node runs it is measured (default settings:
//!   a 4 s lease, a heartbeat every second, claims every 250 ms); the killed node is restarted.
//! - **relay**: one streaming run (40 deltas, 25 ms apart) read at once from the node running
//!   it and from another node, which relays it; the added latency per delta.
//!
//! `CLUSTER_BENCH_ONLY=throughput|failover|relay` runs one part.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use agentry_testkit::{Chunking, MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

fn base_url() -> String {
    std::env::var("AGENTRY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned())
}

fn psql(url: &str, sql: &str) {
    let status = std::process::Command::new("psql")
        .args([url, "-Atqc", sql])
        .stdout(Stdio::null())
        .status()
        .expect("psql runs");
    assert!(status.success(), "psql {sql}");
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

/// A fresh database and the data folders of its nodes (one secret key, one workspaces folder).
struct Cluster {
    name: String,
    url: String,
    root: tempfile::TempDir,
}

impl Cluster {
    fn new() -> Self {
        let name = format!("cluster_bench_{:016x}", fastrand::u64(..));
        psql(&base_url(), &format!("CREATE DATABASE {name}"));
        let base = base_url();
        let (server, _) = base.rsplit_once('/').unwrap();
        let url = format!("{server}/{name}");
        let root = tempfile::tempdir().unwrap();
        agentry_store::SecretKey::load_or_create(&root.path().join("secret.key")).unwrap();
        Self { name, url, root }
    }

    fn home(&self, id: &str) -> PathBuf {
        let home = self.root.path().join(id);
        if !home.exists() {
            std::fs::create_dir_all(&home).unwrap();
            std::fs::copy(self.root.path().join("secret.key"), home.join("secret.key")).unwrap();
        }
        home
    }

    async fn start(&self, id: &str) -> Node {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let mut child = spawn(
            &self.home(id),
            &self.url,
            &self.root.path().join("ws"),
            id,
            port,
        );
        let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(first.starts_with("Agentry is listening"), "{first}");
        tokio::spawn(async move { while let Ok(Some(_)) = stdout.next_line().await {} });
        Node {
            port,
            child,
            id: id.into(),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("psql")
            .args([
                &base_url(),
                "-Atqc",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name),
            ])
            .output();
    }
}

fn spawn(home: &Path, url: &str, workspaces: &Path, id: &str, port: u16) -> tokio::process::Child {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"))
        .arg("--home")
        .arg(home)
        .args(["--database-url", url, "serve", &format!("127.0.0.1:{port}")])
        .args(["--node-id", id, "--sandbox", "off", "--approve", "none"])
        .arg("--workspaces")
        .arg(workspaces)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

struct Node {
    port: u16,
    child: tokio::process::Child,
    id: String,
}

impl Node {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

fn client() -> reqwest::Client {
    agentry_llm::http_client(Duration::from_secs(120)).unwrap()
}

async fn add_model(node: &Node, mock: &MockProvider) {
    let status = client()
        .post(format!("{}/v1/models", node.base()))
        .json(&json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "x"}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 201);
    tokio::time::sleep(Duration::from_millis(600)).await;
}

/// 400 durable two-round runs from 20 clients spread over `nodes`: (runs/s, p50, p99).
async fn throughput(nodes: &[&Node]) -> (f64, Duration, Duration) {
    const RUNS: usize = 400;
    const CLIENTS: usize = 20;
    let http = client();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let bases: Vec<String> = nodes.iter().map(|node| node.base()).collect();
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for worker in 0..CLIENTS {
        let http = http.clone();
        let next = std::sync::Arc::clone(&next);
        let base = bases[worker % bases.len()].clone();
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < RUNS {
                let begun = Instant::now();
                let response = http
                    .post(format!("{base}/v1/infer"))
                    .json(&json!({"session_id": "new", "model_id": "m", "text": "go"}))
                    .send()
                    .await
                    .unwrap();
                assert!(response.status().is_success(), "{}", response.status());
                let _ = response.bytes().await.unwrap();
                latencies.push(begun.elapsed());
            }
            latencies
        });
    }
    let mut latencies = Vec::new();
    while let Some(done) = tasks.join_next().await {
        latencies.extend(done.unwrap());
    }
    let elapsed = started.elapsed();
    latencies.sort();
    (
        latencies.len() as f64 / elapsed.as_secs_f64(),
        percentile(&latencies, 0.5),
        percentile(&latencies, 0.99),
    )
}

/// The node a background run is running on, once it runs.
async fn owner(node: &Node, run: &str, not: Option<&str>) -> (String, Instant) {
    let http = client();
    loop {
        let view: Value = http
            .get(format!("{}/v1/runs/{run}", node.base()))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if let Some(worker) = view["worker"].as_str() {
            let id = worker.split('/').next().unwrap().to_owned();
            if Some(id.as_str()) != not {
                return (id, Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn failover(cluster: &Cluster, mock: &MockProvider, rounds: usize) -> Vec<Duration> {
    let mut nodes = [cluster.start("f1").await, cluster.start("f2").await];
    add_model(&nodes[0], mock).await;
    let mut times = Vec::new();
    for _ in 0..rounds {
        mock.clear_queue();
        mock.set_fallback(
            Reply::scripted(ScriptedTurn::text("late")).delay_headers(Duration::from_secs(60)),
        );
        let run: Value = client()
            .post(format!("{}/v1/runs", nodes[0].base()))
            .json(&json!({"model_id": "m", "text": "hang"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let run = run["run_id"].as_str().unwrap().to_owned();
        let (first, _) = owner(&nodes[0], &run, None).await;
        let index = nodes.iter().position(|node| node.id == first).unwrap();
        let survivor = 1 - index;
        // Wait for a heartbeat or two, as in real life, then kill.
        tokio::time::sleep(Duration::from_millis(300 + fastrand::u64(..1000))).await;
        nodes[index].child.start_kill().unwrap();
        nodes[index].child.wait().await.unwrap();
        let killed = Instant::now();
        let (_, taken) = owner(&nodes[survivor], &run, Some(&first)).await;
        times.push(taken - killed);
        // Let the run end, and bring the node back.
        mock.clear_fallback();
        mock.set_fallback(Reply::scripted(ScriptedTurn::text("done")));
        let _ = client()
            .post(format!("{}/v1/runs/{run}/cancel", nodes[survivor].base()))
            .send()
            .await;
        nodes[index] = cluster.start(&first).await;
    }
    times.sort();
    times
}

/// Added latency per delta of a stream read through another node: (mean, p99, deltas).
async fn relay(cluster: &Cluster, mock: &MockProvider) -> (Duration, Duration, usize) {
    let nodes = [cluster.start("r1").await, cluster.start("r2").await];
    add_model(&nodes[0], mock).await;
    let words: String = (0..40).map(|n| format!("w{n} ")).collect();
    mock.clear_queue();
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text(words))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(25))
            .delay_headers(Duration::from_millis(500)),
    );
    let run: Value = client()
        .post(format!("{}/v1/runs", nodes[0].base()))
        .json(&json!({"model_id": "m", "text": "stream"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run = run["run_id"].as_str().unwrap().to_owned();
    let (first, _) = owner(&nodes[0], &run, None).await;
    let (local, remote) = if nodes[0].id == first {
        (&nodes[0], &nodes[1])
    } else {
        (&nodes[1], &nodes[0])
    };
    let path = format!("/v1/runs/{run}/stream");
    let (direct, relayed) = tokio::join!(arrivals(local, &path), arrivals(remote, &path));
    let mut added: Vec<Duration> = direct
        .iter()
        .zip(&relayed)
        .map(|(a, b)| b.saturating_duration_since(*a))
        .collect();
    let count = added.len();
    let mean = added.iter().sum::<Duration>() / count.max(1) as u32;
    added.sort();
    (mean, percentile(&added, 0.99), count)
}

/// When each `delta.text` event of a stream arrived.
async fn arrivals(node: &Node, path: &str) -> Vec<Instant> {
    use futures::StreamExt as _;
    let response = client()
        .get(format!("{}{path}", node.base()))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let mut buffer = String::new();
    let mut times = Vec::new();
    while let Some(chunk) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
        while let Some(end) = buffer.find("\n\n") {
            let block: String = buffer.drain(..end + 2).collect();
            if block.contains("event: delta.text") {
                times.push(Instant::now());
            }
        }
    }
    times
}

#[tokio::main]
async fn main() {
    let only = std::env::var("CLUSTER_BENCH_ONLY").unwrap_or_default();
    let wants = |part: &str| only.is_empty() || only == part;
    let mock = MockProvider::start().await.unwrap();
    println!("| measure | 1 node | 2 nodes | 3 nodes |");
    println!("|---|---|---|---|");
    if wants("throughput") {
        let cluster = Cluster::new();
        let nodes = [
            cluster.start("t1").await,
            cluster.start("t2").await,
            cluster.start("t3").await,
        ];
        add_model(&nodes[0], &mock).await;
        mock.clear_queue();
        mock.set_fallback(Reply::scripted(ScriptedTurn::text("done")));
        let mut cells = Vec::new();
        for count in 1..=3 {
            let chosen: Vec<&Node> = nodes.iter().take(count).collect();
            cells.push(throughput(&chosen).await);
        }
        println!(
            "| durable runs/s, 20 clients | {:.0} | {:.0} | {:.0} |",
            cells[0].0, cells[1].0, cells[2].0
        );
        println!(
            "| p50 / p99 | {} / {} | {} / {} | {} / {} |",
            ms(cells[0].1),
            ms(cells[0].2),
            ms(cells[1].1),
            ms(cells[1].2),
            ms(cells[2].1),
            ms(cells[2].2)
        );
    }
    if wants("failover") {
        let cluster = Cluster::new();
        let times = failover(&cluster, &mock, 20).await;
        println!(
            "| failover after kill -9, 20 kills (lease 4 s) | p50 {} | p90 {} | max {} |",
            ms(percentile(&times, 0.5)),
            ms(percentile(&times, 0.9)),
            ms(*times.last().unwrap())
        );
    }
    if wants("relay") {
        let cluster = Cluster::new();
        let (mean, p99, count) = relay(&cluster, &mock).await;
        println!(
            "| added latency per delta relayed across nodes ({count} deltas) | mean {} µs | p99 {} µs | |",
            mean.as_micros(),
            p99.as_micros()
        );
    }
}
