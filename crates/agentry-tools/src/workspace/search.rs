//! `search`: a regex or literal search over the workspace, in process.
//!
//! Files come from an `ignore` walk (so `.gitignore` applies) and each is opened through the
//! confined [`Root`], then searched with `grep-searcher`; binary files are skipped.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use grep_regex::RegexMatcherBuilder;
use grep_searcher::sinks::Lossy;
use grep_searcher::{BinaryDetection, SearcherBuilder};
use schemars::JsonSchema;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use super::files::Walk;
use super::{SEARCH, WorkspaceToolsConfig, blocking, workspace_of};
use agentry_core::tool::result::truncate_on_char_boundary;
use agentry_core::tool::{FunctionTool, ToolContext, ToolError, ToolOutput};
use agentry_core::workspace::{Root, display_path, relative_path};

/// The most bytes of one matching line shown.
const MAX_LINE_BYTES: usize = 400;

fn yes() -> bool {
    true
}

/// Arguments of `search`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArguments {
    /// A regular expression (Rust regex syntax), or plain text when `literal` is set.
    pattern: String,
    /// The folder or file to search, relative to the workspace root (default: the root).
    #[serde(default)]
    path: Option<String>,
    /// Match `pattern` as plain text (default false).
    #[serde(default)]
    literal: bool,
    /// Ignore case (default false).
    #[serde(default)]
    case_insensitive: bool,
    /// Only files matching this glob, e.g. "*.rs" or "src/**/*.py".
    #[serde(default)]
    glob: Option<String>,
    /// Leave out what `.gitignore` (and `.ignore`) files exclude (default true).
    #[serde(default = "yes")]
    gitignore: bool,
    /// The most matching lines to return.
    #[serde(default)]
    max_results: Option<usize>,
}

/// The `search` tool.
pub(super) fn search(config: Arc<WorkspaceToolsConfig>) -> FunctionTool {
    FunctionTool::new(
        SEARCH,
        "Searches the workspace's files for a regular expression (or plain text with \
         `literal`), one matching line per result as `path:line: text`. Files excluded by \
         .gitignore and binary files are skipped. Narrow it with `path` and `glob`.",
        move |arguments: SearchArguments, context: ToolContext| {
            let config = Arc::clone(&config);
            async move {
                let workspace = workspace_of(&context)?;
                let path = arguments.path.as_deref().unwrap_or(".");
                let relative = relative_path(&workspace, path)?;
                let root = Root::open(&workspace)?;
                let cancel = context.cancel.clone();
                blocking(move || run(&root, &relative, &arguments, &config, &cancel)).await
            }
        },
    )
    .idempotent()
}

fn run(
    root: &Root,
    target: &Path,
    arguments: &SearchArguments,
    config: &WorkspaceToolsConfig,
    cancel: &CancellationToken,
) -> Result<ToolOutput, ToolError> {
    let display = display_path(target);
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(arguments.case_insensitive)
        .fixed_strings(arguments.literal)
        .line_terminator(Some(b'\n'))
        .build(&arguments.pattern)
        .map_err(|error| {
            ToolError::InvalidArguments(format!(
                "invalid pattern {:?}: {error} (set literal to search for plain text)",
                arguments.pattern
            ))
        })?;
    let cap = arguments
        .max_results
        .unwrap_or(config.max_search_results)
        .clamp(1, config.max_search_results.max(1));
    let mut searcher = SearcherBuilder::new()
        .binary_detection(BinaryDetection::quit(0))
        .line_number(true)
        .build();
    let walk = Walk {
        target: target.to_owned(),
        max_depth: None,
        gitignore: arguments.gitignore,
        glob: arguments.glob.clone(),
        max_file_bytes: Some(config.max_search_file_bytes),
    };
    let mut results: Vec<String> = Vec::new();
    let mut more = false;
    let mut skipped = 0usize;
    for entry in walk.entries(root, &display)? {
        if cancel.is_cancelled() {
            return Err(ToolError::Cancelled);
        }
        let Ok(entry) = entry else { continue };
        if !entry.file_type().is_some_and(|kind| kind.is_file()) {
            continue;
        }
        let Some(relative) = entry
            .path()
            .strip_prefix(root.path())
            .ok()
            .filter(|relative| relative.starts_with(target))
        else {
            continue;
        };
        let shown = relative.to_string_lossy().into_owned();
        let Ok((file, _)) = root.open_read(relative, &shown) else {
            // Hard-linked files, files gone since the walk, links swapped in: not searched.
            skipped += 1;
            continue;
        };
        let searched = searcher.search_file(
            &matcher,
            &file,
            Lossy(|number, line| {
                if results.len() == cap {
                    more = true;
                    return Ok(false);
                }
                let line = line.trim_end_matches(['\n', '\r']);
                let mut text = truncate_on_char_boundary(line, MAX_LINE_BYTES).to_owned();
                if text.len() < line.len() {
                    text.push_str(" […]");
                }
                results.push(format!("{shown}:{number}: {text}"));
                Ok(true)
            }),
        );
        if searched.is_err() {
            skipped += 1;
        }
        if more {
            break;
        }
    }
    if results.is_empty() {
        return Ok(ToolOutput::text(format!(
            "no matches for {:?} in {display}",
            arguments.pattern
        )));
    }
    let mut text = results.join("\n");
    if more {
        let _ = write!(
            text,
            "\n[… stopped at {cap} matches; narrow the pattern, path or glob]"
        );
    }
    if skipped > 0 {
        let _ = write!(text, "\n[{skipped} files could not be searched]");
    }
    Ok(ToolOutput::text(text))
}
