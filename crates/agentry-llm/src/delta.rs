//! The normalised items every provider stream is decoded into.
//!
//! Provider decoders turn their wire events into [`Delta`]s; the [`crate::Accumulator`] folds
//! deltas into live [`agentry_types::ModelEvent`]s and the final response. Nothing
//! protocol-specific survives past this point.

use agentry_types::StopReason;

/// One normalised piece of a provider's response.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Delta {
    /// Response metadata.
    Meta {
        id: Option<String>,
        model: Option<String>,
    },
    /// Answer text.
    Text(String),
    /// Reasoning text.
    Thinking(String),
    /// The signature closing the current thinking part.
    ThinkingSignature(String),
    /// A whole redacted thinking payload.
    RedactedThinking(String),
    /// The provider closed a content block: the next text or thinking starts a new part.
    BlockEnd,
    /// A tool call's id and/or name, keyed by the provider's index (may repeat).
    ToolCallStart {
        key: u64,
        id: Option<String>,
        name: Option<String>,
    },
    /// A fragment of a tool call's arguments JSON.
    ToolCallArguments { key: u64, fragment: String },
    /// A whole tool call whose arguments came as a JSON value (Ollama, non-streamed bodies).
    ToolCallWhole {
        key: u64,
        id: Option<String>,
        name: String,
        arguments: serde_json::Value,
    },
    /// Token counts; absent fields leave earlier values in place.
    Usage(UsageUpdate),
    /// Why generation stopped.
    Stop(StopReason),
    /// The provider said the response is complete.
    Done,
}

/// A partial usage report.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct UsageUpdate {
    pub(crate) input_tokens: Option<u64>,
    pub(crate) output_tokens: Option<u64>,
    pub(crate) cached_input_tokens: Option<u64>,
    pub(crate) cache_creation_input_tokens: Option<u64>,
    pub(crate) reasoning_tokens: Option<u64>,
}
