#!/usr/bin/env bash
# One short GPU call for --recompute bn-relu (issue 15), ordered so that a call cut short still brings back the most:
# build only the CLI and the three GPU test binaries; the GPU recompute test and the GPU goldens; MobileNetV2 b256 AMP
# with --recompute off, bn-relu, and bn-relu within --recompute-budget (BUDGET, default 5.7GiB: issue 15 wants
# <= 0.85x PyTorch eager's 6.76 GiB peak) beside PyTorch eager, twice; then the GPU runtime tests (fused, determinism,
# resume, profile, input, JPEG) until DEADLINE (s, default 560); ResNet-50 last. Logs and JSON lines in $OUT.
#   bash scripts/bench/gpu_recompute_call.sh        (on the GPU machine; carry .deps/cudnn-frontend)
set -u
OUT=${OUT:-out}
BUDGET=${BUDGET:-5.7GiB}
DEADLINE=${DEADLINE:-560}
mkdir -p "$OUT"
STEPS="" TARGETS="renaissance_cli test_gpu_runtime test_golden_gpu" scripts/bench/gpu_session.sh || exit 1
B=build-gpu
(timeout 150 $B/tests/gpu_runtime/test_gpu_runtime --gtest_filter='GpuFused.Recompute*' > $OUT/recompute-test.log 2>&1; echo "exit $?" >> $OUT/recompute-test.log)
tail -2 $OUT/recompute-test.log
# the goldens against PyTorch on the GPU (FP32 plans have fused layers since 2026-12-05; the FP32 goldens are CPU-made)
(timeout 90 $B/tests/golden/test_golden_gpu > $OUT/golden-gpu.log 2>&1; echo "exit $?" >> $OUT/golden-gpu.log)
grep -E "OK \]|FAILED \]|^exit" $OUT/golden-gpu.log | head -14
mb() { timeout 120 $B/app/renaissance bench --model mobilenet_v2 --batch 256 --amp --warmup 10 --steps 50 --device cuda --json "$@" >> $OUT/bench.jsonl 2>>$OUT/bench.err; }
eager() { timeout 120 python3 scripts/bench/pytorch_gpu.py --model mobilenet_v2 --batch 256 --mode eager --warmup 20 --steps 50 >> $OUT/bench.jsonl 2>>$OUT/bench.err; }
mb --recompute off
mb --recompute bn-relu
mb --recompute bn-relu --recompute-budget "$BUDGET"
eager
mb --recompute bn-relu --recompute-budget "$BUDGET"
eager
grep -h images_per_s $OUT/bench.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
  d=json.loads(l); print(d.get('model'), d.get('recompute', d.get('mode')), d.get('recomputed', ''), round(d['images_per_s'],1), round(d.get('arena_bytes', d.get('peak_allocated_bytes',0))/2**30,3))"
left=$((DEADLINE - SECONDS - 80))
if ((left > 60)); then
  (cd $B && timeout $left ctest -L gpu -j3 -R '^gpu\.(Cases|Golden)|Gpu(Fused|Determinism|DeterminismCli|Resume|Profile|Input|Jpeg|MemoryGuard|StartUp)?\.' > "$(cd .. && cd "$OUT" && pwd)/ctest-gpu.log" 2>&1)
  grep -E "tests passed|\(Failed\)|Timeout" $OUT/ctest-gpu.log | head -20
fi
for r in off bn-relu; do timeout 70 $B/app/renaissance bench --model resnet50 --batch 256 --amp --warmup 10 --steps 40 --device cuda --json --recompute $r >> $OUT/bench.jsonl 2>>$OUT/bench.err; done
grep -h resnet50 $OUT/bench.jsonl | cut -c1-300
