#!/usr/bin/env bash
# Writes testdata/gguf-quants/tiny-qwen2-<ftype>.gguf: one tiny random-weight Qwen2,
# converted to F32 by llama.cpp's convert_hf_to_gguf.py and quantised by llama.cpp's
# llama-quantize to each ftype below; then types.json (every tensor's type, read back with
# gguf-py). See README.md.
#
# Usage, from anywhere:
#   testdata/gguf-quants/make.sh
# Environment:
#   PYTHON     a Python with torch, transformers 5 and llama.cpp's gguf-py
#              [default: /tmp/hfvenv/bin/python, else python3]
#   LLAMA_CPP  the llama.cpp peer that scripts/peers/bench-peers.sh builds (bin/ and src/)
#              [default: ${PYRAMID_HOME:-~/.cache/pyramid}/peers/llama.cpp-0.3.36]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
LLAMA_CPP="${LLAMA_CPP:-${PYRAMID_HOME:-$HOME/.cache/pyramid}/peers/llama.cpp-0.3.36}"
if [[ -z "${PYTHON:-}" ]]; then
    if [[ -x /tmp/hfvenv/bin/python ]]; then PYTHON=/tmp/hfvenv/bin/python; else PYTHON=python3; fi
fi
QUANTIZE="$LLAMA_CPP/bin/llama-quantize"
[[ -x "$QUANTIZE" ]] || { echo "no llama-quantize at $QUANTIZE (run scripts/peers/bench-peers.sh --build-only)" >&2; exit 1; }

FTYPES=(Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K_S Q4_K_S Q4_K_M Q5_K_S Q6_K IQ4_NL IQ4_XS)

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" "$HERE/make.py" source "$WORK" "$LLAMA_CPP/src"

rm -f "$HERE"/tiny-qwen2-*.gguf
for ftype in "${FTYPES[@]}"; do
    out="$HERE/tiny-qwen2-${ftype,,}.gguf"
    # One thread: the quantised bytes do not depend on it, but the log's order does.
    "$QUANTIZE" "$WORK/tiny-qwen2-f32.gguf" "$out" "$ftype" 1 >"$WORK/$ftype.log" 2>&1 \
        || { cat "$WORK/$ftype.log" >&2; exit 1; }
    grep -E "falling back|fallback" "$WORK/$ftype.log" | sed "s/^/$ftype: /" || true
done

"$PYTHON" "$HERE/make.py" types "$HERE"
