// Two tabs on one session see the same live run, and an approval decided in one is decided in
// the other.
import { test, expect, open, pick, shot, slowText } from "../support.js";

test("two tabs on one session follow the same live run", async ({ browser, env, script }) => {
  // A session to open in both tabs.
  await script.enqueue({ text: "Ready." });
  const made = await env.api.post("/v1/infer", { session_id: "new", model_id: "mock", text: "Hello" });
  const id = made.session_id;
  const context = await browser.newContext();
  const one = await context.newPage();
  const two = await context.newPage();
  await open(one, env, `#/chat/${id}`);
  await open(two, env, `#/chat/${id}`);
  await expect(two.locator("[data-testid=message][data-role=assistant]")).toHaveCount(1);

  await script.enqueue(slowText("Both tabs see this answer arrive, word by word, while it is written.", 90));
  await pick(one, "model:mock");
  await one.getByTestId("composer").fill("Tell both tabs");
  await one.getByTestId("send").click();
  // The other tab attaches to the live run: it sees the text grow, then the whole answer.
  const mirrored = two.locator("[data-testid=message][data-role=assistant] [data-testid=message-text]").nth(1);
  await expect.poll(async () => {
    const text = (await mirrored.textContent()) || "";
    return text.length > 0 && !text.endsWith("written.");
  }, { message: "the second tab shows the answer while it streams" }).toBe(true);
  await expect(mirrored).toHaveText("Both tabs see this answer arrive, word by word, while it is written.");
  await expect(two.locator("[data-testid=message][data-role=user] [data-testid=message-text]").nth(1)).toHaveText("Tell both tabs");
  await shot(two, "two-tabs-second-tab");

  // An approval: asked in both, decided in the second, seen decided in the first.
  await env.api.post("/v1/agents", { id: "careful-tabs", model_id: "mock", tool_ids: ["current_time"], approvals: { tools: { current_time: "always" } } });
  await one.reload();
  await expect(one.getByTestId("sidebar")).toBeVisible();
  await script.enqueue({ tool_calls: [{ name: "current_time", arguments: {} }] }, { text: "Done in both." });
  await pick(one, "agent:careful-tabs");
  await one.getByTestId("composer").fill("Check the clock");
  await one.getByTestId("send").click();
  await expect(one.getByTestId("approval")).toBeVisible();
  await expect(two.getByTestId("approval")).toBeVisible();
  await two.getByTestId("approval").getByTestId("approve").click();
  await expect(one.getByTestId("approval")).toContainText("Approved");
  await expect(one.locator("[data-testid=message][data-role=assistant] [data-testid=message-text]").last()).toHaveText("Done in both.");
  await expect(two.locator("[data-testid=message][data-role=assistant] [data-testid=message-text]").last()).toHaveText("Done in both.");
  await context.close();
});
