"""Error handling of `pyramid serve`, and a seeded fuzz run against every endpoint.

Proves that every documented error comes with the right status and an OpenAI-shaped
body `{"error": {"message", "type", "code", "param"}}`, mapped by the openai client to
the right exception: malformed JSON (400 invalid_request_error), unknown model (404
model_not_found), a prompt beyond the largest window (400 context_length_exceeded),
each out-of-range parameter (400 naming it in `param`), an oversized body (413), an
unknown path (404), a wrong method (405), and, when the server has an API key, a
missing or wrong key (401) while the right key works. Values on the edge of the
allowed ranges are accepted.

The fuzz section then throws ~230 seeded random or mangled requests (random bytes,
truncated JSON, wrong types, extreme numbers, odd unicode, deep nesting, odd methods,
paths and content types) at the endpoints: every one must get an HTTP answer below
500, 4xx answers must carry the error shape, and afterwards the server must still
answer a greedy chat exactly as before, be healthy, and have no sequence left running.
The seed is fixed so a failure reproduces; failing requests are printed (truncated).
"""

from __future__ import annotations

import copy
import http.client
import json
import random

import openai

import common
from common import expect, expect_eq, ok

cfg = common.config()
api = common.client()
MODEL = cfg.model
HELLO = [{"role": "user", "content": "Say hello."}]

FUZZ_SEED = 0x5EED_F022


def is_messages_param(param):
    """A bad message may be reported as `messages` or a path into it (`messages[0].role`)."""
    return isinstance(param, str) and param.startswith("messages")


def chat_call(**kw):
    """A chat call to run later; `max_tokens=None` leaves max_tokens out altogether."""
    kw.setdefault("model", MODEL)
    kw.setdefault("messages", HELLO)
    kw.setdefault("max_tokens", 2)
    if kw["max_tokens"] is None:
        del kw["max_tokens"]
    return lambda: api.chat.completions.create(**kw)


def completion_call(**kw):
    kw.setdefault("model", MODEL)
    kw.setdefault("prompt", "Hello")
    kw.setdefault("max_tokens", 2)
    return lambda: api.completions.create(**kw)


def check_malformed_json():
    for path in ("/v1/chat/completions", "/v1/completions"):
        for body in (b'{"model": "' + MODEL.encode() + b'", "messages": [', b"not json at all", b""):
            resp = common.post(path, body)
            common.check_error_response(resp, 400, f"POST {path} with {body[:20]!r}", type_="invalid_request_error")
        resp = common.post(path, [1, 2, 3])
        common.check_error_response(resp, 400, f"POST {path} with a JSON array", type_="invalid_request_error")
    ok("malformed or non-object JSON -> 400 invalid_request_error")


def check_unknown_model():
    for name, call in (("chat", chat_call(model="no-such-model")), ("completions", completion_call(model="no-such-model"))):
        common.expect_api_error(call, openai.NotFoundError, 404, f"{name} with an unknown model", code="model_not_found")
    ok("unknown model -> 404 model_not_found (chat and completions)")


def check_context_length():
    # ~100k tokens: beyond the largest window of any test model (SmolLM2 8k, Qwen2.5 32k).
    huge = " ".join(common.SENTENCES) * 170
    common.expect_api_error(chat_call(messages=[{"role": "user", "content": huge}]), openai.BadRequestError, 400,
                            "chat with a ~100k-token prompt", code="context_length_exceeded",
                            param="messages")
    common.expect_api_error(completion_call(prompt=huge), openai.BadRequestError, 400,
                            "completions with a ~100k-token prompt", code="context_length_exceeded",
                            param="prompt")
    err = common.expect_api_error(completion_call(prompt=huge), openai.BadRequestError, 400, "again",
                                  code="context_length_exceeded")
    # OpenAI's wording, which clients such as litellm recognise.
    expect("maximum context length is" in err.message, f"OpenAI's wording: {err.message!r}")
    ok("prompt beyond the largest window -> 400 context_length_exceeded in OpenAI's wording")


BAD_CHAT_PARAMS = [
    ("temperature=-0.5", dict(temperature=-0.5), "temperature"),
    ("temperature=2.5", dict(temperature=2.5), "temperature"),
    ("top_p=0", dict(top_p=0), "top_p"),
    ("top_p=1.5", dict(top_p=1.5), "top_p"),
    ("top_p=-1", dict(top_p=-1), "top_p"),
    ("max_tokens=0", dict(max_tokens=0), "max_tokens"),
    ("max_tokens=-5", dict(max_tokens=-5), "max_tokens"),
    ("max_completion_tokens=0", dict(max_tokens=None, extra_body={"max_completion_tokens": 0}), "max_completion_tokens"),
    ("n=17", dict(n=17), "n"),
    ("n=0", dict(n=0), "n"),
    ("top_logprobs=21", dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    ("top_logprobs=-1", dict(logprobs=True, top_logprobs=-1), "top_logprobs"),
    ("5 stop strings", dict(stop=["a", "b", "c", "d", "e"]), "stop"),
    ("empty messages", dict(messages=[]), "messages"),
    ("message without content", dict(messages=[{"role": "user"}]), is_messages_param),
    ("message without role", dict(messages=[{"content": "hi"}]), is_messages_param),
    ("unknown role", dict(messages=[{"role": "wizard", "content": "hi"}]), is_messages_param),
]

# Fields pyramid does not implement are refused, never ignored (issue 18); the tool and
# format fields it does implement refuse what they cannot do, by name.
BAD_CHAT_PARAMS += [
    ("a tool that is not a function", dict(tools=[{"type": "retrieval"}]), "tools[0].type"),
    ("tool_choice without tools", dict(tool_choice="required"), "tool_choice"),
    ("an unknown response_format", dict(response_format={"type": "xml"}), "response_format.type"),
    ("functions", dict(extra_body={"functions": [{"name": "f"}]}), "functions"),
    ("function_call", dict(extra_body={"function_call": "auto"}), "function_call"),
    ("an unknown field", dict(extra_body={"frobnicate": 1}), "frobnicate"),
    ("stream_options without stream", dict(stream_options={"include_usage": True}), "stream_options"),
    ("logit_bias beyond 100", dict(logit_bias={"42": 101}), "logit_bias.42"),
    ("logit_bias of a token id not in the vocabulary", dict(logit_bias={"99999999": 1}), "logit_bias"),
]

BAD_COMPLETION_PARAMS = [
    ("temperature=3", dict(temperature=3), "temperature"),
    ("top_p=0", dict(top_p=0), "top_p"),
    ("max_tokens=0", dict(max_tokens=0), "max_tokens"),
    ("n=17", dict(n=17), "n"),
    ("echo", dict(echo=True), "echo"),
    ("suffix", dict(suffix="x"), "suffix"),
    ("logprobs", dict(logprobs=2), "logprobs"),
    ("a token id not in the vocabulary", dict(prompt=[1, 99999999]), "prompt"),
]


def check_bad_params():
    for label, kw, param in BAD_CHAT_PARAMS:
        common.expect_api_error(chat_call(**kw), openai.BadRequestError, 400, f"chat {label}", param=param,
                                type_="invalid_request_error")
    ok(f"chat: {len(BAD_CHAT_PARAMS)} bad parameter values -> 400 naming the parameter")
    for label, kw, param in BAD_COMPLETION_PARAMS:
        common.expect_api_error(completion_call(**kw), openai.BadRequestError, 400, f"completions {label}",
                                param=param, type_="invalid_request_error")
    ok(f"completions: {len(BAD_COMPLETION_PARAMS)} bad parameter values -> 400 naming the parameter")
    # Validation happens before a stream starts: a plain 400, not a 200 with an error event.
    common.expect_api_error(chat_call(temperature=-1, stream=True), openai.BadRequestError, 400,
                            "streaming chat temperature=-1", param="temperature")
    common.expect_api_error(completion_call(max_tokens=0, stream=True), openai.BadRequestError, 400,
                            "streaming completions max_tokens=0", param="max_tokens")
    ok("bad parameters on streaming requests -> 400 before any event")


def check_edge_values_accepted():
    for kw in (dict(temperature=0), dict(temperature=2, seed=1), dict(top_p=1), dict(top_p=0.01, temperature=1, seed=1),
               dict(max_tokens=1), dict(n=1), dict(logprobs=True, top_logprobs=20), dict(logprobs=True, top_logprobs=0),
               dict(stop=["a1", "b2", "c3", "d4"]), dict(stop="x")):
        resp = chat_call(**kw)()
        expect(resp.choices and resp.usage.completion_tokens <= 2, f"chat with {kw} should succeed: {resp}")
    ok("edge values (temperature 0 and 2, top_p 1, max_tokens 1, n 1, top_logprobs 20, 4 stops) accepted")
    # The Hugging Face reference for "The capital of France is": its ids, and " Paris" first.
    text, ids, paris = "The capital of France is", [504, 3575, 282, 4649, 314], 7042
    as_text = completion_call(prompt=text, temperature=0, max_tokens=6)()
    as_ids = completion_call(prompt=ids, temperature=0, max_tokens=6)()
    expect(as_text.choices[0].text.startswith(" Paris"), f"reference reply: {as_text.choices[0].text!r}")
    expect_eq(as_ids.choices[0].text, as_text.choices[0].text, "completion from token ids vs from text")
    ok("a completion prompt given as token ids")
    banned = completion_call(prompt=ids, temperature=0, max_tokens=1, logit_bias={str(paris): -100})()
    expect(not banned.choices[0].text.startswith(" Paris"), f"logit_bias -100 on ' Paris': {banned.choices[0].text!r}")
    forced = completion_call(prompt=ids, temperature=0, max_tokens=1, logit_bias={"33": 100})()
    expect_eq(forced.choices[0].text, "1", "logit_bias +100 on token 33 ('1')")
    ok("logit_bias bans and forces tokens")
    model = api.models.retrieve(MODEL)
    expect_eq((model.id, model.object), (MODEL, "model"), "models.retrieve")
    common.expect_api_error(lambda: api.models.retrieve("no-such-model"), openai.NotFoundError, 404,
                            "models.retrieve of an unknown model")
    ok("GET /v1/models/{id}: the model, or 404")


def check_http_level():
    # A valid chat request whose message is 20 MiB of "a".
    head = ('{"model": ' + json.dumps(MODEL) + ', "max_tokens": 2, "messages": [{"role": "user", "content": "').encode()
    body = head + b"a" * (20 * 1024 * 1024) + b'"}]}'
    resp = common.post_oversized("/v1/chat/completions", body)
    common.check_error_response(resp, 413, f"POST of {len(body) >> 20} MiB")
    ok(f"{len(body) >> 20} MiB body -> 413")

    for method, path in (("GET", "/v1/chat/completions"), ("GET", "/v1/completions"), ("POST", "/health"),
                         ("DELETE", "/v1/models"), ("PUT", "/metrics")):
        resp = common.request(method, path, b"{}" if method != "GET" else None)
        common.check_error_response(resp, 405, f"{method} {path}")
    ok("wrong method -> 405 with an error body")

    for method, path in (("GET", "/v1/nope"), ("POST", "/v1/audio/speech"), ("GET", "/v2/models")):
        resp = common.request(method, path, b"{}" if method == "POST" else None)
        common.check_error_response(resp, 404, f"{method} {path}")
    ok("unknown path -> 404 with an error body")


def check_auth():
    if not cfg.api_key:
        resp = common.get("/v1/models", auth=False)
        expect_eq(resp.status, 200, "GET /v1/models without a key on a server without --api-key")
        ok("no --api-key: requests without Authorization are served")
        return
    chat_body = {"model": MODEL, "messages": HELLO, "max_tokens": 2}
    requests = [("GET", "/v1/models", None), ("POST", "/v1/chat/completions", chat_body),
                ("POST", "/v1/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2}),
                ("GET", "/metrics", None)]
    # /health is for supervisors and load balancers: reachable without the key.
    expect_eq(common.get("/health", auth=False).status, 200, "GET /health without a key")
    for method, path, body in requests:
        resp = common.request(method, path, body, auth=False)
        common.check_error_response(resp, 401, f"{method} {path} without Authorization")
        for bad in (f"Bearer {cfg.api_key}x", f"Basic {cfg.api_key}", cfg.api_key, "Bearer "):
            resp = common.request(method, path, body, auth=False, headers={"Authorization": bad})
            common.check_error_response(resp, 401, f"{method} {path} with Authorization: {bad!r}")
    ok("missing or wrong key -> 401 on every endpoint")
    wrong = common.client(api_key=cfg.api_key + "-wrong")
    common.expect_api_error(lambda: wrong.models.list(), openai.AuthenticationError, 401, "openai client, wrong key")
    common.expect_api_error(lambda: wrong.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2),
                            openai.AuthenticationError, 401, "openai client chat, wrong key")
    expect_eq([m.id for m in api.models.list().data], [MODEL], "models with the right key")
    for scheme in ("bearer", "BEARER"):
        resp = common.request("GET", "/v1/models", None, auth=False,
                              headers={"Authorization": f"{scheme} {cfg.api_key}"})
        expect_eq(resp.status, 200, f"Authorization scheme {scheme!r}")
    for method, path, body in requests:
        expect_eq(common.request(method, path, body).status, 200, f"{method} {path} with the right key")
    ok("openai client with a wrong key -> AuthenticationError; the right key works everywhere")


# ---------------------------------------------------------------------------
# fuzz

CHAT_TEMPLATE = {"model": MODEL, "messages": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Name a colour."}],
                 "max_tokens": 4, "temperature": 0}
COMPLETION_TEMPLATE = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}
CHAT_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
               "n", "stream", "stream_options", "logprobs", "top_logprobs", "presence_penalty", "frequency_penalty",
               "user", "response_format", "tools", "unknown_field"]
COMPLETION_FIELDS = ["model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream",
                     "stream_options", "logprobs", "echo", "suffix", "best_of", "unknown_field"]
EMBEDDING_TEMPLATE = {"model": MODEL, "input": ["Once upon a time", "there was"], "encoding_format": "float"}
EMBEDDING_FIELDS = ["model", "input", "encoding_format", "dimensions", "user", "priority", "unknown_field"]


def garbage(rng: random.Random, depth: int = 0):
    """A random JSON value of an arbitrary (usually wrong) type or extreme value."""
    choices = [
        None, True, False, 0, -1, 1, 2, 7.5, -0.0, 1e-300, 1e308, -1e308, 10**30, -(10**30), 2**63, 2**64, 2**31,
        "", " ", "x", "4", "0.5", "null", "\u0000", "\ud800", "\udfff\ud800", "é" * 40, "🦀🦀🦀", "\u202eevil",
        "a\u0301\u0301\u0301", "\t\n\r", "<|im_start|>system\n", "<|endoftext|>", "%s%n%x", "A" * 2000,
        [], {}, [None], ["a", 1, None], {"role": "user"}, {"content": ["x"]}, [[[[[[]]]]]],
    ]
    if depth < 2 and rng.random() < 0.2:
        return [garbage(rng, depth + 1) for _ in range(rng.randrange(1, 4))]
    if depth < 2 and rng.random() < 0.15:
        return {rng.choice(["role", "content", "x", "name"]): garbage(rng, depth + 1) for _ in range(rng.randrange(1, 3))}
    return rng.choice(choices)


FIELD_EXTRAS = {
    # Type-correct but extreme values, to reach deeper than the type checks.
    "max_tokens": [10**9, 2**32, 2**63 - 1, 1, 100000, -(2**63)],
    "max_completion_tokens": [10**9, 1, 0],
    "seed": [2**64 - 1, 2**64, -1, 0],
    "top_logprobs": [20, 21, 10**6],
    "stop": [["", ""], [""], "\n", ["a"] * 4, ["a"] * 100, "x" * 10000],
    "prompt": [[1, 2, 3], [999999999], [-1], [[1, 2]], ["a", "b"], [], ""],
    "messages": [[{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                 [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
                 [{"role": "assistant", "content": "hi"}], [{"role": "tool", "content": "x"}],
                 [{"role": "user", "content": None}], [{"role": "user", "content": "hi", "name": 5}],
                 [{"role": "user", "content": "é" * 500}]],
    "stream_options": [{"include_usage": "yes"}, {"include_usage": None}, []],
}


def limit_generation(body, mutated):
    """A mutated request might still be valid with a huge (or default) max_tokens; make
    it streaming so the fuzz reads only its start and hangs up instead of waiting."""
    if not isinstance(body, dict) or mutated == "stream":
        return
    small = all(isinstance(body.get(k), int) and not isinstance(body.get(k), bool) and 1 <= body[k] <= 16
                for k in ("max_tokens", "max_completion_tokens") if k in body)
    if not small or not any(k in body for k in ("max_tokens", "max_completion_tokens")):
        body["stream"] = True


class Case:
    def __init__(self, label, method, path, body: bytes | None, content_type="application/json"):
        self.label, self.method, self.path, self.body, self.content_type = label, method, path, body, content_type


def fuzz_cases(rng: random.Random) -> list[Case]:
    cases: list[Case] = []
    endpoints = [("/v1/chat/completions", CHAT_TEMPLATE, CHAT_FIELDS),
                 ("/v1/completions", COMPLETION_TEMPLATE, COMPLETION_FIELDS),
                 ("/v1/embeddings", EMBEDDING_TEMPLATE, EMBEDDING_FIELDS)]

    # Random bytes, some dressed up to look like the start of JSON.
    for i in range(30):
        path = endpoints[i % len(endpoints)][0]
        raw = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400)))
        if i % 3 == 0:
            raw = b'{"model": "' + raw
        cases.append(Case(f"random bytes #{i}", "POST", path, raw))

    # Valid requests truncated at ~20 points each.
    for path, template, _ in endpoints:
        full = json.dumps(template).encode()
        step = max(1, len(full) // 20)
        for cut in range(0, len(full), step):
            cases.append(Case(f"truncated at {cut}/{len(full)}", "POST", path, full[:cut]))

    # One top-level field set to garbage, deleted, or to an extreme value of the right type.
    for i in range(90):
        path, template, fields = endpoints[rng.randrange(len(endpoints))]
        body = copy.deepcopy(template)
        if rng.random() < 0.5:
            body["stream"] = rng.random() < 0.5
        key = rng.choice(fields)
        roll = rng.random()
        if roll < 0.1 and key in body:
            del body[key]
            what = f"without {key}"
        elif roll < 0.4 and key in FIELD_EXTRAS:
            body[key] = rng.choice(FIELD_EXTRAS[key])
            what = f"{key}={body[key]!r}"
        else:
            body[key] = garbage(rng)
            what = f"{key}={body[key]!r}"
        limit_generation(body, key)
        cases.append(Case(f"field {what}"[:120], "POST", path, json.dumps(body).encode()))

    # Garbage inside the messages.
    for i in range(20):
        body = copy.deepcopy(CHAT_TEMPLATE)
        msg = body["messages"][rng.randrange(2)]
        key = rng.choice(["role", "content", "name", "tool_calls", "extra"])
        msg[key] = garbage(rng)
        if rng.random() < 0.3:
            body["messages"].append(garbage(rng))
        limit_generation(body, key)
        cases.append(Case(f"message {key}={msg[key]!r}"[:120], "POST", "/v1/chat/completions", json.dumps(body).encode()))

    # Whole bodies that are valid JSON of the wrong shape, or nearly-JSON.
    special = [
        b"null", b"0", b"-1", b"1e999", b'"string"', b"[]", b"{}", b"[" * 10000 + b"]" * 10000,
        b'{"a":' * 300 + b"1" + b"}" * 300, json.dumps({"messages": [[[[[]]]]] * 50}).encode(),
        b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "max_tokens": NaN}',
        b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "max_tokens": Infinity}',
        b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}",
        b'{"model": "' + MODEL.encode() + b'", "model": "other", "prompt": "x", "max_tokens": 2}',
        b'{"model": "' + MODEL.encode() + b'", "prompt": "x", "max_tokens": 2,}',
        b'{"model": "' + MODEL.encode() + b'", /* c */ "prompt": "x"}',
        b"\xef\xbb\xbf" + json.dumps(COMPLETION_TEMPLATE).encode(),
        json.dumps(COMPLETION_TEMPLATE).encode("utf-16"),
        b'{"model": "' + MODEL.encode() + b'", "prompt": "\xff\xfe\xc3", "max_tokens": 2}',
        b'{"model": "' + MODEL.encode() + b'", "prompt": "\\ud800", "max_tokens": 2}',
        b'{"model": "' + MODEL.encode() + b'\x00", "prompt": "x", "max_tokens": 2}',
        json.dumps({**COMPLETION_TEMPLATE, "prompt": "\u0000" * 100}).encode(),
    ]
    for i, raw in enumerate(special):
        cases.append(Case(f"special body #{i}: {raw[:40]!r}", "POST", endpoints[i % len(endpoints)][0], raw))

    # A valid body under odd content types.
    for ctype in (None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                  "application/json; charset=utf-8"):
        cases.append(Case(f"content-type {ctype!r}", "POST", "/v1/completions", json.dumps(COMPLETION_TEMPLATE).encode(),
                          content_type=ctype))

    # Odd methods and paths on every endpoint.
    for method, path in (("POST", "/v1/models"), ("PUT", "/v1/models"), ("GET", "/v1/models?limit=-1"),
                         ("GET", f"/v1/models/{MODEL}"), ("GET", "/v1/models/%00"), ("POST", "/health"),
                         ("PATCH", "/health"), ("GET", "/health?x=%ff"), ("HEAD", "/health"), ("DELETE", "/metrics"),
                         ("GET", "/metrics?name[]=x"), ("OPTIONS", "/v1/chat/completions"),
                         ("GET", "/v1/chat/completions"), ("GET", "/%2e%2e/%2e%2e/etc/passwd"), ("GET", "//v1//models"),
                         ("POST", "/v1/chat/completions/extra"), ("POST", "/v1/completions?stream=true")):
        body = None if method in ("GET", "HEAD") else bytes(rng.randrange(32, 127) for _ in range(rng.randrange(0, 60)))
        if path.startswith("/v1/completions?"):
            body = json.dumps(COMPLETION_TEMPLATE).encode()
        cases.append(Case(f"{method} {path}", method, path, body))
    return cases


def send_case(case: Case) -> tuple[int | None, bytes, str]:
    """Send one fuzz case; returns (status, body start, content type). A streaming 200 is
    read for a couple of lines, then the connection is dropped."""
    host, port = common._host_port(cfg.base_url)
    headers = dict(common.auth_headers())
    if case.body is not None and case.content_type is not None:
        headers["Content-Type"] = case.content_type
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request(case.method, case.path, body=case.body, headers=headers)
        resp = conn.getresponse()
        ctype = resp.getheader("content-type", "")
        if resp.status == 200 and ctype.startswith("text/event-stream"):
            head = b"".join(resp.readline() for _ in range(4))
            return resp.status, head, ctype
        return resp.status, resp.read(), ctype
    finally:
        conn.close()


def check_fuzz():
    rng = random.Random(FUZZ_SEED)
    cases = fuzz_cases(rng)
    failures: list[str] = []
    statuses: dict[int, int] = {}
    for i, case in enumerate(cases):
        where = f"#{i} {case.method} {case.path} [{case.label}] body={common.short(case.body, 160)}"
        try:
            status, body, ctype = send_case(case)
        except (OSError, http.client.HTTPException) as e:
            failures.append(f"{where}: no HTTP answer ({type(e).__name__}: {e})")
            if len(failures) >= 5 and all("no HTTP answer" in f for f in failures[-5:]):
                break  # the server is gone; the rest would only repeat this
            continue
        statuses[status] = statuses.get(status, 0) + 1
        if status >= 500:
            failures.append(f"{where}: HTTP {status}: {common.short(body)}")
        elif status >= 400 and case.method != "HEAD":
            try:
                common.check_error_shape(json.loads(body), f"HTTP {status}")
            except (ValueError, AssertionError) as e:
                failures.append(f"{where}: HTTP {status} without a JSON error body ({e}); body {common.short(body)}")
    summary = ", ".join(f"{s}: {n}" for s, n in sorted(statuses.items()))
    if failures:
        for f in failures[:25]:
            print("FUZZ FAILURE", f, flush=True)
        raise AssertionError(f"{len(failures)} of {len(cases)} fuzz requests failed (seed {FUZZ_SEED:#x}; "
                             f"first: {failures[0]}); statuses {summary}")
    ok(f"fuzz: {len(cases)} requests (seed {FUZZ_SEED:#x}), none 5xx or dropped; statuses {summary}")


def greedy_reference():
    resp = api.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "List two planets."}],
                                       max_tokens=12, temperature=0)
    return resp.choices[0].message.content


def main():
    reference = greedy_reference()
    check_malformed_json()
    check_unknown_model()
    check_context_length()
    check_bad_params()
    check_edge_values_accepted()
    check_http_level()
    check_auth()
    check_fuzz()

    # The server survived: still healthy, nothing left running, same greedy answer.
    resp = common.get("/health")
    expect_eq((resp.status, resp.json()), (200, {"status": "ok"}), "/health after the fuzz")
    idle = common.wait_until(lambda: common.metrics().sum("pyramid_running_sequences") == 0, timeout=15)
    expect(idle, "pyramid_running_sequences did not return to 0 within 15 s after the fuzz "
                 f"(now {common.metrics().sum('pyramid_running_sequences')})")
    expect_eq(greedy_reference(), reference, "greedy chat after the error checks and fuzz vs before")
    ok("after the fuzz: healthy, no running sequences, same greedy answer")


if __name__ == "__main__":
    common.run(main)
