// The workflow editor (`#/workflows/new`, `#/workflows/edit/{id}`): a form for the common
// fields (id, description, and each step's id, kind and main field) over the same definition
// as a JSON or YAML text editor, which is checked as you type — syntax first, then the
// server's JSON Schema (`GET /v1/workflow-schema`, validated by the vendored
// @cfworker/json-schema, which needs no eval under the CSP) — with each problem shown by its
// path. Saved with `POST /v1/workflows` (new) or `PUT /v1/workflows/{id}` (a new version); what
// the server refuses beyond the schema (unknown agents, cycles, bad templates) is shown too.
// Loaded on first open: the vendored validator and YAML parser weigh 120 KB.

import { get, post, put } from "./api.js";
import { h, clear, toast, errorText } from "./dom.js";
import { Validator } from "../vendor/json-schema/json-schema.mjs";
import { parse as parseYaml, stringify as toYaml } from "../vendor/yaml/yaml.mjs";

/** The step kinds the form edits, each with its main fields and their defaults. */
const FORM_KINDS = {
  agent: { agent: "", prompt: "" },
  tool: { tool: "" },
  workflow: { workflow: "" },
  approval: { message: "" },
  wait: { seconds: 0 },
  signal: { name: "" },
};
/** Kinds the form shows but leaves to the text editor (their fields nest steps). */
const TEXT_KINDS = ["map", "loop", "parallel", "switch"];
/** The fields every step kind may have (kept when the form changes a step's kind). */
const COMMON = ["id", "needs", "when", "on_failure", "retry", "timeout_secs"];

let schemaPromise = null;
/** The server's workflow schema as a validator (fetched once per page). */
function validator() {
  if (!schemaPromise) {
    schemaPromise = get("/v1/workflow-schema").then((schema) => new Validator(schema, "2020-12", false));
    schemaPromise.catch(() => { schemaPromise = null; });
  }
  return schemaPromise;
}

/** The value at a JSON pointer such as `#/steps/0` in `doc` (undefined when absent). */
function at(doc, location) {
  let value = doc;
  for (const raw of location.replace(/^#\/?/, "").split("/").filter(Boolean)) {
    let key = raw.replace(/~1/g, "/").replace(/~0/g, "~");
    try { key = decodeURIComponent(key); } catch { /* as it is */ }
    if (value === null || typeof value !== "object") return undefined;
    value = value[key];
  }
  return value;
}

const pathOf = (location) => location.replace(/^#/, "") || "/";

/**
 * What the validator's output means to a person: one problem per leaf, by path. A `oneOf` over
 * step kinds reports every alternative; only the alternative the step's `kind` names is kept
 * (or, for an unknown kind, one problem listing the kinds). "Unevaluated" properties reported
 * only because a sibling check failed are dropped.
 */
export function schemaProblems(errors, doc) {
  // Boolean-schema errors repeat their parent's (unevaluated/additional properties).
  let kept = errors.filter((error) => error.keyword !== "false");
  const extra = [];
  const byDepth = kept.filter((error) => error.keyword === "oneOf")
    .sort((a, b) => a.keywordLocation.length - b.keywordLocation.length);
  for (const oneOf of byDepth) {
    if (!kept.includes(oneOf)) continue;
    const prefix = `${oneOf.keywordLocation}/`;
    const branches = new Map();
    for (const error of kept) {
      if (!error.keywordLocation.startsWith(prefix)) continue;
      const index = error.keywordLocation.slice(prefix.length).split("/")[0];
      if (!branches.has(index)) branches.set(index, []);
      branches.get(index).push(error);
    }
    const value = at(doc, oneOf.instanceLocation);
    const kindAt = `${oneOf.instanceLocation}/kind`;
    const kindMiss = (error) => error.keyword === "const" && error.instanceLocation === kindAt;
    const inBranch = new Set([...branches.values()].flat());
    if (value && typeof value === "object" && typeof value.kind === "string") {
      const matching = [...branches.values()].filter((list) => !list.some(kindMiss));
      if (matching.length) {
        const keep = new Set(matching.flat());
        kept = kept.filter((error) => !inBranch.has(error) || keep.has(error));
        kept = kept.filter((error) => error !== oneOf);
      } else {
        const kinds = [...inBranch].filter(kindMiss).map((error) => /"(.*)"/.exec(error.error)?.[1]).filter(Boolean);
        kept = kept.filter((error) => !inBranch.has(error) && error !== oneOf);
        extra.push({ path: pathOf(kindAt), message: `unknown kind "${value.kind}": one of ${[...new Set(kinds)].join(", ")}` });
      }
    } else {
      kept = kept.filter((error) => !inBranch.has(error) && error !== oneOf);
      const told = kept.some((error) => error.keyword === "required" && error.instanceLocation === oneOf.instanceLocation && error.error.includes('"kind"'));
      if (!told) extra.push({ path: pathOf(oneOf.instanceLocation), message: 'needs a "kind"' });
    }
  }
  // A property is "unevaluated" only because its sibling checks failed: not a problem of its own.
  kept = kept.filter((error) => {
    if (error.keyword !== "unevaluatedProperties") return true;
    const base = error.keywordLocation.replace(/\/unevaluatedProperties$/, "/");
    return !kept.some((other) => other !== error && other.keyword !== "unevaluatedProperties" && other.keywordLocation.startsWith(base));
  });
  // Leaves only: an error another one explains (properties, items, $ref, allOf) says nothing more.
  const leaves = kept.filter((error) => !kept.some((other) => other !== error && other.keywordLocation.startsWith(`${error.keywordLocation}/`)));
  const problems = [...leaves.map((error) => {
    const unknown = /^Property "(.*)" does not match (?:unevaluated|additional) properties schema/.exec(error.error);
    if (unknown) return { path: pathOf(`${error.instanceLocation}/${unknown[1]}`), message: `unknown property "${unknown[1]}"` };
    const missing = /^Instance does not have required property "(.*)"/.exec(error.error);
    if (missing) return { path: pathOf(error.instanceLocation), message: `"${missing[1]}" is required` };
    return { path: pathOf(error.instanceLocation), message: error.error.replace(/^Instance /, "") };
  }), ...extra];
  // A wrapper whose own problems were dropped above ("a subschema had errors") says nothing
  // that the problems under its path do not.
  const WRAPPERS = ["$ref", "allOf", "properties", "items"];
  const under = (problem, base) => problem.path === base || problem.path.startsWith(base === "/" ? "/" : `${base}/`);
  const told = problems.filter((problem, index) => {
    const error = leaves[index];
    if (!error || !WRAPPERS.includes(error.keyword)) return true;
    return !problems.some((other) => other !== problem && under(other, problem.path));
  });
  const seen = new Set();
  return told.filter((problem) => {
    const key = `${problem.path} ${problem.message}`;
    if (seen.has(key)) return false;
    seen.add(key);
    return true;
  });
}

/** The definition as text in `format` ("json" or "yaml"). */
function serialize(doc, format) {
  return format === "yaml" ? toYaml(doc) : `${JSON.stringify(doc, null, 2)}\n`;
}

/** Parses `text` in `format`; throws with the position of the first syntax error. */
function parseText(text, format) {
  if (format === "yaml") return parseYaml(text);
  return JSON.parse(text);
}

export class WorkflowEditor {
  /** `id`: the workflow to edit, or null for a new one. */
  constructor(root, id) {
    this.root = root;
    this.id = id;
    this.validator = null;
    this.format = localStorage.getItem("agentry.workflow-format") === "yaml" ? "yaml" : "json";
    this.load();
  }

  async load() {
    clear(this.root).append(h("a", { href: "#/workflows" }, "← Workflows"), h("p", { class: "muted" }, "Loading…"));
    let doc;
    let agents = [];
    let tools = [];
    try {
      const [definition, agentList, toolList, checker] = await Promise.all([
        this.id ? get(`/v1/workflows/${encodeURIComponent(this.id)}`) : null,
        get("/v1/agents").catch(() => ({ agents: [] })),
        get("/v1/tools").catch(() => ({ tools: [] })),
        validator().catch(() => null),
      ]);
      // Without the schema (an older server) the text is still checked as JSON or YAML.
      this.validator = checker;
      agents = (agentList.agents || []).map((agent) => agent.id);
      tools = (toolList.tools || []).map((tool) => tool.name);
      doc = definition || { id: "", description: "", steps: [{ id: "step1", kind: "agent", agent: agents[0] || "", prompt: "" }] };
    } catch (error) {
      this.root.append(h("div", { class: "form-error", role: "alert" }, errorText(error)));
      return;
    }
    // The server sets the version; the editor does not show it.
    delete doc.version;
    this.doc = doc;
    this.build(agents, tools);
  }

  build(agents, tools) {
    this.fields = h("div", { class: "workflow-fields" });
    this.stepsEl = h("div", { class: "workflow-step-forms", testid: "step-forms" });
    this.text = h("textarea", { class: "definition-text", testid: "definition-editor", rows: 22, spellcheck: "false",
      "aria-label": "The workflow definition", oninput: () => this.textChanged() });
    this.formatPicker = h("select", { testid: "editor-format", "aria-label": "Format", onchange: () => this.formatChanged() },
      h("option", { value: "json" }, "JSON"), h("option", { value: "yaml" }, "YAML"));
    this.formatPicker.value = this.format;
    this.status = h("div", { class: "editor-status", testid: "editor-status", role: "status" });
    this.problems = h("ul", { class: "schema-problems", testid: "schema-errors" });
    this.saveError = h("div", { class: "form-error", testid: "save-error", role: "alert" });
    this.saveButton = h("button", { class: "primary", testid: "save-workflow", onclick: () => this.save() }, this.id ? "Save a new version" : "Create");
    this.lists = [
      h("datalist", { id: "workflow-agents" }, agents.map((agent) => h("option", { value: agent }))),
      h("datalist", { id: "workflow-tools" }, tools.map((tool) => h("option", { value: tool }))),
    ];
    clear(this.root).append(
      h("a", { href: "#/workflows" }, "← Workflows"),
      h("div", { class: "page-head" }, h("h2", {}, this.id ? `Edit workflow ${this.id}` : "New workflow")),
      h("div", { class: "workflow-editor", testid: "workflow-editor" },
        h("div", { class: "card" }, h("h3", {}, "Common fields"), this.fields, this.stepsEl,
          h("button", { type: "button", testid: "add-step", onclick: () => this.addStep() }, "Add a step"), this.lists),
        h("div", { class: "card" },
          h("div", { class: "editor-head" }, h("h3", {}, "Definition"), this.formatPicker,
            h("span", { class: "muted" }, "checked against the server's schema as you type")),
          this.text, this.status, this.problems)),
      h("div", { class: "form-actions" }, this.saveButton, h("a", { href: "#/workflows" }, "Cancel"), this.saveError));
    this.renderForm();
    this.text.value = serialize(this.doc, this.format);
    this.check();
  }

  /** The form from `this.doc` (again after the text changed it). */
  renderForm() {
    const doc = this.doc && typeof this.doc === "object" && !Array.isArray(this.doc) ? this.doc : {};
    const setTop = (key) => (event) => {
      const value = event.target.value;
      if (value === "" && key !== "id") delete this.doc[key]; else this.doc[key] = value;
      this.formChanged();
    };
    clear(this.fields).append(h("div", { class: "grid" },
      h("label", {}, "Id", h("input", { testid: "workflow-id", value: doc.id ?? "", readOnly: Boolean(this.id), required: true,
        placeholder: "publish", dataset: { path: "/id" }, oninput: setTop("id") })),
      h("label", {}, "Description", h("input", { testid: "workflow-description", value: doc.description ?? "",
        dataset: { path: "/description" }, oninput: setTop("description") }))));
    const steps = Array.isArray(doc.steps) ? doc.steps : [];
    clear(this.stepsEl).append(...steps.map((step, index) => this.stepForm(step, index)));
  }

  stepForm(step, index) {
    if (!step || typeof step !== "object") return h("div", { class: "workflow-step" }, `Step ${index + 1} is not an object: edit it in the text.`);
    const path = `/steps/${index}`;
    const set = (key, number = false) => (event) => {
      const value = event.target.value;
      if (number) step[key] = value === "" ? undefined : Number(value);
      else step[key] = value;
      if (step[key] === undefined) delete step[key];
      this.formChanged();
    };
    const input = (key, label, props = {}) => h("label", {}, label,
      h("input", { value: step[key] ?? "", dataset: { path: `${path}/${key}`, field: key }, oninput: set(key, props.type === "number"), ...props }));
    const kinds = [...Object.keys(FORM_KINDS), ...TEXT_KINDS];
    const kind = h("select", { dataset: { path: `${path}/kind`, field: "kind" }, "aria-label": "Kind", onchange: () => this.changeKind(index, kind.value) },
      kinds.map((name) => h("option", { value: name }, name)));
    if (!kinds.includes(step.kind)) kind.prepend(h("option", { value: step.kind ?? "" }, String(step.kind ?? "(none)")));
    kind.value = step.kind ?? "";
    const main = [];
    if (step.kind === "agent") {
      main.push(input("agent", "Agent", { list: "workflow-agents" }));
      main.push(h("label", { class: "wide" }, "Prompt", h("textarea", { rows: 2, dataset: { path: `${path}/prompt`, field: "prompt" }, oninput: set("prompt") }, step.prompt ?? "")));
    } else if (step.kind === "tool") main.push(input("tool", "Tool", { list: "workflow-tools" }));
    else if (step.kind === "workflow") main.push(input("workflow", "Workflow"));
    else if (step.kind === "approval") main.push(h("label", { class: "wide" }, "Message", h("textarea", { rows: 2, dataset: { path: `${path}/message`, field: "message" }, oninput: set("message") }, step.message ?? "")));
    else if (step.kind === "wait") main.push(input("seconds", "Seconds", { type: "number", min: 0 }));
    else if (step.kind === "signal") main.push(input("name", "Signal name"));
    else main.push(h("p", { class: "muted wide" }, "This kind's fields are edited in the definition below."));
    return h("div", { class: "workflow-step", testid: "step-form", dataset: { index: String(index) } },
      h("div", { class: "grid" }, input("id", "Step id"), h("label", {}, "Kind", kind), ...main,
        h("div", { class: "form-actions" }, h("button", { type: "button", class: "danger", testid: "remove-step", onclick: () => this.removeStep(index) }, "Remove step"))));
  }

  addStep() {
    if (!Array.isArray(this.doc.steps)) this.doc.steps = [];
    const ids = new Set(this.doc.steps.map((step) => step && step.id));
    let n = this.doc.steps.length + 1;
    while (ids.has(`step${n}`)) n += 1;
    this.doc.steps.push({ id: `step${n}`, kind: "wait", seconds: 0 });
    this.renderForm();
    this.formChanged();
  }

  removeStep(index) {
    this.doc.steps.splice(index, 1);
    this.renderForm();
    this.formChanged();
  }

  /** A step's new kind: its common fields stay, the old kind's fields go, the new kind's come. */
  changeKind(index, kind) {
    const old = this.doc.steps[index] || {};
    const step = {};
    for (const key of COMMON) if (old[key] !== undefined) step[key] = old[key];
    step.kind = kind;
    Object.assign(step, structuredClone(FORM_KINDS[kind] || {}));
    this.doc.steps[index] = step;
    this.renderForm();
    this.formChanged();
    this.stepsEl.querySelector(`[data-index="${index}"] select[data-field=kind]`)?.focus();
  }

  formChanged() {
    this.text.value = serialize(this.doc, this.format);
    this.check();
  }

  textChanged() {
    const parsed = this.check();
    if (parsed !== undefined) {
      this.doc = parsed;
      this.renderForm();
      this.mark();
    }
  }

  formatChanged() {
    const next = this.formatPicker.value;
    let doc;
    try {
      doc = parseText(this.text.value, this.format);
    } catch {
      this.formatPicker.value = this.format;
      toast(`Mend the ${this.format.toUpperCase()} first: it cannot be converted while it does not parse.`, "error");
      return;
    }
    this.format = next;
    localStorage.setItem("agentry.workflow-format", next);
    this.doc = doc;
    this.text.value = serialize(doc, next);
    this.check();
  }

  /**
   * Checks the text: its syntax, then the schema. Shows the problems; answers the parsed
   * definition when it is an object (valid or not), else undefined.
   */
  check() {
    const problems = [];
    let parsed;
    try {
      parsed = parseText(this.text.value, this.format);
    } catch (error) {
      problems.push({ path: "", message: `${this.format === "yaml" ? "YAML" : "JSON"}: ${String(error.message).split("\n")[0]}`, syntax: true });
    }
    if (!problems.length && (parsed === null || typeof parsed !== "object" || Array.isArray(parsed))) {
      problems.push({ path: "/", message: "the definition must be an object" });
      parsed = undefined;
    }
    if (!problems.length && this.validator) problems.push(...schemaProblems(this.validator.validate(parsed).errors, parsed));
    this.problemList = problems;
    clear(this.problems).append(...problems.map((problem) => h("li", { testid: "schema-error", dataset: { path: problem.path } },
      problem.path ? h("code", { class: "path" }, problem.path) : null, " ", problem.message)));
    this.status.dataset.valid = String(!problems.length);
    this.status.textContent = problems.length
      ? `${problems.length} problem${problems.length > 1 ? "s" : ""}`
      : this.validator ? "Matches the workflow schema." : "Parses (the schema could not be loaded, so it was not checked).";
    this.text.setAttribute("aria-invalid", String(Boolean(problems.length)));
    this.saveButton.disabled = Boolean(problems.length);
    this.mark();
    return parsed;
  }

  /** Marks the form's fields that a problem names. */
  mark() {
    const byPath = new Map((this.problemList || []).map((problem) => [problem.path, problem.message]));
    for (const input of this.root.querySelectorAll(".workflow-fields [data-path], .workflow-step-forms [data-path]")) {
      const message = byPath.get(input.dataset.path);
      if (message) { input.setAttribute("aria-invalid", "true"); input.title = message; } else { input.removeAttribute("aria-invalid"); input.removeAttribute("title"); }
    }
  }

  async save() {
    this.saveError.textContent = "";
    const definition = this.check();
    if (definition === undefined || this.problemList.length) return;
    this.saveButton.disabled = true;
    try {
      const saved = this.id
        ? await put(`/v1/workflows/${encodeURIComponent(this.id)}`, definition)
        : await post("/v1/workflows", definition);
      toast(`Workflow ${saved.id} saved (version ${saved.version}).`);
      location.hash = "#/workflows";
    } catch (error) {
      this.saveError.textContent = `The server refused it: ${errorText(error)}`;
      this.saveButton.disabled = false;
    }
  }
}
