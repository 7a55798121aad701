//! Learning a model's context window from its provider.
//!
//! A model's window is, in order: the one configured for it, the one its provider states, the
//! known one ([`crate::known_context_window`]), else [`crate::tokens::FALLBACK_CONTEXT_WINDOW`].
//! This module asks the provider, once per base URL and model name in the process (the answer is
//! cached), never on a model call's path:
//!
//! - OpenAI-compatible servers: `GET {base_url}/models`, the entry whose `id` is the model name,
//!   its `max_model_len` (vLLM), `context_length` (OpenRouter, LM Studio, many others),
//!   `max_context_length`, or `meta.n_ctx_train` (llama.cpp's server).
//! - Ollama: `POST {base_url}/api/show`. The window is the `num_ctx` the model runs with: the one
//!   in its `parameters` when set, otherwise Ollama's default ([`OLLAMA_DEFAULT_NUM_CTX`]) capped
//!   by the trained length in `model_info` (`<family>.context_length`) — Ollama silently cuts a
//!   prompt longer than `num_ctx`, so the trained length alone would overstate the window.
//! - Anthropic and api.openai.com state no window; nothing is asked.
//!
//! Every stated number is validated (an integer from [`crate::tokens::MIN_CONTEXT_WINDOW`] to
//! 100,000,000); anything else is ignored. A failed lookup is logged and the next one waits
//! [`RETRY_FAILED_AFTER`]; the caller falls back to the known window.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;

use crate::config::ProviderConfig;
use crate::error::LlmError;
use crate::provider::Protocol;
use crate::tokens::MIN_CONTEXT_WINDOW;

/// How long a lookup may take before the known window is used instead.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(3);

/// After a failed lookup (unreachable provider, error status, unreadable body), how long until
/// the provider is asked again.
pub const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);

/// The `num_ctx` Ollama runs a model with when neither the model nor the request sets one.
pub const OLLAMA_DEFAULT_NUM_CTX: u64 = 4_096;

/// The largest window accepted from a provider.
const MAX_WINDOW: u64 = 100_000_000;

/// The largest metadata body read (OpenRouter's listing of every model is a few MiB).
const MAX_METADATA_BYTES: usize = 16 * 1024 * 1024;

/// What a lookup found.
#[derive(Debug, Clone, Copy)]
enum Found {
    /// The provider answered; `None` when it states no window for the model.
    Answer(Option<u64>),
    /// The lookup failed at this time.
    Failed(Instant),
}

type CacheKey = (Protocol, String, String);

static CACHE: LazyLock<Mutex<HashMap<CacheKey, Found>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Whether the provider of `config` is asked for its models' windows at all.
pub fn states_windows(config: &ProviderConfig) -> bool {
    match config.protocol {
        Protocol::Anthropic | Protocol::A2a => false,
        Protocol::OpenAi | Protocol::OpenAiResponses => !config.base_url.contains("api.openai.com"),
        Protocol::Ollama => true,
    }
}

/// The window the provider of `config` states for its model: from the process-wide cache, or
/// asked once with `timeout`. `None` when it states none, the lookup failed (logged), or the
/// provider is not one that states windows (see [`states_windows`]).
pub(crate) async fn provider_window(
    config: &ProviderConfig,
    http: &reqwest::Client,
    headers: &reqwest::header::HeaderMap,
    timeout: Duration,
) -> Option<u64> {
    if !states_windows(config) {
        return None;
    }
    let key = (
        config.protocol,
        config.base_url.trim_end_matches('/').to_owned(),
        config.model.clone(),
    );
    let cached = CACHE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
        .copied();
    match cached {
        Some(Found::Answer(window)) => return window,
        Some(Found::Failed(at)) if at.elapsed() < RETRY_FAILED_AFTER => return None,
        _ => {}
    }
    let found = match tokio::time::timeout(timeout, ask(config, http, headers)).await {
        Ok(Ok(window)) => {
            tracing::debug!(
                provider = config.protocol.name(),
                model = %config.model,
                window,
                "context window stated by the provider"
            );
            Found::Answer(window)
        }
        Ok(Err(error)) => {
            tracing::warn!(
                provider = config.protocol.name(),
                model = %config.model,
                %error,
                "cannot read the model's context window from its provider; using the known one"
            );
            Found::Failed(Instant::now())
        }
        Err(_) => {
            tracing::warn!(
                provider = config.protocol.name(),
                model = %config.model,
                timeout_ms = timeout.as_millis() as u64,
                "the provider did not state the model's context window in time; using the known one"
            );
            Found::Failed(Instant::now())
        }
    };
    CACHE
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, found);
    match found {
        Found::Answer(window) => window,
        Found::Failed(_) => None,
    }
}

/// One lookup, without cache or timeout.
async fn ask(
    config: &ProviderConfig,
    http: &reqwest::Client,
    headers: &reqwest::header::HeaderMap,
) -> Result<Option<u64>, LlmError> {
    let base = config.base_url.trim_end_matches('/');
    let request = match config.protocol {
        Protocol::Ollama => http
            .post(format!("{base}/api/show"))
            .headers(headers.clone())
            .json(&serde_json::json!({ "model": config.model })),
        Protocol::OpenAi | Protocol::OpenAiResponses | Protocol::Anthropic | Protocol::A2a => {
            http.get(format!("{base}/models")).headers(headers.clone())
        }
    };
    let response = request
        .send()
        .await
        .map_err(|error| request_failed(&error))?;
    let status = response.status();
    if !status.is_success() {
        return Err(LlmError::MalformedResponse {
            detail: format!("the model metadata request answered {status}"),
            raw: String::new(),
        });
    }
    if response
        .content_length()
        .is_some_and(|length| length > MAX_METADATA_BYTES as u64)
    {
        return Err(too_large());
    }
    let mut body = Vec::new();
    let mut response = response;
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| request_failed(&error))?
    {
        if body.len() + chunk.len() > MAX_METADATA_BYTES {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    let value: Value =
        serde_json::from_slice(&body).map_err(|error| LlmError::MalformedResponse {
            detail: format!("the model metadata is not JSON: {error}"),
            raw: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        })?;
    Ok(match config.protocol {
        Protocol::Ollama => window_from_ollama_show(&value),
        Protocol::OpenAi | Protocol::OpenAiResponses | Protocol::Anthropic | Protocol::A2a => {
            window_from_model_list(&value, &config.model)
        }
    })
}

fn request_failed(error: &reqwest::Error) -> LlmError {
    LlmError::Configuration(format!("the model metadata request failed: {error}"))
}

fn too_large() -> LlmError {
    LlmError::MalformedResponse {
        detail: format!("the model metadata is larger than {MAX_METADATA_BYTES} bytes"),
        raw: String::new(),
    }
}

/// A stated window, if it is a plausible one.
fn plausible(value: Option<&Value>) -> Option<u64> {
    let tokens = value?.as_u64()?;
    (MIN_CONTEXT_WINDOW..=MAX_WINDOW)
        .contains(&tokens)
        .then_some(tokens)
}

/// The window an OpenAI-compatible `GET /models` listing states for `model`: the entry in `data`
/// whose `id` is `model`, its `max_model_len`, `context_length`, `max_context_length` or
/// `meta.n_ctx_train`, in that order. `None` when the model is not listed or no field holds a
/// plausible number.
pub fn window_from_model_list(listing: &Value, model: &str) -> Option<u64> {
    let entry = listing
        .get("data")?
        .as_array()?
        .iter()
        .find(|entry| entry.get("id").and_then(Value::as_str) == Some(model))?;
    plausible(entry.get("max_model_len"))
        .or_else(|| plausible(entry.get("context_length")))
        .or_else(|| plausible(entry.get("max_context_length")))
        .or_else(|| plausible(entry.get("meta").and_then(|meta| meta.get("n_ctx_train"))))
}

/// The window an Ollama `POST /api/show` answer states: the `num_ctx` in its `parameters` when
/// set, otherwise [`OLLAMA_DEFAULT_NUM_CTX`], capped by the trained length in `model_info`
/// (a key ending in `.context_length`). `None` when it states neither.
pub fn window_from_ollama_show(show: &Value) -> Option<u64> {
    let num_ctx = show
        .get("parameters")
        .and_then(Value::as_str)
        .and_then(|parameters| {
            parameters.lines().find_map(|line| {
                let mut words = line.split_whitespace();
                (words.next() == Some("num_ctx"))
                    .then(|| words.next())
                    .flatten()
                    .and_then(|value| value.parse::<u64>().ok())
            })
        })
        .filter(|tokens| (MIN_CONTEXT_WINDOW..=MAX_WINDOW).contains(tokens));
    let trained = show
        .get("model_info")
        .and_then(Value::as_object)
        .and_then(|info| {
            info.iter()
                .filter(|(key, _)| key.ends_with(".context_length"))
                .find_map(|(_, value)| plausible(Some(value)))
        });
    match (num_ctx, trained) {
        (Some(num_ctx), _) => Some(num_ctx),
        (None, Some(trained)) => Some(trained.min(OLLAMA_DEFAULT_NUM_CTX)),
        (None, None) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn model_list_fields_in_order_and_only_for_the_model() {
        let listing = json!({"object": "list", "data": [
            {"id": "other", "max_model_len": 4096},
            {"id": "qwen", "max_model_len": 32768, "context_length": 1000},
            {"id": "router", "context_length": 200000},
            {"id": "lms", "max_context_length": 65536},
            {"id": "gguf", "meta": {"n_ctx_train": 131072}},
            {"id": "silly", "max_model_len": 12, "context_length": "lots"},
            {"id": "float", "max_model_len": 8192.5},
        ]});
        assert_eq!(window_from_model_list(&listing, "qwen"), Some(32_768));
        assert_eq!(window_from_model_list(&listing, "router"), Some(200_000));
        assert_eq!(window_from_model_list(&listing, "lms"), Some(65_536));
        assert_eq!(window_from_model_list(&listing, "gguf"), Some(131_072));
        assert_eq!(window_from_model_list(&listing, "silly"), None);
        assert_eq!(window_from_model_list(&listing, "float"), None);
        assert_eq!(window_from_model_list(&listing, "missing"), None);
        assert_eq!(window_from_model_list(&json!({"data": "x"}), "qwen"), None);
        assert_eq!(window_from_model_list(&json!([]), "qwen"), None);
    }

    #[test]
    fn ollama_num_ctx_wins_and_the_trained_length_caps_the_default() {
        let show = json!({
            "parameters": "stop \"<|eot_id|>\"\nnum_ctx                        16384",
            "model_info": {"llama.context_length": 131072, "general.architecture": "llama"},
        });
        assert_eq!(window_from_ollama_show(&show), Some(16_384));
        let show = json!({"model_info": {"llama.context_length": 131072}});
        assert_eq!(window_from_ollama_show(&show), Some(OLLAMA_DEFAULT_NUM_CTX));
        let show = json!({"model_info": {"phi.context_length": 2048}});
        assert_eq!(window_from_ollama_show(&show), Some(2_048));
        let show = json!({"parameters": "num_ctx lots", "model_info": {"x.context_length": -1}});
        assert_eq!(window_from_ollama_show(&show), None);
        assert_eq!(window_from_ollama_show(&json!({})), None);
    }
}
