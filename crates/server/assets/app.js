// The page: two views (chat and engine), the API key field, and start-up.

import { apiKey, setApiKey, status } from "./api.js";
import { loadModels, startChat } from "./chat.js";
import { showEngine } from "./engine.js";

const $ = (id) => document.getElementById(id);
const TABS = ["chat", "engine"];

function show(name) {
  for (const tab of TABS) {
    const on = tab === name;
    $(`tab-${tab}`).setAttribute("aria-selected", String(on));
    $(`tab-${tab}`).tabIndex = on ? 0 : -1;
    $(`view-${tab}`).hidden = !on;
  }
  showEngine(name === "engine");
  if (location.hash !== `#${name}`) history.replaceState(null, "", `#${name}`);
}

function tabs() {
  for (const tab of TABS) $(`tab-${tab}`).addEventListener("click", () => show(tab));
  // Arrow keys move between tabs, as WAI-ARIA's tab pattern has it.
  document.querySelector("[role=tablist]").addEventListener("keydown", (e) => {
    if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
    const next = TABS[(TABS.findIndex((t) => $(`tab-${t}`).getAttribute("aria-selected") === "true") + 1) % TABS.length];
    show(next);
    $(`tab-${next}`).focus();
  });
  show(location.hash === "#engine" ? "engine" : "chat");
}

function keyField() {
  const field = $("api-key");
  field.value = apiKey();
  field.addEventListener("change", () => {
    setApiKey(field.value.trim());
    loadModels();
    if ($("tab-engine").getAttribute("aria-selected") === "true") showEngine(true);
  });
  window.addEventListener("pyramid:unauthorized", () => {
    status("This server needs an API key: enter it in Settings.", true);
    $("settings-box").open = true;
    if (!$("view-chat").hidden) $("api-key").focus();
  });
}

// A module runs once the document is parsed: the elements are there.
if (window.matchMedia("(max-width: 720px)").matches) $("chats-box").open = false;
keyField();
startChat();
tabs();
