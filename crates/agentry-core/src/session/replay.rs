//! Rebuilding a session from its log: the conversation, and the run that was in flight.
//!
//! The conversation a model sees is derived from the log, never stored separately. A run with a
//! `run_started` but no `run_finished` was in flight when the process stopped; replay recovers
//! its counters, usage, loop window and working directory, and the tool calls whose intent was
//! committed without a result.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use agentry_types::{Message, PendingApproval, RunId, SessionEvent, ToolCall, Usage};

use crate::approval::ApprovalDecision;

use crate::context::Compaction;
use crate::engine::RunLimits;
use crate::loop_guard::LoopDetector;

/// A session rebuilt from its log.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Replay {
    /// The conversation, in order.
    pub messages: Vec<Message>,
    /// The last event's seq (0 for an empty session).
    pub last_seq: u64,
    /// Runs started in the session.
    pub runs: usize,
    /// The run that started and never finished, if any.
    pub in_flight: Option<InFlight>,
    /// What the latest compaction of the conversation did (see [`crate::context`]).
    pub compaction: Option<Compaction>,
}

/// What a run that never finished had done.
#[derive(Debug, Clone, PartialEq)]
pub struct InFlight {
    /// The run.
    pub run_id: RunId,
    /// Its model id.
    pub model: String,
    /// Its fallback models.
    pub fallback_models: Vec<String>,
    /// The saved agent it runs as.
    pub agent_id: Option<String>,
    /// Names of the tools it offered.
    pub tools: Vec<String>,
    /// Its generation parameters, as recorded.
    pub params: serde_json::Value,
    /// Its guards, as recorded.
    pub limits: serde_json::Value,
    /// Model calls completed.
    pub round: u32,
    /// Rounds whose tools all returned.
    pub tool_rounds: u32,
    /// Tool calls the model asked for (the `max_tool_calls` quota counts them).
    pub tool_calls: u32,
    /// Tokens used.
    pub usage: Usage,
    /// The loop window, replayed.
    pub loops: LoopDetector,
    /// The working directory a skill selected.
    pub working_dir: Option<PathBuf>,
    /// Tool calls whose intent is committed but whose result is not, with their idempotency.
    pub pending: Vec<(ToolCall, bool)>,
    /// Whether the model's last answer asked for no tools (the run only lacks its end event).
    pub answered: bool,
    /// Its approval policy, as recorded (null when nothing waits).
    pub approvals: serde_json::Value,
    /// Its network narrowings, as recorded (null when there are none).
    pub network: serde_json::Value,
    /// Its caller's grant, as recorded (null: everything).
    pub grant: serde_json::Value,
    /// The calls of the current round waiting for (or given) a decision; empty unless the run
    /// waits for approvals.
    pub approval_requests: Vec<PendingApproval>,
    /// The decisions made on them so far, by call id.
    pub decisions: BTreeMap<String, ApprovalDecision>,
    /// The latest round's calls that have no result yet.
    pub unanswered: Vec<ToolCall>,
    /// Whether the run was paused (and not resumed since).
    pub paused: bool,
}

impl InFlight {
    /// Whether the run waits for approvals (some of its round's calls were sent to a person).
    pub fn awaiting_approval(&self) -> bool {
        !self.approval_requests.is_empty()
    }

    /// The calls still waiting for a decision.
    pub fn undecided(&self) -> Vec<PendingApproval> {
        self.approval_requests
            .iter()
            .filter(|p| !self.decisions.contains_key(&p.call.id))
            .cloned()
            .collect()
    }
}

/// The events that make up the session's conversation now: those a later
/// [`SessionEvent::Revoked`] cut off are left out (so are the revocations themselves).
pub fn effective_events(events: &[(u64, SessionEvent)]) -> Vec<&(u64, SessionEvent)> {
    let mut kept: Vec<&(u64, SessionEvent)> = Vec::with_capacity(events.len());
    for entry in events {
        match &entry.1 {
            SessionEvent::Revoked { after_seq, .. } => kept.retain(|(seq, _)| seq <= after_seq),
            _ => kept.push(entry),
        }
    }
    kept
}

/// Rebuilds a session from its events (what revoked turns did is left out: see
/// [`effective_events`]).
pub fn replay(events: &[(u64, SessionEvent)]) -> Replay {
    let mut replay = Replay::default();
    let last_seq = events.last().map_or(0, |(seq, _)| *seq);
    let revoked = events
        .iter()
        .any(|(_, event)| matches!(event, SessionEvent::Revoked { .. }));
    let effective: Vec<&(u64, SessionEvent)> = if revoked {
        effective_events(events)
    } else {
        events.iter().collect()
    };
    let mut intents: BTreeMap<String, (usize, ToolCall, bool)> = BTreeMap::new();
    let mut order = 0usize;
    let mut round_calls: Vec<ToolCall> = Vec::new();
    let mut round_results: BTreeSet<String> = BTreeSet::new();
    for (seq, event) in effective.into_iter() {
        replay.last_seq = *seq;
        match event {
            SessionEvent::RunStarted {
                run_id,
                model,
                tools,
                params,
                limits,
                fallback_models,
                approvals,
                network,
                agent_id,
                grant,
            } => {
                replay.runs += 1;
                intents.clear();
                replay.in_flight = Some(InFlight {
                    run_id: *run_id,
                    model: model.clone(),
                    fallback_models: fallback_models.clone(),
                    agent_id: agent_id.clone(),
                    tools: tools.clone(),
                    params: params.clone(),
                    limits: limits.clone(),
                    round: 0,
                    tool_rounds: 0,
                    tool_calls: 0,
                    usage: Usage::default(),
                    loops: LoopDetector::default(),
                    working_dir: None,
                    pending: Vec::new(),
                    answered: false,
                    approvals: approvals.clone(),
                    network: network.clone(),
                    grant: grant.clone(),
                    approval_requests: Vec::new(),
                    decisions: BTreeMap::new(),
                    unanswered: Vec::new(),
                    paused: false,
                });
                round_calls.clear();
                round_results.clear();
            }
            SessionEvent::Message { message, .. } => replay.messages.push(message.clone()),
            SessionEvent::AssistantMessage {
                run_id,
                round,
                content,
                usage,
                ..
            } => {
                let message = Message::Assistant {
                    content: content.clone(),
                };
                if let Some(run) = replay.in_flight.as_mut().filter(|r| r.run_id == *run_id) {
                    run.round = run.round.max(*round);
                    run.usage.add(usage);
                    let limits: RunLimits =
                        serde_json::from_value(run.limits.clone()).unwrap_or_default();
                    let mut calls = 0;
                    run.approval_requests.clear();
                    run.decisions.clear();
                    round_calls = message.tool_calls().cloned().collect();
                    round_results.clear();
                    for call in message.tool_calls() {
                        run.loops.observe(call, &limits.loops);
                        calls += 1;
                    }
                    run.answered = calls == 0;
                    run.tool_calls = run.tool_calls.saturating_add(calls);
                }
                replay.messages.push(message);
            }
            SessionEvent::ToolCallIntent {
                run_id,
                call,
                idempotent,
            } => {
                order += 1;
                intents.insert(call.id.clone(), (order, call.clone(), *idempotent));
                if let Some(run) = replay.in_flight.as_mut().filter(|r| r.run_id == *run_id) {
                    settle_approvals(run);
                }
            }
            SessionEvent::ApprovalRequested {
                run_id,
                call,
                reason,
            } => {
                if let Some(run) = replay.in_flight.as_mut().filter(|r| r.run_id == *run_id) {
                    run.approval_requests.push(PendingApproval {
                        call: call.clone(),
                        reason: reason.clone(),
                    });
                }
            }
            SessionEvent::ApprovalDecided {
                run_id,
                call_id,
                decision,
                reason,
                arguments,
            } => {
                if let Some(run) = replay.in_flight.as_mut().filter(|r| r.run_id == *run_id) {
                    run.decisions.insert(
                        call_id.clone(),
                        ApprovalDecision {
                            call_id: call_id.clone(),
                            decision: *decision,
                            reason: reason.clone(),
                            arguments: arguments.clone(),
                        },
                    );
                }
            }
            SessionEvent::RunPaused { run_id } => {
                if let Some(run) = replay.in_flight.as_mut().filter(|r| r.run_id == *run_id) {
                    run.paused = true;
                }
            }
            SessionEvent::RunResumed { run_id } => {
                if let Some(run) = replay.in_flight.as_mut().filter(|r| r.run_id == *run_id) {
                    run.paused = false;
                }
            }
            SessionEvent::ToolCallResult {
                run_id,
                result,
                working_dir,
                ..
            } => {
                intents.remove(&result.call_id);
                round_results.insert(result.call_id.clone());
                if let Some(run) = replay.in_flight.as_mut().filter(|r| r.run_id == *run_id) {
                    settle_approvals(run);
                    if working_dir.is_some() {
                        run.working_dir.clone_from(working_dir);
                    }
                    if intents.is_empty() {
                        run.tool_rounds += 1;
                    }
                }
                replay.messages.push(Message::Tool(result.clone()));
            }
            SessionEvent::RunFinished { .. } => {
                replay.in_flight = None;
                intents.clear();
            }
            // A group session's transcript: its members' turns run in their own sessions.
            // Revocations were applied by `effective_events`.
            SessionEvent::Group { .. } | SessionEvent::Revoked { .. } => {}
            SessionEvent::ContextCompacted {
                covered,
                summary,
                dropped,
                ..
            } => {
                replay.compaction = Some(Compaction {
                    covered: *covered,
                    summary: summary.clone(),
                    dropped: *dropped,
                });
            }
        }
    }
    replay.last_seq = last_seq;
    if let Some(run) = replay.in_flight.as_mut() {
        run.unanswered = round_calls
            .into_iter()
            .filter(|call| !round_results.contains(&call.id))
            .collect();
        let mut pending: Vec<(usize, ToolCall, bool)> = intents.into_values().collect();
        pending.sort_by_key(|(order, _, _)| *order);
        run.pending = pending
            .into_iter()
            .map(|(_, call, idempotent)| (call, idempotent))
            .collect();
    }
    replay
}

/// Once every waiting call is decided, the next intent or result means the round went on:
/// the requests are settled.
fn settle_approvals(run: &mut InFlight) {
    if run.awaiting_approval() && run.undecided().is_empty() {
        run.approval_requests.clear();
        run.decisions.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_types::{AssistantPart, StopReason, ToolResult};
    use serde_json::json;

    fn run_started(run_id: RunId) -> SessionEvent {
        SessionEvent::RunStarted {
            run_id,
            model: "m".into(),
            tools: vec!["t".into()],
            params: json!({}),
            limits: json!(null),
            fallback_models: Vec::new(),
            approvals: json!(null),
            network: json!(null),
            agent_id: None,
            grant: json!(null),
        }
    }

    fn assistant(run_id: RunId, round: u32, calls: &[&str]) -> SessionEvent {
        SessionEvent::AssistantMessage {
            run_id,
            round,
            content: calls
                .iter()
                .map(|id| AssistantPart::ToolCall(ToolCall::new(*id, "t", json!({"id": id}))))
                .collect(),
            usage: Usage {
                input_tokens: 5,
                ..Usage::default()
            },
            stop_reason: StopReason::ToolUse,
            model: None,
            agent_id: None,
            cost_usd: None,
            duration_ms: None,
            first_output_ms: None,
        }
    }

    fn intent(run_id: RunId, id: &str, idempotent: bool) -> SessionEvent {
        SessionEvent::ToolCallIntent {
            run_id,
            call: ToolCall::new(id, "t", json!({"id": id})),
            idempotent,
        }
    }

    fn result(run_id: RunId, id: &str) -> SessionEvent {
        SessionEvent::ToolCallResult {
            run_id,
            result: ToolResult::text(id, "ok"),
            duration_ms: 1,
            working_dir: None,
        }
    }

    fn numbered(events: Vec<SessionEvent>) -> Vec<(u64, SessionEvent)> {
        events
            .into_iter()
            .enumerate()
            .map(|(i, e)| (i as u64 + 1, e))
            .collect()
    }

    #[test]
    fn a_crash_between_intent_and_result_leaves_pending_calls() {
        let run = RunId::new();
        let events = numbered(vec![
            run_started(run),
            SessionEvent::Message {
                run_id: run,
                message: Message::user("go"),
            },
            assistant(run, 1, &["a", "b", "c"]),
            intent(run, "a", false),
            intent(run, "b", true),
            intent(run, "c", false),
            result(run, "b"),
        ]);
        let replay = replay(&events);
        assert_eq!(replay.last_seq, 7);
        assert_eq!(replay.messages.len(), 3);
        let in_flight = replay.in_flight.unwrap();
        assert_eq!(in_flight.round, 1);
        assert_eq!(in_flight.tool_rounds, 0);
        assert_eq!(in_flight.usage.input_tokens, 5);
        let pending: Vec<(&str, bool)> = in_flight
            .pending
            .iter()
            .map(|(c, i)| (c.id.as_str(), *i))
            .collect();
        assert_eq!(pending, [("a", false), ("c", false)]);
    }

    #[test]
    fn approvals_and_pauses_are_replayed() {
        let run = RunId::new();
        let mut events = vec![
            run_started(run),
            assistant(run, 1, &["a", "b"]),
            SessionEvent::ApprovalRequested {
                run_id: run,
                call: ToolCall::new("a", "t", json!({"id": "a"})),
                reason: "always".into(),
            },
            SessionEvent::ApprovalDecided {
                run_id: run,
                call_id: "a".into(),
                decision: agentry_types::ApprovalVerdict::Reject,
                reason: Some("no".into()),
                arguments: None,
            },
        ];
        let replayed = replay(&numbered(events.clone()));
        let in_flight = replayed.in_flight.unwrap();
        assert!(in_flight.awaiting_approval());
        assert!(in_flight.undecided().is_empty());
        assert_eq!(in_flight.decisions.len(), 1);
        assert_eq!(in_flight.unanswered.len(), 2);
        // The round went on: the requests are settled.
        events.push(intent(run, "b", false));
        events.push(result(run, "b"));
        events.push(SessionEvent::RunPaused { run_id: run });
        let in_flight = replay(&numbered(events.clone())).in_flight.unwrap();
        assert!(!in_flight.awaiting_approval());
        assert!(in_flight.paused);
        events.push(SessionEvent::RunResumed { run_id: run });
        assert!(!replay(&numbered(events)).in_flight.unwrap().paused);
    }

    #[test]
    fn finished_runs_leave_nothing_in_flight() {
        let run = RunId::new();
        let events = numbered(vec![
            run_started(run),
            SessionEvent::Message {
                run_id: run,
                message: Message::user("go"),
            },
            assistant(run, 1, &["a"]),
            intent(run, "a", false),
            result(run, "a"),
            SessionEvent::RunFinished {
                run_id: run,
                stop_reason: agentry_types::RunStopReason::Completed,
                usage: Usage::default(),
                rounds: 2,
                error: None,
                note: None,
            },
        ]);
        let replay = replay(&events);
        assert!(replay.in_flight.is_none());
        assert_eq!(replay.runs, 1);
        assert_eq!(replay.messages.len(), 3);
    }
}
