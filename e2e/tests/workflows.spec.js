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

test("a workflow is created through the form, edited as YAML with live schema checks, saved and run", async ({ page, env }) => {
  await env.api.post("/v1/agents", { id: "wf-editor-agent", model_id: "mock" });
  await open(page, env, "#/workflows");
  await page.getByTestId("new-workflow").click();
  await expect(page).toHaveURL(/#\/workflows\/new$/);
  const text = page.getByTestId("definition-editor");
  const problems = page.getByTestId("schema-errors").getByTestId("schema-error");
  const status = page.getByTestId("editor-status");
  const save = page.getByTestId("save-workflow");
  // A new definition has no id yet: the schema says so before anything is typed.
  await expect(problems.filter({ hasText: "/id" })).toHaveCount(1);
  await expect(save).toBeDisabled();

  // The form: id, description, a wait and an approval.
  await page.getByTestId("workflow-id").fill("greet");
  await page.getByTestId("workflow-description").fill("says hello");
  const first = page.getByTestId("step-form").nth(0);
  await first.locator("select[data-field=kind]").selectOption("wait");
  await first.locator("input[data-field=seconds]").fill("0");
  await page.getByTestId("add-step").click();
  const second = page.getByTestId("step-form").nth(1);
  await second.locator("select[data-field=kind]").selectOption("approval");
  await second.locator("textarea[data-field=message]").fill("Go on?");
  // The text follows the form, and matches the schema.
  expect(JSON.parse(await text.inputValue())).toEqual({ id: "greet", description: "says hello", steps: [
    { id: "step1", kind: "wait", seconds: 0 }, { id: "step2", kind: "approval", message: "Go on?" }] });
  await expect(status).toHaveAttribute("data-valid", "true");
  await expect(problems).toHaveCount(0);
  await shot(page, "workflow-new");
  await save.click();
  await expect(page).toHaveURL(/#\/workflows$/);
  const row = page.locator('[data-testid=workflow][data-id="greet"]');
  await expect(row).toContainText("v1 · 2 steps · says hello");

  // Edit it as YAML: an invalid edit is flagged as it is typed, with its path, and cleared
  // when mended.
  await row.getByTestId("edit-workflow").click();
  await expect(page.getByTestId("workflow-id")).toHaveValue("greet");
  await page.getByTestId("editor-format").selectOption("yaml");
  await expect(text).toHaveValue(/seconds: 0/);
  const yaml = await text.inputValue();
  await text.fill(yaml.replace("seconds: 0", "seconds: soon"));
  await expect(problems).toHaveCount(1);
  await expect(problems.first()).toHaveAttribute("data-path", "/steps/0/seconds");
  await expect(problems.first()).toContainText("integer");
  await expect(save).toBeDisabled();
  await expect(page.locator('[data-testid=step-form] [data-path="/steps/0/seconds"]')).toHaveAttribute("aria-invalid", "true");
  // Typed key by key: an unknown property is named while it is typed.
  await text.fill(yaml);
  await expect(problems).toHaveCount(0);
  await text.press("Control+End");
  await text.pressSequentially("colour: blue");
  await expect(problems).toHaveCount(1);
  await expect(problems.first()).toContainText('/colour unknown property "colour"');
  for (let i = 0; i < "colour: blue".length; i += 1) await text.press("Backspace");
  await expect(problems).toHaveCount(0);
  // YAML that does not parse.
  await text.fill(`${yaml}steps: [oops\n`);
  await expect(problems.first()).toContainText("YAML");
  // Mended: the second step now waits a second; the form follows the text.
  await text.fill(yaml.replace("seconds: 0", "seconds: 1"));
  await expect(problems).toHaveCount(0);
  await expect(status).toHaveAttribute("data-valid", "true");
  await expect(page.getByTestId("step-form").nth(0).locator("input[data-field=seconds]")).toHaveValue("1");
  await shot(page, "workflow-edit-yaml");

  // What only the server can tell (an agent that does not exist) is shown on save.
  await text.fill(yaml.replace("kind: approval", "kind: agent").replace("message: Go on?", "agent: nobody\n    prompt: hi"));
  await expect(problems).toHaveCount(0);
  await save.click();
  await expect(page.getByTestId("save-error")).toContainText("nobody");
  await text.fill(yaml.replace("seconds: 0", "seconds: 1"));
  await save.click();
  await expect(page).toHaveURL(/#\/workflows$/);
  await expect(row).toContainText("v2 · 2 steps");
  expect((await env.api.get("/v1/workflows/greet")).steps[0]).toEqual({ id: "step1", kind: "wait", seconds: 1 });

  // Run the new version.
  await row.getByTestId("open-start").click();
  await row.getByTestId("start-form").getByTestId("start").click();
  await expect(page).toHaveURL(/#\/workflows\/run\/[0-9a-f-]{36}$/);
  const approval = page.locator('[data-testid=workflow-step][data-id="step2"]');
  await expect(approval).toHaveAttribute("data-state", "waiting");
  await approval.getByTestId("approve").click();
  await expect(page.getByTestId("run-state")).toHaveAttribute("data-state", "succeeded");
  await env.api.del("/v1/workflows/greet");
  await env.api.del("/v1/agents/wf-editor-agent");
});
