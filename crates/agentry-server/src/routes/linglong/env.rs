//! The seed's environment variables (`/v1/env`), which hold its keys: in Agentry they are the
//! sealed secrets, so values are written, never read back (listed masked: `…` and the last four
//! characters of a long value). `POST /v1/env/detect` answers the names the configuration
//! reads — the secrets models and tools name, and the providers' usual key variables the server
//! was started with — so a client knows what to set.

use std::collections::BTreeSet;

use serde_json::{Map, Value, json};

use agentry_app::App;
use agentry_app::AppError;

/// Provider key variables a server may have been started with.
const PROVIDER_KEYS: &[&str] = &[
    "OPENAI_API_KEY",
    "ANTHROPIC_API_KEY",
    "OLLAMA_API_KEY",
    "DEEPSEEK_API_KEY",
    "OPENROUTER_API_KEY",
];

/// Every `{"secret": NAME}` in a tool's definition.
fn secrets_named(value: &Value, names: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            if let (1, Some(Value::String(name))) = (map.len(), map.get("secret")) {
                names.insert(name.clone());
            }
            map.values().for_each(|value| secrets_named(value, names));
        }
        Value::Array(items) => items.iter().for_each(|value| secrets_named(value, names)),
        _ => {}
    }
}

/// `GET /v1/env`: `{"env": {name: masked value}}`.
pub async fn seed_env(app: &App) -> Result<Value, AppError> {
    let env: Map<String, Value> = app
        .secrets()
        .list()
        .await?
        .into_iter()
        .map(|secret| (secret.name, json!(secret.masked)))
        .collect();
    Ok(json!({"env": env}))
}

/// `POST /v1/env` with `{"key", "value"}`: sets it; answers the list. Agentry's own
/// `hosts` (a list of host names or `*.domain` patterns) may be added: the value is then
/// sent only where those hosts are (see [`agentry_app::secrets`]).
pub async fn seed_set_env(app: &App, body: Value) -> Result<Value, AppError> {
    let key = body
        .get("key")
        .and_then(Value::as_str)
        .ok_or_else(|| AppError::bad_request("Missing required field: key"))?;
    if key.is_empty() {
        return Err(AppError::bad_request("key must not be empty"));
    }
    let value = match body.get("value") {
        Some(Value::String(value)) => value.clone(),
        None | Some(Value::Null) => String::new(),
        Some(other) => other.to_string(),
    };
    match body.get("hosts") {
        None | Some(Value::Null) => app.secrets().set(&[(key.to_owned(), value)]).await?,
        Some(hosts) => {
            let hosts: Vec<String> = serde_json::from_value(hosts.clone())
                .map_err(|_| AppError::bad_request("`hosts` must be a list of host names"))?;
            app.secrets().set_bound(key, &value, &hosts).await?;
        }
    }
    seed_env(app).await
}

/// `DELETE /v1/env/{key}`: deletes it if set (as the seed, no error if not); answers the
/// list.
pub async fn seed_delete_env(app: &App, key: &str) -> Result<Value, AppError> {
    match app.secrets().delete(key).await {
        Ok(()) => {}
        Err(error) if error.failure == agentry_app::error::Failure::NotFound => {}
        Err(error) => return Err(error),
    }
    seed_env(app).await
}

/// `POST /v1/env/detect`: `{"keys": [...]}`, sorted.
pub async fn seed_detect_env(app: &App) -> Result<Value, AppError> {
    let mut keys = BTreeSet::new();
    for model in app.models().list().await?.models {
        keys.extend(model.api_key_secret);
    }
    for definition in app.tools().saved().await? {
        if let Ok(value) = serde_json::to_value(&definition) {
            secrets_named(&value, &mut keys);
        }
    }
    keys.extend(
        PROVIDER_KEYS
            .iter()
            .filter(|name| std::env::var_os(name).is_some())
            .map(|name| (*name).to_owned()),
    );
    Ok(json!({"keys": keys}))
}
