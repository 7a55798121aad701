//! Agents: a saved model (with fallbacks), tools, skills, MCP servers, system prompt or
//! template, nickname, labels and limits, used by name in `POST /v1/infer` (`agent_id` or
//! `agent_ids`) and by `agentry run --agent`.
//!
//! An agent is checked against the runtime when it is saved, and resolved against the runtime
//! of the moment when it runs ([`AgentConfig::resolve`]): a model, tool or template removed
//! since is a clear 400 then. Skills are folders on the server's disk; the runtime registers the
//! skills of every saved agent ((`runtime::build_runtime`)).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentry_core::skill::Skill;
use agentry_core::{RunLimits, RunRequest, Runtime};
use agentry_llm::GenerationParams;
use agentry_store::{ConfigKind, Store};

use crate::config::check_name;
use crate::error::AppError;

/// A saved agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// The id requests name it by.
    #[serde(alias = "agent_id")]
    pub id: String,
    /// A display name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nickname: Option<String>,
    /// What it is for, in a sentence or two (shown to people and to other agents choosing it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// An image for it (a URL or a `data:` URL), for the console and the seed's clients.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub avatar: Option<String>,
    /// How it introduces itself to the other members of a group (the seed's `myself_view`):
    /// kept and returned as given; Agentry's runs do not read it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub myself_view: Option<String>,
    /// The model it runs on.
    pub model_id: String,
    /// The tools it may use (none if empty; `["*"]`: every registered tool).
    #[serde(default)]
    pub tool_ids: Vec<String>,
    /// Its system prompt.
    #[serde(
        default,
        alias = "system_prompt",
        skip_serializing_if = "Option::is_none"
    )]
    pub system: Option<String>,
    /// Labels for finding it.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Tool rounds allowed per run (the older spelling of `limits.max_tool_rounds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_rounds: Option<u32>,
    /// Generation parameters.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: GenerationParams,
    /// Models tried in order when a call to `model_id` fails with a provider or transient error
    /// before any output.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_model_ids: Vec<String>,
    /// Skill folders on the server (each with a `SKILL.md`); the agent is offered each skill.
    /// Each must be inside the server's skill folders (`<data folder>/skills`, or a
    /// `--skill-root`), symlinks resolved.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skills: Vec<String>,
    /// Configured MCP servers whose tools (`<server>__<tool>`) the agent is offered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp_servers: Vec<String>,
    /// A saved prompt template rendered as the system prompt (instead of `system`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_template: Option<String>,
    /// Values for the template's placeholders.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub template_arguments: serde_json::Map<String, Value>,
    /// Per-run limits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<AgentLimits>,
    /// Which tool calls wait for a person's approval before they run (a request's own
    /// `approvals` override it per tool). Runs that may wait need a session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<crate::schema::ApprovalPolicyDoc>))]
    pub approvals: Option<agentry_core::approval::ApprovalPolicy>,
    /// How its runs compact their context (`threshold`, `keep_recent`, `summary_model`,
    /// `summary_tokens`, `enabled`; default: the server's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub compaction: Option<agentry_core::context::CompactionSettings>,
    /// Narrows the `fetch` tool's network policy for its runs (never widens the server's):
    /// `"off"`, or `{"allow": ["docs.rs", "*.python.org"]}` (a host must be on this list and
    /// allowed by the server), or `"public"` (public addresses only). Default: the server's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub network: Option<agentry_core::network::NetworkPolicy>,
    /// The vision model that describes images for it when its model is not labelled
    /// `vision` (default: the model labelled `read-image`, if any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vision_model_id: Option<String>,
    /// The speech model that transcribes audio for it when its model is not labelled `audio`
    /// (default: the model labelled `speech`, if any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speech_model_id: Option<String>,
    /// Where its background runs report their end when the run names no `webhook_url` of its
    /// own: signed and delivered like any run's webhook, under the same rules (http or https,
    /// no loopback or private address unless the server allows them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
    /// Whose workspace its runs work in: `"session"` (default: each session its own folder)
    /// or `"agent"` (one folder for all its sessions and its stateless runs, so what one
    /// conversation writes the next one finds; the file routes reach it by `agent_id`).
    #[serde(default, skip_serializing_if = "WorkspaceScope::is_session")]
    pub workspace: WorkspaceScope,
    /// Publishes the agent over A2A (the Agent2Agent protocol) when present: its agent card at
    /// `/a2a/{id}/.well-known/agent-card.json`, its JSON-RPC endpoint at `/a2a/{id}`. Absent
    /// (the default): not reachable over A2A.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub a2a: Option<crate::publication::A2aPublication>,
}

/// Whose workspace an agent's runs work in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum WorkspaceScope {
    /// Each session its own.
    #[default]
    Session,
    /// One for the agent, shared by its sessions and stateless runs.
    Agent,
}

impl WorkspaceScope {
    /// Whether it is the default, each session its own.
    pub fn is_session(&self) -> bool {
        *self == Self::Session
    }
}

/// The limits of an agent's runs. A run that reaches one stops with a clear stop reason:
/// `max_rounds`, `quota_exceeded` (tokens or tool calls, the note says which) or `deadline`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct AgentLimits {
    /// Tool rounds allowed per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(maximum = 10000))]
    pub max_tool_rounds: Option<u32>,
    /// Output tokens the whole run may generate (every model call together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_tokens: Option<u64>,
    /// Tool calls the whole run may make.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1))]
    pub max_tool_calls: Option<u32>,
    /// The run's wall-clock deadline, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 86400))]
    pub wall_time_secs: Option<u64>,
    /// Background runs of this agent running at once, across every worker; more wait in the
    /// queue, in priority order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 10000))]
    pub max_concurrent_runs: Option<u32>,
}

/// What running as an agent means for one run, resolved against a runtime.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentRun {
    /// The agent's id.
    pub agent_id: String,
    /// The model.
    pub model: String,
    /// Its fallbacks, in order.
    pub fallback_models: Vec<String>,
    /// Every tool offered: the agent's tools, skills and MCP servers' tools.
    pub tools: Vec<String>,
    /// The system prompt (the rendered template, if the agent has one).
    pub system: Option<String>,
    /// The guards.
    pub limits: RunLimits,
    /// Generation parameters.
    pub params: GenerationParams,
    /// Which tool calls wait for approval.
    pub approvals: Option<agentry_core::approval::ApprovalPolicy>,
    /// How its runs compact their context.
    pub compaction: Option<agentry_core::context::CompactionSettings>,
    /// Its narrowing of the `fetch` tool's network policy (none: the server's policy).
    pub network: Vec<agentry_core::network::NetworkPolicy>,
    /// The vision model that describes images for it.
    pub vision_model: Option<String>,
    /// The speech model that transcribes audio for it.
    pub speech_model: Option<String>,
}

impl AgentRun {
    /// The run request of a run as this agent, for `user` (when one is named): its model and
    /// fallbacks, tools, system prompt, limits, parameters, approvals, compaction and network,
    /// with its id as the run's agent. The one place a saved agent becomes a run request: the
    /// HTTP API, group chats, delegation and the CLI all start here, then add their input and
    /// [`crate::memory::remember`] the agent's memories.
    pub fn request(&self, user: Option<String>) -> RunRequest {
        RunRequest {
            model: Some(self.model.clone()),
            fallback_models: self.fallback_models.clone(),
            system: self.system.clone(),
            tools: Some(self.tools.clone()),
            params: self.params.clone(),
            limits: Some(self.limits.clone()),
            approvals: self.approvals.clone(),
            agent_id: Some(self.agent_id.clone()),
            compaction: self.compaction.clone(),
            network: self.network.clone(),
            vision_model: self.vision_model.clone(),
            speech_model: self.speech_model.clone(),
            user,
            ..RunRequest::default()
        }
    }
}

/// Most fallback models, skills and MCP servers one agent may name.
const MAX_LIST: usize = 32;

/// The longest wall time an agent may set: a day.
const MAX_WALL_TIME_SECS: u64 = 24 * 3600;

impl AgentConfig {
    /// Every model it names: its own, its fallbacks, its vision and speech models.
    pub fn models(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.model_id)
            .chain(&self.fallback_model_ids)
            .chain(&self.vision_model_id)
            .chain(&self.speech_model_id)
    }

    /// The tool-round limit, from `limits` or the older top-level field.
    pub fn tool_round_limit(&self) -> Option<u32> {
        self.limits
            .as_ref()
            .and_then(|limits| limits.max_tool_rounds)
            .or(self.max_tool_rounds)
    }

    /// The guards of the agent's runs, over `base`.
    pub fn run_limits(&self, base: RunLimits) -> RunLimits {
        let limits = self.limits.clone().unwrap_or_default();
        RunLimits {
            max_tool_rounds: self.tool_round_limit().unwrap_or(base.max_tool_rounds),
            max_output_tokens: limits.max_tokens.or(base.max_output_tokens),
            max_tool_calls: limits.max_tool_calls.or(base.max_tool_calls),
            deadline: limits
                .wall_time_secs
                .map(Duration::from_secs)
                .or(base.deadline),
            ..base
        }
    }

    /// Checks the fields that need no runtime.
    pub fn check_shape(&self) -> Result<(), AppError> {
        check_name("agent", &self.id)?;
        if let Some(publication) = &self.a2a {
            publication.check()?;
        }
        if let Some(url) = &self.webhook_url {
            // Where it may point is the server's to say, at saving and at each submission.
            crate::standard_webhooks::check_webhook_url(url, true)?;
        }
        if self
            .nickname
            .as_ref()
            .is_some_and(|n| n.chars().count() > 64 || n.trim().is_empty())
        {
            return Err(AppError::bad_request("a nickname has 1 to 64 characters"));
        }
        if self.labels.len() > 32
            || self
                .labels
                .iter()
                .any(|l| l.is_empty() || l.chars().count() > 64)
        {
            return Err(AppError::bad_request(
                "at most 32 labels, each of 1 to 64 characters",
            ));
        }
        for (field, list) in [
            ("fallback_model_ids", &self.fallback_model_ids),
            ("skills", &self.skills),
            ("mcp_servers", &self.mcp_servers),
        ] {
            if list.len() > MAX_LIST {
                return Err(AppError::bad_request(format!(
                    "`{field}` names at most {MAX_LIST} entries"
                )));
            }
            if let Some(duplicate) = list
                .iter()
                .enumerate()
                .find_map(|(i, item)| list[..i].contains(item).then_some(item))
            {
                return Err(AppError::bad_request(format!(
                    "`{field}` names {duplicate:?} twice"
                )));
            }
        }
        if self.fallback_model_ids.contains(&self.model_id) {
            return Err(AppError::bad_request(format!(
                "the model {:?} cannot be its own fallback",
                self.model_id
            )));
        }
        for server in &self.mcp_servers {
            agentry_mcp::validate_server_name(server)
                .map_err(|error| AppError::bad_request(format!("`mcp_servers`: {error}")))?;
        }
        if self.system.is_some() && self.prompt_template.is_some() {
            return Err(AppError::bad_request(
                "give `system` or `prompt_template`, not both",
            ));
        }
        if self.prompt_template.is_none() && !self.template_arguments.is_empty() {
            return Err(AppError::bad_request(
                "`template_arguments` needs a `prompt_template`",
            ));
        }
        if let Some(approvals) = &self.approvals {
            approvals
                .validate()
                .map_err(|error| AppError::bad_request(format!("`approvals`: {error}")))?;
        }
        if let Some(network) = &self.network {
            agentry_tools::validate_network_policy(network)
                .map_err(|error| AppError::bad_request(format!("`network`: {error}")))?;
        }
        if let Some(limits) = &self.limits {
            if let (Some(old), Some(new)) = (self.max_tool_rounds, limits.max_tool_rounds)
                && old != new
            {
                return Err(AppError::bad_request(
                    "`max_tool_rounds` and `limits.max_tool_rounds` disagree: give one",
                ));
            }
            if limits.max_tool_rounds.is_some_and(|rounds| rounds > 10_000) {
                return Err(AppError::bad_request(
                    "`limits.max_tool_rounds` is at most 10000",
                ));
            }
            if limits.max_tokens == Some(0) {
                return Err(AppError::bad_request(
                    "`limits.max_tokens` must be at least 1",
                ));
            }
            if limits.max_tool_calls == Some(0) {
                return Err(AppError::bad_request(
                    "`limits.max_tool_calls` must be at least 1",
                ));
            }
            if limits
                .wall_time_secs
                .is_some_and(|secs| secs == 0 || secs > MAX_WALL_TIME_SECS)
            {
                return Err(AppError::bad_request(format!(
                    "`limits.wall_time_secs` is 1 to {MAX_WALL_TIME_SECS}"
                )));
            }
            if limits
                .max_concurrent_runs
                .is_some_and(|runs| runs == 0 || runs > 10_000)
            {
                return Err(AppError::bad_request(
                    "`limits.max_concurrent_runs` is 1 to 10000",
                ));
            }
        }
        Ok(())
    }

    /// Resolves the agent for one run against `runtime`: every model, tool, skill, MCP server
    /// and template it names must be there, and its skills inside `skill_roots` (when set).
    pub fn resolve(
        &self,
        runtime: &Runtime,
        skill_roots: Option<&[PathBuf]>,
    ) -> Result<AgentRun, AppError> {
        for model in self.models() {
            if runtime.model_client(model).is_err() {
                return Err(AppError::bad_request(format!(
                    "agent {:?} uses the model {model:?}, which is not registered \
                     (POST /v1/models)",
                    self.id
                )));
            }
        }
        let mut tools = Vec::new();
        let mut offer = |name: String| {
            if !tools.contains(&name) {
                tools.push(name);
            }
        };
        for tool in &self.tool_ids {
            if tool != agentry_core::tool::ALL_TOOLS && !runtime.tools().contains(tool) {
                return Err(AppError::bad_request(format!(
                    "agent {:?} uses the tool {tool:?}, which does not exist",
                    self.id
                )));
            }
            offer(tool.clone());
        }
        for path in &self.skills {
            let skill = load_skill(path, skill_roots)?;
            if !runtime.tools().contains(skill.name()) {
                return Err(AppError::bad_request(format!(
                    "agent {:?} uses the skill {:?} ({path}), which the runtime did not \
                     register (another tool has its name?)",
                    self.id,
                    skill.name()
                )));
            }
            offer(skill.name().to_owned());
        }
        let names = runtime.tools().names();
        for server in &self.mcp_servers {
            let prefix = format!("{server}__");
            let offered: Vec<&String> = names
                .iter()
                .filter(|name| name.starts_with(&prefix))
                .collect();
            if offered.is_empty() {
                return Err(AppError::bad_request(format!(
                    "agent {:?} uses the MCP server {server:?}, which offers no tools now (is \
                     it configured and connected? GET /v1/mcp-servers)",
                    self.id
                )));
            }
            for name in offered {
                offer(name.clone());
            }
        }
        let system = match &self.prompt_template {
            Some(template) => Some(
                runtime
                    .templates()
                    .render(template, &self.template_arguments)
                    .map_err(|error| {
                        AppError::bad_request(format!(
                            "agent {:?}: its prompt template: {error}",
                            self.id
                        ))
                    })?,
            ),
            None => self.system.clone(),
        };
        Ok(AgentRun {
            agent_id: self.id.clone(),
            model: self.model_id.clone(),
            fallback_models: self.fallback_model_ids.clone(),
            tools,
            system,
            limits: self.run_limits(RunLimits::default()),
            params: self.params.clone(),
            approvals: self.approvals.clone(),
            compaction: self.compaction.clone(),
            network: self.network.iter().cloned().collect(),
            vision_model: self.vision_model_id.clone(),
            speech_model: self.speech_model_id.clone(),
        })
    }
}

/// Loads a skill folder named by an agent, with a clear 400: with `skill_roots`, only a folder
/// inside one of them (canonicalised, so no symlink or `..` leads out).
pub fn load_skill(path: &str, skill_roots: Option<&[PathBuf]>) -> Result<Skill, AppError> {
    if path.trim().is_empty() {
        return Err(AppError::bad_request("a skill path is empty"));
    }
    let loaded = match skill_roots {
        Some(roots) => Skill::load_within(Path::new(path), roots),
        None => Skill::load(Path::new(path)),
    };
    loaded.map_err(|error| AppError::bad_request(format!("skill {path:?}: {error}")))
}

/// Checks an agent against the store and the runtime: its models, tools and template must
/// exist, its skills load (from inside `skill_roots`, when set), its MCP servers be configured.
pub async fn validate(
    store: &Store,
    runtime: &Runtime,
    agent: &AgentConfig,
    skill_roots: Option<&[PathBuf]>,
) -> Result<(), AppError> {
    agent.check_shape()?;
    if let Some(compaction) = &agent.compaction {
        compaction
            .validate()
            .map_err(|error| AppError::bad_request(format!("`compaction`: {error}")))?;
        if let Some(model) = &compaction.summary_model
            && runtime.model_client(model).is_err()
        {
            return Err(AppError::bad_request(format!(
                "agent {:?} summarises with the model {model:?}, which is not registered",
                agent.id
            )));
        }
    }
    for model in agent.models() {
        if runtime.model_client(model).is_err() {
            return Err(AppError::bad_request(format!(
                "agent {:?} uses the model {model:?}, which is not registered (POST /v1/models)",
                agent.id
            )));
        }
    }
    for tool in &agent.tool_ids {
        if tool != agentry_core::tool::ALL_TOOLS && !runtime.tools().contains(tool) {
            return Err(AppError::bad_request(format!(
                "agent {:?} uses the tool {tool:?}, which does not exist",
                agent.id
            )));
        }
    }
    for path in &agent.skills {
        load_skill(path, skill_roots)?;
    }
    for server in &agent.mcp_servers {
        if store.config(ConfigKind::McpServer, server).await?.is_none() {
            return Err(AppError::bad_request(format!(
                "agent {:?} uses the MCP server {server:?}, which is not configured \
                 (POST /v1/tools/mcp)",
                agent.id
            )));
        }
    }
    if let Some(template) = &agent.prompt_template {
        runtime
            .templates()
            .render(template, &agent.template_arguments)
            .map_err(|error| {
                AppError::bad_request(format!(
                    "agent {:?}: its prompt template: {error}",
                    agent.id
                ))
            })?;
    }
    Ok(())
}

impl crate::App {
    /// Checks an agent before it is saved: [`validate`] against this app's store, runtime and
    /// skill folders, and its default webhook against the server's webhook rules.
    pub async fn validate_agent(&self, agent: &AgentConfig) -> Result<(), AppError> {
        validate(
            &self.parts.store,
            &self.parts.sessions.runtime(),
            agent,
            self.parts.tools.skill_roots.as_deref(),
        )
        .await?;
        if let Some(url) = &agent.webhook_url {
            self.check_webhook(url, None).await?;
        }
        if agent.a2a.as_ref().is_some_and(|a2a| a2a.default)
            && let Some(other) = self.agents().await?.into_iter().find(|other| {
                other.id != agent.id && other.a2a.as_ref().is_some_and(|a2a| a2a.default)
            })
        {
            return Err(AppError::conflict(format!(
                "agent {:?} is the server's default A2A agent already (one at most)",
                other.id
            )));
        }
        Ok(())
    }

    /// Every saved agent, by id.
    pub async fn agents(&self) -> Result<Vec<AgentConfig>, AppError> {
        Ok(crate::config::ConfigRepo::new(&self.parts.store)
            .list()
            .await?
            .into_iter()
            .map(|(_, agent)| agent)
            .collect())
    }

    /// The saved agent `id`, or `not_found`.
    pub async fn agent(&self, id: &str) -> Result<AgentConfig, AppError> {
        check_name("agent", id)?;
        stored_agent(&self.parts.store, id)
            .await?
            .ok_or_else(|| no_agent(id))
    }

    /// Checks and saves a new agent (`conflict` if the id is taken).
    pub async fn create_agent(&self, agent: &AgentConfig) -> Result<(), AppError> {
        self.validate_agent(agent).await?;
        crate::config::ConfigRepo::new(&self.parts.store)
            .create(&agent.id, agent)
            .await?;
        if !agent.skills.is_empty() {
            // The runtime registers the skills of every saved agent.
            self.reload_runtime().await?;
        }
        Ok(())
    }

    /// Checks and saves `agent` in place of the saved agent of its id (`not_found` if none).
    pub async fn replace_agent(&self, agent: &AgentConfig) -> Result<(), AppError> {
        check_name("agent", &agent.id)?;
        self.validate_agent(agent).await?;
        let repo = crate::config::ConfigRepo::<AgentConfig>::new(&self.parts.store);
        let Some(old) = repo.get(&agent.id).await? else {
            return Err(no_agent(&agent.id));
        };
        repo.replace(&agent.id, &agent.id, agent).await?;
        if old.skills != agent.skills {
            self.reload_runtime().await?;
        }
        Ok(())
    }

    /// Deletes the saved agent `id` (`not_found` if none).
    pub async fn delete_agent(&self, id: &str) -> Result<(), AppError> {
        check_name("agent", id)?;
        let repo = crate::config::ConfigRepo::<AgentConfig>::new(&self.parts.store);
        let had_skills = repo
            .get(id)
            .await
            .ok()
            .flatten()
            .is_some_and(|agent| !agent.skills.is_empty());
        if !repo.delete(id).await? {
            return Err(no_agent(id));
        }
        if had_skills {
            self.reload_runtime().await?;
        }
        Ok(())
    }
}

/// The answer when no agent has the id.
fn no_agent(id: &str) -> AppError {
    AppError::not_found(format!("no agent {id:?}"))
}

/// The stored agent named `id`.
pub async fn stored_agent(store: &Store, id: &str) -> Result<Option<AgentConfig>, AppError> {
    crate::config::ConfigRepo::new(store).get(id).await
}

impl crate::config::ConfigDoc for AgentConfig {
    const KIND: agentry_store::ConfigKind = agentry_store::ConfigKind::Agent;
    const NOUN: &'static str = "agent";
}
