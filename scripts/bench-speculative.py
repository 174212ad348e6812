#!/usr/bin/env python3
"""Decode speed with and without prompt-lookup speculation, side by side in one run.

Agent steps that copy their context (a whole file with a small change, JSON re-emitted
with one field changed, a tool call echoing its arguments) against free prose. Each
prompt runs through `pyramid run --json` with `--speculative off` and `ngram`
alternately, greedy; the two must give the same tokens (checked), and the figures are
decode tok/s per mode, their ratio, the acceptance rate and tokens per pass.

    scripts/bench-speculative.py --model qwen2.5-coder-0.5b --reps 3 --out FILE.json
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def function_file(n_lines: int) -> str:
    lines = ["def process_records(records, threshold):", '    """Filter and summarise sensor records."""', "    results = []"]
    i = 0
    while len(lines) < n_lines - 1:
        lines.append(f"    value_{i} = records[{i}].get('reading', 0) * {i + 1} + threshold")
        lines.append(f"    if value_{i} > threshold:")
        lines.append(f"        results.append(('sensor_{i}', value_{i}))")
        i += 1
    lines.append("    return results")
    return "\n".join(lines)


def config_json() -> str:
    obj = {
        f"service_{i}": {"host": f"10.0.{i}.{i + 7}", "port": 8000 + i, "enabled": i % 3 != 0, "tags": [f"zone-{i % 4}", "prod"]}
        for i in range(24)
    }
    return json.dumps(obj, indent=2)


NOTES = (
    "Meeting notes, 14 March. Attendees: Ana, Bo, Chidi, Dana. The migration of the billing service to the new "
    "cluster is scheduled for the first week of April. Bo will prepare the rollback plan and Dana will update the "
    "runbook. Open questions: whether the nightly export job can run during the freeze, and who owns the alerting "
    "rules for the payments queue. Next meeting: 21 March, same room."
)

PROMPTS = {
    "copy": {
        "code-edit": "Apply this small change to the following file: rename the function process_records to "
        "summarise_records. Return the whole file, unchanged otherwise, in one python code block.\n\n```python\n"
        + function_file(150)
        + "\n```",
        "json-reemit": "Here is a JSON configuration. Set the port of service_5 to 9090 and return the whole JSON "
        "object, unchanged otherwise.\n\n```json\n" + config_json() + "\n```",
        "tool-echo": "Call the tool save_note with the note below as its `text` argument, word for word. Answer "
        'with only the call, as JSON: {"name": "save_note", "arguments": {"title": ..., "text": ...}}.\n\nNote:\n'
        + NOTES,
    },
    "prose": {
        "story": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "explain": "Explain how vaccines train the immune system, for a curious twelve-year-old.",
    },
}


def run(binary, model, prompt_file, mode, max_tokens, extra):
    cmd = [binary, "run", "-m", model, "--chat", "--prompt-file", prompt_file, "--temperature", "0",
           "-n", str(max_tokens), "--json", "--speculative", mode] + extra
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--binary", default=os.path.join(ROOT, "target", "release", "pyramid"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=400)
    ap.add_argument("--out", help="write the results here as JSON")
    ap.add_argument("extra", nargs="*", help="more `pyramid run` flags (after --)")
    args = ap.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind, prompts in PROMPTS.items():
            for name, text in prompts.items():
                path = os.path.join(tmp, name + ".txt")
                with open(path, "w") as f:
                    f.write(text)
                rates = {"off": [], "ngram": []}
                tokens = {}
                spec = None
                for rep in range(args.reps):
                    # Alternate the order so drift on a shared machine hits both modes.
                    order = ["off", "ngram"] if rep % 2 == 0 else ["ngram", "off"]
                    for mode in order:
                        d = run(args.binary, args.model, path, mode, args.max_tokens, args.extra)
                        rates[mode].append(d["timings"]["decode_tok_s"])
                        tokens.setdefault(mode, d["tokens"])
                        if mode == "ngram":
                            spec = d["speculative"]
                same = tokens["off"] == tokens["ngram"]
                off, on = statistics.median(rates["off"]), statistics.median(rates["ngram"])
                row = {
                    "kind": kind,
                    "prompt": name,
                    "n_tokens": len(tokens["ngram"]),
                    "off_tok_s": rates["off"],
                    "ngram_tok_s": rates["ngram"],
                    "ratio": on / off if off else None,
                    "same_tokens": same,
                    "acceptance_rate": spec["acceptance_rate"],
                    "tokens_per_pass": spec["tokens_per_pass"],
                    "drafted_tokens": spec["drafted_tokens"],
                    "accepted_tokens": spec["accepted_tokens"],
                }
                rows.append(row)
                print(f"| {args.model} | {kind} | {name} | {row['n_tokens']} | {off:.1f} | {on:.1f} | "
                      f"{row['ratio']:.2f}x | {spec['acceptance_rate']:.2f} | {spec['tokens_per_pass']:.2f} | "
                      f"{'same' if same else 'DIFFERENT'} |", flush=True)
                if not same:
                    print("speculative tokens differ from plain tokens", file=sys.stderr)
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    isa = [x for x in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16") if x in flags]
    result = {
        "model": args.model,
        "reps": args.reps,
        "max_tokens": args.max_tokens,
        "host": {"machine": platform.machine(), "cpus": os.cpu_count(), "isa": isa},
        "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip(),
        "rows": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
    if not all(r["same_tokens"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
