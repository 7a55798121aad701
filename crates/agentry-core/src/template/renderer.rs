//! The renderer's side: the runtime's executable re-executed to compile and render templates
//! and expressions with its address space capped (see [`super::isolation`], the runtime's
//! side), answering one JSON job a line on its standard input and output.

use std::ffi::OsStr;
use std::io::{self, BufRead, Write};

use super::isolation::{Job, Outcome, RENDERER_ARG};
use super::{Expressions, TemplateError, TemplateLimits, TemplateStore};

/// Serves renders and exits if this process was started as a renderer; returns otherwise.
/// Call it first thing in `main`, before any thread is started.
pub fn maybe_run_renderer() {
    let mut args = std::env::args_os();
    let _ = args.next();
    if args.next().as_deref() != Some(OsStr::new(RENDERER_ARG)) {
        return;
    }
    let memory = args
        .next()
        .and_then(|arg| arg.to_str().and_then(|arg| arg.parse::<u64>().ok()));
    let code = match memory {
        Some(memory) => serve(memory),
        None => 2,
    };
    std::process::exit(code);
}

/// The renderer's loop: caps its address space, then answers jobs until its input ends.
fn serve(memory_bytes: u64) -> i32 {
    let limit = rustix::process::Rlimit {
        current: Some(memory_bytes),
        maximum: Some(memory_bytes),
    };
    if rustix::process::setrlimit(rustix::process::Resource::As, limit).is_err() {
        return 3;
    }
    let mut input = io::stdin().lock();
    let mut output = io::stdout().lock();
    let mut renderer = Rendering::default();
    let mut line = String::new();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) => return 0,
            Ok(_) => {}
            Err(_) => return 1,
        }
        let outcome = match serde_json::from_str::<Job>(&line) {
            Ok(job) => renderer.run(job),
            Err(_) => return 4,
        };
        let answered = serde_json::to_writer(&mut output, &outcome)
            .map_err(io::Error::from)
            .and_then(|()| output.write_all(b"\n"))
            .and_then(|()| output.flush());
        if answered.is_err() {
            return 1;
        }
    }
}

/// What a renderer keeps between jobs: the prompt templates it compiled and the expression
/// engine.
#[derive(Default)]
struct Rendering {
    templates: Option<TemplateStore>,
    expressions: Expressions,
}

impl Rendering {
    /// The renderer's store, with `source` compiled under `name` (kept while it is unchanged).
    fn compiled(
        &mut self,
        limits: TemplateLimits,
        name: &str,
        source: String,
    ) -> Result<&TemplateStore, TemplateError> {
        if self
            .templates
            .as_ref()
            .is_none_or(|store| store.limits() != limits)
        {
            self.templates = Some(TemplateStore::with_limits(limits));
        }
        let store = self
            .templates
            .get_or_insert_with(|| TemplateStore::with_limits(limits));
        if store.get(name) != Some(source.as_str()) {
            store.put_compiled(name.to_owned(), source)?;
        }
        Ok(store)
    }

    fn run(&mut self, job: Job) -> Outcome {
        match job {
            Job::Template {
                name,
                source,
                arguments,
                fuel,
                max_output_bytes,
            } => {
                let limits = TemplateLimits {
                    fuel,
                    max_output_bytes,
                };
                let rendered = self
                    .compiled(limits, &name, source.into_owned())
                    .and_then(|store| store.render_here(&name, &arguments));
                Outcome::Template(rendered)
            }
            Job::Check {
                name,
                source,
                fuel,
                max_output_bytes,
            } => {
                let mut scratch = TemplateStore::with_limits(TemplateLimits {
                    fuel,
                    max_output_bytes,
                });
                Outcome::Checked(scratch.insert_here(name.into_owned(), source.into_owned()))
            }
            Job::Variables { name, source } => {
                let limits = self
                    .templates
                    .as_ref()
                    .map_or_else(TemplateLimits::default, TemplateStore::limits);
                let variables = self
                    .compiled(limits, &name, source.into_owned())
                    .and_then(|store| store.variables_here(&name));
                Outcome::Variables(variables)
            }
            Job::CheckExpression { expression } => {
                Outcome::Parsed(self.expressions.check_expression_here(&expression))
            }
            Job::CheckText { text } => Outcome::Parsed(self.expressions.check_text_here(&text)),
            Job::Text { text, context } => {
                Outcome::Text(self.expressions.render_text_here(&text, &context))
            }
            Job::Evaluate {
                expression,
                context,
            } => Outcome::Evaluate(self.expressions.evaluate_here(&expression, &context)),
            Job::Truthy {
                expression,
                context,
            } => Outcome::Truthy(self.expressions.truthy_here(&expression, &context)),
        }
    }
}
