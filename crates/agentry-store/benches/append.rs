//! Event-log benchmark: append latency (one ~1 KiB event per append, sequential) and the bytes
//! a 500-turn session stores, on SQLite and on PostgreSQL; and, side by side in alternating
//! blocks, the same append with and without a usage-ledger entry (what a model call's answer
//! costs to record). Prints a report; asserts nothing.
//!
//! `cargo bench -p agentry-store --bench append`
//!
//! PostgreSQL comes from `AGENTRY_TEST_DATABASE_URL` (default
//! `postgres://root@127.0.0.1:5432/test`); the run works in a schema of its own and drops it.
//! Without a reachable server the PostgreSQL rows say so.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use agentry_store::{
    Durability, NewEvent, NewSession, SecretKey, SessionId, Store, StoreOptions, UsageEntry,
};
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Connection, Row};

const WARM_UP: usize = 200;
const APPENDS: usize = 2_000;
const TURNS: usize = 500;

/// A realistic ~1 KiB event: an assistant message with some text and a usage record.
fn kib_event(n: usize) -> NewEvent {
    let text = "I read the file and the failing test expects the parser to keep the trailing \
                comment. The fix is to stop trimming after the last token and to carry the \
                comment span through to the printer. ";
    NewEvent::new(
        "assistant.message",
        json!({
            "role": "assistant",
            "run_id": "01890a5d-ac96-774b-bcce-b302099a8057",
            "parts": [{"type": "text", "text": format!("{n}: {}", text.repeat(4))}],
            "usage": {"input_tokens": 1843 + n, "output_tokens": 212, "cached_tokens": 1536},
            "stop_reason": "end_turn",
        }),
    )
}

/// One turn: user message, assistant message with a tool call, tool intent, tool result.
fn turn(n: usize) -> Vec<NewEvent> {
    let prose = "Please look at src/parser.rs and tell me why the comment disappears. ";
    let output: String = (0..40)
        .map(|i| {
            format!(
                "{:>4} | let token = lexer.next_token()?; // line {i}\n",
                n + i
            )
        })
        .collect();
    vec![
        NewEvent::new(
            "user.message",
            json!({"role": "user", "text": format!("{n}: {}", prose.repeat(3))}),
        ),
        NewEvent::new(
            "assistant.message",
            json!({
                "role": "assistant",
                "parts": [
                    {"type": "thinking", "text": prose.repeat(6), "signature": "EqQBCkYIBxgCKkD".repeat(8)},
                    {"type": "text", "text": "Let me read the parser first."},
                    {"type": "tool_call", "id": format!("toolu_{n:08}"), "name": "read_file",
                     "arguments": {"path": "src/parser.rs", "start": n, "lines": 40}},
                ],
                "usage": {"input_tokens": 2400 + n * 30, "output_tokens": 180},
            }),
        ),
        NewEvent::new(
            "tool.intent",
            json!({"id": format!("toolu_{n:08}"), "name": "read_file",
                   "arguments": {"path": "src/parser.rs", "start": n, "lines": 40}, "idempotent": true}),
        ),
        NewEvent::new(
            "tool.result",
            json!({"id": format!("toolu_{n:08}"), "output": output, "is_error": false, "elapsed_ms": 3}),
        ),
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

async fn append_latency(store: &Store) -> (Duration, Duration, Duration, usize) {
    let id = store.create_session(NewSession::new()).await.unwrap().id;
    for n in 0..WARM_UP {
        store.append(id, None, &[kib_event(n)]).await.unwrap();
    }
    let payload_len = kib_event(WARM_UP).payload().len();
    let mut samples = Vec::with_capacity(APPENDS);
    for n in 0..APPENDS {
        let event = [kib_event(WARM_UP + n)];
        let started = Instant::now();
        store.append(id, None, &event).await.unwrap();
        samples.push(started.elapsed());
    }
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    samples.sort();
    (
        percentile(&samples, 0.5),
        percentile(&samples, 0.99),
        mean,
        payload_len,
    )
}

/// Mean append latency without and with a usage-ledger entry on the event, measured in
/// alternating blocks of 100 on one session.
async fn ledger_overhead(store: &Store) -> (Duration, Duration) {
    let id = store.create_session(NewSession::new()).await.unwrap().id;
    let entry = UsageEntry {
        run_id: agentry_types::RunId::new(),
        agent_id: Some("bench".into()),
        model: "m".into(),
        usage: agentry_types::Usage {
            input_tokens: 1843,
            output_tokens: 212,
            ..Default::default()
        },
        cost_usd: Some(0.0021),
    };
    let (mut plain, mut ledger) = (Duration::ZERO, Duration::ZERO);
    let mut n = 0;
    for block in 0..(2 * APPENDS / 100) {
        let with_usage = block % 2 == 1;
        for _ in 0..100 {
            let mut event = kib_event(n);
            n += 1;
            if with_usage {
                event = event.with_usage(entry.clone());
            }
            let started = Instant::now();
            store.append(id, None, &[event]).await.unwrap();
            let took = started.elapsed();
            if with_usage {
                ledger += took;
            } else {
                plain += took;
            }
        }
    }
    (plain / APPENDS as u32, ledger / APPENDS as u32)
}

/// Appends a 500-turn session; returns (payload bytes per turn, storage bytes per turn).
async fn bytes_per_turn(store: &Store, disk: impl AsyncFn() -> u64) -> (f64, f64) {
    let id: SessionId = store.create_session(NewSession::new()).await.unwrap().id;
    let before = disk().await;
    for n in 0..TURNS {
        store.append(id, None, &turn(n)).await.unwrap();
    }
    let after = disk().await;
    let payload = store.stored_bytes(id).await.unwrap();
    (
        payload as f64 / TURNS as f64,
        after.saturating_sub(before) as f64 / TURNS as f64,
    )
}

fn row(backend: &str, latency: (Duration, Duration, Duration, usize), bytes: (f64, f64)) {
    let (p50, p99, mean, _) = latency;
    println!(
        "{backend:<24} {:>10.1} {:>10.1} {:>10.1} {:>14.0} {:>14.0}",
        micros(p50),
        micros(p99),
        micros(mean),
        bytes.0,
        bytes.1
    );
}

type Report = (
    (Duration, Duration, Duration, usize),
    (f64, f64),
    (Duration, Duration),
);

async fn sqlite(durability: Durability) -> Report {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("agentry.db");
    let mut options = StoreOptions::new(SecretKey::from_bytes([3; 32]));
    options.durability = durability;
    let store = Store::connect(path.to_str().unwrap(), options)
        .await
        .unwrap();
    let latency = append_latency(&store).await;
    let ledger = ledger_overhead(&store).await;
    // Database size after a checkpoint folds the WAL back into the file.
    let disk = async || {
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&mut conn)
            .await
            .unwrap();
        let row = sqlx::query(
            "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
        row.get::<i64, _>(0) as u64
    };
    let bytes = bytes_per_turn(&store, disk).await;
    store.close().await;
    (latency, bytes, ledger)
}

async fn postgres() -> Result<Report, String> {
    let base = std::env::var("AGENTRY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned());
    let mut admin = sqlx::PgConnection::connect(&base)
        .await
        .map_err(|e| format!("unreachable at {base}: {e}"))?;
    let schema = format!("bench_{}", SessionId::new().to_string().replace('-', ""));
    sqlx::raw_sql(AssertSqlSafe(format!("CREATE SCHEMA {schema}")))
        .execute(&mut admin)
        .await
        .map_err(|e| e.to_string())?;
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{separator}options[search_path]={schema}");
    let store = Store::connect(&url, StoreOptions::new(SecretKey::from_bytes([3; 32])))
        .await
        .map_err(|e| e.to_string())?;
    let latency = append_latency(&store).await;
    let ledger = ledger_overhead(&store).await;
    let disk = async || {
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        // Table, TOAST and indexes.
        let row = sqlx::query("SELECT pg_total_relation_size('events')")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        conn.close().await.unwrap();
        row.get::<i64, _>(0) as u64
    };
    let bytes = bytes_per_turn(&store, disk).await;
    store.close().await;
    sqlx::raw_sql(AssertSqlSafe(format!("DROP SCHEMA {schema} CASCADE")))
        .execute(&mut admin)
        .await
        .map_err(|e| e.to_string())?;
    Ok((latency, bytes, ledger))
}

#[tokio::main]
async fn main() {
    let sample = kib_event(0);
    let payload: Value = serde_json::from_str(sample.payload()).unwrap();
    println!(
        "append latency: {APPENDS} sequential appends of one {}-byte event after {WARM_UP} \
         warm-up; bytes per turn over a {TURNS}-turn session (4 events a turn)",
        serde_json::to_string(&payload).unwrap().len()
    );
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>14} {:>14}",
        "backend", "p50 µs", "p99 µs", "mean µs", "payload B/turn", "storage B/turn"
    );
    let mut ledgers = Vec::new();
    let (latency, bytes, ledger) = sqlite(Durability::Normal).await;
    row("sqlite (sync=NORMAL)", latency, bytes);
    ledgers.push(("sqlite (sync=NORMAL)", ledger));
    let (latency, bytes, ledger) = sqlite(Durability::Full).await;
    row("sqlite (sync=FULL)", latency, bytes);
    ledgers.push(("sqlite (sync=FULL)", ledger));
    match postgres().await {
        Ok((latency, bytes, ledger)) => {
            row("postgres", latency, bytes);
            ledgers.push(("postgres", ledger));
        }
        Err(error) => println!("{:<24} skipped: {error}", "postgres"),
    }
    println!();
    println!(
        "usage ledger: mean append with and without a ledger entry, alternating blocks of 100"
    );
    println!(
        "{:<24} {:>12} {:>12} {:>10}",
        "backend", "plain µs", "ledger µs", "ratio"
    );
    for (backend, (plain, ledger)) in ledgers {
        println!(
            "{backend:<24} {:>12.1} {:>12.1} {:>9.2}×",
            micros(plain),
            micros(ledger),
            micros(ledger) / micros(plain)
        );
    }
    println!(
        "storage B/turn: SQLite file growth after a WAL checkpoint; PostgreSQL \
         pg_total_relation_size('events') growth (heap, TOAST, index)"
    );
}
