"""A 10-turn agent conversation reuses its cached session turn after turn.

An agent loop: a system prompt, then 10 user turns each adding a ~45-70-token
"observation", each answered greedily (max_tokens 24) and the answer appended to the
history; odd turns go through the openai client, even turns stream over raw SSE. The
context grows past at least two boundaries of the window ladder (256, 512, ...).

Proves that from turn 2 on, the whole previous prompt is reused from the cache
(cached_tokens >= the previous turn's prompt_tokens), that only the new tokens are
prefilled (pyramid_prefilled_tokens_total grows by prompt_tokens - cached_tokens, and
the prompt / cached counters grow by exactly what usage says), that the session
migrated between windows (pyramid_kv_migrations_total +2 or more) and never
re-prefilled (pyramid_reprefills_total unchanged), and that none of this changes the
answer: the last turn's full history sent to a freshly started server
(nothing cached, everything prefilled) gives the same reply.
"""

from __future__ import annotations

import os
import random
import time

import common
from common import expect, expect_eq, ok

cfg = common.config()
MODEL = cfg.model
TURNS = 10
MAX_TOKENS = 24
# Seconds between a reply and the next turn: the agent's own work (a tool call, a page
# load) during which the server can compile the next window ahead of the crossing.
PAUSE = float(os.environ.get("PYRAMID_AGENT_PAUSE_S") or 0)
SYSTEM = ("You are a field research assistant. The user sends observations from a survey; "
          "after each one, reply with a one-line note on what stands out.")


def ask(messages, *, stream: bool, base_url: str | None = None) -> tuple[str, str, dict]:
    """One greedy turn; returns (content, finish_reason, usage dict)."""
    if stream:
        result = common.stream_sse("/v1/chat/completions", {
            "model": MODEL, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}, base_url=base_url)
        expect(result.status == 200, f"HTTP {result.status}: {common.short(result.error_body)}")
        expect(result.done and not result.problems, f"stream incomplete or malformed: {result.problems}")
        usage = result.usage()
        expect(usage is not None, "no usage chunk although include_usage was set")
        return result.text(), result.finish_reason(), usage
    api = common.client(base_url)
    resp = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    return resp.choices[0].message.content or "", resp.choices[0].finish_reason, resp.usage.model_dump()


def main():
    expect(cfg.fresh_base_url, "PYRAMID_FRESH_BASE_URL is not set: test_agent.py needs a second, fresh server")
    rng = random.Random(2024)
    history = [{"role": "system", "content": SYSTEM}]
    start = common.metrics()
    prev_prompt = 0
    last = None
    for turn in range(1, TURNS + 1):
        # 4 or 3 sentences (~45-70 tokens with SmolLM2's tokenizer): the final prompt
        # lands at ~700-910 tokens, past the 256 and 512 boundaries yet, with the
        # reply, still inside a 1024 window should the test ladder end there.
        if turn > 1:
            time.sleep(PAUSE)
        observation = f"Observation {turn}: " + common.paragraph(rng, 4 if turn % 2 else 3)
        history.append({"role": "user", "content": observation})
        before = common.metrics()
        content, finish, usage = ask(history, stream=turn % 2 == 0)
        what = f"turn {turn}"
        common.check_usage(usage, what, max_completion=MAX_TOKENS)
        prompt, cached = usage["prompt_tokens"], common.cached_tokens(usage)
        after = common.settled_metrics(lambda m: m.sum("pyramid_prompt_tokens_total")
                                       - before.sum("pyramid_prompt_tokens_total") >= prompt)

        def delta(name):
            return after.sum(name) - before.sum(name)

        prefilled = delta("pyramid_prefilled_tokens_total")
        expect_eq(prefilled, prompt - cached, f"{what}: pyramid_prefilled_tokens_total delta (prompt {prompt} - "
                                              f"cached {cached})")
        expect_eq(delta("pyramid_prompt_tokens_total"), prompt, f"{what}: pyramid_prompt_tokens_total delta")
        expect_eq(delta("pyramid_cached_prompt_tokens_total"), cached, f"{what}: pyramid_cached_prompt_tokens_total delta")
        if turn >= 2:
            expect(prompt > prev_prompt, f"{what}: prompt_tokens {prompt} did not grow from {prev_prompt}")
            expect(cached >= prev_prompt, f"{what}: cached_tokens {cached} < previous turn's prompt_tokens "
                                          f"{prev_prompt}: the conversation was not continued from its cached session")
        migrations = delta("pyramid_kv_migrations_total")
        stalls = delta("pyramid_stalls_total")
        ok(f"{what}: prompt {prompt}, cached {cached}, prefilled {prefilled:.0f}, generated "
           f"{usage['completion_tokens']} ({finish})" + (f", {migrations:.0f} migration(s)" if migrations else "")
           + (f", {stalls:.0f} stall(s)" if stalls else ""))
        prev_prompt = prompt
        last = (content, finish, usage)
        history.append({"role": "assistant", "content": content})

    end = common.metrics()
    expect(prev_prompt > 600, f"the final prompt has only {prev_prompt} tokens; the conversation should grow past "
                              "two window boundaries (> 600 tokens with windows 256, 512, 1024)")
    migrations = end.sum("pyramid_kv_migrations_total") - start.sum("pyramid_kv_migrations_total")
    expect(migrations >= 2, f"pyramid_kv_migrations_total grew by {migrations:.0f}; expected >= 2 as the session "
                            f"grew to {prev_prompt} tokens")
    ok(f"conversation grew to {prev_prompt} prompt tokens with {migrations:.0f} window migrations")
    reprefills = end.sum("pyramid_reprefills_total") - start.sum("pyramid_reprefills_total")
    expect_eq(reprefills, 0, "pyramid_reprefills_total delta: a crossing re-prefilled instead of migrating")
    # Artifacts made during the conversation: compiled, or loaded from the store a
    # previous start left.
    made = ["pyramid_artifact_compiles_total", "pyramid_artifact_store_loads_total"]
    compiles = sum(end.sum(name) - start.sum(name) for name in made)
    stalls = end.sum("pyramid_stalls_total") - start.sum("pyramid_stalls_total")
    stall_s = end.sum("pyramid_stall_seconds_total") - start.sum("pyramid_stall_seconds_total")
    if cfg.expect_stalls == "none":
        expect(compiles >= 2, f"only {compiles:.0f} artifacts compiled for {migrations:.0f} crossings")
        expect_eq(stalls, 0, f"pyramid_stalls_total delta ({stall_s:.2f} s waited) with predicted compiles")
    elif cfg.expect_stalls == "some":
        expect(stalls > 0 and stall_s > 0, f"no crossing waited ({stalls:.0f} stalls) although compiles are on demand")
    if cfg.expect_stalls:
        ok(f"{compiles:.0f} artifacts compiled during the conversation, {stalls:.0f} stalls ({stall_s:.2f} s)")

    # The same final request on a server that has never seen this conversation.
    fresh_before = common.metrics(cfg.fresh_base_url)
    content, finish, usage = ask(history[:-1], stream=False, base_url=cfg.fresh_base_url)
    fresh_after = common.settled_metrics(
        lambda m: m.sum("pyramid_prefilled_tokens_total") - fresh_before.sum("pyramid_prefilled_tokens_total")
        >= usage["prompt_tokens"], base_url=cfg.fresh_base_url)
    expect_eq(content, last[0], "last reply from a fresh server (full prefill) vs the incremental server")
    expect_eq(finish, last[1], "finish_reason on the fresh server")
    expect_eq(usage["prompt_tokens"], last[2]["prompt_tokens"], "prompt_tokens on the fresh server")
    expect_eq(usage["completion_tokens"], last[2]["completion_tokens"], "completion_tokens on the fresh server")
    expect_eq(common.cached_tokens(usage), 0, "cached_tokens on the fresh server")
    prefilled = (fresh_after.sum("pyramid_prefilled_tokens_total")
                 - fresh_before.sum("pyramid_prefilled_tokens_total"))
    expect_eq(prefilled, usage["prompt_tokens"], "pyramid_prefilled_tokens_total delta on the fresh server")
    ok(f"a fresh server prefilling all {usage['prompt_tokens']} tokens gives the same last reply")


if __name__ == "__main__":
    common.run(main)
