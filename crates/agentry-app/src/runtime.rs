//! Model configurations, and assembling the runtime from what the configuration store holds.
//!
//! Models, configured tools and prompt templates live in the store; whenever one changes, the
//! server builds a new [`Runtime`] from them and hands it to the session manager (runs already
//! going keep the runtime they started with).

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use agentry_core::Runtime;
use agentry_core::session::SessionManager;
use agentry_core::tool::Tool;
use agentry_llm::{GenerationParams, HttpModelClient, Protocol, ProviderConfig};
use agentry_mcp::McpManager;
use agentry_store::Store;
use agentry_tools::{
    ShellToolsConfig, ToolDefinition, WorkspaceToolsConfig, builtin_tools, shell_tools,
    workspace_tools,
};

use crate::config::ConfigRepo;
use crate::environment::ToolEnvironment;
use crate::error::AppError;

/// A registered model. Accepts the Python service's field names (`model_id`, `api_protocol`,
/// `api_base`) as well as Agentry's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The id requests name it by.
    #[serde(alias = "model_id")]
    #[schema(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub id: String,
    /// The wire protocol.
    #[serde(alias = "api_protocol", default = "default_protocol")]
    #[schema(schema_with = crate::schema::protocol_schema)]
    pub protocol: Protocol,
    /// Base URL (default: the protocol's public endpoint).
    #[serde(alias = "api_base", default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The provider's model name.
    #[schema(pattern = "\\S")]
    pub model_name: String,
    /// The name of the secret (see `/v1/env`) holding the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret: Option<String>,
    /// Default generation parameters.
    #[serde(default, alias = "generate_params")]
    #[schema(value_type = Object)]
    pub params: GenerationParams,
    /// The model's context window in tokens (default: the window the provider states — an
    /// OpenAI-compatible `/models` listing's `max_model_len` / `context_length`, Ollama's
    /// `num_ctx` — else the model's known window, else 8192). Compaction keeps requests under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 256)]
    pub context_window: Option<u32>,
    /// Whether this is the default model, used when a request names none (default: the first
    /// model registered is).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    /// What the model can do and is for, as labels (a list, or one string separated by commas
    /// or spaces): `vision` (takes images), `audio` (takes audio), `thinking` (reasons),
    /// `summary` (writes compaction summaries and titles when nothing else is named),
    /// `read-image` (describes images for models without `vision`), `speech` (transcribes
    /// audio for models without `audio`, through `/audio/transcriptions`), or any label of
    /// your own; a request may name a model by a label.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "labels_from_list_or_text"
    )]
    #[schema(value_type = Vec<String>)]
    pub labels: Vec<String>,
    /// What the model costs, in US dollars per million tokens (`input`, `output`, and
    /// optionally `cached_input` and `cache_write`); each call's cost is recorded in the usage
    /// ledger. Default: the published price of a well-known model, by `model_name`
    /// ([`crate::usage::known_price`]); none for others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::schema::price_schema)]
    pub pricing: Option<agentry_types::ModelPrice>,
}

/// Labels as a list, or as one string separated by commas (also `，`) or white space, as the
/// seed's console sends them.
fn labels_from_list_or_text<'de, D>(deserializer: D) -> Result<Vec<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Labels {
        List(Vec<String>),
        Text(String),
    }
    let labels = match Labels::deserialize(deserializer)? {
        Labels::List(list) => list,
        Labels::Text(text) => text
            .split(|c: char| c == ',' || c == '，' || c.is_whitespace())
            .map(str::to_owned)
            .collect(),
    };
    let mut unique: Vec<String> = Vec::new();
    for label in labels {
        let label = label.trim();
        if !label.is_empty() && !unique.iter().any(|l| l == label) {
            unique.push(label.to_owned());
        }
    }
    Ok(unique)
}

fn default_protocol() -> Protocol {
    Protocol::OpenAi
}

/// A stored prompt template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    /// The template's name.
    #[serde(alias = "id")]
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    /// Its text, with `{{placeholders}}`.
    #[serde(alias = "content")]
    pub template: String,
}

impl ModelConfig {
    /// The client for this model, its key resolved from `secrets` (refused when the key is
    /// bound to other hosts than the model's URL).
    pub fn client(
        &self,
        secrets: &crate::secrets::Secrets,
        http: &reqwest::Client,
    ) -> Result<HttpModelClient, AppError> {
        let mut config = ProviderConfig::new(self.protocol, &self.model_name);
        if let Some(base_url) = &self.base_url {
            config = config.with_base_url(base_url);
        }
        if let Some(name) = &self.api_key_secret {
            let to = crate::secrets::SecretUse::of_url(&config.base_url)?;
            let user = format!("model {:?}", self.id);
            let key = secrets.value_for(name, &user, &to)?.ok_or_else(|| {
                AppError::bad_request(format!(
                    "model {:?} uses the secret {name:?}, which is not set (POST /v1/env)",
                    self.id
                ))
            })?;
            config = config.with_api_key(key);
        }
        if let Some(tokens) = self.context_window {
            config = config.with_context_window(u64::from(tokens));
        }
        HttpModelClient::with_http_client(config, http.clone())
            .map_err(|error| AppError::bad_request(format!("model {:?}: {error}", self.id)))
    }
}

/// The saved model a run that names none uses: the one marked default, else the first
/// registered; `None` when there is none.
pub async fn default_model(store: &Store) -> Result<Option<ModelConfig>, AppError> {
    let models = ConfigRepo::<ModelConfig>::new(store)
        .list_registered()
        .await?;
    Ok(models
        .iter()
        .find(|(_, model)| model.default)
        .or(models.first())
        .map(|(_, model)| model.clone()))
}

/// The built-in tools runs get in `environment`: `current_time`, `delegate` and `talk_to`; the
/// file tools and `fetch` when sessions have workspaces (and `undo` with their file journal);
/// `exec` and `terminal` when they also have sandboxes.
pub fn builtins(environment: &crate::environment::ToolEnvironment) -> Vec<Arc<dyn Tool>> {
    let mut tools = builtin_tools();
    tools.extend(environment.delegation.tools());
    if environment.workspaces.is_some() {
        tools.extend(workspace_tools(WorkspaceToolsConfig {
            fetch: Some(environment.fetch.clone()),
            ..WorkspaceToolsConfig::default()
        }));
        if let Some(sandboxes) = &environment.sandboxes {
            tools.extend(shell_tools(
                sandboxes.clone(),
                environment.terminals.clone(),
                ShellToolsConfig::default(),
            ));
        }
        if let Some(journal) = &environment.file_journal {
            tools.push(agentry_tools::undo_tool(Arc::clone(journal)));
        }
    }
    tools
}

/// Builds the runtime from the store: every model, the built-in tools (with the file tools when
/// sessions have workspaces, and `exec` and `terminal` when they also have sandboxes), the
/// configured tools (command tools in the sandbox), the tools of every connected MCP server,
/// the skills of every saved agent, every template. Invalid stored entries are skipped with a
/// warning, so one bad entry cannot take the server down.
///
/// The default model is the one marked `default` (the first registered of them, should several
/// be), else the first registered. Each model's context window is asked of its provider here
/// (once per model in the process, see [`agentry_llm::window`]), all at once and within
/// [`agentry_llm::window::DISCOVERY_TIMEOUT`], never on a run's path.
pub async fn build_runtime(
    store: &Store,
    http: &reqwest::Client,
    mcp: &McpManager,
    environment: &crate::environment::ToolEnvironment,
) -> Result<Runtime, AppError> {
    let secrets = crate::secrets::Secrets::load(store).await?;
    let mut builder = Runtime::builder();
    builder.approval_defaults(environment.approval_defaults.clone());
    builder.network_check(agentry_tools::validate_network_policy);
    let mut models = Vec::new();
    // In the order they were registered: the first is the default unless one is marked.
    for (name, model) in ConfigRepo::<ModelConfig>::new(store)
        .list_registered()
        .await?
    {
        match model.client(&secrets, http) {
            Ok(client) => {
                if let Some(price) = crate::usage::price_of(&model) {
                    builder.model_price(name.clone(), price);
                }
                models.push((name, model.default, model.labels, client));
            }
            Err(error) => tracing::warn!(model = %name, "skipping a model: {}", error.message),
        }
    }
    futures::future::join_all(models.iter().map(|(_, _, _, client)| {
        client.discover_context_window(agentry_llm::window::DISCOVERY_TIMEOUT)
    }))
    .await;
    let mut marked_default: Option<String> = None;
    let mut summary_model = None;
    for (name, marked, labels, client) in models {
        if summary_model.is_none() && labels.iter().any(|l| l == agentry_core::media::SUMMARY) {
            summary_model = Some(name.clone());
        }
        builder.model_labels(name.clone(), labels);
        if marked {
            match &marked_default {
                None => marked_default = Some(name.clone()),
                Some(first) => tracing::warn!(
                    model = %name,
                    "several models are marked default; {first:?} (registered first) is"
                ),
            }
        }
        builder.model(name, client);
    }
    builder.budget_gate_opt(crate::usage::StoreBudgets::gate(
        store,
        ConfigRepo::<crate::usage::BudgetConfig>::new(store)
            .list()
            .await?
            .into_iter()
            .map(|(_, budget)| budget)
            .collect(),
    ));
    if let Some(name) = marked_default {
        builder.default_model(name);
    }
    // A model labelled `summary` writes compaction summaries unless a run names another.
    if let Some(model) = summary_model {
        builder.compaction(agentry_core::context::CompactionSettings {
            summary_model: Some(model),
            ..Default::default()
        });
    }
    builder.media_cache(Arc::clone(&environment.media_cache));
    for tool in builtins(environment) {
        builder.tool_arc(tool)?;
    }
    // Command tools run in the session's sandbox when there is one; on the host only when the
    // operator allows host commands (otherwise they are refused and skipped here).
    let sandboxes = environment.command_sandboxes();
    for (name, definition) in ConfigRepo::<ToolDefinition>::new(store).list().await? {
        let resolver = match secrets.for_tool(&definition) {
            Ok(resolver) => resolver,
            Err(error) => {
                tracing::warn!(tool = %name, "skipping a tool: {}", error.message);
                continue;
            }
        };
        let built = definition.build_in(
            http,
            Arc::new(resolver),
            sandboxes,
            environment.allow_host_commands,
        );
        match built {
            Ok(tool) => {
                if let Err(error) = builder.tool_arc(tool) {
                    tracing::warn!(tool = %name, "skipping a tool: {error}");
                }
            }
            Err(error) => tracing::warn!(tool = %name, "skipping a tool: {error}"),
        }
    }
    for tool in crate::mcp_tools::tools(mcp, environment.elicitations.as_ref()) {
        let name = tool.spec().name.clone();
        if let Err(error) = builder.tool_arc(tool) {
            tracing::warn!(tool = %name, "skipping an MCP tool: {error}");
        }
    }
    // The registered skills, then those of every saved agent (each folder once; a name taken by
    // another tool is skipped, and running the agent then says so).
    let mut skill_dirs = std::collections::BTreeSet::new();
    let mut skill_names = std::collections::BTreeMap::new();
    for (name, registered) in ConfigRepo::<crate::skills::SkillConfig>::new(store)
        .list()
        .await?
    {
        match crate::agents::load_skill(&registered.path, environment.skill_roots.as_deref()) {
            Ok(skill) => {
                let (skill_name, dir) = (skill.name().to_owned(), skill.dir().to_owned());
                match builder.skill(skill) {
                    Ok(_) => {
                        skill_names.insert(dir, skill_name);
                    }
                    Err(error) => tracing::warn!(skill = %name, "skipping a skill: {error}"),
                }
            }
            Err(error) => tracing::warn!(skill = %name, "skipping a skill: {}", error.message),
        }
    }
    for (name, agent) in ConfigRepo::<crate::agents::AgentConfig>::new(store)
        .list()
        .await?
    {
        for path in agent.skills {
            if !skill_dirs.insert(path.clone()) {
                continue;
            }
            match crate::agents::load_skill(&path, environment.skill_roots.as_deref()) {
                Ok(skill) => {
                    let skill_name = skill.name().to_owned();
                    if skill_names.get(skill.dir()) == Some(&skill_name) {
                        // Registered on its own already.
                    } else if builder.tools_contain(&skill_name) {
                        tracing::warn!(agent = %name, skill = %path, "skipping a skill: a tool is already named {skill_name:?}");
                    } else if let Err(error) = builder.skill(skill) {
                        tracing::warn!(agent = %name, skill = %path, "skipping a skill: {error}");
                    }
                }
                Err(error) => {
                    tracing::warn!(agent = %name, skill = %path, "skipping a skill: {}", error.message)
                }
            }
        }
    }
    for (name, template) in ConfigRepo::<TemplateConfig>::new(store).list().await? {
        if let Err(error) = builder.template(&template.name, &template.template) {
            tracing::warn!(template = %name, "skipping a template: {error}");
        }
    }
    Ok(builder.build())
}

impl crate::config::ConfigDoc for ModelConfig {
    const KIND: agentry_store::ConfigKind = agentry_store::ConfigKind::Model;
    const NOUN: &'static str = "model";
}

impl crate::config::ConfigDoc for TemplateConfig {
    const KIND: agentry_store::ConfigKind = agentry_store::ConfigKind::Template;
    const NOUN: &'static str = "template";
}

/// How long a rebuild waits for more tool changes before it runs (a server's start brings several).
const REBUILD_DEBOUNCE: Duration = Duration::from_millis(50);

/// Rebuilds the runtime whenever the MCP servers' tools change, until the manager is dropped.
pub(crate) fn rebuild_on_changes(
    manager: &McpManager,
    store: Store,
    http: reqwest::Client,
    tools: ToolEnvironment,
    sessions: SessionManager,
) {
    let mut changes = manager.subscribe();
    let weak = manager.downgrade();
    tokio::spawn(async move {
        while changes.changed().await.is_ok() {
            tokio::time::sleep(REBUILD_DEBOUNCE).await;
            changes.mark_unchanged();
            let Some(manager) = weak.upgrade() else {
                break;
            };
            match build_runtime(&store, &http, &manager, &tools).await {
                Ok(runtime) => sessions.set_runtime(runtime),
                Err(error) => tracing::warn!(
                    "could not rebuild the runtime after an MCP change: {}",
                    error.message
                ),
            }
        }
    });
}
