#!/usr/bin/env bash
# The whole test suite: the Rust workspace (unit, golden and CLI tests), then the HTTP API suite
# (pytest + the official `openai` client against `strata serve`) in a venv under target/.
# Needs ../shared/fixtures (or STRATA_FIXTURES), python3 with venv, and PyPI for the first run.
set -euo pipefail
cd "$(dirname "$0")/.."

cargo test --workspace --locked
cargo build --locked -p strata-cli

venv=target/venv-api
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r tests/api/requirements.txt
STRATA_BIN="$PWD/target/debug/strata" "$venv/bin/python" -m pytest tests/api -q -p no:cacheprovider
