//! Template rendering benchmark. Prints a table; asserts nothing.
//!
//! `cargo bench -p agentry-core --bench templates`
//!
//! What rendering in a memory-capped renderer process costs against rendering in this process:
//! a prompt template (a greeting and a ten-item loop) and a workflow expression, warm (the
//! renderer already running, the template compiled there), and the first render of a cold
//! renderer (its start included). This binary is its own renderer, as `agentry` is.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use agentry_core::template::isolation::{self, IsolationConfig};
use agentry_core::template::{Expressions, TemplateStore, renderer};
use serde_json::{Map, Value, json};

const RUNS: usize = 2_000;

fn arguments() -> Map<String, Value> {
    match json!({"name": "Ada", "items": (0..10).map(|i| json!({"title": format!("item {i}")})).collect::<Vec<_>>()})
    {
        Value::Object(map) => map,
        _ => unreachable!(),
    }
}

/// The median and the 99th percentile of `RUNS` calls, in microseconds.
fn measure(mut call: impl FnMut()) -> (f64, f64) {
    let mut samples: Vec<Duration> = (0..RUNS)
        .map(|_| {
            let started = Instant::now();
            call();
            started.elapsed()
        })
        .collect();
    samples.sort();
    let micros = |d: Duration| d.as_secs_f64() * 1e6;
    (micros(samples[RUNS / 2]), micros(samples[RUNS * 99 / 100]))
}

fn main() {
    renderer::maybe_run_renderer();
    let source =
        "Hello {{ name }}!\n{% for item in items %}- {{ item.title | upper }}\n{% endfor %}";
    let context = json!({"input": {"count": 4, "names": ["a", "b", "c"]}});
    let expression = "input.names | length + input.count > 5";
    let arguments = arguments();

    let mut here = TemplateStore::new();
    here.add("greeting", source).unwrap();
    let expressions = Expressions::new();
    let template_here = measure(|| {
        here.render("greeting", &arguments).unwrap();
    });
    let expression_here = measure(|| {
        expressions.truthy(expression, &context).unwrap();
    });

    let exe = std::env::current_exe().unwrap();
    assert!(isolation::isolate(IsolationConfig::new(exe)));
    let mut isolated = TemplateStore::new();
    let started = Instant::now();
    isolated.add("greeting", source).unwrap();
    let cold = started.elapsed().as_secs_f64() * 1e6;
    let template_isolated = measure(|| {
        isolated.render("greeting", &arguments).unwrap();
    });
    let expression_isolated = measure(|| {
        expressions.truthy(expression, &context).unwrap();
    });

    println!("Template renders: in this process against a memory-capped renderer ({RUNS} runs)");
    println!(
        "{:<28} | {:>14} | {:>14} | {:>16} | {:>16} | {:>6}",
        "", "here p50 (µs)", "here p99 (µs)", "renderer p50 (µs)", "renderer p99 (µs)", "ratio"
    );
    println!("{}", "-".repeat(110));
    for (name, here, isolated) in [
        ("prompt template (warm)", template_here, template_isolated),
        (
            "workflow expression (warm)",
            expression_here,
            expression_isolated,
        ),
    ] {
        println!(
            "{name:<28} | {:>14.1} | {:>14.1} | {:>16.1} | {:>16.1} | {:>6.1}",
            here.0,
            here.1,
            isolated.0,
            isolated.1,
            isolated.0 / here.0
        );
    }
    println!(
        "first render of a cold renderer (its start, a compile, a trial render): {cold:.0} µs"
    );
}
