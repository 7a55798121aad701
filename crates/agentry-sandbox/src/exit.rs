//! How a command in a sandbox ended: its code or signal, and why it was stopped.

/// How a command ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitStatus {
    /// The exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
    /// Killed because its timeout ran out.
    pub timed_out: bool,
    /// Killed on request (`ExecHandle::kill`).
    pub killed: bool,
    /// Killed by the out-of-memory killer of the sandbox's memory cgroup.
    pub out_of_memory: bool,
    /// The sandbox went away while the command ran; why.
    pub sandbox_closed: Option<String>,
}

impl ExitStatus {
    /// Exited with code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}
