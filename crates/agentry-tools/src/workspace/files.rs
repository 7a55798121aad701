//! `read_file`, `write_file`, `edit_file` and `list_dir`.

use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agentry_types::{ImageSource, ToolResultPart};
use base64::Engine as _;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{
    EDIT_FILE, LIST_DIR, READ_FILE, WRITE_FILE, WorkspaceToolsConfig, blocking, workspace_of,
};
use agentry_core::tool::result::truncate_on_char_boundary;
use agentry_core::tool::{FunctionTool, ToolContext, ToolError, ToolOutput};
use agentry_core::workspace::{
    BINARY_SNIFF_BYTES, Root, Written, display_path, image_type, relative_path,
};

/// How many match locations an ambiguous `edit_file` error lists.
const LISTED_MATCHES: usize = 10;

/// Opens the call's workspace root and resolves `path` in it.
fn open(context: &ToolContext, path: &str) -> Result<(Root, PathBuf, String), ToolError> {
    let workspace = workspace_of(context)?;
    let relative = relative_path(&workspace, path)?;
    // A session's workspace is made on first use, by whichever tool comes first.
    if !workspace.exists() {
        std::fs::create_dir_all(&workspace).map_err(|error| {
            ToolError::Failed(format!("the workspace folder cannot be made: {error}"))
        })?;
    }
    let root = Root::open(&workspace)?;
    let display = display_path(&relative);
    Ok((root, relative, display))
}

/// Arguments of `read_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReadFileArguments {
    /// The file's path, relative to the workspace root.
    path: String,
    /// The first line to return, counting from 1 (default 1).
    #[serde(default)]
    offset: Option<u64>,
    /// The most lines to return (default: as many as fit in the size cap).
    #[serde(default)]
    limit: Option<u64>,
}

/// The `read_file` tool.
pub(super) fn read_file(config: Arc<WorkspaceToolsConfig>) -> FunctionTool {
    FunctionTool::new(
        READ_FILE,
        "Reads a file in the workspace. Text comes back as it is, a range of lines at most (use \
         `offset` and `limit` to read a long file in parts; a note says where to go on). PNG, \
         JPEG, GIF and WebP images come back as images. Paths are relative to the workspace \
         root.",
        move |arguments: ReadFileArguments, context: ToolContext| {
            let config = Arc::clone(&config);
            async move {
                let (root, relative, display) = open(&context, &arguments.path)?;
                blocking(move || read(&root, &relative, &display, &arguments, &config)).await
            }
        },
    )
    .idempotent()
}

fn read(
    root: &Root,
    relative: &Path,
    display: &str,
    arguments: &ReadFileArguments,
    config: &WorkspaceToolsConfig,
) -> Result<ToolOutput, ToolError> {
    let (file, size) = root.open_read(relative, display)?;
    let io_error = |error: std::io::Error| ToolError::Failed(format!("{display}: {error}"));
    let mut reader = BufReader::with_capacity(64 * 1024, file);
    let head = reader.fill_buf().map_err(io_error)?;
    if let Some(media_type) = image_type(head) {
        if size > config.max_image_bytes {
            return Err(ToolError::Failed(format!(
                "{display} is a {media_type} image of {size} bytes, larger than the {} bytes \
                 read_file returns",
                config.max_image_bytes
            )));
        }
        let mut bytes = Vec::new();
        reader
            .take(config.max_image_bytes)
            .read_to_end(&mut bytes)
            .map_err(io_error)?;
        let data = base64::engine::general_purpose::STANDARD.encode(&bytes);
        return Ok(ToolOutput::parts(
            vec![
                ToolResultPart::Text {
                    text: format!("{display}: {media_type} image, {} bytes", bytes.len()),
                },
                ToolResultPart::Image {
                    source: ImageSource::Base64 {
                        media_type: media_type.to_owned(),
                        data,
                    },
                },
            ],
            false,
        ));
    }
    if head[..head.len().min(BINARY_SNIFF_BYTES)].contains(&0) {
        return Ok(ToolOutput::text(format!(
            "{display} is a binary file ({size} bytes); it is not shown"
        )));
    }
    if size == 0 {
        return Ok(ToolOutput::text(format!("{display} is empty")));
    }

    let first = arguments.offset.unwrap_or(1).max(1);
    let limit = arguments.limit.unwrap_or(u64::MAX);
    let mut text = String::new();
    let mut line = Vec::new();
    let mut number = 0u64;
    let mut last_shown = 0u64;
    let mut cut = false;
    loop {
        line.clear();
        if reader.read_until(b'\n', &mut line).map_err(io_error)? == 0 {
            break;
        }
        number += 1;
        if number < first || cut || number - first >= limit {
            continue;
        }
        let decoded = String::from_utf8_lossy(&line);
        if text.len() + decoded.len() > config.max_read_bytes {
            if text.is_empty() {
                // One line longer than the cap: show its start.
                text.push_str(truncate_on_char_boundary(&decoded, config.max_read_bytes));
                last_shown = number;
            }
            cut = true;
            continue;
        }
        text.push_str(&decoded);
        last_shown = number;
    }
    let total = number;
    if first > total {
        return Err(ToolError::InvalidArguments(format!(
            "offset {first} is past the end of {display}, which has {total} lines"
        )));
    }
    if first > 1 || last_shown < total || cut {
        if !text.ends_with('\n') {
            text.push('\n');
        }
        let why = if cut {
            format!(" (cut at the {}-byte cap)", config.max_read_bytes)
        } else {
            String::new()
        };
        let _ = write!(text, "[… showed lines {first}–{last_shown} of {total}{why}");
        if last_shown < total {
            let _ = write!(text, "; read on with offset={}", last_shown + 1);
        }
        text.push(']');
    }
    Ok(ToolOutput::text(text))
}

/// Arguments of `write_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct WriteFileArguments {
    /// The file's path, relative to the workspace root. Missing folders are created.
    path: String,
    /// The whole new content of the file.
    content: String,
}

/// The `write_file` tool.
pub(super) fn write_file() -> FunctionTool {
    FunctionTool::new(
        WRITE_FILE,
        "Creates or replaces a file in the workspace with the given content (missing folders \
         are created; the file is replaced in one step). Paths are relative to the workspace \
         root. To change part of a file, use edit_file.",
        |arguments: WriteFileArguments, context: ToolContext| async move {
            let (root, relative, display) = open(&context, &arguments.path)?;
            blocking(move || {
                let bytes = arguments.content.as_bytes();
                let written = root.write_atomic(&relative, &display, bytes)?;
                let how = match written {
                    Written::Created => "created",
                    Written::Replaced => "replaced",
                };
                Ok(ToolOutput::text(format!(
                    "wrote {} bytes to {display} ({how})",
                    bytes.len()
                )))
            })
            .await
        },
    )
    .idempotent()
}

/// Arguments of `edit_file`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct EditFileArguments {
    /// The file's path, relative to the workspace root.
    path: String,
    /// The exact text to replace, whitespace and indentation included. It must occur exactly
    /// once unless `replace_all` is set.
    old_text: String,
    /// The text to put in its place.
    new_text: String,
    /// Replace every occurrence instead of requiring exactly one (default false).
    #[serde(default)]
    replace_all: bool,
}

/// The `edit_file` tool.
pub(super) fn edit_file(config: Arc<WorkspaceToolsConfig>) -> FunctionTool {
    FunctionTool::new(
        EDIT_FILE,
        "Edits a text file in the workspace by replacing an exact piece of text (`old_text`, \
         which must occur exactly once, whitespace included; add surrounding lines to make it \
         unique) with `new_text`. Set `replace_all` to replace every occurrence.",
        move |arguments: EditFileArguments, context: ToolContext| {
            let max_bytes = config.max_edit_bytes;
            async move {
                let (root, relative, display) = open(&context, &arguments.path)?;
                blocking(move || edit(&root, &relative, &display, &arguments, max_bytes)).await
            }
        },
    )
}

fn edit(
    root: &Root,
    relative: &Path,
    display: &str,
    arguments: &EditFileArguments,
    max_bytes: u64,
) -> Result<ToolOutput, ToolError> {
    let old = arguments.old_text.as_str();
    if old.is_empty() {
        return Err(ToolError::InvalidArguments(
            "old_text is empty: give the exact text to replace".into(),
        ));
    }
    if old == arguments.new_text {
        return Err(ToolError::InvalidArguments(
            "old_text and new_text are the same: nothing would change".into(),
        ));
    }
    let (file, size) = root.open_read(relative, display)?;
    if size > max_bytes {
        return Err(ToolError::Failed(format!(
            "{display} is {size} bytes, larger than the {max_bytes} bytes edit_file edits"
        )));
    }
    let mut bytes = Vec::new();
    file.take(max_bytes)
        .read_to_end(&mut bytes)
        .map_err(|error| ToolError::Failed(format!("{display}: {error}")))?;
    let content = String::from_utf8(bytes).map_err(|_| {
        ToolError::Failed(format!(
            "{display} is not UTF-8 text; edit_file edits text files only"
        ))
    })?;
    let starts: Vec<usize> = content.match_indices(old).map(|(at, _)| at).collect();
    match starts.len() {
        0 => {
            let mut message = format!(
                "old_text was not found in {display}. It must match exactly, whitespace and \
                 indentation included; read the file again and copy the text as it is"
            );
            if content.contains("\r\n") && old.contains('\n') && !old.contains("\r\n") {
                message.push_str(" (the file uses CRLF line endings)");
            }
            return Err(ToolError::Failed(message));
        }
        1 => {}
        count if !arguments.replace_all => {
            let lines: Vec<String> = starts
                .iter()
                .take(LISTED_MATCHES)
                .map(|&at| (content[..at].matches('\n').count() + 1).to_string())
                .collect();
            let more = if count > LISTED_MATCHES { ", …" } else { "" };
            return Err(ToolError::Failed(format!(
                "old_text occurs {count} times in {display} (at lines {}{more}); include more \
                 surrounding lines in old_text so that it matches exactly once, or set \
                 replace_all to replace every occurrence",
                lines.join(", ")
            )));
        }
        _ => {}
    }
    let count = starts.len();
    let updated = if arguments.replace_all {
        content.replace(old, &arguments.new_text)
    } else {
        content.replacen(old, &arguments.new_text, 1)
    };
    root.write_atomic(relative, display, updated.as_bytes())?;
    let plural = if count == 1 { "" } else { "s" };
    Ok(ToolOutput::text(format!(
        "replaced {count} occurrence{plural} in {display}"
    )))
}

fn yes() -> bool {
    true
}

/// Arguments of `list_dir`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListDirArguments {
    /// The folder, relative to the workspace root (default: the root).
    #[serde(default)]
    path: Option<String>,
    /// List sub-folders' contents too (default false).
    #[serde(default)]
    recursive: bool,
    /// Leave out what `.gitignore` (and `.ignore`) files exclude (default true).
    #[serde(default = "yes")]
    gitignore: bool,
    /// The most entries to return.
    #[serde(default)]
    max_entries: Option<usize>,
}

/// The `list_dir` tool.
pub(super) fn list_dir(config: Arc<WorkspaceToolsConfig>) -> FunctionTool {
    FunctionTool::new(
        LIST_DIR,
        "Lists a folder in the workspace: one entry per line, folders ending in `/`, files with \
         their size, symbolic links with their target. Paths are relative to the workspace root. \
         `recursive` lists sub-folders too; what .gitignore excludes is left out unless \
         `gitignore` is false.",
        move |arguments: ListDirArguments, context: ToolContext| {
            let cap = arguments
                .max_entries
                .unwrap_or(config.max_list_entries)
                .clamp(1, config.max_list_entries.max(1));
            async move {
                let path = arguments.path.as_deref().unwrap_or(".");
                let (root, relative, display) = open(&context, path)?;
                blocking(move || list(&root, &relative, &display, &arguments, cap)).await
            }
        },
    )
    .idempotent()
}

fn list(
    root: &Root,
    relative: &Path,
    display: &str,
    arguments: &ListDirArguments,
    cap: usize,
) -> Result<ToolOutput, ToolError> {
    root.check_dir(relative, display)?;
    let walk = Walk {
        target: relative.to_owned(),
        max_depth: (!arguments.recursive).then_some(1),
        gitignore: arguments.gitignore,
        glob: None,
        max_file_bytes: None,
    };
    let mut lines = Vec::new();
    let mut more = false;
    for entry in walk.entries(root, display)? {
        let Ok(entry) = entry else { continue };
        let Some(path) = entry_relative(root, entry.path(), relative) else {
            continue;
        };
        if lines.len() == cap {
            more = true;
            break;
        }
        let path = path.to_string_lossy();
        let kind = entry.file_type();
        let line = if kind.is_some_and(|kind| kind.is_dir()) {
            format!("{path}/")
        } else if kind.is_some_and(|kind| kind.is_symlink()) {
            match std::fs::read_link(entry.path()) {
                Ok(target) => format!("{path} -> {}", target.to_string_lossy()),
                Err(_) => format!("{path} (symbolic link)"),
            }
        } else {
            match entry.metadata() {
                Ok(metadata) => format!("{path} ({} bytes)", metadata.len()),
                Err(_) => path.into_owned(),
            }
        };
        lines.push(line);
    }
    if lines.is_empty() {
        return Ok(ToolOutput::text(format!("{display} is empty")));
    }
    let mut text = lines.join("\n");
    if more {
        let _ = write!(
            text,
            "\n[… stopped at {cap} entries; list a sub-folder, or without recursive]"
        );
    }
    Ok(ToolOutput::text(text))
}

/// A walk over part of the workspace, with `.gitignore` rules applied as they would be from
/// the workspace root.
pub(super) struct Walk {
    /// The folder (or file) to walk, relative to the root.
    pub(super) target: PathBuf,
    /// How deep below the target to go (`None`: all the way).
    pub(super) max_depth: Option<usize>,
    /// Whether `.gitignore` and `.ignore` files apply.
    pub(super) gitignore: bool,
    /// Only files matching this glob (relative to the root; a bare `*.rs` matches anywhere).
    pub(super) glob: Option<String>,
    /// Skip files larger than this.
    pub(super) max_file_bytes: Option<u64>,
}

impl Walk {
    /// The walk's entries. The walk starts at the workspace root so that ignore files between
    /// the root and the target count, and is pruned to the target; symbolic links are never
    /// followed, and `.git` folders are skipped.
    pub(super) fn entries(&self, root: &Root, display: &str) -> Result<ignore::Walk, ToolError> {
        root.check_inside(&self.target, display)?;
        // The walker does not follow links, so a target reached through one (inside the
        // workspace) would come out empty: say so instead.
        let mut prefix = root.path().to_path_buf();
        for component in self.target.components() {
            prefix.push(component);
            if std::fs::symlink_metadata(&prefix).is_ok_and(|m| m.file_type().is_symlink()) {
                return Err(ToolError::Failed(format!(
                    "{display} goes through a symbolic link; use the path it points to"
                )));
            }
        }
        let mut builder = ignore::WalkBuilder::new(root.path());
        builder
            .standard_filters(false)
            .hidden(false)
            .parents(false)
            .require_git(false)
            .git_ignore(self.gitignore)
            .git_exclude(self.gitignore)
            .ignore(self.gitignore)
            .follow_links(false)
            .max_filesize(self.max_file_bytes)
            .sort_by_file_name(|a, b| a.cmp(b));
        if let Some(glob) = &self.glob {
            let mut overrides = ignore::overrides::OverrideBuilder::new(root.path());
            overrides.add(glob).map_err(|error| {
                ToolError::InvalidArguments(format!("invalid glob {glob:?}: {error}"))
            })?;
            let overrides = overrides.build().map_err(|error| {
                ToolError::InvalidArguments(format!("invalid glob {glob:?}: {error}"))
            })?;
            builder.overrides(overrides);
        }
        let base = root.path().to_path_buf();
        let target = self.target.clone();
        let target_depth = target.components().count();
        let max_depth = self.max_depth;
        builder.filter_entry(move |entry| {
            if entry.file_name() == ".git" {
                return false;
            }
            let Ok(relative) = entry.path().strip_prefix(&base) else {
                return false;
            };
            if target.starts_with(relative) {
                // An ancestor of the target (or the target itself).
                return true;
            }
            if !relative.starts_with(&target) {
                return false;
            }
            let depth = relative.components().count() - target_depth;
            max_depth.is_none_or(|max| depth <= max)
        });
        Ok(builder.build())
    }
}

/// An entry's path relative to the root, when it lies strictly below `target`.
pub(super) fn entry_relative<'a>(root: &Root, path: &'a Path, target: &Path) -> Option<&'a Path> {
    let relative = path.strip_prefix(root.path()).ok()?;
    (relative != target && relative.starts_with(target)).then_some(relative)
}
