//! How to reach one model: protocol, base URL, model name, key, headers, timeouts.

use std::fmt;

use crate::error::LlmError;
use crate::provider::Protocol;
use crate::transport::TransportConfig;

/// An API key. Its `Debug` form never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// Wraps a key.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key's value, for the request header only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// OpenAI-compatible servers differ in small ways; these switches cover the known ones.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenAiOptions {
    /// The field for the output limit. `None` picks `max_completion_tokens` for api.openai.com
    /// (its reasoning models refuse `max_tokens`) and `max_tokens` for everything else.
    pub max_tokens_field: Option<String>,
    /// Send earlier reasoning back as `reasoning_content` on assistant messages (DeepSeek's
    /// thinking mode with tools needs it; OpenAI does not accept it).
    pub replay_reasoning: bool,
    /// Send the images tool results carry (a chart from `run_code`, a screenshot) in a user
    /// message after the tool messages: chat completions take images only from the user, and a
    /// tool message would show the model a placeholder. Only for models that take images (an
    /// image sent to one that does not fails the request).
    pub tool_images_as_user: bool,
}

/// Everything needed to call one model.
#[derive(Debug, Clone)]
pub struct ProviderConfig {
    /// The wire protocol.
    pub protocol: Protocol,
    /// Base URL; the protocol's path (`/chat/completions`, `/messages`, `/api/chat`) is appended.
    pub base_url: String,
    /// The provider's model name.
    pub model: String,
    /// The API key, if the provider needs one.
    pub api_key: Option<ApiKey>,
    /// Extra headers sent with every request.
    pub headers: Vec<(String, String)>,
    /// OpenAI-compatible switches.
    pub openai: OpenAiOptions,
    /// Timeouts and retries.
    pub transport: TransportConfig,
    /// The model's context window in tokens, when configured. It always wins; otherwise the
    /// window the provider states (the window module asks it), else a known one (see
    /// [`crate::known_context_window`]), else the fallback.
    pub context_window: Option<u64>,
}

impl ProviderConfig {
    /// A configuration with the protocol's default base URL and transport settings.
    pub fn new(protocol: Protocol, model: impl Into<String>) -> Self {
        Self {
            protocol,
            base_url: protocol.default_base_url().to_owned(),
            model: model.into(),
            api_key: None,
            headers: Vec::new(),
            openai: OpenAiOptions::default(),
            transport: TransportConfig::default(),
            context_window: None,
        }
    }

    /// Sets the context window.
    pub fn with_context_window(mut self, tokens: u64) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// The context window without asking the provider: the configured one, else the model's
    /// known one, else [`crate::tokens::FALLBACK_CONTEXT_WINDOW`] (a client that asked its
    /// provider reports the stated window instead of the last two, see
    /// [`crate::HttpModelClient::discover_context_window`]).
    pub fn effective_context_window(&self) -> u64 {
        self.context_window
            .or_else(|| crate::known_context_window(self.protocol, &self.model))
            .unwrap_or(crate::tokens::FALLBACK_CONTEXT_WINDOW)
    }

    /// Sets the base URL.
    pub fn with_base_url(mut self, base_url: impl Into<String>) -> Self {
        self.base_url = base_url.into();
        self
    }

    /// Sets the API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(ApiKey::new(key));
        self
    }

    /// Sets the transport settings.
    pub fn with_transport(mut self, transport: TransportConfig) -> Self {
        self.transport = transport;
        self
    }

    /// Checks the configuration before any request is made.
    pub fn validate(&self) -> Result<(), LlmError> {
        if self.model.trim().is_empty() {
            return Err(LlmError::Configuration("the model name is empty".into()));
        }
        if self.context_window.is_some_and(|tokens| {
            !(crate::tokens::MIN_CONTEXT_WINDOW..=100_000_000).contains(&tokens)
        }) {
            return Err(LlmError::Configuration(format!(
                "the context window is {} to 100,000,000 tokens",
                crate::tokens::MIN_CONTEXT_WINDOW
            )));
        }
        let url = reqwest::Url::parse(&self.base_url).map_err(|error| {
            LlmError::Configuration(format!(
                "base URL {:?} is not a URL: {error}",
                self.base_url
            ))
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(LlmError::Configuration(format!(
                "base URL {:?} must use http or https",
                self.base_url
            )));
        }
        for (name, value) in &self.headers {
            http::HeaderName::try_from(name.as_str())
                .map_err(|_| LlmError::Configuration(format!("invalid header name {name:?}")))?;
            http::HeaderValue::try_from(value.as_str()).map_err(|_| {
                LlmError::Configuration(format!("invalid value for header {name:?}"))
            })?;
        }
        Ok(())
    }

    /// The full URL requests go to.
    pub fn endpoint(&self) -> String {
        let base = self.base_url.trim_end_matches('/');
        let path = match self.protocol {
            crate::Protocol::OpenAi => "/chat/completions",
            crate::Protocol::OpenAiResponses => "/responses",
            crate::Protocol::Anthropic => "/messages",
            crate::Protocol::Ollama => "/api/chat",
            // The agent's JSON-RPC endpoint is the URL itself.
            crate::Protocol::A2a => return self.base_url.clone(),
        };
        format!("{base}{path}")
    }

    pub(crate) fn openai_max_tokens_field(&self) -> &str {
        match &self.openai.max_tokens_field {
            Some(field) => field,
            None if self.base_url.contains("api.openai.com") => "max_completion_tokens",
            None => "max_tokens",
        }
    }
}
