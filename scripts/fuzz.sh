#!/usr/bin/env bash
# Fuzz strata's parsers of untrusted input with cargo-fuzz (libFuzzer), on a stable toolchain
# (no sanitizer: `-s none`).
#   scripts/fuzz.sh [SECONDS] [TARGET...]   run each target (default: all) for SECONDS (default 30)
# Inputs: fuzz/corpus/TARGET.tar.gz (committed: a minimized corpus, unpacked into fuzz/work/TARGET
# on first use) and fuzz/seeds/TARGET; what a run finds goes to fuzz/work/TARGET (ignored by
# git), crashes to fuzz/artifacts/TARGET. Installs cargo-fuzz from crates.io when it is missing.
# Exits non-zero on the first crash. To refresh a committed corpus after a long run:
#   fuzz/target/x86_64-unknown-linux-gnu/release/T -merge=1 fuzz/min/T fuzz/work/T
#   tar czf fuzz/corpus/T.tar.gz -C fuzz/min T
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds="${1:-30}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(safetensors_header content_range cache_journal api_request chat_template stop_matcher output_parser)
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked --quiet
fi
cargo fuzz build -s none
for t in "${targets[@]}"; do
    if [ ! -d "work/$t" ] && [ -f "corpus/$t.tar.gz" ]; then
        mkdir -p work && tar xzf "corpus/$t.tar.gz" -C work
    fi
    mkdir -p "work/$t"
    echo "== fuzz $t for ${seconds}s"
    cargo fuzz run -s none "$t" "work/$t" "seeds/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 2>&1 \
        | grep -E "^(Done|stat::number_of_executed_units|stat::peak_rss_mb)|panicked|ERROR|SUMMARY" || true
    if [ -n "$(ls -A "artifacts/$t" 2>/dev/null)" ]; then
        echo "fuzz $t: crash inputs in fuzz/artifacts/$t" >&2
        exit 1
    fi
done
