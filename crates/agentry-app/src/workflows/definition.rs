//! A workflow as data: its steps (`tool`, `agent`, `workflow`, `map`, `loop`, `parallel`,
//! `switch`, `approval`, `wait`, `signal`), how
//! they depend on each other (`needs`; by default the step before), when each runs (`when`, an
//! expression), their retry policy, and the templates that carry data between them
//! (`{{ input.x }}`, `{{ steps.fetch.output.items }}`). Expressions and templates are
//! minijinja's (the engine prompt templates use), strict about undefined names; a string that
//! is one `{{ … }}` keeps the value's JSON type. A definition is checked whole before it is
//! stored: every problem is named by its path (`steps[2].needs[0]`).

use std::collections::{BTreeMap, BTreeSet};

use agentry_core::template::Expressions;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::error::AppError;

/// Most steps one workflow may have.
pub const MAX_STEPS: usize = 1000;
/// Most items one `map` step may fan out over.
pub const MAX_MAP_ITEMS: usize = 10_000;
/// The longest durable timer or approval timeout: thirty days.
pub const MAX_WAIT_SECS: u64 = 30 * 24 * 3600;

/// A stored workflow definition.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct WorkflowDefinition {
    /// The id it is started by.
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9_-]{1,64}$"))]
    pub id: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its version: set by the server, 1 at creation and one more at each replacement. A run
    /// keeps the definition it started with.
    #[serde(default)]
    pub version: u32,
    /// The JSON Schema its input must match (default: any object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub input_schema: Option<Value>,
    /// The steps, in order (a step needs the one before unless it says what it `needs`).
    #[cfg_attr(feature = "openapi", schema(value_type = Vec<Object>))]
    pub steps: Vec<StepDefinition>,
    /// The workflow's output, a template over `input` and `steps` (default: the last step's
    /// output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<Object>))]
    pub output: Option<Value>,
    /// Where each run's end is told (`workflow.succeeded`, `workflow.failed`,
    /// `workflow.cancelled`), signed like a background run's webhook, unless the run names its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
}

/// One step as written: its common fields and its kind's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepDefinition {
    /// Its id (what later steps name it by).
    pub id: String,
    /// `tool`, `agent`, `workflow`, `map`, `loop`, `parallel`, `switch`, `approval`, `wait` or
    /// `signal`.
    pub kind: String,
    /// The steps it waits for (default: the step before; `[]`: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs: Option<Vec<String>>,
    /// An expression: the step runs only when it is true, else it is skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when: Option<String>,
    /// How often it is tried, and how long between tries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<RetryPolicy>,
    /// The longest one attempt may take, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_secs: Option<u64>,
    /// The step that runs if this one fails (after its retries) instead of the run failing:
    /// it must need this step, it is skipped when this step does not fail, and it sees this
    /// step's `error` and `error_kind`. Steps that need the failed one and are not its handler
    /// are skipped (a join that needs a step that ran still runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_failure: Option<String>,
    /// The kind's fields.
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

/// Retries of a failed step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetryPolicy {
    /// Attempts in all (1: no retry).
    pub attempts: u32,
    /// Seconds before the second attempt; doubled for each later one.
    #[serde(default = "default_backoff")]
    pub backoff_secs: f64,
    /// Only failures of these kinds are tried again (default: every kind).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on: Option<Vec<StepErrorKind>>,
}

/// What kind of failure failed a step's attempt: what a retry policy's `on` names, and what a
/// step's `error_kind` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum StepErrorKind {
    /// The attempt took longer than the step's `timeout_secs`.
    Timeout,
    /// The tool call failed.
    Tool,
    /// The agent's run failed.
    Agent,
    /// The agent's structured answer could not be used, even after its repairs.
    InvalidOutput,
    /// The sub-workflow failed, was cancelled, or could not start.
    Workflow,
    /// A template or expression failed, or gave a value of the wrong kind (a map over a
    /// non-list, arguments that are not an object).
    Expression,
    /// A loop's `until` was not true within its `max` iterations.
    LoopExhausted,
    /// A person rejected the approval, or its timeout did.
    Rejected,
    /// Anything else (the store, the engine).
    Internal,
}

fn default_backoff() -> f64 {
    1.0
}

/// What a step does, by kind.
#[derive(Debug, Clone, PartialEq)]
pub enum StepKind {
    /// Calls a tool directly with templated arguments.
    Tool(ToolStep),
    /// Runs a saved agent on a templated prompt, in a session of its own (a background run).
    Agent(AgentStep),
    /// Fans out over a list: its `step` (a tool or agent step) once per item (`item`, `index`),
    /// at most `concurrency` at once; the output is the outputs in the items' order.
    Map {
        /// An expression giving the list.
        items: String,
        /// How many items run at once.
        concurrency: usize,
        /// What runs per item.
        step: Box<StepKind>,
    },
    /// Runs a saved workflow (a sub-workflow) with a templated input; its output is the step's.
    Workflow {
        /// The workflow's id.
        workflow: String,
        /// Its input (a template).
        input: Value,
    },
    /// Repeats its `step` (a tool, agent or workflow step; `iteration` counts from 0 and
    /// `last` is the previous output) until `until` is true of the latest output (`last`),
    /// at most `max` times; the output is the last iteration's. Not meeting `until` in `max`
    /// iterations fails the step.
    Loop {
        /// Most iterations.
        max: u32,
        /// An expression over `last` (and `iteration`).
        until: String,
        /// What each iteration runs.
        step: Box<StepKind>,
    },
    /// Runs named branches at once, each a tool, agent or workflow step (a sub-workflow for a
    /// branch of several steps); the output is an object of their outputs by branch name. A
    /// branch that fails fails the step (after the others have stopped).
    Parallel {
        /// The branches by name, in order.
        branches: Vec<(String, StepKind)>,
        /// How many branches run at once (default: all).
        concurrency: usize,
    },
    /// Chooses the way on: the first case whose `when` is true names the step that runs
    /// (`then`), else `default`; the other cases' steps are skipped, and so is every step that
    /// needs only skipped ones (a join that needs one step that ran, runs). Each step a case
    /// names needs the switch. The output is `{"case": <index, or "default", or null>, "next":
    /// <the chosen step, or null>}`.
    Switch {
        /// The cases, in order.
        cases: Vec<SwitchCase>,
        /// The step when no case holds (none: every case's step is skipped).
        default: Option<String>,
    },
    /// Waits for a person's decision (`POST …/approve`); a rejection fails the step.
    Approval {
        /// What the person is asked (a template).
        message: String,
        /// Seconds before `on_timeout` decides.
        timeout_secs: Option<u64>,
        /// What a timeout decides: `approve` or `reject` (default).
        approve_on_timeout: bool,
    },
    /// A durable timer.
    Wait {
        /// How long, in seconds.
        seconds: u64,
    },
    /// Waits for a signal of this name (`POST …/signal`); its payload is the output.
    Signal {
        /// The signal's name.
        name: String,
    },
}

/// One case of a `switch` step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwitchCase {
    /// An expression over `input` and `steps`.
    pub when: String,
    /// The step that runs when it is the first case that holds.
    pub then: String,
}

/// A `tool` step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolStep {
    /// The tool's name.
    pub tool: String,
    /// Its arguments: a template (strings inside are rendered).
    #[serde(default = "empty_object")]
    pub arguments: Value,
}

fn empty_object() -> Value {
    Value::Object(Map::new())
}

/// An `agent` step.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStep {
    /// The saved agent.
    pub agent: String,
    /// What it is asked (a template).
    pub prompt: String,
    /// When set, the answer must be JSON matching this schema; it becomes the step's output.
    /// The prompt then ends with the schema and an instruction to answer with JSON only.
    #[serde(default)]
    pub output_schema: Option<Value>,
    /// How many times an answer that is not JSON matching `output_schema` is sent back to the
    /// agent, in the same session, with what is wrong (default 1, at most 5; 0: none), before
    /// the attempt fails.
    #[serde(default = "default_repairs")]
    pub repair_attempts: u32,
}

/// The most repairs of a structured answer an agent step may ask for.
pub const MAX_REPAIRS: u32 = 5;

fn default_repairs() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MapFields {
    items: String,
    #[serde(default = "default_concurrency")]
    concurrency: usize,
    step: Map<String, Value>,
}

fn default_concurrency() -> usize {
    4
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkflowFields {
    workflow: String,
    #[serde(default = "empty_object")]
    input: Value,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoopFields {
    max: u32,
    until: String,
    step: Map<String, Value>,
}

/// The kinds a `map`, `loop` or `parallel` runs per item, iteration or branch.
const INNER_KINDS: [&str; 3] = ["tool", "agent", "workflow"];

/// The inner step of a `map`, `loop` or `parallel` branch, at `path`.
fn inner_step(step: &Map<String, Value>, path: &str) -> Result<StepKind, AppError> {
    let kind = step
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    if !INNER_KINDS.contains(&kind.as_str()) {
        return Err(invalid(
            &format!("{path}.kind"),
            "a map, loop or parallel branch runs a tool, agent or workflow step",
        ));
    }
    let mut fields = step.clone();
    fields.remove("kind");
    kind_of(&kind, &fields, path)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ParallelFields {
    branches: Map<String, Value>,
    #[serde(default)]
    concurrency: Option<usize>,
}

/// Most branches one `parallel` step may have.
pub const MAX_BRANCHES: usize = 100;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SwitchFields {
    cases: Vec<SwitchCase>,
    #[serde(default)]
    default: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ApprovalFields {
    message: String,
    #[serde(default)]
    timeout_secs: Option<u64>,
    #[serde(default)]
    on_timeout: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitFields {
    seconds: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SignalFields {
    name: String,
}

/// A definition problem, named by its path.
fn invalid(path: &str, message: impl std::fmt::Display) -> AppError {
    AppError::new(
        crate::error::Failure::Invalid,
        "invalid_workflow",
        format!("{path}: {message}"),
    )
}

/// Parses a kind's own fields.
fn kind_of(kind: &str, fields: &Map<String, Value>, path: &str) -> Result<StepKind, AppError> {
    let parse = |what: &'static str| {
        move |error: serde_json::Error| invalid(path, format!("a {what} step: {error}"))
    };
    let value = Value::Object(fields.clone());
    Ok(match kind {
        "tool" => StepKind::Tool(serde_json::from_value(value).map_err(parse("tool"))?),
        "agent" => StepKind::Agent(serde_json::from_value(value).map_err(parse("agent"))?),
        "map" => {
            let map: MapFields = serde_json::from_value(value).map_err(parse("map"))?;
            if map.concurrency == 0 || map.concurrency > 1000 {
                return Err(invalid(&format!("{path}.concurrency"), "is 1 to 1000"));
            }
            let step = inner_step(&map.step, &format!("{path}.step"))?;
            StepKind::Map {
                items: map.items,
                concurrency: map.concurrency,
                step: Box::new(step),
            }
        }
        "workflow" => {
            let workflow: WorkflowFields =
                serde_json::from_value(value).map_err(parse("workflow"))?;
            if !workflow.input.is_object() && !workflow.input.is_string() {
                return Err(invalid(
                    &format!("{path}.input"),
                    "the input is an object (or one template giving one)",
                ));
            }
            StepKind::Workflow {
                workflow: workflow.workflow,
                input: workflow.input,
            }
        }
        "loop" => {
            let looped: LoopFields = serde_json::from_value(value).map_err(parse("loop"))?;
            if looped.max == 0 || looped.max > 100 {
                return Err(invalid(&format!("{path}.max"), "is 1 to 100"));
            }
            let step = inner_step(&looped.step, &format!("{path}.step"))?;
            StepKind::Loop {
                max: looped.max,
                until: looped.until,
                step: Box::new(step),
            }
        }
        "parallel" => {
            let parallel: ParallelFields =
                serde_json::from_value(value).map_err(parse("parallel"))?;
            if parallel.branches.is_empty() || parallel.branches.len() > MAX_BRANCHES {
                return Err(invalid(
                    &format!("{path}.branches"),
                    format!("a parallel step has 1 to {MAX_BRANCHES} branches"),
                ));
            }
            let mut branches = Vec::with_capacity(parallel.branches.len());
            for (name, branch) in &parallel.branches {
                let branch_path = format!("{path}.branches.{name}");
                crate::config::check_name("branch", name)
                    .map_err(|error| invalid(&branch_path, error.message))?;
                let Value::Object(branch) = branch else {
                    return Err(invalid(&branch_path, "a branch is a step (an object)"));
                };
                branches.push((name.clone(), inner_step(branch, &branch_path)?));
            }
            let concurrency = parallel.concurrency.unwrap_or(branches.len());
            if concurrency == 0 || concurrency > MAX_BRANCHES {
                return Err(invalid(
                    &format!("{path}.concurrency"),
                    format!("is 1 to {MAX_BRANCHES}"),
                ));
            }
            StepKind::Parallel {
                branches,
                concurrency,
            }
        }
        "switch" => {
            let switch: SwitchFields = serde_json::from_value(value).map_err(parse("switch"))?;
            if switch.cases.is_empty() {
                return Err(invalid(
                    &format!("{path}.cases"),
                    "a switch has at least one case",
                ));
            }
            StepKind::Switch {
                cases: switch.cases,
                default: switch.default,
            }
        }
        "approval" => {
            let approval: ApprovalFields =
                serde_json::from_value(value).map_err(parse("approval"))?;
            let approve_on_timeout = match approval.on_timeout.as_deref() {
                None | Some("reject") => false,
                Some("approve") => true,
                Some(other) => {
                    return Err(invalid(
                        &format!("{path}.on_timeout"),
                        format!("is approve or reject, not {other:?}"),
                    ));
                }
            };
            if approval
                .timeout_secs
                .is_some_and(|secs| secs == 0 || secs > MAX_WAIT_SECS)
            {
                return Err(invalid(
                    &format!("{path}.timeout_secs"),
                    format!("is 1 to {MAX_WAIT_SECS}"),
                ));
            }
            StepKind::Approval {
                message: approval.message,
                timeout_secs: approval.timeout_secs,
                approve_on_timeout,
            }
        }
        "wait" => {
            let wait: WaitFields = serde_json::from_value(value).map_err(parse("wait"))?;
            if wait.seconds > MAX_WAIT_SECS {
                return Err(invalid(
                    &format!("{path}.seconds"),
                    format!("is at most {MAX_WAIT_SECS}"),
                ));
            }
            StepKind::Wait {
                seconds: wait.seconds,
            }
        }
        "signal" => {
            let signal: SignalFields = serde_json::from_value(value).map_err(parse("signal"))?;
            crate::config::check_name("signal", &signal.name)
                .map_err(|error| invalid(&format!("{path}.name"), error.message))?;
            StepKind::Signal { name: signal.name }
        }
        other => {
            return Err(invalid(
                &format!("{path}.kind"),
                format!(
                    "unknown kind {other:?} (tool, agent, workflow, map, loop, parallel, \
                     switch, approval, wait or signal)"
                ),
            ));
        }
    })
}

impl StepDefinition {
    /// The step's kind, parsed.
    pub fn step_kind(&self, index: usize) -> Result<StepKind, AppError> {
        let path = format!("steps[{index}]");
        // An approval's `timeout_secs` is how long it waits for a decision. The field is the
        // step's own (an attempt's time limit for the kinds that run), so the kind's fields
        // do not hold it.
        if self.kind == "approval"
            && let Some(secs) = self.timeout_secs
        {
            let mut fields = self.fields.clone();
            fields.insert("timeout_secs".into(), Value::from(secs));
            return kind_of(&self.kind, &fields, &path);
        }
        kind_of(&self.kind, &self.fields, &path)
    }
}

/// The expression and template engine: strict about undefined names, bounded by fuel and an
/// output cap, and out of process where the process isolates renders (so a value grown
/// without bound costs a renderer, not the server).
pub fn environment() -> Expressions {
    Expressions::new()
}

/// The expression inside a string that is exactly one `{{ … }}`, if it is.
fn whole_expression(text: &str) -> Option<&str> {
    let inner = text.trim().strip_prefix("{{")?.strip_suffix("}}")?;
    (!inner.contains("{{") && !inner.contains("}}")).then_some(inner.trim())
}

/// Checks every template string in `value` compiles.
fn check_templates(env: &Expressions, value: &Value, path: &str) -> Result<(), AppError> {
    match value {
        Value::String(text) => match whole_expression(text) {
            Some(expression) => env
                .check_expression(expression)
                .map_err(|error| invalid(path, format!("the expression does not parse: {error}"))),
            None => env
                .check_text(text)
                .map_err(|error| invalid(path, format!("the template does not parse: {error}"))),
        },
        Value::Array(items) => items
            .iter()
            .enumerate()
            .try_for_each(|(i, item)| check_templates(env, item, &format!("{path}[{i}]"))),
        Value::Object(fields) => fields
            .iter()
            .try_for_each(|(key, item)| check_templates(env, item, &format!("{path}.{key}"))),
        _ => Ok(()),
    }
}

/// Renders every template string in `value` against `context` (a whole `{{ … }}` keeps the
/// value's JSON type).
pub fn render(env: &Expressions, value: &Value, context: &Value) -> Result<Value, String> {
    match value {
        Value::String(text) => match whole_expression(text) {
            Some(expression) => env.evaluate(expression, context),
            None if text.contains("{{") || text.contains("{%") => {
                env.render_text(text, context).map(Value::String)
            }
            None => Ok(value.clone()),
        },
        Value::Array(items) => items
            .iter()
            .map(|item| render(env, item, context))
            .collect::<Result<Vec<_>, _>>()
            .map(Value::Array),
        Value::Object(fields) => fields
            .iter()
            .map(|(key, item)| render(env, item, context).map(|value| (key.clone(), value)))
            .collect::<Result<Map<_, _>, _>>()
            .map(Value::Object),
        _ => Ok(value.clone()),
    }
}

impl WorkflowDefinition {
    /// Checks the definition whole: ids, kinds and their fields, dependencies (known, no
    /// cycle), expressions, templates and the input schema. `known_tool` and `known_agent` say
    /// whether a tool or agent exists.
    pub fn check(
        &self,
        known_tool: impl Fn(&str) -> bool,
        known_agent: impl Fn(&str) -> bool,
        known_workflow: impl Fn(&str) -> bool,
    ) -> Result<(), AppError> {
        crate::config::check_name("workflow", &self.id)
            .map_err(|error| invalid("id", error.message))?;
        if self.steps.is_empty() {
            return Err(invalid("steps", "a workflow needs at least one step"));
        }
        if self.steps.len() > MAX_STEPS {
            return Err(invalid("steps", format!("at most {MAX_STEPS} steps")));
        }
        if let Some(schema) = &self.input_schema {
            jsonschema::validator_for(schema).map_err(|error| {
                invalid("input_schema", format!("not a valid JSON Schema: {error}"))
            })?;
        }
        let env = environment();
        let mut ids = BTreeMap::new();
        for (index, step) in self.steps.iter().enumerate() {
            let path = format!("steps[{index}]");
            crate::config::check_name("step", &step.id)
                .map_err(|error| invalid(&format!("{path}.id"), error.message))?;
            if ids.insert(step.id.as_str(), index).is_some() {
                return Err(invalid(
                    &format!("{path}.id"),
                    format!("{:?} is used twice", step.id),
                ));
            }
            let kind = step.step_kind(index)?;
            check_kind(
                &env,
                &kind,
                &path,
                &Known {
                    tool: &known_tool,
                    agent: &known_agent,
                    workflow: &known_workflow,
                    this: &self.id,
                },
            )?;
            if let Some(when) = &step.when {
                env.check_expression(when).map_err(|error| {
                    invalid(
                        &format!("{path}.when"),
                        format!("the expression does not parse: {error}"),
                    )
                })?;
            }
            if step
                .retry
                .as_ref()
                .is_some_and(|retry| retry.on.as_ref().is_some_and(|kinds| kinds.is_empty()))
            {
                return Err(invalid(
                    &format!("{path}.retry.on"),
                    "names at least one kind of failure (leave it out for every kind)",
                ));
            }
            if let Some(retry) = &step.retry
                && (retry.attempts == 0
                    || retry.attempts > 20
                    || !(0.0..=3600.0).contains(&retry.backoff_secs))
            {
                return Err(invalid(
                    &format!("{path}.retry"),
                    "attempts are 1 to 20, backoff_secs 0 to 3600",
                ));
            }
            if step
                .timeout_secs
                .is_some_and(|secs| secs == 0 || secs > MAX_WAIT_SECS)
            {
                return Err(invalid(
                    &format!("{path}.timeout_secs"),
                    format!("is 1 to {MAX_WAIT_SECS}"),
                ));
            }
        }
        for (index, step) in self.steps.iter().enumerate() {
            for (n, need) in self.needs_of(index).iter().enumerate() {
                if !ids.contains_key(need.as_str()) {
                    return Err(invalid(
                        &format!("steps[{index}].needs[{n}]"),
                        format!("no step is called {need:?}"),
                    ));
                }
                if need == &step.id {
                    return Err(invalid(
                        &format!("steps[{index}].needs[{n}]"),
                        "a step cannot need itself",
                    ));
                }
            }
        }
        self.check_switches(&ids)?;
        self.check_failure_handlers(&ids)?;
        if let Some(cycle) = self.cycle() {
            return Err(invalid(
                "steps",
                format!(
                    "the steps depend on each other in a cycle: {}",
                    cycle.join(" → ")
                ),
            ));
        }
        if let Some(output) = &self.output {
            check_templates(&env, output, "output")?;
        }
        Ok(())
    }

    /// Each `switch` names steps that exist, each once, each needing the switch.
    fn check_switches(&self, ids: &BTreeMap<&str, usize>) -> Result<(), AppError> {
        for (index, step) in self.steps.iter().enumerate() {
            let Ok(StepKind::Switch { cases, default }) = step.step_kind(index) else {
                continue;
            };
            let named = cases
                .iter()
                .enumerate()
                .map(|(n, case)| (format!("steps[{index}].cases[{n}].then"), &case.then))
                .chain(
                    default
                        .iter()
                        .map(|target| (format!("steps[{index}].default"), target)),
                );
            let mut seen = BTreeSet::new();
            for (path, target) in named {
                let Some(&at) = ids.get(target.as_str()) else {
                    return Err(invalid(&path, format!("no step is called {target:?}")));
                };
                if !seen.insert(target.as_str()) {
                    return Err(invalid(&path, format!("{target:?} is named twice")));
                }
                if !self.needs_of(at).contains(&step.id) {
                    return Err(invalid(
                        &path,
                        format!(
                            "the step {target:?} must need the switch {:?} (`needs`)",
                            step.id
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Each `on_failure` names another step that needs the failing one, and no step handles
    /// two.
    fn check_failure_handlers(&self, ids: &BTreeMap<&str, usize>) -> Result<(), AppError> {
        let mut handled_by = BTreeMap::new();
        for (index, step) in self.steps.iter().enumerate() {
            let Some(handler) = &step.on_failure else {
                continue;
            };
            let path = format!("steps[{index}].on_failure");
            let Some(&at) = ids.get(handler.as_str()) else {
                return Err(invalid(&path, format!("no step is called {handler:?}")));
            };
            if at == index {
                return Err(invalid(&path, "a step cannot handle its own failure"));
            }
            if !self.needs_of(at).contains(&step.id) {
                return Err(invalid(
                    &path,
                    format!(
                        "the step {handler:?} must need {:?} (`needs`) to handle its failure",
                        step.id
                    ),
                ));
            }
            if let Some(other) = handled_by.insert(handler.as_str(), step.id.as_str()) {
                return Err(invalid(
                    &path,
                    format!("{handler:?} already handles the failure of {other:?}"),
                ));
            }
        }
        Ok(())
    }

    /// Who handles whose failure (the steps' `on_failure`), looked up both ways.
    pub fn failure_handlers(&self) -> FailureHandlers {
        let handler_of: BTreeMap<String, String> = self
            .steps
            .iter()
            .filter_map(|step| Some((step.id.clone(), step.on_failure.clone()?)))
            .collect();
        let handles = handler_of
            .iter()
            .map(|(failing, handler)| (handler.clone(), failing.clone()))
            .collect();
        FailureHandlers {
            handler_of,
            handles,
        }
    }

    /// The ids a step waits for.
    pub fn needs_of(&self, index: usize) -> Vec<String> {
        match &self.steps[index].needs {
            Some(needs) => needs.clone(),
            None if index == 0 => Vec::new(),
            None => vec![self.steps[index - 1].id.clone()],
        }
    }

    /// A dependency cycle, if there is one (ids in order).
    fn cycle(&self) -> Option<Vec<String>> {
        let index: BTreeMap<&str, usize> = self
            .steps
            .iter()
            .enumerate()
            .map(|(i, step)| (step.id.as_str(), i))
            .collect();
        // 0: unvisited, 1: on the path, 2: done.
        let mut marks = vec![0u8; self.steps.len()];
        let mut path = Vec::new();
        fn visit(
            definition: &WorkflowDefinition,
            index: &BTreeMap<&str, usize>,
            at: usize,
            marks: &mut [u8],
            path: &mut Vec<usize>,
        ) -> Option<Vec<String>> {
            marks[at] = 1;
            path.push(at);
            for need in definition.needs_of(at) {
                let Some(&next) = index.get(need.as_str()) else {
                    continue;
                };
                if marks[next] == 1 {
                    let start = path.iter().position(|&i| i == next).unwrap_or(0);
                    let mut cycle: Vec<String> = path[start..]
                        .iter()
                        .map(|&i| definition.steps[i].id.clone())
                        .collect();
                    cycle.push(definition.steps[next].id.clone());
                    return Some(cycle);
                }
                if marks[next] == 0
                    && let Some(cycle) = visit(definition, index, next, marks, path)
                {
                    return Some(cycle);
                }
            }
            path.pop();
            marks[at] = 2;
            None
        }
        (0..self.steps.len()).find_map(|at| {
            if marks[at] == 0 {
                visit(self, &index, at, &mut marks, &mut path)
            } else {
                None
            }
        })
    }

    /// The steps no other step needs (the workflow's ends).
    pub fn ends(&self) -> BTreeSet<String> {
        let needed: BTreeSet<String> = (0..self.steps.len())
            .flat_map(|i| self.needs_of(i))
            .collect();
        self.steps
            .iter()
            .filter(|step| !needed.contains(&step.id))
            .map(|step| step.id.clone())
            .collect()
    }
}

/// The steps' failure handlers (`on_failure`) of a definition, by failing step and by handler
/// (a handler handles one step: the check says so).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FailureHandlers {
    handler_of: BTreeMap<String, String>,
    handles: BTreeMap<String, String>,
}

impl FailureHandlers {
    /// The step that handles `id`'s failure, if any.
    pub fn handler_of(&self, id: &str) -> Option<&str> {
        self.handler_of.get(id).map(String::as_str)
    }

    /// The step whose failure `id` handles, if any.
    pub fn handled_by(&self, id: &str) -> Option<&str> {
        self.handles.get(id).map(String::as_str)
    }
}

/// What exists, for a definition's check.
struct Known<'a> {
    tool: &'a dyn Fn(&str) -> bool,
    agent: &'a dyn Fn(&str) -> bool,
    workflow: &'a dyn Fn(&str) -> bool,
    /// The workflow being checked (it may run itself, to a depth limit).
    this: &'a str,
}

fn check_kind(
    env: &Expressions,
    kind: &StepKind,
    path: &str,
    known: &Known<'_>,
) -> Result<(), AppError> {
    match kind {
        StepKind::Tool(tool) => {
            if !(known.tool)(&tool.tool) {
                return Err(invalid(
                    &format!("{path}.tool"),
                    format!("no tool is called {:?}", tool.tool),
                ));
            }
            if !tool.arguments.is_object() && !tool.arguments.is_string() {
                return Err(invalid(
                    &format!("{path}.arguments"),
                    "arguments are an object (or one template giving one)",
                ));
            }
            check_templates(env, &tool.arguments, &format!("{path}.arguments"))
        }
        StepKind::Agent(agent) => {
            if !(known.agent)(&agent.agent) {
                return Err(invalid(
                    &format!("{path}.agent"),
                    format!("no agent is called {:?}", agent.agent),
                ));
            }
            if agent.repair_attempts > MAX_REPAIRS {
                return Err(invalid(
                    &format!("{path}.repair_attempts"),
                    format!("at most {MAX_REPAIRS}"),
                ));
            }
            if let Some(schema) = &agent.output_schema {
                jsonschema::validator_for(schema).map_err(|error| {
                    invalid(
                        &format!("{path}.output_schema"),
                        format!("not a valid JSON Schema: {error}"),
                    )
                })?;
            }
            check_templates(
                env,
                &Value::String(agent.prompt.clone()),
                &format!("{path}.prompt"),
            )
        }
        StepKind::Map { items, step, .. } => {
            env.check_expression(items).map_err(|error| {
                invalid(
                    &format!("{path}.items"),
                    format!("the expression does not parse: {error}"),
                )
            })?;
            check_kind(env, step, &format!("{path}.step"), known)
        }
        StepKind::Loop { until, step, .. } => {
            env.check_expression(until).map_err(|error| {
                invalid(
                    &format!("{path}.until"),
                    format!("the expression does not parse: {error}"),
                )
            })?;
            check_kind(env, step, &format!("{path}.step"), known)
        }
        StepKind::Workflow { workflow, input } => {
            if workflow != known.this && !(known.workflow)(workflow) {
                return Err(invalid(
                    &format!("{path}.workflow"),
                    format!("no workflow is called {workflow:?}"),
                ));
            }
            check_templates(env, input, &format!("{path}.input"))
        }
        StepKind::Approval { message, .. } => check_templates(
            env,
            &Value::String(message.clone()),
            &format!("{path}.message"),
        ),
        StepKind::Parallel { branches, .. } => branches.iter().try_for_each(|(name, branch)| {
            check_kind(env, branch, &format!("{path}.branches.{name}"), known)
        }),
        StepKind::Switch { cases, .. } => cases.iter().enumerate().try_for_each(|(n, case)| {
            env.check_expression(&case.when).map_err(|error| {
                invalid(
                    &format!("{path}.cases[{n}].when"),
                    format!("the expression does not parse: {error}"),
                )
            })
        }),
        StepKind::Wait { .. } | StepKind::Signal { .. } => Ok(()),
    }
}
