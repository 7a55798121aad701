// The Workflows page: a workflow started from the form made from its input schema; the run's
// graph (mermaid) and steps change live from its event stream; an approval given inline.
import { test, expect, open, shot } from "../support.js";

test("a workflow starts from its form, changes live, and is approved inline", async ({ page, env, script }) => {
  await page.addInitScript(() => {
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (event) => window.__violations.push(`${event.violatedDirective} ${event.sourceFile}:${event.lineNumber}`));
  });
  await env.api.post("/v1/agents", { id: "wf-writer", model_id: "mock" });
  await env.api.post("/v1/workflows", {
    id: "publish",
    input_schema: { type: "object", required: ["topic"], properties: { topic: { type: "string", description: "what to write about" } } },
    steps: [
      { id: "draft", kind: "agent", agent: "wf-writer", prompt: "Write about {{ input.topic }}." },
      { id: "review", kind: "approval", message: "Publish this? {{ steps.draft.output }}" },
      { id: "settle", kind: "wait", seconds: 0 },
    ],
  });
  await script.enqueue({ text: "Cats nap a lot." });
  await open(page, env, "#/workflows");
  const workflow = page.locator('[data-testid=workflow][data-id="publish"]');
  await workflow.getByTestId("open-start").click();
  const form = workflow.getByTestId("start-form");
  await form.locator("[name=topic]").fill("cats");
  await form.getByTestId("start").click();
  await expect(page).toHaveURL(/#\/workflows\/run\/[0-9a-f-]{36}$/);

  // Live: the approval waits, its question shows the draft.
  const review = page.locator('[data-testid=workflow-step][data-id="review"]');
  await expect(review).toHaveAttribute("data-state", "waiting");
  await expect(review.getByTestId("approval")).toContainText("Publish this? Cats nap a lot.");
  await expect(page.locator('[data-testid=workflow-step][data-id="draft"] [data-testid=step-session]')).toHaveCount(1);
  const graph = page.getByTestId("workflow-graph");
  await expect(graph.locator(".diagram[data-state=done] svg g.node")).toHaveCount(3);
  await expect(graph.locator("svg g.node.waiting")).toHaveCount(1);
  await expect(page.locator(".workflow-head")).not.toContainText("null");
  await shot(page, "workflow-run-waiting");

  await review.getByTestId("comment").fill("ship it");
  await review.getByTestId("approve").click();
  await expect(page.getByTestId("run-state")).toHaveAttribute("data-state", "succeeded");
  await expect(review).toHaveAttribute("data-state", "succeeded");
  await expect(graph.locator("svg g.node.succeeded")).toHaveCount(3);
  // The model was asked with the rendered prompt.
  const { requests } = await script.requests();
  expect(JSON.stringify(requests[0].body.messages)).toContain("Write about cats.");
  expect(await page.evaluate(() => window.__violations)).toEqual([]);
  await shot(page, "workflow-run-succeeded");
  // A click on a step's node: the approval's card comes into view; the agent step's opens its
  // session.
  await graph.locator('svg g.node[id*="-n1-"]').first().click();
  await expect(review).toHaveClass(/focused/);
  const session = await page.locator('[data-testid=workflow-step][data-id="draft"] [data-testid=step-session]').getAttribute("href");
  await graph.locator('svg g.node[id*="-n0-"]').first().click();
  await expect(page).toHaveURL(new RegExp(`${session.replace(/[/#]/g, "\\$&")}$`));

  // The run is listed on the page.
  await page.goto(`${env.server.url}/#/workflows`);
  await expect(page.locator("[data-testid=workflow-run] [data-testid=state]").first()).toHaveText("succeeded");
  await env.api.del("/v1/workflows/publish");
  await env.api.del("/v1/agents/wf-writer");
});

test("a switch is drawn as a choice with its ways, and the way not taken is skipped", async ({ page, env }) => {
  await env.api.post("/v1/workflows", {
    id: "fork",
    steps: [
      { id: "route", kind: "switch", cases: [{ when: "input.go", then: "yes" }], default: "no" },
      { id: "yes", kind: "wait", seconds: 0, needs: ["route"] },
      { id: "no", kind: "wait", seconds: 0, needs: ["route"] },
    ],
  });
  const run = await env.api.post("/v1/workflows/fork/runs", { input: { go: true } });
  await open(page, env, `#/workflows/run/${run.run_id}`);
  await expect(page.getByTestId("run-state")).toHaveAttribute("data-state", "succeeded");
  await expect(page.locator('[data-testid=workflow-step][data-id="no"]')).toHaveAttribute("data-state", "skipped");
  const graph = page.getByTestId("workflow-graph");
  await expect(graph.locator("svg g.node.skipped")).toHaveCount(1);
  await expect(graph.locator("svg g.node.succeeded")).toHaveCount(2);
  // The switch is a diamond; its edges say which way is which.
  await expect(graph.locator("svg g.node polygon")).toHaveCount(1);
  await expect(graph.locator("svg .edgeLabel", { hasText: "case 0" })).toHaveCount(1);
  await expect(graph.locator("svg .edgeLabel", { hasText: "default" })).toHaveCount(1);
  await shot(page, "workflow-switch");
  await env.api.del("/v1/workflows/fork");
});
