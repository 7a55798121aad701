//! `/v1/sandboxes` and `/v1/sandbox/capabilities` over loopback HTTP, with real native
//! sandboxes (the workspace's `agentry-sandbox-init` as their agent).

use std::time::{Duration, Instant};

use agentry_app::ToolEnvironment;
use agentry_app::sandboxes::SandboxRegistry;
use agentry_server::ServerConfig;
use reqwest::Method;
use serde_json::{Value, json};

use super::support::{Server, native_sandboxes, start, start_with};

async fn sandbox_server() -> Server {
    start_with(native_sandboxes, |_| {}).await
}

async fn send(server: &Server, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = server.http.request(method, format!("{}{path}", server.url));
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request
        .timeout(Duration::from_secs(60))
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

async fn create(server: &Server, body: Value) -> String {
    let (status, created) = send(server, Method::POST, "/v1/sandboxes", Some(body)).await;
    assert_eq!(status, 201, "{created}");
    created["id"].as_str().unwrap().to_owned()
}

async fn exec(server: &Server, id: &str, body: Value) -> (u16, Value) {
    send(
        server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/exec"),
        Some(body),
    )
    .await
}

/// Runs a shell line and asserts it succeeded; its stdout.
async fn sh(server: &Server, id: &str, line: &str) -> String {
    let (status, result) = exec(server, id, json!({"command": line})).await;
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["exit_code"], 0, "{line}: {result}");
    result["stdout"].as_str().unwrap().to_owned()
}

async fn file_request(
    server: &Server,
    method: Method,
    id: &str,
    path: &str,
    body: Option<Vec<u8>>,
) -> (u16, Vec<u8>) {
    let mut request = server
        .http
        .request(
            method,
            format!(
                "{}/v1/sandboxes/{id}/files?path={}",
                server.url,
                encode(path)
            ),
        )
        .timeout(Duration::from_secs(60));
    if let Some(body) = body {
        request = request
            .header("content-type", "application/octet-stream")
            .body(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.bytes().await.unwrap().to_vec())
}

/// Percent-encodes a query value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|byte| {
            if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
                char::from(byte).to_string()
            } else {
                format!("%{byte:02X}")
            }
        })
        .collect()
}

fn error_code(body: &[u8]) -> String {
    let value: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    value["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Waits until `check` holds (up to `limit`).
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test]
async fn without_a_backend_sandboxes_are_disabled_with_a_typed_503() {
    let server = start().await;
    let (status, capabilities) = server.get("/v1/sandbox/capabilities").await;
    assert_eq!(status, 200);
    assert_eq!(capabilities["enabled"], false);
    assert_eq!(capabilities["backend"], Value::Null);
    assert!(
        capabilities["disabled_reason"]
            .as_str()
            .unwrap()
            .contains("without a sandbox backend")
    );
    assert!(capabilities["host"]["os"].is_string());
    assert!(capabilities["host"]["user_namespaces"].is_boolean());
    for (method, path) in [
        (Method::POST, "/v1/sandboxes"),
        (Method::GET, "/v1/sandboxes"),
        (
            Method::GET,
            "/v1/sandboxes/01890a5d-ac96-774b-bcce-b302099a8057",
        ),
        (
            Method::POST,
            "/v1/sandboxes/01890a5d-ac96-774b-bcce-b302099a8057/exec",
        ),
    ] {
        let body = (method == Method::POST).then(|| json!({"command": "true"}));
        let body = if path == "/v1/sandboxes" && method == Method::POST {
            Some(json!({}))
        } else {
            body
        };
        let (status, error) = send(&server, method.clone(), path, body).await;
        assert_eq!(status, 503, "{method} {path}: {error}");
        assert_eq!(error["error"]["code"], "sandboxes_disabled");
    }
}

#[tokio::test]
async fn create_exec_stream_stdin_timeout_and_delete() {
    let server = sandbox_server().await;
    let (status, capabilities) = server.get("/v1/sandbox/capabilities").await;
    assert_eq!(status, 200);
    assert_eq!(capabilities["enabled"], true);
    assert_eq!(capabilities["backend"], "native");
    assert_eq!(capabilities["host"]["native_available"], true);
    assert_eq!(capabilities["open_sandboxes"], 0);
    assert!(capabilities["default_limits"]["memory_bytes"].is_u64());

    // Create, with an environment and limits.
    let (status, created) = send(
        &server,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({
            "env": {"GREETING": "hello from the env"},
            "limits": {"memory_bytes": 268_435_456_u64, "max_processes": 64,
                       "wall_time_secs": 600, "idle_timeout_secs": 300}
        })),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    assert_eq!(created["workspace_mount"], "/workspace");
    assert_eq!(created["report"]["backend"], "native");
    assert_eq!(created["report"]["isolated"], true);
    assert_eq!(created["limits"]["memory_bytes"], 268_435_456_u64);
    assert_eq!(created["limits"]["max_processes"], 64);
    assert_eq!(created["limits"]["wall_time_secs"], 600);
    assert_eq!(created["limits"]["idle_timeout_secs"], 300);
    assert!(created["created_at"].as_u64().unwrap() > 0);
    let workspace = server
        .state
        .app
        .parts()
        .sandboxes
        .get(id.parse().unwrap())
        .unwrap()
        .workspace()
        .to_path_buf();
    assert!(workspace.starts_with(server.home.path().join("sandboxes")));
    assert!(workspace.is_dir());

    // Listed and shown.
    let (status, list) = server.get("/v1/sandboxes").await;
    assert_eq!(status, 200);
    assert_eq!(list["sandboxes"][0]["id"], id);
    let (status, shown) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(shown["id"], id);

    // argv: exit code and stdout.
    let (status, result) = exec(&server, &id, json!({"argv": ["echo", "hello", "world"]})).await;
    assert_eq!(status, 200, "{result}");
    assert_eq!(result["stdout"], "hello world\n");
    assert_eq!(result["stderr"], "");
    assert_eq!(result["exit_code"], 0);
    assert_eq!(result["timed_out"], false);
    assert_eq!(result["stdout_truncated"], false);
    // A shell line, the sandbox's environment, a command's own, its working directory.
    let (_, result) = exec(
        &server,
        &id,
        json!({"command": "echo \"$GREETING/$EXTRA\"; pwd; echo oops >&2; exit 7",
               "env": {"EXTRA": "x"}, "cwd": "/tmp"}),
    )
    .await;
    assert_eq!(result["stdout"], "hello from the env/x\n/tmp\n");
    assert_eq!(result["stderr"], "oops\n");
    assert_eq!(result["exit_code"], 7);
    // The default working directory is the workspace.
    assert_eq!(sh(&server, &id, "pwd").await, "/workspace\n");
    // A program that does not exist: 127, said on stderr.
    let (_, result) = exec(&server, &id, json!({"argv": ["no-such-program"]})).await;
    assert_eq!(result["exit_code"], 127);
    assert!(
        result["stderr"]
            .as_str()
            .unwrap()
            .contains("no-such-program")
    );

    // Streamed: events in order, exit last.
    let mut stream = server
        .sse(
            &format!("/v1/sandboxes/{id}/exec"),
            Some(json!({"command": "printf a; sleep 0.3; printf b >&2; sleep 0.3; printf 'c\\n'; exit 3",
                        "stream": true})),
            None,
        )
        .await;
    let events = stream.rest().await;
    let names: Vec<&str> = events.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["stdout", "stderr", "stdout", "exit"], "{events:?}");
    assert_eq!(events[0].data["text"], "a");
    assert_eq!(events[1].data["text"], "b");
    assert_eq!(events[2].data["text"], "c\n");
    assert_eq!(events[3].data["exit_code"], 3);
    assert_eq!(events[3].data["timed_out"], false);
    assert!(events[3].data["duration_ms"].as_u64().unwrap() >= 500);

    // stdin: written, then closed; large input does not deadlock against the output.
    let (_, result) = exec(
        &server,
        &id,
        json!({"argv": ["cat"], "stdin": "piped input\n"}),
    )
    .await;
    assert_eq!(result["stdout"], "piped input\n");
    assert_eq!(result["exit_code"], 0);
    let big = "x".repeat(300_000);
    let (_, result) = exec(
        &server,
        &id,
        json!({"command": "cat; cat >&2", "stdin": big}),
    )
    .await;
    assert_eq!(result["stdout"].as_str().unwrap().len(), 300_000);
    assert_eq!(result["exit_code"], 0);
    // Without stdin, it is /dev/null: cat ends at once.
    let (_, result) = exec(&server, &id, json!({"argv": ["cat"]})).await;
    assert_eq!(result["stdout"], "");
    assert_eq!(result["exit_code"], 0);

    // Output past 1 MiB is cut, and said to be.
    let (_, result) = exec(
        &server,
        &id,
        json!({"command": "head -c 1100000 /dev/zero | tr '\\0' y"}),
    )
    .await;
    assert_eq!(result["stdout"].as_str().unwrap().len(), 1 << 20);
    assert_eq!(result["stdout_truncated"], true);

    // Timeout: killed with everything it started.
    let started = Instant::now();
    let (status, result) = exec(
        &server,
        &id,
        json!({"command": "sleep 30 & sleep 31", "timeout_secs": 1}),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(result["timed_out"], true, "{result}");
    assert_eq!(result["exit_code"], Value::Null);
    assert_eq!(result["signal"], 9);
    assert!(started.elapsed() < Duration::from_secs(15));
    let left = sh(
        &server,
        &id,
        "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
    )
    .await;
    assert!(!left.contains("sleep 3"), "{left}");

    // A streamed command whose client goes away is killed.
    {
        let mut stream = server
            .sse(
                &format!("/v1/sandboxes/{id}/exec"),
                Some(json!({"command": "echo go; exec sleep 41", "stream": true})),
                None,
            )
            .await;
        let first = stream.next().await.unwrap();
        assert_eq!(first.name, "stdout");
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            let line = "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '";
            !sh(&server, &id, line).await.contains("sleep 41")
        })
        .await,
        "the abandoned command still runs"
    );

    // Delete: 204, then 404 everywhere, and the workspace is gone.
    let (status, _) = send(
        &server,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, error) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(status, 404, "{error}");
    assert_eq!(error["error"]["code"], "not_found");
    let (status, _) = exec(&server, &id, json!({"argv": ["true"]})).await;
    assert_eq!(status, 404);
    let (status, _) = send(
        &server,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    assert!(!workspace.exists());
    let (_, list) = server.get("/v1/sandboxes").await;
    assert_eq!(list["sandboxes"], json!([]));
}

#[tokio::test]
async fn background_processes_are_listed_read_and_killed() {
    let server = sandbox_server().await;
    let id = create(&server, json!({})).await;
    let (status, started) = exec(
        &server,
        &id,
        json!({"command": "echo started; sleep 300 & sleep 301; echo never", "background": true}),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    assert_eq!(started["sandbox_id"], id);
    let exec_id = started["exec_id"].as_str().unwrap().to_owned();
    assert_eq!(started["argv"][0], "/bin/sh");

    let (status, list) = server.get(&format!("/v1/sandboxes/{id}/processes")).await;
    assert_eq!(status, 200);
    assert_eq!(list["processes"][0]["exec_id"], exec_id);
    assert_eq!(list["processes"][0]["running"], true);
    let (_, shown) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(shown["running_processes"], 1);

    let process_path = format!("/v1/sandboxes/{id}/processes/{exec_id}");
    assert!(
        eventually(Duration::from_secs(10), || async {
            server.get(&process_path).await.1["stdout"] == "started\n"
        })
        .await
    );
    let (_, detail) = server.get(&process_path).await;
    assert_eq!(detail["running"], true);
    assert_eq!(detail["exit"], Value::Null);

    // Kill: it ends, with what it started.
    let (status, killed) = send(&server, Method::POST, &format!("{process_path}/kill"), None).await;
    assert_eq!(status, 200, "{killed}");
    assert_eq!(killed["running"], false);
    assert_eq!(killed["exit"]["killed"], true);
    assert_eq!(killed["stdout"], "started\n");
    let left = sh(
        &server,
        &id,
        "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
    )
    .await;
    assert!(!left.contains("sleep 30"), "{left}");
    let (_, list) = server.get(&format!("/v1/sandboxes/{id}/processes")).await;
    assert_eq!(list["processes"], json!([]));
    // A finished process is still readable, and killing it again is harmless.
    let (status, detail) = server.get(&process_path).await;
    assert_eq!(status, 200);
    assert_eq!(detail["exit"]["killed"], true);
    let (status, _) = send(&server, Method::POST, &format!("{process_path}/kill"), None).await;
    assert_eq!(status, 200);

    // A background command that ends by itself, with its exit code.
    let (_, started) = exec(
        &server,
        &id,
        json!({"argv": ["sh", "-c", "read line; echo \"got $line\"; exit 4"],
               "stdin": "this\n", "background": true}),
    )
    .await;
    let path = format!(
        "/v1/sandboxes/{id}/processes/{}",
        started["exec_id"].as_str().unwrap()
    );
    assert!(
        eventually(Duration::from_secs(10), || async {
            server.get(&path).await.1["running"] == false
        })
        .await
    );
    let (_, detail) = server.get(&path).await;
    assert_eq!(detail["stdout"], "got this\n");
    assert_eq!(detail["exit"]["exit_code"], 4);
    assert_eq!(detail["exit"]["killed"], false);

    // Unknown and malformed process ids.
    let (status, _) = server
        .get(&format!(
            "/v1/sandboxes/{id}/processes/01890a5d-ac96-774b-bcce-b302099a8057"
        ))
        .await;
    assert_eq!(status, 404);
    let (status, _) = server
        .get(&format!("/v1/sandboxes/{id}/processes/nope"))
        .await;
    assert_eq!(status, 400);

    // Deleting the sandbox kills a background process too.
    let (status, _) = exec(
        &server,
        &id,
        json!({"command": "sleep 302", "background": true}),
    )
    .await;
    assert_eq!(status, 202);
    let (status, _) = send(
        &server,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
}

#[tokio::test]
async fn files_round_trip_and_cannot_escape() {
    let server = sandbox_server().await;
    let id = create(&server, json!({})).await;
    let workspace = server
        .state
        .app
        .parts()
        .sandboxes
        .get(id.parse().unwrap())
        .unwrap()
        .workspace()
        .to_path_buf();

    // Writing into a missing folder: 404; mkdir with parents, then write and read back.
    let bytes = vec![0xff, 0x00, 0x01, b'a'];
    let (status, body) = file_request(
        &server,
        Method::PUT,
        &id,
        "notes/a.bin",
        Some(bytes.clone()),
    )
    .await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    let (status, made) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/files/mkdir"),
        Some(json!({"path": "notes/deep", "parents": true})),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let (status, _) = file_request(
        &server,
        Method::PUT,
        &id,
        "notes/a.bin",
        Some(bytes.clone()),
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(std::fs::read(workspace.join("notes/a.bin")).unwrap(), bytes);
    let response = server
        .http
        .get(format!(
            "{}/v1/sandboxes/{id}/files?path={}",
            server.url,
            encode("/workspace/notes/a.bin")
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/octet-stream"
    );
    assert_eq!(response.bytes().await.unwrap().to_vec(), bytes);
    // Commands see the same file.
    assert_eq!(sh(&server, &id, "wc -c < notes/a.bin").await.trim(), "4");

    // Stat and list.
    let (status, stat) = server
        .get(&format!("/v1/sandboxes/{id}/files/stat?path=notes/a.bin"))
        .await;
    assert_eq!(status, 200, "{stat}");
    assert_eq!(stat["kind"], "file");
    assert_eq!(stat["size"], 4);
    assert_eq!(stat["mode"], 0o644);
    let (_, stat) = server
        .get(&format!("/v1/sandboxes/{id}/files/stat?path=notes"))
        .await;
    assert_eq!(stat["kind"], "dir");
    let (status, listing) = server
        .get(&format!("/v1/sandboxes/{id}/files/list?path=notes"))
        .await;
    assert_eq!(status, 200, "{listing}");
    let names: Vec<&str> = listing["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a.bin", "deep"]);
    let (_, listing) = server.get(&format!("/v1/sandboxes/{id}/files/list")).await;
    assert_eq!(listing["path"], "/workspace");
    assert_eq!(listing["entries"][0]["name"], "notes");
    assert_eq!(listing["entries"][0]["kind"], "dir");

    // mkdir of an existing folder without parents: 409; a directory read as a file: 400.
    let (status, error) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/files/mkdir"),
        Some(json!({"path": "notes"})),
    )
    .await;
    assert_eq!(status, 409, "{error}");
    let (status, _) = file_request(&server, Method::GET, &id, "notes", None).await;
    assert_eq!(status, 400);

    // Remove: a non-empty folder needs `recursive`.
    let (status, body) = file_request(&server, Method::DELETE, &id, "notes", None).await;
    assert_eq!(status, 409, "{}", String::from_utf8_lossy(&body));
    let response = server
        .http
        .delete(format!(
            "{}/v1/sandboxes/{id}/files?path=notes&recursive=true",
            server.url
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 204);
    assert!(!workspace.join("notes").exists());
    let (status, body) = file_request(&server, Method::GET, &id, "notes/a.bin", None).await;
    assert_eq!(status, 404);
    assert_eq!(error_code(&body), "not_found");
    let (status, _) = file_request(&server, Method::DELETE, &id, "notes", None).await;
    assert_eq!(status, 404);

    // Size caps: a file over 16 MiB is not read (413), nor written.
    sh(&server, &id, "head -c 17000000 /dev/zero > big").await;
    let (status, body) = file_request(&server, Method::GET, &id, "big", None).await;
    assert_eq!(status, 413);
    assert_eq!(error_code(&body), "file_too_large");
    let (status, body) =
        file_request(&server, Method::PUT, &id, "big2", Some(vec![0; 17_000_000])).await;
    assert_eq!(status, 413);
    assert_eq!(error_code(&body), "file_too_large");
    // Up to the cap is fine (past the API's 4 MiB JSON limit).
    let (status, _) = file_request(&server, Method::PUT, &id, "five", Some(vec![7; 5 << 20])).await;
    assert_eq!(status, 204);

    // Escapes. The sandbox's /etc is its own, not the host's.
    let (status, passwd) = file_request(&server, Method::GET, &id, "/etc/passwd", None).await;
    assert_eq!(status, 200);
    assert_ne!(passwd, std::fs::read("/etc/passwd").unwrap());
    // Writing outside the workspace is refused.
    let (status, body) = file_request(
        &server,
        Method::PUT,
        &id,
        "/etc/passwd",
        Some(b"evil".to_vec()),
    )
    .await;
    assert!(
        [403, 404].contains(&status),
        "{status} {}",
        String::from_utf8_lossy(&body)
    );
    // Symlinks made inside resolve inside: to the sandbox's (absent) /etc/shadow.
    sh(
        &server,
        &id,
        "ln -s /etc/shadow shadow && ln -s ../../../../../../../etc/shadow up && ln -s / root",
    )
    .await;
    for path in ["shadow", "up", "root/etc/shadow", "../../../../etc/shadow"] {
        let (status, body) = file_request(&server, Method::GET, &id, path, None).await;
        assert!(
            [403, 404].contains(&status),
            "{path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
    }
    let (_, stat) = server
        .get(&format!("/v1/sandboxes/{id}/files/stat?path=shadow"))
        .await;
    assert_eq!(stat["kind"], "symlink");
    assert_eq!(stat["symlink_target"], "/etc/shadow");
    // A symlink planted on the host, pointing at a host file outside the workspace: read
    // through the API it resolves inside the sandbox, where that file does not exist.
    let secret = server.home.path().join("host-secret.txt");
    std::fs::write(&secret, "the host's secret").unwrap();
    std::os::unix::fs::symlink(&secret, workspace.join("planted")).unwrap();
    let (status, body) = file_request(&server, Method::GET, &id, "planted", None).await;
    assert_eq!(status, 404, "{}", String::from_utf8_lossy(&body));
    assert!(!String::from_utf8_lossy(&body).contains("the host's secret"));
    let (status, _) = file_request(
        &server,
        Method::PUT,
        &id,
        "planted",
        Some(b"overwritten".to_vec()),
    )
    .await;
    assert_ne!(status, 204);
    assert_eq!(
        std::fs::read_to_string(&secret).unwrap(),
        "the host's secret"
    );

    // Paths with a NUL, empty paths, a missing path parameter, unknown parameters: 400.
    for query in ["path=a%00b", "path=", "", "path=a&extra=1"] {
        let (status, error) = server
            .get(&format!("/v1/sandboxes/{id}/files?{query}"))
            .await;
        assert_eq!(status, 400, "{query}: {error}");
        assert_eq!(error["error"]["code"], "invalid_request");
    }
    let (status, _) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{id}/files/mkdir"),
        Some(json!({"path": "a\u{0}b"})),
    )
    .await;
    assert_eq!(status, 400);
}

#[tokio::test]
async fn bad_inputs_are_refused_with_clear_errors() {
    let server = sandbox_server().await;
    let id = create(&server, json!({})).await;
    let exec_path = format!("/v1/sandboxes/{id}/exec");
    for (body, needle) in [
        (json!({"argv": ["echo"], "command": "echo"}), "not both"),
        (json!({}), "give `argv`"),
        (json!({"argv": []}), "non-empty first element"),
        (json!({"argv": [""]}), "non-empty first element"),
        (json!({"argv": ["echo", "a\u{0}b"]}), "NUL"),
        (json!({"command": "  "}), "must not be empty"),
        (json!({"command": "true", "unknown": 1}), "unknown field"),
        (
            json!({"command": "true", "timeout_secs": 0}),
            "timeout_secs",
        ),
        (
            json!({"command": "true", "timeout_secs": 3601}),
            "timeout_secs",
        ),
        (
            json!({"command": "true", "background": true, "stream": true}),
            "exclude each other",
        ),
        (
            json!({"command": "true", "env": {"1BAD": "x"}}),
            "environment variable name",
        ),
        (json!({"command": "true", "env": {"A": "x\u{0}"}}), "NUL"),
        (json!({"command": "true", "cwd": ""}), "must not be empty"),
        (json!({"command": "x".repeat(60_000)}), "longer than"),
        (json!({"argv": "echo"}), "invalid type"),
    ] {
        let (status, error) = send(&server, Method::POST, &exec_path, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {error}");
        let message = error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(message.contains(needle), "{body}: {message}");
    }
    // A body that is not JSON.
    let (status, _) = server.raw(Method::POST, &exec_path, "{not json").await;
    assert_eq!(status, 400);

    // Create: unknown fields and out-of-range limits.
    for (body, needle) in [
        (json!({"unknown": true}), "unknown field"),
        (
            json!({"limits": {"memory_bytes": 1}}),
            "limits.memory_bytes",
        ),
        (
            json!({"limits": {"max_processes": 1}}),
            "limits.max_processes",
        ),
        (
            json!({"limits": {"open_files": 100000}}),
            "limits.open_files",
        ),
        (
            json!({"limits": {"idle_timeout_secs": 0}}),
            "limits.idle_timeout_secs",
        ),
        (json!({"limits": {"swap": 1}}), "unknown field"),
        (json!({"env": {"A=B": "x"}}), "environment variable name"),
    ] {
        let (status, error) =
            send(&server, Method::POST, "/v1/sandboxes", Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {error}");
        let message = error["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(message.contains(needle), "{body}: {message}");
    }
    // A create without a JSON body is refused: nothing is made by a bare POST.
    let response = server
        .http
        .post(format!("{}/v1/sandboxes", server.url))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 415);

    // Ids: malformed (400), or well-formed but unknown (404).
    for bad in [
        "nope",
        "01890A5D-AC96-774B-BCCE-B302099A8057",
        "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
    ] {
        let (status, error) = server.get(&format!("/v1/sandboxes/{bad}")).await;
        assert_eq!(status, 400, "{bad}: {error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("UUIDv7")
        );
        let (status, _) = exec(&server, bad, json!({"command": "true"})).await;
        assert_eq!(status, 400);
    }
    let unknown = "01890a5d-ac96-774b-bcce-b302099a8057";
    for (method, path) in [
        (Method::GET, format!("/v1/sandboxes/{unknown}")),
        (Method::DELETE, format!("/v1/sandboxes/{unknown}")),
        (Method::GET, format!("/v1/sandboxes/{unknown}/processes")),
        (Method::GET, format!("/v1/sandboxes/{unknown}/files/list")),
    ] {
        let (status, error) = send(&server, method.clone(), &path, None).await;
        assert_eq!(status, 404, "{method} {path}: {error}");
        assert_eq!(error["error"]["code"], "not_found");
    }
    let (status, _) = exec(&server, unknown, json!({"command": "true"})).await;
    assert_eq!(status, 404);

    // The sandbox is still fine after all that.
    assert_eq!(sh(&server, &id, "echo ok").await, "ok\n");
}

#[tokio::test]
async fn idle_sandboxes_leave_and_the_cap_holds() {
    let server = start_with(native_sandboxes, |state| {
        state.app.parts_mut().sandboxes = SandboxRegistry::with_max(Some(state_root(state)), 2);
    })
    .await;
    let (_, capabilities) = server.get("/v1/sandbox/capabilities").await;
    assert_eq!(capabilities["max_sandboxes"], 2);

    // Idle: closed after its timeout, then gone from the registry with its workspace.
    let idle = create(&server, json!({"limits": {"idle_timeout_secs": 1}})).await;
    let kept = create(&server, json!({})).await;
    let idle_workspace = server.state.app.parts().sandboxes.root().join(&idle);
    assert!(idle_workspace.is_dir());
    let (status, error) = send(&server, Method::POST, "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 429, "{error}");
    assert_eq!(error["error"]["code"], "too_many_sandboxes");
    assert!(
        eventually(Duration::from_secs(15), || async {
            server.get(&format!("/v1/sandboxes/{idle}")).await.0 == 404
        })
        .await,
        "the idle sandbox was not closed"
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            !idle_workspace.exists()
        })
        .await,
        "the idle sandbox's workspace was not removed"
    );
    let (_, list) = server.get("/v1/sandboxes").await;
    let ids: Vec<&str> = list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [kept.as_str()]);
    // Its place is free again.
    let third = create(&server, json!({})).await;
    let (status, _) = send(&server, Method::POST, "/v1/sandboxes", Some(json!({}))).await;
    assert_eq!(status, 429);
    for id in [kept, third] {
        let (status, _) = send(
            &server,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
        )
        .await;
        assert_eq!(status, 204);
    }
}

fn state_root(state: &agentry_server::AppState) -> std::path::PathBuf {
    state.app.parts().sandboxes.root().to_path_buf()
}

#[tokio::test]
async fn shutdown_closes_every_sandbox() {
    let home = tempfile::tempdir().unwrap();
    let store = agentry_store::Store::open_home(home.path()).await.unwrap();
    let tools: ToolEnvironment = native_sandboxes(home.path());
    let state = agentry_server::AppState::with_tools(store.clone(), tools)
        .await
        .unwrap();
    let config = ServerConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        shutdown_grace: Duration::from_secs(1),
    };
    let listener = agentry_server::serve::bind(&config, &store).await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let served = state.clone();
    let serving =
        tokio::spawn(async move { agentry_server::serve(listener, served, &config).await });
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{url}/v1/sandboxes"))
        .json(&json!({}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["id"].as_str().unwrap();
    let entry = state
        .app
        .parts()
        .sandboxes
        .get(id.parse().unwrap())
        .unwrap();
    let workspace = entry.workspace().to_path_buf();
    assert!(workspace.is_dir());
    state.app.parts().shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(30), serving)
        .await
        .expect("the server stops")
        .unwrap()
        .unwrap();
    assert!(entry.sandbox.closed_reason().is_some());
    assert!(!workspace.exists());
    assert!(state.app.parts().sandboxes.is_empty());
}

/// The hard maximum of each limit an override may set where the server sets none.
const HARD_MAXIMA: [(&str, u64); 9] = [
    ("memory_bytes", 1_099_511_627_776),
    ("max_processes", 65_536),
    ("cpu_percent", 25_600),
    ("cpu_time_secs", 604_800),
    ("wall_time_secs", 604_800),
    ("idle_timeout_secs", 86_400),
    ("file_size_bytes", 1_099_511_627_776),
    ("open_files", 4096),
    ("tmp_size_bytes", 68_719_476_736),
];

/// Each limit's maximum for a sandbox of `server`: the server's default when it sets one.
async fn maxima(server: &Server) -> serde_json::Map<String, Value> {
    let (status, capabilities) = server.get("/v1/sandbox/capabilities").await;
    assert_eq!(status, 200, "{capabilities}");
    let defaults = &capabilities["default_limits"];
    HARD_MAXIMA
        .iter()
        .map(|(name, hard)| {
            let max = defaults[*name].as_u64().map_or(*hard, |own| own.min(*hard));
            ((*name).to_owned(), json!(max))
        })
        .collect()
}

#[tokio::test]
async fn the_extremes_of_every_documented_limit_make_a_working_sandbox() {
    let server = sandbox_server().await;
    let upper = Value::Object(maxima(&server).await);
    for limits in [
        json!({"memory_bytes": 67_108_864_u64, "max_processes": 8, "cpu_percent": 1,
               "cpu_time_secs": 1, "wall_time_secs": 30, "idle_timeout_secs": 1,
               "file_size_bytes": 1024, "open_files": 16, "tmp_size_bytes": 1_048_576_u64}),
        upper,
    ] {
        let id = create(&server, json!({ "limits": limits })).await;
        let (status, result) = exec(&server, &id, json!({"command": "echo hi"})).await;
        assert_eq!(status, 200, "{limits}: {result}");
        assert_eq!(result["stdout"], "hi\n", "{limits}: {result}");
        let (status, _) = send(
            &server,
            Method::DELETE,
            &format!("/v1/sandboxes/{id}"),
            None,
        )
        .await;
        assert_eq!(status, 204);
    }
}

/// The server's limits are maxima: a sandbox may lower them, never raise them, and the default
/// sandbox has a CPU share and a lifetime.
#[tokio::test]
async fn limit_overrides_may_only_lower_the_servers_limits() {
    let server = sandbox_server().await;
    let (_, capabilities) = server.get("/v1/sandbox/capabilities").await;
    let defaults = &capabilities["default_limits"];
    assert_eq!(defaults["cpu_percent"], 100, "{defaults}");
    assert_eq!(defaults["wall_time_secs"], 86_400, "{defaults}");
    for (name, default) in [
        ("memory_bytes", 1_u64 << 30),
        ("max_processes", 256),
        ("cpu_percent", 100),
        ("wall_time_secs", 86_400),
        ("idle_timeout_secs", 900),
        ("file_size_bytes", 1 << 30),
        ("open_files", 1024),
        ("tmp_size_bytes", 256 << 20),
    ] {
        assert_eq!(defaults[name], default, "{name}: {defaults}");
        let body = json!({"limits": {name: default + 1}});
        let (status, error) =
            send(&server, Method::POST, "/v1/sandboxes", Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {error}");
        let message = error["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("limits.{name}"))
                && message.contains(&default.to_string())
                && message.contains("server's limit"),
            "{body}: {message}"
        );
    }
    assert!(server.state.app.parts().sandboxes.is_empty());

    // The reproduction of the review: every limit at its old maximum.
    let (status, error) = send(
        &server,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"limits": {"memory_bytes": 1_099_511_627_776_u64,
                               "tmp_size_bytes": 68_719_476_736_u64}})),
    )
    .await;
    assert_eq!(status, 400, "{error}");

    // Lowering is accepted, and the default sandbox carries the CPU share and lifetime.
    let (status, created) = send(
        &server,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"limits": {"memory_bytes": 512_u64 << 20, "cpu_percent": 50}})),
    )
    .await;
    assert_eq!(status, 201, "{created}");
    assert_eq!(created["limits"]["memory_bytes"], 512_u64 << 20);
    assert_eq!(created["limits"]["cpu_percent"], 50);
    assert_eq!(created["limits"]["wall_time_secs"], 86_400);
    let plain = create(&server, json!({})).await;
    let (status, shown) = send(
        &server,
        Method::GET,
        &format!("/v1/sandboxes/{plain}"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["limits"]["cpu_percent"], 100, "{shown}");
    assert_eq!(shown["limits"]["wall_time_secs"], 86_400, "{shown}");
}

/// Sessions' runs get the built-in tools, a workspace each under the data folder, and a sandbox
/// each: what one session's command writes is in its workspace, and another session sees none of it.
#[tokio::test]
async fn session_runs_work_in_their_own_workspace_and_sandbox() {
    use agentry_testkit::{Reply, ScriptedTurn};
    let server = start_with(
        |home| ToolEnvironment {
            workspaces: Some(home.join("workspaces")),
            ..native_sandboxes(home)
        },
        |_| {},
    )
    .await;
    let (status, tools) = server.get("/v1/tools").await;
    assert_eq!(status, 200, "{tools}");
    let names: Vec<String> = tools
        .as_array()
        .or_else(|| tools["tools"].as_array())
        .expect("a tool list")
        .iter()
        .filter_map(|t| t["name"].as_str().map(str::to_owned))
        .collect();
    for builtin in [
        "exec",
        "terminal",
        "read_file",
        "write_file",
        "edit_file",
        "list_dir",
        "search",
        "fetch",
    ] {
        assert!(names.iter().any(|n| n == builtin), "{builtin}: {names:?}");
    }

    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "exec",
        json!({"command": "echo $((6 * 7)) > answer.txt; cat answer.txt; hostname"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("It is 42.")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "compute"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["text"], "It is 42.");
    let session = body["session_id"].as_str().unwrap().to_owned();
    let answer = server
        .home
        .path()
        .join("workspaces")
        .join(&session)
        .join("answer.txt");
    assert_eq!(std::fs::read_to_string(answer).unwrap(), "42\n");
    let seen = server.mock.requests()[1].body.to_string();
    assert!(seen.contains(r"exit code 0"), "{seen}");
    assert!(seen.contains(r"--- stdout ---\n42\nsandbox"), "{seen}");

    // Another session has another workspace and sandbox.
    server.mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "exec",
        json!({"command": "cat answer.txt"}),
    )));
    server
        .mock
        .enqueue(Reply::scripted(ScriptedTurn::text("none")));
    let (status, body) = server
        .post(
            "/v1/infer",
            json!({"session_id": "new", "model_id": "mock", "text": "look"}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_ne!(body["session_id"].as_str().unwrap(), session);
    let seen = server.mock.requests()[3].body.to_string();
    assert!(seen.contains("exit code 1"), "{seen}");
    assert!(seen.contains("No such file"), "{seen}");
    let pool = server.state.app.parts().tools.sandboxes.clone().unwrap();
    assert_eq!(pool.len(), 2, "one sandbox per session");
    pool.close_all().await;
    server.mock.check_protocol().unwrap();
}

/// Without workspaces (the default state), runs get neither the file nor the shell tools.
#[tokio::test]
async fn without_workspaces_there_are_no_file_or_shell_tools() {
    let server = start().await;
    let (_, tools) = server.get("/v1/tools").await;
    let text = tools.to_string();
    assert!(text.contains("current_time"), "{text}");
    for absent in ["\"exec\"", "\"terminal\"", "\"read_file\""] {
        assert!(!text.contains(absent), "{absent}: {text}");
    }
}

/// `POST /v1/sandboxes/{id}/pause` freezes a sandbox with a background process in it: the view
/// says so, commands and file reads answer 409 `sandbox_paused`, the process's output stops;
/// `resume` lets the same process go on. Without a cgroup freezer for the sandbox (no cgroups
/// here) pausing is a typed 503 and the sandbox keeps working.
/// `on_idle: pause`: the idle timeout pauses the sandbox instead of closing it, its files stay,
/// and the next command resumes it by itself (no 409). Without a freezer it is closed, as by
/// default.
#[tokio::test]
async fn an_idle_sandbox_pauses_and_the_next_command_wakes_it_over_http() {
    let server = sandbox_server().await;
    let (status, body) = send(
        &server,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"on_idle": "sleep"})),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let id = create(
        &server,
        json!({"on_idle": "pause", "limits": {"idle_timeout_secs": 1}}),
    )
    .await;
    let path = format!("/v1/sandboxes/{id}");
    let (_, shown) = server.get(&path).await;
    assert_eq!(shown["on_idle"], "pause", "{shown}");
    assert_eq!(shown["paused_on_idle"], false);
    assert_eq!(sh(&server, &id, "echo kept > note.txt").await, "");
    if shown["report"]["limits"] == "rlimit" {
        assert!(
            eventually(Duration::from_secs(10), || async {
                server.get(&path).await.0 == 404
            })
            .await,
            "without a freezer the idle sandbox closes"
        );
        return;
    }
    assert!(
        eventually(Duration::from_secs(10), || async {
            server.get(&path).await.1["paused_on_idle"] == true
        })
        .await,
        "the idle sandbox never paused"
    );
    let (_, paused) = server.get(&path).await;
    assert_eq!(paused["paused"], true, "{paused}");
    // The next command wakes it: no 409, and its files are there.
    assert_eq!(sh(&server, &id, "cat note.txt").await, "kept\n");
    let (_, awake) = server.get(&path).await;
    assert_eq!(awake["paused"], false, "{awake}");
    assert_eq!(awake["paused_on_idle"], false);
}

#[tokio::test]
async fn a_sandbox_pauses_and_resumes_over_http() {
    let server = sandbox_server().await;
    let id = create(&server, json!({})).await;
    let (_, shown) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert_eq!(shown["paused"], false);
    let pause = format!("/v1/sandboxes/{id}/pause");
    let resume = format!("/v1/sandboxes/{id}/resume");
    if shown["report"]["limits"] == "rlimit" {
        let (status, body) = send(&server, Method::POST, &pause, None).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["error"]["code"], "not_supported", "{body}");
        assert_eq!(sh(&server, &id, "echo up").await, "up\n");
        return;
    }
    // A process that prints a growing count, one line every 20 ms.
    let (status, started) = exec(
        &server,
        &id,
        json!({"command": "i=0; while :; do i=$((i+1)); echo $i; sleep 0.02; done", "background": true}),
    )
    .await;
    assert_eq!(status, 202, "{started}");
    let process = format!(
        "/v1/sandboxes/{id}/processes/{}",
        started["exec_id"].as_str().unwrap()
    );
    let lines = |detail: &Value| detail["stdout"].as_str().unwrap_or("").lines().count();
    assert!(
        eventually(Duration::from_secs(10), || async {
            lines(&server.get(&process).await.1) >= 3
        })
        .await
    );

    let (status, paused) = send(&server, Method::POST, &pause, None).await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["paused"], true);
    assert_eq!(
        server.get(&format!("/v1/sandboxes/{id}")).await.1["paused"],
        true
    );
    let before = lines(&server.get(&process).await.1);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        lines(&server.get(&process).await.1),
        before,
        "a paused process printed"
    );
    let (status, refused) = exec(&server, &id, json!({"command": "true"})).await;
    assert_eq!(status, 409, "{refused}");
    assert_eq!(refused["error"]["code"], "sandbox_paused");
    let (status, refused) = send(
        &server,
        Method::GET,
        &format!("/v1/sandboxes/{id}/files?path=."),
        None,
    )
    .await;
    assert_eq!(status, 409, "{refused}");
    // Pausing again changes nothing.
    let (status, again) = send(&server, Method::POST, &pause, None).await;
    assert_eq!((status, &again["paused"]), (200, &json!(true)), "{again}");

    let (status, resumed) = send(&server, Method::POST, &resume, None).await;
    assert_eq!(status, 200, "{resumed}");
    assert_eq!(resumed["paused"], false);
    assert!(
        eventually(Duration::from_secs(10), || async {
            lines(&server.get(&process).await.1) > before + 2
        })
        .await,
        "the process did not go on after resume"
    );
    let detail = server.get(&process).await.1;
    assert_eq!(detail["running"], true, "{detail}");
    // It went on counting where it stopped: the lines are 1, 2, 3… without a restart.
    let counted: Vec<u64> = detail["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .map(|line| line.parse().unwrap())
        .collect();
    assert!(
        counted.windows(2).all(|pair| pair[1] == pair[0] + 1),
        "{counted:?}"
    );
    assert_eq!(sh(&server, &id, "echo up").await, "up\n");
    // Metered from its cgroups: the counter's CPU time and the sandbox's memory.
    let (_, shown) = server.get(&format!("/v1/sandboxes/{id}")).await;
    assert!(shown["cpu_seconds"].as_f64().unwrap() > 0.0, "{shown}");
    assert!(shown["memory_bytes"].as_u64().unwrap() > 0, "{shown}");
    let (status, _) = send(
        &server,
        Method::DELETE,
        &format!("/v1/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, gone) = send(&server, Method::POST, &resume, None).await;
    assert_eq!(status, 404, "{gone}");
}

/// A snapshot of a sandbox's workspace starts new sandboxes with its files (a fork): the
/// sandbox and its fork then diverge, the snapshot stays as it was, it outlives its sandbox and
/// a restart of the server (a new one over the same folder lists it and forks from it), another
/// key cannot see or use it, and a deleted one is gone.
#[tokio::test]
async fn a_snapshot_forks_sandboxes_that_diverge_and_outlives_a_restart() {
    let server = sandbox_server().await;
    let original = create(&server, json!({})).await;
    sh(
        &server,
        &original,
        "echo one > data.txt; mkdir -p sub; echo deep > sub/f; ln -s data.txt link",
    )
    .await;
    let (status, snapshot) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{original}/snapshots"),
        None,
    )
    .await;
    let (_, shown) = server.get(&format!("/v1/sandboxes/{original}")).await;
    if shown["report"]["limits"] == "rlimit" {
        // No freezer: the host does not copy a workspace whose processes run.
        assert_eq!(status, 503, "{snapshot}");
        assert_eq!(snapshot["error"]["code"], "not_supported", "{snapshot}");
        return;
    }
    assert_eq!(status, 201, "{snapshot}");
    let snapshot_id = snapshot["id"].as_str().unwrap().to_owned();
    assert_eq!(snapshot["sandbox_id"], original.as_str());
    assert_eq!(snapshot["entries"], 4, "{snapshot}");
    assert_eq!(snapshot["bytes"], 9, "{snapshot}");
    // It was paused while it was copied, and runs again now.
    assert_eq!(shown["paused"], false);
    let fork = create(&server, json!({"snapshot_id": snapshot_id})).await;
    assert_eq!(
        sh(&server, &fork, "cat data.txt sub/f; readlink link").await,
        "one\ndeep\ndata.txt\n"
    );
    sh(&server, &original, "echo two > data.txt").await;
    sh(&server, &fork, "echo three > data.txt").await;
    assert_eq!(sh(&server, &original, "cat data.txt").await, "two\n");
    assert_eq!(sh(&server, &fork, "cat data.txt").await, "three\n");
    let again = create(&server, json!({"snapshot_id": snapshot_id})).await;
    assert_eq!(sh(&server, &again, "cat data.txt").await, "one\n");

    // It outlives its sandbox.
    let (status, _) = send(
        &server,
        Method::DELETE,
        &format!("/v1/sandboxes/{original}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, listed) = server.get("/v1/sandbox-snapshots").await;
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["snapshots"][0]["id"],
        snapshot_id.as_str(),
        "{listed}"
    );

    // A snapshot that does not exist: 404, and no sandbox is made.
    let (status, body) = send(
        &server,
        Method::POST,
        "/v1/sandboxes",
        Some(json!({"snapshot_id": "01890a5d-ac96-774b-bcce-b302099a8057"})),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let (_, open) = server.get("/v1/sandboxes").await;
    assert_eq!(open["sandboxes"].as_array().unwrap().len(), 2, "{open}");

    // A new server over the same folder (a restart) lists it and forks from it.
    let root = state_root(&server.state);
    let home = server.home.path().to_path_buf();
    let restarted = super::support::start_with(
        move |_| ToolEnvironment {
            sandbox_root: Some(root),
            ..native_sandboxes(&home)
        },
        |_| {},
    )
    .await;
    let (status, listed) = restarted
        .get(&format!("/v1/sandbox-snapshots/{snapshot_id}"))
        .await;
    assert_eq!(status, 200, "{listed}");
    let revived = create(&restarted, json!({"snapshot_id": snapshot_id})).await;
    assert_eq!(sh(&restarted, &revived, "cat data.txt").await, "one\n");

    // Deleted, it is gone; the sandboxes made from it keep their files.
    let path = format!("/v1/sandbox-snapshots/{snapshot_id}");
    let (status, _) = send(&restarted, Method::DELETE, &path, None).await;
    assert_eq!(status, 204);
    let (status, _) = restarted.get(&path).await;
    assert_eq!(status, 404);
    assert_eq!(sh(&restarted, &revived, "cat data.txt").await, "one\n");
}

/// A key's snapshots are its own: another `user` key neither lists, reads, forks nor deletes
/// them (404, as for what does not exist).
#[tokio::test]
async fn a_keys_snapshots_are_its_own() {
    let server = sandbox_server().await;
    let (_, admin) = send(
        &server,
        Method::POST,
        "/v1/api-keys",
        Some(json!({"label": "admin"})),
    )
    .await;
    let admin = admin["key"].as_str().unwrap().to_owned();
    let as_key = |key: &str| {
        let (key, http, url) = (key.to_owned(), server.http.clone(), server.url.clone());
        move |method: Method, path: String, body: Option<Value>| {
            let request = http
                .request(method, format!("{url}{path}"))
                .bearer_auth(&key);
            let request = match body {
                Some(body) => request.json(&body),
                None => request,
            };
            async move {
                let response = request.send().await.unwrap();
                let status = response.status().as_u16();
                (
                    status,
                    response.json::<Value>().await.unwrap_or(Value::Null),
                )
            }
        }
    };
    let admin_call = as_key(&admin);
    let mut keys = Vec::new();
    for label in ["alice", "bob"] {
        let (status, made) = admin_call(
            Method::POST,
            "/v1/api-keys".into(),
            Some(json!({"label": label, "role": "user"})),
        )
        .await;
        assert_eq!(status, 201, "{made}");
        keys.push(made["key"].as_str().unwrap().to_owned());
    }
    let (alice, bob) = (as_key(&keys[0]), as_key(&keys[1]));
    let (status, made) = alice(Method::POST, "/v1/sandboxes".into(), Some(json!({}))).await;
    assert_eq!(status, 201, "{made}");
    let sandbox = made["id"].as_str().unwrap().to_owned();
    let (status, snapshot) = alice(
        Method::POST,
        format!("/v1/sandboxes/{sandbox}/snapshots"),
        None,
    )
    .await;
    if made["report"]["limits"] == "rlimit" {
        // No freezer, no snapshot (the other snapshot test pins the 503).
        assert_eq!(status, 503, "{snapshot}");
        return;
    }
    assert_eq!(status, 201, "{snapshot}");
    let id = snapshot["id"].as_str().unwrap().to_owned();

    let (_, listed) = bob(Method::GET, "/v1/sandbox-snapshots".into(), None).await;
    assert_eq!(listed["snapshots"], json!([]), "{listed}");
    let (status, _) = bob(Method::GET, format!("/v1/sandbox-snapshots/{id}"), None).await;
    assert_eq!(status, 404);
    let (status, _) = bob(
        Method::POST,
        "/v1/sandboxes".into(),
        Some(json!({"snapshot_id": id})),
    )
    .await;
    assert_eq!(status, 404);
    let (status, _) = bob(Method::DELETE, format!("/v1/sandbox-snapshots/{id}"), None).await;
    assert_eq!(status, 404);
    // Its owner and the admin see it.
    let (_, listed) = alice(Method::GET, "/v1/sandbox-snapshots".into(), None).await;
    assert_eq!(listed["snapshots"][0]["id"], id.as_str(), "{listed}");
    let (status, _) = admin_call(Method::GET, format!("/v1/sandbox-snapshots/{id}"), None).await;
    assert_eq!(status, 200);
    let (status, _) = alice(Method::DELETE, format!("/v1/sandbox-snapshots/{id}"), None).await;
    assert_eq!(status, 204);
}

/// A key's snapshots share one disk quota: a snapshot that would take the key past it is refused
/// (413 `snapshot_quota_exceeded`, nothing kept), the listing shows the bytes used against the
/// quota, and deleting a snapshot makes room again.
#[tokio::test]
async fn a_keys_snapshots_stay_within_its_disk_quota() {
    let server = start_with(native_sandboxes, |state| {
        state.app.parts_mut().sandboxes =
            SandboxRegistry::new(Some(state_root(state))).with_snapshot_quota(3000);
    })
    .await;
    let id = create(&server, json!({})).await;
    let (_, shown) = server.get(&format!("/v1/sandboxes/{id}")).await;
    if shown["report"]["limits"] == "rlimit" {
        return; // No freezer, no snapshots (503, tested with the snapshots themselves).
    }
    sh(&server, &id, "head -c 2000 /dev/zero > a.bin").await;
    let snapshots = format!("/v1/sandboxes/{id}/snapshots");
    let take = || send(&server, Method::POST, &snapshots, None);
    let (status, first) = take().await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["bytes"], 2000);
    let (_, listed) = server.get("/v1/sandbox-snapshots").await;
    assert_eq!(listed["used_bytes"], 2000, "{listed}");
    assert_eq!(listed["quota_bytes"], 3000);

    // 2000 more would make 4000 of 3000: refused, and nothing is kept.
    let (status, refused) = take().await;
    assert_eq!(status, 413, "{refused}");
    assert_eq!(
        refused["error"]["code"], "snapshot_quota_exceeded",
        "{refused}"
    );
    let (_, listed) = server.get("/v1/sandbox-snapshots").await;
    assert_eq!(listed["snapshots"].as_array().unwrap().len(), 1, "{listed}");
    assert_eq!(listed["used_bytes"], 2000);
    let partial = std::fs::read_dir(state_root(&server.state).join(".snapshots"))
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".partial")
        })
        .count();
    assert_eq!(partial, 0, "a refused snapshot leaves nothing behind");
    // The sandbox goes on (it was resumed after the refused copy).
    assert_eq!(sh(&server, &id, "echo on").await, "on\n");

    // Deleting the first makes room for the second.
    let (status, _) = send(
        &server,
        Method::DELETE,
        &format!("/v1/sandbox-snapshots/{}", first["id"].as_str().unwrap()),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, second) = take().await;
    assert_eq!(status, 201, "{second}");
}

/// A sandbox paused when the server stops comes back paused when a server starts over the same
/// folder: its files are there (its processes are not: no process snapshots yet), one paused by
/// a request waits for a resume, one paused on idle wakes on its next command, and a running one
/// is gone with its workspace.
#[tokio::test]
async fn paused_sandboxes_and_their_files_survive_a_restart() {
    let server = sandbox_server().await;
    let by_request = create(&server, json!({})).await;
    let (_, shown) = server.get(&format!("/v1/sandboxes/{by_request}")).await;
    if shown["report"]["limits"] == "rlimit" {
        return; // No freezer: nothing pauses, nothing is kept.
    }
    assert_eq!(shown["restored"], false);
    sh(&server, &by_request, "echo kept > note.txt").await;
    let on_idle = create(
        &server,
        json!({"on_idle": "pause", "limits": {"idle_timeout_secs": 1}}),
    )
    .await;
    sh(&server, &on_idle, "echo idle > note.txt").await;
    let running = create(&server, json!({})).await;
    let (status, _) = send(
        &server,
        Method::POST,
        &format!("/v1/sandboxes/{by_request}/pause"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        eventually(Duration::from_secs(10), || async {
            server.get(&format!("/v1/sandboxes/{on_idle}")).await.1["paused_on_idle"] == true
        })
        .await
    );
    // The server stops (every sandbox's processes end).
    let root = state_root(&server.state);
    server.state.app.parts().sandboxes.close_all().await;
    assert!(root.join(&by_request).join("note.txt").is_file());
    assert!(
        !root.join(&running).exists(),
        "a running sandbox's workspace goes"
    );

    let home = server.home.path().to_path_buf();
    let restarted = super::support::start_with(
        move |_| ToolEnvironment {
            sandbox_root: Some(root),
            ..native_sandboxes(&home)
        },
        |_| {},
    )
    .await;
    let (status, back) = restarted.get(&format!("/v1/sandboxes/{by_request}")).await;
    assert_eq!(status, 200, "{back}");
    assert_eq!(back["restored"], true);
    assert_eq!(back["paused"], true);
    assert_eq!(back["paused_on_idle"], false);
    let (status, refused) = exec(&restarted, &by_request, json!({"command": "true"})).await;
    assert_eq!(
        status, 409,
        "paused by request, it waits for a resume: {refused}"
    );
    let (status, _) = send(
        &restarted,
        Method::POST,
        &format!("/v1/sandboxes/{by_request}/resume"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(sh(&restarted, &by_request, "cat note.txt").await, "kept\n");
    // Paused on idle: the next command wakes it.
    let (_, idle) = restarted.get(&format!("/v1/sandboxes/{on_idle}")).await;
    assert_eq!(idle["paused_on_idle"], true, "{idle}");
    assert_eq!(sh(&restarted, &on_idle, "cat note.txt").await, "idle\n");
    assert_eq!(
        restarted.get(&format!("/v1/sandboxes/{running}")).await.0,
        404
    );
    // Deleted, it does not come back again.
    let (status, _) = send(
        &restarted,
        Method::DELETE,
        &format!("/v1/sandboxes/{on_idle}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    assert!(
        !state_root(&restarted.state)
            .join(".paused")
            .join(format!("{on_idle}.json"))
            .exists()
    );
}
