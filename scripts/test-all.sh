#!/usr/bin/env bash
# The whole test suite: the Rust workspace (unit, golden and CLI tests), the NEON kernels under
# emulation, then the HTTP API suite
# (pytest + the official `openai` client against `strata serve`) in a venv under target/, the
# GGUF suite (files made from the fixtures by the `gguf` package) in the same venv, then
# a short run of each fuzz target. Needs ../shared/fixtures (or STRATA_FIXTURES), python3 with
# venv, and PyPI and crates.io for the first run.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --locked
cargo build --locked -p strata-cli

# The aarch64 NEON kernels against their scalar twins, built for aarch64 and run under qemu-user
# (../shared/tools/aarch64-test.sh installs Debian's cross toolchain and qemu the first time,
# which needs root).
a64=../shared/tools/aarch64-test.sh
if [ "$(uname -m)" = x86_64 ] && [ -x "$a64" ]; then
    if [ "$(id -u)" = 0 ] || command -v qemu-aarch64 >/dev/null; then
        "$a64" -p strata-kernels --release --locked --test neon
    else
        echo "NEON kernel tests not run: $a64 needs root to install the aarch64 toolchain" >&2
    fi
fi

venv=target/venv-api
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/api/requirements.txt -r tests/gguf/requirements.txt
STRATA_BIN="$PWD/target/debug/strata" "$venv/bin/python" -m pytest tests/api -q -p no:cacheprovider

# GGUF files made from the fixtures with the `gguf` package, against the fixtures' goldens.
STRATA_BIN="$PWD/target/debug/strata" "$venv/bin/python" -m pytest tests/gguf -q -p no:cacheprovider

# A short smoke of every fuzz target (cargo-fuzz, installed from crates.io when missing); the
# long runs are reported in fuzz/README.md.
scripts/fuzz.sh "${STRATA_FUZZ_SECONDS:-20}"
