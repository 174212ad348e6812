#!/usr/bin/env python3
"""Writes the headline table at the top of docs/BENCHMARKS.md from the latest records.

The table is every side-by-side peer comparison in benchmarks/latest.json (what
`scripts/peers/bench-peers.sh` merges there): model, test, precision, each engine's
tokens per second, pyramid's ratio to each peer, the host's ISA and the commit
measured. It replaces what lies between the two marker lines; the dated notebook
below them is left alone.

    scripts/bench-headline.py          # rewrite the table
    scripts/bench-headline.py --check  # fail if the table is not what the records give
"""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "latest.json"
DOC = ROOT / "docs" / "BENCHMARKS.md"
START = "<!-- headline: written by scripts/bench-headline.py from benchmarks/latest.json -->"
END = "<!-- headline end -->"


def table(records):
    peers = records.get("peers", [])
    engines = sorted({e["engine"] for p in peers for e in p["engines"]} - {"pyramid"})
    head = ["model", "test", "precision", "pyramid t/s"]
    head += [f"{e} t/s" for e in engines] + [f"pyramid / {e}" for e in engines]
    head += ["host ISA", "commit"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in sorted(peers, key=lambda p: (p["model"], p["test"], p["precision"])):
        by = {e["engine"]: e for e in p["engines"] if e.get("error") is None}
        ours = by.get("pyramid", {}).get("mean_ts")
        cells = [p["model"], p["test"], p["precision"], fmt(ours)]
        cells += [fmt(by.get(e, {}).get("mean_ts")) for e in engines]
        for e in engines:
            theirs = by.get(e, {}).get("mean_ts")
            cells.append(f"{ours / theirs:.2f}x" if ours and theirs else "—")
        provenance = p.get("provenance", {})
        cells.append(provenance.get("machine", {}).get("isa", "—"))
        cells.append(provenance.get("commit", "—")[:10])
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def fmt(value):
    return f"{value:,.1f}" if value else "—"


def main():
    records = json.loads(RECORDS.read_text())
    doc = DOC.read_text()
    block = (
        f"{START}\n\n## Headline figures\n\n"
        "Side by side in one run on one host, from `benchmarks/latest.json` (mean tokens per "
        "second; `—`: not measured or failed). The dated notebook below has how each was run.\n\n"
        f"{table(records)}\n\n{END}"
    )
    if START in doc:
        before, rest = doc.split(START, 1)
        _, after = rest.split(END, 1)
        updated = before + block + after
    else:
        title, body = doc.split("\n", 1)
        updated = f"{title}\n\n{block}\n{body}"
    if "--check" in sys.argv:
        if updated != doc:
            sys.exit("docs/BENCHMARKS.md's headline table is stale: run scripts/bench-headline.py")
        return
    DOC.write_text(updated)


if __name__ == "__main__":
    main()
