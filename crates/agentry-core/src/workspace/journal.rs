//! The per-turn file journal: what the tools of each turn (one run) changed in a session's
//! workspace, so that a turn can be shown as a diff, undone, or revoked.
//!
//! **How changes are seen.** Around every round of tool calls that holds a tool which is not
//! read-only (file tools, commands in the sandbox, MCP tools, sub-agents), the driver scans the
//! workspace before and after ([`FileJournal::before_round`], [`FileJournal::after_round`]).
//! Whatever changed in between is recorded against the run: a path's first before-image in the
//! turn and its latest after-image. This catches changes made by any tool, a shell command's
//! included, not only those of `write_file` and `edit_file`.
//!
//! **Cost.** A scan is a walk of the workspace with one `statx` per entry; a file is read (and
//! hashed) only when its inode, size or times moved since the last scan, or when it changed so
//! recently that a later change could hide in the same timestamp tick. Contents are kept
//! content-addressed (SHA-256) under `<journal>/<session>/blobs/`, each distinct content once.
//! Files larger than [`JournalConfig::max_file_bytes`] and files with several hard links are
//! tracked but not kept (a turn that changed one says it cannot restore it).
//!
//! **Bounds.** The last [`JournalConfig::keep_turns`] turns of a session are kept; older
//! records and the contents only they referenced are dropped. A workspace with more than
//! [`JournalConfig::max_entries`] entries is not journalled (the scan gives up, says so, and the
//! round runs as usual).
//!
//! **Restoring.** [`FileJournal::restore`] puts every path the chosen turns touched back as it
//! was before the earliest of them: created files and folders removed, changed ones rewritten,
//! deleted ones back, links re-made. A path whose current state is not what the latest of those
//! turns left (someone changed it since) is a conflict: nothing is restored unless forced.
//! Everything goes through [`Root`], so nothing outside the workspace is touched.
//!
//! Names that are not UTF-8 are skipped (neither tracked nor restored).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use agentry_types::{RunId, SessionId};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{EntryKind, Root, Stamp, display_path};
use crate::tool::ToolError;

/// A change stamped this close to a scan may hide another change in the same timestamp tick
/// (file times advance by a clock tick of a few milliseconds): such a file is read again.
const RACY_NS: i128 = 50_000_000;

/// Limits of the file journal.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Files larger than this are tracked but their contents are not kept.
    pub max_file_bytes: u64,
    /// A workspace with more entries than this is not journalled.
    pub max_entries: usize,
    /// How many turns of a session are kept.
    pub keep_turns: usize,
}

impl Default for JournalConfig {
    fn default() -> Self {
        Self {
            max_file_bytes: 16 * 1024 * 1024,
            max_entries: 100_000,
            keep_turns: 100,
        }
    }
}

/// Why the journal could not do something.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The workspace could not be read or written.
    #[error(transparent)]
    Workspace(#[from] ToolError),
    /// The journal's own files could not be read or written.
    #[error("the file journal ({path}): {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// A record of the journal is damaged.
    #[error("the file journal's record {path} is damaged: {message}")]
    Damaged {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// The workspace has more entries than the journal follows.
    #[error("the workspace has more than {0} entries: its changes are not journalled")]
    TooLarge(usize),
    /// A kept content was asked for by a malformed hash.
    #[error("{0:?} is not a content hash (64 lowercase hex digits)")]
    BadHash(String),
    /// No kept content has that hash.
    #[error("no kept content has the hash {0}")]
    NoContent(String),
    /// Paths changed since the turns being restored; nothing was restored.
    #[error("{} file(s) changed since: {}", .0.len(), .0.join(", "))]
    Conflict(Vec<String>),
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> JournalError + '_ {
    move |source| JournalError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What a path was, for the journal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FileState {
    /// Nothing there.
    Absent,
    /// A folder.
    Dir,
    /// A regular file.
    File {
        /// Its size.
        size: u64,
        /// The SHA-256 of its contents, hex; absent when the contents were not kept (too large,
        /// several hard links, unreadable).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hash: Option<String>,
    },
    /// A symbolic link.
    Link {
        /// Where it points.
        target: String,
    },
    /// A device, FIFO or socket (never restored).
    Other,
}

impl FileState {
    /// Whether something is there.
    pub fn exists(&self) -> bool {
        !matches!(self, FileState::Absent)
    }

    /// Whether the journal could put this state back.
    fn restorable(&self) -> bool {
        match self {
            FileState::File { hash, .. } => hash.is_some(),
            FileState::Other => false,
            _ => true,
        }
    }
}

/// One path's change in a turn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileChange {
    /// What it was before the turn's first change to it.
    pub before: FileState,
    /// What the turn left.
    pub after: FileState,
}

/// What one turn (a run) changed in the workspace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnFiles {
    /// The run.
    pub run_id: RunId,
    /// The workspace it ran in.
    pub workspace: PathBuf,
    /// When its first change was recorded (Unix milliseconds).
    pub started_ms: u64,
    /// When its latest change was recorded.
    pub updated_ms: u64,
    /// When its changes were undone (by the `undo` tool), if they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub undone_ms: Option<u64>,
    /// The changed paths (workspace-relative) and what changed.
    pub changes: BTreeMap<String, FileChange>,
}

impl TurnFiles {
    /// The paths whose state differs between before and after (a file written back to what it
    /// was is not a change).
    pub fn changed(&self) -> impl Iterator<Item = (&String, &FileChange)> {
        self.changes
            .iter()
            .filter(|(_, change)| change.before != change.after)
    }
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RestoreReport {
    /// The turns whose changes were rolled back, oldest first.
    pub turns: Vec<RunId>,
    /// Paths written back (changed or deleted files, links).
    pub restored: Vec<String>,
    /// Paths removed (created by the turns).
    pub removed: Vec<String>,
    /// Paths that could not be put back (contents not kept, or the write failed), with why.
    pub failed: Vec<(String, String)>,
}

/// A scan's view of one entry.
#[derive(Debug, Clone)]
struct Scanned {
    state: FileState,
    stamp: Stamp,
}

/// A scan of a workspace.
#[derive(Debug, Clone, Default)]
struct Manifest {
    workspace: PathBuf,
    /// When the scan began (nanoseconds since the Unix epoch).
    started_ns: i128,
    entries: BTreeMap<String, Scanned>,
}

/// The state of the workspace before a round, to compare with after it.
#[derive(Debug)]
pub struct RoundMark {
    manifest: Arc<Manifest>,
}

/// A session's journal state in memory.
#[derive(Debug, Default)]
struct SessionState {
    /// The latest scan, whose hashes the next scan reuses.
    manifest: Option<Arc<Manifest>>,
    /// The turns, oldest first (loaded on first use).
    turns: Option<Vec<TurnFiles>>,
    /// Contents kept since the last collection, which may have become garbage.
    fresh: BTreeSet<String>,
    /// What an undo during the current round put back: not a change of the round (else the
    /// next undo would undo the undo).
    undone: BTreeMap<String, FileState>,
}

/// The file journal of every session, under one folder (outside every workspace).
#[derive(Debug)]
pub struct FileJournal {
    dir: PathBuf,
    config: JournalConfig,
    sessions: Mutex<HashMap<SessionId, Arc<Mutex<SessionState>>>>,
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos() as i128)
        .unwrap_or(0)
}

fn now_ms() -> u64 {
    u64::try_from(now_ns() / 1_000_000).unwrap_or(0)
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Whether `hash` is a SHA-256 in lowercase hex.
fn valid_hash(hash: &str) -> bool {
    hash.len() == 64
        && hash
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl FileJournal {
    /// A journal keeping its records under `dir` (made on first use).
    pub fn new(dir: PathBuf, config: JournalConfig) -> Self {
        Self {
            dir,
            config,
            sessions: Mutex::new(HashMap::new()),
        }
    }

    /// Its limits.
    pub fn config(&self) -> &JournalConfig {
        &self.config
    }

    fn session_dir(&self, session: SessionId) -> PathBuf {
        self.dir.join(session.to_string())
    }

    fn blobs_dir(&self, session: SessionId) -> PathBuf {
        self.session_dir(session).join("blobs")
    }

    fn record_path(&self, session: SessionId) -> PathBuf {
        self.session_dir(session).join("turns.json")
    }

    fn state(&self, session: SessionId) -> Arc<Mutex<SessionState>> {
        Arc::clone(locked(&self.sessions).entry(session).or_default())
    }

    /// Scans the workspace before a round of tool calls, keeping the contents of every file
    /// that changed since the last scan (so that whatever the round does can be undone).
    pub fn before_round(
        &self,
        session: SessionId,
        workspace: &Path,
    ) -> Result<RoundMark, JournalError> {
        let state = self.state(session);
        let mut state = locked(&state);
        let state = &mut *state;
        let manifest = self.scan(
            session,
            workspace,
            state.manifest.as_deref(),
            &mut state.fresh,
        )?;
        let manifest = Arc::new(manifest);
        state.manifest = Some(Arc::clone(&manifest));
        Ok(RoundMark { manifest })
    }

    /// Scans the workspace after the round and records what changed against `run_id`. Answers
    /// how many paths changed.
    pub fn after_round(
        &self,
        session: SessionId,
        run_id: RunId,
        mark: RoundMark,
    ) -> Result<usize, JournalError> {
        let before = mark.manifest;
        let state = self.state(session);
        let mut state = locked(&state);
        let after = self.scan(session, &before.workspace, Some(&before), &mut state.fresh)?;
        let mut changed = BTreeMap::new();
        // Both scans are sorted by path: one merged pass finds what differs.
        let mut was_entries = before.entries.iter().peekable();
        let mut now_entries = after.entries.iter().peekable();
        loop {
            let order = match (was_entries.peek(), now_entries.peek()) {
                (None, None) => break,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((a, _)), Some((b, _))) => a.cmp(b),
            };
            let (path, was, now) = match order {
                std::cmp::Ordering::Equal => match (was_entries.next(), now_entries.next()) {
                    (Some((_, was)), Some((_, now))) if was.state == now.state => continue,
                    (Some((path, was)), Some((_, now))) => {
                        (path, was.state.clone(), now.state.clone())
                    }
                    _ => break,
                },
                std::cmp::Ordering::Less => match was_entries.next() {
                    Some((path, was)) => (path, was.state.clone(), FileState::Absent),
                    None => break,
                },
                std::cmp::Ordering::Greater => match now_entries.next() {
                    Some((path, now)) => (path, FileState::Absent, now.state.clone()),
                    None => break,
                },
            };
            let put_back_by_undo = state.undone.get(path.as_str()) == Some(&now);
            if !put_back_by_undo {
                changed.insert(path.clone(), (was, now));
            }
        }
        state.undone.clear();
        let count = changed.len();
        let workspace = after.workspace.clone();
        state.manifest = Some(Arc::new(after));
        if changed.is_empty() {
            return Ok(0);
        }
        self.load(session, &mut state)?;
        let turns = state.turns.get_or_insert_with(Vec::new);
        let now = now_ms();
        let index = match turns.iter().position(|turn| turn.run_id == run_id) {
            Some(index) => index,
            None => {
                turns.push(TurnFiles {
                    run_id,
                    workspace,
                    started_ms: now,
                    updated_ms: now,
                    undone_ms: None,
                    changes: BTreeMap::new(),
                });
                turns.len() - 1
            }
        };
        let turn = &mut turns[index];
        turn.updated_ms = now;
        for (path, (was, now)) in changed {
            turn.changes
                .entry(path)
                .and_modify(|change| change.after = now.clone())
                .or_insert(FileChange {
                    before: was,
                    after: now,
                });
        }
        let dropped = turns.len().saturating_sub(self.config.keep_turns);
        turns.drain(..dropped);
        self.save(session, &state)?;
        self.collect(session, &mut state, dropped > 0)?;
        Ok(count)
    }

    /// The session's turns that changed files, oldest first.
    pub fn turns(&self, session: SessionId) -> Result<Vec<TurnFiles>, JournalError> {
        let state = self.state(session);
        let mut state = locked(&state);
        self.load(session, &mut state)?;
        Ok(state.turns.clone().unwrap_or_default())
    }

    /// A kept content, by its hash.
    pub fn content(&self, session: SessionId, hash: &str) -> Result<Vec<u8>, JournalError> {
        if !valid_hash(hash) {
            return Err(JournalError::BadHash(hash.to_owned()));
        }
        let path = self.blobs_dir(session).join(hash);
        std::fs::read(&path).map_err(|error| match error.kind() {
            std::io::ErrorKind::NotFound => JournalError::NoContent(hash.to_owned()),
            _ => JournalError::Io {
                path: path.clone(),
                source: error,
            },
        })
    }

    /// Puts the workspace back as it was before the turns `runs` (those of them the journal
    /// has; the others changed no files). With `force`, paths changed since are overwritten;
    /// without it they are a [`JournalError::Conflict`] and nothing is restored. `forget`
    /// drops the turns' records (a revoke); otherwise they are marked undone (the `undo` tool),
    /// and what was put back is not counted as a change of the round the undo runs in.
    pub fn restore(
        &self,
        session: SessionId,
        runs: &[RunId],
        force: bool,
        forget: bool,
    ) -> Result<RestoreReport, JournalError> {
        let state = self.state(session);
        let mut state = locked(&state);
        self.load(session, &mut state)?;
        let turns = state.turns.clone().unwrap_or_default();
        let chosen: Vec<&TurnFiles> = turns
            .iter()
            .filter(|turn| runs.contains(&turn.run_id) && turn.undone_ms.is_none())
            .collect();
        let mut report = RestoreReport {
            turns: chosen.iter().map(|turn| turn.run_id).collect(),
            ..RestoreReport::default()
        };
        // Per workspace, per path: the earliest before and the latest after.
        let mut plans: BTreeMap<&Path, BTreeMap<&str, (FileState, FileState)>> = BTreeMap::new();
        for turn in &chosen {
            let plan = plans.entry(turn.workspace.as_path()).or_default();
            for (path, change) in &turn.changes {
                plan.entry(path.as_str())
                    .and_modify(|(_, after)| *after = change.after.clone())
                    .or_insert((change.before.clone(), change.after.clone()));
            }
        }
        let mut roots = Vec::new();
        let mut conflicts = Vec::new();
        for (workspace, plan) in &plans {
            let root = Root::open(workspace)?;
            let mut current = BTreeMap::new();
            for (path, (_, expected)) in plan {
                let now = self.current(&root, path)?;
                if now != *expected && !force {
                    conflicts.push((*path).to_owned());
                }
                current.insert(*path, now);
            }
            roots.push((root, plan, current));
        }
        if !conflicts.is_empty() {
            return Err(JournalError::Conflict(conflicts));
        }
        let blobs = self.blobs_dir(session);
        for (root, plan, current) in &roots {
            put_back(root, plan, current, &blobs, &mut report);
            if !forget {
                for path in plan.keys() {
                    let now = self.current(root, path)?;
                    state.undone.insert((*path).to_owned(), now);
                }
            }
        }
        let chosen: BTreeSet<RunId> = report.turns.iter().copied().collect();
        if let Some(turns) = state.turns.as_mut() {
            if forget {
                turns.retain(|turn| !chosen.contains(&turn.run_id));
            } else {
                let now = now_ms();
                for turn in turns.iter_mut().filter(|t| chosen.contains(&t.run_id)) {
                    turn.undone_ms = Some(now);
                }
            }
        }
        // The workspace moved under the cached scan: the next one reads what changed.
        state.manifest = None;
        self.save(session, &state)?;
        if forget {
            self.collect(session, &mut state, true)?;
        }
        Ok(report)
    }

    /// Drops the records of the turns `runs` without touching the workspace (a revoke that
    /// keeps the files as they are).
    pub fn forget_turns(&self, session: SessionId, runs: &[RunId]) -> Result<(), JournalError> {
        let state = self.state(session);
        let mut state = locked(&state);
        self.load(session, &mut state)?;
        if let Some(turns) = state.turns.as_mut() {
            turns.retain(|turn| !runs.contains(&turn.run_id));
        }
        self.save(session, &state)?;
        self.collect(session, &mut state, true)
    }

    /// Drops everything the journal keeps for `session` (the session was deleted).
    pub fn forget_session(&self, session: SessionId) -> Result<(), JournalError> {
        locked(&self.sessions).remove(&session);
        let dir = self.session_dir(session);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(io_error(&dir)(error)),
        }
    }

    /// What `path` is now (file contents hashed, not kept).
    fn current(&self, root: &Root, path: &str) -> Result<FileState, JournalError> {
        let relative = Path::new(path);
        let entry = match root.entry(relative, path) {
            Ok(entry) => entry,
            Err(_) if root.check_inside(relative, path).is_err() => return Ok(FileState::Absent),
            Err(error) => return Err(error.into()),
        };
        Ok(match entry.kind {
            EntryKind::Dir => FileState::Dir,
            EntryKind::Symlink => link_state(root, relative, path),
            EntryKind::Other => FileState::Other,
            EntryKind::File => {
                let hash = if entry.size <= self.config.max_file_bytes {
                    root.open_read(relative, path)
                        .ok()
                        .and_then(|(mut file, _)| hash_reader(&mut file, None).ok())
                } else {
                    None
                };
                FileState::File {
                    size: entry.size,
                    hash,
                }
            }
        })
    }

    /// Walks the workspace, reusing `previous`'s hashes where a file's stamp did not move and
    /// keeping the contents of every file read.
    fn scan(
        &self,
        session: SessionId,
        workspace: &Path,
        previous: Option<&Manifest>,
        fresh: &mut BTreeSet<String>,
    ) -> Result<Manifest, JournalError> {
        let started_ns = now_ns();
        let previous = previous.filter(|manifest| manifest.workspace == workspace);
        // A file stamped after this may have changed again within the same tick since.
        let settled_before = previous.map_or(i128::MIN, |m| m.started_ns - RACY_NS);
        let mut manifest = Manifest {
            workspace: workspace.to_owned(),
            started_ns,
            entries: BTreeMap::new(),
        };
        if !workspace.exists() {
            return Ok(manifest);
        }
        let root = Root::open(workspace)?;
        let blobs = self.blobs_dir(session);
        let mut folders = vec![String::new()];
        while let Some(folder) = folders.pop() {
            let listing = match root.list_dir(Path::new(&folder), &display_path(folder.as_ref())) {
                Ok(listing) => listing,
                // Removed while we walked: whatever was inside is gone.
                Err(_) if !folder.is_empty() => continue,
                Err(error) => return Err(error.into()),
            };
            for entry in listing {
                let Some(name) = entry.name.to_str() else {
                    continue;
                };
                let path = if folder.is_empty() {
                    name.to_owned()
                } else {
                    format!("{folder}/{name}")
                };
                if manifest.entries.len() >= self.config.max_entries {
                    return Err(JournalError::TooLarge(self.config.max_entries));
                }
                let relative = Path::new(&path);
                let state = match entry.kind {
                    EntryKind::Dir => {
                        folders.push(path.clone());
                        FileState::Dir
                    }
                    EntryKind::Symlink => link_state(&root, relative, &path),
                    EntryKind::Other => FileState::Other,
                    EntryKind::File => {
                        let known = previous.and_then(|m| m.entries.get(&path)).filter(|known| {
                            known.stamp == entry.stamp
                                && entry.stamp.changed_ns < settled_before
                                && entry.stamp.modified_ns < settled_before
                        });
                        match known {
                            Some(known) => known.state.clone(),
                            None => {
                                let hash = if entry.size <= self.config.max_file_bytes {
                                    keep(&root, relative, &path, &blobs, fresh)?
                                } else {
                                    None
                                };
                                FileState::File {
                                    size: entry.size,
                                    hash,
                                }
                            }
                        }
                    }
                };
                manifest.entries.insert(
                    path,
                    Scanned {
                        state,
                        stamp: entry.stamp,
                    },
                );
            }
        }
        Ok(manifest)
    }

    /// Reads the session's record into `state`, once.
    fn load(&self, session: SessionId, state: &mut SessionState) -> Result<(), JournalError> {
        if state.turns.is_some() {
            return Ok(());
        }
        let path = self.record_path(session);
        let turns = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|error| JournalError::Damaged {
                path: path.clone(),
                message: error.to_string(),
            })?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(error) => return Err(io_error(&path)(error)),
        };
        state.turns = Some(turns);
        Ok(())
    }

    /// Writes the session's record atomically.
    fn save(&self, session: SessionId, state: &SessionState) -> Result<(), JournalError> {
        let path = self.record_path(session);
        let dir = self.session_dir(session);
        std::fs::create_dir_all(&dir).map_err(io_error(&dir))?;
        let bytes =
            serde_json::to_vec(state.turns.as_deref().unwrap_or_default()).map_err(|error| {
                JournalError::Damaged {
                    path: path.clone(),
                    message: error.to_string(),
                }
            })?;
        let temp = dir.join(temp_name("turns"));
        std::fs::write(&temp, bytes).map_err(io_error(&temp))?;
        std::fs::rename(&temp, &path).map_err(io_error(&path))
    }

    /// Removes kept contents nothing refers to any more: those kept since the last collection,
    /// or (with `all`) every one.
    fn collect(
        &self,
        session: SessionId,
        state: &mut SessionState,
        all: bool,
    ) -> Result<(), JournalError> {
        let kept = |file: &FileState| match file {
            FileState::File {
                hash: Some(hash), ..
            } => Some(hash.clone()),
            _ => None,
        };
        let mut live: BTreeSet<String> = BTreeSet::new();
        for turn in state.turns.iter().flatten() {
            for change in turn.changes.values() {
                live.extend(kept(&change.before));
                live.extend(kept(&change.after));
            }
        }
        for scanned in state.manifest.iter().flat_map(|m| m.entries.values()) {
            live.extend(kept(&scanned.state));
        }
        let blobs = self.blobs_dir(session);
        let candidates: Vec<String> = if all {
            match std::fs::read_dir(&blobs) {
                Ok(entries) => entries
                    .flatten()
                    .filter_map(|entry| entry.file_name().into_string().ok())
                    .collect(),
                Err(_) => Vec::new(),
            }
        } else {
            state.fresh.iter().cloned().collect()
        };
        for name in candidates {
            if !live.contains(&name) && !name.starts_with('.') {
                let path = blobs.join(&name);
                if let Err(error) = std::fs::remove_file(&path)
                    && error.kind() != std::io::ErrorKind::NotFound
                {
                    return Err(io_error(&path)(error));
                }
            }
        }
        state.fresh.clear();
        Ok(())
    }
}

fn link_state(root: &Root, relative: &Path, display: &str) -> FileState {
    match root.read_link(relative, display) {
        Ok(target) => match target.into_os_string().into_string() {
            Ok(target) => FileState::Link { target },
            Err(_) => FileState::Other,
        },
        Err(_) => FileState::Other,
    }
}

fn temp_name(stem: &str) -> String {
    let count = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(".{stem}.{}-{count}.tmp", std::process::id())
}

/// Hashes what `reader` gives, copying it to `copy` when given.
fn hash_reader(
    reader: &mut dyn Read,
    mut copy: Option<&mut std::fs::File>,
) -> std::io::Result<String> {
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match reader.read(&mut buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        hasher.update(&buffer[..read]);
        if let Some(copy) = copy.as_mut() {
            copy.write_all(&buffer[..read])?;
        }
    }
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

/// Keeps the contents of the file `relative` (once per distinct content); answers its hash, or
/// `None` when it cannot be read (several hard links, gone, not readable).
fn keep(
    root: &Root,
    relative: &Path,
    display: &str,
    blobs: &Path,
    fresh: &mut BTreeSet<String>,
) -> Result<Option<String>, JournalError> {
    let Ok((mut file, _)) = root.open_read(relative, display) else {
        return Ok(None);
    };
    std::fs::create_dir_all(blobs).map_err(io_error(blobs))?;
    let temp = blobs.join(temp_name("blob"));
    let mut copy = std::fs::File::create(&temp).map_err(io_error(&temp))?;
    let hash = match hash_reader(&mut file, Some(&mut copy)) {
        Ok(hash) => hash,
        Err(_) => {
            let _ = std::fs::remove_file(&temp);
            return Ok(None);
        }
    };
    drop(copy);
    let target = blobs.join(&hash);
    if target.exists() {
        let _ = std::fs::remove_file(&temp);
    } else {
        std::fs::rename(&temp, &target).map_err(io_error(&target))?;
        fresh.insert(hash.clone());
    }
    Ok(Some(hash))
}

/// Puts each path of `plan` back to its `before` state, in an order that works: what must go
/// goes first (files, then folders deepest first), then folders are made (shallowest first),
/// then files and links are written.
fn put_back(
    root: &Root,
    plan: &BTreeMap<&str, (FileState, FileState)>,
    current: &BTreeMap<&str, FileState>,
    blobs: &Path,
    report: &mut RestoreReport,
) {
    let now = |path: &str| current.get(path).cloned().unwrap_or(FileState::Absent);
    let fail = |report: &mut RestoreReport, path: &str, why: String| {
        report.failed.push((path.to_owned(), why));
    };
    // Non-folders that are in the way or must go.
    for (path, (before, _)) in plan {
        let now = now(path);
        let replaced_in_place = matches!(
            (&now, before),
            (FileState::File { .. }, FileState::File { .. })
        );
        if now.exists() && now != FileState::Dir && now != *before && !replaced_in_place {
            match root.remove(Path::new(path), path) {
                Ok(()) if !before.exists() => report.removed.push((*path).to_owned()),
                Ok(()) => {}
                Err(error) => fail(report, path, error.to_string()),
            }
        }
    }
    // Folders that must go, deepest first.
    let mut folders: Vec<&str> = plan
        .iter()
        .filter(|(path, (before, _))| now(path) == FileState::Dir && *before != FileState::Dir)
        .map(|(path, _)| *path)
        .collect();
    folders.sort_by_key(|path| std::cmp::Reverse(path.matches('/').count()));
    for path in folders {
        match root.remove_empty_dir(Path::new(path), path) {
            Ok(()) if !plan[path].0.exists() => report.removed.push(path.to_owned()),
            Ok(()) => {}
            Err(error) => fail(report, path, error.to_string()),
        }
    }
    // Folders to make, shallowest first.
    let mut folders: Vec<&str> = plan
        .iter()
        .filter(|(path, (before, _))| *before == FileState::Dir && now(path) != FileState::Dir)
        .map(|(path, _)| *path)
        .collect();
    folders.sort_by_key(|path| path.matches('/').count());
    for path in folders {
        match root.create_dir(Path::new(path), path) {
            Ok(()) => report.restored.push(path.to_owned()),
            Err(error) => fail(report, path, error.to_string()),
        }
    }
    // Files and links.
    for (path, (before, _)) in plan {
        if now(path) == *before || !before.exists() || *before == FileState::Dir {
            continue;
        }
        if !before.restorable() {
            fail(
                report,
                path,
                "its earlier contents were not kept (too large, several hard links, or not a \
                 regular file)"
                    .into(),
            );
            continue;
        }
        let relative = Path::new(path);
        let outcome = match before {
            FileState::File {
                hash: Some(hash), ..
            } => std::fs::File::open(blobs.join(hash))
                .map_err(|error| format!("its kept contents are missing: {error}"))
                .and_then(|mut blob| {
                    root.write_atomic_from(relative, path, &mut blob, true)
                        .map(drop)
                        .map_err(|error| error.to_string())
                }),
            FileState::Link { target } => root
                .create_symlink(relative, path, Path::new(target))
                .map_err(|error| error.to_string()),
            _ => Ok(()),
        };
        match outcome {
            Ok(()) => report.restored.push((*path).to_owned()),
            Err(why) => fail(report, path, why),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    use agentry_testkit::folder::snapshot as tree;

    fn setup() -> (tempfile::TempDir, PathBuf, FileJournal, SessionId) {
        let temp = tempfile::tempdir().unwrap();
        let workspace = temp.path().join("ws");
        fs::create_dir_all(workspace.join("docs/deep")).unwrap();
        fs::write(workspace.join("a.txt"), "alpha\n").unwrap();
        fs::write(workspace.join("docs/b.txt"), "bravo\n").unwrap();
        fs::write(workspace.join("docs/deep/c.bin"), [0u8, 159, 146, 150]).unwrap();
        std::os::unix::fs::symlink("a.txt", workspace.join("link")).unwrap();
        let journal = FileJournal::new(temp.path().join("journal"), JournalConfig::default());
        (temp, workspace, journal, SessionId::new())
    }

    /// A turn that edits in place (same size, within the scan's timestamp tick), replaces,
    /// creates, deletes files and folders and re-points a link is restored byte for byte.
    #[test]
    fn a_turn_is_restored_byte_for_byte() {
        let (_temp, ws, journal, session) = setup();
        let original = tree(&ws);
        let run = RunId::new();
        let mark = journal.before_round(session, &ws).unwrap();
        // In place, same size, right after the scan.
        fs::OpenOptions::new()
            .write(true)
            .open(ws.join("a.txt"))
            .unwrap()
            .write_all(b"ALPHA\n")
            .unwrap();
        fs::remove_dir_all(ws.join("docs")).unwrap();
        fs::create_dir_all(ws.join("new/inner")).unwrap();
        fs::write(ws.join("new/inner/made.txt"), "made\n").unwrap();
        fs::remove_file(ws.join("link")).unwrap();
        std::os::unix::fs::symlink("elsewhere", ws.join("link")).unwrap();
        assert_eq!(journal.after_round(session, run, mark).unwrap(), 9);
        // A second round of the same turn: its first before-image stays.
        let mark = journal.before_round(session, &ws).unwrap();
        fs::write(ws.join("a.txt"), "third version\n").unwrap();
        journal.after_round(session, run, mark).unwrap();
        let turns = journal.turns(session).unwrap();
        assert_eq!(turns.len(), 1);
        let a = &turns[0].changes["a.txt"];
        assert_eq!(
            a.before,
            FileState::File {
                size: 6,
                hash: Some(hex(&Sha256::digest(b"alpha\n")))
            }
        );
        assert_eq!(
            a.after,
            FileState::File {
                size: 14,
                hash: Some(hex(&Sha256::digest(b"third version\n")))
            }
        );
        assert_ne!(tree(&ws), original);
        let report = journal.restore(session, &[run], false, true).unwrap();
        assert_eq!(tree(&ws), original);
        assert_eq!(report.turns, vec![run]);
        assert!(report.failed.is_empty(), "{report:?}");
        assert!(report.removed.contains(&"new/inner/made.txt".to_owned()));
        assert!(report.removed.contains(&"new".to_owned()));
        assert!(report.restored.contains(&"docs/deep/c.bin".to_owned()));
        // Revoked turns are forgotten, and so are the contents only they kept.
        assert!(journal.turns(session).unwrap().is_empty());
    }

    /// Several turns are rolled back to before the earliest; a file changed since by someone
    /// else is a conflict (nothing restored) unless forced.
    #[test]
    fn later_changes_conflict_unless_forced() {
        let (_temp, ws, journal, session) = setup();
        let original = tree(&ws);
        let (first, second) = (RunId::new(), RunId::new());
        let mark = journal.before_round(session, &ws).unwrap();
        fs::write(ws.join("a.txt"), "one\n").unwrap();
        journal.after_round(session, first, mark).unwrap();
        let mark = journal.before_round(session, &ws).unwrap();
        fs::write(ws.join("a.txt"), "two\n").unwrap();
        fs::write(ws.join("docs/b.txt"), "changed\n").unwrap();
        journal.after_round(session, second, mark).unwrap();
        // Someone edits outside a turn.
        fs::write(ws.join("docs/b.txt"), "by hand\n").unwrap();
        let changed = tree(&ws);
        match journal.restore(session, &[first, second], false, true) {
            Err(JournalError::Conflict(files)) => assert_eq!(files, vec!["docs/b.txt"]),
            other => panic!("expected a conflict: {other:?}"),
        }
        assert_eq!(tree(&ws), changed, "nothing restored");
        journal
            .restore(session, &[first, second], true, true)
            .unwrap();
        assert_eq!(tree(&ws), original);
    }

    /// Undoing marks the turn undone (it is not restored twice); the record stays.
    #[test]
    fn undo_keeps_the_record_marked() {
        let (_temp, ws, journal, session) = setup();
        let original = tree(&ws);
        let run = RunId::new();
        let mark = journal.before_round(session, &ws).unwrap();
        fs::write(ws.join("fresh.txt"), "new").unwrap();
        journal.after_round(session, run, mark).unwrap();
        let report = journal.restore(session, &[run], false, false).unwrap();
        assert_eq!(report.removed, vec!["fresh.txt"]);
        assert_eq!(tree(&ws), original);
        let turns = journal.turns(session).unwrap();
        assert!(turns[0].undone_ms.is_some());
        let again = journal.restore(session, &[run], false, false).unwrap();
        assert!(again.turns.is_empty() && again.restored.is_empty());
    }

    /// Only the last `keep_turns` turns are kept, and contents nothing refers to are dropped.
    #[test]
    fn retention_drops_old_turns_and_their_contents() {
        let (temp, ws, _, session) = setup();
        let config = JournalConfig {
            keep_turns: 2,
            ..JournalConfig::default()
        };
        let journal = FileJournal::new(temp.path().join("journal2"), config);
        let mut runs = Vec::new();
        for round in 0..5 {
            let run = RunId::new();
            runs.push(run);
            let mark = journal.before_round(session, &ws).unwrap();
            fs::write(ws.join("a.txt"), format!("version {round}\n")).unwrap();
            journal.after_round(session, run, mark).unwrap();
        }
        let kept: Vec<RunId> = journal
            .turns(session)
            .unwrap()
            .iter()
            .map(|t| t.run_id)
            .collect();
        assert_eq!(kept, runs[3..].to_vec());
        let blobs = fs::read_dir(journal.blobs_dir(session)).unwrap().count();
        // The workspace's 3 files (a.txt's current contents among them) and a.txt's versions 2
        // and 3 (the kept turns' before-images): nothing else.
        assert_eq!(
            blobs,
            5,
            "{:?}",
            fs::read_dir(journal.blobs_dir(session))
                .unwrap()
                .collect::<Vec<_>>()
        );
        journal.forget_session(session).unwrap();
        assert!(!journal.session_dir(session).exists());
    }

    /// A file over the size limit is tracked but cannot be put back: the restore says so.
    #[test]
    fn files_too_large_to_keep_are_reported() {
        let (temp, ws, _, session) = setup();
        let config = JournalConfig {
            max_file_bytes: 4,
            ..JournalConfig::default()
        };
        let journal = FileJournal::new(temp.path().join("journal3"), config);
        let run = RunId::new();
        let mark = journal.before_round(session, &ws).unwrap();
        fs::write(ws.join("a.txt"), "a longer text\n").unwrap();
        journal.after_round(session, run, mark).unwrap();
        let report = journal.restore(session, &[run], false, true).unwrap();
        assert_eq!(report.failed.len(), 1, "{report:?}");
        assert_eq!(report.failed[0].0, "a.txt");
    }

    /// A workspace with more entries than the limit is not journalled (the scan says why).
    #[test]
    fn oversized_workspaces_are_refused() {
        let (temp, ws, _, session) = setup();
        let config = JournalConfig {
            max_entries: 3,
            ..JournalConfig::default()
        };
        let journal = FileJournal::new(temp.path().join("journal4"), config);
        assert!(matches!(
            journal.before_round(session, &ws),
            Err(JournalError::TooLarge(3))
        ));
        assert!(matches!(
            journal.content(session, "../etc/passwd"),
            Err(JournalError::BadHash(_))
        ));
    }
}
