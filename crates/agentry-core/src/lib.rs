//! Agentry's run engine.
//!
//! A run turns a request into rounds of (model call → the round's tool calls, in parallel) until
//! the model answers. The engine ([`engine`]) is a state machine that does no IO: given the run's
//! state it decides the next step, and the driver ([`driver`]) performs it with tokio and feeds
//! the outcome back. The run state serialises, so a run can be resumed later or elsewhere.
//!
//! Around it: the tool contract and registry ([`tool`]), skills ([`skill`]), prompt templates
//! ([`template`]), loop detection ([`loop_guard`]), the history repair pass ([`repair`]),
//! durable sessions ([`session`]), and the embeddable [`Runtime`]. The run's workspace
//! confinement ([`workspace`]), network narrowings ([`network`]) and sub-run contract
//! ([`subrun`]) are what the tools build on; the built-in tools themselves are in the
//! `agentry-tools` crate, which core does not depend on.

pub mod access;
pub mod approval;
pub mod budget;
mod compactor;
pub mod context;
pub mod driver;
pub mod engine;
pub mod events;
pub mod fallback;
pub mod file_refs;
pub mod group;
pub mod loop_guard;
pub mod media;
pub mod network;
pub mod repair;
pub mod runtime;
pub mod session;
pub mod skill;
pub mod subrun;
pub mod telemetry;
pub mod template;
pub mod tool;
pub mod workspace;

pub use budget::{BudgetGate, BudgetQuery};
pub use engine::{DEFAULT_MAX_TOOL_ROUNDS, Phase, RunLimits, RunState, Step, ToolOutcome};
pub use fallback::FallbackModelClient;
pub use loop_guard::LoopLimits;
pub use runtime::{Input, RunError, RunOutput, RunRequest, RunStream, Runtime, RuntimeBuilder};
