//! Workflows built from Rust: the same definitions as the YAML and JSON documents, made with
//! typed constructors instead of text. What they build is checked the same way when saved
//! ([`crate::App::create_workflow`]).
//!
//! ```
//! use agentry_app::workflows::definition::StepDefinition;
//! use agentry_app::workflows::WorkflowDefinition;
//! use serde_json::json;
//!
//! let review = WorkflowDefinition::new("review")
//!     .input_schema(json!({"type": "object", "required": ["topic"]}))
//!     .step(StepDefinition::agent("draft", "writer", "Write about {{ input.topic }}."))
//!     .step(StepDefinition::approval("ok", "Publish? {{ steps.draft.output }}").timeout_secs(3600))
//!     .step(StepDefinition::tool("publish", "http_post", json!({"body": "{{ steps.draft.output }}"}))
//!         .retry(3, 2.0));
//! assert_eq!(review.steps.len(), 3);
//! ```

use serde_json::{Map, Value, json};

use super::definition::{RetryPolicy, StepDefinition, StepErrorKind, WorkflowDefinition};

impl WorkflowDefinition {
    /// A workflow `id` with no steps yet (add them with [`Self::step`]).
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            description: None,
            version: 0,
            input_schema: None,
            steps: Vec::new(),
            output: None,
            webhook_url: None,
        }
    }

    /// What it does.
    #[must_use]
    pub fn description(mut self, text: impl Into<String>) -> Self {
        self.description = Some(text.into());
        self
    }

    /// The JSON Schema its input must match.
    #[must_use]
    pub fn input_schema(mut self, schema: Value) -> Self {
        self.input_schema = Some(schema);
        self
    }

    /// Its output: a template over `input` and `steps`.
    #[must_use]
    pub fn output(mut self, template: Value) -> Self {
        self.output = Some(template);
        self
    }

    /// Adds a step (after the one before it, unless it says what it [`StepDefinition::needs`]).
    #[must_use]
    pub fn step(mut self, step: StepDefinition) -> Self {
        self.steps.push(step);
        self
    }
}

impl StepDefinition {
    /// A step `id` of `kind` with these kind fields.
    fn of(id: impl Into<String>, kind: &str, fields: Value) -> Self {
        let fields = match fields {
            Value::Object(fields) => fields,
            _ => Map::new(),
        };
        Self {
            id: id.into(),
            kind: kind.to_owned(),
            needs: None,
            when: None,
            retry: None,
            timeout_secs: None,
            on_failure: None,
            fields,
        }
    }

    /// Calls `tool` with `arguments` (strings inside are templates).
    pub fn tool(id: impl Into<String>, tool: &str, arguments: Value) -> Self {
        Self::of(id, "tool", json!({"tool": tool, "arguments": arguments}))
    }

    /// Runs the saved agent `agent` on `prompt` (a template).
    pub fn agent(id: impl Into<String>, agent: &str, prompt: &str) -> Self {
        Self::of(id, "agent", json!({"agent": agent, "prompt": prompt}))
    }

    /// Runs the saved agent `agent` on `prompt`; its answer must be JSON matching `schema`
    /// (sent back to it with what is wrong, once by default: see `repair_attempts`).
    pub fn agent_json(id: impl Into<String>, agent: &str, prompt: &str, schema: Value) -> Self {
        Self::of(
            id,
            "agent",
            json!({"agent": agent, "prompt": prompt, "output_schema": schema}),
        )
    }

    /// Runs the saved workflow `workflow` with `input` (a template).
    pub fn workflow(id: impl Into<String>, workflow: &str, input: Value) -> Self {
        Self::of(
            id,
            "workflow",
            json!({"workflow": workflow, "input": input}),
        )
    }

    /// Runs `each` (a tool, agent or workflow step; its id is not used) once per item of the
    /// list `items` (an expression), `concurrency` at once.
    pub fn map(
        id: impl Into<String>,
        items: &str,
        concurrency: usize,
        each: StepDefinition,
    ) -> Self {
        Self::of(
            id,
            "map",
            json!({"items": items, "concurrency": concurrency, "step": each.inner()}),
        )
    }

    /// Runs `body` (a tool, agent or workflow step) again and again until `until` (an
    /// expression over `last` and `iteration`) is true, at most `max` times.
    pub fn repeat(id: impl Into<String>, max: u32, until: &str, body: StepDefinition) -> Self {
        Self::of(
            id,
            "loop",
            json!({"max": max, "until": until, "step": body.inner()}),
        )
    }

    /// Runs `branches` (name, then a tool, agent or workflow step; its id is not used) at
    /// once; the output is an object of their outputs by name.
    pub fn parallel<I, S>(id: impl Into<String>, branches: I) -> Self
    where
        I: IntoIterator<Item = (S, StepDefinition)>,
        S: Into<String>,
    {
        let branches: Map<String, Value> = branches
            .into_iter()
            .map(|(name, step)| (name.into(), step.inner()))
            .collect();
        Self::of(id, "parallel", json!({"branches": branches}))
    }

    /// Chooses the way on: the step of the first case (`(expression, step id)`) that holds,
    /// else `default`; the steps of the other cases are skipped. Each named step needs this
    /// one.
    pub fn switch<I, S, T>(id: impl Into<String>, cases: I, default: Option<&str>) -> Self
    where
        I: IntoIterator<Item = (S, T)>,
        S: Into<String>,
        T: Into<String>,
    {
        let cases: Vec<Value> = cases
            .into_iter()
            .map(|(when, then)| json!({"when": when.into(), "then": then.into()}))
            .collect();
        let mut fields = json!({"cases": cases});
        if let Some(default) = default {
            fields["default"] = json!(default);
        }
        Self::of(id, "switch", fields)
    }

    /// Waits for a person's decision on `message` (a template).
    pub fn approval(id: impl Into<String>, message: &str) -> Self {
        Self::of(id, "approval", json!({"message": message}))
    }

    /// Waits `seconds` (a durable timer).
    pub fn wait(id: impl Into<String>, seconds: u64) -> Self {
        Self::of(id, "wait", json!({"seconds": seconds}))
    }

    /// Waits for the signal `name`; its payload is the output.
    pub fn signal(id: impl Into<String>, name: &str) -> Self {
        Self::of(id, "signal", json!({"name": name}))
    }

    /// Runs after these steps (instead of the one before; none: at the start).
    #[must_use]
    pub fn needs<I, S>(mut self, steps: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.needs = Some(steps.into_iter().map(Into::into).collect());
        self
    }

    /// Runs only when `expression` is true (else it is skipped).
    #[must_use]
    pub fn when(mut self, expression: &str) -> Self {
        self.when = Some(expression.to_owned());
        self
    }

    /// Tries it up to `attempts` times, `backoff_secs` before the second (doubled after).
    #[must_use]
    pub fn retry(mut self, attempts: u32, backoff_secs: f64) -> Self {
        self.retry = Some(RetryPolicy {
            on: None,
            attempts,
            backoff_secs,
        });
        self
    }

    /// Tries it again only after failures of these kinds (with [`Self::retry`]'s attempts
    /// and backoff; one attempt with no backoff when it has none).
    #[must_use]
    pub fn retry_on(mut self, kinds: impl IntoIterator<Item = StepErrorKind>) -> Self {
        let mut policy = self.retry.take().unwrap_or(RetryPolicy {
            attempts: 1,
            backoff_secs: 0.0,
            on: None,
        });
        policy.on = Some(kinds.into_iter().collect());
        self.retry = Some(policy);
        self
    }

    /// If it fails (after its retries), `handler` runs instead of the run failing; the
    /// handler must need this step.
    #[must_use]
    pub fn on_failure(mut self, handler: &str) -> Self {
        self.on_failure = Some(handler.to_owned());
        self
    }

    /// The longest one attempt may take.
    #[must_use]
    pub fn timeout_secs(mut self, seconds: u64) -> Self {
        self.timeout_secs = Some(seconds);
        self
    }

    /// Sets one more field of its kind (an approval's `on_timeout`, an agent step's
    /// `repair_attempts`, …); the fields every step has (`needs`, `when`, `retry`,
    /// `timeout_secs`) have their own methods.
    #[must_use]
    pub fn with(mut self, field: &str, value: Value) -> Self {
        self.fields.insert(field.to_owned(), value);
        self
    }

    /// The step as a `map` or `loop` carries it: its kind and fields.
    fn inner(self) -> Value {
        let mut fields = self.fields;
        fields.insert("kind".into(), Value::String(self.kind));
        Value::Object(fields)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_policy_is_built_as_written() {
        let built = StepDefinition::tool("call", "billing", json!({}))
            .retry(3, 0.5)
            .retry_on([StepErrorKind::Tool, StepErrorKind::Timeout])
            .on_failure("fallback");
        let written: StepDefinition = serde_json::from_value(json!({
            "id": "call", "kind": "tool", "tool": "billing", "arguments": {},
            "retry": {"attempts": 3, "backoff_secs": 0.5, "on": ["tool", "timeout"]},
            "on_failure": "fallback"
        }))
        .unwrap();
        assert_eq!(built, written);
    }

    #[test]
    fn a_built_workflow_is_the_document_it_stands_for() {
        let built = WorkflowDefinition::new("costs")
            .description("Cloud costs")
            .input_schema(json!({"type": "object"}))
            .step(StepDefinition::tool(
                "bill",
                "billing",
                json!({"month": "{{ input.month }}"}),
            ))
            .step(
                StepDefinition::map(
                    "each",
                    "steps.bill.output.items",
                    4,
                    StepDefinition::agent("_", "analyst", "Look at {{ item }}."),
                )
                .retry(2, 0.5)
                .timeout_secs(60),
            )
            .step(
                StepDefinition::agent_json("sum", "analyst", "Sum up.", json!({"type": "object"}))
                    .with("repair_attempts", json!(2)),
            )
            .step(StepDefinition::repeat(
                "polish",
                3,
                "last.ok",
                StepDefinition::tool("_", "check", json!({})),
            ))
            .step(
                StepDefinition::approval("ok", "Fine?")
                    .with("on_timeout", json!("approve"))
                    .timeout_secs(600),
            )
            .step(StepDefinition::wait("rest", 5).needs(["ok"]))
            .step(
                StepDefinition::signal("go", "go")
                    .needs(Vec::<String>::new())
                    .when("input.wait"),
            )
            .step(StepDefinition::workflow("sub", "other", json!({"n": 1})).needs(["rest", "go"]))
            .step(StepDefinition::parallel(
                "both",
                [
                    ("left", StepDefinition::tool("_", "check", json!({}))),
                    ("right", StepDefinition::agent("_", "analyst", "Right?")),
                ],
            ))
            .step(StepDefinition::switch(
                "route",
                [("steps.both.output.left.ok", "done")],
                Some("again"),
            ))
            .step(StepDefinition::wait("done", 0).needs(["route"]))
            .step(StepDefinition::wait("again", 1).needs(["route"]))
            .output(json!("{{ steps.sub.output }}"));
        let document = json!({
            "id": "costs", "description": "Cloud costs", "input_schema": {"type": "object"},
            "steps": [
                {"id": "bill", "kind": "tool", "tool": "billing", "arguments": {"month": "{{ input.month }}"}},
                {"id": "each", "kind": "map", "items": "steps.bill.output.items", "concurrency": 4,
                 "step": {"kind": "agent", "agent": "analyst", "prompt": "Look at {{ item }}."},
                 "retry": {"attempts": 2, "backoff_secs": 0.5}, "timeout_secs": 60},
                {"id": "sum", "kind": "agent", "agent": "analyst", "prompt": "Sum up.",
                 "output_schema": {"type": "object"}, "repair_attempts": 2},
                {"id": "polish", "kind": "loop", "max": 3, "until": "last.ok",
                 "step": {"kind": "tool", "tool": "check", "arguments": {}}},
                {"id": "ok", "kind": "approval", "message": "Fine?", "on_timeout": "approve", "timeout_secs": 600},
                {"id": "rest", "kind": "wait", "seconds": 5, "needs": ["ok"]},
                {"id": "go", "kind": "signal", "name": "go", "needs": [], "when": "input.wait"},
                {"id": "sub", "kind": "workflow", "workflow": "other", "input": {"n": 1}, "needs": ["rest", "go"]},
                {"id": "both", "kind": "parallel", "branches": {
                    "left": {"kind": "tool", "tool": "check", "arguments": {}},
                    "right": {"kind": "agent", "agent": "analyst", "prompt": "Right?"}}},
                {"id": "route", "kind": "switch", "cases": [{"when": "steps.both.output.left.ok", "then": "done"}],
                 "default": "again"},
                {"id": "done", "kind": "wait", "seconds": 0, "needs": ["route"]},
                {"id": "again", "kind": "wait", "seconds": 1, "needs": ["route"]}
            ],
            "output": "{{ steps.sub.output }}"
        });
        let written: WorkflowDefinition = serde_json::from_value(document.clone()).unwrap();
        assert_eq!(built, written);
        // The published schema takes the document (every kind), and refuses a switch without
        // cases and a parallel branch that waits.
        let schema =
            jsonschema::validator_for(&crate::workflows::workflow_schema().unwrap()).unwrap();
        let errors: Vec<String> = schema
            .iter_errors(&document)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{errors:?}");
        for bad in [
            json!({"id": "s", "kind": "switch", "default": "a"}),
            json!({"id": "p", "kind": "parallel", "branches": {"x": {"kind": "wait", "seconds": 1}}}),
        ] {
            let mut document = document.clone();
            document["steps"][0] = bad;
            assert!(!schema.is_valid(&document), "{document}");
        }
        // Every step reads as its kind.
        for (index, step) in built.steps.iter().enumerate() {
            step.step_kind(index).unwrap();
        }
    }
}
