// Login when auth is on (a server of its own: creating a key turns auth on), themes, and a
// narrow screen.
import { test, expect, shot, startServer, client } from "../support.js";

test("a server with API keys asks for one, and the console signs in with it", async ({ page }) => {
  const server = await startServer();
  try {
    const api = client(server.url);
    const created = await api.post("/v1/api-keys", { label: "e2e" });
    expect(created.key).toMatch(/^agk_/);
    await page.goto(`${server.url}/#/chat`);
    const login = page.getByTestId("login");
    await expect(login).toBeVisible();
    await shot(page, "login");
    await login.locator("[name=key]").fill("agk_000000000000_wrong");
    await page.getByTestId("login-submit").click();
    await expect(login.getByTestId("form-error")).not.toBeEmpty();
    await login.locator("[name=key]").fill(created.key);
    await page.getByTestId("login-submit").click();
    await expect(page.getByTestId("chat")).toBeVisible();
    await expect(page.getByTestId("sidebar")).toBeVisible();
    // The key list shows it, never the key itself.
    await page.getByTestId("nav-settings").click();
    await page.getByTestId("settings-keys").click();
    await expect(page.locator(`[data-testid=row][data-id="${created.id}"]`)).toContainText("e2e");
    await expect(page.locator("body")).not.toContainText(created.key);
  } finally {
    await server.stop();
  }
});

test("a user key made in the console sees only its own sessions", async ({ page, env, script }) => {
  const server = await startServer();
  try {
    const admin = await client(server.url).post("/v1/api-keys", { label: "admin" });
    const api = client(server.url, admin.key);
    await api.post("/v1/models", { id: "mock", protocol: "openai", base_url: env.mock.openai_base_url, model_name: "mock-model" });
    await script.enqueue({ text: "Noted." });
    const theirs = await api.post("/v1/infer", { session_id: "new", text: "the admin's private plans" });
    // The admin signs in and makes a `user` key in Settings.
    await page.goto(`${server.url}/#/chat`);
    await page.getByTestId("login").locator("[name=key]").fill(admin.key);
    await page.getByTestId("login-submit").click();
    await expect(page.locator(`[data-testid=session-item][data-session-id="${theirs.session_id}"]`)).toBeVisible();
    await page.getByTestId("nav-settings").click();
    await page.getByTestId("settings-keys").click();
    const form = page.getByTestId("key-form");
    await form.locator("[name=label]").fill("alice");
    await expect(form.locator("[name=role]")).toHaveValue("user");
    await form.getByTestId("save").click();
    const userKey = (await page.getByTestId("new-key").textContent()).trim();
    expect(userKey).toMatch(/^agk_/);
    await shot(page, "settings-user-key");
    // Its row shows each quota's use against its limit.
    await page.getByTestId("settings-agents").click();
    await page.getByTestId("settings-keys").click();
    const keyRow = page.locator(`[data-testid=row][data-id="${userKey.split("_")[1]}"]`);
    await expect(keyRow.getByTestId("key-quotas")).toContainText("live runs 0/16");
    await expect(keyRow.getByTestId("key-quotas")).toContainText("sandboxes 0/8");
    await shot(page, "settings-key-quotas");
    // Signed in with it, the console lists none of the admin's sessions, and the API denies it.
    await page.locator("#logout").click();
    await page.getByTestId("login").locator("[name=key]").fill(userKey);
    await page.getByTestId("login-submit").click();
    await expect(page.getByTestId("sidebar")).toBeVisible();
    await expect(page.getByTestId("session-item")).toHaveCount(0);
    await expect(client(server.url, userKey).get(`/v1/sessions/${theirs.session_id}`)).rejects.toThrow(/404/);
    await expect(client(server.url, userKey).get("/v1/api-keys")).rejects.toThrow(/403/);
  } finally {
    await server.stop();
  }
});

test("themes switch, and a narrow screen hides the sidebar behind a button", async ({ page, env }) => {
  await page.emulateMedia({ colorScheme: "light" });
  await page.goto(`${env.server.url}/#/chat`);
  await expect(page.getByTestId("sidebar")).toBeVisible();
  const html = page.locator("html");
  await expect(html).toHaveAttribute("data-theme", "light");
  await shot(page, "theme-light");
  await page.getByTestId("theme-toggle").click();
  await expect(html).toHaveAttribute("data-theme", "dark");
  await shot(page, "theme-dark");
  // Kept across a reload.
  await page.reload();
  await expect(html).toHaveAttribute("data-theme", "dark");
  await page.getByTestId("theme-toggle").click();
  await expect(html).toHaveAttribute("data-theme", "light");

  await page.setViewportSize({ width: 390, height: 800 });
  await expect(page.getByTestId("sidebar")).not.toBeInViewport();
  await page.getByRole("button", { name: "Sessions" }).click();
  await expect(page.getByTestId("sidebar")).toBeInViewport();
  await shot(page, "narrow-screen");
});
