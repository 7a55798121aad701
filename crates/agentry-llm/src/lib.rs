//! Agentry's model layer.
//!
//! One trait, [`ModelClient`], with a streaming and a non-streaming call, and one HTTP
//! implementation, [`HttpModelClient`], that speaks the three protocols Agentry supports: OpenAI
//! chat completions (and compatible servers), Anthropic Messages and Ollama's native API.
//!
//! A call flows through four layers, each in its own module:
//! - [`provider`]: encodes the request for the protocol and decodes its wire events into
//!   normalised deltas; all protocol quirks live here.
//! - `decode`: cuts the body into SSE events or NDJSON lines, feeds the protocol decoder, and
//!   folds deltas with the accumulator.
//! - `accumulator`: live text / thinking / tool-call deltas, then complete tool calls, usage and
//!   the stop reason; a truncated stream or unparseable arguments become typed errors.
//! - [`transport`]: the pooled HTTP client, timeouts, and retries before the first output token.
//!
//! [`tokens`] counts a request's tokens (tiktoken for OpenAI models, a calibrated estimate
//! elsewhere) and knows the context windows of well-known models; [`window`] asks a provider
//! for the window it states (vLLM, llama.cpp, OpenRouter-style listings, Ollama's model info).

mod accumulator;
mod client;
mod config;
mod decode;
mod delta;
mod error;
pub mod provider;
mod request;
pub mod tokens;
pub mod trace_context;
pub mod transport;
pub mod window;

pub use client::{
    AudioClip, HttpModelClient, ModelClient, ModelStream, collect_response, encode_request,
};
pub use config::{ApiKey, OpenAiOptions, ProviderConfig};
pub use decode::decode_stream;
pub use error::{LlmError, ProviderError, RAW_BODY_LIMIT, TimeoutKind};
pub use provider::Protocol;
pub use request::{GenerationParams, ModelRequest, ThinkingConfig};
pub use tokens::{ModelContext, TokenCounter, known_context_window};
pub use transport::{RetryPolicy, TransportConfig, http_client, install_tls_provider};

pub use tokio_util::sync::CancellationToken;
