//! Tools defined at run time that call an HTTP endpoint.
//!
//! An [`HttpTool`] POSTs the call's arguments as a JSON body to a configured URL, with configured
//! headers whose values are literal or come from named secrets ([`SecretResolver`]). A 2xx body
//! is the result (JSON when the response says so, text otherwise), read in chunks and cut at a
//! byte cap; any other status is a failure quoting the start of the body.
//!
//! Redirects are never followed (the client from `agentry_llm::http_client` follows none, and the
//! tool must be given such a client): a 3xx is a failure naming its target, so the configured
//! headers and secrets reach only the configured URL.
//!
//! Secret values never appear in errors, results or logs: errors name a secret, never its value,
//! header values holding secrets are marked sensitive, and any occurrence of a secret's value in
//! a response (an endpoint echoing headers back) is replaced by `[redacted]`.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use agentry_types::ToolSpec;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, LOCATION};
use serde_json::Value;

use agentry_core::tool::registry::{TOOL_NAME_RULE, is_valid_tool_name};
use agentry_core::tool::result::{decode_cut_utf8, truncation_note};
use agentry_core::tool::{Tool, ToolContext, ToolError, ToolOutput};

/// How much of a failed response's body an error quotes.
const ERROR_SNIPPET_BYTES: usize = 1024;

/// What replaces a secret's value wherever it would be shown.
const REDACTED: &str = "[redacted]";

/// Looks up secrets by name.
pub trait SecretResolver: Send + Sync {
    /// The secret's value, or `None` when it is not set.
    fn resolve(&self, name: &str) -> Option<String>;
}

/// Secrets read from the process's environment variables (for the CLI).
#[derive(Debug, Clone, Copy, Default)]
pub struct EnvSecrets;

impl SecretResolver for EnvSecrets {
    fn resolve(&self, name: &str) -> Option<String> {
        std::env::var(name).ok()
    }
}

/// Secrets from a fixed table (tests, embedding).
#[derive(Clone, Default)]
pub struct StaticSecrets(pub HashMap<String, String>);

impl fmt::Debug for StaticSecrets {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names: Vec<&String> = self.0.keys().collect();
        names.sort();
        formatter
            .debug_struct("StaticSecrets")
            .field("names", &names)
            .finish_non_exhaustive()
    }
}

impl SecretResolver for StaticSecrets {
    fn resolve(&self, name: &str) -> Option<String> {
        self.0.get(name).cloned()
    }
}

/// Where a header's value comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderValueSource {
    /// This exact value.
    Literal(String),
    /// The value of the secret with this name.
    Secret(String),
}

/// The definition of an HTTP tool.
#[derive(Debug, Clone)]
pub struct HttpToolConfig {
    /// The tool's name.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON Schema of the arguments (an object).
    pub parameters: Value,
    /// The endpoint the arguments are POSTed to (`http` or `https`).
    pub url: String,
    /// Headers sent with every call.
    pub headers: Vec<(String, HeaderValueSource)>,
    /// The tool's timeout, overriding the run's default.
    pub timeout: Option<Duration>,
    /// The most bytes of a response body read; the rest is cut with a note.
    pub max_response_bytes: usize,
}

/// A tool that POSTs its arguments to an HTTP endpoint.
#[derive(Clone)]
pub struct HttpTool {
    spec: ToolSpec,
    timeout: Option<Duration>,
    endpoint: Arc<Endpoint>,
}

struct Endpoint {
    url: reqwest::Url,
    headers: HeaderMap,
    timeout: Option<Duration>,
    max_response_bytes: usize,
    http: reqwest::Client,
    /// Secret values to scrub from anything shown.
    secrets: Vec<String>,
}

impl fmt::Debug for HttpTool {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let header_names: Vec<&str> = self
            .endpoint
            .headers
            .keys()
            .map(HeaderName::as_str)
            .collect();
        formatter
            .debug_struct("HttpTool")
            .field("name", &self.spec.name)
            .field("host", &self.endpoint.url.host_str())
            .field("headers", &header_names)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl HttpTool {
    /// Builds the tool, resolving secret headers now.
    ///
    /// Fails with [`ToolError::Registration`] for an invalid name, a URL that is not `http(s)`
    /// or carries credentials, an invalid header name or value, a secret that is not set, or a
    /// zero response cap. Errors name secrets, never their values.
    pub fn new(
        config: HttpToolConfig,
        http: reqwest::Client,
        secrets: Arc<dyn SecretResolver>,
    ) -> Result<HttpTool, ToolError> {
        let name = config.name;
        let invalid =
            |reason: String| ToolError::Registration(format!("HTTP tool {name:?}: {reason}"));
        if !is_valid_tool_name(&name) {
            return Err(ToolError::Registration(format!(
                "invalid tool name {name:?}: a name is {TOOL_NAME_RULE}"
            )));
        }
        let url = reqwest::Url::parse(&config.url)
            .map_err(|error| invalid(format!("invalid URL {:?}: {error}", config.url)))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "the URL must be http or https, not {:?}",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(invalid(
                "the URL must not carry credentials; send them in a header from a secret".into(),
            ));
        }
        if config.max_response_bytes == 0 {
            return Err(invalid("max_response_bytes must be at least 1".into()));
        }
        let mut headers = HeaderMap::new();
        let mut secret_values = Vec::new();
        for (header, source) in config.headers {
            let header_name = HeaderName::from_bytes(header.as_bytes())
                .map_err(|_| invalid(format!("invalid header name {header:?}")))?;
            let value = match source {
                HeaderValueSource::Literal(value) => HeaderValue::from_str(&value)
                    .map_err(|_| invalid(format!("invalid value for header {header:?}")))?,
                HeaderValueSource::Secret(secret) => {
                    let value = secrets
                        .resolve(&secret)
                        .filter(|value| !value.is_empty())
                        .ok_or_else(|| {
                            invalid(format!(
                                "secret {secret:?} (for header {header:?}) is not set"
                            ))
                        })?;
                    let mut header_value = HeaderValue::from_str(&value).map_err(|_| {
                        invalid(format!(
                            "the value of secret {secret:?} is not a valid value for header {header:?}"
                        ))
                    })?;
                    header_value.set_sensitive(true);
                    secret_values.push(value);
                    header_value
                }
            };
            headers.append(header_name, value);
        }
        Ok(HttpTool {
            spec: ToolSpec::new(name, config.description, config.parameters),
            timeout: config.timeout,
            endpoint: Arc::new(Endpoint {
                url,
                headers,
                timeout: config.timeout,
                max_response_bytes: config.max_response_bytes,
                http,
                secrets: secret_values,
            }),
        })
    }
}

impl Tool for HttpTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn risk(&self) -> agentry_core::tool::ToolRisk {
        agentry_core::tool::ToolRisk::of(agentry_core::tool::RiskClass::Network)
    }

    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    fn call(
        &self,
        arguments: Value,
        context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        let endpoint = Arc::clone(&self.endpoint);
        async move {
            tokio::select! {
                biased;
                () = context.cancel.cancelled() => Err(ToolError::Cancelled),
                outcome = endpoint.post(&arguments) => outcome,
            }
        }
        .boxed()
    }
}

impl Endpoint {
    async fn post(&self, arguments: &Value) -> Result<ToolOutput, ToolError> {
        let mut request = self
            .http
            .post(self.url.clone())
            .headers(self.headers.clone())
            .json(arguments);
        if let Some(timeout) = self.timeout {
            request = request.timeout(timeout);
        }
        let mut response = request
            .send()
            .await
            .map_err(|error| self.request_error(error))?;
        let status = response.status();
        let total = response
            .content_length()
            .and_then(|n| usize::try_from(n).ok());
        let is_json = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .is_some_and(is_json_media_type);
        if status.is_redirection() {
            // Never followed: the request carries the tool's headers, secrets among them, and
            // they go only to the configured URL.
            let target = response
                .headers()
                .get(LOCATION)
                .map(|location| String::from_utf8_lossy(location.as_bytes()).into_owned());
            let message = match target {
                Some(target) => format!(
                    "the endpoint answered HTTP {status}, a redirect to {target}; HTTP tools do \
                     not follow redirects (their headers would go along): configure the tool \
                     with the final URL"
                ),
                None => format!(
                    "the endpoint answered HTTP {status}, a redirect without a Location; HTTP \
                     tools do not follow redirects"
                ),
            };
            return Err(ToolError::Failed(self.redact(message)));
        }
        if !status.is_success() {
            let snippet = match read_capped(&mut response, ERROR_SNIPPET_BYTES).await {
                Ok((bytes, truncated)) => {
                    let mut text = decode_cut_utf8(&bytes);
                    if truncated {
                        text.push('…');
                    }
                    text
                }
                Err(_) => String::new(),
            };
            return Err(ToolError::Failed(
                self.redact(format!("the endpoint answered HTTP {status}: {snippet}")),
            ));
        }
        let (bytes, truncated) = read_capped(&mut response, self.max_response_bytes)
            .await
            .map_err(|error| self.request_error(error))?;
        if truncated {
            let mut text = decode_cut_utf8(&bytes);
            let note = truncation_note(text.len(), total);
            text.push_str(&note);
            return Ok(ToolOutput::text(self.redact(text)));
        }
        if is_json && let Ok(value) = serde_json::from_slice::<Value>(&bytes) {
            return Ok(ToolOutput::json(self.redact_json(value)));
        }
        Ok(ToolOutput::text(self.redact(decode_cut_utf8(&bytes))))
    }

    fn request_error(&self, error: reqwest::Error) -> ToolError {
        if error.is_timeout()
            && let Some(timeout) = self.timeout
        {
            return ToolError::Timeout(timeout);
        }
        let error = error.without_url();
        let mut message = format!("the request to the endpoint failed: {error}");
        let mut source = std::error::Error::source(&error);
        while let Some(cause) = source {
            message.push_str(&format!(": {cause}"));
            source = cause.source();
        }
        ToolError::Failed(self.redact(message))
    }

    /// Replaces every secret value in `text`.
    fn redact(&self, mut text: String) -> String {
        for secret in &self.secrets {
            if text.contains(secret.as_str()) {
                text = text.replace(secret.as_str(), REDACTED);
            }
        }
        text
    }

    fn redact_json(&self, value: Value) -> Value {
        if self.secrets.is_empty() {
            return value;
        }
        match value {
            Value::String(text) => Value::String(self.redact(text)),
            Value::Array(items) => {
                Value::Array(items.into_iter().map(|v| self.redact_json(v)).collect())
            }
            Value::Object(object) => Value::Object(
                object
                    .into_iter()
                    .map(|(key, v)| (self.redact(key), self.redact_json(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}

/// Whether a `Content-Type` names JSON (`application/json`, or any `+json` type).
fn is_json_media_type(content_type: &str) -> bool {
    let media_type = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    media_type == "application/json" || media_type.ends_with("+json")
}

/// Reads the body chunk by chunk, stopping at `cap` bytes. Returns the bytes and whether the
/// body went on past the cap.
pub(crate) async fn read_capped(
    response: &mut reqwest::Response,
    cap: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut bytes = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = cap - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(&chunk[..room]);
            return Ok((bytes, true));
        }
        bytes.extend_from_slice(&chunk);
        if bytes.len() == cap {
            // Exactly at the cap: the body was cut only if more follows.
            let more = response.chunk().await?.is_some_and(|next| !next.is_empty());
            return Ok((bytes, more));
        }
    }
    Ok((bytes, false))
}
