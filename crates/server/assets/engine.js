// The engine view: a snapshot from /v1/engine/snapshot, then live snapshots and timeline
// events from /v1/engine/events, read only while the view is shown.

import { api, events } from "./api.js";
import { el } from "./markdown.js";

const TIMELINE_MAX = 200;
const $ = (id) => document.getElementById(id);
let controller = null;
let retry = 0;
/** The latest snapshot and when it arrived here, for compiles' elapsed time between them. */
let latest = null;
let tick = 0;

function bytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  for (; n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

function ms(n) {
  return n == null ? "–" : n < 1000 ? `${Math.round(n)} ms` : `${(n / 1000).toFixed(1)} s`;
}

function cell(text, numeric) {
  return el("td", numeric ? "n" : null, String(text ?? "–"));
}

function meter(id, textId, used, budget, extra) {
  const m = $(id);
  m.max = Math.max(budget || 0, used || 0, 1);
  m.value = used || 0;
  m.high = m.max * 0.9;
  $(textId).textContent = `${bytes(used)} of ${bytes(budget)}${extra || ""}`;
}

function showSnapshot(snap) {
  latest = { snap, at: performance.now() };
  $("engine-state").hidden = true;
  $("engine-body").hidden = false;
  const t = snap.throughput || {};
  $("engine-summary").textContent = `${snap.model ?? ""} · route ${snap.route ?? "–"} · ${(t.tokens_per_second ?? 0).toFixed(1)} tok/s · ${(snap.sessions || []).length} sessions`;
  meter("kv-meter", "kv-text", snap.kv?.used_bytes, snap.kv?.budget_bytes, snap.kv?.reserved_bytes ? `, ${bytes(snap.kv.reserved_bytes)} reserved` : "");
  meter("artifact-meter", "artifact-text", snap.artifacts?.used_bytes, snap.artifacts?.budget_bytes);
  $("sessions").replaceChildren(...(snap.sessions || []).map((s) => {
    const state = el("td", `state-${s.state}`, s.state);
    const row = el("tr", null, cell(s.id), state, cell(s.priority, true), cell(s.prompt_tokens, true), cell(s.generated_tokens, true), cell(s.context_tokens, true), cell(s.window, true), cell(ms(s.age_ms), true));
    row.dataset.testid = "engine-session-row";
    row.dataset.state = s.state;
    return row;
  }));
  $("throughput").replaceChildren(...(t.by_priority || []).map((p) => el("tr", null, cell(p.priority, true), cell((p.tokens_per_second ?? 0).toFixed(1), true), cell(ms(p.ttft_ms_p50), true), cell(p.finished, true))));
  drawLadder();
}

/** The ladder, compiles' elapsed time advanced by the time since the snapshot came. */
function drawLadder() {
  if (!latest) return;
  const since = performance.now() - latest.at;
  $("ladder").replaceChildren(...(latest.snap.ladder || []).map((rung) => el("li", null,
    el("span", "w", String(rung.window)),
    ...(rung.artifacts || []).map((a) => {
      let text = `${a.kind} ×${a.rows} ${a.state}`;
      if (a.state === "compiling" && a.compiling_ms != null) text += ` ${ms(a.compiling_ms + since)}`;
      if (a.state === "resident" && a.bytes != null) text += ` ${bytes(a.bytes)}`;
      const chip = el("span", `chip ${a.state}`, text);
      chip.dataset.testid = "engine-artifact";
      return chip;
    }),
  )));
}

function timelineText(e) {
  const parts = [e.kind];
  if (e.session != null) parts.push(`session ${e.session}`);
  if (e.from_window != null && e.window != null) parts.push(`window ${e.from_window} → ${e.window}`);
  else if (e.window != null) parts.push(`window ${e.window}`);
  if (e.detail) parts.push(typeof e.detail === "string" ? e.detail : JSON.stringify(e.detail));
  return parts.join(" · ");
}

function addTimeline(e) {
  const list = $("timeline");
  const when = el("time", null, new Date(e.time_ms).toLocaleTimeString());
  if (Number.isFinite(e.time_ms)) when.dateTime = new Date(e.time_ms).toISOString();
  const item = el("li", null, when, timelineText(e));
  item.dataset.testid = "timeline-item";
  item.dataset.kind = e.kind;
  list.prepend(item);
  while (list.children.length > TIMELINE_MAX) list.lastChild.remove();
}

function unavailable(text) {
  $("engine-state").hidden = false;
  $("engine-state").textContent = text;
}

async function run(signal) {
  showSnapshot(await (await api("/v1/engine/snapshot", { signal })).json());
  const response = await api("/v1/engine/events", { signal, headers: { Accept: "text/event-stream" } });
  retry = 0;
  for await (const { event, data } of events(response)) {
    if (event === "snapshot") showSnapshot(JSON.parse(data));
    else if (event === "timeline") addTimeline(JSON.parse(data));
  }
}

async function connect() {
  const mine = (controller = new AbortController());
  try {
    await run(mine.signal);
    if (mine !== controller) return;
    unavailable("The engine view's stream ended; reconnecting…");
  } catch (e) {
    if (e.name === "AbortError" || mine !== controller) return;
    if (e.status === 404) unavailable("Engine view unavailable: this server has no /v1/engine endpoints.");
    else if (e.status === 401) unavailable("Engine view unavailable: enter the API key in the chat's settings.");
    else unavailable(`Engine view unavailable: ${e.message}`);
  }
  // Back off to half a minute; a 404 will not change soon.
  retry = Math.min(retry + 1, 6);
  setTimeout(() => { if (mine === controller) connect(); }, Math.min(500 * 2 ** retry, 30000));
}

/** Streams while the view is shown; showing it again reconnects. */
export function showEngine(shown) {
  controller?.abort();
  controller = null;
  clearInterval(tick);
  if (shown) {
    retry = 0;
    tick = setInterval(drawLadder, 500);
    connect();
  }
}
