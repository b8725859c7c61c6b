#!/usr/bin/env bash
# Stream-race hunt on the GPU machine: PROCS copies of tests/gpu_runtime/gpu_race_probe per variant at once, each
# training REPEATS times; every training prints a hash of its losses and of its weights + BN statistics. Within a
# variant all hashes must agree (same seed, same engines from one shared engine cache): a variant with more than one
# hash has a race or a read of unwritten bytes. Results in $OUT/race.log and a summary on stdout.
#   VARIANTS="amp fp32 amp,nostreams" PROCS=4 REPEATS=3 scripts/bench/gpu_race.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
G=Ninja; command -v ninja >/dev/null 2>&1 || G="Unix Makefiles"
cmake -S . -B build-gpu -G "$G" -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DRENAISSANCE_BUILD_BENCHMARKS=OFF >"$OUT/race-configure.log" 2>&1 || { tail -20 "$OUT/race-configure.log"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target gpu_race_probe >"$OUT/race-build.log" 2>&1 ||
  { grep -a -A8 error "$OUT/race-build.log" | head -40; exit 1; }
rm -f "$OUT/race-configure.log" "$OUT/race-build.log"
say "built"
P=build-gpu/tests/gpu_runtime/gpu_race_probe
W=$(mktemp -d)
PROCS=${PROCS:-4}
REPEATS=${REPEATS:-3}
VARIANTS=${VARIANTS:-"amp fp32 amp,nostreams fp32,nostreams amp,nocache amp,nofold amp,nofuse amp,noreuse"}
: >"$OUT/race.log"
for v in $VARIANTS; do
  "$P" "$v" 1 "$W/engines.txt" "$W/syn.h5" >>"$OUT/race.log" 2>&1  # times this variant's engines once
  for p in $(seq 1 "$PROCS"); do "$P" "$v" "$REPEATS" "$W/engines.txt" "$W/syn.h5" >"$W/$v.$p" 2>&1 & done
  wait
  cat "$W/$v".* >>"$OUT/race.log"
  # probe VARIANT run R losses HASH state HASH first_loss X val_loss Y
  runs=$(cat "$W/$v".* | grep -c "^probe")
  n=$(grep -h "^probe" "$W/$v".* | awk '{print $6, $8}' | sort -u | wc -l)
  say "variant $v: $runs trainings, $n distinct (losses, state) hashes"
  grep -h "^probe" "$W/$v".* | awk '{print $6, $8, $10}' | sort | uniq -c | head -5
done
rm -rf "$W"
say "done"
