//! `agentry mcp add|list|check|call|rm|serve`: the MCP servers of the runtime.
//!
//! Servers are saved in the data folder's database, where `agentry serve` starts them (a running
//! server picks up changes made here at its next start; the API changes them live).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};

use agentry_app::domain::mcp::{McpManager, McpServerConfig, ServerState, ValueSource};
use agentry_app::domain::store::{ConfigKind, Store};

use agentry_app::config::ConfigRepo;

use super::app_error;
use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct McpArgs {
    #[command(subcommand)]
    command: McpCommand,
}

#[derive(Debug, Subcommand)]
enum McpCommand {
    /// Save an MCP server (stdio: `add NAME -- COMMAND ARGS…`; HTTP: `add NAME --url URL`;
    /// or several from a `{"mcpServers": {…}}` file with `--file`), then start it once to check
    /// it and list its tools.
    Add(AddArgs),
    /// List the saved servers.
    List,
    /// Start a saved server, report its status and tools, and stop it.
    Check {
        /// The server's name.
        name: String,
    },
    /// Start a saved server, call one of its tools with JSON arguments, print the result and
    /// stop it (exit status 1 when the server says the call failed). Elicitations the server
    /// asks for during the call are declined: nobody is there to answer.
    Call {
        /// The server's name.
        name: String,
        /// The tool, by its name on the server.
        tool: String,
        /// The arguments, a JSON object.
        #[arg(default_value = "{}")]
        arguments: String,
    },
    /// Delete a saved server.
    Rm {
        /// The server's name.
        name: String,
    },
    /// Offer the saved agents (and optionally the registered tools) as an MCP server on stdio.
    Serve(super::mcp_serve::McpServeArgs),
}

#[derive(Debug, Args)]
struct AddArgs {
    /// The server's name (its tools are called `<name>__<tool>`).
    #[arg(required_unless_present = "file")]
    name: Option<String>,
    /// A streamable HTTP endpoint instead of a command.
    #[arg(long, conflicts_with = "file")]
    url: Option<String>,
    /// An HTTP header, `Name=value` (repeatable).
    #[arg(long = "header", value_name = "NAME=VALUE")]
    headers: Vec<String>,
    /// An environment variable for a stdio server, `NAME=value` (repeatable).
    #[arg(long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// A header or environment value taken from a stored secret: `NAME=SECRET` (repeatable;
    /// a header for HTTP servers, an environment variable for stdio ones).
    #[arg(long = "secret", value_name = "NAME=SECRET")]
    secrets: Vec<String>,
    /// The working directory of a stdio server.
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// Servers from a JSON file `{"mcpServers": {name: config}}`.
    #[arg(long, conflicts_with_all = ["url", "command"])]
    file: Option<PathBuf>,
    /// Save without starting the server.
    #[arg(long)]
    no_check: bool,
    /// The command and its arguments (after `--`).
    #[arg(last = true)]
    command: Vec<String>,
}

/// How long a check waits for a server to start.
const CHECK_WAIT: Duration = Duration::from_secs(60);

pub(crate) async fn mcp(args: McpArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        McpCommand::Add(args) => add(args, data).await,
        McpCommand::List => list(data).await,
        McpCommand::Check { name } => {
            let store = data.open_store().await?;
            let config = saved(&store, &name).await?;
            check(&store, &name, config).await
        }
        McpCommand::Call {
            name,
            tool,
            arguments,
        } => {
            let arguments: serde_json::Value = serde_json::from_str(&arguments)
                .context("the arguments are not JSON (give an object, e.g. '{\"a\": 1}')")?;
            anyhow::ensure!(
                arguments.is_object(),
                "the arguments must be a JSON object, not {arguments}"
            );
            let store = data.open_store().await?;
            let config = saved(&store, &name).await?;
            call(&store, &name, config, &tool, arguments).await
        }
        McpCommand::Rm { name } => {
            agentry_app::domain::mcp::validate_server_name(&name)?;
            let store = data.open_store().await?;
            if !saved_servers(&store)
                .delete(&name)
                .await
                .map_err(app_error)?
            {
                anyhow::bail!("no MCP server {name:?}");
            }
            eprintln!("removed {name}");
            Ok(ExitCode::SUCCESS)
        }
        McpCommand::Serve(args) => super::mcp_serve::run(args, data).await,
    }
}

/// The saved MCP servers.
fn saved_servers(store: &Store) -> ConfigRepo<McpServerConfig> {
    ConfigRepo::new(store)
}

fn pairs(values: &[String], what: &str) -> anyhow::Result<BTreeMap<String, String>> {
    values
        .iter()
        .map(|pair| {
            pair.split_once('=')
                .map(|(name, value)| (name.to_owned(), value.to_owned()))
                .with_context(|| format!("{what} {pair:?} is not NAME=VALUE"))
        })
        .collect()
}

async fn add(args: AddArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let servers = if let Some(file) = &args.file {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let document: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", file.display()))?;
        agentry_app::domain::mcp::parse_servers_document(&document)?
    } else {
        let name = args.name.clone().context("give the server a name")?;
        let secrets = pairs(&args.secrets, "--secret")?
            .into_iter()
            .map(|(name, secret)| (name, ValueSource::Secret { secret }));
        let config = match (&args.url, args.command.split_first()) {
            (Some(url), None) => {
                if !args.env.is_empty() || args.cwd.is_some() {
                    anyhow::bail!("--env and --cwd are for stdio servers");
                }
                let mut config = McpServerConfig::http(url);
                for (header, value) in pairs(&args.headers, "--header")? {
                    config.headers.insert(header, ValueSource::Literal(value));
                }
                config.headers.extend(secrets);
                config
            }
            (None, Some((program, rest))) => {
                if !args.headers.is_empty() {
                    anyhow::bail!("--header is for HTTP servers");
                }
                let mut config = McpServerConfig::stdio(program, rest.iter().cloned());
                for (variable, value) in pairs(&args.env, "--env")? {
                    config.env.insert(variable, ValueSource::Literal(value));
                }
                config.env.extend(secrets);
                config.cwd = args.cwd.clone();
                config
            }
            (Some(_), Some(_)) => {
                anyhow::bail!("give either --url or a command after --, not both")
            }
            (None, None) => anyhow::bail!(
                "give the command after -- (agentry mcp add NAME -- npx -y SERVER) or --url URL"
            ),
        };
        config.validate(&name)?;
        BTreeMap::from([(name, config)])
    };
    let store = data.open_store().await?;
    let known = agentry_app::secrets::Secrets::load(&store)
        .await
        .map_err(app_error)?;
    for (name, config) in &servers {
        // Each secret it names is set, and may go where the server would send it.
        known.for_mcp_server(name, config).map_err(app_error)?;
    }
    for (name, config) in &servers {
        saved_servers(&store)
            .put(name, config)
            .await
            .map_err(app_error)?;
        eprintln!("saved MCP server {name}");
    }
    let mut code = ExitCode::SUCCESS;
    if !args.no_check {
        for (name, config) in servers {
            if check(&store, &name, config).await? != ExitCode::SUCCESS {
                code = ExitCode::FAILURE;
            }
        }
    }
    Ok(code)
}

async fn saved(store: &Store, name: &str) -> anyhow::Result<McpServerConfig> {
    agentry_app::domain::mcp::validate_server_name(name)?;
    saved_servers(store)
        .get(name)
        .await
        .map_err(app_error)?
        .with_context(|| format!("no MCP server {name:?} (agentry mcp add)"))
}

/// Starts one saved server (on the host: the operator, on their own terminal, asked for it)
/// and waits until it is ready or has failed.
async fn start(
    store: &Store,
    name: &str,
    config: McpServerConfig,
) -> anyhow::Result<(McpManager, agentry_app::domain::mcp::ServerStatus)> {
    let secrets = agentry_app::secrets::Secrets::load(store)
        .await
        .map_err(app_error)?;
    let manager = McpManager::with_stdio(agentry_app::domain::mcp::StdioPolicy::host());
    agentry_app::mcp_tools::add_server(&manager, &secrets, name, config)
        .await
        .map_err(app_error)?;
    let status = manager.wait_ready(name, CHECK_WAIT).await?;
    Ok((manager, status))
}

/// Starts one server, calls `tool`, prints what it answered, stops it.
async fn call(
    store: &Store,
    name: &str,
    config: McpServerConfig,
    tool: &str,
    arguments: serde_json::Value,
) -> anyhow::Result<ExitCode> {
    let (manager, status) = start(store, name, config).await?;
    if status.state != ServerState::Connected {
        manager.shutdown().await;
        anyhow::bail!(
            "{name}: could not connect: {}",
            status.last_error.as_deref().unwrap_or("no answer")
        );
    }
    let result = manager
        .call_tool(
            name,
            tool,
            arguments,
            agentry_app::domain::mcp::CallOptions::default(),
        )
        .await;
    manager.shutdown().await;
    let result = result.with_context(|| format!("{name}: calling {tool}"))?;
    for part in &result.content {
        match part {
            agentry_types::ToolResultPart::Text { text } => println!("{text}"),
            other => println!("{}", serde_json::to_string(other)?),
        }
    }
    if result.content.is_empty()
        && let Some(structured) = &result.structured_content
    {
        println!("{structured}");
    }
    if result.is_error {
        eprintln!("{name}: {tool} answered with an error");
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts one server, prints its status and tools, stops it.
async fn check(store: &Store, name: &str, config: McpServerConfig) -> anyhow::Result<ExitCode> {
    let (manager, status) = start(store, name, config).await?;
    let tools = manager.tools();
    manager.shutdown().await;
    if status.state != ServerState::Connected {
        eprintln!(
            "{name}: could not connect: {}",
            status.last_error.as_deref().unwrap_or("no answer")
        );
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "{name}: connected ({}), {} tools",
        status
            .protocol_version
            .as_deref()
            .unwrap_or("unknown protocol"),
        tools.len()
    );
    for tool in tools {
        let summary = tool
            .description
            .lines()
            .next()
            .unwrap_or_default()
            .to_owned();
        println!("  {}  {summary}", tool.name);
    }
    Ok(ExitCode::SUCCESS)
}

async fn list(data: &DataArgs) -> anyhow::Result<ExitCode> {
    let store = data.open_store().await?;
    for (name, value) in store.list_config(ConfigKind::McpServer).await? {
        match serde_json::from_value::<McpServerConfig>(value) {
            Ok(config) => {
                let target = match (&config.command, &config.url) {
                    (Some(command), _) => {
                        let mut shown = command.clone();
                        for arg in &config.args {
                            shown.push(' ');
                            shown.push_str(arg);
                        }
                        shown
                    }
                    (None, Some(url)) => url.clone(),
                    (None, None) => String::new(),
                };
                let disabled = if config.disabled { "  (disabled)" } else { "" };
                println!("{name}  {target}{disabled}");
            }
            Err(error) => println!("{name}  (unreadable: {error})"),
        }
    }
    Ok(ExitCode::SUCCESS)
}
