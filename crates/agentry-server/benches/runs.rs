//! Runs benchmark: one table, side by side in one process. Asserts nothing.
//!
//! `cargo bench -p agentry-server --bench runs`
//!
//! Every run is the same two-round tool loop (a tool call, then the answer) against the
//! zero-latency mock provider, with client, server, mock and database on this machine:
//!
//! - `stateless`: `POST /v1/infer` without a session (nothing stored);
//! - `durable`: `POST /v1/infer` in a new session (every step committed);
//! - `background`: `POST /v1/runs` then `GET /v1/runs/{id}/wait` (queued, claimed under a lease,
//!   committed, settled), timed from submission to the answer of the wait.
//!
//! `RUNS_BENCH_ONLY="sqlite durable 20"` runs only the rows whose "backend scenario clients"
//! contains it (for profiling one of them).
//!
//! Each at 1, 20 and 200 concurrent clients, on SQLite and (when `AGENTRY_TEST_DATABASE_URL`
//! names one, in a fresh schema) PostgreSQL. Per run it counts the session-log writes (appends
//! and status changes) and the group commits that carried them (`Store::commit_counts`), and on
//! PostgreSQL every committed transaction (`pg_stat_database.xact_commit`: reads, the queue's
//! claims, leases and settles included). The last line gives durable and background throughput
//! at 20 clients as a share of stateless.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use agentry_app::queue::QueueSettings;
use agentry_server::{AppState, router};
use agentry_store::{ConfigKind, Store, StoreOptions};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use futures::StreamExt;
use serde_json::{Value, json};

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

#[derive(Clone, Copy, PartialEq)]
enum Scenario {
    Stateless,
    Durable,
    Background,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Stateless => "stateless",
            Self::Durable => "durable",
            Self::Background => "background",
        }
    }
}

struct Cell {
    runs_per_sec: f64,
    p50: Duration,
    p99: Duration,
}

async fn serve(store: Store, mock: &MockProvider) -> String {
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "m"}),
        )
        .await
        .unwrap();
    let state = AppState::new(store).await.unwrap();
    state.set_queue_settings(QueueSettings {
        max_concurrent: 256,
        poll: Duration::from_millis(20),
        ..QueueSettings::default()
    });
    state.start_worker();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(state)).await.unwrap() });
    url
}

async fn one_run(http: &reqwest::Client, url: &str, scenario: Scenario) {
    let body = match scenario {
        Scenario::Stateless => json!({"text": "What time is it?", "tool_ids": ["current_time"]}),
        _ => json!({"text": "What time is it?", "tool_ids": ["current_time"], "session_id": "new"}),
    };
    if scenario == Scenario::Background {
        let run: Value = http
            .post(format!("{url}/v1/runs"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = run["run_id"].as_str().expect("a run id");
        let done: Value = http
            .get(format!("{url}/v1/runs/{id}/wait?timeout_secs=120"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(done["state"], "succeeded", "{done}");
    } else {
        let response = http
            .post(format!("{url}/v1/infer"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        let _ = response.bytes().await.unwrap();
    }
}

async fn load(
    url: &str,
    mock: &MockProvider,
    scenario: Scenario,
    clients: usize,
    total: usize,
) -> Cell {
    let http = agentry_llm::http_client(Duration::from_secs(120)).unwrap();
    for _ in 0..total {
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "current_time",
            json!({}),
        )));
        mock.enqueue(Reply::scripted(
            ScriptedTurn::text("It is noon.").with_usage(30, 4),
        ));
    }
    let started = Instant::now();
    let mut latencies: Vec<Duration> = futures::stream::iter(0..total)
        .map(|_| {
            let http = http.clone();
            async move {
                let begun = Instant::now();
                one_run(&http, url, scenario).await;
                begun.elapsed()
            }
        })
        .buffer_unordered(clients)
        .collect()
        .await;
    let elapsed = started.elapsed();
    latencies.sort();
    mock.take_requests();
    Cell {
        runs_per_sec: total as f64 / elapsed.as_secs_f64(),
        p50: percentile(&latencies, 0.5),
        p99: percentile(&latencies, 0.99),
    }
}

fn psql(url: &str, sql: &str) -> String {
    let output = std::process::Command::new("psql")
        .args([url, "-Atqc", sql])
        .output()
        .expect("psql");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

fn commits(url: &str) -> u64 {
    // PostgreSQL flushes its statistics at most once a second.
    std::thread::sleep(Duration::from_millis(1100));
    psql(
        url,
        "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()",
    )
    .parse()
    .unwrap()
}

async fn backend(
    label: &str,
    store: Store,
    pg: Option<&str>,
    stateless_20: &mut Option<f64>,
    shares: &mut Vec<String>,
) {
    let mock = MockProvider::start().await.unwrap();
    let url = serve(store.clone(), &mock).await;
    let only = std::env::var("RUNS_BENCH_ONLY").unwrap_or_default();
    for scenario in [Scenario::Stateless, Scenario::Durable, Scenario::Background] {
        for (clients, total) in [(1, 200), (20, 1000), (200, 1000)] {
            if !format!("{label} {} {clients}", scenario.name()).contains(&only) {
                continue;
            }
            let before = pg.map(commits);
            let log_before = store.commit_counts();
            let cell = load(&url, &mock, scenario, clients, total).await;
            let log = store.commit_counts();
            let writes = (log.writes - log_before.writes) as f64 / total as f64;
            let log_commits = (log.commits - log_before.commits) as f64 / total as f64;
            let per_run = match (pg, before) {
                (Some(pg), Some(before)) => {
                    format!("{:.1}", (commits(pg) - before) as f64 / total as f64)
                }
                _ => "–".to_owned(),
            };
            println!(
                "| {label:<10} | {:<10} | {clients:>7} | {:>8.0} | {:>8.2} | {:>8.2} | {writes:>10.1} | {log_commits:>11.2} | {per_run:>9} |",
                scenario.name(),
                cell.runs_per_sec,
                cell.p50.as_secs_f64() * 1e3,
                cell.p99.as_secs_f64() * 1e3,
            );
            if clients == 20 {
                match scenario {
                    Scenario::Stateless => *stateless_20 = Some(cell.runs_per_sec),
                    _ => {
                        if let Some(base) = stateless_20 {
                            shares.push(format!(
                                "{label} {}: {:.0} %",
                                scenario.name(),
                                100.0 * cell.runs_per_sec / *base
                            ));
                        }
                    }
                }
            }
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        println!(
            "| backend    | scenario   | clients |   runs/s |  p50 ms  |  p99 ms  | writes/run | commits/run | xacts/run |"
        );
        println!(
            "|------------|------------|---------|----------|----------|----------|------------|-------------|-----------|"
        );
        let mut shares = Vec::new();
        let home = tempfile::tempdir().unwrap();
        let mut stateless = None;
        backend(
            "sqlite",
            Store::open_home(home.path()).await.unwrap(),
            None,
            &mut stateless,
            &mut shares,
        )
        .await;
        if let Ok(base) = std::env::var("AGENTRY_TEST_DATABASE_URL") {
            let schema = format!("bench_{}", std::process::id());
            psql(&base, &format!("CREATE SCHEMA {schema}"));
            let separator = if base.contains('?') { '&' } else { '?' };
            let url = format!("{base}{separator}options[search_path]={schema}");
            let key = agentry_store::SecretKey::generate().unwrap();
            let store = Store::connect(&url, StoreOptions::new(key)).await.unwrap();
            let mut stateless = None;
            backend("postgres", store, Some(&base), &mut stateless, &mut shares).await;
            psql(&base, &format!("DROP SCHEMA {schema} CASCADE"));
        } else {
            println!("(PostgreSQL skipped: set AGENTRY_TEST_DATABASE_URL)");
        }
        println!();
        println!(
            "throughput at 20 clients, as a share of stateless: {}",
            shares.join(", ")
        );
    });
}
