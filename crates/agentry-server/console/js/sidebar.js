// The sessions sidebar: every session with its title and live status (from the status feed),
// unread markers, search (titles at once, then the sessions' text through the API).

import { get, post } from "./api.js";
import { h, clear, time } from "./dom.js";
import { bus } from "./app.js";

/** The status shown for a server status. */
export function shownStatus(status) {
  switch (status) {
    case "idle": return "done";
    case "failed": return "error";
    case "running": case "waiting": case "paused": case "interrupted": return status;
    default: return status || "idle";
  }
}

export class Sidebar {
  constructor(root) {
    this.root = root;
    this.sessions = new Map();
    this.current = null;
    this.query = "";
    this.matches = null;
    /** Feed changes received while a listing is on its way (see `load`). */
    this.arriving = null;
    this.search = h("input", { type: "search", testid: "session-search", placeholder: "Search sessions (Ctrl+K)", "aria-label": "Search sessions",
      oninput: () => this.filter() });
    this.list = h("nav", { class: "list", "aria-label": "Sessions" });
    clear(root).append(
      h("div", { class: "tools" },
        h("button", { class: "primary", testid: "new-chat", onclick: () => { location.hash = "#/chat"; } }, "+ New chat"),
        this.search),
      this.list);
    bus.addEventListener("status", (event) => this.onStatus(event.detail));
    bus.addEventListener("refresh", () => this.load());
  }

  async load() {
    // Changes the feed brings while the list is on its way are newer than it: applied again
    // after it.
    const arrived = [];
    this.arriving = arrived;
    try {
      const data = await get("/v1/sessions?limit=200");
      this.sessions.clear();
      for (const session of data.sessions || []) this.sessions.set(session.id, session);
    } catch { /* the status feed retries */ }
    if (this.arriving === arrived) this.arriving = null;
    for (const change of arrived) this.onStatus(change);
    this.render();
  }

  select(id) {
    this.current = id;
    const session = id && this.sessions.get(id);
    if (session && session.unread) {
      session.unread = false;
      post(`/v1/sessions/${id}/read`).catch(() => {});
    }
    this.render();
  }

  /** A session changed (its status, title, or it is new). Applied at once and in order: a new
   * session is listed straight away and its details (title, whether it is a linked sub-session)
   * are filled in when they arrive, so a later change never loses to an earlier one's fetch. */
  onStatus(change) {
    if (this.arriving) this.arriving.push(change);
    const id = change.session_id;
    let session = this.sessions.get(id);
    if (!session) {
      session = { id, created_at: Date.now() };
      this.sessions.set(id, session);
      this.details(session);
    }
    if (change.title) session.title = change.title;
    else if (!session.title) this.details(session);
    if (change.status && change.status !== "updated") {
      session.status = change.status;
      session.last_activity = Date.now();
      if (id !== this.current) session.unread = true;
      else if (change.status !== "running") post(`/v1/sessions/${id}/read`).catch(() => {});
    }
    this.render();
  }

  /** Fills in a session's title and whether it is a linked sub-session (not its status: the
   * feed owns that). */
  async details(session) {
    try {
      const detail = await get(`/v1/sessions/${session.id}`);
      if (detail.session.title) session.title = detail.session.title;
      if (detail.delegation || detail.group_member) session.hidden = true;
      this.render();
    } catch { /* gone, or not yet readable: the next change tries again */ }
  }

  async filter() {
    this.query = this.search.value.trim();
    this.matches = null;
    this.render();
    if (this.query.length < 2) return;
    const asked = this.query;
    try {
      const found = await get(`/v1/sessions/search?q=${encodeURIComponent(asked)}&limit=50`);
      if (asked !== this.query) return;
      this.matches = new Set((found.hits || []).map((hit) => hit.session_id));
      this.render();
    } catch { /* titles only */ }
  }

  render() {
    const query = this.query.toLowerCase();
    const sessions = [...this.sessions.values()]
      .filter((s) => !s.hidden)
      .filter((s) => !query || (s.title || "").toLowerCase().includes(query) || s.id.startsWith(query)
        || (this.matches && this.matches.has(s.id)))
      .sort((a, b) => (b.last_activity || b.created_at || 0) - (a.last_activity || a.created_at || 0));
    const items = sessions.map((s) => {
      const status = shownStatus(s.status);
      return h("a", {
        class: `session-item${s.id === this.current ? " current" : ""}`,
        href: `#/chat/${s.id}`, testid: "session-item",
        dataset: { sessionId: s.id, unread: s.unread ? "true" : "false" },
        title: `${s.title || "Untitled"} · ${time(s.last_activity)}`,
      },
      h("span", { class: "title", testid: "session-title" }, s.title || "Untitled"),
      h("span", { class: "status", testid: "session-status", dataset: { status } }, status));
    });
    clear(this.list).append(...(items.length ? items : [h("p", { class: "muted", style: "padding: 8px" }, query ? "No session matches." : "No sessions yet.")]));
  }

  /** Forgets a deleted session. */
  remove(id) {
    this.sessions.delete(id);
    if (this.current === id) this.current = null;
    this.render();
  }

  /** Adds or updates one session (the chat view made it). */
  upsert(session) {
    const known = this.sessions.get(session.id) || {};
    const merged = { ...known, ...session };
    // Once listed, a session's status follows the live feed, not an older snapshot.
    if (known.status) merged.status = known.status;
    // The open session is read (its mark-read request may not have landed yet).
    if (session.id === this.current) merged.unread = false;
    this.sessions.set(session.id, merged);
    this.render();
  }
}
