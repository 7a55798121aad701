//! Spending budgets: what a run asks before each model call.
//!
//! The engine knows what a call costs only once it is made ([`agentry_types::ModelPrice`]);
//! whether an agent's or an API key's budget is spent is the application's to say, from what
//! every run recorded. A runtime with a [`BudgetGate`] asks it before each model call of each
//! run; a run whose budget is used up stops there with
//! [`RunStopReason::BudgetExceeded`](agentry_types::RunStopReason::BudgetExceeded), its note
//! saying which budget.

use futures::future::BoxFuture;

use agentry_types::{RunId, SessionId};

/// The run a budget check is for.
#[derive(Debug, Clone, Copy)]
pub struct BudgetQuery<'a> {
    /// The run.
    pub run_id: RunId,
    /// Its session, when it has one (the session's owner is the API key it is charged to).
    pub session: Option<SessionId>,
    /// The saved agent it runs as.
    pub agent_id: Option<&'a str>,
}

/// Says whether a run may make another model call.
pub trait BudgetGate: Send + Sync + 'static {
    /// `Some(note)` when a budget that applies to the run is used up (the note names it and
    /// what was spent); `None` when the run may go on. A gate that cannot tell (its store is
    /// unreachable) lets the run go on and says so in its own log.
    fn exceeded<'a>(&'a self, run: BudgetQuery<'a>) -> BoxFuture<'a, Option<String>>;
}
