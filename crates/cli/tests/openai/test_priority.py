"""Priorities over HTTP: an urgent request pauses a background one, which then resumes.

The server runs with --max-batch 1 and a small --kv-budget. Proves that:
- a background stream (priority 5, end tokens banned so it runs its whole length) is
  paused when an urgent request (priority -1 in the body, or the X-Priority header)
  arrives: the urgent reply completes while the background stream is still running, and
  pyramid_paused_total / pyramid_resumed_total count it;
- the paused stream resumes with exactly the text it gives when served alone (greedy);
- /metrics reports TTFT and inter-token latency per priority and the queue per priority
  (a series of its own for 0 and API key priorities, `other` for the rest);
- a bad priority is a 400 naming `priority` (body) or `X-Priority` (header);
- a request that can never fit the KV budget is a 400 naming --kv-budget at once, even
  while another request runs.
"""

from __future__ import annotations

import threading
import time

import common
from common import expect, expect_eq, ok

cfg = common.config()
MODEL = cfg.model
# SmolLM2's end tokens (<|endoftext|>, <|im_end|>), banned so lengths are exact.
BAN = {"0": -100, "2": -100}
BACKGROUND = {"model": MODEL, "prompt": "The history of the printing press begins", "max_tokens": 160,
              "temperature": 0, "logit_bias": BAN, "priority": 5, "stream": True}


def urgent_body(n: int) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": f"Say hello to agent {n}."}],
            "max_tokens": 8, "temperature": 0, "logit_bias": BAN}


def main() -> None:
    before = common.metrics()
    # Alone first: the reference text.
    alone = common.stream_sse("/v1/completions", BACKGROUND)
    expect(alone.done, "the background stream alone ended with [DONE]")
    reference = "".join(e["choices"][0].get("text", "") for e in alone.events if e.get("choices"))

    result: dict = {}

    def background() -> None:
        result["sse"] = common.stream_sse("/v1/completions", BACKGROUND)
        result["ended"] = time.perf_counter()

    thread = threading.Thread(target=background)
    thread.start()
    expect(common.wait_until(lambda: common.metrics().sum("pyramid_generated_tokens_total")
                             - before.sum("pyramid_generated_tokens_total") > 160 + 5, 60),
           "the background stream started")
    urgent_done = []
    body = urgent_body(1) | {"priority": -1}
    r = common.post("/v1/chat/completions", body)
    expect_eq(r.status, 200, f"urgent request in the body: {common.short(r.body)}")
    urgent_done.append(time.perf_counter())
    r = common.post("/v1/chat/completions", urgent_body(2), headers={"X-Priority": "-1"})
    expect_eq(r.status, 200, f"urgent request by header: {common.short(r.body)}")
    urgent_done.append(time.perf_counter())
    thread.join(180)
    sse = result.get("sse")
    expect(sse is not None and sse.done, "the background stream ended with [DONE]")
    expect(result["ended"] > urgent_done[-1], "both urgent replies came while the background stream ran")
    text = "".join(e["choices"][0].get("text", "") for e in sse.events if e.get("choices"))
    expect_eq(text, reference, "the paused and resumed background stream's text")

    after = common.settled_metrics(lambda m: m.sum("pyramid_running_sequences") == 0)
    paused = after.sum("pyramid_paused_total") - before.sum("pyramid_paused_total")
    resumed = after.sum("pyramid_resumed_total") - before.sum("pyramid_resumed_total")
    expect(paused >= 1 and resumed == paused, f"paused {paused}, resumed {resumed}")
    # Without API key priorities, only the default priority has a label of its own: the
    # urgent (-1) and background (5) requests are counted under `other`.
    expect(after.sum("pyramid_ttft_seconds_count", priority="other") >= 4, "TTFT samples at priorities -1 and 5")
    expect(after.sum("pyramid_inter_token_seconds_count", priority="other") >= 300, "inter-token samples at priority 5")
    expect_eq(after.sum("pyramid_ttft_seconds_count", priority="-1"), 0, "no series of its own for priority -1")
    expect("pyramid_queue_depth_by_priority" in after.samples, "queue depth by priority is reported")

    for bad in ["high", 1.5, 2**40]:
        r = common.post("/v1/chat/completions", urgent_body(3) | {"priority": bad})
        common.check_error_response(r, 400, f"priority {bad!r}", param="priority")
    r = common.post("/v1/chat/completions", urgent_body(3), headers={"X-Priority": "soon"})
    common.check_error_response(r, 400, "X-Priority: soon", param="X-Priority")

    # Never fits: a prompt of ~900 tokens needs the 1024 window, beyond --kv-budget
    # (30 MiB: 682 positions of SmolLM2's f32 KV); refused at once even while a long
    # stream holds the only batch slot.
    thread = threading.Thread(target=background)
    thread.start()
    time.sleep(0.5)
    words = " ".join(f"word{i}" for i in range(300))
    started = time.perf_counter()
    r = common.post("/v1/completions", {"model": MODEL, "prompt": words, "max_tokens": 4})
    waited = time.perf_counter() - started
    err = common.check_error_response(r, 400, "a prompt beyond the KV budget", param="prompt")
    expect("--kv-budget" in (err.get("message") or ""), f"the error names --kv-budget: {err}")
    thread.join(180)
    ok(f"urgent requests paused the background stream {paused:.0f} time(s); it resumed with its solo text; "
       f"a prompt beyond the budget was refused in {waited:.2f} s")


common.run(main)
