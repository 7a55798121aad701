//! The run engine: a state machine with no IO of its own.
//!
//! [`RunState`] holds everything a run needs to continue — the conversation, the offered tools,
//! the round counter, usage, the loop detector, the working directory — and serialises, so a run
//! can be stored and resumed later or on another node. [`RunState::next_step`] says what to do
//! next; the driver does it and reports back with `on_model_response`, `on_model_error`,
//! `on_tool_results`, `cancel` or `expire`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use agentry_llm::{GenerationParams, ModelRequest};
use agentry_types::{
    ApprovalVerdict, ErrorInfo, Message, ModelResponse, PendingApproval, RunId, RunStopReason,
    ToolCall, ToolResult, ToolSpec, Usage,
};
use serde::{Deserialize, Serialize};

use crate::approval::{ApprovalDecision, ApprovalError, ApprovalPolicy};
use crate::context::{self, Compaction, ContextPolicy};
use crate::loop_guard::{LoopDetector, LoopLimits, LoopVerdict};
use crate::repair::repair_history;

/// Tool rounds a run may take unless its request, agent or runtime says otherwise (the seed
/// service's limit; the loop detector stops a run going round in circles long before).
pub const DEFAULT_MAX_TOOL_ROUNDS: u32 = 200;

/// The guards of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunLimits {
    /// Rounds in which tools may run; a model asking for tools after that stops the run with
    /// `max_rounds` (default [`DEFAULT_MAX_TOOL_ROUNDS`]).
    pub max_tool_rounds: u32,
    /// Tool calls of one round that may run at the same time.
    pub max_parallel_tools: usize,
    /// Wall-clock limit for the whole run.
    #[serde(default, with = "optional_millis")]
    pub deadline: Option<Duration>,
    /// Timeout of one tool call, unless the tool sets its own.
    #[serde(with = "millis")]
    pub tool_timeout: Duration,
    /// Bytes of one tool result shown to the model; the rest is cut with a note.
    pub result_limit: usize,
    /// Loop detection.
    pub loops: LoopLimits,
    /// Output tokens the whole run may generate (a quota over every model call). Each call's
    /// `max_tokens` is capped to what is left; a model asking for tools once the quota is spent
    /// stops the run with `quota_exceeded`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Tool calls the whole run may make; a round that would go over stops the run with
    /// `quota_exceeded` before any of its calls runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls: Option<u32>,
}

impl Default for RunLimits {
    fn default() -> Self {
        Self {
            max_tool_rounds: DEFAULT_MAX_TOOL_ROUNDS,
            max_parallel_tools: 8,
            deadline: Some(Duration::from_secs(30 * 60)),
            tool_timeout: Duration::from_secs(120),
            result_limit: crate::tool::DEFAULT_RESULT_LIMIT,
            loops: LoopLimits::default(),
            max_output_tokens: None,
            max_tool_calls: None,
        }
    }
}

mod millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(value: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(value.as_millis() as u64)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_millis)
    }
}

mod optional_millis {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(
        value: &Option<Duration>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match value {
            Some(duration) => s.serialize_some(&(duration.as_millis() as u64)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(Duration::from_millis))
    }
}

/// Where the run is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// The model is to be called next.
    CallModel,
    /// The latest assistant message's tool calls are to be run.
    RunTools {
        /// The calls, in the model's order.
        calls: Vec<ToolCall>,
        /// Loop warnings to append to some calls' results, by call id.
        warnings: BTreeMap<String, String>,
    },
    /// Some of the latest assistant message's tool calls wait for a person's decision; the
    /// round runs once every one is decided.
    AwaitingApproval {
        /// The round's calls, in the model's order.
        calls: Vec<ToolCall>,
        /// Loop warnings to append to some calls' results, by call id.
        #[serde(default)]
        warnings: BTreeMap<String, String>,
        /// The calls that need a decision, and why.
        pending: Vec<PendingApproval>,
        /// The decisions made so far, by call id.
        #[serde(default)]
        decisions: BTreeMap<String, ApprovalDecision>,
    },
    /// The run is over.
    Finished {
        /// Why.
        reason: RunStopReason,
        /// The error, when `reason` is `error`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<ErrorInfo>,
        /// A note on why a guard stopped the run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        note: Option<String>,
    },
}

/// What the driver should do next.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Call the model with this request.
    CallModel(ModelRequest),
    /// Run these tool calls (in parallel, bounded by `max_parallel_tools`).
    RunTools(Vec<ToolCall>),
    /// Calls wait for approval: continue with [`RunState::continue_after_approvals`] once
    /// [`RunState::approvals_decided`], else suspend the run.
    AwaitApproval,
    /// The run is over.
    Finish,
}

/// A tool call's outcome as the engine needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    /// The result the model will see.
    pub result: ToolResult,
    /// A new working directory the tool asked for.
    pub working_dir: Option<PathBuf>,
}

/// Everything a run needs to continue. Serialisable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunState {
    /// The run's id.
    pub run_id: RunId,
    /// The id of the model the runtime calls.
    pub model: String,
    /// Models tried in order when a call to `model` fails before any output (see
    /// [`crate::fallback`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    /// The conversation so far.
    pub messages: Vec<Message>,
    /// The tools offered to the model.
    pub tools: Vec<ToolSpec>,
    /// The names among `tools` that the caller runs itself: calling one ends the run
    /// ([`RunStopReason::ToolCalls`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_tools: Vec<String>,
    /// Generation parameters for every model call.
    pub params: GenerationParams,
    /// The guards.
    pub limits: RunLimits,
    /// Model calls made so far.
    pub round: u32,
    /// Rounds in which tools ran.
    pub tool_rounds: u32,
    /// Tool calls the model asked for and the engine let run.
    #[serde(default)]
    pub tool_calls: u32,
    /// Tokens used so far.
    pub usage: Usage,
    /// The working directory for file and command tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<PathBuf>,
    /// The root of the run's workspace, passed to tools (the workspace tools refuse to work
    /// without one, and never touch anything outside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<PathBuf>,
    /// Recent tool calls, for loop detection.
    #[serde(default)]
    pub loops: LoopDetector,
    /// Which tool calls wait for a person's approval before they run.
    #[serde(default, skip_serializing_if = "ApprovalPolicy::is_empty")]
    pub approvals: ApprovalPolicy,
    /// When the run first started, in Unix milliseconds (set by the driver; the deadline counts
    /// from here, also across a resume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    /// The saved agent the run runs as, if any (tools that reach other agents use it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Narrowings of the `fetch` tool's network policy, passed to tools (see
    /// [`ToolContext::network`](crate::tool::ToolContext::network)).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub network: Vec<crate::network::NetworkPolicy>,
    /// What the run's caller may use (`None`: everything); its sub-agents are held to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<crate::access::Grant>,
    /// When and how the conversation is compacted to fit the model's window (`None`: never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<ContextPolicy>,
    /// What compaction did so far (the model is sent [`context::view`] of `messages`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compaction: Option<Compaction>,
    /// Whether the coming model call is the one retry after a context-length error.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub overflow_retried: bool,
    /// Long-term memories added to the system prompt of every call (not to the log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    /// The user the run is for (memories found while compacting are theirs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The models that describe images and transcribe audio for the run's model.
    #[serde(default, skip_serializing_if = "crate::media::MediaRoute::is_empty")]
    pub media: crate::media::MediaRoute,
    /// Where the run is.
    pub phase: Phase,
}

impl RunState {
    /// A new run about to make its first model call.
    pub fn new(
        model: impl Into<String>,
        messages: Vec<Message>,
        tools: Vec<ToolSpec>,
        params: GenerationParams,
        limits: RunLimits,
    ) -> Self {
        Self {
            run_id: RunId::new(),
            model: model.into(),
            fallback_models: Vec::new(),
            messages,
            tools,
            client_tools: Vec::new(),
            params,
            limits,
            round: 0,
            tool_rounds: 0,
            tool_calls: 0,
            usage: Usage::default(),
            working_dir: None,
            workspace: None,
            loops: LoopDetector::default(),
            approvals: ApprovalPolicy::default(),
            started_at_ms: None,
            agent_id: None,
            network: Vec::new(),
            grant: None,
            context: None,
            compaction: None,
            overflow_retried: false,
            memory: None,
            user: None,
            media: crate::media::MediaRoute::default(),
            phase: Phase::CallModel,
        }
    }

    /// The messages the next model call is sent: the conversation as compaction left it, the
    /// memories appended to the system prompt.
    pub fn request_messages(&self) -> Vec<Message> {
        let mut messages = context::view(&self.messages, self.compaction.as_ref());
        if let Some(memory) = self.memory.as_deref().filter(|m| !m.trim().is_empty()) {
            match messages.first_mut() {
                Some(Message::System { text }) => {
                    text.push_str("\n\n");
                    text.push_str(memory);
                }
                _ => messages.insert(0, Message::system(memory)),
            }
        }
        messages
    }

    /// Decides the next step. Before a model call the history is repaired so the provider
    /// always sees a valid conversation.
    pub fn next_step(&mut self) -> Step {
        match &self.phase {
            Phase::CallModel => {
                let mut params = self.params.clone();
                if let Some(left) = self.output_tokens_left() {
                    if left == 0 {
                        let note = self.output_quota_note();
                        self.finish(RunStopReason::QuotaExceeded, None, Some(note));
                        return Step::Finish;
                    }
                    let left = u32::try_from(left).unwrap_or(u32::MAX);
                    params.max_tokens = Some(params.max_tokens.map_or(left, |own| own.min(left)));
                }
                repair_history(&mut self.messages);
                Step::CallModel(ModelRequest {
                    messages: self.request_messages(),
                    tools: self.tools.clone(),
                    params,
                })
            }
            Phase::RunTools { calls, .. } => Step::RunTools(calls.clone()),
            Phase::AwaitingApproval { .. } => Step::AwaitApproval,
            Phase::Finished { .. } => Step::Finish,
        }
    }

    /// Whether the run is over.
    pub fn is_finished(&self) -> bool {
        matches!(self.phase, Phase::Finished { .. })
    }

    /// Why the run ended, once it has.
    pub fn stop_reason(&self) -> Option<RunStopReason> {
        match &self.phase {
            Phase::Finished { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    /// The model answered.
    pub fn on_model_response(&mut self, response: &ModelResponse) {
        if self.is_finished() {
            return;
        }
        self.round += 1;
        self.overflow_retried = false;
        self.usage.add(&response.usage);
        self.messages.push(response.to_message());
        let calls: Vec<ToolCall> = response.tool_calls().into_iter().cloned().collect();
        if calls.is_empty() {
            self.finish(RunStopReason::Completed, None, None);
            return;
        }
        // A call the caller runs itself ends the run here: the caller answers it.
        if calls
            .iter()
            .any(|call| self.client_tools.contains(&call.name))
        {
            self.finish(RunStopReason::ToolCalls, None, None);
            return;
        }
        if self.output_tokens_left() == Some(0) {
            let note = self.output_quota_note();
            self.finish(RunStopReason::QuotaExceeded, None, Some(note));
            return;
        }
        if let Some(max) = self.limits.max_tool_calls {
            let wanted = u32::try_from(calls.len()).unwrap_or(u32::MAX);
            if self.tool_calls.saturating_add(wanted) > max {
                let note = format!(
                    "the model asked for {wanted} more tool call(s) after {} of the run's {max} \
                     allowed (max_tool_calls)",
                    self.tool_calls
                );
                self.finish(RunStopReason::QuotaExceeded, None, Some(note));
                return;
            }
        }
        if self.tool_rounds >= self.limits.max_tool_rounds {
            let note = format!(
                "the model asked for tools after {} tool rounds, the run's limit",
                self.tool_rounds
            );
            self.finish(RunStopReason::MaxRounds, None, Some(note));
            return;
        }
        let mut warnings = BTreeMap::new();
        for call in &calls {
            match self.loops.observe(call, &self.limits.loops) {
                LoopVerdict::Fine => {}
                LoopVerdict::Warn(warning) => {
                    warnings.insert(call.id.clone(), warning);
                }
                LoopVerdict::Stop(note) => {
                    self.finish(RunStopReason::LoopDetected, None, Some(note));
                    return;
                }
            }
        }
        self.tool_calls = self
            .tool_calls
            .saturating_add(u32::try_from(calls.len()).unwrap_or(u32::MAX));
        let pending: Vec<PendingApproval> = calls
            .iter()
            .filter_map(|call| {
                self.approvals.check(call).map(|reason| PendingApproval {
                    call: call.clone(),
                    reason,
                })
            })
            .collect();
        self.phase = if pending.is_empty() {
            Phase::RunTools { calls, warnings }
        } else {
            Phase::AwaitingApproval {
                calls,
                warnings,
                pending,
                decisions: BTreeMap::new(),
            }
        };
    }

    /// The calls still waiting for a decision (none unless the run awaits approval).
    pub fn pending_approvals(&self) -> Vec<PendingApproval> {
        match &self.phase {
            Phase::AwaitingApproval {
                pending, decisions, ..
            } => pending
                .iter()
                .filter(|p| !decisions.contains_key(&p.call.id))
                .cloned()
                .collect(),
            _ => Vec::new(),
        }
    }

    /// Whether the run waits for approvals and every one is decided.
    pub fn approvals_decided(&self) -> bool {
        matches!(&self.phase, Phase::AwaitingApproval { .. }) && self.pending_approvals().is_empty()
    }

    /// Records a decision on a waiting call. The caller validates edited arguments against
    /// the tool's schema first.
    pub fn decide(&mut self, decision: ApprovalDecision) -> Result<(), ApprovalError> {
        decision.check()?;
        let Phase::AwaitingApproval {
            pending, decisions, ..
        } = &mut self.phase
        else {
            return Err(ApprovalError::NotWaiting);
        };
        if !pending.iter().any(|p| p.call.id == decision.call_id) {
            return Err(ApprovalError::UnknownCall(decision.call_id));
        }
        if decisions.contains_key(&decision.call_id) {
            return Err(ApprovalError::AlreadyDecided(decision.call_id));
        }
        decisions.insert(decision.call_id.clone(), decision);
        Ok(())
    }

    /// Once every waiting call is decided: rejected calls get an error result with the reason
    /// (returned, and added to the conversation), approved ones run (edited ones with their new
    /// arguments and a note saying so) with the rest of the round.
    pub fn continue_after_approvals(&mut self) -> Result<Vec<ToolResult>, ApprovalError> {
        if !self.approvals_decided() {
            return Err(ApprovalError::NotWaiting);
        }
        let Phase::AwaitingApproval {
            calls,
            mut warnings,
            decisions,
            ..
        } = std::mem::replace(&mut self.phase, Phase::CallModel)
        else {
            return Err(ApprovalError::NotWaiting);
        };
        let mut run = Vec::with_capacity(calls.len());
        let mut rejected = Vec::new();
        for mut call in calls {
            match decisions.get(&call.id) {
                Some(ApprovalDecision {
                    decision: ApprovalVerdict::Reject,
                    reason,
                    ..
                }) => {
                    let reason = reason
                        .as_deref()
                        .filter(|r| !r.trim().is_empty())
                        .unwrap_or("no reason given");
                    rejected.push(ToolResult {
                        name: Some(call.name.clone()),
                        ..ToolResult::error(
                            call.id.clone(),
                            format!("the call was rejected by a reviewer: {reason}"),
                        )
                    });
                }
                Some(ApprovalDecision {
                    decision: ApprovalVerdict::Edit,
                    arguments: Some(arguments),
                    reason,
                    ..
                }) => {
                    let mut note = format!(
                        "note: a reviewer edited this call's arguments before it ran; it ran with \
                         {arguments}"
                    );
                    if let Some(reason) = reason.as_deref().filter(|r| !r.trim().is_empty()) {
                        note.push_str(&format!(" ({reason})"));
                    }
                    let entry = warnings.entry(call.id.clone()).or_default();
                    if !entry.is_empty() {
                        entry.push('\n');
                    }
                    entry.push_str(&note);
                    call.arguments = arguments.clone();
                    run.push(call);
                }
                _ => run.push(call),
            }
        }
        self.messages
            .extend(rejected.iter().cloned().map(Message::Tool));
        self.phase = Phase::RunTools {
            calls: run,
            warnings,
        };
        Ok(rejected)
    }

    /// Output tokens the run may still generate, when it has a quota.
    pub fn output_tokens_left(&self) -> Option<u64> {
        self.limits
            .max_output_tokens
            .map(|max| max.saturating_sub(self.usage.output_tokens))
    }

    fn output_quota_note(&self) -> String {
        format!(
            "the run generated {} output tokens, its quota of {} (max_output_tokens)",
            self.usage.output_tokens,
            self.limits.max_output_tokens.unwrap_or_default()
        )
    }

    /// The loop warning for this call of the current round, if it has one. The driver appends
    /// it to the call's result, so the model reads it together with the result.
    pub fn loop_warning(&self, call_id: &str) -> Option<&str> {
        match &self.phase {
            Phase::RunTools { warnings, .. } | Phase::AwaitingApproval { warnings, .. } => {
                warnings.get(call_id).map(String::as_str)
            }
            _ => None,
        }
    }

    /// The model call failed.
    pub fn on_model_error(&mut self, error: ErrorInfo) {
        self.fail(error);
    }

    /// The run cannot go on (a model error, or its log could not be written).
    pub fn fail(&mut self, error: ErrorInfo) {
        self.finish(RunStopReason::Error, Some(error), None);
    }

    /// The round's tools finished. Results are recorded in the order of the calls.
    pub fn on_tool_results(&mut self, outcomes: Vec<ToolOutcome>) {
        let Phase::RunTools { calls, .. } = &self.phase else {
            return;
        };
        let mut by_id: BTreeMap<String, ToolOutcome> = outcomes
            .into_iter()
            .map(|outcome| (outcome.result.call_id.clone(), outcome))
            .collect();
        let mut results = Vec::with_capacity(calls.len());
        for call in calls {
            // A call without an outcome is left to the repair pass ("interrupted").
            let Some(outcome) = by_id.remove(&call.id) else {
                continue;
            };
            if let Some(dir) = outcome.working_dir {
                self.working_dir = Some(dir);
            }
            results.push(Message::Tool(outcome.result));
        }
        self.messages.extend(results);
        self.tool_rounds += 1;
        self.phase = Phase::CallModel;
    }

    /// A budget of the run's agent or API key is used up (`note` says which): the run stops
    /// before its next model call.
    pub fn stop_over_budget(&mut self, note: String) {
        self.finish(RunStopReason::BudgetExceeded, None, Some(note));
    }

    /// The caller cancelled the run.
    pub fn cancel(&mut self) {
        self.finish(RunStopReason::Cancelled, None, None);
    }

    /// The run's deadline passed.
    pub fn expire(&mut self) {
        let note = self
            .limits
            .deadline
            .map(|deadline| format!("the run's deadline of {deadline:?} passed"));
        self.finish(RunStopReason::Deadline, None, note);
    }

    fn finish(&mut self, reason: RunStopReason, error: Option<ErrorInfo>, note: Option<String>) {
        if !self.is_finished() {
            self.phase = Phase::Finished {
                reason,
                error,
                note,
            };
        }
    }

    /// The text of the last assistant message, if the run completed with an answer.
    pub fn final_text(&self) -> String {
        if self.stop_reason() != Some(RunStopReason::Completed) {
            return String::new();
        }
        self.messages
            .iter()
            .rev()
            .find_map(Message::answer_text)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_types::{AssistantPart, StopReason};
    use serde_json::json;

    fn response(parts: Vec<AssistantPart>) -> ModelResponse {
        ModelResponse {
            id: None,
            model: None,
            content: parts,
            usage: Usage {
                input_tokens: 10,
                output_tokens: 5,
                ..Usage::default()
            },
            stop_reason: StopReason::EndTurn,
        }
    }

    fn call(id: &str) -> AssistantPart {
        AssistantPart::ToolCall(ToolCall::new(id, "lookup", json!({"id": id})))
    }

    fn outcome(id: &str) -> ToolOutcome {
        ToolOutcome {
            result: ToolResult::text(id, "ok"),
            working_dir: None,
        }
    }

    fn state() -> RunState {
        RunState::new(
            "m",
            vec![Message::user("go")],
            Vec::new(),
            GenerationParams::default(),
            RunLimits::default(),
        )
    }

    #[test]
    fn a_two_round_run() {
        let mut run = state();
        assert!(matches!(run.next_step(), Step::CallModel(_)));
        run.on_model_response(&response(vec![call("a"), call("b")]));
        let Step::RunTools(calls) = run.next_step() else {
            panic!("expected tools");
        };
        assert_eq!(calls.len(), 2);
        // Results arrive out of order; they are recorded in call order.
        run.on_tool_results(vec![outcome("b"), outcome("a")]);
        let Step::CallModel(request) = run.next_step() else {
            panic!("expected a model call");
        };
        assert_eq!(request.messages.len(), 4);
        assert!(matches!(&request.messages[2], Message::Tool(r) if r.call_id == "a"));
        run.on_model_response(&response(vec![AssistantPart::Text {
            text: "done".into(),
        }]));
        assert_eq!(run.next_step(), Step::Finish);
        assert_eq!(run.stop_reason(), Some(RunStopReason::Completed));
        assert_eq!(run.final_text(), "done");
        assert_eq!(run.round, 2);
        assert_eq!(run.tool_rounds, 1);
        assert_eq!(run.usage.input_tokens, 20);
    }

    #[test]
    fn the_state_serialises_and_resumes_mid_run() {
        let mut run = state();
        run.next_step();
        run.on_model_response(&response(vec![call("a")]));
        let json = serde_json::to_string(&run).unwrap();
        let mut resumed: RunState = serde_json::from_str(&json).unwrap();
        assert_eq!(resumed, run);
        assert_eq!(
            resumed.next_step(),
            Step::RunTools(vec![ToolCall::new("a", "lookup", json!({"id": "a"}))])
        );
    }

    #[test]
    fn max_tool_rounds_stops_the_run() {
        let mut run = state();
        run.limits.max_tool_rounds = 1;
        run.next_step();
        run.on_model_response(&response(vec![call("a")]));
        run.on_tool_results(vec![outcome("a")]);
        run.next_step();
        run.on_model_response(&response(vec![call("b")]));
        assert_eq!(run.stop_reason(), Some(RunStopReason::MaxRounds));
    }

    #[test]
    fn the_default_limit_allows_200_tool_rounds() {
        assert_eq!(RunLimits::default().max_tool_rounds, 200);
        let mut run = state();
        for round in 0..200 {
            let id = format!("c{round}");
            assert!(
                matches!(run.next_step(), Step::CallModel(_)),
                "round {round}"
            );
            run.on_model_response(&response(vec![call(&id)]));
            assert_eq!(run.stop_reason(), None, "round {round}");
            run.on_tool_results(vec![outcome(&id)]);
        }
        run.next_step();
        run.on_model_response(&response(vec![call("one-too-many")]));
        assert_eq!(run.stop_reason(), Some(RunStopReason::MaxRounds));
    }

    #[test]
    fn a_missing_outcome_is_repaired_as_interrupted() {
        let mut run = state();
        run.next_step();
        run.on_model_response(&response(vec![call("a"), call("b")]));
        run.on_tool_results(vec![outcome("a")]);
        let Step::CallModel(request) = run.next_step() else {
            panic!("expected a model call");
        };
        assert!(
            matches!(request.messages.last(), Some(Message::Tool(r)) if r.call_id == "b" && r.is_error)
        );
    }

    #[test]
    fn the_output_token_quota_caps_each_call_and_stops_the_run() {
        let mut run = state();
        run.limits.max_output_tokens = Some(12);
        run.params.max_tokens = Some(100);
        let Step::CallModel(request) = run.next_step() else {
            panic!("expected a model call");
        };
        assert_eq!(request.params.max_tokens, Some(12));
        run.on_model_response(&response(vec![call("a")]));
        run.on_tool_results(vec![outcome("a")]);
        // 5 of 12 used: the next call may generate 7.
        let Step::CallModel(request) = run.next_step() else {
            panic!("expected a model call");
        };
        assert_eq!(request.params.max_tokens, Some(7));
        run.on_model_response(&response(vec![call("b")]));
        run.on_tool_results(vec![outcome("b")]);
        let Step::CallModel(_) = run.next_step() else {
            panic!("expected a model call");
        };
        // 15 > 12: the model asking for more tools is stopped.
        run.on_model_response(&response(vec![call("c")]));
        assert_eq!(run.stop_reason(), Some(RunStopReason::QuotaExceeded));
        let Phase::Finished { note, .. } = &run.phase else {
            panic!("expected the end");
        };
        assert!(note.as_deref().unwrap_or("").contains("max_output_tokens"));
        assert_eq!(run.output_tokens_left(), Some(0));
    }

    #[test]
    fn a_spent_output_quota_stops_before_the_next_call() {
        let mut run = state();
        run.limits.max_output_tokens = Some(5);
        run.next_step();
        run.on_model_response(&response(vec![AssistantPart::Text {
            text: "done".into(),
        }]));
        // A final answer within the call's cap completes normally.
        assert_eq!(run.stop_reason(), Some(RunStopReason::Completed));
        let mut run = state();
        run.limits.max_output_tokens = Some(5);
        run.usage.output_tokens = 5;
        assert_eq!(run.next_step(), Step::Finish);
        assert_eq!(run.stop_reason(), Some(RunStopReason::QuotaExceeded));
    }

    #[test]
    fn the_tool_call_quota_stops_a_round_that_would_exceed_it() {
        let mut run = state();
        run.limits.max_tool_calls = Some(3);
        run.next_step();
        run.on_model_response(&response(vec![call("a"), call("b")]));
        assert_eq!(run.tool_calls, 2);
        run.on_tool_results(vec![outcome("a"), outcome("b")]);
        run.next_step();
        // Two more would make four: none of them runs.
        run.on_model_response(&response(vec![call("c"), call("d")]));
        assert_eq!(run.stop_reason(), Some(RunStopReason::QuotaExceeded));
        assert_eq!(run.tool_calls, 2);
        let Phase::Finished { note, .. } = &run.phase else {
            panic!("expected the end");
        };
        assert!(note.as_deref().unwrap_or("").contains("max_tool_calls"));
    }

    #[test]
    fn old_states_and_limits_without_quotas_still_load() {
        let mut value = serde_json::to_value(state()).unwrap();
        let object = value.as_object_mut().unwrap();
        object.remove("tool_calls");
        let limits = object["limits"].as_object_mut().unwrap();
        assert!(!limits.contains_key("max_output_tokens"));
        assert!(!limits.contains_key("max_tool_calls"));
        let loaded: RunState = serde_json::from_value(value).unwrap();
        assert_eq!(loaded.tool_calls, 0);
        assert_eq!(loaded.limits.max_tool_calls, None);
        assert_eq!(
            serde_json::to_value(RunStopReason::QuotaExceeded).unwrap(),
            json!("quota_exceeded")
        );
    }

    #[test]
    fn calls_that_need_approval_wait_and_decisions_shape_the_round() {
        use crate::approval::ApprovalDecision;
        let mut run = state();
        run.approvals = serde_json::from_value(json!({"tools": {"lookup": "always"}})).unwrap();
        run.next_step();
        run.on_model_response(&response(vec![call("a"), call("b"), call("c")]));
        assert_eq!(run.next_step(), Step::AwaitApproval);
        assert_eq!(run.pending_approvals().len(), 3);
        // The state with its waiting calls survives a round trip; an old state without a
        // policy still loads.
        let json = serde_json::to_value(&run).unwrap();
        assert_eq!(serde_json::from_value::<RunState>(json).unwrap(), run);
        let mut old = serde_json::to_value(state()).unwrap();
        old.as_object_mut().unwrap().remove("approvals");
        assert!(
            serde_json::from_value::<RunState>(old)
                .unwrap()
                .approvals
                .is_empty()
        );

        let verdict = |id: &str, decision, arguments| ApprovalDecision {
            call_id: id.into(),
            decision,
            reason: Some("no".into()),
            arguments,
        };
        assert!(matches!(
            run.decide(verdict("zz", ApprovalVerdict::Approve, None)),
            Err(ApprovalError::UnknownCall(_))
        ));
        assert!(matches!(
            run.decide(verdict("a", ApprovalVerdict::Edit, None)),
            Err(ApprovalError::InvalidDecision(_))
        ));
        run.decide(verdict("a", ApprovalVerdict::Approve, None))
            .unwrap();
        assert!(matches!(
            run.decide(verdict("a", ApprovalVerdict::Reject, None)),
            Err(ApprovalError::AlreadyDecided(_))
        ));
        assert!(!run.approvals_decided());
        assert!(run.continue_after_approvals().is_err());
        run.decide(verdict("b", ApprovalVerdict::Reject, None))
            .unwrap();
        run.decide(verdict(
            "c",
            ApprovalVerdict::Edit,
            Some(json!({"id": "z"})),
        ))
        .unwrap();
        let rejected = run.continue_after_approvals().unwrap();
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].call_id, "b");
        assert!(rejected[0].is_error);
        let Step::RunTools(calls) = run.next_step() else {
            panic!("expected tools");
        };
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].arguments, json!({"id": "z"}));
        assert!(run.loop_warning("c").unwrap_or("").contains("edited"));
        run.on_tool_results(vec![outcome("a"), outcome("c")]);
        let Step::CallModel(request) = run.next_step() else {
            panic!("expected a model call");
        };
        // Every call is answered once: the rejection plus the two results.
        let answered = request
            .messages
            .iter()
            .filter(|m| matches!(m, Message::Tool(_)))
            .count();
        assert_eq!(answered, 3);
    }

    #[test]
    fn cancel_and_expire_finish_once() {
        let mut run = state();
        run.cancel();
        run.expire();
        assert_eq!(run.stop_reason(), Some(RunStopReason::Cancelled));
        assert_eq!(run.final_text(), "");
    }
}
