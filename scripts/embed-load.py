#!/usr/bin/env python3
"""Measure `/v1/embeddings` throughput: texts per second at given batch sizes.

A measurement, not a test: nothing is asserted. For each batch size it sends requests of
that many texts (each text a unique tag and a few sentences, so every one is prefilled
in full), one request at a time after a warm-up, and reports texts/s and prompt tokens/s
over the wall time of the timed requests. Any OpenAI-compatible server works, so the
same run can measure a peer (llama-server started with `--embeddings`) beside pyramid:
pass several `--base-url`s.

Usage (the openai package is needed; scripts/test.sh installs it into
${PYRAMID_HOME:-~/.cache/pyramid}/test-venv):

    ~/.cache/pyramid/test-venv/bin/python scripts/embed-load.py \\
        --base-url http://127.0.0.1:8080 --batch 1 32 --sentences 3

Prints one JSON line per (server, batch size).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid

from openai import OpenAI

SENTENCES = [
    "The river bends twice before it reaches the old mill.",
    "A compiler turns a program into instructions a machine can run.",
    "She packed the lantern, a map and enough bread for two days.",
    "Caches keep recent answers close so they need not be computed again.",
    "The committee met on Thursday and postponed the decision.",
    "Every prime above two is odd, but not every odd number is prime.",
]


def texts(n: int, sentences: int, salt: str) -> list[str]:
    return [
        f"[{salt}-{i}] " + " ".join(SENTENCES[(i + j) % len(SENTENCES)] for j in range(sentences))
        for i in range(n)
    ]


def measure(base_url: str, model: str | None, batch: int, sentences: int, requests: int) -> dict:
    client = OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="none", timeout=600)
    model = model or client.models.list().data[0].id
    client.embeddings.create(model=model, input=texts(batch, sentences, "warm"))
    start = time.perf_counter()
    n_texts = n_tokens = 0
    for _ in range(requests):
        reply = client.embeddings.create(
            model=model, input=texts(batch, sentences, uuid.uuid4().hex[:8]), encoding_format="float"
        )
        n_texts += len(reply.data)
        n_tokens += reply.usage.prompt_tokens
    took = time.perf_counter() - start
    return {
        "server": base_url,
        "model": model,
        "batch": batch,
        "requests": requests,
        "texts_per_s": round(n_texts / took, 2),
        "prompt_tokens_per_s": round(n_tokens / took, 1),
        "tokens_per_text": round(n_tokens / n_texts, 1),
        "dimensions": len(reply.data[0].embedding),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", nargs="+", default=["http://127.0.0.1:8080"])
    parser.add_argument("--model", default=None, help="model id (default: the server's first)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 32], help="texts per request")
    parser.add_argument("--sentences", type=int, default=3, help="sentences per text")
    parser.add_argument("--requests", type=int, default=0,
                        help="timed requests per batch size (default: enough for 64 texts)")
    args = parser.parse_args()
    for batch in args.batch:
        requests = args.requests or max(1, 64 // batch)
        for url in args.base_url:
            print(json.dumps(measure(url, args.model, batch, args.sentences, requests)), flush=True)


if __name__ == "__main__":
    main()
