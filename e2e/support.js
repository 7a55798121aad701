// Fixtures: the mock provider and an `agentry serve` on a fresh data folder, started once per
// worker; helpers to script the mock and call the API; screenshots under
// target/console-screenshots/.
import { test as base, expect } from "@playwright/test";
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, mkdirSync, realpathSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const target = process.env.CARGO_TARGET_DIR ? resolve(process.env.CARGO_TARGET_DIR) : join(root, "target");
const bin = (name) => process.env[`AGENTRY_E2E_${name.toUpperCase().replace("-", "_")}`] || join(target, "debug", name);
export const SCREENSHOTS = join(target, "console-screenshots");
mkdirSync(SCREENSHOTS, { recursive: true });

/** A full-page screenshot, saved under its name. */
export async function shot(page, name) {
  await page.screenshot({ path: join(SCREENSHOTS, `${name}.png`), fullPage: true });
}

function freePort() {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => ok(port));
    });
    server.on("error", fail);
  });
}

/** Starts the testkit's mock provider; resolves with its URLs and a stop(). */
export function startMock() {
  return new Promise((ok, fail) => {
    const child = spawn(bin("agentry-mock"), [], { stdio: ["pipe", "pipe", "inherit"] });
    let out = "";
    child.on("error", fail);
    child.stdout.on("data", (chunk) => {
      out += chunk;
      const line = out.split("\n")[0];
      if (out.includes("\n")) {
        const urls = JSON.parse(line);
        ok({ ...urls, stop: () => { child.stdin.end(); child.kill(); } });
      }
    });
  });
}

/**
 * What stdio MCP servers registered by the tests need to see inside their sandboxes (they run in
 * one each): the installed test servers, and node's install folder when it is not a system one;
 * and the Python the code interpreter's kernels run with.
 */
function sandboxFlags() {
  const mounts = [];
  const servers = resolve(process.env.AGENTRY_MCP_SERVERS || join(root, "target", "mcp-servers"));
  if (existsSync(servers)) mounts.push(realpathSync(servers));
  const node = dirname(dirname(realpathSync(process.execPath)));
  if (!node.startsWith("/usr")) mounts.push(node);
  const flags = mounts.flatMap((path) => ["--sandbox-ro-mount", path]);
  // The code interpreter's kernel: the stock data-analysis venv the install script makes.
  const kernel = join(servers, "kernel", "bin", "python");
  if (existsSync(kernel)) flags.push("--kernel-python", join(realpathSync(join(servers, "kernel")), "bin", "python"));
  return flags;
}

/** Starts `agentry serve` on a fresh data folder; resolves with its URL and a stop(). */
export async function startServer() {
  const home = mkdtempSync(join(tmpdir(), "agentry-e2e-"));
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  // The schedules suite fires every second, below the default floor of a minute.
  const args = ["--home", home, "serve", `127.0.0.1:${port}`, "--min-schedule-interval-secs", "1", ...sandboxFlags()];
  const child = spawn(bin("agentry"), args, {
    stdio: ["ignore", "ignore", "pipe"],
    env: (() => {
      // The embedded SQLite default, whatever the environment says.
      const env = { ...process.env, RUST_LOG: process.env.RUST_LOG || "warn" };
      delete env.AGENTRY_DATABASE_URL;
      return env;
    })(),
  });
  let log = "";
  child.stderr.on("data", (chunk) => { log = (log + chunk).slice(-20000); });
  for (let i = 0; i < 300; i += 1) {
    try {
      const response = await fetch(`${url}/readyz`);
      if (response.ok) break;
    } catch { /* not yet */ }
    if (child.exitCode !== null) throw new Error(`agentry serve exited: ${log}`);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    home,
    log: () => log,
    stop: async () => {
      child.kill("SIGTERM");
      await new Promise((r) => { if (child.exitCode !== null) r(); else child.on("exit", r); });
      rmSync(home, { recursive: true, force: true });
    },
  };
}

/** A small API client for setup that is not under test. */
export function client(url, key) {
  const call = async (method, path, body) => {
    const headers = { "content-type": "application/json" };
    if (key) headers.authorization = `Bearer ${key}`;
    const response = await fetch(`${url}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await response.text();
    const data = text ? JSON.parse(text) : null;
    if (!response.ok) throw new Error(`${method} ${path}: ${response.status} ${text}`);
    return data;
  };
  return {
    get: (path) => call("GET", path),
    post: (path, body) => call("POST", path, body ?? {}),
    del: (path) => call("DELETE", path),
  };
}

/** Scripts the mock: each turn is served to one model request, in order. */
export function mockClient(mock) {
  const call = async (method, path, body) => {
    const response = await fetch(`${mock.control_url}${path}`, {
      method, headers: { "content-type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!response.ok) throw new Error(`mock ${path}: ${response.status} ${await response.text()}`);
    const text = await response.text();
    return text ? JSON.parse(text) : null;
  };
  return {
    enqueue: (...turns) => call("POST", "/enqueue", { turns }),
    requests: () => call("GET", "/requests"),
    reset: () => call("POST", "/reset"),
  };
}

/** A long answer streamed slowly enough to watch it arrive. */
export function slowText(text, paceMs = 60) {
  return { text, pace_ms: paceMs, chunk_bytes: 40 };
}

export const test = base.extend({
  env: [async ({}, use) => {
    const mock = await startMock();
    const server = await startServer();
    const api = client(server.url);
    await api.post("/v1/models", { id: "mock", protocol: "openai", base_url: mock.openai_base_url, model_name: "mock-model" });
    await use({ mock, server, api, script: mockClient(mock) });
    await server.stop();
    mock.stop();
  }, { scope: "worker" }],
  // Every test starts with an empty queue and no recorded requests.
  script: async ({ env }, use) => {
    await env.script.reset();
    await use(env.script);
  },
  // Pages report their script errors as test failures.
  page: async ({ page }, use) => {
    const errors = [];
    page.on("pageerror", (error) => errors.push(error.message));
    await use(page);
    expect(errors, "errors in the page's scripts").toEqual([]);
  },
});

export { expect };

/** Opens the console on `hash` and waits for it to be ready. */
export async function open(page, env, hash = "#/chat") {
  await page.goto(`${env.server.url}/${hash}`);
  await expect(page.getByTestId("sidebar")).toBeVisible();
}

/** Picks a model or agent in the chat's picker. */
export async function pick(page, value) {
  const picker = page.getByTestId("model-picker");
  await expect(picker.locator(`option[value="${value}"]`)).toHaveCount(1);
  await picker.selectOption(value);
}

/** Checks these tools (by name; "*" is the explicit "All tools") in the composer's tool menu. */
export async function offer(page, ...names) {
  await page.locator("[data-testid=tool-picker] button").click();
  for (const name of names) await page.locator(`input[type=checkbox][data-tool="${name}"]`).check();
  await page.locator("[data-testid=tool-picker] button").click();
}
