//! The tool registry, result shaping, and function tools (the built-in tools are tested in
//! agentry-tools).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agentry_core::tool::{
    DEFAULT_RESULT_LIMIT, FunctionTool, ResultFormat, Tool, ToolContext, ToolError, ToolOutput,
    ToolRegistry, format_output, result_for_model,
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
