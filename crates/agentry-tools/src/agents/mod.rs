//! Tools that run other agents: `delegate` (a sub-agent with its own model and a subset of the
//! caller's tools) and `talk_to` (a message to saved agents, run in parallel).
//!
//! Each child run is a run in its own session, linked to its caller by a
//! [`ChildLink`](agentry_core::subrun::ChildLink) (parent session and run, the call id, the
//! depth). The engine does not know where saved agents live or how sessions are created: the
//! embedder implements [`SubRuns`] (the contract lives in [`agentry_core::subrun`]; the server
//! implements it over its store and `SessionManager`) and hands it to [`delegation_tools`]. A
//! child's events reach the caller's clients live as [`RunEvent::Nested`]; its final answer is
//! the tool's result; cancelling the caller cancels the child, and runs nest at most
//! [`DelegationConfig::max_depth`] deep.

use std::sync::Arc;
use std::time::Duration;

use agentry_types::{RunEvent, RunId, RunStopReason, SessionId, ToolSpec};
use futures::StreamExt;

use agentry_core::subrun::{ChildRun, SubRuns};
use agentry_core::tool::{CallerInfo, Tool, ToolContext, ToolError};

pub mod delegate;
pub mod talk_to;

pub use delegate::DelegateTool;
pub use talk_to::TalkToTool;

/// The `delegate` tool's name.
pub const DELEGATE: &str = "delegate";
/// The `talk_to` tool's name.
pub const TALK_TO: &str = "talk_to";

/// How deep sub-runs may nest, how long one may take, and how many agents one `talk_to` may
/// address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DelegationConfig {
    /// The deepest a child run may be: a top-level run is at depth 0, its children at 1. A run
    /// at this depth gets an error result from `delegate` and `talk_to`.
    pub max_depth: u32,
    /// How long one `delegate` or `talk_to` call may run (its children are cancelled then).
    pub timeout: Duration,
    /// Most agents one `talk_to` call may address (after labels are expanded).
    pub max_targets: usize,
}

impl Default for DelegationConfig {
    fn default() -> Self {
        Self {
            max_depth: 3,
            timeout: Duration::from_secs(30 * 60),
            max_targets: 8,
        }
    }
}

/// The `delegate` and `talk_to` tools over `runs`.
pub fn delegation_tools(runs: Arc<dyn SubRuns>, config: DelegationConfig) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(DelegateTool::new(Arc::clone(&runs), config)),
        Arc::new(TalkToTool::new(runs, config)),
    ]
}

/// The calling run, or an error for a call outside any run.
fn caller_of(context: &ToolContext, tool: &str) -> Result<Arc<CallerInfo>, ToolError> {
    context
        .caller
        .clone()
        .ok_or_else(|| ToolError::Failed(format!("`{tool}` can only be called inside a run")))
}

/// The depth a child of the caller would have, or an error at the depth limit.
async fn child_depth(
    runs: &Arc<dyn SubRuns>,
    caller: &CallerInfo,
    config: &DelegationConfig,
) -> Result<u32, ToolError> {
    let depth = match caller.session {
        Some(session) => runs.depth_of(session).await?,
        None => 0,
    };
    if depth >= config.max_depth {
        return Err(ToolError::Failed(format!(
            "the delegation depth limit ({}) is reached: this run is at depth {depth} and cannot \
             start sub-agents; do the work yourself",
            config.max_depth
        )));
    }
    Ok(depth + 1)
}

/// A Markdown table of tools (name and the first line of each description).
fn tool_table(tools: &[ToolSpec]) -> String {
    let mut table = String::from("| tool | description |\n|---|---|\n");
    for tool in tools {
        let description: String = tool
            .description
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect();
        table.push_str(&format!(
            "| {} | {} |\n",
            tool.name,
            description.replace('|', "\\|").trim()
        ));
    }
    table
}

/// How a child run ended.
#[derive(Debug, Clone)]
struct ChildOutcome {
    session_id: SessionId,
    run_id: Option<RunId>,
    stop_reason: Option<RunStopReason>,
    text: String,
    error: Option<String>,
}

impl ChildOutcome {
    fn completed(&self) -> bool {
        self.stop_reason == Some(RunStopReason::Completed) && self.error.is_none()
    }

    /// Why the child did not complete, for the model.
    fn failure(&self) -> String {
        if let Some(error) = &self.error {
            return format!("{error} (session {})", self.session_id);
        }
        let reason = self.stop_reason.map_or("unknown", RunStopReason::as_str);
        let mut message = format!(
            "the sub-agent stopped before finishing ({reason}) in session {}",
            self.session_id
        );
        if !self.text.is_empty() {
            message.push_str(&format!("; its last words: {}", self.text));
        }
        message
    }

    fn link(&self, depth: u32, agent_id: Option<&str>) -> serde_json::Value {
        let mut link = serde_json::json!({
            "session_id": self.session_id,
            "run_id": self.run_id,
            "depth": depth,
            "stop_reason": self.stop_reason.map(RunStopReason::as_str),
        });
        if let Some(agent) = agent_id {
            link["agent_id"] = serde_json::json!(agent);
        }
        if !self.completed() {
            link["error"] = serde_json::json!(self.failure());
        }
        link
    }
}

/// Follows a child run to its end, forwarding its events to the caller's clients as
/// [`RunEvent::Nested`]; cancels the child when the caller's call is cancelled.
async fn follow(
    child: ChildRun,
    context: &ToolContext,
    depth: u32,
    agent_id: Option<String>,
) -> ChildOutcome {
    let ChildRun {
        session_id,
        mut events,
        cancel,
    } = child;
    // A call dropped before the child ends (its timeout, the caller's end) cancels the child.
    let _cancel_on_drop = cancel.clone().drop_guard();
    let mut outcome = ChildOutcome {
        session_id,
        run_id: None,
        stop_reason: None,
        text: String::new(),
        error: None,
    };
    let mut cancelled = false;
    loop {
        let event = tokio::select! {
            biased;
            () = context.cancel.cancelled(), if !cancelled => {
                cancelled = true;
                cancel.cancel();
                continue;
            }
            event = events.next() => event,
        };
        let Some(event) = event else { break };
        match &event {
            RunEvent::RunStarted { run_id } => outcome.run_id = Some(*run_id),
            RunEvent::RunFinished {
                stop_reason, text, ..
            } => {
                outcome.stop_reason = Some(*stop_reason);
                outcome.text = text.clone();
            }
            RunEvent::RunFailed {
                stop_reason, error, ..
            } => {
                outcome.stop_reason = Some(*stop_reason);
                outcome.error = Some(format!(
                    "the sub-agent's run failed ({}): {}",
                    error.code.as_str(),
                    error.message
                ));
            }
            RunEvent::RunSuspended { run_id, status, .. } => {
                outcome.error = Some(format!(
                    "the sub-agent's run {run_id} is {} (it waits for a person)",
                    status.as_str()
                ));
            }
            _ => {}
        }
        // The child's committed steps are in its own session; the plain events carry the same.
        if matches!(event, RunEvent::Committed { .. }) {
            continue;
        }
        if let Some(events) = &context.events {
            events
                .emit(RunEvent::Nested {
                    call_id: context.call_id.clone(),
                    session_id,
                    depth,
                    agent_id: agent_id.clone(),
                    event: Box::new(event),
                })
                .await;
        }
    }
    if outcome.stop_reason.is_none() && outcome.error.is_none() {
        outcome.error = Some(if cancelled {
            "the sub-agent's run was cancelled".to_owned()
        } else {
            "the sub-agent's run ended without a result".to_owned()
        });
    }
    outcome
}

/// One line of a title: the first `max` characters of `text`'s first line.
fn title_of(prefix: &str, text: &str, max: usize) -> String {
    let line: String = text
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(max)
        .collect();
    format!("{prefix}: {line}")
}

#[cfg(test)]
mod tests;
