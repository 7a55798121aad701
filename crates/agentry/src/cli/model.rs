//! Flags shared by `run` and `chat`: which model to call, which tools to offer, which guards.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use agentry_core::skill::Skill;
use agentry_core::tool::{EnvSecrets, SecretResolver, builtin, load_definitions};
use agentry_core::{RunLimits, Runtime};
use agentry_llm::{
    GenerationParams, HttpModelClient, LlmError, Protocol, ProviderConfig, ThinkingConfig,
};

/// The model to call.
#[derive(Debug, Args)]
pub(crate) struct ModelArgs {
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
    /// Upper bound on generated tokens per model call.
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Sampling temperature.
    #[arg(long)]
    temperature: Option<f32>,
    /// Enable extended thinking with this token budget (Anthropic; Ollama turns `think` on).
    #[arg(long)]
    thinking_budget: Option<u32>,
}

fn parse_protocol(value: &str) -> Result<Protocol, String> {
    value.parse().map_err(|error: LlmError| error.to_string())
}

impl ModelArgs {
    pub(crate) fn client(&self) -> anyhow::Result<HttpModelClient> {
        let mut config = ProviderConfig::new(self.provider, &self.model_name);
        if let Some(base_url) = &self.base_url {
            config = config.with_base_url(base_url);
        }
        let key_var = self
            .api_key_env
            .as_deref()
            .or(self.provider.default_api_key_env());
        if let Some(var) = key_var {
            match std::env::var(var) {
                Ok(key) if !key.trim().is_empty() => config = config.with_api_key(key.trim()),
                // A key named explicitly must exist; the default may be absent (local servers).
                _ if self.api_key_env.is_some() => {
                    anyhow::bail!("the environment variable {var} (from --api-key-env) is not set")
                }
                _ => {}
            }
        }
        HttpModelClient::new(config).context("invalid model configuration")
    }

    pub(crate) fn params(&self) -> GenerationParams {
        GenerationParams {
            max_tokens: self.max_tokens,
            temperature: self.temperature,
            thinking: self.thinking_budget.map(|budget| ThinkingConfig {
                budget_tokens: Some(budget),
                effort: None,
            }),
            ..GenerationParams::default()
        }
    }
}

/// Tools, skills and guards.
#[derive(Debug, Args)]
pub(crate) struct AgentArgs {
    /// A system prompt.
    #[arg(long)]
    pub(crate) system: Option<String>,
    /// Offer a built-in tool to the model (repeatable), e.g. `--tool current_time`.
    #[arg(long = "tool", value_name = "NAME")]
    tools: Vec<String>,
    /// Offer the tools defined in this JSON file: an array of `{"kind": "http" | "command", …}`
    /// definitions (secret headers are read from the environment variable they name; command
    /// tools run unsandboxed).
    #[arg(long, value_name = "FILE")]
    tools_file: Option<PathBuf>,
    /// Offer the skill in this folder (a SKILL.md with name and description; repeatable).
    #[arg(long = "skill", value_name = "DIR")]
    skills: Vec<PathBuf>,
    /// Stop after this many tool rounds.
    #[arg(long, default_value_t = 25)]
    max_rounds: u32,
    /// Give up after this many seconds in total.
    #[arg(long, default_value_t = 600)]
    timeout_secs: u64,
}

impl AgentArgs {
    /// A runtime with the model registered as `default` and the chosen tools and skills.
    pub(crate) fn runtime(&self, model: HttpModelClient) -> anyhow::Result<Runtime> {
        let mut builder = Runtime::builder();
        builder.model("default", model);
        for name in &self.tools {
            let tool = builtin(name).with_context(|| {
                let known: Vec<String> = builtin::builtin_tools()
                    .iter()
                    .map(|t| t.spec().name.clone())
                    .collect();
                format!(
                    "no built-in tool is named {name:?} (built-ins: {})",
                    known.join(", ")
                )
            })?;
            builder.tool_arc(Arc::clone(&tool))?;
        }
        if let Some(path) = &self.tools_file {
            let http = agentry_llm::http_client(Duration::from_secs(10))?;
            let secrets: Arc<dyn SecretResolver> = Arc::new(EnvSecrets);
            for definition in load_definitions(path)? {
                builder.tool_arc(definition.build(&http, Arc::clone(&secrets))?)?;
            }
        }
        for dir in &self.skills {
            let skill = Skill::load(dir)?;
            builder.skill(skill)?;
        }
        builder.limits(RunLimits {
            max_tool_rounds: self.max_rounds,
            deadline: Some(Duration::from_secs(self.timeout_secs)),
            ..RunLimits::default()
        });
        Ok(builder.build())
    }
}
