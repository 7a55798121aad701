//! The seed's file journal and revoke routes: `GET /v1/sessions/{id}/file-journals` (the turn
//! keys: its user messages' times), `GET …/file-journals/{turn}` (the turn's files with
//! baseline, after and a unified diff) and `POST /v1/sessions/{id}/revoke` (`timestamp`,
//! `forced`, `keep_files`), in its shapes, over [`agentry_app::turn_files`].

use serde_json::{Value, json};

use agentry_app::App;
use agentry_app::AppError;
use agentry_app::auth::Principal;
use agentry_app::turn_files::RevokeRequest;

/// `GET /v1/sessions/{id}/file-journals`: `{"session_id", "turn_keys"}`.
pub async fn seed_file_journals(
    app: &App,
    caller: &Principal,
    session: &str,
) -> Result<Value, AppError> {
    let turns = Box::pin(app.file_turns(caller, session)).await?;
    let keys: Vec<String> = turns
        .into_iter()
        .filter(|turn| turn.undone_ms.is_none())
        .filter_map(|turn| turn.timestamp)
        .collect();
    Ok(json!({"session_id": session, "turn_keys": keys}))
}

/// `GET /v1/sessions/{id}/file-journals/{turn}`: `{"turn_key", "files"}`, each file with
/// `path`, `change_type`, `size`, `baseline`, `after` and `diff`.
pub async fn seed_file_journal_diff(
    app: &App,
    caller: &Principal,
    session: &str,
    turn: &str,
) -> Result<Value, AppError> {
    let diff = Box::pin(app.file_turn_diff(caller, session, turn)).await?;
    let files: Vec<Value> = diff
        .files
        .into_iter()
        .map(|file| {
            json!({
                "path": file.path,
                "change_type": file.change_type,
                "kind": file.kind,
                "size": file.size,
                "baseline": file.baseline.unwrap_or_default(),
                "after": file.after.unwrap_or_default(),
                "diff": file.diff.unwrap_or_default(),
                "binary": file.binary,
            })
        })
        .collect();
    Ok(json!({"turn_key": diff.turn_key, "run_id": diff.run_id, "files": files}))
}

/// `POST /v1/sessions/{id}/revoke` with `{"timestamp", "forced"?, "keep_files"?}`:
/// `{"status": "success", "session_id", "removed_count", "journal"}`.
pub async fn seed_revoke(
    app: &App,
    caller: &Principal,
    session: &str,
    body: Value,
) -> Result<Value, AppError> {
    let text = |key: &str| body.get(key).and_then(Value::as_str).map(str::to_owned);
    let flag = |key: &str| body.get(key).and_then(Value::as_bool).unwrap_or(false);
    let timestamp = text("timestamp")
        .ok_or_else(|| AppError::bad_request("Missing required field: timestamp"))?;
    let request = RevokeRequest {
        run_id: None,
        timestamp: Some(timestamp),
        force: flag("forced") || flag("force"),
        keep_files: flag("keep_files"),
    };
    // The seed answers 400 for a timestamp no user message has.
    let outcome = Box::pin(app.revoke_turn(caller, session, request))
        .await
        .map_err(|error| match error.code {
            agentry_app::turn_files::UNKNOWN_TURN => AppError::bad_request(error.message),
            _ => error,
        })?;
    let journal = match &outcome.files {
        _ if outcome.kept_files => json!({
            "revoked": true,
            "revoked_turns": outcome.runs,
            "restored_files": [],
            "kept_files": true,
        }),
        Some(report) if !report.turns.is_empty() => json!({
            "revoked": true,
            "revoked_turns": report.turns,
            "restored_files": report.restored,
            "removed_files": report.removed,
            "failed_files": report.failed,
        }),
        _ => json!({
            "skipped": true,
            "reason": "no_matching_file_journals",
            "restored_files": [],
        }),
    };
    Ok(json!({
        "status": "success",
        "session_id": outcome.session_id,
        "removed_count": outcome.removed_count,
        "journal": journal,
    }))
}
