//! The catalogue as every front-end manages it: models (registered, replaced, deleted, tested
//! with a one-token call), tools (built-in, configured, and the MCP servers'; configured ones
//! created, replaced, deleted, one at a time or in a batch; any of them called directly),
//! prompt templates and secrets, each a typed service of the app (`App::models`,
//! `App::tools`, `App::templates`, `App::secrets`). Each change is checked first
//! ([`crate::catalogue`]) and rebuilds the runtime after.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use agentry_core::tool::{ResultFormat, Tool, ToolError};
use agentry_llm::{GenerationParams, LlmError, ModelRequest, TimeoutKind};
use agentry_mcp::McpToolInfo;
use agentry_tools::ToolDefinition;
use agentry_types::{ErrorInfo, Message};

use crate::App;
use crate::catalogue::{
    builtin_named, check_model, check_tool, compile_template, parse_model, unmark_other_defaults,
};
use crate::config::{ConfigRepo, check_name, to_document};
use crate::error::{AppError, Failure};
use crate::model_config::ModelConfig;
use crate::runtime::TemplateConfig;

/// How long a model test waits for the provider.
pub const MODEL_TEST_TIMEOUT: Duration = Duration::from_secs(15);

/// The start of the message a tool's result that holds no JSON gives when JSON is asked for.
const NOT_JSON: &str = "the tool's result is not JSON";

/// `GET /v1/models`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelList {
    /// The registered models, by id.
    pub models: Vec<ModelConfig>,
}

/// `POST /v1/models/{id}/test`: a provider that fails is reported here, not as an error.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ModelTestOutcome {
    /// Whether the model answered.
    pub ok: bool,
    /// How long it took.
    pub latency_ms: u64,
    /// The model that answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub error: Option<ErrorInfo>,
}

/// A tool as listed.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolInfo {
    /// Its name.
    pub name: String,
    /// What it does.
    pub description: String,
    /// JSON Schema of its arguments.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub parameters: Value,
    /// `builtin`, `http`, `command`, `mcp` or `skill` (a registered skill, `/v1/skills`).
    pub kind: &'static str,
    /// Whether calling it twice with the same arguments is harmless.
    pub idempotent: bool,
    /// What it can do: `read_only`, `writes_files`, `runs_commands`, `network` or `agents`
    /// (absent for a configured tool the runtime could not load).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(nullable = false))]
    pub risk: Option<&'static str>,
    /// Whether it runs on the host, outside any sandbox (such tools ask for approval by default).
    pub runs_on_host: bool,
}

impl ToolInfo {
    /// Fills in the risk of the runtime's tool of this name.
    fn with_risk(mut self, runtime: &agentry_core::Runtime) -> Self {
        if let Some(tool) = runtime.tools().get(&self.name) {
            let risk = tool.risk();
            self.risk = Some(risk.class.as_str());
            self.runs_on_host = risk.host;
        }
        self
    }

    fn of_definition(definition: &ToolDefinition) -> Self {
        let (name, description, parameters, idempotent, kind) = match definition {
            ToolDefinition::Http {
                name,
                description,
                parameters,
                idempotent,
                ..
            } => (name, description, parameters, idempotent, "http"),
            ToolDefinition::Command {
                name,
                description,
                parameters,
                idempotent,
                ..
            } => (name, description, parameters, idempotent, "command"),
        };
        Self {
            name: name.clone(),
            description: description.clone(),
            parameters: parameters.clone(),
            kind,
            idempotent: *idempotent,
            risk: None,
            runs_on_host: false,
        }
    }

    fn of_mcp(info: McpToolInfo) -> Self {
        Self {
            name: info.name,
            description: info.description,
            parameters: info.input_schema,
            kind: "mcp",
            idempotent: info.idempotent,
            risk: None,
            runs_on_host: false,
        }
    }

    fn of_builtin(tool: &dyn Tool) -> Self {
        let spec = tool.spec();
        Self {
            name: spec.name.clone(),
            description: spec.description.clone(),
            parameters: spec.parameters.clone(),
            kind: "builtin",
            idempotent: tool.idempotent(),
            risk: Some(tool.risk().class.as_str()),
            runs_on_host: tool.risk().host,
        }
    }
}

/// `GET /v1/tools`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ToolList {
    /// Built-in and configured tools, by name.
    pub tools: Vec<ToolInfo>,
}

/// `DELETE /v1/tools/batch`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct DeletedTools {
    /// The tools deleted.
    pub deleted: Vec<String>,
    /// Names with no configured tool.
    pub missing: Vec<String>,
}

/// `GET /v1/prompt-templates`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateList {
    /// The templates, by name.
    pub templates: Vec<TemplateConfig>,
}

/// `GET /v1/prompt-templates/{name}/variables`.
#[derive(Debug, Clone, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct TemplateVariables {
    /// The variables the template reads.
    pub variables: BTreeSet<String>,
}

fn no_model(id: &str) -> AppError {
    AppError::not_found(format!("no model is registered as {id:?}"))
}

fn builtin_is_fixed(name: &str) -> AppError {
    AppError::bad_request(format!(
        "{name:?} is a built-in tool: it cannot be changed or deleted"
    ))
}

fn no_tool(name: &str) -> AppError {
    AppError::not_found(format!("no configured tool is named {name:?}"))
}

fn no_template(name: &str) -> AppError {
    AppError::not_found(format!("no template is named {name:?}"))
}

fn check_secret(name: &str, value: &str) -> Result<(), AppError> {
    check_name("secret", name)?;
    if value.is_empty() {
        return Err(AppError::bad_request(format!(
            "secret {name:?} needs a non-empty value"
        )));
    }
    Ok(())
}

/// Refuses a secret only its own endpoint writes: a webhook signing secret (`POST
/// /v1/webhook-secret`) or a workflow trigger's (`POST /v1/workflows/{name}/trigger`).
fn refuse_reserved(name: &str) -> Result<(), AppError> {
    if crate::webhooks::is_reserved_secret(name) {
        return Err(AppError::new(
            crate::error::Failure::Invalid,
            "reserved_secret",
            format!(
                "{name:?} is written only by its own endpoint: `POST /v1/webhook-secret` for \
                 webhook signing secrets, `POST /v1/workflows/{{name}}/trigger` for workflow \
                 triggers"
            ),
        ));
    }
    Ok(())
}

/// The models runs may call: saved, replaced, removed and tried.
pub struct Models<'a> {
    app: &'a App,
}

impl App {
    /// The models runs may call: saved, replaced, removed and tried.
    pub fn models(&self) -> Models<'_> {
        Models { app: self }
    }
}

impl Models<'_> {
    /// The registered models, by id.
    pub async fn list(&self) -> Result<ModelList, AppError> {
        let mut models: Vec<ModelConfig> = ConfigRepo::new(&self.app.parts.store)
            .list()
            .await?
            .into_iter()
            .map(|(_, model)| model)
            .collect();
        models.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(ModelList { models })
    }

    /// Whether a model `id` is registered: the runtime's catalogue (in memory, kept in step
    /// with the store) rather than a read of the store.
    pub fn has(&self, id: &str) -> bool {
        self.app.parts.sessions.runtime().model_client(id).is_ok()
    }

    /// Registers a model, after checking it (id, base URL, model name, and that a client can
    /// be built, which resolves its key's secret).
    pub async fn create(&self, body: Value) -> Result<ModelConfig, AppError> {
        let model = parse_model(body)?;
        check_model(self.app, &model).await?;
        ConfigRepo::new(&self.app.parts.store)
            .create(&model.id, &model)
            .await?;
        unmark_other_defaults(&self.app.parts.store, &model).await?;
        self.app.reload_runtime().await?;
        Ok(model)
    }

    /// A registered model.
    pub async fn get(&self, id: &str) -> Result<ModelConfig, AppError> {
        check_name("model", id)?;
        ConfigRepo::new(&self.app.parts.store)
            .get(id)
            .await?
            .ok_or_else(|| no_model(id))
    }

    /// Replaces a model (renames it if the body's id differs).
    pub async fn replace(&self, id: &str, body: Value) -> Result<ModelConfig, AppError> {
        check_name("model", id)?;
        let model = parse_model(body)?;
        check_model(self.app, &model).await?;
        ConfigRepo::new(&self.app.parts.store)
            .replace(id, &model.id, &model)
            .await?;
        unmark_other_defaults(&self.app.parts.store, &model).await?;
        self.app.reload_runtime().await?;
        Ok(model)
    }

    /// Deletes a model.
    pub async fn delete(&self, id: &str) -> Result<(), AppError> {
        check_name("model", id)?;
        if !ConfigRepo::<ModelConfig>::new(&self.app.parts.store)
            .delete(id)
            .await?
        {
            return Err(no_model(id));
        }
        self.app.reload_runtime().await
    }

    /// Sends `ping` with a one-token limit through the runtime's client for the model. A
    /// provider that fails is reported in the outcome, not as an error.
    pub async fn test(&self, id: &str) -> Result<ModelTestOutcome, AppError> {
        check_name("model", id)?;
        let client = match self.app.parts.sessions.runtime().model_client(id) {
            Ok(client) => client,
            Err(_) => {
                // Not in the runtime: unknown, or stored but unusable (say why), or stored by a
                // writer whose reload this runtime predates.
                let model = self.get(id).await?;
                let secrets = crate::secrets::Secrets::load(&self.app.parts.store).await?;
                model.client(&secrets, &self.app.parts.http)?;
                self.app.reload_runtime().await?;
                self.app.parts.sessions.runtime().model_client(id)?
            }
        };
        let request =
            ModelRequest::new(vec![Message::user("ping")]).with_params(GenerationParams {
                max_tokens: Some(1),
                ..GenerationParams::default()
            });
        let cancel = self.app.parts.shutdown.child_token();
        let started = Instant::now();
        let outcome =
            tokio::time::timeout(MODEL_TEST_TIMEOUT, client.complete(request, cancel.clone()))
                .await;
        let latency_ms = crate::clock::millis(started.elapsed());
        let failed = |error: LlmError| ModelTestOutcome {
            ok: false,
            latency_ms,
            model: None,
            error: Some(error.info()),
        };
        Ok(match outcome {
            Ok(Ok(response)) => ModelTestOutcome {
                ok: true,
                latency_ms,
                model: response.model,
                error: None,
            },
            Ok(Err(error)) => failed(error),
            Err(_) => {
                cancel.cancel();
                failed(LlmError::Timeout {
                    kind: TimeoutKind::Total,
                    after: MODEL_TEST_TIMEOUT,
                })
            }
        })
    }
}

/// The tools runs may use: the built-in ones, the saved HTTP and command tools, and the MCP
/// servers' tools.
pub struct Tools<'a> {
    app: &'a App,
}

impl App {
    /// The tools runs may use: the built-in ones, the saved HTTP and command tools, and the MCP
    /// servers' tools.
    pub fn tools(&self) -> Tools<'_> {
        Tools { app: self }
    }
}

impl Tools<'_> {
    /// The configured tools' definitions (HTTP, command and function tools), by name.
    pub async fn saved(&self) -> Result<Vec<ToolDefinition>, AppError> {
        Ok(ConfigRepo::<ToolDefinition>::new(&self.app.parts.store)
            .list()
            .await?
            .into_iter()
            .map(|(_, definition)| definition)
            .collect())
    }

    /// The configured tool `name`'s definition, if there is one.
    pub async fn saved_one(&self, name: &str) -> Result<Option<ToolDefinition>, AppError> {
        ConfigRepo::<ToolDefinition>::new(&self.app.parts.store)
            .get(name)
            .await
    }

    /// Whether the runtime offers a tool `name` (built-in, configured, skill or MCP).
    pub fn has(&self, name: &str) -> bool {
        self.app
            .parts
            .sessions
            .runtime()
            .tools()
            .get(name)
            .is_some()
    }

    /// The built-in and configured tools, and the tools of the connected MCP servers, by name.
    pub async fn list(&self) -> Result<ToolList, AppError> {
        let mut tools: Vec<ToolInfo> = crate::runtime::builtins(&self.app.parts.tools)
            .iter()
            .map(|tool| ToolInfo::of_builtin(tool.as_ref()))
            .collect();
        for (_, definition) in ConfigRepo::<ToolDefinition>::new(&self.app.parts.store)
            .list()
            .await?
        {
            tools.push(ToolInfo::of_definition(&definition));
        }
        tools.extend(self.app.parts.mcp.tools().into_iter().map(ToolInfo::of_mcp));
        let runtime = self.app.parts.sessions.runtime();
        for (_, skill) in ConfigRepo::<crate::skills::SkillConfig>::new(&self.app.parts.store)
            .list()
            .await?
        {
            if let Some(tool) = runtime.tools().get(&skill.name) {
                tools.push(ToolInfo {
                    kind: "skill",
                    ..ToolInfo::of_builtin(tool.as_ref())
                });
            }
        }
        tools.sort_by(|a, b| a.name.cmp(&b.name));
        let tools = tools
            .into_iter()
            .map(|tool| tool.with_risk(&runtime))
            .collect();
        Ok(ToolList { tools })
    }

    /// A built-in or MCP tool's summary, or a configured tool's definition — for an admin; any
    /// other caller gets a configured tool's summary too, since a definition may carry literal
    /// credentials (HTTP headers, command environments, URLs) only admins may read.
    pub async fn document(
        &self,
        caller: &crate::auth::Principal,
        name: &str,
    ) -> Result<Value, AppError> {
        if let Some(tool) = builtin_named(self.app, name) {
            return to_document(&ToolInfo::of_builtin(tool.as_ref()));
        }
        check_name("tool", name)?;
        if let Some(info) = self
            .app
            .parts
            .mcp
            .tools()
            .into_iter()
            .find(|info| info.name == name)
        {
            return to_document(
                &ToolInfo::of_mcp(info).with_risk(&self.app.parts.sessions.runtime()),
            );
        }
        let definition = ConfigRepo::<ToolDefinition>::new(&self.app.parts.store)
            .get(name)
            .await?
            .ok_or_else(|| no_tool(name))?;
        if caller.is_admin() {
            to_document(&definition)
        } else {
            to_document(
                &ToolInfo::of_definition(&definition).with_risk(&self.app.parts.sessions.runtime()),
            )
        }
    }

    /// Configures a tool, after building it and checking its name and argument schema.
    pub async fn create(&self, definition: &ToolDefinition) -> Result<(), AppError> {
        check_tool(self.app, definition).await?;
        let name = definition.name();
        if builtin_named(self.app, name).is_some() {
            return Err(AppError::conflict(format!(
                "a tool named {name:?} already exists"
            )));
        }
        ConfigRepo::new(&self.app.parts.store)
            .create(name, definition)
            .await?;
        self.app.reload_runtime().await
    }

    /// Replaces a configured tool (renames it if the definition's name differs).
    pub async fn replace(&self, name: &str, definition: &ToolDefinition) -> Result<(), AppError> {
        if builtin_named(self.app, name).is_some() {
            return Err(builtin_is_fixed(name));
        }
        check_name("tool", name)?;
        check_tool(self.app, definition).await?;
        let new_name = definition.name();
        if new_name != name && builtin_named(self.app, new_name).is_some() {
            return Err(AppError::conflict(format!(
                "cannot rename {name:?}: a tool named {new_name:?} already exists"
            )));
        }
        ConfigRepo::new(&self.app.parts.store)
            .replace(name, new_name, definition)
            .await?;
        self.app.reload_runtime().await
    }

    /// Deletes a configured tool.
    pub async fn delete(&self, name: &str) -> Result<(), AppError> {
        let deleted = self.delete_many(vec![name.to_owned()]).await?;
        if deleted.deleted.is_empty() {
            return Err(no_tool(name));
        }
        Ok(())
    }

    /// Deletes several configured tools. Every name is checked first (a built-in or an invalid
    /// name refuses the whole batch, deleting nothing); names with no tool are listed as
    /// missing.
    pub async fn delete_many(&self, names: Vec<String>) -> Result<DeletedTools, AppError> {
        let mut seen = BTreeSet::new();
        let names: Vec<String> = names
            .into_iter()
            .filter(|name| seen.insert(name.clone()))
            .collect();
        for name in &names {
            if builtin_named(self.app, name).is_some() {
                return Err(builtin_is_fixed(name));
            }
            check_name("tool", name)?;
        }
        let repo = ConfigRepo::<ToolDefinition>::new(&self.app.parts.store);
        let mut deleted = Vec::new();
        let mut missing = Vec::new();
        for name in names {
            if repo.delete(&name).await? {
                deleted.push(name);
            } else {
                missing.push(name);
            }
        }
        if !deleted.is_empty() {
            self.app.reload_runtime().await?;
        }
        Ok(DeletedTools { deleted, missing })
    }

    /// Runs a tool directly. A result that is not JSON when JSON was asked for is the
    /// request's fault (`result_not_json`).
    pub async fn call(
        &self,
        name: &str,
        arguments: Value,
        format: ResultFormat,
    ) -> Result<Value, AppError> {
        match self
            .app
            .parts
            .sessions
            .runtime()
            .call_tool(name, arguments, format)
            .await
        {
            Ok(result) => Ok(result),
            Err(ToolError::Failed(message))
                if format == ResultFormat::Json && message.starts_with(NOT_JSON) =>
            {
                Err(AppError::new(Failure::Invalid, "result_not_json", message))
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// The prompt templates: saved, replaced, removed and rendered.
pub struct Templates<'a> {
    app: &'a App,
}

impl App {
    /// The prompt templates: saved, replaced, removed and rendered.
    pub fn templates(&self) -> Templates<'_> {
        Templates { app: self }
    }
}

impl Templates<'_> {
    /// The prompt templates, by name.
    pub async fn list(&self) -> Result<TemplateList, AppError> {
        let mut templates: Vec<TemplateConfig> = ConfigRepo::new(&self.app.parts.store)
            .list()
            .await?
            .into_iter()
            .map(|(_, template)| template)
            .collect();
        templates.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(TemplateList { templates })
    }

    /// Stores a prompt template, after compiling it.
    pub async fn create(&self, template: &TemplateConfig) -> Result<(), AppError> {
        compile_template(template)?;
        ConfigRepo::new(&self.app.parts.store)
            .create(&template.name, template)
            .await?;
        self.app.reload_runtime().await
    }

    /// A prompt template.
    pub async fn get(&self, name: &str) -> Result<TemplateConfig, AppError> {
        check_name("template", name)?;
        ConfigRepo::new(&self.app.parts.store)
            .get(name)
            .await?
            .ok_or_else(|| no_template(name))
    }

    /// Replaces a prompt template (renames it if the new one's name differs).
    pub async fn replace(&self, name: &str, template: &TemplateConfig) -> Result<(), AppError> {
        check_name("template", name)?;
        compile_template(template)?;
        ConfigRepo::new(&self.app.parts.store)
            .replace(name, &template.name, template)
            .await?;
        self.app.reload_runtime().await
    }

    /// Deletes a prompt template.
    pub async fn delete(&self, name: &str) -> Result<(), AppError> {
        check_name("template", name)?;
        if !ConfigRepo::<TemplateConfig>::new(&self.app.parts.store)
            .delete(name)
            .await?
        {
            return Err(no_template(name));
        }
        self.app.reload_runtime().await
    }

    /// The variables a prompt template reads.
    pub async fn variables(&self, name: &str) -> Result<TemplateVariables, AppError> {
        let template = self.get(name).await?;
        let variables = compile_template(&template)?
            .variables(&template.name)
            .map_err(|error| AppError::internal(error.to_string()))?;
        Ok(TemplateVariables { variables })
    }

    /// The prompt template `name` filled with `arguments` (a system prompt named by template),
    /// rendered as a run's templated input is.
    pub fn render(
        &self,
        name: &str,
        arguments: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, AppError> {
        Ok(self
            .app
            .parts
            .sessions
            .runtime()
            .render_template(name, arguments)?)
    }
}

/// The secrets tools and models name: set, bound to hosts and removed; their values never leave.
pub struct Secrets<'a> {
    app: &'a App,
}

impl App {
    /// The secrets tools and models name: set, bound to hosts and removed; their values never
    /// leave.
    pub fn secrets(&self) -> Secrets<'_> {
        Secrets { app: self }
    }
}

impl Secrets<'_> {
    /// The secrets, their values masked.
    pub async fn list(&self) -> Result<Vec<agentry_store::SecretInfo>, AppError> {
        Ok(self.app.parts.store.list_secrets().await?)
    }

    /// Sets secrets: every name and value is checked before any is written.
    pub async fn set(&self, pairs: &[(String, String)]) -> Result<(), AppError> {
        if pairs.is_empty() {
            return Err(AppError::bad_request("no secret to set"));
        }
        for (name, value) in pairs {
            check_secret(name, value)?;
            refuse_reserved(name)?;
        }
        for (name, value) in pairs {
            self.app.parts.store.put_secret(name, value).await?;
        }
        self.app.reload_runtime().await
    }

    /// Sets one secret bound to `hosts` (see [`crate::secrets`]): it will be sent only to
    /// models, HTTP tools and MCP servers whose URL's host matches one of them. The hosts are
    /// sealed with the value, so changing them means writing the value again.
    pub async fn set_bound(
        &self,
        name: &str,
        value: &str,
        hosts: &[String],
    ) -> Result<(), AppError> {
        check_secret(name, value)?;
        refuse_reserved(name)?;
        let hosts = crate::secrets::check_hosts(name, hosts)?;
        self.app
            .parts
            .store
            .put_bound_secret(name, value, &hosts)
            .await?;
        self.app.reload_runtime().await
    }

    /// Deletes a secret.
    pub async fn delete(&self, name: &str) -> Result<(), AppError> {
        check_name("secret", name)?;
        refuse_reserved(name)?;
        if !self.app.parts.store.delete_secret(name).await? {
            return Err(AppError::not_found(format!("no secret is named {name:?}")));
        }
        self.app.reload_runtime().await
    }
}
