//! Prompt templates: named texts with `{{placeholder}}` variables filled from request arguments.
//!
//! Templates use minijinja's syntax (`{{ name }}`, filters, `{% if %}`, `{% for %}`), with
//! strict undefined behaviour — a variable the arguments do not provide is an error naming it,
//! never an empty string — and no HTML escaping, since these are prompts. A template that does
//! not compile is rejected when it is added, with the line and the reason. Templates cannot
//! include or extend one another.
//!
//! Rendering is bounded, because it runs on the caller's thread (often a tokio worker): every
//! render gets a budget of VM instructions ([`TemplateLimits::fuel`], minijinja's fuel) and a cap
//! on the size of its output ([`TemplateLimits::max_output_bytes`]). A template that exceeds
//! either fails with [`TemplateError::TooExpensive`] or [`TemplateError::TooLarge`]. When a
//! template is added it is also rendered once with every variable set to an empty string, so a
//! template that runs away whatever its arguments (nested loops over large ranges) is refused
//! there, with the same errors.
//!
//! Fuel cannot bound memory (one `~` doubles a string), so where the process installed
//! [`isolation`] every render — the trial render at `add` included — runs in a renderer
//! process whose address space is capped, and a template that needs more fails with
//! [`TemplateError::TooMuchMemory`] instead of taking the server's memory ([`renderer`] is
//! that process's side). [`Expressions`] (workflow expressions) render the same way.

pub mod expression;
pub mod isolation;
pub mod renderer;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::io;

use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use self::expression::Expressions;
use self::isolation::{Failure, Job, Outcome};
use crate::tool::{TOOL_NAME_RULE, is_valid_tool_name};

/// Why a template operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
#[non_exhaustive]
pub enum TemplateError {
    /// No template has this name.
    #[error("no template is named {0:?}")]
    NotFound(String),
    /// A template with this name already exists.
    #[error("a template named {0:?} already exists")]
    AlreadyExists(String),
    /// The name is not acceptable.
    #[error("invalid template name {name:?}: a name is {TOOL_NAME_RULE}")]
    InvalidName {
        /// The rejected name.
        name: String,
    },
    /// The template does not compile.
    #[error("template {template:?} does not compile{}: {reason}", line_suffix(*line))]
    Syntax {
        /// The template's name.
        template: String,
        /// The line of the error, when known.
        line: Option<usize>,
        /// What is wrong.
        reason: String,
    },
    /// Rendering needs a variable the arguments do not provide.
    #[error("template {template:?} needs the variable {variable:?}, which was not given")]
    MissingVariable {
        /// The template's name.
        template: String,
        /// The missing variable.
        variable: String,
    },
    /// Rendering executed more instructions than the store allows: a loop too long, or nested
    /// loops.
    #[error(
        "template {template:?} is too expensive to render: it runs more than {fuel} \
         instructions (look for long or nested loops)"
    )]
    TooExpensive {
        /// The template's name.
        template: String,
        /// The instruction budget it exceeded.
        fuel: u64,
    },
    /// Rendering produced more text than the store allows.
    #[error("template {template:?} renders more than {max_bytes} bytes")]
    TooLarge {
        /// The template's name.
        template: String,
        /// The output cap it exceeded, in bytes.
        max_bytes: usize,
    },
    /// Rendering needed more memory than a renderer may have (renders out of process only,
    /// see [`isolation`]): a value grown without bound, such as a string doubled in a loop.
    #[error("template {template:?} needs more than {max_bytes} bytes of memory to render")]
    TooMuchMemory {
        /// The template's name.
        template: String,
        /// The renderer's memory cap, in bytes.
        max_bytes: u64,
    },
    /// Rendering failed for another reason (a bad filter argument, an undefined attribute…).
    #[error("template {template:?} failed to render{}: {reason}", line_suffix(*line))]
    Render {
        /// The template's name.
        template: String,
        /// The line of the error, when known.
        line: Option<usize>,
        /// What went wrong.
        reason: String,
    },
}

fn line_suffix(line: Option<usize>) -> String {
    line.map(|line| format!(" (line {line})"))
        .unwrap_or_default()
}

/// The bounds on one render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TemplateLimits {
    /// How many VM instructions a render may execute (minijinja's fuel; most instructions cost
    /// one).
    pub fuel: u64,
    /// How many bytes a render may produce.
    pub max_output_bytes: usize,
}

impl TemplateLimits {
    /// The default instruction budget: ample for a prompt (a loop over a thousand items with a
    /// few filters each needs a few tens of thousands), and a few milliseconds of work.
    pub const DEFAULT_FUEL: u64 = 500_000;
    /// The default output cap: 1 MiB, far more than any model's context window holds.
    pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;
}

impl Default for TemplateLimits {
    fn default() -> Self {
        Self {
            fuel: Self::DEFAULT_FUEL,
            max_output_bytes: Self::DEFAULT_MAX_OUTPUT_BYTES,
        }
    }
}

/// A set of named prompt templates.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    environment: Environment<'static>,
    sources: BTreeMap<String, String>,
    limits: TemplateLimits,
}

impl Default for TemplateStore {
    fn default() -> Self {
        Self::new()
    }
}

impl TemplateStore {
    /// An empty store with the default [`TemplateLimits`].
    pub fn new() -> Self {
        Self::with_limits(TemplateLimits::default())
    }

    /// An empty store whose renders are bounded by `limits`.
    pub fn with_limits(limits: TemplateLimits) -> Self {
        let mut environment = Environment::new();
        environment.set_fuel(Some(limits.fuel));
        environment.set_undefined_behavior(UndefinedBehavior::Strict);
        environment.set_auto_escape_callback(|_| AutoEscape::None);
        // Debug mode makes minijinja record which expression produced an undefined value, which
        // is how a missing variable is named.
        environment.set_debug(true);
        Self {
            environment,
            sources: BTreeMap::new(),
            limits,
        }
    }

    /// The bounds on each render.
    pub fn limits(&self) -> TemplateLimits {
        self.limits
    }

    /// Adds a new template. Fails when the name is invalid or taken, the source does not
    /// compile ([`TemplateError::Syntax`] with the line and reason), or a trial render with
    /// every variable set to an empty string exceeds the limits
    /// ([`TemplateError::TooExpensive`], [`TemplateError::TooLarge`]).
    pub fn add(
        &mut self,
        name: impl Into<String>,
        source: impl Into<String>,
    ) -> Result<(), TemplateError> {
        let name = name.into();
        check_name(&name)?;
        if self.sources.contains_key(&name) {
            return Err(TemplateError::AlreadyExists(name));
        }
        self.insert(name, source.into())
    }

    /// Adds a template or replaces the one with this name, returning the replaced source. A
    /// source that does not compile is rejected and the old template kept.
    pub fn replace(
        &mut self,
        name: impl Into<String>,
        source: impl Into<String>,
    ) -> Result<Option<String>, TemplateError> {
        let name = name.into();
        check_name(&name)?;
        let previous = self.sources.get(&name).cloned();
        self.insert(name, source.into())?;
        Ok(previous)
    }

    /// Removes a template, returning its source.
    pub fn remove(&mut self, name: &str) -> Result<String, TemplateError> {
        let source = self
            .sources
            .remove(name)
            .ok_or_else(|| TemplateError::NotFound(name.to_owned()))?;
        self.environment.remove_template(name);
        Ok(source)
    }

    /// The source of a template.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.sources.get(name).map(String::as_str)
    }

    /// The names of every template, sorted.
    pub fn list(&self) -> Vec<&str> {
        self.sources.keys().map(String::as_str).collect()
    }

    /// How many templates the store holds.
    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// Whether the store holds no template.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// The variables a template reads from its arguments (top-level names), sorted.
    pub fn variables(&self, name: &str) -> Result<BTreeSet<String>, TemplateError> {
        let source = self.source(name)?;
        let job = Job::Variables {
            name: name.into(),
            source: source.into(),
        };
        match isolation::run(&job) {
            None => self.variables_here(name),
            Some(outcome) => isolated(name, outcome, |outcome| match outcome {
                Outcome::Variables(result) => Some(result),
                _ => None,
            }),
        }
    }

    fn variables_here(&self, name: &str) -> Result<BTreeSet<String>, TemplateError> {
        let template = self.template(name)?;
        let globals: BTreeSet<&str> = self.environment.globals().map(|(name, _)| name).collect();
        Ok(template
            .undeclared_variables(false)
            .into_iter()
            .filter(|variable| !globals.contains(variable.as_str()))
            .collect())
    }

    /// Renders a template with these arguments.
    ///
    /// A variable the arguments lack is [`TemplateError::MissingVariable`] naming it (a variable
    /// only tested with `is defined` may be left out). A render that exceeds the store's
    /// [`TemplateLimits`] stops there with [`TemplateError::TooExpensive`] or
    /// [`TemplateError::TooLarge`].
    ///
    /// Where [`isolation`] is installed the render runs in a renderer process, and one that
    /// needs more memory than it may have fails with [`TemplateError::TooMuchMemory`].
    pub fn render(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
    ) -> Result<String, TemplateError> {
        let source = self.source(name)?;
        let job = Job::Template {
            name: name.into(),
            source: source.into(),
            arguments: Cow::Borrowed(arguments),
            fuel: self.limits.fuel,
            max_output_bytes: self.limits.max_output_bytes,
        };
        match isolation::run(&job) {
            None => self.render_here(name, arguments),
            Some(outcome) => isolated(name, outcome, |outcome| match outcome {
                Outcome::Template(result) => Some(result),
                _ => None,
            }),
        }
    }

    /// Renders in this process, bounded by fuel and the output cap.
    fn render_here(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
    ) -> Result<String, TemplateError> {
        let template = self.template(name)?;
        let context = minijinja::Value::from(minijinja::value::Serde(arguments));
        let mut output = CappedOutput::new(self.limits.max_output_bytes);
        let result = template.render_captured_to(context, &mut output);
        if output.overflowed {
            return Err(TemplateError::TooLarge {
                template: name.to_owned(),
                max_bytes: self.limits.max_output_bytes,
            });
        }
        match result {
            Ok(_) => String::from_utf8(output.buffer).map_err(|_| TemplateError::Render {
                template: name.to_owned(),
                line: None,
                reason: "the output is not UTF-8".to_owned(),
            }),
            Err(error) if error.kind() == ErrorKind::OutOfFuel => {
                Err(TemplateError::TooExpensive {
                    template: name.to_owned(),
                    fuel: self.limits.fuel,
                })
            }
            Err(error) => Err(self.render_error(name, arguments, &error)),
        }
    }

    /// Renders `name` once with every variable it reads set to an empty string, and fails only
    /// when that render exceeds the limits: other errors (a filter that needs a number, say)
    /// depend on real arguments and are left to the real render.
    fn check_bounded(&self, name: &str) -> Result<(), TemplateError> {
        let arguments: Map<String, Value> = self
            .variables_here(name)?
            .into_iter()
            .map(|variable| (variable, Value::String(String::new())))
            .collect();
        match self.render_here(name, &arguments) {
            Err(
                error @ (TemplateError::TooExpensive { .. }
                | TemplateError::TooLarge { .. }
                | TemplateError::TooMuchMemory { .. }),
            ) => Err(error),
            _ => Ok(()),
        }
    }

    fn source(&self, name: &str) -> Result<&str, TemplateError> {
        self.get(name)
            .ok_or_else(|| TemplateError::NotFound(name.to_owned()))
    }

    fn template(&self, name: &str) -> Result<minijinja::Template<'_, '_>, TemplateError> {
        if !self.sources.contains_key(name) {
            return Err(TemplateError::NotFound(name.to_owned()));
        }
        self.environment
            .get_template(name)
            .map_err(|_| TemplateError::NotFound(name.to_owned()))
    }

    fn insert(&mut self, name: String, source: String) -> Result<(), TemplateError> {
        let job = Job::Check {
            name: Cow::Borrowed(&name),
            source: Cow::Borrowed(&source),
            fuel: self.limits.fuel,
            max_output_bytes: self.limits.max_output_bytes,
        };
        match isolation::run(&job) {
            // Compiling folds constant expressions, which can allocate as much as a render:
            // in a renderer, the source is compiled and tried there, and kept here as text.
            Some(outcome) => {
                isolated(&name, outcome, |outcome| match outcome {
                    Outcome::Checked(result) => Some(result),
                    _ => None,
                })?;
                self.environment.remove_template(&name);
                self.sources.insert(name, source);
                Ok(())
            }
            None => self.insert_here(name, source),
        }
    }

    /// Compiles and tries the template in this process: in a scratch environment first, so a
    /// bad source leaves the store unchanged.
    fn insert_here(&mut self, name: String, source: String) -> Result<(), TemplateError> {
        let mut scratch = Self::with_limits(self.limits);
        scratch.put_compiled(name.clone(), source.clone())?;
        scratch.check_bounded(&name)?;
        self.put_compiled(name, source)
    }

    /// Compiles `source` under `name`, replacing any template of that name, without the trial
    /// render: a renderer's copy of a template the runtime's store already checked.
    fn put_compiled(&mut self, name: String, source: String) -> Result<(), TemplateError> {
        self.environment
            .add_template_owned(name.clone(), source.clone())
            .map_err(|error| TemplateError::Syntax {
                template: name.clone(),
                line: error.line(),
                reason: describe(&error),
            })?;
        self.sources.insert(name, source);
        Ok(())
    }

    fn render_error(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
        error: &minijinja::Error,
    ) -> TemplateError {
        // In debug mode minijinja says which expression was undefined ("`user.name` is
        // undefined"), also when an operation on it failed; without that, the first variable
        // the template reads and the arguments lack is the one.
        let missing = match error.detail().and_then(undefined_expression) {
            Some(expression) => {
                // Only a variable read from the arguments counts (not a loop variable).
                let variable = top_level_name(expression);
                let read_from_arguments = self
                    .variables_here(name)
                    .is_ok_and(|variables| variables.contains(variable));
                (read_from_arguments && !arguments.contains_key(variable))
                    .then(|| variable.to_owned())
            }
            None if error.kind() == ErrorKind::UndefinedError => {
                self.variables_here(name).ok().and_then(|variables| {
                    variables
                        .into_iter()
                        .find(|variable| !arguments.contains_key(variable))
                })
            }
            None => None,
        };
        if let Some(variable) = missing {
            return TemplateError::MissingVariable {
                template: name.to_owned(),
                variable,
            };
        }
        TemplateError::Render {
            template: name.to_owned(),
            line: error.line(),
            reason: describe(error),
        }
    }
}

/// What a renderer answered, for the template `name`: the result `pick` finds in its outcome,
/// or why there is none.
fn isolated<T>(
    name: &str,
    outcome: Result<Outcome, Failure>,
    pick: impl FnOnce(Outcome) -> Option<Result<T, TemplateError>>,
) -> Result<T, TemplateError> {
    match outcome {
        Ok(outcome) => pick(outcome).unwrap_or_else(|| {
            Err(TemplateError::Render {
                template: name.to_owned(),
                line: None,
                reason: "the template renderer answered another kind of job".to_owned(),
            })
        }),
        Err(Failure::OutOfMemory { max_bytes }) => Err(TemplateError::TooMuchMemory {
            template: name.to_owned(),
            max_bytes,
        }),
        Err(failure) => Err(TemplateError::Render {
            template: name.to_owned(),
            line: None,
            reason: failure.to_string(),
        }),
    }
}

/// A render's output, refusing to grow past `limit` bytes: the write that would cross it fails,
/// which stops the render.
struct CappedOutput {
    buffer: Vec<u8>,
    limit: usize,
    overflowed: bool,
}

impl CappedOutput {
    fn new(limit: usize) -> Self {
        Self {
            buffer: Vec::new(),
            limit,
            overflowed: false,
        }
    }
}

impl io::Write for CappedOutput {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.buffer.len().saturating_add(bytes.len()) > self.limit {
            self.overflowed = true;
            return Err(io::Error::other("the output cap is reached"));
        }
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn check_name(name: &str) -> Result<(), TemplateError> {
    if is_valid_tool_name(name) {
        Ok(())
    } else {
        Err(TemplateError::InvalidName {
            name: name.to_owned(),
        })
    }
}

/// The expression in minijinja's "`expression` is undefined".
fn undefined_expression(detail: &str) -> Option<&str> {
    let end = detail.find("` is undefined")?;
    let start = detail[..end].rfind('`')? + 1;
    Some(&detail[start..end])
}

/// `user.name` → `user`, `items[0]` → `items`.
fn top_level_name(expression: &str) -> &str {
    let end = expression
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(expression.len());
    &expression[..end]
}

/// The error's kind and detail, without the source excerpt.
fn describe(error: &minijinja::Error) -> String {
    match error.detail() {
        Some(detail) => format!("{}: {detail}", error.kind()),
        None => error.kind().to_string(),
    }
}
