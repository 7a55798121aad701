//! What a request to make a standalone sandbox or to run a command in one may say, and the
//! checks it passes before anything starts: environments (names, sizes, no NUL), paths, limit
//! overrides (the operator's limits are maxima), argv or a shell line, timeouts. The HTTP API
//! takes these types as its bodies; the schemas describe the same rules.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
#[cfg(feature = "openapi")]
use utoipa::openapi::schema::{Object, ObjectBuilder, Type};

use agentry_sandbox::{ExecRequest, IdleAction, SandboxPool, SandboxSpec};

use crate::error::AppError;

/// A command's timeout when the request names none (seconds); the most a waiting or streamed
/// command may have.
pub const DEFAULT_TIMEOUT_SECS: u64 = 60;
/// The longest timeout of a command the request waits for or streams (seconds).
pub const MAX_TIMEOUT_SECS: u64 = 3600;
/// A background command's timeout when the request names none (seconds).
pub const DEFAULT_BACKGROUND_TIMEOUT_SECS: u64 = 3600;
/// The longest timeout of a background command (seconds).
pub const MAX_BACKGROUND_TIMEOUT_SECS: u64 = 86_400;

/// The most bytes of argv, environment and working directory a command may have in all.
const MAX_COMMAND_BYTES: usize = 48 * 1024;
/// The most environment variables a sandbox or a command may be given.
const MAX_ENV_VARS: usize = 256;
/// The longest path accepted (bytes).
const MAX_PATH_BYTES: usize = 4096;

/// The body of `POST /v1/sandboxes`; every field is optional (`{}` gives the defaults).
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxRequest {
    /// Environment variables every command gets, added to the minimal base (`PATH`, `HOME`,
    /// `LANG`, `TMPDIR`).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = env_schema))]
    pub env: BTreeMap<String, String>,
    /// Limits that replace the server's defaults.
    #[serde(default)]
    pub limits: Option<LimitOverrides>,
    /// A snapshot to start from (`POST /v1/sandboxes/{id}/snapshots`): the new sandbox's
    /// workspace is a copy of the snapshot's files (a fork; the snapshot stays as it is).
    #[serde(default)]
    pub snapshot_id: Option<String>,
    /// What the idle timeout (`limits.idle_timeout_secs`) does: `close` the sandbox (the
    /// default), or `pause` it — its processes frozen, their memory and its files kept — so
    /// that the next command or file operation resumes it by itself. A paused sandbox still
    /// ends at its wall-time limit; where the host cannot pause it, it is closed.
    #[serde(default)]
    pub on_idle: Option<OnIdle>,
}

/// What a sandbox's idle timeout does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum OnIdle {
    /// Close it.
    #[default]
    Close,
    /// Pause it until its next command or file operation.
    Pause,
}

impl From<OnIdle> for IdleAction {
    fn from(on_idle: OnIdle) -> Self {
        match on_idle {
            OnIdle::Close => IdleAction::Close,
            OnIdle::Pause => IdleAction::Pause,
        }
    }
}

impl From<IdleAction> for OnIdle {
    fn from(action: IdleAction) -> Self {
        match action {
            IdleAction::Pause => OnIdle::Pause,
            _ => OnIdle::Close,
        }
    }
}

/// Limits for one sandbox; a field left out keeps the server's default. The server's defaults
/// (`default_limits` of `GET /v1/sandbox/capabilities`) are also maxima: a value above one is
/// refused (400 naming the limit and the maximum). The ranges below apply where the server sets
/// no limit.
#[derive(Debug, Clone, Default, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    /// Memory of the whole sandbox (per process where only rlimits are available), bytes:
    /// 64 MiB to 1 TiB.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 67_108_864, maximum = 1_099_511_627_776_u64)
    )]
    pub memory_bytes: Option<u64>,
    /// Processes and threads in the sandbox: 8 to 65536.
    #[cfg_attr(feature = "openapi", schema(minimum = 8, maximum = 65_536))]
    pub max_processes: Option<u64>,
    /// CPU share in percent of one core (cgroups only): 1 to 25600.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 25_600))]
    pub cpu_percent: Option<u32>,
    /// CPU time of each process, seconds: 1 to 604800.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 604_800))]
    pub cpu_time_secs: Option<u64>,
    /// Lifetime of the sandbox, seconds: it is closed when it runs out. 1 to 604800.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 604_800))]
    pub wall_time_secs: Option<u64>,
    /// Close the sandbox after this long without a request and with no command running,
    /// seconds: 1 to 86400.
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 86_400))]
    pub idle_timeout_secs: Option<u64>,
    /// The largest file a process may write, bytes: 1 KiB to 1 TiB.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1024, maximum = 1_099_511_627_776_u64)
    )]
    pub file_size_bytes: Option<u64>,
    /// Open files per process: 16 to 4096.
    #[cfg_attr(feature = "openapi", schema(minimum = 16, maximum = 4096))]
    pub open_files: Option<u64>,
    /// Size of the sandbox's `/tmp`, bytes: 1 MiB to 64 GiB.
    #[cfg_attr(
        feature = "openapi",
        schema(minimum = 1_048_576, maximum = 68_719_476_736_u64)
    )]
    pub tmp_size_bytes: Option<u64>,
}

/// The body of `POST /v1/sandboxes/{id}/exec`: exactly one of `argv` and `command`.
#[derive(Debug, Clone, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct ExecBody {
    /// The program and its arguments; the program is looked up in `PATH` unless it holds a
    /// `/`. No NUL anywhere.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(min_items = 1, max_items = 4096))]
    pub argv: Option<Vec<String>>,
    /// A shell command line, run as `/bin/sh -c <command>`. No NUL.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 49_152))]
    pub command: Option<String>,
    /// Environment variables for this command.
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(schema_with = env_schema))]
    pub env: BTreeMap<String, String>,
    /// The working directory (default: the workspace).
    #[serde(default)]
    #[cfg_attr(
        feature = "openapi",
        schema(min_length = 1, max_length = 4096, pattern = "^[^\\u0000]+$")
    )]
    pub cwd: Option<String>,
    /// Written to the command's stdin, which is then closed (without it, stdin is `/dev/null`).
    #[serde(default)]
    pub stdin: Option<String>,
    /// Kill the command (and everything it started) after this many seconds: 1 to 3600
    /// (default 60); in the background 1 to 86400 (default 3600).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 86_400))]
    pub timeout_secs: Option<u64>,
    /// Start it in the background: answer `202` with its `exec_id` at once (see
    /// `/v1/sandboxes/{id}/processes`).
    #[serde(default)]
    pub background: bool,
    /// Stream its output as server-sent events (`stdout`, `stderr`, then `exit`) instead of
    /// waiting for it. Not with `background`.
    #[serde(default)]
    pub stream: bool,
}

/// The schema of an environment: names `[A-Za-z_][A-Za-z0-9_]*`, values without NUL.
#[cfg(feature = "openapi")]
pub fn env_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[A-Za-z_][A-Za-z0-9_]{0,255}$")),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some("^[^\\u0000]*$")),
        ))
        .max_properties(Some(MAX_ENV_VARS))
        .description(Some(
            "Environment variables: names `[A-Za-z_][A-Za-z0-9_]*` (at most 256 characters), \
             values without NUL; at most 256 of them, 48 KiB in all.",
        ))
        .build()
}

/// Checks a text field: no NUL, at most `max` bytes.
pub fn check_text(what: &str, value: &str, max: usize) -> Result<(), AppError> {
    if value.contains('\0') {
        return Err(AppError::bad_request(format!(
            "{what} must not contain a NUL character"
        )));
    }
    if value.len() > max {
        return Err(AppError::bad_request(format!(
            "{what} is longer than {max} bytes"
        )));
    }
    Ok(())
}

/// Checks a path: not empty, no NUL, at most 4096 bytes.
pub fn check_path(what: &str, path: &str) -> Result<(), AppError> {
    if path.is_empty() {
        return Err(AppError::bad_request(format!("{what} must not be empty")));
    }
    check_text(what, path, MAX_PATH_BYTES)
}

/// Checks an environment: at most 256 variables, valid names, values without NUL.
pub fn check_env(env: &BTreeMap<String, String>) -> Result<(), AppError> {
    if env.len() > MAX_ENV_VARS {
        return Err(AppError::bad_request(format!(
            "at most {MAX_ENV_VARS} environment variables"
        )));
    }
    for (name, value) in env {
        let mut chars = name.chars();
        let valid = name.len() <= 256
            && chars
                .next()
                .is_some_and(|first| first.is_ascii_alphabetic() || first == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            let shown: String = name.chars().take(64).collect();
            return Err(AppError::bad_request(format!(
                "invalid environment variable name {shown:?}: expected [A-Za-z_][A-Za-z0-9_]*, \
                 at most 256 characters"
            )));
        }
        check_text(&format!("the value of {name}"), value, MAX_COMMAND_BYTES)?;
    }
    let total: usize = env
        .iter()
        .map(|(name, value)| name.len() + value.len())
        .sum();
    if total > MAX_COMMAND_BYTES {
        return Err(AppError::bad_request(format!(
            "the environment is larger than {MAX_COMMAND_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Checks an override: at least `min`, and at most the server's own limit for it (`ceiling`,
/// when the server sets one) or else the hard maximum `max`. A sandbox may only lower the
/// operator's limits, never raise them.
pub fn in_range(
    name: &str,
    value: Option<u64>,
    min: u64,
    max: u64,
    ceiling: Option<u64>,
) -> Result<Option<u64>, AppError> {
    let (max, whose) = match ceiling {
        Some(ceiling) => (
            ceiling.min(max),
            " (the server's limit: a sandbox may only lower it)",
        ),
        None => (max, ""),
    };
    match value {
        Some(value) if value < min || value > max => Err(AppError::bad_request(format!(
            "limits.{name} must be between {min} and {max}{whose}"
        ))),
        other => Ok(other),
    }
}

/// The specification of a new sandbox: the pool's template with the request's environment and
/// limits. The template's limits are maxima: an override may only lower them.
pub fn sandbox_spec(
    pool: &SandboxPool,
    request: CreateSandboxRequest,
) -> Result<SandboxSpec, AppError> {
    check_env(&request.env)?;
    let mut spec = pool.template().clone();
    spec.env.extend(request.env);
    if let Some(on_idle) = request.on_idle {
        spec.on_idle = on_idle.into();
    }
    let Some(limits) = request.limits else {
        return Ok(spec);
    };
    let secs = Duration::from_secs;
    let ceiling = spec.limits.clone();
    let as_secs = |time: Option<Duration>| time.map(|time| time.as_secs());
    if let Some(bytes) = in_range(
        "memory_bytes",
        limits.memory_bytes,
        64 << 20,
        1 << 40,
        ceiling.memory_bytes,
    )? {
        spec.limits.memory_bytes = Some(bytes);
    }
    if let Some(count) = in_range(
        "max_processes",
        limits.max_processes,
        8,
        65_536,
        ceiling.max_processes,
    )? {
        spec.limits.max_processes = Some(count);
    }
    if let Some(percent) = in_range(
        "cpu_percent",
        limits.cpu_percent.map(u64::from),
        1,
        25_600,
        ceiling.cpu_percent.map(u64::from),
    )? {
        spec.limits.cpu_percent = u32::try_from(percent).ok();
    }
    if let Some(time) = in_range(
        "cpu_time_secs",
        limits.cpu_time_secs,
        1,
        604_800,
        as_secs(ceiling.cpu_time),
    )? {
        spec.limits.cpu_time = Some(secs(time));
    }
    if let Some(time) = in_range(
        "wall_time_secs",
        limits.wall_time_secs,
        1,
        604_800,
        as_secs(ceiling.wall_time),
    )? {
        spec.limits.wall_time = Some(secs(time));
    }
    if let Some(time) = in_range(
        "idle_timeout_secs",
        limits.idle_timeout_secs,
        1,
        86_400,
        as_secs(spec.idle_timeout),
    )? {
        spec.idle_timeout = Some(secs(time));
    }
    if let Some(bytes) = in_range(
        "file_size_bytes",
        limits.file_size_bytes,
        1024,
        1 << 40,
        ceiling.file_size,
    )? {
        spec.limits.file_size = Some(bytes);
    }
    if let Some(count) = in_range(
        "open_files",
        limits.open_files,
        16,
        4096,
        ceiling.open_files,
    )? {
        spec.limits.open_files = Some(count);
    }
    if let Some(bytes) = in_range(
        "tmp_size_bytes",
        limits.tmp_size_bytes,
        1 << 20,
        64 << 30,
        Some(ceiling.tmp_size),
    )? {
        spec.limits.tmp_size = bytes;
    }
    Ok(spec)
}

/// A checked command.
pub struct Command {
    /// What to run.
    pub request: ExecRequest,
    /// Written to its stdin, which is then closed.
    pub stdin: Option<String>,
    /// Started in the background.
    pub background: bool,
    /// Its output streamed.
    pub stream: bool,
}

/// Checks an exec body and turns it into a command: argv or a shell line, the environment,
/// the working directory, a timeout in range for how it runs.
pub fn command(body: ExecBody) -> Result<Command, AppError> {
    if body.background && body.stream {
        return Err(AppError::bad_request(
            "`background` and `stream` exclude each other: a background command's output is \
             read from /v1/sandboxes/{id}/processes/{exec_id}",
        ));
    }
    let argv = match (body.argv, body.command) {
        (Some(_), Some(_)) => {
            return Err(AppError::bad_request(
                "give either `argv` or `command`, not both",
            ));
        }
        (None, None) => {
            return Err(AppError::bad_request(
                "give `argv` (the program and its arguments) or `command` (a shell command line)",
            ));
        }
        (Some(argv), None) => {
            if argv.first().is_none_or(String::is_empty) {
                return Err(AppError::bad_request(
                    "`argv` must name a program: a non-empty first element",
                ));
            }
            for arg in &argv {
                check_text("an argument", arg, MAX_COMMAND_BYTES)?;
            }
            argv
        }
        (None, Some(command)) => {
            if command.trim().is_empty() {
                return Err(AppError::bad_request("`command` must not be empty"));
            }
            check_text("`command`", &command, MAX_COMMAND_BYTES)?;
            vec!["/bin/sh".to_owned(), "-c".to_owned(), command]
        }
    };
    check_env(&body.env)?;
    if let Some(cwd) = &body.cwd {
        check_path("`cwd`", cwd)?;
    }
    let size = argv.iter().map(String::len).sum::<usize>()
        + body
            .env
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>()
        + body.cwd.as_ref().map_or(0, String::len);
    if size > MAX_COMMAND_BYTES {
        return Err(AppError::bad_request(format!(
            "argv, environment and cwd are larger than {MAX_COMMAND_BYTES} bytes in all: pass \
             large input on `stdin` or in a file"
        )));
    }
    let (default, max) = if body.background {
        (DEFAULT_BACKGROUND_TIMEOUT_SECS, MAX_BACKGROUND_TIMEOUT_SECS)
    } else {
        (DEFAULT_TIMEOUT_SECS, MAX_TIMEOUT_SECS)
    };
    let timeout = body.timeout_secs.unwrap_or(default);
    if timeout == 0 || timeout > max {
        return Err(AppError::bad_request(format!(
            "`timeout_secs` must be between 1 and {max}{}",
            if body.background {
                ""
            } else {
                " (up to 86400 in the background)"
            }
        )));
    }
    let mut request = ExecRequest::new(argv).timeout(Duration::from_secs(timeout));
    request.env = body.env;
    request.cwd = body.cwd;
    if body.stdin.is_some() {
        request = request.with_stdin();
    }
    Ok(Command {
        request,
        stdin: body.stdin,
        background: body.background,
        stream: body.stream,
    })
}
