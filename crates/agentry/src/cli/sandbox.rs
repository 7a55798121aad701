//! Choosing the sandbox backend (`--sandbox`), the tool environment built from it (sessions'
//! workspaces under the data folder, their sandboxes), and `agentry doctor`, which says what
//! isolation this host gives.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

use agentry_sandbox::{
    BackendKind, Capabilities, NetworkPolicy, SandboxConfig, SandboxPool, SandboxSpec, backend,
};
use agentry_server::ToolEnvironment;

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

/// The `--sandbox` flag.
#[derive(Debug, Clone, Args)]
pub(crate) struct SandboxArgs {
    /// Where model-written commands run: auto (native if this host allows it), native, local
    /// (no isolation) or off.
    #[arg(long = "sandbox", value_enum, default_value_t, env = "AGENTRY_SANDBOX")]
    pub(crate) mode: SandboxMode,
    /// Let the sessions' sandboxes reach this domain (repeatable; `*.example.com` for its
    /// subdomains) through Agentry's filtering proxy; everything else stays unreachable. By
    /// default sandboxes have no network but their own loopback.
    #[arg(long = "sandbox-allow-domain", value_name = "DOMAIN")]
    pub(crate) allow_domains: Vec<String>,
    /// Show this host folder read-only inside every sandbox, at the same path (repeatable): for
    /// programs installed outside the system folders, such as a stdio MCP server's virtualenv
    /// or npm project.
    #[arg(long = "sandbox-ro-mount", value_name = "PATH")]
    pub(crate) ro_mounts: Vec<std::path::PathBuf>,
    /// Let commands run on the host, WITHOUT ISOLATION: command tools and stdio MCP servers that
    /// say "host": true, and all of them when there is no sandbox. Off by default: those are
    /// refused. With it, registering a stdio MCP server over HTTP needs an API key.
    #[arg(long = "allow-host-commands", env = "AGENTRY_ALLOW_HOST_COMMANDS")]
    pub(crate) allow_host_commands: bool,
}

impl SandboxArgs {
    /// Workspaces under `home/workspaces` and, unless off, the sandboxes they run in.
    pub(crate) fn environment(&self, home: &Path) -> anyhow::Result<ToolEnvironment> {
        let network = if self.allow_domains.is_empty() {
            NetworkPolicy::Off
        } else {
            NetworkPolicy::allow_list(self.allow_domains.clone())
        };
        network.validate().context("--sandbox-allow-domain")?;
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
        let mut tools = environment_with(self.mode, network, self.ro_mounts.clone(), home)?;
        tools.allow_host_commands = self.allow_host_commands;
        Ok(tools)
    }
}

/// Workspaces under `home/workspaces` and, unless `mode` is off, the sandboxes they run in,
/// with `network`. Host commands are not allowed.
pub(crate) fn environment(
    mode: SandboxMode,
    network: NetworkPolicy,
    home: &Path,
) -> anyhow::Result<ToolEnvironment> {
    environment_with(mode, network, Vec::new(), home)
}

/// [`environment`], with `ro_mounts` shown read-only in every sandbox; sandboxed stdio MCP
/// servers get their workspaces under `home/mcp-workspaces`.
fn environment_with(
    mode: SandboxMode,
    network: NetworkPolicy,
    ro_mounts: Vec<std::path::PathBuf>,
    home: &Path,
) -> anyhow::Result<ToolEnvironment> {
    {
        let workspaces = home.join("workspaces");
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
                template.ro_mounts = ro_mounts;
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
async fn try_sandbox(data: &DataArgs) -> anyhow::Result<agentry_sandbox::SandboxReport> {
    let home = data.home()?;
    std::fs::create_dir_all(&home)?;
    let scratch = home.join("workspaces").join(".doctor");
    let backend = backend(SandboxConfig::default())?;
    let sandbox = backend.create(SandboxSpec::new(&scratch)).await?;
    let output = sandbox
        .run(agentry_sandbox::ExecRequest::new(["echo", "sandbox ok"]))
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
