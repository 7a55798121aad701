// Settings: models (with a connection test, edit and copy), tools (with a call test, edit),
// MCP servers, skills, prompt templates (edit), agents (edit), secrets (write-only), API keys,
// sandbox capabilities.
// Each form's inputs are named after the API body's fields; list fields take comma-separated
// text, object fields JSON. Editing fills the form from the saved entry and saves it with PUT,
// keeping the fields the form does not show. Every field that takes a secret's name (a model's
// API key, an MCP server's header or variable, an HTTP tool's header) offers New secret…, the
// Secrets page's form in a dialog.

import { get, post, put, del } from "./api.js";
import { h, clear, toast, errorText, json, time } from "./dom.js";

const SECTIONS = [
  ["models", "Models"], ["tools", "Tools"], ["mcp", "MCP servers"], ["skills", "Skills"],
  ["templates", "Templates"], ["agents", "Agents"], ["secrets", "Secrets"], ["keys", "API keys"],
  ["sandbox", "Sandbox"],
];

const list = (text) => text.split(",").map((s) => s.trim()).filter(Boolean);

function field(label, input, wide = false) {
  return h("label", { class: wide ? "wide" : "" }, label, input);
}

/** A form whose submit runs `save(values)`; `values` maps input names to their text. */
function form(testid, fields, save, submitLabel = "Save") {
  const error = h("div", { class: "form-error", testid: "form-error", role: "alert" });
  const el = h("form", { class: "grid", testid, onsubmit: async (event) => {
    event.preventDefault();
    error.textContent = "";
    const values = {};
    for (const input of el.querySelectorAll("[name]")) values[input.name] = input.type === "checkbox" ? input.checked : input.value.trim();
    try {
      await save(values, el);
    } catch (err) {
      error.textContent = errorText(err);
    }
  } }, fields, h("div", { class: "form-actions" }, h("button", { class: "primary", type: "submit", testid: "save" }, submitLabel), error));
  return el;
}

function parseJson(text, what) {
  if (!text) return undefined;
  try { return JSON.parse(text); } catch { throw new Error(`${what} must be JSON`); }
}

/**
 * The form that sets a secret (`POST /v1/env`: name, value, optional hosts): the Secrets page's,
 * and the one a secret-name field opens. `saved(name)` runs once the server has it.
 */
function secretForm(saved, name = "") {
  return form("secret-form", [
    field("Name", h("input", { name: "name", required: true, placeholder: "OPENAI_API_KEY", value: name })),
    field("Value", h("input", { name: "value", type: "password", required: true, autocomplete: "off" })),
    field("Only sent to hosts (optional, comma-separated)",
      h("input", { name: "hosts", placeholder: "api.openai.com, *.example.com" })),
  ], async (v) => {
    const hosts = list(v.hosts || "");
    await post("/v1/env", hosts.length ? { name: v.name, value: v.value, hosts } : { name: v.name, value: v.value });
    toast(`Secret ${v.name} saved.`);
    saved(v.name);
  });
}

/**
 * `input` (a field that takes a secret's name) with New secret…: a dialog holding the Secrets
 * page's form, after which the field holds the new secret's name — no trip to the Secrets page
 * and back.
 */
function secretName(input) {
  const open = () => {
    const dialog = h("dialog", { class: "secret-dialog", testid: "secret-dialog", "aria-label": "New secret", onclose: () => dialog.remove() });
    const done = (name) => {
      input.value = name;
      input.dispatchEvent(new Event("input", { bubbles: true }));
      dialog.close();
      input.focus();
    };
    dialog.append(h("h3", {}, "New secret"),
      h("p", { class: "muted" }, "Its value is write-only: never shown again. This field will hold its name."),
      secretForm(done, input.value.trim()),
      h("button", { type: "button", testid: "cancel-secret", onclick: () => dialog.close() }, "Cancel"));
    document.body.append(dialog);
    dialog.showModal();
    dialog.querySelector(input.value.trim() ? "[name=value]" : "[name=name]").focus();
  };
  return h("span", { class: "secret-name" }, input,
    h("button", { type: "button", testid: "new-secret", title: "Create a secret and put its name here", onclick: open }, "New secret…"));
}

/** The label known to the runtime, and what it means (shown as hints and badges). */
const MODEL_LABELS = {
  vision: "takes images", audio: "takes audio", thinking: "reasons before answering",
  summary: "writes summaries and titles", "read-image": "describes images for models without vision",
  speech: "transcribes audio for models without audio",
};

/**
 * Fills `el` (a form) with `values` for editing the entry `editing` (or, without it, for a new
 * entry such as a copy), and retitles its card. The original entry is kept on the form, so a
 * save keeps what the form does not show.
 */
function fill(el, values, editing, heading) {
  for (const input of el.querySelectorAll("[name]")) {
    const value = values[input.name];
    if (input.type === "checkbox") input.checked = Boolean(value);
    else if (value === undefined || value === null) input.value = "";
    else if (Array.isArray(value)) input.value = value.join(", ");
    else if (typeof value === "object") input.value = JSON.stringify(value, null, 2);
    else input.value = String(value);
  }
  el.original = values;
  if (editing) el.dataset.editing = editing; else delete el.dataset.editing;
  // An entry keeps its id while edited (a copy is a new entry, under a new id).
  for (const input of el.querySelectorAll("input[name=id], input[name=name]")) input.readOnly = Boolean(editing);
  const card = el.closest(".card");
  const title = card?.querySelector("h3");
  if (title) title.textContent = heading;
  el.querySelector("[data-testid=save]").textContent = editing ? "Save changes" : "Save";
  card?.querySelector("[data-testid=cancel-edit]")?.classList.remove("hidden");
  card?.scrollIntoView({ block: "center" });
  el.querySelector("[name]:not([readonly])")?.focus();
}

/** A card holding `formEl` under `heading`, with a Cancel that empties the form again. */
function formCard(heading, formEl, reload, ...extra) {
  return h("div", { class: "card" }, h("h3", {}, heading), ...extra, formEl,
    h("button", { class: "hidden", type: "button", testid: "cancel-edit", onclick: () => reload() }, "Cancel editing"));
}

/** The saved entry with the form's values over it; a field set to `undefined` is dropped. */
function merged(el, values) {
  const body = { ...(el.original || {}), ...values };
  for (const key of Object.keys(body)) if (body[key] === undefined) delete body[key];
  return body;
}

/** POST a new entry to `collection`, or PUT the one being edited. */
async function saveEntry(el, collection, body) {
  const editing = el.dataset.editing;
  if (editing) return put(`${collection}/${encodeURIComponent(editing)}`, body);
  return post(collection, body);
}

/** Whether a tool is one of the configured ones (an HTTP or command tool), which may be edited. */
const configured = (tool) => !["builtin", "mcp", "skill"].includes(tool.kind);

function row(id, meta, ...actions) {
  return h("div", { class: "row", testid: "row", dataset: { id } }, h("span", { class: "id" }, id), h("span", { class: "meta" }, meta), ...actions);
}

function deleteButton(path, reload, what) {
  return h("button", { class: "danger", testid: "delete", onclick: async () => {
    if (!confirm(`Delete ${what}?`)) return;
    try { await del(path); toast(`Deleted ${what}.`); reload(); } catch (error) { toast(errorText(error), "error"); }
  } }, "Delete");
}

export class SettingsView {
  constructor(root, section) {
    this.root = root;
    this.section = SECTIONS.some(([key]) => key === section) ? section : "models";
    this.body = h("section", {});
    root.append(h("div", { class: "page" }, h("div", { class: "settings", testid: "settings" },
      h("nav", { "aria-label": "Settings" }, SECTIONS.map(([key, label]) =>
        h("a", { href: `#/settings/${key}`, testid: `settings-${key}`, class: key === this.section ? "active" : "" }, label))),
      this.body)));
    this.render();
  }

  async render() {
    const reload = () => this.render();
    const title = SECTIONS.find(([key]) => key === this.section)[1];
    const content = h("div");
    clear(this.body).append(h("h2", {}, title), content);
    try {
      await this[this.section](content, reload);
    } catch (error) {
      content.append(h("div", { class: "form-error load-error", role: "alert" }, errorText(error)));
    }
  }

  async models(root, reload) {
    const { models } = await get("/v1/models");
    root.append(h("div", { class: "card" }, h("div", { class: "rows" }, models.length ? models.map((m) => {
      const result = h("span", { class: "result", testid: "test-result" });
      return row(m.id, h("span", {}, `${m.default ? "default · " : ""}${m.protocol} · ${m.model_name}${m.base_url ? ` · ${m.base_url}` : ""}${m.context_window ? ` · ${m.context_window} tokens` : ""}`,
        (m.labels || []).map((label) => h("span", { class: "badge", testid: "model-label", title: MODEL_LABELS[label] || "your label" }, label))),
        result,
        h("button", { testid: "test", onclick: async () => {
          result.textContent = "testing…";
          delete result.dataset.ok;
          try {
            const outcome = await post(`/v1/models/${encodeURIComponent(m.id)}/test`);
            result.dataset.ok = String(outcome.ok !== false);
            result.textContent = outcome.ok === false ? `failed: ${outcome.error || ""}` : `ok · ${outcome.latency_ms} ms`;
          } catch (error) {
            result.dataset.ok = "false";
            result.textContent = errorText(error);
          }
        } }, "Test"),
        h("button", { testid: "edit", onclick: () => fill(modelForm, m, m.id, `Edit model ${m.id}`) }, "Edit"),
        h("button", { testid: "copy", title: "A new model with these settings", onclick: () => fill(modelForm, { ...m, id: `${m.id}-copy`, default: false }, null, `Copy of ${m.id}`) }, "Copy"),
        deleteButton(`/v1/models/${encodeURIComponent(m.id)}`, reload, `model ${m.id}`));
    }) : h("p", { class: "muted" }, "No model yet."))));
    const modelForm = form("model-form", [
      field("Id", h("input", { name: "id", required: true, placeholder: "gpt" })),
      field("Protocol", h("select", { name: "protocol" }, ["openai", "openai-responses", "anthropic", "ollama", "a2a"].map((p) => h("option", { value: p }, p)))),
      field("Model name", h("input", { name: "model_name", required: true, placeholder: "gpt-4.1-mini" })),
      field("Base URL", h("input", { name: "base_url", placeholder: "https://api.openai.com/v1" })),
      field("API key secret (a secret's name)", secretName(h("input", { name: "api_key_secret", placeholder: "OPENAI_API_KEY" }))),
      field("Context window (tokens; empty: what the provider states, else the known one)", h("input", { name: "context_window", type: "number", min: 256 })),
      field("Labels (comma-separated: vision, audio, thinking, summary, read-image, speech, or your own)", h("input", { name: "labels", testid: "model-labels", placeholder: "vision, thinking" }), true),
      field("Default model (used when a run names none; else the first registered)", h("input", { name: "default", type: "checkbox" })),
    ], async (v, el) => {
      const body = merged(el, {
        id: v.id, protocol: v.protocol, model_name: v.model_name,
        base_url: v.base_url || undefined, api_key_secret: v.api_key_secret || undefined,
        context_window: v.context_window ? Number(v.context_window) : undefined,
        default: v.default || undefined, labels: list(v.labels),
      });
      await saveEntry(el, "/v1/models", body);
      toast(el.dataset.editing ? `Model ${v.id} saved.` : `Model ${v.id} added.`);
      reload();
    });
    root.append(formCard("Add a model", modelForm, reload));
  }

  async tools(root, reload) {
    const { tools } = await get("/v1/tools");
    root.append(h("div", { class: "card" }, h("div", { class: "rows" }, tools.map((tool) => {
      const args = h("textarea", { name: "arguments", "aria-label": `Arguments of ${tool.name}`, rows: 2 }, "{}");
      const result = h("pre", { class: "result hidden", testid: "call-result" });
      const box = h("div", { class: "hidden", style: "flex-basis: 100%" }, args,
        h("button", { class: "primary", onclick: async () => {
          result.classList.remove("hidden");
          result.textContent = "calling…";
          try {
            const outcome = await post("/v1/tools/call", { tool_id: tool.name, arguments: parseJson(args.value, "The arguments") || {} });
            result.dataset.ok = "true";
            result.textContent = typeof outcome.result === "string" ? outcome.result : json(outcome);
          } catch (error) {
            result.dataset.ok = "false";
            result.textContent = errorText(error);
          }
        } }, "Run"), result);
      return h("div", { class: "row", testid: "row", dataset: { id: tool.name } },
        h("span", { class: "id" }, tool.name), h("span", { class: "meta", title: tool.description }, `${tool.kind} · ${tool.description || ""}`),
        h("button", { testid: "call", onclick: () => box.classList.toggle("hidden") }, "Call"),
        configured(tool) ? h("button", { testid: "edit", onclick: async () => {
          try {
            const definition = await get(`/v1/tools/${encodeURIComponent(tool.name)}`);
            fill(toolForm, { definition }, tool.name, `Edit tool ${tool.name}`);
          } catch (error) { toast(errorText(error), "error"); }
        } }, "Edit") : null,
        configured(tool) ? deleteButton(`/v1/tools/${encodeURIComponent(tool.name)}`, reload, `tool ${tool.name}`) : null,
        box);
    }))));
    const toolForm = form("tool-form", [
      field("Definition", h("textarea", { name: "definition", rows: 8, placeholder: '{"name": "weather", "description": "…", "kind": "http", "url": "https://…", "parameters": {"type": "object", "properties": {}}}' }), true),
    ], async (v, el) => {
      const definition = parseJson(v.definition, "The definition");
      await saveEntry(el, "/v1/tools", definition);
      toast(el.dataset.editing ? `Tool ${definition.name} saved.` : `Tool ${definition.name} added.`);
      reload();
    });
    // An HTTP tool's header from a secret, written into the definition as {"secret": NAME}.
    const headerName = h("input", { placeholder: "Authorization", "aria-label": "Header", testid: "tool-secret-header" });
    const headerSecret = h("input", { placeholder: "WEATHER_KEY", "aria-label": "Its secret's name", testid: "tool-secret-name" });
    const addHeader = () => {
      const definitionInput = toolForm.querySelector("[name=definition]");
      try {
        const definition = parseJson(definitionInput.value.trim(), "The definition") || {};
        if (!headerName.value.trim() || !headerSecret.value.trim()) throw new Error("Name the header and its secret.");
        definition.headers = { ...(definition.headers || {}), [headerName.value.trim()]: { secret: headerSecret.value.trim() } };
        definitionInput.value = JSON.stringify(definition, null, 2);
      } catch (error) { toast(errorText(error), "error"); }
    };
    root.append(formCard("Add a tool", toolForm, reload,
      h("p", { class: "muted" }, "An HTTP endpoint or a command, as the API's tool definition (JSON)."),
      h("div", { class: "header-from-secret" }, h("span", { class: "muted" }, "An HTTP header from a secret:"), headerName, secretName(headerSecret),
        h("button", { type: "button", testid: "add-secret-header", onclick: addHeader }, "Add to the definition"))));
  }

  async mcp(root, reload) {
    const { servers } = await get("/v1/mcp-servers");
    root.append(h("div", { class: "card" }, h("div", { class: "rows" }, servers.length ? servers.map((s) =>
      row(s.name, `${s.state} · ${s.transport} · ${s.tool_count} tools${s.protocol_version ? ` · ${s.protocol_version}` : ""}${s.last_error ? ` · ${s.last_error}` : ""}`,
        h("button", { onclick: async () => { try { await post(`/v1/mcp-servers/${encodeURIComponent(s.name)}/restart`); toast("Restarting."); reload(); } catch (e) { toast(errorText(e), "error"); } } }, "Restart"),
        deleteButton(`/v1/mcp-servers/${encodeURIComponent(s.name)}`, reload, `server ${s.name}`)))
      : h("p", { class: "muted" }, "No MCP server yet."))));
    const tools = await get("/v1/tools");
    const mcpTools = (tools.tools || []).filter((t) => t.kind === "mcp" || t.name.includes("__"));
    if (mcpTools.length) root.append(h("div", { class: "card" }, h("h3", {}, "Their tools"), h("ul", {}, mcpTools.map((t) => h("li", {}, h("code", {}, t.name), ` — ${t.description || ""}`)))));
    root.append(h("div", { class: "card" }, h("h3", {}, "Add a server"), form("mcp-form", [
      field("Name", h("input", { name: "name", required: true, placeholder: "files" })),
      field("Command (stdio)", h("input", { name: "command", placeholder: "npx" })),
      field("Arguments (comma-separated)", h("input", { name: "args", placeholder: "-y, @modelcontextprotocol/server-filesystem, /data" })),
      field("URL (streamable HTTP)", h("input", { name: "url", placeholder: "https://…/mcp" })),
      field("Header (HTTP) or environment variable (stdio) from a secret", h("input", { name: "secret_key", placeholder: "Authorization, or GITHUB_TOKEN" })),
      field("…its secret (a secret's name)", secretName(h("input", { name: "secret_name", testid: "mcp-secret", placeholder: "GITHUB_TOKEN" }))),
    ], async (v) => {
      const server = v.url ? { url: v.url } : { command: v.command, args: list(v.args) };
      if (v.secret_key && v.secret_name) server[v.url ? "headers" : "env"] = { [v.secret_key]: { secret: v.secret_name } };
      await post("/v1/tools/mcp", { mcpServers: { [v.name]: server } });
      toast(`Server ${v.name} added.`);
      reload();
    })));
  }

  async skills(root, reload) {
    const [{ agents }, { skills }] = await Promise.all([get("/v1/agents"), get("/v1/skills")]);
    const withSkills = (agents || []).filter((a) => (a.skills || []).length);
    root.append(h("div", { class: "card" },
      h("p", { class: "muted" }, "A skill is a folder holding SKILL.md (name, description, instructions). Register a folder here to offer it to any run by its name, or give an agent skill folders in its settings; the model sees each skill's name and description and opens it when needed."),
      h("div", { class: "rows" },
        skills.map((s) => row(s.name, `${s.description} · ${s.path}`,
          deleteButton(`/v1/skills/${encodeURIComponent(s.name)}`, reload, `skill ${s.name}`))),
        withSkills.map((a) => row(a.id, `agent skills: ${a.skills.join(", ")}`)),
        !skills.length && !withSkills.length ? h("p", { class: "muted" }, "No skill yet.") : null)));
    root.append(h("div", { class: "card" }, h("h3", {}, "Register a skill folder"), form("skill-form", [
      field("Folder on the server (inside the data folder's skills, or a --skill-root)", h("input", { name: "path", required: true, placeholder: "/home/me/.agentry/skills/summarise" }), true),
    ], async (v) => {
      const skill = await post("/v1/skills", { path: v.path });
      toast(`Skill ${skill.name} registered.`);
      reload();
    })));
  }

  async templates(root, reload) {
    const { templates } = await get("/v1/prompt-templates");
    root.append(h("div", { class: "card" }, h("div", { class: "rows" }, templates.length ? templates.map((t) =>
      row(t.name, (t.template || "").slice(0, 120),
        h("button", { testid: "edit", onclick: () => fill(templateForm, t, t.name, `Edit template ${t.name}`) }, "Edit"),
        deleteButton(`/v1/prompt-templates/${encodeURIComponent(t.name)}`, reload, `template ${t.name}`)))
      : h("p", { class: "muted" }, "No template yet."))));
    const templateForm = form("template-form", [
      field("Name", h("input", { name: "name", required: true, placeholder: "review" })),
      field("Template", h("textarea", { name: "template", required: true, rows: 5, placeholder: "Review this {{ language }} code:\n{{ code }}" }), true),
    ], async (v, el) => {
      await saveEntry(el, "/v1/prompt-templates", { name: v.name, template: v.template });
      toast(el.dataset.editing ? `Template ${v.name} saved.` : `Template ${v.name} added.`);
      reload();
    });
    root.append(formCard("Add a template", templateForm, reload,
      h("p", { class: "muted" }, "Jinja syntax: {{ variable }}; the chat asks for each variable.")));
  }

  async agents(root, reload) {
    const [{ agents }, { models }] = await Promise.all([get("/v1/agents"), get("/v1/models")]);
    root.append(h("div", { class: "card" }, h("div", { class: "rows" }, agents.length ? agents.map((a) =>
      row(a.id, `${a.nickname ? `@${a.nickname} · ` : ""}${a.model_id}${(a.tool_ids || []).length ? ` · tools: ${a.tool_ids.join(", ")}` : ""}${(a.labels || []).length ? ` · ${a.labels.join(", ")}` : ""}`,
        h("button", { testid: "edit", onclick: () => fill(agentForm,
          { ...a, max_tool_rounds: a.limits?.max_tool_rounds ?? a.max_tool_rounds, workspace: a.workspace || "session" }, a.id, `Edit agent ${a.id}`) }, "Edit"),
        deleteButton(`/v1/agents/${encodeURIComponent(a.id)}`, reload, `agent ${a.id}`)))
      : h("p", { class: "muted" }, "No agent yet."))));
    const standIn = (name, label) => h("select", { name },
      h("option", { value: "" }, `the model labelled ${label}, if any`), models.map((m) => h("option", { value: m.id }, m.id)));
    const agentForm = form("agent-form", [
      field("Id", h("input", { name: "id", required: true, placeholder: "researcher" })),
      field("Nickname", h("input", { name: "nickname", placeholder: "res" })),
      field("Model", h("select", { name: "model_id", required: true }, models.map((m) => h("option", { value: m.id }, m.id)))),
      field("Fallback models (comma-separated)", h("input", { name: "fallback_model_ids" })),
      field("Tools (comma-separated)", h("input", { name: "tool_ids", placeholder: "fetch, read_file" })),
      field("Labels (comma-separated)", h("input", { name: "labels" })),
      field("Skill folders (comma-separated)", h("input", { name: "skills" })),
      field("MCP servers (comma-separated)", h("input", { name: "mcp_servers" })),
      field("Max tool rounds", h("input", { name: "max_tool_rounds", type: "number", min: 1 })),
      field("System prompt", h("textarea", { name: "system", rows: 4 }), true),
      field("Vision model (describes images when its model cannot see them)", standIn("vision_model_id", "read-image")),
      field("Speech model (transcribes audio when its model cannot hear it)", standIn("speech_model_id", "speech")),
      field("Workspace", h("select", { name: "workspace" },
        h("option", { value: "session" }, "one per session"), h("option", { value: "agent" }, "one for the agent, shared by its sessions"))),
      field("Approvals (JSON)", h("textarea", { name: "approvals", rows: 3, placeholder: '{"tools": {"exec": "always"}}' }), true),
    ], async (v, el) => {
      const rounds = v.max_tool_rounds ? Number(v.max_tool_rounds) : undefined;
      const original = el.original || {};
      const body = merged(el, { id: v.id, model_id: v.model_id, tool_ids: list(v.tool_ids), labels: list(v.labels),
        fallback_model_ids: list(v.fallback_model_ids), skills: list(v.skills), mcp_servers: list(v.mcp_servers),
        nickname: v.nickname || undefined, system: v.system || undefined,
        vision_model_id: v.vision_model_id || undefined, speech_model_id: v.speech_model_id || undefined,
        workspace: v.workspace === "agent" ? "agent" : undefined,
        approvals: parseJson(v.approvals, "Approvals") });
      // The round limit lives in `limits` when the saved agent keeps it there.
      if (original.limits) {
        body.limits = { ...original.limits, max_tool_rounds: rounds };
        if (rounds === undefined) delete body.limits.max_tool_rounds;
        delete body.max_tool_rounds;
      } else if (rounds === undefined) delete body.max_tool_rounds;
      else body.max_tool_rounds = rounds;
      delete body.system_prompt;
      await saveEntry(el, "/v1/agents", body);
      toast(el.dataset.editing ? `Agent ${v.id} saved.` : `Agent ${v.id} added.`);
      reload();
    });
    root.append(formCard("Add an agent", agentForm, reload));
  }

  async secrets(root, reload) {
    const { secrets } = await get("/v1/env");
    // A bound secret lists the hosts it may be sent to.
    const meta = (s) => (s.masked || s.value || "••••") + (s.hosts ? ` · only to ${s.hosts.join(", ")}` : "");
    root.append(h("div", { class: "card" }, h("p", { class: "muted" }, "Secrets are write-only: their values are never shown again."),
      h("div", { class: "rows" }, secrets.length ? secrets.map((s) => row(s.name, meta(s),
        deleteButton(`/v1/env/${encodeURIComponent(s.name)}`, reload, `secret ${s.name}`)))
        : h("p", { class: "muted" }, "No secret yet."))));
    root.append(h("div", { class: "card" }, h("h3", {}, "Set a secret"), secretForm(() => reload())));
  }

  async keys(root, reload) {
    const { keys, auth_enabled: enabled } = await get("/v1/api-keys");
    // A user key's quotas, used against their limits, filled in once its detail comes.
    const quotas = (k) => {
      if (k.revoked || k.role !== "user") return null;
      const line = h("span", { class: "meta key-quotas", testid: "key-quotas" }, "quotas…");
      get(`/v1/api-keys/${k.id}`).then((detail) => {
        const q = detail.quotas;
        line.textContent = [["live runs", q.live_runs], ["sandboxes", q.sandboxes], ["terminals", q.terminals],
          ["sessions a minute", q.sessions_per_minute], ["tokens a day", q.tokens_per_day]]
          .map(([name, use]) => `${name} ${use.used}/${use.limit ?? "∞"}`).join(" · ");
      }).catch(() => line.remove());
      return line;
    };
    root.append(h("div", { class: "card" },
      h("p", { class: "muted" }, enabled ? "Authentication is on: the API needs a key (or this console's login). Revoking keys never turns it off." : "Authentication is off: creating a key (always an admin, the first) turns it on."),
      h("div", { class: "rows" }, keys.length ? keys.map((k) => row(k.id, `${k.label || "(no label)"} · ${k.role || "admin"} · ${time(k.created_at)}${k.revoked ? " · revoked" : ""}`,
        quotas(k),
        k.revoked ? null : h("button", { class: "danger", testid: "delete", onclick: async () => {
          if (!confirm(`Revoke key ${k.id}?`)) return;
          try { await del(`/v1/api-keys/${k.id}`); reload(); } catch (error) { toast(errorText(error), "error"); }
        } }, "Revoke")))
        : h("p", { class: "muted" }, "No key yet."))));
    const shown = h("div");
    root.append(h("div", { class: "card" }, h("h3", {}, "Create a key"), form("key-form", [
      field("Label", h("input", { name: "label", placeholder: "ci" })),
      field("Role", h("select", { name: "role", testid: "key-role" },
        h("option", { value: "user" }, "user — runs, and only its own sessions"),
        h("option", { value: "admin" }, "admin — everything"))),
      field("Agents it may run as (comma-separated; empty: any)", h("input", { name: "agents", placeholder: "writer" })),
    ], async (v) => {
      const body = { label: v.label, role: v.role || "user" };
      const agents = (v.agents || "").split(",").map((a) => a.trim()).filter(Boolean);
      if (agents.length) body.limits = { agents };
      const created = await post("/v1/api-keys", body);
      clear(shown).append(h("p", {}, "Copy it now: it is not shown again."), h("div", { class: "secret-once", testid: "new-key" }, created.key));
      // The console itself now needs a login: sign in with the new key at once.
      if (!enabled) { try { await post("/v1/auth/login", { api_key: created.key }); } catch { /* the login form will ask */ } }
    }, "Create")), shown);
  }

  async sandbox(root) {
    const caps = await get("/v1/sandbox/capabilities");
    const host = caps.host || {};
    root.append(h("div", { class: "card" },
      h("div", { class: "totals" },
        h("div", {}, "Backend", h("b", {}, caps.enabled ? caps.backend : "off")),
        h("div", {}, "Open", h("b", {}, `${caps.open_sandboxes ?? 0} / ${caps.max_sandboxes ?? "?"}`)),
        h("div", {}, "User namespaces", h("b", {}, host.user_namespaces ? "yes" : "no")),
        h("div", {}, "Landlock", h("b", {}, host.landlock_abi ? `ABI ${host.landlock_abi}` : "no"))),
      caps.disabled_reason ? h("p", { class: "form-error" }, caps.disabled_reason) : null,
      h("pre", { class: "json" }, json(caps))));
  }
}
