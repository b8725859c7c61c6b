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
# Two layers whose names differ only in '.' and '_' ('x.y', 'x_y'): both became the PyTorch module 'x_y' and the export
# wrote one of their tensors, dropping the other, exit 0.
d8=$(dataset 8 8 1)
cat >collide.yaml <<'YAML'
name: collide
input: [8, 8, 1]
layers:
  - conv: {out: 4, k: 3, pad: 1, name: x.y}
  - relu
  - conv: {out: 4, k: 3, pad: 1, name: x_y}
  - gap
  - fc: {out: 10}
  - softmax_ce: {classes: 10}
YAML
"$CLI" train --model-file collide.yaml --data "$d8" --epochs 1 --max-steps 1 --batch 8 --no-validate \
  --device "$RDEV" --save collide.h5 >/dev/null
refused "export of two layers on one module name" "layers 'x.y' and 'x_y' both become the PyTorch module 'x_y'" \
  "$PY" "$SRC/scripts/export_pytorch.py" collide.h5 --out collide.pt
[[ ! -e collide.pt ]] || { echo "FAIL: the colliding export wrote collide.pt"; fail=1; }
# --ema: every EMA export failed (the /ema lookup came before skipping the bias convs do not have).
d28=$(dataset 28 28 1)
"$CLI" train --model fmnist_cnn --data "$d28" --epochs 1 --max-steps 3 --batch 16 --lr 0.02 --ema --no-validate \
  --device "$RDEV" --save ema.h5 | tail -1
"$CLI" predict --model fmnist_cnn --data "$d28" --weights ema.h5 --ema --count 32 --device "$RDEV" --out ema.logits.h5
"$PY" "$SRC/scripts/export_pytorch.py" ema.h5 --out ema.pt --ema --check-logits ema.logits.h5 --data "$d28" \
  --device "$DEVICE" || { echo "FAIL: --ema export"; fail=1; }
# auto takes a torchvision twin only where it computes exactly what the plan does: these were taken for an FmnistCnn
# or a torchvision ResNet (first conv's width, tensor kinds, stage count) and gave wrong logits with exit 0.
sed '0,/stride: 1/s//stride: 2/' "$SRC/models/fmnist_cnn.yaml" >strided.yaml  # a strided first conv
sed 's/^input: \[28, 28, 1\]/input: [32, 32, 1]/' "$SRC/models/fmnist_cnn.yaml" >fmnist32.yaml  # 8x8 before fc
sed -e 's/- cbr: {out: \([0-9]*\), k: 3, stride: 1, pad: 1}/- conv: {out: \1, k: 3, pad: 1}\n  - bn\n  - tanh/' \
  "$SRC/models/fmnist_cnn.yaml" >tanh.yaml
N=$SRC/models/resnet18_fmnist_narrow.yaml
sed '/- cbr:/a\  - maxpool: {k: 3, stride: 2, pad: 1}' "$N" >rn_pool.yaml  # small stem + max-pool
sed 's/out: 128/out: 64/' "$N" >rn_width.yaml                           # stage widths 16 32 64 64
sed 's/out: 32, kind: RESNET_3_3, stride: 2/out: 32, kind: RESNET_3_3, stride: 1/' "$N" >rn_stride.yaml
for m in strided fmnist32 tanh rn_pool rn_width rn_stride; do
  data=$d28; [[ $m == fmnist32 ]] && data=$(dataset 32 32 1)
  "$CLI" train --model-file "$m.yaml" --data "$data" --epochs 1 --max-steps 1 --batch 16 --lr 0.05 --no-validate \
    --device "$RDEV" --save "$m.h5" >/dev/null
  "$CLI" predict --model-file "$m.yaml" --data "$data" --weights "$m.h5" --count 32 --device "$RDEV" \
    --out "$m.logits.h5" >/dev/null
  out=$("$PY" "$SRC/scripts/export_pytorch.py" "$m.h5" --out "$m.pt" --check-logits "$m.logits.h5" --data "$data" \
    --device "$DEVICE" 2>&1) && rc=0 || rc=$?
  if [[ $rc -ne 0 || $out != *"renaissance layout"* ]]; then
    echo "FAIL: $m, --layout auto: exit $rc"; echo "$out"; fail=1
  else
    echo "auto layout of $m: $(tail -1 <<<"$out" | cut -c1-100)"
  fi
done
refused "--layout torchvision without an exact twin" "no torchvision-style twin computes what this model does" \
  "$PY" "$SRC/scripts/export_pytorch.py" rn_stride.h5 --out x.pt --layout torchvision
# Export: bad files and logits that do not fit.
echo "not HDF5" >text.h5
refused "export of a text file" "text.h5: not an HDF5 file" "$PY" "$SRC/scripts/export_pytorch.py" text.h5 --out x.pt
"$PY" -c "import h5py; h5py.File('noarch.h5', 'w').attrs['format'] = 'renaissance-weights'"
refused "export without arch_plan" "noarch.h5: no arch_plan attribute" \
  "$PY" "$SRC/scripts/export_pytorch.py" noarch.h5 --out x.pt
"$PY" - ema.logits.h5 <<'PYEOF'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1], "r") as f:
    logits, labels, attrs = f["logits"][...], f["labels"][...], dict(f.attrs)
def write(name, logits=logits, labels=labels, drop=()):
    with h5py.File(name, "w") as g:
        g.attrs.update({k: v for k, v in attrs.items() if k not in drop})
        g["logits"], g["labels"] = logits, labels
write("lg_classes.h5", logits=logits[:, :5])
write("lg_empty.h5", logits=logits[:0], labels=labels[:0])
write("lg_nosplit.h5", drop=("split",))
write("lg_short.h5", labels=labels[:10])
PYEOF
for c in "lg_classes:5 logits per sample, the model gives 10" "lg_empty:no samples to compare" \
  "lg_nosplit:no split" "lg_short:10 labels for 32 rows of logits"; do
  refused "--check-logits ${c%%:*}" "${c#*:}" "$PY" "$SRC/scripts/export_pytorch.py" ema.h5 --out x.pt \
    --check-logits "${c%%:*}.h5" --data "$d28"
done
refused "--device bogus" "--device bogus: not a PyTorch device" "$PY" "$SRC/scripts/export_pytorch.py" ema.h5 \
  --out x.pt --check-logits ema.logits.h5 --data "$d28" --device bogus
if "$PY" -c "import sys, torch; sys.exit(torch.cuda.is_available())"; then  # exit 0: no CUDA here
  refused "--device cuda without CUDA" "sees no CUDA device" "$PY" "$SRC/scripts/export_pytorch.py" ema.h5 \
    --out x.pt --check-logits ema.logits.h5 --data "$d28" --device cuda
fi
# Import: each tensor's exact shape (a 9x1 kernel for a 3x3 went in reshaped), finite dense floating-point tensors.
"$PY" - ema.pt <<'PYEOF'
import sys, torch
sd = torch.load(sys.argv[1])
def save(name, key, value):
    torch.save(dict(sd, **{key: value}), name)
save("sd_k91.pt", "conv2.weight", sd["conv2.weight"].reshape(64, 32, 9, 1))
save("sd_fct.pt", "fc.weight", sd["fc.weight"].t().contiguous())
save("sd_nan.pt", "conv1.weight", sd["conv1.weight"].clone().index_fill_(0, torch.tensor([0]), float("nan")))
save("sd_int.pt", "bn1.bias", 3)
save("sd_sparse.pt", "fc.bias", sd["fc.bias"].to_sparse())
PYEOF
for c in "sd_k91:'conv2.weight': shape [64, 32, 9, 1] in the state_dict, the model's is [64, 32, 3, 3]" \
  "sd_fct:'fc.weight': shape [3136, 10] in the state_dict, the model's is [10, 3136]" \
  "sd_nan:'conv1.weight' holds a non-finite value" "sd_int:'bn1.bias' is of type int, not a tensor" \
  "sd_sparse:'fc.bias' is a torch.sparse_coo tensor"; do
  refused "import ${c%%:*}" "${c#*:}" "$PY" "$SRC/scripts/import_pytorch.py" "${c%%:*}.pt" --out x.h5 --like ema.h5
done
refused "import of a text file" "text.h5: not a PyTorch file" \
  "$PY" "$SRC/scripts/import_pytorch.py" text.h5 --out x.h5 --like ema.h5
refused "import --like a text file" "text.h5: not an HDF5 file" \
  "$PY" "$SRC/scripts/import_pytorch.py" ema.pt --out x.h5 --like text.h5
refused "import --renaissance /nonexistent" "--renaissance /nonexistent: no such executable" \
  "$PY" "$SRC/scripts/import_pytorch.py" ema.pt --out x.h5 --model fmnist_cnn --renaissance /nonexistent
refused "import torchvision keys into a model without that twin" "no torchvision-style twin computes what" \
  "$PY" "$SRC/scripts/import_pytorch.py" ema.pt --out x.h5 --like strided.h5
[[ ! -e x.h5 && ! -e x.pt ]] || { echo "FAIL: a refused export or import wrote its --out"; fail=1; }
# golden_pytorch.py (a developer tool): --out a file, a device PyTorch lacks.
refused "golden --out a file" "--out text.h5: not a directory" \
  "$PY" "$SRC/scripts/golden_pytorch.py" --out text.h5 --renaissance "$CLI"
refused "golden --device bogus" "--device bogus: not a PyTorch device" \
  "$PY" "$SRC/scripts/golden_pytorch.py" --out golden --device bogus --renaissance "$CLI"
if [[ $fail -ne 0 ]]; then echo "INTEROP FAILED"; exit 1; fi
echo "INTEROP OK"
