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
//! Each row begins with one run per client that is not counted (connections open, statements
//! are prepared), so that a row run alone (`RUNS_BENCH_ONLY`) measures the same steady state
//! as one run after the others.
//!
//! Then `streams`: 1,000 streaming runs at once (`POST /v1/infer/stream`, without a session,
//! then in new sessions on SQLite, each on a fresh server), each answer paced by the mock at 50 ms between its SSE events. The server runs in a
//! child process (this binary again), so its peak RSS is Agentry's alone; the ideal is the time
//! one paced answer takes straight from the mock, asked for as Agentry's client asks (the same
//! 18 events). It also gives when the first text delta came
//! (the start's share of the latency) and the CPU time of the server and of this process (client
//! and mock), with how busy that kept the machine's cores. Its first row, `mock only`, is the
//! same 1,000 answers at once straight from the mock, without Agentry: the floor that this
//! client and mock set on this machine (their own start-up of 1,000 connections at once), which
//! no server between them can go under; `p99 / mock only` gives what Agentry adds to it. The
//! next row, `proxy only`, sends the same streams through a bare pass-through child (axum and
//! reqwest, as Agentry's, passing the mock's bytes on unparsed): what any server in the middle
//! costs here (a second connection per stream), the floor for the Agentry rows after it. The
//! same four rows follow with the 1,000 streams arriving one after another over 0.5 s (one
//! every 0.5 ms) instead of in one instant: all 1,000 are still live together, from when the
//! last arrives until the first ends, but the start-up of their connections is spread; each is
//! timed from its own start. To compare two builds' RSS, drop the
//! page cache first (`echo 1 > /proc/sys/vm/drop_caches`): a binary just built or copied is
//! cached in large blocks and starts with about 8 MiB more file-backed RSS than one read from
//! disk.
//!
//! `RUNS_BENCH_ONLY="sqlite durable 20"` runs only the rows whose "backend scenario clients;"
//! contains it (for profiling one of them; `"sqlite durable 20;"` leaves out the 200-client
//! row). Under `valgrind --tool=callgrind` (about 50 times slower, every thread's instructions
//! counted) such a row gives a cost per run that, unlike time, does not drift with the
//! machine's load: the way to compare two builds on a shared machine. `RUNS_BENCH_SQL=1` also prints, after each row, the
//! SQL statements the store ran per run, by statement (counted from sqlx's query log, which
//! costs time: the throughput of such a run is not comparable).
//!
//! Each at 1, 20 and 200 concurrent clients, on SQLite and (when `AGENTRY_TEST_DATABASE_URL`
//! names one, in a fresh schema) PostgreSQL. Per run it counts the session-log writes (appends
//! and status changes) and the group commits that carried them (`Store::commit_counts`), with
//! how busy the group-commit writer was over the row (its batches' time over the wall time), and on
//! PostgreSQL every committed transaction (`pg_stat_database.xact_commit`: reads, the queue's
//! claims, leases and settles included, as the backends report them: one in steady use reports
//! at most once a second, so the group-commit writer's connections, which it keeps from batch
//! to batch, are mostly missing from a row of a second or two). It also gives the CPU time per run of this process
//! (client, mock and server: on a shared machine a steadier measure of cost than throughput)
//! and, on PostgreSQL, of the database's processes. The line after the table gives durable and background throughput
//! at 20 clients as a share of stateless, from those rows. The machine's speed drifts over
//! seconds, and those two rows are seconds apart: the lines after it compare durable with
//! stateless again in 7 pairs of 400-run slices run back to back, each pair within itself, and
//! give the median share with its range and the median durable throughput (`RUNS_BENCH_ONLY=
//! "sqlite paired"` runs only that).

// They await whole futures on purpose: nothing keeps them per request in flight, as a
// handler's is (the crate's 2 KiB `future-size-threshold`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::large_futures)]

use std::time::{Duration, Instant};

use agentry_app::queue::QueueSettings;
use agentry_server::{AppState, router};
use agentry_store::{ConfigKind, Store, StoreOptions};
use agentry_testkit::{Chunking, MockProvider, Reply, ScriptedTurn};
use futures::StreamExt;
use serde_json::{Value, json};

/// Counts sqlx's query-log events by the statement's first words (`RUNS_BENCH_SQL=1`).
#[derive(Default)]
struct StatementCounter {
    counts: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl StatementCounter {
    /// The counts so far, emptied.
    fn take(&self) -> std::collections::BTreeMap<String, u64> {
        std::mem::take(&mut *self.counts.lock().unwrap())
    }
}

struct StatementVisitor(Option<String>);

impl tracing::field::Visit for StatementVisitor {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "db.statement" {
            self.0 = Some(value.split_whitespace().collect::<Vec<_>>().join(" "));
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "db.statement" {
            self.record_str(field, &format!("{value:?}"));
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for &'static StatementCounter {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut visitor = StatementVisitor(None);
        event.record(&mut visitor);
        if let Some(statement) = visitor.0 {
            let key: String = statement.trim_matches('"').chars().take(90).collect();
            *self.counts.lock().unwrap().entry(key).or_default() += 1;
        }
    }
}

/// The statement counter, when `RUNS_BENCH_SQL` is set.
fn statement_counter() -> Option<&'static StatementCounter> {
    static COUNTER: std::sync::OnceLock<Option<&'static StatementCounter>> =
        std::sync::OnceLock::new();
    *COUNTER.get_or_init(|| {
        std::env::var_os("RUNS_BENCH_SQL")?;
        let counter: &'static StatementCounter = Box::leak(Box::default());
        use tracing_subscriber::{Layer as _, layer::SubscriberExt};
        let subscriber = tracing_subscriber::registry().with(
            counter.with_filter(
                tracing_subscriber::filter::Targets::new()
                    .with_target("sqlx::query", tracing::Level::TRACE),
            ),
        );
        tracing::subscriber::set_global_default(subscriber).unwrap();
        Some(counter)
    })
}

/// CPU seconds (user and system) the processes `pids` have used, from `/proc/<pid>/stat`.
fn cpu_seconds(pids: impl IntoIterator<Item = String>) -> f64 {
    // utime and stime are the 14th and 15th fields, in clock ticks (100 a second on Linux);
    // the command name (2nd) is in parentheses and may hold spaces.
    let ticks: u64 = pids
        .into_iter()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/stat")).ok())
        .filter_map(|stat| {
            let rest = &stat[stat.rfind(')')? + 2..];
            let fields: Vec<&str> = rest.split_whitespace().collect();
            Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
        })
        .sum();
    ticks as f64 / 100.0
}

/// The CPU seconds of this process (client, mock and server), and of PostgreSQL's processes
/// on this machine.
fn cpu_now() -> (f64, f64) {
    let postgres = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|comm| comm.trim() == "postgres")
        });
    (cpu_seconds(["self".to_owned()]), cpu_seconds(postgres))
}

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
    state.app.set_queue_settings(QueueSettings {
        max_concurrent: 256,
        poll: Duration::from_millis(20),
        ..QueueSettings::default()
    });
    state.app.start_worker();
    let listener = agentry_server::listen(([127, 0, 0, 1], 0).into()).unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(
            agentry_server::without_delay(listener),
            router(state).into_make_service(),
        )
        .await
        .unwrap()
    });
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
    paired: &mut Vec<String>,
) {
    let mock = MockProvider::start().await.unwrap();
    let url = serve(store.clone(), &mock).await;
    let only = std::env::var("RUNS_BENCH_ONLY").unwrap_or_default();
    for scenario in [Scenario::Stateless, Scenario::Durable, Scenario::Background] {
        for (clients, total) in [(1, 200), (20, 1000), (200, 1000)] {
            if !format!("{label} {} {clients};", scenario.name()).contains(&only) {
                continue;
            }
            // One run per client first, not counted: connections (HTTP, the store's) open and
            // statements are prepared before the clock starts.
            load(&url, &mock, scenario, clients, clients).await;
            let before = pg.map(commits);
            let log_before = store.commit_counts();
            let cpu_before = cpu_now();
            if let Some(counter) = statement_counter() {
                counter.take();
            }
            let cell = load(&url, &mock, scenario, clients, total).await;
            let cpu_after = cpu_now();
            let cpu_ms = |after: f64, before: f64| 1e3 * (after - before) / total as f64;
            let cpu = cpu_ms(cpu_after.0, cpu_before.0);
            let pg_cpu = match pg {
                Some(_) => format!("{:.2}", cpu_ms(cpu_after.1, cpu_before.1)),
                None => "–".to_owned(),
            };
            let log = store.commit_counts();
            let writes = (log.writes - log_before.writes) as f64 / total as f64;
            let log_commits = (log.commits - log_before.commits) as f64 / total as f64;
            // The writer's time over the row's wall time (PostgreSQL: summed over the batches
            // in flight, so up to 400 %).
            let busy = 100.0 * (log.busy_micros - log_before.busy_micros) as f64 * 1e-6
                / (total as f64 / cell.runs_per_sec);
            let per_run = match (pg, before) {
                (Some(pg), Some(before)) => {
                    format!("{:.1}", (commits(pg) - before) as f64 / total as f64)
                }
                _ => "–".to_owned(),
            };
            println!(
                "| {label:<10} | {:<10} | {clients:>7} | {:>8.0} | {:>8.2} | {:>8.2} | {cpu:>10.3} | {pg_cpu:>13} | {writes:>10.1} | {log_commits:>11.2} | {busy:>9.0} % | {per_run:>9} |",
                scenario.name(),
                cell.runs_per_sec,
                cell.p50.as_secs_f64() * 1e3,
                cell.p99.as_secs_f64() * 1e3,
            );
            if let Some(counter) = statement_counter() {
                let counts = counter.take();
                let all: u64 = counts.values().sum();
                println!("  statements per run: {:.1}", all as f64 / total as f64);
                let mut counts: Vec<_> = counts.into_iter().collect();
                counts.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
                for (statement, count) in counts {
                    println!("  {:>6.2}  {statement}", count as f64 / total as f64);
                }
            }
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
    if format!("{label} paired;").contains(&only) {
        paired.push(paired_share(label, &url, &mock).await);
    }
}

/// Slices of the paired comparison, and runs in each.
const PAIRS: usize = 7;
const PAIR_RUNS: usize = 400;

/// Durable against stateless at 20 clients, in `PAIRS` pairs of short slices run back to back
/// (which of the two goes first alternates): the machine's speed drifts over seconds, so each
/// pair is compared within itself, and the median pair is reported with the range. The two
/// rows of the table above are seconds apart, and their ratio moves with the drift.
async fn paired_share(label: &str, url: &str, mock: &MockProvider) -> String {
    // Warm, as a row is (when run alone).
    for scenario in [Scenario::Stateless, Scenario::Durable] {
        load(url, mock, scenario, 20, 20).await;
    }
    let mut shares = Vec::with_capacity(PAIRS);
    let mut durable = Vec::with_capacity(PAIRS);
    for pair in 0..PAIRS {
        let order = if pair % 2 == 0 {
            [Scenario::Stateless, Scenario::Durable]
        } else {
            [Scenario::Durable, Scenario::Stateless]
        };
        let mut rates = [0.0; 2];
        for scenario in order {
            let cell = load(url, mock, scenario, 20, PAIR_RUNS).await;
            rates[usize::from(scenario == Scenario::Durable)] = cell.runs_per_sec;
        }
        shares.push(rates[1] / rates[0]);
        durable.push(rates[1]);
    }
    shares.sort_by(f64::total_cmp);
    durable.sort_by(f64::total_cmp);
    format!(
        "{label}: share median {:.0} % (range {:.0}–{:.0} %), durable median {:.0} runs/s (range {:.0}–{:.0})",
        100.0 * shares[PAIRS / 2],
        100.0 * shares[0],
        100.0 * shares[PAIRS - 1],
        durable[PAIRS / 2],
        durable[0],
        durable[PAIRS - 1],
    )
}

/// Runs concurrently, events apart, for the streams table.
const STREAMS: usize = 1000;
const PACE: Duration = Duration::from_millis(50);

/// The answer each stream gets, word by word: 14 words, 18 SSE events (a role chunk, 14
/// words, the finish, the usage Agentry's client asks for, `[DONE]`): 17 paces.
fn paced_answer() -> Reply {
    Reply::scripted(
        ScriptedTurn::text(
            "one two three four five six seven eight nine ten eleven twelve thirteen fourteen",
        )
        .with_usage(30, 14),
    )
    .chunked(Chunking::SseEvents)
    .paced(PACE)
}

/// The request for an answer straight from the mock: as Agentry's OpenAI client asks for it,
/// with the usage chunk (`stream_options.include_usage`), so the ideal and the `mock only` row
/// time the same 18 events, 17 paces, that the server receives (without it the answer is one
/// event and one pace shorter, and every ratio to the ideal came out one pace too high).
fn direct_request() -> serde_json::Value {
    json!({
        "model": "m",
        "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": "x"}],
    })
}

/// Asks the mock at `url` (its `/chat/completions`) for the paced answer, as [`direct_request`].
async fn ask_mock(http: &reqwest::Client, url: &str) -> reqwest::Response {
    http.post(url).json(&direct_request()).send().await.unwrap()
}

/// What a streams row's child server is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Through {
    /// A bare pass-through: each request answered with the mock's answer, byte for byte (no
    /// parsing, no run): what any server between this client and the mock costs here.
    Proxy,
    /// Agentry, runs without a session.
    NoSession,
    /// Agentry, each run in a new session (SQLite).
    NewSessions,
}

impl Through {
    fn name(self) -> &'static str {
        match self {
            Self::Proxy => "proxy only",
            Self::NoSession => "no session",
            Self::NewSessions => "new sessions",
        }
    }

    /// The variable that makes this binary that child, set to the mock's URL.
    fn child_variable(self) -> &'static str {
        match self {
            Self::Proxy => "RUNS_BENCH_PROXY",
            Self::NoSession | Self::NewSessions => "RUNS_BENCH_SERVE",
        }
    }
}

/// The `proxy only` child: answers every `POST /v1/infer/stream` with the mock's streamed
/// answer, passed through as it comes (the same client and listener as Agentry's), prints its
/// address, and runs until killed.
async fn serve_proxy(mock_url: String) {
    let http = agentry_llm::http_client(Duration::from_secs(120)).unwrap();
    let url = format!("{mock_url}/chat/completions");
    let app = axum::Router::new().route(
        "/v1/infer/stream",
        axum::routing::post(move || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let answer = ask_mock(&http, &url).await;
                axum::response::Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(axum::body::Body::from_stream(answer.bytes_stream()))
                    .unwrap()
            }
        }),
    );
    let listener = agentry_server::listen(([127, 0, 0, 1], 0).into()).unwrap();
    println!("http://{}", listener.local_addr().unwrap());
    axum::serve(agentry_server::without_delay(listener), app)
        .await
        .unwrap();
}

/// The child: serves Agentry on SQLite with the mock at `mock_url`, prints its address, and
/// runs until killed.
async fn serve_child(mock_url: String) {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock_url, "model_name": "m"}),
        )
        .await
        .unwrap();
    let state = AppState::new(store).await.unwrap();
    // As `agentry serve` listens.
    let listener = agentry_server::listen(([127, 0, 0, 1], 0).into()).unwrap();
    println!("http://{}", listener.local_addr().unwrap());
    axum::serve(
        agentry_server::without_delay(listener),
        router(state).into_make_service(),
    )
    .await
    .unwrap();
}

/// A process's `VmRSS` or `VmHWM` (peak), in MiB.
fn memory_mib(pid: u32, field: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|line| line.starts_with(field)).unwrap();
    let kib: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib / 1024.0
}

/// The streams table: 1,000 paced streaming runs at once against a child server, without a
/// session and in new sessions, each on a fresh server.
async fn streams() {
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(paced_answer());
    let http = agentry_llm::http_client(Duration::from_secs(120)).unwrap();
    // The ideal: one paced answer straight from the mock.
    let begun = Instant::now();
    let direct = ask_mock(
        &http,
        &format!("{}/chat/completions", mock.openai_base_url()),
    )
    .await
    .bytes()
    .await
    .unwrap();
    let ideal = begun.elapsed();
    assert!(direct.ends_with(b"data: [DONE]\n\n"));
    let events = direct
        .windows(6)
        .filter(|window| window == b"data: ")
        .count();
    assert_eq!(
        events, 18,
        "the answer the server gets: 17 chunks and [DONE]"
    );
    println!();
    println!(
        "| streams | arriving | runs | ideal s | p50 s | p99 s | p99 / ideal | p99 / mock only | first delta p50 / p99 s | all done s | server CPU s | client + mock CPU s | cores busy | server idle RSS MiB | server peak RSS MiB | KiB per stream |"
    );
    println!(
        "|---------|----------|------|---------|-------|-------|-------------|-----------------|-------------------------|------------|--------------|---------------------|------------|---------------------|---------------------|----------------|"
    );
    for spread in [Duration::ZERO, SPREAD] {
        let floor = mock_only_row(&mock, &http, ideal, spread).await;
        for through in [Through::Proxy, Through::NoSession, Through::NewSessions] {
            streams_row(&mock, &http, ideal, floor, spread, through).await;
        }
    }
    println!(
        "(server, client and mock share {} cores; `cores busy` is their CPU time over the time all streams took)",
        cores()
    );
}

fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// How long the streams of the table's second half take to arrive, one after another at even
/// intervals: all of them are still live when the last arrives (each lasts the ideal, longer).
const SPREAD: Duration = Duration::from_millis(500);

/// The `arriving` cell of a row: all at once, or over `spread`.
fn arriving(spread: Duration) -> String {
    if spread.is_zero() {
        "at once".to_owned()
    } else {
        format!("in {:.1} s", spread.as_secs_f64())
    }
}

/// The first word of [`paced_answer`], as the mock's first text delta carries it.
const FIRST_WORD: &[u8] = b"\"one\"";

/// The `mock only` row: the same streams arriving the same way (see [`all_live`]), straight
/// from the mock. Returns its p99.
async fn mock_only_row(
    mock: &MockProvider,
    http: &reqwest::Client,
    ideal: Duration,
    spread: Duration,
) -> Duration {
    let url = format!("{}/chat/completions", mock.openai_base_url());
    let cpu_before = cpu_seconds(["self".to_owned()]);
    let started = Instant::now();
    let (latencies, firsts) = all_live(spread, || async {
        let begun = Instant::now();
        read_mock_answer(ask_mock(http, &url).await, begun).await
    })
    .await;
    let elapsed = started.elapsed();
    let cpu = cpu_seconds(["self".to_owned()]) - cpu_before;
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    println!(
        "| {STREAMS:>7} | {:<8} | mock only | {:>7.3} | {:>5.3} | {:>5.3} | {:>10.2}× | {:>14.2}× | {:>23} | {:>10.2} | {:>12} | {cpu:>19.2} | {:>8.0} % | {:>19} | {:>19} | {:>14} |",
        arriving(spread),
        ideal.as_secs_f64(),
        p50.as_secs_f64(),
        p99.as_secs_f64(),
        p99.as_secs_f64() / ideal.as_secs_f64(),
        1.0,
        format!(
            "{:.3} / {:.3}",
            percentile(&firsts, 0.5).as_secs_f64(),
            percentile(&firsts, 0.99).as_secs_f64()
        ),
        elapsed.as_secs_f64(),
        "–",
        100.0 * cpu / (elapsed.as_secs_f64() * cores() as f64),
        "–",
        "–",
        "–",
    );
    p99
}

/// One row of the streams table, against a fresh child server.
async fn streams_row(
    mock: &MockProvider,
    http: &reqwest::Client,
    ideal: Duration,
    floor: Duration,
    spread: Duration,
    through: Through,
) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .env(through.child_variable(), mock.openai_base_url())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut url = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut url)
        .unwrap();
    let url = url.trim().to_owned();
    let pid = child.id();
    // Warm up, then the idle baseline.
    for _ in 0..5 {
        stream_once(http, &url, through).await;
    }
    let idle = memory_mib(pid, "VmRSS");
    let cpu_before = (
        cpu_seconds(["self".to_owned()]),
        cpu_seconds([pid.to_string()]),
    );
    let started = Instant::now();
    let (latencies, firsts) = all_live(spread, || stream_once(http, &url, through)).await;
    let elapsed = started.elapsed();
    let client_cpu = cpu_seconds(["self".to_owned()]) - cpu_before.0;
    let server_cpu = cpu_seconds([pid.to_string()]) - cpu_before.1;
    let peak = memory_mib(pid, "VmHWM");
    child.kill().unwrap();
    let _ = child.wait();
    let p50 = percentile(&latencies, 0.5);
    let p99 = percentile(&latencies, 0.99);
    println!(
        "| {STREAMS:>7} | {:<8} | {:<4} | {:>7.3} | {:>5.3} | {:>5.3} | {:>10.2}× | {:>14.2}× | {:>23} | {:>10.2} | {server_cpu:>12.2} | {client_cpu:>19.2} | {:>8.0} % | {idle:>19.1} | {peak:>19.1} | {:>14.1} |",
        arriving(spread),
        through.name(),
        ideal.as_secs_f64(),
        p50.as_secs_f64(),
        p99.as_secs_f64(),
        p99.as_secs_f64() / ideal.as_secs_f64(),
        p99.as_secs_f64() / floor.as_secs_f64(),
        format!(
            "{:.3} / {:.3}",
            percentile(&firsts, 0.5).as_secs_f64(),
            percentile(&firsts, 0.99).as_secs_f64()
        ),
        elapsed.as_secs_f64(),
        100.0 * (server_cpu + client_cpu) / (elapsed.as_secs_f64() * cores() as f64),
        (peak - idle) * 1024.0 / STREAMS as f64,
    );
}

/// One streaming run through the child, read to its end; returns when its first text delta
/// came, from the start.
async fn stream_once(http: &reqwest::Client, url: &str, through: Through) -> Duration {
    let begun = Instant::now();
    let mut body = json!({"text": "Count.", "model_id": "mock"});
    if through == Through::NewSessions {
        body["session_id"] = json!("new");
    }
    let response = http
        .post(format!("{url}/v1/infer/stream"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success(), "{}", response.status());
    if through == Through::Proxy {
        return read_mock_answer(response, begun).await;
    }
    let (body, first_delta) = read_to_end(response, b"event: delta.text", begun).await;
    let body = String::from_utf8_lossy(&body);
    assert!(body.contains("event: run.finished"), "{body}");
    first_delta
}

/// `STREAMS` of `one` live together (each returns when its first text came, from its start),
/// starting at even intervals over `spread` (zero: all at once); returns how long each took
/// from its own start and when its first text came, both sorted.
async fn all_live<F: Future<Output = Duration>>(
    spread: Duration,
    one: impl Fn() -> F,
) -> (Vec<Duration>, Vec<Duration>) {
    let base = tokio::time::Instant::now();
    let (mut latencies, mut firsts): (Vec<Duration>, Vec<Duration>) =
        futures::stream::iter(0..STREAMS)
            .map(|place| {
                let run = one();
                let start = base + spread * place as u32 / STREAMS as u32;
                async move {
                    tokio::time::sleep_until(start).await;
                    let begun = Instant::now();
                    let first = run.await;
                    (begun.elapsed(), first)
                }
            })
            .buffer_unordered(STREAMS)
            .unzip()
            .await;
    latencies.sort();
    firsts.sort();
    (latencies, firsts)
}

/// Reads the mock's own streamed answer (straight or passed through) to its end; returns when
/// its first word came, from `begun`.
async fn read_mock_answer(response: reqwest::Response, begun: Instant) -> Duration {
    let (body, first) = read_to_end(response, FIRST_WORD, begun).await;
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    first
}

/// Reads a streamed answer to its end; returns it and when `first` (the first text) first
/// appeared in it, from `begun`.
async fn read_to_end(
    response: reqwest::Response,
    first: &[u8],
    begun: Instant,
) -> (Vec<u8>, Duration) {
    let mut seen = None;
    let mut body = Vec::new();
    let mut chunks = response.bytes_stream();
    while let Some(chunk) = chunks.next().await {
        body.extend_from_slice(&chunk.unwrap());
        if seen.is_none() && body.windows(first.len()).any(|w| w == first) {
            seen = Some(begun.elapsed());
        }
    }
    (body, seen.expect("the answer's first text"))
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Ok(mock_url) = std::env::var("RUNS_BENCH_SERVE") {
        runtime.block_on(serve_child(mock_url));
        return;
    }
    if let Ok(mock_url) = std::env::var("RUNS_BENCH_PROXY") {
        runtime.block_on(serve_proxy(mock_url));
        return;
    }
    let only = std::env::var("RUNS_BENCH_ONLY").unwrap_or_default();
    statement_counter();
    if only == "streams" {
        runtime.block_on(streams());
        return;
    }
    runtime.block_on(async {
        println!(
            "| backend    | scenario   | clients |   runs/s |  p50 ms  |  p99 ms  | CPU ms/run | PG CPU ms/run | writes/run | commits/run | writer busy | xacts/run |"
        );
        println!(
            "|------------|------------|---------|----------|----------|----------|------------|---------------|------------|-------------|-------------|-----------|"
        );
        let mut shares = Vec::new();
        let mut paired = Vec::new();
        let home = tempfile::tempdir().unwrap();
        let mut stateless = None;
        backend(
            "sqlite",
            Store::open_home(home.path()).await.unwrap(),
            None,
            &mut stateless,
            &mut shares,
            &mut paired,
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
            backend(
                "postgres",
                store,
                Some(&base),
                &mut stateless,
                &mut shares,
                &mut paired,
            )
            .await;
            psql(&base, &format!("DROP SCHEMA {schema} CASCADE"));
        } else {
            println!("(PostgreSQL skipped: set AGENTRY_TEST_DATABASE_URL)");
        }
        println!();
        println!(
            "throughput at 20 clients, as a share of stateless: {}",
            shares.join(", ")
        );
        for line in &paired {
            println!(
                "durable at 20 clients, {PAIRS} pairs of {PAIR_RUNS}-run slices side by side: {line}"
            );
        }
        if only.is_empty() {
            streams().await;
        }
    });
}
