// The Workflows page: the saved workflows, each with a start form made from its input schema
// and an Edit (the editor of workflow-editor.js, also behind New workflow), and their runs; a
// run's page draws the graph (a mermaid flowchart, steps coloured by state) (a click on a
// step's node opens its agent session, or its card) and lists every step — state, attempts,
// time, output, error, the sessions its agents ran in — live from the run's event stream, with
// approvals and signals answered inline, cancel and retry.

import { get, post, stream } from "./api.js";
import { h, clear, toast, errorText, json, time } from "./dom.js";
import { typeset } from "./rich.js";

const STATE_STYLES = {
  pending: "fill:#f2f4f7,stroke:#98a2b3,color:#344054",
  running: "fill:#d1e9ff,stroke:#2e90fa,color:#1849a9",
  waiting: "fill:#fef0c7,stroke:#f79009,color:#93370d",
  succeeded: "fill:#d1fadf,stroke:#12b76a,color:#05603a",
  failed: "fill:#fee4e2,stroke:#f04438,color:#912018",
  skipped: "fill:#f9fafb,stroke:#d0d5dd,color:#98a2b3",
  cancelled: "fill:#f2f4f7,stroke:#667085,color:#667085",
};

/** The steps each step waits for (the one before unless it names its `needs`). */
function needsOf(definition, index) {
  const step = definition.steps[index];
  if (Array.isArray(step.needs)) return step.needs;
  return index === 0 ? [] : [definition.steps[index - 1].id];
}

/** The way a switch step takes to `target`: "case N" or "default" (null when it names none). */
function wayTo(step, target) {
  if (!step || step.kind !== "switch") return null;
  const index = (step.cases || []).findIndex((item) => item.then === target);
  if (index >= 0) return `case ${index}`;
  return step.default === target ? "default" : null;
}

/**
 * A mermaid flowchart of the run: one node per step (a switch as a diamond), edges from needs
 * (a switch's labelled with its case), classes by state.
 */
export function flowchart(definition, steps) {
  const node = new Map(definition.steps.map((step, i) => [step.id, `n${i}`]));
  const byId = new Map(definition.steps.map((step) => [step.id, step]));
  const label = (text) => text.replace(/["#]/g, (c) => (c === '"' ? "#quot;" : "#35;"));
  const lines = ["flowchart TD"];
  definition.steps.forEach((step, i) => {
    const state = steps[step.id]?.state || "pending";
    const text = label(`${step.id} · ${step.kind}`);
    lines.push(`  ${node.get(step.id)}${step.kind === "switch" ? `{"${text}"}` : `["${text}"]`}:::${state}`);
    for (const need of needsOf(definition, i)) {
      if (!node.has(need)) continue;
      const way = wayTo(byId.get(need), step.id);
      lines.push(`  ${node.get(need)} -->${way ? `|"${way}"|` : ""} ${node.get(step.id)}`);
    }
  });
  for (const [state, style] of Object.entries(STATE_STYLES)) lines.push(`  classDef ${state} ${style}`);
  return lines.join("\n");
}

/** Form fields for an input schema's properties (strings, numbers, booleans; the rest as JSON). */
function inputFields(schema) {
  const properties = (schema && schema.properties) || {};
  const required = new Set((schema && schema.required) || []);
  const names = Object.keys(properties);
  if (!names.length) return [h("label", { class: "wide" }, "Input (JSON)", h("textarea", { name: "__json", rows: 3, placeholder: "{}" }))];
  return names.map((name) => {
    const spec = properties[name] || {};
    const label = `${name}${required.has(name) ? " *" : ""}${spec.description ? ` — ${spec.description}` : ""}`;
    if (spec.type === "boolean") return h("label", {}, label, h("input", { name, type: "checkbox", dataset: { type: "boolean" } }));
    if (spec.type === "number" || spec.type === "integer") return h("label", {}, label, h("input", { name, type: "number", dataset: { type: "number" }, required: required.has(name) }));
    if (spec.type === "string" || !spec.type) return h("label", {}, label, h("input", { name, dataset: { type: "string" }, required: required.has(name) }));
    return h("label", { class: "wide" }, `${label} (JSON)`, h("textarea", { name, rows: 2, dataset: { type: "json" }, required: required.has(name) }));
  });
}

function readInput(form) {
  const raw = form.querySelector("[name=__json]");
  if (raw) return raw.value.trim() ? JSON.parse(raw.value) : {};
  const input = {};
  for (const field of form.querySelectorAll("[name]")) {
    const type = field.dataset.type;
    if (type === "boolean") input[field.name] = field.checked;
    else if (!field.value.trim()) continue;
    else if (type === "number") input[field.name] = Number(field.value);
    else if (type === "json") input[field.name] = JSON.parse(field.value);
    else input[field.name] = field.value;
  }
  return input;
}

const badge = (state) => h("span", { class: `badge state-${state === "waiting" ? "waiting" : state}`, testid: "state" }, state);
const duration = (step) => (step.started_at && step.finished_at ? `${((step.finished_at - step.started_at) / 1000).toFixed(1)} s` : "");

export class WorkflowsView {
  constructor(root, arg) {
    this.root = h("div", { class: "page workflows", testid: "workflows" });
    root.append(this.root);
    this.controller = null;
    const [what, id] = (arg || "").split("/");
    if (what === "run" && id) this.showRun(id);
    else if (what === "new" || (what === "edit" && id)) this.showEditor(what === "edit" ? decodeURIComponent(id) : null);
    else this.showList();
  }

  close() {
    if (this.controller) this.controller.abort();
  }

  /** The editor (a new workflow, or the next version of `id`), loaded on first use. */
  async showEditor(id) {
    try {
      const { WorkflowEditor } = await import("./workflow-editor.js");
      this.editor = new WorkflowEditor(this.root, id);
    } catch (error) {
      clear(this.root).append(h("div", { class: "form-error", role: "alert" }, errorText(error)));
    }
  }

  async showList() {
    clear(this.root).append(h("div", { class: "page-head" }, h("h2", {}, "Workflows"),
      h("a", { class: "button primary", href: "#/workflows/new", testid: "new-workflow" }, "New workflow")));
    let workflows;
    let runs;
    try {
      [{ workflows }, { runs }] = await Promise.all([get("/v1/workflows"), get("/v1/workflow-runs")]);
    } catch (error) {
      this.root.append(h("div", { class: "form-error", role: "alert" }, errorText(error)));
      return;
    }
    this.root.append(h("div", { class: "card" }, workflows.length ? workflows.map((workflow) => {
      const error = h("div", { class: "form-error", testid: "form-error", role: "alert" });
      const form = h("form", { class: "grid hidden", testid: "start-form", onsubmit: async (event) => {
        event.preventDefault();
        error.textContent = "";
        try {
          const run = await post(`/v1/workflows/${encodeURIComponent(workflow.id)}/runs`, { input: readInput(form) });
          location.hash = `#/workflows/run/${run.run_id}`;
        } catch (err) {
          error.textContent = err instanceof SyntaxError ? `The input is not JSON: ${err.message}` : errorText(err);
        }
      } }, inputFields(workflow.input_schema), h("div", { class: "form-actions" }, h("button", { class: "primary", type: "submit", testid: "start" }, "Start"), error));
      return h("div", { class: "workflow", testid: "workflow", dataset: { id: workflow.id } },
        h("div", { class: "row" },
          h("span", { class: "id" }, workflow.id),
          h("span", { class: "meta" }, `v${workflow.version} · ${workflow.steps.length} steps${workflow.description ? ` · ${workflow.description}` : ""}`),
          h("button", { testid: "open-start", onclick: () => form.classList.toggle("hidden") }, "Run…"),
          h("a", { class: "button", testid: "edit-workflow", href: `#/workflows/edit/${encodeURIComponent(workflow.id)}` }, "Edit")),
        form);
    }) : h("p", { class: "muted" }, "No workflow yet: New workflow, POST /v1/workflows, or `agentry workflows add FILE`.")));
    this.root.append(h("h3", {}, "Runs"), h("div", { class: "card" }, runs.length ? h("table", { class: "runs-table" },
      h("thead", {}, h("tr", {}, ["Run", "Workflow", "State", "Started"].map((title) => h("th", {}, title)))),
      h("tbody", {}, runs.map((run) => h("tr", { testid: "workflow-run", dataset: { id: run.run_id } },
        h("td", {}, h("a", { href: `#/workflows/run/${run.run_id}` }, run.run_id.slice(0, 8))),
        h("td", {}, `${run.workflow_id} v${run.version}`),
        h("td", {}, badge(run.state)),
        h("td", {}, time(run.created_at)))))) : h("p", { class: "muted" }, "No run yet.")));
  }

  /** A run's page, kept live from its event stream. */
  async showRun(id) {
    this.graph = h("div", { class: "workflow-graph", testid: "workflow-graph", onclick: (event) => this.openNode(event) });
    this.steps = h("div", { class: "workflow-steps" });
    this.head = h("div", { class: "workflow-head" });
    clear(this.root).append(h("a", { href: "#/workflows" }, "← Workflows"), this.head, this.graph, this.steps);
    this.controller = new AbortController();
    const signal = this.controller.signal;
    try {
      // The whole run first, then each change: a step's new state, or the run's own.
      await stream("GET", `/v1/workflow-runs/${encodeURIComponent(id)}/stream`, undefined, (name, data) => {
        if (name === "run" && data.definition) this.renderRun(data);
        else if (name === "run" && this.run) {
          const { state, output, error, finished_at } = data;
          this.renderRun({ ...this.run, state, output, error, finished_at });
        } else if (name === "step" && this.run) {
          this.renderRun({ ...this.run, steps: { ...this.run.steps, [data.step]: data.run } });
        }
      }, { signal });
    } catch (error) {
      if (!signal.aborted) this.root.append(h("div", { class: "form-error", role: "alert" }, errorText(error)));
    }
  }

  renderRun(run) {
    this.run = run;
    const act = (label, testid, path, danger = false) => h("button", { class: danger ? "danger" : "", testid, onclick: async () => {
      try { await post(`/v1/workflow-runs/${run.run_id}/${path}`); if (path === "retry") this.showRun(run.run_id); } catch (error) { toast(errorText(error), "error"); }
    } }, label);
    clear(this.head).append(...[
      h("h2", {}, `${run.workflow_id} `, h("span", { class: "muted" }, `v${run.version}`), " ", h("span", { testid: "run-state", dataset: { state: run.state } }, badge(run.state))),
      h("div", { class: "actions" },
        run.state === "running" || run.state === "waiting" ? act("Cancel", "cancel-run", "cancel", true) : null,
        run.state === "failed" || run.state === "cancelled" ? act("Retry from the failed steps", "retry-run", "retry") : null),
      run.error ? h("div", { class: "form-error", testid: "run-error" }, run.error) : null,
      run.output !== undefined && run.output !== null ? h("details", { open: true }, h("summary", {}, "Output"), h("pre", { class: "json", testid: "run-output" }, json(run.output))) : null,
    ].filter(Boolean));
    const source = flowchart(run.definition, run.steps);
    if (this.graph.dataset.source !== source) {
      this.graph.dataset.source = source;
      const diagram = h("div", { class: "diagram", dataset: { source } }, h("pre", {}, source));
      clear(this.graph).append(diagram);
      typeset(this.graph);
    }
    clear(this.steps).append(...run.definition.steps.map((definition) => this.renderStep(definition, run.steps[definition.id] || { state: "pending", attempts: 0 })));
  }

  /** A click on a step's node in the graph: its agent session when it has one, else its card. */
  openNode(event) {
    const node = event.target.closest?.("g.node");
    const match = node && /(?:^|-)n(\d+)-\d+$/.exec(node.id || "");
    const definition = match && this.run?.definition.steps[Number(match[1])];
    if (!definition) return;
    const session = (this.run.steps[definition.id]?.sessions || [])[0];
    if (session) {
      location.hash = `#/chat/${session}`;
      return;
    }
    const card = this.steps.querySelector(`[data-testid=workflow-step][data-id="${CSS.escape(definition.id)}"]`);
    if (!card) return;
    card.scrollIntoView({ block: "center" });
    card.classList.add("focused");
    setTimeout(() => card.classList.remove("focused"), 1500);
  }

  renderStep(definition, step) {
    const run = this.run;
    const extra = [];
    if (step.state === "waiting" && definition.kind === "approval") {
      const comment = h("input", { placeholder: "Comment (optional)", testid: "comment", "aria-label": "Comment" });
      const decide = (approved) => async () => {
        try {
          await post(`/v1/workflow-runs/${run.run_id}/approve`, { step: definition.id, approved, comment: comment.value.trim() || undefined });
        } catch (error) { toast(errorText(error), "error"); }
      };
      extra.push(h("div", { class: "approval", testid: "approval" },
        h("p", {}, step.message || ""), comment,
        h("button", { class: "primary", testid: "approve", onclick: decide(true) }, "Approve"),
        h("button", { class: "danger", testid: "reject", onclick: decide(false) }, "Reject")));
    }
    if (step.state === "waiting" && definition.kind === "signal") {
      const payload = h("textarea", { rows: 2, placeholder: "payload (JSON)", testid: "payload", "aria-label": "Payload" });
      extra.push(h("div", { class: "approval" }, payload, h("button", { class: "primary", testid: "send-signal", onclick: async () => {
        try {
          const value = payload.value.trim() ? JSON.parse(payload.value) : null;
          await post(`/v1/workflow-runs/${run.run_id}/signal`, { name: definition.name, payload: value });
        } catch (error) { toast(error instanceof SyntaxError ? "The payload is not JSON." : errorText(error), "error"); }
      } }, `Send ${definition.name}`)));
    }
    if (step.wake_at && step.state === "waiting") extra.push(h("p", { class: "muted" }, `until ${time(step.wake_at)}`));
    return h("div", { class: "workflow-step", testid: "workflow-step", dataset: { id: definition.id, state: step.state } },
      h("div", { class: "row" },
        h("span", { class: "id" }, definition.id),
        h("span", { class: "meta" }, `${definition.kind}${step.attempts > 1 ? ` · attempt ${step.attempts}` : ""}${duration(step) ? ` · ${duration(step)}` : ""}`),
        badge(step.state)),
      step.error ? h("div", { class: "form-error", testid: "step-error", dataset: { kind: step.error_kind || "" } }, step.error_kind ? `${step.error_kind.replace("_", " ")}: ${step.error}` : step.error) : null,
      (step.sessions || []).length ? h("div", { class: "meta" }, "sessions: ", step.sessions.map((session) => h("a", { href: `#/chat/${session}`, testid: "step-session" }, `${session.slice(0, 8)} `))) : null,
      step.output !== undefined && step.output !== null ? h("details", {}, h("summary", {}, "Output"), h("pre", { class: "json" }, json(step.output))) : null,
      extra);
  }
}
