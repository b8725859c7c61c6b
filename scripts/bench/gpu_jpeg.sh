#!/usr/bin/env bash
# JPEG stores decoded on the GPU (issue 12), one call on the GPU machine: build (sm_90), the nvJPEG tests, then
# bench-decode and (optionally) ResNet-50 training from a JPEG store. Logs and results in $OUT.
#
#   STORE=data/imagenet-like.h5 scripts/bench/gpu_jpeg.sh        # a store made elsewhere (carried or on disk)
#   IMAGES=50000 scripts/bench/gpu_jpeg.sh                        # generate and import one here (needs libturbojpeg:
#                                                                 #  TURBOJPEG_PREFIX below)
# STEPS (default "tests bench"): tests = test_gpu_jpeg; bench = data bench-decode STORE (BENCH_ARGS); train = ResNet-50
# AMP b256 --crop random-resized --decode gpu from STORE for TRAIN_STEPS steps, then the same `bench` figure.
# TURBOJPEG_PREFIX: a prefix with include/turbojpeg.h and lib/x86_64-linux-gnu/libturbojpeg.so (the GPU machine has no
# libturbojpeg: on the development machine `apt-get download libturbojpeg0 libturbojpeg0-dev`, carry the two .debs and
# `dpkg -x` each into .deps/turbojpeg; then TURBOJPEG_PREFIX=$PWD/.deps/turbojpeg/usr) - needed only to import JPEG
# folders (data import folder) and for the CPU decode path there. The GPU machine needs .deps/cudnn-frontend carried.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
STEPS=${STEPS:-"tests bench"}
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
G=Ninja
command -v ninja >/dev/null 2>&1 || G="Unix Makefiles"
PREFIX_ARGS=()
[[ -n "${TURBOJPEG_PREFIX:-}" ]] && PREFIX_ARGS=(-DCMAKE_PREFIX_PATH="$TURBOJPEG_PREFIX")
say "configure + build"
cmake -S . -B build-gpu -G "$G" -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DRENAISSANCE_NVJPEG=ON -DRENAISSANCE_BUILD_BENCHMARKS=OFF "${PREFIX_ARGS[@]}" >"$OUT/configure.log" 2>&1 ||
  { tail -30 "$OUT/configure.log"; exit 1; }
grep "Renaissance:" "$OUT/configure.log"
cmake --build build-gpu -j"$(nproc)" --target renaissance_cli test_gpu_jpeg >"$OUT/build.log" 2>&1 ||
  { grep -a -B2 -A8 "error" "$OUT/build.log" | head -60; exit 1; }
RN=build-gpu/app/renaissance
rc=0
for step in $STEPS; do
  case $step in
    tests)
      say "test_gpu_jpeg"
      build-gpu/tests/gpu_runtime/test_gpu_jpeg 2>&1 | tee "$OUT/test_gpu_jpeg.log" | grep -E "^\[ (decode|train) \]|OK|FAILED|SKIPPED|PASSED|Failure|Expected|Which|actual" | head -80
      [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
      ;;
    bench | train)
      if [[ -z "${STORE:-}" ]]; then
        STORE=/tmp/rn-imagenet-like.h5
        if [[ ! -e $STORE ]]; then
          n=${IMAGES:-50000}
          say "generate $n ImageNet-like JPEGs (1000 classes, ~500x375, quality 90)"
          python3 scripts/make_image_folder.py imagenet-like /tmp/rn-imagenet-like --classes 1000 \
            --train-per-class $((n / 1000)) --val-per-class 5 2>&1 | tail -1
          say "import --store jpeg"
          { time $RN data import folder /tmp/rn-imagenet-like --out $STORE --store jpeg; } 2>&1 | tail -8
        fi
      fi
      if [[ $step == bench ]]; then
        say "bench-decode $STORE"
        $RN data bench-decode "$STORE" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench_decode.log"
        $RN data bench-decode "$STORE" --no-hardware ${BENCH_ARGS:-} 2>&1 | tee -a "$OUT/bench_decode.log"
      else
        say "train ResNet-50 from $STORE"
        $RN train --device cuda --model resnet50 --amp --batch 256 --data "$STORE" --crop random-resized --decode gpu \
          --max-steps "${TRAIN_STEPS:-100}" --no-validate --log-every 20 2>&1 | tee "$OUT/train_jpeg.log" | tail -15
        $RN bench --model resnet50 --amp --batch 256 --device cuda 2>&1 | tail -3 | tee -a "$OUT/train_jpeg.log"
      fi
      ;;
    *) say "unknown step $step"; rc=1 ;;
  esac
done
say "done (exit $rc)"
exit $rc
