//! A real server on loopback, its mock model, and small HTTP/SSE helpers.

use std::time::Duration;

use std::path::PathBuf;

use agentry_app::ToolEnvironment;
use agentry_core::template::isolation::{self, IsolationConfig};
use agentry_sandbox::{BackendKind, SandboxConfig, SandboxPool, SandboxSpec};
use agentry_server::{AppState, router};
use agentry_store::{ConfigKind, Store};
use agentry_testkit::MockProvider;
use eventsource_stream::Eventsource;
use futures::StreamExt;
use serde_json::{Value, json};

pub struct Server {
    pub url: String,
    pub state: AppState,
    pub mock: MockProvider,
    pub http: reqwest::Client,
    pub home: tempfile::TempDir,
}

/// A server with a `mock` model (OpenAI protocol) and a `slow` command tool (about 600 ms).
///
/// It has no sandbox and allows host commands, so the command tools of these tests run on the
/// host: the tests using it are about runs, tools and the API, not about where commands run
/// (that is `hostcmd.rs`, and [`start_sandboxed`] for MCP servers).
pub async fn start() -> Server {
    start_with(host_commands, |_| {}).await
}

/// No sandbox, host commands allowed, and no approvals by risk class: `slow` is a host command
/// tool, which would otherwise ask for approval (the defaults have tests of their own).
pub fn host_commands(_: &std::path::Path) -> ToolEnvironment {
    ToolEnvironment {
        allow_host_commands: true,
        approval_defaults: agentry_core::tool::ApprovalDefaults::none(),
        ..ToolEnvironment::default()
    }
}

/// [`host_commands`], for tests that adjust the state.
pub fn no_default_approvals() -> ToolEnvironment {
    host_commands(std::path::Path::new("."))
}
/// A server like [`start`] with native sandboxes and host commands not allowed: stdio MCP
/// servers run each in a sandbox of their own (workspaces under `<home>/mcp-workspaces`), and the
/// installed test servers are shown read-only inside (`--sandbox-ro-mount`).
pub async fn start_sandboxed() -> Server {
    start_with(sandboxed_mcp, |_| {}).await
}

/// The installed MCP servers, under their canonical path (the path a sandbox shows them at,
/// with no `..` through folders the sandbox lacks).
pub fn mcp_servers() -> agentry_testkit::mcp::McpServers {
    let found = agentry_testkit::mcp::McpServers::locate().unwrap();
    agentry_testkit::mcp::McpServers::at(std::fs::canonicalize(found.root()).unwrap()).unwrap()
}

/// Native sandboxes whose template shows the installed MCP servers read-only; stdio MCP
/// servers' workspaces under `<home>/mcp-workspaces`; host commands not allowed.
pub fn sandboxed_mcp(home: &std::path::Path) -> ToolEnvironment {
    let installed = mcp_servers();
    let backend = agentry_sandbox::backend(SandboxConfig {
        backend: BackendKind::Native,
        init_exe: Some(sandbox_init_exe()),
        ..Default::default()
    })
    .expect("the native sandbox backend (user namespaces) on this host");
    let mut template = SandboxSpec::new(home.join("placeholder"));
    template.ro_mounts = vec![installed.root().to_path_buf()];
    ToolEnvironment {
        sandboxes: Some(SandboxPool::new(backend, template)),
        sandbox_root: Some(home.join("sandboxes")),
        mcp_workspaces: Some(home.join("mcp-workspaces")),
        ..Default::default()
    }
}

/// The sandbox agent executable the workspace builds (`agentry-sandbox-init`, a bin of
/// agentry-sandbox).
pub fn sandbox_init_exe() -> PathBuf {
    workspace_bin("agentry-sandbox-init")
}

/// A bin the workspace builds, next to this test binary's folder: `target/debug/deps/all-…` →
/// `target/debug/<name>`.
fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let debug = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test binary lives in target/<profile>/deps");
    let bin = debug.join(name);
    assert!(
        bin.is_file(),
        "{} is missing: build it first with `cargo build --workspace --bins` (a workspace test \
         run builds every bin)",
        bin.display()
    );
    bin
}

/// Renders templates out of process, as `agentry serve` does, in the workspace's
/// `agentry-template-renderer` (a bin of agentry-core).
pub fn isolate_template_renders() {
    let config = IsolationConfig::new(workspace_bin("agentry-template-renderer"));
    assert!(
        isolation::isolate(config),
        "renders isolated elsewhere first"
    );
}

/// This process's peak resident memory (`VmHWM`), in bytes: the server under test runs in it.
pub fn peak_memory_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .unwrap();
    kib * 1024
}

/// Tools with native sandboxes made by the workspace's `agentry-sandbox-init`; standalone
/// sandboxes' workspaces go under `<home>/sandboxes`.
pub fn native_sandboxes(home: &std::path::Path) -> ToolEnvironment {
    let backend = agentry_sandbox::backend(SandboxConfig {
        backend: BackendKind::Native,
        init_exe: Some(sandbox_init_exe()),
        ..Default::default()
    })
    .expect("the native sandbox backend (user namespaces) on this host");
    ToolEnvironment {
        sandboxes: Some(SandboxPool::new(
            backend,
            SandboxSpec::new(home.join("placeholder")),
        )),
        sandbox_root: Some(home.join("sandboxes")),
        ..Default::default()
    }
}

/// A server whose sessions have workspaces and native sandboxes (file, shell and terminal
/// tools; terminals).
pub async fn start_with_workspaces() -> Server {
    start_with(
        |home| ToolEnvironment {
            workspaces: Some(home.join("workspaces")),
            ..native_sandboxes(home)
        },
        |_| {},
    )
    .await
}

/// A server like [`start`] whose tools come from `tools` (given the home folder), and whose
/// state `adjust` may change before it serves.
pub async fn start_with(
    tools: impl FnOnce(&std::path::Path) -> ToolEnvironment,
    adjust: impl FnOnce(&mut AppState),
) -> Server {
    isolate_template_renders();
    let home = tempfile::tempdir().unwrap();
    let store = Store::open_home(home.path()).await.unwrap();
    let mock = MockProvider::start().await.unwrap();
    store
        .put_config(
            ConfigKind::Model,
            "mock",
            &json!({"id": "mock", "protocol": "openai", "base_url": mock.openai_base_url(), "model_name": "m"}),
        )
        .await
        .unwrap();
    store
        .put_config(
            ConfigKind::Tool,
            "slow",
            &json!({"kind": "command", "name": "slow", "program": "/bin/sh",
                    "args": ["-c", "cat > /dev/null; sleep 0.6; echo '{\"slept\": true}'"]}),
        )
        .await
        .unwrap();
    let mut tools = tools(home.path());
    // As `agentry serve` does: saved agents' skills live under the data folder.
    tools
        .skill_roots
        .get_or_insert_with(|| vec![home.path().join("skills")]);
    let mut state = AppState::with_tools(store, tools).await.unwrap();
    adjust(&mut state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let app = router(state.clone());
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
        )
        .await
        .unwrap();
    });
    Server {
        url,
        state,
        mock,
        http: agentry_llm::http_client(Duration::from_secs(5)).unwrap(),
        home,
    }
}

impl Server {
    /// Closes the sessions' sandboxes (a test's last step, so nothing outlives it).
    pub async fn close_sandboxes(&self) {
        if let Some(pool) = &self.state.app.parts().tools.sandboxes {
            pool.close_all().await;
        }
    }

    /// The Prometheus text of `GET /metrics`.
    pub async fn metrics_text(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// Registers a command tool `echo` that answers its arguments (what `cat` reads on stdin).
    pub async fn add_echo_tool(&self) {
        let (status, body) = self
            .post(
                "/v1/tools",
                json!({"kind": "command", "name": "echo", "description": "Echoes its arguments.",
                       "program": "/bin/sh", "args": ["-c", "cat"]}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }

    pub async fn post(&self, path: &str, body: Value) -> (u16, Value) {
        let response = self
            .http
            .post(format!("{}{path}", self.url))
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

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let response = self
            .http
            .get(format!("{}{path}", self.url))
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

    pub async fn raw(&self, method: reqwest::Method, path: &str, body: &str) -> (u16, Value) {
        let response = self
            .http
            .request(method, format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(body.to_owned())
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

    /// Opens an SSE stream (POST with a body, or GET with an optional Last-Event-ID).
    pub async fn sse(
        &self,
        path: &str,
        body: Option<Value>,
        last_event_id: Option<u64>,
    ) -> SseClient {
        let mut request = match body {
            Some(body) => self.http.post(format!("{}{path}", self.url)).json(&body),
            None => self.http.get(format!("{}{path}", self.url)),
        };
        if let Some(id) = last_event_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 200, "SSE request failed");
        let session = response
            .headers()
            .get("x-session-id")
            .map(|v| v.to_str().unwrap().to_owned());
        SseClient {
            session,
            events: Box::pin(response.bytes_stream().eventsource()),
        }
    }
}

/// One received SSE event.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub name: String,
    pub id: Option<u64>,
    pub data: Value,
}

pub struct SseClient {
    pub session: Option<String>,
    events: std::pin::Pin<
        Box<
            dyn futures::Stream<
                    Item = Result<
                        eventsource_stream::Event,
                        eventsource_stream::EventStreamError<reqwest::Error>,
                    >,
                > + Send,
        >,
    >,
}

impl SseClient {
    /// The next event, or None at the end of the stream.
    pub async fn next(&mut self) -> Option<Received> {
        let event = tokio::time::timeout(Duration::from_secs(20), self.events.next())
            .await
            .expect("an SSE event within 20 s")?
            .unwrap();
        // SSE keeps the last id for events that carry none (the spec's lastEventId), so only
        // committed kinds are taken to have their own.
        let committed = matches!(
            event.event.as_str(),
            "run.started"
                | "message"
                | "tool.started"
                | "tool.result"
                | "run.finished"
                | "run.failed"
        );
        Some(Received {
            id: if committed {
                event.id.parse().ok()
            } else {
                None
            },
            name: event.event,
            data: serde_json::from_str(&event.data).unwrap_or(Value::Null),
        })
    }

    /// Every remaining event until the stream ends.
    pub async fn rest(&mut self) -> Vec<Received> {
        let mut all = Vec::new();
        while let Some(event) = self.next().await {
            all.push(event);
        }
        all
    }
}

/// The committed seqs among received events.
pub fn seqs(events: &[Received]) -> Vec<u64> {
    events.iter().filter_map(|e| e.id).collect()
}
