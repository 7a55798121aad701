// A turn's file changes in the chat: shown as a diff under its message, and revoked — the
// conversation goes back to before the message, and the file the agent wrote is gone.
import { test, expect, open, pick, offer, shot } from "../support.js";

test("a turn's changes show as a diff, and revoking it puts the files back", async ({ page, env, script }) => {
  await script.enqueue(
    { tool_calls: [{ name: "write_file", arguments: { path: "notes/plan.md", content: "# Plan\nship it\n" } }] },
    { text: "Wrote the plan." },
  );
  await open(page, env);
  await pick(page, "model:mock");
  await offer(page, "write_file");
  await page.getByTestId("composer").fill("Write a plan");
  await page.getByTestId("send").click();
  const user = page.locator("[data-testid=message][data-role=user]");
  await expect(page.locator("[data-testid=message][data-role=assistant]").last()).toContainText("Wrote the plan.");
  const session = (await page.evaluate(() => location.hash)).split("/").pop();

  // The message says the turn changed files (at once, and after a reload); its diff opens
  // under it.
  const changes = user.getByTestId("turn-files");
  await expect(changes).toHaveText("Changes (2)");
  await page.reload();
  await expect(changes).toHaveText("Changes (2)");
  await changes.click();
  const diff = user.getByTestId("turn-diff");
  await expect(diff.locator("details[data-path='notes/plan.md'] summary")).toContainText("added");
  await expect(diff.locator("details[data-path='notes/plan.md'] pre.diff .add")).toHaveText(["+# Plan", "+ship it"]);
  await shot(page, "turn-diff");

  // Revoke: confirmed, the turn is gone from the transcript and its file from the workspace.
  page.once("dialog", (dialog) => dialog.accept());
  await user.getByTestId("revoke").click();
  await expect(user).toHaveCount(0);
  await expect(page.getByTestId("composer")).toHaveValue("Write a plan");
  const journal = await env.api.get(`/v1/sessions/${session}/file-journals`);
  expect(journal.turns).toEqual([]);
  const listing = await env.api.get(`/linglong/v1/workspace/list?session_id=${session}&path=`);
  expect(JSON.stringify(listing)).not.toContain("plan.md");
  // A reload shows the conversation as it now is.
  await page.reload();
  await expect(page.locator("[data-testid=message]")).toHaveCount(0);
});
