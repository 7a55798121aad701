//! Durable sessions: runs written through an append-only log, one writer per session, crash
//! recovery.
//!
//! - [`log`]: the [`SessionLog`] trait the engine writes through, and an in-memory log.
//! - [`replay`]: the conversation and the in-flight run, rebuilt from the log.
//! - [`manager`]: [`SessionManager`] — runs a request in a session (the user turn is committed
//!   before the model is called), applies the busy policy when a run is already in progress,
//!   and recovers runs that were in flight when the process stopped.

pub mod log;
pub mod manager;
pub mod replay;

pub use log::{LogError, MemoryLog, NewSessionInfo, SessionLog, SessionStatus};
pub use manager::{
    BusyPolicy, DEFAULT_MAX_QUEUED_RUNS, SessionError, SessionManager, WeakSessionManager,
};
pub use replay::{InFlight, Replay, effective_events, replay};
