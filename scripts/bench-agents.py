#!/usr/bin/env python3
"""Many agents on one device: what priorities and session persistence buy, measured.

A measurement, not a test: nothing is asserted. It starts `pyramid serve` itself (on
loopback, port 0) and reports:

1. Priorities. One server with --max-batch equal to the background agents. Phases:
   - `alone`: the interactive client alone: short turns of one growing conversation;
   - `background`: N background agents streaming long generations (end tokens banned);
   - `mixed_off`: both at once, every request at priority 0;
   - `mixed_on`: both at once, background at priority 10, interactive at 0.
   For each: the interactive client's TTFT p50/p99 and the background agents' aggregate
   decode throughput (tokens per second of wall time).
2. Resume from disk vs re-prefill, for one conversation of ~--context tokens: a server
   with --session-dir serves the first turn and is stopped (SIGTERM); a new one on the
   same directory serves the second turn (TTFT = reading the KV from disk + the new
   tokens' prefill), against a server without it whose second turn prefills everything.

Usage (the openai package is needed; scripts/test.sh installs it into
${PYRAMID_HOME:-~/.cache/pyramid}/test-venv):

    ~/.cache/pyramid/test-venv/bin/python scripts/bench-agents.py \\
        --pyramid target/release/pyramid --model qwen2.5-coder-0.5b

Prints a JSON summary (also written to --out), then a short table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

try:
    import openai
except ImportError:
    sys.exit("bench-agents.py needs the openai package (e.g. the venv scripts/test.sh makes)")

WORDS = ("agent tool result file function change test error value list window cache token "
         "memory device plan step note output input search query answer reason check").split()


def text(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


class Server:
    """`pyramid serve` on a free loopback port; stopped with SIGTERM."""

    def __init__(self, binary: str, model: str, extra: list[str]) -> None:
        self.proc = subprocess.Popen([binary, "serve", "-m", model, "--port", "0", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        url = next((w for w in line.split() if w.startswith("http://")), None)
        if url is None:
            self.proc.kill()
            sys.exit(f"pyramid serve did not start: {line!r}")
        self.url = url.rstrip("/")
        self.client = openai.AsyncOpenAI(base_url=self.url + "/v1", api_key="none", max_retries=0, timeout=1800)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=600)


async def stream(client, model: str, messages: list[dict], max_tokens: int, priority: int | None,
                 ban: dict | None) -> dict:
    extra = {"logit_bias": ban} if ban else {}
    if priority is not None:
        extra["extra_body"] = {"priority": priority}
    start = time.perf_counter()
    first = None
    tokens = prompt_tokens = cached = 0
    reply = []
    s = await client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens,
                                             temperature=0, stream=True,
                                             stream_options={"include_usage": True}, **extra)
    async for chunk in s:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter()
            reply.append(chunk.choices[0].delta.content)
        if chunk.usage:
            tokens = chunk.usage.completion_tokens
            prompt_tokens = chunk.usage.prompt_tokens
            details = chunk.usage.prompt_tokens_details
            cached = (details.cached_tokens or 0) if details else 0
    return {"ttft": (first or time.perf_counter()) - start, "tokens": tokens, "reply": "".join(reply),
            "prompt_tokens": prompt_tokens, "cached_tokens": cached, "end": time.perf_counter()}


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, max(0, int(round(q * (len(v) - 1)))))]


async def interactive(client, model: str, turns: int, priority: int | None, rng: random.Random) -> list[float]:
    """Short turns of one conversation; TTFT of each."""
    messages = [{"role": "system", "content": "You are a terse assistant."}]
    ttfts = []
    for _ in range(turns):
        messages.append({"role": "user", "content": "Quick question: " + text(rng, 12)})
        r = await stream(client, model, messages, 16, priority, None)
        ttfts.append(r["ttft"])
        messages.append({"role": "assistant", "content": r["reply"]})
        await asyncio.sleep(0.3)  # the user reads the answer
    return ttfts


async def background(client, model: str, agent: int, until: list[bool], priority: int | None, ban: dict,
                     max_tokens: int, rng: random.Random) -> int:
    """Long generations back to back until told to stop; tokens generated."""
    total = 0
    messages = [{"role": "system", "content": f"You are background agent {agent}. Write long reports."},
                {"role": "user", "content": "Report on: " + text(rng, 30)}]
    while not until[0]:
        r = await stream(client, model, messages, max_tokens, priority, ban)
        total += r["tokens"]
    return total


async def priority_phase(server: Server, model: str, name: str, agents: int, turns: int, bg_prio, fg_prio,
                         ban: dict, bg_tokens: int, seconds: float) -> dict:
    rng = random.Random(7)
    until = [False]
    start = time.perf_counter()
    bg = [asyncio.create_task(background(server.client, model, a, until, bg_prio, ban, bg_tokens, rng))
          for a in range(agents)] if name != "alone" else []
    if name == "background":
        await asyncio.sleep(seconds)
        ttfts = []
    else:
        if bg:
            await asyncio.sleep(2.0)  # the background agents are streaming
        ttfts = await interactive(server.client, model, turns, fg_prio, rng)
    until[0] = True
    wall = time.perf_counter() - start
    tokens = sum(await asyncio.gather(*bg)) if bg else 0
    return {"phase": name, "interactive_ttft_ms_p50": (pct(ttfts, 0.5) or 0) * 1e3 if ttfts else None,
            "interactive_ttft_ms_p99": (pct(ttfts, 0.99) or 0) * 1e3 if ttfts else None,
            "interactive_turns": len(ttfts),
            "background_tok_s": tokens / wall if bg else None, "wall_s": wall}


async def resume_phase(binary: str, model: str, context: int, extra: list[str]) -> dict:
    rng = random.Random(11)
    # About a token per word of this vocabulary; the server reports the real count.
    messages = [{"role": "system", "content": "You review agent logs."},
                {"role": "user", "content": "Log follows. " + text(rng, context) + " Summarise in one line."}]
    with tempfile.TemporaryDirectory() as sessions:
        first = Server(binary, model, [*extra, "--session-dir", sessions])
        r = await stream(first.client, model, messages, 16, None, None)
        messages += [{"role": "assistant", "content": r["reply"]}, {"role": "user", "content": "And the errors?"}]
        first.stop()
        stored = sum(os.path.getsize(os.path.join(sessions, f)) for f in os.listdir(sessions))
        resumed_server = Server(binary, model, [*extra, "--session-dir", sessions])
        resumed = await stream(resumed_server.client, model, messages, 16, None, None)
        resumed_server.stop()
    fresh_server = Server(binary, model, extra)
    fresh = await stream(fresh_server.client, model, messages, 16, None, None)
    fresh_server.stop()
    return {"prompt_tokens": resumed["prompt_tokens"], "resumed_cached_tokens": resumed["cached_tokens"],
            "reprefill_cached_tokens": fresh["cached_tokens"], "session_file_bytes": stored,
            "resume_ttft_ms": resumed["ttft"] * 1e3, "reprefill_ttft_ms": fresh["ttft"] * 1e3,
            "resume_over_reprefill": resumed["ttft"] / fresh["ttft"],
            "same_reply": resumed["reply"] == fresh["reply"]}


async def main_async(args) -> dict:
    ban = {str(t): -100 for t in args.ban}
    extra = ["--max-batch", str(args.agents), *args.serve_args]
    server = Server(args.pyramid, args.model, extra)
    model = (await server.client.models.list()).data[0].id
    phases = []
    for name, bg_prio, fg_prio in [("alone", None, None), ("background", 0, None), ("mixed_off", 0, 0),
                                   ("mixed_on", 10, 0)]:
        phases.append(await priority_phase(server, model, name, args.agents, args.turns, bg_prio, fg_prio, ban,
                                           args.background_tokens, args.seconds))
        print(json.dumps(phases[-1]), file=sys.stderr)
    server.stop()
    resume = await resume_phase(args.pyramid, model, args.context, args.serve_args)
    return {"model": model, "agents": args.agents, "turns": args.turns, "phases": phases, "resume": resume,
            "provenance": provenance(args)}


def provenance(args) -> dict:
    """Where and how the figures were measured."""
    def run(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return "unknown"
    cpu = "unknown"
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and cpu == "unknown":
                    cpu = line.split(":", 1)[1].strip()
                if line.startswith("flags") and not flags:
                    flags = [x for x in line.split(":", 1)[1].split() if x.startswith("avx")]
    except OSError:
        pass
    dirty = run(["git", "status", "--porcelain", "--untracked-files=no"])
    return {"commit": run(["git", "rev-parse", "HEAD"]), "dirty": bool(dirty) and dirty != "unknown",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu": cpu, "cores": os.cpu_count(),
            "isa": flags, "command": " ".join(sys.argv)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pyramid", default="target/release/pyramid")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--agents", type=int, default=4, help="background agents (and the batch size)")
    parser.add_argument("--turns", type=int, default=10, help="interactive turns per phase")
    parser.add_argument("--background-tokens", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=20.0, help="length of the background-only phase")
    parser.add_argument("--context", type=int, default=4000, help="tokens of the resumed conversation")
    parser.add_argument("--ban", type=int, nargs="*", default=[0, 2], help="end-token ids to ban in background runs")
    parser.add_argument("--serve-args", nargs=argparse.REMAINDER, default=[], help="more `pyramid serve` flags")
    parser.add_argument("--out", help="write the JSON summary here too")
    args = parser.parse_args()
    summary = asyncio.run(main_async(args))
    out = json.dumps(summary, indent=2)
    print(out)
    if args.out:
        with open(args.out, "w") as f:
            f.write(out + "\n")
    alone = summary["phases"][0]["interactive_ttft_ms_p50"]
    print(f"\n{'phase':<12} {'TTFT p50 ms':>12} {'p99 ms':>9} {'x alone':>8} {'bg tok/s':>9}")
    for p in summary["phases"]:
        p50 = p["interactive_ttft_ms_p50"]
        row = [f"{p50:.0f}" if p50 else "-", f"{p['interactive_ttft_ms_p99']:.0f}" if p50 else "-",
               f"{p50 / alone:.2f}" if p50 else "-",
               f"{p['background_tok_s']:.1f}" if p["background_tok_s"] else "-"]
        print(f"{p['phase']:<12} {row[0]:>12} {row[1]:>9} {row[2]:>8} {row[3]:>9}")
    r = summary["resume"]
    print(f"\n{r['prompt_tokens']}-token conversation: resume from disk {r['resume_ttft_ms']:.0f} ms "
          f"({r['resumed_cached_tokens']} cached) vs re-prefill {r['reprefill_ttft_ms']:.0f} ms "
          f"({100 * r['resume_over_reprefill']:.1f} %), same reply: {r['same_reply']}")


if __name__ == "__main__":
    main()
