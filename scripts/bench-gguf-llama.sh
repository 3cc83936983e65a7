#!/usr/bin/env bash
# Issue #19's side-by-side run: one GGUF file, llama.cpp and strata under the same cgroup memory
# cap and thread count, page cache dropped before each run; the file's direct-read rate after each
# round (the disk's bound); then greedy output of both from the same ids. Needs root (the cap,
# drop_caches). Make a MoE GGUF larger than RAM from a small `strata synth` folder with
#   python3 scripts/hf-to-gguf.py SYNTH_DIR OUT.gguf --outtype q8_0 --layers 48
#   scripts/bench-gguf-llama.sh MODEL.gguf [OUT_DIR]
# Env: STRATA, LLAMA_BENCH, LLAMA_GREEDY (scripts/llama-greedy.cpp, built as its header says),
# CAP (8G; "none": uncapped), THREADS (2), ROUNDS (2), PROMPT (512), TOKENS (16), GREEDY (1; 0: no
# greedy runs).
set -u
M=$1
OUT=${2:-$PWD/target/bench/gguf-llama}
B=${STRATA:-strata}
LB=${LLAMA_BENCH:-llama-bench}
LG=${LLAMA_GREEDY:-llama-greedy}
CAP=${CAP:-8G}
T=${THREADS:-2}
P=${PROMPT:-512}
N=${TOKENS:-16}
mkdir -p "$OUT"
capped() {
    if [ "$CAP" = none ]; then "$@"; else CAPMEM_STATS=1 "$(dirname "$0")/../../shared/tools/capmem.sh" "$CAP" "$@"; fi
}
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
echo "model $M ($(du -h "$M" | cut -f1)), cap $CAP, $T threads, RAM $(free -g | awk '/Mem:/{print $2}') GiB"
for round in $(seq "${ROUNDS:-2}"); do
    cold
    capped "$LB" -m "$M" -p "$P" -n 0 -t "$T" -r 1 > "$OUT/llama-pp-$round.txt" 2>&1
    cold
    capped "$LB" -m "$M" -p 0 -n "$N" -t "$T" -r 1 > "$OUT/llama-tg-$round.txt" 2>&1
    echo "round $round llama.cpp: $(grep -hE "pp$P|tg$N" "$OUT/llama-pp-$round.txt" "$OUT/llama-tg-$round.txt" | awk -F'|' '{print $(NF-2), $(NF-1)}' | tr -s ' ' | tr '\n' ';')"
    cold
    capped "$B" bench -m "$M" --prompt-len "$P" --tokens "$N" -t "$T" --seed $((40 + round)) \
        > "$OUT/strata-$round.txt" 2> "$OUT/strata-$round.err"
    echo "round $round strata: $(grep -E "^(prefill|decode) " "$OUT/strata-$round.txt" | tr '\n' ';')"
    tail -1 "$OUT/strata-$round.err"
    cold
    echo "direct read: $(dd if="$M" of=/dev/null bs=16M count=128 iflag=direct 2>&1 | tail -1)"
done
[ "${GREEDY:-1}" = 0 ] && exit 0
ids=$(seq -s, 1 16)
cold
capped "$B" run -m "$M" --ids "$ids" --max-tokens 24 --temperature 0 --ignore-eos --output json -t "$T" \
    > "$OUT/strata-greedy.json" 2> "$OUT/strata-greedy.err"
cold
capped "$LG" "$M" 24 "$T" "$ids" > "$OUT/llama-greedy.txt" 2> "$OUT/llama-greedy.err"
echo "greedy, strata:    $(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["token_ids"])))' "$OUT/strata-greedy.json" 2>&1)"
echo "greedy, llama.cpp: $(tr -s ' \n' ',' < "$OUT/llama-greedy.txt" | sed 's/,$//')"
