"""Shared helpers for the scripts that drive `pyramid serve` over HTTP.

The Rust integration test starts a server and runs each script with:

    PYRAMID_BASE_URL        e.g. http://127.0.0.1:43123 (no trailing slash, no /v1)
    PYRAMID_MODEL_ID        the model id the server reports
    PYRAMID_API_KEY         only when the server was started with --api-key
    PYRAMID_FRESH_BASE_URL  (test_agent.py only) a second, freshly started server

What is here:
- configuration from those variables, and `client()` for the official openai client;
- `request()`: one raw HTTP request (http.client, so that 4xx answers, odd methods,
  missing content types and arbitrary bytes are all possible), `post_oversized()`
  for a body the server should refuse before reading it all, and `stream_sse()`, a
  strict server-sent-events reader that tells whether `data: [DONE]` arrived;
- `Metrics`: a small parser for the Prometheus text format of GET /metrics;
- assertion helpers that say what was expected and what came;
- `SENTENCES`, a pool of varied text for building prompts of chosen lengths;
- `run()`, the entry point every script uses: exit 0 on success, 1 with the failed
  check's message otherwise.

common.py uses only the standard library and `openai`; test_tools.py adds `jsonschema`
and test_langchain.py `langchain-openai` (scripts/test.sh installs all three).
"""

from __future__ import annotations

import http.client
import io
import json
import math
import os
import random
import re
import select
import socket
import sys
import time
import traceback
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable

# ---------------------------------------------------------------------------
# configuration


class Config:
    """The environment the Rust test hands to a script."""

    def __init__(self) -> None:
        self.base_url = _required_env("PYRAMID_BASE_URL").rstrip("/")
        self.model = _required_env("PYRAMID_MODEL_ID")
        self.api_key = os.environ.get("PYRAMID_API_KEY") or None
        self.fresh_base_url = (os.environ.get("PYRAMID_FRESH_BASE_URL") or "").rstrip("/") or None
        # On a route with compiled artifacts: "none" when every crossing must find its
        # window compiled ahead (predictive), "some" when crossings must wait (on demand).
        self.expect_stalls = os.environ.get("PYRAMID_EXPECT_STALLS") or None


def _required_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"{name} is not set: this script is run by the Rust test that starts `pyramid serve`")
    return value


_CONFIG: Config | None = None


def config() -> Config:
    global _CONFIG
    if _CONFIG is None:
        _CONFIG = Config()
    return _CONFIG


def client(base_url: str | None = None, *, api_key: str | None = None, timeout: float = 120.0):
    """An `openai.OpenAI` client for the server, with retries off (a retried request
    would hide the status being tested and double the server's work)."""
    import openai

    cfg = config()
    key = api_key if api_key is not None else (cfg.api_key or "no-key-needed")
    return openai.OpenAI(
        base_url=(base_url or cfg.base_url) + "/v1",
        api_key=key,
        max_retries=0,
        timeout=timeout,
    )


def auth_headers() -> dict[str, str]:
    key = config().api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


def _host_port(base_url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"expected an http:// base URL, got {base_url!r}")
    return parts.hostname, parts.port or 80


# ---------------------------------------------------------------------------
# raw HTTP


@dataclass
class Response:
    status: int
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        try:
            return json.loads(self.body)
        except ValueError as e:
            raise AssertionError(f"expected a JSON body (status {self.status}), got {short(self.body)}: {e}") from None

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "")


def _encode_body(body: Any) -> bytes | None:
    if body is None or isinstance(body, bytes):
        return body
    if isinstance(body, str):
        return body.encode("utf-8")
    return json.dumps(body).encode("utf-8")


def request(
    method: str,
    path: str,
    body: Any = None,
    *,
    base_url: str | None = None,
    headers: dict[str, str] | None = None,
    auth: bool = True,
    content_type: str | None = "application/json",
    timeout: float = 120.0,
) -> Response:
    """Send one request on a new connection and read the whole answer.

    `body` may be bytes, str, or anything JSON-serialisable (then it is encoded here).
    `auth=False` leaves out the API key; `content_type=None` sends no Content-Type.
    Connection failures (refused, reset, timeout) propagate as exceptions: the callers
    treat them as the server failing to answer."""
    host, port = _host_port(base_url or config().base_url)
    data = _encode_body(body)
    hdrs: dict[str, str] = {}
    if auth:
        hdrs.update(auth_headers())
    if data is not None and content_type is not None:
        hdrs["Content-Type"] = content_type
    if headers:
        hdrs.update(headers)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, payload)
    finally:
        conn.close()


def get(path: str, **kw: Any) -> Response:
    return request("GET", path, **kw)


def post(path: str, body: Any, **kw: Any) -> Response:
    return request("POST", path, body, **kw)


class _BytesSocket:
    """Just enough of a socket for http.client.HTTPResponse to parse captured bytes."""

    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, *_args: Any, **_kw: Any) -> io.BytesIO:
        return io.BytesIO(self._data)


def post_oversized(path: str, payload: bytes, *, base_url: str | None = None, timeout: float = 60.0) -> Response:
    """POST a body the server is expected to refuse (413) without reading it whole.

    A server may answer as soon as it sees Content-Length (or after reading up to its
    limit) and close the connection; a plain client that insists on writing all of the
    body first then dies on EPIPE/ECONNRESET and never sees the answer. So the body is
    written in slices, and as soon as the socket is readable (the answer has started)
    writing stops and the answer is read."""
    host, port = _host_port(base_url or config().base_url)
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Content-Type: application/json",
            f"Content-Length: {len(payload)}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in auth_headers().items()]
    sock = socket.create_connection((host, port), timeout=timeout)
    received = bytearray()
    try:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        view = memoryview(payload)
        sent = 0
        deadline = time.monotonic() + timeout
        while sent < len(payload):
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                break  # the server answered before taking the whole body
            if writable:
                try:
                    sent += sock.send(view[sent : sent + 256 * 1024])
                except (BrokenPipeError, ConnectionResetError):
                    break  # closed by the server; its answer may be waiting to be read
            if time.monotonic() > deadline:
                raise TimeoutError(f"server neither read the {len(payload)}-byte body nor answered in {timeout}s")
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            received += chunk
    finally:
        sock.close()
    if not received:
        raise AssertionError(
            f"the server closed the connection without an HTTP answer after {sent} of {len(payload)} body bytes"
        )
    resp = http.client.HTTPResponse(_BytesSocket(bytes(received)))  # type: ignore[arg-type]
    resp.begin()
    try:
        body = resp.read()
    except http.client.IncompleteRead as e:
        body = e.partial
    return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, body)


@dataclass
class SSEResult:
    status: int
    headers: dict[str, str]
    events: list[dict] = field(default_factory=list)  # parsed `data:` payloads, in order
    times: list[float] = field(default_factory=list)  # time.perf_counter() at each event
    done: bool = False  # saw `data: [DONE]`
    after_done: list[str] = field(default_factory=list)  # anything the server sent after [DONE]
    problems: list[str] = field(default_factory=list)  # framing errors (bad JSON, unknown lines)
    error_body: bytes = b""  # the body when status != 200
    started: float = 0.0  # time.perf_counter() when the request was sent

    def text(self) -> str:
        """Concatenated content: chat `delta.content` or completions `text`."""
        out = []
        for ev in self.events:
            for choice in ev.get("choices") or []:
                delta = choice.get("delta")
                if isinstance(delta, dict):
                    out.append(delta.get("content") or "")
                else:
                    out.append(choice.get("text") or "")
        return "".join(out)

    def finish_reason(self) -> str | None:
        reasons = [c.get("finish_reason") for ev in self.events for c in ev.get("choices") or []]
        reasons = [r for r in reasons if r]
        return reasons[-1] if reasons else None

    def usage(self) -> dict | None:
        with_usage = [ev["usage"] for ev in self.events if ev.get("usage")]
        return with_usage[-1] if with_usage else None

    def content_times(self) -> list[float]:
        """Arrival times of the events that carried some content."""
        out = []
        for ev, t in zip(self.events, self.times):
            for choice in ev.get("choices") or []:
                delta = choice.get("delta")
                piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
                if piece:
                    out.append(t)
                    break
        return out


def stream_sse(
    path: str,
    body: Any,
    *,
    base_url: str | None = None,
    timeout: float = 180.0,
    max_events: int | None = None,
) -> SSEResult:
    """POST a streaming request and read its server-sent events strictly.

    Each event must be `data: <json>` lines followed by a blank line; the stream must end
    with `data: [DONE]` and nothing after it. Comment lines (`:` keep-alives) are allowed.
    With `max_events`, the connection is closed after that many events (a client
    walking away mid-stream)."""
    host, port = _host_port(base_url or config().base_url)
    hdrs = {"Content-Type": "application/json", "Accept": "text/event-stream", **auth_headers()}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        started = time.perf_counter()
        conn.request("POST", path, body=_encode_body(body), headers=hdrs)
        resp = conn.getresponse()
        result = SSEResult(resp.status, {k.lower(): v for k, v in resp.getheaders()}, started=started)
        if resp.status != 200:
            result.error_body = resp.read()
            return result
        if not result.headers.get("content-type", "").startswith("text/event-stream"):
            result.problems.append(f"content-type is {result.headers.get('content-type')!r}, not text/event-stream")
        data_lines: list[str] = []
        while True:
            raw = resp.readline()
            if not raw:
                break  # connection closed
            line = raw.decode("utf-8").rstrip("\r\n")
            if result.done:
                if line.strip():
                    result.after_done.append(line)
                continue
            if line.startswith(":"):
                continue
            if line.startswith("data:"):
                value = line[5:]
                data_lines.append(value[1:] if value.startswith(" ") else value)
                continue
            if line == "":
                if not data_lines:
                    continue
                payload = "\n".join(data_lines)
                data_lines = []
                if payload == "[DONE]":
                    result.done = True
                    continue
                try:
                    event = json.loads(payload)
                except ValueError:
                    result.problems.append(f"event is not JSON: {short(payload)}")
                    continue
                if isinstance(event, dict) and "error" in event:
                    result.problems.append(f"error event mid-stream: {short(payload)}")
                result.events.append(event)
                result.times.append(time.perf_counter())
                if max_events is not None and len(result.events) >= max_events:
                    return result
                continue
            result.problems.append(f"unexpected SSE line: {short(line)}")
        if data_lines:
            result.problems.append("stream ended inside an event (no blank line after the last data:)")
        return result
    finally:
        conn.close()


# ---------------------------------------------------------------------------
# Prometheus text format


_SAMPLE_RE = re.compile(
    r"""^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)
        (?P<labels>\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?
        \s+(?P<value>\S+)
        (?:\s+-?\d+)?\s*$""",
    re.VERBOSE,
)
_LABEL_RE = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


class Metrics:
    """Parsed GET /metrics: samples by name (a histogram's are NAME_bucket, NAME_sum,
    NAME_count) and the types from `# TYPE` lines."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        self.types: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 4 and parts[1] == "TYPE":
                    self.types[parts[2]] = parts[3].strip()
                continue
            m = _SAMPLE_RE.match(line)
            if not m:
                raise AssertionError(f"/metrics line {number} is not a Prometheus sample: {line!r}")
            labels: dict[str, str] = {}
            inner = (m.group("labels") or "{}")[1:-1].strip()
            pos = 0
            while pos < len(inner):
                lm = _LABEL_RE.match(inner, pos)
                if not lm:
                    raise AssertionError(f"/metrics line {number}: bad labels {inner!r}")
                labels[lm.group(1)] = lm.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
                pos = lm.end()
            self.samples.setdefault(m.group("name"), []).append((labels, _parse_value(m.group("value"), number)))

    def has(self, name: str) -> bool:
        return name in self.samples

    def sum(self, name: str, **label_filter: str) -> float:
        """Sum of a sample name's values across labels (only those matching the filter).
        A missing name sums to 0: a counter may appear only once it has been bumped."""
        total = 0.0
        for labels, value in self.samples.get(name, []):
            if all(labels.get(k) == v for k, v in label_filter.items()):
                total += value
        return total

    def type_of(self, name: str) -> str | None:
        """The declared type; counters may be declared with or without `_total`."""
        if name in self.types:
            return self.types[name]
        if name.endswith("_total"):
            return self.types.get(name[: -len("_total")])
        return None


def _parse_value(token: str, number: int) -> float:
    lowered = token.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    if lowered == "nan":
        return math.nan
    try:
        return float(token)
    except ValueError:
        raise AssertionError(f"/metrics line {number}: value {token!r} is not a number") from None


def metrics(base_url: str | None = None) -> Metrics:
    resp = get("/metrics", base_url=base_url)
    expect(resp.status == 200, f"GET /metrics: expected 200, got {resp.status}: {short(resp.body)}")
    return Metrics(resp.text)


def settled_metrics(predicate: Callable[[Metrics], bool], timeout: float = 5.0, base_url: str | None = None) -> Metrics:
    """The first /metrics snapshot satisfying `predicate`, polling up to `timeout` s.

    A request's counters may be bumped just after its last byte reaches the client, so
    a snapshot taken at once can miss them; callers wait for the request to show up
    (e.g. the prompt-token counter to reach the usage total) and then compare exactly.
    On timeout the last snapshot is returned and the caller's checks say what is off."""
    deadline = time.monotonic() + timeout
    while True:
        snapshot = metrics(base_url)
        if predicate(snapshot) or time.monotonic() > deadline:
            return snapshot
        time.sleep(0.05)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)


# ---------------------------------------------------------------------------
# assertions and reporting


def short(value: Any, limit: int = 300) -> str:
    """A printable, truncated rendering of a body or value for failure messages."""
    if isinstance(value, (bytes, bytearray)):
        text = repr(bytes(value[: limit + 1]))
    elif isinstance(value, str):
        text = repr(value[: limit + 1])
    else:
        text = repr(value)
    return text if len(text) <= limit else text[:limit] + f"... ({len(value) if hasattr(value, '__len__') else '?'} in all)"


def expect(condition: Any, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def expect_eq(actual: Any, expected: Any, what: str) -> None:
    if actual != expected:
        raise AssertionError(f"{what}: expected {short(expected)}, got {short(actual)}")


def ok(message: str) -> None:
    print(f"ok  {message}", flush=True)


def check_error_shape(error_json: Any, context: str) -> dict:
    """`{"error": {"message": str, "type": str, "code": str|null, "param": str|null}}`;
    returns the inner object."""
    expect(isinstance(error_json, dict) and isinstance(error_json.get("error"), dict),
           f"{context}: expected a body {{\"error\": {{...}}}}, got {short(error_json)}")
    check_inner_error(error_json["error"], context)
    return error_json["error"]


def check_inner_error(err: Any, context: str) -> None:
    expect(isinstance(err, dict), f"{context}: error object is not a JSON object: {short(err)}")
    expect(isinstance(err.get("message"), str) and err["message"],
           f"{context}: error.message should be a non-empty string, got {short(err.get('message'))}")
    expect(isinstance(err.get("type"), str) and err["type"],
           f"{context}: error.type should be a non-empty string, got {short(err.get('type'))}")
    for key in ("code", "param"):
        expect(key in err, f"{context}: error.{key} is missing (should be a string or null): {short(err)}")
        expect(err[key] is None or isinstance(err[key], str),
               f"{context}: error.{key} should be a string or null, got {short(err[key])}")


def check_error_response(resp: Response, status: int, context: str, *, code: str | None = None,
                         param: str | None = None, type_: str | None = None) -> dict:
    """A raw error answer: its status, that it is JSON of the error shape, and optionally
    its code / param / type."""
    expect(resp.status == status, f"{context}: expected HTTP {status}, got {resp.status}: {short(resp.body)}")
    err = check_error_shape(resp.json(), context)
    if code is not None:
        expect_eq(err.get("code"), code, f"{context}: error.code")
    if param is not None:
        expect_eq(err.get("param"), param, f"{context}: error.param")
    if type_ is not None:
        expect_eq(err.get("type"), type_, f"{context}: error.type")
    return err


def expect_api_error(call: Callable[[], Any], exc_type: type, status: int, context: str, *,
                     code: str | None = None, param: str | Callable[[str | None], bool] | None = None,
                     type_: str | None = None):
    """Run an openai-client call that must fail with `exc_type` / `status`; check the
    error body (the client unwraps `{"error": ...}` into `e.body`), code and param.
    `param` may be a predicate for when several spellings are acceptable."""
    import openai

    try:
        result = call()
    except openai.APIStatusError as e:
        expect(isinstance(e, exc_type),
               f"{context}: expected {exc_type.__name__} (HTTP {status}), got {type(e).__name__} "
               f"(HTTP {e.status_code}): {short(e.body)}")
        expect_eq(e.status_code, status, f"{context}: status")
        check_inner_error(e.body, context)
        if code is not None:
            expect_eq(e.code, code, f"{context}: error.code")
        if callable(param):
            expect(param(e.param), f"{context}: unexpected error.param {e.param!r} (body {short(e.body)})")
        elif param is not None:
            expect_eq(e.param, param, f"{context}: error.param")
        if type_ is not None:
            expect_eq(e.type, type_, f"{context}: error.type")
        return e
    except openai.APIError as e:
        raise AssertionError(f"{context}: expected {exc_type.__name__}, got {type(e).__name__}: {e}") from e
    raise AssertionError(f"{context}: expected {exc_type.__name__} (HTTP {status}), but the call succeeded: "
                         f"{short(result)}")


def check_usage(usage: Any, context: str, *, max_completion: int | None = None) -> None:
    """usage = {prompt_tokens, completion_tokens, total_tokens, prompt_tokens_details:
    {cached_tokens}}, consistent with each other. Accepts a dict or an openai model."""
    u = usage if isinstance(usage, dict) else usage.model_dump()
    expect(isinstance(u, dict), f"{context}: usage missing")
    p, c, t = u.get("prompt_tokens"), u.get("completion_tokens"), u.get("total_tokens")
    expect(all(isinstance(x, int) for x in (p, c, t)), f"{context}: usage counts should be integers: {u}")
    expect(p > 0, f"{context}: usage.prompt_tokens should be > 0: {u}")
    expect(c >= 0, f"{context}: usage.completion_tokens should be >= 0: {u}")
    expect_eq(t, p + c, f"{context}: usage.total_tokens (prompt + completion)")
    details = u.get("prompt_tokens_details")
    expect(isinstance(details, dict) and isinstance(details.get("cached_tokens"), int),
           f"{context}: usage.prompt_tokens_details.cached_tokens should be an integer: {u}")
    expect(0 <= details["cached_tokens"] <= p,
           f"{context}: cached_tokens {details['cached_tokens']} should be within 0..=prompt_tokens ({p})")
    if max_completion is not None:
        expect(c <= max_completion, f"{context}: completion_tokens {c} exceeds max_tokens {max_completion}")


def cached_tokens(usage: Any) -> int:
    u = usage if isinstance(usage, dict) else usage.model_dump()
    return (u.get("prompt_tokens_details") or {}).get("cached_tokens") or 0


def run(main: Callable[[], None]) -> None:
    """Run a script's checks: exit 0 when all pass, 1 with the failing check otherwise."""
    name = os.path.basename(sys.argv[0])
    started = time.monotonic()
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001 - any failure is a test failure
        traceback.print_exc()
        print(f"FAILED {name}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
    print(f"{name}: all checks passed in {time.monotonic() - started:.1f}s", flush=True)


# ---------------------------------------------------------------------------
# prompt material

# Varied sentences (topics, lengths, punctuation, numbers) so that prompts built from
# them tokenize into realistic, non-repetitive sequences.
SENTENCES = [
    "The river bends twice before it reaches the old mill at the edge of town.",
    "At 6:40 in the morning the thermometer on the porch read minus three degrees.",
    "Most of the library's maps were donated by a retired sea captain in 1962.",
    "She replaced the bicycle chain, oiled the gears, and rode to the market.",
    "A colony of ants can move several kilograms of soil in a single summer.",
    "The committee postponed its vote because two members were stuck in traffic.",
    "Fresh bread cools on the rack while the kitchen smells of rosemary and salt.",
    "Our satellite link drops out whenever heavy clouds roll in from the west.",
    "He counted forty-seven steps from the harbour wall to the lighthouse door.",
    "The violinist tuned her instrument quietly as the audience found their seats.",
    "Granite cliffs rise almost vertically from the narrow beach below.",
    "Every Tuesday the bakery sells rye loaves at half price after four o'clock.",
    "The printer jammed again, so the report was delivered a day late.",
    "Migrating geese fly in a loose V to save energy on long journeys.",
    "A small leak in the roof left a brown stain shaped like a rabbit.",
    "The museum's new wing displays pottery from three different centuries.",
    "Tomatoes ripen faster when they are stored next to bananas.",
    "The night train to the capital stops at eleven stations along the coast.",
    "Volunteers planted two hundred oak saplings along the highway last spring.",
    "His grandmother's recipe calls for a pinch of nutmeg and a splash of cider.",
    "The server logs showed a spike in traffic shortly after midnight.",
    "Children chased each other around the fountain until the rain started.",
    "A thick fog delayed every ferry crossing until almost noon.",
    "The chess club meets in the back room of the café on Thursdays.",
    "Copper pipes in the basement had turned green after years of damp.",
    "The hikers reached the ridge just as the sun dipped below the peaks.",
    "Her notebook was full of sketches of birds, bridges, and strangers' hands.",
    "The town council approved a budget of 1.2 million for road repairs.",
    "Wind turbines on the hill turn slowly even on the calmest days.",
    "The old radio crackled before a faint voice read the shipping forecast.",
    "Beekeepers wear pale clothing because dark colours seem to agitate the bees.",
    "A stray cat has adopted the hardware store and sleeps in the nail aisle.",
    "The spreadsheet had 3,412 rows, and nobody knew who had created it.",
    "Snow covered the vineyard, but the vines underneath were perfectly healthy.",
    "The lecture on volcanic soils ran twenty minutes over its allotted time.",
    "Two fishing boats returned early because the nets had torn on the rocks.",
    "A quiet hum from the refrigerator filled the empty apartment.",
    "The festival ended with fireworks reflected in the still water of the bay.",
    "The mechanic said the engine needed new spark plugs and a timing belt.",
    "Students measured the shadow of a pole every hour to track the sun.",
    "The archive keeps handwritten letters in acid-free boxes at 18 degrees.",
    "Lanterns swayed along the pier as the evening breeze picked up.",
]


def paragraph(rng: random.Random, sentences: int) -> str:
    """`sentences` sentences drawn from the pool (without repeats while possible)."""
    picked: list[str] = []
    while len(picked) < sentences:
        batch = SENTENCES[:]
        rng.shuffle(batch)
        picked.extend(batch[: sentences - len(picked)])
    return " ".join(picked)
