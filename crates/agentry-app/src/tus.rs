//! Resumable uploads into a session's workspace by the tus 1.0 protocol (core, creation,
//! termination and checksum), so standard upload clients (tus-js-client, tuspy, Uppy) work:
//! the HTTP layer maps its requests to [`App::tus_create`], [`App::tus_offset`],
//! [`App::tus_patch`] and [`App::tus_terminate`].
//!
//! The protocol's wire (its version and extension headers, `Upload-Metadata`'s encoding) is the
//! HTTP layer's; the app takes the metadata decoded. An upload names its workspace and where
//! the file goes in its metadata (`session_id`
//! or `workspace_id`, or `agent_id` for an agent's shared workspace, and `target_path`, else
//! `filename`), and is checked like a chunked upload
//! (size limit, quota, a path inside the workspace). Its bytes collect outside every workspace
//! (`<workspaces>/.uploads/<id>/data`, beside `tus.json`), so the file appears in the workspace
//! only when the last byte arrives, whole (streamed into a temporary file beside the target and
//! renamed over it). A PATCH is taken whole or not at all: its body is written to a part file,
//! checked against `Upload-Checksum` (`sha1` or `sha256`) when given, then appended; a client
//! whose connection broke asks the offset (`HEAD`) and sends the rest again. One PATCH at a time
//! per upload (a lock file; a second is a 409).

use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt as _;

use agentry_types::SessionId;

use crate::App;
use crate::auth::Principal;
use crate::error::{AppError, Failure};
use crate::workspace_files::{WorkspaceLimits, WorkspaceRef};

/// The checksum algorithms `Upload-Checksum` may name.
pub const TUS_CHECKSUMS: &str = "sha1,sha256";

impl TusUpload {
    /// The workspace it goes to.
    pub fn workspace(&self) -> WorkspaceRef {
        WorkspaceRef::stored(self.session_id, self.agent_id.as_deref())
    }
}

/// A tus upload as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TusUpload {
    /// Its id.
    pub upload_id: String,
    /// The session whose workspace it goes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// The agent whose shared workspace it goes to (instead of a session's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// Where, relative to the workspace root.
    pub target_path: String,
    /// Its length.
    pub length: u64,
    /// Whether the last byte arrived and the file is in place.
    #[serde(default)]
    pub completed: bool,
    /// Who made it (an API key's id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
}

/// Checks `Upload-Checksum` (`<algorithm> <base64 digest>`) against the digest of the file `data`: `Ok(false)`
/// on a mismatch.
fn checksum_matches(header: &str, data: &Path) -> Result<bool, AppError> {
    let (algorithm, encoded) = header
        .trim()
        .split_once(' ')
        .ok_or_else(|| AppError::bad_request("Upload-Checksum is `<algorithm> <base64>`"))?;
    let expected = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .map_err(|_| AppError::bad_request("Upload-Checksum's digest is not base64"))?;
    let actual = match algorithm {
        "sha1" => {
            let mut hasher = <sha1::Sha1 as sha1::Digest>::new();
            each_piece(data, |piece| sha1::Digest::update(&mut hasher, piece))?;
            sha1::Digest::finalize(hasher).to_vec()
        }
        "sha256" => {
            let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
            each_piece(data, |piece| sha2::Digest::update(&mut hasher, piece))?;
            sha2::Digest::finalize(hasher).to_vec()
        }
        other => {
            return Err(AppError::bad_request(format!(
                "Upload-Checksum: {other} is not supported ({TUS_CHECKSUMS})"
            )));
        }
    };
    Ok(actual == expected)
}

/// The bytes of `upload` received so far (all of them once it is complete).
async fn received(folder: &Path, upload: &TusUpload) -> Result<u64, AppError> {
    if upload.completed {
        return Ok(upload.length);
    }
    let data = tokio::fs::metadata(folder.join("data"))
        .await
        .map_err(io_error)?;
    Ok(data.len())
}

/// How long a PATCH's lock may stand before it counts as left by a crash.
const STALE_LOCK: std::time::Duration = std::time::Duration::from_secs(600);

/// One PATCH at a time per upload: a lock file made with `O_EXCL`, removed when dropped.
struct PatchLock(PathBuf);

impl PatchLock {
    fn take(folder: &Path) -> Result<Self, AppError> {
        let path = folder.join("patch.lock");
        for _ in 0..2 {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(_) => return Ok(Self(path)),
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => {
                    let stale = std::fs::metadata(&path)
                        .and_then(|meta| meta.modified())
                        .ok()
                        .and_then(|at| at.elapsed().ok())
                        .is_some_and(|age| age > STALE_LOCK);
                    if !stale {
                        return Err(AppError::conflict(
                            "another PATCH of this upload is in progress",
                        ));
                    }
                    let _ = std::fs::remove_file(&path);
                }
                Err(error) => return Err(io_error(error)),
            }
        }
        Err(AppError::conflict(
            "another PATCH of this upload is in progress",
        ))
    }
}

impl Drop for PatchLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Reads the file at `path` in pieces, handing each to `take`.
fn each_piece(path: &Path, mut take: impl FnMut(&[u8])) -> Result<(), AppError> {
    use std::io::Read as _;
    let mut file = std::fs::File::open(path).map_err(io_error)?;
    let mut buffer = vec![0; 64 * 1024];
    loop {
        let read = file.read(&mut buffer).map_err(io_error)?;
        if read == 0 {
            return Ok(());
        }
        take(&buffer[..read]);
    }
}

fn io_error(error: std::io::Error) -> AppError {
    AppError::internal(format!("upload storage: {error}"))
}

impl App {
    /// The folder of the tus upload `id` and its record, when `caller` made it.
    fn tus_of(&self, caller: &Principal, id: &str) -> Result<(PathBuf, TusUpload), AppError> {
        let folder = self.workspace_files().upload_folder(id)?;
        let missing = || AppError::not_found(format!("no upload {id:?}"));
        let text = std::fs::read(folder.join("tus.json")).map_err(|_| missing())?;
        let upload: TusUpload = serde_json::from_slice(&text)
            .map_err(|error| AppError::internal(format!("upload {id}: {error}")))?;
        if !caller.may_see(upload.owner.as_deref()) {
            return Err(missing());
        }
        Ok((folder, upload))
    }

    /// Creation: an upload of `length` bytes described by `Upload-Metadata`. Answers its id.
    pub async fn tus_create(
        &self,
        caller: &Principal,
        length: u64,
        metadata: &[(String, String)],
        limits: WorkspaceLimits,
    ) -> Result<TusUpload, AppError> {
        let value = |key: &str| {
            metadata
                .iter()
                .find(|(name, _)| name == key)
                .map(|(_, value)| value.as_str())
        };
        let target_workspace = WorkspaceRef::from_ids(
            value("session_id")
                .or_else(|| value("workspace_id"))
                .map(str::to_owned),
            value("agent_id").map(str::to_owned),
        )?;
        let target = value("target_path")
            .or_else(|| value("filename"))
            .ok_or_else(|| {
                AppError::bad_request("Upload-Metadata needs `target_path` (or `filename`)")
            })?;
        let (workspace, workspace_owner) = self
            .workspace_files()
            .workspace_of(caller, &target_workspace)
            .await?;
        let uploads = self.workspace_files().uploads_folder()?;
        let owner = caller.owner();
        let target_path = self
            .workspace_files()
            .check_new_upload(
                caller,
                workspace,
                workspace_owner.clone(),
                target.to_owned(),
                length,
                limits,
            )
            .await?;
        let upload = TusUpload {
            upload_id: uuid::Uuid::new_v4().simple().to_string(),
            session_id: workspace_owner.session(),
            agent_id: workspace_owner.agent(),
            target_path,
            length,
            completed: false,
            owner,
        };
        let folder = uploads.join(&upload.upload_id);
        tokio::fs::create_dir_all(&folder).await.map_err(io_error)?;
        tokio::fs::File::create(folder.join("data"))
            .await
            .map_err(io_error)?;
        self.save_tus(&folder, &upload).await?;
        Ok(upload)
    }

    async fn save_tus(&self, folder: &Path, upload: &TusUpload) -> Result<(), AppError> {
        let text =
            serde_json::to_vec(upload).map_err(|error| AppError::internal(error.to_string()))?;
        let temp = folder.join("tus.json.tmp");
        tokio::fs::write(&temp, text).await.map_err(io_error)?;
        tokio::fs::rename(&temp, folder.join("tus.json"))
            .await
            .map_err(io_error)
    }

    /// `HEAD`: the bytes received so far, and the length.
    pub async fn tus_offset(&self, caller: &Principal, id: &str) -> Result<(u64, u64), AppError> {
        let (folder, upload) = self.tus_of(caller, id)?;
        Ok((received(&folder, &upload).await?, upload.length))
    }

    /// `PATCH` at `offset` (which must be the bytes received so far) with `body`; with a
    /// checksum the body must match it. The last byte puts the file in place. Answers the new
    /// offset.
    pub async fn tus_patch<E: std::fmt::Display>(
        &self,
        caller: &Principal,
        id: &str,
        offset: u64,
        checksum: Option<String>,
        body: impl futures::Stream<Item = Result<bytes::Bytes, E>>,
    ) -> Result<u64, AppError> {
        use futures::StreamExt as _;
        let (folder, mut upload) = self.tus_of(caller, id)?;
        let data = folder.join("data");
        let _lock = PatchLock::take(&folder)?;
        let current = received(&folder, &upload).await?;
        if upload.completed || offset != current {
            return Err(AppError::conflict(format!(
                "Upload-Offset is {offset}, the upload is at {current}"
            )));
        }
        let room = upload.length - current;
        let part = folder.join(format!("patch.{}", uuid::Uuid::new_v4().simple()));
        let outcome = async {
            // Gathered a mebibyte at a time: each write to a tokio file is a trip to a blocking
            // thread, and the body comes in pieces of a few KiB.
            let mut file = tokio::io::BufWriter::with_capacity(
                1024 * 1024,
                tokio::fs::File::create(&part).await.map_err(io_error)?,
            );
            let mut received = 0_u64;
            let mut body = std::pin::pin!(body);
            while let Some(chunk) = body.next().await {
                let chunk = chunk.map_err(|error| {
                    AppError::bad_request(format!("the upload was interrupted: {error}"))
                })?;
                received += chunk.len() as u64;
                if received > room {
                    return Err(AppError::bad_request(format!(
                        "the upload is {} bytes; more arrived",
                        upload.length
                    )));
                }
                file.write_all(&chunk).await.map_err(io_error)?;
            }
            file.flush().await.map_err(io_error)?;
            file.get_ref().sync_all().await.map_err(io_error)?;
            drop(file);
            if let Some(header) = &checksum {
                let part = part.clone();
                let header = header.clone();
                let matches = tokio::task::spawn_blocking(move || checksum_matches(&header, &part))
                    .await
                    .map_err(|error| AppError::internal(error.to_string()))??;
                if !matches {
                    return Err(AppError::new(
                        Failure::Invalid,
                        "checksum_mismatch",
                        "the body does not match Upload-Checksum",
                    ));
                }
            }
            let mut source = tokio::io::BufReader::with_capacity(
                1024 * 1024,
                tokio::fs::File::open(&part).await.map_err(io_error)?,
            );
            let mut target = tokio::fs::OpenOptions::new()
                .append(true)
                .open(&data)
                .await
                .map_err(io_error)?;
            tokio::io::copy_buf(&mut source, &mut target)
                .await
                .map_err(io_error)?;
            target.sync_all().await.map_err(io_error)?;
            Ok(current + received)
        }
        .await;
        let _ = tokio::fs::remove_file(&part).await;
        let offset = outcome?;
        if offset == upload.length {
            let (workspace, _) = self
                .workspace_files()
                .workspace_of(caller, &upload.workspace())
                .await?;
            let (target, length) = (upload.target_path.clone(), upload.length);
            let source = data.clone();
            tokio::task::spawn_blocking(move || {
                let mut file = std::fs::File::open(&source).map_err(io_error)?;
                workspace.put(&target, &mut file, length, WorkspaceLimits::default())
            })
            .await
            .map_err(|error| AppError::internal(error.to_string()))??;
            upload.completed = true;
            self.save_tus(&folder, &upload).await?;
            let _ = tokio::fs::remove_file(&data).await;
        }
        Ok(offset)
    }

    /// Termination: the upload and what it received are removed.
    pub async fn tus_terminate(&self, caller: &Principal, id: &str) -> Result<(), AppError> {
        let (folder, _) = self.tus_of(caller, id)?;
        tokio::fs::remove_dir_all(&folder).await.map_err(io_error)
    }
}
