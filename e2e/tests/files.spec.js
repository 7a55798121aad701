// The Files panel beside a chat: uploads (with progress, a dropped chunk sent again, and a
// reload resumed without sending again what arrived), previews of Markdown, code and images,
// list and grid, search, rename, duplicate, delete, new folder, download; the sidebar and the
// panel resized by their handles.
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test, expect, open, pick, shot } from "../support.js";

const PNG = Buffer.from("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==", "base64");
const MIB = 1024 * 1024;

/** Files on disk (a stable modification time, which resuming an upload relies on). */
function files() {
  const dir = mkdtempSync(join(tmpdir(), "agentry-files-"));
  const write = (name, content) => { const path = join(dir, name); writeFileSync(path, content); return path; };
  const big = Buffer.alloc(9 * MIB + 12345);
  for (let i = 0; i < big.length; i += 4096) big.writeUInt32LE((i * 2654435761) >>> 0, i);
  return {
    notes: write("notes.md", "# Plan\n\n- **ship** it on Friday\n"),
    code: write("main.rs", "fn main() {\n    println!(\"hi\");\n}\n"),
    image: write("pixel.png", PNG),
    big: write("big.bin", big),
    other: write("other.bin", big.subarray(0, 9 * MIB)),
  };
}

const sha = (buffer) => createHash("sha256").update(buffer).digest("hex");

/** A chat with one answered message; resolves with the session's id. */
async function session(page, env, script) {
  await script.enqueue({ text: "Ready." });
  await open(page, env);
  await pick(page, "model:mock");
  await page.getByTestId("composer").fill("Let us work on files.");
  await page.getByTestId("send").click();
  await expect(page.locator('[data-testid=message][data-role=assistant]').last()).toContainText("Ready.");
  await expect(page).toHaveURL(/#\/chat\/[0-9a-f-]{36}$/);
  return page.url().split("/").pop();
}

async function workspaceFile(env, id, path) {
  const response = await fetch(`${env.server.url}/linglong/v1/workspace/content?session_id=${id}&path=${encodeURIComponent(path)}`);
  expect(response.status, path).toBe(200);
  return Buffer.from(await response.arrayBuffer());
}

test("files are uploaded, previewed, searched, renamed, duplicated, deleted and downloaded", async ({ page, env, script }) => {
  const paths = files();
  const id = await session(page, env, script);
  await page.getByTestId("open-files").click();
  const panel = page.getByTestId("files-panel");
  await expect(panel).toBeVisible();

  // The second chunk of the big file is cut off once: the panel sends it again.
  let cut = 0;
  await page.route("**/workspace/upload/*/chunk/1", (route) => {
    if (cut === 0) { cut += 1; return route.abort("connectionreset"); }
    return route.continue();
  });
  await panel.getByTestId("files-upload-input").setInputFiles([paths.notes, paths.code, paths.image, paths.big]);
  const big = panel.locator('[data-testid=upload][data-name="big.bin"]');
  await expect(big).toHaveAttribute("data-done", "true", { timeout: 30_000 });
  await expect(big).toHaveAttribute("data-retried", "true");
  await expect(big.getByTestId("upload-progress")).toHaveJSProperty("value", readFileSync(paths.big).length);
  expect(cut).toBe(1);
  await page.unroute("**/workspace/upload/*/chunk/1");
  const names = panel.getByTestId("file-name");
  await expect(names).toHaveText(["big.bin", "main.rs", "notes.md", "pixel.png"]);
  expect(sha(await workspaceFile(env, id, "big.bin"))).toBe(sha(readFileSync(paths.big)));
  await shot(page, "files-panel-list");

  // Previews: Markdown rendered, code highlighted, an image.
  const file = (name) => panel.locator(`[data-testid=file][data-path="${name}"]`);
  await file("notes.md").click();
  const preview = panel.getByTestId("preview-content");
  await expect(preview).toHaveAttribute("data-kind", "markdown");
  await expect(preview.locator("h3")).toHaveText("Plan");
  await expect(preview.locator("strong")).toHaveText("ship");
  await panel.getByTestId("preview-back").click();
  await file("main.rs").click();
  await expect(preview.locator(".tok-k").first()).toHaveText("fn");
  await panel.getByTestId("preview-back").click();
  await file("pixel.png").click();
  await expect.poll(() => preview.locator("img").evaluate((img) => img.naturalWidth)).toBe(1);
  await panel.getByTestId("preview-back").click();

  // The grid shows images as pictures.
  await panel.getByTestId("files-view").click();
  await expect(panel.locator(".files-grid img")).toHaveCount(1);
  await shot(page, "files-panel-grid");
  await panel.getByTestId("files-view").click();

  // Search reads the files' text.
  await panel.getByTestId("files-search").fill("Friday");
  await panel.getByTestId("files-search").press("Enter");
  await expect(names).toHaveText(["notes.md"]);
  await panel.getByTestId("files-search").press("Escape");
  await expect(names).toHaveCount(4);

  // Rename, duplicate, delete (each asks first).
  page.once("dialog", (dialog) => dialog.accept("plan.md"));
  await file("notes.md").getByTestId("file-rename").click();
  await expect(file("plan.md")).toBeVisible();
  await file("main.rs").getByTestId("file-duplicate").click();
  await expect(names).toHaveCount(5);
  page.once("dialog", (dialog) => dialog.accept());
  await file("big.bin").getByTestId("file-delete").click();
  await expect(file("big.bin")).toHaveCount(0);
  await expect(names).toHaveCount(4);
  const listing = await (await fetch(`${env.server.url}/linglong/v1/workspace/list?session_id=${id}`)).json();
  expect(listing.files.map((f) => f.name)).toContain("plan.md");
  expect(listing.files.map((f) => f.name)).not.toContain("big.bin");

  // A new folder shows in the tree.
  page.once("dialog", (dialog) => dialog.accept("docs"));
  await panel.getByTestId("files-mkdir").click();
  await expect(panel.locator('[data-testid=tree-node][data-path="docs"]')).toBeVisible();

  // Download.
  const download = page.waitForEvent("download");
  await file("main.rs").getByTestId("file-download").click();
  const saved = await download;
  expect(saved.suggestedFilename()).toBe("main.rs");
  expect(readFileSync(await saved.path(), "utf8")).toBe(readFileSync(paths.code, "utf8"));
});

test("an upload cut off by a reload resumes without sending again what arrived", async ({ page, env, script }) => {
  const paths = files();
  await session(page, env, script);
  const id = page.url().split("/").pop();
  await page.getByTestId("open-files").click();
  const panel = page.getByTestId("files-panel");
  // The second chunk never gets an answer: the page is reloaded while it waits.
  const sent = [];
  let hang = true;
  await page.route("**/workspace/upload/*/chunk/*", (route) => {
    const n = route.request().url().split("/").pop();
    sent.push(n);
    if (hang && n === "1") return; // left hanging, never reaching the server
    return route.continue();
  });
  await panel.getByTestId("files-upload-input").setInputFiles(paths.other);
  const upload = panel.locator('[data-testid=upload][data-name="other.bin"]');
  await expect(upload.getByTestId("upload-state")).toHaveText(/^8\.0 MiB of 9\.0 MiB$/, { timeout: 20_000 });
  expect([...sent].sort()).toEqual(["0", "1"]);
  hang = false;
  sent.length = 0;
  await page.reload();
  await page.getByTestId("open-files").click();
  await panel.getByTestId("files-upload-input").setInputFiles(paths.other);
  await expect(upload).toHaveAttribute("data-done", "true", { timeout: 20_000 });
  expect(sent).toEqual(["1"]);
  expect(sha(await workspaceFile(env, id, "other.bin"))).toBe(sha(readFileSync(paths.other)));
});

test("the sidebar and the Files panel are resized by their handles", async ({ page, env, script }) => {
  await session(page, env, script);
  const sidebar = page.getByTestId("sidebar");
  const before = (await sidebar.boundingBox()).width;
  const handle = page.getByTestId("sidebar-resize");
  const box = await handle.boundingBox();
  await page.mouse.move(box.x + box.width / 2, box.y + 100);
  await page.mouse.down();
  await page.mouse.move(box.x + 120, box.y + 100, { steps: 5 });
  await page.mouse.up();
  await expect.poll(async () => Math.round((await sidebar.boundingBox()).width)).toBeGreaterThan(before + 80);
  // Remembered across a reload.
  const widened = Math.round((await sidebar.boundingBox()).width);
  await page.reload();
  await expect.poll(async () => Math.round((await page.getByTestId("sidebar").boundingBox()).width)).toBe(widened);

  await page.getByTestId("open-files").click();
  const panel = page.getByTestId("files-panel");
  const width = (await panel.boundingBox()).width;
  await page.getByTestId("files-resize").focus();
  await page.keyboard.press("Shift+ArrowLeft");
  await page.keyboard.press("Shift+ArrowLeft");
  await expect.poll(async () => Math.round((await panel.boundingBox()).width)).toBe(Math.round(width) + 80);
  await page.evaluate(() => { localStorage.removeItem("agentry.sidebar.width"); localStorage.removeItem("agentry.files.width"); });
});
