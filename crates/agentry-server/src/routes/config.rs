//! Configuration routes: models, tools, prompt templates, secrets.
//!
//! - `/v1/models`: registered models ([`ModelConfig`]), with a connection test that sends a
//!   one-token completion through the runtime's client.
//! - `/v1/tools`: the built-in tools and the ones defined by configuration ([`ToolDefinition`],
//!   HTTP endpoints and commands), a batch delete, and direct calls (`/v1/tools/call`).
//! - `/v1/prompt-templates`: named prompt templates and the variables each reads.
//! - `/v1/env`: secrets, write-only: listings show a masked form, never a value.
//!
//! Every input is checked before anything is written: a model by building its client, a tool by
//! building it and registering it in a scratch registry, a template by compiling it. Every change
//! rebuilds the runtime, so the next run (and the next direct tool call) sees it at once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Mutex;

use agentry_core::template::TemplateStore;
use agentry_core::tool::{
    ResultFormat, SecretResolver, StaticSecrets, ToolDefinition, ToolError, ToolRegistry, builtin,
    builtin_tools,
};
use agentry_llm::{GenerationParams, LlmError, ModelRequest, Protocol, TimeoutKind};
use agentry_store::{ConfigKind, Store};
use agentry_types::Message;

use crate::error::ApiError;
use crate::models::{ModelConfig, TemplateConfig};
use crate::state::AppState;

/// How long a model connection test may take.
pub const MODEL_TEST_TIMEOUT: Duration = Duration::from_secs(15);

/// Tool names that would collide with the static routes under `/v1/tools/`.
pub const RESERVED_TOOL_NAMES: [&str; 2] = ["call", "batch"];

/// Serialises check-then-write sequences (create if absent, rename), so two concurrent creates
/// of one name cannot both succeed.
static WRITE_LOCK: Mutex<()> = Mutex::const_new(());

/// The configuration routes.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(list_models).post(create_model))
        .route(
            "/v1/models/{id}",
            get(get_model).put(replace_model).delete(delete_model),
        )
        .route("/v1/models/{id}/test", post(test_model))
        .route("/v1/tools", get(list_tools).post(create_tool))
        .route("/v1/tools/call", post(call_tool))
        .route("/v1/tools/batch", axum::routing::delete(delete_tools))
        .route(
            "/v1/tools/{name}",
            get(get_tool).put(replace_tool).delete(delete_tool),
        )
        .route(
            "/v1/prompt-templates",
            get(list_templates).post(create_template),
        )
        .route(
            "/v1/prompt-templates/{name}",
            get(get_template)
                .put(replace_template)
                .delete(delete_template),
        )
        .route(
            "/v1/prompt-templates/{name}/variables",
            get(template_variables),
        )
        .route("/v1/env", get(list_secrets).post(set_secrets))
        .route("/v1/env/{name}", axum::routing::delete(delete_secret))
}

// --- extractors ---

/// A JSON body whose rejection (malformed JSON, wrong types, missing content type, a body over
/// the limit) is an [`ApiError`], so clients always get the API's JSON error.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let result: Result<Json<T>, JsonRejection> = Json::from_request(request, state).await;
        let Json(value) = result?;
        Ok(Self(value))
    }
}

/// Path parameters whose rejection is an [`ApiError`].
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let result: Result<Path<T>, PathRejection> = Path::from_request_parts(parts, state).await;
        let Path(value) = result?;
        Ok(Self(value))
    }
}

/// A created resource: 201 with its JSON.
fn created<T: Serialize>(value: T) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

// --- shared checks ---

/// Checks a model or secret name: 1 to 64 characters of `A-Z a-z 0-9 _ . -` (the store's rule).
fn check_name(what: &str, name: &str) -> Result<(), ApiError> {
    let valid = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-'));
    if valid {
        Ok(())
    } else {
        let shown: String = name.chars().take(64).collect();
        Err(ApiError::bad_request(format!(
            "invalid {what} name {shown:?}: use 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' \
             and '-'"
        )))
    }
}

/// Every secret's value, for building clients and tools inside the process only.
async fn secret_values(store: &Store) -> Result<HashMap<String, String>, ApiError> {
    let mut secrets = HashMap::new();
    for info in store.list_secrets().await? {
        if let Some(value) = store.reveal_secret(&info.name).await? {
            secrets.insert(info.name, value);
        }
    }
    Ok(secrets)
}

fn to_document<T: Serialize>(value: &T) -> Result<Value, ApiError> {
    serde_json::to_value(value).map_err(|error| ApiError::internal(error.to_string()))
}

// --- models ---

/// Reads a model from a request body. Protocol names are taken in every spelling the model
/// layer accepts (`openai`, `openai-compatible`, `anthropic`, `ollama`), and an unknown one is
/// named in the error.
fn parse_model(mut body: Value) -> Result<ModelConfig, ApiError> {
    if let Some(object) = body.as_object_mut() {
        for key in ["protocol", "api_protocol"] {
            let Some(Value::String(name)) = object.get(key) else {
                continue;
            };
            let protocol = name.parse::<Protocol>().map_err(|_| {
                ApiError::bad_request(format!(
                    "unknown protocol {name:?}: expected openai, anthropic or ollama"
                ))
            })?;
            object.insert(key.to_owned(), to_document(&protocol)?);
        }
    }
    serde_json::from_value(body)
        .map_err(|error| ApiError::bad_request(format!("invalid model: {error}")))
}

/// Checks a model before it is stored: its id, its base URL, its model name, and that a client
/// can be built (which resolves its key's secret).
async fn check_model(state: &AppState, model: &ModelConfig) -> Result<(), ApiError> {
    check_name("model", &model.id)?;
    if model.model_name.trim().is_empty() {
        return Err(ApiError::bad_request(format!(
            "model {:?} needs a model_name",
            model.id
        )));
    }
    if let Some(base_url) = &model.base_url {
        let url = reqwest::Url::parse(base_url).map_err(|error| {
            ApiError::bad_request(format!("invalid base_url {base_url:?}: {error}"))
        })?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(ApiError::bad_request(format!(
                "invalid base_url {base_url:?}: use an http or https URL"
            )));
        }
    }
    let secrets = secret_values(&state.store).await?;
    model.client(&secrets, &state.http)?;
    Ok(())
}

async fn stored_model(store: &Store, id: &str) -> Result<Option<ModelConfig>, ApiError> {
    store
        .config(ConfigKind::Model, id)
        .await?
        .map(|value| {
            serde_json::from_value(value).map_err(|error| {
                ApiError::internal(format!("the stored model {id:?} is unreadable: {error}"))
            })
        })
        .transpose()
}

fn no_model(id: &str) -> ApiError {
    ApiError::not_found(format!("no model is registered as {id:?}"))
}

async fn list_models(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let mut models = Vec::new();
    for (name, value) in state.store.list_config(ConfigKind::Model).await? {
        match serde_json::from_value::<ModelConfig>(value) {
            Ok(model) => models.push(model),
            Err(error) => tracing::warn!(model = %name, "unreadable stored model: {error}"),
        }
    }
    models.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(Json(json!({ "models": models })))
}

async fn create_model(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    let model = parse_model(body)?;
    check_model(&state, &model).await?;
    let _guard = WRITE_LOCK.lock().await;
    if state
        .store
        .config(ConfigKind::Model, &model.id)
        .await?
        .is_some()
    {
        return Err(ApiError::conflict(format!(
            "a model is already registered as {:?}",
            model.id
        )));
    }
    state
        .store
        .put_config(ConfigKind::Model, &model.id, &to_document(&model)?)
        .await?;
    state.reload_runtime().await?;
    Ok(created(model))
}

async fn get_model(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ModelConfig>, ApiError> {
    check_name("model", &id)?;
    stored_model(&state.store, &id)
        .await?
        .map(Json)
        .ok_or_else(|| no_model(&id))
}

async fn replace_model(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<ModelConfig>, ApiError> {
    check_name("model", &id)?;
    let model = parse_model(body)?;
    check_model(&state, &model).await?;
    let _guard = WRITE_LOCK.lock().await;
    if state.store.config(ConfigKind::Model, &id).await?.is_none() {
        return Err(no_model(&id));
    }
    let renamed = model.id != id;
    if renamed
        && state
            .store
            .config(ConfigKind::Model, &model.id)
            .await?
            .is_some()
    {
        return Err(ApiError::conflict(format!(
            "cannot rename {id:?}: a model is already registered as {:?}",
            model.id
        )));
    }
    state
        .store
        .put_config(ConfigKind::Model, &model.id, &to_document(&model)?)
        .await?;
    if renamed {
        state.store.delete_config(ConfigKind::Model, &id).await?;
    }
    state.reload_runtime().await?;
    Ok(Json(model))
}

async fn delete_model(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    check_name("model", &id)?;
    let _guard = WRITE_LOCK.lock().await;
    if !state.store.delete_config(ConfigKind::Model, &id).await? {
        return Err(no_model(&id));
    }
    state.reload_runtime().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sends `ping` with a one-token limit through the runtime's client for the model. A provider
/// that fails is reported in the body (`ok: false` with the error), not as a server error.
async fn test_model(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    check_name("model", &id)?;
    let client = match state.sessions.runtime().model_client(&id) {
        Ok(client) => client,
        Err(_) => {
            // Not in the runtime: unknown, or stored but unusable (say why), or stored by a
            // writer whose reload this runtime predates.
            let model = stored_model(&state.store, &id)
                .await?
                .ok_or_else(|| no_model(&id))?;
            let secrets = secret_values(&state.store).await?;
            model.client(&secrets, &state.http)?;
            state.reload_runtime().await?;
            state.sessions.runtime().model_client(&id)?
        }
    };
    let request = ModelRequest::new(vec![Message::user("ping")]).with_params(GenerationParams {
        max_tokens: Some(1),
        ..GenerationParams::default()
    });
    let cancel = state.shutdown.child_token();
    let started = Instant::now();
    let outcome =
        tokio::time::timeout(MODEL_TEST_TIMEOUT, client.complete(request, cancel.clone())).await;
    let latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let body = match outcome {
        Ok(Ok(response)) => json!({"ok": true, "latency_ms": latency_ms, "model": response.model}),
        Ok(Err(error)) => json!({"ok": false, "latency_ms": latency_ms, "error": error.info()}),
        Err(_) => {
            cancel.cancel();
            let error = LlmError::Timeout {
                kind: TimeoutKind::Total,
                after: MODEL_TEST_TIMEOUT,
            };
            json!({"ok": false, "latency_ms": latency_ms, "error": error.info()})
        }
    };
    Ok(Json(body))
}

// --- tools ---

/// A tool as listed.
#[derive(Debug, Clone, Serialize)]
struct ToolSummary {
    name: String,
    description: String,
    parameters: Value,
    kind: &'static str,
    idempotent: bool,
}

impl ToolSummary {
    fn of_definition(definition: &ToolDefinition) -> Self {
        match definition {
            ToolDefinition::Http {
                name,
                description,
                parameters,
                idempotent,
                ..
            } => Self {
                name: name.clone(),
                description: description.clone(),
                parameters: parameters.clone(),
                kind: "http",
                idempotent: *idempotent,
            },
            ToolDefinition::Command {
                name,
                description,
                parameters,
                idempotent,
                ..
            } => Self {
                name: name.clone(),
                description: description.clone(),
                parameters: parameters.clone(),
                kind: "command",
                idempotent: *idempotent,
            },
        }
    }

    fn of_builtin(tool: &dyn agentry_core::tool::Tool) -> Self {
        let spec = tool.spec();
        Self {
            name: spec.name.clone(),
            description: spec.description.clone(),
            parameters: spec.parameters.clone(),
            kind: "builtin",
            idempotent: tool.idempotent(),
        }
    }
}

fn builtin_is_fixed(name: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{name:?} is a built-in tool: it cannot be changed or deleted"
    ))
}

fn no_tool(name: &str) -> ApiError {
    ApiError::not_found(format!("no configured tool is named {name:?}"))
}

/// Checks a definition by building it (secrets resolved from the store) and registering it in a
/// scratch registry, which checks its name and compiles its argument schema.
async fn check_tool(state: &AppState, definition: &ToolDefinition) -> Result<(), ApiError> {
    let name = definition.name();
    if RESERVED_TOOL_NAMES.contains(&name) {
        return Err(ApiError::bad_request(format!(
            "{name:?} is reserved (it is a route under /v1/tools/): choose another name"
        )));
    }
    let secrets: Arc<dyn SecretResolver> =
        Arc::new(StaticSecrets(secret_values(&state.store).await?));
    let tool = definition
        .clone()
        .build(&state.http, secrets)
        .map_err(|error| ApiError::bad_request(error.to_string()))?;
    ToolRegistry::new()
        .register_arc(tool)
        .map_err(|error| ApiError::bad_request(error.to_string()))
}

async fn stored_tool(store: &Store, name: &str) -> Result<Option<ToolDefinition>, ApiError> {
    store
        .config(ConfigKind::Tool, name)
        .await?
        .map(|value| {
            serde_json::from_value(value).map_err(|error| {
                ApiError::internal(format!("the stored tool {name:?} is unreadable: {error}"))
            })
        })
        .transpose()
}

async fn list_tools(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let mut tools: Vec<ToolSummary> = builtin_tools()
        .iter()
        .map(|tool| ToolSummary::of_builtin(tool.as_ref()))
        .collect();
    for (name, value) in state.store.list_config(ConfigKind::Tool).await? {
        match serde_json::from_value::<ToolDefinition>(value) {
            Ok(definition) => tools.push(ToolSummary::of_definition(&definition)),
            Err(error) => tracing::warn!(tool = %name, "unreadable stored tool: {error}"),
        }
    }
    tools.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(json!({ "tools": tools })))
}

/// A built-in tool's summary, or a configured tool's definition.
async fn get_tool(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    if let Some(tool) = builtin(&name) {
        return Ok(Json(to_document(&ToolSummary::of_builtin(tool.as_ref()))?));
    }
    check_name("tool", &name)?;
    let definition = stored_tool(&state.store, &name)
        .await?
        .ok_or_else(|| no_tool(&name))?;
    Ok(Json(to_document(&definition)?))
}

async fn create_tool(
    State(state): State<AppState>,
    ApiJson(definition): ApiJson<ToolDefinition>,
) -> Result<Response, ApiError> {
    check_tool(&state, &definition).await?;
    let name = definition.name().to_owned();
    let _guard = WRITE_LOCK.lock().await;
    if builtin(&name).is_some() || state.store.config(ConfigKind::Tool, &name).await?.is_some() {
        return Err(ApiError::conflict(format!(
            "a tool named {name:?} already exists"
        )));
    }
    state
        .store
        .put_config(ConfigKind::Tool, &name, &to_document(&definition)?)
        .await?;
    state.reload_runtime().await?;
    Ok(created(definition))
}

async fn replace_tool(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(definition): ApiJson<ToolDefinition>,
) -> Result<Json<ToolDefinition>, ApiError> {
    if builtin(&name).is_some() {
        return Err(builtin_is_fixed(&name));
    }
    check_name("tool", &name)?;
    check_tool(&state, &definition).await?;
    let new_name = definition.name().to_owned();
    let _guard = WRITE_LOCK.lock().await;
    if state.store.config(ConfigKind::Tool, &name).await?.is_none() {
        return Err(no_tool(&name));
    }
    let renamed = new_name != name;
    if renamed
        && (builtin(&new_name).is_some()
            || state
                .store
                .config(ConfigKind::Tool, &new_name)
                .await?
                .is_some())
    {
        return Err(ApiError::conflict(format!(
            "cannot rename {name:?}: a tool named {new_name:?} already exists"
        )));
    }
    state
        .store
        .put_config(ConfigKind::Tool, &new_name, &to_document(&definition)?)
        .await?;
    if renamed {
        state.store.delete_config(ConfigKind::Tool, &name).await?;
    }
    state.reload_runtime().await?;
    Ok(Json(definition))
}

async fn delete_tool(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if builtin(&name).is_some() {
        return Err(builtin_is_fixed(&name));
    }
    check_name("tool", &name)?;
    let _guard = WRITE_LOCK.lock().await;
    if !state.store.delete_config(ConfigKind::Tool, &name).await? {
        return Err(no_tool(&name));
    }
    state.reload_runtime().await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The body of `DELETE /v1/tools/batch`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteTools {
    ids: Vec<String>,
}

/// Deletes several configured tools. Every name is checked first (a built-in or an invalid
/// name refuses the whole batch, deleting nothing); names with no tool are listed as missing.
async fn delete_tools(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<DeleteTools>,
) -> Result<Json<Value>, ApiError> {
    let mut seen = BTreeSet::new();
    let names: Vec<String> = body
        .ids
        .into_iter()
        .filter(|name| seen.insert(name.clone()))
        .collect();
    for name in &names {
        if builtin(name).is_some() {
            return Err(builtin_is_fixed(name));
        }
        check_name("tool", name)?;
    }
    let _guard = WRITE_LOCK.lock().await;
    let mut deleted = Vec::new();
    let mut missing = Vec::new();
    for name in names {
        if state.store.delete_config(ConfigKind::Tool, &name).await? {
            deleted.push(name);
        } else {
            missing.push(name);
        }
    }
    if !deleted.is_empty() {
        state.reload_runtime().await?;
    }
    Ok(Json(json!({"deleted": deleted, "missing": missing})))
}

/// The body of `POST /v1/tools/call`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallTool {
    #[serde(alias = "name")]
    tool_id: String,
    #[serde(default = "empty_object")]
    arguments: Value,
    #[serde(default)]
    format: ResultFormat,
}

fn empty_object() -> Value {
    json!({})
}

/// The start of the message `format_output` gives a result that holds no JSON.
const NOT_JSON: &str = "the tool's result is not JSON";

/// Runs a tool directly. An unknown tool is 404, invalid arguments 400, a result that is not
/// JSON when JSON was asked for 400, a failing tool 502, a timeout 504.
async fn call_tool(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CallTool>,
) -> Result<Json<Value>, ApiError> {
    let runtime = state.sessions.runtime();
    match runtime
        .call_tool(&body.tool_id, body.arguments, body.format)
        .await
    {
        Ok(result) => Ok(Json(json!({ "result": result }))),
        Err(ToolError::Failed(message))
            if body.format == ResultFormat::Json && message.starts_with(NOT_JSON) =>
        {
            Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "result_not_json",
                message,
            ))
        }
        Err(error) => Err(error.into()),
    }
}

// --- prompt templates ---

fn no_template(name: &str) -> ApiError {
    ApiError::not_found(format!("no template is named {name:?}"))
}

/// Compiles a template in a scratch store (which also checks its name).
fn compile_template(template: &TemplateConfig) -> Result<TemplateStore, ApiError> {
    let mut scratch = TemplateStore::new();
    scratch
        .add(&template.name, &template.template)
        .map_err(|error| ApiError::bad_request(error.to_string()))?;
    Ok(scratch)
}

async fn stored_template(store: &Store, name: &str) -> Result<Option<TemplateConfig>, ApiError> {
    store
        .config(ConfigKind::Template, name)
        .await?
        .map(|value| {
            serde_json::from_value(value).map_err(|error| {
                ApiError::internal(format!(
                    "the stored template {name:?} is unreadable: {error}"
                ))
            })
        })
        .transpose()
}

async fn list_templates(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let mut templates = Vec::new();
    for (name, value) in state.store.list_config(ConfigKind::Template).await? {
        match serde_json::from_value::<TemplateConfig>(value) {
            Ok(template) => templates.push(template),
            Err(error) => tracing::warn!(template = %name, "unreadable stored template: {error}"),
        }
    }
    templates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(json!({ "templates": templates })))
}

async fn create_template(
    State(state): State<AppState>,
    ApiJson(template): ApiJson<TemplateConfig>,
) -> Result<Response, ApiError> {
    compile_template(&template)?;
    let _guard = WRITE_LOCK.lock().await;
    if state
        .store
        .config(ConfigKind::Template, &template.name)
        .await?
        .is_some()
    {
        return Err(ApiError::conflict(format!(
            "a template named {:?} already exists",
            template.name
        )));
    }
    state
        .store
        .put_config(
            ConfigKind::Template,
            &template.name,
            &to_document(&template)?,
        )
        .await?;
    state.reload_runtime().await?;
    Ok(created(template))
}

async fn get_template(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<TemplateConfig>, ApiError> {
    check_name("template", &name)?;
    stored_template(&state.store, &name)
        .await?
        .map(Json)
        .ok_or_else(|| no_template(&name))
}

async fn replace_template(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(template): ApiJson<TemplateConfig>,
) -> Result<Json<TemplateConfig>, ApiError> {
    check_name("template", &name)?;
    compile_template(&template)?;
    let _guard = WRITE_LOCK.lock().await;
    if state
        .store
        .config(ConfigKind::Template, &name)
        .await?
        .is_none()
    {
        return Err(no_template(&name));
    }
    let renamed = template.name != name;
    if renamed
        && state
            .store
            .config(ConfigKind::Template, &template.name)
            .await?
            .is_some()
    {
        return Err(ApiError::conflict(format!(
            "cannot rename {name:?}: a template named {:?} already exists",
            template.name
        )));
    }
    state
        .store
        .put_config(
            ConfigKind::Template,
            &template.name,
            &to_document(&template)?,
        )
        .await?;
    if renamed {
        state
            .store
            .delete_config(ConfigKind::Template, &name)
            .await?;
    }
    state.reload_runtime().await?;
    Ok(Json(template))
}

async fn delete_template(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    check_name("template", &name)?;
    let _guard = WRITE_LOCK.lock().await;
    if !state
        .store
        .delete_config(ConfigKind::Template, &name)
        .await?
    {
        return Err(no_template(&name));
    }
    state.reload_runtime().await?;
    Ok(StatusCode::NO_CONTENT)
}

async fn template_variables(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    check_name("template", &name)?;
    let template = stored_template(&state.store, &name)
        .await?
        .ok_or_else(|| no_template(&name))?;
    let variables = compile_template(&template)?
        .variables(&template.name)
        .map_err(|error| ApiError::internal(error.to_string()))?;
    Ok(Json(json!({ "variables": variables })))
}

// --- secrets ---

/// The body of `POST /v1/env`: one secret (`name`, `value`) or several (`vars`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SetSecrets {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    vars: Option<BTreeMap<String, String>>,
}

fn check_secret(name: &str, value: &str) -> Result<(), ApiError> {
    check_name("secret", name)?;
    if value.is_empty() {
        return Err(ApiError::bad_request(format!(
            "secret {name:?} needs a non-empty value"
        )));
    }
    Ok(())
}

async fn list_secrets(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let secrets = state.store.list_secrets().await?;
    Ok(Json(json!({ "secrets": secrets })))
}

/// Sets one secret (204) or several (200 with the names set). Every name and value is checked
/// before any is written.
async fn set_secrets(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SetSecrets>,
) -> Result<Response, ApiError> {
    let (pairs, single) = match body {
        SetSecrets {
            name: Some(name),
            value: Some(value),
            vars: None,
        } => (vec![(name, value)], true),
        SetSecrets {
            name: None,
            value: None,
            vars: Some(vars),
        } => {
            if vars.is_empty() {
                return Err(ApiError::bad_request("\"vars\" holds no secret"));
            }
            (vars.into_iter().collect::<Vec<_>>(), false)
        }
        _ => {
            return Err(ApiError::bad_request(
                "give either \"name\" and \"value\", or \"vars\": {\"NAME\": \"value\", …}",
            ));
        }
    };
    for (name, value) in &pairs {
        check_secret(name, value)?;
    }
    let _guard = WRITE_LOCK.lock().await;
    for (name, value) in &pairs {
        state.store.put_secret(name, value).await?;
    }
    state.reload_runtime().await?;
    if single {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        let names: Vec<&String> = pairs.iter().map(|(name, _)| name).collect();
        Ok(Json(json!({ "set": names })).into_response())
    }
}

async fn delete_secret(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    check_name("secret", &name)?;
    let _guard = WRITE_LOCK.lock().await;
    if !state.store.delete_secret(&name).await? {
        return Err(ApiError::not_found(format!("no secret is named {name:?}")));
    }
    state.reload_runtime().await?;
    Ok(StatusCode::NO_CONTENT)
}
