//! The seed's tool registration: a `function` tool is a Python function in a file
//! (`function_file_path` + `function_name`). Agentry runs it out of process, as a command tool
//! (`python3` with a small runner): in the session's sandbox when sandboxes are on, on the host
//! only when the operator allows host commands. The file is read once, when the tool is saved
//! (its text travels with the tool, so the sandbox needs no view of the host's folder); saving
//! it again picks up changes. The runner executes the file as a module, calls the function with
//! the call's arguments as keyword arguments and writes `str(result)`, as the seed does; an
//! exception fails the call with its message.

use std::path::Path;

use serde_json::{Map, Value, json};

use agentry_app::domain::tools::ToolDefinition;

use agentry_app::App;
use agentry_app::AppError;

/// The largest function file accepted (its text is passed on the command line, which Linux caps
/// at 128 KiB per argument).
pub const MAX_FUNCTION_FILE_BYTES: usize = 100 * 1024;

/// The runner: `python3 -c RUNNER <function> <source> <path>`, arguments as JSON on stdin.
const RUNNER: &str = r#"import json, sys, types
name, source, path = sys.argv[1], sys.argv[2], sys.argv[3]
module = types.ModuleType("agentry_function")
module.__file__ = path
exec(compile(source, path, "exec"), module.__dict__)
function = getattr(module, name, None)
if not callable(function):
    sys.exit("the file defines no function " + repr(name))
arguments = json.loads(sys.stdin.read() or "{}")
result = function(**arguments)
sys.stdout.write("" if result is None else str(result))
"#;

const TOOL_FIELDS: &[&str] = &[
    "tool_id",
    "tool_type",
    "name",
    "description",
    "parameters",
    "function_file_path",
    "function_name",
    "builtin",
];

/// A function file's text, checked: an absolute path to a regular UTF-8 file of at most
/// [`MAX_FUNCTION_FILE_BYTES`] that defines `function` at its top level.
fn function_source(path: &str, function: &str) -> Result<String, AppError> {
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err(AppError::bad_request(
            "`function_file_path` must be an absolute path",
        ));
    }
    if path.extension().and_then(|e| e.to_str()) != Some("py") {
        return Err(AppError::bad_request(
            "`function_file_path` must name a .py file",
        ));
    }
    let valid_name = !function.is_empty()
        && function.len() <= 128
        && !function.starts_with(|c: char| c.is_ascii_digit())
        && function
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !valid_name {
        return Err(AppError::bad_request(
            "`function_name` must be a Python identifier",
        ));
    }
    let metadata = std::fs::metadata(path).map_err(|error| {
        AppError::bad_request(format!("cannot read {}: {error}", path.display()))
    })?;
    if !metadata.is_file() {
        return Err(AppError::bad_request(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    if metadata.len() > MAX_FUNCTION_FILE_BYTES as u64 {
        return Err(AppError::bad_request(format!(
            "{} is larger than {MAX_FUNCTION_FILE_BYTES} bytes",
            path.display()
        )));
    }
    let source = std::fs::read_to_string(path).map_err(|error| {
        AppError::bad_request(format!(
            "cannot read {} as UTF-8 text: {error}",
            path.display()
        ))
    })?;
    if source.contains('\0') {
        return Err(AppError::bad_request("the function file holds a NUL byte"));
    }
    let defines = source.lines().any(|line| {
        let line = line.strip_prefix("async ").unwrap_or(line);
        line.strip_prefix("def ")
            .and_then(|rest| rest.trim_start().strip_prefix(function))
            .is_some_and(|rest| rest.trim_start().starts_with('('))
    });
    if !defines {
        return Err(AppError::bad_request(format!(
            "{} defines no top-level function {function:?}",
            path.display()
        )));
    }
    Ok(source)
}

/// The command tool that runs `function` from the file at `path`.
fn function_tool(
    name: &str,
    description: &str,
    parameters: Value,
    path: &str,
    function: &str,
) -> Result<ToolDefinition, AppError> {
    let source = function_source(path, function)?;
    serde_json::from_value(json!({
        "kind": "command",
        "name": name,
        "description": description,
        "parameters": parameters,
        "program": "python3",
        "args": ["-c", RUNNER, function, source, path],
    }))
    .map_err(|error| AppError::bad_request(format!("invalid tool: {error}")))
}

fn string<'a>(body: &'a Map<String, Value>, field: &str) -> Result<&'a str, AppError> {
    match body.get(field) {
        Some(Value::String(text)) if !text.trim().is_empty() => Ok(text),
        None | Some(Value::Null) | Some(Value::String(_)) => Err(AppError::bad_request(format!(
            "Missing required field: {field}"
        ))),
        Some(_) => Err(AppError::bad_request(format!("`{field}` must be a string"))),
    }
}

/// A seed tool id as Agentry names the tool: the seed names function tools `function-<name>`
/// and skills `skill-<name>`.
pub fn tool_name(id: &str) -> &str {
    id.strip_prefix("function-")
        .or_else(|| id.strip_prefix("skill-"))
        .unwrap_or(id)
}

/// `POST /v1/tools` (`None`) and `PUT /v1/tools/{id}`: a `function` tool from a Python
/// file. MCP tools come with their server (`POST /v1/tools/mcp`), skills with
/// `POST /v1/tools/skill`.
pub async fn seed_save_tool(
    app: &App,
    existing: Option<&str>,
    body: Value,
) -> Result<Value, AppError> {
    let Value::Object(body) = body else {
        return Err(AppError::bad_request("the body must be a JSON object"));
    };
    if let Some(key) = body.keys().find(|key| !TOOL_FIELDS.contains(&key.as_str())) {
        return Err(AppError::bad_request(format!(
            "unknown field `{key}` (expected one of {})",
            TOOL_FIELDS.join(", ")
        )));
    }
    match body.get("tool_type").and_then(Value::as_str) {
        Some("function") => {}
        Some("mcp") => {
            return Err(AppError::bad_request(
                "MCP tools come with their server: POST /v1/tools/mcp with {\"mcpServers\": …}",
            ));
        }
        Some("skill") => {
            return Err(AppError::bad_request(
                "skills are registered with POST /v1/tools/skill",
            ));
        }
        _ => {
            return Err(AppError::bad_request(
                "`tool_type` must be function (or mcp / skill through their own routes)",
            ));
        }
    }
    // The tool is saved under its `tool_id` when one is given (runs name it so), else its
    // name.
    let name = match body.get("tool_id") {
        Some(Value::String(id)) if !id.trim().is_empty() => tool_name(id),
        _ => string(&body, "name")?,
    };
    let description = string(&body, "description")?;
    let parameters = body
        .get("parameters")
        .filter(|p| p.is_object())
        .cloned()
        .ok_or_else(|| AppError::bad_request("Missing required field: parameters"))?;
    let definition = function_tool(
        name,
        description,
        parameters,
        string(&body, "function_file_path")?,
        string(&body, "function_name")?,
    )?;
    match existing {
        Some(old) => {
            Box::pin(app.tools().replace(tool_name(old), &definition)).await?;
            Ok(json!({"status": "updated", "tool_id": name}))
        }
        None => {
            // As the seed: registering a tool that exists replaces it.
            let saved = app.tools().saved_one(name).await?.is_some();
            if saved {
                Box::pin(app.tools().replace(name, &definition)).await?;
            } else {
                app.tools().create(&definition).await?;
            }
            Ok(json!({"status": "registered", "tool_id": name}))
        }
    }
}

/// `DELETE /v1/tools/{id}` (a skill's id unregisters it).
pub async fn seed_delete_tool(app: &App, id: &str) -> Result<Value, AppError> {
    match id.strip_prefix("skill-") {
        Some(skill) => app.skills().delete(skill).await?,
        None => app.tools().delete(tool_name(id)).await?,
    }
    Ok(json!({"status": "deleted", "tool_id": id}))
}

/// `POST /v1/tools/skill` with `{"skill_dir"}`: 201 `{"status": "registered", "tool_id":
/// "skill-<name>"}` (a skill of that name is replaced, as the seed does).
pub async fn seed_register_skill(app: &App, body: Value) -> Result<Value, AppError> {
    let Value::Object(body) = body else {
        return Err(AppError::bad_request("the body must be a JSON object"));
    };
    if let Some(key) = body.keys().find(|key| key.as_str() != "skill_dir") {
        return Err(AppError::bad_request(format!(
            "unknown field `{key}` (expected skill_dir)"
        )));
    }
    let dir = string(&body, "skill_dir")?;
    let registered = app.skills().register(dir.trim()).await?;
    Ok(json!({"status": "registered", "tool_id": format!("skill-{}", registered.skill.name)}))
}

/// `DELETE /v1/tools/batch` with `{"tool_ids": [...]}`: `{"deleted", "not_found",
/// "skipped"}` (built-in tools are skipped).
pub async fn seed_delete_tools(app: &App, body: Value) -> Result<Value, AppError> {
    let ids: Vec<String> = body
        .get("tool_ids")
        .and_then(Value::as_array)
        .and_then(|ids| {
            ids.iter()
                .map(|id| id.as_str().map(str::to_owned))
                .collect()
        })
        .ok_or_else(|| AppError::bad_request("tool_ids must be a list"))?;
    let builtins: Vec<String> = app
        .tools()
        .list()
        .await?
        .tools
        .into_iter()
        .filter(|tool| tool.kind != "http" && tool.kind != "command")
        .map(|tool| tool.name)
        .collect();
    let (skipped, names): (Vec<String>, Vec<String>) = ids
        .into_iter()
        .partition(|id| builtins.iter().any(|name| name == tool_name(id)));
    let names: Vec<String> = names.iter().map(|id| tool_name(id).to_owned()).collect();
    let deleted = if names.is_empty() {
        agentry_app::catalogue_service::DeletedTools {
            deleted: Vec::new(),
            missing: Vec::new(),
        }
    } else {
        app.tools().delete_many(names).await?
    };
    Ok(json!({"deleted": deleted.deleted, "not_found": deleted.missing, "skipped": skipped}))
}
