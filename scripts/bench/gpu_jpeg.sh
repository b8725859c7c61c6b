#!/usr/bin/env bash
# JPEG stores decoded on the GPU (issue 12), one call on the GPU machine: build (sm_90), the nvJPEG tests, then
# bench-decode and (optionally) ResNet-50 training from a JPEG store. Logs and results in $OUT.
#
#   STORE=data/imagenet-like.h5 scripts/bench/gpu_jpeg.sh        # a store made elsewhere (carried or on disk)
#   IMAGES=50000 scripts/bench/gpu_jpeg.sh                        # generate and import one here (needs libturbojpeg:
#                                                                 #  TURBOJPEG_PREFIX below)
# STEPS (default "tests bench"): tests = test_gpu_jpeg; bench = data bench-decode STORE (BENCH_ARGS, default 5,120
# images, 2 timed passes); train = ResNet-50 AMP b256 --crop random-resized --decode gpu from STORE for TRAIN_EPOCHS
# (default 2) epochs; raw = the same folder imported as a raw store (--size RAW_SIZE, default 256) and ResNet-50
# trained from it the same way (the device cache on: --data-cache auto); then `bench` for the same model beside them
# (the last step that trains runs it). DECODE (default gpu) is --decode for the JPEG store's run; TRAIN_VARIANTS
# (';'-separated extra train arguments) trains once per variant.
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
# shellcheck disable=SC2086
cmake --build build-gpu -j"$(nproc)" --target renaissance_cli test_gpu_jpeg ${EXTRA_TARGETS:-} >"$OUT/build.log" 2>&1 ||
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
    bench | train | raw)
      FOLDER=/tmp/rn-imagenet-like
      if [[ ! -d $FOLDER/train ]] && { [[ -z "${STORE:-}" ]] || [[ $step == raw ]]; }; then
        n=${IMAGES:-50000}
        say "generate $n ImageNet-like JPEGs (1000 classes, ~500x375, quality 90)"
        python3 scripts/make_image_folder.py imagenet-like $FOLDER --classes 1000 \
          --train-per-class $((n / 1000)) --val-per-class 5 2>&1 | tail -1
        say "generated"
      fi
      if [[ -z "${STORE:-}" ]]; then
        STORE=/tmp/rn-imagenet-like.h5
        if [[ ! -e $STORE ]]; then
          say "import --store jpeg"
          { time $RN data import folder $FOLDER --out $STORE --store jpeg; } 2>&1 | tail -8 | tee -a "$OUT/import.log"
        fi
      fi
      train_args=(--device cuda --model resnet50 --amp --batch 256 --crop random-resized --epochs "${TRAIN_EPOCHS:-2}"
        --no-validate --log-every 50)
      if [[ $step == bench ]]; then
        say "bench-decode $STORE"
        # shellcheck disable=SC2086
        $RN data bench-decode "$STORE" ${BENCH_ARGS:---images 5120 --passes 2} 2>&1 | tee "$OUT/bench_decode.log"
        # shellcheck disable=SC2086
        $RN data bench-decode "$STORE" --no-hardware ${BENCH_ARGS:---images 5120 --passes 2} 2>&1 |
          tee -a "$OUT/bench_decode.log"
      elif [[ $step == train ]]; then
        # TRAIN_VARIANTS: ';'-separated extra arguments, one training each (e.g. "--data-cache off;--data-cache on");
        # default: one training with none.
        IFS=';' read -r -a variants <<<"${TRAIN_VARIANTS:- }"
        : >"$OUT/train_jpeg.log"
        for extra in "${variants[@]}"; do
          say "train ResNet-50 from $STORE (--decode ${DECODE:-gpu} $extra)"
          # shellcheck disable=SC2086
          $RN train "${train_args[@]}" --data "$STORE" --decode "${DECODE:-gpu}" $extra 2>&1 |
            tee -a "$OUT/train_jpeg.log" | grep -v "^step" | tail -12
          t=${PIPESTATUS[0]}; ((t == 0)) || { say "train exit $t"; rc=1; }  # not lost in the pipe
        done
        say "bench"
        $RN bench --model resnet50 --amp --batch 256 --device cuda 2>&1 | tail -2 | tee -a "$OUT/train_jpeg.log"
      else
        RAW=/tmp/rn-imagenet-like-raw${RAW_SIZE:-256}.h5
        if [[ ! -e $RAW ]]; then
          say "import --store raw --size ${RAW_SIZE:-256}"
          { time $RN data import folder $FOLDER --out $RAW --store raw --size "${RAW_SIZE:-256}"; } 2>&1 | tail -8 |
            tee -a "$OUT/import.log"
        fi
        say "train ResNet-50 from $RAW"
        $RN train "${train_args[@]}" --data "$RAW" --data-cache auto 2>&1 | tee "$OUT/train_raw.log" |
          grep -v "^step" | tail -12
        t=${PIPESTATUS[0]}; ((t == 0)) || { say "train exit $t"; rc=1; }
        say "bench"
        $RN bench --model resnet50 --amp --batch 256 --device cuda 2>&1 | tail -2 | tee -a "$OUT/train_raw.log"
      fi
      ;;
    none) ;;
    *) say "unknown step $step"; rc=1 ;;
  esac
done
say "done (exit $rc)"
exit $rc
