//! `agentry run`: one prompt, one model call, the answer streamed to the terminal.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use futures::StreamExt;

use agentry_llm::{
    CancellationToken, GenerationParams, HttpModelClient, LlmError, ModelClient, ModelRequest,
    Protocol, ProviderConfig, ThinkingConfig,
};
use agentry_types::{Message, ModelEvent, ModelResponse};

/// Exit code when the model call fails.
const EXIT_CALL_FAILED: u8 = 1;
/// Exit code when the user interrupts with Ctrl-C (128 + SIGINT).
const EXIT_INTERRUPTED: u8 = 130;

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// The prompt.
    prompt: String,
    /// The provider protocol: openai (and compatible servers), anthropic or ollama.
    #[arg(long, default_value = "openai", value_parser = parse_protocol)]
    provider: Protocol,
    /// Base URL of the API (default: the provider's public endpoint; Ollama: localhost:11434).
    #[arg(long)]
    base_url: Option<String>,
    /// The model's name at the provider.
    #[arg(long = "model-name", alias = "model")]
    model_name: String,
    /// Environment variable holding the API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY;
    /// none for Ollama).
    #[arg(long)]
    api_key_env: Option<String>,
    /// A system prompt.
    #[arg(long)]
    system: Option<String>,
    /// Upper bound on generated tokens.
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Sampling temperature.
    #[arg(long)]
    temperature: Option<f32>,
    /// Enable extended thinking with this token budget (Anthropic; Ollama turns `think` on).
    #[arg(long)]
    thinking_budget: Option<u32>,
    /// Print one JSON object per line for every event instead of text.
    #[arg(long)]
    json: bool,
    /// Give up after this many seconds in total.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

fn parse_protocol(value: &str) -> Result<Protocol, String> {
    value.parse().map_err(|error: LlmError| error.to_string())
}

pub(crate) async fn run(args: RunArgs) -> anyhow::Result<ExitCode> {
    let client = build_client(&args)?;
    let request = build_request(&args);
    let cancel = CancellationToken::new();
    let on_interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_interrupt.cancel();
        }
    });
    let mut printer = Printer::new(args.json);
    let mut stream = client.stream(request, cancel);
    while let Some(event) = stream.next().await {
        match event {
            Ok(event) => printer.event(&event)?,
            Err(error) => {
                printer.error(&error)?;
                let code = if matches!(error, LlmError::Cancelled) {
                    EXIT_INTERRUPTED
                } else {
                    EXIT_CALL_FAILED
                };
                return Ok(ExitCode::from(code));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn build_client(args: &RunArgs) -> anyhow::Result<HttpModelClient> {
    let mut config = ProviderConfig::new(args.provider, &args.model_name);
    if let Some(base_url) = &args.base_url {
        config = config.with_base_url(base_url);
    }
    let key_var = args
        .api_key_env
        .as_deref()
        .or(args.provider.default_api_key_env());
    if let Some(var) = key_var {
        match std::env::var(var) {
            Ok(key) if !key.trim().is_empty() => config = config.with_api_key(key.trim()),
            // A key named explicitly must exist; the default one may be absent for local servers.
            _ if args.api_key_env.is_some() => {
                anyhow::bail!("the environment variable {var} (from --api-key-env) is not set")
            }
            _ => {}
        }
    }
    config.transport.total_timeout = Some(Duration::from_secs(args.timeout_secs));
    HttpModelClient::new(config).context("invalid model configuration")
}

fn build_request(args: &RunArgs) -> ModelRequest {
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(Message::system(system));
    }
    messages.push(Message::user(&args.prompt));
    ModelRequest::new(messages).with_params(GenerationParams {
        max_tokens: args.max_tokens,
        temperature: args.temperature,
        thinking: args.thinking_budget.map(|budget| ThinkingConfig {
            budget_tokens: Some(budget),
            effort: None,
        }),
        ..GenerationParams::default()
    })
}

/// Writes events as text (thinking dimmed on a terminal) or as JSON lines.
struct Printer {
    json: bool,
    styled: bool,
    in_thinking: bool,
    at_line_start: bool,
    out: std::io::Stdout,
}

const DIM: &str = "\x1b[2m";
const RESET: &str = "\x1b[0m";

impl Printer {
    fn new(json: bool) -> Self {
        let out = std::io::stdout();
        Self {
            json,
            // Dim thinking only on a terminal, and never when NO_COLOR is set (no-color.org).
            styled: out.is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
            in_thinking: false,
            at_line_start: true,
            out,
        }
    }

    fn event(&mut self, event: &ModelEvent) -> anyhow::Result<()> {
        if self.json {
            let mut out = self.out.lock();
            serde_json::to_writer(&mut out, event)?;
            out.write_all(b"\n")?;
            return Ok(out.flush()?);
        }
        match event {
            ModelEvent::ThinkingDelta { text } => {
                if !self.in_thinking {
                    self.in_thinking = true;
                    if self.styled {
                        self.write(DIM)?;
                    }
                }
                self.write(text)?;
            }
            ModelEvent::TextDelta { text } => {
                self.end_thinking()?;
                self.write(text)?;
            }
            ModelEvent::ToolCall { call, .. } => {
                self.end_thinking()?;
                self.line_break()?;
                self.write(&format!("→ {}({})\n", call.name, call.arguments))?;
            }
            ModelEvent::ToolCallDelta { .. } => {}
            ModelEvent::Completed { response } => {
                self.end_thinking()?;
                self.line_break()?;
                eprintln!("{}", usage_line(response));
            }
        }
        Ok(self.out.flush()?)
    }

    fn error(&mut self, error: &LlmError) -> anyhow::Result<()> {
        if self.json {
            let line = serde_json::json!({"type": "error", "error": error.info()});
            println!("{line}");
        } else {
            self.end_thinking()?;
            self.line_break()?;
        }
        eprintln!("agentry: {}: {error}", error.code());
        Ok(())
    }

    fn end_thinking(&mut self) -> std::io::Result<()> {
        if self.in_thinking {
            self.in_thinking = false;
            if self.styled {
                self.write(RESET)?;
            }
            self.line_break()?;
            self.write("\n")?;
        }
        Ok(())
    }

    fn line_break(&mut self) -> std::io::Result<()> {
        if !self.at_line_start {
            self.write("\n")?;
        }
        Ok(())
    }

    fn write(&mut self, text: &str) -> std::io::Result<()> {
        if let Some(last) = text.chars().last() {
            self.at_line_start = last == '\n';
        }
        self.out.write_all(text.as_bytes())
    }
}

fn usage_line(response: &ModelResponse) -> String {
    let usage = &response.usage;
    let mut line = format!(
        "[{} · {} in",
        response.model.as_deref().unwrap_or("model"),
        usage.input_tokens
    );
    if usage.cached_input_tokens > 0 {
        line.push_str(&format!(" ({} cached)", usage.cached_input_tokens));
    }
    line.push_str(&format!(" · {} out", usage.output_tokens));
    if usage.reasoning_tokens > 0 {
        line.push_str(&format!(" ({} reasoning)", usage.reasoning_tokens));
    }
    line.push_str(&format!(
        " · stop: {}]",
        serde_json::to_value(&response.stop_reason)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_else(|| format!("{:?}", response.stop_reason))
    ));
    line
}
