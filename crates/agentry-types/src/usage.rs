//! Token usage and why a model stopped.

use serde::{Deserialize, Serialize};

/// Tokens counted by the provider for one model call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, including cached ones.
    pub input_tokens: u64,
    /// Generated tokens, including reasoning tokens.
    pub output_tokens: u64,
    /// Prompt tokens served from the provider's cache.
    #[serde(default)]
    pub cached_input_tokens: u64,
    /// Prompt tokens written to the provider's cache (Anthropic).
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
    /// Output tokens spent on reasoning.
    #[serde(default)]
    pub reasoning_tokens: u64,
}

impl Usage {
    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens + self.output_tokens
    }

    /// Adds another call's usage to this one.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        self.cached_input_tokens += other.cached_input_tokens;
        self.cache_creation_input_tokens += other.cache_creation_input_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
    }
}

/// Why the model stopped generating.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model finished its answer.
    EndTurn,
    /// The model wants tools run.
    ToolUse,
    /// The output token limit cut the answer short.
    MaxTokens,
    /// A stop sequence matched.
    StopSequence,
    /// The provider's content filter stopped it.
    ContentFilter,
    /// The model refused.
    Refusal,
    /// A reason this version does not know, as the provider spelled it.
    Other(String),
}

impl StopReason {
    /// Maps an OpenAI `finish_reason` (and the spellings of compatible servers).
    pub fn from_openai(reason: &str) -> Self {
        match reason {
            "stop" | "eos" => Self::EndTurn,
            "tool_calls" | "function_call" => Self::ToolUse,
            "length" => Self::MaxTokens,
            "content_filter" => Self::ContentFilter,
            other => Self::Other(other.to_owned()),
        }
    }

    /// Maps an Anthropic `stop_reason`.
    pub fn from_anthropic(reason: &str) -> Self {
        match reason {
            "end_turn" | "pause_turn" => Self::EndTurn,
            "tool_use" => Self::ToolUse,
            "max_tokens" | "model_context_window_exceeded" => Self::MaxTokens,
            "stop_sequence" => Self::StopSequence,
            "refusal" => Self::Refusal,
            other => Self::Other(other.to_owned()),
        }
    }

    /// Maps an Ollama `done_reason`.
    pub fn from_ollama(reason: &str) -> Self {
        match reason {
            "stop" => Self::EndTurn,
            "length" => Self::MaxTokens,
            other => Self::Other(other.to_owned()),
        }
    }
}
