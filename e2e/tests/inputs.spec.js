// Inputs and editing: a voice message recorded from the (fake) microphone and sent as WAV;
// models, agents and templates edited in settings (and a model copied), keeping the fields the
// forms do not show; a session renamed and deleted.
import { test, expect, open, pick, shot } from "../support.js";

/** Sends a PUT through the API (setup the console does not do). */
async function put(env, path, body) {
  const response = await fetch(`${env.server.url}${path}`, { method: "PUT", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  if (!response.ok) throw new Error(`PUT ${path}: ${response.status} ${await response.text()}`);
}

test("a voice message is recorded, sent as WAV and played back", async ({ page, env, script }) => {
  await script.enqueue({ text: "I heard a tone." });
  await open(page, env);
  await pick(page, "model:mock");
  const record = page.getByTestId("record");
  await record.click();
  await expect(record).toHaveText(/^Stop 0:0[1-9]/, { timeout: 10_000 });
  await record.click();
  const chip = page.getByTestId("audio-attachment");
  await expect(chip.locator("audio")).toHaveAttribute("src", /^data:audio\/wav;base64,UklGR/);
  await page.getByTestId("composer").fill("Listen to this.");
  await page.getByTestId("send").click();
  await expect(page.locator('[data-testid=message][data-role=assistant]').last()).toContainText("I heard a tone.");
  // The transcript plays the recording back.
  const user = page.locator('[data-testid=message][data-role=user]').last();
  await expect(user.getByTestId("message-audio")).toHaveAttribute("src", /^data:audio\/wav;base64,/);
  await expect(chip).toHaveCount(0);

  // The model (not labelled audio, no speech model registered) got the audio itself, as WAV:
  // 16 kHz, mono, 16 bits, at least a second of it.
  const { requests } = await script.requests();
  const parts = requests[0].body.messages.find((m) => m.role === "user").content;
  expect(parts.find((p) => p.type === "text").text).toBe("Listen to this.");
  const audio = parts.find((p) => p.type === "input_audio").input_audio;
  expect(audio.format).toBe("wav");
  const wav = Buffer.from(audio.data, "base64");
  expect(wav.subarray(0, 4).toString()).toBe("RIFF");
  expect(wav.subarray(8, 12).toString()).toBe("WAVE");
  expect(wav.readUInt16LE(22)).toBe(1);
  expect(wav.readUInt32LE(24)).toBe(16000);
  expect(wav.readUInt16LE(34)).toBe(16);
  expect(wav.readUInt32LE(40)).toBeGreaterThanOrEqual(16000 * 2);
  // A tone, not silence.
  let peak = 0;
  for (let i = 44; i < wav.length; i += 2) peak = Math.max(peak, Math.abs(wav.readInt16LE(i)));
  expect(peak).toBeGreaterThan(1000);
  await shot(page, "chat-voice-message");
});

test("models, agents and templates are edited, and a model copied", async ({ page, env }) => {
  await env.api.post("/v1/agents", { id: "scribe", model_id: "mock", limits: { max_tool_rounds: 4 }, params: { temperature: 0.2 } });
  await env.api.post("/v1/prompt-templates", { name: "greet", template: "Hello {{ name }}" });
  await open(page, env, "#/settings/models");
  const mock = page.locator('[data-testid=row][data-id="mock"]');
  await mock.getByTestId("edit").click();
  const form = page.getByTestId("model-form");
  await expect(form.locator("[name=id]")).toHaveValue("mock");
  await expect(form.locator("[name=id]")).not.toBeEditable();
  await expect(form.locator("[name=model_name]")).toHaveValue("mock-model");
  await form.getByTestId("model-labels").fill("thinking, fast");
  await form.getByTestId("save").click();
  await expect(mock.getByTestId("model-label")).toHaveText(["thinking", "fast"]);
  let saved = await env.api.get("/v1/models/mock");
  expect(saved.labels).toEqual(["thinking", "fast"]);
  expect(saved.base_url).toBe(env.mock.openai_base_url);

  // A copy: the same settings under a new id.
  await mock.getByTestId("copy").click();
  await expect(form.locator("[name=id]")).toHaveValue("mock-copy");
  await form.getByTestId("save").click();
  await expect(page.locator('[data-testid=row][data-id="mock-copy"]')).toBeVisible();
  const copy = await env.api.get("/v1/models/mock-copy");
  expect([copy.model_name, copy.base_url, copy.labels]).toEqual(["mock-model", env.mock.openai_base_url, ["thinking", "fast"]]);
  await shot(page, "settings-models-labels");

  // An agent: its vision model and round limit changed; its parameters (not on the form) kept.
  await page.getByTestId("settings-agents").click();
  await page.locator('[data-testid=row][data-id="scribe"]').getByTestId("edit").click();
  const agent = page.getByTestId("agent-form");
  await expect(agent.locator("[name=max_tool_rounds]")).toHaveValue("4");
  await agent.locator("[name=vision_model_id]").selectOption("mock-copy");
  await agent.locator("[name=max_tool_rounds]").fill("6");
  await agent.getByTestId("save").click();
  await expect(page.getByText("Agent scribe saved.")).toBeVisible();
  const scribe = await env.api.get("/v1/agents/scribe");
  expect(scribe.vision_model_id).toBe("mock-copy");
  expect(scribe.limits.max_tool_rounds).toBe(6);
  expect(scribe.params.temperature).toBeCloseTo(0.2);

  // A template's text.
  await page.getByTestId("settings-templates").click();
  await page.locator('[data-testid=row][data-id="greet"]').getByTestId("edit").click();
  const template = page.getByTestId("template-form");
  await expect(template.locator("[name=template]")).toHaveValue("Hello {{ name }}");
  await template.locator("[name=template]").fill("Good morning {{ name }}");
  await template.getByTestId("save").click();
  await expect(page.locator('[data-testid=row][data-id="greet"]')).toContainText("Good morning");
  expect((await env.api.get("/v1/prompt-templates/greet")).template).toBe("Good morning {{ name }}");

  // Leave the shared server as it was.
  await env.api.del("/v1/agents/scribe");
  await env.api.del("/v1/prompt-templates/greet");
  await env.api.del("/v1/models/mock-copy");
  await put(env, "/v1/models/mock", { ...saved, labels: [] });
});

test("a session is renamed and deleted", async ({ page, env, script }) => {
  await script.enqueue({ text: "Hi there." });
  await open(page, env);
  await pick(page, "model:mock");
  await page.getByTestId("composer").fill("Hello");
  await page.getByTestId("send").click();
  await expect(page.locator('[data-testid=message][data-role=assistant]').last()).toContainText("Hi there.");
  await expect(page).toHaveURL(/#\/chat\/[0-9a-f-]{36}$/);
  const id = page.url().split("/").pop();
  await page.getByTestId("rename-session").click();
  await page.getByTestId("title-input").fill("Planning the launch");
  await page.getByTestId("title-input").press("Enter");
  const item = page.locator(`[data-testid=session-item][data-session-id="${id}"]`);
  await expect(item.getByTestId("session-title")).toHaveText("Planning the launch");
  await expect.poll(async () => (await env.api.get(`/v1/sessions/${id}`)).session.title).toBe("Planning the launch");
  // Escape keeps the title.
  await page.getByTestId("rename-session").click();
  await page.getByTestId("title-input").fill("Something else");
  await page.getByTestId("title-input").press("Escape");
  await expect(page.locator(".chat-head h1")).toHaveText("Planning the launch");

  page.once("dialog", (dialog) => dialog.accept());
  await page.getByTestId("delete-session").click();
  await expect(page).toHaveURL(/#\/chat$/);
  await expect(item).toHaveCount(0);
  const response = await fetch(`${env.server.url}/v1/sessions/${id}`);
  expect(response.status).toBe(404);
});
