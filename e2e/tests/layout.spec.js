// Layout at desktop and phone widths: the chat's hint while the server has no model is shown
// whole, and every entry of the top menu stays reachable on a phone.
import { test, expect, open, shot, startServer } from "../support.js";

/** Why `locator`'s element is cut off (overflowing itself, or outside an ancestor that clips), or null. */
function clipping(locator) {
  return locator.evaluate((el) => {
    if (el.scrollWidth > el.clientWidth + 1 || el.scrollHeight > el.clientHeight + 1) return "its text overflows its box";
    const box = el.getBoundingClientRect();
    for (let parent = el.parentElement; parent; parent = parent.parentElement) {
      const style = getComputedStyle(parent);
      if (style.overflowX === "visible" && style.overflowY === "visible") continue;
      const outer = parent.getBoundingClientRect();
      if (box.left < outer.left - 1 || box.right > outer.right + 1 || box.top < outer.top - 1 || box.bottom > outer.bottom + 1) {
        return `clipped by ${parent.tagName.toLowerCase()}.${parent.className}`;
      }
    }
    return null;
  });
}

test("the hint shown while the server has no model is whole at desktop and phone widths", async ({ page }) => {
  // A server of its own: the shared one has a model.
  const server = await startServer();
  try {
    for (const [width, height] of [[1280, 820], [390, 844]]) {
      await page.setViewportSize({ width, height });
      await page.goto(`${server.url}/#/chat`);
      const hint = page.getByTestId("no-model-hint");
      await expect(hint).toBeVisible();
      await expect(hint).toContainText("No model yet: add one in Settings → Models");
      await expect(hint.getByRole("link")).toHaveAttribute("href", "#/settings/models");
      await expect(hint).toBeInViewport({ ratio: 1 });
      const box = await hint.boundingBox();
      expect(box.x).toBeGreaterThanOrEqual(0);
      expect(box.x + box.width).toBeLessThanOrEqual(width);
      expect(box.y + box.height).toBeLessThanOrEqual(height);
      expect(await clipping(hint)).toBeNull();
      await shot(page, `no-model-hint-${width}`);
    }
    // Its link leads to the models' settings.
    await page.getByTestId("no-model-hint").getByRole("link").click();
    await expect(page.getByTestId("model-form")).toBeVisible();
  } finally {
    await server.stop();
  }
});

test("the hint is gone once the server has a model", async ({ page, env }) => {
  await open(page, env, "#/chat");
  await expect(page.getByTestId("model-picker").locator('option[value="model:mock"]')).toHaveCount(1);
  await expect(page.getByTestId("no-model-hint")).toBeHidden();
});

test("every top menu entry is reachable at phone width", async ({ page, env }) => {
  await page.setViewportSize({ width: 390, height: 844 });
  await open(page, env, "#/chat");
  for (const name of ["chat", "runs", "schedules", "workflows", "usage", "settings"]) {
    const link = page.getByTestId(`nav-${name}`);
    await expect(link).toBeInViewport({ ratio: 1 });
    expect(await clipping(link)).toBeNull();
  }
  await expect(page.getByTestId("theme-toggle")).toBeInViewport({ ratio: 1 });
  await shot(page, "topbar-390");
  // Each one works (nothing covers it), and the sessions still slide in under the bar.
  for (const name of ["runs", "schedules", "workflows", "usage", "settings", "chat"]) {
    await page.getByTestId(`nav-${name}`).click();
    await expect(page.getByTestId(`nav-${name}`)).toHaveClass(/active/);
  }
  await page.getByRole("button", { name: "Sessions" }).click();
  await expect(page.getByTestId("sidebar")).toBeInViewport();
  const bar = await page.locator(".topbar").boundingBox();
  const sidebar = await page.getByTestId("sidebar").boundingBox();
  expect(sidebar.y).toBeGreaterThanOrEqual(bar.y + bar.height - 1);
});
