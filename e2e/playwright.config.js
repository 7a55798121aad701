// The web console's end-to-end suite: headless Chromium (Debian's `chromium`, or
// AGENTRY_CHROMIUM) against real `agentry serve` processes and the testkit's mock provider
// (`agentry-mock`), both started by the fixtures in support.js. One worker: the tests share a
// server and script its mock in turn.
import { defineConfig } from "@playwright/test";
import { join, resolve } from "node:path";

// The build's target folder (CARGO_TARGET_DIR when set), where the results go too.
const target = process.env.CARGO_TARGET_DIR ? resolve(process.env.CARGO_TARGET_DIR) : join(import.meta.dirname, "..", "target");

export default defineConfig({
  testDir: "./tests",
  workers: 1,
  fullyParallel: false,
  retries: 0,
  timeout: 60_000,
  expect: { timeout: 15_000 },
  reporter: [["list"]],
  outputDir: join(target, "console-e2e-results"),
  use: {
    testIdAttribute: "data-testid",
    viewport: { width: 1280, height: 820 },
    launchOptions: {
      executablePath: process.env.AGENTRY_CHROMIUM || "/usr/bin/chromium",
      // Chromium's own sandbox needs privileges a root CI container does not give.
      // A fake microphone (a tone) that needs no permission prompt, for the recording test.
      args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--use-fake-ui-for-media-stream", "--use-fake-device-for-media-stream"],
    },
    trace: "retain-on-failure",
  },
});
