#!/usr/bin/env python3
"""Collects the outputs of one bench-peers.sh run into a results JSON file and
prints a markdown table: tok/s (mean ± sd over repetitions) per model, test and
engine, and the ratios of pyramid's mean to each peer's mean.

Called by bench-peers.sh; it can also re-render an existing results file:
    python3 scripts/peers/compare.py --render benchmarks/peers-<date>.json
"""

import argparse
import datetime as dt
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import sys

ENGINES = ["pyramid", "pyramid-ov", "llama-own", "llama-q8_0", "ov-genai"]
# (numerator, denominator, column): a ratio of means. Ratios of native pyramid are keyed
# by the peer alone in the results file, the others by "numerator/peer".
RATIOS = [("pyramid", "llama-q8_0", "pyramid / llama.cpp Q8_0"),
          ("pyramid", "llama-own", "pyramid / llama.cpp own quant"),
          ("pyramid", "ov-genai", "pyramid / OV GenAI"),
          ("pyramid-ov", "ov-genai", "pyramid ov:CPU / OV GenAI")]


def ratio_key(num, peer):
    return peer if num == "pyramid" else f"{num}/{peer}"
ISA_FLAGS = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16"]


def sh(cmd, cwd=None):
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def mean_sd(xs):
    if not xs:
        return None, None
    m = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return m, sd


# ------------------------------------------------------------- fingerprint --

def machine_fingerprint(loadavg_start):
    cpuinfo = read("/proc/cpuinfo")
    model = re.search(r"^model name\s*:\s*(.*)$", cpuinfo, re.M)
    ident = {k: (m.group(1).strip() if m else None) for k, m in (
        (k, re.search(r"^" + k + r"\s*:\s*(.*)$", cpuinfo, re.M))
        for k in ("vendor_id", "cpu family", "model", "stepping", "cache size"))}
    flags_line = re.search(r"^flags\s*:\s*(.*)$", cpuinfo, re.M)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    physical = {(m.group(1), m.group(2)) for m in re.finditer(
        r"physical id\s*:\s*(\d+).*?core id\s*:\s*(\d+)", cpuinfo, re.S)}
    meminfo = read("/proc/meminfo")
    mem = re.search(r"^MemTotal:\s*(\d+)\s*kB", meminfo, re.M)
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:
        affinity = None
    return {
        "cpu_model": model.group(1).strip() if model else platform.processor(),
        "cpu_id": ident,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": affinity,
        "physical_cores": len(physical) or None,
        "mem_total_gib": round(int(mem.group(1)) / 1024 / 1024, 2) if mem else None,
        "isa": {f: (f in flags) for f in ISA_FLAGS},
        "kernel": platform.release(),
        "os": sh(["sh", "-c", ". /etc/os-release 2>/dev/null && echo \"$PRETTY_NAME\""]),
        "governor": read("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").strip() or None,
        "loadavg_start": loadavg_start,
        "loadavg_end": read("/proc/loadavg").strip(),
    }


def pyramid_version(repo, binary):
    info = {"binary": binary}
    if binary and os.path.isfile(binary):
        h = hashlib.sha256()
        with open(binary, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        info["binary_sha256"] = h.hexdigest()
        info["binary_mtime"] = dt.datetime.fromtimestamp(
            os.path.getmtime(binary), dt.timezone.utc).isoformat(timespec="seconds")
        info["version"] = sh([binary, "--version"])
    info["git_commit"] = sh(["git", "rev-parse", "HEAD"], cwd=repo)
    info["git_describe"] = sh(["git", "describe", "--always", "--dirty"], cwd=repo)
    return info


def ov_versions(python):
    if not python:
        return None
    out = sh([python, "-c", "import json, openvino, openvino_genai; "
              "print(json.dumps({'openvino_genai': openvino_genai.__version__, "
              "'openvino': openvino.__version__}))"])
    try:
        return json.loads(out)
    except ValueError:
        return {"error": "could not import openvino_genai"}


# ----------------------------------------------------------------- parsing --

def int_list(text):
    return [int(v) for v in str(text).split(",") if v.strip()]


def test_name(n_prompt, n_gen):
    if n_prompt and n_gen:
        return f"pp{n_prompt}+tg{n_gen}"
    return f"pp{n_prompt}" if n_prompt else f"tg{n_gen}"


def parse_run(run):
    """Returns (records, error) for one engine invocation."""
    text = read(run["stdout"])
    data = None
    try:
        data = json.loads(text) if text.strip() else None
    except ValueError:
        data = None
    if isinstance(data, dict) and "error" in data:
        return [], str(data["error"])
    if run["status"] != "ok" or not isinstance(data, list):
        lines = [ln.strip() for ln in read(run["stderr"]).splitlines() if ln.strip()]
        reason = lines[-1] if lines else ("no JSON output" if run["status"] == "ok" else "exited with an error")
        return [], reason[:300]
    records = []
    for rec in data:
        n_prompt = int(rec.get("n_prompt", 0) or 0)
        n_gen = int(rec.get("n_gen", 0) or 0)
        records.append({
            # built from the lengths: engines spell depth and batch differently
            "test": test_name(n_prompt, n_gen),
            "n_prompt": n_prompt,
            "n_gen": n_gen,
            "n_depth": int(rec.get("n_depth", 0) or 0),
            "samples_ts": [float(x) for x in rec.get("samples_ts", [])],
            "raw": rec,
        })
    return records, None


def own_quant_label(path):
    m = re.search(r"[-_.](i?q\d[a-z0-9_]*|f16|bf16|f32)\.gguf$", os.path.basename(path), re.I)
    return m.group(1).upper() if m else "own"


# --------------------------------------------------------------- summarise --

def summarise(results):
    runs = results["runs"]
    order_models = [m["key"] for m in results["models"]]
    engines = [e for e in ENGINES if any(r["engine"] == e for r in runs)]
    samples, errors, tests = {}, {}, {}
    for run in runs:
        key = (run["model"], run["engine"])
        if run.get("error"):
            errors.setdefault(key, run["error"])
        for rec in run.get("records", []):
            label = rec["test"] + (f" @ d{rec['n_depth']}" if rec["n_depth"] else "")
            order = (0 if rec["n_prompt"] and not rec["n_gen"] else 1, rec["n_prompt"], rec["n_gen"])
            tests.setdefault(run["model"], {})[label] = order
            samples.setdefault((run["model"], label, run["engine"]), []).extend(rec["samples_ts"])
    summary = []
    for model in order_models:
        for label in sorted(tests.get(model, {}), key=lambda t: tests[model][t]):
            row = {"model": model, "test": label, "engines": {}, "ratios": {}}
            for eng in engines:
                xs = samples.get((model, label, eng), [])
                m, sd = mean_sd(xs)
                cell = {"mean_ts": m, "sd_ts": sd, "n": len(xs)}
                if not xs:
                    cell["error"] = errors.get((model, eng), "no result")
                row["engines"][eng] = cell
            for num, peer, _ in RATIOS:
                ours = row["engines"].get(num, {}).get("mean_ts")
                other = row["engines"].get(peer, {}).get("mean_ts")
                if ours and other:
                    row["ratios"][ratio_key(num, peer)] = ours / other
            summary.append(row)
        if model not in tests:
            # every engine failed on this model: still show why
            row = {"model": model, "test": "-", "engines": {}, "ratios": {}}
            for eng in engines:
                row["engines"][eng] = {"mean_ts": None, "sd_ts": None, "n": 0,
                                       "error": errors.get((model, eng), "no result")}
            summary.append(row)
    return engines, summary


def fmt_cell(cell, notes):
    """A tok/s cell; a failure becomes "failed [k]" with its reason in notes[k-1]."""
    if cell.get("mean_ts") is None:
        reason = " ".join(cell.get("error", "no result").split())
        if reason not in notes:
            notes.append(reason)
        return f"failed [{notes.index(reason) + 1}]"
    return f"{cell['mean_ts']:.1f} ± {cell['sd_ts']:.1f}"


def render(results):
    engines, summary = summarise(results)
    settings = results["settings"]
    quant = {m["key"]: own_quant_label(m["path"]) for m in results["models"]}
    heads = {
        "pyramid": f"pyramid {settings.get('precision', '')}".strip(),
        "pyramid-ov": f"pyramid ov:CPU {settings.get('precision', '')}".strip(),
        "llama-own": "llama.cpp own quant",
        "llama-q8_0": "llama.cpp Q8_0",
        "ov-genai": "OV GenAI" + (" (Q8_0 file)" if settings.get("ov_file") == "q8_0" else ""),
    }
    cols = ["model", "test"] + [heads[e] + " tok/s" for e in engines]
    ratio_cols = [(ratio_key(num, peer), title) for num, peer, title in RATIOS
                  if num in engines and peer in engines]
    cols += [title for _, title in ratio_cols]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * (len(cols) - 2)) + "|"]
    notes = []
    for row in summary:
        cells = [f"{row['model']} ({quant.get(row['model'], 'own')})", row["test"]]
        cells += [fmt_cell(row["engines"][e], notes) for e in engines]
        for peer, _ in ratio_cols:
            r = row["ratios"].get(peer)
            cells.append(f"{r:.2f}×" if r else "—")
        lines.append("| " + " | ".join(cells) + " |")
    m = results.get("machine", {})
    note = (f"\n{m.get('cpu_model', '?')}, {settings['threads']} threads, "
            f"{settings['repetitions']} repetition(s) alternating engines; "
            f"tok/s mean ± sd; ratios are ratios of means.")
    if notes:
        note += "\n\nFailures:\n" + "\n".join(f"- [{k}] {r}" for k, r in enumerate(notes, 1))
    return engines, summary, "\n".join(lines) + "\n" + note


# -------------------------------------------------------------------- main --

def build(args):
    runs = []
    with open(args.manifest, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                runs.append(json.loads(line))
    llama_meta = None
    for run in runs:
        records, error = parse_run(run)
        run["records"] = records
        run["error"] = error
        run["stdout_text"] = read(run["stdout"])[-20000:]
        run["stderr_tail"] = "\n".join(read(run["stderr"]).splitlines()[-40:])
        if run["engine"].startswith("llama") and records and llama_meta is None:
            raw = records[0]["raw"]
            llama_meta = {k: raw.get(k) for k in ("build_commit", "build_number", "cpu_info", "backends")}
    with open(args.models, encoding="utf-8") as f:
        models = json.load(f)
    for m in models:
        m["own_quant"] = own_quant_label(m["path"])

    llama = None
    if args.llama_dir:
        llama = {
            "source": f"llama-cpp-python {args.llama_cpp_python} sdist (vendor/llama.cpp)",
            "llama_cpp_python_version": args.llama_cpp_python,
            "llama_cpp_commit": args.llama_commit or None,
            "dir": args.llama_dir,
        }
        try:
            with open(os.path.join(args.llama_dir, "build-info.json"), encoding="utf-8") as f:
                llama["build_info"] = json.load(f)
        except (OSError, ValueError):
            pass
        if llama_meta:
            llama["llama_bench_reports"] = llama_meta

    results = {
        "schema": "pyramid-peers/1",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "started": args.start,
        "finished": args.end,
        "invocation": args.invocation,
        "settings": {
            "threads": args.threads, "n_prompt": int_list(args.n_prompt), "n_gen": int_list(args.n_gen),
            "n_depth": args.n_depth, "repetitions": args.repetitions,
            "precision": args.precision, "kv": args.kv, "ov_file": args.ov_file,
        },
        "machine": machine_fingerprint(args.loadavg_start),
        "versions": {
            "pyramid": pyramid_version(args.repo, args.pyramid_bin),
            "llama.cpp": llama,
            "openvino_genai": ov_versions(args.ov_python),
        },
        "models": models,
        "commands": [{"rep": r["rep"], "model": r["model"], "engine": r["engine"], "cmd": r["cmd"]} for r in runs],
        "runs": runs,
    }
    _, summary, table = render(results)
    results["summary"] = summary
    results["table_markdown"] = table
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    os.replace(tmp, args.out)
    print(table)
    print(f"\nraw results: {args.out}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--render", metavar="RESULTS_JSON", help="print the table of an existing results file")
    ap.add_argument("--manifest")
    ap.add_argument("--models")
    ap.add_argument("--out")
    ap.add_argument("--repo", default=".")
    ap.add_argument("--pyramid-bin", default="")
    ap.add_argument("--llama-dir", default="")
    ap.add_argument("--llama-cpp-python", default="")
    ap.add_argument("--llama-commit", default="")
    ap.add_argument("--ov-python", default="")
    ap.add_argument("--ov-file", default="own")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("-p", dest="n_prompt", default="")
    ap.add_argument("-n", dest="n_gen", default="")
    ap.add_argument("-d", dest="n_depth", type=int, default=0)
    ap.add_argument("-r", dest="repetitions", type=int, default=0)
    ap.add_argument("--precision", default="")
    ap.add_argument("--kv", default="")
    ap.add_argument("--start", default="")
    ap.add_argument("--end", default="")
    ap.add_argument("--loadavg-start", default="")
    ap.add_argument("--invocation", default="")
    args = ap.parse_args()
    if args.render:
        with open(args.render, encoding="utf-8") as f:
            print(render(json.load(f))[2])
        return
    missing = [name for name in ("manifest", "models", "out") if not getattr(args, name)]
    if missing:
        ap.error("--" + ", --".join(missing) + " required (or use --render)")
    build(args)


if __name__ == "__main__":
    main()
