//! What waits for a person, and the decisions clients send: the approval list of a run or a
//! session (undecided tool calls and MCP servers' requests for input), a decision body turned
//! into an [`Op`], and the answers the command protocol gives back.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use agentry_core::approval::ApprovalDecision;
use agentry_mcp::ElicitationAnswer;
use agentry_types::{ApprovalVerdict, PendingApproval, RunId, SessionId};

use crate::App;
use crate::error::AppError;
use crate::ops::{Op, OpOutcome};
#[cfg(feature = "openapi")]
use crate::schema::{PendingCall, PendingElicitation};

/// Where to follow a session's runs.
pub fn stream_path(session: SessionId) -> String {
    format!("/v1/sessions/{session}/stream")
}

/// The calls of a run that wait for a decision.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApprovalList {
    /// The run (absent when the session has no waiting run).
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>))]
    pub run_id: Option<RunId>,
    /// Its session.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
    /// `waiting` when calls or elicitations wait; else the session's status.
    pub status: String,
    /// The undecided calls.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<PendingCall>))]
    pub pending: Vec<PendingApproval>,
    /// MCP servers' requests for input waiting (live only).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<PendingElicitation>))]
    pub elicitations: Vec<Value>,
}

/// What the decisions led to.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DecideOutcome {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    /// Its session.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
    /// `running` (every call decided: the run went on) or `waiting` (calls or elicitations
    /// remain).
    pub status: String,
    /// The calls still waiting.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<PendingCall>))]
    pub pending: Vec<PendingApproval>,
    /// The elicitations still waiting.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<PendingElicitation>))]
    pub elicitations: Vec<Value>,
    /// Where to follow the run.
    pub stream: String,
}

impl From<OpOutcome> for DecideOutcome {
    fn from(outcome: OpOutcome) -> Self {
        Self {
            run_id: outcome.run_id,
            session_id: outcome.session_id,
            status: outcome.status.as_str().to_owned(),
            pending: outcome.pending,
            elicitations: outcome.elicitations,
            stream: stream_path(outcome.session_id),
        }
    }
}

/// What a control action did: the body the control routes answer with.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ControlOutcome {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    /// Its session.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
    /// `interrupt`, `pause`, `resume` or `abort`.
    pub action: &'static str,
    /// For `pause`: `pausing` (the run stops before its next model call, then `paused`); for
    /// `resume`: `running`; for `interrupt` and `abort`: `interrupted`.
    pub status: &'static str,
    /// For `abort`: how many queued messages of the session were dropped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dropped_queued: Option<u64>,
    /// Where to follow the run.
    pub stream: String,
}

impl ControlOutcome {
    /// The answer to a control command: the action taken and the status it leads to
    /// (`pausing` until the round ends).
    pub fn new(outcome: &OpOutcome, action: &'static str, status: &'static str) -> Self {
        Self {
            run_id: outcome.run_id,
            session_id: outcome.session_id,
            action,
            status,
            dropped_queued: outcome
                .dropped_queued
                .map(|dropped| u64::try_from(dropped).unwrap_or(u64::MAX)),
            stream: stream_path(outcome.session_id),
        }
    }
}

/// A decision on one waiting call.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// The call's id (`pending[].call.id`).
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub call_id: String,
    /// `approve`, `reject` or `edit`.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^(approve|reject|edit)$"))]
    pub decision: ApprovalVerdict,
    /// Why; for `reject` the model reads it as the call's error result.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(max_length = 4096))]
    pub reason: Option<String>,
    /// For `edit` (required): the arguments to run the call with, checked against the tool's
    /// schema.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub arguments: Option<Value>,
}

/// `POST /v1/runs/{run_id}/approvals`: one decision, or several in `decisions`; or the answer
/// to one MCP elicitation (`elicitation_id`, `decision` `approve` with `content`, or `reject`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct DecideBody {
    /// Several decisions, committed together.
    #[serde(default)]
    pub decisions: Option<Vec<DecisionBody>>,
    /// One decision: the call's id.
    #[serde(default)]
    pub call_id: Option<String>,
    /// One decision: `approve`, `reject` or `edit`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^(approve|reject|edit)$"))]
    pub decision: Option<ApprovalVerdict>,
    /// One decision: why.
    #[serde(default)]
    pub reason: Option<String>,
    /// One decision: edited arguments.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub arguments: Option<Value>,
    /// An MCP elicitation to answer (`elicitations[].elicitation_id`) instead of a call.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(min_length = 1))]
    pub elicitation_id: Option<String>,
    /// The answer to a form elicitation with `approve`: an object matching its
    /// `requested_schema`.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub content: Option<Value>,
}

impl DecideBody {
    /// The command this body asks for about `run_id`: decisions on waiting calls, or the answer
    /// to one MCP elicitation (`elicitation_id`, `decision` `approve` with `content`, or
    /// `reject`).
    pub fn into_op(self, run_id: RunId) -> Result<Op, AppError> {
        if self.elicitation_id.is_none() && self.content.is_none() {
            return Ok(Op::Decide {
                run_id,
                decisions: decisions_of(self)?,
            });
        }
        let body = self;
        let Some(id) = body.elicitation_id else {
            return Err(AppError::bad_request(
                "`content` answers an elicitation: give its `elicitation_id` too",
            ));
        };
        if body.decisions.is_some() || body.call_id.is_some() || body.arguments.is_some() {
            return Err(AppError::bad_request(
                "answer an elicitation (`elicitation_id`, `decision`, `content`) or decide calls, \
             not both in one request",
            ));
        }
        let answer = match body.decision {
            Some(ApprovalVerdict::Approve) => {
                ElicitationAnswer::Accept(body.content.unwrap_or(Value::Null))
            }
            Some(ApprovalVerdict::Reject) if body.content.is_none() => ElicitationAnswer::Decline,
            Some(ApprovalVerdict::Reject) => {
                return Err(AppError::bad_request(
                    "a rejected elicitation takes no `content`",
                ));
            }
            Some(ApprovalVerdict::Edit) => {
                return Err(AppError::bad_request(
                    "an elicitation is answered with `approve` (and `content`) or `reject`, not `edit`",
                ));
            }
            None => return Err(AppError::bad_request("`decision` is required")),
        };
        Ok(Op::AnswerElicitation {
            run_id,
            elicitation_id: id,
            answer,
        })
    }
}

fn decisions_of(body: DecideBody) -> Result<Vec<ApprovalDecision>, AppError> {
    let single = body.call_id.is_some()
        || body.decision.is_some()
        || body.reason.is_some()
        || body.arguments.is_some();
    let list = match (body.decisions, single) {
        (Some(_), true) => {
            return Err(AppError::bad_request(
                "give one decision (`call_id`, `decision`, …) or `decisions`, not both",
            ));
        }
        (Some(list), false) => list,
        (None, true) => vec![DecisionBody {
            call_id: body
                .call_id
                .ok_or_else(|| AppError::bad_request("`call_id` is required"))?,
            decision: body
                .decision
                .ok_or_else(|| AppError::bad_request("`decision` is required"))?,
            reason: body.reason,
            arguments: body.arguments,
        }],
        (None, false) => {
            return Err(AppError::bad_request(
                "no decision: give `call_id` and `decision`, or `decisions`",
            ));
        }
    };
    if list.is_empty() {
        return Err(AppError::bad_request("`decisions` is empty"));
    }
    let mut decisions = Vec::with_capacity(list.len());
    for (index, item) in list.into_iter().enumerate() {
        if decisions
            .iter()
            .any(|d: &ApprovalDecision| d.call_id == item.call_id)
        {
            return Err(AppError::bad_request(format!(
                "call {:?} is decided twice",
                item.call_id
            )));
        }
        let decision = ApprovalDecision {
            call_id: item.call_id,
            decision: item.decision,
            reason: item.reason,
            arguments: item.arguments,
        };
        decision
            .check()
            .map_err(|error| AppError::bad_request(format!("decision {index}: {error}")))?;
        decisions.push(decision);
    }
    Ok(decisions)
}

impl App {
    /// The calls of `run_id` that wait for a person, its open MCP elicitations, and its status.
    pub async fn approvals_of_run(&self, run_id: RunId) -> Result<ApprovalList, AppError> {
        let session = self.locate(run_id).await?;
        let pending = self.pending_of(session, run_id).await?;
        let elicitations = self.parts.elicitations.for_run(run_id);
        let status = if !pending.is_empty() || !elicitations.is_empty() {
            "waiting".to_owned()
        } else if self.parts.hub.is_live(session) {
            "running".to_owned()
        } else {
            self.parts
                .store
                .session(session)
                .await?
                .map_or_else(|| "idle".to_owned(), |record| record.status)
        };
        Ok(ApprovalList {
            run_id: Some(run_id),
            session_id: session,
            status,
            pending,
            elicitations,
        })
    }

    /// The run of `session` that waits for a person (if any), with what waits.
    pub async fn approvals_of_session(&self, session: SessionId) -> Result<ApprovalList, AppError> {
        let record = self
            .parts
            .store
            .session(session)
            .await?
            .ok_or_else(|| AppError::not_found(format!("no session {session}")))?;
        let waiting = self.parts.sessions.pending_approvals(session).await?;
        let (asking_run, elicitations) = self.parts.elicitations.for_session(session);
        let status = if waiting.is_some() || !elicitations.is_empty() {
            "waiting".to_owned()
        } else if self.parts.hub.is_live(session) {
            "running".to_owned()
        } else {
            record.status
        };
        let (run_id, pending) = match waiting {
            Some((run_id, pending)) => (Some(run_id), pending),
            None => (asking_run, Vec::new()),
        };
        Ok(ApprovalList {
            run_id,
            session_id: session,
            status,
            pending,
            elicitations,
        })
    }
}
