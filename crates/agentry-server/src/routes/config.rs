//! Configuration routes: models, tools, prompt templates, secrets.
//!
//! - `/v1/models`: registered models ([`ModelConfig`]), with a connection test that sends a
//!   one-token completion through the runtime's client.
//! - `/v1/tools`: the built-in tools and the ones defined by configuration ([`ToolDefinition`],
//!   HTTP endpoints and commands), a batch delete, and direct calls (`/v1/tools/call`).
//! - `/v1/prompt-templates`: named prompt templates and the variables each reads.
//! - `/v1/skills`: skill folders on the server registered on their own, offered to runs by name.
//! - `/v1/env`: secrets, write-only: listings show a masked form, never a value.
//!
//! Every input is checked before anything is written: a model by building its client, a tool by
//! building it and registering it in a scratch registry, a template by compiling it. Every change
//! rebuilds the runtime, so the next run (and the next direct tool call) sees it at once.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::rejection::{JsonRejection, PathRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Request, State};
use axum::http::StatusCode;
use axum::http::request::Parts;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use agentry_app::catalogue_service::{
    DeletedTools, ModelList, ModelTestOutcome, TemplateList, TemplateVariables, ToolList,
};
use agentry_app::domain::core::tool::ResultFormat;
use agentry_app::domain::tools::ToolDefinition;
use agentry_app::model_config::ModelConfig;
use agentry_app::runtime::TemplateConfig;
use agentry_app::skills::{SkillConfig, SkillList};

use crate::authorization::Caller;
use crate::error::ApiError;
use crate::openapi::{
    BadGateway, BadRequest, Conflict, GatewayTimeout, HostCommandsRefused, JsonBodyErrors,
    ModelPath, NamePath, NotFound, SecretHostNotAllowed, SecretList, SecretsSet, ToolCallOutcome,
    ToolDefinitionSchema,
};
use crate::state::AppState;

/// The configuration routes.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list_models, create_model))
        .routes(routes!(get_model, replace_model, delete_model))
        .routes(routes!(test_model))
        .routes(routes!(list_tools, create_tool))
        .routes(routes!(call_tool))
        .routes(routes!(delete_tools))
        .routes(routes!(get_tool, replace_tool, delete_tool))
        .routes(routes!(list_templates, create_template))
        .routes(routes!(get_template, replace_template, delete_template))
        .routes(routes!(template_variables))
        .routes(routes!(list_skills, register_skill))
        .routes(routes!(delete_skill))
        .routes(routes!(list_secrets, set_secrets))
        .routes(routes!(delete_secret))
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
pub(crate) fn created<T: Serialize>(value: T) -> Response {
    (StatusCode::CREATED, Json(value)).into_response()
}

// --- models ---

/// The registered models.
#[utoipa::path(
    get,
    path = "/v1/models",
    tag = "models",
    operation_id = "list_models",
    responses(
        (status = 200, description = "The models, by id.", body = ModelList),
    )
)]
async fn list_models(State(state): State<AppState>) -> Result<Json<ModelList>, ApiError> {
    Ok(Json(state.app.models().list().await?))
}

/// Registers a model, after checking it (id, base URL, model name, and that a client can be
/// built, which resolves its key's secret).
#[utoipa::path(
    post,
    path = "/v1/models",
    tag = "models",
    operation_id = "create_model",
    request_body = ModelConfig,
    responses(
        (status = 201, description = "Registered.", body = ModelConfig,
         links(
             ("get_model" = (operation_id = "get_model", parameters(("id" = "$response.body#/id")))),
             ("replace_model" = (operation_id = "replace_model", parameters(("id" = "$response.body#/id")))),
             ("delete_model" = (operation_id = "delete_model", parameters(("id" = "$response.body#/id")))),
             ("test_model" = (operation_id = "test_model", parameters(("id" = "$response.body#/id")))),
         )),
        JsonBodyErrors,
        Conflict,
        SecretHostNotAllowed,
    )
)]
async fn create_model(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Response, ApiError> {
    Ok(created(state.app.models().create(body).await?))
}

/// A registered model.
#[utoipa::path(
    get,
    path = "/v1/models/{id}",
    tag = "models",
    operation_id = "get_model",
    params(ModelPath),
    responses(
        (status = 200, description = "The model.", body = ModelConfig),
        BadRequest,
        NotFound,
    )
)]
async fn get_model(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ModelConfig>, ApiError> {
    Ok(Json(state.app.models().get(&id).await?))
}

/// Replaces a model (renames it if the body's id differs).
#[utoipa::path(
    put,
    path = "/v1/models/{id}",
    tag = "models",
    operation_id = "replace_model",
    params(ModelPath),
    request_body = ModelConfig,
    responses(
        (status = 200, description = "Replaced.", body = ModelConfig),
        JsonBodyErrors,
        NotFound,
        Conflict,
        SecretHostNotAllowed,
    )
)]
async fn replace_model(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
    ApiJson(body): ApiJson<Value>,
) -> Result<Json<ModelConfig>, ApiError> {
    Ok(Json(Box::pin(state.app.models().replace(&id, body)).await?))
}

/// Deletes a model.
#[utoipa::path(
    delete,
    path = "/v1/models/{id}",
    tag = "models",
    operation_id = "delete_model",
    params(ModelPath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_model(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.models().delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Sends `ping` with a one-token limit through the runtime's client for the model. A provider
/// that fails is reported in the body (`ok: false` with the error), not as a server error.
#[utoipa::path(
    post,
    path = "/v1/models/{id}/test",
    tag = "models",
    operation_id = "test_model",
    params(ModelPath),
    responses(
        (status = 200, description = "Whether the model answered; a provider failure is reported here.", body = ModelTestOutcome),
        BadRequest,
        NotFound,
        SecretHostNotAllowed,
    )
)]
async fn test_model(
    State(state): State<AppState>,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ModelTestOutcome>, ApiError> {
    Ok(Json(state.app.models().test(&id).await?))
}

// --- tools ---

/// The built-in and configured tools, and the tools of the connected MCP servers.
#[utoipa::path(
    get,
    path = "/v1/tools",
    tag = "tools",
    operation_id = "list_tools",
    responses(
        (status = 200, description = "The tools, by name.", body = ToolList),
    )
)]
async fn list_tools(State(state): State<AppState>) -> Result<Json<ToolList>, ApiError> {
    Ok(Json(state.app.tools().list().await?))
}

/// A built-in or MCP tool's summary, or a configured tool's definition (its summary for a
/// non-admin key: definitions may carry credentials).
#[utoipa::path(
    get,
    path = "/v1/tools/{name}",
    tag = "tools",
    operation_id = "get_tool",
    params(NamePath),
    responses(
        (status = 200, description = "A built-in tool's summary, or a configured tool's definition (its summary for a non-admin key).", body = Object),
        BadRequest,
        NotFound,
    )
)]
async fn get_tool(
    State(state): State<AppState>,
    Caller(caller): Caller,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<Value>, ApiError> {
    Ok(Json(state.app.tools().document(&caller, &name).await?))
}

/// Configures a tool, after building it and checking its name and argument schema.
#[utoipa::path(
    post,
    path = "/v1/tools",
    tag = "tools",
    operation_id = "create_tool",
    request_body = ToolDefinitionSchema,
    responses(
        (status = 201, description = "Configured: the definition.", body = ToolDefinitionSchema,
         links(
             ("get_tool" = (operation_id = "get_tool", parameters(("name" = "$response.body#/name")))),
             ("replace_tool" = (operation_id = "replace_tool", parameters(("name" = "$response.body#/name")))),
             ("delete_tool" = (operation_id = "delete_tool", parameters(("name" = "$response.body#/name")))),
         )),
        JsonBodyErrors,
        Conflict,
        HostCommandsRefused,
    )
)]
async fn create_tool(
    State(state): State<AppState>,
    ApiJson(definition): ApiJson<ToolDefinition>,
) -> Result<Response, ApiError> {
    state.app.tools().create(&definition).await?;
    Ok(created(definition))
}

/// Replaces a configured tool (renames it if the body's name differs).
#[utoipa::path(
    put,
    path = "/v1/tools/{name}",
    tag = "tools",
    operation_id = "replace_tool",
    params(NamePath),
    request_body = ToolDefinitionSchema,
    responses(
        (status = 200, description = "Replaced: the definition.", body = ToolDefinitionSchema),
        JsonBodyErrors,
        NotFound,
        Conflict,
        HostCommandsRefused,
    )
)]
async fn replace_tool(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(definition): ApiJson<ToolDefinition>,
) -> Result<Json<ToolDefinition>, ApiError> {
    Box::pin(state.app.tools().replace(&name, &definition)).await?;
    Ok(Json(definition))
}

/// Deletes a configured tool.
#[utoipa::path(
    delete,
    path = "/v1/tools/{name}",
    tag = "tools",
    operation_id = "delete_tool",
    params(NamePath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_tool(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.tools().delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The body of `DELETE /v1/tools/batch`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct DeleteTools {
    /// The names of the tools to delete.
    ids: Vec<String>,
}

/// Deletes several configured tools. Every name is checked first (a built-in or an invalid
/// name refuses the whole batch, deleting nothing); names with no tool are listed as missing.
#[utoipa::path(
    delete,
    path = "/v1/tools/batch",
    tag = "tools",
    operation_id = "delete_tools",
    request_body = DeleteTools,
    responses(
        (status = 200, description = "What was deleted, and the names with no tool.", body = DeletedTools),
        JsonBodyErrors,
    )
)]
async fn delete_tools(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<DeleteTools>,
) -> Result<Json<DeletedTools>, ApiError> {
    Ok(Json(state.app.tools().delete_many(body.ids).await?))
}

/// The body of `POST /v1/tools/call`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct CallTool {
    /// The tool's name (also accepted as `name`).
    #[serde(alias = "name")]
    tool_id: String,
    /// Its arguments (default `{}`).
    #[serde(default = "empty_object")]
    #[schema(value_type = Object)]
    arguments: Value,
    /// `text` (the result's text as one string, the default) or `json` (parsed).
    #[serde(default)]
    #[schema(value_type = crate::openapi::ResultFormatName)]
    format: ResultFormat,
}

fn empty_object() -> Value {
    json!({})
}

/// Runs a tool directly. An unknown tool is 404, invalid arguments 400, a result that is not
/// JSON when JSON was asked for 400, a failing tool 502, a timeout 504.
#[utoipa::path(
    post,
    path = "/v1/tools/call",
    tag = "tools",
    operation_id = "call_tool",
    request_body = CallTool,
    responses(
        (status = 200, description = "The result.", body = ToolCallOutcome),
        JsonBodyErrors,
        NotFound,
        BadGateway,
        GatewayTimeout,
    )
)]
async fn call_tool(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<CallTool>,
) -> Result<Json<Value>, ApiError> {
    let result = state
        .app
        .tools()
        .call(&body.tool_id, body.arguments, body.format)
        .await?;
    Ok(Json(json!({ "result": result })))
}

// --- skills ---

/// The registered skills.
#[utoipa::path(
    get,
    path = "/v1/skills",
    tag = "skills",
    operation_id = "list_skills",
    responses(
        (status = 200, description = "The registered skills, by name.", body = SkillList),
    )
)]
async fn list_skills(State(state): State<AppState>) -> Result<Json<SkillList>, ApiError> {
    Ok(Json(state.app.skills().list().await?))
}

/// A skill folder to register.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SkillBody {
    /// The folder holding `SKILL.md`, inside the server's skill roots (`<data folder>/skills`
    /// or a `--skill-root`).
    #[schema(min_length = 1, max_length = 4096)]
    path: String,
}

/// Registers a skill folder: its `SKILL.md` names and describes it, and runs are offered it by
/// that name (a skill of the same name is replaced).
#[utoipa::path(
    post,
    path = "/v1/skills",
    tag = "skills",
    operation_id = "register_skill",
    request_body = SkillBody,
    responses(
        (status = 201, description = "Registered.", body = SkillConfig,
         links(("delete_skill" = (operation_id = "delete_skill", parameters(("name" = "$response.body#/name")))))),
        (status = 200, description = "Registered again, replacing the skill of that name.", body = SkillConfig),
        JsonBodyErrors,
        Conflict,
    )
)]
async fn register_skill(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SkillBody>,
) -> Result<Response, ApiError> {
    let registered = state.app.skills().register(&body.path).await?;
    Ok(if registered.replaced {
        Json(registered.skill).into_response()
    } else {
        created(registered.skill)
    })
}

/// Unregisters a skill (its folder stays).
#[utoipa::path(
    delete,
    path = "/v1/skills/{name}",
    tag = "skills",
    operation_id = "delete_skill",
    params(NamePath),
    responses(
        (status = 204, description = "Unregistered."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_skill(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.skills().delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

// --- prompt templates ---

/// The prompt templates.
#[utoipa::path(
    get,
    path = "/v1/prompt-templates",
    tag = "prompt-templates",
    operation_id = "list_templates",
    responses(
        (status = 200, description = "The templates, by name.", body = TemplateList),
    )
)]
async fn list_templates(State(state): State<AppState>) -> Result<Json<TemplateList>, ApiError> {
    Ok(Json(state.app.templates().list().await?))
}

/// Stores a prompt template, after compiling it.
#[utoipa::path(
    post,
    path = "/v1/prompt-templates",
    tag = "prompt-templates",
    operation_id = "create_template",
    request_body = TemplateConfig,
    responses(
        (status = 201, description = "Stored.", body = TemplateConfig,
         links(
             ("get_template" = (operation_id = "get_template", parameters(("name" = "$response.body#/name")))),
             ("replace_template" = (operation_id = "replace_template", parameters(("name" = "$response.body#/name")))),
             ("delete_template" = (operation_id = "delete_template", parameters(("name" = "$response.body#/name")))),
             ("template_variables" = (operation_id = "template_variables", parameters(("name" = "$response.body#/name")))),
         )),
        JsonBodyErrors,
        Conflict,
    )
)]
async fn create_template(
    State(state): State<AppState>,
    ApiJson(template): ApiJson<TemplateConfig>,
) -> Result<Response, ApiError> {
    state.app.templates().create(&template).await?;
    Ok(created(template))
}

/// A prompt template.
#[utoipa::path(
    get,
    path = "/v1/prompt-templates/{name}",
    tag = "prompt-templates",
    operation_id = "get_template",
    params(NamePath),
    responses(
        (status = 200, description = "The template.", body = TemplateConfig),
        BadRequest,
        NotFound,
    )
)]
async fn get_template(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<TemplateConfig>, ApiError> {
    Ok(Json(state.app.templates().get(&name).await?))
}

/// Replaces a prompt template (renames it if the body's name differs).
#[utoipa::path(
    put,
    path = "/v1/prompt-templates/{name}",
    tag = "prompt-templates",
    operation_id = "replace_template",
    params(NamePath),
    request_body = TemplateConfig,
    responses(
        (status = 200, description = "Replaced.", body = TemplateConfig),
        JsonBodyErrors,
        NotFound,
        Conflict,
    )
)]
async fn replace_template(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
    ApiJson(template): ApiJson<TemplateConfig>,
) -> Result<Json<TemplateConfig>, ApiError> {
    Box::pin(state.app.templates().replace(&name, &template)).await?;
    Ok(Json(template))
}

/// Deletes a prompt template.
#[utoipa::path(
    delete,
    path = "/v1/prompt-templates/{name}",
    tag = "prompt-templates",
    operation_id = "delete_template",
    params(NamePath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_template(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.templates().delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// The variables a prompt template reads.
#[utoipa::path(
    get,
    path = "/v1/prompt-templates/{name}/variables",
    tag = "prompt-templates",
    operation_id = "template_variables",
    params(NamePath),
    responses(
        (status = 200, description = "The variables.", body = TemplateVariables),
        BadRequest,
        NotFound,
    )
)]
async fn template_variables(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<Json<TemplateVariables>, ApiError> {
    Ok(Json(state.app.templates().variables(&name).await?))
}

// --- secrets ---

/// The body of `POST /v1/env`: one secret (`name`, `value`, and optionally the `hosts` it is
/// bound to) or several (`vars`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
struct SetSecrets {
    /// One secret's name.
    #[serde(default)]
    name: Option<String>,
    /// One secret's value.
    #[serde(default)]
    value: Option<String>,
    /// The hosts this one secret may be sent to (`api.openai.com`, `*.example.com`,
    /// `127.0.0.1`): a model, HTTP tool or MCP server whose URL names another host cannot use
    /// it, and no process gets it. Sealed with the value; absent, the secret goes wherever it
    /// is named.
    #[serde(default)]
    #[schema(max_items = 16)]
    hosts: Option<Vec<String>>,
    /// Several secrets: `{"NAME": "value", …}`.
    #[serde(default)]
    vars: Option<BTreeMap<String, String>>,
}

/// The secrets, masked: never a value.
#[utoipa::path(
    get,
    path = "/v1/env",
    tag = "secrets",
    operation_id = "list_secrets",
    responses(
        (status = 200, description = "The secrets.", body = SecretList),
    )
)]
async fn list_secrets(State(state): State<AppState>) -> Result<Json<Value>, ApiError> {
    let secrets = state.app.secrets().list().await?;
    Ok(Json(json!({ "secrets": secrets })))
}

/// Sets one secret (204) or several (200 with the names set). Every name and value is checked
/// before any is written.
#[utoipa::path(
    post,
    path = "/v1/env",
    tag = "secrets",
    operation_id = "set_secrets",
    request_body = SetSecrets,
    responses(
        (status = 200, description = "Several secrets set (`vars`): their names.", body = SecretsSet),
        (status = 204, description = "One secret set (`name` and `value`)."),
        JsonBodyErrors,
    )
)]
async fn set_secrets(
    State(state): State<AppState>,
    ApiJson(body): ApiJson<SetSecrets>,
) -> Result<Response, ApiError> {
    let (pairs, single) = match body {
        SetSecrets {
            name: Some(name),
            value: Some(value),
            hosts: Some(hosts),
            vars: None,
        } => {
            state.app.secrets().set_bound(&name, &value, &hosts).await?;
            return Ok(StatusCode::NO_CONTENT.into_response());
        }
        SetSecrets {
            name: Some(name),
            value: Some(value),
            hosts: None,
            vars: None,
        } => (vec![(name, value)], true),
        SetSecrets {
            name: None,
            value: None,
            hosts: None,
            vars: Some(vars),
        } => {
            if vars.is_empty() {
                return Err(ApiError::bad_request("\"vars\" holds no secret"));
            }
            (vars.into_iter().collect::<Vec<_>>(), false)
        }
        _ => {
            return Err(ApiError::bad_request(
                "give either \"name\" and \"value\" (and optionally \"hosts\"), or \"vars\": \
                 {\"NAME\": \"value\", …}",
            ));
        }
    };
    state.app.secrets().set(&pairs).await?;
    if single {
        Ok(StatusCode::NO_CONTENT.into_response())
    } else {
        let names: Vec<&String> = pairs.iter().map(|(name, _)| name).collect();
        Ok(Json(json!({ "set": names })).into_response())
    }
}

/// Deletes a secret.
#[utoipa::path(
    delete,
    path = "/v1/env/{name}",
    tag = "secrets",
    operation_id = "delete_secret",
    params(NamePath),
    responses(
        (status = 204, description = "Deleted."),
        BadRequest,
        NotFound,
    )
)]
async fn delete_secret(
    State(state): State<AppState>,
    ApiPath(name): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    state.app.secrets().delete(&name).await?;
    Ok(StatusCode::NO_CONTENT)
}
