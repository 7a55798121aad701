// The Files panel beside a chat: the session's workspace as a folder tree and a list or grid
// (sizes, times), search (contents, .gitignore respected), previews (text and code, Markdown,
// images), download (a folder as a zip), new folder, rename, duplicate, delete, and uploads by
// button, drag and drop or paste, in chunks with progress, retried after a dropped connection
// and resumed after a reload (the chunks the server has are not sent again).
// It speaks the workspace routes the seed's clients use (/linglong/v1/workspace/…).

import { ApiError } from "./api.js";
import { h, clear, toast, errorText, time } from "./dom.js";
import { highlight, markdown } from "./markdown.js";

const BASE = "/linglong/v1/workspace";
/** How much of a file a text preview reads. */
const PREVIEW_BYTES = 256 * 1024;
/** Chunks sent at once by one upload. */
const PARALLEL = 2;
/** Tries of one chunk before the upload stops (a growing delay between them). */
const CHUNK_TRIES = 6;
const TEXT_EXTENSIONS = /\.(txt|md|markdown|rs|py|js|mjs|ts|tsx|jsx|json|toml|ya?ml|sh|bash|c|h|cc|cpp|hpp|go|java|kt|rb|php|css|html?|xml|sql|csv|tsv|ini|cfg|conf|log|env|gitignore|dockerfile|makefile)$/i;

/** A query string from an object (undefined values left out). */
function qs(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value !== undefined && value !== null) search.set(key, String(value));
  return search.toString();
}

/** A JSON call to the workspace routes; throws ApiError with the server's message. */
async function call(method, path, { query, body } = {}) {
  const init = { method, credentials: "same-origin", headers: {} };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(`${BASE}${path}${query ? `?${qs(query)}` : ""}`, init);
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = text; }
  if (!response.ok) {
    const message = data && (data.error?.message || data.error || data.message);
    throw new ApiError(response.status, typeof message === "string" ? message : data);
  }
  return data;
}

export function size(bytes) {
  if (bytes < 1024) return `${bytes} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = bytes / 1024;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(value < 10 ? 1 : 0)} ${units[unit]}`;
}

const join = (folder, name) => (folder ? `${folder}/${name}` : name);
const parent = (path) => path.split("/").slice(0, -1).join("/");
const isMarkdown = (path) => /\.(md|markdown)$/i.test(path);

/** What a file is shown as: `image`, `markdown`, `text` or `none`. */
function kindOf(entry) {
  if (entry.is_image) return "image";
  if (isMarkdown(entry.path)) return "markdown";
  if (entry.is_text || TEXT_EXTENSIONS.test(entry.name)) return "text";
  return "none";
}

/** A small type badge: the folder mark, else the extension (no icon font needed). */
function icon(entry) {
  if (entry.is_dir) return h("span", { class: "type-badge dir", "aria-label": "folder" }, "DIR");
  const dot = entry.name.lastIndexOf(".");
  const ext = dot > 0 ? entry.name.slice(dot + 1, dot + 5).toUpperCase() : "FILE";
  const kind = entry.is_image ? "image" : entry.is_text ? "text" : entry.is_audio || entry.is_video ? "media" : "other";
  return h("span", { class: `type-badge ${kind}` }, ext);
}

/** Where an unfinished upload is remembered, so choosing the same file again resumes it. */
function resumeKey(session, target, file) {
  return `agentry.upload:${session}:${target}:${file.size}:${file.lastModified}`;
}

/** One chunk sent with XMLHttpRequest, for its progress events. */
function sendChunk(uploadId, n, blob, onProgress, signal) {
  return new Promise((resolve, reject) => {
    const xhr = new XMLHttpRequest();
    xhr.open("PUT", `${BASE}/upload/${encodeURIComponent(uploadId)}/chunk/${n}`);
    xhr.withCredentials = true;
    xhr.upload.onprogress = (event) => onProgress(event.loaded);
    xhr.onload = () => {
      if (xhr.status >= 200 && xhr.status < 300) resolve();
      else {
        let message = xhr.responseText;
        try { const body = JSON.parse(xhr.responseText); message = body.error?.message || body.error || message; } catch { /* text */ }
        reject(new ApiError(xhr.status, message));
      }
    };
    xhr.onerror = () => reject(new Error("the connection dropped"));
    xhr.onabort = () => reject(new DOMException("cancelled", "AbortError"));
    if (signal) signal.addEventListener("abort", () => xhr.abort(), { once: true });
    xhr.send(blob);
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Whether a failed chunk is worth sending again (the connection, or the server, not the request). */
const retryable = (error) => !(error instanceof ApiError) || error.status >= 500 || error.status === 408 || error.status === 429;

export class FilesPanel {
  constructor(sessionId) {
    this.sessionId = sessionId;
    this.folder = "";
    this.view = localStorage.getItem("agentry.files.view") === "grid" ? "grid" : "list";
    this.uploads = new Set();
    this.build();
  }

  build() {
    this.crumbs = h("nav", { class: "crumbs", testid: "files-path", "aria-label": "Folder" });
    this.search = h("input", { type: "search", placeholder: "Search files…", testid: "files-search", "aria-label": "Search the workspace",
      onkeydown: (event) => { if (event.key === "Enter") this.runSearch(); if (event.key === "Escape") { this.search.value = ""; this.refresh(); } } });
    this.picker = h("input", { type: "file", multiple: true, class: "hidden", testid: "files-upload-input", onchange: () => {
      this.upload([...this.picker.files]);
      this.picker.value = "";
    } });
    this.viewButton = h("button", { testid: "files-view", title: "List or grid", onclick: () => this.toggleView() }, this.view === "grid" ? "List" : "Grid");
    this.tree = h("div", { class: "files-tree", testid: "files-tree", role: "tree" });
    this.body = h("div", { class: "files-body", testid: "files-body" });
    this.transfers = h("div", { class: "files-uploads", testid: "files-uploads" });
    this.el = h("section", { class: "files-panel", testid: "files-panel", tabindex: "0", "aria-label": "Workspace files",
      ondragover: (event) => { event.preventDefault(); this.el.classList.add("dropping"); },
      ondragleave: (event) => { if (!this.el.contains(event.relatedTarget)) this.el.classList.remove("dropping"); },
      ondrop: (event) => {
        event.preventDefault();
        this.el.classList.remove("dropping");
        const files = [...(event.dataTransfer?.files || [])];
        if (files.length) this.upload(files);
      },
      onpaste: (event) => {
        const files = [...(event.clipboardData?.files || [])];
        if (files.length) { event.preventDefault(); this.upload(files); }
      } },
    h("div", { class: "files-head" },
      h("strong", {}, "Files"),
      h("span", { class: "spacer" }),
      h("button", { testid: "files-up", title: "Up one folder", onclick: () => this.open(parent(this.folder)) }, "↑"),
      h("button", { testid: "files-mkdir", title: "New folder", onclick: () => this.mkdir() }, "New folder"),
      h("button", { class: "primary", testid: "files-upload", title: "Upload files (or drop or paste them here)", onclick: () => this.picker.click() }, "Upload"),
      this.viewButton,
      h("button", { testid: "files-refresh", title: "Refresh", onclick: () => this.refresh() }, "⟳"),
      this.picker),
    h("div", { class: "files-bar" }, this.search),
    this.crumbs,
    h("details", { class: "files-folders", open: true }, h("summary", {}, "Folders"), this.tree),
    this.transfers,
    this.body);
  }

  async load() {
    await Promise.all([this.open(""), this.loadTree(this.tree, "", 0)]);
  }

  toggleView() {
    this.view = this.view === "grid" ? "list" : "grid";
    localStorage.setItem("agentry.files.view", this.view);
    this.viewButton.textContent = this.view === "grid" ? "List" : "Grid";
    this.refresh();
  }

  refresh() {
    if (this.search.value.trim()) return this.runSearch();
    return this.open(this.folder);
  }

  /** The folder tree, one level at a time: a folder's children load when it opens. */
  async loadTree(into, path, depth) {
    let folders = [];
    try {
      folders = await call("GET", "/children", { query: { session_id: this.sessionId, path } });
    } catch (error) {
      if (!(error instanceof ApiError && error.status === 404)) clear(into).append(h("p", { class: "muted" }, errorText(error)));
      return;
    }
    clear(into);
    if (!folders.length && depth === 0) into.append(h("p", { class: "muted" }, "No folders."));
    for (const folder of folders) {
      const children = h("div", { class: "tree-children hidden", role: "group" });
      const toggle = h("button", { class: "tree-toggle", "aria-label": `Open ${folder.name}`, onclick: async () => {
        const opening = children.classList.contains("hidden");
        children.classList.toggle("hidden");
        toggle.textContent = opening ? "▾" : "▸";
        if (opening && !children.dataset.loaded) { children.dataset.loaded = "1"; await this.loadTree(children, folder.path, depth + 1); }
      } }, "▸");
      into.append(h("div", { class: "tree-node", role: "treeitem", testid: "tree-node", dataset: { path: folder.path } },
        h("div", { class: "tree-row" }, toggle, h("a", { href: "#", onclick: (event) => { event.preventDefault(); this.open(folder.path); } }, folder.name)),
        children));
    }
  }

  breadcrumbs() {
    const parts = this.folder ? this.folder.split("/") : [];
    clear(this.crumbs).append(
      h("a", { href: "#", onclick: (event) => { event.preventDefault(); this.open(""); } }, "workspace"),
      parts.map((part, i) => [" / ", h("a", { href: "#", onclick: (event) => { event.preventDefault(); this.open(parts.slice(0, i + 1).join("/")); } }, part)]));
  }

  /** Lists `folder` (every page of it). */
  async open(folder) {
    this.folder = folder;
    this.search.value = "";
    this.breadcrumbs();
    const files = [];
    try {
      for (let page = 1; page <= 100; page += 1) {
        const listing = await call("GET", "/list", { query: { session_id: this.sessionId, path: folder, page, page_size: 200 } });
        files.push(...listing.files);
        if (!listing.has_more) break;
      }
    } catch (error) {
      clear(this.body).append(h("p", { class: "muted", testid: "files-empty" },
        error instanceof ApiError && error.status === 404 ? "Nothing here yet: the workspace fills as the agent or you add files." : errorText(error)));
      return;
    }
    this.render(files);
  }

  async runSearch() {
    const query = this.search.value.trim();
    if (!query) return this.open(this.folder);
    try {
      const found = await call("GET", "/search", { query: { session_id: this.sessionId, path: this.folder, query } });
      clear(this.crumbs).append(h("span", {}, `Search: “${query}” in ${this.folder || "workspace"}`));
      this.render(found, true);
    } catch (error) {
      toast(errorText(error), "error");
    }
  }

  /** Draws entries as a list or a grid. */
  render(files, searching = false) {
    const items = files.map((entry) => this.view === "grid" ? this.tile(entry) : this.row(entry, searching));
    clear(this.body).append(items.length
      ? h("div", { class: `files-${this.view}`, testid: "files-list" }, items)
      : h("p", { class: "muted", testid: "files-empty" }, searching ? "No file matches." : "This folder is empty. Drop files here to upload them."));
  }

  activate(entry) {
    if (entry.is_dir) this.open(entry.path);
    else this.preview(entry);
  }

  actions(entry) {
    return h("span", { class: "file-actions" },
      h("button", { testid: "file-download", title: entry.is_dir ? "Download as a zip" : "Download", onclick: (event) => { event.stopPropagation(); this.download(entry); } }, "⤓"),
      h("button", { testid: "file-rename", title: "Rename", onclick: (event) => { event.stopPropagation(); this.rename(entry); } }, "Rename"),
      entry.is_dir ? null : h("button", { testid: "file-duplicate", title: "Duplicate", onclick: (event) => { event.stopPropagation(); this.duplicate(entry); } }, "Duplicate"),
      h("button", { class: "danger", testid: "file-delete", title: "Delete", onclick: (event) => { event.stopPropagation(); this.remove(entry); } }, "Delete"));
  }

  row(entry, searching) {
    return h("div", { class: "file-row", testid: "file", role: "button", tabindex: "0", dataset: { path: entry.path, dir: String(entry.is_dir) },
      onclick: () => this.activate(entry), onkeydown: (event) => { if (event.key === "Enter") this.activate(entry); } },
    h("span", { class: "file-icon" }, icon(entry)),
    h("span", { class: "file-name", testid: "file-name", title: entry.path }, searching ? entry.path : entry.name),
    h("span", { class: "file-size" }, entry.is_dir ? "" : size(entry.size)),
    h("span", { class: "file-time" }, entry.modified ? time(entry.modified) : ""),
    this.actions(entry));
  }

  tile(entry) {
    const picture = entry.is_image
      ? h("img", { loading: "lazy", alt: entry.name, src: `${BASE}/thumbnail?${qs({ session_id: this.sessionId, path: entry.path, size: 160 })}`,
        onerror: (event) => event.target.replaceWith(icon(entry)) })
      : icon(entry);
    return h("div", { class: "file-tile", testid: "file", role: "button", tabindex: "0", dataset: { path: entry.path, dir: String(entry.is_dir) },
      onclick: () => this.activate(entry), onkeydown: (event) => { if (event.key === "Enter") this.activate(entry); } },
    picture, h("span", { class: "file-name", testid: "file-name", title: entry.path }, entry.name),
    h("span", { class: "file-size" }, entry.is_dir ? "folder" : size(entry.size)), this.actions(entry));
  }

  contentUrl(entry, route = "content") {
    return `${BASE}/${route}?${qs({ session_id: this.sessionId, path: entry.path })}`;
  }

  /** Shows a file: text and code highlighted, Markdown rendered, images; the rest can be downloaded. */
  async preview(entry) {
    const kind = kindOf(entry);
    const content = h("div", { class: "preview-content", testid: "preview-content", dataset: { kind } });
    clear(this.body).append(h("div", { class: "files-preview", testid: "files-preview" },
      h("div", { class: "preview-head" },
        h("button", { testid: "preview-back", onclick: () => this.open(this.folder) }, "← Back"),
        h("strong", { class: "file-name", title: entry.path }, entry.name),
        h("span", { class: "muted" }, size(entry.size)),
        this.actions(entry)),
      content));
    if (kind === "image") {
      content.append(h("img", { src: this.contentUrl(entry), alt: entry.name }));
      return;
    }
    if (kind === "none") {
      content.append(h("p", { class: "muted" }, "No preview for this kind of file."));
      return;
    }
    try {
      const response = await fetch(this.contentUrl(entry), { credentials: "same-origin", headers: { range: `bytes=0-${PREVIEW_BYTES - 1}` } });
      if (!response.ok) throw new ApiError(response.status, await response.text());
      const text = await response.text();
      const cut = entry.size > PREVIEW_BYTES;
      if (kind === "markdown") content.append(h("div", { class: "markdown" }, markdown(text)));
      else {
        const lang = (entry.name.split(".").pop() || "").toLowerCase();
        content.append(h("pre", { class: "code" }, h("code", {}, highlight(text, lang))));
      }
      if (cut) content.append(h("p", { class: "muted" }, `Showing the first ${size(PREVIEW_BYTES)} of ${size(entry.size)}.`));
    } catch (error) {
      content.append(h("p", { class: "form-error" }, errorText(error)));
    }
  }

  download(entry) {
    const link = h("a", { href: this.contentUrl(entry, "download"), download: entry.is_dir ? `${entry.name}.zip` : entry.name, class: "hidden" });
    document.body.append(link);
    link.click();
    link.remove();
  }

  async mkdir() {
    const name = prompt("New folder's name");
    if (!name) return;
    try {
      await call("POST", "/mkdir", { body: { session_id: this.sessionId, parent_path: this.folder, name } });
      await Promise.all([this.refresh(), this.loadTree(this.tree, "", 0)]);
    } catch (error) { toast(errorText(error), "error"); }
  }

  async rename(entry) {
    const name = prompt(`Rename ${entry.name} to`, entry.name);
    if (!name || name === entry.name) return;
    try {
      await call("POST", "/rename", { body: { session_id: this.sessionId, path: entry.path, new_name: name } });
      toast(`Renamed to ${name}.`);
      await this.open(this.folder);
      if (entry.is_dir) await this.loadTree(this.tree, "", 0);
    } catch (error) { toast(errorText(error), "error"); }
  }

  async duplicate(entry) {
    try {
      await call("POST", "/duplicate", { body: { session_id: this.sessionId, path: entry.path } });
      await this.open(this.folder);
    } catch (error) { toast(errorText(error), "error"); }
  }

  async remove(entry) {
    if (!confirm(`Delete ${entry.path}${entry.is_dir ? " and everything in it" : ""}?`)) return;
    try {
      await call("DELETE", "/delete", { body: { session_id: this.sessionId, path: entry.path } });
      toast(`Deleted ${entry.name}.`);
      await this.open(this.folder);
      if (entry.is_dir) await this.loadTree(this.tree, "", 0);
    } catch (error) { toast(errorText(error), "error"); }
  }

  /** Uploads files into the open folder, one after another. */
  async upload(files) {
    for (const file of files) await this.uploadOne(file, this.folder);
    await this.open(this.folder);
  }

  /**
   * One file in chunks: a new upload, or the remembered one for this file (the server says
   * which chunks it has, and only the others are sent). A chunk that fails on the connection
   * or the server is sent again after a growing delay; the upload appears in the folder only
   * when complete.
   */
  async uploadOne(file, folder) {
    const target = join(folder, file.name);
    const key = resumeKey(this.sessionId, target, file);
    const bar = h("progress", { max: file.size || 1, value: 0, testid: "upload-progress" });
    const state = h("span", { class: "muted upload-state", testid: "upload-state" }, "starting…");
    const cancel = new AbortController();
    const stop = h("button", { class: "upload-cancel", testid: "upload-cancel", title: "Cancel the upload", onclick: () => cancel.abort() }, "×");
    const item = h("div", { class: "upload", testid: "upload", dataset: { name: file.name } },
      h("span", { class: "file-name" }, file.name), stop, bar, state);
    this.transfers.append(item);
    this.uploads.add(cancel);
    let plan = null;
    let missing = null;
    try {
      const remembered = localStorage.getItem(key);
      if (remembered) {
        try {
          const status = await call("GET", `/upload/${encodeURIComponent(remembered)}`);
          plan = { upload_id: remembered, parallel_size: status.chunk_size, chunk_count: status.chunk_count };
          missing = status.missing;
          state.textContent = `resuming (${status.received.length} of ${status.chunk_count} chunks already there)`;
        } catch { localStorage.removeItem(key); }
      }
      if (!plan) {
        plan = await call("POST", "/upload/init", { body: { session_id: this.sessionId, file_name: file.name, file_size: file.size, target_path: target } });
        missing = [...Array(plan.chunk_count).keys()];
        localStorage.setItem(key, plan.upload_id);
      }
      const chunkSize = plan.parallel_size;
      const sent = new Map();
      for (let n = 0; n < plan.chunk_count; n += 1) if (!missing.includes(n)) sent.set(n, Math.min(chunkSize, file.size - n * chunkSize));
      const show = () => {
        const done = [...sent.values()].reduce((a, b) => a + b, 0);
        bar.value = done;
        state.textContent = `${size(done)} of ${size(file.size)}`;
      };
      show();
      const queue = [...missing];
      const worker = async () => {
        while (queue.length) {
          const n = queue.shift();
          const blob = file.slice(n * chunkSize, Math.min(file.size, (n + 1) * chunkSize));
          for (let attempt = 1; ; attempt += 1) {
            try {
              await sendChunk(plan.upload_id, n, blob, (loaded) => { sent.set(n, loaded); show(); }, cancel.signal);
              sent.set(n, blob.size);
              show();
              break;
            } catch (error) {
              sent.set(n, 0);
              if (cancel.signal.aborted || attempt >= CHUNK_TRIES || !retryable(error)) throw error;
              state.textContent = `connection lost, retrying (${attempt})…`;
              item.dataset.retried = "true";
              await sleep(Math.min(8000, 250 * 2 ** attempt));
            }
          }
        }
      };
      await Promise.all(Array.from({ length: Math.min(PARALLEL, queue.length || 1) }, worker));
      await call("POST", `/upload/${encodeURIComponent(plan.upload_id)}/complete`);
      localStorage.removeItem(key);
      bar.value = bar.max;
      state.textContent = "done";
      item.dataset.done = "true";
      stop.remove();
      setTimeout(() => item.remove(), 4000);
    } catch (error) {
      if (cancel.signal.aborted) {
        if (plan) {
          localStorage.removeItem(key);
          call("DELETE", `/upload/${encodeURIComponent(plan.upload_id)}`).catch(() => {});
        }
        item.remove();
      } else {
        item.dataset.failed = "true";
        state.textContent = `failed: ${errorText(error)} (choose the file again to resume)`;
        toast(`${file.name}: ${errorText(error)}`, "error");
      }
    } finally {
      this.uploads.delete(cancel);
    }
  }

  destroy() {
    for (const cancel of this.uploads) cancel.abort();
  }
}
