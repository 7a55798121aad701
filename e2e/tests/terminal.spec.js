// The terminal panel: a real shell in the session's sandbox, typed into; a dropped connection
// re-attached with its screen; tabs opened and closed.
import { test, expect, open, shot } from "../support.js";

test("a typed command's output shows, and survives a dropped connection", async ({ page, env, script }) => {
  await script.enqueue({ text: "Hi." });
  const run = await env.api.post("/v1/infer", { session_id: "new", model_id: "mock", text: "hello" });
  // Keep the page's WebSockets at hand, to drop them as a failing network would.
  await page.addInitScript(() => {
    // The page's CSP must let the terminal render: no violation may be reported.
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (event) => window.__violations.push(event.violatedDirective));
    const Native = window.WebSocket;
    window.__sockets = [];
    window.WebSocket = class extends Native {
      constructor(...args) { super(...args); window.__sockets.push(this); }
    };
  });
  await open(page, env, `#/chat/${run.session_id}`);
  await page.getByTestId("open-terminal").click();
  const panel = page.getByTestId("terminal-panel");
  const tab = panel.getByTestId("terminal-tab");
  await expect(tab).toHaveCount(1);
  await expect(tab).toHaveAttribute("data-state", "live");
  const screen = panel.locator("[data-testid=terminal-body]:not(.hidden) .xterm-rows");
  await panel.locator("[data-testid=terminal-body]:not(.hidden) .xterm").click();
  await page.keyboard.type("echo hello-$((6*7)) in $PWD");
  await page.keyboard.press("Enter");
  await expect(screen).toContainText("hello-42 in /workspace");
  // The renderer's theme styles applied (their `<style>` elements carry the page's nonce).
  expect(await page.evaluate(() => window.__violations)).toEqual([]);
  expect(await page.evaluate(() => [...document.querySelectorAll("style")].every((style) => style.sheet !== null))).toBe(true);
  await shot(page, "terminal");

  // The connection drops: the panel connects again, the screen comes back, typing goes on.
  await page.evaluate(() => window.__sockets.forEach((socket) => socket.close()));
  await expect.poll(() => page.evaluate(() => window.__sockets.length)).toBe(2);
  await expect(tab).toHaveAttribute("data-state", "live");
  await expect(screen).toContainText("hello-42 in /workspace");
  await panel.locator("[data-testid=terminal-body]:not(.hidden) .xterm").click();
  await page.keyboard.type("echo again-$((7*6))");
  await page.keyboard.press("Enter");
  await expect(screen).toContainText("again-42");

  // Another tab; closing one kills its terminal on the server.
  await panel.getByTestId("terminal-new").click();
  await expect(tab).toHaveCount(2);
  await expect(tab.last()).toHaveAttribute("data-state", "live");
  await tab.last().getByTestId("terminal-close").click();
  await expect(tab).toHaveCount(1);
  const listed = await env.api.get(`/v1/terminals?session_id=${run.session_id}`);
  expect(listed.terminals.length).toBe(1);
});
