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

/// What a model costs, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelPrice {
    /// Per million prompt tokens not served from a cache.
    pub input: f64,
    /// Per million prompt tokens read from the provider's cache (default: `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input: Option<f64>,
    /// Per million prompt tokens written to the provider's cache (default: `input`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    /// Per million generated tokens (reasoning included).
    pub output: f64,
}

impl ModelPrice {
    /// A price of `input` and `output` dollars per million tokens, cached input at `input`.
    pub fn new(input: f64, output: f64) -> Self {
        Self {
            input,
            output,
            ..Self::default()
        }
    }

    /// Whether every rate is a finite number, zero or more.
    pub fn is_valid(&self) -> bool {
        [
            Some(self.input),
            self.cached_input,
            self.cache_write,
            Some(self.output),
        ]
        .into_iter()
        .flatten()
        .all(|rate| rate.is_finite() && rate >= 0.0)
    }

    /// What `usage` costs, in dollars. Cached and cache-written prompt tokens are part of
    /// `input_tokens` and are charged at their own rates instead of `input`'s.
    pub fn cost(&self, usage: &Usage) -> f64 {
        let cached = usage.cached_input_tokens.min(usage.input_tokens);
        let written = usage
            .cache_creation_input_tokens
            .min(usage.input_tokens - cached);
        let fresh = usage.input_tokens - cached - written;
        let per_token = |rate: f64| rate / 1_000_000.0;
        fresh as f64 * per_token(self.input)
            + cached as f64 * per_token(self.cached_input.unwrap_or(self.input))
            + written as f64 * per_token(self.cache_write.unwrap_or(self.input))
            + usage.output_tokens as f64 * per_token(self.output)
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

#[cfg(test)]
mod tests {
    use super::{ModelPrice, Usage};

    #[test]
    fn cached_and_written_prompt_tokens_are_charged_at_their_own_rates() {
        let price = ModelPrice {
            input: 3.0,
            cached_input: Some(0.3),
            cache_write: Some(3.75),
            output: 15.0,
        };
        let usage = Usage {
            input_tokens: 1_000_000,
            cached_input_tokens: 400_000,
            cache_creation_input_tokens: 100_000,
            output_tokens: 200_000,
            reasoning_tokens: 50_000,
        };
        // 500k fresh at $3, 400k cached at $0.30, 100k written at $3.75, 200k out at $15.
        let expected = 1.5 + 0.12 + 0.375 + 3.0;
        assert!((price.cost(&usage) - expected).abs() < 1e-9);
        // Without cache rates every prompt token costs `input`.
        let plain = ModelPrice::new(3.0, 15.0);
        assert!((plain.cost(&usage) - 6.0).abs() < 1e-9);
    }

    #[test]
    fn counts_that_disagree_never_underflow_and_bad_rates_are_invalid() {
        let usage = Usage {
            input_tokens: 10,
            cached_input_tokens: 30,
            cache_creation_input_tokens: 30,
            output_tokens: 0,
            reasoning_tokens: 0,
        };
        let price = ModelPrice {
            cached_input: Some(1.0),
            ..ModelPrice::new(2.0, 0.0)
        };
        assert!((price.cost(&usage) - 10.0 / 1_000_000.0).abs() < 1e-12);
        assert!(price.is_valid());
        assert!(!ModelPrice::new(-1.0, 1.0).is_valid());
        assert!(!ModelPrice::new(f64::NAN, 1.0).is_valid());
    }
}
