//! A session's workspace as people manage it (the seed's workspace routes; later the console's
//! Files panel and `agentry files`): list a folder a page at a time, read a file, download a
//! folder as a zip archive (written as it is sent), search names and contents (`.gitignore`d
//! and hidden entries skipped, at most [`MAX_SEARCH_RESULTS`]), create a folder, rename,
//! duplicate, move or copy several entries, delete, and upload large files in chunks.
//!
//! Every path is relative to the workspace root and resolved inside it by the kernel
//! ([`Root`]: `openat2` with `RESOLVE_BENEATH`), so `..`, absolute paths and symbolic links
//! pointing out are refused; a link is listed, renamed or deleted as itself, never followed.
//!
//! Uploads: `init` checks the size against [`WorkspaceLimits::max_upload_bytes`] and the
//! workspace's use against its quota, and plans fixed-size chunks; its plan is kept on disk
//! (`<workspaces>/.uploads/<id>/plan.json`, outside every workspace), so an upload survives a
//! dropped connection or a restart of the server: `status` says which chunks arrived, a chunk
//! may be sent again, in any order. Every chunk is written at its offset in the upload's one
//! data file (`<id>/data`), synced, and only then marked received (`<n>.done`). `complete`
//! moves the data file over the target in one rename (a copy when the workspace is on another
//! file system): the file appears whole or not at all, and its bytes are written once. Uploads
//! left unfinished for a day are swept.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use agentry_core::tool::ToolError;
use agentry_core::workspace::{Entry, EntryKind, Root, display_path, relative_path};
use agentry_types::SessionId;

use crate::App;
use crate::auth::Principal;
use crate::error::{AppError, Failure};

/// How long an unfinished upload is kept after its last byte came.
const UPLOAD_TTL: Duration = Duration::from_secs(2 * 60 * 60);

/// Unfinished uploads one workspace may have at once.
pub const MAX_PENDING_PER_WORKSPACE: usize = 16;

/// Unfinished uploads one API key may have at once, across workspaces.
pub const MAX_PENDING_PER_KEY: usize = 32;

/// The bytes every unfinished upload together may announce.
pub const MAX_PENDING_BYTES: u64 = 64 << 30;

/// The most entries one listing page holds.
pub const MAX_PAGE_SIZE: usize = 1000;

/// Limits on what people put in workspaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkspaceLimits {
    /// The largest file one upload may bring.
    pub max_upload_bytes: u64,
    /// The most one workspace may hold, uploads included.
    pub quota_bytes: u64,
    /// The size of an upload's chunks (the last may be shorter).
    pub chunk_bytes: u64,
}

impl Default for WorkspaceLimits {
    fn default() -> Self {
        Self {
            max_upload_bytes: 4 << 30,
            quota_bytes: 20 << 30,
            chunk_bytes: 8 << 20,
        }
    }
}

/// A file or folder as listed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileEntry {
    /// Its name.
    pub name: String,
    /// Its path, relative to the workspace root.
    pub path: String,
    /// Whether it is a folder.
    pub is_dir: bool,
    /// Bytes (0 for a folder).
    pub size: u64,
    /// Last modified, Unix milliseconds.
    pub modified: u64,
    /// Text, by its name.
    pub is_text: bool,
    /// An image, by its name.
    pub is_image: bool,
    /// Audio, by its name.
    pub is_audio: bool,
    /// Video, by its name.
    pub is_video: bool,
    /// Whether it is a symbolic link (never followed).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub is_symlink: bool,
    /// Its media type, by its name (none for a folder).
    pub mime_type: Option<String>,
}

/// A page of a folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Listing {
    /// The entries of the page.
    pub files: Vec<FileEntry>,
    /// Whether later pages follow.
    pub has_more: bool,
    /// Entries in the folder (after the name filter).
    pub total: usize,
}

/// How a listing is sorted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sort {
    /// Folders first, then by name, ignoring case.
    #[default]
    Name,
    /// Most recently modified first.
    Recent,
}

/// What a move or copy of several entries did: each entry moved (or copied), or why not.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct Transfer {
    /// The entries at their new place.
    pub done: Vec<FileEntry>,
    /// The entries that stayed, each with why.
    pub errors: Vec<TransferError>,
}

/// Why one entry of a move or copy stayed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TransferError {
    /// The entry, as the request named it.
    pub path: String,
    /// Why.
    pub error: String,
    /// Whether an entry of that name is already at the destination.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub conflict: bool,
}

/// A file opened for reading.
#[derive(Debug)]
pub struct OpenedFile {
    /// The file.
    pub file: std::fs::File,
    /// Its size.
    pub size: u64,
    /// Its name.
    pub name: String,
    /// Its media type, by its name.
    pub mime_type: String,
}

/// An upload's plan, as stored and as answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadPlan {
    /// Its id.
    pub upload_id: String,
    /// The session whose workspace it goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// The agent whose shared workspace it goes to (instead of a session's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Where it goes, relative to the workspace root.
    pub target_path: String,
    /// The file's name as the client gave it.
    pub file_name: String,
    /// Its size.
    pub file_size: u64,
    /// The size of each chunk (the last may be shorter).
    pub chunk_size: u64,
    /// How many chunks.
    pub chunk_count: u64,
    /// Who started it (an API key's id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// Whose workspace a file request names, as it named it (a session by id, or an agent with a
/// shared workspace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceRef {
    /// A session's (`session_id`).
    Session(String),
    /// An agent's shared one (`agent_id`).
    Agent(String),
}

impl WorkspaceRef {
    /// The workspace an upload in progress recorded: its agent's, else its session's.
    pub fn stored(session: Option<SessionId>, agent: Option<&str>) -> Self {
        match (agent, session) {
            (Some(agent), _) => Self::Agent(agent.to_owned()),
            (None, session) => Self::Session(session.map(|id| id.to_string()).unwrap_or_default()),
        }
    }

    /// From a request's `session_id` and `agent_id`: exactly one of them.
    pub fn from_ids(session: Option<String>, agent: Option<String>) -> Result<Self, AppError> {
        match (session, agent) {
            (Some(session), None) => Ok(Self::Session(session)),
            (None, Some(agent)) => Ok(Self::Agent(agent)),
            (Some(_), Some(_)) => Err(AppError::bad_request(
                "name one workspace: `session_id` or `agent_id`, not both",
            )),
            (None, None) => Err(AppError::bad_request(
                "name the workspace: `session_id` (a session's) or `agent_id` (an agent's shared one)",
            )),
        }
    }
}

/// Whose a workspace is, once found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceOwner {
    /// This session's.
    Session(SessionId),
    /// This agent's, shared by its sessions.
    Agent(String),
}

impl WorkspaceOwner {
    /// The session, when it is a session's.
    pub fn session(&self) -> Option<SessionId> {
        match self {
            Self::Session(session) => Some(*session),
            Self::Agent(_) => None,
        }
    }

    /// The agent, when it is an agent's.
    pub fn agent(&self) -> Option<String> {
        match self {
            Self::Session(_) => None,
            Self::Agent(agent) => Some(agent.clone()),
        }
    }
}

impl UploadPlan {
    /// The workspace it goes to.
    pub fn workspace(&self) -> WorkspaceRef {
        WorkspaceRef::stored(self.session_id, self.agent_id.as_deref())
    }

    /// The size chunk `n` must have.
    pub fn chunk_len(&self, n: u64) -> Option<u64> {
        (n < self.chunk_count).then(|| {
            let start = n * self.chunk_size;
            self.chunk_size.min(self.file_size - start)
        })
    }
}

/// Where an upload is: its plan and the chunks that arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UploadStatus {
    /// The plan.
    #[serde(flatten)]
    pub plan: UploadPlan,
    /// The chunks received whole, by number.
    pub received: Vec<u64>,
    /// The chunks still to send.
    pub missing: Vec<u64>,
}

fn tool_error(error: ToolError) -> AppError {
    match error {
        ToolError::InvalidArguments(message) => AppError::bad_request(message),
        ToolError::Failed(message) if message.contains("no such file") => {
            AppError::not_found(message)
        }
        ToolError::Failed(message) if message.contains("already exists") => {
            AppError::conflict(message)
        }
        ToolError::Failed(message) => AppError::bad_request(message),
        other => AppError::internal(other.to_string()),
    }
}

fn io_error(error: std::io::Error) -> AppError {
    AppError::internal(format!("workspace storage: {error}"))
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AppError> + Send + 'static,
) -> Result<T, AppError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| AppError::internal(format!("a file task failed: {error}")))?
}

/// A thumbnail: an image scaled to fit a square, PNG when it has transparency, else JPEG.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Thumbnail {
    /// The encoded picture.
    pub bytes: Vec<u8>,
    /// `image/png` or `image/jpeg`.
    pub mime_type: &'static str,
    /// Its width and height.
    pub width: u32,
    /// Its height.
    pub height: u32,
}

/// Where pasted files go, relative to a session's workspace (the seed's `paste-dir`): a chat
/// uploads a pasted picture or document there, then names it with `<file>pasted/…</file>`.
pub const PASTE_FOLDER: &str = "pasted";

/// The largest image file made into a thumbnail (it is read whole to be decoded).
pub const MAX_THUMBNAIL_SOURCE: u64 = 64 << 20;

/// The sides of a thumbnail a request may ask for.
pub const THUMBNAIL_EDGES: std::ops::RangeInclusive<u32> = 16..=1024;

/// The widest and tallest image decoded for a thumbnail (pixels).
pub const MAX_THUMBNAIL_SIDE: u32 = 8_192;

/// The most memory one decode may take: a picture declaring more (an 11,000² PNG compresses
/// to half a megabyte and decodes to almost 500 MB) is refused before it is decoded.
pub const MAX_THUMBNAIL_DECODE: u64 = 128 << 20;

/// Thumbnails decoded at once in this process: with [`MAX_THUMBNAIL_DECODE`], at most 256 MiB
/// of pixels however many requests come; the rest wait their turn, up to
/// [`THUMBNAIL_WAIT`].
pub const THUMBNAIL_DECODES: usize = 2;

/// How long a thumbnail request waits for a decode slot before it is told to come back.
const THUMBNAIL_WAIT: Duration = Duration::from_secs(30);

/// The bytes of thumbnails kept, by workspace file and version, so the same thumbnail asked
/// again (another client, a cleared browser cache) is not decoded again.
const THUMBNAIL_CACHE_BYTES: usize = 32 << 20;

/// Made thumbnails by key (the file's path and its ETag), oldest first for eviction.
#[derive(Default)]
struct ThumbnailCache {
    entries: HashMap<String, Arc<Thumbnail>>,
    order: std::collections::VecDeque<String>,
    bytes: usize,
}

impl ThumbnailCache {
    fn get(&self, key: &str) -> Option<Arc<Thumbnail>> {
        self.entries.get(key).cloned()
    }

    fn put(&mut self, key: String, thumbnail: Arc<Thumbnail>) {
        if thumbnail.bytes.len() > THUMBNAIL_CACHE_BYTES || self.entries.contains_key(&key) {
            return;
        }
        self.bytes += thumbnail.bytes.len();
        self.entries.insert(key.clone(), thumbnail);
        self.order.push_back(key);
        while self.bytes > THUMBNAIL_CACHE_BYTES {
            let Some(oldest) = self.order.pop_front() else {
                break;
            };
            if let Some(gone) = self.entries.remove(&oldest) {
                self.bytes -= gone.bytes.len();
            }
        }
    }
}

/// What thumbnails share across the app's workspaces: the decode slots
/// ([`THUMBNAIL_DECODES`]) and the cache of made thumbnails.
pub struct Thumbnails {
    slots: tokio::sync::Semaphore,
    cache: std::sync::Mutex<ThumbnailCache>,
}

impl Default for Thumbnails {
    fn default() -> Self {
        Self {
            slots: tokio::sync::Semaphore::new(THUMBNAIL_DECODES),
            cache: std::sync::Mutex::default(),
        }
    }
}

impl Thumbnails {
    fn cache(&self) -> std::sync::MutexGuard<'_, ThumbnailCache> {
        self.cache
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// Decodes an image (PNG, JPEG, GIF, WebP, BMP; within limits on its size and memory) and
/// scales it to fit `edge`×`edge`, keeping its proportions (never enlarging it).
pub fn thumbnail_of(opened: OpenedFile, edge: u32) -> Result<Thumbnail, AppError> {
    use image::ImageFormat;
    if !THUMBNAIL_EDGES.contains(&edge) {
        return Err(AppError::bad_request(format!(
            "a thumbnail is {} to {} pixels",
            THUMBNAIL_EDGES.start(),
            THUMBNAIL_EDGES.end()
        )));
    }
    if opened.size > MAX_THUMBNAIL_SOURCE {
        return Err(AppError::new(
            Failure::TooLarge,
            "image_too_large",
            format!(
                "{} is {} bytes; thumbnails are made of images up to {MAX_THUMBNAIL_SOURCE}",
                opened.name, opened.size
            ),
        ));
    }
    let not_an_image = |detail: String| {
        AppError::new(
            Failure::Invalid,
            "not_an_image",
            format!("{} has no thumbnail: {detail}", opened.name),
        )
    };
    let mut reader = image::ImageReader::new(std::io::BufReader::new(&opened.file))
        .with_guessed_format()
        .map_err(|error| not_an_image(error.to_string()))?;
    if reader.format().is_none() {
        return Err(not_an_image(
            "not a PNG, JPEG, GIF, WebP or BMP image".into(),
        ));
    }
    let mut limits = image::Limits::default();
    limits.max_image_width = Some(MAX_THUMBNAIL_SIDE);
    limits.max_image_height = Some(MAX_THUMBNAIL_SIDE);
    limits.max_alloc = Some(MAX_THUMBNAIL_DECODE);
    reader.limits(limits);
    let picture = reader
        .decode()
        .map_err(|error| not_an_image(error.to_string()))?;
    let scaled = if picture.width() > edge || picture.height() > edge {
        picture.thumbnail(edge, edge)
    } else {
        picture
    };
    let (width, height) = (scaled.width(), scaled.height());
    let mut bytes = std::io::Cursor::new(Vec::new());
    let (written, mime_type) = if scaled.color().has_alpha() {
        (
            scaled.to_rgba8().write_to(&mut bytes, ImageFormat::Png),
            "image/png",
        )
    } else {
        (
            scaled.to_rgb8().write_to(&mut bytes, ImageFormat::Jpeg),
            "image/jpeg",
        )
    };
    written.map_err(|error| AppError::internal(format!("cannot encode a thumbnail: {error}")))?;
    Ok(Thumbnail {
        bytes: bytes.into_inner(),
        mime_type,
        width,
        height,
    })
}

/// A file or folder name for a new entry: one component, no separators or NULs.
fn check_name(name: &str) -> Result<(), AppError> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.len() > 255
        || name.contains(['/', '\\', '\0']);
    if bad {
        return Err(AppError::bad_request(format!("invalid name {name:?}")));
    }
    Ok(())
}

fn media_type(name: &str) -> Option<String> {
    mime_guess::from_path(name)
        .first()
        .map(|mime| mime.essence_str().to_owned())
}

fn file_entry(relative: &Path, entry: &Entry) -> FileEntry {
    let name = entry.name.to_string_lossy().into_owned();
    let is_dir = entry.kind == EntryKind::Dir;
    let mime = (!is_dir).then(|| media_type(&name)).flatten();
    let top = mime
        .as_deref()
        .and_then(|m| m.split('/').next())
        .unwrap_or("");
    let is_text = !is_dir
        && (top == "text"
            || mime.as_deref().is_some_and(|m| {
                m.ends_with("json")
                    || m.ends_with("xml")
                    || m.ends_with("javascript")
                    || m.ends_with("yaml")
                    || m.ends_with("toml")
            }));
    FileEntry {
        path: display_path(&relative.join(&entry.name)),
        is_dir,
        size: if is_dir { 0 } else { entry.size },
        modified: entry.modified_ms,
        is_text,
        is_image: top == "image",
        is_audio: top == "audio",
        is_video: top == "video",
        is_symlink: entry.kind == EntryKind::Symlink,
        mime_type: mime,
        name,
    }
}

/// The entry at `relative` as listed.
fn entry_at(root: &Root, relative: &Path) -> Result<FileEntry, AppError> {
    let display = display_path(relative);
    let entry = root.entry(relative, &display).map_err(tool_error)?;
    Ok(file_entry(
        relative.parent().unwrap_or(Path::new("")),
        &entry,
    ))
}

/// Bytes the workspace holds (files only, links not followed).
fn usage(root: &Root, relative: &Path) -> Result<u64, AppError> {
    let mut total = 0;
    for entry in root
        .list_dir(relative, &display_path(relative))
        .map_err(tool_error)?
    {
        match entry.kind {
            EntryKind::Dir => total += usage(root, &relative.join(&entry.name))?,
            EntryKind::File => total += entry.size,
            _ => {}
        }
    }
    Ok(total)
}

/// `name (n).ext`, the first `n` from 1 that is free in `parent`.
fn duplicate_name(root: &Root, parent: &Path, name: &str) -> Result<PathBuf, AppError> {
    let (stem, extension) = match name.rfind('.') {
        Some(0) | None => (name, ""),
        Some(dot) => (&name[..dot], &name[dot..]),
    };
    for n in 1..10_000 {
        let candidate = parent.join(format!("{stem} ({n}){extension}"));
        if root.entry(&candidate, "").is_err() {
            return Ok(candidate);
        }
    }
    Err(AppError::conflict(format!(
        "no free name for a copy of {name:?}"
    )))
}

/// Copies the file or folder `from` to `to` (which must not exist).
fn copy_entry(root: &Root, from: &Path, to: &Path) -> Result<(), AppError> {
    let from_display = display_path(from);
    let entry = root.entry(from, &from_display).map_err(tool_error)?;
    match entry.kind {
        EntryKind::File => {
            let (mut file, _) = root.open_read(from, &from_display).map_err(tool_error)?;
            root.write_atomic_from(to, &display_path(to), &mut file, false)
                .map_err(tool_error)?;
        }
        EntryKind::Dir => {
            root.create_dir(to, &display_path(to)).map_err(tool_error)?;
            for child in root.list_dir(from, &from_display).map_err(tool_error)? {
                copy_entry(root, &from.join(&child.name), &to.join(&child.name))?;
            }
        }
        // Links and special files are not copied (a copy of a link could point anywhere).
        _ => {}
    }
    Ok(())
}

/// A workspace folder, opened: what the file manager does, on the calling thread (it blocks;
/// the app's `workspace_*` methods run it off the async threads, `agentry files` directly).
#[derive(Debug)]
pub struct Workspace {
    root: Root,
}

impl Workspace {
    /// Opens the workspace at `folder`, making it if missing.
    pub fn open(folder: &Path) -> Result<Self, AppError> {
        std::fs::create_dir_all(folder).map_err(io_error)?;
        Ok(Self {
            root: Root::open(folder).map_err(tool_error)?,
        })
    }

    /// `path` checked and made relative to the root.
    fn relative(&self, path: &str) -> Result<PathBuf, AppError> {
        relative_path(self.root.path(), path).map_err(tool_error)
    }

    /// A page of the folder `path`.
    pub fn list(
        &self,
        path: &str,
        page: usize,
        page_size: usize,
        sort: Sort,
        name_filter: Option<&str>,
    ) -> Result<Listing, AppError> {
        if page == 0 || page_size == 0 || page_size > MAX_PAGE_SIZE {
            return Err(AppError::bad_request(format!(
                "`page` counts from 1 and `page_size` is 1 to {MAX_PAGE_SIZE}"
            )));
        }
        let relative = self.relative(path)?;
        let mut entries: Vec<FileEntry> = self
            .root
            .list_dir(&relative, &display_path(&relative))
            .map_err(tool_error)?
            .iter()
            .map(|entry| file_entry(&relative, entry))
            .collect();
        if let Some(filter) = name_filter.filter(|f| !f.is_empty()) {
            let filter = filter.to_lowercase();
            entries.retain(|entry| entry.name.to_lowercase().contains(&filter));
        }
        match sort {
            Sort::Name => entries.sort_by(|a, b| {
                b.is_dir
                    .cmp(&a.is_dir)
                    .then_with(|| a.name.to_lowercase().cmp(&b.name.to_lowercase()))
            }),
            Sort::Recent => entries.sort_by(|a, b| {
                b.modified
                    .cmp(&a.modified)
                    .then_with(|| a.name.cmp(&b.name))
            }),
        }
        let total = entries.len();
        let start = (page - 1).saturating_mul(page_size).min(total);
        let end = start.saturating_add(page_size).min(total);
        Ok(Listing {
            files: entries[start..end].to_vec(),
            has_more: end < total,
            total,
        })
    }

    /// Opens the file `path` for reading.
    pub fn open_file(&self, path: &str) -> Result<OpenedFile, AppError> {
        let relative = self.relative(path)?;
        let display = display_path(&relative);
        let (file, size) = self
            .root
            .open_read(&relative, &display)
            .map_err(tool_error)?;
        let name = relative
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mime_type = media_type(&name).unwrap_or_else(|| "application/octet-stream".to_owned());
        Ok(OpenedFile {
            file,
            size,
            name,
            mime_type,
        })
    }

    /// The folders directly in `path` (hidden ones left out), by name: what a folder picker
    /// shows. Links are not followed, so a link to a folder is not one here.
    pub fn children(&self, path: &str) -> Result<Vec<FileEntry>, AppError> {
        let relative = self.relative(path)?;
        let mut folders: Vec<FileEntry> = self
            .root
            .list_dir(&relative, &display_path(&relative))
            .map_err(tool_error)?
            .iter()
            .filter(|entry| entry.kind == EntryKind::Dir)
            .filter(|entry| !entry.name.to_string_lossy().starts_with('.'))
            .map(|entry| file_entry(&relative, entry))
            .collect();
        folders.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(folders)
    }

    /// Creates the folder `name` in `parent`.
    pub fn mkdir(&self, parent: &str, name: &str) -> Result<FileEntry, AppError> {
        check_name(name)?;
        let relative = self.relative(parent)?.join(name);
        self.root
            .create_dir(&relative, &display_path(&relative))
            .map_err(tool_error)?;
        entry_at(&self.root, &relative)
    }

    /// Renames `path` to `new_name` in the same folder (an existing name is a conflict).
    pub fn rename(&self, path: &str, new_name: &str) -> Result<FileEntry, AppError> {
        check_name(new_name)?;
        let from = self.relative(path)?;
        if from.as_os_str().is_empty() {
            return Err(AppError::bad_request(
                "the workspace root cannot be renamed",
            ));
        }
        let to = from.with_file_name(new_name);
        self.root
            .rename(&from, &display_path(&from), &to, &display_path(&to))
            .map_err(tool_error)?;
        entry_at(&self.root, &to)
    }

    /// Copies `path` beside itself as `name (n).ext`.
    pub fn duplicate(&self, path: &str) -> Result<FileEntry, AppError> {
        let from = self.relative(path)?;
        let Some(name) = from.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            return Err(AppError::bad_request(
                "the workspace root cannot be duplicated",
            ));
        };
        let parent = from.parent().unwrap_or(Path::new("")).to_owned();
        let to = duplicate_name(&self.root, &parent, &name)?;
        copy_entry(&self.root, &from, &to)?;
        entry_at(&self.root, &to)
    }

    /// Moves (or, with `copy`, copies) each of `paths` into the folder `dest_dir`; an entry
    /// of the same name there is a conflict unless `overwrite` (then it is replaced). Each
    /// entry succeeds or fails alone.
    pub fn transfer(
        &self,
        paths: &[String],
        dest_dir: &str,
        overwrite: bool,
        copy: bool,
    ) -> Result<Transfer, AppError> {
        let dest = self.relative(dest_dir)?;
        self.root
            .check_dir(&dest, &display_path(&dest))
            .map_err(|_| {
                AppError::bad_request(format!("Destination is not a directory: {dest_dir}"))
            })?;
        let mut transfer = Transfer::default();
        for path in paths {
            let outcome = self.transfer_one(path, &dest, overwrite, copy);
            match outcome {
                Ok(entry) => transfer.done.push(entry),
                Err(error) => transfer.errors.push(TransferError {
                    path: path.clone(),
                    conflict: error.failure == Failure::Conflict,
                    error: error.message,
                }),
            }
        }
        Ok(transfer)
    }

    fn transfer_one(
        &self,
        path: &str,
        dest: &Path,
        overwrite: bool,
        copy: bool,
    ) -> Result<FileEntry, AppError> {
        let from = self.relative(path)?;
        let Some(name) = from.file_name() else {
            return Err(AppError::bad_request("the workspace root cannot be moved"));
        };
        let to = dest.join(name);
        if to == from {
            return Err(AppError::bad_request("Source and target are the same path"));
        }
        if overwrite && self.root.entry(&to, "").is_ok() {
            self.root
                .remove(&to, &display_path(&to))
                .map_err(tool_error)?;
        }
        if copy {
            if self.root.entry(&to, "").is_ok() {
                return Err(AppError::conflict(format!(
                    "Target already exists: {}",
                    display_path(&to)
                )));
            }
            copy_entry(&self.root, &from, &to)?;
        } else {
            self.root
                .rename(&from, &display_path(&from), &to, &display_path(&to))
                .map_err(tool_error)?;
        }
        entry_at(&self.root, &to)
    }

    /// Deletes `path` (a folder with everything in it; a link itself, never its target).
    /// Answers the path as shown.
    pub fn delete(&self, path: &str) -> Result<String, AppError> {
        let relative = self.relative(path)?;
        let display = display_path(&relative);
        self.root.remove(&relative, &display).map_err(tool_error)?;
        Ok(display)
    }

    /// Checks that `size` bytes may go to `target` (a file name, within the size limit and the
    /// quota, not a folder) and sweeps old uploads. Answers the target as shown.
    pub fn check_upload(
        &self,
        target: &str,
        size: u64,
        limits: WorkspaceLimits,
    ) -> Result<String, AppError> {
        let shown = self.check_upload_beside(target, size, 0, limits)?;
        if let Some(workspaces) = self.root.path().parent() {
            sweep_uploads(&uploads_in(workspaces));
        }
        Ok(shown)
    }

    /// Checks that `size` bytes may go to `target` with `pending` bytes that other unfinished
    /// uploads to this workspace announced counted as used (the caller sweeps).
    fn check_upload_beside(
        &self,
        target: &str,
        size: u64,
        pending: u64,
        limits: WorkspaceLimits,
    ) -> Result<String, AppError> {
        let relative = self.relative(target)?;
        let Some(name) = relative.file_name() else {
            return Err(AppError::bad_request(
                "the upload's target must name a file",
            ));
        };
        check_name(&name.to_string_lossy())?;
        if size > limits.max_upload_bytes {
            return Err(AppError::new(
                Failure::TooLarge,
                "upload_too_large",
                format!(
                    "{size} bytes is over the upload limit of {} bytes",
                    limits.max_upload_bytes
                ),
            ));
        }
        if let Ok(entry) = self.root.entry(&relative, "")
            && entry.kind == EntryKind::Dir
        {
            return Err(AppError::conflict(format!(
                "{} is a folder",
                display_path(&relative)
            )));
        }
        let used = usage(&self.root, Path::new(""))?.saturating_add(pending);
        if used.saturating_add(size) > limits.quota_bytes {
            return Err(AppError::new(
                Failure::TooLarge,
                "quota_exceeded",
                format!(
                    "the workspace holds {used} bytes (unfinished uploads to it included); \
                     {size} more would pass its quota of {} bytes",
                    limits.quota_bytes
                ),
            ));
        }
        Ok(display_path(&relative))
    }

    /// Writes `size` bytes from `reader` to `target` (checked as an upload), replacing a file
    /// there; the file appears whole or not at all.
    pub fn put(
        &self,
        target: &str,
        reader: &mut dyn Read,
        size: u64,
        limits: WorkspaceLimits,
    ) -> Result<FileEntry, AppError> {
        let shown = self.check_upload(target, size, limits)?;
        let relative = PathBuf::from(&shown);
        let mut limited = reader.take(size);
        let (_, written) = self
            .root
            .write_atomic_from(&relative, &shown, &mut limited, true)
            .map_err(tool_error)?;
        if written != size {
            return Err(AppError::bad_request(format!(
                "{shown}: {written} bytes arrived, {size} were announced"
            )));
        }
        entry_at(&self.root, &relative)
    }

    /// Puts the file at `source` (outside the workspace, on the same file system: an upload's
    /// data) at `target` whole, by a rename (replacing a file of that name), or by a copy when
    /// the rename cannot cross file systems. The size limit and quota are checked first.
    pub fn install(
        &self,
        target: &str,
        source: &Path,
        limits: WorkspaceLimits,
    ) -> Result<FileEntry, AppError> {
        let size = std::fs::metadata(source).map_err(io_error)?.len();
        let shown = self.check_upload(target, size, limits)?;
        let relative = PathBuf::from(&shown);
        match self.root.install(source, &relative, &shown) {
            Ok(()) => entry_at(&self.root, &relative),
            Err(_) => {
                let mut file = std::fs::File::open(source).map_err(io_error)?;
                self.put(target, &mut file, size, limits)
            }
        }
    }

    /// Searches below `path` (see [`search`]).
    pub fn search(
        &self,
        path: &str,
        query: Option<&str>,
        name_filter: Option<&str>,
    ) -> Result<Vec<FileEntry>, AppError> {
        if query.is_none() && name_filter.is_none() {
            return Err(AppError::bad_request(
                "Missing 'query' or 'name_filter' parameter",
            ));
        }
        search(&self.root, &self.relative(path)?, query, name_filter)
    }
}

/// Where uploads in progress are kept, beside the sessions' workspaces in `workspaces` (a
/// session id is a UUID, never `.uploads`).
fn uploads_in(workspaces: &Path) -> PathBuf {
    workspaces.join(".uploads")
}

/// Removes uploads that received nothing for longer than [`UPLOAD_TTL`] (their folder's and
/// files' newest change); answers how many.
pub(crate) fn sweep_uploads(uploads: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(uploads) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let last_change = std::iter::once(entry.path())
            .chain(
                std::fs::read_dir(entry.path())
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|file| file.path()),
            )
            .filter_map(|path| {
                std::fs::metadata(path)
                    .and_then(|meta| meta.modified())
                    .ok()
            })
            .max();
        let idle = last_change
            .and_then(|changed| now.duration_since(changed).ok())
            .is_some_and(|age| age > UPLOAD_TTL);
        if idle && std::fs::remove_dir_all(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// An unfinished upload as its folder describes it: where it goes, whose it is, its size.
struct PendingUpload {
    session_id: Option<SessionId>,
    agent_id: Option<String>,
    owner: Option<String>,
    bytes: u64,
}

/// What this module reads of a tus upload's `tus.json` (the tus module writes it): whose it
/// is, its length, and whether it is complete.
#[derive(Deserialize)]
struct StoredTusUpload {
    #[serde(default)]
    session_id: Option<SessionId>,
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    owner: Option<String>,
    length: u64,
    #[serde(default)]
    completed: bool,
}

/// The unfinished uploads in `uploads` (chunked plans and tus uploads not yet complete).
fn pending_uploads(uploads: &Path) -> Vec<PendingUpload> {
    let Ok(entries) = std::fs::read_dir(uploads) else {
        return Vec::new();
    };
    let mut pending = Vec::new();
    for entry in entries.flatten() {
        let folder = entry.path();
        if let Ok(text) = std::fs::read(folder.join("plan.json"))
            && let Ok(plan) = serde_json::from_slice::<UploadPlan>(&text)
        {
            pending.push(PendingUpload {
                session_id: plan.session_id,
                agent_id: plan.agent_id,
                owner: plan.owner,
                bytes: plan.file_size,
            });
        } else if let Ok(text) = std::fs::read(folder.join("tus.json"))
            && let Ok(upload) = serde_json::from_slice::<StoredTusUpload>(&text)
            && !upload.completed
        {
            pending.push(PendingUpload {
                session_id: upload.session_id,
                agent_id: upload.agent_id,
                owner: upload.owner,
                bytes: upload.length,
            });
        }
    }
    pending
}

/// `429 too_many_uploads`: `why`.
fn too_many_uploads(why: String) -> AppError {
    AppError::new(Failure::TooMany, "too_many_uploads", why).with_details(serde_json::json!({
        "retry_after_secs": 60,
    }))
}

/// An upload id as made by `init`: 32 lowercase hex digits.
fn check_upload_id(id: &str) -> Result<(), AppError> {
    if id.len() == 32 && id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        Ok(())
    } else {
        Err(AppError::not_found(format!("no upload {id:?}")))
    }
}

/// The chunks marked received (written whole and synced).
fn received_chunks(folder: &Path, plan: &UploadPlan) -> Vec<u64> {
    (0..plan.chunk_count)
        .filter(|n| folder.join(format!("{n}.done")).exists())
        .collect()
}

/// How much of an upload's body is gathered before one write.
const UPLOAD_BLOCK: usize = 1024 * 1024;

/// Where an upload's bytes collect, each chunk at its offset, outside every workspace.
fn upload_data(folder: &Path) -> PathBuf {
    folder.join("data")
}

/// The most results one search answers.
pub const MAX_SEARCH_RESULTS: usize = 500;

/// The most bytes of one file a content search reads.
const SEARCH_READ_BYTES: u64 = 4 << 20;

/// What a download brings: a file, or a folder as a zip stream.
#[derive(Debug)]
pub enum Download {
    /// A file.
    File(OpenedFile),
    /// A folder: its name and its zip archive, as it is written.
    Folder {
        /// The folder's name (the archive is `<name>.zip`).
        name: String,
        /// The archive's bytes.
        archive: tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>,
    },
}

/// Sends what is written to it over a channel, in pieces of 64 KiB.
struct ChannelWriter {
    sender: tokio::sync::mpsc::Sender<Result<bytes::Bytes, std::io::Error>>,
    buffer: Vec<u8>,
}

impl ChannelWriter {
    const PIECE: usize = 64 * 1024;

    fn send(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let piece = bytes::Bytes::from(std::mem::take(&mut self.buffer));
        self.sender
            .blocking_send(Ok(piece))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left"))
    }
}

impl std::io::Write for ChannelWriter {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        if self.buffer.len() >= Self::PIECE {
            self.send()?;
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.send()
    }
}

/// Adds the folder `relative` to `zip` under `prefix` (files and folders; links and special
/// files are left out).
fn zip_folder<W: std::io::Write>(
    root: &Root,
    relative: &Path,
    prefix: &str,
    zip: &mut zip::ZipWriter<zip::write::StreamWriter<W>>,
) -> Result<(), AppError> {
    let options = zip::write::SimpleFileOptions::default()
        .compression_method(zip::CompressionMethod::Deflated)
        .large_file(true);
    let zip_error = |error: zip::result::ZipError| AppError::internal(format!("zip: {error}"));
    let mut entries = root
        .list_dir(relative, &display_path(relative))
        .map_err(tool_error)?;
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    for entry in entries {
        let name = format!("{prefix}{}", entry.name.to_string_lossy());
        let path = relative.join(&entry.name);
        match entry.kind {
            EntryKind::Dir => {
                zip.add_directory(format!("{name}/"), options)
                    .map_err(zip_error)?;
                zip_folder(root, &path, &format!("{name}/"), zip)?;
            }
            EntryKind::File => {
                let (mut file, _) = root
                    .open_read(&path, &display_path(&path))
                    .map_err(tool_error)?;
                zip.start_file(name, options).map_err(zip_error)?;
                std::io::copy(&mut file, zip).map_err(io_error)?;
            }
            EntryKind::Symlink | EntryKind::Other => {}
        }
    }
    Ok(())
}

/// Whether `text` holds the query: `a|b` any of the terms, `a b` all of them (literal,
/// case-sensitive).
fn holds(text: &str, query: &str) -> bool {
    if query.contains('|') {
        query
            .split('|')
            .map(str::trim)
            .filter(|term| !term.is_empty())
            .any(|term| text.contains(term))
    } else {
        query.split_whitespace().all(|term| text.contains(term))
    }
}

/// Searches below `relative`: names holding `name_filter` (ignoring case), files holding
/// `query`; `.gitignore`d and hidden entries skipped, links not followed, at most
/// [`MAX_SEARCH_RESULTS`].
fn search(
    root: &Root,
    relative: &Path,
    query: Option<&str>,
    name_filter: Option<&str>,
) -> Result<Vec<FileEntry>, AppError> {
    root.check_dir(relative, &display_path(relative))
        .map_err(tool_error)?;
    let filter = name_filter.map(str::to_lowercase);
    let walk = ignore::WalkBuilder::new(root.path().join(relative))
        .follow_links(false)
        .require_git(false)
        .build();
    let mut found = Vec::new();
    for entry in walk.flatten() {
        if found.len() >= MAX_SEARCH_RESULTS {
            break;
        }
        if entry.depth() == 0 {
            continue;
        }
        let Ok(path) = entry.path().strip_prefix(root.path()) else {
            continue;
        };
        let name = entry.file_name().to_string_lossy().to_lowercase();
        if filter
            .as_ref()
            .is_some_and(|filter| !name.contains(filter.as_str()))
        {
            continue;
        }
        let Ok(listed) = root.entry(path, "") else {
            continue;
        };
        if let Some(query) = query {
            if listed.kind != EntryKind::File {
                continue;
            }
            let Ok((file, _)) = root.open_read(path, "") else {
                continue;
            };
            let mut head = Vec::new();
            if file.take(SEARCH_READ_BYTES).read_to_end(&mut head).is_err()
                || head[..head.len().min(agentry_core::workspace::BINARY_SNIFF_BYTES)].contains(&0)
                || !holds(&String::from_utf8_lossy(&head), query)
            {
                continue;
            }
        }
        found.push(file_entry(path.parent().unwrap_or(Path::new("")), &listed));
    }
    Ok(found)
}

#[cfg(test)]
mod thumbnail_tests {
    use super::*;

    fn opened(bytes: &[u8]) -> (tempfile::TempDir, OpenedFile) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.png");
        std::fs::write(&path, bytes).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        let size = file.metadata().unwrap().len();
        let opened = OpenedFile {
            file,
            size,
            name: "big.png".into(),
            mime_type: "image/png".into(),
        };
        (dir, opened)
    }

    /// A picture wider than [`MAX_THUMBNAIL_SIDE`] is refused before its pixels are decoded
    /// (the second security review's N6: a small file declaring a huge picture).
    #[test]
    fn a_picture_too_large_to_decode_is_refused() {
        let mut bytes = std::io::Cursor::new(Vec::new());
        image::GrayImage::new(MAX_THUMBNAIL_SIDE + 1, 1)
            .write_to(&mut bytes, image::ImageFormat::Png)
            .unwrap();
        let (_dir, file) = opened(bytes.get_ref());
        let error = thumbnail_of(file, 64).unwrap_err();
        assert_eq!(error.code, "not_an_image", "{error:?}");
        let mut small = std::io::Cursor::new(Vec::new());
        image::GrayImage::new(100, 10)
            .write_to(&mut small, image::ImageFormat::Png)
            .unwrap();
        let (_dir, file) = opened(small.get_ref());
        assert_eq!(thumbnail_of(file, 64).unwrap().width, 64);
    }

    /// No more than [`THUMBNAIL_DECODES`] decodes run at once, and the cache keeps at most
    /// its byte budget, oldest out first.
    #[test]
    fn decodes_are_bounded_and_the_cache_is_capped() {
        let thumbnails = Thumbnails::default();
        let held: Vec<_> = (0..THUMBNAIL_DECODES)
            .map(|_| thumbnails.slots.try_acquire().unwrap())
            .collect();
        assert!(
            thumbnails.slots.try_acquire().is_err(),
            "a third decode waits"
        );
        drop(held);
        assert!(thumbnails.slots.try_acquire().is_ok());

        let mut cache = ThumbnailCache::default();
        let thumbnail = |bytes: usize| {
            Arc::new(Thumbnail {
                bytes: vec![0; bytes],
                mime_type: "image/png",
                width: 1,
                height: 1,
            })
        };
        let quarter = THUMBNAIL_CACHE_BYTES / 4;
        for key in ["a", "b", "c", "d"] {
            cache.put(key.into(), thumbnail(quarter));
        }
        assert!(cache.get("a").is_some());
        cache.put("e".into(), thumbnail(quarter));
        assert!(cache.get("a").is_none(), "the oldest went");
        assert!(cache.get("e").is_some());
        assert!(cache.bytes <= THUMBNAIL_CACHE_BYTES);
        cache.put("huge".into(), thumbnail(THUMBNAIL_CACHE_BYTES + 1));
        assert!(cache.get("huge").is_none(), "larger than the whole budget");
    }
}

#[cfg(test)]
mod upload_tests {
    use super::*;

    /// An upload that received nothing for longer than [`UPLOAD_TTL`] is swept; one that
    /// received a chunk lately stays, however old its folder.
    #[test]
    fn idle_uploads_are_swept_and_busy_ones_kept() {
        let uploads = tempfile::tempdir().unwrap();
        let long_ago = SystemTime::now() - UPLOAD_TTL - Duration::from_secs(60);
        for (id, chunk_lately) in [("idle", false), ("busy", true)] {
            let folder = uploads.path().join(id);
            std::fs::create_dir(&folder).unwrap();
            std::fs::write(folder.join("plan.json"), "{}").unwrap();
            std::fs::write(folder.join("0"), "chunk").unwrap();
            for name in ["plan.json", "0"] {
                if name == "0" && chunk_lately {
                    continue;
                }
                std::fs::File::options()
                    .write(true)
                    .open(folder.join(name))
                    .unwrap()
                    .set_modified(long_ago)
                    .unwrap();
            }
            std::fs::File::open(&folder)
                .unwrap()
                .set_modified(long_ago)
                .unwrap();
        }
        assert_eq!(sweep_uploads(uploads.path()), 1);
        assert!(!uploads.path().join("idle").exists());
        assert!(uploads.path().join("busy").exists());
    }
}

/// The files of sessions' and agents' workspaces: browsed, changed, downloaded, searched and
/// uploaded.
pub struct WorkspaceFiles<'a> {
    app: &'a App,
}

impl App {
    /// The files of sessions' and agents' workspaces: browsed, changed, downloaded, searched and
    /// uploaded.
    pub fn workspace_files(&self) -> WorkspaceFiles<'_> {
        WorkspaceFiles { app: self }
    }
}

impl WorkspaceFiles<'_> {
    /// The workspace `target` names, for `caller` (made if missing), and whose it is.
    pub(crate) async fn workspace_of(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
    ) -> Result<(Workspace, WorkspaceOwner), AppError> {
        let off = || {
            AppError::new(
                Failure::Unavailable,
                "workspaces_off",
                "sessions have no workspaces on this server",
            )
        };
        let (folder, owner) = match target {
            WorkspaceRef::Session(session) => {
                let session = self.app.sessions().record(session).await?.id;
                self.app.check_session_access(caller, session).await?;
                let folder = self.app.parts.sessions.workspace(session).ok_or_else(off)?;
                (folder, WorkspaceOwner::Session(session))
            }
            WorkspaceRef::Agent(agent) => {
                crate::config::check_name("agent", agent)?;
                // Those who may run as the agent share its workspace.
                caller.check_agent(agent)?;
                let saved = crate::agents::stored_agent(&self.app.parts.store, agent)
                    .await?
                    .ok_or_else(|| AppError::not_found(format!("no agent {agent:?}")))?;
                if saved.workspace != crate::agents::WorkspaceScope::Agent {
                    return Err(AppError::bad_request(format!(
                        "agent {agent:?} has no workspace of its own: each of its sessions has \
                         one (name the session), or set its `workspace` to \"agent\""
                    )));
                }
                let folder = self
                    .app
                    .parts
                    .sessions
                    .shared_workspace(agent)
                    .ok_or_else(off)?;
                (folder, WorkspaceOwner::Agent(saved.id))
            }
        };
        let workspace = blocking(move || Workspace::open(&folder)).await?;
        Ok((workspace, owner))
    }

    /// The folder of uploads in progress, outside every workspace.
    pub(crate) fn uploads_folder(&self) -> Result<PathBuf, AppError> {
        let workspaces = self.app.parts.tools.workspaces.as_ref().ok_or_else(|| {
            AppError::new(
                Failure::Unavailable,
                "workspaces_off",
                "sessions have no workspaces on this server",
            )
        })?;
        Ok(uploads_in(workspaces))
    }

    /// A page of the folder `path` of `session`'s workspace.
    #[allow(clippy::too_many_arguments)]
    pub async fn list(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
        page: usize,
        page_size: usize,
        sort: Sort,
        name_filter: Option<String>,
    ) -> Result<Listing, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let path = path.to_owned();
        blocking(move || workspace.list(&path, page, page_size, sort, name_filter.as_deref())).await
    }

    /// Opens the file `path` of `session`'s workspace for reading.
    pub async fn open(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
    ) -> Result<OpenedFile, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let path = path.to_owned();
        blocking(move || workspace.open_file(&path)).await
    }

    /// A thumbnail of the image at `path` of `session`'s workspace (see [`thumbnail_of`]), with
    /// its ETag (the file's size and time and the size asked). When `cached` (an
    /// `If-None-Match`) holds that ETag the picture is not made again: `None`.
    pub async fn thumbnail(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
        edge: u32,
        cached: Option<String>,
    ) -> Result<(String, Option<Thumbnail>), AppError> {
        use std::os::unix::fs::MetadataExt as _;
        let opened = self.open(caller, target, path).await?;
        let metadata = opened.file.metadata().ok();
        let modified = metadata
            .as_ref()
            .and_then(|metadata| metadata.modified().ok())
            .and_then(|time| time.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map_or(0, |since| since.as_nanos());
        // The file itself (device and inode), whichever workspace or path reaches it.
        let file_id = metadata.map_or((0, 0), |metadata| (metadata.dev(), metadata.ino()));
        let etag = format!("\"t{}-{modified}-{edge}\"", opened.size);
        if cached.is_some_and(|tags| tags.split(',').any(|tag| tag.trim() == etag)) {
            return Ok((etag, None));
        }
        let key = format!("{}:{}:{etag}", file_id.0, file_id.1);
        let kept = self.app.parts.thumbnails.cache().get(&key);
        if let Some(kept) = kept {
            return Ok((etag, Some(Thumbnail::clone(&kept))));
        }
        // One of a few decode slots: memory stays bounded however many requests come.
        let slot = tokio::time::timeout(THUMBNAIL_WAIT, self.app.parts.thumbnails.slots.acquire())
            .await
            .ok()
            .and_then(Result::ok)
            .ok_or_else(|| {
                AppError::new(
                    Failure::TooMany,
                    "thumbnails_busy",
                    "the server is making other thumbnails: try again shortly",
                )
            })?;
        let made = blocking(move || thumbnail_of(opened, edge)).await;
        drop(slot);
        let made = Arc::new(made?);
        self.app
            .parts
            .thumbnails
            .cache()
            .put(key, Arc::clone(&made));
        Ok((etag, Some(Thumbnail::clone(&made))))
    }

    /// The folders directly in `path` of `session`'s workspace.
    pub async fn children(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
    ) -> Result<Vec<FileEntry>, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let path = path.to_owned();
        blocking(move || workspace.children(&path)).await
    }

    /// Creates the folder `name` in `parent`.
    pub async fn mkdir(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        parent: &str,
        name: &str,
    ) -> Result<FileEntry, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let (parent, name) = (parent.to_owned(), name.to_owned());
        blocking(move || workspace.mkdir(&parent, &name)).await
    }

    /// Renames `path` to `new_name` in the same folder.
    pub async fn rename(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
        new_name: &str,
    ) -> Result<FileEntry, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let (path, new_name) = (path.to_owned(), new_name.to_owned());
        blocking(move || workspace.rename(&path, &new_name)).await
    }

    /// Copies `path` beside itself.
    pub async fn duplicate(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
    ) -> Result<FileEntry, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let path = path.to_owned();
        blocking(move || workspace.duplicate(&path)).await
    }

    /// Moves (or copies) `paths` into `dest_dir` (see [`Workspace::transfer`]).
    #[allow(clippy::too_many_arguments)]
    pub async fn transfer(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        paths: Vec<String>,
        dest_dir: &str,
        overwrite: bool,
        copy: bool,
    ) -> Result<Transfer, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let dest_dir = dest_dir.to_owned();
        blocking(move || workspace.transfer(&paths, &dest_dir, overwrite, copy)).await
    }

    /// Deletes `path`.
    pub async fn delete(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
    ) -> Result<String, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let path = path.to_owned();
        blocking(move || workspace.delete(&path)).await
    }

    /// Checks a new upload of `size` bytes to `target` in `workspace` (owned by `owner`), made
    /// by `caller`: the target and the workspace's quota with the bytes its unfinished uploads
    /// announced, at most [`MAX_PENDING_PER_WORKSPACE`] unfinished uploads to the workspace and
    /// [`MAX_PENDING_PER_KEY`] of the key's, and [`MAX_PENDING_BYTES`] announced in all.
    /// Uploads idle past their time are swept first. Answers the target as shown.
    pub(crate) async fn check_new_upload(
        &self,
        caller: &Principal,
        workspace: Workspace,
        owner: WorkspaceOwner,
        target: String,
        size: u64,
        limits: WorkspaceLimits,
    ) -> Result<String, AppError> {
        let uploads = self.uploads_folder()?;
        let key = caller.owner();
        blocking(move || {
            sweep_uploads(&uploads);
            let pending = pending_uploads(&uploads);
            let here = |upload: &&PendingUpload| {
                upload.session_id == owner.session() && upload.agent_id == owner.agent()
            };
            // The target, the file's size and the workspace's quota first: they say the most.
            let pending_here: u64 = pending.iter().filter(here).map(|upload| upload.bytes).sum();
            let shown = workspace.check_upload_beside(&target, size, pending_here, limits)?;
            let to_workspace = pending.iter().filter(here).count();
            if to_workspace >= MAX_PENDING_PER_WORKSPACE {
                return Err(too_many_uploads(format!(
                    "this workspace has {to_workspace} unfinished uploads, its most: finish or \
                     cancel one first"
                )));
            }
            if key.is_some() {
                let of_key = pending.iter().filter(|upload| upload.owner == key).count();
                if of_key >= MAX_PENDING_PER_KEY {
                    return Err(too_many_uploads(format!(
                        "this API key has {of_key} unfinished uploads, its most: finish or \
                         cancel one first"
                    )));
                }
            }
            let announced: u64 = pending.iter().map(|upload| upload.bytes).sum();
            if announced.saturating_add(size) > MAX_PENDING_BYTES {
                return Err(too_many_uploads(format!(
                    "unfinished uploads on this server announce {announced} bytes; {size} more \
                     would pass {MAX_PENDING_BYTES}"
                )));
            }
            Ok(shown)
        })
        .await
    }

    /// Removes the uploads idle past their time; answers how many (the worker calls it
    /// every few minutes).
    pub async fn sweep_idle_uploads(&self) -> usize {
        let Ok(uploads) = self.uploads_folder() else {
            return 0;
        };
        blocking(move || Ok(sweep_uploads(&uploads)))
            .await
            .unwrap_or(0)
    }

    /// Plans an upload of `file_size` bytes to `target_path` in `session`'s workspace.
    pub async fn upload_init(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        target_path: &str,
        file_name: &str,
        file_size: u64,
        limits: WorkspaceLimits,
    ) -> Result<UploadPlan, AppError> {
        let (workspace, owner) = self.workspace_of(caller, target).await?;
        let uploads = self.uploads_folder()?;
        let target = target_path.to_owned();
        let target_path = self
            .check_new_upload(caller, workspace, owner.clone(), target, file_size, limits)
            .await?;
        let chunk_size = limits.chunk_bytes.max(1);
        let plan = UploadPlan {
            upload_id: uuid::Uuid::new_v4().simple().to_string(),
            session_id: owner.session(),
            agent_id: owner.agent(),
            target_path,
            file_name: file_name.to_owned(),
            file_size,
            chunk_size,
            chunk_count: file_size.div_ceil(chunk_size),
            owner: caller.owner(),
        };
        let folder = uploads.join(&plan.upload_id);
        let text =
            serde_json::to_vec(&plan).map_err(|error| AppError::internal(error.to_string()))?;
        blocking(move || {
            std::fs::create_dir_all(&folder).map_err(io_error)?;
            std::fs::write(folder.join("plan.json"), text).map_err(io_error)
        })
        .await?;
        Ok(plan)
    }

    /// The folder of the upload `id` (chunked or tus), after checking the id's form.
    pub(crate) fn upload_folder(&self, id: &str) -> Result<PathBuf, AppError> {
        check_upload_id(id)?;
        Ok(self.uploads_folder()?.join(id))
    }

    /// An upload's folder and plan, when `caller` started it.
    fn upload_of(&self, caller: &Principal, id: &str) -> Result<(PathBuf, UploadPlan), AppError> {
        let folder = self.upload_folder(id)?;
        let missing = || AppError::not_found(format!("no upload {id:?}"));
        let text = std::fs::read(folder.join("plan.json")).map_err(|_| missing())?;
        let plan: UploadPlan = serde_json::from_slice(&text)
            .map_err(|error| AppError::internal(format!("upload {id}: {error}")))?;
        if !caller.may_see(plan.owner.as_deref()) {
            return Err(missing());
        }
        Ok((folder, plan))
    }

    /// Which chunks of an upload arrived.
    pub async fn upload_status(
        &self,
        caller: &Principal,
        id: &str,
    ) -> Result<UploadStatus, AppError> {
        let (folder, plan) = self.upload_of(caller, id)?;
        blocking(move || {
            let received = received_chunks(&folder, &plan);
            let missing = (0..plan.chunk_count)
                .filter(|n| !received.contains(n))
                .collect();
            Ok(UploadStatus {
                plan,
                received,
                missing,
            })
        })
        .await
    }

    /// Receives chunk `n` of an upload from `body`; it must bring exactly the chunk's size. A
    /// chunk sent again replaces the earlier one. Answers the bytes received.
    pub async fn upload_chunk<E: std::fmt::Display>(
        &self,
        caller: &Principal,
        id: &str,
        n: u64,
        body: impl futures::Stream<Item = Result<bytes::Bytes, E>>,
    ) -> Result<u64, AppError> {
        use futures::StreamExt as _;
        let (folder, plan) = self.upload_of(caller, id)?;
        let expected = plan
            .chunk_len(n)
            .ok_or_else(|| AppError::not_found(format!("upload {id} has no chunk {n}")))?;
        let offset = n * plan.chunk_size;
        let done = folder.join(format!("{n}.done"));
        // Sent again: it is not received until it has arrived whole again.
        let _ = tokio::fs::remove_file(&done).await;
        let data = upload_data(&folder);
        let file = blocking(move || {
            std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .open(&data)
                .map(std::sync::Arc::new)
                .map_err(io_error)
        })
        .await?;
        // The body comes in pieces of a few KiB; they are written at the chunk's place in the
        // upload's one data file a mebibyte at a time, each write on a blocking thread.
        let write = |bytes: Vec<u8>, at: u64| {
            let file = std::sync::Arc::clone(&file);
            blocking(move || {
                std::os::unix::fs::FileExt::write_all_at(&*file, &bytes, at).map_err(io_error)
            })
        };
        let mut received = 0_u64;
        let mut pending: Vec<u8> = Vec::with_capacity(UPLOAD_BLOCK);
        let mut body = std::pin::pin!(body);
        while let Some(piece) = body.next().await {
            let piece = piece.map_err(|error| {
                AppError::bad_request(format!("the chunk was interrupted: {error}"))
            })?;
            if received + piece.len() as u64 > expected {
                return Err(AppError::bad_request(format!(
                    "chunk {n} is {expected} bytes; more arrived"
                )));
            }
            pending.extend_from_slice(&piece);
            received += piece.len() as u64;
            if pending.len() >= UPLOAD_BLOCK {
                let at = offset + received - pending.len() as u64;
                write(
                    std::mem::replace(&mut pending, Vec::with_capacity(UPLOAD_BLOCK)),
                    at,
                )
                .await?;
            }
        }
        if received != expected {
            return Err(AppError::bad_request(format!(
                "chunk {n} is {expected} bytes; {received} arrived"
            )));
        }
        if !pending.is_empty() {
            let at = offset + received - pending.len() as u64;
            write(pending, at).await?;
        }
        let synced = std::sync::Arc::clone(&file);
        blocking(move || synced.sync_data().map_err(io_error)).await?;
        tokio::fs::write(&done, b"").await.map_err(io_error)?;
        Ok(received)
    }

    /// Joins an upload's chunks into its target, which appears whole (replacing a file of that
    /// name) or not at all, and forgets the upload.
    pub async fn upload_complete(
        &self,
        caller: &Principal,
        id: &str,
    ) -> Result<UploadPlan, AppError> {
        let (folder, plan) = self.upload_of(caller, id)?;
        let (workspace, _) = self.workspace_of(caller, &plan.workspace()).await?;
        blocking(move || {
            let received = received_chunks(&folder, &plan);
            if received.len() as u64 != plan.chunk_count {
                return Err(AppError::conflict(format!(
                    "upload {} is missing chunks: {} of {} arrived",
                    plan.upload_id,
                    received.len(),
                    plan.chunk_count
                )));
            }
            let data = upload_data(&folder);
            let length = std::fs::metadata(&data).map(|meta| meta.len()).unwrap_or(0);
            if length != plan.file_size {
                return Err(AppError::conflict(format!(
                    "upload {} holds {length} bytes, not the {} announced",
                    plan.upload_id, plan.file_size
                )));
            }
            workspace.install(&plan.target_path, &data, WorkspaceLimits::default())?;
            let _ = std::fs::remove_dir_all(&folder);
            Ok(plan)
        })
        .await
    }

    /// Cancels an upload: its chunks are removed.
    pub async fn upload_cancel(&self, caller: &Principal, id: &str) -> Result<(), AppError> {
        let (folder, _) = self.upload_of(caller, id)?;
        blocking(move || std::fs::remove_dir_all(&folder).map_err(io_error)).await
    }

    /// A file, or a folder as a zip archive written as it is sent.
    pub async fn download(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
    ) -> Result<Download, AppError> {
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let relative = workspace.relative(path)?;
        let display = display_path(&relative);
        let is_dir = relative.as_os_str().is_empty()
            || workspace
                .root
                .entry(&relative, &display)
                .map_err(tool_error)?
                .kind
                == EntryKind::Dir;
        if !is_dir {
            let path = path.to_owned();
            return Ok(Download::File(
                blocking(move || workspace.open_file(&path)).await?,
            ));
        }
        workspace
            .root
            .check_dir(&relative, &display)
            .map_err(tool_error)?;
        let name = relative.file_name().map_or_else(
            || "workspace".to_owned(),
            |name| name.to_string_lossy().into_owned(),
        );
        let (sender, archive) = tokio::sync::mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let writer = ChannelWriter {
                sender: sender.clone(),
                buffer: Vec::new(),
            };
            let mut zip = zip::ZipWriter::new_stream(writer);
            let written = zip_folder(&workspace.root, &relative, "", &mut zip).and_then(|()| {
                let mut writer = zip
                    .finish()
                    .map_err(|error| AppError::internal(format!("zip: {error}")))?
                    .into_inner();
                std::io::Write::flush(&mut writer).map_err(io_error)
            });
            if let Err(error) = written {
                // The client sees the archive end with an error (its download fails).
                let _ = sender.blocking_send(Err(std::io::Error::other(error.message)));
            }
        });
        Ok(Download::Folder { name, archive })
    }

    /// Searches `session`'s workspace below `path` (see [`search`]).
    pub async fn search(
        &self,
        caller: &Principal,
        target: &WorkspaceRef,
        path: &str,
        query: Option<String>,
        name_filter: Option<String>,
    ) -> Result<Vec<FileEntry>, AppError> {
        let query = query.filter(|q| !q.trim().is_empty());
        let name_filter = name_filter.filter(|f| !f.is_empty());
        let (workspace, _) = self.workspace_of(caller, target).await?;
        let path = path.to_owned();
        blocking(move || workspace.search(&path, query.as_deref(), name_filter.as_deref())).await
    }
}
