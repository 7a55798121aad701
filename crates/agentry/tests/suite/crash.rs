//! Crash test: `agentry run` is killed with SIGKILL at random points, then resumed.
//!
//! Each iteration runs a scripted multi-round task whose tools are real programs: `counter`
//! (not idempotent) appends its arguments to a file, `reader` (idempotent) only reads. The run
//! is killed at a random moment; then `agentry sessions recover` or `resume` continues it until
//! it finishes.
//! After every iteration: every event committed before the kill is still there, unchanged; no
//! `counter` call ran twice; and the run finished (or had not started when it was killed).

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use agentry_store::Store;
use agentry_testkit::{Chunking, MockProvider, Reply, ScriptedTurn};
use agentry_types::SessionId;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

const ITERATIONS: usize = 50;
const TURNS: usize = 6;

fn write_tools(dir: &Path) -> std::path::PathBuf {
    let counter = dir.join("counter.sh");
    std::fs::write(
        &counter,
        "#!/bin/sh\nread input\nsleep 0.02\necho \"$input\" >> \"$COUNTER_FILE\"\necho '{\"counted\": true}'\n",
    )
    .unwrap();
    let reader = dir.join("reader.sh");
    std::fs::write(
        &reader,
        "#!/bin/sh\ncat > /dev/null\necho '{\"read\": true}'\n",
    )
    .unwrap();
    let tools = dir.join("tools.json");
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    std::fs::write(
        &tools,
        serde_json::to_string(&json!([
            {"kind": "command", "name": "counter", "program": "/bin/sh", "args": [counter],
             "env": {"COUNTER_FILE": dir.join("counter.log")}, "parameters": schema},
            {"kind": "command", "name": "reader", "program": "/bin/sh", "args": [reader],
             "parameters": schema, "idempotent": true}
        ]))
        .unwrap(),
    )
    .unwrap();
    tools
}

fn script(mock: &MockProvider) {
    for n in 0..TURNS {
        mock.enqueue(
            Reply::scripted(
                ScriptedTurn::tool_call("counter", json!({"n": n}))
                    .with_tool_call("reader", json!({"n": n})),
            )
            .chunked(Chunking::Every(64))
            .paced(Duration::from_millis(3)),
        );
    }
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("All counted.")));
}

fn agentry(home: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"));
    command
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("OPENAI_API_KEY")
        .env_remove("AGENTRY_DATABASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

/// Every committed event of a session: (seq, kind, payload).
async fn committed(home: &Path, session: SessionId) -> Vec<(u64, String, Value)> {
    let store = Store::open_home(home).await.unwrap();
    let events = store
        .events(session, 0, usize::MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.seq, e.kind, e.payload))
        .collect();
    store.close().await;
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_runs_lose_nothing_and_never_repeat_side_effects() {
    let seed = std::env::var("AGENTRY_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_u64);
    let mut rng = fastrand::Rng::with_seed(seed);
    let home = tempfile::tempdir().unwrap();
    let mut kills_mid_run = 0;
    for iteration in 0..ITERATIONS {
        let work = tempfile::tempdir().unwrap();
        let tools = write_tools(work.path());
        let mock = MockProvider::start().await.unwrap();
        script(&mock);
        let base_url = mock.openai_base_url();
        let tools = tools.to_str().unwrap();
        let mut child = agentry(
            home.path(),
            &[
                "run",
                "Count to six.",
                "--provider",
                "openai",
                "--base-url",
                &base_url,
                "--model-name",
                "m",
                "--tools-file",
                tools,
            ],
        )
        .spawn()
        .unwrap();
        // The session id is on stderr once the run can start (after any warning of the
        // model's set-up).
        let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
        let session: SessionId = loop {
            let line = stderr.next_line().await.unwrap().expect("a session line");
            if let Some(id) = line.strip_prefix("session: ") {
                break id.parse().unwrap();
            }
        };
        let delay = rng.u64(0..400);
        tokio::time::sleep(Duration::from_millis(delay)).await;
        // SIGKILL: no chance to clean up.
        let _ = child.start_kill();
        let _ = child.wait().await;
        drop(stderr);

        let before = committed(home.path(), session).await;
        let finished_before = before
            .last()
            .is_some_and(|(_, kind, _)| kind == "run_finished");
        if !finished_before && !before.is_empty() {
            kills_mid_run += 1;
        }
        // Resume until the run is over (a resume is itself never killed here). Odd iterations
        // start with start-up recovery of every interrupted session instead.
        let id = session.to_string();
        for attempt in 0..3 {
            let args: &[&str] = if attempt == 0 && iteration % 2 == 1 {
                &["sessions", "recover"]
            } else {
                &["sessions", "resume", &id]
            };
            let output = agentry(home.path(), args).output().await.unwrap();
            let stderr = String::from_utf8_lossy(&output.stderr).to_string();
            assert!(
                output.status.success() || output.status.code() == Some(3),
                "iteration {iteration} (seed {seed}), resume {attempt}: {stderr}"
            );
            if stderr.contains("no interrupted run") {
                break;
            }
        }
        let after = committed(home.path(), session).await;

        // 1. Nothing committed before the kill was lost or changed.
        assert!(
            after.len() >= before.len() && after[..before.len()] == before[..],
            "iteration {iteration} (seed {seed}): committed events changed"
        );
        // 2. No non-idempotent tool call ran twice.
        let log = std::fs::read_to_string(work.path().join("counter.log")).unwrap_or_default();
        let mut runs: HashMap<String, usize> = HashMap::new();
        for line in log.lines() {
            *runs.entry(line.to_owned()).or_default() += 1;
        }
        for (arguments, count) in &runs {
            assert_eq!(
                *count, 1,
                "iteration {iteration} (seed {seed}): counter ran {count}× with {arguments}"
            );
        }
        // 3. The run finished, or never started.
        let started = after.iter().any(|(_, kind, _)| kind == "run_started");
        if started {
            let (_, kind, payload) = after.last().unwrap();
            assert_eq!(
                kind, "run_finished",
                "iteration {iteration} (seed {seed}): {payload}"
            );
        }
        // Every counter call either has a result in the log or an explicit unknown outcome.
        let results = after
            .iter()
            .filter(|(_, kind, _)| kind == "tool_call_result")
            .count();
        let intents = after
            .iter()
            .filter(|(_, kind, _)| kind == "tool_call_intent")
            .count();
        assert!(
            results >= intents,
            "iteration {iteration} (seed {seed}): an intent has no result"
        );
    }
    // The random kills really did land in the middle of runs.
    assert!(
        kills_mid_run >= ITERATIONS / 4,
        "only {kills_mid_run} kills landed mid-run"
    );
}
