//! A registered model's configuration ([`ModelConfig`]: provider, URL, key secret, labels,
//! prices, defaults) and which saved model a run that names none uses ([`default_model`]).

use serde::{Deserialize, Serialize};

use agentry_llm::{GenerationParams, HttpModelClient, Protocol, ProviderConfig};
use agentry_store::Store;

use crate::config::ConfigRepo;
use crate::error::AppError;

/// A registered model. Accepts the Python service's field names (`model_id`, `api_protocol`,
/// `api_base`) as well as Agentry's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// The id requests name it by.
    #[serde(alias = "model_id")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9_.-]{1,64}$"))]
    pub id: String,
    /// The wire protocol.
    #[serde(alias = "api_protocol", default = "default_protocol")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::protocol_schema))]
    pub protocol: Protocol,
    /// Base URL (default: the protocol's public endpoint).
    #[serde(alias = "api_base", default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The provider's model name.
    #[cfg_attr(feature = "openapi", schema(pattern = "\\S"))]
    pub model_name: String,
    /// The name of the secret (see `/v1/env`) holding the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_secret: Option<String>,
    /// Default generation parameters.
    #[serde(default, alias = "generate_params")]
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub params: GenerationParams,
    /// The model's context window in tokens (default: the window the provider states — an
    /// OpenAI-compatible `/models` listing's `max_model_len` / `context_length`, Ollama's
    /// `num_ctx` — else the model's known window, else 8192). Compaction keeps requests under it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(minimum = 256))]
    pub context_window: Option<u32>,
    /// Whether this is the default model, used when a request names none (default: the first
    /// model registered is).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    /// What the model can do and is for, as labels (a list, or one string separated by commas
    /// or spaces): `vision` (takes images), `audio` (takes audio), `thinking` (reasons),
    /// `summary` (writes compaction summaries and titles when nothing else is named),
    /// `read-image` (describes images for models without `vision`), `speech` (transcribes
    /// audio for models without `audio`, through `/audio/transcriptions`), or any label of
    /// your own; a request may name a model by a label.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "labels_from_list_or_text"
    )]
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<String>))]
    pub labels: Vec<String>,
    /// What the model costs, in US dollars per million tokens (`input`, `output`, and
    /// optionally `cached_input` and `cache_write`); each call's cost is recorded in the usage
    /// ledger. Default: the published price of a well-known model, by `model_name`
    /// (the usage module's `known_price`); none for others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(schema_with = crate::schema::price_schema))]
    pub pricing: Option<agentry_types::ModelPrice>,
}

/// Labels as a list, or as one string separated by commas (also `，`) or white space, as the
/// seed's console sends them.
fn labels_from_list_or_text<'de, D>(deserializer: D) -> Result<Vec<String>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Labels {
        List(Vec<String>),
        Text(String),
    }
    let labels = match Labels::deserialize(deserializer)? {
        Labels::List(list) => list,
        Labels::Text(text) => text
            .split(|c: char| c == ',' || c == '，' || c.is_whitespace())
            .map(str::to_owned)
            .collect(),
    };
    let mut unique: Vec<String> = Vec::new();
    for label in labels {
        let label = label.trim();
        if !label.is_empty() && !unique.iter().any(|l| l == label) {
            unique.push(label.to_owned());
        }
    }
    Ok(unique)
}

fn default_protocol() -> Protocol {
    Protocol::OpenAi
}

impl ModelConfig {
    /// The client for this model, its key resolved from `secrets` (refused when the key is
    /// bound to other hosts than the model's URL).
    pub fn client(
        &self,
        secrets: &crate::secrets::Secrets,
        http: &reqwest::Client,
    ) -> Result<HttpModelClient, AppError> {
        let mut config = ProviderConfig::new(self.protocol, &self.model_name);
        if let Some(base_url) = &self.base_url {
            config = config.with_base_url(base_url);
        }
        if let Some(name) = &self.api_key_secret {
            let to = crate::secrets::SecretUse::of_url(&config.base_url)?;
            let user = format!("model {:?}", self.id);
            let key = secrets.value_for(name, &user, &to)?.ok_or_else(|| {
                AppError::bad_request(format!(
                    "model {:?} uses the secret {name:?}, which is not set (POST /v1/env)",
                    self.id
                ))
            })?;
            config = config.with_api_key(key);
        }
        if let Some(tokens) = self.context_window {
            config = config.with_context_window(u64::from(tokens));
        }
        // A model that takes images gets those of tool results too (charts, screenshots).
        config.openai.tool_images_as_user = agentry_core::media::sees_images(&self.labels);
        HttpModelClient::with_http_client(config, http.clone())
            .map_err(|error| AppError::bad_request(format!("model {:?}: {error}", self.id)))
    }
}

/// The saved model a run that names none uses: the one marked default, else the first
/// registered; `None` when there is none.
pub async fn default_model(store: &Store) -> Result<Option<ModelConfig>, AppError> {
    let models = ConfigRepo::<ModelConfig>::new(store)
        .list_registered()
        .await?;
    Ok(models
        .iter()
        .find(|(_, model)| model.default)
        .or(models.first())
        .map(|(_, model)| model.clone()))
}
