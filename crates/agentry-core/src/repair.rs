//! The history repair pass run before every model call.
//!
//! Providers reject a conversation in which a tool call has no result or a result answers no
//! call (LangGraph's `INVALID_CHAT_HISTORY`). After an interruption, a crash or a guard stop the
//! history can be in exactly that state, so before each model call every unanswered call gets an
//! explicit "interrupted" result, placed right after the calls it answers, and results that
//! answer nothing are dropped.

use std::collections::HashSet;

use agentry_types::{Message, ToolResult};

/// The text of a result made up for a call that never returned one.
pub const INTERRUPTED: &str =
    "interrupted: this tool call did not complete, so its outcome is unknown";

/// What a repair changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Repair {
    /// "interrupted" results added.
    pub added: usize,
    /// Results removed because they answered no call.
    pub removed: usize,
}

/// Makes `messages` a valid provider history: every call answered, no orphan results.
pub fn repair_history(messages: &mut Vec<Message>) -> Repair {
    let mut repair = Repair::default();
    let mut repaired = Vec::with_capacity(messages.len());
    // Calls of the latest assistant message still waiting for a result, in call order.
    let mut pending: Vec<(String, String)> = Vec::new();
    let mut answered: HashSet<String> = HashSet::new();
    for message in messages.drain(..) {
        match &message {
            Message::Tool(result) => {
                let position = pending.iter().position(|(id, _)| *id == result.call_id);
                match position {
                    Some(index) if answered.insert(result.call_id.clone()) => {
                        pending.remove(index);
                        repaired.push(message);
                    }
                    _ => repair.removed += 1,
                }
            }
            other => {
                repair.added += close_pending(&mut pending, &mut repaired);
                answered.clear();
                if let Message::Assistant { .. } = other {
                    pending = other
                        .tool_calls()
                        .map(|call| (call.id.clone(), call.name.clone()))
                        .collect();
                }
                repaired.push(message);
            }
        }
    }
    repair.added += close_pending(&mut pending, &mut repaired);
    *messages = repaired;
    repair
}

fn close_pending(pending: &mut Vec<(String, String)>, out: &mut Vec<Message>) -> usize {
    let count = pending.len();
    for (id, name) in pending.drain(..) {
        out.push(Message::Tool(ToolResult {
            name: Some(name),
            ..ToolResult::error(id, INTERRUPTED)
        }));
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_types::{AssistantPart, ToolCall};
    use serde_json::json;

    fn assistant_calling(ids: &[&str]) -> Message {
        Message::Assistant {
            content: ids
                .iter()
                .map(|id| AssistantPart::ToolCall(ToolCall::new(*id, "t", json!({}))))
                .collect(),
        }
    }

    fn result_ids(messages: &[Message]) -> Vec<String> {
        messages
            .iter()
            .filter_map(|m| match m {
                Message::Tool(r) => Some(r.call_id.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn valid_history_is_untouched() {
        let mut messages = vec![
            Message::user("hi"),
            assistant_calling(&["a", "b"]),
            Message::Tool(ToolResult::text("b", "2")),
            Message::Tool(ToolResult::text("a", "1")),
            Message::assistant("done"),
        ];
        let before = messages.clone();
        assert_eq!(repair_history(&mut messages), Repair::default());
        assert_eq!(messages, before);
    }

    #[test]
    fn missing_results_get_interrupted_results_in_place() {
        let mut messages = vec![
            Message::user("hi"),
            assistant_calling(&["a", "b"]),
            Message::Tool(ToolResult::text("a", "1")),
            Message::user("are you there?"),
            assistant_calling(&["c"]),
        ];
        let repair = repair_history(&mut messages);
        assert_eq!(
            repair,
            Repair {
                added: 2,
                removed: 0
            }
        );
        assert_eq!(result_ids(&messages), vec!["a", "b", "c"]);
        // b's made-up result sits before the next user message.
        assert!(matches!(&messages[3], Message::Tool(r) if r.call_id == "b" && r.is_error));
        assert!(matches!(&messages[4], Message::User { .. }));
        assert!(matches!(messages.last(), Some(Message::Tool(r)) if r.call_id == "c"));
    }

    #[test]
    fn orphan_and_duplicate_results_are_dropped() {
        let mut messages = vec![
            Message::user("hi"),
            Message::Tool(ToolResult::text("ghost", "?")),
            assistant_calling(&["a"]),
            Message::Tool(ToolResult::text("a", "1")),
            Message::Tool(ToolResult::text("a", "again")),
            Message::Tool(ToolResult::text("zzz", "?")),
        ];
        let repair = repair_history(&mut messages);
        assert_eq!(
            repair,
            Repair {
                added: 0,
                removed: 3
            }
        );
        assert_eq!(result_ids(&messages), vec!["a"]);
    }
}
