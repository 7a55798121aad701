//! Workflows: definitions checked whole, data flowing between steps, parallel branches, `when`,
//! `map` in order, `switch` and `parallel` steps, retries by kind of failure, `on_failure`
//! handlers, an agent step on the run queue, an approval, a timer and a signal
//! surviving a restart, cancel.

use std::time::Duration;

use agentry_app::auth::Principal;
use agentry_testkit::{Reply, ScriptedTurn};
use serde_json::{Value, json};

use super::support::{Server, host_commands, start};

async fn save(server: &Server, definition: Value) {
    let (status, body) = server.post("/v1/workflows", definition).await;
    assert_eq!(status, 201, "{body}");
}

async fn start_run(server: &Server, workflow: &str, input: Value) -> String {
    let (status, run) = server
        .post(
            &format!("/v1/workflows/{workflow}/runs"),
            json!({"input": input}),
        )
        .await;
    assert_eq!(status, 202, "{run}");
    run["run_id"].as_str().unwrap().to_owned()
}

/// A server whose worker runs the queue, with the agent `analyst` on the mock.
async fn with_analyst() -> Server {
    let server = start().await;
    server.state.app.start_worker();
    let (status, body) = server
        .post("/v1/agents", json!({"id": "analyst", "model_id": "mock"}))
        .await;
    assert_eq!(status, 201, "{body}");
    server
}

/// Polls the run until `done` says so (at most 20 s).
async fn until(server: &Server, run: &str, done: impl Fn(&Value) -> bool) -> Value {
    for _ in 0..400 {
        let (status, body) = server.get(&format!("/v1/workflow-runs/{run}")).await;
        assert_eq!(status, 200, "{body}");
        if done(&body) {
            return body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the workflow run never got there");
}

/// Every event of a run's stream until it ends: name, number and data.
async fn sse_events(server: &Server, run: &str, after: Option<u64>) -> Vec<(String, u64, Value)> {
    use eventsource_stream::Eventsource as _;
    use futures::StreamExt as _;
    let mut request = server
        .http
        .get(format!("{}/v1/workflow-runs/{run}/stream", server.url));
    if let Some(after) = after {
        request = request.header("last-event-id", after.to_string());
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = response.bytes_stream().eventsource();
    let mut events = Vec::new();
    while let Some(event) = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .unwrap()
    {
        let event = event.unwrap();
        events.push((
            event.event,
            event.id.parse().unwrap(),
            serde_json::from_str(&event.data).unwrap(),
        ));
    }
    events
}

fn ended(run: &Value) -> bool {
    matches!(
        run["state"].as_str(),
        Some("succeeded" | "failed" | "cancelled")
    )
}

#[tokio::test]
async fn data_flows_branches_run_in_parallel_when_skips_and_map_keeps_order() {
    let server = start().await;
    server.add_echo_tool().await;
    save(
        &server,
        json!({
            "id": "flow",
            "input_schema": {"type": "object", "required": ["values"],
                             "properties": {"values": {"type": "array", "items": {"type": "integer"}}}},
            "steps": [
                {"id": "first", "kind": "tool", "tool": "echo",
                 "arguments": {"values": "{{ input['values'] }}", "label": "start"}},
                {"id": "each", "kind": "map", "needs": ["first"], "concurrency": 2,
                 "items": "steps.first.output['values']",
                 "step": {"kind": "tool", "tool": "echo", "arguments": {"n": "{{ item * 10 }}", "i": "{{ index }}"}}},
                {"id": "left", "kind": "tool", "tool": "slow", "needs": ["first"]},
                {"id": "right", "kind": "tool", "tool": "slow", "needs": ["first"]},
                {"id": "never", "kind": "tool", "tool": "echo", "needs": ["first"],
                 "when": "input['values'] | length > 5"},
                {"id": "join", "kind": "tool", "tool": "echo", "needs": ["each", "left", "right", "never"],
                 "arguments": {"total": "{{ steps.each.output | map(attribute='n') | sum }}",
                               "label": "{{ steps.first.output.label }}-joined",
                               "slept": "{{ steps.left.output.slept and steps.right.output.slept }}"}}
            ],
            "output": {"total": "{{ steps.join.output.total }}", "label": "{{ steps.join.output.label }}"}
        }),
    )
    .await;
    let (_, saved) = server.get("/v1/workflows/flow").await;
    assert_eq!(saved["version"], 1);

    // Input that does not match the schema is refused, and no run is made.
    let (status, body) = server
        .post(
            "/v1/workflows/flow/runs",
            json!({"input": {"values": "no"}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (_, runs) = server.get("/v1/workflow-runs").await;
    assert_eq!(runs["runs"], json!([]));

    let id = start_run(&server, "flow", json!({"values": [1, 2, 3]})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["output"], json!({"total": 60, "label": "start-joined"}));
    assert_eq!(
        run["steps"]["each"]["output"],
        json!([{"n": 10, "i": 0}, {"n": 20, "i": 1}, {"n": 30, "i": 2}])
    );
    assert_eq!(run["steps"]["join"]["output"]["slept"], true);
    assert_eq!(run["steps"]["never"]["state"], "skipped");
    // The two branches after `first` overlapped in time.
    let span = |step: &str| {
        (
            run["steps"][step]["started_at"].as_u64().unwrap(),
            run["steps"][step]["finished_at"].as_u64().unwrap(),
        )
    };
    let (left, right) = (span("left"), span("right"));
    assert!(left.0 < right.1 && right.0 < left.1, "{left:?} {right:?}");
    // `join` started only after every step it needs had ended.
    let join = span("join");
    for step in ["each", "left", "right"] {
        assert!(span(step).1 <= join.0, "{step}");
    }
    assert_eq!(run["version"], 1);
    let (_, runs) = server.get("/v1/workflow-runs?workflow_id=flow").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1);
    // Each step's transitions are events in the store (started, then ended), in order; the
    // ended run's document includes them all.
    let events = server
        .state
        .app
        .parts()
        .store
        .workflow_events(&id, 0)
        .await
        .unwrap();
    let of = |step: &str| -> Vec<String> {
        events
            .iter()
            .filter(|(_, event)| event["step"] == step)
            .map(|(_, event)| event["run"]["state"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(of("left"), ["running", "succeeded"], "{events:?}");
    assert_eq!(of("never"), ["skipped"]);
    let seqs: Vec<u64> = events.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
    assert_eq!(run["seq"], seqs.len() as u64);
}

/// A command tool `name` running `script` in `sh` (its arguments on stdin, ignored).
async fn add_script(server: &Server, name: &str, script: &str) {
    let (status, body) = server
        .post(
            "/v1/tools",
            json!({"kind": "command", "name": name, "program": "/bin/sh",
                   "args": ["-c", format!("cat > /dev/null; {script}")]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test]
async fn a_switch_takes_one_way_and_a_parallel_steps_branches_run_together() {
    let server = start().await;
    server.add_echo_tool().await;
    // Two branches that finish only if both run at once: each leaves a mark and waits (5 s at
    // most) for the other's.
    let meeting = tempfile::tempdir().unwrap();
    let dir = meeting.path().display();
    for (me, other) in [("a", "b"), ("b", "a")] {
        add_script(
            &server,
            &format!("meet_{me}"),
            &format!(
                "touch {dir}/{me}; i=0; while [ ! -f {dir}/{other} ]; do sleep 0.05; \
                 i=$((i+1)); [ $i -gt 100 ] && exit 1; done; echo '{{\"met\": true}}'"
            ),
        )
        .await;
    }
    add_script(&server, "fails", "echo broken; exit 3").await;
    save(
        &server,
        json!({
            "id": "triage",
            "steps": [
                {"id": "classify", "kind": "tool", "tool": "echo", "arguments": {"kind": "{{ input.kind }}"}},
                {"id": "route", "kind": "switch", "cases": [
                    {"when": "steps.classify.output.kind == 'bug'", "then": "fix"},
                    {"when": "steps.classify.output.kind == 'feature'", "then": "plan"}],
                 "default": "later"},
                {"id": "fix", "kind": "tool", "tool": "echo", "arguments": {"did": "fix"}},
                {"id": "verify", "kind": "tool", "tool": "echo", "needs": ["fix"], "arguments": {"did": "verify"}},
                {"id": "plan", "kind": "tool", "tool": "echo", "needs": ["route"], "arguments": {"did": "plan"}},
                {"id": "later", "kind": "tool", "tool": "echo", "needs": ["route"], "arguments": {"did": "later"}},
                {"id": "gather", "kind": "parallel", "needs": ["verify", "plan", "later"], "branches": {
                    "a": {"kind": "tool", "tool": "meet_a"},
                    "b": {"kind": "tool", "tool": "meet_b"},
                    "way": {"kind": "tool", "tool": "echo", "arguments": {"next": "{{ steps.route.output.next }}"}}}},
                {"id": "report", "kind": "tool", "tool": "echo",
                 "arguments": {"way": "{{ steps.gather.output.way.next }}", "met": "{{ steps.gather.output.a.met and steps.gather.output.b.met }}"}}
            ],
            "output": "{{ steps.report.output }}"
        }),
    )
    .await;

    // A bug: `fix` and the step after it run; the other ways are skipped, and the join runs.
    let id = start_run(&server, "triage", json!({"kind": "bug"})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(
        run["steps"]["route"]["output"],
        json!({"case": 0, "next": "fix"})
    );
    for step in ["fix", "verify", "gather", "report"] {
        assert_eq!(run["steps"][step]["state"], "succeeded", "{step}: {run:#}");
    }
    for step in ["plan", "later"] {
        assert_eq!(run["steps"][step]["state"], "skipped", "{step}");
        assert_eq!(run["steps"][step]["not_taken"], true, "{step}");
    }
    assert_eq!(run["output"], json!({"way": "fix", "met": true}));
    assert_eq!(
        run["steps"]["gather"]["output"],
        json!({"a": {"met": true}, "b": {"met": true}, "way": {"next": "fix"}})
    );

    // A switch skipped by its `when` takes no way: none of its cases' steps run.
    save(
        &server,
        json!({"id": "quiet", "steps": [
            {"id": "route", "kind": "switch", "when": "input.route", "cases": [{"when": "true", "then": "a"}],
             "default": "b"},
            {"id": "a", "kind": "tool", "tool": "echo", "needs": ["route"]},
            {"id": "b", "kind": "tool", "tool": "echo", "needs": ["route"]},
            {"id": "after", "kind": "tool", "tool": "echo", "needs": ["a"]}
        ]}),
    )
    .await;
    let quiet = start_run(&server, "quiet", json!({"route": false})).await;
    let quiet = until(&server, &quiet, ended).await;
    assert_eq!(quiet["state"], "succeeded", "{quiet:#}");
    for step in ["route", "a", "b", "after"] {
        assert_eq!(
            quiet["steps"][step]["state"], "skipped",
            "{step}: {quiet:#}"
        );
    }

    // No case holds: the default way; `fix` is skipped and so is `verify`, which needs only it.
    for mark in ["a", "b"] {
        std::fs::remove_file(meeting.path().join(mark)).unwrap();
    }
    let id = start_run(&server, "triage", json!({"kind": "question"})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(
        run["steps"]["route"]["output"],
        json!({"case": "default", "next": "later"})
    );
    for step in ["fix", "verify", "plan"] {
        assert_eq!(run["steps"][step]["state"], "skipped", "{step}: {run:#}");
        assert_eq!(run["steps"][step]["not_taken"], true, "{step}");
    }
    assert_eq!(run["steps"]["later"]["output"], json!({"did": "later"}));
    assert_eq!(run["output"]["way"], "later");

    // A branch that fails fails the step, named.
    save(
        &server,
        json!({"id": "broken", "steps": [{"id": "both", "kind": "parallel", "branches": {
            "fine": {"kind": "tool", "tool": "echo"}, "bad": {"kind": "tool", "tool": "fails"}}}]}),
    )
    .await;
    let id = start_run(&server, "broken", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "failed", "{run:#}");
    let error = run["steps"]["both"]["error"].as_str().unwrap();
    assert!(error.starts_with("branch bad:"), "{error}");
}

#[tokio::test]
async fn a_map_and_a_parallel_step_keep_to_their_concurrency() {
    let server = start().await;
    // Each call leaves a mark while it runs and says how many marks it saw: no more calls than
    // the concurrency at once ever see each other.
    let marks = tempfile::tempdir().unwrap();
    let dir = marks.path().display();
    add_script(
        &server,
        "count",
        &format!(
            "f={dir}/run.$$; touch $f; sleep 0.15; n=$(ls {dir} | wc -l); sleep 0.15; rm $f; \
             echo \"{{\\\"seen\\\": $n}}\""
        ),
    )
    .await;
    let count = json!({"kind": "tool", "tool": "count"});
    save(
        &server,
        json!({"id": "bounded", "steps": [
            {"id": "each", "kind": "map", "items": "[1, 2, 3, 4, 5, 6]", "concurrency": 2, "step": count},
            {"id": "some", "kind": "parallel", "concurrency": 3,
             "branches": {"a": count, "b": count, "c": count, "d": count, "e": count}}
        ]}),
    )
    .await;
    let id = start_run(&server, "bounded", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let seen = |values: Vec<&Value>| -> Vec<u64> {
        values.iter().map(|v| v["seen"].as_u64().unwrap()).collect()
    };
    let map = seen(
        run["steps"]["each"]["output"]
            .as_array()
            .unwrap()
            .iter()
            .collect(),
    );
    assert_eq!(map.len(), 6);
    assert_eq!(
        map.iter().max(),
        Some(&2),
        "two at a time, never more: {map:?}"
    );
    let branches = seen(
        run["steps"]["some"]["output"]
            .as_object()
            .unwrap()
            .values()
            .collect(),
    );
    assert_eq!(branches.len(), 5);
    assert_eq!(
        branches.iter().max(),
        Some(&3),
        "three at a time: {branches:?}"
    );
}

#[tokio::test]
async fn failures_are_typed_retried_by_kind_and_handled_by_on_failure_steps() {
    let server = start().await;
    server.add_echo_tool().await;
    // Fails the first time it runs, then works (a mark file counts the runs).
    let marks = tempfile::tempdir().unwrap();
    let mark = marks.path().join("tried");
    add_script(
        &server,
        "flaky",
        &format!(
            "if [ -f {0} ]; then echo '{{\"ok\": true}}'; else touch {0}; echo down; exit 7; fi",
            mark.display()
        ),
    )
    .await;
    add_script(&server, "sleepy", "sleep 5; echo late").await;
    save(
        &server,
        json!({
            "id": "guarded",
            "steps": [
                // A tool failure, retried because the policy names `tool`.
                {"id": "flaky", "kind": "tool", "tool": "flaky", "needs": [],
                 "retry": {"attempts": 3, "backoff_secs": 0, "on": ["tool"]}},
                // An expression failure: not retried (the policy names only `tool`), handled.
                {"id": "bad", "kind": "tool", "tool": "echo", "needs": [],
                 "arguments": {"x": "{{ input.missing.deep }}"},
                 "retry": {"attempts": 3, "backoff_secs": 0, "on": ["tool"]},
                 "on_failure": "recover"},
                {"id": "recover", "kind": "tool", "tool": "echo", "needs": ["bad"],
                 "arguments": {"kind": "{{ steps.bad.error_kind }}", "why": "{{ steps.bad.error }}"}},
                {"id": "after_bad", "kind": "tool", "tool": "echo", "needs": ["bad"]},
                // A timeout, handled.
                {"id": "slow", "kind": "tool", "tool": "sleepy", "needs": [], "timeout_secs": 1,
                 "on_failure": "caught"},
                {"id": "caught", "kind": "tool", "tool": "echo", "needs": ["slow"],
                 "arguments": {"kind": "{{ steps.slow.error_kind }}"}},
                // A step that works: its handler is not taken.
                {"id": "fine", "kind": "tool", "tool": "echo", "needs": [], "on_failure": "unused"},
                {"id": "unused", "kind": "tool", "tool": "echo", "needs": ["fine"]},
                {"id": "end", "kind": "tool", "tool": "echo",
                 "needs": ["flaky", "recover", "after_bad", "caught", "fine", "unused"],
                 "arguments": {"flaky": "{{ steps.flaky.output.ok }}"}}
            ],
            "output": {"recovered": "{{ steps.recover.output }}", "caught": "{{ steps.caught.output.kind }}",
                       "flaky": "{{ steps.end.output.flaky }}"}
        }),
    )
    .await;
    let id = start_run(&server, "guarded", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    let steps = &run["steps"];
    assert_eq!(steps["flaky"]["state"], "succeeded");
    assert_eq!(steps["flaky"]["attempts"], 2, "retried once: {run:#}");
    assert_eq!(steps["bad"]["state"], "failed");
    assert_eq!(steps["bad"]["error_kind"], "expression");
    assert_eq!(
        steps["bad"]["attempts"], 1,
        "an expression failure is not retried"
    );
    assert_eq!(steps["recover"]["output"]["kind"], "expression");
    assert!(
        steps["recover"]["output"]["why"]
            .as_str()
            .unwrap()
            .contains("arguments"),
        "{run:#}"
    );
    assert_eq!(steps["after_bad"]["state"], "skipped");
    assert_eq!(steps["after_bad"]["not_taken"], true);
    assert_eq!(steps["slow"]["error_kind"], "timeout");
    assert_eq!(steps["caught"]["output"]["kind"], "timeout");
    assert_eq!(steps["unused"]["state"], "skipped");
    assert_eq!(steps["unused"]["not_taken"], true);
    assert_eq!(run["output"]["caught"], "timeout");
    assert_eq!(run["output"]["flaky"], true);

    // Without a handler, a failure fails the run, its kind said.
    std::fs::remove_file(&mark).unwrap();
    save(
        &server,
        json!({"id": "unguarded", "steps": [{"id": "flaky", "kind": "tool", "tool": "flaky",
               "retry": {"attempts": 3, "backoff_secs": 0, "on": ["timeout"]}}]}),
    )
    .await;
    let id = start_run(&server, "unguarded", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(run["steps"]["flaky"]["error_kind"], "tool");
    assert_eq!(
        run["steps"]["flaky"]["attempts"], 1,
        "only timeouts are retried"
    );
}

#[tokio::test]
async fn bad_definitions_are_refused_with_the_path_of_the_problem() {
    let server = start().await;
    server.add_echo_tool().await;
    let echo = |id: &str| json!({"id": id, "kind": "tool", "tool": "echo"});
    let cases = [
        (
            json!([echo("a"), {"id": "b", "kind": "tool", "tool": "echo", "needs": ["ghost"]}]),
            "steps[1].needs[0]",
        ),
        (
            json!([{"id": "a", "kind": "tool", "tool": "echo", "needs": ["b"]}, {"id": "b", "kind": "tool", "tool": "echo", "needs": ["a"]}]),
            "cycle",
        ),
        (json!([echo("a"), echo("a")]), "steps[1].id"),
        (
            json!([{"id": "a", "kind": "tool", "tool": "echo", "when": "1 +"}]),
            "steps[0].when",
        ),
        (
            json!([{"id": "a", "kind": "tool", "tool": "nope"}]),
            "steps[0].tool",
        ),
        (json!([{"id": "a", "kind": "teleport"}]), "steps[0].kind"),
        (
            json!([{"id": "a", "kind": "tool", "tool": "echo", "arguments": {"x": "{{ ("}}]),
            "steps[0].arguments.x",
        ),
        (
            json!([{"id": "a", "kind": "agent", "agent": "nobody", "prompt": "hi"}]),
            "steps[0].agent",
        ),
        (
            json!([{"id": "a", "kind": "map", "items": "input.list", "concurrency": 0, "step": {"kind": "tool", "tool": "echo"}}]),
            "steps[0].concurrency",
        ),
        (
            json!([{"id": "a", "kind": "map", "items": "input.list", "step": {"kind": "wait", "seconds": 1}}]),
            "steps[0].step.kind",
        ),
        (
            json!([{"id": "a", "kind": "wait", "seconds": 1, "extra": true}]),
            "steps[0]",
        ),
        (json!([]), "steps"),
        (
            json!([{"id": "p", "kind": "parallel", "branches": {}}]),
            "steps[0].branches",
        ),
        (
            json!([{"id": "p", "kind": "parallel", "branches": {"x": {"kind": "approval", "message": "?"}}}]),
            "steps[0].branches.x.kind",
        ),
        (
            json!([{"id": "p", "kind": "parallel", "branches": {"x": {"kind": "tool", "tool": "nope"}}}]),
            "steps[0].branches.x.tool",
        ),
        (
            json!([{"id": "s", "kind": "switch", "cases": [{"when": "true", "then": "ghost"}]}]),
            "steps[0].cases[0].then",
        ),
        (
            json!([{"id": "s", "kind": "switch", "cases": [{"when": "1 +", "then": "a"}]},
                   {"id": "a", "kind": "tool", "tool": "echo"}]),
            "steps[0].cases[0].when",
        ),
        (
            json!([{"id": "s", "kind": "switch", "cases": [{"when": "true", "then": "b"}], "default": "b"},
                   echo("a"), {"id": "b", "kind": "tool", "tool": "echo", "needs": ["s"]}]),
            "steps[0].default",
        ),
        (
            json!([echo("a"), {"id": "s", "kind": "switch", "cases": [{"when": "true", "then": "a"}]}]),
            "must need the switch",
        ),
        (
            json!([{"id": "a", "kind": "tool", "tool": "echo", "on_failure": "ghost"}]),
            "steps[0].on_failure",
        ),
        (
            json!([{"id": "a", "kind": "tool", "tool": "echo", "on_failure": "b"},
                   {"id": "b", "kind": "tool", "tool": "echo", "needs": []}]),
            "must need \"a\"",
        ),
        (
            json!([{"id": "a", "kind": "tool", "tool": "echo", "retry": {"attempts": 2, "on": []}}]),
            "steps[0].retry.on",
        ),
        (
            json!([{"id": "a", "kind": "tool", "tool": "echo", "retry": {"attempts": 2, "on": ["gremlins"]}}]),
            "gremlins",
        ),
    ];
    for (steps, path) in cases {
        let (status, body) = server
            .post("/v1/workflows", json!({"id": "bad", "steps": steps}))
            .await;
        assert_eq!(status, 400, "{steps}: {body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(path), "{path} not in {message}");
    }
    let (status, body) = server
        .post(
            "/v1/workflows",
            json!({"id": "bad", "input_schema": {"type": 7}, "steps": [echo("a")]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (_, list) = server.get("/v1/workflows").await;
    assert_eq!(list["workflows"], json!([]));
    // The published schema, for editors.
    let (status, schema) = server.get("/v1/workflow-schema").await;
    assert_eq!(status, 200);
    assert_eq!(schema["title"], "Agentry workflow");
}

/// An expression that grows a value past any bound fails its step in the renderer, as an
/// expression failure; one that does so whatever the input is refused when it is saved. The
/// server's memory does not grow either way.
#[tokio::test]
async fn an_expression_that_grows_without_bound_fails_its_step_not_the_server() {
    let server = start().await;
    server.add_echo_tool().await;
    let before = super::support::peak_memory_bytes();
    let part = "(input.s * 100000000)";
    let grow = [part; 8].join(" ~ ");
    save(
        &server,
        json!({"id": "grow", "steps": [
            {"id": "big", "kind": "tool", "tool": "echo", "arguments": {"x": format!("{{{{ {grow} }}}}")}},
            {"id": "after", "kind": "tool", "tool": "echo", "needs": ["big"]}
        ]}),
    )
    .await;
    let id = start_run(&server, "grow", json!({"s": "x"})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(run["steps"]["big"]["error_kind"], "expression", "{run:#}");
    let error = run["steps"]["big"]["error"].as_str().unwrap();
    assert!(error.contains("bytes of memory"), "{error}");

    // Constant, it is folded when the definition is checked: refused at save.
    let constant = grow.replace("input.s", "'x'");
    let (status, body) = server
        .post(
            "/v1/workflows",
            json!({"id": "folded", "steps": [{"id": "a", "kind": "tool", "tool": "echo", "when": constant}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("steps[0].when") && message.contains("bytes of memory"),
        "{message}"
    );
    let grown = super::support::peak_memory_bytes().saturating_sub(before);
    assert!(
        grown < 100 * 1024 * 1024,
        "the server grew by {grown} bytes"
    );

    // A modest input runs.
    save(
        &server,
        json!({"id": "small", "steps": [
            {"id": "big", "kind": "tool", "tool": "echo", "arguments": {"n": "{{ (input.s * 3) | length }}"}}
        ]}),
    )
    .await;
    let id = start_run(&server, "small", json!({"s": "ab"})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
}

#[tokio::test]
async fn a_step_is_retried_by_its_policy_and_a_failure_fails_the_run() {
    let server = start().await;
    server.add_echo_tool().await;
    let counter = server.home.path().join("tries");
    let script = format!(
        "n=$(cat {0} 2>/dev/null || echo 0); n=$((n+1)); echo $n > {0}; \
         if [ $n -lt 3 ]; then echo not yet >&2; exit 1; fi; echo \"{{\\\"tries\\\": $n}}\"",
        counter.display()
    );
    let (status, body) = server
        .post(
            "/v1/tools",
            json!({"kind": "command", "name": "flaky", "description": "Fails twice.",
                   "program": "/bin/sh", "args": ["-c", script]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    save(
        &server,
        json!({"id": "retry", "steps": [
            {"id": "try", "kind": "tool", "tool": "flaky", "retry": {"attempts": 3, "backoff_secs": 0.05}}
        ]}),
    )
    .await;
    let id = start_run(&server, "retry", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"]["try"]["attempts"], 3);
    assert_eq!(run["output"], json!({"tries": 3}));

    // Without enough attempts: the step fails, the run fails, and what follows never runs.
    std::fs::remove_file(&counter).unwrap();
    save(
        &server,
        json!({"id": "fail", "steps": [
            {"id": "try", "kind": "tool", "tool": "flaky", "retry": {"attempts": 2, "backoff_secs": 0.01}},
            {"id": "after", "kind": "tool", "tool": "echo"}
        ]}),
    )
    .await;
    let id = start_run(&server, "fail", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(run["steps"]["try"]["state"], "failed");
    assert_eq!(run["steps"]["try"]["attempts"], 2);
    assert!(
        run["error"].as_str().unwrap().contains("\"try\""),
        "{run:#}"
    );
    assert_eq!(run["steps"]["after"]["state"], "cancelled");
    // An ended run takes no more messages.
    let (status, _) = server
        .post(&format!("/v1/workflow-runs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 409);

    // A long timer, cancelled.
    save(
        &server,
        json!({"id": "sleepy", "steps": [{"id": "nap", "kind": "wait", "seconds": 3600}]}),
    )
    .await;
    let id = start_run(&server, "sleepy", json!({})).await;
    until(&server, &id, |run| run["state"] == "waiting").await;
    let (status, body) = server
        .post(&format!("/v1/workflow-runs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 202, "{body}");
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "cancelled");
    assert_eq!(run["steps"]["nap"]["state"], "cancelled");
    let (status, _) = server.get("/v1/workflow-runs/00000000-nope").await;
    assert_eq!(status, 404);
}

/// An approval's `timeout_secs` decides it by its `on_timeout` when nobody does: approved, the
/// run goes on; by default rejected, the run fails.
#[tokio::test]
async fn an_approval_nobody_decides_is_decided_by_its_timeout() {
    let server = start().await;
    server.add_echo_tool().await;
    save(
        &server,
        json!({"id": "lenient", "steps": [
            {"id": "ok", "kind": "approval", "message": "Go?", "timeout_secs": 1, "on_timeout": "approve"},
            {"id": "after", "kind": "tool", "tool": "echo", "arguments": {"text": "went"}}
        ]}),
    )
    .await;
    save(
        &server,
        json!({"id": "strict", "steps": [
            {"id": "ok", "kind": "approval", "message": "Go?", "timeout_secs": 1}
        ]}),
    )
    .await;
    let lenient = start_run(&server, "lenient", json!({})).await;
    let strict = start_run(&server, "strict", json!({})).await;
    let waiting = until(&server, &lenient, |run| run["state"] == "waiting").await;
    assert!(waiting["steps"]["ok"]["wake_at"].is_u64(), "{waiting:#}");
    let run = until(&server, &lenient, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"]["ok"]["decision"]["timed_out"], true);
    assert_eq!(run["steps"]["ok"]["decision"]["approved"], true);
    assert_eq!(run["steps"]["after"]["state"], "succeeded");
    let run = until(&server, &strict, ended).await;
    assert_eq!(run["state"], "failed", "{run:#}");
    assert_eq!(run["steps"]["ok"]["error_kind"], "rejected");
    assert_eq!(
        run["steps"]["ok"]["error"],
        "no decision before the timeout"
    );
}

#[tokio::test]
async fn an_agent_step_an_approval_a_timer_and_a_signal_survive_a_restart() {
    let server = start().await;
    server.state.app.start_worker();
    server.add_echo_tool().await;
    let (status, body) = server
        .post(
            "/v1/agents",
            json!({"id": "writer", "model_id": "mock", "system": "You write."}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    save(
        &server,
        json!({"id": "publish", "steps": [
            {"id": "draft", "kind": "agent", "agent": "writer", "prompt": "Write about {{ input.topic }}."},
            {"id": "review", "kind": "approval", "message": "Publish this? {{ steps.draft.output }}"},
            {"id": "pause", "kind": "wait", "seconds": 1},
            {"id": "feedback", "kind": "signal", "name": "feedback"},
            {"id": "final", "kind": "tool", "tool": "echo",
             "arguments": {"text": "{{ steps.draft.output }}", "note": "{{ steps.feedback.output.note }}",
                           "approved": "{{ steps.review.output.approved }}"}}
        ]}),
    )
    .await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("Cats sleep a lot.")));
    let id = start_run(&server, "publish", json!({"topic": "cats"})).await;
    let run = until(&server, &id, |run| {
        run["steps"]["review"]["state"] == "waiting"
    })
    .await;
    assert_eq!(run["state"], "waiting");
    assert_eq!(run["steps"]["draft"]["output"], "Cats sleep a lot.");
    assert_eq!(
        run["steps"]["review"]["message"],
        "Publish this? Cats sleep a lot."
    );
    // The agent ran in a session of its own, on the model, with the rendered prompt.
    let session = run["steps"]["draft"]["sessions"][0].as_str().unwrap();
    let (status, _) = server.get(&format!("/v1/sessions/{session}")).await;
    assert_eq!(status, 200);
    assert!(
        server.mock.requests()[0]
            .body
            .to_string()
            .contains("Write about cats.")
    );
    // A decision on a step that is not an approval, or an unknown step, is refused.
    let (status, _) = server
        .post(
            &format!("/v1/workflow-runs/{id}/approve"),
            json!({"step": "pause"}),
        )
        .await;
    assert_eq!(status, 400);
    let (status, _) = server
        .post(
            &format!("/v1/workflow-runs/{id}/approve"),
            json!({"step": "ghost"}),
        )
        .await;
    assert_eq!(status, 404);

    // The process stops while the approval waits; another starts on the same data.
    server.state.app.parts().shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let store = agentry_store::Store::open_home(server.home.path())
        .await
        .unwrap();
    let second = agentry_app::App::with_tools(store, host_commands(server.home.path()))
        .await
        .unwrap();
    assert_eq!(second.workflows().resume().await, 1);
    let operator = Principal::operator();
    let wait = |app: agentry_app::App, run: String, done: fn(&Value) -> bool| async move {
        for _ in 0..400 {
            let view = serde_json::to_value(
                app.workflows()
                    .run(&Principal::operator(), &run)
                    .await
                    .unwrap(),
            )
            .unwrap();
            if done(&view) {
                return view;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("never got there");
    };
    // The signal comes early: it is kept until the step waits for it.
    second
        .workflows()
        .signal(&operator, &id, "feedback", json!({"note": "shorter"}))
        .await
        .unwrap();
    second
        .workflows()
        .decide_step(&operator, &id, "review", true, Some("ok".into()))
        .await
        .unwrap();
    let run = wait(second.clone(), id.clone(), |run| {
        run["state"] == "succeeded"
    })
    .await;
    assert_eq!(
        run["output"],
        json!({"text": "Cats sleep a lot.", "note": "shorter", "approved": true})
    );
    assert_eq!(run["steps"]["review"]["decision"]["comment"], "ok");
    // The timer ran its second, after the approval.
    let waited = run["steps"]["pause"]["finished_at"].as_u64().unwrap()
        - run["steps"]["pause"]["started_at"].as_u64().unwrap();
    assert!(waited >= 1000, "{waited}");
    // The agent step was not run again: the model was asked once.
    assert_eq!(server.mock.requests().len(), 1);
    second.parts().shutdown.cancel();
}

#[tokio::test]
async fn a_loop_repeats_until_its_condition_and_a_sub_workflow_runs_as_a_step() {
    let server = start().await;
    server.add_echo_tool().await;
    save(
        &server,
        json!({"id": "double", "steps": [
            {"id": "calc", "kind": "tool", "tool": "echo", "arguments": {"value": "{{ input.n * 2 }}"}}
        ], "output": "{{ steps.calc.output.value }}"}),
    )
    .await;
    save(
        &server,
        json!({"id": "grow", "steps": [
            {"id": "grow", "kind": "loop", "max": 10, "until": "last >= 20",
             "step": {"kind": "workflow", "workflow": "double",
                      "input": {"n": "{{ last if last is not none else input.start }}"}}}
        ]}),
    )
    .await;
    let id = start_run(&server, "grow", json!({"start": 3})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    // 3 → 6 → 12 → 24: three iterations, each a run of `double` started by this one.
    assert_eq!(run["output"], 24);
    let (_, children) = server.get("/v1/workflow-runs?workflow_id=double").await;
    let children = children["runs"].as_array().unwrap();
    assert_eq!(children.len(), 3, "{children:#?}");
    assert!(children.iter().all(|child| child["parent"] == id.as_str()
        && child["depth"] == 1
        && child["state"] == "succeeded"));
    let mut outputs: Vec<u64> = children
        .iter()
        .map(|c| c["output"].as_u64().unwrap())
        .collect();
    outputs.sort_unstable();
    assert_eq!(outputs, [6, 12, 24]);

    // A loop whose condition never holds fails its step when it reaches its maximum.
    save(
        &server,
        json!({"id": "endless", "steps": [
            {"id": "spin", "kind": "loop", "max": 2, "until": "false",
             "step": {"kind": "tool", "tool": "echo", "arguments": {"i": "{{ iteration }}"}}}
        ]}),
    )
    .await;
    let id = start_run(&server, "endless", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "failed");
    assert!(
        run["steps"]["spin"]["error"]
            .as_str()
            .unwrap()
            .contains("after 2 iterations"),
        "{run:#}"
    );

    for (steps, path) in [
        (
            json!([{"id": "a", "kind": "workflow", "workflow": "ghost"}]),
            "steps[0].workflow",
        ),
        (
            json!([{"id": "a", "kind": "loop", "max": 0, "until": "true", "step": {"kind": "tool", "tool": "echo"}}]),
            "steps[0].max",
        ),
        (
            json!([{"id": "a", "kind": "loop", "max": 2, "until": "1 +", "step": {"kind": "tool", "tool": "echo"}}]),
            "steps[0].until",
        ),
    ] {
        let (status, body) = server
            .post("/v1/workflows", json!({"id": "bad", "steps": steps}))
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(path),
            "{body}"
        );
    }
}

#[tokio::test]
async fn a_run_is_followed_as_events_and_retried_from_its_failed_step() {
    let server = start().await;
    server.add_echo_tool().await;
    let gate = server.home.path().join("gate");
    let script = format!("test -e {} && cat", gate.display());
    let (status, body) = server
        .post(
            "/v1/tools",
            json!({"kind": "command", "name": "gated", "description": "Fails until the gate exists.",
                   "program": "/bin/sh", "args": ["-c", script]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    save(
        &server,
        json!({"id": "gated", "steps": [
            {"id": "one", "kind": "tool", "tool": "echo", "arguments": {"n": 1}},
            {"id": "two", "kind": "tool", "tool": "gated", "arguments": {"n": 2}},
            {"id": "three", "kind": "tool", "tool": "echo", "arguments": {"n": "{{ steps.two.output.n + 1 }}"}}
        ]}),
    )
    .await;
    let id = start_run(&server, "gated", json!({})).await;
    // Followed as server-sent events until it ends: the whole run first, then each change,
    // numbered (a step's new state, the run's own).
    // (From the first change on, whenever the stream is opened: `Last-Event-ID: 0`.)
    let fresh = sse_events(&server, &id, None).await;
    assert_eq!(fresh[0].0, "run");
    assert!(fresh[0].2["definition"].is_object(), "{:?}", fresh[0]);
    let events = sse_events(&server, &id, Some(0)).await;
    assert_eq!(events[0].1, 1, "{events:?}");
    let (last_name, _, last) = events.last().unwrap();
    assert_eq!(
        (last_name.as_str(), last["state"].as_str()),
        ("run", Some("failed"))
    );
    let steps: Vec<(String, String)> = events
        .iter()
        .filter(|(name, _, _)| name == "step")
        .map(|(_, _, data)| {
            (
                data["step"].as_str().unwrap().to_owned(),
                data["run"]["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(
        steps.contains(&("two".into(), "failed".into())),
        "{steps:?}"
    );
    let numbers: Vec<u64> = events.iter().map(|(_, id, _)| *id).collect();
    assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
    // Reconnecting after a number: only the changes after it, no whole run first.
    let middle = numbers[numbers.len() / 2];
    let resumed = sse_events(&server, &id, Some(middle)).await;
    let resumed_numbers: Vec<u64> = resumed.iter().map(|(_, id, _)| *id).collect();
    assert_eq!(
        resumed_numbers,
        numbers
            .iter()
            .copied()
            .filter(|n| *n > middle)
            .collect::<Vec<_>>()
    );
    let refused = server
        .http
        .get(format!("{}/v1/workflow-runs/{id}/stream", server.url))
        .header("last-event-id", "soon")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let (_, run) = server.get(&format!("/v1/workflow-runs/{id}")).await;
    assert_eq!(run["steps"]["one"]["state"], "succeeded");
    assert_eq!(run["steps"]["two"]["state"], "failed");
    let first_one = run["steps"]["one"]["finished_at"].clone();

    // Retried: the failed step and what follows run; the step that succeeded is kept.
    std::fs::write(&gate, "").unwrap();
    let (status, body) = server
        .post(&format!("/v1/workflow-runs/{id}/retry"), json!({}))
        .await;
    assert_eq!(status, 202, "{body}");
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["output"], json!({"n": 3}));
    assert_eq!(run["steps"]["one"]["finished_at"], first_one);
    // A run that succeeded is not retried.
    let (status, _) = server
        .post(&format!("/v1/workflow-runs/{id}/retry"), json!({}))
        .await;
    assert_eq!(status, 409);
    let (status, _) = server.get("/v1/workflow-runs/not-a-run/stream").await;
    assert_eq!(status, 404);
}

/// A workflow's trigger URL: a secret made (and remade), deliveries signed the Standard
/// Webhooks way or carrying the secret as a bearer token start runs with the body as input,
/// the same delivery twice starts one run, and what is not authenticated starts nothing.
#[tokio::test]
async fn a_trigger_url_starts_runs_once_per_delivery() {
    let server = start().await;
    server.add_echo_tool().await;
    save(
        &server,
        json!({"id": "hooked", "input_schema": {"type": "object", "required": ["order"]},
               "steps": [{"id": "say", "kind": "tool", "tool": "echo",
                          "arguments": {"order": "{{ input.order }}"}}]}),
    )
    .await;
    let hook = format!("{}/hooks/workflows/hooked", server.url);
    let post = |headers: Vec<(&'static str, String)>, body: &'static str| {
        let mut request = server.http.post(&hook).body(body);
        for (name, value) in headers {
            request = request.header(name, value);
        }
        async move {
            let response = request.send().await.unwrap();
            let status = response.status().as_u16();
            let text = response.text().await.unwrap();
            (
                status,
                serde_json::from_str::<Value>(&text).unwrap_or(Value::String(text)),
            )
        }
    };
    // No trigger yet: nothing is accepted.
    let (status, _) = post(vec![("authorization", "Bearer whsec_x".into())], "{}").await;
    assert_eq!(status, 401);
    let (status, _) = server.post("/v1/workflows/ghost/trigger", json!({})).await;
    assert_eq!(status, 404);
    let (status, made) = server.post("/v1/workflows/hooked/trigger", json!({})).await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["path"], "/hooks/workflows/hooked");
    let secret = made["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("whsec_"));

    // A signed delivery starts a run; the same delivery again answers the same run.
    let body = r#"{"order": 42}"#;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let signed = |id: &str, at: u64| {
        vec![
            ("webhook-id", id.to_owned()),
            ("webhook-timestamp", at.to_string()),
            (
                "webhook-signature",
                agentry_app::standard_webhooks::sign(&secret, id, at, body).unwrap(),
            ),
        ]
    };
    let (status, first) = post(signed("msg_1", now), body).await;
    assert_eq!(status, 202, "{first}");
    let run = first["run_id"].as_str().unwrap().to_owned();
    let (status, again) = post(signed("msg_1", now), body).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["run_id"], run.as_str());
    let done = until(&server, &run, ended).await;
    assert_eq!(done["state"], "succeeded", "{done:#}");
    assert_eq!(done["input"], json!({"order": 42}));
    assert_eq!(done["steps"]["say"]["output"]["order"], 42);
    // Another delivery id is another run.
    let (status, second) = post(signed("msg_2", now), body).await;
    assert_eq!(status, 202);
    assert_ne!(second["run_id"], run.as_str());

    // Refused: a stale timestamp, a signature over another body, a wrong bearer token, none.
    let (status, _) = post(signed("msg_3", now - 600), body).await;
    assert_eq!(status, 401);
    let mut forged = signed("msg_4", now);
    forged[2].1 = agentry_app::standard_webhooks::sign(&secret, "msg_4", now, "{}").unwrap();
    let (status, _) = post(forged, body).await;
    assert_eq!(status, 401);
    let (status, _) = post(vec![("authorization", "Bearer whsec_AAAA".into())], body).await;
    assert_eq!(status, 401);
    let (status, _) = post(vec![], body).await;
    assert_eq!(status, 401);
    // The secret as a bearer token, idempotent by `Idempotency-Key`; bad input is a 400.
    let bearer = |key: &str| {
        vec![
            ("authorization", format!("Bearer {secret}")),
            ("idempotency-key", key.to_owned()),
        ]
    };
    let (status, third) = post(bearer("k1"), body).await;
    assert_eq!(status, 202, "{third}");
    let (status, repeat) = post(bearer("k1"), body).await;
    assert_eq!((status, &repeat["run_id"]), (200, &third["run_id"]));
    let (status, _) = post(bearer("k2"), "[1, 2]").await;
    assert_eq!(status, 400);
    let (status, _) = post(bearer("k3"), r#"{"no_order": 1}"#).await;
    assert_eq!(status, 400);
    let (_, runs) = server.get("/v1/workflow-runs?workflow_id=hooked").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 3);

    // A new secret replaces the old; a deleted trigger accepts nothing.
    let (_, remade) = server.post("/v1/workflows/hooked/trigger", json!({})).await;
    assert_ne!(remade["secret"].as_str().unwrap(), secret);
    let (status, _) = post(bearer("k4"), body).await;
    assert_eq!(status, 401);
    let (status, _) = server
        .raw(reqwest::Method::DELETE, "/v1/workflows/hooked/trigger", "")
        .await;
    assert_eq!(status, 204);
    let fresh = remade["secret"].as_str().unwrap().to_owned();
    let (status, _) = post(vec![("authorization", format!("Bearer {fresh}"))], body).await;
    assert_eq!(status, 401);
}

/// An agent step with an output schema: the prompt carries the schema; an answer that is not
/// JSON, then one that misses a required field, goes back to the agent in the same session
/// with what is wrong, until it fits (the output is the parsed JSON); past its repairs, the
/// attempt fails with the last problem.
#[tokio::test]
async fn a_structured_answer_is_repaired_in_the_same_session() {
    let server = with_analyst().await;
    let schema = json!({"type": "object", "required": ["total"],
                        "properties": {"total": {"type": "number"}}});
    save(
        &server,
        json!({"id": "tally", "steps": [
            {"id": "count", "kind": "agent", "agent": "analyst", "prompt": "Add 2 and 3.",
             "output_schema": schema, "repair_attempts": 2}
        ]}),
    )
    .await;
    for answer in [
        "The total is five.",
        r#"{"sum": 5}"#,
        "```json\n{\"total\": 5}\n```",
    ] {
        server
            .mock
            .enqueue(Reply::scripted(ScriptedTurn::text(answer)));
    }
    let id = start_run(&server, "tally", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"]["count"]["output"], json!({"total": 5}));
    // One session: three turns, the complaints naming what was wrong.
    assert_eq!(
        run["steps"]["count"]["sessions"].as_array().unwrap().len(),
        1
    );
    let requests = server.mock.requests();
    assert_eq!(requests.len(), 3);
    let first = requests[0].body.to_string();
    assert!(
        first.contains("Add 2 and 3.") && first.contains("required"),
        "{first}"
    );
    let second = requests[1].body.to_string();
    assert!(
        second.contains("The total is five.") && second.contains("it is not JSON"),
        "{second}"
    );
    let third = requests[2].body.to_string();
    assert!(
        third.contains("does not match the schema") && third.contains("total"),
        "{third}"
    );

    // With no repairs left the attempt fails with the last problem.
    save(
        &server,
        json!({"id": "strict", "steps": [
            {"id": "count", "kind": "agent", "agent": "analyst", "prompt": "Add.",
             "output_schema": schema, "repair_attempts": 0}
        ]}),
    )
    .await;
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("five")));
    let id = start_run(&server, "strict", json!({})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "failed", "{run:#}");
    let error = run["steps"]["count"]["error"].as_str().unwrap();
    assert!(error.contains("it is not JSON"), "{error}");
    // More repairs than allowed is refused at saving, with the path.
    let (status, body) = server
        .post(
            "/v1/workflows",
            json!({"id": "greedy", "steps": [{"id": "a", "kind": "agent", "agent": "analyst",
                   "prompt": "x", "repair_attempts": 9}]}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.to_string().contains("steps[0].repair_attempts"),
        "{body}"
    );
}

/// A schedule that starts a workflow: checked when saved (the workflow exists, the input fits,
/// a run or a workflow but not both); each slot starts one workflow run with the schedule's
/// input, also when the slot is seen due again after a crash.
#[tokio::test]
async fn a_schedule_starts_a_workflow_once_per_slot() {
    let server = start().await;
    server.add_echo_tool().await;
    save(
        &server,
        json!({"id": "nightly", "input_schema": {"type": "object", "required": ["region"]},
               "steps": [{"id": "bill", "kind": "tool", "tool": "echo",
                          "arguments": {"region": "{{ input.region }}"}}]}),
    )
    .await;
    let workflow = json!({"workflow_id": "nightly", "input": {"region": "eu"}});
    let (status, made) = server
        .post(
            "/v1/schedules",
            json!({"cron": "0 2 * * *", "timezone": "Europe/Paris", "workflow": workflow}),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(made["workflow"], workflow);
    assert!(made.get("run").is_none(), "{made}");
    assert_eq!(made["name"], "nightly at 0 2 * * * (Europe/Paris)");
    for (bad, status_expected) in [
        (
            json!({"interval_secs": 60, "workflow": {"workflow_id": "ghost"}}),
            404,
        ),
        (
            json!({"interval_secs": 60, "workflow": {"workflow_id": "nightly", "input": {}}}),
            400,
        ),
        (
            json!({"interval_secs": 60, "workflow": workflow, "run": {"text": "x", "model_id": "mock"}}),
            400,
        ),
        (json!({"interval_secs": 60}), 400),
    ] {
        let (status, body) = server.post("/v1/schedules", bad.clone()).await;
        assert_eq!(status, status_expected, "{bad}: {body}");
    }
    let (_, all) = server.get("/v1/schedules").await;
    assert_eq!(all["schedules"].as_array().unwrap().len(), 1);

    // A slot due now (fired by hand, as the worker's loop does).
    let slot = agentry_app::clock::now_ms() - 100;
    let schedule = agentry_store::NewSchedule {
        id: agentry_types::RunId::new().to_string(),
        name: "due".into(),
        owner: None,
        cron: None,
        timezone: "UTC".into(),
        interval_secs: Some(3600),
        request: json!({"workflow": workflow}),
        enabled: true,
        catch_up: "skip".into(),
        overlap: "skip".into(),
        next_fire_at: Some(slot),
    };
    server
        .state
        .app
        .parts()
        .store
        .create_schedule(&schedule)
        .await
        .unwrap();
    server.state.app.schedules().fire_due().await;
    let (_, shown) = server.get(&format!("/v1/schedules/{}", schedule.id)).await;
    let run = shown["last_run_id"].as_str().unwrap().to_owned();
    let done = until(&server, &run, ended).await;
    assert_eq!(done["state"], "succeeded", "{done:#}");
    assert_eq!(done["steps"]["bill"]["output"]["region"], "eu");
    // The process died before moving the schedule on: the same slot again starts nothing new.
    server
        .state
        .app
        .parts()
        .store
        .update_schedule(&schedule)
        .await
        .unwrap();
    server.state.app.schedules().fire_due().await;
    let (_, runs) = server.get("/v1/workflow-runs?workflow_id=nightly").await;
    assert_eq!(runs["runs"].as_array().unwrap().len(), 1, "{runs:#}");
    let (_, shown) = server.get(&format!("/v1/schedules/{}", schedule.id)).await;
    assert_eq!(shown["last_run_id"], run.as_str());
    assert!(shown["next_fires"][0].as_u64().unwrap() > slot + 3_000_000);
}

/// A workflow built from Rust is saved, checked and run like a document.
#[tokio::test]
async fn a_workflow_built_from_rust_runs() {
    use agentry_app::workflows::WorkflowDefinition;
    use agentry_app::workflows::definition::StepDefinition;
    let server = start().await;
    server.add_echo_tool().await;
    let built = WorkflowDefinition::new("built")
        .step(StepDefinition::tool(
            "first",
            "echo",
            json!({"n": "{{ input.n }}"}),
        ))
        .step(
            StepDefinition::tool(
                "double",
                "echo",
                json!({"twice": "{{ steps.first.output.n * 2 }}"}),
            )
            .retry(2, 0.1),
        );
    let saved = server.state.app.workflows().create(built).await.unwrap();
    assert_eq!(saved.version, 1);
    // Checked the same way: an unknown tool is refused with its path.
    let error = server
        .state
        .app
        .workflows()
        .create(WorkflowDefinition::new("broken").step(StepDefinition::tool(
            "a",
            "ghost",
            json!({}),
        )))
        .await
        .unwrap_err();
    assert!(error.message.contains("steps[0]"), "{}", error.message);
    let id = start_run(&server, "built", json!({"n": 21})).await;
    let run = until(&server, &id, ended).await;
    assert_eq!(run["state"], "succeeded", "{run:#}");
    assert_eq!(run["steps"]["double"]["output"]["twice"], 42);
}

#[tokio::test]
async fn an_agent_step_runs_as_the_key_that_started_the_workflow_is_now() {
    use agentry_app::auth::{KeyLimits, create_key, revoke_key};

    use super::security::{as_key, with_keys};

    let server = with_analyst().await;
    save(
        &server,
        json!({"id": "later", "steps": [
            {"id": "nap", "kind": "wait", "seconds": 1},
            {"id": "ask", "kind": "agent", "agent": "analyst", "prompt": "Hello.",
             "needs": ["nap"]}
        ]}),
    )
    .await;
    let (owner, _, _) = with_keys(&server, KeyLimits::default()).await;
    let other = create_key(&server.state.app.parts().store, "another admin")
        .await
        .unwrap();
    let (status, run) = as_key(
        &server,
        &owner,
        "POST",
        "/v1/workflows/later/runs",
        json!({"input": {}}),
    )
    .await;
    assert_eq!(status, 202, "{run}");
    let id = run["run_id"].as_str().unwrap().to_owned();
    // The key goes while the run waits: its agent step does not run.
    let owner_id = owner.split('_').nth(1).unwrap();
    assert!(
        revoke_key(&server.state.app.parts().store, owner_id)
            .await
            .unwrap()
    );
    let mut run = Value::Null;
    for _ in 0..200 {
        let (status, body) = as_key(
            &server,
            &other.key,
            "GET",
            &format!("/v1/workflow-runs/{id}"),
            json!({}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        run = body;
        if ended(&run) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(run["state"], "failed", "{run:#}");
    assert!(run.to_string().contains("revoked"), "{run:#}");
    assert!(
        server.mock.requests().is_empty(),
        "the model was asked nothing"
    );
}
