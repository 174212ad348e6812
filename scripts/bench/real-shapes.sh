#!/usr/bin/env bash
# Random-weight GGUF files with the shapes of published models, for side-by-side speed
# runs (issue 53): for each SHAPE, under ${PYRAMID_HOME:-~/.cache/pyramid}/real-shapes/,
#   SHAPE-q8_0.gguf    written by scripts/bench/real-shape-gguf.py (tokenizer and chat
#                      template from a real Qwen2.5 GGUF, random Q8_0 weights)
#   SHAPE-q4_k_m.gguf  llama.cpp's llama-quantize --allow-requantize of it to Q4_K_M
# Files that exist are kept. A file is written as NAME.part and renamed when complete.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HOME_DIR="${PYRAMID_HOME:-$HOME/.cache/pyramid}"
OUT_DIR="$HOME_DIR/real-shapes"
LLAMA_CPP="${LLAMA_CPP:-$HOME_DIR/peers/llama.cpp-0.3.36}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x "$HOME_DIR/test-venv/bin/python" ]]; then PYTHON="$HOME_DIR/test-venv/bin/python"; else PYTHON=python3; fi
fi
LAYERS=""
MIN_FREE_GB=8
CHECK=0
Q8_ONLY=0
SHAPES=()

usage() {
    cat <<EOF
Usage: scripts/bench/real-shapes.sh [options] [SHAPE ...]

SHAPE: qwen2.5-1.5b (default), qwen2.5-7b, qwen3-30b-a3b. Writes SHAPE-q8_0.gguf and
SHAPE-q4_k_m.gguf under $OUT_DIR, keeping files that exist.

Options:
  --layers N        only the first N layers (files named SHAPE-Nl-*.gguf), to try a big
                    shape quickly
  --q8-only         do not make the Q4_K_M file
  --min-free-gb G   refuse to start a file that would leave less than G GB free on the
                    output's disk [default: $MIN_FREE_GB]
  --check           run llama-bench -p 64 -n 16 -t 2 -r 1 on each file (does it load?)
  -h, --help        this text

Environment: PYTHON (numpy and gguf-py) [$PYTHON], LLAMA_CPP (bin/llama-quantize,
bin/llama-bench) [$LLAMA_CPP], PYRAMID_HOME.
Sizes: qwen2.5-1.5b 1.6 + 1.0 GB, qwen2.5-7b 8.1 + 4.7 GB, qwen3-30b-a3b 32.5 + ~18.5 GB
(Q8_0 + Q4_K_M).
EOF
}

while [[ $# -gt 0 ]]; do
    case "$1" in
        --layers) LAYERS="$2"; shift 2 ;;
        --q8-only) Q8_ONLY=1; shift ;;
        --min-free-gb) MIN_FREE_GB="$2"; shift 2 ;;
        --check) CHECK=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "unknown option $1" >&2; usage >&2; exit 2 ;;
        *) SHAPES+=("$1"); shift ;;
    esac
done
[[ ${#SHAPES[@]} -gt 0 ]] || SHAPES=(qwen2.5-1.5b)

QUANTIZE="$LLAMA_CPP/bin/llama-quantize"
BENCH="$LLAMA_CPP/bin/llama-bench"
[[ -x "$QUANTIZE" ]] || { echo "no llama-quantize at $QUANTIZE (scripts/peers/bench-peers.sh --build-only builds it)" >&2; exit 1; }
mkdir -p "$OUT_DIR"

# Refuses a file of about $1 bytes that would leave less than MIN_FREE_GB free.
room_for() {
    local need=$1 free
    free=$(( $(df -Pk "$OUT_DIR" | awk 'NR==2 {print $4}') * 1024 ))
    if (( free - need < MIN_FREE_GB * 1000000000 )); then
        echo "not enough disk: $((need / 1000000)) MB wanted, $((free / 1000000)) MB free," \
             "at least ${MIN_FREE_GB} GB to be left (--min-free-gb)" >&2
        return 1
    fi
}

check() {
    [[ $CHECK == 1 ]] || return 0
    echo "== llama-bench $(basename "$1")"
    "$BENCH" -m "$1" -p 64 -n 16 -t 2 -r 1 2>/dev/null | grep -E '^\| (model|[a-z0-9])'
}

layer_args=()
suffix=""
if [[ -n "$LAYERS" ]]; then
    layer_args=(--layers "$LAYERS")
    suffix="-${LAYERS}l"
fi

for shape in "${SHAPES[@]}"; do
    q8="$OUT_DIR/$shape$suffix-q8_0.gguf"
    q4="$OUT_DIR/$shape$suffix-q4_k_m.gguf"
    if [[ -f "$q8" ]]; then
        echo "kept $q8"
    else
        bytes=$("$PYTHON" "$SCRIPT_DIR/real-shape-gguf.py" "$shape" "$q8" "${layer_args[@]}" --size)
        room_for "$bytes"
        "$PYTHON" "$SCRIPT_DIR/real-shape-gguf.py" "$shape" "$q8" "${layer_args[@]}"
    fi
    check "$q8"
    [[ $Q8_ONLY == 1 ]] && continue
    if [[ -f "$q4" ]]; then
        echo "kept $q4"
    else
        # Q4_K_M is about 0.6 of Q8_0 (4.8 against 8.5 bits a weight, and Q6_K tensors)
        room_for $(( $(stat -c %s "$q8") * 6 / 10 ))
        start=$(date +%s)
        "$QUANTIZE" --allow-requantize "$q8" "$q4.part" Q4_K_M "$(nproc)" >"$q4.log" 2>&1 \
            || { tail -20 "$q4.log" >&2; rm -f "$q4.part"; exit 1; }
        mv "$q4.part" "$q4"
        echo "$q4: $(stat -c %s "$q4") bytes, quantised in $(( $(date +%s) - start )) s (log: $q4.log)"
    fi
    check "$q4"
done
ls -l "$OUT_DIR"
