// The sessions sidebar: live status from the status feed (running, waiting, done, error),
// unread markers for sessions that changed in the background, search.
import { test, expect, open, shot, slowText } from "../support.js";

function item(page, id) {
  return page.locator(`[data-testid=session-item][data-session-id="${id}"]`);
}

test("statuses change live and unread sessions are marked", async ({ page, env, script }) => {
  await open(page, env, "#/chat");
  // A run started elsewhere (the API): the sidebar shows it running, then done, unread.
  // Long and slow enough (about 4 s: some 175 pieces of 40 bytes, 25 ms apart) that the sidebar
  // shows it running before it ends, however loaded the machine.
  await script.enqueue(slowText("A background answer that takes a little while to write out, one piece after another, so that anyone watching the sidebar sees the session running before it is done.", 25));
  const started = fetch(`${env.server.url}/v1/infer/stream`, {
    method: "POST", headers: { "content-type": "application/json" },
    body: JSON.stringify({ session_id: "new", model_id: "mock", text: "Background work" }),
  }).then((response) => response.text());
  const row = page.locator("[data-testid=session-item]", { hasText: "Background work" });
  await expect(row.getByTestId("session-status")).toHaveAttribute("data-status", "running");
  await started;
  await expect(row.getByTestId("session-status")).toHaveAttribute("data-status", "done");
  await expect(row).toHaveAttribute("data-unread", "true");
  // Opening it marks it read.
  await row.click();
  await expect(row).toHaveAttribute("data-unread", "false");

  // A failing run shows as an error.
  await script.enqueue({ status: 400, error: { error: { message: "scripted failure", type: "invalid_request_error" } } });
  const failed = await env.api.post("/v1/infer", { session_id: "new", model_id: "mock", text: "This one fails" }).catch((e) => e);
  expect(String(failed)).toContain("400");
  const failing = page.locator("[data-testid=session-item]", { hasText: "This one fails" });
  await expect(failing.getByTestId("session-status")).toHaveAttribute("data-status", "error");

  // Waiting for approval.
  await env.api.post("/v1/agents", { id: "careful-sidebar", model_id: "mock", tool_ids: ["current_time"], approvals: { tools: { current_time: "always" } } });
  await script.enqueue({ tool_calls: [{ name: "current_time", arguments: {} }] });
  const waiting = await env.api.post("/v1/infer", { session_id: "new", agent_id: "careful-sidebar", text: "Needs a person" });
  await expect(item(page, waiting.session_id).getByTestId("session-status")).toHaveAttribute("data-status", "waiting");

  // Search: titles at once.
  await page.getByTestId("session-search").fill("Background");
  await expect(page.locator("[data-testid=session-item]")).toHaveCount(1);
  await expect(page.locator("[data-testid=session-item]")).toContainText("Background work");
  await page.getByTestId("session-search").fill("");
  await expect(page.locator("[data-testid=session-item]")).not.toHaveCount(1);
});

test("a group chat's transcript shows each member's reply", async ({ page, env, script }) => {
  for (const [id, nickname] of [["ann-agent", "ann"], ["bob-agent", "bob"]]) {
    await env.api.post("/v1/agents", { id, nickname, model_id: "mock" });
  }
  const group = await env.api.post("/v1/groups", { members: ["ann-agent", "bob-agent"], title: "Standup" });
  // One round: both members answer (in parallel, so either may take either reply), no mentions.
  await script.enqueue({ text: "Shipping the console." }, { text: "Reviewing it." });
  await env.api.post(`/v1/groups/${group.session_id}/messages`, { text: "@all status?" });
  await open(page, env, `#/chat/${group.session_id}`);
  const members = page.locator("[data-testid=message][data-role=assistant]");
  await expect(members).toHaveCount(2);
  await expect(members.filter({ hasText: "Shipping the console." })).toHaveCount(1);
  await expect(members.filter({ hasText: "Reviewing it." })).toHaveCount(1);
  const names = await members.evaluateAll((els) => els.map((el) => el.dataset.member).sort());
  expect(names).toEqual(["ann", "bob"]);
  await expect(page.locator("[data-testid=message][data-role=user] [data-testid=message-text]")).toHaveText("@all status?");
  // From the console: the composer posts to the group; only the member named answers.
  await script.enqueue(slowText("Review done, all good.", 40));
  await page.getByTestId("composer").fill("@bob-agent is the review done?");
  await page.getByTestId("send").click();
  await expect(members).toHaveCount(3);
  await expect(members.last()).toContainText("Review done, all good.");
  await expect(members.last()).toHaveAttribute("data-member", "bob");
  await expect(page.getByTestId("stop")).toBeHidden();
  await shot(page, "group-chat");
});
