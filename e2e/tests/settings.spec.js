// Settings: a model created and tested, an agent created on it; both reach the chat's picker.
// Every section renders (and is saved as a screenshot).
import { test, expect, open, shot } from "../support.js";

test("a model and an agent are created in settings", async ({ page, env, script }) => {
  await open(page, env, "#/settings/models");
  await expect(page.getByTestId("settings")).toBeVisible();
  const form = page.getByTestId("model-form");
  // A bad one first: the server's reason is shown.
  await form.locator("[name=id]").fill("bad model!");
  await form.locator("[name=model_name]").fill("x");
  await form.getByTestId("save").click();
  await expect(form.getByTestId("form-error")).not.toBeEmpty();

  await form.locator("[name=id]").fill("second");
  await form.locator("[name=protocol]").selectOption("openai");
  await form.locator("[name=model_name]").fill("second-model");
  await form.locator("[name=base_url]").fill(env.mock.openai_base_url);
  await form.locator("[name=context_window]").fill("32000");
  await form.getByTestId("save").click();
  const row = page.locator('[data-testid=row][data-id="second"]');
  await expect(row).toContainText("second-model");
  // The connection test reaches the mock.
  await script.enqueue({ text: "pong" });
  await row.getByTestId("test").click();
  await expect(row.getByTestId("test-result")).toHaveAttribute("data-ok", "true");
  await shot(page, "settings-models");

  await page.getByTestId("settings-agents").click();
  const agent = page.getByTestId("agent-form");
  await agent.locator("[name=id]").fill("writer");
  await agent.locator("[name=nickname]").fill("wri");
  await agent.locator("[name=model_id]").selectOption("second");
  await agent.locator("[name=tool_ids]").fill("current_time");
  await agent.locator("[name=labels]").fill("docs, prose");
  await agent.locator("[name=system]").fill("You write clearly.");
  await agent.getByTestId("save").click();
  await expect(page.locator('[data-testid=row][data-id="writer"]')).toContainText("@wri");
  const saved = await env.api.get("/v1/agents/writer");
  expect(saved.model_id).toBe("second");
  expect(saved.labels).toEqual(["docs", "prose"]);
  expect(saved.tool_ids).toEqual(["current_time"]);
  await shot(page, "settings-agents");

  // Both are offered in the chat.
  await page.getByTestId("nav-chat").click();
  const picker = page.getByTestId("model-picker");
  await expect(picker.locator('option[value="model:second"]')).toHaveCount(1);
  await expect(picker.locator('option[value="agent:writer"]')).toHaveCount(1);
});

test("every settings section renders", async ({ page, env, script }) => {
  await env.api.post("/v1/prompt-templates", { name: "review", template: "Review this {{ language }} code:\n{{ code }}" }).catch(() => {});
  for (const section of ["models", "tools", "mcp", "skills", "templates", "agents", "secrets", "keys", "sandbox"]) {
    await open(page, env, `#/settings/${section}`);
    await expect(page.getByTestId(`settings-${section}`)).toHaveClass(/active/);
    await expect(page.locator(".settings section h2")).not.toBeEmpty();
    await expect(page.locator(".settings section .load-error")).toHaveCount(0);
    await shot(page, `settings-${section}`);
  }
  // A tool's call test.
  await open(page, env, "#/settings/tools");
  const row = page.locator('[data-testid=row][data-id="current_time"]');
  await row.getByTestId("call").click();
  await row.getByRole("button", { name: "Run" }).click();
  await expect(row.getByTestId("call-result")).toContainText("unix_seconds");
  // A secret is write-only: listed, never shown.
  await open(page, env, "#/settings/secrets");
  const secret = page.getByTestId("secret-form");
  await secret.locator("[name=name]").fill("E2E_TOKEN");
  await secret.locator("[name=value]").fill("very-secret-value");
  await secret.getByTestId("save").click();
  await expect(page.locator('[data-testid=row][data-id="E2E_TOKEN"]')).toBeVisible();
  await expect(page.locator("body")).not.toContainText("very-secret-value");
  // One bound to hosts lists them.
  await secret.locator("[name=name]").fill("E2E_BOUND");
  await secret.locator("[name=value]").fill("another-secret-value");
  await secret.locator("[name=hosts]").fill("api.example.com, *.example.org");
  await secret.getByTestId("save").click();
  await expect(page.locator('[data-testid=row][data-id="E2E_BOUND"]')).toContainText("only to api.example.com, *.example.org");
  await expect(page.locator("body")).not.toContainText("another-secret-value");
  // The template picker in the chat asks for each variable.
  await open(page, env, "#/chat");
  await page.getByTestId("template-picker").selectOption("review");
  await expect(page.locator("input[data-var=language]")).toBeVisible();
  await expect(page.locator("input[data-var=code]")).toBeVisible();
});

test("a skill folder is registered in settings and removed", async ({ page, env }) => {
  const { mkdirSync, writeFileSync, realpathSync } = await import("node:fs");
  const folder = `${env.server.home}/skills/tidy`;
  mkdirSync(folder, { recursive: true });
  writeFileSync(`${folder}/SKILL.md`, "---\nname: tidy\ndescription: Tidies folders.\n---\nSort everything.\n");
  await open(page, env, "#/settings/skills");
  const form = page.getByTestId("skill-form");
  await form.locator("[name=path]").fill("/no/such/folder");
  await form.getByTestId("save").click();
  await expect(form.getByTestId("form-error")).not.toBeEmpty();
  await form.locator("[name=path]").fill(folder);
  await form.getByTestId("save").click();
  const row = page.locator('[data-testid=row][data-id="tidy"]');
  await expect(row).toContainText("Tidies folders.");
  expect((await env.api.get("/v1/skills")).skills).toEqual([{ name: "tidy", description: "Tidies folders.", path: realpathSync(folder) }]);
  page.once("dialog", (dialog) => dialog.accept());
  await row.getByTestId("delete").click();
  await expect(row).toHaveCount(0);
  expect((await env.api.get("/v1/skills")).skills).toEqual([]);
});

test("a model's API key secret is created from its field, and the model is saved with it", async ({ page, env, script }) => {
  await open(page, env, "#/settings/models");
  const form = page.getByTestId("model-form");
  await form.locator("[name=id]").fill("keyed");
  await form.locator("[name=model_name]").fill("keyed-model");
  await form.locator("[name=base_url]").fill(env.mock.openai_base_url);
  // The field takes a secret's name; New secret… makes one without leaving the form.
  await form.getByTestId("new-secret").click();
  const dialog = page.getByTestId("secret-dialog");
  await expect(dialog).toBeVisible();
  await dialog.locator("[name=name]").fill("KEYED_API_KEY");
  await dialog.locator("[name=value]").fill("sk-inline-test");
  await dialog.getByTestId("save").click();
  await expect(dialog).toHaveCount(0);
  await expect(form.locator("[name=api_key_secret]")).toHaveValue("KEYED_API_KEY");
  const { secrets } = await env.api.get("/v1/env");
  expect(secrets.map((s) => s.name)).toContain("KEYED_API_KEY");
  await shot(page, "settings-model-with-new-secret");

  await form.getByTestId("save").click();
  const row = page.locator('[data-testid=row][data-id="keyed"]');
  await expect(row).toContainText("keyed-model");
  const { models } = await env.api.get("/v1/models");
  expect(models.find((m) => m.id === "keyed").api_key_secret).toBe("KEYED_API_KEY");
  // Saved (a model naming a secret that is not set is refused), and it reaches its provider.
  await script.enqueue({ text: "pong" });
  await row.getByTestId("test").click();
  await expect(row.getByTestId("test-result")).toHaveAttribute("data-ok", "true");

  // The same field on an MCP server's form and beside an HTTP tool's definition.
  await page.getByTestId("settings-mcp").click();
  await expect(page.getByTestId("mcp-form").getByTestId("new-secret")).toHaveCount(1);
  await page.getByTestId("settings-tools").click();
  await page.getByTestId("tool-secret-header").fill("Authorization");
  await page.getByTestId("tool-secret-name").fill("KEYED_API_KEY");
  await page.getByTestId("tool-form").locator("[name=definition]").fill('{"name": "weather", "kind": "http", "url": "https://example.com/w"}');
  await page.getByTestId("add-secret-header").click();
  expect(JSON.parse(await page.getByTestId("tool-form").locator("[name=definition]").inputValue()).headers)
    .toEqual({ Authorization: { secret: "KEYED_API_KEY" } });
  await env.api.del("/v1/models/keyed");
  await env.api.del("/v1/env/KEYED_API_KEY");
});
