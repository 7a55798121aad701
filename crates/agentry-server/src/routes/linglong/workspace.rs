//! The seed's workspace file manager under `/linglong/v1/workspace`, over a session's
//! workspace (`session_id`, or `workspace_id` in an upload's start) or an agent's shared one
//! (`agent_id`): list, content and download
//! (single HTTP ranges; a folder downloads as a zip archive), search, children and tree (the
//! folder picker, inside the workspace), thumbnail (the image scaled to `size`, PNG or JPEG),
//! paste-dir (where pasted files go: `pasted`, inside the workspace),
//! mkdir, rename, duplicate, move and copy, delete, and chunked uploads (`upload/init`, `PUT upload/{id}/chunk/{n}`, `GET
//! upload/{id}` to resume, `upload/{id}/complete`, `DELETE upload/{id}`). Paths are relative to
//! the workspace root; what answers them is [`agentry_app::workspace_files`].

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};

use agentry_app::error::AppError;
use agentry_app::workspace_files::{Download, OpenedFile, Sort, WorkspaceLimits, WorkspaceRef};

use super::{Answer, SeedError, json_body, ok};
use crate::authorization::Caller;
use crate::state::AppState;

/// How much of a file one read takes when it is sent.
const FILE_CHUNK: usize = 256 * 1024;
/// The workspace routes, under `/linglong/v1`.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/workspace/list", get(list))
        .route("/workspace/content", get(content))
        .route("/workspace/download", get(download))
        .route("/workspace/search", get(search))
        .route("/workspace/children", get(children))
        .route("/workspace/tree", get(tree))
        .route("/workspace/thumbnail", get(thumbnail))
        .route("/workspace/paste-dir", get(paste_dir))
        .route("/workspace/mkdir", post(mkdir))
        .route("/workspace/rename", post(rename))
        .route("/workspace/duplicate", post(duplicate))
        .route("/workspace/move", post(move_entries))
        .route("/workspace/copy", post(copy_entries))
        .route("/workspace/delete", delete(remove))
        .route("/workspace/upload/init", post(upload_init))
        .route(
            "/workspace/upload/{id}",
            get(upload_status).delete(upload_cancel),
        )
        .route("/workspace/upload/{id}/chunk/{n}", put(upload_chunk))
        .route("/workspace/upload/{id}/complete", post(upload_complete))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    #[serde(default)]
    session_id: Option<String>,
    /// An agent's shared workspace instead of a session's.
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    path: String,
    #[serde(default = "first_page")]
    page: usize,
    #[serde(default = "default_page_size")]
    page_size: usize,
    #[serde(default)]
    sort: Sort,
    #[serde(default)]
    name_filter: Option<String>,
    /// The seed's switch to leave the workspace; only `1` (stay inside) is accepted.
    #[serde(default)]
    restrict: Option<String>,
}

fn first_page() -> usize {
    1
}

fn default_page_size() -> usize {
    50
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileQuery {
    #[serde(default)]
    session_id: Option<String>,
    /// An agent's shared workspace instead of a session's.
    #[serde(default)]
    agent_id: Option<String>,
    path: String,
    #[serde(default)]
    restrict: Option<String>,
}

/// The workspace a query names: `session_id`, or `agent_id` for an agent's shared one.
fn workspace_target(
    session: &Option<String>,
    agent: &Option<String>,
) -> Result<WorkspaceRef, SeedError> {
    Ok(WorkspaceRef::from_ids(session.clone(), agent.clone())?)
}

fn query<T: serde::de::DeserializeOwned>(
    query: Result<Query<T>, axum::extract::rejection::QueryRejection>,
) -> Result<T, SeedError> {
    query
        .map(|Query(query)| query)
        .map_err(|error| AppError::bad_request(error.body_text()).into())
}

/// The seed's `restrict=0` would read outside the workspace: refused.
fn stay_inside(restrict: Option<&str>) -> Result<(), SeedError> {
    match restrict {
        None | Some("1" | "true") => Ok(()),
        Some(_) => Err(AppError::bad_request(
            "`restrict` must be 1: files outside the workspace are not served",
        )
        .into()),
    }
}

async fn list(
    State(state): State<AppState>,
    Caller(caller): Caller,
    raw: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(raw)?;
    stay_inside(q.restrict.as_deref())?;
    let listing = state
        .app
        .workspace_files()
        .list(
            &caller,
            &workspace_target(&q.session_id, &q.agent_id)?,
            &q.path,
            q.page,
            q.page_size,
            q.sort,
            q.name_filter,
        )
        .await?;
    Ok(Json(listing).into_response())
}

/// A single `bytes=` range of a file of `size` bytes: `None` for the whole file, `Err` when
/// it cannot be satisfied.
fn byte_range(headers: &HeaderMap, size: u64) -> Result<Option<(u64, u64)>, ()> {
    let Some(value) = headers.get(header::RANGE).and_then(|v| v.to_str().ok()) else {
        return Ok(None);
    };
    let parsed = http_range_header::parse_range_header(value).map_err(|_| ())?;
    let ranges = parsed.validate(size).map_err(|_| ())?;
    match ranges.as_slice() {
        [range] => Ok(Some((*range.start(), *range.end()))),
        // Several ranges: the whole file (multipart answers are not made).
        _ => Ok(None),
    }
}

/// What every workspace file's answer carries, so that no file an agent or a user wrote runs as
/// a page on the API's origin: no sniffing, and a sandboxing policy on whatever is opened.
pub(crate) fn never_active(headers: &mut HeaderMap) {
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static("sandbox; default-src 'none'"),
    );
}

/// How a workspace file of `mime_type` is shown inline: as its own type when that is inert
/// (raster images, audio, video, plain text), as plain text for every other text type (HTML,
/// XML, scripts: read, never run); `None` for the rest (SVG, PDF, anything else), which only
/// ever come as attachments (an `<img>` still shows an SVG, a navigation downloads it).
fn inline_type(mime_type: &str) -> Option<&str> {
    let essence = mime_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let inert_image = matches!(
        essence.as_str(),
        "image/png" | "image/jpeg" | "image/gif" | "image/webp" | "image/bmp" | "image/avif"
    );
    if inert_image
        || essence == "text/plain"
        || essence.starts_with("audio/")
        || essence.starts_with("video/")
    {
        Some(mime_type)
    } else if essence == "image/svg+xml" {
        None
    } else if essence.starts_with("text/")
        || essence.ends_with("+xml")
        || matches!(
            essence.as_str(),
            "application/xml" | "application/javascript" | "application/json"
        )
    {
        Some("text/plain; charset=utf-8")
    } else {
        None
    }
}

/// A file's bytes, whole or one range of them: inline only as an inert type, else as an
/// attachment, and never active (see [`never_active`]).
fn file_response(headers: &HeaderMap, opened: OpenedFile, as_attachment: bool) -> Response {
    use std::io::{Seek as _, SeekFrom};
    let OpenedFile {
        mut file,
        size,
        name,
        mime_type,
    } = opened;
    let range = match byte_range(headers, size) {
        Ok(range) => range,
        Err(()) => {
            return (
                StatusCode::RANGE_NOT_SATISFIABLE,
                [(header::CONTENT_RANGE, format!("bytes */{size}"))],
            )
                .into_response();
        }
    };
    let (status, start, length) = match range {
        Some((start, end)) => (StatusCode::PARTIAL_CONTENT, start, end - start + 1),
        None => (StatusCode::OK, 0, size),
    };
    if start > 0 && file.seek(SeekFrom::Start(start)).is_err() {
        return SeedError::from(AppError::internal("the file cannot be read")).into_response();
    }
    let reader = tokio::io::AsyncReadExt::take(tokio::fs::File::from_std(file), length);
    // Large reads: tokio reads a file on a blocking thread per call, so 4 KiB at a time (the
    // default) spends its time hopping threads.
    let stream = tokio_util::io::ReaderStream::with_capacity(reader, FILE_CHUNK);
    let mut response = Body::from_stream(stream).into_response();
    *response.status_mut() = status;
    let headers = response.headers_mut();
    let inline = inline_type(&mime_type).filter(|_| !as_attachment);
    if let Ok(value) = HeaderValue::from_str(inline.unwrap_or(&mime_type)) {
        headers.insert(header::CONTENT_TYPE, value);
    }
    never_active(headers);
    headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
    headers.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if status == StatusCode::PARTIAL_CONTENT
        && let Ok(value) =
            HeaderValue::from_str(&format!("bytes {start}-{}/{size}", start + length - 1))
    {
        headers.insert(header::CONTENT_RANGE, value);
    }
    if inline.is_none()
        && let Ok(value) = HeaderValue::from_str(&attachment(&name))
    {
        headers.insert(header::CONTENT_DISPOSITION, value);
    }
    response
}

/// `Content-Disposition` for a download named `name`: an ASCII fallback and the UTF-8 name.
fn attachment(name: &str) -> String {
    let ascii: String = name
        .chars()
        .filter(char::is_ascii)
        .map(|c| {
            if matches!(c, '"' | '\\' | '\r' | '\n') {
                '_'
            } else {
                c
            }
        })
        .collect();
    let ascii = if ascii.is_empty() {
        "download".to_owned()
    } else {
        ascii
    };
    format!(
        "attachment; filename=\"{ascii}\"; filename*=UTF-8''{}",
        percent_encoded(name)
    )
}

async fn content(
    State(state): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    raw: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(raw)?;
    stay_inside(q.restrict.as_deref())?;
    let opened = state
        .app
        .workspace_files()
        .open(
            &caller,
            &workspace_target(&q.session_id, &q.agent_id)?,
            &q.path,
        )
        .await?;
    Ok(file_response(&headers, opened, false))
}

/// The seed's `paste-dir`: `{"path"}`, where pasted files are uploaded before a message names
/// them (relative to the session's workspace, where `<file>` looks; the seed answered `/tmp`).
async fn paste_dir() -> Answer {
    ok(json!({"path": agentry_app::workspace_files::PASTE_FOLDER}))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ThumbnailQuery {
    #[serde(default)]
    session_id: Option<String>,
    /// An agent's shared workspace instead of a session's.
    #[serde(default)]
    agent_id: Option<String>,
    path: String,
    /// The longest side, in pixels (default 256).
    #[serde(default = "default_edge")]
    size: u32,
    #[serde(default)]
    restrict: Option<String>,
}

fn default_edge() -> u32 {
    256
}

/// An image scaled down to `size` pixels on its longer side (PNG or JPEG), cached by the
/// client until the file changes (its ETag is the file's size and time and the size asked).
async fn thumbnail(
    State(state): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    raw: Result<Query<ThumbnailQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(raw)?;
    stay_inside(q.restrict.as_deref())?;
    let cached = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let (etag, made) = state
        .app
        .workspace_files()
        .thumbnail(
            &caller,
            &workspace_target(&q.session_id, &q.agent_id)?,
            &q.path,
            q.size,
            cached,
        )
        .await?;
    let mut response = match made {
        None => StatusCode::NOT_MODIFIED.into_response(),
        Some(made) => {
            let mut response = Body::from(made.bytes).into_response();
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(made.mime_type),
            );
            response
        }
    };
    let headers = response.headers_mut();
    never_active(headers);
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, no-cache"),
    );
    Ok(response)
}

async fn download(
    State(state): State<AppState>,
    Caller(caller): Caller,
    headers: HeaderMap,
    raw: Result<Query<FileQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(raw)?;
    stay_inside(q.restrict.as_deref())?;
    match state
        .app
        .workspace_files()
        .download(
            &caller,
            &workspace_target(&q.session_id, &q.agent_id)?,
            &q.path,
        )
        .await?
    {
        Download::File(opened) => Ok(file_response(&headers, opened, true)),
        Download::Folder { name, archive } => {
            let stream = futures::stream::unfold(archive, |mut archive| async move {
                archive.recv().await.map(|piece| (piece, archive))
            });
            let mut response = Body::from_stream(stream).into_response();
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/zip"),
            );
            never_active(headers);
            if let Ok(value) = HeaderValue::from_str(&attachment(&format!("{name}.zip"))) {
                headers.insert(header::CONTENT_DISPOSITION, value);
            }
            Ok(response)
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchQuery {
    #[serde(default)]
    session_id: Option<String>,
    /// An agent's shared workspace instead of a session's.
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    path: String,
    #[serde(default)]
    query: Option<String>,
    #[serde(default)]
    name_filter: Option<String>,
}

/// The seed's answer: a bare array of entries.
async fn search(
    State(state): State<AppState>,
    Caller(caller): Caller,
    raw: Result<Query<SearchQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(raw)?;
    let found = state
        .app
        .workspace_files()
        .search(
            &caller,
            &workspace_target(&q.session_id, &q.agent_id)?,
            &q.path,
            q.query,
            q.name_filter,
        )
        .await?;
    Ok(Json(found).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FolderQuery {
    #[serde(default)]
    session_id: Option<String>,
    /// An agent's shared workspace instead of a session's.
    #[serde(default)]
    agent_id: Option<String>,
    #[serde(default)]
    path: String,
}

/// The seed's folder picker: `[{"name", "path"}]` for the folders in `path` (here inside the
/// workspace only; the seed's browsed the whole host).
async fn children(
    State(state): State<AppState>,
    Caller(caller): Caller,
    raw: Result<Query<FolderQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(raw)?;
    let folders = state
        .app
        .workspace_files()
        .children(
            &caller,
            &workspace_target(&q.session_id, &q.agent_id)?,
            &q.path,
        )
        .await?;
    let shown: Vec<Value> = folders
        .iter()
        .map(|folder| json!({"name": folder.name, "path": folder.path}))
        .collect();
    ok(Value::Array(shown))
}

/// The seed's tree: the folder `path` with the folders directly in it,
/// `[{"name", "path", "is_root": true, "children": [{"name", "path", "is_root": false}]}]`.
async fn tree(
    State(state): State<AppState>,
    Caller(caller): Caller,
    raw: Result<Query<FolderQuery>, axum::extract::rejection::QueryRejection>,
) -> Answer {
    let q = query(raw)?;
    let folders = state
        .app
        .workspace_files()
        .children(
            &caller,
            &workspace_target(&q.session_id, &q.agent_id)?,
            &q.path,
        )
        .await?;
    let path = q.path.trim_matches('/');
    let name = path
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or(".");
    let children: Vec<Value> = folders
        .iter()
        .map(|folder| json!({"name": folder.name, "path": folder.path, "is_root": false}))
        .collect();
    ok(
        json!([{"name": name, "path": if path.is_empty() { "." } else { path }, "is_root": true, "children": children}]),
    )
}

/// The workspace a JSON body names: `session_id`, or `agent_id` for an agent's shared one.
fn body_target(body: &Value) -> Result<WorkspaceRef, SeedError> {
    let text = |name: &str| body.get(name).and_then(Value::as_str).map(str::to_owned);
    if text("session_id").is_none() && text("agent_id").is_none() {
        return Err(AppError::bad_request("Missing 'session_id' field").into());
    }
    Ok(WorkspaceRef::from_ids(
        text("session_id"),
        text("agent_id"),
    )?)
}

/// A required string field of a JSON body.
fn field<'a>(body: &'a Value, name: &str) -> Result<&'a str, SeedError> {
    body.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| AppError::bad_request(format!("Missing '{name}' field")).into())
}

async fn mkdir(State(state): State<AppState>, Caller(caller): Caller, body: Bytes) -> Answer {
    let body = json_body(&body)?;
    let entry = state
        .app
        .workspace_files()
        .mkdir(
            &caller,
            &body_target(&body)?,
            field(&body, "parent_path")?,
            field(&body, "name")?,
        )
        .await?;
    Ok(Json(entry).into_response())
}

async fn rename(State(state): State<AppState>, Caller(caller): Caller, body: Bytes) -> Answer {
    let body = json_body(&body)?;
    let entry = state
        .app
        .workspace_files()
        .rename(
            &caller,
            &body_target(&body)?,
            field(&body, "path")?,
            field(&body, "new_name")?,
        )
        .await?;
    Ok(Json(entry).into_response())
}

async fn duplicate(State(state): State<AppState>, Caller(caller): Caller, body: Bytes) -> Answer {
    let body = json_body(&body)?;
    let entry = state
        .app
        .workspace_files()
        .duplicate(&caller, &body_target(&body)?, field(&body, "path")?)
        .await?;
    Ok(Json(entry).into_response())
}

/// `{"session_id", "paths", "dest_dir", "overwrite"?}` → `{"<done>": [entries], "errors":
/// [{"path", "error", "conflict"?}]}`, 200 even when every entry failed (as the seed).
async fn transfer(state: AppState, caller: Caller, body: Bytes, copy: bool) -> Answer {
    let Caller(caller) = caller;
    let body = json_body(&body)?;
    let paths: Vec<String> = body
        .get("paths")
        .and_then(Value::as_array)
        .filter(|paths| !paths.is_empty())
        .and_then(|paths| {
            paths
                .iter()
                .map(|p| p.as_str().map(str::to_owned))
                .collect()
        })
        .ok_or_else(|| AppError::bad_request("Missing or invalid 'paths' field (must be array)"))?;
    let overwrite = body
        .get("overwrite")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let transfer = state
        .app
        .workspace_files()
        .transfer(
            &caller,
            &body_target(&body)?,
            paths,
            field(&body, "dest_dir")?,
            overwrite,
            copy,
        )
        .await?;
    let done = if copy { "copied" } else { "moved" };
    ok(json!({done: transfer.done, "errors": transfer.errors}))
}

async fn move_entries(State(state): State<AppState>, caller: Caller, body: Bytes) -> Answer {
    transfer(state, caller, body, false).await
}

async fn copy_entries(State(state): State<AppState>, caller: Caller, body: Bytes) -> Answer {
    transfer(state, caller, body, true).await
}

async fn remove(State(state): State<AppState>, Caller(caller): Caller, body: Bytes) -> Answer {
    let body = json_body(&body)?;
    let path = state
        .app
        .workspace_files()
        .delete(&caller, &body_target(&body)?, field(&body, "path")?)
        .await?;
    ok(json!({"status": "deleted", "path": path}))
}

async fn upload_init(State(state): State<AppState>, Caller(caller): Caller, body: Bytes) -> Answer {
    let body = json_body(&body)?;
    let session = body
        .get("session_id")
        .or_else(|| body.get("workspace_id"))
        .and_then(Value::as_str);
    let agent = body.get("agent_id").and_then(Value::as_str);
    if session.is_none() && agent.is_none() {
        return Err(AppError::bad_request("INVALID_REQUEST: missing field workspace_id").into());
    }
    let target_workspace =
        WorkspaceRef::from_ids(session.map(str::to_owned), agent.map(str::to_owned))?;
    let file_name = field(&body, "file_name")?;
    let file_size = body
        .get("file_size")
        .and_then(Value::as_u64)
        .ok_or_else(|| AppError::bad_request("INVALID_REQUEST: missing field file_size"))?;
    let target = field(&body, "target_path")?;
    let target = match body.get("target_dir_path").and_then(Value::as_str) {
        Some(dir) if !dir.is_empty() => format!("{}/{target}", dir.trim_end_matches('/')),
        _ => target.to_owned(),
    };
    let limits = WorkspaceLimits::default();
    let plan = state
        .app
        .workspace_files()
        .upload_init(
            &caller,
            &target_workspace,
            &target,
            file_name,
            file_size,
            limits,
        )
        .await?;
    let chunks: Vec<Value> = (0..plan.chunk_count)
        .map(|n| {
            json!({"parallel_id": n, "offset": n * plan.chunk_size,
                   "size": plan.chunk_len(n).unwrap_or(0)})
        })
        .collect();
    ok(json!({
        "upload_id": plan.upload_id,
        "parallel_size": plan.chunk_size,
        "parallel_max_threads": 4,
        "chunk_count": plan.chunk_count,
        "chunks": chunks,
        "path": plan.target_path,
    }))
}

async fn upload_status(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    let status = state
        .app
        .workspace_files()
        .upload_status(&caller, &id)
        .await?;
    Ok(Json(status).into_response())
}

async fn upload_chunk(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path((id, n)): Path<(String, u64)>,
    body: Body,
) -> Answer {
    let received = state
        .app
        .workspace_files()
        .upload_chunk(&caller, &id, n, body.into_data_stream())
        .await?;
    ok(json!({"upload_id": id, "parallel_id": n, "received": received, "status": "uploaded"}))
}

async fn upload_complete(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    let plan = state
        .app
        .workspace_files()
        .upload_complete(&caller, &id)
        .await?;
    ok(
        json!({"upload_id": plan.upload_id, "file_name": plan.file_name,
              "file_size": plan.file_size, "path": plan.target_path, "status": "completed"}),
    )
}

async fn upload_cancel(
    State(state): State<AppState>,
    Caller(caller): Caller,
    Path(id): Path<String>,
) -> Answer {
    state
        .app
        .workspace_files()
        .upload_cancel(&caller, &id)
        .await?;
    ok(json!({"upload_id": id, "status": "cancelled"}))
}

/// `name` percent-encoded for `filename*` (RFC 8187: unreserved characters kept).
fn percent_encoded(name: &str) -> String {
    let mut out = String::new();
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}
