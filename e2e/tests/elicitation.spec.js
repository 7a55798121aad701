// An MCP server asking for input during a tool call: the console shows its form inline in the
// call's capsule, and the answer reaches the server's tool. Uses server-everything as installed
// by scripts/install-mcp-servers (AGENTRY_MCP_SERVERS, default target/mcp-servers).
import { existsSync, realpathSync } from "node:fs";
import { join, resolve } from "node:path";
import { test, expect, open, pick, offer, shot } from "../support.js";

// The server runs in a sandbox of its own, which shows the installed servers read-only at their
// real path (support.js passes `--sandbox-ro-mount`).
const given = resolve(process.env.AGENTRY_MCP_SERVERS || join(import.meta.dirname, "..", "..", "target", "mcp-servers"));
const servers = existsSync(given) ? realpathSync(given) : given;
const everything = join(servers, "npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js");

test("an MCP server's request for input is answered inline", async ({ page, env, script }) => {
  expect(existsSync(everything), `server-everything is installed at ${everything} (scripts/install-mcp-servers)`).toBe(true);
  await env.api.post("/v1/tools/mcp", { mcpServers: { everything: { command: process.execPath, args: [everything, "stdio"] } } });
  const tool = "everything__trigger-elicitation-request";
  await expect.poll(async () => (await env.api.get("/v1/tools")).tools.some((t) => t.name === tool), { timeout: 20_000 }).toBe(true);

  await script.enqueue({ tool_calls: [{ name: tool, arguments: {} }] }, { text: "Thanks, Ada." });
  await open(page, env);
  await pick(page, "model:mock");
  await offer(page, tool);
  await page.getByTestId("composer").fill("Ask me for my details");
  await page.getByTestId("send").click();

  const asked = page.getByTestId("elicitation");
  await expect(asked).toBeVisible();
  await expect(asked).toContainText("everything asks");
  const capsule = page.locator(`[data-testid=tool-capsule][data-tool="${tool}"]`);
  await expect(capsule).toHaveAttribute("data-state", "waiting");
  const id = page.url().split("/").pop();
  await expect(page.locator(`[data-testid=session-item][data-session-id="${id}"] [data-testid=session-status]`)).toHaveAttribute("data-status", "waiting");
  await asked.locator("[data-field=name]").fill("Ada Lovelace");
  await asked.locator("[data-field=check]").check();
  await shot(page, "chat-mcp-elicitation");
  await asked.getByTestId("approve").click();

  await expect(asked).toHaveCount(0);
  await expect(capsule).toHaveAttribute("data-state", "ok");
  await capsule.locator("summary").click();
  await expect(capsule.getByTestId("tool-result")).toContainText("Name: Ada Lovelace");
  await expect(page.locator("[data-testid=message][data-role=assistant] [data-testid=message-text]").last()).toHaveText("Thanks, Ada.");
  await env.api.del("/v1/mcp-servers/everything");
});
