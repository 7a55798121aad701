// The API client: JSON requests and server-sent event streams (parsed from fetch, so the login
// cookie and POST bodies work the same for every stream).

export class ApiError extends Error {
  constructor(status, body) {
    super((body && body.error && body.error.message) || (typeof body === "string" && body) || `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

let unauthorized = () => {};
/** Called when the API answers 401: the app shows the login form. */
export function onUnauthorized(handler) { unauthorized = handler; }

async function parse(response) {
  const text = await response.text();
  if (!text) return null;
  try { return JSON.parse(text); } catch { return text; }
}

/** A JSON request; throws ApiError on a non-2xx answer. */
export async function api(method, path, body) {
  const init = { method, headers: {}, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const data = await parse(response);
  if (response.status === 401) unauthorized();
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body === undefined ? {} : body);
export const put = (path, body) => api("PUT", path, body);
export const patch = (path, body) => api("PATCH", path, body);
export const del = (path) => api("DELETE", path);

/**
 * Opens an SSE stream and calls onEvent(name, data, id) for each event until it ends, the
 * signal aborts, or it fails. Resolves when the stream is over.
 */
export async function stream(method, path, body, onEvent, { signal, lastEventId, onOpen } = {}) {
  const headers = { accept: "text/event-stream" };
  if (body !== undefined) headers["content-type"] = "application/json";
  if (lastEventId) headers["last-event-id"] = String(lastEventId);
  const response = await fetch(path, {
    method, headers, signal, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 401) unauthorized();
  if (!response.ok) throw new ApiError(response.status, await parse(response));
  if (onOpen) onOpen();
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = { name: "message", data: [], id: null };
  const dispatch = () => {
    if (event.data.length) {
      let data = event.data.join("\n");
      try { data = JSON.parse(data); } catch { /* plain text */ }
      onEvent(event.name, data, event.id);
    }
    event = { name: "message", data: [], id: null };
  };
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (error) {
      if (signal && signal.aborted) return;
      throw error;
    }
    if (chunk.done) break;
    buffer += chunk.value;
    let cut;
    while ((cut = buffer.search(/\r?\n/)) >= 0) {
      const line = buffer.slice(0, cut);
      buffer = buffer.slice(buffer[cut] === "\r" ? cut + 2 : cut + 1);
      if (line === "") { dispatch(); continue; }
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") event.name = value;
      else if (field === "data") event.data.push(value);
      else if (field === "id") event.id = value;
    }
  }
  dispatch();
}
