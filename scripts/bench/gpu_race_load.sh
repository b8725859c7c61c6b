#!/usr/bin/env bash
# The determinism tests that failed once under `ctest -L gpu -j4`, repeated beside a heavy GPU load (a ResNet-50
# bench that times its engines, then trains), as ctest's parallel tests load the GPU. Logs in $OUT.
#   ROUNDS=4 scripts/bench/gpu_race_load.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
G=Ninja; command -v ninja >/dev/null 2>&1 || G="Unix Makefiles"
cmake -S . -B build-gpu -G "$G" -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DRENAISSANCE_BUILD_BENCHMARKS=OFF >/dev/null 2>&1 || { say "configure failed"; exit 1; }
cmake --build build-gpu -j"$(nproc)" --target renaissance_cli test_gpu_runtime test_golden_gpu >"$OUT/load-build.log" 2>&1 ||
  { grep -a -A8 error "$OUT/load-build.log" | head -40; exit 1; }
rm -f "$OUT/load-build.log"; say "built"
RN=build-gpu/app/renaissance
ROUNDS=${ROUNDS:-4}
( for i in $(seq 1 "$ROUNDS"); do
    "$RN" bench --model resnet50 --batch 256 --amp --warmup 5 --steps 60 --device cuda --engine-cache off >/dev/null 2>&1
  done ) &
load=$!
( build-gpu/tests/gpu_runtime/test_gpu_runtime --gtest_filter='*GpuDeterminism.StartUpLeftovers*:*GpuDeterminism.TwoTrainings*' \
    --gtest_repeat="$ROUNDS" >"$OUT/load-det.log" 2>&1; echo "det exit $?" >>"$OUT/load-det.log" ) &
p1=$!
( build-gpu/tests/golden/test_golden_gpu --gtest_filter='*tiny_resnet*' --gtest_repeat=$((ROUNDS * 3)) \
    >"$OUT/load-golden.log" 2>&1; echo "golden exit $?" >>"$OUT/load-golden.log" ) &
p2=$!
( build-gpu/tests/gpu_runtime/test_gpu_runtime --gtest_filter='*GpuFused.*' --gtest_repeat="$ROUNDS" \
    >"$OUT/load-fused.log" 2>&1; echo "fused exit $?" >>"$OUT/load-fused.log" ) &
p3=$!
wait "$p1" "$p2" "$p3"
pkill -P "$load" 2>/dev/null; kill "$load" 2>/dev/null; wait
for f in det golden fused; do
  say "$f: $(grep -c '^\[       OK' "$OUT/load-$f.log") ok, $(grep -c '^\[  FAILED  \].*ms)' "$OUT/load-$f.log") failed; $(tail -1 "$OUT/load-$f.log")"
  grep '^\[  FAILED  \].*ms)' "$OUT/load-$f.log" | sort | uniq -c | head
done
