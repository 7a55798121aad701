// The Usage page: what model calls cost and used over a range (7, 30 or 90 days): totals, cost
// per day by agent and tokens per day by model as charts (uPlot, vendored under
// console/vendor/uplot, MIT), a table by agent and model, and the budgets with what their
// period spent (admins).
// Everything comes from GET /v1/usage and GET /v1/budgets; nothing is computed here but the
// arrangement of the numbers. The chart library loads the first time the page opens.

import { get } from "./api.js";
import { h, clear, toast, errorText, dollars } from "./dom.js";

const DAY = 86_400_000;
const PALETTE = ["#4f6bed", "#e8833a", "#2a9d8f", "#c0392b", "#8e44ad", "#7f8c8d", "#d4a017", "#16a085"];

let library = null;

/** uPlot, and its stylesheet, loaded once. */
function uplot() {
  if (!document.querySelector("link[data-uplot]")) {
    document.head.append(h("link", { rel: "stylesheet", href: "/console/vendor/uplot/uPlot.min.css", "data-uplot": "" }));
  }
  library ??= import("../vendor/uplot/uPlot.esm.js").then((module) => module.default);
  return library;
}

/** The days of the range (UTC midnights, in seconds) and, per series name, a value per day. */
export function seriesByDay(groups, from, to, dim, value) {
  const days = [];
  for (let at = Math.floor(from / DAY) * DAY; at < to; at += DAY) days.push(at / 1000);
  const index = new Map(days.map((day, i) => [new Date(day * 1000).toISOString().slice(0, 10), i]));
  const series = new Map();
  for (const group of groups) {
    const name = group[dim] ?? "(none)";
    if (!series.has(name)) series.set(name, days.map(() => 0));
    const i = index.get(group.day);
    if (i !== undefined) series.get(name)[i] += value(group);
  }
  return { days, series };
}

function chart(uPlot, target, title, { days, series }, format) {
  const width = Math.max(target.clientWidth || 0, 320);
  const names = [...series.keys()];
  // The theme's colours, so the axes read on a dark page too.
  const css = getComputedStyle(document.body);
  const ink = css.getPropertyValue("--muted").trim() || "#667085";
  const grid = { stroke: css.getPropertyValue("--border").trim() || "#e4e7ec", width: 1 };
  const options = {
    title,
    width,
    height: 220,
    scales: { x: { time: true } },
    axes: [{ stroke: ink, grid, ticks: grid }, { stroke: ink, grid, ticks: grid, values: (_, ticks) => ticks.map(format), size: 70 }],
    series: [{}, ...names.map((name, i) => ({
      label: name,
      stroke: PALETTE[i % PALETTE.length],
      fill: `${PALETTE[i % PALETTE.length]}22`,
      width: 2,
      value: (_, v) => (v == null ? "" : format(v)),
    }))],
  };
  return new uPlot(options, [days, ...names.map((name) => series.get(name))], target);
}

export class UsageView {
  constructor(root) {
    this.root = h("div", { class: "page usage", testid: "usage" });
    root.append(this.root);
    this.days = 30;
    this.plots = [];
    this.load();
  }

  close() { for (const plot of this.plots) plot.destroy(); this.plots = []; }

  async load() {
    const to = Date.now() + 60_000;
    const from = Math.floor((to - this.days * DAY) / DAY) * DAY;
    const range = `from=${from}&to=${to}`;
    let byAgent, byModel, table, budgets, uPlot;
    try {
      [uPlot, byAgent, byModel, table] = await Promise.all([
        uplot(),
        get(`/v1/usage?${range}&group_by=day,agent`),
        get(`/v1/usage?${range}&group_by=day,model`),
        get(`/v1/usage?${range}&group_by=agent,model`),
      ]);
    } catch (error) {
      toast(`Usage: ${errorText(error)}`, "error");
      return;
    }
    try {
      budgets = (await get("/v1/budgets")).budgets;
    } catch {
      budgets = null; // A user key sees no budgets.
    }
    this.render(uPlot, byAgent, byModel, table, budgets, from, to);
  }

  render(uPlot, byAgent, byModel, table, budgets, from, to) {
    this.close();
    const total = table.total;
    const select = h("select", { testid: "usage-range", "aria-label": "Range", onchange: (event) => {
      this.days = Number(event.target.value);
      this.load();
    } }, [7, 30, 90].map((days) => h("option", { value: days, selected: days === this.days }, `Last ${days} days`)));
    const costChart = h("div", { class: "chart", testid: "usage-cost-chart" });
    const tokenChart = h("div", { class: "chart", testid: "usage-token-chart" });
    clear(this.root).append(
      h("div", { class: "page-head" }, h("h2", {}, "Usage"), select),
      h("div", { class: "totals", testid: "usage-totals" },
        h("div", {}, "Runs", h("b", { testid: "usage-runs" }, total.runs)),
        h("div", {}, "Model calls", h("b", {}, total.calls)),
        h("div", {}, "Tokens in / out", h("b", { testid: "usage-tokens" }, `${total.input_tokens} / ${total.output_tokens}`)),
        h("div", {}, "Cost", h("b", { testid: "usage-cost" }, dollars(total.cost_usd))),
        total.unpriced_calls ? h("div", {}, "Calls without a price", h("b", {}, total.unpriced_calls)) : null),
      h("div", { class: "card" }, costChart),
      h("div", { class: "card" }, tokenChart),
      h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["Agent", "Model", "Runs", "Calls", "Input", "Cached", "Output", "Cost"].map((t) => h("th", {}, t)))),
        h("tbody", { testid: "usage-rows" }, table.groups.map((row) => h("tr", { testid: "usage-row" },
          h("td", {}, row.agent ?? h("span", { class: "muted" }, "(none)")),
          h("td", {}, row.model),
          h("td", {}, row.runs), h("td", {}, row.calls),
          h("td", {}, row.input_tokens), h("td", {}, row.cached_input_tokens), h("td", {}, row.output_tokens),
          h("td", {}, row.unpriced_calls === row.calls ? h("span", { class: "muted" }, "no price") : dollars(row.cost_usd)))))),
      budgets ? this.budgets(budgets) : null);
    this.plots.push(chart(uPlot, costChart, "Cost per day, by agent",
      seriesByDay(byAgent.groups, from, to, "agent", (g) => g.cost_usd), (v) => dollars(v)));
    this.plots.push(chart(uPlot, tokenChart, "Tokens per day, by model",
      seriesByDay(byModel.groups, from, to, "model", (g) => g.input_tokens + g.output_tokens), (v) => `${Math.round(v)}`));
  }

  budgets(budgets) {
    return h("div", { class: "card", testid: "usage-budgets" },
      h("h3", {}, "Budgets"),
      budgets.length === 0 ? h("p", { class: "muted" }, "No budget. POST /v1/budgets or `agentry budgets add` sets one.") : null,
      budgets.map((view) => {
        const share = view.limit_usd > 0 ? Math.min(view.spent_usd / view.limit_usd, 1) : 1;
        return h("div", { class: "budget", testid: "usage-budget", dataset: { exceeded: String(view.exceeded) } },
          h("div", {}, h("strong", {}, view.name), h("span", { class: "muted" },
            ` · ${view.agent ? `agent ${view.agent}` : `key ${view.key}`} · ${dollars(view.spent_usd)} of ${dollars(view.limit_usd)} per ${view.period}`),
            view.exceeded ? h("span", { class: "badge state-failed", testid: "budget-exceeded" }, "exceeded") : null),
          h("div", { class: "meter" }, h("div", { class: "fill", style: `width: ${share * 100}%` })));
      }));
  }
}
