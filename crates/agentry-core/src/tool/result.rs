//! Turning tool outcomes into what the model (or a direct caller) sees.
//!
//! [`result_for_model`] builds the [`ToolResult`] sent back to the model: errors become text the
//! model can act on, flagged `is_error`, and large results are cut to a byte budget with a note
//! saying how much was shown. [`format_output`] shapes a result for a direct call: plain text, or
//! JSON parsed from the result (a JSON part, JSON text, or a fenced JSON block in prose).

use agentry_types::{ImageSource, ToolCall, ToolResult, ToolResultPart};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{ToolError, ToolOutput};

/// The default byte budget of one tool result sent to the model.
pub const DEFAULT_RESULT_LIMIT: usize = 64 * 1024;

/// How many characters of a non-JSON result a "not JSON" error quotes.
const NOT_JSON_QUOTE_CHARS: usize = 200;

/// Builds the result the model sees for one call.
///
/// A success keeps its parts, in order, within `max_bytes` of text and JSON in total: a text part
/// past the budget is cut on a character boundary and gets a note
/// `[… truncated: showed N of M bytes]`; a JSON part past it is serialised and cut the same way.
/// Images are passed through. An error becomes a text part `error: …` with `is_error` set; so
/// does a result whose tool flagged it (`ToolOutput::is_error`), its content kept.
pub fn result_for_model(
    call: &ToolCall,
    outcome: Result<ToolOutput, ToolError>,
    max_bytes: usize,
) -> ToolResult {
    let (content, is_error) = match outcome {
        Ok(output) => (cap_parts(output.content, max_bytes), output.is_error),
        Err(error) => {
            let text = cap_text(format!("error: {error}"), max_bytes);
            (vec![ToolResultPart::Text { text }], true)
        }
    };
    ToolResult {
        call_id: call.id.clone(),
        name: Some(call.name.clone()),
        content,
        is_error,
    }
}

/// Cuts the parts to a shared byte budget.
fn cap_parts(parts: Vec<ToolResultPart>, max_bytes: usize) -> Vec<ToolResultPart> {
    let mut remaining = max_bytes;
    parts
        .into_iter()
        .map(|part| match part {
            ToolResultPart::Text { text } => {
                let text = cap_text_within(text, &mut remaining);
                ToolResultPart::Text { text }
            }
            ToolResultPart::Json { value } => {
                let serialised = value.to_string();
                if serialised.len() <= remaining {
                    remaining -= serialised.len();
                    ToolResultPart::Json { value }
                } else {
                    let text = cap_text_within(serialised, &mut remaining);
                    ToolResultPart::Text { text }
                }
            }
            image @ ToolResultPart::Image { .. } => image,
        })
        .collect()
}

/// Cuts `text` to `max_bytes`, with the truncation note when cut.
fn cap_text(text: String, max_bytes: usize) -> String {
    let mut remaining = max_bytes;
    cap_text_within(text, &mut remaining)
}

fn cap_text_within(text: String, remaining: &mut usize) -> String {
    if text.len() <= *remaining {
        *remaining -= text.len();
        return text;
    }
    let shown = truncate_on_char_boundary(&text, *remaining);
    *remaining -= shown.len();
    let mut capped = shown.to_owned();
    capped.push_str(&truncation_note(shown.len(), Some(text.len())));
    capped
}

/// The note appended to a cut result: `\n[… truncated: showed N of M bytes]`, or
/// `\n[… truncated: showed the first N bytes]` when the full size is unknown.
pub fn truncation_note(shown: usize, total: Option<usize>) -> String {
    match total {
        Some(total) => format!("\n[… truncated: showed {shown} of {total} bytes]"),
        None => format!("\n[… truncated: showed the first {shown} bytes]"),
    }
}

/// The longest prefix of `text` that is at most `max_bytes` long and ends on a character
/// boundary.
pub fn truncate_on_char_boundary(text: &str, max_bytes: usize) -> &str {
    let end = text.floor_char_boundary(max_bytes);
    &text[..end]
}

/// Decodes bytes that may have been cut mid-character: a trailing partial character is dropped,
/// other invalid sequences are replaced.
pub fn decode_cut_utf8(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(error) if error.error_len().is_none() => {
            String::from_utf8_lossy(&bytes[..error.valid_up_to()]).into_owned()
        }
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

/// How a direct call's result is returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResultFormat {
    /// The result's text as one JSON string.
    #[default]
    Text,
    /// The result parsed as JSON.
    Json,
}

/// Shapes a tool's output for a direct call.
///
/// - [`ResultFormat::Text`]: the parts flattened to text (JSON serialised, images as a
///   placeholder), joined with newlines, as a JSON string.
/// - [`ResultFormat::Json`]: a lone JSON part as it is (several JSON parts as an array);
///   otherwise the text parsed as JSON, or else the first fenced code block (```` ```json ````
///   or a bare ```` ``` ````) in it that parses. A result that holds no JSON is a
///   [`ToolError::Failed`] quoting its start.
///
/// A result the tool flagged as an error is [`ToolError::Failed`] with its text.
pub fn format_output(output: &ToolOutput, format: ResultFormat) -> Result<Value, ToolError> {
    if output.is_error {
        return Err(ToolError::Failed(flatten_to_text(&output.content)));
    }
    match format {
        ResultFormat::Text => Ok(Value::String(flatten_to_text(&output.content))),
        ResultFormat::Json => output_as_json(&output.content),
    }
}

fn flatten_to_text(parts: &[ToolResultPart]) -> String {
    let pieces: Vec<String> = parts
        .iter()
        .map(|part| match part {
            ToolResultPart::Text { text } => text.clone(),
            ToolResultPart::Json { value } => value.to_string(),
            ToolResultPart::Image { source } => match source {
                ImageSource::Url { url } => format!("[image: {url}]"),
                ImageSource::Base64 { media_type, .. } => format!("[image: {media_type}]"),
            },
        })
        .collect();
    pieces.join("\n")
}

fn output_as_json(parts: &[ToolResultPart]) -> Result<Value, ToolError> {
    let json_parts: Vec<&Value> = parts
        .iter()
        .filter_map(|part| match part {
            ToolResultPart::Json { value } => Some(value),
            _ => None,
        })
        .collect();
    let only_json = parts.iter().all(|part| match part {
        ToolResultPart::Json { .. } => true,
        ToolResultPart::Text { text } => text.trim().is_empty(),
        ToolResultPart::Image { .. } => false,
    });
    if only_json {
        match json_parts.as_slice() {
            [] => {}
            [value] => return Ok((*value).clone()),
            values => return Ok(Value::Array(values.iter().map(|v| (*v).clone()).collect())),
        }
    }
    let text = flatten_to_text(parts);
    if let Ok(value) = serde_json::from_str::<Value>(text.trim()) {
        return Ok(value);
    }
    if let Some(value) = fenced_json(&text) {
        return Ok(value);
    }
    let quoted: String = text.chars().take(NOT_JSON_QUOTE_CHARS).collect();
    let ellipsis = if quoted.len() < text.len() { "…" } else { "" };
    Err(ToolError::Failed(format!(
        "the tool's result is not JSON (format: json was asked for); it begins: {quoted:?}{ellipsis}"
    )))
}

/// The first fenced code block that parses as JSON: blocks tagged `json` first, then untagged
/// ones.
fn fenced_json(text: &str) -> Option<Value> {
    let blocks = fenced_blocks(text);
    let tagged = blocks
        .iter()
        .filter(|(info, _)| info.eq_ignore_ascii_case("json"));
    let untagged = blocks.iter().filter(|(info, _)| info.is_empty());
    tagged
        .chain(untagged)
        .find_map(|(_, body)| serde_json::from_str(body.trim()).ok())
}

/// Fenced code blocks (```` ``` ```` lines) with their info strings.
fn fenced_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, Vec<&str>)> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        match open.take() {
            None => {
                if let Some(info) = trimmed.strip_prefix("```") {
                    open = Some((info.trim().to_owned(), Vec::new()));
                }
            }
            Some((info, mut body)) => {
                if trimmed == "```" {
                    blocks.push((info, body.join("\n")));
                } else {
                    body.push(line);
                    open = Some((info, body));
                }
            }
        }
    }
    blocks
}
