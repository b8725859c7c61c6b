#!/usr/bin/env bash
# Issue 11's AMP reproducibility hunt in one call on the GPU machine (docs/benchmarks.md, 2026-12-04 sessions 11-12):
#  1. GpuConvEngines.ATimedPlanAndItsCachedRebuildsGiveTheSameBits: a timed graph plan against its two cached rebuilds;
#  2. rounds of the AMP/FP32 determinism and profile tests under `ctest -j4`, every training hashing its nodes
#     (RN_TEST_NODE_HASHES=1), odd rounds with the device data cache, even rounds with the host loader, for HUNT_SECONDS
#     (default 170) seconds; a failing pair prints its first differing node and that layer's engines.
#   OUT=... scripts/bench/gpu_repro_hunt.sh     (needs .deps/cudnn-frontend carried; logs in $OUT)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
OUT=$OUT STEPS="" TARGETS="test_gpu_runtime test_gpu_dnn" scripts/bench/gpu_session.sh || exit 1  # build only
build-gpu/tests/gpu_dnn/test_gpu_dnn --gtest_filter='*GpuConvEngines.ATimedPlan*' >"$OUT/engines.log" 2>&1
echo "rebuild test exit $?: $(grep -hE '^\[ (engines|differs) \]' "$OUT/engines.log" | head -8 | tr '\n' ';')"
cd build-gpu || exit 1
T0=$SECONDS
r=0
failed=0
: >"$OUT/hunt.log"
while ((SECONDS - T0 < ${HUNT_SECONDS:-170})); do
  r=$((r + 1))
  dc=on
  ((r % 2 == 0)) && dc=off
  RN_TEST_DATA_CACHE=$dc RN_TEST_NODE_HASHES=1 ctest -L gpu -R \
    'GpuDeterminism.TwoTrainings|GpuDeterminism.StartUp|GpuProfile' -j4 --output-on-failure >"$OUT/round.log" 2>&1
  n=$(grep -c '\*\*\*Failed' "$OUT/round.log")
  failed=$((failed + n))
  echo "round $r, data cache $dc: $n failed $(grep -E '\*\*\*Failed' "$OUT/round.log" | sed 's/.*Test *#[0-9]*: //;s/ \..*//' | tr '\n' ' ')"
  cat "$OUT/round.log" >>"$OUT/hunt.log"
done
rm -f "$OUT/round.log"
echo "$r rounds, $failed failed test runs"
grep -E '^\[ hashes|^  [ab]: ' "$OUT/hunt.log" | grep -v 'hashes  \] [^:]*:$' | head -40
