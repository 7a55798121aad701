//! Several `agentry serve` nodes on one PostgreSQL database (a fresh database per test): any
//! node takes any request; a killed node's runs finish on the others, each tool call executed
//! at most once and every committed event kept; a node paused past its lease is fenced out and
//! rejoins; a client on one node streams and controls a run live on another, and its status
//! feed shows the other nodes' runs; a rolling restart of every node fails no run and loses no
//! streamed event; configuration
//! made on one node is used on the others; a schedule fires once per slot and a run's webhook
//! is delivered once whichever node sends it; and the bad starts
//! (a taken node id, a newer schema, an unreachable database) are refused with a clear error.

use std::collections::HashMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_testkit::{Chunking, MockProvider, Reply, ScriptedTurn};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

use super::processes::free_port;

/// The PostgreSQL server the tests use (`AGENTRY_TEST_DATABASE_URL`, as the store's tests).
fn base_url() -> String {
    std::env::var("AGENTRY_TEST_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://root@127.0.0.1:5432/test".to_owned())
}

async fn psql(url: &str, sql: &str) -> String {
    let output = tokio::process::Command::new("psql")
        .args([url, "-Atqc", sql])
        .output()
        .await
        .expect("psql runs");
    assert!(
        output.status.success(),
        "psql {sql}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// A fresh database, dropped with the value.
struct Database {
    name: String,
    url: String,
}

impl Database {
    async fn new() -> Self {
        let name = format!("cluster_{}", uuid_hex());
        psql(&base_url(), &format!("CREATE DATABASE {name}")).await;
        let base = base_url();
        let url = match base.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("unexpected database URL {base}"),
        };
        Self { name, url }
    }
}

impl Drop for Database {
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

fn uuid_hex() -> String {
    format!("{:032x}", fastrand::u128(..))
}

/// One node: its process, its port, what it printed.
struct Node {
    id: String,
    port: u16,
    child: tokio::process::Child,
    log: Arc<Mutex<Vec<String>>>,
}

impl Node {
    fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    fn pid(&self) -> i32 {
        self.child.id().unwrap() as i32
    }

    /// Sends `signal` (`STOP`, `CONT`, `TERM`) to the node's process.
    fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// The nodes' data folders share one secret key, as the nodes of a cluster must.
struct Homes {
    root: tempfile::TempDir,
}

impl Homes {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let key = root.path().join("secret.key");
        agentry_store::SecretKey::load_or_create(&key).unwrap();
        Self { root }
    }

    fn home(&self, id: &str) -> std::path::PathBuf {
        let home = self.root.path().join(id);
        if !home.exists() {
            std::fs::create_dir_all(&home).unwrap();
            std::fs::copy(self.root.path().join("secret.key"), home.join("secret.key")).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(
                home.join("secret.key"),
                std::fs::Permissions::from_mode(0o600),
            )
            .unwrap();
        }
        home
    }
}

fn spawn(home: &Path, url: &str, id: &str, port: u16, extra: &[&str]) -> tokio::process::Child {
    // Every node's workspaces on one shared folder (beside the data folders), as a cluster's
    // nodes must have to take over each other's runs, unless `extra` names a folder of its own.
    let shared = home.parent().unwrap().join("workspaces");
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_agentry"));
    command.arg("--home").arg(home).arg("serve");
    if !extra.contains(&"--workspaces") {
        command.arg("--workspaces").arg(&shared);
    }
    command
        .args(["--database-url", url])
        .args([&format!("127.0.0.1:{port}"), "--node-id", id])
        .args(["--lease-secs", "2", "--approve", "none", "--sandbox", "off"])
        .args(["--allow-domain", "127.0.0.1", "--allow-private"])
        .args(extra)
        .env_remove("OPENAI_API_KEY")
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

/// Starts node `id` and waits until it listens; everything it prints is kept.
async fn start(homes: &Homes, db: &Database, id: &str, extra: &[&str]) -> Node {
    let port = free_port();
    let mut child = spawn(&homes.home(id), &db.url, id, port, extra);
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), stdout.next_line())
        .await
        .expect("the node starts")
        .unwrap();
    assert!(
        first
            .as_deref()
            .is_some_and(|line| line.starts_with("Agentry is listening")),
        "{first:?}"
    );
    let out = Arc::clone(&log);
    tokio::spawn(async move {
        while let Ok(Some(line)) = stdout.next_line().await {
            out.lock().unwrap().push(line);
        }
    });
    let err = Arc::clone(&log);
    tokio::spawn(async move {
        while let Ok(Some(line)) = stderr.next_line().await {
            err.lock().unwrap().push(line);
        }
    });
    Node {
        id: id.into(),
        port,
        child,
        log,
    }
}

async fn get(node: &Node, path: &str) -> Value {
    agentry_llm::http_client(Duration::from_secs(60))
        .unwrap()
        .get(format!("{}{path}", node.base()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

async fn post(node: &Node, path: &str, body: Value) -> (u16, Value) {
    let response = agentry_llm::http_client(Duration::from_secs(60))
        .unwrap()
        .post(format!("{}{path}", node.base()))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Registers the mock as model `m` on `node`.
async fn add_model(node: &Node, mock: &MockProvider) {
    let (status, body) = post(
        node,
        "/v1/models",
        json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "x"}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
}

/// An HTTP server counting the requests to each path: the non-idempotent tool's effect.
async fn counter() -> (u16, Arc<Mutex<HashMap<String, u32>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits: Arc<Mutex<HashMap<String, u32>>> = Arc::default();
    let counted = Arc::clone(&hits);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let counted = Arc::clone(&counted);
            tokio::spawn(async move {
                let mut buffer = vec![0_u8; 4096];
                let Ok(read) = socket.read(&mut buffer).await else {
                    return;
                };
                let request = String::from_utf8_lossy(&buffer[..read]).into_owned();
                if let Some(path) = request.split_whitespace().nth(1) {
                    *counted.lock().unwrap().entry(path.to_owned()).or_default() += 1;
                }
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 4\r\nconnection: close\r\n\r\ndone")
                    .await;
            });
        }
    });
    (port, hits)
}

/// Waits for a background run to stop, asking `node`.
async fn wait_run(node: &Node, run: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let view = get(node, &format!("/v1/runs/{run}/wait?timeout_secs=10")).await;
        let state = view["state"].as_str().unwrap_or_default().to_owned();
        if ["succeeded", "failed", "cancelled", "waiting", "paused"].contains(&state.as_str()) {
            return view;
        }
        assert!(Instant::now() < deadline, "run {run} did not stop: {view}");
    }
}

/// The kinds of a session's committed events.
async fn kinds(node: &Node, session: &str) -> Vec<String> {
    let events = get(node, &format!("/v1/sessions/{session}/events")).await;
    events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["event"]["type"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_nodes_thirty_runs_finish_on_the_others_each_call_run_at_most_once() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    let (hits_port, hits) = counter().await;
    let nodes = [
        start(&homes, &db, "a", &[]).await,
        start(&homes, &db, "b", &[]).await,
        start(&homes, &db, "c", &[]).await,
    ];
    add_model(&nodes[0], &mock).await;
    let cluster = get(&nodes[1], "/v1/cluster").await;
    let alive: Vec<&str> = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["state"] == "alive")
        .map(|node| node["id"].as_str().unwrap())
        .collect();
    assert_eq!(alive, vec!["a", "b", "c"], "{cluster}");
    // Each run calls the counting tool once (its own path), then answers slowly: the answers
    // are still being written when node a is killed.
    for n in 0..30 {
        mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
            "fetch",
            json!({"url": format!("http://127.0.0.1:{hits_port}/call/{n}")}),
        )));
    }
    mock.set_fallback(
        Reply::scripted(ScriptedTurn::text("finished")).delay_headers(Duration::from_millis(1500)),
    );
    // Wait until the configuration reached every node (a second at most).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let mut runs = Vec::new();
    for n in 0..30 {
        let node = &nodes[n % 3];
        let (status, run) = post(
            node,
            "/v1/runs",
            json!({"text": format!("run {n}"), "model_id": "m", "tool_ids": ["fetch"]}),
        )
        .await;
        assert_eq!(status, 202, "{run}");
        runs.push(run["run_id"].as_str().unwrap().to_owned());
    }
    // Every run is under way (its tool called, its answer pending) before the kill.
    let deadline = Instant::now() + Duration::from_secs(30);
    while hits.lock().unwrap().len() < 30 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cluster = get(&nodes[1], "/v1/cluster").await;
    assert_eq!(cluster["nodes"][0]["id"], "a", "{cluster}");
    let held_by_a = cluster["nodes"][0]["running_runs"].as_u64().unwrap_or(0);
    let [mut a, b, c] = nodes;
    a.child.start_kill().unwrap();
    a.child.wait().await.unwrap();
    let killed = Instant::now();
    for run in &runs {
        let done = wait_run(&b, run).await;
        assert_eq!(done["state"], "succeeded", "{done}\n--- b ---\n{}", b.log());
        assert_eq!(done["outcome"]["text"], "finished", "{done}");
        // One run in its log: started once, finished once, whatever node ended it.
        let session = done["session_id"].as_str().unwrap();
        let kinds = kinds(&c, session).await;
        assert_eq!(
            kinds.iter().filter(|k| *k == "run_started").count(),
            1,
            "{kinds:?}"
        );
        assert_eq!(
            kinds.iter().filter(|k| *k == "run_finished").count(),
            1,
            "{kinds:?}"
        );
    }
    let taken_over = {
        let mut count = 0;
        for run in &runs {
            if get(&c, &format!("/v1/runs/{run}")).await["attempt"] == 2 {
                count += 1;
            }
        }
        count
    };
    assert!(
        held_by_a > 0 && taken_over > 0,
        "node a held {held_by_a} runs, {taken_over} were taken over"
    );
    assert!(
        killed.elapsed() < Duration::from_secs(40),
        "the runs took {:?} to finish after the kill",
        killed.elapsed()
    );
    // The counting tool ran once per call, never twice.
    let hits = hits.lock().unwrap().clone();
    assert_eq!(hits.len(), 30, "{hits:?}");
    assert!(hits.values().all(|count| *count == 1), "{hits:?}");
    // The dead node is seen as dead.
    let cluster = get(&b, "/v1/cluster").await;
    let a_state = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["id"] == "a")
        .map(|node| node["state"].clone());
    assert_eq!(a_state, Some(json!("dead")), "{cluster}");
}

/// The node id of the process running a background run (`<node>/<process>`), once it runs.
async fn owner_of(node: &Node, run: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let view = get(node, &format!("/v1/runs/{run}")).await;
        if let Some(worker) = view["worker"].as_str() {
            return worker.split('/').next().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "run {run} never started: {view}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server-sent event stream, read to its end: each event's name, id and data.
async fn read_stream(node: &Node, path: &str) -> Vec<(String, Option<u64>, Value)> {
    read_stream_at(&node.base(), path).await.unwrap()
}

/// [`read_stream`] from the node at `base`; an error when the connection fails or breaks.
async fn read_stream_at(
    base: &str,
    path: &str,
) -> Result<Vec<(String, Option<u64>, Value)>, reqwest::Error> {
    read_stream_as(base, path, None).await
}

/// [`read_stream_at`] with the credential header `auth` (`authorization` or `cookie`).
async fn read_stream_as(
    base: &str,
    path: &str,
    auth: Option<(&str, &str)>,
) -> Result<Vec<(String, Option<u64>, Value)>, reqwest::Error> {
    let mut request = agentry_llm::http_client(Duration::from_secs(60))
        .unwrap()
        .get(format!("{base}{path}"));
    if let Some((name, value)) = auth {
        request = request.header(name, value);
    }
    let body = request.send().await?.error_for_status()?.text().await?;
    Ok(body
        .split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut id = None;
            let mut data = String::new();
            for line in block.lines() {
                if let Some(value) = line.strip_prefix("event: ") {
                    name = Some(value.to_owned());
                } else if let Some(value) = line.strip_prefix("id: ") {
                    id = value.parse().ok();
                } else if let Some(value) = line.strip_prefix("data: ") {
                    data.push_str(value);
                }
            }
            Some((
                name?,
                id,
                serde_json::from_str(&data).unwrap_or(Value::Null),
            ))
        })
        .collect())
}

fn streamed_text(events: &[(String, Option<u64>, Value)]) -> String {
    events
        .iter()
        .filter(|(name, _, _)| name == "delta.text")
        .map(|(_, _, data)| data["text"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_on_any_node_streams_and_controls_a_run_live_on_another() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    let nodes = [
        start(&homes, &db, "a", &[]).await,
        start(&homes, &db, "b", &[]).await,
        start(&homes, &db, "c", &[]).await,
    ];
    // Configuration made on one node is used on every other one within a second.
    add_model(&nodes[2], &mock).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("ready")));
    let (status, answer) = post(
        &nodes[0],
        "/v1/infer",
        json!({"model_id": "m", "text": "hello"}),
    )
    .await;
    assert_eq!(status, 200, "{answer}");

    // A run streaming slowly: every node streams it, the two that do not run it included.
    let words: Vec<String> = (0..12).map(|n| format!("w{n} ")).collect();
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text(words.concat()))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(120)),
    );
    let (status, run) = post(
        &nodes[0],
        "/v1/runs",
        json!({"model_id": "m", "text": "stream"}),
    )
    .await;
    assert_eq!(status, 202, "{run}");
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let owner = owner_of(&nodes[1], &run_id).await;
    let path = format!("/v1/runs/{run_id}/stream");
    let (on_a, on_b, on_c) = tokio::join!(
        read_stream(&nodes[0], &path),
        read_stream(&nodes[1], &path),
        read_stream(&nodes[2], &path)
    );
    for (name, events) in [("a", &on_a), ("b", &on_b), ("c", &on_c)] {
        // Every delta, in order, and the committed events with the owner's ids, none missing.
        assert_eq!(
            streamed_text(events),
            words.concat(),
            "node {name} (the run is on {owner}): {events:?}"
        );
        let ids: Vec<u64> = events.iter().filter_map(|(_, id, _)| *id).collect();
        let owner_ids: Vec<u64> = match owner.as_str() {
            "a" => &on_a,
            "b" => &on_b,
            _ => &on_c,
        }
        .iter()
        .filter_map(|(_, id, _)| *id)
        .collect();
        assert_eq!(ids, owner_ids, "node {name}");
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
        assert!(
            events.iter().any(|(name, _, _)| name == "run.finished"),
            "node {name}: {events:?}"
        );
    }

    // An interrupt sent to a node that does not run the run stops it.
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("x ".repeat(200)))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(100)),
    );
    let (_, run) = post(
        &nodes[1],
        "/v1/runs",
        json!({"model_id": "m", "text": "long"}),
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let owner = owner_of(&nodes[1], &run_id).await;
    let other = nodes.iter().find(|node| node.id != owner).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, interrupted) =
        post(other, &format!("/v1/runs/{run_id}/interrupt"), json!({})).await;
    assert_eq!(status, 200, "{interrupted}");
    let done = wait_run(other, &run_id).await;
    assert_eq!(done["state"], "cancelled", "{done}");

    // A conversation's run (no lease, a record of its own) cancelled through its record on a
    // node that does not run it: its node stops it.
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("y ".repeat(200)))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(100)),
    );
    let talking = {
        let url = format!("{}/v1/infer", nodes[0].base());
        tokio::spawn(async move {
            let response = agentry_llm::http_client(Duration::from_secs(60))
                .unwrap()
                .post(url)
                .json(&json!({"model_id": "m", "text": "talk", "session_id": "new"}))
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            (status, response.json::<Value>().await.unwrap())
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let run_id = loop {
        let listed = get(&nodes[2], "/v1/runs?background=false&state=running").await;
        if let Some(id) = listed["runs"][0]["run_id"].as_str() {
            break id.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "the conversation's run never showed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (status, cancelled) =
        post(&nodes[2], &format!("/v1/runs/{run_id}/cancel"), json!({})).await;
    assert_eq!(status, 200, "{cancelled}");
    let (status, answer) = talking.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["stop_reason"], "cancelled", "{answer}");
    let done = wait_run(&nodes[1], &run_id).await;
    assert_eq!(done["state"], "cancelled", "{done}");
    assert_eq!(done["background"], false, "{done}");

    // An approval sent to a node that did not run the run continues it.
    // (The model answers slowly, so the run is seen running on its node first.)
    mock.enqueue(
        Reply::scripted(ScriptedTurn::tool_call(
            "fetch",
            json!({"url": "http://127.0.0.1:9/never"}),
        ))
        .delay_headers(Duration::from_millis(1000)),
    );
    let (_, run) = post(
        &nodes[2],
        "/v1/runs",
        json!({"model_id": "m", "text": "ask", "tool_ids": ["fetch"],
               "approvals": {"tools": {"fetch": "always"}}}),
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let owner = owner_of(&nodes[2], &run_id).await;
    let waiting = wait_run(&nodes[2], &run_id).await;
    assert_eq!(waiting["state"], "waiting", "{waiting}");
    let approvals = get(&nodes[0], &format!("/v1/runs/{run_id}/approvals")).await;
    let call = approvals["pending"][0]["call"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let other = nodes.iter().find(|node| node.id != owner).unwrap();
    mock.enqueue(Reply::scripted(ScriptedTurn::text("rejected, fine")));
    let (status, decided) = post(
        other,
        &format!("/v1/runs/{run_id}/approvals"),
        json!({"call_id": call, "decision": "reject", "reason": "not now"}),
    )
    .await;
    assert_eq!(status, 200, "{decided}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let done = loop {
        let view = wait_run(&nodes[0], &run_id).await;
        if view["state"] != "waiting" || Instant::now() > deadline {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["outcome"]["text"], "rejected, fine", "{done}");
}

/// `method path` with `body` on `node`, with the credential header `auth`.
async fn send_as(
    node: &Node,
    method: reqwest::Method,
    path: &str,
    body: Value,
    auth: (&str, &str),
) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = agentry_llm::http_client(Duration::from_secs(60))
        .unwrap()
        .request(method, format!("{}{path}", node.base()))
        .header(auth.0, auth.1)
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let text = response.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// With keys: a user key and a console login made on one node stream and interrupt runs live
/// on another. The relay carries an assertion signed with the cluster's key instead of the
/// client's credentials (security review 2, N15), so a login, which only its own node knows,
/// works across nodes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_or_a_login_on_one_node_controls_a_run_live_on_another() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    let nodes = [
        start(&homes, &db, "a", &[]).await,
        start(&homes, &db, "b", &[]).await,
    ];
    // The first key is minted without credentials; it makes a user key.
    let (status, admin) = post(&nodes[0], "/v1/api-keys", json!({"label": "admin"})).await;
    assert_eq!(status, 201, "{admin}");
    let admin = format!("Bearer {}", admin["key"].as_str().unwrap());
    let (status, _, user) = send_as(
        &nodes[0],
        reqwest::Method::POST,
        "/v1/api-keys",
        json!({"label": "user", "role": "user"}),
        ("authorization", &admin),
    )
    .await;
    assert_eq!(status, 201, "{user}");
    let user_key = user["key"].as_str().unwrap().to_owned();
    let user = format!("Bearer {user_key}");
    let (status, _, model) = send_as(
        &nodes[1],
        reqwest::Method::POST,
        "/v1/models",
        json!({"id": "m", "protocol": "openai", "base_url": mock.openai_base_url(),
               "model_name": "gpt-mock"}),
        ("authorization", &admin),
    )
    .await;
    assert_eq!(status, 201, "{model}");
    tokio::time::sleep(Duration::from_millis(1000)).await;

    // A console login on node b (its cookie is b's alone).
    let (status, headers, _) = send_as(
        &nodes[1],
        reqwest::Method::POST,
        "/v1/auth/login",
        json!({"api_key": user_key}),
        ("x-unused", "-"),
    )
    .await;
    assert_eq!(status, 204);
    let cookie = headers["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();

    // Runs live on node a (a conversation runs on the node it was posted to); the client talks
    // to node b only, with the key, then with b's login.
    for (attempt, auth) in [
        ("authorization", user.as_str()),
        ("cookie", cookie.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        for interrupt in [false, true] {
            let words: Vec<String> = (0..12).map(|n| format!("w{attempt}.{n} ")).collect();
            mock.enqueue(
                Reply::scripted(ScriptedTurn::text(words.concat()))
                    .chunked(Chunking::SseEvents)
                    .paced(Duration::from_millis(150)),
            );
            let talking = {
                let url = format!("{}/v1/infer", nodes[0].base());
                let user = user.clone();
                tokio::spawn(async move {
                    let response = agentry_llm::http_client(Duration::from_secs(60))
                        .unwrap()
                        .post(url)
                        .header("authorization", user)
                        .json(&json!({"model_id": "m", "text": "talk", "session_id": "new"}))
                        .send()
                        .await
                        .unwrap();
                    response.json::<Value>().await.unwrap()
                })
            };
            let deadline = Instant::now() + Duration::from_secs(10);
            let running = loop {
                let (_, _, listed) = send_as(
                    &nodes[1],
                    reqwest::Method::GET,
                    "/v1/runs?background=false&state=running",
                    Value::Null,
                    auth,
                )
                .await;
                if listed["runs"][0]["run_id"].is_string() {
                    break listed["runs"][0].clone();
                }
                assert!(Instant::now() < deadline, "the run never showed: {listed}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            let run_id = running["run_id"].as_str().unwrap();
            if interrupt {
                let (status, _, interrupted) = send_as(
                    &nodes[1],
                    reqwest::Method::POST,
                    &format!("/v1/runs/{run_id}/interrupt"),
                    json!({}),
                    auth,
                )
                .await;
                assert_eq!(status, 200, "{} {interrupted}", auth.0);
                let answer = talking.await.unwrap();
                assert_eq!(answer["stop_reason"], "cancelled", "{} {answer}", auth.0);
            } else {
                let events = read_stream_as(
                    &nodes[1].base(),
                    &format!("/v1/runs/{run_id}/stream"),
                    Some(auth),
                )
                .await
                .unwrap();
                assert_eq!(
                    streamed_text(&events),
                    words.concat(),
                    "{} {events:?}",
                    auth.0
                );
                let answer = talking.await.unwrap();
                assert_eq!(answer["text"], words.concat(), "{answer}");
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_paused_past_its_lease_is_fenced_out_and_rejoins() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    let nodes = [
        start(&homes, &db, "a", &[]).await,
        start(&homes, &db, "b", &[]).await,
    ];
    add_model(&nodes[0], &mock).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // The first answer trickles (the pause catches it mid-way); the one after the takeover
    // comes at once.
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("slow ".repeat(40)))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(100)),
    );
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("taken over")));
    let (_, run) = post(
        &nodes[0],
        "/v1/runs",
        json!({"model_id": "m", "text": "pause me"}),
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let owner = owner_of(&nodes[0], &run_id).await;
    let (paused, other) = if owner == "a" {
        (&nodes[0], &nodes[1])
    } else {
        (&nodes[1], &nodes[0])
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    paused.signal("STOP");
    let done = wait_run(other, &run_id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 2, "{done}");
    assert_eq!(done["outcome"]["text"], "taken over", "{done}");
    let cluster = get(other, "/v1/cluster").await;
    let state_of = |cluster: &Value, id: &str| {
        cluster["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|node| node["id"] == id)
            .map(|node| node["state"].clone())
    };
    assert_eq!(
        state_of(&cluster, &paused.id),
        Some(json!("dead")),
        "{cluster}"
    );
    // It wakes up: whatever it still tries to write for the run is refused; it joins again.
    paused.signal("CONT");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let cluster = get(other, "/v1/cluster").await;
        if state_of(&cluster, &paused.id) == Some(json!("alive")) {
            break;
        }
        assert!(Instant::now() < deadline, "{cluster}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let session = done["session_id"].as_str().unwrap();
    let kinds = kinds(other, session).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "run_finished").count(),
        1,
        "{kinds:?}"
    );
    let events = get(other, &format!("/v1/sessions/{session}/events")).await;
    let texts: Vec<String> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["event"]["message"]["content"].as_array().cloned())
        .flatten()
        .filter_map(|part| part["text"].as_str().map(str::to_owned))
        .collect();
    assert!(
        !texts.iter().any(|text| text.starts_with("slow")),
        "the paused node's answer was refused: {texts:?}"
    );
    // The woken node serves again.
    mock.enqueue(Reply::scripted(ScriptedTurn::text("back")));
    let (status, answer) = post(paused, "/v1/infer", json!({"model_id": "m", "text": "hi"})).await;
    assert_eq!(status, 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_once_per_slot_with_three_nodes() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("tick")));
    // The schedule fires every second: below the default floor of a minute.
    let every_second = ["--min-schedule-interval-secs", "1"];
    let nodes = [
        start(&homes, &db, "a", &every_second).await,
        start(&homes, &db, "b", &every_second).await,
        start(&homes, &db, "c", &every_second).await,
    ];
    add_model(&nodes[0], &mock).await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (status, schedule) = post(
        &nodes[1],
        "/v1/schedules",
        json!({"interval_secs": 1, "run": {"text": "tick", "model_id": "m"}}),
    )
    .await;
    assert_eq!(status, 201, "{schedule}");
    let id = schedule["id"].as_str().unwrap();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let removed = agentry_llm::http_client(Duration::from_secs(10))
        .unwrap()
        .delete(format!("{}/v1/schedules/{id}", nodes[2].base()))
        .send()
        .await
        .unwrap();
    assert!(removed.status().is_success(), "{}", removed.status());
    let elapsed = started.elapsed().as_secs_f64();
    let runs = get(&nodes[0], &format!("/v1/runs?schedule_id={id}&limit=100")).await;
    let runs = runs["runs"].as_array().unwrap();
    // One run per one-second slot, whichever nodes saw it due: never more than the slots.
    assert!(!runs.is_empty());
    assert!(
        (runs.len() as f64) <= elapsed.ceil() + 1.0,
        "{} runs in {elapsed:.1} s: {runs:#?}",
        runs.len()
    );
    let mut sessions: Vec<&str> = runs
        .iter()
        .map(|run| run["session_id"].as_str().unwrap())
        .collect();
    sessions.sort_unstable();
    sessions.dedup();
    assert_eq!(sessions.len(), runs.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_starts_are_refused_with_a_clear_error() {
    let db = Database::new().await;
    let homes = Homes::new();
    let first = start(&homes, &db, "same", &[]).await;
    // Two live nodes with one id.
    let output = spawn(&homes.home("other"), &db.url, "same", free_port(), &[])
        .wait_with_output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("another live node holds the id \"same\""),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&output.stdout).contains("listening"));
    drop(first);
    // A database a newer Agentry migrated.
    psql(
        &db.url,
        "INSERT INTO agentry_migrations (version, applied_at) VALUES (999, 0)",
    )
    .await;
    let output = spawn(&homes.home("newer"), &db.url, "newer", free_port(), &[])
        .wait_with_output()
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("newer than this build"), "{stderr}");
    // A database nobody answers for.
    let output = spawn(
        &homes.home("unreachable"),
        &format!("postgres://root@127.0.0.1:{}/nothing", free_port()),
        "lonely",
        free_port(),
        &[],
    )
    .wait_with_output()
    .await
    .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.to_lowercase().contains("connect"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_whose_node_is_killed_goes_on_on_another() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    let nodes = [
        start(&homes, &db, "a", &[]).await,
        start(&homes, &db, "b", &[]).await,
    ];
    add_model(&nodes[0], &mock).await;
    mock.enqueue(Reply::scripted(ScriptedTurn::text("hello")));
    let (status, first) = post(
        &nodes[0],
        "/v1/infer",
        json!({"session_id": "new", "model_id": "m", "text": "hi"}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let session = first["session_id"].as_str().unwrap().to_owned();
    // The next turn, on node a, waits on its model when a is killed.
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("never seen")).delay_headers(Duration::from_secs(30)),
    );
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("after the failover")));
    let url = format!("{}/v1/infer", nodes[0].base());
    let body = json!({"session_id": session, "model_id": "m", "text": "and now?"});
    let pending = tokio::spawn(async move {
        agentry_llm::http_client(Duration::from_secs(60))
            .unwrap()
            .post(url)
            .json(&body)
            .send()
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while mock.request_count() < 2 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A run's first model call goes out while its start commits: a is killed once the second
    // run's start is in the shared log (read through b), or the turn would never have begun.
    while Instant::now() < deadline {
        let started = kinds(&nodes[1], &session)
            .await
            .iter()
            .filter(|kind| *kind == "run_started")
            .count();
        if started == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let [mut a, b] = nodes;
    a.child.start_kill().unwrap();
    a.child.wait().await.unwrap();
    assert!(
        pending.await.unwrap().is_err(),
        "the client's connection died with a"
    );
    // Node b takes the session over once a's lease runs out and finishes the turn.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let detail = get(&b, &format!("/v1/sessions/{session}")).await;
        if detail["session"]["status"] == "idle" || detail["status"] == "idle" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{detail}\n--- b ---\n{}",
            b.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let kinds = kinds(&b, &session).await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "run_started").count(),
        2,
        "{kinds:?}"
    );
    assert_eq!(
        kinds.iter().filter(|k| *k == "run_finished").count(),
        2,
        "{kinds:?}"
    );
    let events = get(&b, &format!("/v1/sessions/{session}/events")).await;
    assert!(
        events.to_string().contains("after the failover"),
        "{events}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_with_sigterm_finishes_its_run_and_its_clients_resume_elsewhere() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    let nodes = [
        start(&homes, &db, "a", &[]).await,
        start(&homes, &db, "b", &[]).await,
    ];
    add_model(&nodes[0], &mock).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let words: Vec<String> = (0..25).map(|n| format!("w{n} ")).collect();
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text(words.concat()))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(100)),
    );
    let (_, run) = post(
        &nodes[0],
        "/v1/runs",
        json!({"model_id": "m", "text": "go"}),
    )
    .await;
    let run_id = run["run_id"].as_str().unwrap().to_owned();
    let owner = owner_of(&nodes[1], &run_id).await;
    let (stopping, other) = if owner == "a" {
        (&nodes[0], &nodes[1])
    } else {
        (&nodes[1], &nodes[0])
    };
    // A client follows the run through the other node; the owner is told to stop meanwhile.
    let path = format!("/v1/runs/{run_id}/stream");
    let reading = read_stream(other, &path);
    let stopping_pid = stopping.pid();
    let stop = async {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &stopping_pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    let (first, ()) = tokio::join!(reading, stop);
    // Its stream may end early (the owner went away): it resumes from the last id it has,
    // on the node still up, and nothing is missing.
    let last = first.iter().filter_map(|(_, id, _)| *id).max().unwrap_or(0);
    let rest = if first.iter().any(|(name, _, _)| name == "run.finished") {
        Vec::new()
    } else {
        read_stream(other, &format!("{path}?after={last}")).await
    };
    let done = wait_run(other, &run_id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["attempt"], 1, "finished by its own node: {done}");
    let ids: Vec<u64> = first
        .iter()
        .chain(rest.iter())
        .filter_map(|(_, id, _)| *id)
        .collect();
    let session = done["session_id"].as_str().unwrap();
    let logged: Vec<u64> = get(other, &format!("/v1/sessions/{session}/events")).await["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|event| event["event"]["type"] != "usage")
        .map(|event| event["seq"].as_u64().unwrap())
        .collect();
    for seq in &logged {
        assert!(
            ids.contains(seq),
            "seq {seq} missing: {ids:?} of {logged:?}"
        );
    }
    assert!(
        first
            .iter()
            .chain(rest.iter())
            .any(|(name, _, _)| name == "run.finished")
    );
    // The stopped node exits cleanly and is seen as stopped; restarted, it joins again.
    let [mut a, mut b] = nodes;
    let stopped = if owner == "a" { &mut a } else { &mut b };
    let status = tokio::time::timeout(Duration::from_secs(20), stopped.child.wait())
        .await
        .expect("the node stops within its grace")
        .unwrap();
    assert!(status.success(), "{status}\n{}", stopped.log());
    let up = if owner == "a" { &b } else { &a };
    let cluster = get(up, "/v1/cluster").await;
    let state = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["id"] == owner.as_str())
        .map(|node| node["state"].clone());
    assert_eq!(state, Some(json!("stopped")), "{cluster}");
    let again = start(&homes, &db, &owner, &[]).await;
    let cluster = get(&again, "/v1/cluster").await;
    let state = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|node| node["id"] == owner.as_str())
        .map(|node| node["state"].clone());
    assert_eq!(state, Some(json!("alive")), "{cluster}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_status_feed_shows_the_runs_of_the_others() {
    use futures::StreamExt as _;
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    let nodes = [
        start(&homes, &db, "a", &[]).await,
        start(&homes, &db, "b", &[]).await,
    ];
    add_model(&nodes[0], &mock).await;
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("slowly")).delay_headers(Duration::from_millis(1500)),
    );
    // Node b's feed, read in the background.
    let feed = agentry_llm::http_client(Duration::from_secs(60))
        .unwrap()
        .get(format!("{}/v1/sessions/events", nodes[1].base()))
        .send()
        .await
        .unwrap();
    let seen: Arc<Mutex<String>> = Arc::default();
    let into = Arc::clone(&seen);
    let reader = tokio::spawn(async move {
        let mut body = feed.bytes_stream();
        while let Some(Ok(chunk)) = body.next().await {
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk));
        }
    });
    let (status, done) = post(
        &nodes[0],
        "/v1/infer",
        json!({"session_id": "new", "model_id": "m", "text": "hi"}),
    )
    .await;
    assert_eq!(status, 200, "{done}");
    let session = done["session_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let text = seen.lock().unwrap().clone();
        let mine: Vec<Value> = text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .filter(|change| change["session_id"] == session.as_str())
            .collect();
        let statuses: Vec<&str> = mine
            .iter()
            .filter_map(|change| change["status"].as_str())
            .collect();
        if statuses.contains(&"running") && statuses.last() == Some(&"idle") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node b's feed: {statuses:?}\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    reader.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_deliver_each_runs_webhook_once() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("done")));
    let private = ["--webhook-allow-private"];
    let nodes = [
        start(&homes, &db, "a", &private).await,
        start(&homes, &db, "b", &private).await,
        start(&homes, &db, "c", &private).await,
    ];
    add_model(&nodes[0], &mock).await;
    let (status, secret) = post(&nodes[1], "/v1/webhook-secret", json!({})).await;
    assert_eq!(status, 201, "{secret}");
    // A receiver that records each delivery's id.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hook = format!("http://{}/hook", listener.local_addr().unwrap());
    let ids: Arc<Mutex<Vec<String>>> = Arc::default();
    let recorded = Arc::clone(&ids);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let recorded = Arc::clone(&recorded);
            tokio::spawn(async move {
                let mut buffer = vec![0_u8; 65536];
                let Ok(read) = socket.read(&mut buffer).await else {
                    return;
                };
                let request = String::from_utf8_lossy(&buffer[..read]).into_owned();
                if let Some(id) = request.lines().find_map(|line| {
                    line.to_ascii_lowercase()
                        .strip_prefix("webhook-id: ")
                        .map(|id| id.trim().to_owned())
                }) {
                    recorded.lock().unwrap().push(id);
                }
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    let mut runs = Vec::new();
    for n in 0..9 {
        let (status, run) = post(
            &nodes[n % 3],
            "/v1/runs",
            json!({"text": "hook", "model_id": "m", "webhook_url": hook}),
        )
        .await;
        assert_eq!(status, 202, "{run}");
        runs.push(run["run_id"].as_str().unwrap().to_owned());
    }
    for run in &runs {
        assert_eq!(wait_run(&nodes[2], run).await["state"], "succeeded");
    }
    // Every node's worker looks at the one outbox: each run's delivery goes out once.
    let deadline = Instant::now() + Duration::from_secs(20);
    while ids.lock().unwrap().len() < runs.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut got = ids.lock().unwrap().clone();
    assert_eq!(got.len(), runs.len(), "{got:?}");
    got.sort();
    got.dedup();
    assert_eq!(got.len(), runs.len(), "a delivery id came twice");
    for run in &runs {
        let log = get(&nodes[0], &format!("/v1/runs/{run}/webhooks")).await;
        assert_eq!(log["deliveries"].as_array().unwrap().len(), 1, "{log}");
        assert_eq!(log["deliveries"][0]["attempts"], 1, "{log}");
    }
}

/// Follows a run's stream to its end through whichever nodes are up (`bases`, `None` while a
/// node restarts), resuming from the last event id it has each time a stream ends early.
async fn follow(
    bases: Arc<Mutex<Vec<Option<String>>>>,
    run: String,
    first: usize,
) -> Vec<(String, Option<u64>, Value)> {
    let path = format!("/v1/runs/{run}/stream");
    let mut seen: Vec<(String, Option<u64>, Value)> = Vec::new();
    let mut pick = first;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        assert!(
            Instant::now() < deadline,
            "run {run} never finished: {seen:?}"
        );
        let base = bases.lock().unwrap()[pick % 3].clone();
        pick += 1;
        let Some(base) = base else { continue };
        let last = seen.iter().filter_map(|(_, id, _)| *id).max().unwrap_or(0);
        let Ok(events) = read_stream_at(&base, &format!("{path}?after={last}")).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        seen.extend(events);
        if seen.iter().any(|(name, _, _)| name == "run.finished") {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_all_three_nodes_fails_no_run_and_loses_no_streamed_event() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    let mut nodes = [
        start(&homes, &db, "a", &[]).await,
        start(&homes, &db, "b", &[]).await,
        start(&homes, &db, "c", &[]).await,
    ];
    add_model(&nodes[0], &mock).await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    // Every run streams twenty words over two seconds.
    let words: Vec<String> = (0..20).map(|n| format!("w{n} ")).collect();
    let answer = words.concat();
    mock.set_fallback(
        Reply::scripted(ScriptedTurn::text(answer.clone()))
            .chunked(Chunking::SseEvents)
            .paced(Duration::from_millis(100)),
    );
    let bases: Arc<Mutex<Vec<Option<String>>>> = Arc::new(Mutex::new(
        nodes.iter().map(|node| Some(node.base())).collect(),
    ));
    let mut readers = Vec::new();
    let mut runs = Vec::new();
    for restarting in 0..3 {
        // Runs started, and followed, through the nodes that stay up this round; any node's
        // worker may take them, the one about to stop included.
        for k in 0..4 {
            let via = (restarting + 1 + k % 2) % 3;
            let (status, run) = post(
                &nodes[via],
                "/v1/runs",
                json!({"model_id": "m", "text": format!("round {restarting} run {k}")}),
            )
            .await;
            assert_eq!(status, 202, "{run}");
            let run = run["run_id"].as_str().unwrap().to_owned();
            runs.push(run.clone());
            readers.push(tokio::spawn(follow(Arc::clone(&bases), run, via)));
        }
        tokio::time::sleep(Duration::from_millis(600)).await;
        // The node stops (SIGTERM), its runs finish or move, and it comes back.
        bases.lock().unwrap()[restarting] = None;
        nodes[restarting].signal("TERM");
        let status = tokio::time::timeout(Duration::from_secs(30), nodes[restarting].child.wait())
            .await
            .expect("the node stops within its grace")
            .unwrap();
        assert!(status.success(), "{status}\n{}", nodes[restarting].log());
        let id = nodes[restarting].id.clone();
        nodes[restarting] = start(&homes, &db, &id, &[]).await;
        bases.lock().unwrap()[restarting] = Some(nodes[restarting].base());
    }
    for (run, reader) in runs.iter().zip(readers) {
        let streamed = reader.await.unwrap();
        let done = wait_run(&nodes[0], run).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        assert_eq!(
            done["outcome"]["text"].as_str().map(str::trim_end),
            Some(answer.trim_end()),
            "{done}"
        );
        // Every committed event reached the client once, in order, whichever nodes it went
        // through.
        let ids: Vec<u64> = streamed.iter().filter_map(|(_, id, _)| *id).collect();
        assert!(ids.windows(2).all(|pair| pair[0] < pair[1]), "{ids:?}");
        let session = done["session_id"].as_str().unwrap();
        let logged: Vec<u64> =
            get(&nodes[1], &format!("/v1/sessions/{session}/events")).await["events"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|event| event["event"]["type"] != "usage")
                .map(|event| event["seq"].as_u64().unwrap())
                .collect();
        for seq in &logged {
            assert!(
                ids.contains(seq),
                "run {run}: seq {seq} missing: {ids:?} of {logged:?}"
            );
        }
    }
    // All three nodes are back and alive.
    let cluster = get(&nodes[2], "/v1/cluster").await;
    let alive = cluster["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|node| node["state"] == "alive")
        .count();
    assert_eq!(alive, 3, "{cluster}");
}

/// Starts a turn of `session` on `node` whose model answers only after 30 s, then kills the
/// node while the turn waits on it, once `observer` sees the run's start committed (the model
/// is asked while the start is being written).
async fn kill_mid_turn(node: Node, observer: &Node, mock: &MockProvider, session: &str) {
    let before = mock.request_count();
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("never seen")).delay_headers(Duration::from_secs(30)),
    );
    let url = format!("{}/v1/infer", node.base());
    let body = json!({"session_id": session, "model_id": "m", "text": "and now?"});
    let pending = tokio::spawn(async move {
        agentry_llm::http_client(Duration::from_secs(60))
            .unwrap()
            .post(url)
            .json(&body)
            .send()
            .await
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while mock.request_count() <= before && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    detail_until(observer, session, |detail| {
        detail["session"]["status"] == "running"
    })
    .await;
    let mut node = node;
    node.child.start_kill().unwrap();
    node.child.wait().await.unwrap();
    assert!(pending.await.unwrap().is_err());
}

/// Polls `node`'s detail of `session` until `done` accepts it (20 s at most).
async fn detail_until(node: &Node, session: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let detail = get(node, &format!("/v1/sessions/{session}")).await;
        if done(&detail) {
            return detail;
        }
        assert!(
            Instant::now() < deadline,
            "{detail}\n--- {} ---\n{}",
            node.id,
            node.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Issue 48: a conversation whose node died on a workspace volume no live node has cannot be
/// taken over (its files are there): its detail says so (`waiting_for_volume`, the volume and
/// since when), and a node started with `--stranded-after-secs` takes it after that wait and
/// resumes it (`--stranded-action resume`) or ends it `interrupted` for a person to continue
/// (`interrupt`, the default). A background run stranded so is resumed under `resume` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_stranded_on_a_dead_nodes_volume_says_so_then_is_resumed_or_interrupted() {
    let db = Database::new().await;
    let homes = Homes::new();
    let mock = MockProvider::start().await.unwrap();
    mock.set_fallback(Reply::scripted(ScriptedTurn::text("taken over")));
    let folder = |name: &str| homes.root.path().join(name).display().to_string();
    let (wa, wb, wc, we, wf) = (
        folder("volume-a"),
        folder("volume-b"),
        folder("volume-c"),
        folder("volume-e"),
        folder("volume-f"),
    );
    let a = start(&homes, &db, "a", &["--workspaces", &wa]).await;
    add_model(&a, &mock).await;
    // A background run, taken by a (the only node yet), waits on its model when a dies.
    mock.enqueue(
        Reply::scripted(ScriptedTurn::text("never seen")).delay_headers(Duration::from_secs(30)),
    );
    let (status, run) = post(&a, "/v1/runs", json!({"model_id": "m", "text": "long"})).await;
    assert_eq!(status, 202, "{run}");
    let background = run["run_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while mock.request_count() < 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // b, on a volume of its own and with no policy, may only wait and say so.
    let b = start(&homes, &db, "b", &["--workspaces", &wb]).await;
    let (status, first) = post(
        &a,
        "/v1/infer",
        json!({"session_id": "new", "model_id": "m", "text": "hi"}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let session = first["session_id"].as_str().unwrap().to_owned();
    let volume_a = std::fs::read_to_string(format!("{wa}/.agentry-volume")).unwrap();
    kill_mid_turn(a, &b, &mock, &session).await;
    let waiting = detail_until(&b, &session, |detail| {
        !detail["waiting_for_volume"].is_null()
    })
    .await;
    assert_eq!(
        waiting["waiting_for_volume"]["volume"],
        volume_a.trim(),
        "{waiting}"
    );
    assert!(waiting["waiting_for_volume"]["since"].as_u64().unwrap() > 0);
    assert_eq!(waiting["session"]["status"], "running", "{waiting}");
    // Still waiting a while later: b never takes it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = get(&b, &format!("/v1/sessions/{session}")).await;
    assert!(!still["waiting_for_volume"].is_null(), "{still}");

    // c resumes it, a second after the dead node's lease.
    let c = start(
        &homes,
        &db,
        "c",
        &[
            "--workspaces",
            &wc,
            "--stranded-after-secs",
            "1",
            "--stranded-action",
            "resume",
        ],
    )
    .await;
    let resumed = detail_until(&b, &session, |detail| detail["session"]["status"] == "idle").await;
    assert!(resumed["waiting_for_volume"].is_null(), "{resumed}");
    assert!(resumed.to_string().contains("taken over"), "{resumed}");
    // The background run too (the run queue's claim).
    let finished = wait_run(&b, &background).await;
    assert_eq!(finished["state"], "succeeded", "{finished}");
    assert!(finished.to_string().contains("taken over"), "{finished}");
    drop(c);

    // A conversation on e, which dies; f interrupts it after its wait instead.
    let e = start(&homes, &db, "e", &["--workspaces", &we]).await;
    let (status, first) = post(
        &e,
        "/v1/infer",
        json!({"session_id": "new", "model_id": "m", "text": "hello"}),
    )
    .await;
    assert_eq!(status, 200, "{first}");
    let second = first["session_id"].as_str().unwrap().to_owned();
    kill_mid_turn(e, &b, &mock, &second).await;
    let _f = start(
        &homes,
        &db,
        "f",
        &["--workspaces", &wf, "--stranded-after-secs", "1"],
    )
    .await;
    let interrupted = detail_until(&b, &second, |detail| {
        detail["session"]["status"] == "interrupted"
    })
    .await;
    assert!(interrupted["waiting_for_volume"].is_null(), "{interrupted}");
    let events = get(&b, &format!("/v1/sessions/{second}/events")).await;
    assert!(
        events
            .to_string()
            .contains("no live node has its workspace volume"),
        "{events}"
    );
}
