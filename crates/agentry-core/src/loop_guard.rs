//! Loop detection: the same tool called with the same arguments again and again.
//!
//! Every call is fingerprinted (tool name + canonical JSON of its arguments) into a sliding
//! window of recent calls. When a fingerprint occurs `warn_at` times in the window, the model
//! gets a warning with that call's result; at `stop_at` the run stops with `loop_detected`.
//! Counting occurrences in a window catches direct repetition (A, A, A) and cycles
//! (A, B, A, B) alike.

use std::collections::VecDeque;

use agentry_types::ToolCall;
use serde::{Deserialize, Serialize};

/// Loop-detection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopLimits {
    /// How many recent calls are remembered.
    pub window: usize,
    /// Occurrences in the window at which the model is warned.
    pub warn_at: usize,
    /// Occurrences in the window at which the run stops.
    pub stop_at: usize,
}

impl Default for LoopLimits {
    fn default() -> Self {
        Self {
            window: 12,
            warn_at: 3,
            stop_at: 4,
        }
    }
}

/// What the detector concluded about one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoopVerdict {
    /// Nothing unusual.
    Fine,
    /// The call repeats; the model should be told.
    Warn(String),
    /// The call repeats too often; the run must stop.
    Stop(String),
}

/// The sliding window of recent call fingerprints. Serialisable with the run state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopDetector {
    recent: VecDeque<String>,
}

impl LoopDetector {
    /// Records `call` and says whether it makes a loop.
    pub fn observe(&mut self, call: &ToolCall, limits: &LoopLimits) -> LoopVerdict {
        let fingerprint = fingerprint(call);
        self.recent.push_back(fingerprint.clone());
        while self.recent.len() > limits.window.max(1) {
            self.recent.pop_front();
        }
        let count = self.recent.iter().filter(|f| **f == fingerprint).count();
        let described = format!(
            "{} was called with the same arguments {count} times in the last {} tool calls",
            call.name,
            self.recent.len()
        );
        if count >= limits.stop_at {
            LoopVerdict::Stop(described)
        } else if count >= limits.warn_at {
            LoopVerdict::Warn(format!(
                "warning: {described}. Repeating it will not give a different result; change \
                 the arguments, try another approach, or answer with what you have. The run \
                 will be stopped if this continues."
            ))
        } else {
            LoopVerdict::Fine
        }
    }
}

/// Tool name plus canonical arguments (serde_json sorts object keys).
fn fingerprint(call: &ToolCall) -> String {
    format!("{}\u{1f}{}", call.name, call.arguments)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, args: serde_json::Value) -> ToolCall {
        ToolCall::new("id", name, args)
    }

    #[test]
    fn direct_repetition_warns_then_stops() {
        let limits = LoopLimits::default();
        let mut detector = LoopDetector::default();
        let a = call("search", json!({"q": "x"}));
        assert_eq!(detector.observe(&a, &limits), LoopVerdict::Fine);
        assert_eq!(detector.observe(&a, &limits), LoopVerdict::Fine);
        assert!(matches!(
            detector.observe(&a, &limits),
            LoopVerdict::Warn(_)
        ));
        assert!(matches!(
            detector.observe(&a, &limits),
            LoopVerdict::Stop(_)
        ));
    }

    #[test]
    fn alternation_is_a_loop_too() {
        let limits = LoopLimits::default();
        let mut detector = LoopDetector::default();
        let a = call("a", json!({}));
        let b = call("b", json!({"k": 1}));
        let verdicts: Vec<_> = [&a, &b, &a, &b, &a, &b, &a]
            .into_iter()
            .map(|c| detector.observe(c, &limits))
            .collect();
        assert!(matches!(verdicts[4], LoopVerdict::Warn(_)));
        assert!(matches!(verdicts[5], LoopVerdict::Warn(_)));
        assert!(matches!(verdicts[6], LoopVerdict::Stop(_)));
    }

    #[test]
    fn different_arguments_and_key_order() {
        let limits = LoopLimits::default();
        let mut detector = LoopDetector::default();
        for i in 0..10 {
            let verdict = detector.observe(&call("a", json!({"i": i})), &limits);
            assert_eq!(verdict, LoopVerdict::Fine);
        }
        // Same arguments in another key order are the same call.
        let one = call("a", serde_json::from_str(r#"{"x":1,"y":2}"#).unwrap());
        let two = call("a", serde_json::from_str(r#"{"y":2,"x":1}"#).unwrap());
        detector.observe(&one, &limits);
        detector.observe(&two, &limits);
        assert!(matches!(
            detector.observe(&one, &limits),
            LoopVerdict::Warn(_)
        ));
    }

    #[test]
    fn old_calls_leave_the_window() {
        let limits = LoopLimits {
            window: 3,
            warn_at: 2,
            stop_at: 3,
        };
        let mut detector = LoopDetector::default();
        let a = call("a", json!({}));
        detector.observe(&a, &limits);
        for i in 0..3 {
            detector.observe(&call("b", json!({"i": i})), &limits);
        }
        assert_eq!(detector.observe(&a, &limits), LoopVerdict::Fine);
    }
}
