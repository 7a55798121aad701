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
