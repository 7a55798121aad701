//! `undo`: puts back what the latest turn's tools changed in the workspace (the file journal's
//! record of that turn), leaving the conversation as it is.

use std::sync::Arc;

use agentry_core::tool::{FunctionTool, ToolContext, ToolError, ToolOutput};
use agentry_core::workspace::journal::{FileJournal, JournalError};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::{UNDO, blocking};

/// `undo` takes no arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct UndoArguments {}

/// The `undo` tool over `journal`.
pub(super) fn undo(journal: Arc<FileJournal>) -> FunctionTool {
    FunctionTool::new(
        UNDO,
        "Undoes the file changes of the latest turn of this session that changed files (this \
         turn's, if it changed any): files written or edited get their earlier contents back, \
         created files are removed and deleted ones return. The conversation is not changed. \
         Refused when a file was changed since by someone else.",
        move |_: UndoArguments, context: ToolContext| {
            let journal = Arc::clone(&journal);
            async move {
                let session = context
                    .caller
                    .as_ref()
                    .and_then(|caller| caller.session)
                    .ok_or_else(|| {
                        ToolError::Failed(
                            "undo works in a session: this run has no file journal".into(),
                        )
                    })?;
                blocking(move || {
                    let turns = journal.turns(session).map_err(failed)?;
                    let Some(latest) = turns
                        .iter()
                        .rev()
                        .find(|turn| turn.undone_ms.is_none() && turn.changed().next().is_some())
                    else {
                        return Err(ToolError::Failed(
                            "nothing to undo: no turn of this session changed files (or their \
                             changes were undone already)"
                                .into(),
                        ));
                    };
                    let report = journal
                        .restore(session, &[latest.run_id], false, false)
                        .map_err(failed)?;
                    let failed: Vec<_> = report
                        .failed
                        .iter()
                        .map(|(path, why)| json!({"path": path, "error": why}))
                        .collect();
                    Ok(ToolOutput::text(
                        json!({
                            "undone": true,
                            "turn": latest.run_id,
                            "restored_files": report.restored,
                            "removed_files": report.removed,
                            "failed": failed,
                        })
                        .to_string(),
                    ))
                })
                .await
            }
        },
    )
}

fn failed(error: JournalError) -> ToolError {
    match error {
        JournalError::Conflict(files) => ToolError::Failed(format!(
            "not undone: {} file(s) changed since that turn ({}); nothing was restored",
            files.len(),
            files.join(", ")
        )),
        error => ToolError::Failed(format!("not undone: {error}")),
    }
}
