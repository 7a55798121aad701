//! Prompt templates: storing, rendering, and the errors a caller can act on.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use agentry_core::template::{TemplateError, TemplateLimits, TemplateStore};
use serde_json::{Map, Value, json};

fn arguments(value: Value) -> Map<String, Value> {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments must be an object: {other}"),
    }
}

#[test]
fn renders_with_variables() {
    let mut store = TemplateStore::new();
    store
        .add(
            "greeting",
            "Hello {{ name }}, you have {{count}} new messages{% if urgent %} (urgent){% endif %}.\n\
             {% for item in items %}- {{ item.title | upper }}\n{% endfor %}",
        )
        .unwrap();
    let text = store
        .render(
            "greeting",
            &arguments(json!({
                "name": "Ada",
                "count": 3,
                "urgent": true,
                "items": [{"title": "first"}, {"title": "second"}]
            })),
        )
        .unwrap();
    assert_eq!(
        text,
        "Hello Ada, you have 3 new messages (urgent).\n- FIRST\n- SECOND\n"
    );
}

#[test]
fn a_missing_variable_is_named() {
    let mut store = TemplateStore::new();
    store
        .add("trip", "Plan a trip for {{ name }} to {{ city }}.")
        .unwrap();
    let error = store
        .render("trip", &arguments(json!({"name": "Ada"})))
        .unwrap_err();
    assert_eq!(
        error,
        TemplateError::MissingVariable {
            template: "trip".into(),
            variable: "city".into()
        }
    );
    assert!(error.to_string().contains("\"city\""), "{error}");

    // A missing object used through an attribute is named too.
    store
        .add("profile", "{{ user.name }} lives in {{ place }}")
        .unwrap();
    let error = store
        .render("profile", &arguments(json!({"place": "Paris"})))
        .unwrap_err();
    assert_eq!(
        error,
        TemplateError::MissingVariable {
            template: "profile".into(),
            variable: "user".into()
        }
    );

    // A missing attribute of a given object is a render error, not a missing variable.
    let error = store
        .render(
            "profile",
            &arguments(json!({"user": {"email": "a@b"}, "place": "Paris"})),
        )
        .unwrap_err();
    assert!(matches!(error, TemplateError::Render { .. }), "{error:?}");

    // A missing variable that a filter or operator uses is named as well.
    store
        .add("count", "{{ items | length }} items for {{ who }}")
        .unwrap();
    let error = store
        .render("count", &arguments(json!({"who": "Ada"})))
        .unwrap_err();
    assert_eq!(
        error,
        TemplateError::MissingVariable {
            template: "count".into(),
            variable: "items".into()
        }
    );

    // A loop variable's missing attribute is not a missing argument.
    store
        .add("rows", "{% for row in rows %}{{ row.name }}{% endfor %}")
        .unwrap();
    let error = store
        .render("rows", &arguments(json!({"rows": [{"id": 1}]})))
        .unwrap_err();
    assert!(matches!(error, TemplateError::Render { .. }), "{error:?}");
}

#[test]
fn a_variable_only_tested_with_is_defined_may_be_left_out() {
    let mut store = TemplateStore::new();
    store
        .add(
            "optional",
            "Hi{% if nickname is defined %} {{ nickname }}{% endif %}!",
        )
        .unwrap();
    assert_eq!(store.render("optional", &Map::new()).unwrap(), "Hi!");
    assert_eq!(
        store
            .render("optional", &arguments(json!({"nickname": "Ace"})))
            .unwrap(),
        "Hi Ace!"
    );
}

#[test]
fn an_unknown_template_is_not_found() {
    let store = TemplateStore::new();
    assert_eq!(
        store.render("nope", &Map::new()).unwrap_err(),
        TemplateError::NotFound("nope".into())
    );
    assert_eq!(
        store.variables("nope").unwrap_err(),
        TemplateError::NotFound("nope".into())
    );
}

#[test]
fn bad_syntax_is_rejected_at_add_with_the_line() {
    let mut store = TemplateStore::new();
    let error = store
        .add("broken", "Line one\nHello {{ name \nLine three")
        .unwrap_err();
    let TemplateError::Syntax {
        template,
        line,
        reason,
    } = &error
    else {
        panic!("expected Syntax, got {error:?}");
    };
    assert_eq!(template, "broken");
    assert!(matches!(line, Some(2 | 3)), "{error:?}");
    assert!(!reason.is_empty());
    assert!(error.to_string().contains("line"), "{error}");
    assert!(store.get("broken").is_none());
    assert!(store.is_empty());

    let error = store.add("unclosed", "{% if x %}never closed").unwrap_err();
    assert!(matches!(error, TemplateError::Syntax { .. }), "{error:?}");

    // Replacing with a bad source keeps the old template.
    store.add("kept", "Hello {{ name }}").unwrap();
    let error = store.replace("kept", "Hello {{ name ").unwrap_err();
    assert!(matches!(error, TemplateError::Syntax { .. }), "{error:?}");
    assert_eq!(store.get("kept"), Some("Hello {{ name }}"));
    assert_eq!(
        store
            .render("kept", &arguments(json!({"name": "Ada"})))
            .unwrap(),
        "Hello Ada"
    );
}

#[test]
fn html_is_not_escaped() {
    let mut store = TemplateStore::new();
    store.add("raw", "{{ html }}").unwrap();
    let html = "<b>bold</b> & 'quoted' \"text\"";
    assert_eq!(
        store
            .render("raw", &arguments(json!({"html": html})))
            .unwrap(),
        html
    );
}

#[test]
fn add_replace_remove_get_and_list() {
    let mut store = TemplateStore::default();
    store.add("b", "B {{ x }}").unwrap();
    store.add("a", "A").unwrap();
    assert_eq!(store.list(), ["a", "b"]);
    assert_eq!(store.len(), 2);
    assert_eq!(
        store.add("a", "again").unwrap_err(),
        TemplateError::AlreadyExists("a".into())
    );

    assert_eq!(store.replace("a", "A2").unwrap(), Some("A".to_owned()));
    assert_eq!(store.replace("c", "C").unwrap(), None);
    assert_eq!(store.get("a"), Some("A2"));
    assert_eq!(store.render("a", &Map::new()).unwrap(), "A2");

    assert_eq!(store.remove("b").unwrap(), "B {{ x }}");
    assert_eq!(
        store.remove("b").unwrap_err(),
        TemplateError::NotFound("b".into())
    );
    assert_eq!(
        store.render("b", &arguments(json!({"x": 1}))).unwrap_err(),
        TemplateError::NotFound("b".into())
    );
    assert_eq!(store.list(), ["a", "c"]);

    for name in ["", "has space", "dotted.name"] {
        assert_eq!(
            store.add(name, "x").unwrap_err(),
            TemplateError::InvalidName { name: name.into() }
        );
    }
}

#[test]
fn variables_lists_what_the_template_reads() {
    let mut store = TemplateStore::new();
    store
        .add(
            "report",
            "{{ title }}\n{% for row in rows %}{{ row.name }}: {{ loop.index }}{% endfor %}\n\
             {% set total = rows | length %}{{ total }} rows, {{ range(3) | length }} {{ footer | default('') }}",
        )
        .unwrap();
    let expected: BTreeSet<String> = ["footer", "rows", "title"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(store.variables("report").unwrap(), expected);
}

const NESTED_LOOPS: &str =
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";

#[test]
fn a_runaway_template_is_refused_at_add_quickly() {
    let mut store = TemplateStore::new();
    let started = Instant::now();
    let error = store.add("spin", NESTED_LOOPS).unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(
        error,
        TemplateError::TooExpensive {
            template: "spin".into(),
            fuel: TemplateLimits::DEFAULT_FUEL
        }
    );
    assert!(error.to_string().contains("too expensive"), "{error}");
    assert!(store.get("spin").is_none());
    assert!(store.is_empty());

    // Replacing with a runaway source keeps the old template.
    store.add("kept", "fine").unwrap();
    assert!(matches!(
        store.replace("kept", NESTED_LOOPS).unwrap_err(),
        TemplateError::TooExpensive { .. }
    ));
    assert_eq!(store.get("kept"), Some("fine"));
}

#[test]
fn a_template_that_runs_away_with_its_arguments_stops_at_render() {
    let mut store = TemplateStore::new();
    // Bounded with the empty-string trial arguments (the loops run zero times)…
    store
        .add(
            "spin",
            "{% for i in outer %}{% for j in range(100000) %}{{ j }}{% endfor %}{% endfor %}",
        )
        .unwrap();
    // …not with real ones.
    let started = Instant::now();
    let error = store
        .render("spin", &arguments(json!({"outer": vec![0; 100_000]})))
        .unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        matches!(
            error,
            TemplateError::TooExpensive { .. } | TemplateError::TooLarge { .. }
        ),
        "{error:?}"
    );
}

#[test]
fn output_is_capped() {
    let limits = TemplateLimits {
        fuel: TemplateLimits::DEFAULT_FUEL,
        max_output_bytes: 1000,
    };
    let mut store = TemplateStore::with_limits(limits);
    assert_eq!(store.limits(), limits);
    // A single expression that is large whatever the arguments: refused at add.
    let error = store.add("wide", "{{ 'x' * 5000 }}").unwrap_err();
    assert_eq!(
        error,
        TemplateError::TooLarge {
            template: "wide".into(),
            max_bytes: 1000
        }
    );
    assert!(store.is_empty());

    // Large only with its arguments: refused at render; at the cap exactly it renders.
    store.add("echo", "{{ text }}").unwrap();
    let error = store
        .render("echo", &arguments(json!({"text": "y".repeat(1001)})))
        .unwrap_err();
    assert_eq!(
        error,
        TemplateError::TooLarge {
            template: "echo".into(),
            max_bytes: 1000
        }
    );
    assert!(error.to_string().contains("1000 bytes"), "{error}");
    let exact = "z".repeat(1000);
    assert_eq!(
        store
            .render("echo", &arguments(json!({"text": exact})))
            .unwrap(),
        exact
    );
}

#[test]
fn ordinary_loops_fit_the_default_budget() {
    let mut store = TemplateStore::new();
    store
        .add(
            "list",
            "{% for item in items %}- {{ loop.index }}. {{ item.title | upper | trim }}\n{% endfor %}",
        )
        .unwrap();
    let items: Vec<Value> = (0..2000)
        .map(|i| json!({"title": format!(" item {i} ")}))
        .collect();
    let text = store
        .render("list", &arguments(json!({ "items": items })))
        .unwrap();
    assert!(text.ends_with("- 2000. ITEM 1999\n"), "{text}");
}
