//! The model, tools and guards a command runs with: flags, saved in a session's metadata so
//! `sessions resume` and `chat --session` run it again the same way.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::{Deserialize, Serialize};

use agentry_app::ToolEnvironment;
use agentry_app::domain::core::skill::Skill;
use agentry_app::domain::core::{RunLimits, Runtime};
use agentry_app::domain::llm::{
    GenerationParams, HttpModelClient, LlmError, Protocol, ProviderConfig, ThinkingConfig,
};
use agentry_app::domain::mcp::{McpManager, ServerState};
use agentry_app::domain::store::Store;
use agentry_app::domain::tools::{
    EnvSecrets, SecretResolver, ShellToolsConfig, WorkspaceToolsConfig, builtin_tools,
    load_definitions, shell_tools, workspace_tools,
};

/// The key of the profile in a session's metadata.
pub(crate) const METADATA_KEY: &str = "cli_profile";

/// Which model to call, with which tools and guards. Flags left out fall back to the profile
/// saved with a session (when continuing one), then to defaults.
#[derive(Debug, Clone, Default, PartialEq, Args, Serialize, Deserialize)]
pub(crate) struct Profile {
    /// The provider protocol: openai (and compatible servers), openai-responses, anthropic,
    /// ollama or a2a (a remote agent) [default: openai].
    #[arg(long, value_parser = parse_protocol)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    provider: Option<Protocol>,
    /// Base URL of the API (default: the provider's public endpoint; Ollama: localhost:11434).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    base_url: Option<String>,
    /// A model saved in the data folder, by id (`agentry models`) [default: the saved default
    /// model, unless --model-name says which model to call].
    #[arg(long, value_name = "ID", conflicts_with_all = ["model_name", "provider", "base_url", "api_key_env"])]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model: Option<String>,
    /// The model's name at the provider, called directly (with --provider, --base-url and
    /// --api-key-env) instead of a saved model.
    #[arg(long = "model-name")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    model_name: Option<String>,
    /// Environment variable holding the API key (default OPENAI_API_KEY / ANTHROPIC_API_KEY;
    /// none for Ollama). The key itself is never saved.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    api_key_env: Option<String>,
    /// Upper bound on generated tokens per model call.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    /// Sampling temperature.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    /// Enable extended thinking with this token budget (Anthropic; Ollama turns `think` on).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    thinking_budget: Option<u32>,
    /// A system prompt (a session keeps the one it started with).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) system: Option<String>,
    /// Offer a built-in tool to the model (repeatable), e.g. `--tool current_time`.
    #[arg(long = "tool", value_name = "NAME")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    tools: Vec<String>,
    /// Offer the tools defined in this JSON file: an array of `{"kind": "http" | "command", …}`
    /// definitions (secret headers are read from the environment variable they name; command
    /// tools run unsandboxed).
    #[arg(long, value_name = "FILE")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tools_file: Option<PathBuf>,
    /// Offer the tools of this saved MCP server (`agentry mcp add`; repeatable). The server is
    /// started for the run and stopped after it.
    #[arg(long = "mcp", value_name = "SERVER")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    mcp: Vec<String>,
    /// Offer the skill in this folder (a SKILL.md with name and description; repeatable).
    #[arg(long = "skill", value_name = "DIR")]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    skills: Vec<PathBuf>,
    /// Stop after this many tool rounds [default: 200].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max_rounds: Option<u32>,
    /// Give up after this many seconds in total [default: 600].
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    timeout_secs: Option<u64>,
    /// Where commands of a saved session run: auto (native if this host allows it), native,
    /// local (no isolation) or off [default: auto].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sandbox: Option<super::sandbox::SandboxMode>,
    /// The network of a saved session's sandbox and of `fetch`.
    #[command(flatten)]
    #[serde(default, flatten)]
    pub(crate) network: super::sandbox::NetworkArgs,
}

fn parse_protocol(value: &str) -> Result<Protocol, String> {
    value.parse().map_err(|error: LlmError| error.to_string())
}

impl Profile {
    /// These flags over a saved profile: every flag given wins.
    pub(crate) fn over(self, saved: Profile) -> Profile {
        // A model given on this command line, saved or named, replaces the saved choice.
        let (model, saved_name) = if self.model.is_some() || self.model_name.is_some() {
            (self.model, None)
        } else {
            (saved.model, saved.model_name)
        };
        Profile {
            model,
            provider: self.provider.or(saved.provider),
            base_url: self.base_url.or(saved.base_url),
            model_name: self.model_name.or(saved_name),
            api_key_env: self.api_key_env.or(saved.api_key_env),
            max_tokens: self.max_tokens.or(saved.max_tokens),
            temperature: self.temperature.or(saved.temperature),
            thinking_budget: self.thinking_budget.or(saved.thinking_budget),
            system: self.system.or(saved.system),
            tools: if self.tools.is_empty() {
                saved.tools
            } else {
                self.tools
            },
            tools_file: self.tools_file.or(saved.tools_file),
            mcp: if self.mcp.is_empty() {
                saved.mcp
            } else {
                self.mcp
            },
            skills: if self.skills.is_empty() {
                saved.skills
            } else {
                self.skills
            },
            max_rounds: self.max_rounds.or(saved.max_rounds),
            timeout_secs: self.timeout_secs.or(saved.timeout_secs),
            sandbox: self.sandbox.or(saved.sandbox),
            network: self.network.over(saved.network),
        }
    }

    /// The profile as saved with a session: paths made absolute so it works from anywhere.
    pub(crate) fn to_saved(&self) -> serde_json::Value {
        let mut saved = self.clone();
        let absolute = |path: &PathBuf| path.canonicalize().unwrap_or_else(|_| path.clone());
        saved.tools_file = saved.tools_file.as_ref().map(absolute);
        saved.skills = saved.skills.iter().map(absolute).collect();
        serde_json::to_value(saved).unwrap_or_default()
    }

    /// The profile saved in session metadata, if any.
    pub(crate) fn from_metadata(metadata: &serde_json::Value) -> Profile {
        metadata
            .get(METADATA_KEY)
            .and_then(|value| serde_json::from_value(value.clone()).ok())
            .unwrap_or_default()
    }

    /// Settles which model runs: with neither `--model` nor `--model-name`, the data folder's
    /// default saved model (its id is then kept, so a continued session keeps its model).
    pub(crate) async fn choose_model(&mut self, store: &Store) -> anyhow::Result<()> {
        if self.model.is_none() && self.model_name.is_none() {
            self.model = Some(self.saved_model(store).await?.id);
        }
        Ok(())
    }

    /// The saved model this profile names (`--model ID`), else the data folder's default one.
    async fn saved_model(
        &self,
        store: &Store,
    ) -> anyhow::Result<agentry_app::model_config::ModelConfig> {
        match &self.model {
            Some(id) => agentry_app::config::ConfigRepo::new(store)
                .get(id)
                .await
                .map_err(super::app_error)?
                .with_context(|| format!("no saved model {id:?} (`agentry models` lists them)")),
            None => agentry_app::model_config::default_model(store)
                .await
                .map_err(super::app_error)?
                .context(
                    "no model: save one (`agentry serve`, then POST /v1/models or the console's \
                     Settings → Models; `agentry models` lists them) and it is used by default, \
                     or name one with --model ID, or call one directly with --model-name NAME \
                     [--provider P]",
                ),
        }
    }

    /// Whether the runtime needs the data folder's store: saved MCP servers, or a saved model.
    pub(crate) fn uses_store(&self) -> bool {
        self.uses_mcp() || self.model_name.is_none()
    }

    /// The model's client, and its price when known.
    async fn model_client(
        &self,
        store: Option<&Store>,
    ) -> anyhow::Result<(HttpModelClient, Option<agentry_types::ModelPrice>)> {
        if self.model_name.is_some() {
            let price = self
                .model_name
                .as_deref()
                .and_then(agentry_app::usage::known_price);
            return Ok((self.client()?, price));
        }
        let store = store.context("a saved model needs the data folder's store")?;
        let model = self.saved_model(store).await?;
        let secrets = agentry_app::secrets::Secrets::load(store)
            .await
            .map_err(super::app_error)?;
        let http = agentry_app::domain::llm::http_client(Duration::from_secs(600))?;
        let client = model.client(&secrets, &http).map_err(super::app_error)?;
        Ok((client, agentry_app::usage::price_of(&model)))
    }

    fn client(&self) -> anyhow::Result<HttpModelClient> {
        let provider = self.provider.unwrap_or(Protocol::OpenAi);
        let model_name = self
            .model_name
            .as_deref()
            .context("no model: give --model ID or --model-name NAME (and --provider)")?;
        let mut config = ProviderConfig::new(provider, model_name);
        if let Some(base_url) = &self.base_url {
            config = config.with_base_url(base_url);
        }
        let key_var = self
            .api_key_env
            .as_deref()
            .or(provider.default_api_key_env());
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

    /// A run of `text` with this profile's system prompt and parameters. It is offered every
    /// tool of the profile's runtime ([`Profile::runtime`] holds exactly the tools chosen with
    /// `--tool`, `--tools-file`, `--mcp` and `--skill`).
    pub(crate) fn request(&self, text: &str) -> agentry_app::domain::core::RunRequest {
        let mut request = agentry_app::domain::core::RunRequest::text(text);
        request.system = self.system.clone();
        request.params = self.params();
        request.tools = Some(vec![agentry_app::domain::core::tool::ALL_TOOLS.to_owned()]);
        request
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

    /// The sandbox mode a session with this profile needs: none unless it offers a tool that
    /// runs commands (`exec`, `terminal`, or a tools file, which may define command tools).
    pub(crate) fn sandbox_mode(&self) -> super::sandbox::SandboxMode {
        let runs_commands = self.tools_file.is_some()
            || self.tools.iter().any(|name| {
                name == agentry_app::domain::tools::shell::EXEC
                    || name == agentry_app::domain::tools::shell::TERMINAL
            });
        if runs_commands {
            self.sandbox.unwrap_or_default()
        } else {
            super::sandbox::SandboxMode::Off
        }
    }

    /// Whether the profile offers tools of saved MCP servers (which live in the store).
    pub(crate) fn uses_mcp(&self) -> bool {
        !self.mcp.is_empty()
    }

    /// A runtime with the model registered as `default` and the chosen tools and skills; the
    /// chosen MCP servers are started from `store`'s configuration (none without a store).
    ///
    /// With `environment` (a saved session's workspace and sandbox), `--tool` may also name the
    /// file tools and, with a sandbox, `exec` and `terminal`; tools from `--tools-file` that run
    /// commands run in the sandbox.
    pub(crate) async fn runtime(
        &self,
        store: Option<&Store>,
        environment: Option<&ToolEnvironment>,
    ) -> anyhow::Result<Runtime> {
        let mut builder = Runtime::builder();
        // The tools of a terminal run are the ones its operator named on this very command
        // line (`--tool`, `--tools-file`, `--mcp`), `"host": true` included: nothing more to
        // approve by default. `agentry serve`'s runs ask for host tools (`--approve`).
        builder.approval_defaults(agentry_app::domain::core::tool::ApprovalDefaults::none());
        builder.network_check(agentry_app::domain::tools::validate_network_policy);
        let (client, price) = self.model_client(store).await?;
        // The window the provider states, unless one is configured (asked once per run of the
        // CLI, before the run; a failure keeps the known window).
        client
            .discover_context_window(agentry_app::domain::llm::window::DISCOVERY_TIMEOUT)
            .await;
        builder.model("default", client);
        // A well-known or priced model's calls are priced in the usage ledger (`agentry usage`).
        if let Some(price) = price {
            builder.model_price("default", price);
        }
        let mut available = builtin_tools();
        let sandboxes = environment.and_then(|environment| environment.sandboxes.as_ref());
        if let Some(environment) = environment.filter(|e| e.workspaces.is_some()) {
            available.extend(workspace_tools(WorkspaceToolsConfig {
                fetch: Some(environment.fetch.clone()),
                ..WorkspaceToolsConfig::default()
            }));
            if let Some(sandboxes) = sandboxes {
                available.extend(shell_tools(
                    sandboxes.clone(),
                    environment.terminals.clone(),
                    ShellToolsConfig::default(),
                ));
            }
        }
        for name in &self.tools {
            let tool = available
                .iter()
                .find(|tool| tool.spec().name == *name)
                .with_context(|| {
                    let known: Vec<String> =
                        available.iter().map(|t| t.spec().name.clone()).collect();
                    format!(
                        "no built-in tool is named {name:?} here (available: {}; the file \
                         tools need a saved session, exec and terminal also a sandbox)",
                        known.join(", ")
                    )
                })?;
            builder.tool_arc(Arc::clone(tool))?;
        }
        if let Some(path) = &self.tools_file {
            let http = agentry_app::domain::llm::http_client(Duration::from_secs(10))?;
            let secrets: Arc<dyn SecretResolver> = Arc::new(EnvSecrets);
            // The operator's own tools file, named on their own command line: its command tools
            // run in the sandbox when there is one, and on the host when they say "host": true
            // or there is no sandbox (the operator asked for them).
            for definition in load_definitions(path)? {
                builder.tool_arc(definition.build_in(
                    &http,
                    Arc::clone(&secrets),
                    sandboxes,
                    true,
                )?)?;
            }
        }
        if let Some(store) = store.filter(|_| self.uses_mcp()) {
            for tool in mcp_tools(
                store,
                &self.mcp,
                environment.and_then(|environment| environment.elicitations.as_ref()),
            )
            .await?
            {
                builder.tool_arc(tool)?;
            }
        }
        for dir in &self.skills {
            builder.skill(Skill::load(dir)?)?;
        }
        builder.limits(RunLimits {
            max_tool_rounds: self
                .max_rounds
                .unwrap_or(agentry_app::domain::core::DEFAULT_MAX_TOOL_ROUNDS),
            deadline: Some(Duration::from_secs(self.timeout_secs.unwrap_or(600))),
            ..RunLimits::default()
        });
        Ok(builder.build())
    }
}

/// How long a run waits for an MCP server to start.
pub(crate) const MCP_START_WAIT: Duration = Duration::from_secs(60);

/// Starts the saved MCP servers `names` and returns their tools. The tools hold the manager, so
/// the servers run as long as the runtime that offers them.
async fn mcp_tools(
    store: &Store,
    names: &[String],
    elicitations: Option<&agentry_app::elicitation::Elicitations>,
) -> anyhow::Result<Vec<Arc<dyn agentry_app::domain::core::tool::Tool>>> {
    let manager = start_mcp(store, names).await?;
    Ok(agentry_app::mcp_tools::tools(&manager, elicitations))
}

/// Starts the saved MCP servers `names` (none: an empty manager) and waits until each is
/// connected.
pub(crate) async fn start_mcp(store: &Store, names: &[String]) -> anyhow::Result<McpManager> {
    // `agentry run` / `chat`: the operator, on their own terminal, named these servers (saved
    // in their own data folder with `agentry mcp add` or mcp.json): they run on the host.
    let manager = McpManager::with_stdio(agentry_app::domain::mcp::StdioPolicy::host());
    if names.is_empty() {
        return Ok(manager);
    }
    let secrets = agentry_app::secrets::Secrets::load(store)
        .await
        .map_err(super::app_error)?;
    for name in names {
        agentry_app::domain::mcp::validate_server_name(name)?;
        let config =
            agentry_app::config::ConfigRepo::<agentry_app::domain::mcp::McpServerConfig>::new(
                store,
            )
            .get(name)
            .await
            .map_err(super::app_error)?
            .with_context(|| format!("no saved MCP server {name:?} (agentry mcp add)"))?;
        agentry_app::mcp_tools::add_server(&manager, &secrets, name, config)
            .await
            .map_err(super::app_error)?;
    }
    if let Err(error) = wait_connected(&manager, names).await {
        manager.shutdown().await;
        return Err(error);
    }
    Ok(manager)
}

/// Waits until each of the servers `names` of `manager` is connected; the first that is not
/// (its start failed, or it did not answer in [`MCP_START_WAIT`]) is the error.
pub(crate) async fn wait_connected(manager: &McpManager, names: &[String]) -> anyhow::Result<()> {
    for name in names {
        let status = manager.wait_ready(name, MCP_START_WAIT).await?;
        if status.state != ServerState::Connected {
            anyhow::bail!(
                "the MCP server {name:?} did not start: {}",
                status.last_error.as_deref().unwrap_or("no answer")
            );
        }
    }
    Ok(())
}
