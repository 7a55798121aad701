//! Token accounting: how many tokens a request takes, and how large a model's window is.
//!
//! A [`TokenCounter`] counts with the model's real tokenizer where one is known (tiktoken's
//! `o200k_base` / `cl100k_base` for OpenAI models, via `tiktoken-rs`), and otherwise with a
//! character-based estimate. Either way, the provider's reported usage is the ground truth: after
//! each call, [`TokenCounter::observe`] compares what was estimated for the request with the
//! input tokens the provider billed, and the counter's calibration factor moves towards the
//! observed ratio, so the estimate for an unknown tokenizer (or a provider's hidden per-message
//! overhead) converges within a few calls.
//!
//! [`known_context_window`] gives a model's window when it is a known one; a configured window,
//! and the window the provider states (the window module asks it), win over it.

use std::sync::{Arc, Mutex, PoisonError};

use agentry_types::{AssistantPart, ContentPart, Message, Thinking, ToolResultPart, ToolSpec};
use tiktoken_rs::CoreBPE;

use crate::provider::Protocol;
use crate::request::ModelRequest;

/// Tokens an image or audio part is counted as (a high-detail 1024×1024 image is 765 tokens on
/// OpenAI and about 1,400 on Anthropic; calibration corrects the rest).
pub const MEDIA_PART_TOKENS: u64 = 1_000;

/// Tokens every message costs beyond its content (role markers and separators).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 4;

/// Tokens the reply primer costs once per request.
pub const REQUEST_OVERHEAD_TOKENS: u64 = 3;

/// Characters per token assumed for text when the tokenizer is unknown (English prose and code
/// average 3.5–4.2 on the BPE tokenizers in use; the lower value errs towards compacting early).
pub const DEFAULT_CHARS_PER_TOKEN: f64 = 3.6;

/// The window assumed for a model nobody configured and this table does not know. Small on
/// purpose: compacting too early is cheap; overflowing is a failed call.
pub const FALLBACK_CONTEXT_WINDOW: u64 = 8_192;

/// The smallest context window a model may be configured with.
pub const MIN_CONTEXT_WINDOW: u64 = 256;

/// What a model can take: its window and the counter for its tokens.
#[derive(Debug, Clone)]
pub struct ModelContext {
    /// The context window, in tokens.
    pub window: u64,
    /// Whether the window was configured or known (not the fallback guess).
    pub window_known: bool,
    /// Counts the model's tokens (shared calibration).
    pub counter: TokenCounter,
}

impl ModelContext {
    /// A model nothing is known about: [`FALLBACK_CONTEXT_WINDOW`] and an estimate.
    pub fn unknown() -> Self {
        Self {
            window: FALLBACK_CONTEXT_WINDOW,
            window_known: false,
            counter: TokenCounter::estimate(),
        }
    }
}

/// The bounds of the calibration factor: a provider reporting numbers far outside them is more
/// likely wrong than the estimate.
const CALIBRATION_RANGE: (f64, f64) = (0.25, 4.0);

/// Weight of the newest observation in the calibration factor's moving average.
const CALIBRATION_WEIGHT: f64 = 0.5;

/// How text is turned into a token count.
#[derive(Clone)]
enum Tokenizer {
    /// The model's own BPE.
    Exact {
        bpe: &'static CoreBPE,
        name: &'static str,
    },
    /// Characters divided by an average.
    Estimate,
}

/// Counts tokens for one model; see the module docs. Cheap to clone: clones share their
/// calibration.
#[derive(Clone)]
pub struct TokenCounter {
    tokenizer: Tokenizer,
    calibration: Arc<Mutex<f64>>,
}

impl std::fmt::Debug for TokenCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCounter")
            .field("tokenizer", &self.tokenizer_name())
            .field("calibration", &self.calibration())
            .finish()
    }
}

impl TokenCounter {
    /// The counter for `model` spoken to over `protocol`: the exact tokenizer for OpenAI models
    /// tiktoken knows, the calibrated estimate otherwise.
    pub fn for_model(protocol: Protocol, model: &str) -> Self {
        let tokenizer = match protocol {
            Protocol::OpenAi | Protocol::OpenAiResponses => {
                exact_tokenizer(model).unwrap_or(Tokenizer::Estimate)
            }
            Protocol::Anthropic | Protocol::Ollama | Protocol::A2a => Tokenizer::Estimate,
        };
        Self {
            tokenizer,
            calibration: Arc::new(Mutex::new(1.0)),
        }
    }

    /// A counter that always estimates (for tests and unknown models).
    pub fn estimate() -> Self {
        Self {
            tokenizer: Tokenizer::Estimate,
            calibration: Arc::new(Mutex::new(1.0)),
        }
    }

    /// The tokenizer's name: `o200k_base`, `cl100k_base`, … or `estimate`.
    pub fn tokenizer_name(&self) -> &'static str {
        match &self.tokenizer {
            Tokenizer::Exact { name, .. } => name,
            Tokenizer::Estimate => "estimate",
        }
    }

    /// Whether counts come from the model's own tokenizer.
    pub fn is_exact(&self) -> bool {
        matches!(self.tokenizer, Tokenizer::Exact { .. })
    }

    /// The factor raw counts are multiplied by, learnt from the provider's reported usage.
    pub fn calibration(&self) -> f64 {
        *self
            .calibration
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Tokens of a piece of text (uncalibrated).
    pub fn count_text(&self, text: &str) -> u64 {
        if text.is_empty() {
            return 0;
        }
        match &self.tokenizer {
            Tokenizer::Exact { bpe, .. } => bpe.encode_ordinary(text).len() as u64,
            Tokenizer::Estimate => {
                let chars = text.chars().count() as f64;
                (chars / DEFAULT_CHARS_PER_TOKEN).ceil() as u64
            }
        }
    }

    /// Tokens of one message, its overhead included (uncalibrated).
    pub fn count_message(&self, message: &Message) -> u64 {
        let content = match message {
            Message::System { text } => self.count_text(text),
            Message::User { content } => content
                .iter()
                .map(|part| match part {
                    ContentPart::Text { text } => self.count_text(text),
                    ContentPart::Image { .. } | ContentPart::Audio { .. } => MEDIA_PART_TOKENS,
                })
                .sum(),
            Message::Assistant { content } => content
                .iter()
                .map(|part| match part {
                    AssistantPart::Text { text } => self.count_text(text),
                    AssistantPart::Thinking(Thinking::Text { text, .. }) => self.count_text(text),
                    // Opaque to us; providers bill it by its decoded size, about this.
                    AssistantPart::Thinking(Thinking::Redacted { data }) => {
                        (data.len() as u64).div_ceil(4)
                    }
                    AssistantPart::ToolCall(call) => {
                        self.count_text(&call.name)
                            + self.count_text(&call.arguments.to_string())
                            + MESSAGE_OVERHEAD_TOKENS
                    }
                })
                .sum(),
            Message::Tool(result) => result
                .content
                .iter()
                .map(|part| match part {
                    ToolResultPart::Text { text } => self.count_text(text),
                    ToolResultPart::Json { value } => self.count_text(&value.to_string()),
                    ToolResultPart::Image { .. } => MEDIA_PART_TOKENS,
                })
                .sum(),
        };
        content + MESSAGE_OVERHEAD_TOKENS
    }

    /// Tokens of the tool definitions offered (uncalibrated).
    pub fn count_tools(&self, tools: &[ToolSpec]) -> u64 {
        tools
            .iter()
            .map(|tool| {
                self.count_text(&tool.name)
                    + self.count_text(&tool.description)
                    + self.count_text(&tool.parameters.to_string())
                    + MESSAGE_OVERHEAD_TOKENS
            })
            .sum()
    }

    /// Tokens of a whole request before calibration: messages, tools and the reply primer.
    pub fn count_request_raw(&self, request: &ModelRequest) -> u64 {
        let messages: u64 = request.messages.iter().map(|m| self.count_message(m)).sum();
        messages + self.count_tools(&request.tools) + REQUEST_OVERHEAD_TOKENS
    }

    /// The input tokens `request` is expected to take: the raw count, calibrated.
    pub fn count_request(&self, request: &ModelRequest) -> u64 {
        self.calibrated(self.count_request_raw(request))
    }

    /// A raw count, calibrated.
    pub fn calibrated(&self, raw: u64) -> u64 {
        (raw as f64 * self.calibration()).ceil() as u64
    }

    /// The provider billed `reported` input tokens for a request whose raw count was `raw`:
    /// moves the calibration factor towards their ratio. Ignores empty reports (some servers
    /// send zeros when they do not count).
    pub fn observe(&self, raw: u64, reported: u64) {
        if raw == 0 || reported == 0 {
            return;
        }
        let ratio = (reported as f64 / raw as f64).clamp(CALIBRATION_RANGE.0, CALIBRATION_RANGE.1);
        let mut factor = self
            .calibration
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *factor = (*factor * (1.0 - CALIBRATION_WEIGHT) + ratio * CALIBRATION_WEIGHT)
            .clamp(CALIBRATION_RANGE.0, CALIBRATION_RANGE.1);
    }
}

fn exact_tokenizer(model: &str) -> Option<Tokenizer> {
    use tiktoken_rs::tokenizer::{Tokenizer as Kind, get_tokenizer};
    let (bpe, name) = match get_tokenizer(model)? {
        Kind::O200kBase | Kind::O200kHarmony => (tiktoken_rs::o200k_base_singleton(), "o200k_base"),
        Kind::Cl100kBase => (tiktoken_rs::cl100k_base_singleton(), "cl100k_base"),
        Kind::P50kBase | Kind::P50kEdit => (tiktoken_rs::p50k_base_singleton(), "p50k_base"),
        Kind::R50kBase | Kind::Gpt2 => (tiktoken_rs::r50k_base_singleton(), "r50k_base"),
    };
    Some(Tokenizer::Exact { bpe, name })
}

/// The context window of a known model, in tokens; `None` when the model is not known (the
/// caller then uses a configured window or [`FALLBACK_CONTEXT_WINDOW`]).
pub fn known_context_window(protocol: Protocol, model: &str) -> Option<u64> {
    let model = model.trim().to_ascii_lowercase();
    match protocol {
        Protocol::OpenAi | Protocol::OpenAiResponses => {
            tiktoken_rs::model::get_context_size(&model).map(|size| size as u64)
        }
        Protocol::Anthropic => model.starts_with("claude").then_some(200_000),
        // Ollama's window is the `num_ctx` it runs with, not the model's; its default is 4096
        // (2048 before 0.6): anything more must be configured, here and in `options`.
        Protocol::Ollama => Some(4_096),
        // A remote agent keeps its own context: only the new message travels.
        Protocol::A2a => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentry_types::{ToolCall, ToolResult};
    use serde_json::json;

    #[test]
    fn openai_models_are_counted_with_their_own_tokenizer() {
        let counter = TokenCounter::for_model(Protocol::OpenAi, "gpt-4o-mini");
        assert!(counter.is_exact());
        assert_eq!(counter.tokenizer_name(), "o200k_base");
        // "hello world" is two tokens in o200k_base.
        assert_eq!(counter.count_text("hello world"), 2);
        let old = TokenCounter::for_model(Protocol::OpenAi, "gpt-4");
        assert_eq!(old.tokenizer_name(), "cl100k_base");
        // An OpenAI-compatible server's own model name: estimated.
        let local = TokenCounter::for_model(Protocol::OpenAi, "qwen2.5:7b");
        assert!(!local.is_exact());
    }

    #[test]
    fn estimates_count_characters_and_every_part() {
        let counter = TokenCounter::for_model(Protocol::Anthropic, "claude-sonnet-4-5");
        assert!(!counter.is_exact());
        assert_eq!(counter.count_text(&"a".repeat(36)), 10);
        let request = ModelRequest {
            messages: vec![
                Message::system("s".repeat(36)),
                Message::user("u".repeat(72)),
                Message::Assistant {
                    content: vec![AssistantPart::ToolCall(ToolCall::new(
                        "c1",
                        "lookup",
                        json!({"q": "x"}),
                    ))],
                },
                Message::Tool(ToolResult::text("c1", "r".repeat(36))),
            ],
            tools: vec![ToolSpec {
                name: "lookup".into(),
                description: "d".repeat(36),
                parameters: json!({"type": "object"}),
            }],
            params: Default::default(),
        };
        let raw = counter.count_request_raw(&request);
        // 10 + 20 + (2 + 3 + 4) + 10 message tokens, 4 × 4 overhead, the tool (2 + 10 + 5 + 4),
        // the primer 3.
        assert_eq!(raw, 10 + 20 + 9 + 10 + 16 + 21 + 3);
        assert_eq!(counter.count_request(&request), raw);
    }

    #[test]
    fn reported_usage_calibrates_the_estimate() {
        let counter = TokenCounter::estimate();
        // The provider keeps billing 1.5× the estimate: the factor converges towards 1.5.
        for _ in 0..8 {
            counter.observe(1_000, 1_500);
        }
        assert!((counter.calibration() - 1.5).abs() < 0.01, "{counter:?}");
        assert_eq!(counter.calibrated(100), 150);
        // Zeros (a server that does not count) are ignored; absurd ratios are clamped.
        counter.observe(1_000, 0);
        assert!((counter.calibration() - 1.5).abs() < 0.01);
        for _ in 0..20 {
            counter.observe(1, 1_000_000);
        }
        assert!(counter.calibration() <= CALIBRATION_RANGE.1);
        // Clones share what they learnt.
        let clone = counter.clone();
        clone.observe(1_000, 250);
        assert_eq!(clone.calibration(), counter.calibration());
    }

    #[test]
    fn known_windows() {
        assert_eq!(
            known_context_window(Protocol::OpenAi, "gpt-4o"),
            Some(128_000)
        );
        assert_eq!(
            known_context_window(Protocol::Anthropic, "claude-opus-4-1"),
            Some(200_000)
        );
        assert_eq!(
            known_context_window(Protocol::Ollama, "llama3.2"),
            Some(4_096)
        );
        assert_eq!(
            known_context_window(Protocol::OpenAi, "my-local-model"),
            None
        );
    }
}
