#!/usr/bin/env bash
# Side-by-side throughput of pyramid, llama.cpp (llama-bench) and OpenVINO GenAI
# on the same GGUF files, the same thread count and the same prompt/generation
# lengths. See docs/BENCHMARKS.md for what is measured and how to read it.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SCRIPT_DIR/../.." && pwd)"

# ---------------------------------------------------------------- defaults ---
MODELS="smollm2-135m,qwen2.5-coder-0.5b"
THREADS=2
N_PROMPT=512
N_GEN=128
N_DEPTH=0
REPS=5
PRECISION=int8
KV=f32
SKIP_OV=0
SKIP_LLAMA=0
SKIP_PYRAMID=0
OV_ROUTE=0
BUILD_ONLY=0
OUT=""
# llama.cpp comes from the source vendored in this llama-cpp-python sdist.
# Pinned so that results stay comparable from run to run; override with
# --llama-cpp-python VERSION (or "latest").
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
OV_GENAI_SPEC="${OV_GENAI_SPEC:-openvino-genai}"
OV_FILE=own
LLAMA_ARGS=""
PYRAMID_BIN="${PYRAMID_BIN:-$REPO_ROOT/target/release/pyramid}"
PYRAMID_HOME_DIR="${PYRAMID_HOME:-$HOME/.cache/pyramid}"
PEERS_DIR="$PYRAMID_HOME_DIR/peers"
JOBS=2
ORIG_ARGS=("$@")

usage() {
    cat <<EOF
Usage: scripts/peers/bench-peers.sh [options]

Benchmarks prefill (pp) and decode (tg) throughput of pyramid against llama.cpp
and OpenVINO GenAI on the GGUF files the pyramid registry caches, alternating
the engines within each repetition, and prints a markdown table of tok/s
(mean ± sd) with the pyramid/peer ratios. Raw results go to a JSON file.

Options:
  --models LIST           Comma-separated known model names (smollm2-135m,
                          qwen2.5-coder-0.5b, gemma3-270m) or paths to GGUF files
                          [default: $MODELS]
  -t, --threads N         Threads for every engine [default: $THREADS]
  -p N[,N...]             Prompt lengths (pp tests); 0 skips [default: $N_PROMPT]
  -n N[,N...]             Tokens to generate (tg tests); 0 skips [default: $N_GEN]
  -d N                    Context already in the KV cache before each test
                          [default: $N_DEPTH]
  -r N                    Repetitions; each repetition runs every engine once
                          [default: $REPS]
  --precision P           pyramid weight precision (f32, int8, ...) [default: $PRECISION]
  --kv KV                 pyramid KV cache storage (f32, int8) [default: $KV]
  --skip-ov               Do not run OpenVINO GenAI
  --skip-llama            Do not run llama.cpp (and do not build it)
  --skip-pyramid          Do not run pyramid
  --ov-route              Also run pyramid on its OpenVINO route (--device ov:CPU,
                          --kv f32), for the ratio to OpenVINO GenAI on the same
                          plugin (needs scripts/setup-openvino.sh)
  --ov-file own|q8_0      GGUF file OpenVINO GenAI reads: the model's own
                          quantisation or the Q8_0 copy [default: $OV_FILE]
  --llama-args "ARGS"     Extra llama-bench arguments, split on spaces; e.g.
                          "--repack 0" where its AMX repacking crashes
  --out FILE              Raw results JSON [default: benchmarks/peers-<date>.json]
  --llama-cpp-python VER  llama-cpp-python sdist whose vendored llama.cpp is
                          built, or "latest" [default: $LLAMA_CPP_PYTHON_VERSION]
  --build-only            Install the tools, build llama.cpp, make the Q8_0
                          copies, then stop
  -h, --help              Show this help

Environment:
  PYRAMID_BIN    pyramid binary [default: target/release/pyramid]
  PYRAMID_HOME   pyramid cache; models are read from \$PYRAMID_HOME/models and
                 the peers' tools are cached in \$PYRAMID_HOME/peers
                 [default: ~/.cache/pyramid]
  OV_GENAI_SPEC  pip requirement for OpenVINO GenAI [default: openvino-genai]

Everything the script needs (cmake, ninja, openvino-genai, llama.cpp's
llama-bench and llama-quantize) is installed or built on first use under
$PEERS_DIR and reused afterwards.
EOF
}

die() { echo "bench-peers: error: $*" >&2; exit 1; }
log() { echo "bench-peers: $*" >&2; }

need_arg() { [[ $# -ge 2 && -n "$2" ]] || die "option $1 needs a value (see --help)"; }
is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_uint_list() { [[ "$1" =~ ^[0-9]+(,[0-9]+)*$ ]]; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --models) need_arg "$@"; MODELS="$2"; shift 2 ;;
        -t|--threads) need_arg "$@"; THREADS="$2"; shift 2 ;;
        -p) need_arg "$@"; N_PROMPT="$2"; shift 2 ;;
        -n) need_arg "$@"; N_GEN="$2"; shift 2 ;;
        -d) need_arg "$@"; N_DEPTH="$2"; shift 2 ;;
        -r) need_arg "$@"; REPS="$2"; shift 2 ;;
        --precision) need_arg "$@"; PRECISION="$2"; shift 2 ;;
        --kv) need_arg "$@"; KV="$2"; shift 2 ;;
        --skip-ov) SKIP_OV=1; shift ;;
        --skip-llama) SKIP_LLAMA=1; shift ;;
        --skip-pyramid) SKIP_PYRAMID=1; shift ;;
        --ov-route) OV_ROUTE=1; shift ;;
        --ov-file) need_arg "$@"; OV_FILE="$2"; shift 2 ;;
        --llama-args) need_arg "$@"; LLAMA_ARGS="$2"; shift 2 ;;
        --out) need_arg "$@"; OUT="$2"; shift 2 ;;
        --llama-cpp-python) need_arg "$@"; LLAMA_CPP_PYTHON_VERSION="$2"; shift 2 ;;
        --build-only) BUILD_ONLY=1; shift ;;
        *) die "unknown option '$1' (see --help)" ;;
    esac
done

is_uint "$THREADS" && [[ "$THREADS" -ge 1 ]] || die "--threads must be a positive integer, got '$THREADS'"
is_uint_list "$N_PROMPT" || die "-p must be a comma-separated list of integers, got '$N_PROMPT'"
is_uint_list "$N_GEN" || die "-n must be a comma-separated list of integers, got '$N_GEN'"
is_uint "$N_DEPTH" || die "-d must be an integer, got '$N_DEPTH'"
is_uint "$REPS" && [[ "$REPS" -ge 1 ]] || die "-r must be a positive integer, got '$REPS'"
[[ "$OV_FILE" == own || "$OV_FILE" == q8_0 ]] || die "--ov-file must be 'own' or 'q8_0', got '$OV_FILE'"
[[ -n "$MODELS" ]] || die "--models is empty"
if [[ "$SKIP_OV" == 1 && "$SKIP_LLAMA" == 1 && "$SKIP_PYRAMID" == 1 ]]; then
    die "every engine is skipped: nothing to run"
fi

DATE_TAG="$(date +%Y-%m-%d)"
[[ -n "$OUT" ]] || OUT="$REPO_ROOT/benchmarks/peers-$DATE_TAG.json"

# ------------------------------------------------------------ python tools ---
# One venv holds cmake, ninja (when the system has none) and openvino-genai.
VENV="$PEERS_DIR/venv"
VPY="$VENV/bin/python"

find_python() {
    local c
    for c in python3 python; do
        if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 9))' 2>/dev/null; then
            command -v "$c"; return 0
        fi
    done
    return 1
}

ensure_venv() {
    [[ -x "$VPY" ]] && return 0
    local py
    py="$(find_python)" || die "python3 (>= 3.9) is needed to install cmake/ninja/openvino-genai; install it first"
    log "creating python venv $VENV"
    mkdir -p "$PEERS_DIR"
    if ! "$py" -m venv "$VENV" >/dev/null 2>&1; then
        rm -rf "$VENV"
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "python venv module missing: installing python3-venv with apt-get"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null \
                || die "apt-get install python3-venv failed"
            "$py" -m venv "$VENV" || die "cannot create a venv at $VENV"
        else
            die "cannot create a venv at $VENV (install python3-venv)"
        fi
    fi
    "$VPY" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
}

pip_install() {
    ensure_venv
    log "pip install $*"
    "$VPY" -m pip install -q "$@" || die "pip install $* failed"
}

version_ge() { # version_ge A B: A >= B (dotted numbers)
    [[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" == "$2" ]]
}

CMAKE=""
NINJA=""
ensure_build_tools() {
    local v
    if command -v cmake >/dev/null 2>&1; then
        v="$(cmake --version | head -n1 | awk '{print $3}')"
        if version_ge "$v" 3.18; then CMAKE="$(command -v cmake)"; fi
    fi
    if [[ -z "$CMAKE" ]]; then
        [[ -x "$VENV/bin/cmake" ]] || pip_install cmake
        CMAKE="$VENV/bin/cmake"
    fi
    if command -v ninja >/dev/null 2>&1; then
        NINJA="$(command -v ninja)"
    else
        [[ -x "$VENV/bin/ninja" ]] || pip_install ninja
        NINJA="$VENV/bin/ninja"
    fi
    if ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
        if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
            log "no C++ compiler: installing g++ with apt-get"
            apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null \
                || die "apt-get install g++ failed"
        else
            die "a C/C++ compiler (gcc/g++ or clang) is needed to build llama.cpp"
        fi
    fi
}

ensure_ov_genai() {
    ensure_venv
    if ! "$VPY" -c 'import openvino_genai' >/dev/null 2>&1; then
        pip_install "$OV_GENAI_SPEC"
    fi
    "$VPY" -c 'import openvino_genai' >/dev/null 2>&1 \
        || die "openvino_genai does not import after installing $OV_GENAI_SPEC"
}

# ------------------------------------------------------------- fingerprint ---
cpu_key() { # identifies the CPU a GGML_NATIVE build was tuned for
    {
        grep -m1 '^model name' /proc/cpuinfo || true
        grep -m1 '^flags' /proc/cpuinfo || true
    } | cksum | awk '{print $1}'
}

# ------------------------------------------------------------ llama.cpp ---
LLAMA_DIR=""
LLAMA_BENCH=""
LLAMA_QUANTIZE=""
LLAMA_SERVER=""
LLAMA_COMMIT=""
BUILD_SECONDS=""

resolve_llama_version() {
    if [[ "$LLAMA_CPP_PYTHON_VERSION" == latest ]]; then
        local dl
        dl="$(mktemp -d)"
        log "looking up the latest llama-cpp-python sdist"
        ensure_venv
        fetch_sdist "" "$dl"
        LLAMA_CPP_PYTHON_VERSION="$(basename "$(ls "$dl"/llama_cpp_python-*.tar.gz)" .tar.gz)"
        LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION#llama_cpp_python-}"
        mkdir -p "$PEERS_DIR/src"
        mv "$dl"/llama_cpp_python-*.tar.gz "$PEERS_DIR/src/"
        rmdir "$dl"
    fi
}

fetch_sdist() { # fetch_sdist VERSION DEST_DIR  (empty VERSION = latest)
    local spec="llama-cpp-python"
    [[ -n "$1" ]] && spec="llama-cpp-python==$1"
    # --no-binary for this one package only: with ':all:' pip would also build
    # the sdist's build requirements (cmake itself) from source just to read
    # its metadata, which takes the better part of an hour on two cores.
    "$VPY" -m pip download -q --no-deps --no-binary llama-cpp-python "$spec" -d "$2" \
        || die "pip download $spec failed"
}

ensure_llama() {
    resolve_llama_version
    LLAMA_DIR="$PEERS_DIR/llama.cpp-$LLAMA_CPP_PYTHON_VERSION"
    LLAMA_BENCH="$LLAMA_DIR/bin/llama-bench"
    LLAMA_QUANTIZE="$LLAMA_DIR/bin/llama-quantize"
    LLAMA_SERVER="$LLAMA_DIR/bin/llama-server"
    local stamp="$LLAMA_DIR/build-info.json" key
    key="$(cpu_key)"
    if [[ -x "$LLAMA_BENCH" && -x "$LLAMA_QUANTIZE" && -x "$LLAMA_SERVER" && -f "$stamp" ]] \
        && grep -q "\"cpu_key\": \"$key\"" "$stamp"; then
        LLAMA_COMMIT="$(sed -n 's/.*"llama_cpp_commit": "\([^"]*\)".*/\1/p' "$stamp")"
        log "llama.cpp from llama-cpp-python $LLAMA_CPP_PYTHON_VERSION already built ($LLAMA_DIR)"
        return 0
    fi
    [[ -x "$LLAMA_BENCH" ]] && log "cached llama.cpp build was made for another CPU: rebuilding"

    ensure_build_tools
    ensure_venv
    local sdist_dir="$PEERS_DIR/src"
    local sdist="$sdist_dir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
    mkdir -p "$sdist_dir"
    if [[ ! -f "$sdist" ]]; then
        log "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist"
        fetch_sdist "$LLAMA_CPP_PYTHON_VERSION" "$sdist_dir"
        [[ -f "$sdist" ]] || die "pip did not leave $sdist"
    fi

    local src="$LLAMA_DIR/src" build="$LLAMA_DIR/build" top="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    rm -rf "$src" "$build" "${LLAMA_DIR:?}/bin"
    mkdir -p "$src" "$LLAMA_DIR/bin"
    log "unpacking vendor/llama.cpp"
    tar -xzf "$sdist" -C "$src" --strip-components=3 "$top/vendor/llama.cpp" \
        || die "$sdist has no vendor/llama.cpp"
    # The sdist carries the submodule's git metadata: read the commit from it.
    LLAMA_COMMIT="$(tar -xzf "$sdist" -O "$top/.git/modules/vendor/llama.cpp/HEAD" 2>/dev/null | head -c 40 || true)"
    [[ -n "$LLAMA_COMMIT" ]] || LLAMA_COMMIT=unknown
    [[ -f "$src/CMakeLists.txt" ]] || die "no CMakeLists.txt in the vendored llama.cpp"

    local -a flags=(
        -S "$src" -B "$build" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA"
        -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON
        -DLLAMA_BUILD_TOOLS=ON -DGGML_CCACHE=OFF
    )
    # Network support is not needed; the option names changed across versions.
    grep -q 'option(LLAMA_CURL' "$src/CMakeLists.txt" && flags+=(-DLLAMA_CURL=OFF)
    grep -q 'option(LLAMA_OPENSSL' "$src/CMakeLists.txt" && flags+=(-DLLAMA_OPENSSL=OFF)
    grep -q 'option(LLAMA_BUILD_APP' "$src/CMakeLists.txt" && flags+=(-DLLAMA_BUILD_APP=OFF)

    log "configuring llama.cpp $LLAMA_COMMIT (log: $LLAMA_DIR/build.log)"
    local t0 t1
    t0=$(date +%s)
    # git would report the commit of whatever repository encloses the cache:
    # build outside any (GIT_CEILING_DIRECTORIES) so the version is not misread.
    GIT_CEILING_DIRECTORIES="$LLAMA_DIR" nice -n 19 "$CMAKE" "${flags[@]}" >"$LLAMA_DIR/build.log" 2>&1 \
        || { tail -n 30 "$LLAMA_DIR/build.log" >&2; die "cmake configure failed (see $LLAMA_DIR/build.log)"; }
    log "building llama-bench, llama-quantize and llama-server (nice -n 19, -j$JOBS); this takes a while"
    nice -n 19 "$CMAKE" --build "$build" --target llama-bench llama-quantize llama-server -j "$JOBS" >>"$LLAMA_DIR/build.log" 2>&1 \
        || { tail -n 30 "$LLAMA_DIR/build.log" >&2; die "llama.cpp build failed (see $LLAMA_DIR/build.log)"; }
    t1=$(date +%s)
    BUILD_SECONDS=$((t1 - t0))
    local b
    for b in llama-bench llama-quantize llama-server; do
        [[ -x "$build/bin/$b" ]] || die "the build did not produce $build/bin/$b"
        cp "$build/bin/$b" "$LLAMA_DIR/bin/$b"
    done
    cat >"$stamp" <<EOF
{
  "llama_cpp_python_version": "$LLAMA_CPP_PYTHON_VERSION",
  "llama_cpp_commit": "$LLAMA_COMMIT",
  "cpu_key": "$key",
  "build_seconds": $BUILD_SECONDS,
  "cmake_flags": "$(printf '%s ' "${flags[@]}" | sed 's/"/\\"/g')",
  "built_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
}
EOF
    log "llama.cpp built in ${BUILD_SECONDS}s"
}

# ----------------------------------------------------------------- models ---
declare -a M_KEY=() M_PATH=() M_Q8=()

resolve_models() {
    local entry path name missing=0
    IFS=',' read -r -a entries <<<"$MODELS"
    for entry in "${entries[@]}"; do
        [[ -n "$entry" ]] || continue
        case "$entry" in
            smollm2-135m) path="$PYRAMID_HOME_DIR/models/smollm2-135m-instruct-q4_1.gguf"; name="$entry" ;;
            qwen2.5-coder-0.5b) path="$PYRAMID_HOME_DIR/models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"; name="$entry" ;;
            gemma3-270m) path="$PYRAMID_HOME_DIR/models/gemma-3-270m-q4_k_m.gguf"; name="$entry" ;;
            *.gguf) path="$entry"; name="$(basename "$entry" .gguf)" ;;
            *) die "unknown model '$entry': use smollm2-135m, qwen2.5-coder-0.5b, gemma3-270m or a path to a .gguf file" ;;
        esac
        if [[ ! -f "$path" ]]; then
            if [[ "$entry" == *.gguf ]]; then
                echo "bench-peers: error: no such GGUF file: $path" >&2
            else
                echo "bench-peers: error: $path is not cached; run: pyramid fetch $entry" >&2
            fi
            missing=1
            continue
        fi
        M_KEY+=("$name")
        M_PATH+=("$(cd "$(dirname "$path")" && pwd)/$(basename "$path")")
    done
    [[ $missing == 0 ]] || exit 1
    [[ ${#M_KEY[@]} -gt 0 ]] || die "no models to run"
}

make_q8_copies() {
    local i src dst
    mkdir -p "$LLAMA_DIR/models"
    for i in "${!M_PATH[@]}"; do
        src="${M_PATH[$i]}"
        dst="$LLAMA_DIR/models/$(basename "$src" .gguf)-requant-q8_0.gguf"
        # Rebuild when the source file changed (newer than the copy).
        if [[ ! -s "$dst" || "$src" -nt "$dst" ]]; then
            log "making a Q8_0 copy of $(basename "$src")"
            nice -n 19 "$LLAMA_QUANTIZE" --allow-requantize "$src" "$dst.tmp" Q8_0 "$JOBS" \
                >"$dst.log" 2>&1 || { tail -n 20 "$dst.log" >&2; die "llama-quantize failed on $src"; }
            mv "$dst.tmp" "$dst"
        fi
        M_Q8[i]="$dst"
    done
}

# ------------------------------------------------------------------- main ---
resolve_models

# Check pyramid before the long llama.cpp build, so a missing binary fails fast.
PYRAMID_KV_FLAG=()
if [[ "$SKIP_PYRAMID" == 0 && "$BUILD_ONLY" == 0 ]]; then
    [[ -x "$PYRAMID_BIN" ]] || die "pyramid binary not found at $PYRAMID_BIN (build it with 'cargo build --release' or set PYRAMID_BIN)"
    pyramid_help="$("$PYRAMID_BIN" bench --help 2>&1 || true)"
    [[ "$pyramid_help" == *--json* ]] || die "$PYRAMID_BIN has no 'bench --json' subcommand"
    if [[ "$pyramid_help" == *--kv* ]]; then
        PYRAMID_KV_FLAG=(--kv "$KV")
    elif [[ "$KV" != f32 ]]; then
        die "$PYRAMID_BIN bench has no --kv option"
    fi
fi

if [[ "$SKIP_LLAMA" == 0 || "$OV_FILE" == q8_0 && "$SKIP_OV" == 0 ]]; then
    ensure_llama
    make_q8_copies
fi
if [[ "$SKIP_OV" == 0 ]]; then
    ensure_ov_genai
fi
if [[ "$BUILD_ONLY" == 1 ]]; then
    log "tools ready; --build-only given, stopping here"
    exit 0
fi
WORK="$(mktemp -d "${TMPDIR:-/tmp}/bench-peers.XXXXXX")"
MANIFEST="$WORK/manifest.jsonl"
: >"$MANIFEST"
log "raw outputs in $WORK"

# Appends one line to the manifest describing one engine invocation.
record() { # record REP MODEL ENGINE EXIT_CODE SECONDS OUTFILE ERRFILE CMD...
    local rep="$1" model="$2" engine="$3" rc="$4" secs="$5" out="$6" err="$7"
    shift 7
    "$PY" - "$rep" "$model" "$engine" "$rc" "$secs" "$out" "$err" "$@" >>"$MANIFEST" <<'EOF'
import json, sys
a = sys.argv[1:]
print(json.dumps({"rep": int(a[0]), "model": a[1], "engine": a[2],
                  "status": "ok" if a[3] == "0" else "failed", "exit_code": int(a[3]),
                  "seconds": float(a[4]), "stdout": a[5], "stderr": a[6], "cmd": a[7:]}))
EOF
}

PY="$(find_python)" || die "python3 is needed"
[[ "$SKIP_OV" == 0 ]] && PY="$VPY"

run_engine() { # run_engine REP MODEL_INDEX ENGINE
    local rep="$1" i="$2" engine="$3" key="${M_KEY[$2]}"
    local base="$WORK/r${rep}-${key}-${engine}"
    local -a cmd
    case "$engine" in
        llama-own|llama-q8_0)
            local file="${M_PATH[$i]}"
            [[ "$engine" == llama-q8_0 ]] && file="${M_Q8[$i]}"
            cmd=("$LLAMA_BENCH" -m "$file" -t "$THREADS" -p "$N_PROMPT" -n "$N_GEN" -r 1 -o json)
            # shellcheck disable=SC2206 # split on spaces, as documented
            [[ -n "$LLAMA_ARGS" ]] && cmd+=($LLAMA_ARGS)
            [[ "$N_DEPTH" != 0 ]] && cmd+=(-d "$N_DEPTH")
            ;;
        ov-genai)
            local file="${M_PATH[$i]}"
            [[ "$OV_FILE" == q8_0 ]] && file="${M_Q8[$i]}"
            cmd=("$VPY" "$SCRIPT_DIR/ov_genai_bench.py" --model "$file" --threads "$THREADS"
                 -p "$N_PROMPT" -n "$N_GEN" -d "$N_DEPTH" -r 1)
            ;;
        pyramid)
            cmd=("$PYRAMID_BIN" bench --model "${M_PATH[$i]}" -p "$N_PROMPT" -n "$N_GEN" -d "$N_DEPTH"
                 -r 1 --threads "$THREADS" --precision "$PRECISION" ${PYRAMID_KV_FLAG[@]+"${PYRAMID_KV_FLAG[@]}"} --json)
            ;;
        pyramid-ov)
            # OpenVINO routes bind an f32 cache.
            cmd=("$PYRAMID_BIN" bench --model "${M_PATH[$i]}" -p "$N_PROMPT" -n "$N_GEN" -d "$N_DEPTH"
                 -r 1 --threads "$THREADS" --precision "$PRECISION" --kv f32 --device ov:CPU --json)
            ;;
    esac
    local t0 t1 rc=0 secs
    t0=$(date +%s.%N)
    "${cmd[@]}" >"$base.out" 2>"$base.err" || rc=$?
    t1=$(date +%s.%N)
    secs="$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')"
    record "$rep" "$key" "$engine" "$rc" "$secs" "$base.out" "$base.err" "${cmd[@]}"
    if [[ "$rc" == 0 ]]; then
        log "  rep $rep/$REPS  $key  $engine  ${secs}s"
    else
        log "  rep $rep/$REPS  $key  $engine  FAILED (exit $rc, see $base.err): $(grep -v '^[[:space:]]*$' "$base.err" | tail -n 1 | cut -c1-160)"
    fi
}

declare -a ENGINES=()
[[ "$SKIP_PYRAMID" == 0 ]] && ENGINES+=(pyramid)
[[ "$OV_ROUTE" == 1 ]] && ENGINES+=(pyramid-ov)
[[ "$SKIP_LLAMA" == 0 ]] && ENGINES+=(llama-own llama-q8_0)
[[ "$SKIP_OV" == 0 ]] && ENGINES+=(ov-genai)
NE=${#ENGINES[@]}

START_ISO="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
LOADAVG_START="$(cat /proc/loadavg 2>/dev/null || true)"
log "running ${#M_KEY[@]} model(s) x $NE engine(s) x $REPS repetition(s); threads=$THREADS p=$N_PROMPT n=$N_GEN d=$N_DEPTH"
for ((rep = 1; rep <= REPS; rep++)); do
    for i in "${!M_KEY[@]}"; do
        # Rotate the starting engine each repetition so no engine always runs
        # first (cold) or last (after the others heated the CPU).
        for ((k = 0; k < NE; k++)); do
            run_engine "$rep" "$i" "${ENGINES[$(((k + rep - 1) % NE))]}"
        done
    done
done
END_ISO="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# ----------------------------------------------------------------- report ---
MODELS_JSON="$WORK/models.json"
model_args=()
for i in "${!M_KEY[@]}"; do
    model_args+=("${M_KEY[$i]}" "${M_PATH[$i]}" "${M_Q8[$i]:-}")
done
"$PY" - "${model_args[@]}" >"$MODELS_JSON" <<'EOF'
import json, sys
a = sys.argv[1:]
print(json.dumps([{"key": a[i], "path": a[i + 1], "q8_0_path": a[i + 2] or None}
                  for i in range(0, len(a), 3)], indent=2))
EOF

mkdir -p "$(dirname "$OUT")"
"$PY" "$SCRIPT_DIR/compare.py" \
    --manifest "$MANIFEST" --models "$MODELS_JSON" --out "$OUT" \
    --repo "$REPO_ROOT" --pyramid-bin "$PYRAMID_BIN" \
    --llama-dir "${LLAMA_DIR:-}" --llama-cpp-python "$LLAMA_CPP_PYTHON_VERSION" \
    --llama-commit "${LLAMA_COMMIT:-}" \
    --ov-python "$( [[ "$SKIP_OV" == 0 ]] && echo "$VPY" || true)" \
    --ov-file "$OV_FILE" \
    --threads "$THREADS" -p "$N_PROMPT" -n "$N_GEN" -d "$N_DEPTH" -r "$REPS" \
    --precision "$PRECISION" --kv "$KV" --start "$START_ISO" --end "$END_ISO" \
    --loadavg-start "$LOADAVG_START" \
    --invocation "$(printf '%q ' "$0" "${ORIG_ARGS[@]+"${ORIG_ARGS[@]}"}")"
