//! Reading a workspace file for a user message (`<file>path</file>`), under the same
//! confinement as the file tools: a relative path, opened beneath the workspace root.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use base64::Engine as _;

use super::confine::Root;
use super::{BINARY_SNIFF_BYTES, display_path, image_type, relative_path};
use crate::tool::ToolError;

/// A workspace file read for a message.
#[derive(Debug, Clone, PartialEq)]
pub enum Attachment {
    /// A text file (up to the limit).
    Text {
        /// The path as shown (relative to the workspace).
        path: String,
        /// The text, cut at the limit on a character boundary.
        text: String,
        /// The file's size in bytes.
        size: u64,
        /// Whether the text was cut.
        truncated: bool,
    },
    /// An image (PNG, JPEG, GIF, WebP).
    Image {
        /// The path as shown.
        path: String,
        /// Its media type.
        media_type: &'static str,
        /// Its bytes, base64.
        data: String,
    },
}

/// Reads `input` (a path relative to `workspace`) as text capped at `max_text` bytes, or as an
/// image up to `max_image` bytes. Paths outside the workspace, folders, binary files and
/// oversize images are refused with a clear error.
pub fn read_attachment(
    workspace: &Path,
    input: &str,
    max_text: usize,
    max_image: u64,
) -> Result<Attachment, ToolError> {
    let relative = relative_path(workspace, input.trim())?;
    if relative.as_os_str().is_empty() {
        return Err(ToolError::InvalidArguments(
            "<file> names the workspace itself, not a file".into(),
        ));
    }
    let display = display_path(&relative);
    let root = Root::open(workspace)?;
    let (file, size) = root.open_read(&relative, &display)?;
    let io_error = |error: std::io::Error| ToolError::Failed(format!("{display}: {error}"));
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let head = reader.fill_buf().map_err(io_error)?;
    if let Some(media_type) = image_type(head) {
        if size > max_image {
            return Err(ToolError::Failed(format!(
                "{display} is a {media_type} image of {size} bytes, larger than the {max_image} \
                 bytes a message may attach"
            )));
        }
        let mut bytes = Vec::new();
        reader
            .take(max_image)
            .read_to_end(&mut bytes)
            .map_err(io_error)?;
        return Ok(Attachment::Image {
            path: display,
            media_type,
            data: base64::engine::general_purpose::STANDARD.encode(&bytes),
        });
    }
    if head[..head.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Err(ToolError::Failed(format!(
            "{display} is a binary file; only text files and images can be attached"
        )));
    }
    let mut bytes = Vec::new();
    reader
        .take(max_text as u64 + 4)
        .read_to_end(&mut bytes)
        .map_err(io_error)?;
    let truncated = bytes.len() > max_text;
    bytes.truncate(max_text);
    let text = match String::from_utf8(bytes) {
        Ok(text) => text,
        // A cut inside a character, or invalid UTF-8: keep what decodes.
        Err(error) => {
            let valid = error.utf8_error().valid_up_to();
            let mut bytes = error.into_bytes();
            if !truncated || bytes.len() - valid > 3 {
                return Err(ToolError::Failed(format!(
                    "{display} is not UTF-8 text; only text files and images can be attached"
                )));
            }
            bytes.truncate(valid);
            String::from_utf8(bytes).unwrap_or_default()
        }
    };
    Ok(Attachment::Text {
        path: display,
        text,
        size,
        truncated,
    })
}
