//! Tools written as Rust functions, with the argument schema derived from the argument type.
//!
//! [`FunctionTool::new`] takes an async function of a `serde` + `schemars` argument type; the
//! JSON Schema the model sees is generated from that type ([`arguments_schema`]) and cleaned to
//! what every provider accepts.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use agentry_types::ToolSpec;
use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use super::{Tool, ToolContext, ToolError, ToolOutput, ToolRisk};

type Handler =
    dyn Fn(Value, ToolContext) -> BoxFuture<'static, Result<ToolOutput, ToolError>> + Send + Sync;

/// A tool backed by an async Rust function.
///
/// ```
/// use agentry_core::tool::{FunctionTool, ToolOutput};
/// use schemars::JsonSchema;
/// use serde::Deserialize;
///
/// /// Arguments of `add`.
/// #[derive(Deserialize, JsonSchema)]
/// struct AddArguments {
///     /// The first number.
///     a: i64,
///     /// The second number.
///     b: i64,
/// }
///
/// let tool = FunctionTool::new("add", "Adds two numbers.", |args: AddArguments, _context| async move {
///     Ok(ToolOutput::json(serde_json::json!({ "sum": args.a + args.b })))
/// })
/// .idempotent();
/// # let _ = tool;
/// ```
#[derive(Clone)]
pub struct FunctionTool {
    spec: ToolSpec,
    timeout: Option<Duration>,
    idempotent: bool,
    risk: ToolRisk,
    handler: Arc<Handler>,
}

impl fmt::Debug for FunctionTool {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("FunctionTool")
            .field("spec", &self.spec)
            .field("timeout", &self.timeout)
            .field("idempotent", &self.idempotent)
            .finish_non_exhaustive()
    }
}

impl FunctionTool {
    /// A tool named `name` that runs `function` on arguments deserialised into `Args`.
    ///
    /// The schema is derived from `Args` (see [`arguments_schema`]). Arguments that pass the
    /// schema but still do not deserialise into `Args` are [`ToolError::InvalidArguments`].
    pub fn new<Args, F, Fut>(
        name: impl Into<String>,
        description: impl Into<String>,
        function: F,
    ) -> Self
    where
        Args: DeserializeOwned + schemars::JsonSchema,
        F: Fn(Args, ToolContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<ToolOutput, ToolError>> + Send + 'static,
    {
        let raw = schemars::schema_for!(Args).to_value();
        // A unit struct derives `{"type": "null"}`; the model sends `{}` and it reads as `null`.
        let unit_arguments = raw.get("type").and_then(Value::as_str) == Some("null");
        let parameters = clean_schema(raw);
        let handler = move |arguments: Value, context: ToolContext| {
            let arguments = match arguments {
                Value::Object(map) if unit_arguments && map.is_empty() => Value::Null,
                other => other,
            };
            match serde_json::from_value::<Args>(arguments) {
                Ok(arguments) => function(arguments, context).boxed(),
                Err(error) => {
                    futures::future::ready(Err(ToolError::InvalidArguments(error.to_string())))
                        .boxed()
                }
            }
        };
        Self {
            spec: ToolSpec::new(name, description, parameters),
            timeout: None,
            idempotent: false,
            risk: ToolRisk::default(),
            handler: Arc::new(handler),
        }
    }

    /// Sets this tool's timeout, overriding the run's default.
    #[must_use]
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Says what the tool can do (default: read-only, confined).
    #[must_use]
    pub fn with_risk(mut self, risk: ToolRisk) -> Self {
        self.risk = risk;
        self
    }

    /// Marks the tool as safe to run twice with the same arguments.
    #[must_use]
    pub fn idempotent(mut self) -> Self {
        self.idempotent = true;
        self
    }
}

impl Tool for FunctionTool {
    fn spec(&self) -> &ToolSpec {
        &self.spec
    }

    fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    fn idempotent(&self) -> bool {
        self.idempotent
    }

    fn risk(&self) -> ToolRisk {
        self.risk
    }

    fn call(
        &self,
        arguments: Value,
        context: ToolContext,
    ) -> BoxFuture<'static, Result<ToolOutput, ToolError>> {
        (self.handler)(arguments, context)
    }
}

/// The argument schema of a tool taking `Args`, as providers accept it: derived with schemars,
/// without `$schema` and `title`, with `$defs` kept only when referenced, and with a top-level
/// `"type": "object"` and `properties` (empty for a unit-like struct).
///
/// An `Args` that is not a struct-like type keeps its own `type`, and registering the tool fails.
pub fn arguments_schema<Args: schemars::JsonSchema>() -> Value {
    clean_schema(schemars::schema_for!(Args).to_value())
}

fn clean_schema(schema: Value) -> Value {
    let mut object = match schema {
        Value::Object(object) => object,
        // `true` (anything) becomes an open object schema.
        _ => Map::new(),
    };
    object.remove("$schema");
    object.remove("title");
    if let Some(definitions) = object.remove("$defs")
        && object.values().any(contains_ref)
    {
        object.insert("$defs".to_owned(), definitions);
    }
    match object.get("type").and_then(Value::as_str) {
        None | Some("null") => {
            object.insert("type".to_owned(), Value::String("object".to_owned()));
        }
        Some(_) => {}
    }
    if object.get("type").and_then(Value::as_str) == Some("object") {
        object
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
    }
    Value::Object(object)
}

fn contains_ref(value: &Value) -> bool {
    match value {
        Value::Object(object) => object
            .iter()
            .any(|(key, value)| key == "$ref" || contains_ref(value)),
        Value::Array(items) => items.iter().any(contains_ref),
        _ => false,
    }
}
