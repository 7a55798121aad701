//! A complete agent run, offline: the testkit's mock provider plays the model.
//!
//! `cargo run -p agentry-core --example tool_loop`
//!
//! It registers a model and a Rust function tool, runs a request, prints the live events, then
//! calls the tool directly without a model. Point `ProviderConfig` at a real provider (and give
//! it a key) to run the same code against a real model.

use agentry_core::tool::{FunctionTool, ResultFormat, ToolContext, ToolError, ToolOutput};
use agentry_core::{RunRequest, Runtime};
use agentry_llm::{HttpModelClient, Protocol, ProviderConfig};
use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
use agentry_types::RunEvent;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;

/// Arguments of the `weather` tool; its JSON Schema is derived from this type.
#[derive(Deserialize, schemars::JsonSchema)]
struct WeatherArgs {
    /// The city to report on.
    city: String,
}

async fn weather(args: WeatherArgs, _context: ToolContext) -> Result<ToolOutput, ToolError> {
    Ok(ToolOutput::json(
        json!({"city": args.city, "sky": "clear", "temp_c": 21}),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // The mock answers the first request with a tool call and the second with text.
    let mock = MockProvider::start().await?;
    mock.enqueue(Reply::scripted(ScriptedTurn::tool_call(
        "weather",
        json!({"city": "Lisbon"}),
    )));
    mock.enqueue(Reply::scripted(ScriptedTurn::text(
        "It is clear and 21 °C in Lisbon.",
    )));

    let model = HttpModelClient::new(
        ProviderConfig::new(Protocol::Anthropic, "claude-sonnet-4-5")
            .with_base_url(mock.anthropic_base_url()),
    )?;
    let mut builder = Runtime::builder();
    builder.model("claude", model);
    builder.tool(FunctionTool::new(
        "weather",
        "Current weather for a city",
        weather,
    ))?;
    let runtime = builder.build();

    let mut run = runtime.stream(RunRequest::text("What's the weather in Lisbon?"))?;
    while let Some(event) = run.next().await {
        match event {
            RunEvent::TextDelta { text } => print!("{text}"),
            RunEvent::ToolCallStarted { call } => println!("→ {}({})", call.name, call.arguments),
            RunEvent::ToolResult { result, .. } => println!("← {}", result.text_content()),
            RunEvent::RunFinished {
                stop_reason,
                usage,
                rounds,
                ..
            } => println!(
                "\n[{} · {rounds} rounds · {} tokens]",
                stop_reason.as_str(),
                usage.total_tokens()
            ),
            _ => {}
        }
    }
    let output = run.finish().await?;
    assert_eq!(output.text, "It is clear and 21 °C in Lisbon.");

    // The same tool, called directly without a model.
    let direct = runtime
        .call_tool("weather", json!({"city": "Oslo"}), ResultFormat::Json)
        .await?;
    println!("direct call: {direct}");
    mock.check_protocol()
        .map_err(|violations| anyhow::anyhow!("{violations:?}"))?;
    Ok(())
}
