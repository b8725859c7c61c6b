#!/usr/bin/env bash
# nvJPEG beside other GPU work, one call on the GPU machine (docs/input-pipeline.md, "Why the decode waited"):
# compiles tests/gpu_runtime/nvjpeg_busy_probe.cu with nvcc (no project build needed), generates 300 ImageNet-like
# JPEGs, then runs the probe's queue experiment with CUDA's default 8 and with 32 hardware queues, and its parallel
# experiment (output formats, two decoder threads, bytes per decoder). Logs in $OUT.
#   scripts/bench/nvjpeg_probe.sh            (carry .deps/nvjpeg when the toolkit has no nvjpeg.h)
# MODES (default "queues parallel").
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
OUT=${OUT:-out}
mkdir -p "$OUT"
INC=() LIB=()
if [[ -e .deps/nvjpeg/include/nvjpeg.h ]]; then
  INC=(-I.deps/nvjpeg/include) LIB=(-L.deps/nvjpeg/lib)
  export LD_LIBRARY_PATH=$PWD/.deps/nvjpeg/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
nvcc -std=c++17 -O2 -arch=sm_90 "${INC[@]}" tests/gpu_runtime/nvjpeg_busy_probe.cu "${LIB[@]}" -lnvjpeg \
  -o /tmp/nvjpeg_busy_probe || exit 1
JPEGS=/tmp/nvjpeg-probe-jpegs
if [[ ! -d $JPEGS ]]; then
  python3 scripts/make_image_folder.py imagenet-like /tmp/nvjpeg-probe-folder --classes 2 --train-per-class 150 \
    --val-per-class 1 | tail -1
  mkdir -p $JPEGS
  i=0
  for f in $(find /tmp/nvjpeg-probe-folder/train -type f | sort | head -300); do
    cp "$f" "$JPEGS/$(printf %05d $i).jpg"
    i=$((i + 1))
  done
fi
for mode in ${MODES:-queues parallel}; do
  case $mode in
    queues)
      env -u CUDA_DEVICE_MAX_CONNECTIONS /tmp/nvjpeg_busy_probe $JPEGS 256 hardware | tee "$OUT/probe-queues8.log"
      CUDA_DEVICE_MAX_CONNECTIONS=32 /tmp/nvjpeg_busy_probe $JPEGS 256 hardware | tee "$OUT/probe-queues32.log" ;;
    parallel)
      CUDA_DEVICE_MAX_CONNECTIONS=32 /tmp/nvjpeg_busy_probe $JPEGS 256 parallel | tee "$OUT/probe-parallel.log" ;;
    *) echo "unknown mode $mode"; exit 2 ;;
  esac
done
