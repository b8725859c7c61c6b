#!/usr/bin/env bash
# PyTorch interoperability (issue 6): weights trained by Renaissance, exported to a PyTorch state_dict, give the
# same logits in PyTorch (FP32, eval mode) as `renaissance predict` on the same normalised batch, and a state_dict
# imported back scores exactly like the original weights.
#
#   run_interop_test.sh CLI PYTHON WORKDIR [--device cpu|cuda] [--models "fmnist_cnn resnet50@32 models/x.yaml ..."]
#
# A model is a zoo name, optionally @RESOLUTION (3-channel zoo models get a synthetic 10-class dataset of that
# size), or a YAML file under the source tree.
#
# Exit 77 (CTest: skipped) when PYTHON lacks torch, h5py, numpy or PyYAML, or with --device cuda where no GPU is visible.
set -euo pipefail
CLI=$1 PY=$2 WORK=$3
shift 3
DEVICE=cpu
MODELS="fmnist_cnn models/resnet18_fmnist_narrow.yaml models/tiny_resnet.yaml resnet18@32 resnet50@32"
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) DEVICE=$2; shift 2 ;;
    --models) MODELS=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
SRC=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if ! "$PY" -c "import torch, h5py, numpy, yaml" 2>/dev/null; then
  echo "SKIP: $PY cannot import torch, h5py, numpy and yaml (Debian: python3-torch python3-h5py python3-yaml)"
  exit 77
fi
if [[ $DEVICE == cuda ]] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }; then
  echo "SKIP: --device cuda, and no GPU is visible (nvidia-smi -L lists none)"
  exit 77
fi
RDEV=$DEVICE  # the same device on both sides
rm -rf "$WORK" && mkdir -p "$WORK" && cd "$WORK"
dataset() {  # dataset H W C -> file name (made once)
  local f="syn_$1x$2x$3.h5"
  [[ -f $f ]] || "$CLI" data synthetic --out "$f" --train 256 --val 100 --shape "$1,$2,$3" --classes 10 --seed 1 >/dev/null
  echo "$f"
}

fail=0
for m in $MODELS; do
  if [[ $m == *.yaml ]]; then
    MODEL=(--model-file "$SRC/$m"); tag=$(basename "$m" .yaml)
  elif [[ $m == *@* ]]; then
    MODEL=(--model "${m%@*}" --resolution "${m#*@}" --classes 10); tag="${m%@*}_${m#*@}"
  else
    MODEL=(--model "$m"); tag=$m
  fi
  case $tag in
    fmnist_cnn|*fmnist*) data=$(dataset 28 28 1) ;;
    tiny_resnet|resnet18_cifar) data=$(dataset 32 32 3) ;;
    *_*[0-9]) data=$(dataset "${m#*@}" "${m#*@}" 3) ;;
    *) data=$(dataset 224 224 3) ;;
  esac
  echo "==== $tag on $data ($DEVICE)"
  # A few steps, so the BN running statistics and weights are far from their initial values.
  "$CLI" train "${MODEL[@]}" --data "$data" --epochs 1 --max-steps 6 --batch 16 --lr 0.02 --no-validate \
    --device "$RDEV" --save "$tag.h5" | tail -1
  # 100 samples in batches of 32: the last batch is partial (padded inside predict).
  "$CLI" predict "${MODEL[@]}" --data "$data" --weights "$tag.h5" --count 100 --batch 32 --device "$RDEV" \
    --out "$tag.logits.h5"
  for layout in auto renaissance; do
    "$PY" "$SRC/scripts/export_pytorch.py" "$tag.h5" --out "$tag.$layout.pt" --layout "$layout" \
      --check-logits "$tag.logits.h5" --data "$data" --device "$DEVICE" --tolerance 1e-4 || fail=1
  done
  # Round trip: state_dict -> Renaissance weights -> identical tensors and identical eval.
  "$PY" "$SRC/scripts/import_pytorch.py" "$tag.auto.pt" --out "$tag.rt.h5" "${MODEL[@]}" --renaissance "$CLI"
  "$PY" - "$tag.h5" "$tag.rt.h5" <<'PYEOF' || fail=1
import sys, h5py, numpy as np
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
n = 0
for g in ("params", "bn"):
    if set(a[g]) != set(b[g]):
        sys.exit(f"FAIL: /{g} names differ: {sorted(set(a[g]) ^ set(b[g]))[:5]}")
    for k in a[g]:
        if not np.array_equal(a[g][k][...], b[g][k][...]):
            sys.exit(f"FAIL: /{g}/{k} differs after export + import")
        n += 1
print(f"round trip: {n} tensors bit-identical")
PYEOF
  e1=$("$CLI" eval "${MODEL[@]}" --data "$data" --weights "$tag.h5" --device "$RDEV" --json | tail -1)
  e2=$("$CLI" eval "${MODEL[@]}" --data "$data" --weights "$tag.rt.h5" --device "$RDEV" --json | tail -1)
  s1=$(echo "$e1" | sed 's/"weights":"[^"]*",//') s2=$(echo "$e2" | sed 's/"weights":"[^"]*",//')
  if [[ "$s1" != "$s2" ]]; then
    echo "FAIL: eval differs after the round trip:"; echo "  $e1"; echo "  $e2"; fail=1
  else
    echo "round trip eval identical: $s1"
  fi
done
# The check can fail: logits off by 0.1 % must be reported.
first=$(ls -- *.logits.h5 | head -1)
cp "$first" perturbed.logits.h5
"$PY" -c "import h5py; f = h5py.File('perturbed.logits.h5', 'r+'); f['logits'][...] = f['logits'][...] * 1.001"
tag=${first%.logits.h5}
if "$PY" "$SRC/scripts/export_pytorch.py" "$tag.h5" --out perturbed.pt --check-logits perturbed.logits.h5 \
  --data "$(ls syn_*.h5 | head -1)" --device "$DEVICE" >/dev/null 2>&1; then
  echo "FAIL: the logits check accepted perturbed logits"; fail=1
else
  echo "negative control: perturbed logits rejected"
fi
# Hostile or mistaken use (found by a review): each a one-line error, exit 1, the inputs unchanged.
refused() {  # refused WHAT MUST_SAY CMD...: exit 1 with MUST_SAY in the last line
  local what=$1 must=$2 out rc
  shift 2
  out=$("$@" 2>&1) && rc=0 || rc=$?
  if [[ $rc -ne 1 || "$(tail -1 <<<"$out")" != *"$must"* ]]; then
    echo "FAIL: $what: exit $rc, not 1 with '$must':"; echo "$out" | tail -3; fail=1
  else
    echo "refused: $what: $(tail -1 <<<"$out" | cut -c1-120)"
  fi
}
before=$(sha256sum "$tag.h5" "$tag.auto.pt")
refused "export --out the weights" "--out is the same file as the weights" \
  "$PY" "$SRC/scripts/export_pytorch.py" "$tag.h5" --out "$tag.h5"
refused "import --out the state_dict" "--out is the same file as the state_dict" \
  "$PY" "$SRC/scripts/import_pytorch.py" "$tag.auto.pt" --out "$tag.auto.pt" --like "$tag.h5"
refused "import --out the --like file" "--out is the same file as --like" \
  "$PY" "$SRC/scripts/import_pytorch.py" "$tag.auto.pt" --out "$tag.h5" --like "$tag.h5"
[[ "$(sha256sum "$tag.h5" "$tag.auto.pt")" == "$before" ]] || { echo "FAIL: an input was changed"; fail=1; }
# A zeroed tensor passes h5py's Fletcher32 check but not the checksum header; a NaN is a diverged run's.
cp "$tag.h5" zeroed.h5
"$PY" - zeroed.h5 <<'PYEOF'
import sys, h5py, numpy as np
with open(sys.argv[1], "rb") as f:
    data = bytearray(f.read())
with h5py.File(sys.argv[1], "r") as f:
    raw = np.asarray(f["params"][sorted(f["params"])[0]][...], dtype="<f4").tobytes()
off = data.find(raw)  # found by content: the tensor's stored chunk (one chunk, no filter but Fletcher32)
assert off > 0 and not np.all(np.frombuffer(raw, np.uint8) == 0)
data[off:off + len(raw)] = bytes(len(raw))
open(sys.argv[1], "wb").write(bytes(data))
PYEOF
refused "export of a zeroed tensor" "does not match its checksum" \
  "$PY" "$SRC/scripts/export_pytorch.py" zeroed.h5 --out zeroed.pt
# A pickle that runs code when loaded: refused by torch.load(weights_only=True), nothing run.
"$PY" - evil.pt <<'PYEOF'
import os, sys, torch
class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned.txt",))
torch.save({"conv1.weight": Evil()}, sys.argv[1])
PYEOF
refused "import of a pickle that runs code" "not a plain state_dict" \
  "$PY" "$SRC/scripts/import_pytorch.py" evil.pt --out evil.h5 --like "$tag.h5"
[[ ! -e pwned.txt ]] || { echo "FAIL: loading evil.pt ran its code"; fail=1; }
# A 1-channel state_dict into the same network with 3 input channels: the missing channels were zero-filled, exit 0
# (padding is for --amp's first conv, to 8 channels, only).
if [[ -f fmnist_cnn.auto.pt ]]; then
  sed 's/^input: \[28, 28, 1\]/input: [28, 28, 3]/' "$SRC/models/fmnist_cnn.yaml" >fm3.yaml
  refused "import into a model of other input channels" "1 input channels in the state_dict, 3 in the model" \
    "$PY" "$SRC/scripts/import_pytorch.py" fmnist_cnn.auto.pt --out fm3.h5 --model-file fm3.yaml --renaissance "$CLI"
  refused "import into a model of other input channels, --amp" "1 input channels in the state_dict, 3 in the model" \
    "$PY" "$SRC/scripts/import_pytorch.py" fmnist_cnn.auto.pt --out fm3.h5 --model-file fm3.yaml --amp \
    --renaissance "$CLI"
else
  echo "not checked: importing into a model of other input channels (fmnist_cnn is not among --models)"
fi
if [[ $fail -ne 0 ]]; then echo "INTEROP FAILED"; exit 1; fi
echo "INTEROP OK"
