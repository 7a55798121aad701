//! The model-client trait and its HTTP implementation.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use agentry_types::{ModelEvent, ModelResponse};

use crate::config::ProviderConfig;
use crate::decode::{decode_stream, decode_whole};
use crate::error::{LlmError, ProviderError};
use crate::provider::{Protocol, anthropic, error_from_response};
use crate::request::ModelRequest;
use crate::transport::{body_chunks, http_client, past_deadline, request_error, until_deadline};

/// A model call's event stream. It ends with [`ModelEvent::Completed`] or an error.
pub type ModelStream = Pin<Box<dyn Stream<Item = Result<ModelEvent, LlmError>> + Send>>;

/// The largest non-streamed response body accepted.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Anything that can answer a model request.
pub trait ModelClient: Send + Sync + 'static {
    /// Streams the answer: deltas for live display, then the complete response.
    /// Cancelling `cancel` (or dropping the stream) stops the call promptly.
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ModelStream;

    /// Asks for the whole answer in one (non-streamed) response.
    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ModelResponse, LlmError>>;

    /// The model's context window and token counter (by default: nothing known, see
    /// [`ModelContext::unknown`](crate::ModelContext::unknown)).
    fn context(&self) -> crate::tokens::ModelContext {
        crate::tokens::ModelContext::unknown()
    }

    /// Turns speech into text (a speech model: OpenAI's `POST /audio/transcriptions`, which
    /// Whisper servers, vLLM and LocalAI speak too). By default the client cannot.
    fn transcribe(
        &self,
        clip: AudioClip,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<String, LlmError>> {
        let _ = (clip, cancel);
        Box::pin(async {
            Err(LlmError::Configuration(
                "this model client does not transcribe audio".into(),
            ))
        })
    }
}

/// Audio to transcribe: its container format (`wav`, `mp3`, `webm`, …) and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AudioClip {
    /// The container format, as a file extension.
    pub format: String,
    /// The encoded audio.
    pub bytes: Bytes,
}

/// Drains a model stream, returning the final response.
pub async fn collect_response(mut stream: ModelStream) -> Result<ModelResponse, LlmError> {
    while let Some(event) = stream.next().await {
        if let ModelEvent::Completed { response } = event? {
            return Ok(response);
        }
    }
    Err(LlmError::StreamEndedEarly {
        detail: "the event stream ended without a completed response".into(),
    })
}

/// A model reached over HTTP with one of the three protocols.
#[derive(Clone)]
pub struct HttpModelClient {
    inner: Arc<Inner>,
}

struct Inner {
    config: ProviderConfig,
    context: crate::tokens::ModelContext,
    /// The window the provider stated, once asked (see [`HttpModelClient::discover_context_window`]).
    stated_window: std::sync::OnceLock<u64>,
    /// The A2A version the remote agent's card says to speak, once read.
    a2a_version: std::sync::OnceLock<crate::provider::a2a::A2aVersion>,
    http: reqwest::Client,
    headers: reqwest::header::HeaderMap,
    endpoint: String,
}

impl std::fmt::Debug for HttpModelClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpModelClient")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl HttpModelClient {
    /// A client with its own pooled HTTP client.
    pub fn new(config: ProviderConfig) -> Result<Self, LlmError> {
        let http = http_client(config.transport.connect_timeout)?;
        Self::with_http_client(config, http)
    }

    /// A client sharing an existing pooled HTTP client (see [`crate::http_client`]).
    pub fn with_http_client(
        config: ProviderConfig,
        http: reqwest::Client,
    ) -> Result<Self, LlmError> {
        config.validate()?;
        let headers = request_headers(&config)?;
        let endpoint = config.endpoint();
        let context = crate::tokens::ModelContext {
            window: config.effective_context_window(),
            window_known: config.context_window.is_some()
                || crate::known_context_window(config.protocol, &config.model).is_some(),
            counter: crate::TokenCounter::for_model(config.protocol, &config.model),
        };
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                context,
                stated_window: std::sync::OnceLock::new(),
                a2a_version: std::sync::OnceLock::new(),
                http,
                headers,
                endpoint,
            }),
        })
    }

    /// Asks the provider for the model's context window (see [`crate::window`]), at most
    /// `timeout`, unless a window is configured (which always wins). The answer is cached for
    /// the process, so asking again (a rebuilt client for the same model) costs nothing; from
    /// then on [`ModelClient::context`] reports it. Returns the stated window, if any; a failed
    /// lookup is logged and leaves the known window in place.
    pub async fn discover_context_window(&self, timeout: std::time::Duration) -> Option<u64> {
        let inner = &self.inner;
        if inner.config.context_window.is_some() {
            return None;
        }
        if let Some(window) = inner.stated_window.get() {
            return Some(*window);
        }
        let window =
            crate::window::provider_window(&inner.config, &inner.http, &inner.headers, timeout)
                .await?;
        Some(*inner.stated_window.get_or_init(|| window))
    }

    /// The configuration.
    pub fn config(&self) -> &ProviderConfig {
        &self.inner.config
    }

    /// The JSON body this client sends for `request` (to a remote A2A agent: in 0.3's shape
    /// until its card has been read).
    pub fn request_body(
        &self,
        request: &ModelRequest,
        stream: bool,
    ) -> Result<serde_json::Value, LlmError> {
        match self.inner.a2a_version.get() {
            Some(version) if self.inner.config.protocol == Protocol::A2a => {
                crate::provider::a2a::encode_version(&self.inner.config, request, stream, *version)
            }
            _ => encode_request(&self.inner.config, request, stream),
        }
    }
}

/// Encodes `request` in the configured protocol.
pub fn encode_request(
    config: &ProviderConfig,
    request: &ModelRequest,
    stream: bool,
) -> Result<serde_json::Value, LlmError> {
    match config.protocol {
        Protocol::OpenAi => crate::provider::openai::encode(config, request, stream),
        Protocol::OpenAiResponses => {
            crate::provider::openai_responses::encode(config, request, stream)
        }
        Protocol::Anthropic => anthropic::encode(config, request, stream),
        Protocol::Ollama => crate::provider::ollama::encode(config, request, stream),
        Protocol::A2a => crate::provider::a2a::encode(config, request, stream),
    }
}

fn request_headers(config: &ProviderConfig) -> Result<reqwest::header::HeaderMap, LlmError> {
    use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
    let mut headers = HeaderMap::new();
    let value = |text: &str| {
        HeaderValue::from_str(text)
            .map_err(|_| LlmError::Configuration("a header value has invalid characters".into()))
    };
    headers.insert("content-type", HeaderValue::from_static("application/json"));
    match config.protocol {
        Protocol::OpenAi | Protocol::OpenAiResponses | Protocol::Ollama | Protocol::A2a => {
            if config.protocol == Protocol::A2a {
                headers.insert(
                    "a2a-version",
                    HeaderValue::from_static(crate::provider::a2a::A2aVersion::V0_3.header()),
                );
            }
            if let Some(key) = &config.api_key {
                let mut auth = value(&format!("Bearer {}", key.expose()))?;
                auth.set_sensitive(true);
                headers.insert("authorization", auth);
            }
        }
        Protocol::Anthropic => {
            headers.insert(
                "anthropic-version",
                HeaderValue::from_static(anthropic::API_VERSION),
            );
            if let Some(key) = &config.api_key {
                let mut auth = value(key.expose())?;
                auth.set_sensitive(true);
                headers.insert("x-api-key", auth);
            }
        }
    }
    for (name, text) in &config.headers {
        let name = HeaderName::try_from(name.as_str())
            .map_err(|_| LlmError::Configuration(format!("invalid header name {name:?}")))?;
        headers.insert(name, value(text)?);
    }
    Ok(headers)
}

impl Inner {
    /// A request body as it goes: to a remote A2A agent, in the version its card names (the
    /// card read once; 0.3 while it cannot be read, and it is asked again on the next call).
    /// The body was made in that version when it was known already, else in 0.3's shape.
    async fn settle_a2a(
        &self,
        body: Result<serde_json::Value, LlmError>,
    ) -> Result<serde_json::Value, LlmError> {
        if self.config.protocol != Protocol::A2a || self.a2a_version.get().is_some() {
            return body;
        }
        let timeout = self.config.transport.first_byte_timeout;
        let found = crate::provider::a2a::discover_version(
            &self.http,
            &self.endpoint,
            &self.headers,
            timeout,
        )
        .await;
        let Some(version) = found else {
            return body;
        };
        let version = *self.a2a_version.get_or_init(|| version);
        body.map(|body| crate::provider::a2a::from_v03(body, version))
    }

    /// Sends one attempt and checks the status.
    async fn send(&self, body: Bytes) -> Result<reqwest::Response, LlmError> {
        let mut headers = self.headers.clone();
        if let Some(version) = self.a2a_version.get() {
            headers.insert(
                "a2a-version",
                reqwest::header::HeaderValue::from_static(version.header()),
            );
        }
        crate::trace_context::inject(&mut headers);
        let request = self.http.post(&self.endpoint).headers(headers).body(body);
        self.dispatch(&self.endpoint, request).await
    }

    /// Sends `request` (to `url`) within the first-byte timeout and checks the status: a
    /// redirect or an error status is a typed error.
    async fn dispatch(
        &self,
        url: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, LlmError> {
        let transport = &self.config.transport;
        let response =
            match tokio::time::timeout(transport.first_byte_timeout, request.send()).await {
                Err(_) => {
                    return Err(LlmError::Timeout {
                        kind: crate::TimeoutKind::FirstByte,
                        after: transport.first_byte_timeout,
                    });
                }
                Ok(Err(error)) => return Err(request_error(&error, transport)),
                Ok(Ok(response)) => response,
            };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        if status.is_redirection() {
            return Err(redirect_error(self.config.protocol, url, &response));
        }
        let headers = response.headers().clone();
        let body = read_body(response, transport.idle_timeout, 64 * 1024)
            .await
            .unwrap_or_default();
        Err(error_from_response(
            self.config.protocol,
            status.as_u16(),
            &headers,
            &body,
        ))
    }

    /// Decides whether to retry after `error`; waits the backoff if so.
    async fn backoff(
        &self,
        attempt: u32,
        error: &LlmError,
        deadline: Option<Instant>,
        cancel: &CancellationToken,
    ) -> Result<(), ()> {
        let Some(delay) = self.config.transport.retry.delay(attempt, error) else {
            return Err(());
        };
        if deadline.is_some_and(|deadline| Instant::now() + delay >= deadline) {
            return Err(());
        }
        tracing::warn!(
            provider = self.config.protocol.name(),
            model = %self.config.model,
            attempt = attempt + 1,
            delay_ms = delay.as_millis() as u64,
            error = %error,
            "retrying model call"
        );
        tokio::select! {
            biased;
            _ = cancel.cancelled() => Err(()),
            _ = tokio::time::sleep(delay) => Ok(()),
        }
    }
}

/// The error for a 3xx answer: redirects are never followed for model providers (the request
/// carries the API key), so the error names where the endpoint pointed.
fn redirect_error(protocol: Protocol, endpoint: &str, response: &reqwest::Response) -> LlmError {
    let status = response.status().as_u16();
    let target = response
        .headers()
        .get(reqwest::header::LOCATION)
        .map(|location| String::from_utf8_lossy(location.as_bytes()).into_owned());
    let message = match target {
        Some(target) => format!(
            "{endpoint} redirected to {target}; redirects are not followed for model providers \
             (the API key would go along): set the model's base URL to the final address"
        ),
        None => format!(
            "{endpoint} answered a redirect without a Location; redirects are not followed for \
             model providers"
        ),
    };
    LlmError::Provider(Box::new(ProviderError::new(
        protocol.name(),
        Some(status),
        None,
        None,
        message,
        "",
    )))
}

/// Reads a whole body, up to `limit` bytes, with the idle timeout between chunks.
async fn read_body(
    response: reqwest::Response,
    idle: std::time::Duration,
    limit: usize,
) -> Result<Vec<u8>, LlmError> {
    let mut body = Vec::new();
    let chunks = body_chunks(response, idle);
    futures::pin_mut!(chunks);
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk?;
        if body.len() + chunk.len() > limit {
            let room = limit - body.len();
            body.extend_from_slice(&chunk[..room]);
            return Err(LlmError::MalformedResponse {
                detail: format!("the response body is larger than {limit} bytes"),
                raw: String::new(),
            });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Whether an event carries model output (after which a call is never retried).
fn is_output(event: &ModelEvent) -> bool {
    !matches!(event, ModelEvent::Completed { .. })
}

impl ModelClient for HttpModelClient {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ModelStream {
        let inner = Arc::clone(&self.inner);
        let body = self.request_body(&request, true);
        Box::pin(async_stream::stream! {
            // Boxed: the card is read once, and the stream's state lasts as long as the answer.
            let body = Box::pin(inner.settle_a2a(body)).await;
            let body = match body.and_then(|body| serialize(&body)) {
                Ok(body) => body,
                Err(error) => {
                    yield Err(error);
                    return;
                }
            };
            let transport = &inner.config.transport;
            let total = transport.total_timeout;
            let deadline = total.map(|total| Instant::now() + total);
            let mut attempt = 0;
            loop {
                // The send is boxed: the stream's state lasts as long as the answer, and the
                // send, needed only until the headers come, is half of it inline.
                let sent = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => Err(LlmError::Cancelled),
                    sent = until_deadline(deadline, total, Box::pin(inner.send(body.clone()))) => sent,
                };
                let failure = match sent {
                    Err(error) => error,
                    Ok(response) => {
                        let events = decode_stream(
                            inner.config.protocol,
                            body_chunks(response, transport.idle_timeout),
                        );
                        futures::pin_mut!(events);
                        // Made once for the whole answer, not per chunk (see `past_deadline`).
                        let cancelled = cancel.cancelled();
                        futures::pin_mut!(cancelled);
                        let expiry = past_deadline(deadline, total);
                        futures::pin_mut!(expiry);
                        let mut emitted = false;
                        loop {
                            let next = tokio::select! {
                                biased;
                                () = &mut cancelled => Some(Err(LlmError::Cancelled)),
                                next = events.next() => next,
                                error = &mut expiry => Some(Err(error)),
                            };
                            match next {
                                Some(Ok(event)) => {
                                    emitted |= is_output(&event);
                                    let completed = matches!(event, ModelEvent::Completed { .. });
                                    yield Ok(event);
                                    if completed {
                                        return;
                                    }
                                }
                                Some(Err(error)) if emitted => {
                                    yield Err(error);
                                    return;
                                }
                                Some(Err(error)) => break error,
                                None => {
                                    yield Err(LlmError::StreamEndedEarly {
                                        detail: "the decoder stopped without a response".into(),
                                    });
                                    return;
                                }
                            }
                        }
                    }
                };
                if matches!(failure, LlmError::Cancelled)
                    || inner.backoff(attempt, &failure, deadline, &cancel).await.is_err()
                {
                    yield Err(if cancel.is_cancelled() { LlmError::Cancelled } else { failure });
                    return;
                }
                attempt += 1;
            }
        })
    }

    fn context(&self) -> crate::tokens::ModelContext {
        let mut context = self.inner.context.clone();
        // A configured window wins; a stated one beats the known one and the fallback.
        if self.inner.config.context_window.is_none()
            && let Some(window) = self.inner.stated_window.get()
        {
            context.window = *window;
            context.window_known = true;
        }
        context
    }

    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ModelResponse, LlmError>> {
        let inner = Arc::clone(&self.inner);
        let body = self.request_body(&request, false);
        Box::pin(async move {
            let body = serialize(&Box::pin(inner.settle_a2a(body)).await?)?;
            let idle = inner.config.transport.idle_timeout;
            inner
                .with_retries(&cancel, || async {
                    let response = inner.send(body.clone()).await?;
                    let bytes = read_body(response, idle, MAX_BODY_BYTES).await?;
                    decode_whole(inner.config.protocol, &bytes)
                })
                .await
        })
    }

    fn transcribe(
        &self,
        clip: AudioClip,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<String, LlmError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            if inner.config.protocol != Protocol::OpenAi {
                return Err(LlmError::Configuration(format!(
                    "{} models do not transcribe audio; register the speech model with the \
                     openai protocol (POST /audio/transcriptions)",
                    inner.config.protocol.name()
                )));
            }
            inner
                .with_retries(&cancel, || inner.transcribe_once(&clip))
                .await
        })
    }
}

impl Inner {
    /// Makes `attempt` until it succeeds, the retry policy gives up, the total timeout passes
    /// or `cancel` fires (one non-streamed call: a whole answer, or a transcript).
    async fn with_retries<T, F, Fut>(
        &self,
        cancel: &CancellationToken,
        mut attempt: F,
    ) -> Result<T, LlmError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, LlmError>>,
    {
        let total = self.config.transport.total_timeout;
        let deadline = total.map(|total| Instant::now() + total);
        let mut tries = 0;
        loop {
            let result = tokio::select! {
                biased;
                _ = cancel.cancelled() => Err(LlmError::Cancelled),
                result = until_deadline(deadline, total, attempt()) => result,
            };
            let failure = match result {
                Ok(value) => return Ok(value),
                Err(error) => error,
            };
            if matches!(failure, LlmError::Cancelled)
                || self
                    .backoff(tries, &failure, deadline, cancel)
                    .await
                    .is_err()
            {
                return Err(if cancel.is_cancelled() {
                    LlmError::Cancelled
                } else {
                    failure
                });
            }
            tries += 1;
        }
    }
}

/// The largest transcription answer read.
const MAX_TRANSCRIPT_BYTES: usize = 4 * 1024 * 1024;

impl Inner {
    /// One transcription attempt: the clip as a multipart upload, the `text` of the answer.
    async fn transcribe_once(&self, clip: &AudioClip) -> Result<String, LlmError> {
        let url = format!(
            "{}/audio/transcriptions",
            self.config.base_url.trim_end_matches('/')
        );
        let format = clip.format.to_ascii_lowercase();
        let file = reqwest::multipart::Part::stream(reqwest::Body::from(clip.bytes.clone()))
            .file_name(format!("audio.{format}"))
            .mime_str(&format!("audio/{format}"))
            .map_err(|_| LlmError::Configuration(format!("invalid audio format {format:?}")))?;
        let form = reqwest::multipart::Form::new()
            .text("model", self.config.model.clone())
            .text("response_format", "json")
            .part("file", file);
        let mut headers = self.headers.clone();
        headers.remove(reqwest::header::CONTENT_TYPE);
        let request = self.http.post(&url).headers(headers).multipart(form);
        let response = self.dispatch(&url, request).await?;
        let idle = self.config.transport.idle_timeout;
        transcript_text(&read_body(response, idle, MAX_TRANSCRIPT_BYTES).await?)
    }
}

/// The text of a transcription answer (`{"text": …}`; a plain-text body as it is).
fn transcript_text(body: &[u8]) -> Result<String, LlmError> {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(serde_json::Value::Object(object)) => match object.get("text") {
            Some(serde_json::Value::String(text)) => Ok(text.trim().to_owned()),
            _ => Err(LlmError::MalformedResponse {
                detail: "the transcription answer has no `text`".into(),
                raw: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
            }),
        },
        _ => match std::str::from_utf8(body) {
            Ok(text) if !text.trim_start().starts_with(['{', '[']) => Ok(text.trim().to_owned()),
            _ => Err(LlmError::MalformedResponse {
                detail: "the transcription answer is neither JSON with `text` nor text".into(),
                raw: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
            }),
        },
    }
}

fn serialize(body: &serde_json::Value) -> Result<Bytes, LlmError> {
    serde_json::to_vec(body)
        .map(Bytes::from)
        .map_err(|error| LlmError::Configuration(format!("cannot serialise the request: {error}")))
}
