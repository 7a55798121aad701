//! `agentry workflows`: definitions from YAML and JSON files, runs followed in the terminal,
//! and the examples in `examples/workflows` run against the mock model.

use std::path::{Path, PathBuf};
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
        .env("NO_COLOR", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A data folder with a model on the mock and the agents the examples use.
async fn home_with_agents(mock: &MockProvider) -> tempfile::TempDir {
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(),
                    "model_name": "m"}),
        )
        .await
        .unwrap();
    for agent in ["analyst", "writer", "summariser"] {
        store
            .put_config(
                ConfigKind::Agent,
                agent,
                &json!({"id": agent, "model_id": "mock", "system": format!("You are the {agent}.")}),
            )
            .await
            .unwrap();
    }
    store.close().await;
    home
}

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/workflows")
}

#[tokio::test]
async fn the_example_workflows_run_against_the_mock_model() {
    let mock = MockProvider::start().await.unwrap();
    // Every agent answers the same JSON: the hot-spot step checks it against its schema.
    mock.set_fallback(Reply::scripted(ScriptedTurn::text(
        r#"{"hotspots": [{"service": "database", "monthly_cost": 1200, "why": "idle replicas"}]}"#,
    )));
    let home = home_with_agents(&mock).await;
    let home = home.path();

    // Both examples match the published schema.
    let schema = agentry_app::workflows::workflow_schema().unwrap();
    let validator = jsonschema::validator_for(&schema).unwrap();
    for example in ["cost-report.yaml", "map-reduce.yaml"] {
        let text = std::fs::read_to_string(examples().join(example)).unwrap();
        let definition: Value = serde_norway::from_str(&text).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&definition)
            .map(|error| format!("{}: {error}", error.instance_path()))
            .collect();
        assert!(errors.is_empty(), "{example}: {errors:?}");
    }

    let cost = examples().join("cost-report.yaml");
    let out = agentry(
        home,
        &[
            "workflows",
            "run",
            cost.to_str().unwrap(),
            "--input",
            "account=acme",
            "--yes",
        ],
    )
    .await;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for step in ["gather", "hotspots", "report", "review"] {
        assert!(
            stderr.contains(&format!("✓ {step}  succeeded")),
            "{step}: {stderr}"
        );
    }
    let output: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(output["hotspots"][0]["service"], "database");
    assert_eq!(output["approved_by_reviewer"], true);
    // Five agent calls: three in parallel (the `gather` step's branches), the analysis, the
    // report.
    assert_eq!(mock.requests().len(), 5);
    assert!(
        mock.requests()
            .iter()
            .any(|r| r.body.to_string().contains("billing for account acme"))
    );

    let map = examples().join("map-reduce.yaml");
    let out = agentry(
        home,
        &[
            "workflows",
            "run",
            map.to_str().unwrap(),
            "--input-json",
            r#"{"documents": ["alpha", "beta", "gamma"]}"#,
        ],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let output: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(output["per_document"].as_array().unwrap().len(), 3);
    // Three summaries and the combination.
    assert_eq!(mock.requests().len(), 9);
    let combined = mock.requests()[8].body.to_string();
    assert!(combined.contains("Combine these 3 summaries"), "{combined}");

    let out = agentry(home, &["workflows", "list"]).await;
    let list = text(&out.stdout);
    assert!(
        list.contains("cost-report\tv1") && list.contains("map-reduce\tv1"),
        "{list}"
    );

    // No terminal and no --yes: the run stays waiting for a person, exit code 3.
    let out = agentry(
        home,
        &[
            "workflows",
            "run",
            "cost-report",
            "--input",
            "account=other",
        ],
    )
    .await;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("waits for a person"));
    let out = agentry(home, &["workflows", "runs", "cost-report"]).await;
    let runs = text(&out.stdout);
    assert_eq!(runs.lines().count(), 2, "{runs}");
    assert!(
        runs.lines().next().unwrap().contains("\twaiting\t"),
        "{runs}"
    );

    // A bad file is refused, naming the problem.
    let bad = home.join("bad.yaml");
    std::fs::write(
        &bad,
        "id: bad\nsteps:\n  - {id: a, kind: tool, tool: nope}\n",
    )
    .unwrap();
    let out = agentry(home, &["workflows", "add", bad.to_str().unwrap()]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("steps[0].tool"),
        "{}",
        text(&out.stderr)
    );
}

/// Polls a workflow run on `base` until `done` says so (at most `secs`).
async fn run_until(base: &str, run: &str, secs: u64, done: impl Fn(&Value) -> bool) -> Value {
    let http = agentry_llm::http_client(std::time::Duration::from_secs(10)).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let view: Value = http
            .get(format!("{base}/v1/workflow-runs/{run}"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if done(&view) {
            return view;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never got there: {view:#}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_workflow_killed_mid_way_resumes_after_a_restart_and_no_step_runs_twice() {
    use super::processes::{free_port, listening, serve};
    let home = tempfile::tempdir().unwrap();
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("done")));
    let http = agentry_llm::http_client(std::time::Duration::from_secs(30)).unwrap();
    let port = free_port();
    let mut first = serve(home.path(), port, &[]);
    listening(&mut first).await;
    let base = format!("http://127.0.0.1:{port}");
    for (path, body) in [
        (
            "/v1/models",
            json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "x"}),
        ),
        ("/v1/agents", json!({"id": "w", "model_id": "m"})),
    ] {
        let status = http
            .post(format!("{base}{path}"))
            .json(&body)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 201, "{path}");
    }
    // Twenty steps: ten agent steps, a three-second timer, nine more agent steps.
    let mut steps: Vec<Value> = (0..10)
        .map(|i| json!({"id": format!("a{i}"), "kind": "agent", "agent": "w", "prompt": format!("step {i}")}))
        .collect();
    steps.push(json!({"id": "pause", "kind": "wait", "seconds": 3}));
    steps.extend((10..19).map(|i| {
        json!({"id": format!("a{i}"), "kind": "agent", "agent": "w", "prompt": format!("step {i}")})
    }));
    let status = http
        .post(format!("{base}/v1/workflows"))
        .json(&json!({"id": "twenty", "steps": steps}))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 201);
    let run: Value = http
        .post(format!("{base}/v1/workflows/twenty/runs"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    run_until(&base, &run_id, 30, |run| {
        run["steps"]["pause"]["state"] == "waiting"
    })
    .await;
    assert_eq!(mock.request_count(), 10);

    // kill -9 while the timer runs, then another server on the same data folder.
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    let port = free_port();
    let mut second = serve(home.path(), port, &[]);
    listening(&mut second).await;
    let base = format!("http://127.0.0.1:{port}");
    let done = run_until(&base, &run_id, 60, |run| {
        matches!(
            run["state"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        )
    })
    .await;
    assert_eq!(done["state"], "succeeded", "{done:#}");
    // Nineteen agent steps, each asked once: none of the first ten ran again.
    assert_eq!(mock.request_count(), 19);
    for i in 0..19 {
        assert_eq!(done["steps"][format!("a{i}")]["attempts"], 1, "a{i}");
    }
    let waited = done["steps"]["pause"]["finished_at"].as_u64().unwrap()
        - done["steps"]["pause"]["started_at"].as_u64().unwrap();
    assert!(waited >= 3000, "{waited}");
}
