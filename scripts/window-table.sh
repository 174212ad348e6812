#!/usr/bin/env bash
# Decode cost against the compiled window at equal live context: the measurement that
# motivates the window pyramid. For each device and window, `pyramid bench` fills
# DEPTH positions (untimed), then times GEN decode steps on artifacts of that window.
#
#   scripts/window-table.sh MODEL PRECISION [DEVICES] [WINDOWS]  > results.jsonl
#
# e.g. scripts/window-table.sh smollm2-135m f32 "cpu ov:CPU" "1024 2048 4096 8192"
set -euo pipefail
cd "$(dirname "$0")/.."
model="$1"
precision="$2"
devices="${3:-cpu ov:CPU}"
windows="${4:-1024 2048 4096 8192}"
depth="${DEPTH:-512}"
gen="${GEN:-32}"
reps="${REPS:-3}"
bin=./target/release/pyramid
[ -x "$bin" ] || cargo build --release -p pyramid-cli >&2
for w in $windows; do
    for d in $devices; do
        echo "window $w on $d" >&2
        "$bin" bench -m "$model" --precision "$precision" --device "$d" --window "$w" \
            -p 0 -n "$gen" -d "$depth" -r "$reps" --json | python3 -c '
import json, sys
for r in json.load(sys.stdin):
    print(json.dumps(r))'
    done
done
