//! A run's workspace on the host: paths relative to its root, files opened beneath it and
//! nowhere else, and a workspace file read to attach to a user message.
//!
//! **Confinement.** Every path is relative to the root: absolute paths outside it and `..` past
//! it are refused ([`relative_path`]) before anything is opened, and every file is then opened
//! with `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to a descriptor of the root
//! ([`Root`]), so the kernel refuses any resolution (through `..`, absolute or relative symbolic
//! links, symlinked parent folders, links swapped in after a check, `/proc` magic links) that
//! would leave it. Files with more than one hard link are refused for reading and writing,
//! since another link may live outside the workspace.
//!
//! The file tools (`read_file`, `write_file`, … in the `agentry-tools` crate) and `<file>`
//! references in user messages (the `file_refs` module) both go through it, and so
//! does the per-turn [`journal`] of what tools changed.

use std::path::{Component, Path, PathBuf};

use crate::tool::ToolError;

mod attach;
mod confine;
pub mod journal;

pub use attach::{Attachment, read_attachment};
pub use confine::{Entry, EntryKind, Root, Stamp, Written};

/// How many leading bytes decide whether a file is binary.
pub const BINARY_SNIFF_BYTES: usize = 8 * 1024;

/// A path the model gave, checked and normalised: relative to the workspace root, without
/// `.` or `..` components (an empty path is the root itself).
///
/// An absolute path is accepted only when it lies under the root (it is made relative); `..`
/// may not climb above the root; NUL bytes are refused.
pub fn relative_path(root: &Path, input: &str) -> Result<PathBuf, ToolError> {
    if input.contains('\0') {
        return Err(ToolError::InvalidArguments(format!(
            "the path {input:?} contains a NUL byte"
        )));
    }
    let path = Path::new(input);
    let path = if path.is_absolute() {
        path.strip_prefix(root).map_err(|_| {
            ToolError::InvalidArguments(format!(
                "{input:?} is an absolute path outside the workspace: paths are relative to the \
                 workspace root (for example \"src/main.rs\")"
            ))
        })?
    } else {
        path
    };
    let mut normalised = PathBuf::new();
    for component in path.components() {
        match component {
            Component::Normal(name) => normalised.push(name),
            Component::CurDir => {}
            Component::ParentDir => {
                if !normalised.pop() {
                    return Err(ToolError::InvalidArguments(format!(
                        "{input:?} leads outside the workspace: paths are relative to the \
                         workspace root and may not climb above it with \"..\""
                    )));
                }
            }
            Component::RootDir | Component::Prefix(_) => {
                return Err(ToolError::InvalidArguments(format!(
                    "{input:?} is not a path relative to the workspace root"
                )));
            }
        }
    }
    Ok(normalised)
}

/// How a workspace-relative path is shown to the model.
pub fn display_path(relative: &Path) -> String {
    if relative.as_os_str().is_empty() {
        ".".to_owned()
    } else {
        relative.to_string_lossy().into_owned()
    }
}

/// The media type of a file returned as an image (PNG, JPEG, GIF, WebP), by its leading bytes.
pub fn image_type(head: &[u8]) -> Option<&'static str> {
    if head.starts_with(b"\x89PNG\r\n\x1a\n") {
        Some("image/png")
    } else if head.starts_with(&[0xff, 0xd8, 0xff]) {
        Some("image/jpeg")
    } else if head.starts_with(b"GIF87a") || head.starts_with(b"GIF89a") {
        Some("image/gif")
    } else if head.len() >= 12 && head.starts_with(b"RIFF") && &head[8..12] == b"WEBP" {
        Some("image/webp")
    } else {
        None
    }
}
