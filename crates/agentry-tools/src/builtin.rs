//! Built-in tools that need no sandbox.
//!
//! - `current_time`: the current time as RFC 3339 and Unix seconds, in UTC or a fixed offset.
//!
//! The file tools and `fetch` are in [`workspace`](crate::workspace) (they need a workspace and a
//! network policy); the tools that run commands wait for the sandbox.

use std::sync::Arc;

use chrono::{FixedOffset, Offset as _, SecondsFormat, Utc};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use agentry_core::tool::{FunctionTool, Tool, ToolContext, ToolError, ToolOutput};

/// The name of the `current_time` tool.
pub const CURRENT_TIME: &str = "current_time";

/// Every built-in tool.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    vec![Arc::new(current_time())]
}

/// The built-in tool with this name.
pub fn builtin(name: &str) -> Option<Arc<dyn Tool>> {
    builtin_tools()
        .into_iter()
        .find(|tool| tool.spec().name == name)
}

/// Arguments of `current_time`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct CurrentTimeArguments {
    /// "UTC" (the default) or a fixed offset from UTC such as "+02:00" or "-05:30".
    #[serde(default)]
    timezone: Option<String>,
}

/// The `current_time` tool.
fn current_time() -> FunctionTool {
    FunctionTool::new(
        CURRENT_TIME,
        "Returns the current date and time as RFC 3339 text and Unix seconds, in UTC or at a \
         fixed offset from UTC.",
        |arguments: CurrentTimeArguments, _context: ToolContext| async move {
            let offset = parse_timezone(arguments.timezone.as_deref())?;
            let now = Utc::now().with_timezone(&offset);
            let use_z = offset.local_minus_utc() == 0;
            Ok(ToolOutput::json(json!({
                "time": now.to_rfc3339_opts(SecondsFormat::Secs, use_z),
                "unix_seconds": now.timestamp(),
                "timezone": if use_z { "UTC".to_owned() } else { offset.to_string() },
            })))
        },
    )
    .idempotent()
}

/// `None`, "UTC" or "Z" → UTC; "+HH:MM" / "-HH:MM" / "+HHMM" → that offset.
fn parse_timezone(timezone: Option<&str>) -> Result<FixedOffset, ToolError> {
    let Some(timezone) = timezone.map(str::trim) else {
        return Ok(Utc.fix());
    };
    if timezone.eq_ignore_ascii_case("utc") || timezone.eq_ignore_ascii_case("z") {
        return Ok(Utc.fix());
    }
    // chrono's parser reads a leading offset and ignores what follows, so check the shape first.
    let well_formed = matches!(timezone.len(), 5 | 6)
        && timezone.starts_with(['+', '-'])
        && (timezone.len() == 5 || timezone.as_bytes().get(3) == Some(&b':'));
    let parsed = well_formed
        .then(|| timezone.parse::<FixedOffset>().ok())
        .flatten();
    parsed.ok_or_else(|| {
        ToolError::InvalidArguments(format!(
            "unknown timezone {timezone:?}: use \"UTC\" or a fixed offset such as \"+02:00\""
        ))
    })
}
