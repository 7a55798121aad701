// The terminal panel beside a chat: the session's PTY terminals (real shells in its sandbox) as
// tabs, each an xterm.js view on `/v1/terminals/{id}/ws`. A dropped connection is retried with
// a growing delay; the server replays the scrollback, so nothing shown is lost. Resizing the
// panel resizes the terminal (the program gets SIGWINCH).
import { Terminal } from "../vendor/xterm/xterm.mjs";
import { FitAddon } from "../vendor/xterm/addon-fit.mjs";
import { get, post, del } from "./api.js";
import { h, clear, toast, errorText } from "./dom.js";

const THEME = { background: "#1e1e1e", foreground: "#e6e6e6", cursor: "#e6e6e6" };

// xterm.js makes `<style>` elements for its theme: nonce.js stamps the page's nonce on them.
import "./nonce.js";

/** One terminal: its xterm view and the socket that drives it. */
class TerminalTab {
  constructor(panel, info) {
    this.panel = panel;
    this.id = info.terminal_id;
    this.closed = false;
    this.retry = 0;
    this.label = h("span", { title: (info.command || []).join(" ") }, info.label || "shell");
    this.state = h("span", { class: "terminal-state", testid: "terminal-state" }, "connecting…");
    this.tab = h("div", { class: "terminal-tab", role: "tab", testid: "terminal-tab", dataset: { terminal: this.id },
      onclick: () => panel.show(this) },
      this.label, this.state,
      h("button", { class: "icon-button", testid: "terminal-close", title: "Close this terminal (kills its programs)",
        onclick: (event) => { event.stopPropagation(); panel.remove(this, true); } }, "×"));
    this.body = h("div", { class: "terminal-body hidden", testid: "terminal-body", dataset: { terminal: this.id } });
    this.term = new Terminal({ cursorBlink: true, fontSize: 14, scrollback: 5000, theme: THEME,
      fontFamily: "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace" });
    this.fit = new FitAddon();
    this.term.loadAddon(this.fit);
    this.term.open(this.body);
    this.encoder = new TextEncoder();
    this.term.onData((data) => this.send(this.encoder.encode(data)));
    this.term.onBinary((data) => this.send(Uint8Array.from(data, (c) => c.charCodeAt(0))));
    this.term.onResize(({ cols, rows }) => this.sendJson({ type: "resize", cols, rows }));
    this.connect();
  }

  send(bytes) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.socket.send(bytes);
  }

  sendJson(message) {
    if (this.socket && this.socket.readyState === WebSocket.OPEN) this.socket.send(JSON.stringify(message));
  }

  setState(text, kind) {
    this.state.textContent = text;
    this.tab.dataset.state = kind;
  }

  connect() {
    if (this.closed) return;
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const socket = new WebSocket(`${scheme}://${location.host}/v1/terminals/${encodeURIComponent(this.id)}/ws`);
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    socket.onmessage = (event) => {
      if (typeof event.data !== "string") { this.term.write(new Uint8Array(event.data)); return; }
      let message;
      try { message = JSON.parse(event.data); } catch { this.term.write(event.data); return; }
      if (message.type === "attached") {
        // The scrollback follows: start from a clean screen so nothing shows twice.
        this.term.reset();
        this.retry = 0;
        this.setState("", "live");
        this.resize();
      } else if (message.type === "exit") {
        this.ended = true;
        const how = message.code != null ? `exited with ${message.code}` : `killed by signal ${message.signal}`;
        this.term.write(`\r\n\x1b[2m[the program ${how}]\x1b[0m\r\n`);
        this.setState("ended", "ended");
      }
    };
    socket.onclose = () => {
      if (this.socket !== socket || this.closed || this.ended) return;
      // Gone (the terminal was closed elsewhere, or the server restarted): stop trying.
      if (this.retry >= 8) { this.setState("disconnected", "lost"); return; }
      const delay = Math.min(500 * 2 ** this.retry, 5000);
      this.retry += 1;
      this.setState("reconnecting…", "reconnecting");
      this.timer = setTimeout(() => this.connect(), delay);
    };
  }

  resize() {
    if (this.body.classList.contains("hidden")) return;
    try { this.fit.fit(); } catch { /* not laid out yet */ }
  }

  dispose() {
    this.closed = true;
    clearTimeout(this.timer);
    if (this.socket) this.socket.close();
    this.term.dispose();
    this.tab.remove();
    this.body.remove();
  }
}

/** The panel: a tab per terminal of the session, a button for another one. */
export class TerminalPanel {
  constructor(sessionId) {
    this.sessionId = sessionId;
    this.tabs = [];
    this.tabBar = h("div", { class: "terminal-tabs", role: "tablist" });
    this.bodies = h("div", { class: "terminal-bodies" });
    this.el = h("section", { class: "terminal-panel", testid: "terminal-panel", "aria-label": "Terminals" },
      h("div", { class: "terminal-bar" }, this.tabBar,
        h("button", { testid: "terminal-new", title: "Open another terminal", onclick: () => this.add() }, "+ Terminal")),
      this.bodies);
    this.observer = new ResizeObserver(() => { if (this.current) this.current.resize(); });
    this.observer.observe(this.bodies);
  }

  /** Shows the session's terminals, opening one when it has none. */
  async load() {
    try {
      const listed = await get(`/v1/terminals?session_id=${encodeURIComponent(this.sessionId)}`);
      const alive = (listed.terminals || []).filter((t) => t.alive);
      if (!alive.length) return this.add();
      for (const info of alive) this.attach(info);
      this.show(this.tabs[0]);
    } catch (error) {
      toast(errorText(error), "error");
    }
  }

  async add() {
    try {
      const info = await post("/v1/terminals", { session_id: this.sessionId });
      this.show(this.attach(info));
    } catch (error) {
      toast(errorText(error), "error");
    }
  }

  attach(info) {
    const tab = new TerminalTab(this, info);
    this.tabs.push(tab);
    this.tabBar.append(tab.tab);
    this.bodies.append(tab.body);
    if (!this.current) this.show(tab);
    return tab;
  }

  show(tab) {
    this.current = tab;
    for (const other of this.tabs) {
      other.tab.classList.toggle("active", other === tab);
      other.body.classList.toggle("hidden", other !== tab);
    }
    tab.resize();
    tab.term.focus();
  }

  /** Removes a tab; `kill` closes the terminal on the server too. */
  async remove(tab, kill) {
    if (kill) {
      try { await del(`/v1/terminals/${encodeURIComponent(tab.id)}`); } catch (error) {
        if (error.status !== 404) { toast(errorText(error), "error"); return; }
      }
    }
    tab.dispose();
    this.tabs = this.tabs.filter((other) => other !== tab);
    if (this.current === tab) {
      this.current = null;
      if (this.tabs.length) this.show(this.tabs[0]);
    }
  }

  /** Leaves the terminals running (they can be attached again). */
  destroy() {
    this.observer.disconnect();
    for (const tab of this.tabs) tab.dispose();
    this.tabs = [];
    clear(this.el);
    this.el.remove();
  }
}
