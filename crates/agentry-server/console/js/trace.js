// The run trace: each run of a session as a waterfall of its model calls (their measured
// duration, the time to the first streamed output marked, tokens and cost) and tool calls (their
// measured durations), from the session's log and its commit times.

import { get } from "./api.js";
import { h, clear, errorText, dollars } from "./dom.js";

function tokens(usage) {
  if (!usage) return "";
  const parts = [`${usage.input_tokens ?? 0} in`, `${usage.output_tokens ?? 0} out`];
  if (usage.cached_input_tokens) parts.push(`${usage.cached_input_tokens} cached`);
  if (usage.reasoning_tokens) parts.push(`${usage.reasoning_tokens} reasoning`);
  return parts.join(" · ");
}

/** The runs of a session, each with its steps: {kind, name, start, end, usage, detail}. */
export function buildTrace(events) {
  const runs = [];
  let run = null;
  let last = 0;
  const calls = new Map();
  for (const { event, at } of events) {
    switch (event.type) {
      case "run_started":
        run = { id: event.run_id, model: event.model, start: at, end: at, steps: [], usage: { input_tokens: 0, output_tokens: 0 }, cost: 0, stop: "" };
        runs.push(run);
        break;
      case "assistant_message":
        if (!run) break;
        // A measured call started its duration before its commit; an older log's, at the
        // commit before it.
        run.steps.push({ kind: "model", name: `round ${event.round}`,
          start: event.duration_ms != null ? at - event.duration_ms : last || at, end: at, usage: event.usage,
          first: event.first_output_ms, cost: event.cost_usd,
          detail: (event.content || []).filter((p) => p.type === "tool_call").map((p) => p.name).join(", ") });
        if (run.steps.at(-1).start < run.start) run.start = run.steps.at(-1).start;
        run.cost += event.cost_usd || 0;
        run.usage.input_tokens += event.usage?.input_tokens || 0;
        run.usage.output_tokens += event.usage?.output_tokens || 0;
        break;
      case "tool_call_intent": calls.set(event.call.id, event.call.name); break;
      case "tool_call_result":
        if (!run) break;
        run.steps.push({ kind: "tool", name: event.result.name || calls.get(event.result.call_id) || "tool",
          start: at - (event.duration_ms || 0), end: at, usage: null, detail: event.result.is_error ? "error" : "ok" });
        break;
      case "run_finished":
        if (run) { run.end = at; run.stop = event.error ? `failed: ${event.error.message || event.error.code}` : event.stop_reason; }
        break;
      default: break;
    }
    if (run && at > run.end) run.end = at;
    last = at;
  }
  return runs;
}

export class TraceView {
  constructor(root, sessionId) {
    this.root = h("div", { class: "page trace", testid: "trace" });
    root.append(this.root);
    this.sessionId = sessionId;
    this.load();
  }

  async load() {
    const root = this.root;
    clear(root).append(h("p", { class: "muted" }, "Loading…"));
    try {
      const [detail, data] = await Promise.all([
        get(`/v1/sessions/${this.sessionId}`),
        get(`/v1/sessions/${this.sessionId}/events`),
      ]);
      const runs = buildTrace(data.events || []);
      const totalIn = runs.reduce((n, r) => n + r.usage.input_tokens, 0);
      const totalOut = runs.reduce((n, r) => n + r.usage.output_tokens, 0);
      const modelCalls = runs.reduce((n, r) => n + r.steps.filter((s) => s.kind === "model").length, 0);
      const toolCalls = runs.reduce((n, r) => n + r.steps.filter((s) => s.kind === "tool").length, 0);
      clear(root).append(
        h("h2", {}, `Trace — ${detail.session.title || "Untitled"} `, h("a", { href: `#/chat/${this.sessionId}`, style: "font-size: 13px" }, "back to chat")),
        h("div", { class: "totals" },
          h("div", {}, "Runs", h("b", {}, runs.length)),
          h("div", {}, "Model calls", h("b", {}, modelCalls)),
          h("div", {}, "Tool calls", h("b", {}, toolCalls)),
          h("div", {}, "Tokens in / out", h("b", {}, `${totalIn} / ${totalOut}`))),
        ...(runs.length ? runs.map((run) => this.run(run)) : [h("p", { class: "muted" }, "No run yet.")]));
    } catch (error) {
      clear(root).append(h("p", { class: "form-error" }, errorText(error)));
    }
  }

  run(run) {
    const span = Math.max(run.end - run.start, 1);
    const pct = (ms) => `${(ms / span) * 100}%`;
    const cost = run.cost ? ` · ${dollars(run.cost)}` : "";
    return h("div", { class: "card" },
      h("div", {}, h("strong", {}, run.model), h("span", { class: "muted" }, ` · ${run.end - run.start} ms · ${tokens(run.usage)}${cost} · ${run.stop || "running"} · run ${run.id}`)),
      h("table", {},
        h("thead", {}, h("tr", {}, ["", "Step", "Start", "Duration", "Tokens", "Cost", "Waterfall"].map((t) => h("th", {}, t)))),
        h("tbody", {}, run.steps.map((step) => h("tr", { testid: "trace-row", dataset: { kind: step.kind } },
          h("td", {}, step.kind === "model" ? "◆" : "▸"),
          h("td", {}, step.kind === "model" ? `${step.name}${step.detail ? ` → ${step.detail}` : ""}` : h("code", {}, step.name), step.kind === "tool" ? h("span", { class: "muted" }, ` ${step.detail}`) : null),
          h("td", { class: "muted" }, `+${Math.max(step.start - run.start, 0)} ms`),
          h("td", { testid: "trace-duration" }, `${Math.max(step.end - step.start, 0)} ms`, step.first != null ? h("span", { class: "muted" }, ` (first output ${step.first} ms)`) : null),
          h("td", {}, tokens(step.usage)),
          h("td", {}, step.cost != null ? dollars(step.cost) : ""),
          h("td", {}, h("div", { class: "timeline", testid: "waterfall" },
            h("div", { class: "bar", style: `left: ${pct(step.start - run.start)}; width: ${Math.max(((step.end - step.start) / span) * 100, 0.5)}%` }),
            step.first != null ? h("div", { class: "first-output", title: "first output", style: `left: ${pct(step.start - run.start + step.first)}` }) : null)))))));
  }
}
