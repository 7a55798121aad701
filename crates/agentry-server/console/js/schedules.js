// The Schedules page: the schedules (a cron expression in a time zone, or an interval) with
// their next fire, a form that adds one (checked by the server: bad cron, zone or run are
// refused with the reason), links to each one's runs, and delete.

import { get, post, del } from "./api.js";
import { h, clear, toast, errorText, time } from "./dom.js";

function timing(schedule) {
  if (schedule.cron) return `${schedule.cron} (${schedule.timezone})`;
  return `every ${schedule.interval_secs} s`;
}

function next(schedule) {
  if (!schedule.enabled) return "disabled";
  const at = schedule.next_fires[0];
  if (!at) return "no further fire";
  const secs = Math.max(0, Math.ceil((at - Date.now()) / 1000));
  return secs < 120 ? `in ${secs} s` : `${new Date(at).toLocaleString()}`;
}

export class SchedulesView {
  constructor(root) {
    this.root = h("div", { class: "page schedules", testid: "schedules" });
    root.append(this.root);
    this.timer = setInterval(() => this.load(), 5000);
    this.render();
    this.load();
  }

  close() { clearInterval(this.timer); }

  render() {
    const field = (name, label, props = {}) => h("label", {}, label, h("input", { name, "aria-label": label, ...props }));
    const error = h("div", { class: "form-error", testid: "form-error" });
    const form = h("form", { class: "card", testid: "schedule-form", onsubmit: async (event) => {
      event.preventDefault();
      error.textContent = "";
      const data = new FormData(form);
      const text = (name) => (data.get(name) || "").toString().trim();
      const run = { text: text("text") };
      if (text("agent_id")) run.agent_id = text("agent_id");
      if (text("model_id")) run.model_id = text("model_id");
      const body = { run, timezone: text("timezone") || "UTC" };
      if (text("name")) body.name = text("name");
      if (text("cron")) body.cron = text("cron");
      if (text("interval_secs")) body.interval_secs = Number(text("interval_secs"));
      try {
        await post("/v1/schedules", body);
        form.reset();
        this.load();
      } catch (err) {
        error.textContent = errorText(err);
      }
    } },
    h("h3", {}, "Add a schedule"),
    field("name", "Name", { placeholder: "standup" }),
    field("cron", "Cron", { placeholder: "0 9 * * MON-FRI" }),
    field("timezone", "Time zone", { placeholder: "UTC" }),
    field("interval_secs", "Or every (seconds)", { type: "number", min: "1" }),
    field("agent_id", "Agent", { placeholder: "an agent id" }),
    field("model_id", "Model", { placeholder: "default" }),
    field("text", "Message", { required: true, placeholder: "Summarise yesterday's sessions." }),
    error,
    h("button", { class: "primary", type: "submit", testid: "schedule-add" }, "Add"));
    this.list = h("tbody", { testid: "schedule-rows" });
    clear(this.root).append(
      h("div", { class: "page-head" }, h("h2", {}, "Schedules")),
      h("table", { class: "grid" },
        h("thead", {}, h("tr", {}, ["Name", "When", "Next", "Last fired", "", ""].map((title) => h("th", {}, title)))),
        this.list),
      form);
  }

  async load() {
    let schedules;
    try {
      schedules = (await get("/v1/schedules")).schedules;
    } catch (error) {
      toast(`Schedules: ${errorText(error)}`, "error");
      return;
    }
    clear(this.list).append(...schedules.map((schedule) => h("tr", { testid: "schedule-row", dataset: { scheduleId: schedule.id } },
      h("td", {}, schedule.name),
      h("td", {}, timing(schedule)),
      h("td", { testid: "schedule-next" }, next(schedule)),
      h("td", {}, time(schedule.last_fire_at)),
      h("td", {}, schedule.workflow
        ? h("a", { href: "#/workflows", testid: "schedule-runs" }, `Workflow ${schedule.workflow.workflow_id}`)
        : h("a", { href: `#/runs/schedule=${encodeURIComponent(schedule.id)}`, testid: "schedule-runs" }, "Runs")),
      h("td", {}, h("button", { testid: "schedule-delete", onclick: async () => {
        try {
          await del(`/v1/schedules/${encodeURIComponent(schedule.id)}`);
          this.load();
        } catch (error) {
          toast(`Delete: ${errorText(error)}`, "error");
        }
      } }, "Delete")))));
  }
}
