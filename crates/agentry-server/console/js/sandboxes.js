// The Sandboxes page: the open standalone sandboxes (state, age, CPU, memory, background
// processes) with pause, resume, snapshot and delete; the snapshots with fork and delete; and a
// code cell on the selected sandbox that runs Python in its kernel (POST /v1/sandboxes/{id}/code,
// streamed: outputs show as they come) and shows what came back: printed text, charts (PNG), tables, errors with their traceback.
// Tables arrive as the kernel's HTML; only their cells' text is kept, so no markup of the
// sandbox's reaches the page.

import { get, post, del, stream } from "./api.js";
import { h, clear, toast, errorText } from "./dom.js";

function age(ms) {
  const secs = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (secs < 120) return `${secs} s`;
  if (secs < 7200) return `${Math.round(secs / 60)} min`;
  return `${Math.round(secs / 3600)} h`;
}

function state(sandbox) {
  if (sandbox.paused_on_idle) return "paused (idle)";
  return sandbox.paused ? "paused" : "running";
}

function megabytes(bytes) {
  return bytes == null ? "—" : `${(bytes / 1048576).toFixed(1)} MB`;
}

/** A table rebuilt from the kernel's HTML, text only. Its styles are dropped before it is
 * parsed: the page's CSP would report them (pandas writes a `<style>` and `style` attributes). */
export function tableFromHtml(html) {
  const unstyled = html.replace(/<style[\s\S]*?<\/style>/gi, "").replace(/\sstyle\s*=\s*("[^"]*"|'[^']*')/gi, "");
  const parsed = new DOMParser().parseFromString(unstyled, "text/html").querySelector("table");
  if (!parsed) return null;
  const rows = [...parsed.querySelectorAll("tr")].map((tr) => h("tr", {},
    [...tr.children].map((cell) => h(cell.tagName === "TH" ? "th" : "td", {}, cell.textContent.trim())),
  ));
  return h("table", { class: "grid code-table", testid: "code-table" }, h("tbody", {}, rows));
}

/** One output of a code call, as the page shows it. */
function output(item) {
  if (item.type === "stream") {
    return h("pre", { class: `code-stream ${item.name}`, testid: "code-stream" }, item.text);
  }
  const data = item.data || {};
  if (typeof data["image/png"] === "string") {
    return h("img", { class: "code-image", testid: "code-image", alt: "a chart the code drew",
      src: `data:image/png;base64,${data["image/png"].trim()}` });
  }
  if (typeof data["text/html"] === "string") {
    const table = tableFromHtml(data["text/html"]);
    if (table) return table;
  }
  if (typeof data["text/plain"] === "string") {
    return h("pre", { class: "code-result", testid: "code-result" }, data["text/plain"]);
  }
  return h("pre", { class: "code-result" }, JSON.stringify(data));
}

export class SandboxesView {
  constructor(root) {
    this.root = h("div", { class: "page sandboxes", testid: "sandboxes" });
    root.append(this.root);
    this.selected = null;
    this.render();
    this.load();
    this.timer = setInterval(() => this.load(), 5000);
  }

  close() { clearInterval(this.timer); }

  render() {
    this.list = h("tbody", { testid: "sandbox-rows" });
    this.snapshots = h("tbody", { testid: "snapshot-rows" });
    this.code = h("textarea", { class: "code-input", testid: "code-input", rows: 6, spellcheck: false,
      "aria-label": "Python code", placeholder: "import pandas as pd\n…" });
    this.outputs = h("div", { class: "code-outputs", testid: "code-outputs" });
    this.target = h("span", { class: "meta", testid: "code-target" }, "no sandbox selected");
    const run = h("button", { class: "primary", testid: "code-run", onclick: () => this.run() }, "Run");
    this.code.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); this.run(); }
    });
    this.root.append(
      h("div", { class: "page-head" }, h("h2", {}, "Sandboxes"),
        h("button", { testid: "sandbox-new", onclick: () => this.create() }, "New sandbox")),
      h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["Sandbox", "State", "Age", "CPU", "Memory", "Processes", ""].map((t) => h("th", {}, t)))),
        this.list),
      h("div", { class: "card code-cell", testid: "code-cell" },
        h("h3", {}, "Code interpreter ", this.target),
        this.code, h("div", { class: "actions" }, run), this.outputs),
      h("h3", {}, "Snapshots"),
      h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["Snapshot", "Of", "Size", "Taken", ""].map((t) => h("th", {}, t)))),
        this.snapshots),
    );
  }

  async load() {
    let sandboxes, snapshots;
    try {
      [sandboxes, snapshots] = await Promise.all([get("/v1/sandboxes"), get("/v1/sandbox-snapshots")]);
    } catch (error) {
      clear(this.list).append(h("tr", {}, h("td", { colspan: 7, testid: "sandboxes-error" }, errorText(error))));
      return;
    }
    const act = (label, testid, action) => h("button", { class: "small", testid, onclick: async () => {
      try { await action(); } catch (error) { toast(errorText(error), "error"); }
      this.load();
    } }, label);
    clear(this.list).append(...sandboxes.sandboxes.map((sandbox) => h("tr", {
      testid: "sandbox-row", dataset: { sandboxId: sandbox.id, state: state(sandbox) },
      class: sandbox.id === this.selected ? "selected" : "",
    },
    h("td", {}, h("a", { href: "#", onclick: (event) => { event.preventDefault(); this.select(sandbox.id); } },
      sandbox.id.slice(-12))),
    h("td", { testid: "sandbox-state" }, state(sandbox)),
    h("td", {}, age(sandbox.created_at)),
    h("td", {}, sandbox.cpu_seconds == null ? "—" : `${sandbox.cpu_seconds.toFixed(2)} s`),
    h("td", {}, megabytes(sandbox.memory_bytes)),
    h("td", {}, String(sandbox.running_processes)),
    h("td", { class: "actions" },
      sandbox.paused
        ? act("Resume", "sandbox-resume", () => post(`/v1/sandboxes/${sandbox.id}/resume`))
        : act("Pause", "sandbox-pause", () => post(`/v1/sandboxes/${sandbox.id}/pause`)),
      act("Snapshot", "sandbox-snapshot", () => post(`/v1/sandboxes/${sandbox.id}/snapshots`)),
      act("Delete", "sandbox-delete", async () => {
        await del(`/v1/sandboxes/${sandbox.id}`);
        if (this.selected === sandbox.id) this.select(null);
      })),
    )));
    if (!sandboxes.sandboxes.length) {
      this.list.append(h("tr", {}, h("td", { colspan: 7, class: "meta" }, "No sandbox is open.")));
    }
    clear(this.snapshots).append(...snapshots.snapshots.map((snapshot) => h("tr", {
      testid: "snapshot-row", dataset: { snapshotId: snapshot.id },
    },
    h("td", {}, snapshot.id.slice(-12)),
    h("td", {}, snapshot.sandbox_id.slice(-12)),
    h("td", {}, megabytes(snapshot.bytes)),
    h("td", {}, age(snapshot.created_at)),
    h("td", { class: "actions" },
      act("Fork", "snapshot-fork", async () => {
        const fork = await post("/v1/sandboxes", { snapshot_id: snapshot.id });
        this.select(fork.id);
      }),
      act("Delete", "snapshot-delete", () => del(`/v1/sandbox-snapshots/${snapshot.id}`))),
    )));
  }

  async create() {
    try {
      const sandbox = await post("/v1/sandboxes", {});
      this.select(sandbox.id);
    } catch (error) {
      toast(errorText(error), "error");
    }
    this.load();
  }

  select(id) {
    this.selected = id;
    this.target.textContent = id ? `in ${id.slice(-12)}` : "no sandbox selected";
    clear(this.outputs);
    for (const row of this.list.querySelectorAll("tr")) row.classList.toggle("selected", row.dataset.sandboxId === id);
  }

  async run() {
    const code = this.code.value;
    if (!this.selected) { toast("Select or make a sandbox first.", "error"); return; }
    if (!code.trim()) return;
    const cell = h("div", { class: "code-call", testid: "code-call" }, h("pre", { class: "code-source" }, code));
    this.outputs.prepend(cell);
    const busy = h("div", { class: "meta", testid: "code-running" }, "running…");
    cell.append(busy);
    try {
      // Streamed: each output shows as the kernel sends it; the last event says how it ended.
      let ended = null;
      await stream("POST", `/v1/sandboxes/${this.selected}/code`, { code, stream: true }, (name, data) => {
        if (name === "output") {
          const last = busy.previousElementSibling;
          // Text on one stream goes on in the same block, as the result merges it.
          if (data.type === "stream" && last && last.dataset.stream === data.name) last.textContent += data.text;
          else {
            const shown = output(data);
            if (data.type === "stream") shown.dataset.stream = data.name;
            cell.insertBefore(shown, busy);
          }
        } else if (name === "done") ended = data;
        else if (name === "error") ended = { failure: data };
      });
      busy.remove();
      if (!ended || ended.failure) {
        const message = ended && ended.failure && ended.failure.error ? ended.failure.error.message : "the call ended without an answer";
        cell.append(h("pre", { class: "code-error", testid: "code-error" }, message));
        return;
      }
      const result = ended;
      if (result.error) {
        cell.append(h("pre", { class: "code-error", testid: "code-error" },
          result.error.traceback.length ? result.error.traceback.join("\n") : `${result.error.name}: ${result.error.value}`));
      }
      cell.append(h("div", { class: "meta" },
        `${result.timed_out ? "interrupted at the timeout · " : ""}${result.kernel_started ? "new kernel · " : ""}${result.duration_ms} ms`));
    } catch (error) {
      busy.remove();
      cell.append(h("pre", { class: "code-error", testid: "code-error" }, errorText(error)));
    }
  }
}
