//! `<file>path</file>` in a user message: the workspace file's text, or the file as an image.
//!
//! Each tag in a user message's text is replaced by the file's text in a
//! `<file path="…">…</file>` block (capped, with a note when cut), or, for a PNG, JPEG, GIF or
//! WebP file, by `[image: path]` with the image attached as a part right after the text. Paths
//! are relative to the session's workspace and opened with the file tools' confinement, so a
//! path outside it (`..`, an absolute path, a symbolic link leading out) is refused, as is any
//! tag when the run has no workspace. A refused or unreadable file is an error for the whole
//! message: nothing is sent with a silently missing file.

use std::path::Path;

use agentry_types::{ContentPart, ImageSource, Message};

use crate::workspace::{Attachment, read_attachment};

/// Limits of file expansion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileRefLimits {
    /// Bytes of text one file contributes.
    pub max_text_bytes: usize,
    /// The largest image attached.
    pub max_image_bytes: u64,
    /// Files one message may name.
    pub max_files: usize,
}

impl Default for FileRefLimits {
    fn default() -> Self {
        Self {
            max_text_bytes: 100 * 1024,
            max_image_bytes: 5 * 1024 * 1024,
            max_files: 20,
        }
    }
}

/// Why a message's files could not be expanded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FileRefError {
    /// The run has no workspace to read from.
    #[error("<file>{path}</file>: this run has no workspace, so no file can be attached")]
    NoWorkspace {
        /// The path named.
        path: String,
    },
    /// The file cannot be attached.
    #[error("<file>{path}</file>: {reason}")]
    Refused {
        /// The path named.
        path: String,
        /// Why.
        reason: String,
    },
    /// Too many files in one message.
    #[error("a message may attach at most {max} files with <file>…</file>")]
    TooMany {
        /// The limit.
        max: usize,
    },
}

const OPEN: &str = "<file>";
const CLOSE: &str = "</file>";

/// The `<file>…</file>` references in `text`, in order: each tag's byte range and the path
/// it names. A tag spanning lines, or naming nothing, is prose, not a reference.
fn tags(text: &str) -> Vec<(std::ops::Range<usize>, &str)> {
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(start) = text[from..].find(OPEN).map(|at| from + at) {
        let path_start = start + OPEN.len();
        let Some(path_end) = text[path_start..].find(CLOSE).map(|at| path_start + at) else {
            break;
        };
        let path = &text[path_start..path_end];
        from = path_end + CLOSE.len();
        if !path.contains('\n') && !path.trim().is_empty() {
            found.push((start..from, path));
        }
    }
    found
}

/// The paths named by `<file>…</file>` tags in `text`, in order.
pub fn file_refs(text: &str) -> Vec<&str> {
    tags(text).into_iter().map(|(_, path)| path).collect()
}

/// Expands every `<file>` tag in the user messages of `messages`. Messages without tags are
/// left untouched (and need no workspace).
pub fn expand_file_refs(
    messages: &mut [Message],
    workspace: Option<&Path>,
    limits: FileRefLimits,
) -> Result<(), FileRefError> {
    for message in messages.iter_mut() {
        let Message::User { content } = message else {
            continue;
        };
        let named: usize = content
            .iter()
            .map(|part| match part {
                ContentPart::Text { text } => file_refs(text).len(),
                _ => 0,
            })
            .sum();
        if named == 0 {
            continue;
        }
        if named > limits.max_files {
            return Err(FileRefError::TooMany {
                max: limits.max_files,
            });
        }
        // Built aside and swapped in only when every file was read: a refusal leaves the
        // message as it was.
        let mut expanded = Vec::with_capacity(content.len() + named);
        for part in content.iter() {
            match part {
                ContentPart::Text { text } if !file_refs(text).is_empty() => {
                    let (text, images) = expand_text(text, workspace, limits)?;
                    expanded.push(ContentPart::Text { text });
                    expanded.extend(images);
                }
                other => expanded.push(other.clone()),
            }
        }
        *content = expanded;
    }
    Ok(())
}

fn expand_text(
    text: &str,
    workspace: Option<&Path>,
    limits: FileRefLimits,
) -> Result<(String, Vec<ContentPart>), FileRefError> {
    let mut out = String::with_capacity(text.len());
    let mut images = Vec::new();
    let mut copied = 0;
    for (range, path) in tags(text) {
        out.push_str(&text[copied..range.start]);
        copied = range.end;
        let workspace = workspace.ok_or_else(|| FileRefError::NoWorkspace {
            path: path.to_owned(),
        })?;
        let attachment = read_attachment(
            workspace,
            path,
            limits.max_text_bytes,
            limits.max_image_bytes,
        )
        .map_err(|error| FileRefError::Refused {
            path: path.to_owned(),
            reason: error.to_string(),
        })?;
        match attachment {
            Attachment::Text {
                path,
                text,
                size,
                truncated,
            } => {
                out.push_str(&format!("<file path=\"{path}\">\n{text}"));
                if !text.ends_with('\n') {
                    out.push('\n');
                }
                if truncated {
                    out.push_str(&format!(
                        "[cut: the file has {size} bytes; the first {} are shown]\n",
                        limits.max_text_bytes
                    ));
                }
                out.push_str("</file>");
            }
            Attachment::Image {
                path,
                media_type,
                data,
            } => {
                out.push_str(&format!("[image: {path}]"));
                images.push(ContentPart::Image {
                    source: ImageSource::Base64 {
                        media_type: media_type.to_owned(),
                        data,
                    },
                });
            }
        }
    }
    out.push_str(&text[copied..]);
    Ok((out, images))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_found_in_order_and_prose_is_left_alone() {
        assert_eq!(
            file_refs("see <file>a.rs</file> and <file> b/c.md </file>"),
            vec!["a.rs", " b/c.md "]
        );
        assert!(file_refs("no <file>\nmultiline</file> tags, <file></file>").is_empty());
        assert!(file_refs("an unclosed <file>x").is_empty());
    }

    #[test]
    fn messages_without_tags_need_no_workspace() {
        let mut messages = vec![Message::user("plain text")];
        assert_eq!(
            expand_file_refs(&mut messages, None, FileRefLimits::default()),
            Ok(())
        );
        assert_eq!(messages, vec![Message::user("plain text")]);
        let mut messages = vec![Message::user("<file>a.txt</file>")];
        assert!(matches!(
            expand_file_refs(&mut messages, None, FileRefLimits::default()),
            Err(FileRefError::NoWorkspace { .. })
        ));
    }
}
