//! Built-in tools confined to the run's workspace, and `fetch`.
//!
//! - `read_file`: a text file (a line range, capped with a note saying how to read on), or an
//!   image (PNG, JPEG, GIF, WebP) as an image part.
//! - `write_file`: creates or replaces a file atomically (a temporary file renamed over it),
//!   creating missing parent folders.
//! - `edit_file`: replaces an exact piece of text; a missing or ambiguous match is an error that
//!   says how many matches there were.
//! - `list_dir`: a folder's entries with kind and size, optionally recursive, honouring
//!   `.gitignore`.
//! - `search`: a regex or literal search over the workspace's files (the `grep` crates, walking
//!   with `ignore`), results as `path:line: text`.
//! - `undo`: puts back the file changes of the session's latest turn that changed files (the
//!   per-turn file journal, [`agentry_core::workspace::journal`]); offered when there is one.
//! - `fetch`: an HTTP GET under a [`NetworkPolicy`](crate::NetworkPolicy) (off unless
//!   configured), HTML reduced to text.
//!
//! **Confinement.** The workspace root comes from [`ToolContext::workspace`] (set from the run's
//! `workspace`); without one the file tools refuse to work. Paths and files go through
//! [`agentry_core::workspace`]: relative to the root, opened beneath it with `openat2`, so nothing
//! outside the workspace can be read or written (see there).

use std::path::PathBuf;
use std::sync::Arc;

use agentry_core::tool::{RiskClass, Tool, ToolContext, ToolError, ToolRisk};

mod fetch;
mod files;
mod search;
mod undo;

pub use fetch::{FetchConfig, public_only_resolver, validate_network_policy};

/// The name of the `read_file` tool.
pub const READ_FILE: &str = "read_file";
/// The name of the `write_file` tool.
pub const WRITE_FILE: &str = "write_file";
/// The name of the `edit_file` tool.
pub const EDIT_FILE: &str = "edit_file";
/// The name of the `list_dir` tool.
pub const LIST_DIR: &str = "list_dir";
/// The name of the `search` tool.
pub const SEARCH: &str = "search";
/// The name of the `undo` tool.
pub const UNDO: &str = "undo";
/// The name of the `fetch` tool.
pub const FETCH: &str = "fetch";

/// Limits of the workspace tools, and the `fetch` tool's configuration.
#[derive(Debug, Clone)]
pub struct WorkspaceToolsConfig {
    /// The most bytes of text `read_file` returns in one call; the rest is announced with the
    /// `offset` to read on from.
    pub max_read_bytes: usize,
    /// The largest image `read_file` returns.
    pub max_image_bytes: u64,
    /// The largest file `edit_file` edits.
    pub max_edit_bytes: u64,
    /// The most entries `list_dir` returns (a call may ask for fewer).
    pub max_list_entries: usize,
    /// The most matching lines `search` returns (a call may ask for fewer).
    pub max_search_results: usize,
    /// Files larger than this are skipped by `search`.
    pub max_search_file_bytes: u64,
    /// The `fetch` tool's configuration; `None` leaves the tool out.
    pub fetch: Option<FetchConfig>,
}

impl Default for WorkspaceToolsConfig {
    fn default() -> Self {
        Self {
            max_read_bytes: 60 * 1024,
            max_image_bytes: 5 * 1024 * 1024,
            max_edit_bytes: 8 * 1024 * 1024,
            max_list_entries: 1000,
            max_search_results: 200,
            max_search_file_bytes: 8 * 1024 * 1024,
            fetch: Some(FetchConfig::default()),
        }
    }
}

/// The workspace tools (`read_file`, `write_file`, `edit_file`, `list_dir`, `search`, and
/// `fetch` when configured), ready to register.
pub fn workspace_tools(config: WorkspaceToolsConfig) -> Vec<Arc<dyn Tool>> {
    let config = Arc::new(config);
    let mut tools: Vec<Arc<dyn Tool>> = vec![
        Arc::new(files::read_file(Arc::clone(&config))),
        Arc::new(files::write_file().with_risk(ToolRisk::of(RiskClass::WritesFiles))),
        Arc::new(
            files::edit_file(Arc::clone(&config)).with_risk(ToolRisk::of(RiskClass::WritesFiles)),
        ),
        Arc::new(files::list_dir(Arc::clone(&config))),
        Arc::new(search::search(Arc::clone(&config))),
    ];
    if let Some(fetch) = &config.fetch {
        tools.push(Arc::new(
            fetch::fetch(fetch.clone()).with_risk(ToolRisk::of(RiskClass::Network)),
        ));
    }
    tools
}

/// The `undo` tool over a session file journal, ready to register.
pub fn undo_tool(journal: Arc<agentry_core::workspace::journal::FileJournal>) -> Arc<dyn Tool> {
    Arc::new(undo::undo(journal).with_risk(ToolRisk::of(RiskClass::WritesFiles)))
}

/// The workspace root of a call, or the error saying there is none.
fn workspace_of(context: &ToolContext) -> Result<PathBuf, ToolError> {
    context.workspace.clone().ok_or_else(|| {
        ToolError::Failed(
            "this run has no workspace: the file tools work only inside a session's workspace"
                .into(),
        )
    })
}

/// Runs blocking file work off the async threads.
async fn blocking<T, F>(work: F) -> Result<T, ToolError>
where
    T: Send + 'static,
    F: FnOnce() -> Result<T, ToolError> + Send + 'static,
{
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|_| ToolError::Failed("the tool crashed".into()))?
}
