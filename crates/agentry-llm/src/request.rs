//! What a caller asks of a model: the conversation, the tools, and generation parameters.

use agentry_types::{Message, ToolSpec};
use serde::{Deserialize, Serialize};

/// One model call's input, independent of the provider.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelRequest {
    /// The conversation, system messages included.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolSpec>,
    /// Sampling and length parameters.
    #[serde(default)]
    pub params: GenerationParams,
}

impl ModelRequest {
    /// A request with these messages and no tools.
    pub fn new(messages: Vec<Message>) -> Self {
        Self {
            messages,
            ..Self::default()
        }
    }

    /// Adds tools.
    pub fn with_tools(mut self, tools: Vec<ToolSpec>) -> Self {
        self.tools = tools;
        self
    }

    /// Replaces the parameters.
    pub fn with_params(mut self, params: GenerationParams) -> Self {
        self.params = params;
        self
    }
}

/// Generation parameters. Unset fields are left to the provider's defaults (Anthropic, which
/// requires `max_tokens`, gets its provider module's `DEFAULT_MAX_TOKENS`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GenerationParams {
    /// Upper bound on generated tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus sampling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Extended thinking / reasoning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thinking: Option<ThinkingConfig>,
    /// Extra top-level fields merged into the provider request body as they are (for Ollama,
    /// into `options`), for parameters this type does not name.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

/// How much the model may think before answering.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ThinkingConfig {
    /// Token budget for thinking (Anthropic `budget_tokens`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget_tokens: Option<u32>,
    /// Reasoning effort (`low`, `medium`, `high`) for OpenAI reasoning models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<String>,
}
