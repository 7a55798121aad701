//! Workflow benchmark. Prints tables; asserts nothing.
//!
//! `cargo bench -p agentry-server --bench workflows`
//!
//! 1. Overhead per durable step on SQLite: a chain of N no-op tool steps (`current_time`), each
//!    written to the run's document as it starts and ends, against the same N tool calls made
//!    directly one after another in the same process.
//! 2. A 10,000-item map, 100 at a time, of the same tool: time and the process's peak RSS.
//! 3. Resume after a crash: a run whose document says every step of a long chain but the last
//!    succeeded; the time from `resume_workflows` to the run's end.

// They await whole futures on purpose: nothing keeps them per request in flight, as a
// handler's is (the crate's 2 KiB `future-size-threshold`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::large_futures)]

use std::time::{Duration, Instant};

use agentry_app::auth::Principal;
use agentry_app::config::ConfigRepo;
use agentry_app::domain::core::tool::ResultFormat;
use agentry_app::workflows::{WorkflowDefinition, WorkflowRun, WorkflowState};
use agentry_server::AppState;
use agentry_store::Store;
use serde_json::{Value, json};

fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmHWM:"))
                .and_then(|line| line.split_whitespace().nth(1))
                .and_then(|kib| kib.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

fn chain(id: &str, n: usize) -> WorkflowDefinition {
    let steps: Vec<Value> = (0..n)
        .map(|i| json!({"id": format!("s{i}"), "kind": "tool", "tool": "current_time"}))
        .collect();
    serde_json::from_value(json!({"id": id, "steps": steps})).unwrap()
}

async fn finish(state: &AppState, run_id: &str) -> WorkflowRun {
    let operator = Principal::operator();
    let mut changes = state.app.parts().workflows.subscribe(run_id);
    loop {
        let run = state.app.workflows().run(&operator, run_id).await.unwrap();
        if run.state.is_final() {
            return run;
        }
        // Until its driver stops (the change channel closes), reading the run only then: a
        // read at every change would cost the run as much as it measures.
        let stopped = async { while changes.changed().await.is_ok() {} };
        let _ = tokio::time::timeout(Duration::from_secs(1), stopped).await;
    }
}

#[tokio::main]
async fn main() {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    let state = AppState::with_tools(store, agentry_app::ToolEnvironment::default())
        .await
        .unwrap();
    let operator = Principal::operator();

    println!("\n1. durable steps on SQLite against direct tool calls (no-op tool)\n");
    println!(
        "| steps | direct calls | workflow run | per step, direct | per step, workflow | overhead per step |"
    );
    println!("|---|---|---|---|---|---|");
    for n in [50, 200, 1000] {
        let start = Instant::now();
        for _ in 0..n {
            state
                .app
                .tools()
                .call("current_time", json!({}), ResultFormat::Text)
                .await
                .unwrap();
        }
        let direct = start.elapsed();
        let id = format!("chain{n}");
        state.app.workflows().create(chain(&id, n)).await.unwrap();
        let start = Instant::now();
        let run = state
            .app
            .workflows()
            .start(&operator, &id, json!({}))
            .await
            .unwrap();
        let run = finish(&state, &run.run_id).await;
        let took = start.elapsed();
        assert_eq!(run.state, WorkflowState::Succeeded);
        let per = |d: Duration| d.as_secs_f64() * 1000.0 / n as f64;
        println!(
            "| {n} | {:.1} ms | {:.1} ms | {:.3} ms | {:.3} ms | {:.3} ms |",
            direct.as_secs_f64() * 1000.0,
            took.as_secs_f64() * 1000.0,
            per(direct),
            per(took),
            per(took) - per(direct)
        );
    }

    println!("\n2. a 10,000-item map, 100 at a time (no-op tool)\n");
    let items: Vec<u32> = (0..10_000).collect();
    let map: WorkflowDefinition = serde_json::from_value(json!({"id": "fan", "steps": [
        {"id": "each", "kind": "map", "items": "input['items']", "concurrency": 100,
         "step": {"kind": "tool", "tool": "current_time"}}
    ]}))
    .unwrap();
    state.app.workflows().create(map).await.unwrap();
    let before = peak_rss_mib();
    let start = Instant::now();
    let run = state
        .app
        .workflows()
        .start(&operator, "fan", json!({"items": items}))
        .await
        .unwrap();
    let run = finish(&state, &run.run_id).await;
    let took = start.elapsed();
    assert_eq!(run.state, WorkflowState::Succeeded);
    println!("| items | time | per item | peak RSS before | peak RSS after |");
    println!("|---|---|---|---|---|");
    println!(
        "| 10,000 | {:.2} s | {:.3} ms | {:.0} MiB | {:.0} MiB |",
        took.as_secs_f64(),
        took.as_secs_f64() * 1000.0 / 10_000.0,
        before,
        peak_rss_mib()
    );

    println!("\n3. resume after a crash: every step but the last already done\n");
    println!("| steps | resume to end |");
    println!("|---|---|");
    for n in [200, 1000] {
        let id = format!("long{n}");
        state.app.workflows().create(chain(&id, n)).await.unwrap();
        let definition = state.app.workflows().get(&id).await.unwrap();
        let mut steps = serde_json::Map::new();
        for i in 0..n {
            let step = if i + 1 < n {
                json!({"state": "succeeded", "attempts": 1, "started_at": 1, "finished_at": 2, "output": "then"})
            } else {
                json!({"state": "running", "attempts": 1, "started_at": 3})
            };
            steps.insert(format!("s{i}"), step);
        }
        let run_id = uuid::Uuid::new_v4().to_string();
        let run: WorkflowRun = serde_json::from_value(json!({
            "run_id": run_id, "workflow_id": id, "version": 1, "state": "running",
            "input": {}, "steps": steps, "created_at": 1, "updated_at": 3,
            "definition": definition,
        }))
        .unwrap();
        ConfigRepo::new(&state.app.parts().store)
            .create(&run_id, &run)
            .await
            .unwrap();
        let start = Instant::now();
        state.app.workflows().resume().await;
        let run = finish(&state, &run_id).await;
        assert_eq!(run.state, WorkflowState::Succeeded);
        println!("| {n} | {:.1} ms |", start.elapsed().as_secs_f64() * 1000.0);
    }
    state.app.parts().shutdown.cancel();
}
