//! Choosing the sandbox backend (`--sandbox`), the tool environment built from it (sessions'
//! workspaces under the data folder, their sandboxes), and `agentry doctor`, which says what
//! isolation this host gives.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use agentry_app::ToolEnvironment;
use agentry_app::domain::sandbox::{
    BackendKind, Capabilities, NetworkPolicy, SandboxConfig, SandboxPool, SandboxSpec, backend,
};
use agentry_app::domain::tools::{FetchConfig, NetworkPolicy as FetchPolicy};

use super::data::DataArgs;

/// Which sandbox commands run in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum SandboxMode {
    /// `native` where this host gives it (Linux with user namespaces), else none, said loudly.
    #[default]
    Auto,
    /// Namespaces, a new root, Landlock, seccomp, cgroups; refuse to start without them.
    Native,
    /// Plain child processes with limits: NO isolation (development only).
    Local,
    /// No sandbox: `exec`, `terminal` and command tools are not offered.
    Off,
}

/// What the host-side `fetch` tool may reach (`--fetch-network`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FetchNetwork {
    /// The `--allow-domain` hosts, as for sandboxes; off when none is given.
    #[default]
    AllowList,
    /// Nothing: `fetch` refuses every URL.
    Off,
    /// Any host at a public address (the `--allow-domain` hosts also at private ones with
    /// `--allow-private`).
    Public,
}

/// One network policy for sessions' sandboxes and the host-side `fetch` tool (serve, run, chat).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args, Serialize, Deserialize)]
pub(crate) struct NetworkArgs {
    /// Let the sessions' sandboxes (through Agentry's filtering proxy) and the `fetch` tool reach
    /// this host (repeatable): `example.com` exactly, `*.example.com` for its subdomains, or an
    /// IP address. Everything else stays unreachable; without any, sandboxes have no network but
    /// their own loopback and `fetch` is off.
    #[arg(
        long = "allow-domain",
        visible_alias = "sandbox-allow-domain",
        value_name = "DOMAIN"
    )]
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) allow_domains: Vec<String>,
    /// Let the `--allow-domain` hosts be at loopback, private or link-local addresses (intranet
    /// services, local development). Off by default, so an allowed name cannot be pointed at
    /// this host, its network or a cloud metadata endpoint.
    #[arg(long, requires = "allow_domains")]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) allow_private: bool,
    /// What `fetch` (which runs on this host) may reach: allow-list (the `--allow-domain`
    /// hosts; off when there are none), off, or public (any host at a public address)
    /// [default: allow-list].
    #[arg(long, value_enum)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fetch_network: Option<FetchNetwork>,
}

impl NetworkArgs {
    /// These flags over saved ones (a session's): flags given win.
    pub(crate) fn over(self, saved: NetworkArgs) -> NetworkArgs {
        if self.allow_domains.is_empty() {
            NetworkArgs {
                allow_domains: saved.allow_domains,
                allow_private: saved.allow_private,
                fetch_network: self.fetch_network.or(saved.fetch_network),
            }
        } else {
            NetworkArgs {
                fetch_network: self.fetch_network.or(saved.fetch_network),
                ..self
            }
        }
    }

    /// The sandboxes' network policy, checked.
    pub(crate) fn sandbox_policy(&self) -> anyhow::Result<NetworkPolicy> {
        let network = if self.allow_domains.is_empty() {
            NetworkPolicy::Off
        } else {
            NetworkPolicy::AllowList {
                domains: self.allow_domains.clone(),
                allow_private: self.allow_private,
            }
        };
        network.validate().context("--allow-domain")?;
        Ok(network)
    }

    /// The `fetch` tool's configuration, checked.
    pub(crate) fn fetch_config(&self) -> anyhow::Result<FetchConfig> {
        let policy = match self.fetch_network.unwrap_or_default() {
            FetchNetwork::Off => FetchPolicy::Off,
            FetchNetwork::AllowList if self.allow_domains.is_empty() => FetchPolicy::Off,
            FetchNetwork::AllowList => FetchPolicy::Allow(self.allow_domains.clone()),
            FetchNetwork::Public => FetchPolicy::Public,
        };
        let config = FetchConfig {
            policy,
            private_hosts: if self.allow_private {
                self.allow_domains.clone()
            } else {
                Vec::new()
            },
            ..FetchConfig::default()
        };
        config.validate().context("--allow-domain")?;
        Ok(config)
    }

    /// Workspaces under `home/workspaces` and, unless `mode` is off, the sandboxes they run in;
    /// sandboxes and `fetch` under these settings.
    pub(crate) fn environment(
        &self,
        mode: SandboxMode,
        home: &Path,
    ) -> anyhow::Result<ToolEnvironment> {
        let network = self.sandbox_policy()?;
        let fetch = self.fetch_config()?;
        let mut environment = environment(mode, network, home)?;
        environment.fetch = fetch;
        Ok(environment)
    }
}

/// The `--sandbox` flag and the network policy of sandboxes and `fetch`.
#[derive(Debug, Clone, Args)]
pub(crate) struct SandboxArgs {
    /// Where model-written commands run: auto (native if this host allows it), native, local
    /// (no isolation) or off.
    #[arg(long = "sandbox", value_enum, default_value_t, env = "AGENTRY_SANDBOX")]
    pub(crate) mode: SandboxMode,
    #[command(flatten)]
    pub(crate) network: NetworkArgs,
    /// Show this host folder read-only inside every sandbox, at the same path (repeatable): for
    /// programs installed outside the system folders, such as a stdio MCP server's virtualenv
    /// or npm project.
    #[arg(long = "sandbox-ro-mount", value_name = "PATH")]
    pub(crate) ro_mounts: Vec<std::path::PathBuf>,
    /// Show the host's /usr/local inside sandboxes (hidden by default: it often holds the
    /// host's own tools and their configuration; show single folders with --sandbox-ro-mount).
    #[arg(
        long = "sandbox-show-usr-local",
        env = "AGENTRY_SANDBOX_SHOW_USR_LOCAL"
    )]
    pub(crate) show_usr_local: bool,
    /// Let commands run on the host, WITHOUT ISOLATION: command tools and stdio MCP servers that
    /// say "host": true, and all of them when there is no sandbox. Off by default: those are
    /// refused. With it, registering a stdio MCP server over HTTP needs an API key.
    #[arg(long = "allow-host-commands", env = "AGENTRY_ALLOW_HOST_COMMANDS")]
    pub(crate) allow_host_commands: bool,
    /// The folder sessions' workspaces live in (default: `workspaces` in the data folder). On
    /// a cluster, give every node the same shared folder (a network or shared volume): a node
    /// takes over a dead node's runs only when their workspaces are on its volume.
    #[arg(long = "workspaces", value_name = "DIR", env = "AGENTRY_WORKSPACES")]
    pub(crate) workspaces: Option<std::path::PathBuf>,
    /// The Python that runs the code interpreter's kernels inside sandboxes
    /// (`POST /v1/sandboxes/{id}/code`), as a sandbox sees it: one with `ipykernel` (and
    /// whatever the code imports: pandas, matplotlib…), e.g. a virtualenv's `bin/python` shown
    /// with --sandbox-ro-mount [default: the sandbox's python3].
    #[arg(
        long = "kernel-python",
        value_name = "PATH",
        env = "AGENTRY_KERNEL_PYTHON"
    )]
    pub(crate) kernel_python: Option<String>,
}

impl SandboxArgs {
    /// Workspaces under `home/workspaces` and, unless off, the sandboxes they run in; `fetch`
    /// under the same network settings.
    pub(crate) fn environment(&self, home: &Path) -> anyhow::Result<ToolEnvironment> {
        for mount in &self.ro_mounts {
            anyhow::ensure!(
                mount.is_absolute(),
                "--sandbox-ro-mount {}: the path must be absolute",
                mount.display()
            );
            anyhow::ensure!(
                mount.exists(),
                "--sandbox-ro-mount {}: no such file or folder",
                mount.display()
            );
        }
        let network = self.network.sandbox_policy()?;
        let fetch = self.network.fetch_config()?;
        let mut tools = environment_with(
            self.mode,
            network,
            Mounts {
                read_only: self.ro_mounts.clone(),
                show_usr_local: self.show_usr_local,
            },
            home,
            self.workspaces.as_deref(),
        )?;
        tools.fetch = fetch;
        tools.allow_host_commands = self.allow_host_commands;
        tools.kernel_python = self.kernel_python.clone();
        Ok(tools)
    }
}

/// The line `agentry serve` prints about `fetch`.
pub(crate) fn fetch_line(config: &FetchConfig) -> String {
    let reach = match &config.policy {
        FetchPolicy::Off => {
            return "fetch: off (--allow-domain HOST or --fetch-network public turns it on)"
                .to_owned();
        }
        FetchPolicy::Allow(hosts) => format!("fetch: {} allowed host(s)", hosts.len()),
        FetchPolicy::Public => "fetch: public hosts".to_owned(),
        FetchPolicy::Any => "fetch: any host".to_owned(),
    };
    if config.private_hosts.is_empty() {
        format!("{reach}, public addresses only")
    } else {
        format!("{reach}; the --allow-domain hosts also at private addresses")
    }
}

/// Workspaces under `home/workspaces` and, unless `mode` is off, the sandboxes they run in,
/// with `network`. Host commands are not allowed.
pub(crate) fn environment(
    mode: SandboxMode,
    network: NetworkPolicy,
    home: &Path,
) -> anyhow::Result<ToolEnvironment> {
    environment_with(mode, network, Mounts::default(), home, None)
}

/// What sandboxes see of the host beyond the system folders.
#[derive(Debug, Default)]
struct Mounts {
    /// Host folders shown read-only at the same paths.
    read_only: Vec<std::path::PathBuf>,
    /// Whether the host's `/usr/local` is shown (hidden by default).
    show_usr_local: bool,
}

/// [`environment`], with `mounts` in every sandbox and the workspaces in `workspaces` when
/// given; sandboxed stdio MCP servers get their workspaces under `home/mcp-workspaces`.
fn environment_with(
    mode: SandboxMode,
    network: NetworkPolicy,
    mounts: Mounts,
    home: &Path,
    workspaces: Option<&Path>,
) -> anyhow::Result<ToolEnvironment> {
    {
        let workspaces = match workspaces {
            Some(folder) => {
                anyhow::ensure!(
                    folder.is_absolute(),
                    "--workspaces {}: the path must be absolute",
                    folder.display()
                );
                folder.to_path_buf()
            }
            None => home.join("workspaces"),
        };
        std::fs::create_dir_all(&workspaces)
            .with_context(|| format!("cannot create {}", workspaces.display()))?;
        let kind = match mode {
            SandboxMode::Off => None,
            SandboxMode::Local => Some(BackendKind::Local),
            SandboxMode::Native => Some(BackendKind::Native),
            SandboxMode::Auto => {
                let capabilities = Capabilities::probe();
                if capabilities.native_available {
                    Some(BackendKind::Native)
                } else {
                    eprintln!(
                        "agentry: warning: no sandbox ({}); exec, terminal and command tools are \
                         off (see `agentry doctor`; --sandbox local runs them without isolation)",
                        capabilities.warnings.join("; ")
                    );
                    None
                }
            }
        };
        let sandboxes = match kind {
            None => None,
            Some(kind) => {
                let backend = backend(SandboxConfig {
                    backend: kind,
                    ..SandboxConfig::default()
                })
                .context("cannot start the sandbox backend (see `agentry doctor`)")?;
                let mut template = SandboxSpec::new(&workspaces);
                template.network = network;
                template.ro_mounts = mounts.read_only;
                template.hide_usr_local = !mounts.show_usr_local;
                Some(SandboxPool::new(backend, template))
            }
        };
        Ok(ToolEnvironment {
            workspaces: Some(workspaces),
            sandboxes,
            sandbox_root: Some(home.join("sandboxes")),
            mcp_workspaces: Some(home.join("mcp-workspaces")),
            ..ToolEnvironment::default()
        })
    }
}

/// The id of the volume `workspaces` is on: `.agentry-volume` in it, made once. Nodes that see
/// the same id share their sessions' files.
pub(crate) fn workspace_volume(workspaces: &Path) -> anyhow::Result<String> {
    let marker = workspaces.join(".agentry-volume");
    let fresh = agentry_types::RunId::new().to_string();
    // Created exclusively: two nodes starting on a new shared folder agree on the first id.
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&marker)
    {
        Ok(mut file) => {
            use std::io::Write as _;
            file.write_all(fresh.as_bytes())
                .with_context(|| format!("cannot write {}", marker.display()))?;
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(error) => {
            return Err(error).with_context(|| format!("cannot create {}", marker.display()));
        }
    }
    // A reader racing the writer may see it empty for a moment.
    for _ in 0..50 {
        let id = std::fs::read_to_string(&marker)
            .with_context(|| format!("cannot read {}", marker.display()))?;
        let id = id.trim();
        if !id.is_empty() {
            anyhow::ensure!(
                id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
                "{} does not hold a volume id",
                marker.display()
            );
            return Ok(id.to_owned());
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    anyhow::bail!("{} stays empty", marker.display())
}

/// `agentry doctor` arguments.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Also start a native sandbox and run `echo` in it (the real end-to-end check).
    #[arg(long)]
    try_sandbox: bool,
}

/// Prints what isolation this host gives; exits non-zero when the native sandbox is unusable.
pub(crate) async fn doctor(args: DoctorArgs, data: &DataArgs) -> anyhow::Result<ExitCode> {
    let capabilities = Capabilities::probe();
    let trial = if args.try_sandbox && capabilities.native_available {
        Some(try_sandbox(data).await)
    } else {
        None
    };
    if args.json {
        let mut report = serde_json::json!({ "capabilities": capabilities });
        if let Some(trial) = &trial {
            report["trial"] = match trial {
                Ok(report) => serde_json::json!({"ok": true, "sandbox": report}),
                Err(error) => serde_json::json!({"ok": false, "error": format!("{error:#}")}),
            };
        }
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let yes = |b: bool| if b { "yes" } else { "no" };
        println!("sandbox capabilities of this host ({}):", capabilities.os);
        println!("  running as root:   {}", yes(capabilities.running_as_root));
        println!("  user namespaces:   {}", yes(capabilities.user_namespaces));
        println!(
            "  Landlock:          {}",
            capabilities
                .landlock_abi
                .map_or_else(|| "no".to_owned(), |abi| format!("ABI {abi}"))
        );
        println!("  seccomp:           {}", yes(capabilities.seccomp));
        println!("  cgroups:           {:?}", capabilities.cgroup);
        println!("  limits enforced by {:?}", capabilities.limits);
        println!(
            "  native sandbox:    {}",
            if capabilities.native_available {
                "available (the default)"
            } else {
                "UNAVAILABLE"
            }
        );
        for warning in &capabilities.warnings {
            println!("  warning: {warning}");
        }
        match &trial {
            Some(Ok(report)) => println!(
                "  trial sandbox:     ok (outer uid {}, limits {:?}, {} warning(s))",
                report.outer_uid,
                report.limits,
                report.warnings.len()
            ),
            Some(Err(error)) => println!("  trial sandbox:     FAILED: {error:#}"),
            None => {}
        }
    }
    let ok = capabilities.native_available && trial.as_ref().is_none_or(Result::is_ok);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Starts a native sandbox on a scratch workspace and runs `echo` in it.
async fn try_sandbox(
    data: &DataArgs,
) -> anyhow::Result<agentry_app::domain::sandbox::SandboxReport> {
    let home = data.home()?;
    std::fs::create_dir_all(&home)?;
    let scratch = home.join("workspaces").join(".doctor");
    let backend = backend(SandboxConfig::default())?;
    let sandbox = backend.create(SandboxSpec::new(&scratch)).await?;
    let output = sandbox
        .run(agentry_app::domain::sandbox::ExecRequest::new([
            "echo",
            "sandbox ok",
        ]))
        .await;
    let report = sandbox.report().clone();
    sandbox.close().await;
    let _ = std::fs::remove_dir_all(&scratch);
    let output = output?;
    anyhow::ensure!(
        output.status.success() && output.stdout_str() == "sandbox ok\n",
        "echo in the sandbox gave {:?} ({:?})",
        output.stdout_str(),
        output.status
    );
    Ok(report)
}
