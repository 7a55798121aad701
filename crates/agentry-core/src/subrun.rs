//! Sub-runs: what tools that start other agents' runs (`delegate`, `talk_to`, in the
//! `agentry-tools` crate) need from their embedder.
//!
//! Each child run is a run in its own session, linked to its caller by a [`ChildLink`] (parent
//! session and run, the call id, the depth). The engine does not know where saved agents live
//! or how sessions are created: the embedder implements [`SubRuns`] (the server does it over
//! its store and `SessionManager`) and hands it to the tools.

use agentry_types::{RunEvent, RunId, SessionId};
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::runtime::{RunRequest, RunStream};
use crate::tool::ToolError;

/// Where a child run comes from; kept in the child session's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildLink {
    /// The caller's session (`None` when the caller runs without one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_session_id: Option<SessionId>,
    /// The caller's run.
    pub parent_run_id: RunId,
    /// The tool call that started the child.
    pub call_id: String,
    /// The child's depth (1 for a child of a top-level run).
    pub depth: u32,
    /// The tool that started it (`delegate` or `talk_to`).
    pub tool: String,
    /// The saved agent the child runs as, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
}

/// A saved agent a target named, ready to run.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentTarget {
    /// The agent's id.
    pub id: String,
    /// Its display name.
    pub nickname: Option<String>,
    /// Its run (model, tools, system prompt, limits, with `agent_id` set), or why it cannot run
    /// now (a model or tool it names is gone).
    pub request: Result<RunRequest, String>,
}

/// A saved agent as a model may name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentEntry {
    /// Its id.
    pub id: String,
    /// Its display name.
    pub nickname: Option<String>,
    /// Its labels.
    pub labels: Vec<String>,
}

/// A started child run.
pub struct ChildRun {
    /// The child's session.
    pub session_id: SessionId,
    /// Its events, to its end.
    pub events: BoxStream<'static, RunEvent>,
    /// Cancels it (the tool cancels it when its own call is cancelled or dropped).
    pub cancel: CancellationToken,
}

impl ChildRun {
    /// A child run that is `stream` (dropping the events cancels it, like the stream).
    pub fn from_stream(session_id: SessionId, stream: RunStream) -> Self {
        Self {
            session_id,
            cancel: stream.cancel_token(),
            events: Box::pin(stream),
        }
    }
}

/// Why a sub-run could not be looked up or started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubRunError {
    /// Sub-runs are not available here (no session manager).
    #[error("sub-agents are not available: {0}")]
    Unavailable(String),
    /// The lookup or the start failed.
    #[error("{0}")]
    Failed(String),
}

impl From<SubRunError> for ToolError {
    fn from(error: SubRunError) -> Self {
        ToolError::Failed(error.to_string())
    }
}

/// What `delegate` and `talk_to` need from their embedder: saved agents, and child runs in
/// linked sessions.
pub trait SubRuns: Send + Sync + 'static {
    /// The saved agents `target` names: the agent with this id; else those with this nickname
    /// (case-insensitive); else every agent with this label. Empty when none matches.
    fn find_agents(
        &self,
        target: &str,
    ) -> BoxFuture<'static, Result<Vec<AgentTarget>, SubRunError>>;

    /// Every saved agent as `id`, `id (nickname)` and its labels, for telling a model which
    /// targets exist (default: none known).
    fn directory(&self) -> BoxFuture<'static, Result<Vec<AgentEntry>, SubRunError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// The delegation depth of `session`'s runs (0 for a session that is not a child).
    fn depth_of(&self, session: SessionId) -> BoxFuture<'static, Result<u32, SubRunError>>;

    /// Creates a session linked by `link`, titled `title`, and starts `request` in it. The
    /// events must end with the run's final event.
    fn start(
        &self,
        link: ChildLink,
        request: RunRequest,
        title: String,
    ) -> BoxFuture<'static, Result<ChildRun, SubRunError>>;
}
