//! The API's OpenAPI 3.1 document, served at `GET /openapi.json`.
//!
//! Most of it comes from the handlers themselves: every route of `routes/{ops, infer, sessions,
//! runs, config, agents, mcp, sandboxes}.rs` is registered through
//! [`utoipa_axum::router::OpenApiRouter`] from its handler's `#[utoipa::path]` operation
//! ([`crate::routes::documented`]), so the method and path served are the ones documented. Routes that other modules serve as plain axum routers — the status feed
//! (`routes/status.rs`), `/metrics` and `/v1/auth/*` (`middleware.rs`) — are described here, in
//! `served_elsewhere`. The test suite compares the finished document with the routes the server
//! answers, in both directions, so a route added without documentation fails it.
//!
//! Errors are described once: the [`ErrorBody`] schema and one reusable response per status
//! ([`BadRequest`], [`NotFound`], …), which operations list in their `responses(...)`.
//! Authentication is added to every `/v1` operation (and `/metrics`) in one place, the way the
//! middleware applies it: a `401` response and optional bearer or cookie security.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde_json::Value;
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr};
use utoipa::{IntoParams, IntoResponses, OpenApi, ToSchema};

use crate::error::ApiError;

/// The document, built from the handlers' annotations and the routes described here.
pub fn document() -> Document {
    let mut document = ApiDoc::openapi();
    document.merge(crate::routes::documented().into_openapi());
    let components = document.components.get_or_insert_with(Default::default);
    for (name, response) in error_response_components() {
        components
            .responses
            .insert(name.to_owned(), RefOr::T(response));
    }
    add_authentication(&mut document);
    document
}

/// The document as JSON, built once.
pub fn document_json() -> Result<&'static str, ApiError> {
    static JSON: OnceLock<Result<String, String>> = OnceLock::new();
    JSON.get_or_init(|| document().to_json().map_err(|error| error.to_string()))
        .as_deref()
        .map_err(|error| {
            ApiError::internal(format!("cannot serialise the OpenAPI document: {error}"))
        })
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Agentry",
        description = "Agentry's HTTP API: inference (waiting or streamed as server-sent events), \
                       durable sessions, and the configuration of models, tools, prompt templates \
                       and secrets. Every error is JSON: `{\"error\": {\"code\", \"message\", \
                       \"details\"}}`."
    ),
    paths(
        served_elsewhere::session_status_feed,
        served_elsewhere::metrics,
        served_elsewhere::login,
        served_elsewhere::logout,
        served_elsewhere::auth_status,
    ),
    components(schemas(ErrorBody, ErrorDetail)),
    tags(
        (name = "operations", description = "Health, readiness, metrics and this document."),
        (name = "inference", description = "Runs: waiting, streamed, aborted."),
        (name = "sessions", description = "Durable sessions and their event logs."),
        (name = "runs", description = "Run control: approvals of waiting tool calls, interrupt, \
                                       pause, resume, abort."),
        (name = "models", description = "Registered models."),
        (name = "tools", description = "Built-in and configured tools, and direct calls."),
        (name = "prompt-templates", description = "Named prompt templates."),
        (name = "skills", description = "Skill folders registered on their own."),
        (name = "workflows", description = "Workflows: durable graphs of tools, agents, fan-outs, \
                                            approvals, timers and signals, and their runs."),
        (name = "secrets", description = "Write-only secrets (`/v1/env`)."),
        (name = "auth", description = "API keys and console logins."),
        (name = "sandboxes", description = "Standalone sandboxes: create, run commands (waiting, \
                                            streamed or in the background), files, close."),
        (name = "schedules", description = "Schedules: a cron expression in a time zone, or an \
                                             interval, and the background run each fire submits."),
        (name = "usage", description = "Tokens and cost of every model call, and spending \
                                        budgets of agents and API keys."),
        (name = "groups", description = "Group chats: several saved agents in one session, woken \
                                         by @mentions, rounds of replies in parallel."),
    ),
    modifiers(&SecuritySchemes)
)]
struct ApiDoc;

// --- errors ---

/// The body of every error response.
#[derive(Debug, Clone, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// What went wrong.
#[derive(Debug, Clone, ToSchema)]
pub struct ErrorDetail {
    /// A stable code: `invalid_request`, `not_found`, `conflict`, `request_too_large`,
    /// `unauthorized`, `method_not_allowed`, `unavailable`, `timeout`, `tool_failed`,
    /// `model_error`, `internal`, …
    #[schema(example = "invalid_request")]
    pub code: String,
    /// What went wrong, for a person.
    pub message: String,
    /// Extra structured detail (for a busy session: `session_id` and `run_id`).
    #[schema(value_type = Option<Object>)]
    pub details: Option<Value>,
}

/// The JSON error response with this description.
fn error_response(description: &str) -> Response {
    ResponseBuilder::new()
        .description(description)
        .content(
            "application/json",
            ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build(),
        )
        .build()
}

/// Reusable error responses: each a unit type to list in an operation's `responses(...)`,
/// which references the response component of the same name.
macro_rules! error_responses {
    ($($name:ident => $status:literal, $description:literal;)*) => {
        $(
            #[doc = concat!("`", $status, "`: ", $description)]
            #[derive(Debug, Clone, Copy)]
            pub struct $name;

            impl IntoResponses for $name {
                fn responses() -> BTreeMap<String, RefOr<Response>> {
                    BTreeMap::from([(
                        $status.to_owned(),
                        RefOr::Ref(Ref::from_response_name(stringify!($name))),
                    )])
                }
            }
        )*

        /// Every reusable error response, by component name.
        fn error_response_components() -> Vec<(&'static str, Response)> {
            vec![$((stringify!($name), error_response($description)),)*]
        }
    };
}

error_responses! {
    BadRequest => "400", "The request is invalid (a malformed body, a wrong type, an unknown \
        field, a bad id or name); the message says what to change.";
    Unauthorized => "401", "This server has API keys and the request carries no valid key or \
        login.";
    Forbidden => "403", "The sandbox refuses the operation (permission denied, a read-only \
        path).";
    HostCommandsRefused => "403", "It would run a command (a command tool, a stdio MCP server) \
        on the host, or without the sandbox this server lacks, and the operator has not allowed \
        that: `sandbox_required` (start the server with `--sandbox native|local`, or \
        `--allow-host-commands`), `host_commands_refused` (`\"host\": true` needs \
        `--allow-host-commands`), or `api_key_required` (with host commands allowed, registering \
        a stdio MCP server needs an API key). Nothing was saved or started.";
    SecretHostNotAllowed => "403", "A secret it names is bound to other hosts than its URL's \
        (`secret_host_not_allowed`: `POST /v1/env` with `hosts` binds a secret); nothing was \
        saved or sent.";
    NotFound => "404", "Nothing exists under this id or name.";
    Conflict => "409", "It conflicts with the current state (the name is taken, the session \
        has a run in progress, or the sandbox is paused: `sandbox_paused`).";
    PayloadTooLarge => "413", "The body is larger than the server accepts (4 MiB).";
    FileTooLarge => "413", "The file is larger than the server reads or writes through the API \
        (16 MiB), or the sandbox has no room for it.";
    UnsupportedMediaType => "415", "The body is not sent as `application/json`.";
    TooManyRequests => "429", "A limit is reached: on how many exist at once (sandboxes, \
        background processes: close one first), or on failed logins (wait a minute).";
    BadGateway => "502", "A model or tool the request depends on failed.";
    ServiceUnavailable => "503", "The database does not answer.";
    GatewayTimeout => "504", "The tool did not finish in time.";
    SandboxUnavailable => "503", "Sandboxes are disabled on this server, or the backend cannot \
        make one now (`GET /v1/sandbox/capabilities` says why).";
}

/// The errors of every route that reads a JSON body: `400`, `413`, `415`.
#[derive(Debug, Clone, Copy)]
pub struct JsonBodyErrors;

impl IntoResponses for JsonBodyErrors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let mut responses = BadRequest::responses();
        responses.append(&mut PayloadTooLarge::responses());
        responses.append(&mut UnsupportedMediaType::responses());
        responses
    }
}

// --- authentication ---

struct SecuritySchemes;

impl utoipa::Modify for SecuritySchemes {
    fn modify(&self, document: &mut Document) {
        let components = document.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some("An API key (`agentry keys create`)."))
                    .build(),
            ),
        );
        components.add_security_scheme(
            "session_cookie",
            SecurityScheme::ApiKey(ApiKey::Cookie(ApiKeyValue::with_description(
                agentry_app::auth::SESSION_COOKIE,
                "The console's login (`POST /v1/auth/login`).",
            ))),
        );
    }
}

/// Whether the middleware asks this path for credentials (once any API key exists).
fn is_protected(path: &str) -> bool {
    (path.starts_with("/v1/") || path == "/metrics")
        && path != "/v1/auth/login"
        && path != "/v1/auth/status"
}

/// Marks every protected operation: a `401` response, and security that is optional (`{}`)
/// because a server without API keys asks for none.
fn add_authentication(document: &mut Document) {
    for (path, item) in document.paths.paths.iter_mut() {
        if !is_protected(path) {
            continue;
        }
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for operation in operations.into_iter().flatten() {
            protect(operation);
        }
    }
}

fn protect(operation: &mut Operation) {
    operation
        .responses
        .responses
        .append(&mut Unauthorized::responses());
    operation.security = Some(vec![
        SecurityRequirement::default(),
        SecurityRequirement::new("bearer", Vec::<String>::new()),
        SecurityRequirement::new("session_cookie", Vec::<String>::new()),
    ]);
}

// --- path parameters ---

/// The session a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct SessionPath {
    /// The session's id: a UUIDv7, lowercase and hyphenated.
    #[param(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub id: String,
}

/// The model a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ModelPath {
    /// The model's id: 1 to 64 characters of `A-Z a-z 0-9 _ . -`.
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub id: String,
}

/// The agent a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct AgentPath {
    /// The agent's id: 1 to 64 characters of `A-Z a-z 0-9 _ . -`.
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub id: String,
}

/// The tool, prompt template or secret a route acts on.
#[derive(Debug, Clone, IntoParams)]
#[into_params(parameter_in = Path)]
pub struct NamePath {
    /// Its name: 1 to 64 characters of `A-Z a-z 0-9 _ . -` (tool and template names take no
    /// `.`, so a name with one is never found).
    #[param(pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub name: String,
}

// --- server-sent events ---

/// The events of a run's stream.
#[derive(Debug, Clone, Copy, ToSchema)]
pub enum RunStreamEventName {
    /// First, for a session run: `{"session_id"}`.
    #[schema(rename = "session")]
    Session,
    /// The run started.
    #[schema(rename = "run.started")]
    RunStarted,
    /// Live text.
    #[schema(rename = "delta.text")]
    DeltaText,
    /// Live thinking.
    #[schema(rename = "delta.thinking")]
    DeltaThinking,
    /// A tool call being written.
    #[schema(rename = "delta.tool_call")]
    DeltaToolCall,
    /// A complete message.
    #[schema(rename = "message")]
    Message,
    /// A tool call started.
    #[schema(rename = "tool.started")]
    ToolStarted,
    /// A tool's result.
    #[schema(rename = "tool.result")]
    ToolResult,
    /// Token usage of a round.
    #[schema(rename = "usage")]
    Usage,
    /// The run ended (last).
    #[schema(rename = "run.finished")]
    RunFinished,
    /// The run failed (last), with a typed error.
    #[schema(rename = "run.failed")]
    RunFailed,
    /// A tool call waits for a person's approval (`{"seq", "event"}`, an `approval_requested`).
    #[schema(rename = "approval.requested")]
    ApprovalRequested,
    /// A waiting call was decided (`approval_decided`).
    #[schema(rename = "approval.decided")]
    ApprovalDecided,
    /// A waiting or paused run goes on (`run_resumed`).
    #[schema(rename = "run.resumed")]
    RunResumed,
    /// The run stopped without ending (last): its calls wait for approval (`{"run_id",
    /// "status": "waiting", "pending", "usage", "rounds"}`); decide them with
    /// `POST /v1/runs/{run_id}/approvals`.
    #[schema(rename = "run.waiting")]
    RunWaiting,
    /// The run paused between rounds (last; `run_paused`); `POST /v1/runs/{run_id}/resume`
    /// continues it.
    #[schema(rename = "run.paused")]
    RunPaused,
    /// A sub-agent's event (live only, no id), from a `delegate` or `talk_to` call:
    /// `{"type": "nested", "call_id", "session_id", "depth", "agent_id"?, "event"}`; a
    /// grandchild's event is nested twice. The child's steps are in its own session.
    #[schema(rename = "nested")]
    Nested,
    /// An MCP server asks a person for input during a tool call (live only):
    /// `{"type": "elicitation_requested", "elicitation_id", "call_id", "server", "message",
    /// "mode": "form"|"url", "requested_schema"?, "url"?}`; answer it with
    /// `POST /v1/runs/{run_id}/approvals` (`elicitation_id`, `decision`, `content`).
    #[schema(rename = "elicitation.requested")]
    ElicitationRequested,
    /// An elicitation was settled (live only): `{"type": "elicitation_resolved",
    /// "elicitation_id", "call_id", "action": "accept"|"decline"|"cancel"|"withdrawn"}`.
    #[schema(rename = "elicitation.resolved")]
    ElicitationResolved,
    /// The context was compacted (`context_compacted`: what the summary replaced).
    #[schema(rename = "context.compacted")]
    ContextCompacted,
    /// Turns were revoked (`revoked`): the conversation is again what it was after its
    /// `after_seq`.
    #[schema(rename = "session.revoked")]
    SessionRevoked,
    /// A group chat's round began (a member session's group event).
    #[schema(rename = "group.round")]
    GroupRound,
    /// A group chat's message (a member session's group event).
    #[schema(rename = "group.message")]
    GroupMessage,
    /// A group chat's exchange ended (a member session's group event).
    #[schema(rename = "group.finished")]
    GroupFinished,
    /// The stream cannot go on (the log could not be read).
    #[schema(rename = "error")]
    Error,
    /// The server is shutting down (last): `{"reason", "session_id", "last_seq", "resume"}`; the
    /// run goes on or resumes at the next start, so reconnect to `resume` with `Last-Event-ID`.
    #[schema(rename = "server.shutdown")]
    ServerShutdown,
}

/// One server-sent event of a run (each `schema` of a `text/event-stream` response describes
/// one event, as OpenAPI 3.1 tools read it).
#[derive(Debug, Clone, ToSchema)]
pub struct RunStreamEvent {
    /// The event's name.
    pub event: RunStreamEventName,
    /// Its data: one JSON document.
    pub data: String,
    /// For a committed step of a session run: its seq in the session's log.
    pub id: Option<String>,
}

/// The events of the session status feed.
#[derive(Debug, Clone, Copy, ToSchema)]
pub enum StatusFeedEventName {
    /// A session's status changed: its id and new status.
    #[schema(rename = "session.status")]
    SessionStatus,
    /// A slow reader missed changes (`{"missed": n}`): refetch the list.
    #[schema(rename = "session.lagged")]
    SessionLagged,
    /// The server is shutting down (`{"reason"}`); the feed ends.
    #[schema(rename = "server.shutdown")]
    ServerShutdown,
}

/// One server-sent event of the session status feed.
#[derive(Debug, Clone, ToSchema)]
pub struct StatusFeedEvent {
    /// The event's name.
    pub event: StatusFeedEventName,
    /// Its data: one JSON document.
    pub data: String,
}

// --- schemas of types that are not ours, or that handlers build as JSON ---

/// The schema of `agentry_app::domain::core::tool::ToolDefinition` (a type of another crate), named
/// `ToolDefinition` in the document: see [`tool_definition_schema`].
#[derive(Debug, Clone, Copy)]
pub struct ToolDefinitionSchema;

impl utoipa::PartialSchema for ToolDefinitionSchema {
    fn schema() -> RefOr<Schema> {
        tool_definition_schema().into()
    }
}

impl ToSchema for ToolDefinitionSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        "ToolDefinition".into()
    }
}

/// A tool definition (`ToolDefinition`): an HTTP endpoint or a command.
///
/// Only the fields every definition shares are spelled out; the endpoint (`url`) and the program
/// (`program`) are named in the description, so that a client generating requests from this
/// document (the API fuzzer in CI) never configures a program to run.
pub fn tool_definition_schema() -> Schema {
    let string = || ObjectBuilder::new().schema_type(Type::String);
    ObjectBuilder::new()
        .property(
            "kind",
            string()
                .enum_values(Some(["http", "command"]))
                .description(Some(
                    "`http`: POST the arguments to `url`; `command`: run `program`.",
                )),
        )
        .required("kind")
        .property("name", string().pattern(Some("^[A-Za-z0-9_-]{1,64}$")))
        .required("name")
        .property("description", string())
        .property(
            "parameters",
            ObjectBuilder::new().description(Some("JSON Schema of the arguments.")),
        )
        .property(
            "idempotent",
            ObjectBuilder::new().schema_type(Type::Boolean),
        )
        .description(Some(
            "A tool definition. `http`: `url`, `headers`, `timeout_ms`, `max_response_bytes`; \
             `command`: `program`, `args`, `env`, `timeout_ms`, `max_output_bytes`, `host` (run \
             on the host instead of the session's sandbox: no isolation); both: `name`, \
             `description`, `parameters`, `idempotent`.",
        ))
        .into()
}

/// How a direct tool call returns its result.
#[derive(Debug, Clone, Copy, ToSchema)]
#[schema(rename_all = "snake_case")]
pub enum ResultFormatName {
    /// The result's text as one JSON string.
    Text,
    /// The result parsed as JSON.
    Json,
}

/// The body of `POST /v1/infer/abort`.
#[derive(Debug, Clone, ToSchema)]
pub struct AbortRequest {
    /// The session whose run to cancel.
    #[schema(pattern = "^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}$")]
    pub session_id: String,
}

/// What `POST /v1/infer/abort` answers.
#[derive(Debug, Clone, ToSchema)]
pub struct AbortOutcome {
    /// The session.
    pub session_id: String,
    /// Whether a live run was cancelled.
    pub aborted: bool,
}

/// `POST /v1/tools/call`.
#[derive(Debug, Clone, ToSchema)]
pub struct ToolCallOutcome {
    /// The result: its text as a string (`format: text`), or its JSON (`format: json`).
    #[schema(value_type = Object)]
    pub result: Value,
}

/// A secret as listed: never its value.
#[derive(Debug, Clone, ToSchema)]
pub struct SecretInfo {
    /// Its name.
    pub name: String,
    /// A masked form (`…wxyz`: the last 4 characters, or `…` for a value shorter than 16).
    pub masked: String,
    /// The hosts it may be sent to, when it was set with `hosts` (absent otherwise).
    #[schema(nullable = false)]
    pub hosts: Option<Vec<String>>,
    /// When it was last set, Unix milliseconds.
    pub updated_at: u64,
}

/// `GET /v1/env`.
#[derive(Debug, Clone, ToSchema)]
pub struct SecretList {
    /// The secrets.
    pub secrets: Vec<SecretInfo>,
}

/// `POST /v1/env` with `vars`.
#[derive(Debug, Clone, ToSchema)]
pub struct SecretsSet {
    /// The names set.
    pub set: Vec<String>,
}

/// `GET /healthz`.
#[derive(Debug, Clone, ToSchema)]
pub struct Health {
    /// Always `ok`.
    pub status: String,
}

/// `GET /readyz`.
#[derive(Debug, Clone, ToSchema)]
pub struct Readiness {
    /// `ready`.
    pub status: String,
    /// `sqlite` or `postgres` (only while the server has no API keys).
    pub database: Option<String>,
    /// The database's schema version (only while the server has no API keys).
    pub schema_version: Option<u32>,
    /// Runs going now (only while the server has no API keys).
    pub live_runs: Option<u64>,
}

/// The body of `POST /v1/auth/login`.
#[derive(Debug, Clone, serde::Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LoginRequest {
    /// An API key.
    pub api_key: String,
}

/// `GET /v1/auth/status`.
#[derive(Debug, Clone, ToSchema)]
pub struct AuthStatus {
    /// Whether the server asks for credentials (it has an API key).
    pub enabled: bool,
    /// Whether this request carries valid ones.
    pub authenticated: bool,
}

/// Routes other modules serve as plain axum routers, described here: the handlers below are
/// never called, they only carry the operations.
#[allow(dead_code, clippy::unused_async)]
mod served_elsewhere {
    use super::{
        AuthStatus, JsonBodyErrors, LoginRequest, StatusFeedEvent, TooManyRequests, Unauthorized,
    };

    /// A live feed of every session's status changes.
    ///
    /// Server-sent events named `session.status` (data: the session's id and new status:
    /// `running`, `idle`, `failed`, `interrupted`, `waiting`, `paused`, `updated`), `session.lagged` (data:
    /// `{"missed": n}`) when a slow reader missed changes and should refetch the list, and
    /// `server.shutdown` last when the server stops.
    #[utoipa::path(
        get,
        path = "/v1/sessions/events",
        tag = "sessions",
        operation_id = "session_status_feed",
        responses(
            (status = 200, description = "The feed, until the server stops.",
             body = StatusFeedEvent, content_type = "text/event-stream"),
        )
    )]
    pub(super) async fn session_status_feed() {}

    /// Prometheus metrics.
    #[utoipa::path(
        get,
        path = "/metrics",
        tag = "operations",
        operation_id = "metrics",
        responses(
            (status = 200, description = "The metrics, in the Prometheus text format.",
             body = String, content_type = "text/plain"),
        )
    )]
    pub(super) async fn metrics() {}

    /// Exchanges an API key for an HttpOnly session cookie (for the web console).
    #[utoipa::path(
        post,
        path = "/v1/auth/login",
        tag = "auth",
        operation_id = "login",
        request_body = LoginRequest,
        responses(
            (status = 204, description = "Logged in: the cookie is set.",
             headers(("set-cookie" = String, description = "The session cookie."))),
            JsonBodyErrors,
            Unauthorized,
            TooManyRequests,
        )
    )]
    pub(super) async fn login() {}

    /// Ends the console login this request carries.
    #[utoipa::path(
        post,
        path = "/v1/auth/logout",
        tag = "auth",
        operation_id = "logout",
        responses(
            (status = 204, description = "Logged out: the cookie is cleared.",
             headers(("set-cookie" = String, description = "An expired session cookie."))),
        )
    )]
    pub(super) async fn logout() {}

    /// Whether the server asks for credentials, and whether this request carries valid ones.
    #[utoipa::path(
        get,
        path = "/v1/auth/status",
        tag = "auth",
        operation_id = "auth_status",
        responses(
            (status = 200, description = "The authentication status.", body = AuthStatus),
        )
    )]
    pub(super) async fn auth_status() {}
}
