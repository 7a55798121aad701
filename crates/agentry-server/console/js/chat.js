// The chat view: one session's transcript (from its log, then live), the composer (model or
// agent, tools, template, images), tool capsules, inline approvals and MCP elicitations,
// nested sub-agent progress, stop / continue / retry / fork.

import { get, post, del, stream, ApiError } from "./api.js";
import { h, clear, toast, errorText, json } from "./dom.js";
import { TerminalPanel } from "./terminal.js";
import { Recorder, MAX_SECONDS } from "./recorder.js";
import { FilesPanel } from "./files.js";
import { resizable } from "./resize.js";
import { markdown, safeUrl } from "./markdown.js";
import { bus } from "./app.js";

const PICK_KEY = "agentry.pick";

function textOf(parts) {
  return (parts || []).filter((p) => p.type === "text").map((p) => p.text).join("");
}

function resultText(result) {
  return (result.content || []).map((part) => {
    if (part.type === "text") return part.text;
    if (part.type === "json") return json(part.value);
    if (part.type === "image") return `[image ${part.media_type || ""}]`;
    return json(part);
  }).join("\n");
}

function preview(value) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  return text && text.length > 90 ? `${text.slice(0, 90)}…` : text || "";
}

/** The transcript: applies committed and live events to the DOM. */
class Transcript {
  constructor(root, view) {
    this.root = root;
    this.view = view;
    this.lastSeq = 0;
    this.capsules = new Map();
    this.streaming = null;
    this.runId = null;
    this.lastUserSeq = 0;
  }

  clearEmpty() { const empty = this.root.querySelector(".empty"); if (empty) empty.remove(); }

  scroll() {
    const near = this.root.scrollHeight - this.root.scrollTop - this.root.clientHeight < 160;
    if (near || this.view.sending) this.root.scrollTop = this.root.scrollHeight;
  }

  /** A committed event ({seq, event}). */
  committed(seq, event) {
    if (seq && seq <= this.lastSeq) return;
    if (seq) this.lastSeq = seq;
    this.clearEmpty();
    switch (event.type) {
      case "run_started": this.runId = event.run_id; this.removeNotices(); break;
      case "message": this.userMessage(seq, event.message, event.run_id); break;
      case "assistant_message": this.assistantMessage(seq, event); break;
      case "tool_call_intent": this.capsule(event.call.id, event.call.name, event.call.arguments, event.run_id); break;
      case "tool_call_result": this.toolResult(event); break;
      case "approval_requested": this.approvalRequested(event); break;
      case "approval_decided": this.approvalDecided(event); break;
      case "run_paused": this.notice("Paused.", [["Resume", () => this.view.control("resume")]]); break;
      case "run_resumed": this.removeNotices(); break;
      case "context_compacted": this.compacted(event); break;
      case "group": this.groupEvent(event.event); break;
      case "run_finished": this.runFinished(event); this.view.scheduleTurnFiles(); break;
      // Turns were revoked (here or in another tab): show the conversation as it now is.
      case "revoked": this.view.reload(); break;
      default: break;
    }
    this.scroll();
  }

  /** Where the conversation was compacted: a lasting notice, saying plainly when messages were
   * dropped without a summary. */
  compacted(event) {
    const tokens = `${event.tokens_before} → ${event.tokens_after} tokens`;
    // Events from before `dropped_messages` existed: no summary model means a drop.
    const dropped = event.dropped_messages
      || (event.summary_model ? null : { count: event.newly_covered });
    let text;
    if (dropped) {
      const n = dropped.count;
      text = `${n} earlier message${n === 1 ? " was" : "s were"} dropped to fit the context window`
        + ` (no summary kept${event.summary_error ? `: ${event.summary_error}` : ""}; ${tokens}).`;
    } else {
      const n = event.newly_covered;
      text = `${n} earlier message${n === 1 ? " was" : "s were"} summarised to fit the context window (${tokens}).`;
    }
    this.root.append(h("div", {
      class: `notice compaction${dropped ? " dropped" : ""}`, testid: "compaction-notice",
      dataset: { dropped: String(dropped ? dropped.count : 0) },
    }, text));
  }

  removeNotices() { this.root.querySelectorAll(".notice.run-end").forEach((n) => n.remove()); }

  notice(text, actions = [], kind = "") {
    const el = h("div", { class: `notice run-end ${kind}` }, text,
      actions.map(([label, fn, testid]) => h("button", { onclick: fn, testid }, label)));
    this.root.append(el);
    return el;
  }

  userMessage(seq, message, runId) {
    if (!message || message.role !== "user") return;
    this.lastUserSeq = seq;
    const images = (message.content || []).filter((p) => p.type === "image");
    const audio = (message.content || []).filter((p) => p.type === "audio" && /^[a-z0-9]{1,16}$/.test(p.format || ""));
    const el = h("div", { class: "message", testid: "message", dataset: { role: "user", seq: String(seq) } },
      h("div", { class: "bubble" },
        h("div", { class: "message-text", testid: "message-text" }, textOf(message.content)),
        images.map((img) => {
          const src = img.source && (img.source.url || (img.source.data && `data:${img.source.media_type};base64,${img.source.data}`));
          return src && /^(data:image\/|https?:)/.test(src) ? h("img", { class: "attachment", src, alt: "attached image" }) : null;
        }),
        audio.map((part) => h("audio", { class: "attachment", testid: "message-audio", controls: true, src: `data:audio/${part.format};base64,${part.data}` }))),
      h("div", { class: "actions" },
        h("button", { testid: "fork", title: "Fork the session from this message", onclick: () => this.view.fork(seq) }, "Fork"),
        runId ? h("button", { testid: "turn-files", class: "hidden", title: "What this turn changed in the workspace",
          onclick: () => this.view.toggleTurnFiles(el, runId) }, "Changes") : null,
        runId ? h("button", { testid: "revoke", title: "Take back this message and everything after it, and put back the files they changed",
          onclick: () => this.view.revoke(runId, textOf(message.content)) }, "Revoke") : null));
    if (runId) el.dataset.runId = runId;
    this.root.append(el);
  }

  /** The live assistant message (created on the first delta). */
  live() {
    if (this.streaming) return this.streaming;
    this.clearEmpty();
    const text = h("div", { class: "message-text", testid: "message-text" });
    const el = h("div", { class: "message streaming", testid: "message", dataset: { role: "assistant" } },
      h("div", { class: "bubble" }, text));
    this.root.append(el);
    this.streaming = { el, text, raw: "", thinking: null, thinkingRaw: "", frame: 0 };
    return this.streaming;
  }

  delta(text) {
    const live = this.live();
    live.raw += text;
    if (!live.frame) {
      live.frame = requestAnimationFrame(() => {
        live.frame = 0;
        clear(live.text).append(markdown(live.raw));
        this.scroll();
      });
    }
  }

  thinkingDelta(text) {
    const live = this.live();
    if (!live.thinking) {
      live.thinkingBody = h("div", { class: "body" });
      live.thinking = h("details", { class: "thinking", testid: "thinking" }, h("summary", {}, "Thinking…"), live.thinkingBody);
      live.text.before(live.thinking);
    }
    live.thinkingRaw += text;
    live.thinkingBody.textContent = live.thinkingRaw;
  }

  assistantMessage(seq, event) {
    let el;
    let textEl;
    if (this.streaming) {
      cancelAnimationFrame(this.streaming.frame);
      ({ el } = this.streaming);
      textEl = this.streaming.text;
      if (this.streaming.thinking) this.streaming.thinking.remove();
      el.classList.remove("streaming");
      this.streaming = null;
    } else {
      textEl = h("div", { class: "message-text", testid: "message-text" });
      el = h("div", { class: "message", testid: "message", dataset: { role: "assistant" } }, h("div", { class: "bubble" }, textEl));
      this.root.append(el);
    }
    el.dataset.seq = String(seq);
    const bubble = el.querySelector(".bubble");
    clear(textEl).append(markdown(textOf(event.content)));
    if (!textOf(event.content)) textEl.classList.add("hidden");
    for (const part of event.content || []) {
      if (part.type === "thinking") {
        const body = part.text || part.summary || (part.kind === "redacted" ? "(redacted)" : "");
        textEl.before(h("details", { class: "thinking", testid: "thinking" }, h("summary", {}, "Thinking"), h("div", { class: "body" }, body)));
      }
    }
    for (const part of event.content || []) {
      if (part.type === "tool_call") bubble.append(this.capsule(part.id, part.name, part.arguments, event.run_id).el);
    }
    this.root.querySelectorAll("[data-testid=retry]").forEach((b) => b.remove());
    el.querySelector(".actions")?.remove();
    el.append(h("div", { class: "actions" },
      h("button", { testid: "fork", title: "Fork the session from here", onclick: () => this.view.fork(seq) }, "Fork"),
      h("button", { testid: "retry", title: "Answer again (in a fork)", onclick: () => this.view.retry(this.lastUserSeq) }, "Retry")));
    el.dataset.userSeq = String(this.lastUserSeq);
  }

  /** The capsule of call `id` of run `runId` (default: the current run): call ids repeat across runs. */
  capsule(id, name, args, runId = this.runId) {
    const key = `${runId}/${id}`;
    let capsule = this.capsules.get(key);
    if (capsule) return capsule;
    const state = h("span", { class: "state", testid: "tool-status" }, "running");
    const argsEl = h("pre", { testid: "tool-args" }, json(args));
    const resultEl = h("pre", { testid: "tool-result" }, "…");
    const nested = h("div", { class: "nested" });
    const extra = h("div", { class: "extra" });
    const el = h("details", { class: "capsule", testid: "tool-capsule", dataset: { tool: name, state: "running", callId: id } },
      h("summary", {}, h("span", { class: "name" }, name), h("span", { class: "preview" }, preview(args)), state),
      h("div", { class: "tool-details", testid: "tool-details" },
        h("div", { class: "label" }, "Arguments"), argsEl,
        h("div", { class: "label" }, "Result"), resultEl, nested));
    el.append(extra);
    capsule = { el, state, argsEl, resultEl, nested, extra, nestedRuns: new Map() };
    this.capsules.set(key, capsule);
    if (!el.isConnected) {
      const host = this.streaming ? this.streaming.el.querySelector(".bubble") : this.root;
      host.append(el);
    }
    return capsule;
  }

  setState(capsule, value, label) {
    capsule.el.dataset.state = value;
    capsule.state.textContent = label || value;
  }

  toolResult(event) {
    const result = event.result;
    const capsule = this.capsule(result.call_id, result.name || "tool", {}, event.run_id);
    capsule.resultEl.textContent = resultText(result);
    this.setState(capsule, result.is_error ? "error" : "ok", `${result.is_error ? "error" : "ok"} · ${event.duration_ms} ms`);
  }

  approvalRequested(event) {
    const capsule = this.capsule(event.call.id, event.call.name, event.call.arguments, event.run_id);
    this.setState(capsule, "waiting", "waiting for approval");
    this.approvalWidget(capsule, event.run_id, event.call, event.reason);
  }

  approvalWidget(capsule, runId, call, reason) {
    if (capsule.approval) return;
    const reasonInput = h("input", { testid: "reject-reason", placeholder: "Why (the model reads it)", "aria-label": "Reason" });
    const editArea = h("textarea", { testid: "edit-args", "aria-label": "Arguments (JSON)" }, json(call.arguments));
    const editBox = h("div", { class: "hidden" }, editArea,
      h("div", { class: "buttons" }, h("button", { class: "primary", testid: "edit-submit", onclick: () => {
        let args;
        try { args = JSON.parse(editArea.value); } catch { toast("The arguments must be JSON", "error"); return; }
        decide({ decision: "edit", arguments: args });
      } }, "Run with these arguments")));
    const buttons = h("div", { class: "buttons" },
      h("button", { class: "primary", testid: "approve", onclick: () => decide({ decision: "approve" }) }, "Approve"),
      h("button", { class: "danger", testid: "reject", onclick: () => decide({ decision: "reject", reason: reasonInput.value || undefined }) }, "Reject"),
      reasonInput,
      h("button", { testid: "edit", onclick: () => editBox.classList.toggle("hidden") }, "Edit"));
    const el = h("div", { class: "approval", testid: "approval", dataset: { approvalId: call.id, runId } },
      h("div", {}, h("strong", {}, `${call.name} needs approval`), reason ? h("span", { class: "muted" }, ` — ${reason}`) : null),
      buttons, editBox);
    const decide = async (body) => {
      el.querySelectorAll("button").forEach((b) => { b.disabled = true; });
      try {
        const outcome = await post(`/v1/runs/${runId}/approvals`, { call_id: call.id, ...body });
        if (outcome.status === "running") this.view.attach();
      } catch (error) {
        toast(errorText(error), "error");
        el.querySelectorAll("button").forEach((b) => { b.disabled = false; });
      }
    };
    capsule.approval = el;
    capsule.extra.append(el);
    capsule.el.open = true;
  }

  approvalDecided(event) {
    const capsule = this.capsules.get(`${event.run_id}/${event.call_id}`);
    if (!capsule) return;
    if (capsule.approval) {
      const words = { approve: "Approved", reject: "Rejected", edit: "Approved with edited arguments" };
      clear(capsule.approval).append(h("span", { class: "decided", testid: "approval-decided" },
        `${words[event.decision] || event.decision}${event.reason ? `: ${event.reason}` : ""}`));
      capsule.approval.dataset.decided = event.decision;
    }
    if (event.decision === "reject") this.setState(capsule, "error", "rejected");
    else this.setState(capsule, "running");
    if (event.arguments) capsule.argsEl.textContent = json(event.arguments);
  }

  /** An MCP server's request for input during a call. */
  elicitation(data, runId) {
    const capsule = this.capsule(data.call_id, "tool", {}, runId || this.runId);
    if (capsule.extra.querySelector(`[data-elicitation-id="${data.elicitation_id}"]`)) return;
    this.setState(capsule, "waiting", "needs input");
    const fields = [];
    const form = h("div", { class: "rows" });
    const schema = data.requested_schema || {};
    for (const [name, field] of Object.entries(schema.properties || {})) {
      const label = field.title || name;
      let input;
      const choices = field.enum || (field.oneOf || field.anyOf || []).map((c) => c.const).filter((c) => c !== undefined);
      if (field.type === "boolean") input = h("input", { type: "checkbox", checked: field.default === true });
      else if (choices.length) input = h("select", {}, choices.map((c) => h("option", { value: c, selected: c === field.default }, String(c))));
      else input = h("input", { type: field.type === "integer" || field.type === "number" ? "number" : "text", value: field.default ?? "" });
      input.dataset.field = name;
      fields.push([name, field, input]);
      form.append(h("label", {}, `${label}${(schema.required || []).includes(name) ? " *" : ""} `, input,
        field.description ? h("span", { class: "hint" }, ` ${field.description}`) : null));
    }
    const answer = async (decision) => {
      const body = { elicitation_id: data.elicitation_id, decision };
      if (decision === "approve" && data.mode === "form") {
        body.content = {};
        for (const [name, field, input] of fields) {
          if (field.type === "boolean") body.content[name] = input.checked;
          else if (input.value === "") continue;
          else if (field.type === "integer") body.content[name] = parseInt(input.value, 10);
          else if (field.type === "number") body.content[name] = Number(input.value);
          else if (field.type === "array") body.content[name] = input.value.split(",").map((s) => s.trim()).filter(Boolean);
          else body.content[name] = input.value;
        }
      }
      try {
        await post(`/v1/runs/${runId || this.runId}/approvals`, body);
      } catch (error) { toast(errorText(error), "error"); }
    };
    const el = h("div", { class: "approval", testid: "elicitation", dataset: { elicitationId: data.elicitation_id } },
      h("div", {}, h("strong", {}, `${data.server} asks: `), data.message),
      data.url ? h("p", {}, safeUrl(data.url)
        ? h("a", { href: safeUrl(data.url), target: "_blank", rel: "noopener noreferrer" }, data.url)
        : h("span", { class: "muted" }, `${data.url} (not an http or https link, not opened)`)) : null,
      form,
      h("div", { class: "buttons" },
        h("button", { class: "primary", testid: "approve", onclick: () => answer("approve") }, data.mode === "url" ? "Done" : "Send"),
        h("button", { class: "danger", testid: "reject", onclick: () => answer("reject") }, "Decline")));
    capsule.extra.append(el);
    capsule.el.open = true;
  }

  elicitationResolved(data) {
    this.root.querySelectorAll(`[data-elicitation-id="${data.elicitation_id}"]`).forEach((el) => el.remove());
    const capsule = this.capsules.get(`${this.runId}/${data.call_id}`);
    if (capsule && capsule.el.dataset.state === "waiting") this.setState(capsule, "running");
  }

  /** A sub-agent's event, inside the capsule of the call that started it. */
  nested(data) {
    const capsule = this.capsule(data.call_id, "delegate", {});
    let run = capsule.nestedRuns.get(data.session_id);
    if (!run) {
      const text = h("div", { class: "message-text" });
      const el = h("div", { class: "nested-run", testid: "nested-run", dataset: { sessionId: data.session_id } },
        h("div", { class: "who" }, `${data.agent_id || "sub-agent"} · depth ${data.depth} · `,
          h("a", { href: `#/chat/${data.session_id}` }, "open")), text);
      capsule.nested.append(el);
      run = { el, text, raw: "", steps: h("div") };
      el.append(run.steps);
      capsule.nestedRuns.set(data.session_id, run);
    }
    const inner = data.event;
    if (inner.type === "text_delta") { run.raw += inner.text; clear(run.text).append(markdown(run.raw)); }
    else if (inner.type === "nested") {
      // A grandchild: shown under the child's run as a line.
      run.steps.append(h("div", { class: "who" }, `↳ ${inner.agent_id || "sub-agent"}: ${inner.event.type}`));
    } else if (inner.type === "tool_call_started") run.steps.append(h("div", { class: "who" }, `→ ${inner.call?.name || inner.name || "tool"}`));
    else if (inner.type === "committed" && inner.event?.type === "tool_call_intent") run.steps.append(h("div", { class: "who" }, `→ ${inner.event.call.name}`));
    else if (inner.type === "assistant_message") { run.raw = textOf(inner.content) || run.raw; clear(run.text).append(markdown(run.raw)); }
    else if (inner.type === "run_finished" || inner.type === "run_failed") run.el.dataset.done = "true";
    capsule.el.open = true;
  }

  /** A group member answering (live): its text so far, until its message is committed. */
  memberDelta(data) {
    this.clearEmpty();
    this.typing = this.typing || new Map();
    let live = this.typing.get(data.agent_id);
    if (!live) {
      const text = h("div", { class: "message-text" });
      const el = h("div", { class: "message streaming", dataset: { role: "assistant" } },
        h("div", { class: "who muted" }, data.name || data.agent_id), h("div", { class: "bubble" }, text));
      this.root.append(el);
      live = { el, text, raw: "" };
      this.typing.set(data.agent_id, live);
    }
    if (data.text) {
      live.raw += data.text;
      clear(live.text).append(markdown(live.raw));
    }
    this.scroll();
  }

  /** A group chat's step: a round starting, a member's (or the user's) message, the end. */
  groupEvent(event) {
    const live = this.typing && event.agent_id && this.typing.get(event.agent_id);
    if (live && event.kind === "message") { live.el.remove(); this.typing.delete(event.agent_id); }
    if (event.kind === "round") {
      this.root.append(h("div", { class: "notice" }, `Round ${event.round}: ${(event.members || []).join(", ")}`));
    } else if (event.kind === "message") {
      const role = event.agent_id ? "assistant" : "user";
      this.root.append(h("div", { class: "message", testid: "message", dataset: { role, member: event.name || "" } },
        h("div", { class: "who muted" }, event.name || event.agent_id || "user"),
        h("div", { class: "bubble" }, h("div", { class: "message-text", testid: "message-text" },
          role === "user" ? event.text || "" : markdown(event.text || "")))));
    } else if (event.kind === "finished") {
      this.root.append(h("div", { class: "notice" }, `Group exchange ${event.stop_reason === "completed" ? "finished" : event.stop_reason} after ${event.rounds} round${event.rounds === 1 ? "" : "s"}.`));
    }
  }

  runFinished(event) {
    if (this.streaming) {
      this.streaming.el.classList.remove("streaming");
      if (!this.streaming.raw) this.streaming.el.remove();
      this.streaming = null;
    }
    for (const capsule of this.capsules.values()) {
      if (capsule.el.dataset.state === "running") this.setState(capsule, "error", "interrupted");
    }
    const reason = event.stop_reason;
    if (event.error) {
      this.notice(`The run failed: ${event.error.message || event.error.code}`,
        [["Retry", () => this.view.retry(this.lastUserSeq), "retry-run"], ["Continue", () => this.view.continueRun(), "continue"]], "error");
    } else if (reason === "cancelled") {
      this.notice("Stopped.", [["Continue", () => this.view.continueRun(), "continue"]]);
    } else if (reason && reason !== "completed") {
      this.notice(`The run ended: ${reason.replace(/_/g, " ")}.`, [["Continue", () => this.view.continueRun(), "continue"]]);
    }
  }
}

/** The events that make up the conversation now: what a later `revoked` cut off is left out. */
function effective(events) {
  const kept = [];
  for (const item of events) {
    if (item.event.type === "revoked") {
      while (kept.length && kept[kept.length - 1].seq > item.event.after_seq) kept.pop();
      continue;
    }
    kept.push(item);
  }
  return kept;
}

export class ChatView {
  constructor(root, sessionId, sidebar) {
    this.root = root;
    this.sessionId = sessionId;
    this.sidebar = sidebar;
    // Titles the person saved here: a session read begun before one must not put the old back.
    this.renames = 0;
    this.controller = null;
    this.sending = false;
    this.images = [];
    this.audio = null;
    this.closed = false;
    this.build();
    this.onStatus = (event) => this.statusChanged(event.detail);
    bus.addEventListener("status", this.onStatus);
    this.onKey = (event) => {
      if (event.key === "Escape" && !this.toolMenu.classList.contains("hidden")) { this.toolMenu.classList.add("hidden"); return; }
      if (event.key === "Escape" && this.controller) { event.preventDefault(); this.stop(); }
    };
    document.addEventListener("keydown", this.onKey);
    // The tool menu closes on a click anywhere else.
    this.onClick = (event) => {
      if (!event.target.closest("[data-testid=tool-picker]")) this.toolMenu.classList.add("hidden");
    };
    document.addEventListener("click", this.onClick);
    this.loadPickers();
    if (sessionId) this.load();
  }

  /** Opens (the first time: loads) or hides the session's Files panel. */
  toggleFiles() {
    if (!this.sessionId) return;
    if (!this.files) {
      this.files = new FilesPanel(this.sessionId);
      const handle = h("div", { class: "resize-handle", testid: "files-resize", "aria-label": "Resize the Files panel" });
      resizable(handle, { key: "agentry.files.width", initial: 420, min: 260, max: () => Math.max(320, window.innerWidth - 520),
        edge: "right", apply: (width) => this.filesSlot.style.setProperty("width", `${width}px`) });
      this.filesSlot.append(handle, this.files.el);
      this.filesSlot.classList.remove("hidden");
      this.filesButton.classList.add("active");
      this.files.load();
      return;
    }
    this.filesSlot.classList.toggle("hidden");
    this.filesButton.classList.toggle("active", !this.filesSlot.classList.contains("hidden"));
    if (!this.filesSlot.classList.contains("hidden")) this.files.refresh();
  }

  /** Opens (the first time: loads) or hides the session's terminal panel. */
  toggleTerminal() {
    if (!this.sessionId) return;
    if (!this.terminals) {
      this.terminals = new TerminalPanel(this.sessionId);
      this.terminalSlot.append(this.terminals.el);
      this.terminalSlot.classList.remove("hidden");
      this.terminals.load();
      return;
    }
    this.terminalSlot.classList.toggle("hidden");
    if (!this.terminalSlot.classList.contains("hidden") && this.terminals.current) this.terminals.show(this.terminals.current);
  }

  /** Shows a title the server sent, unless one is being typed: the edit stays open (a title
   * generated after the first turn used to replace the field under the typing), and leaving it
   * unsaved shows the server's. */
  showTitle(text) {
    if (this.title.querySelector("input")) this.serverTitle = text;
    else this.title.textContent = text;
  }

  /** Edits the title in place: Enter saves it, Escape (or leaving the field) keeps the old one. */
  rename() {
    if (!this.sessionId || this.title.querySelector("input")) return;
    const old = this.title.textContent;
    this.serverTitle = null;
    const input = h("input", { testid: "title-input", "aria-label": "Session title", value: old === "…" ? "" : old, maxlength: 200 });
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      const title = input.value.trim();
      this.title.textContent = save && title ? title : this.serverTitle || old;
      if (!save || !title || title === old) return;
      this.renames += 1;
      try {
        await post(`/v1/sessions/${this.sessionId}/title`, { title });
        if (this.sidebar) this.sidebar.upsert({ id: this.sessionId, title });
      } catch (error) {
        this.title.textContent = old;
        toast(errorText(error), "error");
      }
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") { event.preventDefault(); finish(true); }
      if (event.key === "Escape") { event.preventDefault(); event.stopPropagation(); finish(false); }
    });
    input.addEventListener("blur", () => finish(false));
    clear(this.title).append(input);
    input.focus();
    input.select();
  }

  /** Deletes the session (after a confirmation) and goes back to a new chat. */
  async deleteSession() {
    if (!this.sessionId || !confirm("Delete this session? Its conversation and log are removed.")) return;
    try {
      await del(`/v1/sessions/${this.sessionId}`);
    } catch (error) {
      toast(errorText(error), "error");
      return;
    }
    if (this.sidebar) this.sidebar.remove(this.sessionId);
    toast("Session deleted.");
    location.hash = "#/chat";
  }

  close() {
    this.closed = true;
    if (this.terminals) this.terminals.destroy();
    if (this.files) this.files.destroy();
    bus.removeEventListener("status", this.onStatus);
    document.removeEventListener("keydown", this.onKey);
    document.removeEventListener("click", this.onClick);
    if (this.controller) this.controller.abort();
  }

  build() {
    this.title = h("h1", {}, this.sessionId ? "…" : "New chat");
    this.traceLink = h("a", { testid: "open-trace", href: this.sessionId ? `#/trace/${this.sessionId}` : "#/chat", class: this.sessionId ? "" : "hidden" }, "Trace");
    this.terminalButton = h("button", { testid: "open-terminal", class: this.sessionId ? "" : "hidden",
      title: "A real shell in this session's sandbox", onclick: () => this.toggleTerminal() }, "Terminal");
    this.terminalSlot = h("div", { class: "terminal-slot hidden" });
    this.filesButton = h("button", { testid: "open-files", class: this.sessionId ? "" : "hidden",
      title: "This session's workspace: browse, preview, upload, download", onclick: () => this.toggleFiles() }, "Files");
    this.filesSlot = h("aside", { class: "files-slot hidden" });
    this.renameButton = h("button", { testid: "rename-session", class: this.sessionId ? "" : "hidden", title: "Rename this session",
      onclick: () => this.rename() }, "Rename");
    this.deleteButton = h("button", { testid: "delete-session", class: `danger${this.sessionId ? "" : " hidden"}`, title: "Delete this session and its log",
      onclick: () => this.deleteSession() }, "Delete");
    this.transcriptEl = h("div", { class: "transcript", role: "log", "aria-live": "polite" },
      this.sessionId ? null : h("div", { class: "empty" }, h("h2", {}, "What should we work on?"), h("p", {}, "Pick a model or an agent, then write below. Ctrl+Enter sends, Esc stops.")));
    this.transcript = new Transcript(this.transcriptEl, this);
    this.picker = h("select", { testid: "model-picker", "aria-label": "Model or agent", onchange: () => this.pickChanged() });
    // Shown while the server has no model: in full, wrapping, never clipped by the picker.
    this.noModelHint = h("div", { class: "no-model-hint hidden", testid: "no-model-hint", role: "note" },
      "No model yet: ", h("a", { href: "#/settings/models" }, "add one in Settings → Models"),
      " (a provider's URL, its model name and an API key secret), then pick it here.");
    this.toolMenu = h("div", { class: "menu-list hidden" });
    this.toolButton = h("button", { type: "button", onclick: () => this.toolMenu.classList.toggle("hidden") }, "No tools");
    this.templatePicker = h("select", { testid: "template-picker", "aria-label": "Prompt template", onchange: () => this.templateChanged() }, h("option", { value: "" }, "No template"));
    this.vars = h("div", { class: "vars" });
    this.thumbs = h("div", { class: "thumbs" });
    this.input = h("textarea", { testid: "composer", rows: 2, placeholder: "Message…", "aria-label": "Message",
      onkeydown: (event) => {
        if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) { event.preventDefault(); this.send(); }
      },
      oninput: () => { this.input.style.height = "auto"; this.input.style.height = `${Math.min(this.input.scrollHeight, 240)}px`; },
      onpaste: (event) => this.paste(event) });
    this.attach_ = h("input", { type: "file", accept: "image/*", multiple: true, testid: "attach", class: "hidden", onchange: () => this.addFiles(this.attach_.files) });
    this.sendButton = h("button", { class: "primary", testid: "send", onclick: () => this.send(), title: "Send (Ctrl+Enter)" }, "Send");
    this.stopButton = h("button", { class: "danger hidden", testid: "stop", onclick: () => this.stop(), title: "Stop (Esc)" }, "Stop");
    this.root.append(h("div", { class: "chat-area" }, h("div", { class: "chat", testid: "chat" },
      h("div", { class: "chat-head" }, this.title, this.renameButton, this.deleteButton, this.filesButton, this.terminalButton, this.traceLink),
      this.transcriptEl,
      this.terminalSlot,
      h("div", { class: "composer" }, this.noModelHint,
        h("div", { class: "options" }, this.picker,
          h("div", { class: "tool-picker", testid: "tool-picker" }, this.toolButton, this.toolMenu),
          this.templatePicker,
          h("button", { type: "button", onclick: () => this.attach_.click(), title: "Attach images" }, "Attach"), this.attach_,
          this.recordButton = h("button", { type: "button", testid: "record", title: "Record a voice message (sent to models that take audio, else transcribed by the speech model)",
            onclick: () => this.toggleRecording() }, "Record")),
        this.vars, this.thumbs,
        h("div", { class: "input-row" }, this.input, this.stopButton, this.sendButton),
        h("div", { class: "hint" }, "Ctrl+Enter to send · Esc to stop · paste images"))), this.filesSlot));
  }

  async loadPickers() {
    const [models, agents, tools, templates] = await Promise.all([
      get("/v1/models").catch(() => ({ models: [] })),
      get("/v1/agents").catch(() => ({ agents: [] })),
      get("/v1/tools").catch(() => ({ tools: [] })),
      get("/v1/prompt-templates").catch(() => ({ templates: [] })),
    ]);
    if (this.closed) return;
    const saved = localStorage.getItem(PICK_KEY);
    clear(this.picker).append(
      h("optgroup", { label: "Models" }, (models.models || []).map((m) => h("option", { value: `model:${m.id}` }, `${m.id} (${m.model_name})`))),
      h("optgroup", { label: "Agents" }, (agents.agents || []).map((a) => h("option", { value: `agent:${a.id}` }, `${a.nickname ? `@${a.nickname}` : a.id} — agent`))));
    if (saved && [...this.picker.options].some((o) => o.value === saved)) this.picker.value = saved;
    if (!this.picker.options.length) this.picker.append(h("option", { value: "" }, "No model yet"));
    this.noModelHint.classList.toggle("hidden", (models.models || []).length > 0);
    // Least privilege: a run gets exactly the tools checked here; "All tools" is an explicit
    // choice (`"*"`), never what an empty list means.
    const risk = (tool) => (tool.runs_on_host ? "runs on the host" : (tool.risk || "").replace("_", " "));
    clear(this.toolMenu).append(h("div", { class: "hint" }, "None checked: no tools (an agent brings its own)."),
      h("label", { title: "Every registered tool, including those that run commands or reach the network" },
        h("input", { type: "checkbox", dataset: { tool: "*" }, onchange: () => this.toolsChanged() }), h("strong", {}, "All tools")),
      ...(tools.tools || []).map((tool) => h("label", { title: tool.description },
        h("input", { type: "checkbox", dataset: { tool: tool.name }, onchange: () => this.toolsChanged() }), tool.name,
        risk(tool) ? h("span", { class: "muted", dataset: { risk: tool.risk || "" } }, ` · ${risk(tool)}`) : null)));
    for (const template of templates.templates || []) {
      const name = template.name || template;
      this.templatePicker.append(h("option", { value: name }, name));
    }
    this.pickChanged();
  }

  pickChanged() {
    if (this.picker.value) localStorage.setItem(PICK_KEY, this.picker.value);
    const agent = this.picker.value.startsWith("agent:");
    this.toolButton.disabled = agent;
    this.toolButton.title = agent ? "The agent's tools" : "Tools offered";
  }

  toolsChanged() {
    const all = this.toolMenu.querySelector('input[data-tool="*"]:checked');
    const n = this.toolMenu.querySelectorAll("input:checked").length;
    this.toolButton.textContent = all ? "All tools" : n ? `${n} tool${n > 1 ? "s" : ""}` : "No tools";
  }

  async templateChanged() {
    clear(this.vars);
    const name = this.templatePicker.value;
    if (!name) return;
    try {
      const data = await get(`/v1/prompt-templates/${encodeURIComponent(name)}/variables`);
      for (const variable of data.variables || []) {
        this.vars.append(h("input", { dataset: { var: variable }, placeholder: variable, "aria-label": variable }));
      }
    } catch (error) { toast(errorText(error), "error"); }
  }

  /** Starts recording from the microphone, or stops and attaches the take. */
  async toggleRecording() {
    if (this.recorder) {
      const recorder = this.recorder;
      this.recorder = null;
      clearInterval(this.recordTimer);
      this.recordButton.textContent = "Record";
      this.recordButton.classList.remove("recording");
      try {
        this.setAudio(await recorder.stop());
      } catch (error) {
        toast(`The recording failed: ${errorText(error)}`, "error");
      }
      return;
    }
    const recorder = new Recorder();
    try {
      await recorder.start();
    } catch (error) {
      toast(`Cannot record: ${errorText(error)}`, "error");
      return;
    }
    this.recorder = recorder;
    this.recordButton.classList.add("recording");
    const tick = () => {
      const seconds = recorder.elapsed();
      this.recordButton.textContent = `Stop ${Math.floor(seconds / 60)}:${String(seconds % 60).padStart(2, "0")}`;
      if (seconds >= MAX_SECONDS) this.toggleRecording();
    };
    tick();
    this.recordTimer = setInterval(tick, 500);
  }

  /** Attaches a recording (a data: URL), replacing any earlier one; `null` removes it. */
  setAudio(url) {
    this.audio = url;
    this.thumbs.querySelector("[data-testid=audio-attachment]")?.remove();
    if (!url) return;
    this.thumbs.append(h("span", { class: "audio-chip", testid: "audio-attachment" },
      h("audio", { controls: true, src: url }),
      h("button", { type: "button", testid: "remove-audio", title: "Remove the recording", onclick: () => this.setAudio(null) }, "×")));
  }

  paste(event) {
    const files = [...(event.clipboardData?.files || [])].filter((f) => f.type.startsWith("image/"));
    if (files.length) { event.preventDefault(); this.addFiles(files); }
  }

  addFiles(files) {
    for (const file of files) {
      if (!file.type.startsWith("image/")) continue;
      if (file.size > 3 * 1024 * 1024) { toast(`${file.name} is over 3 MB`, "error"); continue; }
      const reader = new FileReader();
      reader.onload = () => {
        this.images.push(reader.result);
        this.thumbs.append(h("img", { src: reader.result, alt: file.name, title: "Click to remove", onclick: (event) => {
          const i = [...this.thumbs.children].indexOf(event.target);
          this.images.splice(i, 1);
          event.target.remove();
        } }));
      };
      reader.readAsDataURL(file);
    }
    this.attach_.value = "";
  }

  async load() {
    const renames = this.renames;
    try {
      const [detail, events] = await Promise.all([
        get(`/v1/sessions/${this.sessionId}`),
        get(`/v1/sessions/${this.sessionId}/events`),
      ]);
      if (this.closed) return;
      // Renamed here while the session was loading: the title typed is newer than the one read.
      const renamed = this.renames !== renames;
      if (!renamed) this.showTitle(detail.session.title || "Untitled");
      if (detail.group) this.becomeGroup(detail.group);
      if (this.sidebar) this.sidebar.upsert(renamed ? { ...detail.session, title: this.title.textContent } : detail.session);
      for (const item of effective(events.events || [])) this.transcript.committed(item.seq, item.event);
      if (events.events && events.events.length) this.transcript.lastSeq = events.events[events.events.length - 1].seq;
      if (!(events.events || []).length) this.transcriptEl.append(h("div", { class: "empty" }, "This session is empty."));
      const status = detail.session.status;
      if (status === "running") this.attach();
      else if (status === "waiting") this.loadApprovals();
      this.transcriptEl.scrollTop = this.transcriptEl.scrollHeight;
    } catch (error) {
      this.transcriptEl.append(h("div", { class: "notice error" }, errorText(error)));
    }
  }

  /** A group session: messages go to the group (its members answer), not to one model. */
  becomeGroup(group) {
    this.group = group;
    this.picker.classList.add("hidden");
    this.toolButton.parentElement.classList.add("hidden");
    this.templatePicker.classList.add("hidden");
    const names = (group.members || []).map((m) => `@${m.nickname || m.name || m.agent_id || m.id || m}`);
    this.input.placeholder = `Message the group (${[...names, "@all"].join(", ")})`;
  }

  /** Shows the transcript again from the log (after a revocation). */
  reload() {
    if (this.closed || !this.sessionId || this.reloading) return;
    this.reloading = true;
    if (this.controller) this.controller.abort();
    clear(this.transcriptEl);
    this.transcript = new Transcript(this.transcriptEl, this);
    this.load().finally(() => { this.reloading = false; });
  }

  /** [`markTurnFiles`] soon, once for a burst of finished runs. */
  scheduleTurnFiles() {
    if (this.turnFilesTimer || !this.sessionId) return;
    this.turnFilesTimer = setTimeout(() => { this.turnFilesTimer = null; if (!this.closed) this.markTurnFiles(); }, 200);
  }

  /** Reveals "Changes" on the messages whose turn changed files in the workspace. */
  async markTurnFiles() {
    let journal;
    try { journal = await get(`/v1/sessions/${this.sessionId}/file-journals`); } catch { return; }
    for (const turn of journal.turns || []) {
      const message = this.transcriptEl.querySelector(`[data-testid=message][data-run-id="${turn.run_id}"]`);
      const button = message && message.querySelector("[data-testid=turn-files]");
      if (button && turn.files.length) {
        button.classList.remove("hidden");
        button.textContent = `Changes (${turn.files.length})`;
      }
    }
  }

  /** Shows (or hides) a turn's file changes as diffs under its message. */
  async toggleTurnFiles(message, runId) {
    const open = message.querySelector(".turn-files");
    if (open) { open.remove(); return; }
    try {
      const diff = await get(`/v1/sessions/${this.sessionId}/file-journals/${encodeURIComponent(runId)}`);
      const line = (text) => h("span", { class: text.startsWith("+") && !text.startsWith("+++") ? "add"
        : text.startsWith("-") && !text.startsWith("---") ? "del" : text.startsWith("@@") ? "hunk" : "" }, `${text}\n`);
      message.append(h("div", { class: "turn-files", testid: "turn-diff" },
        (diff.files || []).map((file) => h("details", { open: true, dataset: { path: file.path } },
          h("summary", {}, h("strong", {}, file.path), ` — ${file.change_type}${file.kind !== "file" ? ` ${file.kind}` : ""}`),
          file.diff ? h("pre", { class: "diff" }, file.diff.split("\n").filter((t, i, all) => t || i < all.length - 1).map(line))
            : h("div", { class: "hint" }, file.binary ? "binary or large file" : "")))));
    } catch (error) { toast(errorText(error), "error"); }
  }

  /** Revokes a turn (and every later one): the files go back, the conversation too. */
  async revoke(runId, text) {
    if (!confirm("Take back this message and everything after it? The files those turns changed are put back as they were.")) return;
    let outcome;
    try {
      outcome = await post(`/v1/sessions/${this.sessionId}/revoke`, { run_id: runId });
    } catch (error) {
      const conflict = error.status === 409 && error.body && error.body.error && error.body.error.code === "journal_conflict";
      if (!conflict) { toast(errorText(error), "error"); return; }
      const files = (error.body.error.details && error.body.error.details.files) || [];
      if (!confirm(`These files were changed since: ${files.join(", ")}. Put them back anyway (their changes are lost)?`)) return;
      try { outcome = await post(`/v1/sessions/${this.sessionId}/revoke`, { run_id: runId, force: true }); } catch (again) { toast(errorText(again), "error"); return; }
    }
    const restored = outcome.files ? outcome.files.restored.length + outcome.files.removed.length : 0;
    toast(`Revoked ${outcome.removed_count} message(s)${restored ? `, ${restored} file change(s) undone` : ""}.`);
    // As the seed does: the revoked message goes back to the composer, to edit and send again.
    if (!this.input.value) this.input.value = text || "";
    this.reload();
  }

  /** Shows what waits in the session (calls and elicitations), e.g. after a reload. */
  async loadApprovals() {
    try {
      const waiting = await get(`/v1/sessions/${this.sessionId}/approvals`);
      for (const pending of waiting.pending || []) {
        const capsule = this.transcript.capsule(pending.call.id, pending.call.name, pending.call.arguments, waiting.run_id);
        this.transcript.setState(capsule, "waiting", "waiting for approval");
        this.transcript.approvalWidget(capsule, waiting.run_id, pending.call, pending.reason);
      }
      for (const asked of waiting.elicitations || []) this.transcript.elicitation(asked, asked.run_id);
    } catch { /* not waiting */ }
  }

  statusChanged(change) {
    if (!this.sessionId || change.session_id !== this.sessionId) return;
    if (change.title) this.showTitle(change.title);
    else if (this.title.textContent === "New chat") {
      const renames = this.renames;
      get(`/v1/sessions/${this.sessionId}`).then((detail) => {
        // Not over a rename made while this was on its way.
        if (detail.session.title && !this.closed && this.renames === renames) this.showTitle(detail.session.title);
      }).catch(() => {});
    }
    if (change.status === "running" && !this.controller) this.attach();
    if (change.status === "waiting") this.loadApprovals();
  }

  setBusy(busy) {
    this.stopButton.classList.toggle("hidden", !busy);
    this.sendButton.disabled = busy;
  }

  /** Follows the session's live run (a second tab, a reload, an approved call). */
  async attach() {
    if (!this.sessionId || this.controller || this.closed) return;
    const controller = new AbortController();
    this.controller = controller;
    this.setBusy(true);
    try {
      await stream("GET", `/v1/sessions/${this.sessionId}/stream?after=${this.transcript.lastSeq}`, undefined,
        (name, data) => this.event(name, data), { signal: controller.signal });
    } catch (error) {
      if (!controller.signal.aborted) toast(errorText(error), "error");
    } finally {
      if (this.controller === controller) { this.controller = null; this.setBusy(false); }
    }
  }

  event(name, data) {
    const t = this.transcript;
    if (data && typeof data === "object" && "seq" in data && data.event) { t.committed(data.seq, data.event); return; }
    switch (name) {
      case "delta.text": t.delta(data.text); break;
      case "delta.thinking": t.thinkingDelta(data.text); break;
      case "nested": t.nested(data); break;
      case "group.speaking": t.memberDelta({ ...data, text: "" }); break;
      case "group.delta": t.memberDelta(data); break;
      case "elicitation.requested": t.elicitation(data, t.runId); break;
      case "elicitation.resolved": t.elicitationResolved(data); break;
      case "run.waiting": {
        const event = data.event || data;
        for (const pending of event.pending || []) {
          const capsule = t.capsule(pending.call.id, pending.call.name, pending.call.arguments, event.run_id);
          t.setState(capsule, "waiting", "waiting for approval");
          t.approvalWidget(capsule, event.run_id, pending.call, pending.reason);
        }
        break;
      }
      case "error": toast(data.message || errorText(data), "error"); break;
      default: break;
    }
  }

  requestBody() {
    const pick = this.picker.value;
    const body = { session_id: this.sessionId || "new", cancel_on_disconnect: false };
    if (pick.startsWith("agent:")) body.agent_id = pick.slice(6);
    else if (pick.startsWith("model:")) body.model_id = pick.slice(6);
    const tools = [...this.toolMenu.querySelectorAll("input:checked")].map((i) => i.dataset.tool);
    // Always an explicit list for a model (an agent brings its own tools).
    if (!body.agent_id) body.tool_ids = tools.includes("*") ? ["*"] : tools;
    const text = this.input.value.trim();
    const template = this.templatePicker.value;
    if (template) {
      const args = {};
      this.vars.querySelectorAll("input[data-var]").forEach((i) => { args[i.dataset.var] = i.value; });
      body.messages = [{ role: "user", prompt_template: template, arguments: args, images: this.images }];
    } else if (this.images.length || this.audio) {
      body.messages = [{ role: "user", content: text, images: this.images }];
    } else {
      body.text = text;
    }
    if (this.audio && body.messages) body.messages[0].audio = this.audio;
    return { body, empty: !text && !template && !this.images.length && !this.audio };
  }

  async send() {
    if (this.controller) return;
    const { body, empty } = this.requestBody();
    if (empty) { this.input.focus(); return; }
    if (this.group) { this.sendToGroup(); return; }
    if (!body.model_id && !body.agent_id) { toast("Add a model in Settings first.", "error"); return; }
    const controller = new AbortController();
    this.controller = controller;
    this.sending = true;
    this.setBusy(true);
    const sentText = this.input.value;
    this.input.value = "";
    this.images = [];
    this.audio = null;
    clear(this.thumbs);
    try {
      await stream("POST", "/v1/infer/stream", body, (name, data) => {
        if (name === "session" && data.session_id) this.adopt(data.session_id);
        else this.event(name, data);
      }, { signal: controller.signal });
    } catch (error) {
      if (!controller.signal.aborted) {
        if (error instanceof ApiError && !this.transcript.lastSeq) this.input.value = sentText;
        toast(errorText(error), "error");
      }
    } finally {
      this.sending = false;
      if (this.controller === controller) { this.controller = null; this.setBusy(false); }
    }
  }

  async sendToGroup() {
    const controller = new AbortController();
    this.controller = controller;
    this.setBusy(true);
    const text = this.input.value.trim();
    this.input.value = "";
    try {
      await stream("POST", `/v1/groups/${this.sessionId}/messages/stream`, { text },
        (name, data) => this.event(name, data), { signal: controller.signal });
    } catch (error) {
      if (!controller.signal.aborted) { this.input.value = text; toast(errorText(error), "error"); }
    } finally {
      if (this.controller === controller) { this.controller = null; this.setBusy(false); }
    }
  }

  /** The run made a new session: it becomes this view's, without reloading. */
  adopt(id) {
    if (this.sessionId === id) return;
    this.sessionId = id;
    history.replaceState(null, "", `#/chat/${id}`);
    this.traceLink.href = `#/trace/${id}`;
    this.traceLink.classList.remove("hidden");
    this.terminalButton.classList.remove("hidden");
    this.filesButton.classList.remove("hidden");
    this.renameButton.classList.remove("hidden");
    this.deleteButton.classList.remove("hidden");
    this.title.textContent = "New chat";
    if (this.sidebar) {
      // Its status comes from the status feed, which may already have reported it.
      this.sidebar.upsert({ id, last_activity: Date.now() });
      this.sidebar.select(id);
    }
  }

  async stop() {
    if (!this.sessionId) { if (this.controller) this.controller.abort(); return; }
    try {
      await post("/v1/infer/abort", { session_id: this.sessionId });
    } catch (error) {
      if (this.controller) this.controller.abort();
      toast(errorText(error), "error");
    }
  }

  async control(action) {
    const runId = this.transcript.runId;
    if (!runId) return;
    try {
      await post(`/v1/runs/${runId}/${action}`);
      this.attach();
    } catch (error) { toast(errorText(error), "error"); }
  }

  async continueRun() {
    try {
      await post(`/v1/sessions/${this.sessionId}/continue`);
      this.transcript.removeNotices();
      this.attach();
    } catch (error) { toast(errorText(error), "error"); }
  }

  async fork(seq) {
    try {
      const fork = await post(`/v1/sessions/${this.sessionId}/fork`, { at_seq: seq });
      const id = fork.session_id || fork.id || (fork.session && fork.session.id);
      toast("Forked.");
      location.hash = `#/chat/${id}`;
      return id;
    } catch (error) { toast(errorText(error), "error"); return null; }
  }

  /** Answers the last user message again, in a fork that ends with it. */
  async retry(userSeq) {
    if (!userSeq) return;
    try {
      const fork = await post(`/v1/sessions/${this.sessionId}/fork`, { at_seq: userSeq });
      const id = fork.session_id || fork.id || (fork.session && fork.session.id);
      await post(`/v1/sessions/${id}/continue`);
      location.hash = `#/chat/${id}`;
    } catch (error) { toast(errorText(error), "error"); }
  }
}
