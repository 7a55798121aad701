//! The tool registry, result shaping, and the function, HTTP, command and built-in tools.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_core::tool::{
    CommandTool, CommandToolConfig, DEFAULT_RESULT_LIMIT, FunctionTool, HeaderValueSource,
    HttpTool, HttpToolConfig, ResultFormat, StaticSecrets, Tool, ToolContext, ToolError,
    ToolOutput, ToolRegistry, builtin, builtin_tools, format_output, result_for_model,
};
use agentry_types::{ImageSource, ToolCall, ToolResultPart, ToolSpec};
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

const LONG: Duration = Duration::from_secs(30);

/// A tool with a hand-written spec that answers "ok".
struct SpecTool(ToolSpec);

impl SpecTool {
    fn new(name: &str, parameters: Value) -> Self {
        Self(ToolSpec::new(name, "test tool", parameters))
    }
}

impl Tool for SpecTool {
    fn spec(&self) -> &ToolSpec {
        &self.0
    }

    fn call(&self, _: Value, _: ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        Box::pin(async { Ok(ToolOutput::text("ok")) })
    }
}

#[derive(Deserialize, JsonSchema)]
struct EchoArguments {
    /// Text to echo.
    text: String,
}

fn echo_tool(name: &str) -> FunctionTool {
    FunctionTool::new(
        name,
        "Echoes its text.",
        |args: EchoArguments, _| async move { Ok(ToolOutput::text(args.text)) },
    )
}

#[derive(Deserialize, JsonSchema)]
struct SleepArguments {
    /// How long to sleep.
    millis: u64,
}

type TokenSlot = Arc<Mutex<Option<CancellationToken>>>;

/// A tool that sleeps, keeping the cancellation token it was given in `slot`.
fn sleeper(name: &str, slot: TokenSlot) -> FunctionTool {
    FunctionTool::new(
        name,
        "Sleeps.",
        move |args: SleepArguments, context: ToolContext| {
            *slot.lock().unwrap() = Some(context.cancel.clone());
            async move {
                tokio::time::sleep(Duration::from_millis(args.millis)).await;
                Ok(ToolOutput::text("woke"))
            }
        },
    )
}

fn weather_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1}
        },
        "required": ["city"],
        "additionalProperties": false
    })
}

fn invalid_arguments(result: Result<(), ToolError>) -> String {
    match result {
        Err(ToolError::InvalidArguments(message)) => message,
        other => panic!("expected InvalidArguments, got {other:?}"),
    }
}

fn registration_error(result: Result<(), ToolError>) -> String {
    match result {
        Err(ToolError::Registration(message)) => message,
        other => panic!("expected Registration, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Registry

#[test]
fn registry_registers_lists_and_rejects_duplicates() {
    let mut registry = ToolRegistry::default();
    assert!(registry.is_empty());
    registry.register(echo_tool("zeta")).unwrap();
    registry.register(echo_tool("alpha")).unwrap();
    registry
        .register_arc(Arc::new(SpecTool::new("mid-dle_1", weather_schema())))
        .unwrap();

    assert_eq!(registry.len(), 3);
    assert_eq!(registry.names(), ["alpha", "mid-dle_1", "zeta"]);
    let spec_names: Vec<String> = registry.specs().into_iter().map(|s| s.name).collect();
    assert_eq!(spec_names, ["alpha", "mid-dle_1", "zeta"]);
    assert!(registry.contains("alpha"));
    assert!(!registry.contains("beta"));
    assert_eq!(registry.get("zeta").unwrap().spec().name, "zeta");
    assert!(registry.get("beta").is_none());

    let message = registration_error(registry.register(echo_tool("alpha")));
    assert!(
        message.contains("\"alpha\" is already registered"),
        "{message}"
    );
    assert_eq!(registry.len(), 3);

    // A clone is independent once either side registers more.
    let mut clone = registry.clone();
    clone.register(echo_tool("extra")).unwrap();
    assert_eq!(clone.len(), 4);
    assert_eq!(registry.len(), 3);
}

#[test]
fn registry_rejects_bad_names() {
    let mut registry = ToolRegistry::default();
    let long = "a".repeat(65);
    for name in [
        "",
        "has space",
        "dotted.name",
        "ünïcode",
        "slash/name",
        long.as_str(),
    ] {
        let message = registration_error(registry.register(echo_tool(name)));
        assert!(message.contains("invalid tool name"), "{name:?}: {message}");
    }
    registry.register(echo_tool(&"a".repeat(64))).unwrap();
    assert_eq!(registry.len(), 1);
}

#[test]
fn registry_rejects_bad_schemas() {
    let mut registry = ToolRegistry::default();
    let cases = [
        (json!("not a schema"), "must be a JSON Schema object"),
        (json!({"type": "string"}), "\"type\": \"object\""),
        (json!({"properties": {}}), "\"type\": \"object\""),
        (
            json!({"type": "object", "properties": {"a": {"type": "no-such-type"}}}),
            "is invalid",
        ),
        (
            json!({"type": "object", "properties": {"a": {"minLength": -1}}}),
            "is invalid",
        ),
        // External references are never fetched.
        (
            json!({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}),
            "is invalid",
        ),
    ];
    for (schema, expected) in cases {
        let message = registration_error(registry.register(SpecTool::new("t", schema.clone())));
        assert!(message.contains(expected), "{schema}: {message}");
    }
    assert!(registry.is_empty());
}

#[test]
fn subset_picks_named_tools_and_rejects_unknown_ones() {
    let mut registry = ToolRegistry::default();
    for name in ["a", "b", "c"] {
        registry.register(echo_tool(name)).unwrap();
    }
    let subset = registry.subset(&["c".into(), "a".into()]).unwrap();
    assert_eq!(subset.names(), ["a", "c"]);
    assert_eq!(
        registry.subset(&["a".into(), "nope".into()]).unwrap_err(),
        ToolError::NotFound("nope".into())
    );
}

#[test]
fn validate_accepts_good_arguments_and_names_the_path_of_each_error() {
    let mut registry = ToolRegistry::default();
    registry
        .register(SpecTool::new("weather", weather_schema()))
        .unwrap();

    registry
        .validate("weather", &json!({"city": "Paris", "days": 3}))
        .unwrap();
    registry
        .validate("weather", &json!({"city": "Paris"}))
        .unwrap();

    let missing = invalid_arguments(registry.validate("weather", &json!({})));
    assert_eq!(missing, "(root): \"city\" is a required property");

    let wrong_type = invalid_arguments(registry.validate("weather", &json!({"city": 5})));
    assert_eq!(wrong_type, "\"/city\": 5 is not of type \"string\"");

    let extra =
        invalid_arguments(registry.validate("weather", &json!({"city": "Paris", "country": "FR"})));
    assert!(extra.starts_with("(root): "), "{extra}");
    assert!(
        extra.contains("Additional properties are not allowed"),
        "{extra}"
    );
    assert!(
        extra.contains("'country'") || extra.contains("\"country\""),
        "{extra}"
    );

    // Every error is listed, each with its path.
    let several = invalid_arguments(registry.validate("weather", &json!({"city": 1, "days": 0})));
    assert!(
        several.contains("\"/city\": 1 is not of type \"string\""),
        "{several}"
    );
    assert!(
        several.contains("\"/days\": 0 is less than the minimum of 1"),
        "{several}"
    );

    let not_object = invalid_arguments(registry.validate("weather", &json!([1, 2])));
    assert!(
        not_object.contains("is not of type \"object\""),
        "{not_object}"
    );

    assert_eq!(
        registry.validate("nope", &json!({})).unwrap_err(),
        ToolError::NotFound("nope".into())
    );
}

#[tokio::test]
async fn invoke_validates_before_running() {
    let mut registry = ToolRegistry::default();
    registry.register(echo_tool("echo")).unwrap();
    let output = registry
        .invoke(
            "echo",
            json!({"text": "hi"}),
            ToolContext::detached("c1"),
            LONG,
        )
        .await
        .unwrap();
    assert_eq!(output, ToolOutput::text("hi"));

    let error = registry
        .invoke(
            "echo",
            json!({"text": 7}),
            ToolContext::detached("c2"),
            LONG,
        )
        .await
        .unwrap_err();
    assert_eq!(
        error,
        ToolError::InvalidArguments("\"/text\": 7 is not of type \"string\"".into())
    );
}

#[tokio::test]
async fn invoke_unknown_tool_is_not_found() {
    let registry = ToolRegistry::default();
    let error = registry
        .invoke("missing", json!({}), ToolContext::detached("c"), LONG)
        .await
        .unwrap_err();
    assert_eq!(error, ToolError::NotFound("missing".into()));
}

#[tokio::test]
async fn invoke_applies_the_default_timeout_and_cancels_the_tool() {
    let slot = TokenSlot::default();
    let mut registry = ToolRegistry::default();
    registry.register(sleeper("sleeper", slot.clone())).unwrap();

    let caller = CancellationToken::new();
    let context = ToolContext {
        call_id: "c".into(),
        working_dir: None,
        workspace: None,
        cancel: caller.clone(),
        ..ToolContext::detached("c")
    };
    let error = registry
        .invoke(
            "sleeper",
            json!({"millis": 30_000}),
            context,
            Duration::from_millis(100),
        )
        .await
        .unwrap_err();
    assert_eq!(error, ToolError::Timeout(Duration::from_millis(100)));
    let tool_token = slot.lock().unwrap().clone().unwrap();
    assert!(tool_token.is_cancelled(), "the tool's token is cancelled");
    assert!(!caller.is_cancelled(), "the caller's token is left alone");

    // Within the timeout the tool finishes.
    let output = registry
        .invoke(
            "sleeper",
            json!({"millis": 10}),
            ToolContext::detached("c"),
            LONG,
        )
        .await
        .unwrap();
    assert_eq!(output, ToolOutput::text("woke"));
}

#[tokio::test]
async fn a_tool_timeout_overrides_the_default() {
    let slot = TokenSlot::default();
    let mut registry = ToolRegistry::default();
    registry
        .register(sleeper("short", slot.clone()).with_timeout(Duration::from_millis(50)))
        .unwrap();
    assert_eq!(
        registry.get("short").unwrap().timeout(),
        Some(Duration::from_millis(50))
    );
    let error = registry
        .invoke(
            "short",
            json!({"millis": 30_000}),
            ToolContext::detached("c"),
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
    assert_eq!(error, ToolError::Timeout(Duration::from_millis(50)));
    assert!(slot.lock().unwrap().as_ref().unwrap().is_cancelled());
}

#[tokio::test]
async fn cancelling_while_a_tool_runs_returns_cancelled_promptly() {
    let slot = TokenSlot::default();
    let mut registry = ToolRegistry::default();
    registry.register(sleeper("sleeper", slot.clone())).unwrap();

    let cancel = CancellationToken::new();
    let context = ToolContext {
        call_id: "c".into(),
        working_dir: None,
        workspace: None,
        cancel: cancel.clone(),
        ..ToolContext::detached("c")
    };
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    let started = Instant::now();
    let error = registry
        .invoke("sleeper", json!({"millis": 60_000}), context, LONG)
        .await
        .unwrap_err();
    canceller.await.unwrap();
    assert_eq!(error, ToolError::Cancelled);
    // The tool would have slept a minute; the call ended with the cancellation instead.
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(slot.lock().unwrap().as_ref().unwrap().is_cancelled());
}

/// A tool that waits for its cancellation token and records that it saw it.
fn cooperative(name: &str, saw_cancel: Arc<Mutex<usize>>) -> FunctionTool {
    FunctionTool::new(
        name,
        "Waits until told to stop.",
        move |_: SleepArguments, context: ToolContext| {
            let saw_cancel = saw_cancel.clone();
            async move {
                context.cancel.cancelled().await;
                *saw_cancel.lock().unwrap() += 1;
                Err(ToolError::Cancelled)
            }
        },
    )
}

#[tokio::test]
async fn a_tool_that_watches_its_token_gets_to_wind_down() {
    let saw_cancel = Arc::new(Mutex::new(0));
    let mut registry = ToolRegistry::default();
    registry
        .register(cooperative("cooperative", saw_cancel.clone()))
        .unwrap();

    // On timeout.
    let error = registry
        .invoke(
            "cooperative",
            json!({"millis": 0}),
            ToolContext::detached("c"),
            Duration::from_millis(50),
        )
        .await
        .unwrap_err();
    assert_eq!(error, ToolError::Timeout(Duration::from_millis(50)));
    assert_eq!(*saw_cancel.lock().unwrap(), 1);

    // On cancellation.
    let cancel = CancellationToken::new();
    let context = ToolContext {
        cancel: cancel.clone(),
        ..ToolContext::detached("c")
    };
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(50)).await;
        cancel.cancel();
    });
    let error = registry
        .invoke("cooperative", json!({"millis": 0}), context, LONG)
        .await
        .unwrap_err();
    canceller.await.unwrap();
    assert_eq!(error, ToolError::Cancelled);
    assert_eq!(*saw_cancel.lock().unwrap(), 2);

    // A caller whose token is already cancelled does not start the tool.
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let context = ToolContext {
        cancel: cancelled,
        ..ToolContext::detached("c")
    };
    let error = registry
        .invoke("cooperative", json!({"millis": 0}), context, LONG)
        .await
        .unwrap_err();
    assert_eq!(error, ToolError::Cancelled);
    assert_eq!(*saw_cancel.lock().unwrap(), 2);
}

#[tokio::test]
async fn a_panicking_tool_fails_instead_of_crashing() {
    let mut registry = ToolRegistry::default();
    registry
        .register(FunctionTool::new(
            "crash",
            "Panics.",
            |args: EchoArguments, _| async move {
                if args.text == "boom" {
                    panic!("tool bug");
                }
                Ok(ToolOutput::text(args.text))
            },
        ))
        .unwrap();
    let error = registry
        .invoke(
            "crash",
            json!({"text": "boom"}),
            ToolContext::detached("c"),
            LONG,
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&error, ToolError::Failed(m) if m.contains("panicked")),
        "{error:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// FunctionTool

/// Units of temperature.
#[derive(Debug, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "lowercase")]
enum Units {
    Celsius,
    Fahrenheit,
}

/// Arguments of the forecast tool.
#[derive(Debug, Deserialize, JsonSchema)]
struct ForecastArguments {
    /// The city.
    city: String,
    /// How many days ahead.
    #[serde(default)]
    days: Option<u32>,
    /// Temperature units.
    units: Units,
}

fn forecast_tool() -> FunctionTool {
    FunctionTool::new(
        "forecast",
        "Weather forecast.",
        |args: ForecastArguments, _| async move {
            Ok(ToolOutput::json(json!({
                "city": args.city,
                "days": args.days.unwrap_or(1),
                "celsius": args.units == Units::Celsius,
            })))
        },
    )
    .idempotent()
}

/// Follows a local `$ref` (`#/$defs/...`) in `root`.
fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => root
            .pointer(reference.trim_start_matches('#'))
            .unwrap_or_else(|| panic!("dangling reference {reference}")),
        None => schema,
    }
}

#[test]
fn function_tool_schema_is_derived_from_the_argument_type() {
    let tool = forecast_tool();
    // `idempotent()` on the type itself is the builder; the trait method reads the flag.
    assert!(Tool::idempotent(&tool));
    assert_eq!(tool.timeout(), None);
    let spec = tool.spec();
    assert_eq!(spec.name, "forecast");
    assert_eq!(spec.description, "Weather forecast.");
    let schema = &spec.parameters;
    assert_eq!(schema["type"], "object");
    assert!(schema.get("$schema").is_none(), "{schema}");
    assert!(schema.get("title").is_none(), "{schema}");
    assert_eq!(schema["properties"]["city"]["type"], "string");
    assert_eq!(schema["properties"]["city"]["description"], "The city.");
    let required: Vec<&str> = schema["required"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        required.contains(&"city") && required.contains(&"units"),
        "{schema}"
    );
    assert!(!required.contains(&"days"), "{schema}");
    let days_type = &schema["properties"]["days"]["type"];
    assert!(
        days_type == "integer" || days_type == &json!(["integer", "null"]),
        "{schema}"
    );
    let units = resolve(schema, &schema["properties"]["units"]);
    assert_eq!(units["enum"], json!(["celsius", "fahrenheit"]), "{schema}");
}

#[derive(Deserialize, JsonSchema)]
struct NoArguments {}

#[derive(Deserialize, JsonSchema)]
struct UnitArguments;

#[tokio::test]
async fn function_tools_without_arguments_get_an_empty_object_schema() {
    let mut registry = ToolRegistry::default();
    let empty = FunctionTool::new("empty", "No arguments.", |_: NoArguments, _| async {
        Ok(ToolOutput::text("empty ok"))
    });
    let unit = FunctionTool::new("unit", "No arguments.", |_: UnitArguments, _| async {
        Ok(ToolOutput::text("unit ok"))
    });
    for tool in [&empty, &unit] {
        let schema = &tool.spec().parameters;
        assert_eq!(schema["type"], "object", "{schema}");
        assert_eq!(schema["properties"], json!({}), "{schema}");
        assert!(schema.get("$schema").is_none() && schema.get("title").is_none());
    }
    registry.register(empty).unwrap();
    registry.register(unit).unwrap();
    for (name, expected) in [("empty", "empty ok"), ("unit", "unit ok")] {
        let output = registry
            .invoke(name, json!({}), ToolContext::detached("c"), LONG)
            .await
            .unwrap();
        assert_eq!(output, ToolOutput::text(expected));
    }
}

#[tokio::test]
async fn function_tool_runs_with_valid_arguments_and_rejects_invalid_ones() {
    let mut registry = ToolRegistry::default();
    registry.register(forecast_tool()).unwrap();

    let output = registry
        .invoke(
            "forecast",
            json!({"city": "Paris", "units": "celsius", "days": 3}),
            ToolContext::detached("c"),
            LONG,
        )
        .await
        .unwrap();
    assert_eq!(
        output,
        ToolOutput::json(json!({"city": "Paris", "days": 3, "celsius": true}))
    );

    let bad_enum = invalid_arguments(
        registry.validate("forecast", &json!({"city": "Paris", "units": "kelvin"})),
    );
    assert!(bad_enum.starts_with("\"/units\": \"kelvin\""), "{bad_enum}");
    let missing = invalid_arguments(registry.validate("forecast", &json!({"units": "celsius"})));
    assert_eq!(missing, "(root): \"city\" is a required property");

    // Called directly (skipping validation), a bad argument is still InvalidArguments.
    let tool = forecast_tool();
    let error = tool
        .call(json!({"city": 1}), ToolContext::detached("c"))
        .await
        .unwrap_err();
    assert!(matches!(error, ToolError::InvalidArguments(_)), "{error:?}");
}

// ---------------------------------------------------------------------------------------------
// Results for the model

fn call() -> ToolCall {
    ToolCall::new("call_1", "weather", json!({}))
}

#[test]
fn result_for_model_flags_errors_with_actionable_text() {
    let result = result_for_model(
        &call(),
        Err(ToolError::InvalidArguments(
            "\"/city\": 5 is not of type \"string\"".into(),
        )),
        DEFAULT_RESULT_LIMIT,
    );
    assert!(result.is_error);
    assert_eq!(result.call_id, "call_1");
    assert_eq!(result.name.as_deref(), Some("weather"));
    assert_eq!(
        result.text_content(),
        "error: invalid arguments: \"/city\": 5 is not of type \"string\""
    );

    let timeout = result_for_model(
        &call(),
        Err(ToolError::Timeout(Duration::from_secs(2))),
        DEFAULT_RESULT_LIMIT,
    );
    assert!(timeout.is_error);
    assert_eq!(timeout.text_content(), "error: timed out after 2s");

    let not_found = result_for_model(
        &call(),
        Err(ToolError::NotFound("weather".into())),
        DEFAULT_RESULT_LIMIT,
    );
    assert_eq!(
        not_found.text_content(),
        "error: no tool is named \"weather\""
    );
}

#[test]
fn result_for_model_caps_large_text_on_a_char_boundary() {
    let result = result_for_model(&call(), Ok(ToolOutput::text("a".repeat(100))), 10);
    assert!(!result.is_error);
    assert_eq!(
        result.content,
        vec![ToolResultPart::Text {
            text: format!("{}\n[… truncated: showed 10 of 100 bytes]", "a".repeat(10))
        }]
    );

    // "é" is two bytes: a budget of 5 shows two characters, 4 bytes.
    let result = result_for_model(&call(), Ok(ToolOutput::text("é".repeat(10))), 5);
    assert_eq!(
        result.text_content(),
        "éé\n[… truncated: showed 4 of 20 bytes]"
    );
}

#[test]
fn result_for_model_caps_large_json_as_cut_text() {
    let value = json!({"data": "x".repeat(100)});
    let serialised = value.to_string();
    assert_eq!(serialised.len(), 111);
    let result = result_for_model(&call(), Ok(ToolOutput::json(value)), 20);
    assert_eq!(
        result.content,
        vec![ToolResultPart::Text {
            text: format!(
                "{}\n[… truncated: showed 20 of 111 bytes]",
                &serialised[..20]
            )
        }]
    );
}

#[test]
fn result_for_model_leaves_small_results_untouched() {
    let content = vec![
        ToolResultPart::Text {
            text: "hello".into(),
        },
        ToolResultPart::Json {
            value: json!({"a": [1, 2, 3]}),
        },
        ToolResultPart::Image {
            source: ImageSource::Url {
                url: "https://example.com/a.png".into(),
            },
        },
    ];
    let output = ToolOutput {
        content: content.clone(),
        effect: None,
        is_error: false,
    };
    let result = result_for_model(&call(), Ok(output), DEFAULT_RESULT_LIMIT);
    assert!(!result.is_error);
    assert_eq!(result.content, content);
}

#[test]
fn result_for_model_shares_the_budget_between_parts() {
    let output = ToolOutput {
        content: vec![
            ToolResultPart::Text {
                text: "12345".into(),
            },
            ToolResultPart::Text {
                text: "67890".into(),
            },
        ],
        effect: None,
        is_error: false,
    };
    let result = result_for_model(&call(), Ok(output), 7);
    assert_eq!(
        result.content,
        vec![
            ToolResultPart::Text {
                text: "12345".into()
            },
            ToolResultPart::Text {
                text: "67\n[… truncated: showed 2 of 5 bytes]".into()
            },
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Direct calls and result formats

#[derive(Deserialize, JsonSchema)]
struct ReplyArguments {
    /// Which reply to give.
    kind: String,
}

fn reply_tool() -> FunctionTool {
    FunctionTool::new("reply", "Replies.", |args: ReplyArguments, _| async move {
        Ok(match args.kind.as_str() {
            "json_part" => ToolOutput::json(json!({"ok": true})),
            "json_text" => ToolOutput::text("  {\"n\": [1, 2]}\n"),
            "fenced" => ToolOutput::text(
                "Here is the data you asked for:\n```json\n{\"city\": \"Paris\", \"temp\": 21}\n```\nAnything else?",
            ),
            "bare_fence" => ToolOutput::text("Result:\n```\n[1, 2, 3]\n```"),
            _ => ToolOutput::text("The weather in Paris is sunny and warm today."),
        })
    })
}

async fn direct(
    registry: &ToolRegistry,
    kind: &str,
    format: ResultFormat,
) -> Result<Value, ToolError> {
    registry
        .call_direct("reply", json!({"kind": kind}), format, LONG)
        .await
}

#[tokio::test]
async fn call_direct_with_json_format_finds_the_json() {
    let mut registry = ToolRegistry::default();
    registry.register(reply_tool()).unwrap();
    let json_format = ResultFormat::Json;
    assert_eq!(
        direct(&registry, "json_part", json_format).await.unwrap(),
        json!({"ok": true})
    );
    assert_eq!(
        direct(&registry, "json_text", json_format).await.unwrap(),
        json!({"n": [1, 2]})
    );
    assert_eq!(
        direct(&registry, "fenced", json_format).await.unwrap(),
        json!({"city": "Paris", "temp": 21})
    );
    assert_eq!(
        direct(&registry, "bare_fence", json_format).await.unwrap(),
        json!([1, 2, 3])
    );

    let error = direct(&registry, "prose", json_format).await.unwrap_err();
    let ToolError::Failed(message) = error else {
        panic!("expected Failed, got {error:?}");
    };
    assert!(message.contains("not JSON"), "{message}");
    assert!(
        message.contains("The weather in Paris is sunny"),
        "{message}"
    );
}

#[tokio::test]
async fn call_direct_with_text_format_returns_a_string() {
    let mut registry = ToolRegistry::default();
    registry.register(reply_tool()).unwrap();
    assert_eq!(
        direct(&registry, "prose", ResultFormat::Text)
            .await
            .unwrap(),
        json!("The weather in Paris is sunny and warm today.")
    );
    assert_eq!(
        direct(&registry, "json_part", ResultFormat::Text)
            .await
            .unwrap(),
        json!("{\"ok\":true}")
    );
    // Validation and unknown tools fail the same way as in a run.
    assert!(matches!(
        registry
            .call_direct("reply", json!({}), ResultFormat::Text, LONG)
            .await,
        Err(ToolError::InvalidArguments(_))
    ));
    assert_eq!(
        registry
            .call_direct("nope", json!({}), ResultFormat::Text, LONG)
            .await
            .unwrap_err(),
        ToolError::NotFound("nope".into())
    );
}

#[test]
fn format_output_quotes_only_the_start_of_a_long_non_json_result() {
    let output = ToolOutput::text("word ".repeat(500));
    let Err(ToolError::Failed(message)) = format_output(&output, ResultFormat::Json) else {
        panic!("expected a failure");
    };
    assert!(message.len() < 400, "{message}");
    assert!(message.ends_with('…'), "{message}");
    assert_eq!(
        serde_json::to_value(ResultFormat::Json).unwrap(),
        json!("json")
    );
    assert_eq!(
        serde_json::from_value::<ResultFormat>(json!("text")).unwrap(),
        ResultFormat::Text
    );
}

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

#[test]
fn a_result_the_tool_flags_as_an_error_keeps_its_content_and_is_an_error() {
    let content = vec![ToolResultPart::Text {
        text: "refused: loopback".into(),
    }];
    let output = ToolOutput::parts(content.clone(), true);
    let result = result_for_model(&call(), Ok(output.clone()), DEFAULT_RESULT_LIMIT);
    assert!(result.is_error);
    assert_eq!(result.content, content);
    let direct = agentry_core::tool::result::format_output(
        &output,
        agentry_core::tool::result::ResultFormat::Text,
    );
    assert_eq!(direct, Err(ToolError::Failed("refused: loopback".into())));
}
