//! Scripted assistant turns: what the mock should "say" (thinking, text, tool calls, usage),
//! independent of the wire protocol it is rendered in.

/// One assistant turn to serve, rendered in whatever protocol the request's path implies.
///
/// Rendered block order is thinking, text, tool calls (the order real providers use).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScriptedTurn {
    /// Reasoning text: Anthropic `thinking` block, OpenAI `reasoning_content`, Ollama
    /// `message.thinking`.
    pub thinking: Option<String>,
    /// Anthropic thinking signature (`signature_delta`); ignored by the other protocols.
    pub thinking_signature: Option<String>,
    /// Visible assistant text.
    pub text: Option<String>,
    /// Tool calls, in order.
    pub tool_calls: Vec<ScriptedToolCall>,
    /// Prompt tokens to report.
    pub input_tokens: u64,
    /// Completion tokens to report.
    pub output_tokens: u64,
    /// Protocol-native stop reason override (`"length"`, `"max_tokens"`, ...). When `None`:
    /// OpenAI `tool_calls`/`stop`, Anthropic `tool_use`/`end_turn`, Ollama `stop`.
    pub stop_reason: Option<String>,
}

/// One scripted tool call.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedToolCall {
    /// Call id; `None` generates `call_<n>` (OpenAI) or `toolu_<n>` (Anthropic), where `n` is
    /// the 1-based position of the call in its turn. Ollama sends no ids.
    pub id: Option<String>,
    /// Tool name.
    pub name: String,
    /// Tool arguments as a JSON value (normally an object).
    pub arguments: serde_json::Value,
}

impl ScriptedToolCall {
    /// A call to `name` with `arguments` and a generated id.
    pub fn new(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        ScriptedToolCall {
            id: None,
            name: name.into(),
            arguments,
        }
    }

    /// Sets an explicit call id.
    pub fn with_id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }
}

impl ScriptedTurn {
    /// A turn that only answers with `text`.
    pub fn text(text: impl Into<String>) -> Self {
        ScriptedTurn::default().with_text(text)
    }

    /// A turn that only calls tool `name` with `arguments`.
    pub fn tool_call(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        ScriptedTurn::default().with_tool_call(name, arguments)
    }

    /// Adds reasoning text and its (Anthropic) signature.
    pub fn with_thinking(mut self, text: impl Into<String>, signature: impl Into<String>) -> Self {
        self.thinking = Some(text.into());
        self.thinking_signature = Some(signature.into());
        self
    }

    /// Appends a tool call with a generated id.
    pub fn with_tool_call(self, name: impl Into<String>, arguments: serde_json::Value) -> Self {
        self.with_scripted_call(ScriptedToolCall::new(name, arguments))
    }

    /// Appends a fully specified tool call (e.g. one with an explicit id).
    pub fn with_scripted_call(mut self, call: ScriptedToolCall) -> Self {
        self.tool_calls.push(call);
        self
    }

    /// Sets the visible text.
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = Some(text.into());
        self
    }

    /// Sets the reported token usage.
    pub fn with_usage(mut self, input_tokens: u64, output_tokens: u64) -> Self {
        self.input_tokens = input_tokens;
        self.output_tokens = output_tokens;
        self
    }

    /// Overrides the protocol-native stop reason.
    pub fn with_stop_reason(mut self, stop_reason: impl Into<String>) -> Self {
        self.stop_reason = Some(stop_reason.into());
        self
    }

    /// The call id sent for the tool call at `index`, given the protocol's id prefix.
    pub(crate) fn call_id(&self, index: usize, prefix: &str) -> String {
        match self.tool_calls.get(index).and_then(|c| c.id.clone()) {
            Some(id) => id,
            None => format!("{prefix}{}", index + 1),
        }
    }

    /// Text that is present and non-empty.
    pub(crate) fn visible_text(&self) -> Option<&str> {
        self.text.as_deref().filter(|t| !t.is_empty())
    }

    /// Thinking that is present and non-empty.
    pub(crate) fn visible_thinking(&self) -> Option<&str> {
        self.thinking.as_deref().filter(|t| !t.is_empty())
    }
}
