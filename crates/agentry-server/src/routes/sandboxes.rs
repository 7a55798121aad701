//! Sandbox routes: an E2B-like surface over the sandboxes of `agentry-sandbox`.
//!
//! - `GET /v1/sandbox/capabilities`: what isolation this host gives, which backend is
//!   configured, and whether sandboxes are enabled (and why not).
//! - `/v1/sandboxes`: create (a fresh workspace each, optional environment and limits), list,
//!   show, delete (close). Registry: [`agentry_app::sandboxes`].
//! - `POST /v1/sandboxes/{id}/exec`: run a command (`argv`, or a `command` line for `/bin/sh
//!   -c`) with optional environment, working directory, stdin and timeout; wait for it (JSON),
//!   stream it (`"stream": true`: server-sent events `stdout`, `stderr`, then `exit`), or start
//!   it in the background (`"background": true`: `202` with its `exec_id`). A waiting or
//!   streaming command is killed when its client goes away.
//! - `POST /v1/sandboxes/{id}/code`: run Python in the sandbox's kernel (stateful; charts,
//!   tables and errors back as data).
//! - `/v1/sandboxes/{id}/processes`: background processes: list the running ones, read one's
//!   output so far and status, kill one (with everything it started).
//! - `/v1/sandboxes/{id}/files`: read (raw bytes), write (the raw body), delete, list, stat,
//!   mkdir. Paths are the sandbox's own (relative ones from its workspace), resolved inside it
//!   by its agent, so a symlink cannot lead out.
//! - `POST /v1/sandboxes/{id}/pause` and `/resume`; `POST /v1/sandboxes/{id}/snapshots` (a copy
//!   of its workspace, kept across restarts) and `/v1/sandbox-snapshots` (list, show, delete); a
//!   sandbox made with `snapshot_id` starts from one (a fork).
//!
//! When the server has no sandboxes (`ToolEnvironment::sandboxes` is `None`) every route but
//! the capabilities answers `503 sandboxes_disabled`.

use std::convert::Infallible;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::Deserialize;
use serde_json::json;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::config::{ApiJson, ApiPath};
use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{
    BadRequest, Conflict, FileTooLarge, Forbidden, JsonBodyErrors, NotFound, SandboxUnavailable,
    TooManyRequests,
};
use crate::state::AppState;
use agentry_app::sandbox_requests::{CreateSandboxRequest, ExecBody, check_path};
use agentry_app::sandbox_service::{
    BackgroundStarted, CodeEvent, CodeRequest, CodeResult, CommandOutput, DirListing, ExecResult,
    FILE_LIMIT, FileStatView, ForegroundCommand, ProcessDetail, ProcessList, SandboxCapabilities,
    SandboxList, SandboxView, SnapshotList, SnapshotView, Started, sandbox_view,
};

/// The sandbox routes.
pub fn routes() -> OpenApiRouter<AppState> {
    // Files are written from the raw body: up to FILE_LIMIT, not the API's JSON limit.
    let files = OpenApiRouter::new()
        .routes(routes!(read_file, write_file, delete_file))
        .layer(DefaultBodyLimit::max(FILE_LIMIT));
    OpenApiRouter::new()
        .routes(routes!(capabilities))
        .routes(routes!(list_sandboxes, create_sandbox))
        .routes(routes!(get_sandbox, delete_sandbox))
        .routes(routes!(pause_sandbox))
        .routes(routes!(snapshot_sandbox))
        .routes(routes!(list_snapshots))
        .routes(routes!(get_snapshot, delete_snapshot))
        .routes(routes!(resume_sandbox))
        .routes(routes!(exec))
        .routes(routes!(run_code))
        .routes(routes!(list_processes))
        .routes(routes!(get_process))
        .routes(routes!(kill_process))
        .routes(routes!(list_files))
        .routes(routes!(stat_file))
        .routes(routes!(make_directory))
        .merge(files)
}

// --- parameters ---

/// The sandbox a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SandboxPath {
    /// The sandbox's id: a UUIDv7, lowercase and hyphenated.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub id: String,
}

/// The snapshot a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SnapshotPath {
    /// The snapshot's id: a UUIDv7, lowercase and hyphenated.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub snapshot_id: String,
}

/// The background process a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ProcessPath {
    /// The sandbox's id: a UUIDv7, lowercase and hyphenated.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub id: String,
    /// The process's id (`exec_id`): a UUIDv7, lowercase and hyphenated.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub exec_id: String,
}

/// A path inside the sandbox.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct FileQuery {
    /// The path inside the sandbox: absolute, or relative to its workspace (1 to 4096 bytes,
    /// no NUL).
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")]
    pub path: String,
}

/// A directory inside the sandbox.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// The directory: absolute, or relative to the workspace (default: the workspace).
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")]
    pub path: Option<String>,
}

/// What to delete inside the sandbox.
#[derive(Debug, Clone, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// The path: absolute, or relative to the workspace.
    #[param(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")]
    pub path: String,
    /// Delete a directory with its contents (otherwise only an empty one).
    #[serde(default)]
    #[param(default = false)]
    pub recursive: bool,
}

// --- bodies ---

/// The body of `POST /v1/sandboxes/{id}/files/mkdir`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MkdirRequest {
    /// The directory: absolute, or relative to the workspace (no NUL).
    #[schema(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")]
    pub path: String,
    /// Make missing parents too (and succeed if it exists).
    #[serde(default)]
    pub parents: bool,
}

/// Raw bytes (`application/octet-stream`): a binary string in the document.
#[derive(Debug, Clone, Copy)]
pub struct Binary;

impl utoipa::PartialSchema for Binary {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Binary)))
            .description(Some("Raw bytes."))
            .into()
    }
}

impl ToSchema for Binary {
    fn name() -> std::borrow::Cow<'static, str> {
        "Binary".into()
    }
}

// --- answers (the rest are agentry_app::sandbox_service's) ---

/// The events of a streamed command.
#[derive(Debug, Clone, Copy, ToSchema)]
pub enum ExecStreamEventName {
    /// A chunk of standard output: `{"text"}` (UTF-8; a character split across chunks is sent
    /// whole with the next one).
    #[schema(rename = "stdout")]
    Stdout,
    /// A chunk of standard error: `{"text"}`.
    #[schema(rename = "stderr")]
    Stderr,
    /// The command ended (last): an `ExitView`.
    #[schema(rename = "exit")]
    Exit,
}

/// One server-sent event of a streamed command.
#[derive(Debug, Clone, ToSchema)]
pub struct ExecStreamEvent {
    /// The event's name.
    pub event: ExecStreamEventName,
    /// Its data: one JSON document.
    pub data: String,
}

/// The events of a streamed code call.
#[derive(Debug, Clone, Copy, ToSchema)]
pub enum CodeStreamEventName {
    /// One output as the kernel sent it: a `CodeOutput` (text on a stream, a display, the
    /// last expression's value).
    #[schema(rename = "output")]
    Output,
    /// The call ended (last): its `CodeResult`, every output included.
    #[schema(rename = "done")]
    Done,
    /// The call failed (last): an error body, as a non-streamed call would answer it.
    #[schema(rename = "error")]
    Error,
}

/// One server-sent event of a streamed code call.
#[derive(Debug, Clone, ToSchema)]
pub struct CodeStreamEvent {
    /// The event's name.
    pub event: CodeStreamEventName,
    /// Its data: one JSON document.
    pub data: String,
}

fn body_rejection(rejection: BytesRejection) -> ApiError {
    let code = if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
        "request_too_large"
    } else {
        "invalid_request"
    };
    ApiError::new(rejection.status(), code, rejection.body_text())
}

/// A streamed command as server-sent events.
fn stream_of(command: ForegroundCommand) -> Response {
    let events = command.output().map(|output| {
        let event = match output {
            CommandOutput::Stdout(text) => text_event("stdout", text),
            CommandOutput::Stderr(text) => text_event("stderr", text),
            CommandOutput::Exit(exit) => Event::default()
                .event("exit")
                .data(serde_json::to_string(&exit).unwrap_or_else(|_| "{}".to_owned())),
        };
        Ok::<Event, Infallible>(event)
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

fn text_event(name: &'static str, text: String) -> Event {
    Event::default()
        .event(name)
        .data(json!({ "text": text }).to_string())
}

// --- handlers ---

/// What sandboxes this server can make.
///
/// The host's isolation as probed (user namespaces, Landlock, seccomp, cgroups), the backend
/// configured (`native`, `local` or none), whether `/v1/sandboxes` is enabled and, when it is
/// not, why.
#[utoipa::path(
    get,
    path = "/v1/sandbox/capabilities",
    tag = "sandboxes",
    operation_id = "sandbox_capabilities",
    responses((status = 200, description = "What this server can give.", body = SandboxCapabilities))
)]
async fn capabilities(
    State(state): State<AppState>,
) -> Result<Json<SandboxCapabilities>, ApiError> {
    Ok(Json(state.app.sandboxes().capabilities().await?))
}

/// Creates a sandbox.
///
/// It gets a fresh, empty workspace (removed when it closes), the server's default limits
/// unless `limits` names others, and `env` added to every command's environment. The body is a
/// JSON object; `{}` takes every default. At most 64 sandboxes are open at once (`429` past
/// that); an idle sandbox is closed after its idle timeout (15 minutes by default).
#[utoipa::path(
    post,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    operation_id = "create_sandbox",
    request_body = CreateSandboxRequest,
    responses(
        (status = 201, description = "Created and ready.", body = SandboxView,
         links(
             ("get_sandbox" = (operation_id = "get_sandbox", parameters(("id" = "$response.body#/id")))),
             ("delete_sandbox" = (operation_id = "delete_sandbox", parameters(("id" = "$response.body#/id")))),
             ("sandbox_exec" = (operation_id = "sandbox_exec", parameters(("id" = "$response.body#/id")))),
             ("list_sandbox_processes" = (operation_id = "list_sandbox_processes", parameters(("id" = "$response.body#/id")))),
             ("read_sandbox_file" = (operation_id = "read_sandbox_file", parameters(("id" = "$response.body#/id")))),
             ("write_sandbox_file" = (operation_id = "write_sandbox_file", parameters(("id" = "$response.body#/id")))),
             ("delete_sandbox_file" = (operation_id = "delete_sandbox_file", parameters(("id" = "$response.body#/id")))),
             ("list_sandbox_files" = (operation_id = "list_sandbox_files", parameters(("id" = "$response.body#/id")))),
             ("stat_sandbox_file" = (operation_id = "stat_sandbox_file", parameters(("id" = "$response.body#/id")))),
             ("make_sandbox_directory" = (operation_id = "make_sandbox_directory", parameters(("id" = "$response.body#/id")))),
         )),
        JsonBodyErrors,
        NotFound,
        TooManyRequests,
        SandboxUnavailable,
    )
)]
async fn create_sandbox(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiJson(request): ApiJson<CreateSandboxRequest>,
) -> Result<Response, ApiError> {
    let view = state.app.sandboxes().create(&caller, request).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

/// The open sandboxes.
#[utoipa::path(
    get,
    path = "/v1/sandboxes",
    tag = "sandboxes",
    operation_id = "list_sandboxes",
    responses(
        (status = 200, description = "The open sandboxes, oldest first.", body = SandboxList),
        SandboxUnavailable,
    )
)]
async fn list_sandboxes(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<SandboxList>, ApiError> {
    Ok(Json(
        state.app.sandboxes().list(|owner| caller.may_see(owner))?,
    ))
}

/// One sandbox.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    operation_id = "get_sandbox",
    params(SandboxPath),
    responses(
        (status = 200, description = "The sandbox.", body = SandboxView),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn get_sandbox(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxView>, ApiError> {
    let entry = state.app.sandboxes().get(&id)?;
    Ok(Json(sandbox_view(&entry)))
}

/// Pauses a sandbox: every process in it is frozen (no CPU; memory, files and open connections
/// kept) until it is resumed. Commands and file operations answer 409 `sandbox_paused`
/// meanwhile, and a paused sandbox is not closed for being idle (its wall-time limit still
/// counts, and so does a running command's timeout). Pausing a paused sandbox changes nothing.
/// Needs a cgroup freezer for the sandbox (a server running as root, or with a delegated
/// cgroup): 503 `not_supported` otherwise.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/pause",
    tag = "sandboxes",
    operation_id = "pause_sandbox",
    params(SandboxPath),
    responses(
        (status = 200, description = "Paused.", body = SandboxView),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn pause_sandbox(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxView>, ApiError> {
    Ok(Json(state.app.sandboxes().pause(&id).await?))
}

/// Takes a snapshot of a sandbox's workspace: a copy of its files, kept until it is deleted
/// (across restarts of the server), that new sandboxes can start from (`POST /v1/sandboxes`
/// with `snapshot_id`). The sandbox is paused while it is copied (no process of it runs while
/// the host reads its files) and goes on after; a host without a cgroup freezer for it answers
/// 503 `not_supported`. At most 4 GiB of files (413 `snapshot_too_large`), and 32 snapshots
/// kept per key (429 `too_many_snapshots`).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/snapshots",
    tag = "sandboxes",
    operation_id = "snapshot_sandbox",
    params(SandboxPath),
    responses(
        (status = 201, description = "Taken.", body = SnapshotView),
        BadRequest,
        NotFound,
        Conflict,
        FileTooLarge,
        TooManyRequests,
        SandboxUnavailable,
    )
)]
async fn snapshot_sandbox(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<(StatusCode, Json<SnapshotView>), ApiError> {
    Ok((
        StatusCode::CREATED,
        Json(state.app.sandboxes().snapshot(&id).await?),
    ))
}

/// The sandbox snapshots this caller may use (an API key's own; every one for an admin),
/// oldest first.
#[utoipa::path(
    get,
    path = "/v1/sandbox-snapshots",
    tag = "sandboxes",
    operation_id = "list_sandbox_snapshots",
    responses(
        (status = 200, description = "The snapshots.", body = SnapshotList),
        SandboxUnavailable,
    )
)]
async fn list_snapshots(
    State(state): State<AppState>,
    Caller(caller): Caller,
) -> Result<Json<SnapshotList>, ApiError> {
    Ok(Json(state.app.sandboxes().snapshots(&caller).await?))
}

/// One sandbox snapshot.
#[utoipa::path(
    get,
    path = "/v1/sandbox-snapshots/{snapshot_id}",
    tag = "sandboxes",
    operation_id = "get_sandbox_snapshot",
    params(SnapshotPath),
    responses(
        (status = 200, description = "The snapshot.", body = SnapshotView),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn get_snapshot(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SnapshotView>, ApiError> {
    Ok(Json(
        state.app.sandboxes().get_snapshot(&caller, &id).await?,
    ))
}

/// Deletes a sandbox snapshot; sandboxes started from it keep their own copies.
#[utoipa::path(
    delete,
    path = "/v1/sandbox-snapshots/{snapshot_id}",
    tag = "sandboxes",
    operation_id = "delete_sandbox_snapshot",
    params(SnapshotPath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn delete_snapshot(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.sandboxes().delete_snapshot(&caller, &id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Resumes a paused sandbox: its processes go on where they stopped. Resuming a running
/// sandbox changes nothing.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/resume",
    tag = "sandboxes",
    operation_id = "resume_sandbox",
    params(SandboxPath),
    responses(
        (status = 200, description = "Running.", body = SandboxView),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn resume_sandbox(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SandboxView>, ApiError> {
    Ok(Json(state.app.sandboxes().resume(&id).await?))
}

/// Closes a sandbox: every process in it is killed and its workspace removed.
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}",
    tag = "sandboxes",
    operation_id = "delete_sandbox",
    params(SandboxPath),
    responses(
        (status = 204, description = "Closed."),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn delete_sandbox(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.sandboxes().close(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Runs code in the sandbox's code interpreter: a stateful Python kernel (`ipykernel`,
/// through the Jupyter protocol), started on the first call and kept, with its variables,
/// until the sandbox closes.
///
/// Answers what the code printed (`stream` outputs), what it displayed (`display_data`:
/// matplotlib charts as base64 `image/png`, pandas tables as `text/html`, by MIME type), the
/// value of its last expression (`result`) and the exception it raised (`error`, with its
/// traceback). At `timeout_secs` (default 60) the code is interrupted (`"timed_out": true`, a
/// `KeyboardInterrupt` error) and the kernel stays. A kernel that dies fails the call with 409
/// `kernel_died`, and the next call starts a new one (`"kernel_started": true`). 503
/// `kernel_unavailable` when no kernel can start: the server's `--kernel-python` (default: the
/// sandbox's `python3`) needs `ipykernel`.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/code",
    tag = "sandboxes",
    operation_id = "sandbox_run_code",
    params(SandboxPath),
    request_body = CodeRequest,
    responses(
        (status = 200, description = "The code ran (an exception it raised is in `error`), or its events (`\"stream\": true`).",
         content(
             (CodeResult = "application/json"),
             (CodeStreamEvent = "text/event-stream"),
         )),
        JsonBodyErrors,
        NotFound,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn run_code(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<CodeRequest>,
) -> Result<Response, ApiError> {
    if !body.stream {
        return Ok(Json(state.app.sandboxes().run_code(&id, body).await?).into_response());
    }
    let events = state
        .app
        .sandboxes()
        .run_code_streaming(&id, body)?
        .map(|event| {
            let (name, data) = match event {
                CodeEvent::Output(output) => ("output", serde_json::to_string(&output)),
                CodeEvent::Done(result) => ("done", serde_json::to_string(&result)),
                CodeEvent::Failed(error) => ("error", Ok(ApiError::from(error).body().to_string())),
            };
            let data = data.unwrap_or_else(|_| "{}".to_owned());
            Ok::<Event, Infallible>(Event::default().event(name).data(data))
        });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Runs a command in a sandbox.
///
/// Give exactly one of `argv` and `command` (a line for `/bin/sh -c`). By default the request
/// waits for the end and answers its output (each stream's first 1 MiB) and exit. With
/// `"stream": true` it answers server-sent events instead: `stdout` and `stderr` (data:
/// `{"text": …}`) as the command prints, then `exit` (an `ExitView`) last. A command the
/// request waits for or streams is killed with everything it started when the client goes away.
/// With `"background": true` it answers `202` at once; see `/v1/sandboxes/{id}/processes`.
/// A program that cannot be found exits with 127; its error is on stderr.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/exec",
    tag = "sandboxes",
    operation_id = "sandbox_exec",
    params(SandboxPath),
    request_body = ExecBody,
    responses(
        (status = 200, description = "The command ended (JSON), or its events (`\"stream\": true`).",
         content(
             (ExecResult = "application/json"),
             (ExecStreamEvent = "text/event-stream"),
         )),
        (status = 202, description = "Started in the background.", body = BackgroundStarted,
         links(
             ("get_sandbox_process" = (operation_id = "get_sandbox_process", parameters(
                 ("id" = "$response.body#/sandbox_id"), ("exec_id" = "$response.body#/exec_id")))),
             ("kill_sandbox_process" = (operation_id = "kill_sandbox_process", parameters(
                 ("id" = "$response.body#/sandbox_id"), ("exec_id" = "$response.body#/exec_id")))),
         )),
        JsonBodyErrors,
        NotFound,
        TooManyRequests,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn exec(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<ExecBody>,
) -> Result<Response, ApiError> {
    Ok(match state.app.sandboxes().exec(&id, body).await? {
        Started::Background(started) => (StatusCode::ACCEPTED, Json(started)).into_response(),
        Started::Foreground {
            command,
            stream: true,
        } => stream_of(command),
        Started::Foreground { command, .. } => Json(command.wait().await).into_response(),
    })
}

/// The background processes running in a sandbox.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes",
    tag = "sandboxes",
    operation_id = "list_sandbox_processes",
    params(SandboxPath),
    responses(
        (status = 200, description = "The running background processes, oldest first.", body = ProcessList),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn list_processes(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ProcessList>, ApiError> {
    Ok(Json(state.app.sandboxes().processes(&id)?))
}

/// A background process: its output so far and its status.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/processes/{exec_id}",
    tag = "sandboxes",
    operation_id = "get_sandbox_process",
    params(ProcessPath),
    responses(
        (status = 200, description = "The process.", body = ProcessDetail),
        BadRequest,
        NotFound,
        SandboxUnavailable,
    )
)]
async fn get_process(
    State(state): State<AppState>,
    ApiPath((id, exec_id)): ApiPath<(String, String)>,
) -> Result<Json<ProcessDetail>, ApiError> {
    Ok(Json(state.app.sandboxes().process(&id, &exec_id)?))
}

/// Kills a background process and everything it started, and waits up to 5 s for its end.
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/processes/{exec_id}/kill",
    tag = "sandboxes",
    operation_id = "kill_sandbox_process",
    params(ProcessPath),
    responses(
        (status = 200, description = "Killed (or it had ended): its status now.", body = ProcessDetail),
        BadRequest,
        NotFound,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn kill_process(
    State(state): State<AppState>,
    ApiPath((id, exec_id)): ApiPath<(String, String)>,
) -> Result<Json<ProcessDetail>, ApiError> {
    Ok(Json(
        state.app.sandboxes().kill_process(&id, &exec_id).await?,
    ))
}

/// Reads a regular file (up to 16 MiB) as raw bytes.
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files",
    tag = "sandboxes",
    operation_id = "read_sandbox_file",
    params(SandboxPath, FileQuery),
    responses(
        (status = 200, description = "The file's bytes.", body = inline(Binary),
         content_type = "application/octet-stream"),
        BadRequest,
        Forbidden,
        NotFound,
        FileTooLarge,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn read_file(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query?;
    let bytes = state.app.sandboxes().read_file(&id, &query.path).await?;
    let mut response =
        ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response();
    super::linglong::workspace::never_active(response.headers_mut());
    Ok(response)
}

/// Creates or replaces a regular file with the raw request body (up to 16 MiB; mode 0644).
///
/// Its folder must exist (`POST /v1/sandboxes/{id}/files/mkdir`).
#[utoipa::path(
    put,
    path = "/v1/sandboxes/{id}/files",
    tag = "sandboxes",
    operation_id = "write_sandbox_file",
    params(SandboxPath, FileQuery),
    request_body(content = inline(Binary), content_type = "application/octet-stream",
                 description = "The file's new contents."),
    responses(
        (status = 204, description = "Written."),
        BadRequest,
        Forbidden,
        NotFound,
        Conflict,
        FileTooLarge,
        SandboxUnavailable,
    )
)]
async fn write_file(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<StatusCode, ApiError> {
    state.app.sandboxes().get(&id)?;
    let Query(query) = query?;
    check_path("`path`", &query.path)?;
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "file_too_large",
                format!("a file written through the API has at most {FILE_LIMIT} bytes"),
            )
        } else {
            body_rejection(rejection)
        }
    })?;
    state
        .app
        .sandboxes()
        .write_file(&id, &query.path, &body)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Deletes a file, a symlink, or a directory (with its contents when `recursive`).
#[utoipa::path(
    delete,
    path = "/v1/sandboxes/{id}/files",
    tag = "sandboxes",
    operation_id = "delete_sandbox_file",
    params(SandboxPath, DeleteQuery),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        Forbidden,
        NotFound,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn delete_file(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<DeleteQuery>, QueryRejection>,
) -> Result<StatusCode, ApiError> {
    let Query(query) = query?;
    state
        .app
        .sandboxes()
        .delete_file(&id, &query.path, query.recursive)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Lists a directory (entries by name; symlinks are not followed).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/list",
    tag = "sandboxes",
    operation_id = "list_sandbox_files",
    params(SandboxPath, ListQuery),
    responses(
        (status = 200, description = "The directory's entries.", body = DirListing),
        BadRequest,
        Forbidden,
        NotFound,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn list_files(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> Result<Json<DirListing>, ApiError> {
    let Query(query) = query?;
    Ok(Json(
        state.app.sandboxes().list_files(&id, query.path).await?,
    ))
}

/// The metadata of a path (`lstat`: a symlink is described, not followed).
#[utoipa::path(
    get,
    path = "/v1/sandboxes/{id}/files/stat",
    tag = "sandboxes",
    operation_id = "stat_sandbox_file",
    params(SandboxPath, FileQuery),
    responses(
        (status = 200, description = "The path's metadata.", body = FileStatView),
        BadRequest,
        Forbidden,
        NotFound,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn stat_file(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    query: Result<Query<FileQuery>, QueryRejection>,
) -> Result<Json<FileStatView>, ApiError> {
    let Query(query) = query?;
    Ok(Json(
        state.app.sandboxes().stat_file(&id, &query.path).await?,
    ))
}

/// Makes a directory (and its missing parents with `parents`).
#[utoipa::path(
    post,
    path = "/v1/sandboxes/{id}/files/mkdir",
    tag = "sandboxes",
    operation_id = "make_sandbox_directory",
    params(SandboxPath),
    request_body = MkdirRequest,
    responses(
        (status = 201, description = "Made (with `parents`: or it existed)."),
        JsonBodyErrors,
        Forbidden,
        NotFound,
        Conflict,
        SandboxUnavailable,
    )
)]
async fn make_directory(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(request): ApiJson<MkdirRequest>,
) -> Result<StatusCode, ApiError> {
    state
        .app
        .sandboxes()
        .make_directory(&id, &request.path, request.parents)
        .await?;
    Ok(StatusCode::CREATED)
}
