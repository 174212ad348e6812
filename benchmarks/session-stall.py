#!/usr/bin/env python3
"""How much writing conversations to disk stalls the streams a server is serving.

Starts `pyramid serve` (the binary given) with a session directory and room for five
conversations, fills four of them with 4,000-token prompts, then streams one reply and,
while it streams, sends four short requests: each one pushes a 4,000-token conversation
out of memory, to disk. Prints the streamed reply's inter-token gaps (median, p99, max)
and the largest gap over the median (issue 49's goal: no step longer than 2x the median).

    benchmarks/session-stall.py target/release/pyramid [--model smollm2-135m] [--rounds 3]

Only the Python standard library: the server's first stdout line gives its address.
"""

import argparse
import http.client
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time


def post(host, port, body, stream=False):
    conn = http.client.HTTPConnection(host, port, timeout=600)
    conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    if response.status != 200:
        raise SystemExit(f"HTTP {response.status}: {response.read()[:300]!r}")
    if not stream:
        data = json.loads(response.read())
        conn.close()
        return data
    return conn, response


def ids(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(200, 40000) for _ in range(n)]


def one_round(binary, model, kv, long_len, control, max_sessions):
    session_dir = tempfile.mkdtemp(prefix="pyramid-stall-")
    # The control run drops evicted conversations instead of writing them.
    keep = [] if control else ["--session-dir", session_dir]
    server = subprocess.Popen(
        [binary, "serve", "--model", model, "--port", "0", *keep,
         "--max-sessions", str(max_sessions), "--kv", kv, "--speculative", "off"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        line = server.stdout.readline()
        address = line.split("http://")[1].split(" ")[0]
        host, port = address.rsplit(":", 1)
        port = int(port)
        # Four long conversations, cached.
        for seed in range(4):
            post(host, port, {"model": model, "prompt": ids(seed, long_len), "max_tokens": 1,
                              "temperature": 0})
        stream_body = {"model": model, "prompt": ids(100, 32), "max_tokens": 300,
                       "temperature": 0, "stream": True}
        conn, response = post(host, port, stream_body, stream=True)
        stamps = []
        evictors = []

        def evict(seed):
            post(host, port, {"model": model, "prompt": ids(1000 + seed, 16), "max_tokens": 1,
                              "temperature": 0})

        while True:
            raw = response.readline()
            if not raw:
                break
            text = raw.decode().strip()
            if not text.startswith("data: "):
                continue
            if text == "data: [DONE]":
                break
            stamps.append(time.perf_counter())
            if len(stamps) == 40:
                for seed in range(4):
                    t = threading.Thread(target=evict, args=(seed,))
                    t.start()
                    evictors.append(t)
        for t in evictors:
            t.join()
        conn.close()
        return [b - a for a, b in zip(stamps, stamps[1:])]
    finally:
        server.terminate()
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(session_dir, ignore_errors=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("binary")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--kv", default="f32")
    parser.add_argument("--long", type=int, default=4000, help="tokens per long conversation")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--control", action="store_true",
                        help="no session directory: the same evictions, nothing written")
    parser.add_argument("--max-sessions", type=int, default=5,
                        help="conversations kept in memory (9: nothing is evicted, the cost "
                             "of admitting the four short requests alone)")
    args = parser.parse_args()
    for r in range(args.rounds):
        gaps = sorted(one_round(args.binary, args.model, args.kv, args.long, args.control,
                                 args.max_sessions))
        median = statistics.median(gaps)
        p99 = gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))]
        print(json.dumps({
            "round": r, "control": args.control, "max_sessions": args.max_sessions, "gaps": len(gaps),
            "median_ms": round(median * 1e3, 2), "p99_ms": round(p99 * 1e3, 2),
            "max_ms": round(gaps[-1] * 1e3, 2), "max_over_median": round(gaps[-1] / median, 2),
        }))
        sys.stdout.flush()


if __name__ == "__main__":
    main()
