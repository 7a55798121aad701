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

use agentry_mcp::McpManager;
use agentry_store::Store;
use agentry_tools::{
    ShellToolsConfig, ToolDefinition, WorkspaceToolsConfig, builtin_tools, shell_tools,
    workspace_tools,
};

use crate::config::ConfigRepo;
use crate::environment::ToolEnvironment;
use crate::error::AppError;
use crate::model_config::ModelConfig;

/// A stored prompt template.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TemplateConfig {
    /// The template's name.
    #[serde(alias = "id")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9_-]{1,64}$"))]
    pub name: String,
    /// Its text, with `{{placeholders}}`.
    #[serde(alias = "content")]
    pub template: String,
}

/// The built-in tools runs get in `environment`: `current_time`, `delegate` and `talk_to`; the
/// file tools and `fetch` when sessions have workspaces (and `undo` with their file journal);
/// `exec`, `terminal` and `run_code` when they also have sandboxes.
pub fn builtins(environment: &crate::environment::ToolEnvironment) -> Vec<Arc<dyn Tool>> {
    let mut tools = builtin_tools();
    tools.extend(environment.delegation.tools());
    if environment.workspaces.is_some() {
        tools.extend(workspace_tools(WorkspaceToolsConfig {
            fetch: Some(environment.fetch.clone()),
            ..WorkspaceToolsConfig::default()
        }));
        if let Some(sandboxes) = &environment.sandboxes {
            let mut config = ShellToolsConfig::default();
            if let Some(python) = &environment.kernel_python {
                config.kernel_python.clone_from(python);
            }
            tools.extend(shell_tools(
                sandboxes.clone(),
                environment.terminals.clone(),
                config,
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
