//! MCP results in Agentry's vocabulary.
//!
//! A `tools/call` result keeps everything the server sent: text parts as text, images as images
//! (base64 with their MIME type), embedded text resources as text, other parts (audio, binary
//! resources, resource links) as JSON so nothing is lost, the structured content, and `isError`.

use agentry_types::{ImageSource, ToolResultPart};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What an MCP tool call returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct McpToolResult {
    /// The content parts, in order.
    pub content: Vec<ToolResultPart>,
    /// The structured result, when the server gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub structured_content: Option<Value>,
    /// Whether the server flagged the result as a tool error (`isError`).
    #[serde(default)]
    pub is_error: bool,
}

impl McpToolResult {
    /// The parts a model sees: the content, then the structured content as a JSON part unless a
    /// text part already carries exactly that JSON (servers are asked to send both).
    pub fn parts_for_model(&self) -> Vec<ToolResultPart> {
        let mut parts = self.content.clone();
        if let Some(structured) = &self.structured_content {
            let repeated = self.content.iter().any(|part| match part {
                ToolResultPart::Text { text } => {
                    serde_json::from_str::<Value>(text).is_ok_and(|value| &value == structured)
                }
                ToolResultPart::Json { value } => value == structured,
                ToolResultPart::Image { .. } => false,
            });
            if !repeated {
                parts.push(ToolResultPart::Json {
                    value: structured.clone(),
                });
            }
        }
        parts
    }
}

/// Converts one MCP content block (as JSON) into a result part.
pub(crate) fn content_part(block: &Value) -> ToolResultPart {
    let kind = block
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let text = |key: &str| block.get(key).and_then(Value::as_str);
    match kind {
        "text" => ToolResultPart::Text {
            text: text("text").unwrap_or_default().to_owned(),
        },
        "image" => match (text("data"), text("mimeType")) {
            (Some(data), Some(media_type)) => ToolResultPart::Image {
                source: ImageSource::Base64 {
                    media_type: media_type.to_owned(),
                    data: data.to_owned(),
                },
            },
            _ => ToolResultPart::Json {
                value: block.clone(),
            },
        },
        "resource" => match block
            .get("resource")
            .and_then(|resource| resource.get("text"))
        {
            Some(Value::String(resource_text)) => ToolResultPart::Text {
                text: resource_text.clone(),
            },
            _ => ToolResultPart::Json {
                value: block.clone(),
            },
        },
        _ => ToolResultPart::Json {
            value: block.clone(),
        },
    }
}

/// Converts a `tools/call` result.
pub(crate) fn tool_result(result: &rmcp::model::CallToolResult) -> McpToolResult {
    let content = result
        .content
        .iter()
        .map(|block| {
            serde_json::to_value(block).map_or_else(
                |error| ToolResultPart::Text {
                    text: format!("[a content part that could not be read: {error}]"),
                },
                |value| content_part(&value),
            )
        })
        .collect();
    McpToolResult {
        content,
        structured_content: result.structured_content.clone(),
        is_error: result.is_error.unwrap_or(false),
    }
}
