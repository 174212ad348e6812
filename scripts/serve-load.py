#!/usr/bin/env python3
"""Measure `pyramid serve` under load: TTFT, inter-token latency, aggregate throughput.

A measurement, not a test: nothing is asserted. It runs a single-client baseline (a
warm-up, then a few sequential streaming chat requests), then N concurrent streaming
clients with mixed prompt lengths, and reports

  - TTFT: time from sending a request to its first content chunk (p50 / p99),
  - ITL: gaps between consecutive content chunks of a stream (p50 / p99),
  - aggregate tok/s: completion tokens of all concurrent requests (from the usage
    chunk that stream_options.include_usage adds) over the phase's wall time,
  - single-client tok/s: the baseline's completion tokens over its request time,
  - ratio: aggregate / single-client.

Every prompt starts with a unique tag, so nothing is served from the session cache
and each request pays its own prefill. Generation is greedy; a request may stop before
--max-tokens when the model ends its answer (tokens are counted from usage).

Usage (the openai package is needed; scripts/test.sh installs it into
${PYRAMID_HOME:-~/.cache/pyramid}/test-venv):

    ~/.cache/pyramid/test-venv/bin/python scripts/serve-load.py \
        --base-url http://127.0.0.1:8080 --clients 32 --max-tokens 64

Prints a JSON summary, then a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
import uuid

try:
    import openai
except ImportError:
    sys.exit("serve-load.py needs the openai package (e.g. the venv scripts/test.sh makes)")

TOPICS = [
    "the history of lighthouses", "how bread rises", "migrating birds", "the printing press",
    "volcanic soils", "tidal power", "medieval bridges", "the life of bees", "desert cities",
    "glaciers", "ancient maps", "the postal service", "coral reefs", "clock making",
    "mountain railways", "paper making",
]
FILLER = [
    "Consider the people involved and the tools they used.",
    "Mention at least one surprising fact along the way.",
    "Describe how things changed over several centuries.",
    "Explain the main forces or causes at work in plain language.",
    "Compare the situation in two different regions of the world.",
    "Include a short anecdote that illustrates the point.",
    "Finish with a thought about what might happen next.",
    "Keep the tone friendly but informative throughout.",
]


def make_prompt(rng: random.Random, tag: str) -> list[dict]:
    """A unique chat prompt: 0 to ~24 extra sentences, so prompt lengths are mixed."""
    topic = rng.choice(TOPICS)
    extra = " ".join(rng.choice(FILLER) for _ in range(rng.choice([0, 1, 3, 6, 12, 24])))
    return [{"role": "system", "content": "You are a knowledgeable writer."},
            {"role": "user", "content": f"[{tag}] Write a detailed essay about {topic}. {extra}"}]


async def one_request(client, model: str, messages: list[dict], max_tokens: int,
                      ignore_eos: bool = False) -> dict:
    """Stream one request; time every content chunk. With `ignore_eos` every reply runs to
    `max_tokens` (the extension vLLM's and llama.cpp's servers accept), so runs compare
    equal amounts of work."""
    start = time.perf_counter()
    extra = {"ignore_eos": True} if ignore_eos else None
    stream = await client.chat.completions.create(
        model=model, messages=messages, max_tokens=max_tokens, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body=extra)
    stamps: list[float] = []
    tokens = None
    async for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            stamps.append(time.perf_counter())
    end = time.perf_counter()
    if tokens is None:  # a server without include_usage support: count chunks instead
        tokens = len(stamps)
    return {
        "start": start,
        "end": end,
        "ttft": stamps[0] - start if stamps else None,
        "itl": [b - a for a, b in zip(stamps, stamps[1:])],
        "tokens": tokens,
    }


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


async def run(args) -> dict:
    client = openai.AsyncOpenAI(base_url=args.base_url.rstrip("/") + "/v1", api_key=args.api_key or "no-key-needed",
                                max_retries=0, timeout=args.timeout)
    model = args.model
    if not model:
        model = (await client.models.list()).data[0].id
    run_tag = uuid.uuid4().hex[:8]
    rng = random.Random(args.seed)

    # Baseline: one client, one request at a time (after a warm-up that is not counted).
    await one_request(client, model, make_prompt(rng, f"{run_tag}-warm"), args.max_tokens, args.ignore_eos)
    baseline = []
    for i in range(args.baseline_requests):
        baseline.append(await one_request(client, model, make_prompt(rng, f"{run_tag}-base{i}"), args.max_tokens,
                                          args.ignore_eos))
    single_tokens = sum(r["tokens"] for r in baseline)
    single_time = sum(r["end"] - r["start"] for r in baseline)

    # Load: all clients start together.
    prompts = [make_prompt(rng, f"{run_tag}-c{i}") for i in range(args.clients)]
    results = await asyncio.gather(*(one_request(client, model, p, args.max_tokens, args.ignore_eos)
                                     for p in prompts))
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    total_tokens = sum(r["tokens"] for r in results)
    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    itls = [gap for r in results for gap in r["itl"]]
    base_ttfts = [r["ttft"] for r in baseline if r["ttft"] is not None]
    base_itls = [gap for r in baseline for gap in r["itl"]]
    await client.close()

    single_rate = single_tokens / single_time if single_time > 0 else None
    aggregate_rate = total_tokens / wall if wall > 0 else None
    return {
        "model": model,
        "clients": args.clients,
        "max_tokens": args.max_tokens,
        "ignore_eos": args.ignore_eos,
        "ttft_ms": {"p50": ms(percentile(ttfts, 50)), "p99": ms(percentile(ttfts, 99))},
        "itl_ms": {"p50": ms(percentile(itls, 50)), "p99": ms(percentile(itls, 99))},
        "aggregate_tok_s": round(aggregate_rate, 1) if aggregate_rate else None,
        "aggregate_completion_tokens": total_tokens,
        "aggregate_wall_s": round(wall, 2),
        "single_client": {
            "requests": len(baseline),
            "tok_s": round(single_rate, 1) if single_rate else None,
            "ttft_ms_p50": ms(percentile(base_ttfts, 50)),
            "itl_ms_p50": ms(percentile(base_itls, 50)),
        },
        "ratio": round(aggregate_rate / single_rate, 2) if aggregate_rate and single_rate else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default=os.environ.get("PYRAMID_BASE_URL", "http://127.0.0.1:8080"),
                        help="server URL without /v1 (default: $PYRAMID_BASE_URL or http://127.0.0.1:8080)")
    parser.add_argument("--model", default=os.environ.get("PYRAMID_MODEL_ID"),
                        help="model id (default: $PYRAMID_MODEL_ID, else the first one /v1/models lists)")
    parser.add_argument("--clients", type=int, default=32, help="concurrent streaming clients")
    parser.add_argument("--max-tokens", type=int, default=64, help="max_tokens of every request")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="every reply runs to --max-tokens (ignore_eos, as vLLM's bench sends it)")
    parser.add_argument("--api-key", default=os.environ.get("PYRAMID_API_KEY"), help="the server's --api-key, if any")
    parser.add_argument("--baseline-requests", type=int, default=3, help="sequential single-client requests")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--seed", type=int, default=1, help="seed for prompt selection")
    args = parser.parse_args()

    summary = asyncio.run(run(args))
    print(json.dumps(summary, indent=2))
    single = summary["single_client"]
    rows = [
        ("TTFT p50 / p99 (ms)", f"{summary['ttft_ms']['p50']} / {summary['ttft_ms']['p99']}",
         f"{single['ttft_ms_p50']} (p50)"),
        ("ITL p50 / p99 (ms)", f"{summary['itl_ms']['p50']} / {summary['itl_ms']['p99']}",
         f"{single['itl_ms_p50']} (p50)"),
        ("throughput (tok/s)", f"{summary['aggregate_tok_s']}", f"{single['tok_s']}"),
    ]
    print()
    print(f"{'':22} {f'{args.clients} clients':>18} {'1 client':>16}")
    for name, loaded, alone in rows:
        print(f"{name:22} {loaded:>18} {alone:>16}")
    print(f"aggregate / single-client throughput: {summary['ratio']}x "
          f"({summary['aggregate_completion_tokens']} tokens in {summary['aggregate_wall_s']} s)")


if __name__ == "__main__":
    main()
