// The console's entry: theme, login, the hash router, and the one status feed
// (GET /v1/sessions/events) every view listens to through `bus`.

import { get, post, stream, onUnauthorized } from "./api.js";
import { h, clear, toast, errorText } from "./dom.js";
import { Sidebar } from "./sidebar.js";
import { ChatView } from "./chat.js";
import { SettingsView } from "./settings.js";
import { TraceView } from "./trace.js";
import { RunsView } from "./runs.js";
import { SandboxesView } from "./sandboxes.js";
import { SchedulesView } from "./schedules.js";
import { WorkflowsView } from "./workflows.js";
import { UsageView } from "./usage.js";
import { resizable } from "./resize.js";

/** Status changes (`status` events with the feed's data) and other app-wide news. */
export const bus = new EventTarget();

const main = document.getElementById("main");
let view = null;
let sidebar = null;
let feed = null;

// --- theme ---
function applyTheme(theme) {
  document.documentElement.dataset.theme = theme;
  localStorage.setItem("agentry.theme", theme);
}
function initialTheme() {
  const saved = localStorage.getItem("agentry.theme");
  if (saved === "dark" || saved === "light") return saved;
  return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}
applyTheme(initialTheme());
document.getElementById("theme-toggle").addEventListener("click", () => {
  applyTheme(document.documentElement.dataset.theme === "dark" ? "light" : "dark");
});

// --- the sidebar's width: dragged by its handle, remembered ---
{
  const handle = document.getElementById("sidebar-resize");
  const layout = document.querySelector(".layout");
  resizable(handle, { key: "agentry.sidebar.width", initial: 290, min: 200, max: () => Math.max(240, window.innerWidth * 0.5),
    edge: "left", apply: (width) => layout.style.setProperty("--sidebar-width", `${width}px`) });
}

// --- narrow screens: the sidebar slides in ---
document.getElementById("menu").addEventListener("click", () => document.body.classList.toggle("sidebar-open"));

// --- login ---
function showLogin() {
  if (feed) { feed.abort(); feed = null; }
  if (view && view.close) view.close();
  view = null;
  document.getElementById("sidebar").classList.add("hidden");
  const error = h("div", { class: "form-error", testid: "form-error" });
  const input = h("input", { name: "key", type: "password", placeholder: "agk_…", autocomplete: "current-password", required: true, "aria-label": "API key" });
  const form = h("form", { testid: "login", onsubmit: async (event) => {
    event.preventDefault();
    error.textContent = "";
    try {
      await post("/v1/auth/login", { api_key: input.value.trim() });
      start();
    } catch (err) {
      error.textContent = errorText(err);
    }
  } },
  h("h2", {}, "Sign in"),
  h("p", { class: "muted" }, "This server has API keys. Enter one to use the console."),
  input, error,
  h("button", { class: "primary", type: "submit", testid: "login-submit" }, "Sign in"));
  clear(main).append(h("div", { class: "page" }, h("div", { class: "login card" }, form)));
  input.focus();
}
let loginShown = false;
onUnauthorized(() => { if (!loginShown) { loginShown = true; showLogin(); } });

document.getElementById("logout").addEventListener("click", async () => {
  try { await post("/v1/auth/logout"); } catch { /* already out */ }
  loginShown = true;
  showLogin();
});

// --- the status feed ---
async function follow() {
  for (;;) {
    feed = new AbortController();
    const signal = feed.signal;
    try {
      await stream("GET", "/v1/sessions/events", undefined, (name, data) => {
        if (name === "session.status") bus.dispatchEvent(new CustomEvent("status", { detail: data }));
        if (name === "session.lagged") bus.dispatchEvent(new CustomEvent("refresh"));
      }, {
        signal,
        // Subscribed: list the sessions again, so one that changed before the feed was open
        // (between the first listing and now) is not missed until its next change.
        onOpen: () => bus.dispatchEvent(new CustomEvent("refresh")),
      });
    } catch (error) {
      if (signal.aborted) return;
      if (error.status === 401) return;
    }
    if (signal.aborted) return;
    await new Promise((resolve) => setTimeout(resolve, 1500));
  }
}

// --- routing ---
function route() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [section, ...rest] = hash.split("/");
  const arg = rest.join("/");
  document.querySelectorAll(".topnav a").forEach((a) => {
    a.classList.toggle("active", (section || "chat") === a.getAttribute("href").split("/")[1]);
  });
  document.body.classList.remove("sidebar-open");
  if (view && view.close) view.close();
  clear(main);
  if (section === "settings") view = new SettingsView(main, arg || "models");
  else if (section === "trace") view = new TraceView(main, arg);
  else if (section === "runs") view = new RunsView(main, arg);
  else if (section === "schedules") view = new SchedulesView(main);
  else if (section === "workflows") view = new WorkflowsView(main, arg);
  else if (section === "usage") view = new UsageView(main);
  else if (section === "sandboxes") view = new SandboxesView(main);
  else view = new ChatView(main, arg || null, sidebar);
  if (sidebar) sidebar.select(section === "chat" || !section ? arg || null : null);
}

async function start() {
  loginShown = false;
  let status;
  try {
    status = await get("/v1/auth/status");
  } catch (error) {
    toast(`The server does not answer: ${errorText(error)}`, "error");
    return;
  }
  if (status.enabled && !status.authenticated) { loginShown = true; showLogin(); return; }
  document.getElementById("logout").classList.toggle("hidden", !status.enabled);
  document.getElementById("sidebar").classList.remove("hidden");
  if (!sidebar) sidebar = new Sidebar(document.getElementById("sidebar"));
  await sidebar.load();
  if (!feed) follow();
  route();
}

window.addEventListener("hashchange", () => { if (!loginShown) route(); });

// Keyboard: Ctrl/Cmd+Enter sends, Escape stops (the chat view listens), Ctrl/Cmd+K searches.
document.addEventListener("keydown", (event) => {
  if ((event.ctrlKey || event.metaKey) && event.key.toLowerCase() === "k") {
    const search = document.querySelector("[data-testid=session-search]");
    if (search) { event.preventDefault(); search.focus(); }
  }
});

start();
