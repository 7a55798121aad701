// The Runs and Schedules pages: background runs appear with live states and can be cancelled;
// runs started in their sessions are listed beside them;
// a schedule added in the form fires, its runs are listed, and it can be deleted.
import { test, expect, open, shot, slowText } from "../support.js";

function row(page, id) {
  return page.locator(`[data-testid=run-row][data-run-id="${id}"]`);
}

test("background runs show their states live and a running one can be cancelled", async ({ page, env, script }) => {
  await open(page, env, "#/runs");
  await expect(page.getByTestId("runs")).toBeVisible();
  // A quick run: it ends succeeded.
  await script.enqueue({ text: "Done off to the side." });
  const quick = await env.api.post("/v1/runs", { model_id: "mock", text: "Quick queued work" });
  await expect(row(page, quick.run_id).getByTestId("run-state")).toHaveText("succeeded");
  await expect(row(page, quick.run_id)).toContainText("Done off to the side.");
  // A slow one: running, then cancelled from the page.
  await script.enqueue(slowText("A long answer that takes its time to arrive, word after word, on purpose.", 300));
  const slow = await env.api.post("/v1/runs", { model_id: "mock", text: "Slow queued work" });
  await expect(row(page, slow.run_id).getByTestId("run-state")).toHaveText("running");
  await row(page, slow.run_id).getByTestId("run-cancel").click();
  await expect(row(page, slow.run_id).getByTestId("run-state")).toHaveText("cancelled");
  await expect(row(page, slow.run_id).getByTestId("run-cancel")).toHaveCount(0);
  // The state filter.
  await page.getByTestId("runs-state").selectOption("succeeded");
  await expect(row(page, quick.run_id)).toHaveCount(1);
  await expect(row(page, slow.run_id)).toHaveCount(0);
  await expect(page.locator("[data-testid=run-row][data-state=cancelled]")).toHaveCount(0);
  await shot(page, "runs");
});

test("runs started in their sessions are listed beside background runs", async ({ page, env, script }) => {
  await script.enqueue({ text: "Answered in the conversation." });
  const answer = await env.api.post("/v1/infer", { model_id: "mock", session_id: "new", text: "A chat turn" });
  await script.enqueue({ text: "Answered from the queue." });
  const queued = await env.api.post("/v1/runs", { model_id: "mock", text: "Queued work" });
  await open(page, env, "#/runs");
  const chat = row(page, answer.run_id);
  await expect(chat.getByTestId("run-kind")).toHaveText("session");
  await expect(chat.getByTestId("run-state")).toHaveText("succeeded");
  await expect(row(page, queued.run_id).getByTestId("run-kind")).toHaveText("background");
  // Only the runs started in their sessions.
  await page.getByTestId("runs-kind").selectOption("false");
  await expect(row(page, answer.run_id)).toHaveCount(1);
  await expect(row(page, queued.run_id)).toHaveCount(0);
  await expect(page.locator("[data-testid=run-kind]", { hasText: "background" })).toHaveCount(0);
});

test("a schedule added in the form fires, lists its runs, and is deleted", async ({ page, env, script }) => {
  await open(page, env, "#/schedules");
  // A bad cron expression is refused with the server's reason.
  const form = page.getByTestId("schedule-form");
  await form.getByLabel("Cron").fill("61 * * * *");
  await form.getByLabel("Model").fill("mock");
  await form.getByLabel("Message").fill("tick");
  await page.getByTestId("schedule-add").click();
  await expect(page.getByTestId("form-error")).toContainText("cron");
  await expect(page.locator("[data-testid=schedule-row]")).toHaveCount(0);
  // Every second.
  for (let i = 0; i < 10; i++) await script.enqueue({ text: `tick ${i}` });
  await form.getByLabel("Name").fill("ticker");
  await form.getByLabel("Cron").fill("");
  await form.getByLabel("Or every (seconds)").fill("1");
  await page.getByTestId("schedule-add").click();
  const schedule = page.locator("[data-testid=schedule-row]", { hasText: "ticker" });
  await expect(schedule).toHaveCount(1);
  await expect(schedule).toContainText("every 1 s");
  await shot(page, "schedules");
  await schedule.getByTestId("schedule-runs").click();
  await expect(page.getByTestId("runs")).toBeVisible();
  await expect(page.locator("[data-testid=run-row]").first().getByTestId("run-state")).toHaveText("succeeded", { timeout: 10000 });
  await page.goto(`${env.server.url}/#/schedules`);
  await page.locator("[data-testid=schedule-row]", { hasText: "ticker" }).getByTestId("schedule-delete").click();
  await expect(page.locator("[data-testid=schedule-row]")).toHaveCount(0);
});
