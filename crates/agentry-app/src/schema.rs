//! OpenAPI schemas of the application's types that their Rust shape does not describe: the
//! approval policy (a type of `agentry-core`, documented by example) and the model protocol.
//! With the `openapi` feature (the HTTP crate turns it on) the app's types derive
//! `utoipa::ToSchema`, so the HTTP API documents them without copies; without it the app
//! builds with no OpenAPI dependency.

use serde_json::Value;
#[cfg(feature = "openapi")]
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};

/// An approval policy: which tool calls wait for a person before they run.
///
/// Per tool (`tools`, by name; `default` for the others): `"always"` (every call waits),
/// `"never"` (the default), or a rule on the arguments: `{"ask_if": MATCHERS}` (wait when one
/// matches) or `{"allow_if": MATCHERS}` (run at once only when every checked argument matches).
/// Matchers: `commands` (globs with `*` and `?`, or `re:<regex>`, on `command`/`cmd`/`script`),
/// `path_prefixes` (on `path`, `file`, `dir`, `*_path`…; normalised, so `src/../etc` is not
/// under `src`), `domains` (on `url`/`uri`/`urls`; `*.example.com` for subdomains).
/// `unknown_outcome: "ask"` sends a non-idempotent call whose outcome a crash left unknown to a
/// person instead of failing it.
#[cfg(feature = "openapi")]
#[derive(Debug, Clone, utoipa::ToSchema)]
#[schema(example = json!({"tools": {"exec": {"ask_if": {"commands": ["rm *", "re:^git\\s+push"]}},
    "write_file": {"allow_if": {"path_prefixes": ["src/"]}}, "fetch": {"allow_if": {"domains": ["docs.rs"]}},
    "delete_everything": "always"}, "default": "never", "unknown_outcome": "ask"}))]
pub struct ApprovalPolicyDoc {
    /// Policies by tool name: `"always"`, `"never"` or a rule.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub tools: Option<Value>,
    /// The policy of tools not named in `tools`: `"always"`, `"never"` or a rule.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub default: Option<Value>,
    /// `interrupt` (default) or `ask`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^(interrupt|ask)$"))]
    pub unknown_outcome: Option<String>,
}

/// The wire protocols a model may use (any spelling `Protocol` parses).
#[cfg(feature = "openapi")]
pub fn protocol_schema() -> Schema {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([
            "openai",
            "openai-compatible",
            "openai_compatible",
            "openai-responses",
            "openai_responses",
            "anthropic",
            "ollama",
            "a2a",
        ]))
        .description(Some("The wire protocol (default `openai`)."))
        .into()
}

/// A model's price, in US dollars per million tokens.
#[cfg(feature = "openapi")]
pub fn price_schema() -> Schema {
    let rate = |description: &str| {
        ObjectBuilder::new()
            .schema_type(Type::Number)
            .minimum(Some(0.0))
            .description(Some(description))
    };
    ObjectBuilder::new()
        .property(
            "input",
            rate("Per million prompt tokens not served from a cache."),
        )
        .property(
            "cached_input",
            rate("Per million prompt tokens read from a cache (default: `input`)."),
        )
        .property(
            "cache_write",
            rate("Per million prompt tokens written to a cache (default: `input`)."),
        )
        .property("output", rate("Per million generated tokens."))
        .required("input")
        .required("output")
        .additional_properties(Some(
            utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
        ))
        .description(Some(
            "What the model costs, in US dollars per million tokens.",
        ))
        .into()
}

/// A tool call waiting for a decision.
#[derive(Debug, Clone)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingCall {
    /// The call as the model asked for it: `id`, `name`, `arguments`.
    #[cfg_attr(feature = "openapi", schema(value_type = Object))]
    pub call: Value,
    /// Why it needs approval.
    pub reason: String,
}

/// An MCP server's request for input, made during one of the run's tool calls, waiting for a
/// person. Answer with `POST /v1/runs/{run_id}/approvals` and `elicitation_id`: `approve` with
/// `content` (a form's answer, matching `requested_schema`; nothing for a URL request once the
/// page was visited) or `reject` (declined: the tool goes on without it).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PendingElicitation {
    /// The request's id.
    pub elicitation_id: String,
    /// The run.
    pub run_id: String,
    /// Its session.
    pub session_id: Option<String>,
    /// The tool call in flight that the request belongs to.
    pub call_id: String,
    /// That call's tool.
    pub tool: String,
    /// The MCP server asking.
    pub server: String,
    /// What it asks, for a person.
    pub message: String,
    /// `form` or `url`.
    #[cfg_attr(feature = "openapi", schema(pattern = "^(form|url)$"))]
    pub mode: String,
    /// For a form: the JSON Schema of the answer.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub requested_schema: Option<Value>,
    /// For a URL request: the page to visit.
    pub url: Option<String>,
    /// For a URL request: the server's id for it.
    pub elicitation_id_on_server: Option<String>,
    /// When it was asked (Unix milliseconds).
    pub created_at_ms: u64,
}

/// The name serde gives a unit enum value (`"native"`, `"connected"`, …); empty for anything
/// else. Views show the domain's enums by these names.
pub fn serde_name<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        _ => String::new(),
    }
}
