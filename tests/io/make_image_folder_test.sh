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
# A non-empty OUT: the earlier run's files stayed among the new ones (and were imported with them).
expect 1 "$work/f: exists and is not empty" imagenet-like "$work/f" --classes 1 --train-per-class 1
# fashion-mnist: the idx headers checked before any image (truncated data, a label >= 10 and swapped files were
# numpy tracebacks or a KeyError mid-way).
"$py" - "$work" <<'EOF'
import gzip, os, struct, sys
import numpy as np
work = sys.argv[1]
def idx(d, prefix, x, y, images_magic=2051, labels_magic=2049, cut=0):
    os.makedirs(d, exist_ok=True)
    img = struct.pack(">IIII", images_magic, len(x), 28, 28) + x.tobytes()
    with gzip.open(f"{d}/{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write(img[:len(img) - cut])
    with gzip.open(f"{d}/{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", labels_magic, len(y)) + y.tobytes())
x, y = np.zeros((4, 28, 28), np.uint8), np.arange(4, dtype=np.uint8)
for name, kw in (("good", {}), ("truncated", dict(cut=100)), ("label12", dict(y=np.full(4, 12, np.uint8))),
                 ("swapped", dict(images_magic=2049, labels_magic=2051))):
    for prefix in ("train", "t10k"):
        idx(f"{work}/idx-{name}", prefix, **dict(dict(x=x, y=y), **kw))
EOF
expect 1 "train-images-idx3-ubyte.gz: 3036 bytes of data, the header says 4 x 28 x 28 = 3136" \
  fashion-mnist "$work/h" --src "$work/idx-truncated"
expect 1 "train-labels-idx1-ubyte.gz: label 12 at index 0; Fashion-MNIST has 10 classes" \
  fashion-mnist "$work/h" --src "$work/idx-label12"
expect 1 "train-images-idx3-ubyte.gz: magic 2049, not 2051 (idx images): an idx labels file" \
  fashion-mnist "$work/h" --src "$work/idx-swapped"
[[ ! -e $work/g && ! -e $work/h ]] || { echo "FAIL: $work/g or $work/h was made"; fail=1; }
out=$("$py" "$script" fashion-mnist "$work/h" --src "$work/idx-good" 2>&1) || { echo "FAIL: $out"; fail=1; }
n=$(find "$work/h" -name '*.png' | wc -l)
((n == 8)) || { echo "FAIL: $n PNGs from the good idx files, not 8: $out"; fail=1; }
exit $fail
