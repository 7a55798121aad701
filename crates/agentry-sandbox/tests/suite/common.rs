//! Helpers shared by the suite.

use std::path::PathBuf;
use std::sync::Arc;

use agentry_sandbox::{
    Backend, BackendKind, ExecOutput, ExecRequest, Sandbox, SandboxConfig, SandboxSpec,
};

/// The agent executable this crate builds for its tests.
pub fn init_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_agentry-sandbox-init"))
}

pub fn native() -> Arc<dyn Backend> {
    agentry_sandbox::backend(SandboxConfig {
        backend: BackendKind::Native,
        init_exe: Some(init_exe()),
        ..SandboxConfig::default()
    })
    .unwrap()
}

pub fn local() -> Arc<dyn Backend> {
    agentry_sandbox::backend(SandboxConfig {
        backend: BackendKind::Local,
        init_exe: Some(init_exe()),
        ..SandboxConfig::default()
    })
    .unwrap()
}

/// A sandbox around a fresh workspace (the tempdir lives as long as the returned guard).
pub async fn sandbox_with(spec: impl FnOnce(&mut SandboxSpec)) -> (Sandbox, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut s = SandboxSpec::new(dir.path());
    spec(&mut s);
    let sb = native().create(s).await.unwrap();
    (sb, dir)
}

pub async fn sandbox() -> (Sandbox, tempfile::TempDir) {
    sandbox_with(|_| {}).await
}

pub async fn sh(sb: &Sandbox, script: &str) -> ExecOutput {
    sb.run(ExecRequest::shell(script).timeout(std::time::Duration::from_secs(20)))
        .await
        .unwrap()
}

/// Runs a Python snippet inside (the host's /usr/bin/python3, seen through the read-only /usr).
pub async fn py(sb: &Sandbox, code: &str) -> ExecOutput {
    sb.run(
        ExecRequest::new(["/usr/bin/python3", "-c", code])
            .timeout(std::time::Duration::from_secs(20)),
    )
    .await
    .unwrap()
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}
