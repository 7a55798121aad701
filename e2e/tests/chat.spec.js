// Chat: a streamed answer and a tool capsule; approvals inline (approve, reject with a reason,
// edit the arguments); stop; fork; the run trace.
import { test, expect, open, pick, offer, shot, slowText } from "../support.js";

const ANSWER = "The time is **noon** in Paris. Here is how I found it:\n\n```js\nconst now = new Date(); // the clock\n```\n\nAnything else?";

test("a message gets a streamed answer and a tool capsule", async ({ page, env, script }) => {
  await script.enqueue(
    { tool_calls: [{ name: "current_time", arguments: { timezone: "+01:00" } }] },
    slowText(ANSWER),
  );
  await open(page, env);
  await pick(page, "model:mock");
  // Least privilege: the run gets exactly the tools checked (none unless some are).
  await expect(page.locator("[data-testid=tool-picker] button")).toHaveText("No tools");
  await offer(page, "current_time");
  await expect(page.locator("[data-testid=tool-picker] button")).toHaveText("1 tool");
  await page.getByTestId("composer").fill("What time is it in Paris?");
  await page.getByTestId("send").click();

  const user = page.locator('[data-testid=message][data-role=user]');
  await expect(user.getByTestId("message-text")).toHaveText("What time is it in Paris?");
  const capsule = page.locator('[data-testid=tool-capsule][data-tool=current_time]');
  await expect(capsule).toHaveAttribute("data-state", "ok");
  // The answer streams in: seen part-way, then whole.
  const answer = page.locator('[data-testid=message][data-role=assistant] [data-testid=message-text]').last();
  await expect(page.getByTestId("stop")).toBeVisible();
  await expect.poll(async () => {
    const text = (await answer.textContent()) || "";
    return text.length > 0 && !text.includes("Anything else?");
  }, { message: "a partial answer is shown while it streams" }).toBe(true);
  await expect(answer).toContainText("Anything else?");
  await expect(page.getByTestId("stop")).toBeHidden();
  // Markdown: bold and a highlighted code block, as elements (never raw HTML).
  await expect(answer.locator("strong")).toHaveText("noon");
  await expect(answer.locator("pre code .tok-k").first()).toHaveText("const");
  // The capsule opens on its arguments and result.
  await capsule.locator("summary").click();
  await expect(capsule.getByTestId("tool-details")).toBeVisible();
  await expect(capsule.getByTestId("tool-args")).toContainText('"timezone": "+01:00"');
  await expect(capsule.getByTestId("tool-result")).toContainText("+01:00");
  // The session is in the sidebar, done, and the URL names it.
  await expect(page).toHaveURL(/#\/chat\/[0-9a-f-]{36}$/);
  const id = page.url().split("/").pop();
  const item = page.locator(`[data-testid=session-item][data-session-id="${id}"]`);
  await expect(item.getByTestId("session-status")).toHaveAttribute("data-status", "done");
  // What the model was sent: the tool's result in the second request.
  const sent = await script.requests();
  expect(sent.count).toBe(2);
  expect(JSON.stringify(sent.requests[1].body.messages)).toContain("+01:00");
  // Exactly the checked tool was offered.
  expect(sent.requests[0].body.tools.map((t) => t.function.name)).toEqual(["current_time"]);
  await shot(page, "chat-streamed-answer-and-tool-capsule");

  // The trace shows the model calls and the tool call.
  await page.getByTestId("open-trace").click();
  await expect(page.getByTestId("trace")).toBeVisible();
  await expect(page.locator('[data-testid=trace-row][data-kind=model]')).toHaveCount(2);
  await expect(page.locator('[data-testid=trace-row][data-kind=tool]')).toHaveCount(1);
  await expect(page.locator('[data-testid=trace-row][data-kind=tool]')).toContainText("current_time");
  await shot(page, "trace");
});

async function carefulAgent(env, id) {
  await env.api.post("/v1/agents", {
    id, model_id: "mock", tool_ids: ["current_time"],
    approvals: { tools: { current_time: "always" } },
  }).catch((error) => { if (!String(error).includes("409")) throw error; });
}

test("a call waiting for approval is approved inline", async ({ page, env, script }) => {
  await carefulAgent(env, "careful");
  await script.enqueue({ tool_calls: [{ name: "current_time", arguments: {} }] }, { text: "Approved and done." });
  await open(page, env);
  await pick(page, "agent:careful");
  await page.getByTestId("composer").fill("Check the clock");
  await page.keyboard.press("Control+Enter");

  const approval = page.getByTestId("approval");
  await expect(approval).toBeVisible();
  const capsule = page.locator("[data-testid=tool-capsule][data-tool=current_time]");
  await expect(capsule).toHaveAttribute("data-state", "waiting");
  const id = page.url().split("/").pop();
  await expect(page.locator(`[data-testid=session-item][data-session-id="${id}"] [data-testid=session-status]`)).toHaveAttribute("data-status", "waiting");
  await shot(page, "chat-approval-waiting");
  await approval.getByTestId("approve").click();
  await expect(capsule).toHaveAttribute("data-state", "ok");
  await expect(page.locator('[data-testid=message][data-role=assistant] [data-testid=message-text]').last()).toHaveText("Approved and done.");
  await expect(approval).toContainText("Approved");
});

test("a rejected call gives the model the reason, an edited one runs with the new arguments", async ({ page, env, script }) => {
  await carefulAgent(env, "careful");
  await script.enqueue(
    { tool_calls: [{ name: "current_time", arguments: {} }] },
    { text: "Fine, I will not look." },
    { tool_calls: [{ name: "current_time", arguments: {} }] },
    { text: "Checked with your offset." },
  );
  await open(page, env);
  await pick(page, "agent:careful");
  await page.getByTestId("composer").fill("Check the clock");
  await page.getByTestId("send").click();
  const first = page.getByTestId("approval").first();
  await first.getByTestId("reject-reason").fill("not now, thanks");
  await first.getByTestId("reject").click();
  await expect(page.locator("[data-testid=tool-capsule]").first()).toHaveAttribute("data-state", "error");
  await expect(page.locator('[data-testid=message][data-role=assistant] [data-testid=message-text]').last()).toHaveText("Fine, I will not look.");
  let sent = await script.requests();
  expect(JSON.stringify(sent.requests[1].body.messages)).toContain("not now, thanks");

  // Same session, next turn: edit the arguments.
  await page.getByTestId("composer").fill("Now with my offset");
  await page.getByTestId("send").click();
  const second = page.getByTestId("approval").nth(1);
  await second.getByTestId("edit").click();
  await second.getByTestId("edit-args").fill('{"timezone": "+05:30"}');
  await second.getByTestId("edit-submit").click();
  const capsule = page.locator("[data-testid=tool-capsule]").nth(1);
  await expect(capsule).toHaveAttribute("data-state", "ok");
  await capsule.locator("summary").click();
  await expect(capsule.getByTestId("tool-result")).toContainText("+05:30");
  await expect(page.locator('[data-testid=message][data-role=assistant] [data-testid=message-text]').last()).toHaveText("Checked with your offset.");
  sent = await script.requests();
  expect(JSON.stringify(sent.requests[3].body.messages)).toContain("+05:30");
});

test("stop ends the run, continue and fork go on", async ({ page, env, script }) => {
  await script.enqueue(slowText("word ".repeat(400), 80), { text: "Continued." });
  await open(page, env);
  await pick(page, "model:mock");
  await page.getByTestId("composer").fill("Write a lot");
  await page.getByTestId("send").click();
  await expect(page.getByTestId("stop")).toBeVisible();
  await expect(page.locator('[data-testid=message][data-role=assistant]').last()).toContainText("word");
  await page.keyboard.press("Escape");
  await expect(page.getByTestId("continue")).toBeVisible();
  await page.getByTestId("continue").click();
  await expect(page.locator('[data-testid=message][data-role=assistant] [data-testid=message-text]').last()).toHaveText("Continued.");
  // Fork from the first message: a new session holding only it.
  const original = page.url().split("/").pop();
  await page.locator("[data-testid=message][data-role=user]").first().hover();
  await page.locator("[data-testid=message][data-role=user] [data-testid=fork]").first().click();
  await expect(page).not.toHaveURL(new RegExp(original));
  await expect(page.locator("[data-testid=message][data-role=user]")).toHaveCount(1);
  await expect(page.locator("[data-testid=message][data-role=assistant]")).toHaveCount(0);
});

test("a delegated task's progress shows nested in the delegate capsule", async ({ page, env, script }) => {
  await script.enqueue(
    { tool_calls: [{ name: "delegate", arguments: { task: "Summarise the plan in one line." } }] },
    slowText("The plan: ship the console, then rest.", 60),
    { text: "My helper says: ship the console, then rest." },
  );
  await open(page, env);
  await pick(page, "model:mock");
  await page.locator("[data-testid=tool-picker] button").click();
  await page.locator('input[type=checkbox][data-tool="delegate"]').check();
  await page.getByTestId("composer").fill("Ask a helper for the plan");
  await page.getByTestId("send").click();
  const capsule = page.locator("[data-testid=tool-capsule][data-tool=delegate]");
  const nested = capsule.getByTestId("nested-run");
  await expect(nested).toBeVisible();
  await expect(nested).toContainText("The plan: ship the console, then rest.");
  await expect(capsule).toHaveAttribute("data-state", "ok");
  await expect(page.locator("[data-testid=message][data-role=assistant] [data-testid=message-text]").last()).toHaveText("My helper says: ship the console, then rest.");
  // Only the delegate tool was offered.
  const sent = await script.requests();
  const offered = sent.requests[0].body.tools.map((t) => t.function.name);
  expect(offered).toEqual(["delegate"]);
  await shot(page, "chat-delegate-nested");
});

test("an attached image goes to the model and shows in the message", async ({ page, env, script }) => {
  // A 1×1 PNG.
  const png = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==", "base64");
  await script.enqueue({ text: "A single pixel." });
  await open(page, env);
  await pick(page, "model:mock");
  await page.getByTestId("attach").setInputFiles({ name: "pixel.png", mimeType: "image/png", buffer: png });
  await expect(page.locator(".thumbs img")).toHaveCount(1);
  await page.getByTestId("composer").fill("What is in this image?");
  await page.getByTestId("send").click();
  await expect(page.locator("[data-testid=message][data-role=assistant] [data-testid=message-text]").last()).toHaveText("A single pixel.");
  await expect(page.locator("[data-testid=message][data-role=user] img.attachment")).toHaveCount(1);
  await expect(page.locator(".thumbs img")).toHaveCount(0);
  const sent = await script.requests();
  const content = JSON.stringify(sent.requests[0].body.messages);
  expect(content).toContain("image_url");
  expect(content).toContain(png.toString("base64").slice(0, 40));
});

test("messages dropped to fit the context window are announced where it happened", async ({ page, env, script }) => {
  // No summary model: a compaction drops the oldest messages, and the chat says so.
  await env.api.post("/v1/agents", { id: "forgetful", model_id: "mock", compaction: { keep_recent: 1 } })
    .catch((error) => { if (!String(error).includes("409")) throw error; });
  await script.enqueue({ text: "answer 0" }, { text: "answer 1" });
  await open(page, env);
  await pick(page, "agent:forgetful");
  const answers = page.locator("[data-testid=message][data-role=assistant] [data-testid=message-text]");
  for (const i of [0, 1]) {
    await page.getByTestId("composer").fill(`question ${i}`);
    await page.getByTestId("send").click();
    await expect(answers.last()).toHaveText(`answer ${i}`);
  }
  // The provider says the context is too long: the run compacts once and retries.
  await script.enqueue(
    { status: 400, error: { error: { message: "This model's maximum context length is 8192 tokens.",
      type: "invalid_request_error", code: "context_length_exceeded" } } },
    { text: "answer 2" },
  );
  await page.getByTestId("composer").fill("question 2");
  await page.getByTestId("send").click();
  await expect(answers.last()).toHaveText("answer 2");
  const notice = page.getByTestId("compaction-notice");
  await expect(notice).toHaveCount(1);
  await expect(notice).toHaveText(/^\d+ earlier messages? (was|were) dropped to fit the context window/);
  await expect(notice).not.toHaveAttribute("data-dropped", "0");
  // It stays where the compaction happened, also after the page is reloaded.
  await page.reload();
  await expect(page.getByTestId("compaction-notice")).toHaveText(/earlier messages? (was|were) dropped to fit the context window/);
  await shot(page, "chat-messages-dropped");
});
