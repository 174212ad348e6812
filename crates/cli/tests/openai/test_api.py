"""The OpenAI-compatible API of `pyramid serve`, driven by the official openai client.

Proves that: /health and /v1/models answer as documented; chat and text completions
work non-streaming and streaming, and a greedy stream's pieces add up to the
non-streaming answer (first chat chunk carries the assistant role, include_usage adds
a final usage-only chunk, SSE framing ends with [DONE]); usage is consistent;
max_tokens / max_completion_tokens bound the output (finish_reason "length"); stop
strings (also ones spanning a token boundary, and lists) cut the output before their
first occurrence with finish_reason "stop"; logprobs / top_logprobs are well-formed
and agree with greedy choice; a seed makes sampling at temperature 0.8 reproducible;
sending the same chat twice reuses the cached prompt (cached_tokens > 0) without
changing the answer; /metrics is valid Prometheus text whose counters add up with the
usage the API reported; a `json_schema` reply and a forced tool call are constrained on
whatever route the server runs (this script also runs against ov:CPU).
"""

from __future__ import annotations

import json
import math
import os
import random

import common
from common import expect, expect_eq, ok

cfg = common.config()
api = common.client()
MODEL = cfg.model


def chat(messages, **kw):
    kw.setdefault("temperature", 0)
    return api.chat.completions.create(model=MODEL, messages=messages, **kw)


def chat_stream(messages, **kw):
    """Stream a chat request; returns (chunks, content, finish_reason, usage)."""
    kw.setdefault("temperature", 0)
    chunks = list(api.chat.completions.create(model=MODEL, messages=messages, stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = [c.usage for c in chunks if c.usage]
    return chunks, content, (reasons[-1] if reasons else None), (usage[-1] if usage else None)


def user(text):
    return [{"role": "system", "content": "You are a concise assistant."}, {"role": "user", "content": text}]


def check_basics():
    resp = common.get("/health")
    expect_eq(resp.status, 200, "GET /health status")
    expect_eq(resp.json(), {"status": "ok"}, "GET /health body")
    ok("/health is {status: ok}")

    models = api.models.list()
    ids = [m.id for m in models.data]
    expect_eq(ids, [MODEL], "/v1/models ids")
    raw = common.get("/v1/models").json()
    expect_eq(raw.get("object"), "list", "/v1/models object")
    expect_eq(raw["data"][0].get("object"), "model", "/v1/models data[0].object")
    ok(f"/v1/models lists exactly {MODEL!r}")


def check_chat_nonstream_and_stream():
    messages = user("Write one sentence about the sea.")
    resp = chat(messages, max_tokens=24)
    expect_eq(resp.object, "chat.completion", "chat object")
    expect(resp.id, "chat response has no id")
    expect_eq(resp.model, MODEL, "chat response model")
    expect_eq(len(resp.choices), 1, "number of choices")
    choice = resp.choices[0]
    expect_eq(choice.index, 0, "choice index")
    expect_eq(choice.message.role, "assistant", "message role")
    expect(isinstance(choice.message.content, str) and choice.message.content.strip(),
           f"chat content should be non-empty, got {choice.message.content!r}")
    expect(choice.finish_reason in ("stop", "length"), f"finish_reason {choice.finish_reason!r}")
    common.check_usage(resp.usage, "chat usage", max_completion=24)
    expect(resp.usage.completion_tokens >= 1, "completion_tokens should be >= 1 for non-empty content")
    if choice.finish_reason == "length":
        expect_eq(resp.usage.completion_tokens, 24, "completion_tokens when finish_reason is length")
    ok(f"chat non-stream: {resp.usage.completion_tokens} tokens, finish {choice.finish_reason}: "
       f"{choice.message.content[:50]!r}")

    # The same greedy request streamed, with a usage chunk at the end.
    chunks, content, reason, usage = chat_stream(messages, max_tokens=24, stream_options={"include_usage": True})
    expect(chunks, "stream produced no chunks")
    first = chunks[0]
    expect(first.choices and first.choices[0].delta.role == "assistant",
           f"first chunk's delta should carry role 'assistant', got {first.model_dump()}")
    expect(all(c.object == "chat.completion.chunk" for c in chunks), "every chunk's object is chat.completion.chunk")
    expect_eq(len({c.id for c in chunks}), 1, "number of distinct chunk ids in one stream")
    expect_eq(content, choice.message.content, "streamed content vs non-streamed content (greedy)")
    expect_eq(reason, choice.finish_reason, "streamed finish_reason")
    last = chunks[-1]
    expect(last.usage is not None and last.choices == [],
           f"with include_usage the last chunk should have empty choices and usage, got {last.model_dump()}")
    expect(all(c.usage is None for c in chunks[:-1]), "only the final chunk carries usage")
    common.check_usage(usage, "stream usage", max_completion=24)
    expect_eq(usage.prompt_tokens, resp.usage.prompt_tokens, "stream usage.prompt_tokens")
    expect_eq(usage.completion_tokens, resp.usage.completion_tokens, "stream usage.completion_tokens")
    ok(f"chat stream equals non-stream ({len(chunks)} chunks, role first, usage last)")

    # Without stream_options there is no usage chunk.
    chunks, content2, _, usage2 = chat_stream(messages, max_tokens=24)
    expect(usage2 is None and all(c.choices for c in chunks),
           "without include_usage no chunk should carry usage or have empty choices")
    expect_eq(content2, content, "stream without include_usage content")
    ok("chat stream without include_usage has no usage chunk")

    # Wire format, read raw: text/event-stream, `data: ` events, [DONE] last.
    sse = common.stream_sse("/v1/chat/completions", {
        "model": MODEL, "messages": messages, "max_tokens": 24, "temperature": 0, "stream": True})
    expect_eq(sse.status, 200, "raw SSE status")
    expect(not sse.problems, f"SSE framing problems: {sse.problems}")
    expect(sse.done, "raw SSE stream did not end with data: [DONE]")
    expect(not sse.after_done, f"data after [DONE]: {sse.after_done}")
    expect_eq(sse.text(), content, "raw SSE content")
    ok("raw SSE framing: data: events, ends with [DONE], nothing after")


def check_utf8_stream():
    # Non-ASCII output. With a byte-level BPE one CJK character or emoji is often split
    # over several tokens: every streamed piece must still be whole characters (no
    # U+FFFD for a partial one) and the pieces must add up to the non-streamed text.
    cases = [
        ("chat", user("Écris une phrase en français sur les châteaux, avec des accents: é, è, à, ç.")),
        ("completions", "東京は日本の首都です。京都は古い都で、"),
        ("completions", "Emoji story: 🐉🔥🍞 The dragon 🐉 baked bread 🍞 and"),
    ]
    for kind, prompt in cases:
        if kind == "chat":
            text = chat(prompt, max_tokens=24).choices[0].message.content
            stream = api.chat.completions.create(model=MODEL, messages=prompt, max_tokens=24, temperature=0, stream=True)
            pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
        else:
            text = api.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0).choices[0].text
            stream = api.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stream=True)
            pieces = [c.choices[0].text or "" for c in stream if c.choices]
        expect_eq("".join(pieces), text, f"{kind} non-ASCII streamed text vs non-streamed")
        if "\ufffd" not in text:
            bad = [p for p in pieces if "\ufffd" in p]
            expect(not bad, f"{kind}: streamed pieces with U+FFFD (a character split between chunks): {bad}")
        note = "non-ASCII output" if not text.isascii() else "ASCII-only output"
        ok(f"{kind} stream is UTF-8 safe ({note}, {len(pieces)} pieces): {text[:30]!r}")


def check_completions():
    prompt = "The three primary colours are"
    resp = api.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0)
    expect_eq(resp.object, "text_completion", "completions object")
    expect_eq(len(resp.choices), 1, "completions choices")
    text = resp.choices[0].text
    expect(isinstance(text, str) and text, f"completion text should be non-empty, got {text!r}")
    expect(resp.choices[0].finish_reason in ("stop", "length"), f"finish_reason {resp.choices[0].finish_reason!r}")
    common.check_usage(resp.usage, "completions usage", max_completion=16)

    stream = api.completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, stream=True,
                                    stream_options={"include_usage": True})
    chunks = list(stream)
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    expect_eq(streamed, text, "completions streamed text vs non-streamed")
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    expect_eq(reasons[-1:], [resp.choices[0].finish_reason], "completions streamed finish_reason")
    expect(chunks[-1].usage is not None and not chunks[-1].choices, "completions include_usage final chunk")
    expect_eq(chunks[-1].usage.completion_tokens, resp.usage.completion_tokens, "completions streamed usage")
    ok(f"completions non-stream == stream: {text[:50]!r}")


def check_max_completion_tokens():
    messages = user("Write a long story about a dragon who learns to bake bread.")
    ref = chat(messages, max_tokens=24)
    expect(ref.usage.completion_tokens > 5, f"reference should be longer than 5 tokens: {ref.usage}")
    # extra_body keeps this working with openai clients older than the typed parameter.
    short_resp = chat(messages, extra_body={"max_completion_tokens": 5})
    expect_eq(short_resp.usage.completion_tokens, 5, "completion_tokens with max_completion_tokens=5")
    expect_eq(short_resp.choices[0].finish_reason, "length", "finish_reason with max_completion_tokens=5")
    expect(ref.choices[0].message.content.startswith(short_resp.choices[0].message.content),
           f"5-token output {short_resp.choices[0].message.content!r} should prefix the 24-token one "
           f"{ref.choices[0].message.content!r}")
    ok("max_completion_tokens=5 gives 5 tokens, finish length, a prefix of the longer answer")

    short_resp = chat(messages, max_tokens=3)
    expect_eq((short_resp.usage.completion_tokens, short_resp.choices[0].finish_reason), (3, "length"),
              "(completion_tokens, finish_reason) with max_tokens=3")
    ok("max_tokens=3 gives 3 tokens, finish length")


def check_extensions():
    """The fields every local server accepts, as the SDK sends them (`extra_body`)."""
    import openai

    messages = user("Say yes.")
    extensions = {"top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1, "repeat_last_n": 32,
                  "ignore_eos": True, "min_tokens": 2, "stop_token_ids": [],
                  "chat_template_kwargs": {"enable_thinking": False}}
    resp = chat(messages, max_tokens=12, extra_body=extensions)
    expect_eq((resp.usage.completion_tokens, resp.choices[0].finish_reason), (12, "length"),
              "ignore_eos runs the reply to max_tokens")
    _, stream_text, reason, _ = chat_stream(messages, max_tokens=12, extra_body={"ignore_eos": True})
    expect_eq(reason, "length", "ignore_eos streamed finish_reason")
    plain = chat(messages, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    expect_eq(stream_text, plain.choices[0].message.content, "ignore_eos streamed vs not")
    common.expect_api_error(lambda: chat(messages, extra_body={"top_k": -3}), openai.BadRequestError,
                            400, "top_k -3", param="top_k")
    common.expect_api_error(lambda: chat(messages, max_tokens=4, extra_body={"min_tokens": 5}),
                            openai.BadRequestError, 400, "min_tokens over max_tokens", param="min_tokens")
    ok("extensions: top_k, min_p, repetition_penalty, ignore_eos, min_tokens, stop_token_ids, "
       "chat_template_kwargs accepted; bad values named")


def pick_stop(text: str, start_fraction: float = 0.4) -> str | None:
    """A stop string from the middle of `text` whose first occurrence is at index >= 2.

    Preferred shape: two word characters, a space, a word character ("ed t"). With a
    byte-level BPE the space starts a new token, so such a stop spans a token boundary
    and the server has to match it across tokens."""
    begin = max(2, int(len(text) * start_fraction))
    for i in range(begin, len(text) - 2):
        s = text[i - 2 : i + 2]
        if s[0].isalnum() and s[1].isalnum() and s[2] == " " and s[3].isalnum() and text.find(s) >= 2:
            return s
    for i in range(begin, len(text) - 3):
        s = text[i : i + 3]
        if s.strip() and text.find(s) >= 2:
            return s
    return None


def check_stop_strings():
    messages = user("Write a paragraph about lighthouses and the people who kept them.")
    ref = chat(messages, max_tokens=32).choices[0].message.content
    stop = pick_stop(ref)
    expect(stop is not None, f"could not pick a stop string from the reference output {ref!r}")
    expected = ref[: ref.find(stop)]

    resp = chat(messages, max_tokens=32, stop=stop)
    expect_eq(resp.choices[0].message.content, expected, f"content with stop={stop!r}")
    expect_eq(resp.choices[0].finish_reason, "stop", f"finish_reason with stop={stop!r}")
    _, content, reason, _ = chat_stream(messages, max_tokens=32, stop=stop)
    expect_eq(content, expected, f"streamed content with stop={stop!r}")
    expect_eq(reason, "stop", f"streamed finish_reason with stop={stop!r}")
    ok(f"stop {stop!r} cuts at {len(expected)} chars (stream and non-stream)")

    # A list: one that never occurs, one late, one earlier -> cut at the earliest.
    late = pick_stop(ref, 0.75) or stop
    stops = ["@@never@@", late, stop]
    first = min(ref.find(s) for s in stops if s in ref)
    expected = ref[:first]
    resp = chat(messages, max_tokens=32, stop=stops)
    expect_eq(resp.choices[0].message.content, expected, f"content with stop={stops!r}")
    expect_eq(resp.choices[0].finish_reason, "stop", f"finish_reason with stop={stops!r}")
    _, content, reason, _ = chat_stream(messages, max_tokens=32, stop=stops)
    expect_eq((content, reason), (expected, "stop"), f"streamed (content, finish_reason) with stop={stops!r}")
    ok(f"stop list {stops!r} cuts at the earliest match")

    # Completions honour stop too.
    prompt = "A short history of the printing press:"
    ref = api.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0).choices[0].text
    stop = pick_stop(ref)
    expect(stop is not None, f"could not pick a stop string from {ref!r}")
    resp = api.completions.create(model=MODEL, prompt=prompt, max_tokens=32, temperature=0, stop=[stop])
    expect_eq((resp.choices[0].text, resp.choices[0].finish_reason), (ref[: ref.find(stop)], "stop"),
              f"completions (text, finish_reason) with stop {stop!r}")
    ok(f"completions stop {stop!r}")


def check_logprobs():
    messages = user("Name three fruits.")
    resp = chat(messages, max_tokens=12, logprobs=True, top_logprobs=3)
    choice = resp.choices[0]
    expect(choice.logprobs is not None and choice.logprobs.content is not None,
           f"logprobs requested but missing: {choice.model_dump()}")
    entries = choice.logprobs.content
    n = resp.usage.completion_tokens
    # One entry per generated token. If generation ended on the end-of-generation
    # token, that token may or may not count in completion_tokens; allow either.
    allowed = {n, n - 1} if choice.finish_reason == "stop" else {n}
    expect(len(entries) in allowed,
           f"{len(entries)} logprob entries for {n} completion tokens (finish {choice.finish_reason})")
    for i, e in enumerate(entries):
        expect(e.logprob <= 1e-6, f"entry {i}: logprob {e.logprob} > 0")
        expect_eq(len(e.top_logprobs), 3, f"entry {i}: number of top_logprobs")
        tops = [t.logprob for t in e.top_logprobs]
        expect(all(t <= 1e-6 and not math.isnan(t) for t in tops), f"entry {i}: top logprobs {tops}")
        expect(tops == sorted(tops, reverse=True), f"entry {i}: top_logprobs not in descending order: {tops}")
        expect(abs(e.logprob - tops[0]) <= 1e-4,
               f"entry {i}: greedy token {e.token!r} logprob {e.logprob} is not the top one {tops[0]}")
        expect(sum(math.exp(t) for t in tops) <= 1 + 1e-4, f"entry {i}: top probabilities sum above 1: {tops}")
        if tops[0] - tops[1] > 1e-4:  # unique best: it must be the chosen token
            expect_eq(e.top_logprobs[0].token, e.token, f"entry {i}: best top token vs chosen token")
    content = choice.message.content
    if content.isascii():
        expect_eq("".join(e.token for e in entries), content, "concatenated logprob tokens vs content")
    ok(f"logprobs: {len(entries)} entries, 3 alternatives each, greedy = best")

    resp0 = chat(messages, max_tokens=4, logprobs=True, top_logprobs=0)
    expect(all(e.top_logprobs == [] for e in resp0.choices[0].logprobs.content),
           "top_logprobs=0 should give empty top_logprobs lists")
    plain = chat(messages, max_tokens=4)
    expect(plain.choices[0].logprobs is None, "logprobs not requested but present")
    ok("top_logprobs=0 gives empty lists; no logprobs unless asked")

    # Streaming carries the same entries, spread over the chunks.
    chunks = list(api.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, temperature=0,
                                              logprobs=True, top_logprobs=3, stream=True))
    streamed = [e for c in chunks if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
                for e in c.choices[0].logprobs.content]
    expect_eq([(e.token, round(e.logprob, 3)) for e in streamed],
              [(e.token, round(e.logprob, 3)) for e in entries], "streamed logprob entries vs non-streamed")
    ok("streamed logprobs equal non-streamed")


def check_seed():
    messages = user("Invent a name for a new colour and describe it.")
    params = dict(max_tokens=16, temperature=0.8, top_p=0.95, seed=1234)
    a = chat(messages, **params).choices[0].message.content
    b = chat(messages, **params).choices[0].message.content
    expect_eq(b, a, "second sampled answer with the same seed")
    _, c, _, _ = chat_stream(messages, **params)
    expect_eq(c, a, "streamed sampled answer with the same seed")
    other = chat(messages, **{**params, "seed": 4321}).choices[0].message.content
    ok(f"seed 1234 at temperature 0.8 reproduces {a[:40]!r} (seed 4321 {'differs' if other != a else 'same'})")


def check_choices():
    """`n` choices: each its own seed (`seed + i`), the prompt counted once."""
    messages = user("Invent a name for a new colour and describe it.")
    params = dict(max_tokens=12, temperature=0.8, top_p=0.95, seed=77)
    one = chat(messages, **params)
    three = chat(messages, n=3, **params)
    expect_eq([c.index for c in three.choices], [0, 1, 2], "choice indices")
    expect_eq(three.choices[0].message.content, one.choices[0].message.content, "choice 0 is the seed's answer")
    expect_eq(three.usage.prompt_tokens, one.usage.prompt_tokens, "the prompt counted once")
    alone = [chat(messages, **{**params, "seed": 77 + i}) for i in range(3)]
    expect_eq([c.message.content for c in three.choices], [a.choices[0].message.content for a in alone],
              "each choice is the answer alone with seed + i")
    expect_eq(three.usage.completion_tokens, sum(a.usage.completion_tokens for a in alone), "every choice's tokens")
    texts = api.completions.create(model=MODEL, prompt="Once upon a time", n=2, max_tokens=8,
                                      temperature=0.8, seed=5)
    expect_eq([c.index for c in texts.choices], [0, 1], "completions choice indices")
    ok(f"n=3: {[c.message.content[:20] for c in three.choices]}, prompt counted once")


def check_session_cache():
    # A conversation no earlier request has seen (the nonce), sent twice.
    nonce = random.Random().randrange(10**9)
    messages = user(f"Reference {nonce}. " + common.paragraph(random.Random(nonce), 4)
                    + " Summarise this in one line.")
    first = chat(messages, max_tokens=12)
    second = chat(messages, max_tokens=12)
    c1, c2 = common.cached_tokens(first.usage), common.cached_tokens(second.usage)
    expect(c2 > 0, f"the second identical chat should reuse cached prompt tokens; cached_tokens {c2} "
                   f"(first {c1}, prompt {second.usage.prompt_tokens})")
    expect(c2 >= c1, f"cached_tokens fell from {c1} to {c2} on the repeat")
    expect_eq(second.usage.prompt_tokens, first.usage.prompt_tokens, "prompt_tokens of the repeat")
    expect_eq(second.choices[0].message.content, first.choices[0].message.content,
              "greedy answer with a cached prompt vs without")
    ok(f"repeat chat reuses {c2}/{second.usage.prompt_tokens} prompt tokens (first time {c1}), same answer")


COUNTERS = ["pyramid_requests_total", "pyramid_prompt_tokens_total", "pyramid_cached_prompt_tokens_total",
            "pyramid_prefilled_tokens_total", "pyramid_generated_tokens_total", "pyramid_kv_migrations_total",
            "pyramid_artifact_compiles_total", "pyramid_artifact_compile_seconds_total",
            "pyramid_artifact_store_loads_total", "pyramid_artifact_store_load_seconds_total", "pyramid_stalls_total",
            "pyramid_stall_seconds_total", "pyramid_reprefills_total", "pyramid_session_forks_total",
            "pyramid_session_fork_bytes_total"]
HISTOGRAMS = ["pyramid_ttft_seconds", "pyramid_inter_token_seconds", "pyramid_batch_size"]
GAUGES = ["pyramid_queue_depth", "pyramid_running_sequences", "pyramid_cached_sessions", "pyramid_kv_bytes",
          "pyramid_kv_used_bytes", "pyramid_artifacts_compiling", "pyramid_artifacts_resident", "pyramid_route_info"]
# The device the server was started on (`--device`), whose audit /metrics and /v1/models report.
DEVICE = os.environ.get("PYRAMID_EXPECT_DEVICE") or "cpu"


def check_route_audit(m: common.Metrics):
    """After requests ran, both stages report the device asked for and the one that ran."""
    stages = {labels.get("stage"): labels for labels, _ in m.samples.get("pyramid_route_info", [])}
    expect_eq(sorted(stages), ["decode", "prefill"], "pyramid_route_info stages")
    route = common.get("/v1/models").json()["data"][0].get("route") or {}
    for stage, labels in stages.items():
        expect_eq(labels.get("requested"), DEVICE, f"pyramid_route_info requested device ({stage})")
        expect(labels.get("executed"), f"pyramid_route_info names no executing device for {stage}")
        expect_eq(labels.get("as_requested"), "true", f"pyramid_route_info as_requested ({stage})")
        audit = route.get(stage) or {}
        expect_eq((audit.get("requested"), audit.get("executed"), audit.get("as_requested")),
                  (DEVICE, labels.get("executed"), True), f"/v1/models route audit ({stage})")
    compiles = m.sum("pyramid_artifact_compiles_total")
    loads = m.sum("pyramid_artifact_store_loads_total")
    expect(compiles + loads >= 1, f"{compiles} artifacts compiled and {loads} loaded from the store: something ran, "
                                  "so some artifact was made")
    builds = m.samples.get("pyramid_artifact_build_seconds", [])
    expect(0 < len(builds) <= compiles + loads,
           f"{len(builds)} pyramid_artifact_build_seconds series (one per shape built) for {compiles + loads} builds")
    for labels, seconds in builds:
        expect(labels.get("how") in ("compile", "store") and seconds >= 0, f"artifact build {labels} took {seconds} s")
    ok(f"route audit: {DEVICE} asked, {stages['prefill'].get('executed')} ran both stages; {compiles:.0f} compiles, "
       f"{loads:.0f} loads from the store")


def check_metrics(before: common.Metrics):
    resp = common.get("/metrics")
    expect_eq(resp.status, 200, "/metrics status")
    ctype = resp.content_type.replace(" ", "")
    expect(ctype.startswith("text/plain") and "version=0.0.4" in ctype,
           f"/metrics content-type should be text/plain; version=0.0.4, got {resp.content_type!r}")
    m = common.Metrics(resp.text)
    for name in COUNTERS + GAUGES:
        expect(m.has(name), f"/metrics lacks {name}")
    for name in COUNTERS:
        expect_eq(m.type_of(name), "counter", f"# TYPE of {name}")
    for name in GAUGES:
        expect_eq(m.type_of(name), "gauge", f"# TYPE of {name}")
    for name in HISTOGRAMS:
        expect_eq(m.type_of(name), "histogram", f"# TYPE of {name}")
        buckets = m.samples.get(name + "_bucket", [])
        expect(buckets and m.has(name + "_sum") and m.has(name + "_count"), f"{name} lacks _bucket/_sum/_count")
        expect(all("le" in labels for labels, _ in buckets), f"{name}_bucket samples need an le label")
        values = [v for _, v in sorted(buckets, key=lambda lv: float(lv[0]["le"].replace("+Inf", "inf")))]
        expect(values == sorted(values), f"{name} buckets are not cumulative: {values}")
        inf = [v for labels, v in buckets if labels["le"] == "+Inf"]
        expect(inf == [m.sum(name + "_count")], f"{name}: +Inf bucket {inf} != _count {m.sum(name + '_count')}")
    expect(all("status" in labels for labels, _ in m.samples["pyramid_requests_total"]),
           "pyramid_requests_total samples need a status label")
    ok("/metrics: text/plain 0.0.4, every metric present with the right type, histograms well-formed")
    check_route_audit(m)

    for name in ["pyramid_requests_total", "pyramid_prompt_tokens_total", "pyramid_generated_tokens_total",
                 "pyramid_prefilled_tokens_total", "pyramid_cached_prompt_tokens_total", "pyramid_ttft_seconds_count",
                 "pyramid_batch_size_count"]:
        expect(m.sum(name) > before.sum(name), f"{name} did not increase over the script ({before.sum(name)} -> "
                                               f"{m.sum(name)})")
    expect_eq(m.sum("pyramid_running_sequences"), 0, "pyramid_running_sequences when idle")
    expect_eq(m.sum("pyramid_queue_depth"), 0, "pyramid_queue_depth when idle")
    expect(m.sum("pyramid_cached_sessions") >= 1, "pyramid_cached_sessions should be >= 1 after cache reuse")
    expect(m.sum("pyramid_kv_bytes") > 0, "pyramid_kv_bytes should be > 0 while sessions are cached")
    ok("counters increased over the script; idle gauges are 0; sessions are cached")

    # Exact accounting over two requests (nothing else is talking to this server).
    messages = user("Give me a two-word motto for a bakery.")
    start = common.metrics()
    a = chat(messages, max_tokens=8)
    _, _, _, b = chat_stream(messages, max_tokens=8, stream_options={"include_usage": True})
    prompt = a.usage.prompt_tokens + b.prompt_tokens
    end = common.settled_metrics(
        lambda m: m.sum("pyramid_prompt_tokens_total") - start.sum("pyramid_prompt_tokens_total") >= prompt
        and m.sum("pyramid_running_sequences") == 0)

    def delta(name):
        return end.sum(name) - start.sum(name)

    cached = common.cached_tokens(a.usage) + common.cached_tokens(b)
    generated = a.usage.completion_tokens + b.completion_tokens
    expect_eq(delta("pyramid_prompt_tokens_total"), prompt, "pyramid_prompt_tokens_total delta vs usage")
    expect_eq(delta("pyramid_cached_prompt_tokens_total"), cached, "pyramid_cached_prompt_tokens_total delta vs usage")
    expect_eq(delta("pyramid_prefilled_tokens_total"), prompt - cached, "pyramid_prefilled_tokens_total delta")
    expect_eq(delta("pyramid_generated_tokens_total"), generated, "pyramid_generated_tokens_total delta vs usage")
    expect(delta("pyramid_requests_total") >= 2, f"pyramid_requests_total grew by {delta('pyramid_requests_total')}")
    expect_eq(delta("pyramid_ttft_seconds_count"), 2, "pyramid_ttft_seconds_count delta for 2 requests")
    ok(f"metrics deltas match usage exactly: prompt {prompt}, cached {cached}, generated {generated}")


def check_constrained():
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]},
                                               "count": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["colour", "count"], "additionalProperties": False}
    r = api.chat.completions.create(model=MODEL, messages=user("Pick a colour and a count."), temperature=0,
                                    max_tokens=40, response_format={"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}})
    value = json.loads(r.choices[0].message.content)
    expect(value["colour"] in ("red", "green", "blue") and 1 <= value["count"] <= 9 and len(value) == 2,
           f"json_schema reply validates: {value}")
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"term": {"type": "string", "maxLength": 20}}, "required": ["term"]}}}
    r = api.chat.completions.create(model=MODEL, messages=user("Look up 'pyramid'."), tools=[tool],
                                    tool_choice="required", parallel_tool_calls=False, temperature=0, max_tokens=40)
    calls = r.choices[0].message.tool_calls
    expect_eq(r.choices[0].finish_reason, "tool_calls", "forced call finish_reason")
    expect(len(calls) == 1 and calls[0].function.name == "lookup"
           and isinstance(json.loads(calls[0].function.arguments)["term"], str), f"a valid call: {calls}")
    ok(f"constrained on this route: {value}, {calls[0].function.arguments}")


def main():
    before = common.metrics()
    check_basics()
    check_chat_nonstream_and_stream()
    check_utf8_stream()
    check_completions()
    check_max_completion_tokens()
    check_extensions()
    check_stop_strings()
    check_logprobs()
    check_seed()
    check_choices()
    check_session_cache()
    check_metrics(before)
    check_constrained()


if __name__ == "__main__":
    common.run(main)
