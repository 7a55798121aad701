//! MCP elicitations waiting for a person: the requests for input that MCP servers send during
//! a run's tool calls. They are listed and answered with the run's approvals
//! (`GET`/`POST /v1/runs/{run_id}/approvals`, with `elicitation_id`), stream to the run's clients
//! as `elicitation_requested` / `elicitation_resolved` events, and make the session's status
//! `waiting` on the status feed until answered.
//!
//! An elicitation lives as long as the tool call that asked: it is not durable (the MCP
//! server's request dies with its connection), and it is withdrawn when the call ends first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use serde_json::{Value, json};
use tokio::sync::mpsc;

use agentry_core::driver::EventSink;
use agentry_core::tool::ToolContext;
use agentry_mcp::{ElicitationAnswer, ElicitationKind, ElicitationRequest};
use agentry_types::{RunEvent, RunId, SessionId};

use crate::hub::{FeedStatus, Hub};

/// Why an answer was refused.
#[derive(Debug, thiserror::Error)]
pub enum ElicitationError {
    /// No such elicitation waits in that run.
    #[error("no elicitation {0:?} waits in this run")]
    NotFound(String),
    /// The answer does not fit the request.
    #[error("{0}")]
    Invalid(String),
}

/// One elicitation waiting.
struct Pending {
    run_id: RunId,
    session: Option<SessionId>,
    call_id: String,
    tool: String,
    created_at_ms: u64,
    request: ElicitationRequest,
    events: Option<EventSink>,
}

impl Pending {
    fn to_json(&self, id: &str) -> Value {
        let mut value = json!({
            "elicitation_id": id,
            "run_id": self.run_id,
            "session_id": self.session,
            "call_id": self.call_id,
            "tool": self.tool,
            "server": self.request.server,
            "message": self.request.message,
            "created_at_ms": self.created_at_ms,
        });
        if let Value::Object(map) = &mut value {
            match &self.request.kind {
                ElicitationKind::Form { requested_schema } => {
                    map.insert("mode".into(), "form".into());
                    map.insert("requested_schema".into(), requested_schema.clone());
                }
                ElicitationKind::Url {
                    url,
                    elicitation_id,
                } => {
                    map.insert("mode".into(), "url".into());
                    map.insert("url".into(), url.clone().into());
                    if !elicitation_id.is_empty() {
                        map.insert(
                            "elicitation_id_on_server".into(),
                            elicitation_id.clone().into(),
                        );
                    }
                }
            }
        }
        value
    }
}

/// The elicitations waiting in this process. Cheap to clone.
#[derive(Clone, Default)]
pub struct Elicitations {
    pending: Arc<Mutex<BTreeMap<String, Pending>>>,
    hub: Arc<RwLock<Option<Hub>>>,
}

impl std::fmt::Debug for Elicitations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elicitations")
            .field("pending", &self.lock().len())
            .finish()
    }
}

fn action_name(answer: &ElicitationAnswer) -> &'static str {
    match answer {
        ElicitationAnswer::Accept(_) => "accept",
        ElicitationAnswer::Decline => "decline",
        ElicitationAnswer::Cancel => "cancel",
    }
}

impl Elicitations {
    /// Lets the registry tell the status feed when a session starts or stops waiting.
    pub fn bind(&self, hub: &Hub) {
        *self.hub.write().unwrap_or_else(PoisonError::into_inner) = Some(hub.clone());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Pending>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn announce(&self, session: Option<SessionId>, status: FeedStatus) {
        let hub = self
            .hub
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let (Some(hub), Some(session)) = (hub, session) {
            hub.announce(session, status);
        }
    }

    /// The run elicitation `id` belongs to, while it waits.
    pub fn run_of(&self, id: &str) -> Option<RunId> {
        self.lock().get(id).map(|pending| pending.run_id)
    }

    /// The elicitations still open that `which` selects, oldest first, with the run of the first.
    fn waiting(&self, which: impl Fn(&Pending) -> bool) -> (Option<RunId>, Vec<Value>) {
        let pending = self.lock();
        let mut list: Vec<(&String, &Pending)> = pending
            .iter()
            .filter(|(_, p)| which(p) && p.request.responder.is_open())
            .collect();
        list.sort_by_key(|(_, p)| p.created_at_ms);
        let run = list.first().map(|(_, p)| p.run_id);
        (run, list.into_iter().map(|(id, p)| p.to_json(id)).collect())
    }

    /// The elicitations of `run` waiting, oldest first.
    pub fn for_run(&self, run: RunId) -> Vec<Value> {
        self.waiting(|p| p.run_id == run).1
    }

    /// The elicitations of `session`'s runs waiting, oldest first, with the run of the first.
    pub fn for_session(&self, session: SessionId) -> (Option<RunId>, Vec<Value>) {
        self.waiting(|p| p.session == Some(session))
    }

    /// Answers elicitation `id` of `run`. A form's content must match its schema.
    pub async fn answer(
        &self,
        run: RunId,
        id: &str,
        answer: ElicitationAnswer,
    ) -> Result<(), ElicitationError> {
        let pending = {
            let mut pending = self.lock();
            match pending.get(id) {
                Some(p) if p.run_id == run => {}
                _ => return Err(ElicitationError::NotFound(id.to_owned())),
            }
            if let (ElicitationAnswer::Accept(content), Some(p)) = (&answer, pending.get(id)) {
                check_content(&p.request.kind, content)?;
            }
            pending
                .remove(id)
                .ok_or_else(|| ElicitationError::NotFound(id.to_owned()))?
        };
        let action = action_name(&answer);
        if !pending.request.responder.answer(answer) {
            return Err(ElicitationError::NotFound(id.to_owned()));
        }
        self.settled(id, &pending, action).await;
        Ok(())
    }

    async fn settled(&self, id: &str, pending: &Pending, action: &str) {
        if let Some(events) = &pending.events {
            events
                .emit(RunEvent::ElicitationResolved {
                    elicitation_id: id.to_owned(),
                    call_id: pending.call_id.clone(),
                    action: action.to_owned(),
                })
                .await;
        }
        let still_waiting = self
            .lock()
            .values()
            .any(|p| p.session == pending.session && p.request.responder.is_open());
        if !still_waiting {
            self.announce(pending.session, FeedStatus::Running);
        }
    }

    async fn register(
        &self,
        context: &ToolContext,
        tool: &str,
        request: ElicitationRequest,
    ) -> Option<String> {
        // Only calls of a run take elicitations (`McpTool` asks for none otherwise).
        let caller = context.caller.as_ref()?;
        let id = uuid::Uuid::now_v7().to_string();
        let (mode, requested_schema, url) = match &request.kind {
            ElicitationKind::Form { requested_schema } => {
                ("form", Some(requested_schema.clone()), None)
            }
            ElicitationKind::Url { url, .. } => ("url", None, Some(url.clone())),
        };
        let event = RunEvent::ElicitationRequested {
            elicitation_id: id.clone(),
            call_id: context.call_id.clone(),
            server: request.server.clone(),
            message: request.message.clone(),
            mode: mode.to_owned(),
            requested_schema,
            url,
        };
        self.lock().insert(
            id.clone(),
            Pending {
                run_id: caller.run_id,
                session: caller.session,
                call_id: context.call_id.clone(),
                tool: tool.to_owned(),
                created_at_ms: crate::clock::now_ms(),
                request,
                events: context.events.clone(),
            },
        );
        self.announce(caller.session, FeedStatus::Waiting);
        if let Some(events) = &context.events {
            events.emit(event).await;
        }
        Some(id)
    }

    /// Runs `call` (an MCP tool call made with `requests`' sender as its elicitation route),
    /// registering each elicitation it receives for `context`'s run and withdrawing those
    /// still waiting when the call ends (or is dropped, when its run is cancelled).
    pub async fn serve<T>(
        &self,
        context: &ToolContext,
        tool: &str,
        mut requests: mpsc::UnboundedReceiver<ElicitationRequest>,
        call: impl Future<Output = T>,
    ) -> T {
        tokio::pin!(call);
        let mut started = Withdraw {
            registry: self.clone(),
            ids: Vec::new(),
        };
        loop {
            tokio::select! {
                outcome = &mut call => break outcome,
                Some(request) = requests.recv() => {
                    started.ids.extend(self.register(context, tool, request).await);
                }
            }
        }
    }
}

/// Withdraws a call's elicitations still waiting when the call is over.
struct Withdraw {
    registry: Elicitations,
    ids: Vec<String>,
}

impl Drop for Withdraw {
    fn drop(&mut self) {
        let left: Vec<(String, Pending)> = {
            let mut pending = self.registry.lock();
            self.ids
                .drain(..)
                .filter_map(|id| pending.remove(&id).map(|p| (id, p)))
                .collect()
        };
        if left.is_empty() {
            return;
        }
        let registry = self.registry.clone();
        // The events go out from a task: a drop cannot wait.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for (id, pending) in left {
                    registry.settled(&id, &pending, "withdrawn").await;
                }
            });
        }
    }
}

/// Checks a form answer against the request's schema (a URL request takes no content).
fn check_content(kind: &ElicitationKind, content: &Value) -> Result<(), ElicitationError> {
    match kind {
        ElicitationKind::Url { .. } => {
            if content.is_null() {
                Ok(())
            } else {
                Err(ElicitationError::Invalid(
                    "a URL elicitation is accepted without `content`".into(),
                ))
            }
        }
        ElicitationKind::Form { requested_schema } => {
            if !content.is_object() {
                return Err(ElicitationError::Invalid(
                    "`content` must be a JSON object matching the request's `requested_schema`"
                        .into(),
                ));
            }
            let validator = jsonschema::validator_for(requested_schema).map_err(|error| {
                ElicitationError::Invalid(format!("the server's schema is not valid: {error}"))
            })?;
            let problems: Vec<String> = validator
                .iter_errors(content)
                .take(5)
                .map(|error| {
                    let at = error.instance_path().as_str().to_owned();
                    if at.is_empty() {
                        error.to_string()
                    } else {
                        format!("{at}: {error}")
                    }
                })
                .collect();
            if problems.is_empty() {
                Ok(())
            } else {
                Err(ElicitationError::Invalid(format!(
                    "`content` does not match the requested schema: {}",
                    problems.join("; ")
                )))
            }
        }
    }
}
