//! The crate's error type.

/// Everything that can go wrong with a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// The host cannot give the isolation the backend needs.
    #[error("sandbox backend unavailable: {0}")]
    Unavailable(String),
    /// Building the sandbox failed.
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    /// The sandbox is gone (closed, killed, or its agent died); `reason` says why.
    #[error("sandbox closed: {reason}")]
    Closed {
        /// Why it closed.
        reason: String,
    },
    /// The request is invalid (empty argv, too large, …).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// An operation inside the sandbox failed (file not found, permission denied, …).
    #[error("{message}")]
    Remote {
        /// The errno inside the sandbox, when there is one.
        errno: Option<i32>,
        /// What failed.
        message: String,
    },
    /// A file is larger than the caller allowed.
    #[error("file too large: more than {limit} bytes")]
    TooLarge {
        /// The limit.
        limit: u64,
    },
    /// A pool already holds its maximum of open sandboxes.
    #[error(
        "{max} sandboxes are open, the most this pool allows: one must close (idle sandboxes \
         close after their idle timeout) before another is made"
    )]
    PoolFull {
        /// The pool's maximum.
        max: usize,
    },
    /// The sandbox is paused: resume it first.
    #[error("the sandbox is paused: resume it first")]
    Paused,
    /// The host cannot do this for this sandbox.
    #[error("not supported here: {0}")]
    Unsupported(String),
    /// A host-side IO error.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

impl SandboxError {
    /// The errno of a failed operation inside the sandbox, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            SandboxError::Remote { errno, .. } => *errno,
            SandboxError::Io(e) => e.raw_os_error(),
            _ => None,
        }
    }
}

impl From<nix::errno::Errno> for SandboxError {
    fn from(e: nix::errno::Errno) -> Self {
        SandboxError::Io(std::io::Error::from(e))
    }
}

/// The crate's result type.
pub type Result<T, E = SandboxError> = std::result::Result<T, E>;
