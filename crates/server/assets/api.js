// Talking to the server: the API key, JSON errors, and server-sent events read from a
// fetch body (EventSource cannot send an Authorization header).

const KEY = "pyramid.apiKey";

export function apiKey() {
  return localStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(KEY, key);
  else localStorage.removeItem(KEY);
}

/** A non-2xx answer, with the server's error message when it sent one. */
export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

/** fetch with the API key; a 401 also raises `pyramid:unauthorized` for the key field. */
export async function api(path, options = {}) {
  const headers = new Headers(options.headers || {});
  const key = apiKey();
  if (key) headers.set("Authorization", `Bearer ${key}`);
  const response = await fetch(path, { ...options, headers });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try {
      const body = await response.json();
      if (body && body.error && body.error.message) message = body.error.message;
    } catch {
      // Not JSON: the status line says enough.
    }
    if (response.status === 401) window.dispatchEvent(new CustomEvent("pyramid:unauthorized"));
    throw new HttpError(response.status, message);
  }
  return response;
}

/** The events of an SSE body, as `{event, data}`, until it ends. */
export async function* events(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = "";
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let nl;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl).replace(/\r$/, "");
        buffer = buffer.slice(nl + 1);
        if (line === "") {
          if (data.length) yield { event: event || "message", data: data.join("\n") };
          event = "";
          data = [];
        } else if (!line.startsWith(":")) {
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
          if (field === "event") event = text;
          else if (field === "data") data.push(text);
        }
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** The status line under the header. */
export function status(text, bad = false) {
  const node = document.getElementById("status");
  node.textContent = text;
  node.classList.toggle("bad", bad);
}
