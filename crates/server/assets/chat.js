// The chat: conversations in localStorage, streamed replies from /v1/chat/completions.

import { api, events, status } from "./api.js";
import { codeBlock, el, render } from "./markdown.js";

const STORE = "pyramid.conversations";
const SETTINGS = "pyramid.settings";
const NUMBERS = { temperature: parseFloat, top_p: parseFloat, min_p: parseFloat, top_k: parseInt, max_tokens: parseInt, seed: parseInt, priority: parseInt };

const $ = (id) => document.getElementById(id);
let chats = [];
let currentId = null;
/** The reply streaming now: its AbortController. */
let streaming = null;

function load() {
  try {
    const saved = JSON.parse(localStorage.getItem(STORE) || "[]");
    chats = Array.isArray(saved) ? saved.filter((c) => c && Array.isArray(c.messages)) : [];
  } catch {
    chats = [];
  }
}

function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(chats));
  } catch (e) {
    status(`Could not keep the conversations in this browser: ${e.message}`, true);
  }
}

function current() {
  let chat = chats.find((c) => c.id === currentId);
  if (!chat) {
    chat = chats[0] || newChat();
    currentId = chat.id;
  }
  return chat;
}

function newChat() {
  const chat = { id: `${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New conversation", system: "", messages: [], updated: Date.now() };
  chats.unshift(chat);
  return chat;
}

// Settings: the form's fields, kept across visits.

function settings() {
  const form = $("settings");
  const out = {};
  for (const name of [...Object.keys(NUMBERS), "model", "format", "schema", "tools"]) out[name] = form.elements[name].value;
  return out;
}

function restoreSettings() {
  let saved = {};
  try {
    saved = JSON.parse(localStorage.getItem(SETTINGS) || "{}") || {};
  } catch {
    // A damaged entry: start from the defaults.
  }
  const form = $("settings");
  for (const [name, value] of Object.entries(saved)) {
    if (name !== "model" && form.elements[name]) form.elements[name].value = value;
  }
  return saved.model;
}

/** The request body for `chat`'s messages so far, or an error message. */
function requestBody(chat) {
  const s = settings();
  const body = { model: s.model, stream: true, stream_options: { include_usage: true }, messages: [] };
  if (chat.system.trim()) body.messages.push({ role: "system", content: chat.system });
  for (const m of chat.messages) {
    if (m.role === "user") body.messages.push({ role: "user", content: m.content });
    else if (m.content || m.toolCalls?.length) {
      const turn = { role: "assistant", content: m.content };
      if (m.toolCalls?.length) {
        turn.tool_calls = m.toolCalls.map((c, i) => ({ id: c.id || `call_${i}`, type: "function", function: { name: c.name, arguments: c.arguments } }));
      }
      body.messages.push(turn);
    }
  }
  for (const [name, parse] of Object.entries(NUMBERS)) {
    if (s[name].trim() === "") continue;
    const value = parse(s[name], 10);
    if (Number.isNaN(value)) return { error: `${name} is not a number` };
    body[name] = value;
  }
  try {
    if (s.format === "json_object") body.response_format = { type: "json_object" };
    if (s.format === "json_schema") {
      body.response_format = { type: "json_schema", json_schema: { name: "reply", schema: JSON.parse(s.schema || "{}") } };
    }
  } catch (e) {
    return { error: `the JSON schema does not parse: ${e.message}` };
  }
  if (s.tools.trim()) {
    try {
      const tools = JSON.parse(s.tools);
      if (!Array.isArray(tools)) return { error: "tools must be a JSON array" };
      if (tools.length) body.tools = tools;
    } catch (e) {
      return { error: `the tools do not parse: ${e.message}` };
    }
  }
  return { body, json: s.format !== "text" };
}

// Rendering.

function renderList() {
  const list = $("chat-list");
  list.replaceChildren();
  for (const chat of chats) {
    const open = el("button", "open", chat.title || "Conversation");
    open.type = "button";
    open.setAttribute("aria-current", String(chat.id === currentId));
    open.addEventListener("click", () => select(chat.id));
    const remove = el("button", "delete", "×");
    remove.type = "button";
    remove.setAttribute("aria-label", `Delete ${chat.title || "conversation"}`);
    remove.addEventListener("click", () => removeChat(chat.id));
    list.append(el("li", null, open, remove));
  }
}

function renderMessages() {
  const chat = current();
  $("system").value = chat.system;
  const list = $("messages");
  list.replaceChildren(...chat.messages.map((m, i) => messageNode(chat, m, i)));
  list.scrollTop = list.scrollHeight;
}

function messageNode(chat, msg, index) {
  const node = el("li", `msg ${msg.role}`);
  node.dataset.testid = "message";
  node.dataset.role = msg.role;
  fillMessage(node, chat, msg, index);
  return node;
}

function fillMessage(node, chat, msg, index) {
  const parts = [el("div", "who", msg.role === "user" ? "You" : "Assistant")];
  if (msg.reasoning) {
    const thought = el("details", "thought", el("summary", null, msg.done ? "Thought" : "Thinking…"), el("div", "body", render(msg.reasoning)));
    thought.dataset.testid = "message-reasoning";
    parts.push(thought);
  }
  const body = el("div", "body");
  body.dataset.testid = "message-text";
  if (msg.role === "user") {
    body.textContent = msg.content;
  } else if (msg.json && msg.done && parsesAsJson(msg.content)) {
    body.append(codeBlock("JSON", JSON.stringify(JSON.parse(msg.content), null, 2)));
  } else {
    body.append(render(msg.content));
  }
  parts.push(body);
  for (const call of msg.toolCalls || []) {
    let args = call.arguments;
    if (msg.done && parsesAsJson(args)) args = JSON.stringify(JSON.parse(args), null, 2);
    const block = codeBlock(`tool call: ${call.name}`, args);
    block.dataset.testid = "message-tool-call";
    parts.push(block);
  }
  if (msg.error) parts.push(el("p", "error", msg.error));
  const stats = statsText(msg);
  if (stats) {
    const p = el("p", "stats", stats);
    p.dataset.testid = "message-stats";
    parts.push(p);
  }
  if (msg.done || msg.role === "user") parts.push(actions(chat, msg, index));
  node.replaceChildren(...parts);
}

function parsesAsJson(text) {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

function button(label, action, testid) {
  const b = el("button", null, label);
  b.type = "button";
  b.dataset.testid = testid;
  b.addEventListener("click", action);
  return b;
}

function actions(chat, msg, index) {
  const row = el("div", "actions");
  if (msg.role === "user") row.append(button("Edit", () => edit(chat, index), "edit"));
  else if (index === chat.messages.length - 1) {
    row.append(button("Regenerate", () => { if (!streaming) { chat.messages.pop(); complete(chat); } }, "regenerate"));
  }
  return row;
}

/** Prompt and cached tokens, TTFT (measured here), tok/s, drafts accepted, and how it ended. */
function statsText(msg) {
  const s = msg.stats;
  if (!s) return msg.stopped ? "stopped" : "";
  const parts = [];
  const u = s.usage;
  if (u) {
    const cached = u.prompt_tokens_details?.cached_tokens ?? 0;
    const restored = u.prompt_tokens_details?.restored_tokens ?? 0;
    parts.push(`prompt ${u.prompt_tokens} tokens (${cached} cached)`, `reply ${u.completion_tokens} tokens`);
    if (restored > 0) parts.push(`resumed from disk (${restored} tokens)`);
  }
  if (s.ttft_ms != null) parts.push(`TTFT ${Math.round(s.ttft_ms)} ms`);
  if (u && u.completion_tokens > 1 && s.decode_ms > 0) parts.push(`${((u.completion_tokens - 1) / (s.decode_ms / 1000)).toFixed(1)} tok/s`);
  const spec = u?.speculative;
  if (spec && spec.drafted_tokens > 0) parts.push(`drafts ${spec.accepted_tokens}/${spec.drafted_tokens} accepted`);
  if (msg.stopped) parts.push("stopped");
  else if (msg.finish && msg.finish !== "stop") parts.push(`finish: ${msg.finish}`);
  return parts.join(" · ");
}

// Actions.

function select(id) {
  if (streaming) return;
  currentId = id;
  renderList();
  renderMessages();
}

function removeChat(id) {
  const chat = chats.find((c) => c.id === id);
  if (!chat || (streaming && id === currentId)) return;
  if (!window.confirm(`Delete "${chat.title}"?`)) return;
  chats = chats.filter((c) => c.id !== id);
  if (currentId === id) currentId = null;
  save();
  renderList();
  renderMessages();
}

function edit(chat, index) {
  if (streaming) return;
  const node = $("messages").children[index];
  const box = el("textarea");
  box.value = chat.messages[index].content;
  box.setAttribute("aria-label", "Edit message");
  box.dataset.testid = "edit-input";
  const resend = () => {
    if (!box.value.trim()) return;
    chat.messages[index].content = box.value;
    chat.messages.length = index + 1;
    complete(chat);
  };
  box.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); resend(); }
    if (e.key === "Escape") renderMessages();
  });
  node.replaceChildren(el("div", "who", "You"), box, el("div", "actions", button("Send", resend, "edit-send"), button("Cancel", renderMessages, "edit-cancel")));
  box.focus();
}

function setBusy(busy) {
  $("send-button").hidden = busy;
  $("stop-button").hidden = !busy;
  $("messages").setAttribute("aria-busy", String(busy));
}

/** Streams the assistant's reply to `chat`'s messages into a new message. */
async function complete(chat) {
  const request = requestBody(chat);
  renderList();
  renderMessages();
  if (request.error) {
    status(`Not sent: ${request.error}`, true);
    return;
  }
  const msg = { role: "assistant", content: "", reasoning: "", toolCalls: [], json: request.json };
  chat.messages.push(msg);
  chat.updated = Date.now();
  const index = chat.messages.length - 1;
  const list = $("messages");
  const node = messageNode(chat, msg, index);
  list.append(node);
  const controller = new AbortController();
  streaming = controller;
  setBusy(true);
  status("");
  const started = performance.now();
  let first = null;
  let usage = null;
  let frame = 0;
  const redraw = () => {
    frame = 0;
    const follow = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
    fillMessage(node, chat, msg, index);
    if (follow) list.scrollTop = list.scrollHeight;
  };
  try {
    const response = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(request.body),
      signal: controller.signal,
    });
    for await (const { data } of events(response)) {
      if (data === "[DONE]") break;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message || "the server failed");
      for (const choice of chunk.choices || []) {
        const d = choice.delta || {};
        if (first == null && (d.content || d.reasoning_content || d.tool_calls)) first = performance.now();
        if (d.reasoning_content) msg.reasoning += d.reasoning_content;
        if (d.content) msg.content += d.content;
        for (const call of d.tool_calls || []) {
          const slot = (msg.toolCalls[call.index ?? 0] ??= { name: "", arguments: "" });
          if (call.id) slot.id = call.id;
          if (call.function?.name) slot.name += call.function.name;
          if (call.function?.arguments) slot.arguments += call.function.arguments;
        }
        if (choice.finish_reason) msg.finish = choice.finish_reason;
      }
      if (chunk.usage) usage = chunk.usage;
      if (!frame) frame = requestAnimationFrame(redraw);
    }
  } catch (e) {
    if (e.name === "AbortError") msg.stopped = true;
    else msg.error = e.message;
  } finally {
    if (frame) cancelAnimationFrame(frame);
    const end = performance.now();
    msg.done = true;
    msg.stats = { usage, ttft_ms: first == null ? null : first - started, decode_ms: first == null ? 0 : end - first };
    streaming = null;
    setBusy(false);
    save();
    redraw();
    $("message-input").focus();
  }
}

function submit(event) {
  event.preventDefault();
  const input = $("message-input");
  const text = input.value;
  if (!text.trim() || streaming) return;
  const chat = current();
  if (!chat.messages.length) chat.title = text.trim().slice(0, 60);
  chat.messages.push({ role: "user", content: text });
  input.value = "";
  complete(chat);
}

/** Fills the model picker from /v1/models, keeping `wanted` when the server has it. */
export async function loadModels(wanted) {
  const select = $("model");
  try {
    const { data } = await (await api("/v1/models")).json();
    const keep = select.value || wanted;
    select.replaceChildren(...data.map((m) => el("option", null, m.id)));
    if (data.some((m) => m.id === keep)) select.value = keep;
    status("");
  } catch (e) {
    status(`Models: ${e.message}`, true);
  }
}

export function startChat() {
  load();
  const wanted = restoreSettings();
  $("settings").addEventListener("change", (e) => {
    if (e.target.id === "system") {
      current().system = e.target.value;
      save();
    } else if (e.target.id !== "api-key") {
      localStorage.setItem(SETTINGS, JSON.stringify(settings()));
    }
  });
  $("composer").addEventListener("submit", submit);
  $("message-input").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      $("composer").requestSubmit();
    } else if (e.key === "Escape" && streaming) {
      streaming.abort();
    }
  });
  $("stop-button").addEventListener("click", () => streaming?.abort());
  $("new-chat").addEventListener("click", () => {
    if (streaming) return;
    const empty = chats.find((c) => !c.messages.length);
    currentId = (empty || newChat()).id;
    renderList();
    renderMessages();
    $("message-input").focus();
  });
  renderList();
  renderMessages();
  loadModels(wanted);
}
