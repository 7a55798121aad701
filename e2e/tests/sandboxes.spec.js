// The Sandboxes page: a new sandbox listed with its state; Python run in its kernel with a table,
// a chart and an error shown; pause and resume; a snapshot forked into a second sandbox; delete.
import { test, expect, open, shot } from "../support.js";

test("a sandbox runs code with a table and a chart, pauses, snapshots, forks and goes", async ({ page, env }) => {
  await page.addInitScript(() => {
    // The page's CSP must let the chart show: no violation may be reported.
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (event) => window.__violations.push(event.violatedDirective));
  });
  await open(page, env, "#/sandboxes");
  await page.getByTestId("nav-sandboxes").click();
  await expect(page.getByTestId("sandboxes")).toBeVisible();
  const before = await page.getByTestId("sandbox-row").count();
  await page.getByTestId("sandbox-new").click();
  await expect(page.getByTestId("sandbox-row")).toHaveCount(before + 1);
  const row = page.locator("[data-testid=sandbox-row].selected");
  await expect(row.getByTestId("sandbox-state")).toHaveText("running");

  const run = async (code) => {
    await page.getByTestId("code-input").fill(code);
    await page.getByTestId("code-run").click();
  };
  const latest = page.getByTestId("code-call").first();
  await run("import pandas as pd\ndf = pd.DataFrame({'n': [1, 2, 3], 'square': [1, 4, 9]})\ndf");
  const table = latest.getByTestId("code-table");
  await expect(table).toBeVisible({ timeout: 60_000 });
  await expect(table).toContainText("square");
  await expect(table.locator("tr")).toHaveCount(4);

  await run("import matplotlib.pyplot as plt\nplt.plot(df.n, df.square)\nplt.show()\nprint('drawn')");
  await expect(latest.getByTestId("code-image")).toBeVisible({ timeout: 30_000 });
  await expect(latest.locator("[data-testid=code-stream].stdout")).toHaveText("drawn\n");
  const width = await latest.getByTestId("code-image").evaluate((img) => img.naturalWidth);
  expect(width).toBeGreaterThan(100);

  // Streamed: the first line shows while the code still runs (it waits for a file written
  // only once that line is on the page).
  await run("import os, time\nprint('first', flush=True)\nwhile not os.path.exists('go'):\n    time.sleep(0.05)\nprint('second')");
  await expect(latest.getByTestId("code-stream")).toHaveText("first\n");
  await expect(latest.getByTestId("code-running")).toBeVisible();
  const id = await row.getAttribute("data-sandbox-id");
  const put = await fetch(`${env.server.url}/v1/sandboxes/${id}/files?path=go`, { method: "PUT", body: "" });
  expect(put.ok).toBe(true);
  await expect(latest.getByTestId("code-stream")).toHaveText("first\nsecond\n");
  await expect(latest.getByTestId("code-running")).toHaveCount(0);

  await run("len(df) / 0");
  await expect(latest.getByTestId("code-error")).toContainText("ZeroDivisionError");
  await shot(page, "sandboxes");

  await row.getByTestId("sandbox-pause").click();
  await expect(row.getByTestId("sandbox-state")).toHaveText("paused");
  await row.getByTestId("sandbox-resume").click();
  await expect(row.getByTestId("sandbox-state")).toHaveText("running");

  const snapshots = await page.getByTestId("snapshot-row").count();
  await row.getByTestId("sandbox-snapshot").click();
  await expect(page.getByTestId("snapshot-row")).toHaveCount(snapshots + 1);
  await page.getByTestId("snapshot-row").last().getByTestId("snapshot-fork").click();
  await expect(page.getByTestId("sandbox-row")).toHaveCount(before + 2);
  // The fork is selected, and its kernel is its own (a new one: `df` is not there).
  await run("'df' in globals()");
  await expect(latest.getByTestId("code-result")).toHaveText("False", { timeout: 60_000 });

  for (let i = 0; i < 2; i += 1) {
    await page.locator("[data-testid=sandbox-row]").last().getByTestId("sandbox-delete").click();
    await expect(page.getByTestId("sandbox-row")).toHaveCount(before + 1 - i);
  }
  expect(await page.evaluate(() => window.__violations)).toEqual([]);
});
