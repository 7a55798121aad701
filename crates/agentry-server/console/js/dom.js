// Small DOM helpers: elements built with properties and children, never from HTML strings
// (model and tool text is only ever set as text, or through the escaping Markdown renderer).

/** h("div", {class: "x", dataset: {testid: "y"}, onclick}, child, "text", …) */
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "testid") el.dataset.testid = value;
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "text") el.textContent = value;
    else if (key === "style") {
      // Through the CSSOM: the page's CSP allows no inline style attributes.
      for (const rule of String(value).split(";")) {
        const colon = rule.indexOf(":");
        if (colon > 0) el.style.setProperty(rule.slice(0, colon).trim(), rule.slice(colon + 1).trim());
      }
    }
    else if (key in el && typeof value !== "string") el[key] = value;
    else el.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export function clear(el) { while (el.firstChild) el.removeChild(el.firstChild); return el; }

export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  const item = h("div", { class: `toast ${kind}`, role: kind === "error" ? "alert" : "status" }, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}

export function errorText(error) {
  return error && error.message ? error.message : String(error);
}

export function json(value) {
  try { return JSON.stringify(value, null, 2); } catch { return String(value); }
}

export function time(ms) {
  if (!ms) return "";
  const date = new Date(ms);
  const today = new Date();
  return date.toDateString() === today.toDateString()
    ? date.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" })
    : date.toLocaleDateString([], { month: "short", day: "numeric" });
}

/** Dollars, with the precision small amounts need. */
export function dollars(value) {
  if (!value) return "$0";
  return value >= 1 ? `$${value.toFixed(2)}` : `$${value.toPrecision(3)}`;
}
