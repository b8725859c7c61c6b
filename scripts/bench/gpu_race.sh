#!/usr/bin/env bash
# Stream-race hunt on the GPU machine: PROCS copies of tests/gpu_runtime/gpu_race_probe per variant at once, each
# training REPEATS times; every training prints a hash of its losses and of its weights + BN statistics. Within a
# variant all hashes must agree (same seed, same engines from one shared engine cache): a variant with more than one
# hash has a race or a read of unwritten bytes. Results in $OUT/race.log and a summary on stdout.
#   VARIANTS="amp fp32 amp,nostreams" PROCS=4 REPEATS=3 scripts/bench/gpu_race.sh
# DELAYS (default "none"): RN_DEBUG_STREAM_DELAY settings (runtime/cuda_session.cpp), each run with every variant:
# one stream of a fork held back by a spin kernel; the hashes must not change with it (a wait missing between two
# streams shows as another hash under the delay that exposes it), e.g. DELAYS="none wgrad:300 main-wgrad:300".
# POISON: RN_DEBUG_POISON_WORKSPACE for every run but the timing one (e.g. "all": the workspace is NaN before each
# kernel; a kernel that reads workspace bytes it did not write shows as another hash).
# HASHES=1: each process hashes every node's inputs and outputs in its last training's first two steps
# (RN_DEBUG_NODE_HASHES, docs/kernels-cuda.md); where a variant's processes differ, the first differing slots are
# printed (use REPEATS=1: a process keeps only its last training's hashes).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
OUT=$OUT STEPS="" TARGETS=gpu_race_probe scripts/bench/gpu_session.sh || exit 1  # build only
P=build-gpu/tests/gpu_runtime/gpu_race_probe
W=$(mktemp -d)
PROCS=${PROCS:-4}
REPEATS=${REPEATS:-3}
VARIANTS=${VARIANTS:-"amp fp32 amp,nostreams fp32,nostreams amp,nocache amp,nofold amp,nofuse amp,noreuse"}
: >"$OUT/race.log"
mkdir -p "$W/h"
for v in $VARIANTS; do
  # times this variant's engines once: its hash must be the others' too (a timed start-up trains like a cached one)
  "$P" "$v" 1 "$W/engines.txt" "$W/syn.h5" 2>&1 | sed "s/^probe \([^ ]*\)/probe \1@timed/" >"$W/$v.timed.0"
  for d in ${DELAYS:-none}; do
    dv=$d; [[ $d == none ]] && dv=""
    for p in $(seq 1 "$PROCS"); do
      hf=""; [[ ${HASHES:-0} == 1 ]] && hf="$W/h/$v.$d.$p"
      RN_DEBUG_NODE_HASHES=$hf RN_DEBUG_POISON_WORKSPACE=${POISON:-} RN_DEBUG_STREAM_DELAY=$dv \
        "$P" "$v" "$REPEATS" "$W/engines.txt" "$W/syn.h5" 2>&1 |
        sed "s/^probe \([^ ]*\)/probe \1@$d/" >"$W/$v.$d.$p" &
    done
    wait
  done
  cat "$W/$v".* >>"$OUT/race.log"
  # probe VARIANT run R losses HASH state HASH first_loss X val_loss Y
  runs=$(cat "$W/$v".* | grep -c "^probe")
  n=$(grep -h "^probe" "$W/$v".* | awk '{print $6, $8}' | sort -u | wc -l)
  say "variant $v: $runs trainings, $n distinct (losses, state) hashes"
  # each distinct hash with its count and the delays that gave it
  grep -h "^probe" "$W/$v".* | awk '{k = $6 " " $8 " " $10; n[k]++; split($2, a, "@"); if (index(d[k] " ", " " a[2] " ") == 0) d[k] = d[k] " " a[2]}
    END {for (k in n) print n[k], k, "delays:" d[k]}' | head -8
  if [[ ${HASHES:-0} == 1 ]]; then
    ref=""
    for f in "$W/h/$v".*; do
      [[ -f $f ]] || continue
      if [[ -z $ref ]]; then ref=$f; continue; fi
      cmp -s "$ref" "$f" && continue
      say "node hashes differ: $(basename "$ref") vs $(basename "$f"), $(diff "$ref" "$f" | grep -c '^<') slots; the first:"
      diff "$ref" "$f" | head -12
    done
  fi
done
rm -rf "$W"
say "done"
