//! `agentry serve`: the HTTP API on the embedded SQLite (or PostgreSQL) store.

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use agentry_server::{AppState, ServerConfig, serve};

use super::data::DataArgs;

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on. Anything but loopback needs an API key (`agentry keys create`).
    #[arg(default_value = "127.0.0.1:7988")]
    addr: SocketAddr,
    /// Allow cross-origin requests from this origin (repeatable; CORS is off by default).
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// Answer requests whose `Host` is this name (repeatable; `*.example.com` for its
    /// subdomains, `*` for any name behind a proxy that checks it). Loopback names and IP
    /// addresses are always answered; any other name is refused, which keeps web pages that
    /// rebind their own name to this machine out.
    #[arg(long = "allowed-host", value_name = "NAME")]
    allowed_hosts: Vec<String>,
    /// Believe `X-Forwarded-For` from this reverse proxy (an address, or a network such as
    /// `10.0.0.0/8`; repeatable): the login throttle then counts each client the proxy names,
    /// instead of counting every client behind it as one. A header from anyone else is ignored.
    #[arg(long = "trusted-proxy", value_name = "ADDR[/BITS]")]
    trusted_proxies: Vec<agentry_server::access::TrustedProxy>,
    /// Offer the registered tools through the MCP endpoint `/mcp` too (it always offers the
    /// saved agents).
    #[arg(long)]
    mcp_expose_tools: bool,
    /// Require an API key from the first request on: on a server without keys, make an admin
    /// key at start and print it this once (as notebook servers print their token). Without
    /// keys, any process that reaches the port — every local user and program — may do
    /// everything.
    #[arg(long, env = "AGENTRY_REQUIRE_KEY")]
    require_key: bool,
    /// Which tools need a person's approval unless a run's (or agent's) own `approvals` say
    /// otherwise (repeatable): a risk class (`read_only`, `writes_files`, `runs_commands`,
    /// `network`, `agents`), `host` (tools that run on the host, outside the sandbox), or
    /// `none`. Default: `host`.
    #[arg(long = "approve", value_name = "CLASS", value_parser = parse_approval_class)]
    approve: Vec<ApprovalClass>,
    /// Background runs (`POST /v1/runs`) this process runs at once; more wait in the queue.
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    max_concurrent_runs: u32,
    /// Background runs that may wait in the queue; more are refused with 429.
    #[arg(long, value_name = "N", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    max_queued_runs: u64,
    /// The shortest time a schedule may leave between two fires, seconds (each fire may make
    /// a session): a schedule firing more often is refused.
    #[arg(long, value_name = "SECS", default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    min_schedule_interval_secs: u64,
    /// How long a node's lease lasts unless its heartbeat (every quarter of it) renews it,
    /// seconds: a node dead this long is taken for dead, and its background runs go to the
    /// other nodes on the database.
    #[arg(long, value_name = "SECS", default_value_t = 4, value_parser = clap::value_parser!(u64).range(2..=3600))]
    lease_secs: u64,
    /// A conversation whose node died waits for a node on that node's workspace volume (its
    /// files are there); with this, once it has waited this many seconds past the dead node's
    /// lease, this node takes it and does what `--stranded-action` says.
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(0..=31_536_000))]
    stranded_after_secs: Option<u64>,
    /// What `--stranded-after-secs` does with such a conversation: `interrupt` ends its run
    /// (`interrupted`, for a person to continue) or `resume` runs it on here, without the
    /// files of the other volume (background runs stranded so are resumed under `resume`,
    /// and wait under `interrupt`).
    #[arg(long, value_name = "ACTION", default_value = "interrupt", value_parser = ["interrupt", "resume"])]
    stranded_action: String,
    /// This node's id among the nodes sharing a PostgreSQL database (default: the host's name
    /// and the port). Two live nodes cannot share one.
    #[arg(long, value_name = "ID")]
    node_id: Option<String>,
    /// Where the other nodes reach this one (default: the address it listens on):
    /// `HOST:PORT` (plain HTTP), or `https://HOST:PORT` when a TLS proxy fronts this node.
    /// Requests forwarded between nodes carry a one-minute assertion signed with the shared
    /// `secret.key`, never a client's key or cookie.
    #[arg(long, value_name = "[https://]HOST:PORT", value_parser = parse_advertise_addr)]
    advertise_addr: Option<String>,
    /// Let background runs' webhooks reach loopback and private addresses (refused by default,
    /// so a run cannot make this server call into its own network).
    #[arg(long)]
    webhook_allow_private: bool,
    #[command(flatten)]
    sandbox: super::sandbox::SandboxArgs,
}

/// Checks `--advertise-addr`: `HOST:PORT`, optionally after `http://` or `https://`, with no
/// path or credentials.
fn parse_advertise_addr(value: &str) -> Result<String, String> {
    let trimmed = value.trim_end_matches('/');
    let authority = trimmed
        .strip_prefix("https://")
        .or_else(|| trimmed.strip_prefix("http://"))
        .unwrap_or(trimmed);
    let valid = authority.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && port.parse::<u16>().is_ok_and(|port| port > 0)
            && !host.contains(['/', '@', '?', '#', ' '])
    });
    if valid {
        Ok(trimmed.to_owned())
    } else {
        Err(format!(
            "{value:?} is not HOST:PORT or http(s)://HOST:PORT (no path, no credentials)"
        ))
    }
}

/// The data folder's `serve.lock`, held by this process for as long as it lives. It holds the
/// incarnation of the process that holds it, so the next process to take it knows which
/// incarnation it replaces: one that is gone (it no longer holds the lock).
struct FolderLock {
    file: std::fs::File,
    /// The incarnation that held it before, if any.
    previous: Option<String>,
}

impl FolderLock {
    /// Takes the lock; `Ok(None)` when another process holds it.
    fn try_take(home: &std::path::Path) -> anyhow::Result<Option<Self>> {
        use std::io::Read as _;
        let path = home.join("serve.lock");
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => return Ok(None),
            Err(std::fs::TryLockError::Error(error)) => {
                return Err(error).with_context(|| format!("cannot lock {}", path.display()));
            }
        }
        let mut held = String::new();
        file.read_to_string(&mut held)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let previous = Some(held.trim().to_owned()).filter(|held| !held.is_empty());
        Ok(Some(Self { file, previous }))
    }

    /// Takes the lock or says who holds it.
    fn take(home: &std::path::Path) -> anyhow::Result<Self> {
        Self::try_take(home)?.ok_or_else(|| {
            anyhow::anyhow!(
                "another `agentry serve` is using the data folder {} (it holds {}): two servers \
                 on one SQLite folder would run the same sessions twice; stop it, give this one \
                 another data folder (`--home DIR`), or share a PostgreSQL database between \
                 nodes",
                home.display(),
                home.join("serve.lock").display()
            )
        })
    }

    /// Records `incarnation` as the one holding the lock now.
    fn record(&mut self, incarnation: &str) -> anyhow::Result<()> {
        use std::io::{Seek as _, Write as _};
        self.file.set_len(0)?;
        self.file.rewind()?;
        self.file.write_all(incarnation.as_bytes())?;
        self.file.sync_data()?;
        Ok(())
    }
}

/// One value of `--approve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ApprovalClass {
    Class(agentry_app::domain::core::tool::RiskClass),
    Host,
    None,
}

fn parse_approval_class(text: &str) -> Result<ApprovalClass, String> {
    match text {
        "host" => Ok(ApprovalClass::Host),
        "none" => Ok(ApprovalClass::None),
        other => other
            .parse()
            .map(ApprovalClass::Class)
            .map_err(|error| format!("{error}, `host` or `none`")),
    }
}

/// The approval defaults `--approve` names (none given: the shipped default, `host`).
fn approval_defaults(
    values: &[ApprovalClass],
) -> agentry_app::domain::core::tool::ApprovalDefaults {
    if values.is_empty() {
        return agentry_app::domain::core::tool::ApprovalDefaults::default();
    }
    let mut defaults = agentry_app::domain::core::tool::ApprovalDefaults::none();
    for value in values {
        match value {
            ApprovalClass::Class(class) => {
                defaults.classes.insert(*class);
            }
            ApprovalClass::Host => defaults.host = true,
            ApprovalClass::None => {}
        }
    }
    defaults
}

pub(crate) async fn run(args: ServeArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let config = ServerConfig {
        addr: args.addr,
        ..ServerConfig::default()
    };
    let store = data.open_store().await?;
    // Two servers on one SQLite data folder would each resume, queue and run the same
    // sessions: the second refuses to start (PostgreSQL nodes share through leases instead).
    // A PostgreSQL node takes the lock when it can (nodes may share a folder): holding it
    // proves the incarnation recorded in it is gone, so a restart takes its id at once.
    let mut folder_lock = match store.backend() {
        agentry_app::domain::store::Backend::Sqlite => Some(FolderLock::take(&data.home()?)?),
        agentry_app::domain::store::Backend::Postgres => FolderLock::try_take(&data.home()?)?,
    };
    // The first admin key, when a key is required and none exists yet: shown now, this once
    // (before the bind, which may need a key for a non-loopback address).
    if args.require_key && !agentry_app::auth::auth_enabled(&store).await? {
        let key = agentry_app::auth::create_key(&store, "first admin (serve --require-key)")
            .await
            .context("cannot create the first API key")?;
        crate::telemetry::tell(
            "WARN",
            &format!(
                "agentry: --require-key: every request needs this admin key (shown this once; \
             `agentry keys` manages keys):\n\n    Authorization: Bearer {}\n",
                key.key
            ),
        );
    }
    let listener = agentry_server::serve::bind(&config, &store).await?;
    let address = listener.local_addr()?;
    let node_id = match args.node_id {
        Some(id) => id,
        None => format!("{}-{}", host_name(), address.port()),
    };
    agentry_app::domain::store::check_node_id(&node_id)
        .map_err(|error| anyhow::anyhow!("--node-id: {error}"))?;
    let imported = agentry_app::mcp_tools::import_servers_file(&store, &data.home()?).await?;
    // Standalone sandboxes (`/v1/sandboxes`) outlive the server that made them only when
    // paused (and their snapshots): the workspaces a stopped or crashed one left behind go
    // (after the bind, so a second server on the same data folder, refused its port, removes
    // nothing).
    let stale = data.home()?.join("sandboxes");
    agentry_app::sandboxes::remove_stale_workspaces(&stale)
        .with_context(|| format!("cannot clean {}", stale.display()))?;
    let mut tools = args.sandbox.environment(&data.home()?)?;
    let volume = match &tools.workspaces {
        Some(folder) => Some(super::sandbox::workspace_volume(folder)?),
        None => None,
    };
    tools.approval_defaults = approval_defaults(&args.approve);
    tools.skill_roots = Some(data.skill_roots()?);
    let sandbox_line = match &tools.sandboxes {
        Some(pool) => format!("sandbox: {:?}", pool.backend().kind()).to_lowercase(),
        None if tools.allow_host_commands => {
            "sandbox: off (exec and terminal are not offered)".to_owned()
        }
        None => "sandbox: off (exec, terminal, command tools and stdio MCP servers are refused)"
            .to_owned(),
    };
    if tools.allow_host_commands {
        crate::telemetry::tell("WARN", &host_commands_warning(tools.sandboxes.is_some()));
    }
    let fetch_line = super::sandbox::fetch_line(&tools.fetch);
    let mut state = AppState::with_tools(store.clone(), tools).await?;
    state.access = std::sync::Arc::new(agentry_server::access::AccessPolicy {
        allowed_hosts: args.allowed_hosts,
        allowed_origins: args.cors_origins,
        trusted_proxies: args.trusted_proxies,
    });
    state.app.expose_tools_over_mcp(args.mcp_expose_tools);
    // This process: the node's id and a new incarnation.
    let worker = format!("{node_id}/{}", agentry_types::RunId::new());
    let replaces = folder_lock
        .as_ref()
        .and_then(|lock| lock.previous.clone())
        .filter(|previous| previous.starts_with(&format!("{node_id}/")));
    if let Some(lock) = folder_lock.as_mut() {
        lock.record(&worker)
            .context("cannot record this process in serve.lock")?;
    }
    state
        .app
        .set_queue_settings(agentry_app::queue::QueueSettings {
            worker,
            replaces,
            node_id: node_id.clone(),
            volume: volume.clone(),
            address: args
                .advertise_addr
                .clone()
                .unwrap_or_else(|| address.to_string()),
            max_concurrent: args.max_concurrent_runs as usize,
            max_queued: args.max_queued_runs,
            lease: std::time::Duration::from_secs(args.lease_secs),
            stranded: args
                .stranded_after_secs
                .map(|secs| agentry_app::queue::StrandedPolicy {
                    after: std::time::Duration::from_secs(secs),
                    action: if args.stranded_action == "resume" {
                        agentry_app::queue::StrandedAction::Resume
                    } else {
                        agentry_app::queue::StrandedAction::Interrupt
                    },
                }),
            min_schedule_interval: std::time::Duration::from_secs(args.min_schedule_interval_secs),
            webhooks: agentry_app::queue::WebhookSettings {
                allow_private: args.webhook_allow_private,
                ..agentry_app::queue::WebhookSettings::default()
            },
            ..agentry_app::queue::QueueSettings::default()
        });
    // Refused here, before anything is announced, while another live node has this id.
    state
        .app
        .join_cluster()
        .await
        .map_err(|error| anyhow::anyhow!("cannot join the cluster: {}", error.message))?;
    let shutdown = state.app.shutdown_signal().clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        shutdown.cancel();
    });
    crate::telemetry::say(&format!("Agentry is listening on http://{address}"));
    crate::telemetry::say(&format!("console: open http://{address}/ in a browser"));
    crate::telemetry::say(&format!(
        "data: {} ({})",
        data.home()?.display(),
        store.backend().as_str()
    ));
    if store.backend() == agentry_app::domain::store::Backend::Postgres {
        crate::telemetry::say(&format!(
            "node: {node_id} (a node dead {} s has its background runs taken by the others)",
            args.lease_secs
        ));
    }
    crate::telemetry::say(&sandbox_line);
    crate::telemetry::say(&fetch_line);
    crate::telemetry::say(&format!(
        "requests: Host must be a loopback name or IP address{}; browser pages of other origins \
         may not change anything{}",
        if state.access.allowed_hosts.is_empty() {
            String::new()
        } else {
            format!(" or {}", state.access.allowed_hosts.join(", "))
        },
        if state.access.allowed_origins.is_empty() {
            String::new()
        } else {
            format!(" (allowed: {})", state.access.allowed_origins.join(", "))
        }
    ));
    crate::telemetry::say(&approvals_line(state.app.approval_defaults()));
    if imported > 0 {
        crate::telemetry::say(&format!(
            "mcp: {imported} server(s) imported from {}",
            data.home()?
                .join(agentry_app::mcp_tools::SERVERS_FILE)
                .display()
        ));
    }
    let models = store
        .list_config(agentry_app::domain::store::ConfigKind::Model)
        .await?;
    if models.is_empty() {
        for (name, host) in import_provider_keys(&store).await? {
            crate::telemetry::say(&format!(
                "secrets: {name} imported from the environment (sealed in the data folder, sent \
                 only to {host})"
            ));
        }
        crate::telemetry::say(&first_model_hint(address, ollama_running().await));
    }
    serve(listener, state, &config).await?;
    crate::telemetry::tell("INFO", "agentry: stopped");
    Ok(ExitCode::SUCCESS)
}

/// This machine's name (`/proc/sys/kernel/hostname`, else `$HOSTNAME`, else `localhost`),
/// reduced to the characters a node id may hold.
fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_default();
    let name: String = name
        .trim()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        .take(100)
        .collect();
    if name.is_empty() {
        "localhost".to_owned()
    } else {
        name
    }
}

/// What `--approve` makes ask for a person's approval, for the start-up banner.
fn approvals_line(defaults: &agentry_app::domain::core::tool::ApprovalDefaults) -> String {
    let mut asks: Vec<&str> = defaults
        .classes
        .iter()
        .map(|class| class.as_str())
        .collect();
    if defaults.host {
        asks.insert(0, "tools that run on the host");
    }
    if asks.is_empty() {
        "approvals: none by default (runs and agents may still ask for their own)".to_owned()
    } else {
        format!(
            "approvals: {} ask a person unless a run's `approvals` say otherwise",
            asks.join(", ")
        )
    }
}

/// The loud notice `--allow-host-commands` gets at start.
fn host_commands_warning(sandbox: bool) -> String {
    let which = if sandbox {
        "command tools and stdio MCP servers that say \"host\": true"
    } else {
        "every command tool and stdio MCP server (there is no sandbox)"
    };
    let line = "!".repeat(78);
    format!(
        "{line}\n!! agentry: --allow-host-commands: {which} run ON THE HOST, as this \n!! \
         process's user, WITHOUT ISOLATION. Registering a stdio MCP server over HTTP needs an \n!! \
         API key (agentry keys create).\n{line}"
    )
}

/// Whether an Ollama server answers on its default port.
async fn ollama_running() -> bool {
    let connect = tokio::net::TcpStream::connect(("127.0.0.1", 11434));
    matches!(
        tokio::time::timeout(std::time::Duration::from_millis(200), connect).await,
        Ok(Ok(_))
    )
}

/// How to add a first model, offering what this machine seems to have.
/// The providers whose key variables a first start imports: the variable, the host the key is
/// bound to, and the model the banner then offers to register (`id`, protocol, model name).
const PROVIDER_KEYS: [(&str, &str, &str, &str, &str); 2] = [
    (
        "OPENAI_API_KEY",
        "api.openai.com",
        "gpt",
        "openai",
        "gpt-4o-mini",
    ),
    (
        "ANTHROPIC_API_KEY",
        "api.anthropic.com",
        "claude",
        "anthropic",
        "claude-sonnet-4-5",
    ),
];

/// On a first start (no model yet), each provider key in the environment that is not a secret
/// yet becomes one, bound to its provider's host: the imported `(name, host)`s.
async fn import_provider_keys(
    store: &agentry_app::domain::store::Store,
) -> anyhow::Result<Vec<(&'static str, &'static str)>> {
    let stored: Vec<String> = store
        .list_secrets()
        .await?
        .into_iter()
        .map(|secret| secret.name)
        .collect();
    let mut imported = Vec::new();
    for (name, host, ..) in PROVIDER_KEYS {
        let Some(value) = std::env::var(name).ok().filter(|v| !v.trim().is_empty()) else {
            continue;
        };
        if stored.iter().any(|known| known == name) {
            continue;
        }
        store
            .put_bound_secret(name, value.trim(), &[host.to_owned()])
            .await?;
        imported.push((name, host));
    }
    Ok(imported)
}

fn first_model_hint(address: SocketAddr, ollama: bool) -> String {
    let mut hint = String::from("No model yet. Add one:\n");
    let has = |var: &str| std::env::var(var).is_ok_and(|v| !v.trim().is_empty());
    for (name, _, id, protocol, model) in PROVIDER_KEYS {
        if has(name) {
            hint.push_str(&format!(
                "  curl -s http://{address}/v1/models -H 'content-type: application/json' -d '{{\"id\":\"{id}\",\"protocol\":\"{protocol}\",\"model_name\":\"{model}\",\"api_key_secret\":\"{name}\"}}'\n"
            ));
        }
    }
    let ollama_note = if ollama {
        "# Ollama is running here"
    } else {
        "# if you start Ollama"
    };
    hint.push_str(&format!(
        "  curl -s http://{address}/v1/models -H 'content-type: application/json' -d '{{\"id\":\"local\",\"protocol\":\"ollama\",\"model_name\":\"llama3.2\"}}'   {ollama_note}\n"
    ));
    hint.push_str(&format!(
        "Then: curl -s http://{address}/v1/infer -H 'content-type: application/json' -d '{{\"session_id\":\"new\",\"text\":\"Hello!\"}}'"
    ));
    hint
}

/// Waits for Ctrl-C (or SIGTERM on Unix).
pub(super) async fn wait_for_signal() {
    let interrupt = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(_) => {
                    let _ = interrupt.await;
                    return;
                }
            };
        tokio::select! {
            _ = interrupt => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = interrupt.await;
    }
}

#[cfg(test)]
mod tests {
    use super::parse_advertise_addr;

    #[test]
    fn an_advertised_address_is_host_and_port_with_an_optional_scheme() {
        for good in [
            "node-2:8080",
            "10.0.0.2:80",
            "https://node-2.internal:8443/",
            "[::1]:9",
        ] {
            assert!(parse_advertise_addr(good).is_ok(), "{good}");
        }
        assert_eq!(parse_advertise_addr("https://n:1/").unwrap(), "https://n:1");
        for bad in [
            "node-2",
            "node-2:0",
            "https://n:1/path",
            "http://u@n:1",
            ":80",
            "ftp://n:1",
        ] {
            assert!(parse_advertise_addr(bad).is_err(), "{bad}");
        }
    }
}
