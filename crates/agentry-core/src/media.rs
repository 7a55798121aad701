//! Images and audio for models that cannot take them, and the capability labels that say which
//! can.
//!
//! A model is labelled with what it takes besides text ([`VISION`], [`AUDIO`]). When a run's
//! model lacks a label and the run has a model to stand in (a vision model that describes
//! images, a speech model that transcribes audio: the run's own choice, else the model labelled
//! [`READ_IMAGE`] or [`SPEECH`]), [`MediaAdapter`] replaces every image and audio part of each
//! request by the stand-in's text before the call, so the model reads a description or a
//! transcript instead of failing on a part it cannot take. The log keeps the original parts;
//! the texts are cached per content (and model), so a conversation's images are described once
//! per process, not once per round.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use base64::Engine;
use futures::StreamExt;
use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use agentry_llm::{
    AudioClip, GenerationParams, LlmError, ModelClient, ModelRequest, ModelStream, collect_response,
};
use agentry_types::{ContentPart, ImageSource, Message, ModelResponse, ToolResultPart};

/// The model takes images.
pub const VISION: &str = "vision";
/// The seed's spelling of [`VISION`].
pub const VLM: &str = "vlm";
/// The model takes audio.
pub const AUDIO: &str = "audio";
/// The model reasons before it answers (shown to people; nothing changes in a request).
pub const THINKING: &str = "thinking";
/// The model writes compaction summaries and session titles when nothing else is named.
pub const SUMMARY: &str = "summary";
/// The model describes images for models that cannot see them (the seed's label).
pub const READ_IMAGE: &str = "read-image";
/// The model transcribes audio for models that cannot hear it (`/audio/transcriptions`).
pub const SPEECH: &str = "speech";

/// The labels that mean something to the runtime, with what they mean.
pub const KNOWN_LABELS: &[(&str, &str)] = &[
    (VISION, "takes images"),
    (VLM, "takes images (the seed's spelling)"),
    (AUDIO, "takes audio"),
    (THINKING, "reasons before answering"),
    (SUMMARY, "writes compaction summaries and titles by default"),
    (READ_IMAGE, "describes images for models without vision"),
    (SPEECH, "transcribes audio for models without audio"),
];

/// Whether a model with `labels` takes images.
pub fn sees_images(labels: &[String]) -> bool {
    labels.iter().any(|label| label == VISION || label == VLM)
}

/// Whether a model with `labels` takes audio.
pub fn hears_audio(labels: &[String]) -> bool {
    labels.iter().any(|label| label == AUDIO)
}

/// Which models stand in for a run's model, by id (part of the run's state, so a resumed run
/// keeps them).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MediaRoute {
    /// The vision model that describes images for the run's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub describe_images: Option<String>,
    /// The speech model that transcribes audio for the run's model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transcribe_audio: Option<String>,
}

impl MediaRoute {
    /// Whether nothing stands in.
    pub fn is_empty(&self) -> bool {
        self.describe_images.is_none() && self.transcribe_audio.is_none()
    }
}

/// What the vision model is asked about each image.
pub const DESCRIBE_PROMPT: &str = "Describe this image in detail for someone who cannot see it: \
what it shows, its layout, colours and any charts or diagrams. Transcribe every piece of text \
in it exactly. Answer with the description only.";

/// The most output tokens one description may take.
const DESCRIPTION_TOKENS: u32 = 1024;

/// A cache key: the SHA-256 of what was described or transcribed, and by which model.
type MediaKey = [u8; 32];

/// The texts, and their keys oldest first.
type CachedTexts = (HashMap<MediaKey, String>, VecDeque<MediaKey>);

/// Texts already made, by content and model (bounded; the oldest go first).
pub struct MediaCache {
    capacity: usize,
    entries: Mutex<CachedTexts>,
}

impl MediaCache {
    /// A cache holding at most `capacity` texts.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: Mutex::new((HashMap::new(), VecDeque::new())),
        }
    }

    fn get(&self, key: &MediaKey) -> Option<String> {
        let entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        entries.0.get(key).cloned()
    }

    fn put(&self, key: MediaKey, text: String) {
        let mut entries = self
            .entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (map, order) = &mut *entries;
        if map.insert(key, text).is_none() {
            order.push_back(key);
        }
        while order.len() > self.capacity {
            if let Some(oldest) = order.pop_front() {
                map.remove(&oldest);
            }
        }
    }

    /// How many texts it holds.
    pub fn len(&self) -> usize {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0
            .len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Debug for MediaCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MediaCache")
            .field("capacity", &self.capacity)
            .field("len", &self.len())
            .finish()
    }
}

impl Default for MediaCache {
    fn default() -> Self {
        Self::new(512)
    }
}

fn cache_key(kind: &str, model: &str, content: &[&[u8]]) -> MediaKey {
    let mut hasher = Sha256::new();
    hasher.update(kind.as_bytes());
    hasher.update([0]);
    hasher.update(model.as_bytes());
    hasher.update([0]);
    for piece in content {
        hasher.update((piece.len() as u64).to_le_bytes());
        hasher.update(piece);
    }
    hasher.finalize().into()
}

/// A model client that gives its model text in place of the images and audio it cannot take
/// (see the module docs).
#[derive(Clone)]
pub struct MediaAdapter {
    inner: Arc<dyn ModelClient>,
    describer: Option<(String, Arc<dyn ModelClient>)>,
    transcriber: Option<(String, Arc<dyn ModelClient>)>,
    cache: Arc<MediaCache>,
}

impl MediaAdapter {
    /// Wraps `inner`; `describer` and `transcriber` are the stand-ins, by id.
    pub fn new(
        inner: Arc<dyn ModelClient>,
        describer: Option<(String, Arc<dyn ModelClient>)>,
        transcriber: Option<(String, Arc<dyn ModelClient>)>,
        cache: Arc<MediaCache>,
    ) -> Self {
        Self {
            inner,
            describer,
            transcriber,
            cache,
        }
    }

    /// The request with each image and audio part the stand-ins cover replaced by text.
    pub async fn adapt(
        &self,
        mut request: ModelRequest,
        cancel: &CancellationToken,
    ) -> Result<ModelRequest, LlmError> {
        for message in &mut request.messages {
            match message {
                Message::User { content } => {
                    for part in content.iter_mut() {
                        let text = match part {
                            ContentPart::Image { source } => match &self.describer {
                                Some(describer) => {
                                    Some(self.describe(describer, source, cancel).await?)
                                }
                                None => None,
                            },
                            ContentPart::Audio { format, data } => match &self.transcriber {
                                Some(transcriber) => {
                                    Some(self.transcribe(transcriber, format, data, cancel).await?)
                                }
                                None => None,
                            },
                            ContentPart::Text { .. } => None,
                        };
                        if let Some(text) = text {
                            *part = ContentPart::Text { text };
                        }
                    }
                }
                Message::Tool(result) => {
                    let Some(describer) = &self.describer else {
                        continue;
                    };
                    for part in result.content.iter_mut() {
                        if let ToolResultPart::Image { source } = part {
                            let text = self.describe(describer, source, cancel).await?;
                            *part = ToolResultPart::Text { text };
                        }
                    }
                }
                Message::System { .. } | Message::Assistant { .. } => {}
            }
        }
        Ok(request)
    }

    async fn describe(
        &self,
        (id, client): &(String, Arc<dyn ModelClient>),
        source: &ImageSource,
        cancel: &CancellationToken,
    ) -> Result<String, LlmError> {
        let key = match source {
            ImageSource::Url { url } => cache_key("image-url", id, &[url.as_bytes()]),
            ImageSource::Base64 { media_type, data } => {
                cache_key("image", id, &[media_type.as_bytes(), data.as_bytes()])
            }
        };
        if let Some(text) = self.cache.get(&key) {
            return Ok(text);
        }
        let request = ModelRequest {
            messages: vec![Message::User {
                content: vec![
                    ContentPart::text(DESCRIBE_PROMPT),
                    ContentPart::Image {
                        source: source.clone(),
                    },
                ],
            }],
            tools: Vec::new(),
            params: GenerationParams {
                max_tokens: Some(DESCRIPTION_TOKENS),
                ..GenerationParams::default()
            },
        };
        let response = collect_response(client.stream(request, cancel.clone()))
            .await
            .map_err(|error| attributed(error, &format!("the vision model {id:?}")))?;
        let description = answer(&response);
        if description.is_empty() {
            return Err(LlmError::MalformedResponse {
                detail: format!("the vision model {id:?} described an image with no text"),
                raw: String::new(),
            });
        }
        tracing::debug!(model = %id, chars = description.len(), "described an image");
        let text = format!("[image, as the vision model {id} describes it: {description}]");
        self.cache.put(key, text.clone());
        Ok(text)
    }

    async fn transcribe(
        &self,
        (id, client): &(String, Arc<dyn ModelClient>),
        format: &str,
        data: &str,
        cancel: &CancellationToken,
    ) -> Result<String, LlmError> {
        let key = cache_key("audio", id, &[format.as_bytes(), data.as_bytes()]);
        if let Some(text) = self.cache.get(&key) {
            return Ok(text);
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map_err(|_| LlmError::Configuration("an audio part is not base64".into()))?;
        let clip = AudioClip {
            format: format.to_owned(),
            bytes: bytes.into(),
        };
        let transcript = client
            .transcribe(clip, cancel.clone())
            .await
            .map_err(|error| attributed(error, &format!("the speech model {id:?}")))?;
        tracing::debug!(model = %id, chars = transcript.len(), "transcribed audio");
        let text = format!("[audio, as the speech model {id} transcribes it: {transcript}]");
        self.cache.put(key, text.clone());
        Ok(text)
    }
}

/// The text parts of a response, joined and trimmed.
fn answer(response: &ModelResponse) -> String {
    response
        .content
        .iter()
        .filter_map(|part| match part {
            agentry_types::AssistantPart::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// `error` with its message saying which stand-in failed (its code and retry advice kept).
fn attributed(error: LlmError, who: &str) -> LlmError {
    match error {
        LlmError::Provider(mut provider) => {
            provider.message = format!("{who}: {}", provider.message);
            LlmError::Provider(provider)
        }
        LlmError::Connection { message } => LlmError::Connection {
            message: format!("{who}: {message}"),
        },
        LlmError::MalformedResponse { detail, raw } => LlmError::MalformedResponse {
            detail: format!("{who}: {detail}"),
            raw,
        },
        LlmError::StreamEndedEarly { detail } => LlmError::StreamEndedEarly {
            detail: format!("{who}: {detail}"),
        },
        LlmError::Configuration(message) => LlmError::Configuration(format!("{who}: {message}")),
        other => other,
    }
}

impl ModelClient for MediaAdapter {
    fn stream(&self, request: ModelRequest, cancel: CancellationToken) -> ModelStream {
        let this = self.clone();
        Box::pin(
            futures::stream::once(async move {
                match this.adapt(request, &cancel).await {
                    Ok(request) => this.inner.stream(request, cancel),
                    Err(error) => {
                        let failed: ModelStream = Box::pin(futures::stream::iter([Err(error)]));
                        failed
                    }
                }
            })
            .flatten(),
        )
    }

    fn complete(
        &self,
        request: ModelRequest,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<ModelResponse, LlmError>> {
        let this = self.clone();
        Box::pin(async move {
            let request = this.adapt(request, &cancel).await?;
            this.inner.complete(request, cancel).await
        })
    }

    fn context(&self) -> agentry_llm::ModelContext {
        self.inner.context()
    }

    fn transcribe(
        &self,
        clip: AudioClip,
        cancel: CancellationToken,
    ) -> BoxFuture<'static, Result<String, LlmError>> {
        self.inner.transcribe(clip, cancel)
    }
}
