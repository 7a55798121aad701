// The Usage page: runs of two agents on a priced model appear in the totals, the two charts
// (uPlot) and the table by agent and model with their tokens and cost; a budget shows what
// its period spent and that it is used up; the trace shows each model call on a waterfall.
import { test, expect, open, shot } from "../support.js";

test("the usage page charts and tables what runs cost, with budgets", async ({ page, env, script }) => {
  const model = await env.api.get("/v1/models/mock");
  await env.api.post("/v1/models", { id: "usage-priced", protocol: "openai", base_url: model.base_url,
    model_name: "mock-model", pricing: { input: 1000, output: 2000 } });
  for (const id of ["usage-alpha", "usage-beta"]) {
    await env.api.post("/v1/agents", { id, model_id: "usage-priced" });
  }
  await env.api.post("/v1/budgets", { name: "usage-alpha-cap", agent: "usage-alpha", limit_usd: 0.05, period: "day" });
  // alpha: 10 in + 20 out = $0.05 (its budget is used up); beta: 5 in + 5 out = $0.015.
  await script.enqueue({ text: "alpha answers", usage: [10, 20] });
  const alpha = await env.api.post("/v1/infer", { session_id: "new", agent_id: "usage-alpha", text: "go" });
  await script.enqueue({ text: "beta answers", usage: [5, 5] });
  await env.api.post("/v1/infer", { session_id: "new", agent_id: "usage-beta", text: "go" });

  await open(page, env, "#/usage");
  await page.getByTestId("nav-usage").click();
  await expect(page.getByTestId("usage")).toBeVisible();
  const row = (agent) => page.locator("[data-testid=usage-row]", { hasText: agent });
  await expect(row("usage-alpha")).toContainText("usage-priced");
  await expect(row("usage-alpha")).toContainText("$0.0500");
  await expect(row("usage-beta")).toContainText("$0.0150");
  // Two charts, each a canvas with a legend naming the series.
  await expect(page.locator("[data-testid=usage-cost-chart] canvas")).toHaveCount(1);
  await expect(page.locator("[data-testid=usage-token-chart] canvas")).toHaveCount(1);
  await expect(page.getByTestId("usage-cost-chart")).toContainText("usage-alpha");
  await expect(page.getByTestId("usage-token-chart")).toContainText("usage-priced");
  // The budget: used up.
  const budget = page.locator("[data-testid=usage-budget]", { hasText: "usage-alpha-cap" });
  await expect(budget).toHaveAttribute("data-exceeded", "true");
  await expect(budget.getByTestId("budget-exceeded")).toBeVisible();
  // Another range reloads the page's numbers.
  await page.getByTestId("usage-range").selectOption("7");
  await expect(row("usage-beta")).toContainText("$0.0150");
  await shot(page, "usage");

  // The run's trace: the model call on the waterfall, with its cost.
  await page.goto(`${env.server.url}/#/trace/${alpha.session_id}`);
  const call = page.locator("[data-testid=trace-row][data-kind=model]");
  await expect(call).toHaveCount(1);
  await expect(call).toContainText("$0.0500");
  await expect(call.getByTestId("waterfall").locator(".bar")).toHaveCount(1);
  await expect(call.getByTestId("trace-duration")).toContainText("first output");
});
