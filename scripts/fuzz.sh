#!/usr/bin/env bash
# Coverage-guided fuzzing (cargo-fuzz / libFuzzer) of the parsers that read untrusted input.
#
#   scripts/fuzz.sh [seconds-per-target] [target...]
#
# Builds every target in fuzz/ once, then runs each for the given time (default 20 s, for
# CI), one after the other, and prints executions, executions per second and failures per
# target. Exits non-zero if any target crashed, timed out on an input or ran out of memory;
# the failing input is in fuzz/artifacts/<target>/ and the log in fuzz/logs/<target>.log.
# Reproduce one with: fuzz/target/<host>/release/<target> fuzz/artifacts/<target>/<file>
#
# The corpus grows in fuzz/corpus/<target>/ (git-ignored); the committed seeds in
# fuzz/seeds/<target>/ are read at every start. Environment:
#   FUZZ_SANITIZER   none (default; the targets reach almost no unsafe code, and it runs
#                    about twice as fast) or address
#   FUZZ_RUNS        also stop a target after this many executions (libFuzzer -runs)
#   FUZZ_ARGS        extra libFuzzer flags for every target
#   FUZZ_SKIP_KNOWN  1: let targets skip inputs of known, reported bugs (see each target)
#   CARGO_BUILD_JOBS parallel build jobs (default 1)
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"

ALL_TARGETS=(gguf_reader tokenizer_roundtrip chat_template openai_request replay_trace tool_calls)
seconds="${1:-20}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")
sanitizer="${FUZZ_SANITIZER:-none}"

# Largest input per target: a GGUF header with a small vocabulary is a few KB; the rest are
# text, where longer inputs mostly repeat what shorter ones reach.
max_len() {
    case "$1" in
        gguf_reader) echo 16384 ;;
        chat_template) echo 8192 ;;
        *) echo 4096 ;;
    esac
}

# cargo-fuzz's coverage flags are nightly-only; without a nightly toolchain, stable takes
# them under RUSTC_BOOTSTRAP (no sanitizer needs nightly's runtime then).
toolchain=()
if cargo +nightly --version >/dev/null 2>&1; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

echo "== building fuzz targets (sanitizer: $sanitizer)"
build_start=$(date +%s)
cargo "${toolchain[@]}" fuzz build --release --debug-assertions --sanitizer "$sanitizer"
echo "built in $(( $(date +%s) - build_start )) s"
host=$(rustc "${toolchain[@]}" -vV | sed -n 's/^host: //p')
bin_dir="fuzz/target/$host/release"

mkdir -p fuzz/logs
failed=0
summary=()
for target in "${targets[@]}"; do
    corpus="fuzz/corpus/$target"
    artifacts="fuzz/artifacts/$target"
    log="fuzz/logs/$target.log"
    mkdir -p "$corpus" "$artifacts"
    n_before=$(find "$artifacts" -type f | wc -l)
    args=(
        -max_total_time="$seconds"
        -timeout=10
        -rss_limit_mb=2048
        -max_len="$(max_len "$target")"
        -dict="fuzz/dicts/$target.dict"
        -artifact_prefix="$artifacts/"
        -print_final_stats=1
    )
    [ -z "${FUZZ_RUNS:-}" ] || args+=(-runs="$FUZZ_RUNS")
    # shellcheck disable=SC2206 # FUZZ_ARGS is a list of flags
    [ -z "${FUZZ_ARGS:-}" ] || args+=($FUZZ_ARGS)
    echo "== $target for ${seconds} s"
    rc=0
    "$bin_dir/$target" "${args[@]}" "$corpus" "fuzz/seeds/$target" >"$log" 2>&1 || rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    # A crash can cut the final stats short: fall back to the last `#N` status line.
    [ -n "$execs" ] || execs=$(grep -oE '^#[0-9]+' "$log" | tail -1 | tr -d '#')
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$log" | tail -1)
    n_corpus=$(find "$corpus" -type f | wc -l)
    n_new=$(( $(find "$artifacts" -type f | wc -l) - n_before ))
    status=ok
    if [ "$rc" -ne 0 ] || [ "$n_new" -gt 0 ]; then
        status="FAILED (exit $rc, $n_new new artifact(s) in $artifacts, log $log)"
        failed=1
        grep -E '^(==[0-9]+== ERROR|thread .* panicked|SUMMARY|artifact_prefix|Test unit written)' "$log" | head -8 || true
    fi
    line=$(printf '%-20s %12s execs %8s exec/s %6s MB peak %6s corpus  %s' \
        "$target" "${execs:-?}" "${rate:-?}" "${rss:-?}" "$n_corpus" "$status")
    echo "$line"
    summary+=("$line")
done

echo "== summary ($seconds s per target, sanitizer $sanitizer, $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
printf '%s\n' "${summary[@]}"
exit "$failed"
