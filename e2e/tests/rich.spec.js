// Math (KaTeX, as MathML) and mermaid diagrams in answers and in the Files panel's Markdown
// preview, within the page's strict CSP (no violation reported), and money left as money.
import { test, expect, open, pick, shot } from "../support.js";

const ANSWER = [
  "Einstein wrote $E = mc^2$; prices stay prices: $5 and $6.",
  "",
  "$$",
  "\\int_0^1 x^2\\,dx = \\frac{1}{3}",
  "$$",
  "",
  "```mermaid",
  "graph TD",
  "  A[Plan] --> B[Ship]",
  "  B --> C{Done?}",
  "```",
  "",
  "A bad formula: $\\frac{1}{$ stays as text.",
].join("\n");

test("math and diagrams render in answers, within the CSP", async ({ page, env, script }) => {
  await page.addInitScript(() => {
    window.__violations = [];
    document.addEventListener("securitypolicyviolation", (event) => window.__violations.push(`${event.violatedDirective} ${event.sourceFile}:${event.lineNumber}`));
  });
  await script.enqueue({ text: ANSWER });
  await open(page, env);
  await pick(page, "model:mock");
  await page.getByTestId("composer").fill("Show me some maths.");
  await page.getByTestId("send").click();
  const answer = page.locator('[data-testid=message][data-role=assistant] [data-testid=message-text]').last();
  await expect(answer).toContainText("prices stay prices");
  const inline = answer.locator('.math[data-display=inline][data-state=done]');
  await expect(inline).toHaveCount(1);
  await expect(inline.locator("math annotation")).toHaveText("E = mc^2");
  const block = answer.locator('.math[data-display=block][data-state=done]');
  await expect(block.locator("math mfrac")).toHaveCount(1);
  await expect(answer).toContainText("$5 and $6");
  // A formula KaTeX cannot read keeps its source, marked.
  const broken = answer.locator(".math[data-state=error]");
  await expect(broken).toHaveCount(1);
  await expect(broken).toHaveText("\\frac{1}{");
  const diagram = answer.locator(".diagram[data-state=done] svg");
  await expect(diagram).toHaveCount(1);
  await expect(diagram.locator("text", { hasText: "Ship" }).first()).toBeVisible();
  // Written as given (the page's own `.label` rule does not reach into diagrams).
  expect(await diagram.locator("text", { hasText: "Ship" }).first().evaluate((t) => getComputedStyle(t).textTransform)).toBe("none");
  // The nodes are laid out: three of them, side by side in the picture, not piled up.
  const boxes = await diagram.locator("g.node").evaluateAll((nodes) => nodes.map((n) => n.getBoundingClientRect().y));
  expect(boxes.length).toBe(3);
  expect(new Set(boxes.map(Math.round)).size).toBe(3);
  // Its own styles apply (its <style> carries the page's nonce): the boxes are not black.
  const fills = await diagram.locator("g.node rect, g.node polygon").evaluateAll((shapes) => shapes.map((s) => getComputedStyle(s).fill));
  expect(fills.length).toBeGreaterThanOrEqual(3);
  for (const fill of fills) expect(fill).not.toBe("rgb(0, 0, 0)");
  expect(await page.evaluate(() => window.__violations)).toEqual([]);
  await shot(page, "chat-math-and-diagram");
});
