"""`POST /v1/embeddings` through the official openai client.

The client asks for base64 unless told otherwise and decodes it; a raw request asks for
floats, and the two must agree bit for bit. Checked: one string, a batch in order (each
vector equal to the same text embedded alone, however the engine batched them), token
ids, unit length, usage, the model card's `embedding` entry, embeddings in flight beside
a chat reply that stays the same, and errors naming their field (`dimensions` not the
model's width, an empty input, an unknown model, a token id out of range). With
`PYRAMID_EXPECT_DEVICE=ov:*` it checks only that the static route refuses with a 400.
"""

from __future__ import annotations

import math
import os
import struct
import threading

import openai

import common
from common import expect, expect_api_error, expect_eq, ok

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b",
    "Embeddings put similar texts near each other.",
    "The quick brown fox jumps over the lazy dog.",
]


def norm(vector: list[float]) -> float:
    return math.sqrt(sum(x * x for x in vector))


def width() -> int:
    card = common.get("/v1/models/" + common.config().model).json()
    embedding = card.get("embedding")
    expect(isinstance(embedding, dict), f"the model card names its embeddings: {common.short(card)}")
    expect(embedding["pooling"] in ("mean", "cls", "last"), f"pooling {embedding['pooling']}")
    return embedding["dimensions"]


def check_batches(client: openai.OpenAI, dims: int) -> None:
    model = common.config().model
    batch = client.embeddings.create(model=model, input=TEXTS)
    expect_eq(len(batch.data), len(TEXTS), "one embedding per input")
    expect_eq([d.index for d in batch.data], list(range(len(TEXTS))), "indices in order")
    for d in batch.data:
        expect_eq(len(d.embedding), dims, "width")
        expect(abs(norm(d.embedding) - 1.0) < 1e-5, f"unit length, not {norm(d.embedding)}")
    expect_eq(batch.data[0].embedding, batch.data[3].embedding, "the same text twice")
    expect(batch.data[0].embedding != batch.data[1].embedding, "different texts differ")
    alone = client.embeddings.create(model=model, input=TEXTS[1])
    expect_eq(alone.data[0].embedding, batch.data[1].embedding, "alone equals in a batch")
    expect(batch.usage.prompt_tokens > len(TEXTS), f"usage {batch.usage}")
    expect_eq(batch.usage.total_tokens, batch.usage.prompt_tokens, "total = prompt tokens")

    raw = common.post("/v1/embeddings", {"model": model, "input": TEXTS[:2], "encoding_format": "float"})
    expect_eq(raw.status, 200, f"float request: {raw.text}")
    floats = [d["embedding"] for d in raw.json()["data"]]
    as_f32 = [[struct.unpack("<f", struct.pack("<f", x))[0] for x in v] for v in floats]
    expect_eq(as_f32, [batch.data[0].embedding, batch.data[1].embedding], "float equals base64")

    ids = client.embeddings.create(model=model, input=[[1, 2, 3], [4, 5]])
    expect_eq(ids.usage.prompt_tokens, 5, "token-id inputs count as given")
    ok("embeddings: batches, ids, float and base64")


def check_beside_chat(client: openai.OpenAI) -> None:
    """A chat reply is the same with embeddings prefilled beside it."""
    model = common.config().model
    ask = dict(model=model, messages=[{"role": "user", "content": "Name three colours."}],
               max_tokens=24, temperature=0)
    before = client.chat.completions.create(**ask).choices[0].message.content
    vectors: list = []
    worker = threading.Thread(
        target=lambda: vectors.append(client.embeddings.create(model=model, input=TEXTS * 8)))
    worker.start()
    during = client.chat.completions.create(**ask).choices[0].message.content
    worker.join()
    expect_eq(during, before, "the chat reply beside 32 embeddings")
    expect_eq(len(vectors[0].data), 32, "32 embeddings")
    ok("embeddings beside a chat reply")


def check_errors(client: openai.OpenAI, dims: int) -> None:
    model = common.config().model
    expect_api_error(lambda: client.embeddings.create(model=model, input="a", dimensions=dims // 2),
                     openai.BadRequestError, 400, "dimensions", param="dimensions")
    expect_api_error(lambda: client.embeddings.create(model=model, input=["a", ""]),
                     openai.BadRequestError, 400, "empty input", param="input")
    expect_api_error(lambda: client.embeddings.create(model=model, input=[[10_000_000]]),
                     openai.BadRequestError, 400, "id out of range", param="input")
    expect_api_error(lambda: client.embeddings.create(model="no-such-model", input="a"),
                     openai.NotFoundError, 404, "unknown model", code="model_not_found")
    ok("embeddings: errors name their field")


def check_static_route_refuses() -> None:
    """On a route of compiled artifacts (ov:*) the card has no embeddings and a request
    says why."""
    card = common.get("/v1/models/" + common.config().model).json()
    expect_eq(card.get("embedding"), None, "no embeddings on a static route")
    resp = common.post("/v1/embeddings", {"model": common.config().model, "input": "a"})
    common.check_error_response(resp, 400, "embeddings on a static route")
    expect("native route" in resp.json()["error"]["message"], f"names the route: {resp.text}")
    ok("embeddings on a static route: a 400 naming the native route")


def main() -> None:
    if os.environ.get("PYRAMID_EXPECT_DEVICE", "").startswith("ov:"):
        return check_static_route_refuses()
    client = common.client()
    dims = width()
    check_batches(client, dims)
    check_beside_chat(client)
    check_errors(client, dims)


if __name__ == "__main__":
    common.run(main)
