#!/usr/bin/env bash
# scripts/make_image_folder.py (docs/input-pipeline.md, docs/benchmarks.md): a small ImageNet-like folder made and
# imported by `renaissance data import folder`; bad arguments stop it before any image with exit 2 (argparse) or 1
# (OUT), naming the argument, never a traceback or a "wrote -6 JPEGs".
#   tests/io/make_image_folder_test.sh PYTHON SOURCE_DIR WORK_DIR RENAISSANCE_CLI
set -uo pipefail
py=$1 src=$2 work=$3 cli=$4
"$py" -c "import numpy, PIL" 2>/dev/null || { echo "SKIP: $py has no numpy/Pillow"; exit 77; }
script=$src/scripts/make_image_folder.py
rm -rf "$work" && mkdir -p "$work" || exit 1
fail=0
out=$("$py" "$script" imagenet-like "$work/f" --classes 2 --train-per-class 2 --val-per-class 1 --size 32x24 \
  --workers 1 2>&1) || { echo "FAIL: $out"; fail=1; }
n=$(find "$work/f" -name '*.JPEG' -o -name '*.jpg' | wc -l)
((n == 6)) || { echo "FAIL: $n images, not 6: $out"; fail=1; }
"$cli" data import folder "$work/f" --out "$work/f.h5" >"$work/import.txt" 2>&1 ||
  { cat "$work/import.txt"; echo "FAIL: the folder does not import"; fail=1; }
expect() {  # expect CODE MESSAGE ARGS...
  local code=$1 want=$2
  shift 2
  local o rc
  o=$("$py" "$script" "$@" 2>&1)
  rc=$?
  if ((rc != code)) || [[ $o != *"$want"* ]] || [[ $o == *Traceback* ]]; then
    echo "FAIL ($*): exit $rc, wanted $code and '$want':"
    echo "$o"
    fail=1
  else
    echo "ok: $want"
  fi
}
expect 2 "argument --classes: must be >= 1, got -1" imagenet-like "$work/g" --classes -1
expect 2 "argument --train-per-class: must be >= 1, got -3" imagenet-like "$work/g" --train-per-class -3
expect 2 "argument --quality: a JPEG quality is 1 to 100, got 500" imagenet-like "$work/g" --quality 500
expect 2 "argument --size: WxH with each side from 8 to 16384 pixels" imagenet-like "$work/g" --size 64x-5
expect 1 "$work/f.h5: exists and is not a directory" imagenet-like "$work/f.h5" --classes 1
expect 1 "$work/none/train-images-idx3-ubyte.gz" fashion-mnist "$work/h" --src "$work/none"
[[ ! -e $work/g ]] || { echo "FAIL: $work/g was made"; fail=1; }
exit $fail
