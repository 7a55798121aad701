//! Context compaction: keeping a conversation inside the model's window.
//!
//! Pure functions, no IO. A conversation is cut into *units* that must never be separated: a
//! user message, or an assistant message together with the results of the tool calls it made.
//! When a request would take more than `threshold` of the window, [`plan`] picks a cut at a unit
//! boundary: the system prompt stays, the last `keep_recent` units stay verbatim (fewer when
//! they alone do not fit, never fewer than one), and everything between the previous cut and
//! the new one is handed to the summary model together with the previous summary (so each
//! summary call sends only the turns it has not seen). Without a summary model the old units
//! are dropped and a marker says how many messages went.
//!
//! The full conversation is never changed: a [`Compaction`] records the summary and how many
//! messages it covers, and [`view`] builds what the model is sent from the two. A session's log
//! keeps the original messages, so fork and continue work on the real history.

use std::ops::Range;

use agentry_llm::{GenerationParams, ModelRequest, TokenCounter};
use agentry_types::{AssistantPart, ContentPart, Message, Thinking, ToolResultPart, ToolSpec};
use serde::{Deserialize, Serialize};

/// Default share of the window a request may take before it is compacted.
pub const DEFAULT_THRESHOLD: f64 = 0.8;

/// Default number of units kept verbatim.
pub const DEFAULT_KEEP_RECENT: usize = 6;

/// Characters of one message shown to the summary model; longer ones are cut with a note.
const SUMMARY_MESSAGE_CHARS: usize = 4_000;

/// When and how a run's context is compacted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContextPolicy {
    /// The model's window, in tokens.
    pub window: u64,
    /// Share of the window a request may take before it is compacted (0.1 to 1.0).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// Units (a user message, or an assistant message with its tool results) kept verbatim.
    #[serde(default = "default_keep_recent")]
    pub keep_recent: usize,
    /// The model that writes summaries; without one, old turns are dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_model: Option<String>,
    /// Output tokens a summary may take (also reserved in the window for it).
    #[serde(default = "default_summary_tokens")]
    pub summary_tokens: u32,
}

fn default_threshold() -> f64 {
    DEFAULT_THRESHOLD
}

fn default_keep_recent() -> usize {
    DEFAULT_KEEP_RECENT
}

fn default_summary_tokens() -> u32 {
    1_024
}

impl ContextPolicy {
    /// A policy for a window of `window` tokens with the defaults.
    pub fn new(window: u64) -> Self {
        Self {
            window,
            threshold: DEFAULT_THRESHOLD,
            keep_recent: DEFAULT_KEEP_RECENT,
            summary_model: None,
            summary_tokens: default_summary_tokens(),
        }
    }

    /// The tokens a request may take before it is compacted.
    pub fn budget(&self) -> u64 {
        (self.window as f64 * self.threshold.clamp(0.1, 1.0)).floor() as u64
    }
}

/// How a runtime (or one run) compacts: everything of a [`ContextPolicy`] but the window, which
/// comes from the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompactionSettings {
    /// Whether conversations are compacted at all (default: yes).
    #[serde(default = "enabled")]
    pub enabled: bool,
    /// Share of the window a request may take before it is compacted (0.1 to 1.0).
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// Units kept verbatim (at least 1).
    #[serde(default = "default_keep_recent")]
    pub keep_recent: usize,
    /// The model (a registered id) that writes summaries; without one, old turns are dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_model: Option<String>,
    /// Output tokens a summary may take.
    #[serde(default = "default_summary_tokens")]
    pub summary_tokens: u32,
}

fn enabled() -> bool {
    true
}

impl Default for CompactionSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            threshold: DEFAULT_THRESHOLD,
            keep_recent: DEFAULT_KEEP_RECENT,
            summary_model: None,
            summary_tokens: default_summary_tokens(),
        }
    }
}

impl CompactionSettings {
    /// The policy for a model whose window is `window`, or `None` when compaction is off.
    pub fn policy(&self, window: u64) -> Option<ContextPolicy> {
        self.enabled.then(|| ContextPolicy {
            window,
            threshold: self.threshold,
            keep_recent: self.keep_recent,
            summary_model: self.summary_model.clone(),
            summary_tokens: self.summary_tokens,
        })
    }

    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), String> {
        if !(0.1..=1.0).contains(&self.threshold) {
            return Err("the compaction threshold is 0.1 to 1.0 (a share of the window)".into());
        }
        if !(1..=1_000).contains(&self.keep_recent) {
            return Err("`keep_recent` is 1 to 1000".into());
        }
        if !(16..=32_000).contains(&self.summary_tokens) {
            return Err("`summary_tokens` is 16 to 32000".into());
        }
        Ok(())
    }
}

/// What earlier compactions did to a conversation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Compaction {
    /// Index (into the full conversation) of the first message still sent verbatim; everything
    /// after the leading system messages and before it is summarised or dropped.
    pub covered: usize,
    /// The running summary of the covered messages, when a summary model wrote one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Covered messages no summary describes (dropped without a summary model).
    #[serde(default)]
    pub dropped: usize,
}

/// A compaction to perform.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The new first verbatim message.
    pub cut: usize,
    /// The messages to summarise now (those between the previous cut and the new one).
    pub newly_covered: Range<usize>,
    /// Tokens the request takes before compaction.
    pub tokens_before: u64,
}

/// Why no compaction can help.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// Even the system prompt and the last unit alone do not fit.
    #[error(
        "the conversation cannot fit the context window: the system prompt, the tools and the \
         latest turn alone take {needed} tokens of {budget} allowed"
    )]
    TooLarge {
        /// Tokens of what must be kept.
        needed: u64,
        /// Tokens allowed.
        budget: u64,
    },
}

/// The number of leading system messages (the system prompt, which always stays).
pub fn system_prefix(messages: &[Message]) -> usize {
    messages
        .iter()
        .take_while(|m| matches!(m, Message::System { .. }))
        .count()
}

/// The units of `messages[from..]`, as ranges into `messages`: a user (or system) message on
/// its own, an assistant message with the tool results that follow it, an orphan tool result on
/// its own.
pub fn units(messages: &[Message], from: usize) -> Vec<Range<usize>> {
    let mut units: Vec<Range<usize>> = Vec::new();
    let mut index = from;
    while index < messages.len() {
        let start = index;
        index += 1;
        if matches!(messages[start], Message::Assistant { .. }) {
            while index < messages.len() && matches!(messages[index], Message::Tool(_)) {
                index += 1;
            }
        }
        units.push(start..index);
    }
    units
}

/// The messages the model is sent: the system prompt, the summary (or the marker), the
/// messages from the cut on. The summary goes into the first kept user message when there is
/// one, so roles still alternate as every provider requires.
pub fn view(messages: &[Message], compaction: Option<&Compaction>) -> Vec<Message> {
    let Some(compaction) = compaction.filter(|c| c.covered > system_prefix(messages)) else {
        return messages.to_vec();
    };
    let prefix = system_prefix(messages);
    let covered = compaction.covered.min(messages.len());
    let mut note = String::new();
    if let Some(summary) = &compaction.summary {
        note.push_str("<conversation_summary>\nA summary of the earlier conversation:\n");
        note.push_str(summary.trim());
        note.push_str("\n</conversation_summary>");
    }
    if compaction.dropped > 0 {
        if !note.is_empty() {
            note.push('\n');
        }
        note.push_str(&format!(
            "[{} earlier message(s) were removed to fit the model's context window; no summary \
             of them was kept.]",
            compaction.dropped
        ));
    }
    let mut out: Vec<Message> = messages[..prefix].to_vec();
    let mut rest = messages[covered..].iter().cloned();
    match rest.next() {
        Some(Message::User { mut content }) => {
            content.insert(0, ContentPart::text(note));
            out.push(Message::User { content });
        }
        Some(first) => {
            out.push(Message::user(note));
            out.push(first);
        }
        None => out.push(Message::user(note)),
    }
    out.extend(rest);
    out
}

/// Tokens a request with these messages and tools takes.
pub fn request_tokens(counter: &TokenCounter, messages: &[Message], tools: &[ToolSpec]) -> u64 {
    let raw = messages
        .iter()
        .map(|m| counter.count_message(m))
        .sum::<u64>()
        + counter.count_tools(tools)
        + agentry_llm::tokens::REQUEST_OVERHEAD_TOKENS;
    counter.calibrated(raw)
}

/// Decides whether the request built from `messages` (with `current` compaction) needs
/// compacting and where to cut. `force` compacts even under the threshold (after the provider
/// said the context is too long). `Ok(None)`: nothing to do.
pub fn plan(
    messages: &[Message],
    tools: &[ToolSpec],
    counter: &TokenCounter,
    policy: &ContextPolicy,
    current: Option<&Compaction>,
    force: bool,
) -> Result<Option<Plan>, ContextError> {
    let budget = policy.budget();
    let tokens_before = request_tokens(counter, &view(messages, current), tools);
    if tokens_before <= budget && !force {
        return Ok(None);
    }
    let prefix = system_prefix(messages);
    let start = current.map_or(prefix, |c| c.covered.max(prefix));
    let all = units(messages, start);
    let fixed = request_tokens(counter, &messages[..prefix], tools);
    // Room for the summary (or marker) that replaces what is cut.
    let reserve = u64::from(policy.summary_tokens) + 32;
    let Some(last) = all.last() else {
        return Err(ContextError::TooLarge {
            needed: fixed,
            budget,
        });
    };
    // Keep as many recent units as allowed and as fit, at least one.
    let mut keep_from = last.start;
    let mut kept_tokens = counter.calibrated(
        messages[last.clone()]
            .iter()
            .map(|m| counter.count_message(m))
            .sum(),
    );
    if fixed + reserve + kept_tokens > budget {
        return Err(ContextError::TooLarge {
            needed: fixed + reserve + kept_tokens,
            budget,
        });
    }
    let wanted = policy.keep_recent.max(1);
    // When forced, keep at most half of what is there, so a retry sends less.
    let wanted = if force {
        wanted.min(all.len().div_ceil(2)).max(1)
    } else {
        wanted
    };
    for (kept, unit) in all.iter().rev().enumerate().skip(1) {
        if kept >= wanted {
            break;
        }
        let tokens = counter.calibrated(
            messages[unit.clone()]
                .iter()
                .map(|m| counter.count_message(m))
                .sum(),
        );
        if fixed + reserve + kept_tokens + tokens > budget {
            break;
        }
        kept_tokens += tokens;
        keep_from = unit.start;
    }
    if keep_from <= start {
        // Everything left is what must be kept: compaction cannot help any more.
        return Ok(None);
    }
    Ok(Some(Plan {
        cut: keep_from,
        newly_covered: start..keep_from,
        tokens_before,
    }))
}

/// The compaction after `plan` ran, given the summary the summary model wrote (or `None` when
/// the old messages are dropped).
pub fn apply(current: Option<&Compaction>, plan: &Plan, summary: Option<String>) -> Compaction {
    let previous = current.cloned().unwrap_or_default();
    let newly = plan.newly_covered.len();
    match summary {
        Some(summary) => Compaction {
            covered: plan.cut,
            summary: Some(summary),
            dropped: previous.dropped,
        },
        None => Compaction {
            covered: plan.cut,
            summary: previous.summary,
            dropped: previous.dropped + newly,
        },
    }
}

/// The request that asks the summary model for an updated summary: the previous summary and
/// only the messages it has not seen.
pub fn summary_request(
    previous: Option<&str>,
    messages: &[Message],
    max_tokens: u32,
) -> ModelRequest {
    let mut prompt = String::new();
    if let Some(previous) = previous {
        prompt.push_str("The summary so far:\n<summary>\n");
        prompt.push_str(previous.trim());
        prompt.push_str("\n</summary>\n\n");
        prompt.push_str("The conversation since that summary:\n");
    } else {
        prompt.push_str("The conversation:\n");
    }
    prompt.push_str("<conversation>\n");
    prompt.push_str(&transcript(messages));
    prompt.push_str("</conversation>\n\nWrite the updated summary.");
    ModelRequest {
        messages: vec![Message::system(SUMMARY_INSTRUCTIONS), Message::user(prompt)],
        tools: Vec::new(),
        params: GenerationParams {
            max_tokens: Some(max_tokens),
            temperature: Some(0.0),
            ..GenerationParams::default()
        },
    }
}

/// What the summary model is told.
pub const SUMMARY_INSTRUCTIONS: &str = "You compress the history of a conversation between a user \
and an AI assistant that uses tools, so the assistant can continue the work without the original \
messages. Write a concise summary in the conversation's language that keeps: the user's goals and \
instructions, decisions made, facts learnt (names, numbers, paths, identifiers, results of tool \
calls), what was tried and failed, and what is still to do. When a previous summary is given, \
return a single summary that merges it with the new messages.\n\nThen, if the new messages hold \
anything worth remembering in later conversations (lasting facts about the user or the project, \
the user's preferences, decisions taken), add a line `MEMORIES:` followed by one line per item, \
each `- fact: …`, `- preference: …` or `- decision: …`, short and self-contained. Leave the \
section out when there is nothing lasting. Reply with the summary (and that section) only.";

/// The marker that starts the memory section of a summary model's answer.
pub const MEMORIES_MARKER: &str = "MEMORIES:";

/// A memory the summary model extracted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtractedMemory {
    /// `fact`, `preference` or `decision`.
    pub kind: String,
    /// The statement.
    pub text: String,
}

/// Splits a summary model's answer into the summary and the memories it listed. Lines of the
/// memory section that do not follow the format are ignored; at most 20 memories are kept.
pub fn split_memories(answer: &str) -> (String, Vec<ExtractedMemory>) {
    let Some(at) = answer
        .match_indices(MEMORIES_MARKER)
        .map(|(at, _)| at)
        .find(|&at| at == 0 || answer[..at].ends_with('\n'))
    else {
        return (answer.trim().to_owned(), Vec::new());
    };
    let summary = answer[..at].trim().to_owned();
    let memories = answer[at + MEMORIES_MARKER.len()..]
        .lines()
        .filter_map(|line| {
            let item = line.trim().strip_prefix('-')?.trim();
            let (kind, text) = item.split_once(':')?;
            let kind = kind.trim().to_ascii_lowercase();
            let text = text.trim();
            (matches!(kind.as_str(), "fact" | "preference" | "decision")
                && !text.is_empty()
                && text.chars().count() <= 500)
                .then(|| ExtractedMemory {
                    kind,
                    text: text.to_owned(),
                })
        })
        .take(20)
        .collect();
    (summary, memories)
}

/// The messages as plain text for the summary model, each cut to a readable length.
pub fn transcript(messages: &[Message]) -> String {
    let mut out = String::new();
    for message in messages {
        let line = match message {
            Message::System { text } => format!("System: {text}"),
            Message::User { content } => {
                let parts: Vec<String> = content
                    .iter()
                    .map(|part| match part {
                        ContentPart::Text { text } => text.clone(),
                        ContentPart::Image { .. } => "[image]".into(),
                        ContentPart::Audio { .. } => "[audio]".into(),
                    })
                    .collect();
                format!("User: {}", parts.join("\n"))
            }
            Message::Assistant { content } => {
                let parts: Vec<String> = content
                    .iter()
                    .filter_map(|part| match part {
                        AssistantPart::Text { text } => Some(text.clone()),
                        AssistantPart::Thinking(Thinking::Text { .. })
                        | AssistantPart::Thinking(Thinking::Redacted { .. }) => None,
                        AssistantPart::ToolCall(call) => Some(format!(
                            "[called tool {} with {}]",
                            call.name, call.arguments
                        )),
                    })
                    .collect();
                format!("Assistant: {}", parts.join("\n"))
            }
            Message::Tool(result) => {
                let text: Vec<String> = result
                    .content
                    .iter()
                    .map(|part| match part {
                        ToolResultPart::Text { text } => text.clone(),
                        ToolResultPart::Json { value } => value.to_string(),
                        ToolResultPart::Image { .. } => "[image]".into(),
                    })
                    .collect();
                let name = result.name.as_deref().unwrap_or("tool");
                let status = if result.is_error { " (error)" } else { "" };
                format!("Result of {name}{status}: {}", text.join("\n"))
            }
        };
        out.push_str(&cut(&line, SUMMARY_MESSAGE_CHARS));
        out.push('\n');
    }
    out
}

fn cut(text: &str, limit: usize) -> String {
    if text.chars().count() <= limit {
        return text.to_owned();
    }
    let kept: String = text.chars().take(limit).collect();
    format!("{kept} […cut]")
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_types::{ToolCall, ToolResult};
    use serde_json::json;

    fn round(i: usize) -> Vec<Message> {
        vec![
            Message::Assistant {
                content: vec![AssistantPart::ToolCall(ToolCall::new(
                    format!("c{i}"),
                    "lookup",
                    json!({"i": i}),
                ))],
            },
            Message::Tool(ToolResult::text(format!("c{i}"), "x".repeat(360))),
        ]
    }

    fn conversation(rounds: usize) -> Vec<Message> {
        let mut messages = vec![Message::system("be brief"), Message::user("start")];
        for i in 0..rounds {
            messages.extend(round(i));
        }
        messages
    }

    fn policy(window: u64) -> ContextPolicy {
        ContextPolicy {
            summary_tokens: 50,
            keep_recent: 3,
            ..ContextPolicy::new(window)
        }
    }

    #[test]
    fn memories_are_split_from_the_summary() {
        let answer = "The user plans a trip.\nMEMORIES: \n- fact: Alice lives in Lyon\n\
                      - Preference: window seats\n- rumour: ignored\nnot a memory\n- decision:";
        let (summary, memories) = split_memories(answer);
        assert_eq!(summary, "The user plans a trip.");
        assert_eq!(
            memories,
            vec![
                ExtractedMemory {
                    kind: "fact".into(),
                    text: "Alice lives in Lyon".into()
                },
                ExtractedMemory {
                    kind: "preference".into(),
                    text: "window seats".into()
                },
            ]
        );
        // The marker inside a sentence is not a section.
        let (summary, memories) = split_memories("We discussed MEMORIES: none.");
        assert_eq!(summary, "We discussed MEMORIES: none.");
        assert!(memories.is_empty());
    }

    #[test]
    fn units_keep_a_call_with_its_results() {
        let messages = conversation(2);
        assert_eq!(units(&messages, 1), vec![1..2, 2..4, 4..6]);
    }

    #[test]
    fn under_the_threshold_nothing_happens() {
        let counter = TokenCounter::estimate();
        let messages = conversation(2);
        assert_eq!(
            plan(&messages, &[], &counter, &policy(10_000), None, false),
            Ok(None)
        );
    }

    #[test]
    fn compaction_keeps_the_system_prompt_and_recent_units_and_never_splits_a_pair() {
        let counter = TokenCounter::estimate();
        let messages = conversation(20);
        let policy = policy(1_500);
        let plan = plan(&messages, &[], &counter, &policy, None, false)
            .unwrap()
            .expect("over the threshold");
        // Cut on a unit boundary: the first kept message is an assistant message.
        assert!(matches!(messages[plan.cut], Message::Assistant { .. }));
        assert_eq!(plan.newly_covered.start, 1);
        let compaction = apply(None, &plan, Some("the summary".into()));
        let sent = view(&messages, Some(&compaction));
        assert_eq!(sent[0], Message::system("be brief"));
        assert!(
            matches!(&sent[1], Message::User { content } if matches!(&content[0], ContentPart::Text { text } if text.contains("the summary")))
        );
        assert!(request_tokens(&counter, &sent, &[]) <= policy.budget());
        // At most keep_recent units kept, each call followed by its result.
        assert!(sent.len() - 2 <= 2 * policy.keep_recent);
        for (i, message) in sent.iter().enumerate() {
            if let Message::Tool(result) = message {
                let Message::Assistant { .. } = &sent[i - 1] else {
                    panic!("a result without its call at {i}");
                };
                assert!(sent[i - 1].tool_calls().any(|c| c.id == result.call_id));
            }
        }
    }

    #[test]
    fn later_compactions_summarise_only_the_new_messages() {
        let counter = TokenCounter::estimate();
        let mut messages = conversation(20);
        let policy = policy(1_500);
        let first = plan(&messages, &[], &counter, &policy, None, false)
            .unwrap()
            .unwrap();
        let compaction = apply(None, &first, Some("S1".into()));
        messages.extend((20..40).flat_map(round));
        let second = plan(&messages, &[], &counter, &policy, Some(&compaction), false)
            .unwrap()
            .unwrap();
        assert_eq!(second.newly_covered.start, first.cut);
        assert!(second.cut > first.cut);
        let request = summary_request(
            compaction.summary.as_deref(),
            &messages[second.newly_covered.clone()],
            50,
        );
        let Message::User { content } = &request.messages[1] else {
            panic!("expected the prompt");
        };
        let ContentPart::Text { text } = &content[0] else {
            panic!("expected text");
        };
        assert!(text.contains("S1"));
        // c0 was summarised by the first compaction: not sent again.
        assert!(!text.contains("\"i\":0}"));
        assert!(text.contains(&format!("\"i\":{}", first.cut / 2)));
    }

    #[test]
    fn without_a_summary_model_old_units_are_dropped_with_a_marker() {
        let counter = TokenCounter::estimate();
        let messages = conversation(20);
        let plan = plan(&messages, &[], &counter, &policy(1_500), None, false)
            .unwrap()
            .unwrap();
        let compaction = apply(None, &plan, None);
        assert_eq!(compaction.dropped, plan.cut - 1);
        let sent = view(&messages, Some(&compaction));
        let Message::User { content } = &sent[1] else {
            panic!("expected the marker");
        };
        assert!(matches!(&content[0], ContentPart::Text { text } if text.contains("were removed")));
    }

    #[test]
    fn forcing_cuts_even_under_the_threshold_and_a_hopeless_case_is_an_error() {
        let counter = TokenCounter::estimate();
        let messages = conversation(4);
        let forced = plan(&messages, &[], &counter, &policy(100_000), None, true)
            .unwrap()
            .expect("forced");
        assert!(forced.cut > 1);
        let huge = vec![Message::system("s"), Message::user("y".repeat(100_000))];
        assert!(matches!(
            plan(&huge, &[], &counter, &policy(1_000), None, false),
            Err(ContextError::TooLarge { .. })
        ));
    }
}
