"""Conversations that survive a restart (`--session-dir`), in three phases the Rust test
runs against three servers, with a SIGTERM between them:

- `first` (server 1): a two-message conversation's first turn, greedy; its messages and
  reply go to PYRAMID_PERSIST_STATE.
- `resume` (server 2, started on the same directory): the second turn reports
  `cached_tokens` covering the whole first turn (its KV came from disk:
  pyramid_sessions_resumed_from_disk_total rises), and its reply equals an uninterrupted
  server's (PYRAMID_FRESH_BASE_URL, which is given both turns in order).
- `corrupt` (server 3, on the same directory with every file's bytes flipped): the same
  second turn is prefilled (cached_tokens 0: the corrupt file was skipped, the Rust
  test checks the warning) and gives the same reply.
"""

from __future__ import annotations

import json
import os

import common
from common import expect, expect_eq, ok

cfg = common.config()
MODEL = cfg.model
STATE = os.environ["PYRAMID_PERSIST_STATE"]
PHASE = os.environ["PYRAMID_PERSIST_PHASE"]
SYSTEM = "You are a careful assistant who answers in full sentences. " + " ".join(
    f"Rule {i}: be concise and precise about topic {i}." for i in range(12))
FIRST = "What is a CPU cache, in two sentences?"
SECOND = "And what is a cache miss?"


def chat(messages: list[dict], base_url: str | None = None):
    api = common.client(base_url)
    return api.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=24)


def second_turn(first_reply: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST},
            {"role": "assistant", "content": first_reply}, {"role": "user", "content": SECOND}]


def main() -> None:
    if PHASE == "first":
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": FIRST}]
        r = chat(messages)
        with open(STATE, "w") as f:
            json.dump({"reply": r.choices[0].message.content, "prompt_tokens": r.usage.prompt_tokens}, f)
        ok(f"first turn: {r.usage.prompt_tokens} prompt tokens")
        return
    with open(STATE) as f:
        state = json.load(f)
    messages = second_turn(state["reply"])
    before = common.metrics()
    r = chat(messages)
    cached = common.cached_tokens(r.usage)
    reply = r.choices[0].message.content
    if PHASE == "resume":
        expect(cached >= state["prompt_tokens"],
               f"the second turn after a restart reused {cached} tokens < the first turn's {state['prompt_tokens']}")
        after = common.metrics()
        loaded = after.sum("pyramid_sessions_resumed_from_disk_total") - before.sum("pyramid_sessions_resumed_from_disk_total")
        expect_eq(loaded, 1, "conversations resumed from disk")
        details = r.usage.model_dump().get("prompt_tokens_details") or {}
        expect_eq(details.get("restored_tokens"), cached, "usage's restored_tokens (what the web page shows)")
        fresh = cfg.fresh_base_url
        expect(fresh, "PYRAMID_FRESH_BASE_URL is set")
        first = chat(messages[:2], fresh)
        expect_eq(first.choices[0].message.content, state["reply"], "an uninterrupted server's first reply")
        uninterrupted = chat(messages, fresh)
        expect_eq(reply, uninterrupted.choices[0].message.content, "the resumed reply vs an uninterrupted server's")
        with open(STATE, "w") as f:
            json.dump(state | {"second": reply}, f)
        ok(f"resumed from disk: {cached} cached tokens, same reply as an uninterrupted server")
    elif PHASE == "corrupt":
        expect_eq(cached, 0, "cached tokens when the stored conversation is corrupt")
        details = r.usage.model_dump().get("prompt_tokens_details") or {}
        expect_eq(details.get("restored_tokens"), 0, "restored tokens when nothing was read back")
        expect_eq(reply, state["second"], "the reply after prefilling instead")
        ok("a corrupt session file was skipped: the turn was prefilled and gave the same reply")
    else:
        raise SystemExit(f"unknown PYRAMID_PERSIST_PHASE {PHASE}")


common.run(main)
