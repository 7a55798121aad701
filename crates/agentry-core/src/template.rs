//! Prompt templates: named texts with `{{placeholder}}` variables filled from request arguments.
//!
//! Templates use minijinja's syntax (`{{ name }}`, filters, `{% if %}`, `{% for %}`), with
//! strict undefined behaviour — a variable the arguments do not provide is an error naming it,
//! never an empty string — and no HTML escaping, since these are prompts. A template that does
//! not compile is rejected when it is added, with the line and the reason. Templates cannot
//! include or extend one another.

use std::collections::{BTreeMap, BTreeSet};

use minijinja::{AutoEscape, Environment, ErrorKind, UndefinedBehavior};
use serde_json::{Map, Value};

use crate::tool::{TOOL_NAME_RULE, is_valid_tool_name};

/// Why a template operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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

/// A set of named prompt templates.
#[derive(Debug, Clone)]
pub struct TemplateStore {
    environment: Environment<'static>,
    sources: BTreeMap<String, String>,
}

impl Default for TemplateStore {
    fn default() -> Self {
        Self::new()
    }
}

impl TemplateStore {
    /// An empty store.
    pub fn new() -> Self {
        let mut environment = Environment::new();
        environment.set_undefined_behavior(UndefinedBehavior::Strict);
        environment.set_auto_escape_callback(|_| AutoEscape::None);
        // Debug mode makes minijinja record which expression produced an undefined value, which
        // is how a missing variable is named.
        environment.set_debug(true);
        Self {
            environment,
            sources: BTreeMap::new(),
        }
    }

    /// Adds a new template. Fails when the name is invalid or taken, or the source does not
    /// compile ([`TemplateError::Syntax`] with the line and reason).
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
    /// only tested with `is defined` may be left out).
    pub fn render(
        &self,
        name: &str,
        arguments: &Map<String, Value>,
    ) -> Result<String, TemplateError> {
        let template = self.template(name)?;
        let context = minijinja::Value::from(minijinja::value::Serde(arguments));
        match template.render(context) {
            Ok(text) => Ok(text),
            Err(error) => Err(self.render_error(name, arguments, &error)),
        }
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
        // minijinja compiles before it replaces, so a bad source leaves the store unchanged.
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
                    .variables(name)
                    .is_ok_and(|variables| variables.contains(variable));
                (read_from_arguments && !arguments.contains_key(variable))
                    .then(|| variable.to_owned())
            }
            None if error.kind() == ErrorKind::UndefinedError => {
                self.variables(name).ok().and_then(|variables| {
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
