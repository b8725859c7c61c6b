#!/usr/bin/env bash
# One short GPU call for --recompute bn-relu (issue 15), ordered so that a call cut short still brings back the most:
# build only the CLI and the two GPU test binaries, the GPU recompute test, MobileNetV2 b256 AMP bench with and
# without recomputation, the two-trainings determinism tests, PyTorch eager's MobileNetV2 (for the ratio), the conv
# engine cache test, ResNet-50 bench with and without. Logs and JSON lines in $OUT.
#   bash scripts/bench/gpu_recompute_call.sh        (on the GPU machine; carry .deps/cudnn-frontend)
set -u
OUT=${OUT:-out}
mkdir -p "$OUT"
STEPS="" TARGETS="renaissance_cli test_gpu_runtime test_gpu_dnn" scripts/bench/gpu_session.sh || exit 1
B=build-gpu
(timeout 150 $B/tests/gpu_runtime/test_gpu_runtime --gtest_filter='GpuFused.Recompute*' > $OUT/recompute-test.log 2>&1; echo "exit $?" >> $OUT/recompute-test.log)
tail -4 $OUT/recompute-test.log
for r in off bn-relu; do timeout 120 $B/app/renaissance bench --model mobilenet_v2 --batch 256 --amp --warmup 10 --steps 50 --device cuda --json --recompute $r >> $OUT/bench.jsonl 2>>$OUT/bench.err; done
(timeout 120 $B/tests/gpu_runtime/test_gpu_runtime --gtest_filter='*GpuDeterminism.TwoTrainings*' > $OUT/determinism.log 2>&1; echo "exit $?" >> $OUT/determinism.log)
grep -E "OK \]|FAILED \]|^exit" $OUT/determinism.log | head
timeout 120 python3 scripts/bench/pytorch_gpu.py --model mobilenet_v2 --batch 256 --mode eager --warmup 20 --steps 50 >> $OUT/bench.jsonl 2>>$OUT/bench.err
grep -h images_per_s $OUT/bench.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
  d=json.loads(l); print(d.get('model'), d.get('recompute', d.get('mode')), round(d['images_per_s'],1), round(d.get('arena_bytes', d.get('peak_allocated_bytes',0))/2**30,3))"
(timeout 110 $B/tests/gpu_dnn/test_gpu_dnn --gtest_filter='*GpuConvEngines.ATimed*' > $OUT/engines.log 2>&1; echo "exit $?" >> $OUT/engines.log)
grep -E "engines \]|OK \]|FAILED \]|^exit" $OUT/engines.log | head
for r in off bn-relu; do timeout 90 $B/app/renaissance bench --model resnet50 --batch 256 --amp --warmup 10 --steps 40 --device cuda --json --recompute $r >> $OUT/bench.jsonl 2>>$OUT/bench.err; done
grep -h resnet50 $OUT/bench.jsonl | cut -c1-300
