//! Where stdio servers' processes run: in a sandbox of their own (the default wherever the
//! runtime has sandboxes), on the host (only when the operator allows host commands), or
//! nowhere (refused, with an error naming the setting, before anything is spawned).
//!
//! A sandboxed server gets its own sandbox, made from the runtime's sandbox template (so the
//! operator's network policy, limits and read-only mounts apply), around a workspace folder of
//! its own, `<workspaces>/<server name>`, which it sees read-write at the template's mount point
//! (`/workspace`) and which is its home and default working directory. It sees the host's system
//! folders read-only and nothing else of the host: a server installed elsewhere (a virtualenv
//! under a home folder, an npm project in a checkout) must be made visible with a read-only
//! mount in the template, or run on the host with `"host": true` and host commands allowed. A
//! server that downloads itself when it starts (`npx -y …`, `uvx …`) needs the registry's
//! domains in the network allow-list. Its environment is the sandbox's minimal one (`PATH`,
//! `HOME`, `LANG`, `TMPDIR`) plus the variables its configuration names. The sandbox closes with
//! the connection (a stop, a restart or an exit), killing everything the server started.

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use agentry_sandbox::{Backend, ExecStdout, Sandbox, SandboxSpec};
use tokio::io::{AsyncRead, ReadBuf};

use crate::config::{McpServerConfig, TransportKind};
use crate::error::McpError;

/// What tells a refused server how to be allowed.
pub const NO_SANDBOX_HINT: &str = "stdio servers run in a sandbox, and this runtime has none: \
     start it with `--sandbox native` (or `--sandbox local`, no isolation), or let servers run \
     on the host with `--allow-host-commands`";

/// What tells a refused `"host": true` server how to be allowed.
pub const HOST_FLAG_HINT: &str = "\"host\": true runs the server on the host without isolation, \
     which this runtime does not allow: start it with `--allow-host-commands`, or drop \"host\" to \
     run the server in its sandbox";

/// Sandboxes for stdio servers: one per server, from `template`, around `workspaces/<name>`.
#[derive(Clone)]
pub struct StdioSandbox {
    /// The backend that makes them.
    pub backend: Arc<dyn Backend>,
    /// The specification each is made from (network, limits, read-only mounts); its workspace
    /// is replaced per server and it gets no idle timeout.
    pub template: SandboxSpec,
    /// The folder holding each server's workspace (`<workspaces>/<server name>`).
    pub workspaces: PathBuf,
}

impl std::fmt::Debug for StdioSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StdioSandbox")
            .field("backend", &self.backend.kind())
            .field("workspaces", &self.workspaces)
            .finish_non_exhaustive()
    }
}

/// Where the manager may start stdio servers. The default refuses every stdio server.
#[derive(Clone, Debug, Default)]
pub struct StdioPolicy {
    /// The sandboxes servers run in; `None`: the runtime has no sandbox.
    pub sandbox: Option<StdioSandbox>,
    /// Whether servers may run on the host, unsandboxed: those with `"host": true`, and every
    /// server when there is no sandbox. Only an operator's explicit choice
    /// (`--allow-host-commands`, or a command line run on the operator's own terminal) sets it.
    pub allow_host: bool,
}

/// Where one stdio server runs.
#[derive(Clone, Debug)]
pub(crate) enum Placement {
    /// Not a stdio server.
    Remote,
    /// On the host, as the runtime's user.
    Host,
    /// In a sandbox of its own.
    Sandboxed(Box<StdioSandbox>),
}

impl StdioPolicy {
    /// A policy that runs every stdio server on the host: for the operator's own command line
    /// (`agentry run`, `agentry mcp`), where the operator named the servers to start.
    pub fn host() -> Self {
        Self {
            sandbox: None,
            allow_host: true,
        }
    }

    /// Where the server `name` configured as `config` would run, or why it is refused.
    pub(crate) fn place(
        &self,
        name: &str,
        config: &McpServerConfig,
    ) -> Result<Placement, McpError> {
        if config.transport_kind()? != TransportKind::Stdio {
            return Ok(Placement::Remote);
        }
        let refused = |reason: &str| McpError::HostCommandsRefused {
            server: name.to_owned(),
            reason: reason.to_owned(),
        };
        match (&self.sandbox, config.host, self.allow_host) {
            (_, true, true) | (None, false, true) => Ok(Placement::Host),
            (_, true, false) => Err(refused(HOST_FLAG_HINT)),
            (Some(sandbox), false, _) => Ok(Placement::Sandboxed(Box::new(sandbox.clone()))),
            (None, false, false) => Err(refused(NO_SANDBOX_HINT)),
        }
    }

    /// Checks that the server `name` may start under this policy (nothing is started).
    pub fn check(&self, name: &str, config: &McpServerConfig) -> Result<(), McpError> {
        self.place(name, config).map(drop)
    }

    /// Whether this server would run on the host, unsandboxed (`false` when refused or remote).
    pub fn runs_on_host(&self, name: &str, config: &McpServerConfig) -> bool {
        matches!(self.place(name, config), Ok(Placement::Host))
    }
}

/// A sandboxed server's standard output; dropping it (the connection ended) closes the server's
/// sandbox, killing everything in it.
pub(crate) struct SandboxedStdout {
    pub(crate) reader: ExecStdout,
    pub(crate) sandbox: Sandbox,
}

impl AsyncRead for SandboxedStdout {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().reader).poll_read(cx, buf)
    }
}

impl Drop for SandboxedStdout {
    fn drop(&mut self) {
        self.reader.kill();
        let sandbox = self.sandbox.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { sandbox.close().await });
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sandbox() -> StdioSandbox {
        let backend = agentry_sandbox::backend(agentry_sandbox::SandboxConfig {
            backend: agentry_sandbox::BackendKind::Local,
            ..Default::default()
        })
        .unwrap();
        StdioSandbox {
            backend,
            template: SandboxSpec::new("/nonexistent"),
            workspaces: PathBuf::from("/nonexistent"),
        }
    }

    #[test]
    fn stdio_servers_run_on_the_host_only_when_allowed() {
        let plain = McpServerConfig::stdio("node", ["server.js"]);
        let mut host = plain.clone();
        host.host = true;
        let http = McpServerConfig::http("http://127.0.0.1:1/mcp");
        let policy = |sandbox: bool, allow_host: bool| StdioPolicy {
            sandbox: sandbox.then(sandbox_fn),
            allow_host,
        };
        fn sandbox_fn() -> StdioSandbox {
            sandbox()
        }
        let refused =
            |policy: &StdioPolicy, config: &McpServerConfig| match policy.place("s", config) {
                Err(McpError::HostCommandsRefused { reason, .. }) => Some(reason),
                Err(other) => panic!("unexpected error {other}"),
                Ok(_) => None,
            };
        // The default refuses every stdio server, naming both settings.
        let reason = refused(&StdioPolicy::default(), &plain).unwrap();
        assert!(reason.contains("--sandbox native"), "{reason}");
        assert!(reason.contains("--allow-host-commands"), "{reason}");
        assert!(refused(&StdioPolicy::default(), &http).is_none());
        // A sandbox: plain servers go in it; "host": true still needs the flag.
        assert!(matches!(
            policy(true, false).place("s", &plain),
            Ok(Placement::Sandboxed(_))
        ));
        assert_eq!(
            refused(&policy(true, false), &host).as_deref(),
            Some(HOST_FLAG_HINT)
        );
        // The flag: "host": true runs on the host; plain servers stay in the sandbox.
        assert!(policy(true, true).runs_on_host("s", &host));
        assert!(!policy(true, true).runs_on_host("s", &plain));
        // No sandbox and the flag: everything on the host.
        assert!(policy(false, true).runs_on_host("s", &plain));
        assert!(StdioPolicy::host().runs_on_host("s", &host));
    }
}
