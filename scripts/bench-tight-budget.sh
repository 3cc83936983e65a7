#!/usr/bin/env bash
# The tight-budget run of issue #16: a Kimi-K2-shaped INT4 checkpoint 2.6x --mem (written by
# `strata synth` when missing), --io pread against --io mmap on the same budget under a cap
# 1.5 GiB above it (cgroup v1 through ../shared/tools/capmem.sh, or cgroup v2), page cache dropped
# before each run, a direct-read dd of three shards after each. Needs root.
#   scripts/bench-tight-budget.sh [MODEL_DIR] [OUT_DIR]      (STRATA=path/to/strata)
set -u
B=${STRATA:-strata}
M=${1:-$PWD/target/bench/k2-96}
OUT=${2:-$PWD/target/bench/tight}
mkdir -p "$OUT"
cap() {
    local limit=$1; shift
    if [ -d /sys/fs/cgroup/memory ]; then
        CAPMEM_STATS=1 "$(dirname "$0")/../../shared/tools/capmem.sh" "$limit" "$@"
        return
    fi
    local cg=/sys/fs/cgroup/strata-cap.$$
    mkdir "$cg" && echo "$limit" > "$cg/memory.max" || return 2
    bash -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' cap "$cg" "$@"
    local rc=$?
    echo "cap: peak $(cat "$cg/memory.peak" 2>/dev/null) events $(tr '\n' ' ' < "$cg/memory.events")" >&2
    for p in $(cat "$cg/cgroup.procs"); do echo "$p" > /sys/fs/cgroup/cgroup.procs; done
    rmdir "$cg"
    return $rc
}
[ -f "$M/config.json" ] || "$B" synth --out "$M" --layers 4 --experts 96 --vocab 16384 2>&1 | tail -1
"$B" inspect -m "$M" --mem 3500M --ctx-size 16 2>&1 | grep -E "memory plan|resident|cache|reads/token"
for round in 1 2; do for io in pread mmap; do
    sync; echo 3 > /proc/sys/vm/drop_caches
    cap 5G "$B" bench -m "$M" --mem 3500M --tokens 12 --io $io --seed $((40 + round)) --json \
        > "$OUT/$io-$round.txt" 2> "$OUT/$io-$round.err"
    echo "$io $round: $(grep -E '^decode' "$OUT/$io-$round.txt")"
    grep -E "^(effective)" "$OUT/$io-$round.txt"; tail -1 "$OUT/$io-$round.err"
    sync; echo 3 > /proc/sys/vm/drop_caches
    for s in "$M"/model-0000[2-4]*.safetensors; do dd if="$s" of=/dev/null bs=16M iflag=direct 2>&1 | tail -1; done
done; done
