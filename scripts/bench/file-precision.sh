#!/usr/bin/env bash
# GGUF files at their own precision, side by side in one run: for each file, ROUNDS
# alternating rounds of (read bandwidth, llama-bench, pyramid --precision file), then the
# whole process's wall time and peak RSS for a load and one token, warm (file in the page
# cache) and cold (its pages evicted with posix_fadvise), for both engines. The bound is
# the bandwidth over the file's size: what a dense model's step reads (an untied embedding
# table is not read whole, so it is a little low there; an MoE step reads only its active
# experts, so there it says nothing).
#
# Usage: scripts/bench/file-precision.sh [--rounds N] [--threads T] [-p N] [-n N] FILE...
# Files: e.g. the real-shape ones scripts/bench/real-shapes.sh writes under
# ${PYRAMID_HOME:-~/.cache/pyramid}/real-shapes. Needs llama.cpp's binaries
# (scripts/peers/bench-peers.sh --build-only) and a release build of pyramid.
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HOME_DIR="${PYRAMID_HOME:-$HOME/.cache/pyramid}"
LLAMA_BIN="${LLAMA_BIN:-$(ls -d "$HOME_DIR"/peers/llama.cpp-*/bin 2>/dev/null | tail -1)}"
PYRAMID_BIN="${PYRAMID_BIN:-$REPO_ROOT/target/release/pyramid}"
ROUNDS=2 THREADS=2 N_PROMPT=512 N_GEN=128
FILES=()
while [ $# -gt 0 ]; do
    case "$1" in
        --rounds) ROUNDS="$2"; shift 2 ;;
        --threads) THREADS="$2"; shift 2 ;;
        -p) N_PROMPT="$2"; shift 2 ;;
        -n) N_GEN="$2"; shift 2 ;;
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        *) FILES+=("$1"); shift ;;
    esac
done
[ ${#FILES[@]} -gt 0 ] || { echo "give one or more GGUF files" >&2; exit 2; }
[ -x "$LLAMA_BIN/llama-bench" ] || { echo "no llama-bench under '$LLAMA_BIN'" >&2; exit 2; }
[ -x "$PYRAMID_BIN" ] || { echo "no pyramid at $PYRAMID_BIN (cargo build --release)" >&2; exit 2; }
(cd "$REPO_ROOT" && cargo build --release -q -p pyramid-bench --example read_bandwidth)
BANDWIDTH="$REPO_ROOT/target/release/examples/read_bandwidth"

bandwidth() { "$BANDWIDTH" "$THREADS" 1024 3 | awk '{print $1}'; }
evict() { python3 -c 'import os,sys; fd=os.open(sys.argv[1], os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)' "$1"; }
# Wall seconds and peak RSS (MiB) of one process.
measure() {
    /usr/bin/time -f '%e %M' -o /tmp/file-precision.time "$@" > /dev/null 2>&1 || { echo "failed: $*" >&2; echo "- -"; return; }
    awk '{printf "%s %.0f\n", $1, $2 / 1024}' /tmp/file-precision.time
}
llama_tps() { # prints "pp tg" tokens/s
    "$LLAMA_BIN/llama-bench" -m "$1" -t "$THREADS" -p "$N_PROMPT" -n "$N_GEN" -r 2 -o csv 2>/dev/null \
        | awk -F, 'NR==1{for(i=1;i<=NF;i++){gsub(/"/,"",$i); c[$i]=i}} NR>1{gsub(/"/,""); if ($c["n_gen"]==0) pp=$c["avg_ts"]; else tg=$c["avg_ts"]} END{print pp, tg}'
}
pyramid_tps() {
    "$PYRAMID_BIN" bench -m "$1" --precision file -t "$THREADS" -p "$N_PROMPT" -n "$N_GEN" -r 2 --json 2>/dev/null \
        | python3 -c 'import json,sys
rows=json.load(sys.stdin)
get=lambda k: next((r["avg_ts"] for r in rows if r["test"].startswith(k)), "-")
print(get("pp"), get("tg"))'
}

echo "| file | round | bandwidth GB/s | llama pp$N_PROMPT | llama tg$N_GEN | pyramid pp$N_PROMPT | pyramid tg$N_GEN | pp ratio | tg ratio | pyramid tg % of file-bytes bound |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for f in "${FILES[@]}"; do
    bytes=$(stat -c %s "$f")
    for r in $(seq 1 "$ROUNDS"); do
        bw=$(bandwidth)
        read -r lpp ltg < <(llama_tps "$f")
        read -r ppp ptg < <(pyramid_tps "$f")
        bw2=$(bandwidth)
        python3 - "$f" "$r" "$bw" "$bw2" "$lpp" "$ltg" "$ppp" "$ptg" "$bytes" <<'EOF'
import os, sys
f, r, bw, bw2, lpp, ltg, ppp, ptg, size = sys.argv[1:]
num = lambda s: float(s) if s not in ("-", "") else float("nan")
bw_mean = (num(bw) + num(bw2)) / 2
bound = bw_mean * 1e9 / float(size)  # tokens/s if a step read the file's bytes once
print(f"| {os.path.basename(f)} | {r} | {bw}–{bw2} | {num(lpp):.1f} | {num(ltg):.2f} | {num(ppp):.1f} | {num(ptg):.2f} "
      f"| {num(ppp)/num(lpp):.2f}× | {num(ptg)/num(ltg):.2f}× | {100*num(ptg)/bound:.0f} % |")
EOF
    done
done
echo
echo "| file | engine | warm load + 1 token (s) | warm peak RSS (MiB) | cold load + 1 token (s) | cold peak RSS (MiB) |"
echo "|---|---|---|---|---|---|"
for f in "${FILES[@]}"; do
    for engine in llama pyramid; do
        if [ $engine = llama ]; then
            cmd=("$LLAMA_BIN/llama-bench" -m "$f" -t "$THREADS" -p 0 -n 1 -r 1)
        else
            cmd=("$PYRAMID_BIN" bench -m "$f" --precision file -t "$THREADS" -p 1 -n 1 -r 1)
        fi
        cat "$f" > /dev/null
        read -r warm_s warm_rss < <(measure "${cmd[@]}")
        evict "$f"
        read -r cold_s cold_rss < <(measure "${cmd[@]}")
        echo "| $(basename "$f") | $engine | $warm_s | $warm_rss | $cold_s | $cold_rss |"
    done
done
