//! The HTTP, command and built-in tools.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_core::tool::{ResultFormat, Tool, ToolContext, ToolError, ToolOutput, ToolRegistry};
use agentry_tools::{
    CommandTool, CommandToolConfig, HeaderValueSource, HttpTool, HttpToolConfig, StaticSecrets,
    builtin, builtin_tools,
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const LONG: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// HTTP tools

const SECRET_VALUE: &str = "s3cr3t-value-1234";

#[derive(Default)]
struct Received {
    api_keys: Vec<Option<String>>,
    bodies: Vec<Value>,
}

struct TestServer {
    base: String,
    received: Arc<Mutex<Received>>,
}

async fn start_server() -> TestServer {
    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::post;

    let received = Arc::new(Mutex::new(Received::default()));
    let state = received.clone();
    let app = Router::new()
        .route(
            "/echo",
            post(
                move |headers: HeaderMap, axum::Json(body): axum::Json<Value>| {
                    let state = state.clone();
                    async move {
                        let key = headers
                            .get("x-api-key")
                            .map(|v| v.to_str().unwrap().to_owned());
                        let mut received = state.lock().unwrap();
                        received.api_keys.push(key);
                        received.bodies.push(body.clone());
                        axum::Json(json!({"received": body}))
                    }
                },
            ),
        )
        .route("/text", post(|| async { "plain words" }))
        .route(
            "/fail",
            post(|headers: HeaderMap| async move {
                let key = headers
                    .get("x-api-key")
                    .map(|v| v.to_str().unwrap().to_owned())
                    .unwrap_or_default();
                (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("boom: the backend broke (you sent {key})"),
                )
            }),
        )
        .route(
            "/slow",
            post(|| async {
                tokio::time::sleep(Duration::from_secs(10)).await;
                "late"
            }),
        )
        .route("/big", post(|| async { "y".repeat(100_000) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    TestServer {
        base: format!("http://{address}"),
        received,
    }
}

fn http_config(name: &str, url: String) -> HttpToolConfig {
    HttpToolConfig {
        name: name.into(),
        description: "Calls the test server.".into(),
        parameters: json!({
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"]
        }),
        url,
        headers: vec![
            (
                "x-api-key".into(),
                HeaderValueSource::Secret("WEATHER_KEY".into()),
            ),
            (
                "x-client".into(),
                HeaderValueSource::Literal("agentry-tests".into()),
            ),
        ],
        timeout: None,
        max_response_bytes: 64 * 1024,
    }
}

fn secrets() -> Arc<StaticSecrets> {
    Arc::new(StaticSecrets(HashMap::from([(
        "WEATHER_KEY".to_owned(),
        SECRET_VALUE.to_owned(),
    )])))
}

fn http_client() -> reqwest::Client {
    agentry_llm::http_client(Duration::from_secs(5)).unwrap()
}

fn http_tool(config: HttpToolConfig) -> HttpTool {
    HttpTool::new(config, http_client(), secrets()).unwrap()
}

async fn invoke_one(tool: impl Tool, arguments: Value) -> Result<ToolOutput, ToolError> {
    let mut registry = ToolRegistry::default();
    let name = tool.spec().name.clone();
    registry.register(tool).unwrap();
    registry
        .invoke(&name, arguments, ToolContext::detached("c"), LONG)
        .await
}

#[tokio::test]
async fn http_tool_posts_arguments_with_the_secret_header_and_parses_json() {
    let server = start_server().await;
    let tool = http_tool(http_config("weather", format!("{}/echo", server.base)));
    let debug = format!("{tool:?}");
    assert!(!debug.contains(SECRET_VALUE), "{debug}");

    let output = invoke_one(tool, json!({"city": "Paris"})).await.unwrap();
    assert_eq!(
        output,
        ToolOutput::json(json!({"received": {"city": "Paris"}}))
    );
    let received = server.received.lock().unwrap();
    assert_eq!(received.bodies, [json!({"city": "Paris"})]);
    assert_eq!(received.api_keys, [Some(SECRET_VALUE.to_owned())]);
}

/// A server whose every POST answers `307 Temporary Redirect` to `target`.
async fn redirect_server(target: String) -> String {
    use axum::Router;
    use axum::http::StatusCode;
    use axum::http::header::LOCATION;
    use axum::routing::post;

    let app = Router::new().route(
        "/moved",
        post(move || {
            let target = target.clone();
            async move { (StatusCode::TEMPORARY_REDIRECT, [(LOCATION, target)]) }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{address}/moved")
}

#[tokio::test]
async fn http_tool_does_not_follow_a_redirect_with_its_secret_header() {
    // The second server records every request's `x-api-key`; the first redirects to it.
    let second = start_server().await;
    let target = format!("{}/echo", second.base);
    let first = redirect_server(target.clone()).await;
    let tool = http_tool(http_config("moved", first));

    let error = invoke_one(tool, json!({"city": "Paris"}))
        .await
        .unwrap_err();
    let ToolError::Failed(message) = &error else {
        panic!("expected Failed, got {error:?}");
    };
    assert!(message.contains("HTTP 307"), "{message}");
    assert!(
        message.contains(&format!("redirect to {target}")),
        "{message}"
    );
    assert!(message.contains("do not follow redirects"), "{message}");
    let received = second.received.lock().unwrap();
    assert!(
        received.api_keys.is_empty() && received.bodies.is_empty(),
        "the redirect target was reached: {:?}",
        received.api_keys
    );
}

#[tokio::test]
async fn http_tool_returns_text_bodies_as_text() {
    let server = start_server().await;
    let tool = http_tool(http_config("text", format!("{}/text", server.base)));
    let output = invoke_one(tool, json!({"city": "Paris"})).await.unwrap();
    assert_eq!(output, ToolOutput::text("plain words"));
}

#[tokio::test]
async fn http_tool_failure_names_the_status_and_never_the_secret() {
    let server = start_server().await;
    let tool = http_tool(http_config("failing", format!("{}/fail", server.base)));
    let error = invoke_one(tool, json!({"city": "Paris"}))
        .await
        .unwrap_err();
    let ToolError::Failed(message) = &error else {
        panic!("expected Failed, got {error:?}");
    };
    assert!(message.contains("HTTP 500"), "{message}");
    assert!(message.contains("boom: the backend broke"), "{message}");
    assert!(message.contains("[redacted]"), "{message}");
    assert!(!error.to_string().contains(SECRET_VALUE), "{error}");
}

#[tokio::test]
async fn http_tool_times_out() {
    let server = start_server().await;
    let mut config = http_config("slow", format!("{}/slow", server.base));
    config.timeout = Some(Duration::from_millis(200));
    let tool = http_tool(config);
    assert_eq!(tool.timeout(), Some(Duration::from_millis(200)));
    let started = Instant::now();
    let error = invoke_one(tool, json!({"city": "Paris"}))
        .await
        .unwrap_err();
    assert_eq!(error, ToolError::Timeout(Duration::from_millis(200)));
    assert!(started.elapsed() < Duration::from_secs(9));
}

#[tokio::test]
async fn http_tool_truncates_a_response_bigger_than_the_cap() {
    let server = start_server().await;
    let mut config = http_config("big", format!("{}/big", server.base));
    config.max_response_bytes = 1000;
    let output = invoke_one(http_tool(config), json!({"city": "Paris"}))
        .await
        .unwrap();
    assert_eq!(
        output,
        ToolOutput::text(format!(
            "{}\n[… truncated: showed 1000 of 100000 bytes]",
            "y".repeat(1000)
        ))
    );
}

#[tokio::test]
async fn http_tool_configuration_errors_are_clear_and_never_show_a_secret() {
    let mut errors = Vec::new();

    let mut missing = http_config("weather", "http://127.0.0.1:9/x".into());
    missing.headers = vec![(
        "authorization".into(),
        HeaderValueSource::Secret("MISSING_KEY".into()),
    )];
    let error = HttpTool::new(missing, http_client(), secrets()).unwrap_err();
    assert!(
        matches!(&error, ToolError::Registration(m) if m.contains("\"MISSING_KEY\"") && m.contains("not set")),
        "{error:?}"
    );
    errors.push(error);

    // A secret that is not a valid header value: named, never shown.
    let bad_secret_value = "bad\nvalue-with-s3cr3t-value-1234";
    let resolver = Arc::new(StaticSecrets(HashMap::from([(
        "BAD".to_owned(),
        bad_secret_value.to_owned(),
    )])));
    let mut bad_value = http_config("weather", "http://127.0.0.1:9/x".into());
    bad_value.headers = vec![("x-key".into(), HeaderValueSource::Secret("BAD".into()))];
    let error = HttpTool::new(bad_value, http_client(), resolver).unwrap_err();
    assert!(error.to_string().contains("\"BAD\""), "{error}");
    assert!(!error.to_string().contains("bad\nvalue"), "{error}");
    errors.push(error);

    for (url, expected) in [
        ("ftp://example.com/x", "http or https"),
        ("not a url", "invalid URL"),
        ("https://user:pw@example.com/x", "credentials"),
    ] {
        let error = HttpTool::new(http_config("weather", url.into()), http_client(), secrets())
            .unwrap_err();
        assert!(
            matches!(&error, ToolError::Registration(m) if m.contains(expected)),
            "{url}: {error:?}"
        );
        errors.push(error);
    }

    let mut bad_header = http_config("weather", "http://127.0.0.1:9/x".into());
    bad_header.headers = vec![("bad header".into(), HeaderValueSource::Literal("v".into()))];
    let error = HttpTool::new(bad_header, http_client(), secrets()).unwrap_err();
    assert!(error.to_string().contains("invalid header name"), "{error}");
    errors.push(error);

    let mut zero_cap = http_config("weather", "http://127.0.0.1:9/x".into());
    zero_cap.max_response_bytes = 0;
    errors.push(HttpTool::new(zero_cap, http_client(), secrets()).unwrap_err());

    let error = HttpTool::new(
        http_config("bad name", "http://127.0.0.1:9/x".into()),
        http_client(),
        secrets(),
    )
    .unwrap_err();
    errors.push(error);

    // A connection failure (nothing listens on the discard port) is a Failed error.
    let tool = http_tool(http_config("unreachable", "http://127.0.0.1:9/x".into()));
    let error = invoke_one(tool, json!({"city": "Paris"}))
        .await
        .unwrap_err();
    assert!(matches!(error, ToolError::Failed(_)), "{error:?}");
    errors.push(error);

    for error in &errors {
        let text = error.to_string();
        assert!(!text.contains(SECRET_VALUE), "{text}");
        assert!(!format!("{error:?}").contains(SECRET_VALUE), "{error:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Command tools (unsandboxed for now)

/// Writes a shell script; tools run it as `/bin/sh SCRIPT ARGS…` (running `sh` rather than the
/// freshly written file avoids "text file busy" races with other tests' forks).
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    path
}

fn command_config(name: &str, script: &Path, extra_args: &[&str]) -> CommandToolConfig {
    let mut args = vec![script.display().to_string()];
    args.extend(extra_args.iter().map(|arg| (*arg).to_owned()));
    CommandToolConfig {
        name: name.into(),
        description: "Runs a test script.".into(),
        parameters: json!({"type": "object", "properties": {}}),
        program: PathBuf::from("/bin/sh"),
        args,
        env: Vec::new(),
        timeout: None,
        max_output_bytes: 64 * 1024,
    }
}

#[tokio::test]
async fn command_tool_reads_arguments_on_stdin_and_parses_json_output() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        "echo.sh",
        r#"input=$(cat); printf '{"got": %s, "tool": "echo"}' "$input""#,
    );
    let tool = CommandTool::new(command_config("echo", &path, &[])).unwrap();
    let output = invoke_one(tool, json!({"city": "Paris", "n": [1, 2]}))
        .await
        .unwrap();
    assert_eq!(
        output,
        ToolOutput::json(json!({"got": {"city": "Paris", "n": [1, 2]}, "tool": "echo"}))
    );
}

#[tokio::test]
async fn command_tool_returns_plain_output_as_text_and_caps_it() {
    let dir = tempfile::tempdir().unwrap();
    let words = script(dir.path(), "words.sh", "cat >/dev/null; echo hello world");
    let output = invoke_one(
        CommandTool::new(command_config("words", &words, &[])).unwrap(),
        json!({}),
    )
    .await
    .unwrap();
    assert_eq!(output, ToolOutput::text("hello world\n"));

    let flood = script(
        dir.path(),
        "flood.sh",
        "head -c 10000 /dev/zero | tr '\\000' 'z'",
    );
    let mut config = command_config("flood", &flood, &[]);
    config.max_output_bytes = 100;
    let output = invoke_one(CommandTool::new(config).unwrap(), json!({}))
        .await
        .unwrap();
    assert_eq!(
        output,
        ToolOutput::text(format!(
            "{}\n[… truncated: showed 100 of 10000 bytes]",
            "z".repeat(100)
        ))
    );
}

#[tokio::test]
async fn command_tool_reports_a_non_zero_exit_with_code_and_stderr_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        "fail.sh",
        "cat >/dev/null\necho 'first line' >&2\necho 'it went wrong' >&2\nexit 3",
    );
    let error = invoke_one(
        CommandTool::new(command_config("fail", &path, &[])).unwrap(),
        json!({}),
    )
    .await
    .unwrap_err();
    let ToolError::Failed(message) = &error else {
        panic!("expected Failed, got {error:?}");
    };
    assert!(message.contains("exited with code 3"), "{message}");
    assert!(message.contains("it went wrong"), "{message}");
}

#[tokio::test]
async fn command_tool_timeout_kills_the_program() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    let path = script(dir.path(), "slow.sh", "sleep 1\necho done > \"$1\"");
    let mut config = command_config("slow", &path, &[&marker.display().to_string()]);
    config.timeout = Some(Duration::from_millis(200));
    let error = invoke_one(CommandTool::new(config).unwrap(), json!({}))
        .await
        .unwrap_err();
    assert_eq!(error, ToolError::Timeout(Duration::from_millis(200)));
    // Had the script lived on, it would have written the marker after one second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!marker.exists(), "the killed script still wrote its marker");
}

#[tokio::test]
async fn command_tool_is_killed_on_cancellation() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("marker");
    let path = script(dir.path(), "slow.sh", "sleep 1\necho done > \"$1\"");
    let config = command_config("slow", &path, &[&marker.display().to_string()]);
    let mut registry = ToolRegistry::default();
    registry
        .register(CommandTool::new(config).unwrap())
        .unwrap();
    let cancel = CancellationToken::new();
    let context = ToolContext {
        call_id: "c".into(),
        working_dir: None,
        workspace: None,
        cancel: cancel.clone(),
        ..ToolContext::detached("c")
    };
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cancel.cancel();
    });
    let error = registry
        .invoke("slow", json!({}), context, LONG)
        .await
        .unwrap_err();
    canceller.await.unwrap();
    assert_eq!(error, ToolError::Cancelled);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !marker.exists(),
        "the cancelled script still wrote its marker"
    );
}

#[tokio::test]
async fn command_tool_runs_in_the_context_working_dir() {
    let scripts = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let path = script(scripts.path(), "pwd.sh", "pwd");
    let mut registry = ToolRegistry::default();
    registry
        .register(CommandTool::new(command_config("pwd", &path, &[])).unwrap())
        .unwrap();
    let context = ToolContext {
        working_dir: Some(workspace.path().to_path_buf()),
        workspace: None,
        ..ToolContext::detached("c")
    };
    let output = registry
        .invoke("pwd", json!({}), context, LONG)
        .await
        .unwrap();
    let expected = workspace.path().canonicalize().unwrap();
    assert_eq!(
        output,
        ToolOutput::text(format!("{}\n", expected.display()))
    );
    // This process's directory is untouched.
    assert_ne!(std::env::current_dir().unwrap(), expected);
}

#[tokio::test]
async fn command_tool_environment_is_cleared_to_the_allow_list() {
    // The test process has this variable (cargo and nextest set it); the child must not.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    let dir = tempfile::tempdir().unwrap();
    let path = script(
        dir.path(),
        "env.sh",
        r#"printf '{"manifest": "%s", "mine": "%s", "path_set": "%s"}' "${CARGO_MANIFEST_DIR:-}" "${MY_SETTING:-}" "${PATH:+yes}""#,
    );
    let mut config = command_config("env", &path, &[]);
    config.env = vec![("MY_SETTING".into(), "configured".into())];
    let output = invoke_one(CommandTool::new(config).unwrap(), json!({}))
        .await
        .unwrap();
    assert_eq!(
        output,
        ToolOutput::json(json!({"manifest": "", "mine": "configured", "path_set": "yes"}))
    );
}

#[test]
fn command_tool_rejects_bad_configuration() {
    let script = Path::new("/bin/true");
    let mut empty_program = command_config("ok", script, &[]);
    empty_program.program = PathBuf::new();
    let mut bad_env = command_config("ok", script, &[]);
    bad_env.env = vec![("A=B".into(), "x".into())];
    let mut nul_arg = command_config("ok", script, &[]);
    nul_arg.args.push("a\0b".into());
    let mut zero_cap = command_config("ok", script, &[]);
    zero_cap.max_output_bytes = 0;
    for config in [
        command_config("bad name", script, &[]),
        empty_program,
        bad_env,
        nul_arg,
        zero_cap,
    ] {
        let error = CommandTool::new(config).unwrap_err();
        assert!(matches!(error, ToolError::Registration(_)), "{error:?}");
    }
}

#[tokio::test]
async fn command_tool_that_cannot_start_fails_clearly() {
    let mut config = command_config("ghost", Path::new("/bin/true"), &[]);
    config.program = PathBuf::from("/no/such/program");
    let error = invoke_one(CommandTool::new(config).unwrap(), json!({}))
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ToolError::Failed(m) if m.contains("cannot start") && m.contains("/no/such/program")),
        "{error:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Built-ins

fn builtins() -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    for tool in builtin_tools() {
        registry.register_arc(tool).unwrap();
    }
    registry
}

async fn current_time(registry: &ToolRegistry, arguments: Value) -> Result<Value, ToolError> {
    registry
        .call_direct("current_time", arguments, ResultFormat::Json, LONG)
        .await
}

fn unix_now() -> i64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    i64::try_from(now.as_secs()).unwrap()
}

#[tokio::test]
async fn current_time_returns_rfc3339_in_utc_and_at_an_offset() {
    let registry = builtins();
    let tool = builtin("current_time").unwrap();
    assert!(tool.idempotent());
    assert!(builtin("no_such_builtin").is_none());

    let utc = current_time(&registry, json!({})).await.unwrap();
    let time = utc["time"].as_str().unwrap();
    assert!(time.ends_with('Z'), "{utc}");
    let parsed = chrono::DateTime::parse_from_rfc3339(time).unwrap();
    let seconds = utc["unix_seconds"].as_i64().unwrap();
    assert_eq!(parsed.timestamp(), seconds);
    assert!((seconds - unix_now()).abs() < 60, "{utc}");
    assert_eq!(utc["timezone"], "UTC");

    let explicit = current_time(&registry, json!({"timezone": "UTC"}))
        .await
        .unwrap();
    assert!(explicit["time"].as_str().unwrap().ends_with('Z'));

    for offset in ["+02:00", "-05:30"] {
        let value = current_time(&registry, json!({"timezone": offset}))
            .await
            .unwrap();
        let time = value["time"].as_str().unwrap();
        assert!(time.ends_with(offset), "{value}");
        let parsed = chrono::DateTime::parse_from_rfc3339(time).unwrap();
        assert_eq!(parsed.timestamp(), value["unix_seconds"].as_i64().unwrap());
        assert_eq!(value["timezone"], offset);
    }
}

#[tokio::test]
async fn current_time_rejects_an_unknown_timezone_clearly() {
    let registry = builtins();
    for timezone in ["Mars/Olympus", "+02:00junk", "+25:00", "2", ""] {
        let error = current_time(&registry, json!({"timezone": timezone}))
            .await
            .unwrap_err();
        let ToolError::InvalidArguments(message) = &error else {
            panic!("{timezone:?}: expected InvalidArguments, got {error:?}");
        };
        assert!(message.contains(&format!("{timezone:?}")), "{message}");
        assert!(message.contains("\"+02:00\""), "{message}");
    }
    // Arguments the schema does not know are rejected before the tool runs.
    assert!(matches!(
        current_time(&registry, json!({"zone": "UTC"})).await,
        Err(ToolError::InvalidArguments(_))
    ));
}
