#!/usr/bin/env bash
# Renaissance against PyTorch on the same CPU cores, interleaved (issue 19): `renaissance train` and
# scripts/bench/pytorch_cpu_fmnist.py (same net, recipe, batch 128, channels_last, momentum 0.9 throughout as ours
# without --onecycle-momentum: PyTorch's OneCycleLR would cycle it) take turns, one epoch of
# Fashion-MNIST each, PAIRS times per model; the training img/s of each run and the ratio of the medians.
#   scripts/bench/cpu_vs_pytorch.sh [build-dir] [out-dir]     (env: PAIRS=2, MODELS="fmnist_cnn resnet18_fmnist_narrow",
#                                                               THREADS=the affinity mask's CPU count, DATA,
#                                                               WINOGRAD="on" (the default) or "on off": ours once
#                                                               per --cpu-winograd setting)
# Run it on a quiet machine: both sides use every core, and other load moves the figures more than the kernels do.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
BUILD=${1:-build}
OUT_DIR=${2:-${OUT:-out}/cpu_vs_pytorch}
mkdir -p "$OUT_DIR"
RN="$BUILD/app/renaissance"
PY=${PYTHON:-/usr/bin/python3}
PAIRS=${PAIRS:-2}
MODELS=${MODELS:-"fmnist_cnn resnet18_fmnist_narrow"}
THREADS=${THREADS:-$(nproc)}
DATA=${DATA:-data/fashion-mnist.h5}
WINOGRAD=${WINOGRAD:-on}
[[ -x $RN ]] || { echo "cpu_vs_pytorch: no $RN (build first)" >&2; exit 2; }
[[ -f $DATA ]] || "$RN" data import fashion-mnist --out "$DATA" >/dev/null || exit 1
J="$OUT_DIR/runs.jsonl"
: >"$J"
ips() { "$PY" -c 'import json,sys; print(json.loads([l for l in open(sys.argv[1]) if l.strip()][-1])["images_per_s"])' "$1"; }
for model in $MODELS; do
  if [[ $model == fmnist_cnn ]]; then ours=(--model fmnist_cnn); else ours=(--model-file "models/$model.yaml"); fi
  for p in $(seq 1 "$PAIRS"); do
    for wino in $WINOGRAD; do
      fw="renaissance (Winograd, the default)"
      [[ $wino == off ]] && fw="renaissance --cpu-winograd off"
      m="$OUT_DIR/ours-$model-$p-w$wino.jsonl"
      RENAISSANCE_CPU_THREADS=$THREADS "$RN" train "${ours[@]}" --data "$DATA" --epochs 1 --batch 128 --device cpu \
        --no-validate --cpu-winograd "$wino" --metrics "$m" >"$OUT_DIR/ours-$model-$p-w$wino.log" 2>&1 ||
        { echo "ours $model failed" >&2; tail "$OUT_DIR/ours-$model-$p-w$wino.log"; exit 1; }
      echo "{\"framework\": \"$fw\", \"model\": \"$model\", \"pair\": $p, \"images_per_s\": $(ips "$m")}" >>"$J"
    done
    t="$OUT_DIR/torch-$model-$p.jsonl"
    "$PY" scripts/bench/pytorch_cpu_fmnist.py --model "$model" --data "$DATA" --epochs 1 --threads "$THREADS" \
      --channels-last --no-validate --no-cycle-momentum >"$t" 2>"$OUT_DIR/torch-$model-$p.log" || { echo "pytorch $model failed" >&2; tail "$OUT_DIR/torch-$model-$p.log"; exit 1; }
    echo "{\"framework\": \"pytorch\", \"model\": \"$model\", \"pair\": $p, \"images_per_s\": $(ips "$t")}" >>"$J"
    tail -n $(($(wc -w <<<"$WINOGRAD") + 1)) "$J"
  done
done
"$PY" - "$J" <<'PY' | tee "$OUT_DIR/table.md"
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print("| model | ours | Renaissance img/s (each run) | PyTorch img/s (each run) | ratio of medians |")
print("|---|---|---|---|---|")
for m in dict.fromkeys(r["model"] for r in rows):
    b = [r["images_per_s"] for r in rows if r["model"] == m and r["framework"] == "pytorch"]
    for fw in dict.fromkeys(r["framework"] for r in rows if r["framework"] != "pytorch"):
        a = [r["images_per_s"] for r in rows if r["model"] == m and r["framework"] == fw]
        print(f"| {m} | {fw} | {', '.join(f'{x:,.0f}' for x in a)} | {', '.join(f'{x:,.0f}' for x in b)} | "
              f"**{statistics.median(a) / statistics.median(b):.2f}×** |")
PY
