//! The catalogue of what runs may use — models, tools and prompt templates — and the checks each
//! passes before it is saved: a model's id, URL and client (its key's secret resolved), a tool
//! built and registered in a scratch registry (refused with a typed 403 when it would run a
//! command on the host unasked), a template compiled. The front-ends save them through
//! [`crate::config::ConfigRepo`] once these pass.

use std::sync::Arc;

use serde_json::Value;

use agentry_core::template::TemplateStore;
use agentry_core::tool::{Tool, ToolRegistry};
use agentry_llm::Protocol;
use agentry_store::Store;
use agentry_tools::ToolDefinition;

use crate::App;
use crate::config::{ConfigRepo, check_name, to_document};
use crate::error::{AppError, Failure};
use crate::model_config::ModelConfig;
use crate::runtime::TemplateConfig;

/// Tool names that would collide with the routes under `/v1/tools/`.
pub(crate) const RESERVED_TOOL_NAMES: [&str; 3] = ["call", "batch", "mcp"];

/// Reads a model from a request body. Protocol names are taken in every spelling the model
/// layer accepts (`openai`, `openai-compatible`, `anthropic`, `ollama`, and `a2a` for a remote
/// agent), and an unknown one is named in the error.
pub(crate) fn parse_model(mut body: Value) -> Result<ModelConfig, AppError> {
    if let Some(object) = body.as_object_mut() {
        for key in ["protocol", "api_protocol"] {
            let Some(Value::String(name)) = object.get(key) else {
                continue;
            };
            let protocol = name.parse::<Protocol>().map_err(|_| {
                AppError::bad_request(format!(
                    "unknown protocol {name:?}: expected openai, openai-responses, anthropic, ollama or a2a"
                ))
            })?;
            object.insert(key.to_owned(), to_document(&protocol)?);
        }
    }
    serde_json::from_value(body)
        .map_err(|error| AppError::bad_request(format!("invalid model: {error}")))
}

/// Checks a model before it is stored: its id, its base URL, its model name, its prices, and
/// that a client can be built (which resolves its key's secret).
pub(crate) async fn check_model(app: &App, model: &ModelConfig) -> Result<(), AppError> {
    check_name("model", &model.id)?;
    if model.model_name.trim().is_empty() {
        return Err(AppError::bad_request(format!(
            "model {:?} needs a model_name",
            model.id
        )));
    }
    if model.protocol == Protocol::A2a && model.base_url.is_none() {
        return Err(AppError::bad_request(format!(
            "model {:?} is a remote A2A agent: its `base_url` is the agent's JSON-RPC endpoint \
             (the `url` of its agent card)",
            model.id
        )));
    }
    if let Some(base_url) = &model.base_url {
        let url = reqwest::Url::parse(base_url).map_err(|error| {
            AppError::bad_request(format!("invalid base_url {base_url:?}: {error}"))
        })?;
        if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
            return Err(AppError::bad_request(format!(
                "invalid base_url {base_url:?}: use an http or https URL"
            )));
        }
    }
    if model.labels.len() > 32
        || model.labels.iter().any(|label| {
            label.chars().count() > 64
                || label
                    .chars()
                    .any(|c| c.is_control() || c.is_whitespace() || c == ',')
        })
    {
        return Err(AppError::bad_request(
            "at most 32 labels, each of 1 to 64 characters without spaces or commas",
        ));
    }
    if model.pricing.is_some_and(|pricing| !pricing.is_valid()) {
        return Err(AppError::bad_request(format!(
            "model {:?}: each `pricing` rate is a finite number of dollars per million tokens,              zero or more",
            model.id
        )));
    }
    let secrets = crate::secrets::Secrets::load(&app.parts.store).await?;
    model.client(&secrets, &app.parts.http)?;
    Ok(())
}

/// When `model` is marked default, no other model stays marked (there is one default model).
pub(crate) async fn unmark_other_defaults(
    store: &Store,
    model: &ModelConfig,
) -> Result<(), AppError> {
    if !model.default {
        return Ok(());
    }
    let models = ConfigRepo::<ModelConfig>::new(store);
    for (name, mut other) in models.list().await? {
        if name != model.id && other.default {
            other.default = false;
            models.put(&name, &other).await?;
        }
    }
    Ok(())
}

/// The built-in tool `name` of this app's runs (see [`crate::runtime::builtins`]).
pub(crate) fn builtin_named(app: &App, name: &str) -> Option<Arc<dyn Tool>> {
    crate::runtime::builtins(&app.parts.tools)
        .into_iter()
        .find(|tool| tool.spec().name == name)
}

/// Checks a definition by building it (secrets resolved from the store) and registering it in a
/// scratch registry, which checks its name and compiles its argument schema.
pub(crate) async fn check_tool(app: &App, definition: &ToolDefinition) -> Result<(), AppError> {
    let name = definition.name();
    if RESERVED_TOOL_NAMES.contains(&name) {
        return Err(AppError::bad_request(format!(
            "{name:?} is reserved (it is a route under /v1/tools/): choose another name"
        )));
    }
    // A command tool with nowhere to run but the host, when the operator has not allowed host
    // commands, is refused before anything is saved (a typed 403 naming the setting).
    let sandboxes = app.parts.tools.command_sandboxes();
    if let Some(refusal) =
        definition.host_refusal(sandboxes.is_some(), app.parts.tools.allow_host_commands)
    {
        return Err(AppError::new(
            Failure::Forbidden,
            refusal.code(),
            format!("command tool {name:?}: {refusal}"),
        ));
    }
    let secrets = crate::secrets::Secrets::load(&app.parts.store)
        .await?
        .for_tool(definition)?;
    let tool = definition
        .clone()
        .build_in(
            &app.parts.http,
            Arc::new(secrets),
            sandboxes,
            app.parts.tools.allow_host_commands,
        )
        .map_err(|error| AppError::bad_request(error.to_string()))?;
    ToolRegistry::new()
        .register_arc(tool)
        .map_err(|error| AppError::bad_request(error.to_string()))
}

/// Compiles a template in a scratch store (which also checks its name).
pub(crate) fn compile_template(template: &TemplateConfig) -> Result<TemplateStore, AppError> {
    let mut scratch = TemplateStore::new();
    scratch
        .add(&template.name, &template.template)
        .map_err(|error| AppError::bad_request(error.to_string()))?;
    Ok(scratch)
}
