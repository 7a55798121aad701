//! The code interpreter (`POST /v1/sandboxes/{id}/code`): a real `ipykernel` in a native
//! sandbox, the stock data-analysis environment (`target/mcp-servers/kernel`: pandas, numpy,
//! matplotlib) shown read-only inside. State across calls, a chart from a CSV, a table, an
//! error with its traceback, an interrupt at the timeout, a kernel that dies.

use base64::Engine as _;
use serde_json::{Value, json};

use super::support::{Server, mcp_servers, native_sandboxes, start_with};

/// The kernel's virtualenv, made by `scripts/install-mcp-servers` from the system's Python.
fn kernel_venv() -> std::path::PathBuf {
    let venv = mcp_servers().root().join("kernel");
    assert!(
        venv.join("bin/python").exists(),
        "the kernel's venv {} is missing: run scripts/install-mcp-servers",
        venv.display()
    );
    venv
}

/// Native sandboxes that see the kernel's venv, and the server told to use its Python.
async fn server_with_kernel(python: Option<String>) -> Server {
    let venv = kernel_venv();
    let python = python.unwrap_or_else(|| venv.join("bin/python").to_string_lossy().into_owned());
    start_with(
        move |home| {
            let mut tools = native_sandboxes(home);
            if let Some(pool) = tools.sandboxes.take() {
                let mut template = pool.template().clone();
                template.ro_mounts.push(venv);
                tools.sandboxes = Some(agentry_sandbox::SandboxPool::new(
                    pool.backend().clone(),
                    template,
                ));
            }
            tools.kernel_python = Some(python);
            // Sessions' workspaces, so runs get the `run_code` tool.
            tools.workspaces = Some(home.join("workspaces"));
            tools
        },
        |_| {},
    )
    .await
}

async fn new_sandbox(server: &Server) -> String {
    let (status, body) = server.post("/v1/sandboxes", json!({})).await;
    assert_eq!(status, 201, "{body}");
    body["id"].as_str().unwrap().to_owned()
}

async fn run(server: &Server, id: &str, body: Value) -> (u16, Value) {
    server.post(&format!("/v1/sandboxes/{id}/code"), body).await
}

/// Runs code that must succeed; its result.
async fn ok(server: &Server, id: &str, code: &str) -> Value {
    let (status, result) = run(server, id, json!({"code": code})).await;
    assert_eq!(status, 200, "{code}: {result}");
    assert_eq!(result["error"], Value::Null, "{code}: {result:#}");
    result
}

fn stdout(result: &Value) -> String {
    result["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|output| output["type"] == "stream" && output["name"] == "stdout")
        .map(|output| output["text"].as_str().unwrap())
        .collect()
}

fn data<'a>(result: &'a Value, kind: &str, mime: &str) -> Option<&'a Value> {
    result["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|output| output["type"] == kind && output["data"].get(mime).is_some())
        .map(|output| &output["data"][mime])
}

#[tokio::test]
async fn the_kernel_keeps_state_and_returns_a_chart_a_table_and_errors() {
    let server = server_with_kernel(None).await;
    let id = new_sandbox(&server).await;

    let first = ok(&server, &id, "x = 21").await;
    assert_eq!(first["kernel_started"], true, "{first}");
    assert_eq!(first["outputs"], json!([]));
    let second = ok(&server, &id, "print(x * 2)\nx += 1\nx").await;
    assert_eq!(second["kernel_started"], false, "the same kernel: {second}");
    assert_eq!(stdout(&second), "42\n");
    assert_eq!(
        data(&second, "result", "text/plain"),
        Some(&json!("22")),
        "{second:#}"
    );
    assert!(second["execution_count"].as_u64().unwrap() >= 2);

    // E2B's headline: a CSV in, a chart and a table back.
    let (status, _) = (
        server
            .http
            .put(format!(
                "{}/v1/sandboxes/{id}/files?path=sales.csv",
                server.url
            ))
            .body("month,sales\njan,10\nfeb,14\nmar,9\napr,21\n")
            .send()
            .await
            .unwrap()
            .status(),
        (),
    );
    assert!(status.is_success(), "{status}");
    let table = ok(
        &server,
        &id,
        "import pandas as pd\ndf = pd.read_csv('sales.csv')\ndf.describe()",
    )
    .await;
    let html = data(&table, "result", "text/html")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no HTML table: {table:#}"));
    assert!(html.contains("<table") && html.contains("sales"), "{html}");
    let chart = ok(
        &server,
        &id,
        "import matplotlib.pyplot as plt\nplt.bar(df['month'], df['sales'])\nplt.title('sales')\nplt.show()",
    )
    .await;
    let png = data(&chart, "display_data", "image/png")
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no PNG: {chart:#}"));
    let png = base64::engine::general_purpose::STANDARD
        .decode(png.trim())
        .unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    assert!(png.len() > 1000, "a chart of {} bytes", png.len());

    // An exception: its type, message and traceback (without terminal colours).
    let (status, failed) = run(
        &server,
        &id,
        json!({"code": "def f():\n    return 1 / 0\nf()"}),
    )
    .await;
    assert_eq!(status, 200, "{failed}");
    assert_eq!(failed["error"]["name"], "ZeroDivisionError", "{failed:#}");
    assert_eq!(failed["error"]["value"], "division by zero");
    let traceback = failed["error"]["traceback"].to_string();
    assert!(traceback.contains("return 1 / 0"), "{traceback}");
    assert!(
        !traceback.contains("\\u001b"),
        "colours left in: {traceback}"
    );
    // The kernel goes on, state intact.
    assert_eq!(
        stdout(&ok(&server, &id, "print(len(df), x)").await),
        "4 22\n"
    );
}

#[tokio::test]
async fn a_timeout_interrupts_the_code_and_the_kernel_keeps_its_state() {
    let server = server_with_kernel(None).await;
    let id = new_sandbox(&server).await;
    ok(&server, &id, "kept = 'still here'").await;
    let started = std::time::Instant::now();
    let (status, result) = run(
        &server,
        &id,
        json!({"code": "import time\nprint('before', flush=True)\ntime.sleep(60)\nprint('after')", "timeout_secs": 1}),
    )
    .await;
    assert_eq!(status, 200, "{result}");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(result["timed_out"], true, "{result:#}");
    assert_eq!(result["error"]["name"], "KeyboardInterrupt", "{result:#}");
    assert_eq!(stdout(&result), "before\n");
    let after = ok(&server, &id, "kept").await;
    assert_eq!(after["kernel_started"], false);
    assert_eq!(
        data(&after, "result", "text/plain"),
        Some(&json!("'still here'"))
    );
}

#[tokio::test]
async fn a_kernel_that_dies_fails_the_call_and_the_next_call_starts_a_new_one() {
    let server = server_with_kernel(None).await;
    let id = new_sandbox(&server).await;
    ok(&server, &id, "lost = 1").await;
    let (status, died) = run(&server, &id, json!({"code": "import os\nos._exit(3)"})).await;
    assert_eq!(status, 409, "{died}");
    assert_eq!(died["error"]["code"], "kernel_died", "{died}");
    let fresh = ok(&server, &id, "1 + 1").await;
    assert_eq!(fresh["kernel_started"], true, "{fresh}");
    assert_eq!(data(&fresh, "result", "text/plain"), Some(&json!("2")));
    let (_, gone) = run(&server, &id, json!({"code": "lost"})).await;
    assert_eq!(gone["error"]["name"], "NameError", "{gone}");
    // The dead kernel's folder was emptied; the live one's holds its sockets.
    let kernels = server
        .state
        .app
        .parts()
        .sandboxes
        .root()
        .join(&id)
        .join(".kernels");
    let mut sizes: Vec<usize> = std::fs::read_dir(kernels)
        .unwrap()
        .map(|folder| std::fs::read_dir(folder.unwrap().path()).unwrap().count())
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes.len(), 2, "{sizes:?}");
    assert_eq!(sizes[0], 0, "the dead kernel's files stayed: {sizes:?}");
    assert!(sizes[1] >= 7, "{sizes:?}");
}

#[tokio::test]
async fn bad_requests_and_a_python_without_a_kernel_are_typed_errors() {
    let server = server_with_kernel(None).await;
    let id = new_sandbox(&server).await;
    for (body, code) in [
        (json!({"code": "1", "language": "r"}), "invalid_request"),
        (json!({"code": "1", "timeout_secs": 0}), "invalid_request"),
        (json!({"code": "1", "extra": true}), "invalid_request"),
        (json!({}), "invalid_request"),
    ] {
        let (status, error) = run(&server, &id, body.clone()).await;
        assert_eq!(status, 400, "{body}: {error}");
        assert_eq!(error["error"]["code"], code, "{body}: {error}");
    }
    let (status, _) = run(
        &server,
        "01a22ae4-0000-7000-8000-000000000000",
        json!({"code": "1"}),
    )
    .await;
    assert_eq!(status, 404);

    // The system's Python has no ipykernel: 503 with the kernel's own words.
    let bare = server_with_kernel(Some("/usr/bin/python3".into())).await;
    let id = new_sandbox(&bare).await;
    let (status, error) = run(&bare, &id, json!({"code": "1"})).await;
    assert_eq!(status, 503, "{error}");
    assert_eq!(error["error"]["code"], "kernel_unavailable", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("ipykernel"), "{message}");
}

/// An agent's chart reaches a model that takes images: the `run_code` tool's PNG goes back in
/// the next request, as an image after the tool message (chat completions take images only
/// from the user).
#[tokio::test]
async fn a_charts_image_reaches_a_model_that_takes_images() {
    let server = server_with_kernel(None).await;
    let (status, body) = server
        .post(
            "/v1/models",
            json!({"id": "eyes", "protocol": "openai", "base_url": server.mock.openai_base_url(),
                   "model_name": "m", "labels": ["vision"]}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    server.mock.enqueue(agentry_testkit::Reply::scripted(
        agentry_testkit::ScriptedTurn::tool_call(
            "run_code",
            json!({"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()"}),
        ),
    ));
    server.mock.enqueue(agentry_testkit::Reply::scripted(
        agentry_testkit::ScriptedTurn::text("A line that rises, then falls."),
    ));
    let (status, answer) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "eyes", "tool_ids": ["run_code"], "text": "Plot 1, 3, 2."}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["text"], "A line that rises, then falls.", "{answer}");
    let requests = server.mock.requests();
    let messages = requests[1].body["messages"].as_array().unwrap();
    let images: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter_map(|part| part["image_url"]["url"].as_str())
        .collect();
    assert_eq!(images.len(), 1, "{messages:#?}");
    let png = images[0].strip_prefix("data:image/png;base64,").unwrap();
    let png = base64::engine::general_purpose::STANDARD
        .decode(png)
        .unwrap();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
}

/// A sandbox cannot turn the kernel's files against the host: a log swapped for a link to a
/// host file is not read (its content never reaches the error), and sockets swapped for links
/// to a host socket are refused before any connection. The "kernel" here is a script in the
/// sandbox that does the swapping.
#[tokio::test]
async fn the_kernels_files_cannot_lead_the_server_to_the_hosts() {
    let host = tempfile::tempdir().unwrap();
    let secret = host.path().join("secret.txt");
    std::fs::write(&secret, "host-only-canary-7731\n").unwrap();
    let socket = host.path().join("host.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    listener.set_nonblocking(true).unwrap();

    let server = server_with_kernel(Some("/workspace/evil.sh".into())).await;
    for (script, expected) in [
        (
            format!(
                "#!/bin/sh\ndir=$(dirname \"$4\")\nrm -f \"$dir/kernel.log\"\nln -s {} \"$dir/kernel.log\"\n",
                secret.display()
            ),
            "did not start",
        ),
        (
            format!(
                "#!/bin/sh\ndir=$(dirname \"$4\")\nfor p in 1 2 3 4 5; do ln -s {} \"$dir/k-$p\"; done\n\
                 printf '%s' '{{\"transport\":\"ipc\",\"ip\":\"k\",\"shell_port\":1,\"iopub_port\":2,\"stdin_port\":3,\
                 \"control_port\":4,\"hb_port\":5,\"key\":\"x\",\"signature_scheme\":\"hmac-sha256\"}}' > \"$dir/connection.json\"\n\
                 sleep 30\n",
                socket.display()
            ),
            "not a socket",
        ),
    ] {
        let id = new_sandbox(&server).await;
        let response = server
            .http
            .put(format!(
                "{}/v1/sandboxes/{id}/files?path=evil.sh",
                server.url
            ))
            .body(script)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
        let (status, _) = server
            .post(
                &format!("/v1/sandboxes/{id}/exec"),
                json!({"command": "chmod +x evil.sh"}),
            )
            .await;
        assert_eq!(status, 200);
        let (status, error) = run(&server, &id, json!({"code": "1"})).await;
        assert_eq!(status, 503, "{error}");
        let message = error["error"]["message"].as_str().unwrap();
        assert!(message.contains(expected), "{message}");
        assert!(!message.contains("canary"), "a host file leaked: {message}");
    }
    assert!(
        listener.accept().is_err(),
        "the server connected to the host's socket"
    );
}

/// `"stream": true`: each output arrives as the kernel sends it (the code below waits for a
/// file the test writes only after it has read the first output), then the whole result.
#[tokio::test]
async fn a_streamed_call_sends_each_output_as_it_comes_then_the_result() {
    use eventsource_stream::Eventsource as _;
    use futures::StreamExt as _;
    let server = server_with_kernel(None).await;
    let id = new_sandbox(&server).await;
    let code = "import os, time\nprint('ready', flush=True)\n\
                while not os.path.exists('go'):\n    time.sleep(0.02)\nprint('went')\n6 * 7";
    let response = server
        .http
        .post(format!("{}/v1/sandboxes/{id}/code", server.url))
        .json(&json!({"code": code, "stream": true, "timeout_secs": 30}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut events = response.bytes_stream().eventsource();
    macro_rules! next {
        () => {{
            let event = tokio::time::timeout(std::time::Duration::from_secs(40), events.next())
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            (
                event.event,
                serde_json::from_str::<Value>(&event.data).unwrap(),
            )
        }};
    }
    let (name, first) = next!();
    assert_eq!(name, "output");
    assert_eq!(
        first,
        json!({"type": "stream", "name": "stdout", "text": "ready\n"})
    );
    let workspace = server.state.app.parts().sandboxes.root().join(&id);
    std::fs::write(workspace.join("go"), "").unwrap();
    let (name, second) = next!();
    assert_eq!(
        (name.as_str(), second["text"].as_str()),
        ("output", Some("went\n"))
    );
    let (name, third) = next!();
    assert_eq!(name, "output");
    assert_eq!(third["type"], "result");
    assert_eq!(third["data"]["text/plain"], "42");
    let (name, done) = next!();
    assert_eq!(name, "done", "{done}");
    assert_eq!(done["timed_out"], false);
    assert_eq!(stdout(&done), "ready\nwent\n");

    // A failure before anything runs is the usual error status, not a stream.
    let (status, _) = run(
        &server,
        &id,
        json!({"code": "1", "stream": true, "language": "r"}),
    )
    .await;
    assert_eq!(status, 400);
}
