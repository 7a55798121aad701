//! Renders out of process: a template or expression that grows a value without bound costs a
//! renderer, not this process, and everything else renders exactly as in-process.
//!
//! Isolation is process-wide and installed once; nextest runs each test in its own process,
//! so each test here installs its own.

use std::path::PathBuf;
use std::time::Duration;

use agentry_core::template::isolation::{self, IsolationConfig};
use agentry_core::template::{Expressions, TemplateError, TemplateStore};
use serde_json::{Map, Value, json};

/// A renderer capped at 256 MiB: a few doublings of a 100 MB string need more.
const MEMORY: u64 = 256 * 1024 * 1024;

fn isolate() -> IsolationConfig {
    let config = IsolationConfig {
        executable: PathBuf::from(env!("CARGO_BIN_EXE_agentry-template-renderer")),
        memory_bytes: MEMORY,
        timeout: Duration::from_secs(20),
    };
    assert!(isolation::isolate(config.clone()));
    assert_eq!(isolation::isolation(), Some(&config));
    config
}

fn arguments(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments must be an object: {other}"),
    }
}

/// This process's peak resident memory, in bytes (`VmHWM`).
fn peak_memory() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|line| line.starts_with("VmHWM:"))
        .unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// This process's children: (pid, state letter) from `/proc/*/stat`.
fn children() -> Vec<(u32, char)> {
    let me = std::process::id();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let after = &stat[stat.rfind(')')? + 2..];
            let mut fields = after.split_whitespace();
            let state = fields.next()?.chars().next()?;
            let parent: u32 = fields.next()?.parse().ok()?;
            (parent == me).then_some((pid, state))
        })
        .collect()
}

const DOUBLING: &str = "{% set a = \"x\" * 100000000 %}{% set a = a ~ a %}{% set a = a ~ a %}\
                        {% set a = a ~ a %}{% set a = a ~ a %}{{ a | length }}";

#[test]
fn a_template_that_doubles_a_string_fails_in_its_renderer_and_the_next_render_works() {
    isolate();
    let before = peak_memory();
    let mut store = TemplateStore::new();
    // The trial render at `add` is where the bomb goes off (it needs no arguments).
    let error = store.add("bomb", DOUBLING).unwrap_err();
    assert_eq!(
        error,
        TemplateError::TooMuchMemory {
            template: "bomb".into(),
            max_bytes: MEMORY
        }
    );
    assert!(
        error.to_string().contains("memory"),
        "the message says why: {error}"
    );
    assert!(store.is_empty(), "the refused template is not kept");
    let grown = peak_memory().saturating_sub(before);
    assert!(
        grown < 64 * 1024 * 1024,
        "this process's peak memory grew by {grown} bytes"
    );
    // The dead renderer was reaped, and the next render gets a fresh one.
    assert!(
        children().iter().all(|(_, state)| *state != 'Z'),
        "{:?}",
        children()
    );
    store.add("hello", "Hello {{ name }}!").unwrap();
    assert_eq!(
        store
            .render("hello", &arguments(json!({"name": "Ada"})))
            .unwrap(),
        "Hello Ada!"
    );
    // It ran in a renderer, a child of this process, kept for the next call.
    let renderers: Vec<_> = children()
        .into_iter()
        .filter(|(pid, _)| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.starts_with(b"agentry-template-renderer\0"))
        })
        .collect();
    assert_eq!(renderers.len(), 1, "{renderers:?}");
}

#[test]
fn compiling_is_isolated_too_since_it_folds_constants() {
    isolate();
    let before = peak_memory();
    // minijinja folds constant expressions when it compiles: this one is 500 MB before any
    // render, so checking the source in this process would already allocate it.
    let folded = "{{ ('x' * 100000000) ~ ('x' * 100000000) ~ ('x' * 100000000) ~ ('x' * 100000000) ~ ('x' * 100000000) }}";
    let mut store = TemplateStore::new();
    let error = store.add("folded", folded).unwrap_err();
    assert!(
        matches!(error, TemplateError::TooMuchMemory { .. }),
        "{error:?}"
    );
    let expression = &folded[3..folded.len() - 3];
    let error = Expressions::new().check_expression(expression).unwrap_err();
    assert!(error.contains("memory"), "{error}");
    let error = Expressions::new().check_text(folded).unwrap_err();
    assert!(error.contains("memory"), "{error}");
    let grown = peak_memory().saturating_sub(before);
    assert!(grown < 64 * 1024 * 1024, "grew by {grown} bytes");
    // Bad syntax is still a syntax error with its line, found by the renderer.
    let error = store.add("broken", "line one\n{{ oops ").unwrap_err();
    assert!(
        matches!(error, TemplateError::Syntax { line: Some(2), .. }),
        "{error:?}"
    );
    assert!(
        Expressions::new()
            .check_expression("1 +")
            .unwrap_err()
            .contains("syntax error")
    );
    store.add("ok", "{{ a }} and {{ b }}").unwrap();
    assert_eq!(
        store
            .variables("ok")
            .unwrap()
            .into_iter()
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
}

#[test]
fn a_bomb_that_only_goes_off_with_its_arguments_fails_at_render() {
    isolate();
    let mut store = TemplateStore::new();
    store
        .add(
            "grow",
            "{% set a = seed * 100000000 %}{% for i in range(times) %}{% set a = a ~ a %}\
             {% endfor %}{{ a | length }}",
        )
        .unwrap();
    let error = store
        .render("grow", &arguments(json!({"seed": "y", "times": 6})))
        .unwrap_err();
    assert!(
        matches!(error, TemplateError::TooMuchMemory { .. }),
        "{error:?}"
    );
    // Modest arguments still render, in a fresh renderer.
    assert_eq!(
        store
            .render("grow", &arguments(json!({"seed": "y", "times": 0})))
            .unwrap(),
        "100000000"
    );
}

#[test]
fn isolated_renders_answer_what_in_process_renders_answer() {
    let source = "Plan a trip for {{ name }} to {{ city }}{% for stop in stops %}, via {{ stop | upper }}{% endfor %}.";
    let render_all = |store: &TemplateStore| {
        (
            store.render(
                "trip",
                &arguments(json!({"name": "Ada", "city": "Oslo", "stops": ["bergen"]})),
            ),
            store.render("trip", &arguments(json!({"name": "Ada", "stops": []}))),
            store.render(
                "trip",
                &arguments(json!({"name": "Ada", "city": 1, "stops": 3})),
            ),
        )
    };
    let mut here = TemplateStore::new();
    here.add("trip", source).unwrap();
    let expected = render_all(&here);

    isolate();
    let mut isolated = TemplateStore::new();
    isolated.add("trip", source).unwrap();
    let got = render_all(&isolated);
    assert_eq!(got, expected);
    assert_eq!(
        got.0.as_deref(),
        Ok("Plan a trip for Ada to Oslo, via BERGEN.")
    );
    assert_eq!(
        got.1,
        Err(TemplateError::MissingVariable {
            template: "trip".into(),
            variable: "city".into()
        })
    );
    assert!(
        matches!(got.2, Err(TemplateError::Render { .. })),
        "{got:?}"
    );
    // Replacing a template reaches the renderer too (it compiles the new source).
    isolated.replace("trip", "Stay home, {{ name }}.").unwrap();
    assert_eq!(
        isolated
            .render("trip", &arguments(json!({"name": "Ada"})))
            .unwrap(),
        "Stay home, Ada."
    );
}

#[test]
fn expressions_render_in_the_renderer_and_a_bomb_fails_there() {
    let expressions = Expressions::new();
    let context = json!({"input": {"count": 4, "names": ["a", "b"]}});
    let here = (
        expressions.evaluate("input.names | length + input.count", &context),
        expressions.truthy("input.count > 3", &context),
        expressions.render_text("{{ input.names | join(', ') }}!", &context),
        expressions.evaluate("input.missing.deeper", &context),
    );
    isolate();
    let isolated = (
        expressions.evaluate("input.names | length + input.count", &context),
        expressions.truthy("input.count > 3", &context),
        expressions.render_text("{{ input.names | join(', ') }}!", &context),
        expressions.evaluate("input.missing.deeper", &context),
    );
    assert_eq!(isolated, here);
    assert_eq!(isolated.0, Ok(json!(6)));
    assert_eq!(isolated.1, Ok(true));
    assert_eq!(isolated.2.as_deref(), Ok("a, b!"));
    assert!(isolated.3.is_err());

    let before = peak_memory();
    let bomb = "(\"x\" * 100000000) ~ (\"x\" * 100000000) ~ (\"x\" * 100000000)";
    let error = expressions.truthy(bomb, &context).unwrap_err();
    assert!(error.contains("memory"), "{error}");
    let error = expressions
        .render_text(&format!("{{{{ {bomb} }}}}"), &context)
        .unwrap_err();
    assert!(error.contains("memory"), "{error}");
    let grown = peak_memory().saturating_sub(before);
    assert!(grown < 64 * 1024 * 1024, "grew by {grown} bytes");
    assert_eq!(expressions.truthy("input.count > 3", &context), Ok(true));
}

#[test]
fn a_renderer_past_its_timeout_is_killed_and_the_render_fails() {
    let config = IsolationConfig {
        executable: PathBuf::from(env!("CARGO_BIN_EXE_agentry-template-renderer")),
        // Generous memory: this render is slow (a 100 MB string counted a thousand times),
        // not large enough to die of it.
        memory_bytes: 4 * 1024 * 1024 * 1024,
        timeout: Duration::from_millis(200),
    };
    assert!(isolation::isolate(config));
    let expressions = Expressions::new();
    let slow = "([(\"x\" * 100000000)] * 1000) | map('length') | sum";
    let error = expressions.evaluate(slow, &json!({})).unwrap_err();
    assert!(error.contains("ran longer than"), "{error}");
    assert!(children().iter().all(|(_, state)| *state != 'Z'));
    assert_eq!(expressions.evaluate("1 + 1", &json!({})), Ok(json!(2)));
}

#[test]
fn text_renders_are_capped() {
    let expressions = Expressions::new();
    let error = expressions
        .render_text("{{ 'x' * 2000000 }}", &json!({}))
        .unwrap_err();
    assert!(error.contains("renders more than 1048576 bytes"), "{error}");
    assert_eq!(
        expressions.render_text("{{ 'x' * 3 }}", &json!({})),
        Ok("xxx".to_owned())
    );
}
