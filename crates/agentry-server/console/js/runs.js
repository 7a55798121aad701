// The Runs page: every run with a record, newest first — background runs (POST /v1/runs, and
// the ones schedules fire) and runs started in their sessions (chats, /v1/infer, delegated
// children, workflow steps) — with live states (the status feed, and a short poll for runs
// that have not ended), filters by kind, state and schedule, and a cancel button for runs
// that have not ended.

import { get, post } from "./api.js";
import { h, clear, toast, errorText, time } from "./dom.js";
import { bus } from "./app.js";

const STATES = ["queued", "running", "waiting", "paused", "succeeded", "failed", "cancelled"];
const ENDED = new Set(["succeeded", "failed", "cancelled"]);

export class RunsView {
  constructor(root, query) {
    const params = new URLSearchParams(query || "");
    this.schedule = params.get("schedule");
    this.state = "";
    this.kind = "";
    this.root = h("div", { class: "page runs", testid: "runs" });
    root.append(this.root);
    this.onStatus = () => this.load();
    bus.addEventListener("status", this.onStatus);
    bus.addEventListener("refresh", this.onStatus);
    this.timer = setInterval(() => { if (this.pending) this.load(); }, 1000);
    this.render();
    this.load();
  }

  close() {
    bus.removeEventListener("status", this.onStatus);
    bus.removeEventListener("refresh", this.onStatus);
    clearInterval(this.timer);
  }

  render() {
    const filter = h("select", { testid: "runs-state", "aria-label": "State", onchange: (event) => {
      this.state = event.target.value;
      this.load();
    } }, h("option", { value: "" }, "All states"), STATES.map((state) => h("option", { value: state }, state)));
    const kinds = h("select", { testid: "runs-kind", "aria-label": "Kind", onchange: (event) => {
      this.kind = event.target.value;
      this.load();
    } }, h("option", { value: "" }, "All runs"), h("option", { value: "true" }, "Background"), h("option", { value: "false" }, "In a session"));
    this.table = h("tbody", { testid: "runs-rows" });
    clear(this.root).append(
      h("div", { class: "page-head" },
        h("h2", {}, this.schedule ? "Runs of a schedule" : "Runs"),
        h("span", { class: "spacer" }),
        this.schedule ? h("a", { href: "#/runs", testid: "runs-all" }, "All runs") : null,
        kinds,
        filter),
      h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["Run", "Kind", "State", "Agent", "Session", "Created", "Attempt", ""].map((title) => h("th", {}, title)))),
        this.table),
      h("p", { class: "muted empty hidden", testid: "runs-empty" }, "No runs yet: chat with an agent, submit a background run with POST /v1/runs, or add a schedule."));
  }

  async load() {
    const params = new URLSearchParams({ limit: "100" });
    if (this.state) params.set("state", this.state);
    if (this.kind) params.set("background", this.kind);
    if (this.schedule) params.set("schedule_id", this.schedule);
    let runs;
    try {
      runs = (await get(`/v1/runs?${params}`)).runs;
    } catch (error) {
      toast(`Runs: ${errorText(error)}`, "error");
      return;
    }
    this.pending = runs.some((run) => !ENDED.has(run.state));
    clear(this.table).append(...runs.map((run) => this.row(run)));
    this.root.querySelector("[data-testid=runs-empty]").classList.toggle("hidden", runs.length > 0);
  }

  row(run) {
    const cancel = ENDED.has(run.state) ? null : h("button", { testid: "run-cancel", onclick: async () => {
      try {
        await post(`/v1/runs/${run.run_id}/cancel`);
        this.load();
      } catch (error) {
        toast(`Cancel: ${errorText(error)}`, "error");
      }
    } }, "Cancel");
    const outcome = run.outcome && (run.outcome.text || (run.outcome.error && run.outcome.error.message) || "");
    return h("tr", { testid: "run-row", dataset: { runId: run.run_id, state: run.state } },
      h("td", { title: run.run_id }, h("code", {}, run.run_id.slice(-12)), outcome ? h("div", { class: "muted clip" }, outcome) : null),
      h("td", { testid: "run-kind" }, run.background ? "background" : "session"),
      h("td", {}, h("span", { class: `badge state-${run.state}`, testid: "run-state" }, run.state)),
      h("td", {}, run.agent_id || ""),
      h("td", {}, h("a", { href: `#/chat/${run.session_id}` }, "open")),
      h("td", {}, time(run.created_at)),
      h("td", {}, run.background ? String(run.attempt) : ""),
      h("td", {}, cancel));
  }
}
