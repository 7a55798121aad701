//! server-everything over stdio and over streamable HTTP: the same checks on both transports.

use std::collections::BTreeMap;
use std::time::Duration;

use agentry_mcp::{
    CallOptions, ELICITATION_DECLINED, ElicitationAnswer, ElicitationKind, McpManager,
    McpServerConfig, ServerState, TransportKind,
};
use agentry_types::{ImageSource, ToolResultPart};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::support::{connected, eventually, servers, stdio, text};

/// Everything the issue asks of server-everything, on whichever transport `manager` uses.
async fn exercise(manager: &McpManager) -> anyhow::Result<()> {
    let names: Vec<String> = manager.tools().into_iter().map(|tool| tool.name).collect();
    for expected in [
        "everything__echo",
        "everything__get-sum",
        "everything__trigger-long-running-operation",
        "everything__get-structured-content",
        "everything__get-tiny-image",
    ] {
        assert!(
            names.iter().any(|name| name == expected),
            "{expected} missing from {names:?}"
        );
    }
    let sum_tool = manager
        .tools()
        .into_iter()
        .find(|tool| tool.tool == "get-sum")
        .ok_or_else(|| anyhow::anyhow!("no get-sum"))?;
    assert_eq!(sum_tool.input_schema["type"], "object");
    assert!(sum_tool.input_schema["properties"]["a"].is_object());

    // echo
    let echoed = manager
        .call_tool(
            "everything",
            "echo",
            json!({"message": "héllo"}),
            CallOptions::default(),
        )
        .await?;
    assert!(!echoed.is_error);
    assert_eq!(text(&echoed), "Echo: héllo");

    // get-sum
    let sum = manager
        .call_tool(
            "everything",
            "get-sum",
            json!({"a": 2, "b": 40}),
            CallOptions::default(),
        )
        .await?;
    assert!(text(&sum).contains("42"), "{sum:?}");

    // trigger-long-running-operation: progress notifications reach the caller.
    let (progress_tx, mut progress_rx) = mpsc::unbounded_channel();
    let long = manager
        .call_tool(
            "everything",
            "trigger-long-running-operation",
            json!({"duration": 1, "steps": 3}),
            CallOptions {
                progress: Some(progress_tx),
                // Shorter than the whole operation: only the progress keeps it alive.
                timeout: Some(Duration::from_millis(900)),
                ..CallOptions::default()
            },
        )
        .await?;
    assert!(text(&long).contains("completed"), "{long:?}");
    let mut steps = Vec::new();
    while let Ok(progress) = progress_rx.try_recv() {
        steps.push((progress.progress, progress.total));
    }
    assert_eq!(
        steps,
        [(1.0, Some(3.0)), (2.0, Some(3.0)), (3.0, Some(3.0))]
    );

    // get-structured-content: the structured result is kept as it was sent.
    let weather = manager
        .call_tool(
            "everything",
            "get-structured-content",
            json!({"location": "Chicago"}),
            CallOptions::default(),
        )
        .await?;
    let structured = weather
        .structured_content
        .clone()
        .ok_or_else(|| anyhow::anyhow!("no structured content: {weather:?}"))?;
    assert!(structured["temperature"].is_number(), "{structured}");
    assert!(structured["conditions"].is_string(), "{structured}");
    // The model sees it once: the server also sent it as text, so no JSON part is added.
    let for_model = weather.parts_for_model();
    assert_eq!(for_model.len(), weather.content.len());

    // get-tiny-image: text, a PNG, text — in order.
    let image = manager
        .call_tool(
            "everything",
            "get-tiny-image",
            json!({}),
            CallOptions::default(),
        )
        .await?;
    match image.content.as_slice() {
        [
            ToolResultPart::Text { .. },
            ToolResultPart::Image {
                source: ImageSource::Base64 { media_type, data },
            },
            ToolResultPart::Text { .. },
        ] => {
            assert_eq!(media_type, "image/png");
            assert!(
                data.starts_with("iVBORw0KGgo"),
                "not a base64 PNG: {}",
                &data[..16]
            );
        }
        other => panic!("unexpected image result: {other:?}"),
    }

    // A tool the server does not have: the server's own error, typed.
    let missing = manager
        .call_tool(
            "everything",
            "no-such-tool",
            json!({}),
            CallOptions::default(),
        )
        .await;
    match missing {
        Ok(result) => assert!(result.is_error, "{result:?}"),
        Err(error) => assert!(error.to_string().contains("no-such-tool"), "{error}"),
    }

    // Resources and prompts can be listed and read.
    let resources = manager.list_resources("everything").await?;
    assert!(!resources.is_empty());
    let uri = resources[0]["uri"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("no uri"))?
        .to_owned();
    let read = manager.read_resource("everything", &uri).await?;
    assert_eq!(read["contents"][0]["uri"], Value::String(uri));
    let prompts = manager.list_prompts("everything").await?;
    let simple = prompts
        .iter()
        .find(|prompt| prompt["name"] == "simple-prompt")
        .ok_or_else(|| anyhow::anyhow!("no simple-prompt in {prompts:?}"))?;
    let rendered = manager
        .get_prompt(
            "everything",
            simple["name"].as_str().unwrap_or_default(),
            BTreeMap::new(),
        )
        .await?;
    assert!(
        rendered["messages"]
            .as_array()
            .is_some_and(|m| !m.is_empty()),
        "{rendered}"
    );
    Ok(())
}

/// Starts a call of `tool` that takes elicitations (with `idle` as its idle timeout) and waits
/// for the server's request for input.
async fn eliciting_call(
    manager: &McpManager,
    tool: &str,
    arguments: Value,
    idle: Option<Duration>,
) -> anyhow::Result<(
    tokio::task::JoinHandle<Result<agentry_mcp::McpToolResult, agentry_mcp::McpError>>,
    agentry_mcp::ElicitationRequest,
)> {
    let (requests_tx, mut requests) = mpsc::unbounded_channel();
    let manager = manager.clone();
    let tool = tool.to_owned();
    let call = tokio::spawn(async move {
        manager
            .call_tool(
                "everything",
                &tool,
                arguments,
                CallOptions {
                    timeout: idle,
                    elicitation: Some(requests_tx),
                    ..CallOptions::default()
                },
            )
            .await
    });
    let request = tokio::time::timeout(Duration::from_secs(20), requests.recv())
        .await?
        .ok_or_else(|| anyhow::anyhow!("no elicitation request"))?;
    Ok((call, request))
}

/// The conditional tools are registered after initialisation and announced with
/// `notifications/tools/list_changed`: the list refreshes. A request for user input during a
/// call that takes none is declined with our message; during a call that takes them it reaches
/// the caller, whose answer (accept with content, decline) the tool sees; a person taking longer
/// than the idle timeout does not time the call out; URL requests arrive with their page.
async fn list_changed_and_elicitation(manager: &McpManager) -> anyhow::Result<()> {
    eventually(Duration::from_secs(20), || {
        let tools = manager.tools();
        [
            "everything__trigger-elicitation-request",
            "everything__trigger-url-elicitation",
        ]
        .iter()
        .all(|name| tools.iter().any(|tool| tool.name == *name))
    })
    .await?;
    let outcome = manager
        .call_tool(
            "everything",
            "trigger-elicitation-request",
            json!({}),
            CallOptions::default(),
        )
        .await;
    let said = match outcome {
        Ok(result) => {
            assert!(result.is_error, "{result:?}");
            text(&result)
        }
        Err(error) => error.to_string(),
    };
    assert!(said.contains(ELICITATION_DECLINED), "{said}");

    // Accepted, after longer than the call's idle timeout.
    let (call, request) = eliciting_call(
        manager,
        "trigger-elicitation-request",
        json!({}),
        Some(Duration::from_millis(400)),
    )
    .await?;
    assert_eq!(request.server, "everything");
    assert!(
        request.message.contains("Please provide"),
        "{}",
        request.message
    );
    let ElicitationKind::Form { requested_schema } = &request.kind else {
        anyhow::bail!("expected a form, got {:?}", request.kind);
    };
    assert_eq!(requested_schema["required"], json!(["name"]));
    assert!(requested_schema["properties"]["check"].is_object());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(request.responder.is_open());
    assert!(request.responder.answer(ElicitationAnswer::Accept(
        json!({"name": "Ada Lovelace", "check": true})
    )));
    let result = call.await??;
    assert!(!result.is_error, "{result:?}");
    let said = text(&result);
    assert!(said.contains("Name: Ada Lovelace"), "{said}");
    assert!(said.contains("Agreed to terms: true"), "{said}");

    // Declined.
    let (call, request) =
        eliciting_call(manager, "trigger-elicitation-request", json!({}), None).await?;
    assert!(request.responder.answer(ElicitationAnswer::Decline));
    let said = text(&call.await??);
    assert!(said.contains("declined"), "{said}");

    // A URL request.
    let (call, request) = eliciting_call(
        manager,
        "trigger-url-elicitation",
        json!({"url": "https://example.com/authorize", "message": "Sign in, please"}),
        None,
    )
    .await?;
    assert_eq!(request.message, "Sign in, please");
    let ElicitationKind::Url { url, .. } = &request.kind else {
        anyhow::bail!("expected a URL request, got {:?}", request.kind);
    };
    assert_eq!(url, "https://example.com/authorize");
    assert!(
        request
            .responder
            .answer(ElicitationAnswer::Accept(Value::Null))
    );
    let result = call.await??;
    assert!(!result.is_error, "{result:?}");
    let said = text(&result);
    assert!(said.contains("completed the URL elicitation"), "{said}");
    Ok(())
}

#[tokio::test]
async fn everything_over_stdio() -> anyhow::Result<()> {
    let servers = servers()?;
    let manager = connected("everything", stdio(&servers.everything())).await?;
    let status = manager.status("everything")?;
    assert_eq!(status.transport, TransportKind::Stdio);
    assert!(status.pid.is_some());
    assert_eq!(status.protocol_version.as_deref(), Some("2025-11-25"));
    assert!(status.tool_count >= 13, "{status:?}");
    exercise(&manager).await?;
    list_changed_and_elicitation(&manager).await?;
    Ok(())
}

#[tokio::test]
async fn everything_over_streamable_http() -> anyhow::Result<()> {
    let servers = servers()?;
    let http = servers.start_everything_http().await?;
    let manager = connected("everything", McpServerConfig::http(http.url())).await?;
    let status = manager.status("everything")?;
    assert_eq!(status.transport, TransportKind::StreamableHttp);
    assert_eq!(status.state, ServerState::Connected);
    assert_eq!(status.pid, None);
    exercise(&manager).await?;
    list_changed_and_elicitation(&manager).await?;
    Ok(())
}

#[tokio::test]
async fn a_stdio_server_gets_only_its_configured_environment() -> anyhow::Result<()> {
    let servers = servers()?;
    let config = stdio(&servers.everything()).with_env(
        "AGENTRY_TEST_GIVEN",
        agentry_mcp::ValueSource::Secret {
            secret: "given".into(),
        },
    );
    // About the environment a host process gets: on the host, allowed explicitly.
    let manager = McpManager::with_stdio(agentry_mcp::StdioPolicy::host());
    manager
        .add("everything", config, &|name| {
            (name == "given").then(|| "s3cret".to_owned())
        })
        .await?;
    manager
        .wait_ready("everything", super::support::READY)
        .await?;
    let env = manager
        .call_tool("everything", "get-env", json!({}), CallOptions::default())
        .await?;
    let env: Value = serde_json::from_str(&text(&env))?;
    assert_eq!(env["AGENTRY_TEST_GIVEN"], "s3cret");
    assert!(env.get("PATH").is_some());
    // The test process has CARGO_* variables; none reach the server.
    assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
    assert!(env.get("CARGO_MANIFEST_DIR").is_none(), "{env}");
    Ok(())
}

/// A log sink for one test: everything written through it, kept.
#[derive(Clone, Default)]
struct LogSink(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for LogSink {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test(flavor = "current_thread")]
async fn a_stdio_servers_stderr_goes_to_the_log_tagged_with_its_name() -> anyhow::Result<()> {
    let sink = LogSink::default();
    let writer = sink.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    // Every task of this single-threaded runtime logs through it.
    let _guard = tracing::subscriber::set_default(subscriber);
    let servers = servers()?;
    let _manager = connected("chatty", stdio(&servers.everything())).await?;
    eventually(Duration::from_secs(10), || {
        String::from_utf8_lossy(&sink.0.lock().unwrap()).contains("Starting default (STDIO) server")
    })
    .await?;
    let logged = String::from_utf8_lossy(&sink.0.lock().unwrap()).into_owned();
    let line = logged
        .lines()
        .find(|line| line.contains("Starting default (STDIO) server"))
        .unwrap_or_default();
    assert!(line.contains("mcp_server=chatty"), "{line}");
    assert!(line.contains("agentry_mcp::stderr"), "{line}");
    Ok(())
}
