"""Four agents on one system prompt: each forks the shared prefix instead of stealing it.

Four agents share a ~300-token system prompt and take 3 interleaved turns each (agent 0,
1, 2, 3, then again), greedy, the reply appended to each agent's history. Proves that:
- an agent's first turn reuses the system prompt another agent left cached
  (cached_tokens >= the system prompt's tokens), from the second agent on;
- every later turn reuses all of its previous prompt (cached_tokens >= the previous
  turn's prompt_tokens): no agent evicted another by taking its cache;
- pyramid_prefilled_tokens_total rises by exactly the uncached tokens (prompt_tokens -
  cached_tokens) summed over the turns, and pyramid_session_forks_total counts the forks.
"""

from __future__ import annotations

import random

import common
from common import expect, expect_eq, ok

cfg = common.config()
api = common.client()
MODEL = cfg.model
AGENTS = 4
TURNS = 3
# The system turn's tokens, at least (the prompt is ~300 tokens; the user turns differ).
SHARED = 250


def main() -> None:
    rng = random.Random(17)
    system = "You are one of several research agents. Shared notes follow. " + common.paragraph(rng, 18)
    histories = [[{"role": "system", "content": system}] for _ in range(AGENTS)]
    last_prompt = [0] * AGENTS
    before = common.metrics()
    uncached = 0
    for turn in range(TURNS):
        for agent in range(AGENTS):
            histories[agent].append({"role": "user", "content": f"Agent {agent}, step {turn}: " + common.paragraph(rng, 2)})
            r = api.chat.completions.create(model=MODEL, messages=histories[agent], temperature=0, max_tokens=8)
            usage = r.usage
            cached = common.cached_tokens(usage)
            uncached += usage.prompt_tokens - cached
            if turn == 0 and agent > 0:
                expect(cached >= SHARED, f"agent {agent}'s first turn reused only {cached} tokens of the shared system prompt")
            if turn > 0:
                expect(cached >= last_prompt[agent],
                       f"agent {agent} turn {turn}: reused {cached} < its previous prompt {last_prompt[agent]}")
            last_prompt[agent] = usage.prompt_tokens
            histories[agent].append({"role": "assistant", "content": r.choices[0].message.content or ""})
    after = common.settled_metrics(lambda m: m.sum("pyramid_running_sequences") == 0)
    expect_eq(after.sum("pyramid_prefilled_tokens_total") - before.sum("pyramid_prefilled_tokens_total"), uncached,
              "prefilled tokens = the uncached prompt tokens of every turn")
    forks = after.sum("pyramid_session_forks_total") - before.sum("pyramid_session_forks_total")
    expect(forks >= AGENTS - 1, f"{forks} forks for {AGENTS} agents on one system prompt")
    ok(f"{AGENTS} agents x {TURNS} turns: every turn reused its previous prompt, "
       f"{uncached} tokens prefilled in all, {forks:.0f} forks")


common.run(main)
