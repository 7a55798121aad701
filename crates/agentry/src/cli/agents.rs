//! `agentry agents`: saved agents (the same store and the same checks as `/v1/agents`), and
//! running as one (`agentry run --agent`, `agentry chat --agent`).
//!
//! Running as an agent builds the server's runtime from the store (`build_runtime`: every
//! saved model, tool, template and agent skill, plus the tools of the agent's MCP servers,
//! started for the run) and resolves the agent against it, exactly as `/v1/infer` does.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use agentry_app::ToolEnvironment;
use agentry_app::agents::{AgentConfig, AgentLimits, AgentRun, WorkspaceScope, stored_agent};
use agentry_app::config::ConfigRepo;
use agentry_app::domain::core::{RunRequest, Runtime};
use agentry_app::domain::mcp::McpManager;
use agentry_app::domain::store::Store;

use super::app_error;
use super::data::DataArgs;
use super::sandbox::SandboxMode;

#[derive(Debug, Args)]
pub(crate) struct AgentsArgs {
    #[command(subcommand)]
    command: AgentsCommand,
}

#[derive(Debug, Subcommand)]
enum AgentsCommand {
    /// List the saved agents.
    List {
        /// Print one JSON object per agent.
        #[arg(long)]
        json: bool,
    },
    /// Print an agent's configuration as JSON.
    Show {
        /// The agent's id.
        id: String,
    },
    /// Save an agent, from a JSON file (the `/v1/agents` shape) or from flags.
    Add(Box<AddArgs>),
    /// Delete an agent.
    Rm {
        /// The agent's id.
        id: String,
    },
}

#[derive(Debug, Args)]
struct AddArgs {
    /// A JSON file with the whole agent (the `/v1/agents` shape); no other flag is needed.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["id", "model"])]
    file: Option<PathBuf>,
    /// The agent's id.
    #[arg(long, required_unless_present = "file")]
    id: Option<String>,
    /// The saved model it runs on (`/v1/models`).
    #[arg(long, required_unless_present = "file")]
    model: Option<String>,
    /// A model tried when the previous one fails before any output (repeatable, in order).
    #[arg(long = "fallback", value_name = "MODEL")]
    fallbacks: Vec<String>,
    /// A tool it may use (repeatable).
    #[arg(long = "tool", value_name = "NAME")]
    tools: Vec<String>,
    /// A skill folder (repeatable): inside `<data folder>/skills` or a `--skill-root`.
    #[arg(long = "skill", value_name = "DIR")]
    skills: Vec<String>,
    /// A saved MCP server whose tools it gets (repeatable).
    #[arg(long = "mcp", value_name = "SERVER")]
    mcp_servers: Vec<String>,
    /// Its system prompt.
    #[arg(long, conflicts_with = "template")]
    system: Option<String>,
    /// A saved prompt template rendered as its system prompt.
    #[arg(long)]
    template: Option<String>,
    /// A template argument, `NAME=VALUE` (repeatable).
    #[arg(long = "arg", value_name = "NAME=VALUE", requires = "template")]
    arguments: Vec<String>,
    /// A display name.
    #[arg(long)]
    nickname: Option<String>,
    /// What it is for, in a sentence or two.
    #[arg(long)]
    description: Option<String>,
    /// A label (repeatable).
    #[arg(long = "label")]
    labels: Vec<String>,
    /// Tool rounds allowed per run.
    #[arg(long)]
    max_rounds: Option<u32>,
    /// Output tokens allowed per run (all model calls together).
    #[arg(long)]
    max_tokens: Option<u64>,
    /// Tool calls allowed per run.
    #[arg(long)]
    max_tool_calls: Option<u32>,
    /// The run's deadline in seconds.
    #[arg(long)]
    wall_time_secs: Option<u64>,
    /// Background runs of this agent running at once (more wait in the queue).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_concurrent_runs: Option<u32>,
    /// A registered model that summarises old turns when the context window fills up
    /// (without one they are dropped).
    #[arg(long)]
    summary_model: Option<String>,
    /// A registered model that describes images when the agent's model cannot see them
    /// (default: the model labelled `read-image`).
    #[arg(long)]
    vision_model: Option<String>,
    /// A registered speech model that transcribes audio when the agent's model cannot hear it
    /// (default: the model labelled `speech`).
    #[arg(long)]
    speech_model: Option<String>,
    /// One workspace for all its sessions (and stateless runs) instead of one per session.
    #[arg(long)]
    shared_workspace: bool,
    /// Replace an agent with the same id instead of refusing.
    #[arg(long)]
    replace: bool,
}

impl AddArgs {
    fn agent(self) -> anyhow::Result<AgentConfig> {
        if let Some(path) = &self.file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            return serde_json::from_str(&text)
                .with_context(|| format!("{} is not a valid agent", path.display()));
        }
        let mut template_arguments = serde_json::Map::new();
        for argument in &self.arguments {
            let (name, value) = argument
                .split_once('=')
                .with_context(|| format!("--arg {argument:?}: expected NAME=VALUE"))?;
            template_arguments.insert(name.to_owned(), serde_json::Value::from(value));
        }
        let limits = AgentLimits {
            max_tool_rounds: self.max_rounds,
            max_tokens: self.max_tokens,
            max_tool_calls: self.max_tool_calls,
            wall_time_secs: self.wall_time_secs,
            max_concurrent_runs: self.max_concurrent_runs,
        };
        Ok(AgentConfig {
            id: self.id.context("--id is required")?,
            nickname: self.nickname,
            description: self.description,
            // An image and a group self-introduction are set in an agent file (`--file`).
            avatar: None,
            myself_view: None,
            model_id: self.model.context("--model is required")?,
            tool_ids: self.tools,
            system: self.system,
            labels: self.labels,
            max_tool_rounds: None,
            params: Default::default(),
            fallback_model_ids: self.fallbacks,
            skills: self.skills,
            mcp_servers: self.mcp_servers,
            prompt_template: self.template,
            template_arguments,
            limits: (limits != AgentLimits::default()).then_some(limits),
            approvals: None,
            compaction: self.summary_model.map(|model| {
                agentry_app::domain::core::context::CompactionSettings {
                    summary_model: Some(model),
                    ..Default::default()
                }
            }),
            // A narrower network and a default webhook are set in an agent file (`--file`).
            network: None,
            webhook_url: None,
            a2a: None,
            vision_model_id: self.vision_model,
            speech_model_id: self.speech_model,
            workspace: if self.shared_workspace {
                WorkspaceScope::Agent
            } else {
                WorkspaceScope::Session
            },
        })
    }
}

pub(crate) async fn agents(args: AgentsArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    match args.command {
        AgentsCommand::List { json } => {
            for (_, agent) in ConfigRepo::<AgentConfig>::new(&store)
                .list()
                .await
                .map_err(app_error)?
            {
                if json {
                    println!("{}", serde_json::to_string(&agent)?);
                    continue;
                }
                let mut line = format!("{}\t{}", agent.id, agent.model_id);
                if let Some(nickname) = &agent.nickname {
                    line.push_str(&format!("\t{nickname}"));
                }
                if !agent.labels.is_empty() {
                    line.push_str(&format!("\t[{}]", agent.labels.join(", ")));
                }
                println!("{line}");
            }
        }
        AgentsCommand::Show { id } => {
            let agent = stored_agent(&store, &id)
                .await
                .map_err(app_error)?
                .with_context(|| format!("no agent {id:?}"))?;
            println!("{}", serde_json::to_string_pretty(&agent)?);
        }
        AgentsCommand::Add(add) => {
            let replace = add.replace;
            let agent = add.agent()?;
            agent.check_shape().map_err(app_error)?;
            // Checked and saved by the application, as `POST /v1/agents` does (its tools, skills,
            // webhook, the one default A2A agent). Nothing runs, so no MCP server starts, command
            // tools are built as if host commands were allowed, and the workspace tools are
            // there as the sessions' workspaces are.
            let names_only = ToolEnvironment {
                allow_host_commands: true,
                workspaces: Some(data.home()?.join("workspaces")),
                skill_roots: Some(data.skill_roots()?),
                ..ToolEnvironment::default()
            };
            let app = agentry_app::App::builder(store.clone())
                .tools(names_only)
                .mcp(agentry_app::McpStart::None)
                .build()
                .await
                .map_err(app_error)?;
            let exists = ConfigRepo::<AgentConfig>::new(&store)
                .get(&agent.id)
                .await
                .map_err(app_error)?
                .is_some();
            let saved = if replace && exists {
                app.replace_agent(&agent).await
            } else {
                app.create_agent(&agent).await
            };
            app.shut_down();
            if let Err(error) = saved {
                if exists && !replace {
                    anyhow::bail!("{} (--replace to overwrite it)", error.message);
                }
                return Err(app_error(error));
            }
            eprintln!("saved agent {:?}", agent.id);
        }
        AgentsCommand::Rm { id } => {
            if !ConfigRepo::<AgentConfig>::new(&store)
                .delete(&id)
                .await
                .map_err(app_error)?
            {
                anyhow::bail!("no agent {id:?}");
            }
            eprintln!("deleted agent {id:?}");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The server's runtime over `store`, with the tools of `mcp`'s servers.
async fn store_runtime(
    store: &Store,
    mcp: &McpManager,
    environment: &ToolEnvironment,
) -> anyhow::Result<Runtime> {
    let http = agentry_app::domain::llm::http_client(Duration::from_secs(10))?;
    agentry_app::runtime::build_runtime(store, &http, mcp, environment)
        .await
        .map_err(app_error)
}

/// The saved agent `id`.
pub(crate) async fn load(store: &Store, id: &str) -> anyhow::Result<AgentConfig> {
    stored_agent(store, id)
        .await
        .map_err(app_error)?
        .with_context(|| format!("no agent {id:?} (agentry agents list)"))
}

/// The sandbox an agent's session needs: none unless it may run commands.
pub(crate) fn sandbox_mode(agent: &AgentConfig, chosen: Option<SandboxMode>) -> SandboxMode {
    let runs_commands = agent.tool_ids.iter().any(|name| {
        name == agentry_app::domain::tools::shell::EXEC
            || name == agentry_app::domain::tools::shell::TERMINAL
    });
    if runs_commands {
        chosen.unwrap_or_default()
    } else {
        SandboxMode::Off
    }
}

/// A runtime for running as `agent` in `environment` (its MCP servers started for it), and
/// what running as it means.
pub(crate) async fn runtime(
    store: &Store,
    agent: &AgentConfig,
    environment: &ToolEnvironment,
) -> anyhow::Result<(Runtime, AgentRun)> {
    let mcp = super::profile::start_mcp(store, &agent.mcp_servers).await?;
    let runtime = store_runtime(store, &mcp, environment).await?;
    let run = agent
        .resolve(&runtime, environment.skill_roots.as_deref())
        .map_err(app_error)?;
    Ok((runtime, run))
}

/// The application a CLI run as `agent` in a session goes through, as `agentry serve`'s runs
/// do: the agent's sandbox and the flags' network, the data folder's skills, and the agent's
/// own MCP servers (not every saved one), started on the host as every CLI run's are (the
/// operator named them, on their own terminal) and waited for. `elicitations`: where the MCP
/// servers' questions go (a chat answers them inline).
pub(crate) async fn agent_app(
    store: Store,
    agent: &AgentConfig,
    profile: &super::profile::Profile,
    data: &DataArgs,
    elicitations: Option<agentry_app::elicitation::Elicitations>,
) -> anyhow::Result<agentry_app::App> {
    let mut environment = profile
        .network
        .environment(sandbox_mode(agent, profile.sandbox), &data.home()?)?;
    environment.skill_roots = Some(data.skill_roots()?);
    environment.elicitations = elicitations;
    let app = agentry_app::App::builder(store)
        .tools(environment)
        .mcp(agentry_app::McpStart::Only(agent.mcp_servers.clone()))
        .stdio_mcp(agentry_app::domain::mcp::StdioPolicy::host())
        .build()
        .await
        .map_err(app_error)?;
    wait_for_mcp(&app, agent).await?;
    Ok(app)
}

/// Waits for `agent`'s MCP servers, which `app` starts with every saved one, to answer (or
/// fail): its run is offered their tools.
pub(crate) async fn wait_for_mcp(
    app: &agentry_app::App,
    agent: &AgentConfig,
) -> anyhow::Result<()> {
    // The runtime is rebuilt with their tools once they answer.
    app.mcp()
        .await_ready(&agent.mcp_servers, super::profile::MCP_START_WAIT)
        .await
        .map_err(app_error)
}

/// A request for `text` as the agent, with its memories.
pub(crate) async fn request(
    store: &Store,
    run: &AgentRun,
    text: &str,
) -> anyhow::Result<RunRequest> {
    let mut request = run.request(None);
    request.input = Some(agentry_app::domain::core::Input::Text { text: text.into() });
    agentry_app::memory::remember(store, &mut request)
        .await
        .map_err(app_error)?;
    Ok(request)
}
