#!/usr/bin/env bash
# One call on the GPU machine: build (sm_90), the gpu-labelled tests, then the jobs named in STEPS.
#   STEPS="tests bench fmnist" scripts/bench/gpu_session.sh      (logs and results in $OUT)
# bench: Renaissance (graphs on/off) and PyTorch (MODES, default eager) on CASES, via compare_gpu.sh.
# scaling: 1 vs N GPUs, Renaissance (mpirun) and PyTorch DDP (torchrun), via scaling_gpu.sh.
# fmnist: Fashion-MNIST (idx.gz carried in data/cache/fashion-mnist) trained on the GPU with FMNIST_ARGS.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
STEPS=${STEPS:-"tests bench fmnist"}
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
if [[ ! -x build-gpu/app/renaissance ]] || [[ ${REBUILD:-1} == 1 ]]; then
  G=Ninja; command -v ninja >/dev/null || G="Unix Makefiles"
  cmake -S . -B build-gpu -G "$G" -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DRENAISSANCE_BUILD_BENCHMARKS=OFF >"$OUT/configure.log" 2>&1 || { say "configure failed"; tail -20 "$OUT/configure.log"; exit 1; }
  cmake --build build-gpu -j"$(nproc)" >"$OUT/build.log" 2>&1 || { say "build failed"; grep -A5 error "$OUT/build.log" | head -40; exit 1; }
  say "built"
  rm -f "$OUT/configure.log" "$OUT/build.log"  # at most 8 files come back from the GPU machine
fi
RN=build-gpu/app/renaissance
for s in $STEPS; do
  case $s in
    tests)
      OUT=$(cd "$OUT" && pwd); (cd build-gpu && timeout 300 ctest -L gpu --output-on-failure -j4 >"$OUT/ctest-gpu.log" 2>&1)
      say "gpu tests exit $?: $(grep -E 'tests passed' "$OUT/ctest-gpu.log")"
      grep -E '\*\*\*|Failed ' "$OUT/ctest-gpu.log" | head -20 ;;
    bench)
      MODES=${MODES:-eager} CASES=${CASES:-"resnet50:256:${MODES:-eager} fmnist_cnn:256:${MODES:-eager} resnet18_cifar:512:${MODES:-eager}"} \
        scripts/bench/compare_gpu.sh build-gpu "$OUT" >"$OUT/compare.log" 2>&1
      say "bench done"; cat "$OUT/table.md" 2>/dev/null; tail -5 "$OUT/ours.err" "$OUT/pytorch.err" 2>/dev/null ;;
    scaling)
      scripts/bench/scaling_gpu.sh build-gpu "$OUT" >"$OUT/scaling.log" 2>&1
      say "scaling done"; cat "$OUT/scaling.md" 2>/dev/null; tail -5 "$OUT/scaling.err" 2>/dev/null ;;
    fmnist)
      "$RN" data import fashion-mnist --src data/cache/fashion-mnist --out data/fm.h5 >/dev/null || exit 1
      timeout "${FMNIST_TIMEOUT:-300}" "$RN" train --data data/fm.h5 --device cuda ${FMNIST_ARGS:---model resnet18_fmnist --amp --epochs 20 --batch 256 --crop-padding 2} \
        --metrics "$OUT/fmnist_gpu.jsonl" >"$OUT/fmnist_gpu.log" 2>&1
      say "fmnist exit $?"; tail -4 "$OUT/fmnist_gpu.log" ;;
  esac
done
say "done"
