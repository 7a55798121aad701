//! Agentry's sandboxes: where model-written commands run.
//!
//! - [`Backend`] makes [`Sandbox`]es; [`backend`] picks one from a [`SandboxConfig`]:
//!   - [`NativeBackend`] (Linux, the default): one long-lived sandbox whose PID 1 is this
//!     program re-executed in init mode ([`init::maybe_run_init`]) inside new user, mount, pid,
//!     net, ipc, uts and cgroup namespaces; a tmpfs root with read-only system folders, a
//!     synthesised /etc, a fresh /proc, a minimal /dev, a size-capped /tmp and the workspace
//!     read-write; Landlock, a seccomp deny-list, `no_new_privs`, every capability dropped; an
//!     unprivileged outer uid when the runtime is root (never root); an empty environment;
//!     limits through cgroup v2, else v1, else rlimits; network off (loopback only), or
//!     an allow-list of domains reached through a host-side HTTP proxy ([`NetworkPolicy`]).
//!   - [`LocalBackend`]: plain child processes with rlimits and timeouts, for development. It
//!     isolates **nothing**.
//! - [`Capabilities::probe`] says what isolation the host gives; every sandbox's
//!   [`SandboxReport`] says what it got, so a weaker fallback is never silent.
//! - A [`Sandbox`] offers exec (streaming stdout/stderr, stdin, background processes, timeouts,
//!   kill with every descendant, exit codes; a long-lived command as a byte stream with
//!   [`ExecHandle::into_stdio`], for programs spoken to over stdio), files (read, write, list, stat, remove, mkdir,
//!   resolved inside the sandbox by its agent, under its policy, so symlinks cannot escape), an
//!   idle timeout, a wall-time limit, and close. A crash of the runtime kills its sandboxes
//!   (`PR_SET_PDEATHSIG` from the runtime to the keeper to PID 1, whose death empties the pid
//!   namespace).
//!
//! A binary that starts native or local sandboxes must call [`init::maybe_run_init`] first thing
//! in `main` (or point [`SandboxConfig::init_exe`] at one that does).

#![cfg_attr(not(target_os = "linux"), allow(unused))]

mod backend;
mod cgroup;
mod conn;
mod error;
mod exit;
pub mod init;
mod launch;
mod policy;
mod pool;
mod protocol;
mod proxy;
mod report;
mod sandbox;
mod sys;
mod tty;

pub use backend::{Backend, LocalBackend, NativeBackend, backend};
pub use cgroup::ResourceUsage;
pub use error::{Result, SandboxError};
pub use exit::ExitStatus;
pub use policy::{
    BackendKind, DEFAULT_CPU_PERCENT, DEFAULT_WALL_TIME, ExecRequest, IdleAction, Limits,
    NetworkPolicy, SandboxConfig, SandboxSpec,
};
pub use pool::{DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_SANDBOXES, SandboxPool};
pub use proxy::{AllowList, is_public as is_public_address};
pub use report::{
    Capabilities, CgroupSupport, DirEntry, FileKind, FileStat, InitReport, LimitsMode, NetworkMode,
    NetworkReport, SandboxReport,
};
pub use sandbox::{ExecEvent, ExecHandle, ExecOutput, ExecStdout, InUse, Sandbox};
pub use tty::{TtyProcess, TtySize};
