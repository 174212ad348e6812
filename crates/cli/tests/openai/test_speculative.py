"""Prompt-lookup speculative decoding over HTTP.

Proves that:
- a request that re-emits its prompt gives the same text with `speculative: "ngram"`, with
  the field left out (the server's default) and with `"off"`, streamed or not; its drafts are
  counted in `usage` (`completion_tokens_details.accepted_prediction_tokens`, and
  `speculative` with tokens per pass above 1), the plain one's are 0;
- a speculative and a plain request running together each give their own text;
- /metrics counts drafts, accepted tokens and passes, and reports tokens per pass;
- a chat request's `prediction` (OpenAI's predicted outputs) of its own reply is accepted
  almost whole and changes no token, a wrong one changes none either, and a malformed one
  (or one on /v1/completions) is a 400 naming `prediction`;
- a bad `speculative` value is a 400 naming it.
With PYRAMID_SPECULATIVE_OFF=1 (a server started with --speculative off) it proves instead
that a request asking for `ngram` (or sending a `prediction`) is a 400 naming the field,
and one asking `off` runs.
"""

from __future__ import annotations

import os
import threading

import common
from common import expect, expect_eq

cfg = common.config()
MODEL = cfg.model
LINES = "\n".join(f"item_{i} = load('item_{i}.csv', rows={i * 10})" for i in range(12))
PROMPT = f"Copy these lines exactly.\n\n{LINES}\n\nCopy:\n{LINES.splitlines()[0]}\n"
# SmolLM2's end tokens (<|endoftext|>, <|im_end|>), banned so lengths are exact.
BODY = {"model": MODEL, "prompt": PROMPT, "max_tokens": 96, "temperature": 0,
        "logit_bias": {"0": -100, "2": -100}}


CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Describe the water cycle in three sentences."}],
        "max_tokens": 64, "temperature": 0, "logit_bias": {"0": -100, "2": -100}}


def chat(extra: dict) -> dict:
    r = common.post("/v1/chat/completions", CHAT | extra)
    expect_eq(r.status, 200, f"chat {list(extra)}: {common.short(r.body)}")
    return r.json()


def predictions() -> None:
    plain = chat({"speculative": "off"})
    text = plain["choices"][0]["message"]["content"]
    right = chat({"prediction": {"type": "content", "content": text}})
    expect_eq(right["choices"][0]["message"]["content"], text, "a right prediction changes no token")
    details = right["usage"]["completion_tokens_details"]
    expect(details["accepted_prediction_tokens"] >= right["usage"]["completion_tokens"] // 2,
           f"most of a right prediction is accepted: {right['usage']}")
    parts = [{"type": "text", "text": "The sun heats the sea. "}, {"type": "text", "text": "Rain falls."}]
    wrong = chat({"prediction": {"type": "content", "content": parts}})
    expect_eq(wrong["choices"][0]["message"]["content"], text, "a wrong prediction changes no token")
    for bad in ("text", {"type": "content"}, {"type": "text", "content": "x"},
                {"type": "content", "content": [{"type": "image_url"}]}):
        r = common.post("/v1/chat/completions", CHAT | {"prediction": bad})
        expect_eq(r.status, 400, f"prediction={bad!r}: {common.short(r.body)}")
        expect_eq(r.json()["error"]["param"], "prediction", "the 400 names the field")
    r = common.post("/v1/completions", BODY | {"prediction": {"type": "content", "content": "x"}})
    expect_eq(r.status, 400, f"prediction on /v1/completions: {common.short(r.body)}")


def complete(extra: dict) -> dict:
    r = common.post("/v1/completions", BODY | extra)
    expect_eq(r.status, 200, f"completion {extra}: {common.short(r.body)}")
    return r.json()


def text_of(reply: dict) -> str:
    return reply["choices"][0]["text"]


def server_off() -> None:
    r = common.post("/v1/completions", BODY | {"speculative": "ngram"})
    expect_eq(r.status, 400, f"ngram on a server without speculation: {common.short(r.body)}")
    expect_eq(r.json()["error"]["param"], "speculative", "the 400 names the field")
    reply = complete({"speculative": "off"})
    expect_eq(reply["usage"]["speculative"]["drafted_tokens"], 0, "no drafts")
    reply = complete({})
    expect_eq(reply["usage"]["completion_tokens_details"]["accepted_prediction_tokens"], 0,
              "no drafts by default")
    r = common.post("/v1/chat/completions", CHAT | {"prediction": {"type": "content", "content": "Paris"}})
    expect_eq(r.status, 400, f"a prediction without speculation: {common.short(r.body)}")
    expect_eq(r.json()["error"]["param"], "prediction", "the 400 names the field")


def main() -> None:
    if os.environ.get("PYRAMID_SPECULATIVE_OFF") == "1":
        server_off()
        return
    before = common.metrics()
    plain = complete({"speculative": "off"})
    spec = complete({"speculative": "ngram"})
    default = complete({})
    expect_eq(text_of(spec), text_of(plain), "speculative text equals plain text")
    expect_eq(text_of(default), text_of(plain), "the default (ngram) text equals plain text")
    expect_eq(plain["usage"]["speculative"]["drafted_tokens"], 0, "plain requests draft nothing")
    expect_eq(plain["usage"]["completion_tokens_details"]["accepted_prediction_tokens"], 0, "plain")
    usage = spec["usage"]
    accepted = usage["completion_tokens_details"]["accepted_prediction_tokens"]
    rejected = usage["completion_tokens_details"]["rejected_prediction_tokens"]
    s = usage["speculative"]
    expect(accepted > 0, f"drafts were accepted on a copying reply: {usage}")
    expect_eq(accepted, s["accepted_tokens"], "accepted tokens agree")
    expect_eq(accepted + rejected, s["drafted_tokens"], "accepted + rejected = drafted")
    expect_eq(s["decode_passes"] + accepted, usage["completion_tokens"], "passes + accepted = tokens")
    expect(s["tokens_per_pass"] > 1.0, f"more than one token per pass: {s}")

    stream = common.stream_sse("/v1/completions", BODY | {"speculative": "ngram", "stream": True,
                                                          "stream_options": {"include_usage": True}})
    expect(stream.done, "the speculative stream ended with [DONE]")
    expect_eq(stream.text(), text_of(plain), "streamed speculative text equals plain text")
    expect((stream.usage() or {}).get("speculative", {}).get("accepted_tokens", 0) > 0,
           f"the stream's usage counts accepted drafts: {stream.usage()}")

    # Together in one batch: each its own text.
    other = BODY | {"prompt": "The three laws of motion are", "speculative": "off", "max_tokens": 64}
    alone = common.post("/v1/completions", other).json()
    results: dict = {}

    def run(name: str, body: dict) -> None:
        results[name] = common.post("/v1/completions", body).json()

    threads = [threading.Thread(target=run, args=("spec", BODY | {"speculative": "ngram"})),
               threading.Thread(target=run, args=("plain", other))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    expect_eq(text_of(results["spec"]), text_of(plain), "speculative text beside a plain request")
    expect_eq(text_of(results["plain"]), text_of(alone), "plain text beside a speculative request")

    after = common.metrics()
    for name in ("pyramid_speculative_drafted_tokens_total", "pyramid_speculative_accepted_tokens_total",
                 "pyramid_decode_passes_total", "pyramid_speculative_verify_passes_total"):
        expect_eq(after.type_of(name), "counter", f"{name} is a counter")
        expect(after.sum(name) > before.sum(name), f"{name} grew")
    expect(after.sum("pyramid_tokens_per_decode_pass") > 1.0, "tokens per pass above 1 in /metrics")

    predictions()
    for bad in ("fast", 3, {"type": "ngram"}):
        r = common.post("/v1/completions", BODY | {"speculative": bad})
        expect_eq(r.status, 400, f"speculative={bad!r}: {common.short(r.body)}")
        expect_eq(r.json()["error"]["param"], "speculative", "the 400 names the field")
    print("speculative decoding over HTTP: ok")


if __name__ == "__main__":
    main()
