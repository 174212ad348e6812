#!/usr/bin/env python3
"""Run a real agent CLI against an OpenAI/Anthropic-compatible server and measure it.

    python3 scripts/agents.py --agent claude --server http://127.0.0.1:8080 --model qwen2.5-coder-0.5b
    python3 scripts/agents.py --agent codex  --server http://127.0.0.1:8080 --model qwen2.5-coder-0.5b

The agent (`@anthropic-ai/claude-code` in print mode over `/v1/messages`, or
`@openai/codex` with `codex exec` over `/v1/responses`) is installed from npm into
~/.cache/pyramid/agents on first use (PYRAMID_AGENTS_HOME elsewhere). It runs in a
project directory there (the same on every run, as a user's project would be) holding
`notes.txt`, and is asked to read the file with its tool and say the secret word in it. Its requests go through a
recording proxy that streams them on unchanged and notes, per request: the time to the
first output event (a content block or output item: TTFT), the prompt tokens, how many
of them the server read from its cache, and whether the reply made a tool call.

Prints one line per request and a summary; writes them as JSON with --json FILE.
Exits 1 if the agent failed, a request got an HTTP error, or no tool call was made.
The server is any that speaks the protocol: `pyramid serve`, or llama.cpp's
`llama-server` for a side-by-side run with the same model.
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import json
import os
import shutil
import socketserver
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

AGENTS_HOME = Path(os.environ.get("PYRAMID_AGENTS_HOME", Path.home() / ".cache/pyramid/agents"))
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
# Small models need the tool named: each agent's own way of reading a file.
TASKS = {
    "claude": "Use the Read tool to read the file notes.txt, then tell me the secret word written in it.",
    "codex": "Run `cat notes.txt` with the exec_command tool, then tell me the secret word written in it.",
}
SECRET = "tangerine"

# Events that carry the first of a reply's output, per protocol.
FIRST_OUTPUT = {"content_block_start", "response.output_item.added"}


class Recorder:
    """What the proxy saw, one record per request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[dict] = []
        self.seen = 0

    def next_number(self) -> int:
        """A number for each request the proxy forwards, in order."""
        with self.lock:
            self.seen += 1
            return self.seen

    def add(self, record: dict) -> None:
        with self.lock:
            self.records.append(record)


def read_usage(event: dict, record: dict) -> None:
    """Prompt and cached tokens from a usage-bearing event of either protocol."""
    kind = event.get("type")
    if kind == "message_start":
        usage = event["message"].get("usage") or {}
        record["prompt_tokens"] = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
    elif kind == "message_delta":
        usage = event.get("usage") or {}
        if "cache_read_input_tokens" in usage:
            record["cached_tokens"] = usage["cache_read_input_tokens"] or 0
            record["prompt_tokens"] = (usage.get("input_tokens") or 0) + record["cached_tokens"]
    elif kind in ("response.completed", "response.incomplete"):
        usage = event["response"].get("usage") or {}
        record["prompt_tokens"] = usage.get("input_tokens", 0)
        record["cached_tokens"] = (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)
    if kind == "content_block_start" and event.get("content_block", {}).get("type") == "tool_use":
        record["tool_call"] = True
    if kind == "response.output_item.added" and event.get("item", {}).get("type") == "function_call":
        record["tool_call"] = True


def pin_sampling(body: bytes | None, temperature: float | None, max_output: int | None) -> bytes | None:
    """The request with `temperature` and the Responses `max_output_tokens` set where it
    leaves them out (the agents send neither), so runs repeat and compare."""
    if body is None or (temperature is None and max_output is None):
        return body
    try:
        request = json.loads(body)
    except json.JSONDecodeError:
        return body
    if temperature is not None:
        request.setdefault("temperature", temperature)
    if max_output is not None and "input" in request:
        request.setdefault("max_output_tokens", max_output)
    return json.dumps(request).encode()


def proxy(upstream: str, recorder: Recorder, temperature: float | None,
          max_output: int | None, dump: Path | None) -> socketserver.TCPServer:
    target = urllib.parse.urlparse(upstream)

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # quiet
            pass

        def forward(self, method: str) -> None:
            started = time.monotonic()
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else None
            if method == "POST":
                body = pin_sampling(body, temperature, max_output)
            number = recorder.next_number()
            if dump is not None:
                (dump / f"{number:03d}-request.json").write_bytes(body or b"")
            headers = {k: v for k, v in self.headers.items()
                       if k.lower() not in ("host", "accept-encoding", "connection", "content-length")}
            conn = http.client.HTTPConnection(target.hostname, target.port, timeout=3600)
            try:
                conn.request(method, self.path, body=body, headers=headers)
                upstream_reply = conn.getresponse()
            except OSError as e:
                message = json.dumps({"error": {"message": f"the server is unreachable: {e}"}}).encode()
                self.send_response(502)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(message)))
                self.end_headers()
                self.wfile.write(message)
                recorder.add({"path": self.path, "status": 502, "prompt_tokens": None, "cached_tokens": None,
                              "ttft_s": None, "tool_call": False, "total_s": time.monotonic() - started})
                return
            record = {"path": self.path, "status": upstream_reply.status, "prompt_tokens": None,
                      "cached_tokens": None, "ttft_s": None, "tool_call": False}
            self.send_response(upstream_reply.status)
            for k, v in upstream_reply.getheaders():
                if k.lower() not in ("transfer-encoding", "content-length", "connection"):
                    self.send_header(k, v)
            self.send_header("connection", "close")
            self.end_headers()
            self.close_connection = True
            streamed = "text/event-stream" in (upstream_reply.getheader("content-type") or "")
            seen = bytearray()
            if streamed:
                while True:
                    line = upstream_reply.readline()
                    if not line:
                        break
                    if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                        try:
                            event = json.loads(line[6:])
                        except json.JSONDecodeError:
                            event = {}
                        if record["ttft_s"] is None and event.get("type") in FIRST_OUTPUT:
                            record["ttft_s"] = time.monotonic() - started
                        read_usage(event, record)
                    self.wfile.write(line)
                    self.wfile.flush()
                    seen += line
            else:
                data = upstream_reply.read()
                self.wfile.write(data)
                seen += data
                try:
                    reply = json.loads(data)
                    usage = reply.get("usage") or {}
                    record["prompt_tokens"] = usage.get("input_tokens")
                    record["cached_tokens"] = ((usage.get("input_tokens_details") or {}).get("cached_tokens")
                                              or usage.get("cache_read_input_tokens"))
                except (json.JSONDecodeError, AttributeError):
                    pass
            record["total_s"] = time.monotonic() - started
            if dump is not None:
                (dump / f"{number:03d}-reply.txt").write_bytes(bytes(seen))
            # Only the protocol's requests: Claude Code also probes `HEAD /`, which may 404.
            path = urllib.parse.urlparse(self.path).path.rstrip("/")
            if method == "POST" and path.endswith(("/messages", "/responses")):
                recorder.add(record)

        def do_POST(self) -> None:
            self.forward("POST")

        def do_GET(self) -> None:
            self.forward("GET")

        def do_HEAD(self) -> None:
            self.forward("HEAD")

    class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
        daemon_threads = True

    server = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def install(agent: str) -> Path:
    """The agent's executable, installed from npm on first use."""
    binary = AGENTS_HOME / "node_modules/.bin" / agent
    if not binary.exists():
        AGENTS_HOME.mkdir(parents=True, exist_ok=True)
        print(f"installing {PACKAGES[agent]} into {AGENTS_HOME}", file=sys.stderr)
        subprocess.run(["npm", "install", "--silent", "--prefix", str(AGENTS_HOME), PACKAGES[agent]], check=True)
    return binary


def command(agent: str, binary: Path, base: str, model: str, workdir: Path, home: Path) -> tuple[list[str], dict]:
    env = dict(os.environ)
    if agent == "claude":
        env.update({
            "ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": os.environ.get("PYRAMID_API_KEY", "no-key"),
            "ANTHROPIC_MODEL": model, "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1", "HOME": str(home),
        })
        return [str(binary), "-p", TASKS[agent], "--allowedTools", "Read", "--max-turns", "4",
                "--output-format", "stream-json", "--verbose"], env
    (home / "config.toml").write_text(f"""model = "{model}"
model_provider = "local"
approval_policy = "never"
sandbox_mode = "danger-full-access"
web_search = "disabled"

[model_providers.local]
name = "Local"
base_url = "{base}/v1"
env_key = "PYRAMID_AGENT_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = 1800000

[analytics]
enabled = false
""")
    env.update({"CODEX_HOME": str(home), "PYRAMID_AGENT_KEY": os.environ.get("PYRAMID_API_KEY", "no-key")})
    return [str(binary), "exec", "--skip-git-repo-check", "--ephemeral", "-s", "danger-full-access",
            "--disable", "plugins", "--disable", "multi_agent", "--disable", "goals",
            "-C", str(workdir), TASKS[agent]], env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agent", choices=sorted(PACKAGES), required=True)
    parser.add_argument("--server", required=True, help="the server's base URL, without /v1")
    parser.add_argument("--model", required=True)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--temperature", type=float,
                        help="the temperature of requests that give none (the agents give none: 1.0)")
    parser.add_argument("--max-output-tokens", type=int,
                        help="max_output_tokens of Responses requests that give none (Codex gives none)")
    parser.add_argument("--json", help="write the per-request records here")
    parser.add_argument("--dump", type=Path, help="write each request body and reply into this directory")
    args = parser.parse_args()

    binary = install(args.agent)
    recorder = Recorder()
    if args.dump:
        args.dump.mkdir(parents=True, exist_ok=True)
    server = proxy(args.server.rstrip("/"), recorder, args.temperature, args.max_output_tokens, args.dump)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    # One project directory per agent, as a user runs an agent again in the same place:
    # the path is part of the agent's system prompt, so a new session shares its prefix.
    scratch = AGENTS_HOME / f"run-{args.agent}"
    shutil.rmtree(scratch, ignore_errors=True)
    workdir, home = scratch / "work", scratch / "home"
    workdir.mkdir(parents=True)
    home.mkdir()
    (workdir / "notes.txt").write_text(f"Meeting notes.\nThe secret word is {SECRET}.\n")
    argv, env = command(args.agent, binary, base, args.model, workdir, home)
    started = time.monotonic()
    run = subprocess.run(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=args.timeout)
    elapsed = time.monotonic() - started
    server.shutdown()
    shutil.rmtree(scratch, ignore_errors=True)

    records = recorder.records
    for i, r in enumerate(records, 1):
        prefilled = None if r["prompt_tokens"] is None else r["prompt_tokens"] - (r["cached_tokens"] or 0)
        ttft = "-" if r["ttft_s"] is None else f"{r['ttft_s']:.1f} s"
        print(f"request {i}: {r['path']} HTTP {r['status']}, prompt {r['prompt_tokens']} tokens, "
              f"prefilled {prefilled}, TTFT {ttft}, total {r['total_s']:.1f} s"
              f"{', tool call' if r['tool_call'] else ''}")
    tail = (run.stdout.strip().splitlines() or [""])[-1]
    print(f"{args.agent}: exit {run.returncode} after {elapsed:.0f} s, {len(records)} requests; last output: {tail[:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps({"agent": args.agent, "model": args.model, "server": args.server,
                                               "exit": run.returncode, "seconds": elapsed, "requests": records,
                                               "stdout_tail": run.stdout[-4000:], "stderr_tail": run.stderr[-4000:]},
                                              indent=1))
    failures = []
    if run.returncode != 0:
        failures.append(f"the agent exited {run.returncode}: {run.stderr.strip()[-800:]}")
    if any(r["status"] >= 400 for r in records):
        failures.append("a request got an HTTP error")
    if not any(r["tool_call"] for r in records):
        failures.append("no tool call was made")
    for failure in failures:
        print(f"FAILED: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
