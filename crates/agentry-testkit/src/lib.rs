//! Test and benchmark support for Agentry's model adapters.
//!
//! The centrepiece is [`MockProvider`], a loopback HTTP server that speaks the OpenAI chat
//! completions, Anthropic Messages and Ollama `/api/chat` protocols. It can
//!
//! - replay recorded real exchanges ([`Fixture`]) byte for byte, optionally cut into chunks at
//!   arbitrary byte offsets, paced, delayed, or cut off mid-body ([`Reply`], [`Chunking`]);
//! - serve scripted turns ([`ScriptedTurn`]) rendered in whichever protocol the request's path
//!   implies, streamed or not as the request asks;
//! - record every request ([`RecordedRequest`]) and check conversation invariants on it
//!   ([`check_request`], [`MockProvider::check_protocol`]).
//!
//! ```no_run
//! # async fn demo() -> Result<(), agentry_testkit::TestkitError> {
//! use agentry_testkit::{MockProvider, Reply, ScriptedTurn};
//! use serde_json::json;
//!
//! let mock = MockProvider::start().await?;
//! mock.enqueue(Reply::scripted(ScriptedTurn::tool_call("get_weather", json!({"city": "Paris"}))));
//! mock.enqueue(Reply::scripted(ScriptedTurn::text("It is sunny.").with_usage(12, 4)));
//! // point an OpenAI client at mock.openai_base_url() ...
//! assert!(mock.check_protocol().is_ok());
//! # Ok(())
//! # }
//! ```
//!
//! [`OtlpReceiver`] takes OpenTelemetry exports (OTLP/HTTP) for the trace tests and benchmarks.
//!
//! [`mcp`] finds and launches the real reference MCP servers that `scripts/install-mcp-servers`
//! installs, for tests that exercise Agentry's MCP client and server against them.

mod error;
mod fixture;
pub mod folder;
pub mod mcp;
mod mock;
pub mod otlp;
mod protocol;
mod render;
mod script;

pub use error::TestkitError;
pub use fixture::{FIXTURES_DIR_ENV, Fixture, FixtureRequest, fixtures_dir};
pub use mock::{Chunking, MockProvider, RecordedRequest, Reply};
pub use otlp::OtlpReceiver;
pub use protocol::{Protocol, ProtocolViolation, check_request};
pub use script::{ScriptedToolCall, ScriptedTurn};
