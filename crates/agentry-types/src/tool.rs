//! Tool specifications and tool calls.

use serde::{Deserialize, Serialize};

/// What the model is told about a tool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// The name the model calls it by.
    pub name: String,
    /// What it does and when to use it.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: serde_json::Value,
}

impl ToolSpec {
    /// A tool spec.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: serde_json::Value,
    ) -> Self {
        Self {
            name: name.into(),
            description: description.into(),
            parameters,
        }
    }
}

/// A complete tool call produced by the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id; a tool result names it. Providers that give none get a stable made-up id.
    pub id: String,
    /// The tool's name.
    pub name: String,
    /// The parsed arguments (an object; `{}` for a call with no arguments).
    pub arguments: serde_json::Value,
}

impl ToolCall {
    /// A tool call.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        Self {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }
}
