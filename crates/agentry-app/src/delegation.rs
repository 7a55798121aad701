//! Sub-agents: the `delegate` and `talk_to` tools over the store's saved agents (and the remote
//! A2A agents registered as models, `protocol: "a2a"`)
//! and the [`SessionManager`].
//!
//! Each child run gets a session of its own whose metadata holds its link
//! (`{"delegation": {"parent_session_id", "parent_run_id", "call_id", "depth", "tool",
//! "agent_id"}}`); `GET /v1/sessions/{id}` shows it as `delegation` and lists a session's
//! children (found in its `delegate` / `talk_to` results) as `children`. The tools are part of
//! the runtime the manager runs, so they reach the manager through a weak, late-bound handle
//! ([`DelegationHandle::bind`]) rather than keeping it alive.

use std::sync::{Arc, RwLock};

use futures::future::BoxFuture;
use serde_json::{Value, json};

use agentry_core::RunRequest;
use agentry_core::session::{BusyPolicy, SessionManager, WeakSessionManager};
use agentry_core::subrun::{AgentEntry, AgentTarget, ChildLink, ChildRun, SubRunError, SubRuns};
use agentry_core::tool::Tool;
use agentry_store::{NewSession, Store};
use agentry_tools::{DelegationConfig, delegation_tools};
use agentry_types::{RunEvent, SessionEvent, SessionId, ToolResultPart};
use tokio::sync::broadcast::error::RecvError;

use crate::agents::AgentConfig;
use crate::config::ConfigRepo;
use crate::hub::{Hub, Subscription};

/// The key of a child session's link in its metadata.
pub const METADATA_KEY: &str = "delegation";

/// What the delegation tools run with: their limits, and the store and session manager they
/// start child runs through, bound once the server's state exists.
#[derive(Clone, Default)]
pub struct DelegationHandle {
    /// Depth limit, timeout and most targets per `talk_to`.
    pub config: DelegationConfig,
    bound: Arc<RwLock<Option<Bound>>>,
}

/// What the tools reach once the server's state exists.
#[derive(Clone)]
struct Bound {
    store: Store,
    manager: WeakSessionManager,
    hub: Hub,
    skill_roots: Option<Vec<std::path::PathBuf>>,
}

impl std::fmt::Debug for DelegationHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegationHandle")
            .field("config", &self.config)
            .field("bound", &self.bound().is_ok())
            .finish()
    }
}

impl DelegationHandle {
    /// A handle with these limits, not bound yet.
    pub fn new(config: DelegationConfig) -> Self {
        Self {
            config,
            bound: Arc::default(),
        }
    }

    /// Binds the tools to `store`, `manager` (held weakly) and `hub` (where child runs go live,
    /// so their own sessions' clients can follow and abort them).
    pub fn bind(
        &self,
        store: &Store,
        manager: &SessionManager,
        hub: &Hub,
        skill_roots: Option<Vec<std::path::PathBuf>>,
    ) {
        *self
            .bound
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Bound {
            store: store.clone(),
            manager: manager.downgrade(),
            hub: hub.clone(),
            skill_roots,
        });
    }

    fn bound(&self) -> Result<(Bound, SessionManager), SubRunError> {
        let bound = self
            .bound
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        match bound {
            Some(bound) => bound
                .manager
                .upgrade()
                .map(|manager| (bound, manager))
                .ok_or_else(|| SubRunError::Unavailable("the server is shutting down".into())),
            None => Err(SubRunError::Unavailable(
                "this runtime has no session manager to run them in".into(),
            )),
        }
    }

    /// The `delegate` and `talk_to` tools over this handle.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        delegation_tools(Arc::new(self.clone()), self.config)
    }
}

fn failed(error: impl std::fmt::Display) -> SubRunError {
    SubRunError::Failed(error.to_string())
}

/// The saved agents, and the remote A2A agents registered as models (`protocol: "a2a"`) that
/// no saved agent shares an id with: each as an agent on its model, labelled `a2a`.
async fn reachable_agents(store: &Store) -> Result<Vec<AgentConfig>, SubRunError> {
    let mut agents: Vec<AgentConfig> = ConfigRepo::new(store)
        .list()
        .await
        .map_err(|error| failed(error.message))?
        .into_iter()
        .map(|(_, agent)| agent)
        .collect();
    let models: Vec<crate::model_config::ModelConfig> = ConfigRepo::new(store)
        .list()
        .await
        .map_err(|error| failed(error.message))?
        .into_iter()
        .map(|(_, model)| model)
        .collect();
    for model in models {
        if model.protocol != agentry_llm::Protocol::A2a
            || agents.iter().any(|agent| agent.id == model.id)
        {
            continue;
        }
        let remote: AgentConfig = serde_json::from_value(json!({
            "id": model.id,
            "model_id": model.id,
            "labels": ["a2a"],
        }))
        .map_err(failed)?;
        agents.push(remote);
    }
    Ok(agents)
}

/// The saved agents `target` names: by id, else by nickname (case-insensitive), else by label.
fn matching<'a>(agents: &'a [AgentConfig], target: &str) -> Vec<&'a AgentConfig> {
    if let Some(agent) = agents.iter().find(|agent| agent.id == target) {
        return vec![agent];
    }
    let by_nickname: Vec<&AgentConfig> = agents
        .iter()
        .filter(|agent| {
            agent
                .nickname
                .as_deref()
                .is_some_and(|nickname| nickname.eq_ignore_ascii_case(target))
        })
        .collect();
    if !by_nickname.is_empty() {
        return by_nickname;
    }
    agents
        .iter()
        .filter(|agent| agent.labels.iter().any(|label| label == target))
        .collect()
}

impl SubRuns for DelegationHandle {
    fn find_agents(
        &self,
        target: &str,
    ) -> BoxFuture<'static, Result<Vec<AgentTarget>, SubRunError>> {
        let handle = self.clone();
        let target = target.to_owned();
        Box::pin(async move {
            let (
                Bound {
                    store, skill_roots, ..
                },
                manager,
            ) = handle.bound()?;
            let runtime = manager.runtime();
            let agents = reachable_agents(&store).await?;
            let mut targets = Vec::new();
            for agent in matching(&agents, &target) {
                let request = match agent.resolve(&runtime, skill_roots.as_deref()) {
                    Ok(run) => {
                        // Its memories come along (the most recent: the task is not known yet).
                        let mut request = run.request(None);
                        if agent.workspace == crate::agents::WorkspaceScope::Agent {
                            request.workspace = manager.shared_workspace(&agent.id);
                        }
                        match crate::memory::remember(&store, &mut request).await {
                            Ok(()) => Ok(request),
                            Err(error) => Err(error.message),
                        }
                    }
                    Err(error) => Err(error.message),
                };
                targets.push(AgentTarget {
                    id: agent.id.clone(),
                    nickname: agent.nickname.clone(),
                    request,
                });
            }
            Ok(targets)
        })
    }

    fn directory(&self) -> BoxFuture<'static, Result<Vec<AgentEntry>, SubRunError>> {
        let handle = self.clone();
        Box::pin(async move {
            let (Bound { store, .. }, _) = handle.bound()?;
            Ok(reachable_agents(&store)
                .await?
                .into_iter()
                .map(|agent| AgentEntry {
                    id: agent.id,
                    nickname: agent.nickname,
                    labels: agent.labels,
                })
                .collect())
        })
    }

    fn depth_of(&self, session: SessionId) -> BoxFuture<'static, Result<u32, SubRunError>> {
        let handle = self.clone();
        Box::pin(async move {
            let (Bound { store, .. }, _) = handle.bound()?;
            let record = store.session(session).await.map_err(failed)?;
            Ok(record
                .and_then(|record| record.metadata.get(METADATA_KEY)?.get("depth")?.as_u64())
                .map_or(0, |depth| u32::try_from(depth).unwrap_or(u32::MAX)))
        })
    }

    fn start(
        &self,
        link: ChildLink,
        request: RunRequest,
        title: String,
    ) -> BoxFuture<'static, Result<ChildRun, SubRunError>> {
        let handle = self.clone();
        Box::pin(async move {
            let (Bound { store, hub, .. }, manager) = handle.bound()?;
            // Check the model and tools before anything is created.
            manager.runtime().prepare(request.clone()).map_err(failed)?;
            let mut new = NewSession::new();
            new.title = Some(title);
            // A sub-agent's session belongs to whoever owns its caller's.
            if let Some(parent) = link.parent_session_id {
                new.owner = store
                    .session(parent)
                    .await
                    .map_err(failed)?
                    .and_then(|record| record.owner);
            }
            new.metadata = json!({ METADATA_KEY: link });
            let record = store.create_session(new).await.map_err(failed)?;
            // An agent with one workspace: the child's session works in it, resumed or not.
            if let Some(agent) = &link.agent_id
                && request.workspace.is_some()
                && request.workspace == manager.shared_workspace(agent)
            {
                crate::runs::share_workspace(&manager, record.id, agent)
                    .await
                    .map_err(|error| failed(error.message))?;
            }
            match manager.send(record.id, request, BusyPolicy::Reject).await {
                Ok(stream) => {
                    let cancel = stream.cancel_token();
                    let subscription = hub.adopt(record.id, stream);
                    Ok(ChildRun {
                        session_id: record.id,
                        events: Box::pin(events_of(subscription)),
                        cancel,
                    })
                }
                Err(error) => {
                    if let Err(error) = store.delete_session(record.id).await {
                        tracing::warn!(session = %record.id, "could not remove an unused child session: {error}");
                    }
                    Err(failed(error))
                }
            }
        })
    }
}

/// A hub subscription as a stream of events, to the run's end (a subscriber that fell behind
/// skips what it missed).
fn events_of(subscription: Subscription) -> impl futures::Stream<Item = RunEvent> + Send {
    futures::stream::unfold(
        (subscription.events, false),
        |(mut events, ended)| async move {
            if ended {
                return None;
            }
            loop {
                match events.recv().await {
                    Ok(event) => {
                        let last = event.is_terminal();
                        return Some(((*event).clone(), (events, last)));
                    }
                    Err(RecvError::Lagged(skipped)) => {
                        tracing::warn!("a sub-agent's caller missed {skipped} of its events");
                    }
                    Err(RecvError::Closed) => return None,
                }
            }
        },
    )
}

/// The child sessions a session's `delegate` and `talk_to` calls started, in order: the
/// `children` links of their results.
pub fn children(events: &[(u64, SessionEvent)]) -> Vec<Value> {
    let mut found = Vec::new();
    for (_, event) in events {
        let SessionEvent::ToolCallResult { result, .. } = event else {
            continue;
        };
        if !matches!(result.name.as_deref(), Some("delegate" | "talk_to")) {
            continue;
        }
        for part in &result.content {
            if let ToolResultPart::Json { value } = part
                && let Some(links) = value.get("children").and_then(Value::as_array)
            {
                for link in links.iter().filter(|link| link.get("session_id").is_some()) {
                    let mut link = link.clone();
                    link["call_id"] = json!(result.call_id);
                    link["tool"] = json!(result.name);
                    found.push(link);
                }
            }
        }
    }
    found
}
