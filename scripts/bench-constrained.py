#!/usr/bin/env python3
"""Decode speed with and without a JSON-schema constraint, against a running `pyramid serve`.

    ./target/release/pyramid serve -m qwen2.5-coder-0.5b --port 8080 --max-batch 8 &
    python3 scripts/bench-constrained.py --base-url http://127.0.0.1:8080 --model qwen2.5-coder-0.5b

For batch sizes 1 and 8 it sends that many requests at once: unconstrained; with a
`json_schema` response format whose strings have length bounds (`bounded`, the costly
masks) or none (`free`); and, at batch 8, half bounded and half unconstrained (`mixed`).
Every request generates exactly `--tokens` tokens: end-of-generation tokens are banned
with `logit_bias` and the schemas (arrays of 60 strings) are longer than that, so every
arm decodes the same number of tokens after the same prompt. Reports aggregate tokens/s per arm (the median of
`--repeats` runs) and the constrained/unconstrained ratio. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
import urllib.request

# Strings with length bounds are the costly case for masks (every token is checked);
# free strings take llguidance's fast path.
SCHEMAS = {
    "bounded": {"type": "array", "items": {"type": "string", "minLength": 3, "maxLength": 12},
                "minItems": 60, "maxItems": 60},
    "free": {"type": "array", "items": {"type": "string"}, "minItems": 60, "maxItems": 60},
}


def post(base: str, body: dict) -> dict:
    req = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as resp:
        return json.load(resp)


def body(args, i: int, schema: str | None, bans: dict) -> dict:
    b = {"model": args.model, "temperature": 0, "max_tokens": args.tokens, "logit_bias": bans,
         "messages": [{"role": "user", "content": f"List sixty different words about topic {i}, as a JSON array."}]}
    if schema:
        b["response_format"] = {"type": "json_schema", "json_schema": {"name": "words", "schema": SCHEMAS[schema]}}
    return b


def run_batch(args, kinds: list[str | None], bans: dict) -> tuple[float, list[dict]]:
    results: list[dict | None] = [None] * len(kinds)

    def one(i: int) -> None:
        results[i] = post(args.base_url, body(args, i, kinds[i], bans))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(kinds))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, results  # type: ignore[return-value]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--ban", default="", help="comma-separated end-of-generation token ids to ban")
    args = ap.parse_args()
    bans = {t: -100 for t in args.ban.split(",") if t}
    run_batch(args, [None], bans)  # warm-up: caches, page faults
    rows = []
    for batch in (1, 8):
        arms = {"unconstrained": [None] * batch, "bounded": ["bounded"] * batch, "free": ["free"] * batch}
        if batch > 1:
            arms["mixed"] = ["bounded" if i % 2 == 0 else None for i in range(batch)]
        rates = {}
        for name, kinds in arms.items():
            samples = []
            for _ in range(args.repeats):
                secs, results = run_batch(args, kinds, bans)
                tokens = sum(r["usage"]["completion_tokens"] for r in results)
                if any(r["usage"]["completion_tokens"] != args.tokens for r in results):
                    raise SystemExit(f"{name}: a request ended early: {[r['usage'] for r in results]}")
                if any(kinds):
                    for r, k in zip(results, kinds):
                        if k:
                            text = r["choices"][0]["message"]["content"]
                            if not text.startswith('["'):
                                raise SystemExit(f"constrained reply is not the schema's array: {text[:80]!r}")
                samples.append(tokens / secs)
            rates[name] = statistics.median(samples)
        for name, rate in rates.items():
            ratio = rate / rates["unconstrained"]
            rows.append((batch, name, rate, ratio))
            print(f"batch {batch}  {name:13s}  {rate:7.1f} tok/s  ({ratio:.2f} x unconstrained)", flush=True)
    print(json.dumps([{"batch": b, "arm": n, "tok_s": round(r, 2), "ratio": round(x, 3)} for b, n, r, x in rows]))


if __name__ == "__main__":
    main()
