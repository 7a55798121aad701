//! Expressions and inline templates over JSON (what workflow definitions write as
//! `{{ steps.fetch.output }}` or `when: "input.count > 3"`), strict about undefined names and
//! bounded like prompt templates: fuel, an output cap, and out of process where
//! [`super::isolation`] is installed.

use std::borrow::Cow;

use minijinja::{Environment, UndefinedBehavior};
use serde_json::Value;

use super::CappedOutput;
use super::isolation::{self, Job, Outcome};

/// The instruction budget of one evaluation or render.
pub const EXPRESSION_FUEL: u64 = 100_000;
/// The largest text one render may produce: 1 MiB, as for prompt templates.
pub const MAX_TEXT_BYTES: usize = 1024 * 1024;

/// Compiles, evaluates and renders expressions. Cheap to build; holds no state between calls.
#[derive(Debug)]
pub struct Expressions {
    environment: Environment<'static>,
}

impl Default for Expressions {
    fn default() -> Self {
        Self::new()
    }
}

impl Expressions {
    /// The engine: strict undefined behaviour, [`EXPRESSION_FUEL`] per call.
    pub fn new() -> Self {
        let mut environment = Environment::new();
        environment.set_undefined_behavior(UndefinedBehavior::Strict);
        environment.set_fuel(Some(EXPRESSION_FUEL));
        Self { environment }
    }

    /// Checks that an expression parses, without running it (compiling folds constant
    /// parts, so it too runs in a renderer where renders are isolated).
    pub fn check_expression(&self, expression: &str) -> Result<(), String> {
        let job = Job::CheckExpression {
            expression: expression.into(),
        };
        dispatch(
            &job,
            "expression",
            || self.check_expression_here(expression),
            |outcome| match outcome {
                Outcome::Parsed(result) => Some(result),
                _ => None,
            },
        )
    }

    /// Checks that a template text parses, without running it.
    pub fn check_text(&self, text: &str) -> Result<(), String> {
        let job = Job::CheckText { text: text.into() };
        dispatch(
            &job,
            "template",
            || self.check_text_here(text),
            |outcome| match outcome {
                Outcome::Parsed(result) => Some(result),
                _ => None,
            },
        )
    }

    pub(super) fn check_expression_here(&self, expression: &str) -> Result<(), String> {
        self.environment
            .compile_expression(expression)
            .map(|_| ())
            .map_err(|error| error.to_string())
    }

    pub(super) fn check_text_here(&self, text: &str) -> Result<(), String> {
        self.environment
            .template_from_str(text)
            .map(|_| ())
            .map_err(|error| error.to_string())
    }

    /// Renders a template text against `context`.
    pub fn render_text(&self, text: &str, context: &Value) -> Result<String, String> {
        let job = Job::Text {
            text: text.into(),
            context: Cow::Borrowed(context),
        };
        dispatch(
            &job,
            "template",
            || self.render_text_here(text, context),
            |outcome| match outcome {
                Outcome::Text(result) => Some(result),
                _ => None,
            },
        )
    }

    /// Evaluates an expression against `context`, to JSON.
    pub fn evaluate(&self, expression: &str, context: &Value) -> Result<Value, String> {
        let job = Job::Evaluate {
            expression: expression.into(),
            context: Cow::Borrowed(context),
        };
        dispatch(
            &job,
            "expression",
            || self.evaluate_here(expression, context),
            |outcome| match outcome {
                Outcome::Evaluate(result) => Some(result),
                _ => None,
            },
        )
    }

    /// Whether an expression's value counts as true (minijinja's truthiness).
    pub fn truthy(&self, expression: &str, context: &Value) -> Result<bool, String> {
        let job = Job::Truthy {
            expression: expression.into(),
            context: Cow::Borrowed(context),
        };
        dispatch(
            &job,
            "expression",
            || self.truthy_here(expression, context),
            |outcome| match outcome {
                Outcome::Truthy(result) => Some(result),
                _ => None,
            },
        )
    }

    pub(super) fn render_text_here(&self, text: &str, context: &Value) -> Result<String, String> {
        let template = self
            .environment
            .template_from_str(text)
            .map_err(|error| error.to_string())?;
        let mut output = CappedOutput::new(MAX_TEXT_BYTES);
        let result = template.render_captured_to(
            minijinja::Value::from(minijinja::value::Serde(context)),
            &mut output,
        );
        if output.overflowed {
            return Err(format!(
                "the template renders more than {MAX_TEXT_BYTES} bytes"
            ));
        }
        result.map_err(|error| error.to_string())?;
        String::from_utf8(output.buffer).map_err(|_| "the output is not UTF-8".to_owned())
    }

    pub(super) fn evaluate_here(&self, expression: &str, context: &Value) -> Result<Value, String> {
        let value = self
            .environment
            .compile_expression(expression)
            .map_err(|error| error.to_string())?
            .eval(minijinja::Value::from(minijinja::value::Serde(context)))
            .map_err(|error| error.to_string())?;
        serde_json::to_value(&value).map_err(|error| error.to_string())
    }

    pub(super) fn truthy_here(&self, expression: &str, context: &Value) -> Result<bool, String> {
        self.environment
            .compile_expression(expression)
            .map_err(|error| error.to_string())?
            .eval(minijinja::Value::from(minijinja::value::Serde(context)))
            .map(|value| value.is_true())
            .map_err(|error| error.to_string())
    }
}

/// Runs `job` in a renderer where renders are isolated, else `here`; `pick` takes the job's
/// result out of the renderer's answer, and `what` names the job in a failure.
fn dispatch<T>(
    job: &Job<'_>,
    what: &str,
    here: impl FnOnce() -> Result<T, String>,
    pick: impl FnOnce(Outcome) -> Option<Result<T, String>>,
) -> Result<T, String> {
    match isolation::run(job) {
        None => here(),
        Some(Ok(outcome)) => pick(outcome).unwrap_or_else(|| {
            Err("the template renderer answered another kind of job".to_owned())
        }),
        Some(Err(failure)) => Err(format!("the {what} failed: {failure}")),
    }
}
