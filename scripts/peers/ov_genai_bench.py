#!/usr/bin/env python3
"""Prefill and decode throughput of OpenVINO GenAI on CPU, llama-bench style.

Reads a GGUF file directly with openvino_genai.LLMPipeline and prints a JSON list
of records shaped like `pyramid bench --json` (model, test, n_prompt, n_gen,
n_depth, threads, avg_ts, stddev_ts, samples_ts), plus the raw timings.

  pp<P>: a synthetic prompt of exactly P token ids, one new token; the prefill
         rate is P / TTFT. With a depth D > 0 the prompt is D + P tokens and the
         rate is P / (TTFT(D + P) - TTFT(D)), the time the extra P tokens took.
  tg<N>: a prompt of max(D, 1) tokens, exactly N new tokens (EOS ignored); the
         decode rate is 1000 / TPOT, TPOT being OpenVINO GenAI's mean time per
         output token after the first, in ms.

On failure it prints {"error": "..."} and exits with status 2.
"""

import argparse
import json
import math
import os
import random
import re
import struct
import sys
import time
from collections import Counter

FILLER = (
    "Benchmarks measure how quickly a language model reads a prompt and writes "
    "new text. The prompt here is made of ordinary words drawn at random, so "
    "its content does not matter; only its length in tokens does. Each run "
    "uses a fresh sequence, which keeps any prefix cache from skipping work. "
    "Rivers, mountains, numbers like 1234 and 5678, code such as fn main() {} "
    "and punctuation; commas, colons: and questions? all appear in the pool."
)


def parse_list(text):
    try:
        values = [int(v) for v in text.split(",") if v != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("lengths must be >= 0")
    return values


def mean_sd(xs):
    if not xs:
        return float("nan"), float("nan")
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, 0.0
    return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


GGML_TYPES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K",
              16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S",
              22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64", 28: "F64",
              29: "IQ1_M", 30: "BF16"}


def gguf_tensor_types(path):
    """Counts the tensor types of a GGUF file (v2/v3), to explain a load failure."""
    scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
              10: "<Q", 11: "<q", 12: "<d"}
    with open(path, "rb") as f:
        def read(fmt):
            size = struct.calcsize(fmt)
            data = f.read(size)
            if len(data) != size:
                raise ValueError("truncated GGUF header")
            return struct.unpack(fmt, data)[0]

        def skip_string():
            f.seek(read("<Q"), 1)

        def skip_value(vtype):
            if vtype == 8:
                skip_string()
            elif vtype == 9:
                inner, count = read("<I"), read("<Q")
                if inner in scalar:
                    f.seek(struct.calcsize(scalar[inner]) * count, 1)
                else:
                    for _ in range(count):
                        skip_value(inner)
            elif vtype in scalar:
                f.seek(struct.calcsize(scalar[vtype]), 1)
            else:
                raise ValueError(f"unknown GGUF value type {vtype}")

        if f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        if read("<I") < 2:
            raise ValueError("GGUF version 1 is not supported")
        n_tensors, n_kv = read("<Q"), read("<Q")
        for _ in range(n_kv):
            skip_string()
            skip_value(read("<I"))
        counts = Counter()
        for _ in range(n_tensors):
            skip_string()
            f.seek(8 * read("<I"), 1)
            ttype = read("<I")
            read("<Q")
            counts[GGML_TYPES.get(ttype, f"type{ttype}")] += 1
        return counts


def fail(message):
    # OpenVINO's messages name the source file and line of the check that
    # failed; keep that in "detail" and drop it from the short reason.
    short = re.sub(r" at /\S+?:\d+:", ":", message)
    print(json.dumps({"error": short, "detail": message}))
    print(f"ov_genai_bench: {message}", file=sys.stderr)
    sys.exit(2)


class Runner:
    def __init__(self, args):
        import numpy as np
        import openvino as ov
        import openvino_genai as ov_genai

        self.np = np
        self.ov = ov
        self.ov_genai = ov_genai
        self.properties = {"INFERENCE_NUM_THREADS": args.threads}
        t0 = time.perf_counter()
        self.pipe = ov_genai.LLMPipeline(args.model, "CPU", **self.properties)
        self.load_s = time.perf_counter() - t0
        tokenizer = self.pipe.get_tokenizer()
        encoded = tokenizer.encode(FILLER, add_special_tokens=False)
        ids = [int(t) for t in encoded.input_ids.data.reshape(-1)]
        self.pool = sorted(set(ids))
        if len(self.pool) < 8:
            raise RuntimeError("the tokenizer produced too few distinct tokens for a synthetic prompt")
        self.rng = random.Random(1234)

    def prompt(self, length):
        """A tensor of exactly `length` token ids, new for every call."""
        ids = [self.rng.choice(self.pool) for _ in range(length)]
        arr = self.np.array([ids], dtype=self.np.int64)
        mask = self.np.ones_like(arr)
        return self.ov_genai.TokenizedInputs(self.ov.Tensor(arr), self.ov.Tensor(mask))

    def generate(self, prompt_len, new_tokens):
        cfg = self.pipe.get_generation_config()
        cfg.max_new_tokens = new_tokens
        cfg.min_new_tokens = new_tokens
        cfg.ignore_eos = True
        cfg.do_sample = False
        result = self.pipe.generate(self.prompt(prompt_len), cfg)
        pm = result.perf_metrics
        n_in = int(pm.get_num_input_tokens())
        n_out = int(pm.get_num_generated_tokens())
        if n_in != prompt_len:
            raise RuntimeError(f"asked for a {prompt_len}-token prompt, the pipeline saw {n_in}")
        if n_out != new_tokens:
            raise RuntimeError(f"asked for {new_tokens} new tokens, the pipeline made {n_out}")
        return {
            "n_input": n_in,
            "n_generated": n_out,
            "ttft_ms": float(pm.get_ttft().mean),
            "tpot_ms": float(pm.get_tpot().mean),
            "generate_ms": float(pm.get_generate_duration().mean),
        }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="path to a GGUF file")
    ap.add_argument("--threads", type=int, default=2, help="CPU inference threads (default 2)")
    ap.add_argument("-p", "--n-prompt", type=parse_list, default=[512], help="prompt lengths, comma-separated; 0 skips")
    ap.add_argument("-n", "--n-gen", type=parse_list, default=[128], help="tokens to generate, comma-separated; 0 skips")
    ap.add_argument("-d", "--n-depth", type=int, default=0, help="tokens already in context before each test")
    ap.add_argument("-r", "--repetitions", type=int, default=5, help="timed repetitions per test")
    ap.add_argument("--no-warmup", action="store_true", help="skip the untimed warm-up generation")
    args = ap.parse_args()

    if not os.path.isfile(args.model):
        fail(f"no such file: {args.model}")
    if args.threads < 1 or args.repetitions < 1 or args.n_depth < 0:
        fail("--threads and -r must be >= 1, -d >= 0")

    try:
        runner = Runner(args)
    except Exception as e:  # noqa: BLE001 - the reason is the result here
        reason = f"cannot load the model: {type(e).__name__}: {' '.join(str(e).split())}"
        try:
            types = gguf_tensor_types(args.model)
            reason += " (tensor types in the file: " + ", ".join(
                f"{n} x{c}" for n, c in sorted(types.items())) + ")"
        except (OSError, ValueError, struct.error):
            pass
        fail(reason)

    depth = args.n_depth
    records = []
    try:
        if not args.no_warmup:
            warm = max([p for p in args.n_prompt if p > 0] or [16]) + depth
            runner.generate(warm, 2)
        for p in args.n_prompt:
            if p == 0:
                continue
            samples, raw = [], []
            for _ in range(args.repetitions):
                full = runner.generate(depth + p, 1)
                if depth > 0:
                    base = runner.generate(depth, 1)
                    dt_ms = full["ttft_ms"] - base["ttft_ms"]
                    raw.append({"full": full, "depth_only": base})
                else:
                    dt_ms = full["ttft_ms"]
                    raw.append({"full": full})
                if dt_ms <= 0:
                    raise RuntimeError(f"non-positive prefill time {dt_ms} ms")
                samples.append(p * 1000.0 / dt_ms)
            records.append(("pp", p, 0, samples, raw))
        for n in args.n_gen:
            if n == 0:
                continue
            if n < 2:
                fail("tg tests need at least 2 generated tokens (TPOT excludes the first)")
            samples, raw = [], []
            for _ in range(args.repetitions):
                r = runner.generate(max(depth, 1), n)
                samples.append(1000.0 / r["tpot_ms"])
                raw.append(r)
            records.append(("tg", 0, n, samples, raw))
    except Exception as e:  # noqa: BLE001
        fail(f"generation failed: {type(e).__name__}: {' '.join(str(e).split())}")

    out = []
    for kind, p, n, samples, raw in records:
        avg, sd = mean_sd(samples)
        out.append({
            "engine": "openvino-genai",
            "model": args.model,
            "test": f"pp{p}" if kind == "pp" else f"tg{n}",
            "n_prompt": p,
            "n_gen": n,
            "n_depth": depth,
            "threads": args.threads,
            "device": "CPU",
            "properties": runner.properties,
            "load_s": runner.load_s,
            "avg_ts": avg,
            "stddev_ts": sd,
            "samples_ts": samples,
            "raw": raw,
            "openvino_genai_version": runner.ov_genai.__version__,
            "openvino_version": runner.ov.__version__,
        })
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
