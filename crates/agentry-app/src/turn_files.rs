//! What each turn of a session did to its workspace's files, and revoking turns: the
//! conversation goes back to before one of its user messages and the files to their state
//! then (the seed's `revoke` and `file-journals`), over the core's
//! [`FileJournal`](agentry_core::workspace::journal::FileJournal).
//!
//! A turn is a run of the session; the journal records what its tools changed. Revoking a turn
//! appends a [`SessionEvent::Revoked`] (the log keeps the revoked events; the conversation
//! leaves them out from then on) after putting back the files of that turn and of every later
//! one. A file changed since by someone else is a conflict: nothing is done unless forced.

use std::sync::Arc;

use agentry_core::session::effective_events;
use agentry_core::workspace::journal::{
    FileChange, FileJournal, FileState, JournalError, RestoreReport, TurnFiles,
};
use agentry_store::{NewEvent, SessionRecord};
use agentry_types::{Message, RunId, SessionEvent, SessionId};
use serde::Serialize;
use serde_json::json;

use crate::App;
use crate::auth::Principal;
use crate::error::{AppError, Failure};
use crate::hub::FeedStatus;
use crate::session_service::{SessionDetail, StoredEvent};

/// The largest file whose text a diff shows (larger ones are only said to differ).
const MAX_DIFF_BYTES: usize = 1024 * 1024;

/// A turn of the conversation: a run, and the user message that started it.
#[derive(Debug, Clone)]
struct Turn {
    run_id: RunId,
    /// The seq of its `run_started`.
    seq: u64,
    /// When its user message (or its start, without one) was committed, Unix ms.
    at: u64,
    /// Whether a user message started it.
    from_user: bool,
}

/// A turn that changed files.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileTurn {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    /// When its user message was sent (ISO 8601, UTC, milliseconds): the seed's turn key.
    pub timestamp: Option<String>,
    /// When its first change was recorded (Unix ms).
    pub started_ms: u64,
    /// When its latest change was recorded.
    pub updated_ms: u64,
    /// When the `undo` tool put its files back, if it did.
    pub undone_ms: Option<u64>,
    /// The paths it changed.
    pub files: Vec<ChangedFile>,
}

/// One changed path of a turn.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ChangedFile {
    /// Workspace-relative.
    pub path: String,
    /// `added`, `modified` or `deleted`.
    pub change_type: &'static str,
    /// `file`, `dir`, `link` or `other` (what it is now, or was when deleted).
    pub kind: &'static str,
    /// Its size after the turn (files).
    pub size: Option<u64>,
    /// Its size before the turn (files).
    pub before_size: Option<u64>,
}

/// A turn's changes with their contents and unified diffs (the seed's file-journal diff).
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TurnDiff {
    /// The run.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    /// Its user message's time, as in [`FileTurn::timestamp`].
    pub turn_key: Option<String>,
    /// Each changed path.
    pub files: Vec<FileDiff>,
}

/// One path's diff.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct FileDiff {
    /// Workspace-relative.
    pub path: String,
    /// `added`, `modified` or `deleted`.
    pub change_type: &'static str,
    /// `file`, `dir`, `link` or `other`.
    pub kind: &'static str,
    /// Its size after the turn (files).
    pub size: Option<u64>,
    /// The text before the turn (text files up to 1 MiB).
    pub baseline: Option<String>,
    /// The text after the turn.
    pub after: Option<String>,
    /// A unified diff (`a/<path>`, `b/<path>`, `/dev/null` for a missing side); absent for
    /// binary or large files, folders and links.
    pub diff: Option<String>,
    /// Whether either side is not text (or too large to show).
    pub binary: bool,
}

/// What to revoke.
#[derive(Debug, Clone, Default)]
pub struct RevokeRequest {
    /// The first turn to revoke, by its run.
    pub run_id: Option<String>,
    /// Or by the time of its user message (ISO 8601, as the session's messages show it).
    pub timestamp: Option<String>,
    /// Overwrite files changed since the turns.
    pub force: bool,
    /// Leave the files as they are; only the conversation goes back.
    pub keep_files: bool,
}

/// What a revoke did.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RevokeOutcome {
    /// The session.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub session_id: SessionId,
    /// The first revoked turn.
    #[cfg_attr(feature = "openapi", schema(value_type = String))]
    pub run_id: RunId,
    /// The revoked turns, oldest first.
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub runs: Vec<RunId>,
    /// Messages no longer part of the conversation.
    pub removed_count: usize,
    /// The last event kept.
    pub after_seq: u64,
    /// What was done to the files (absent when they were kept, or no workspace journal):
    /// `turns`, `restored` and `removed` paths, and `failed` as `[path, why]` pairs.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub files: Option<RestoreReport>,
    /// Whether the files were left as they are.
    pub kept_files: bool,
}

/// A time as the seed's turn keys spell it.
pub fn turn_time(millis: u64) -> Option<String> {
    i64::try_from(millis)
        .ok()
        .and_then(chrono::DateTime::from_timestamp_millis)
        .map(|time| time.format("%Y-%m-%dT%H:%M:%S%.3f").to_string())
}

/// Whether `given` (a seed client's timestamp: `T` or a space, with or without fractions or
/// a zone) names the instant `millis`, to the precision it gives.
fn names_time(given: &str, millis: u64) -> bool {
    let Some(full) = turn_time(millis) else {
        return false;
    };
    let given = given
        .trim()
        .replace(' ', "T")
        .trim_end_matches('Z')
        .trim_end_matches("+00:00")
        .to_owned();
    match given.split_once('.') {
        Some((seconds, fraction)) => {
            let (full_seconds, full_fraction) = full.split_once('.').unwrap_or((&full, ""));
            seconds == full_seconds
                && fraction
                    .bytes()
                    .take(3)
                    .eq(full_fraction.bytes().take(fraction.len().min(3)))
        }
        None => full.starts_with(&given) && full.len() == given.len() + 4,
    }
}

/// The events with their seqs, as replay takes them.
fn numbered(events: &[StoredEvent]) -> Vec<(u64, SessionEvent)> {
    events
        .iter()
        .map(|stored| (stored.seq, stored.event.clone()))
        .collect()
}

/// The turns of the conversation as it stands, oldest first.
fn turns_of(events: &[StoredEvent]) -> Vec<Turn> {
    let pairs = numbered(events);
    let at = |seq: u64| {
        events
            .binary_search_by_key(&seq, |stored| stored.seq)
            .map_or(0, |index| events[index].at)
    };
    let mut turns: Vec<Turn> = Vec::new();
    for (seq, event) in effective_events(&pairs) {
        match event {
            SessionEvent::RunStarted { run_id, .. } => turns.push(Turn {
                run_id: *run_id,
                seq: *seq,
                at: at(*seq),
                from_user: false,
            }),
            SessionEvent::Message {
                run_id,
                message: Message::User { .. },
            } => {
                if let Some(turn) = turns
                    .last_mut()
                    .filter(|turn| turn.run_id == *run_id && !turn.from_user)
                {
                    turn.at = at(*seq);
                    turn.from_user = true;
                }
            }
            _ => {}
        }
    }
    turns
}

/// When each user message of the conversation as it stands was sent (Unix ms), in order: the
/// seed's message timestamps, which name a turn to revoke.
fn user_message_times(events: &[StoredEvent]) -> Vec<u64> {
    let pairs = numbered(events);
    let times: std::collections::HashMap<u64, u64> = events
        .iter()
        .map(|stored| (stored.seq, stored.at))
        .collect();
    effective_events(&pairs)
        .into_iter()
        .filter(|(_, event)| {
            matches!(
                event,
                SessionEvent::Message {
                    message: Message::User { .. },
                    ..
                }
            )
        })
        .map(|(seq, _)| times.get(seq).copied().unwrap_or(0))
        .collect()
}

fn kind_of(state: &FileState) -> &'static str {
    match state {
        FileState::Dir => "dir",
        FileState::File { .. } => "file",
        FileState::Link { .. } => "link",
        FileState::Absent | FileState::Other => "other",
    }
}

fn describe(path: &str, change: &FileChange) -> ChangedFile {
    let size = |state: &FileState| match state {
        FileState::File { size, .. } => Some(*size),
        _ => None,
    };
    let (change_type, shown) = match (change.before.exists(), change.after.exists()) {
        (false, _) => ("added", &change.after),
        (_, false) => ("deleted", &change.before),
        _ => ("modified", &change.after),
    };
    ChangedFile {
        path: path.to_owned(),
        change_type,
        kind: kind_of(shown),
        size: size(&change.after),
        before_size: size(&change.before),
    }
}

fn journal_error(error: JournalError) -> AppError {
    match error {
        JournalError::Conflict(files) => AppError::new(
            Failure::Conflict,
            "journal_conflict",
            "current files do not match what the revoked turns left: someone changed them \
             since; revoke with force to overwrite them, or keep the files",
        )
        .with_details(json!({"files": files, "can_force": true})),
        JournalError::BadHash(_) | JournalError::NoContent(_) => {
            AppError::not_found(error.to_string())
        }
        error => AppError::internal(error.to_string()),
    }
}

/// Runs blocking journal work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, JournalError> + Send + 'static,
) -> Result<T, AppError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| AppError::internal(format!("a journal task failed: {error}")))?
        .map_err(journal_error)
}

/// A file's text, when it is text and small enough to show.
fn text_of(journal: &FileJournal, session: SessionId, state: &FileState) -> Option<String> {
    match state {
        FileState::File {
            hash: Some(hash),
            size,
        } if *size as usize <= MAX_DIFF_BYTES => journal
            .content(session, hash)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok()),
        _ => None,
    }
}

fn diff_of(journal: &FileJournal, session: SessionId, path: &str, change: &FileChange) -> FileDiff {
    let described = describe(path, change);
    let is_file = |state: &FileState| matches!(state, FileState::File { .. });
    let baseline = text_of(journal, session, &change.before);
    let after = text_of(journal, session, &change.after);
    let readable = |state: &FileState, text: &Option<String>| !is_file(state) || text.is_some();
    let binary = (is_file(&change.before) || is_file(&change.after))
        && !(readable(&change.before, &baseline) && readable(&change.after, &after));
    let diff = (!binary && (is_file(&change.before) || is_file(&change.after))).then(|| {
        let old = baseline.as_deref().unwrap_or("");
        let new = after.as_deref().unwrap_or("");
        let from = if is_file(&change.before) {
            format!("a/{path}")
        } else {
            "/dev/null".to_owned()
        };
        let to = if is_file(&change.after) {
            format!("b/{path}")
        } else {
            "/dev/null".to_owned()
        };
        similar::TextDiff::from_lines(old, new)
            .unified_diff()
            .context_radius(3)
            .header(&from, &to)
            .to_string()
    });
    FileDiff {
        path: path.to_owned(),
        change_type: described.change_type,
        kind: described.kind,
        size: described.size,
        baseline,
        after,
        diff,
        binary,
    }
}

impl App {
    /// `Sessions::detail`, with when each user message of its conversation was sent (Unix
    /// ms, in order: the seed's message timestamps, which name a turn), from one read of the log.
    pub async fn session_detail_with_times(
        &self,
        record: SessionRecord,
    ) -> Result<(SessionDetail, Vec<u64>), AppError> {
        let events = self.sessions().events(record.id, 0).await?.events;
        let numbered = numbered(&events);
        let detail = self.sessions().detail_of(record, &numbered)?;
        Ok((detail, user_message_times(&events)))
    }

    fn file_journal(&self) -> Result<Arc<FileJournal>, AppError> {
        self.parts.sessions.file_journal().ok_or_else(|| {
            AppError::new(
                Failure::Unavailable,
                "journal_off",
                "this server keeps no file journal (sessions have no workspaces)",
            )
        })
    }

    /// The turns of `session` whose tools changed files, oldest first.
    pub async fn file_turns(
        &self,
        caller: &Principal,
        session: &str,
    ) -> Result<Vec<FileTurn>, AppError> {
        let session = self.sessions().record(session).await?.id;
        self.check_session_access(caller, session).await?;
        let journal = self.file_journal()?;
        let recorded = blocking(move || journal.turns(session)).await?;
        let events = self.sessions().events(session, 0).await?.events;
        let turns = turns_of(&events);
        Ok(recorded
            .into_iter()
            .filter_map(|record| {
                let turn = turns.iter().find(|turn| turn.run_id == record.run_id)?;
                Some(file_turn(&record, turn))
            })
            .filter(|turn| !turn.files.is_empty())
            .collect())
    }

    /// What the turn `turn` (a run id, or its user message's time) changed, with diffs.
    pub async fn file_turn_diff(
        &self,
        caller: &Principal,
        session: &str,
        turn: &str,
    ) -> Result<TurnDiff, AppError> {
        let session = self.sessions().record(session).await?.id;
        self.check_session_access(caller, session).await?;
        let journal = self.file_journal()?;
        let events = self.sessions().events(session, 0).await?.events;
        let turns = turns_of(&events);
        let chosen = find_turn(&turns, Some(turn), None)?;
        let run_id = chosen.run_id;
        let key = turn_time(chosen.at);
        blocking(move || {
            let record = journal
                .turns(session)?
                .into_iter()
                .find(|record| record.run_id == run_id);
            let files = record
                .map(|record| {
                    record
                        .changed()
                        .map(|(path, change)| diff_of(&journal, session, path, change))
                        .collect()
                })
                .unwrap_or_default();
            Ok(TurnDiff {
                run_id,
                turn_key: key,
                files,
            })
        })
        .await
    }

    /// Revokes a turn of `session` and every later one: their files are put back (unless
    /// kept) and the conversation goes back to before the turn's user message.
    pub async fn revoke_turn(
        &self,
        caller: &Principal,
        session: &str,
        request: RevokeRequest,
    ) -> Result<RevokeOutcome, AppError> {
        let record = self.sessions().record(session).await?;
        let session = record.id;
        self.check_session_access(caller, session).await?;
        if self.parts.hub.is_live(session) {
            return Err(AppError::conflict(format!(
                "session {session} has a run in progress: abort it before revoking"
            )));
        }
        let events = self.sessions().events(session, 0).await?.events;
        let turns = turns_of(&events);
        let chosen = find_turn(
            &turns,
            request.run_id.as_deref(),
            request.timestamp.as_deref(),
        )?
        .clone();
        let runs: Vec<RunId> = turns
            .iter()
            .filter(|turn| turn.seq >= chosen.seq)
            .map(|turn| turn.run_id)
            .collect();
        let after_seq = chosen.seq.saturating_sub(1);
        let pairs = numbered(&events);
        let before = agentry_core::session::replay(&pairs).messages.len();
        let files = match self.parts.sessions.file_journal() {
            None => None,
            Some(journal) => {
                let revoked = runs.clone();
                if request.keep_files {
                    blocking(move || journal.forget_turns(session, &revoked)).await?;
                    None
                } else {
                    let force = request.force;
                    Some(blocking(move || journal.restore(session, &revoked, force, true)).await?)
                }
            }
        };
        let event = SessionEvent::Revoked {
            run_id: chosen.run_id,
            after_seq,
            runs: runs.clone(),
            files_restored: files.is_some(),
        };
        let revoked = NewEvent::encode(event.kind(), &event)
            .map_err(|error| AppError::internal(format!("a revocation: {error}")))?;
        self.parts.store.append(session, None, &[revoked]).await?;
        let pairs: Vec<(u64, SessionEvent)> = pairs
            .into_iter()
            .chain(std::iter::once((u64::MAX, event)))
            .collect();
        let after = agentry_core::session::replay(&pairs).messages.len();
        self.parts.hub.announce(session, FeedStatus::Updated);
        Ok(RevokeOutcome {
            session_id: session,
            run_id: chosen.run_id,
            runs,
            removed_count: before.saturating_sub(after),
            after_seq,
            kept_files: request.keep_files,
            files,
        })
    }

    /// Drops the file journal of a deleted session (a failure is logged: the session is gone).
    pub(crate) async fn forget_file_journal(&self, session: SessionId) {
        if let Some(journal) = self.parts.sessions.file_journal()
            && let Err(error) = blocking(move || journal.forget_session(session)).await
        {
            tracing::warn!(%session, "the file journal of a deleted session stays: {error}");
        }
    }
}

fn file_turn(record: &TurnFiles, turn: &Turn) -> FileTurn {
    FileTurn {
        run_id: record.run_id,
        timestamp: turn_time(turn.at),
        started_ms: record.started_ms,
        updated_ms: record.updated_ms,
        undone_ms: record.undone_ms,
        files: record
            .changed()
            .map(|(path, change)| describe(path, change))
            .collect(),
    }
}

/// The turn named by a run id or by its user message's time.
fn find_turn<'a>(
    turns: &'a [Turn],
    run_id: Option<&str>,
    timestamp: Option<&str>,
) -> Result<&'a Turn, AppError> {
    if let Some(text) = run_id {
        if let Ok(id) = RunId::parse(text) {
            return turns
                .iter()
                .find(|turn| turn.run_id == id)
                .ok_or_else(|| unknown_turn(format!("no turn of this session is run {id}")));
        }
        // A seed client's turn key is a time.
        return find_turn(turns, None, Some(text));
    }
    let Some(timestamp) = timestamp else {
        return Err(AppError::bad_request(
            "Missing required field: timestamp (or run_id)",
        ));
    };
    turns
        .iter()
        .find(|turn| turn.from_user && names_time(timestamp, turn.at))
        .ok_or_else(|| unknown_turn(format!("No user message found with timestamp: {timestamp}")))
}

/// The error for a turn the session does not have (code `unknown_turn`).
fn unknown_turn(message: String) -> AppError {
    AppError::new(Failure::NotFound, UNKNOWN_TURN, message)
}

/// The code of the error for a turn the session does not have.
pub const UNKNOWN_TURN: &str = "unknown_turn";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_timestamps_name_the_instant_to_their_precision() {
        // 2026-11-26T08:30:15.123Z
        let millis = 1_795_681_815_123;
        assert_eq!(
            turn_time(millis).as_deref(),
            Some("2026-11-26T08:30:15.123")
        );
        assert!(names_time("2026-11-26T08:30:15.123", millis));
        assert!(names_time("2026-11-26 08:30:15.123Z", millis));
        assert!(names_time("2026-11-26T08:30:15.1", millis));
        assert!(names_time("2026-11-26T08:30:15", millis));
        assert!(!names_time("2026-11-26T08:30:15.124", millis));
        assert!(!names_time("2026-11-26T08:30:16", millis));
        assert!(!names_time("2026-11-26T08:30", millis));
        assert!(!names_time("", millis));
    }
}
