#!/usr/bin/env bash
# Fashion-MNIST recipe sweep on the GPU machine (issue 12's recipe, recipes/fmnist-resnet18.yaml): trains the recipe
# with each ';'-separated set of extra arguments in VARIANTS for each seed in SEEDS, JOBS at a time on the one GPU
# (the engine cache is filled by a first run alone, so every run uses the same engines), and prints one line per
# run: variant, seed, final val_top1 (and ema_val_top1 with --ema, tta_val_top1 with --tta flip), the first
# epoch's training loss (a bad start shows there), wall seconds. Needs build-gpu (gpu_session.sh)
# and Fashion-MNIST's idx.gz files in data/cache/fashion-mnist (carried). ENGINE_CACHE=each: every run times its own
# engines into a file of its own (ENGINE_DIR, default $OUT/engines: sweep-<variant>-<seed>.txt), so the runs sample the
# spread over engine sets as well as over seeds, and say which engines each run had. LOSS_LOG=1: each run also writes
# its per-step losses (sweep-<variant>-<seed>.log.loss.jsonl; a host sync each step, so slower runs).
# Last, one summary line per variant: how many runs reached TARGET (default 0.94) test top-1, the mean and the lowest.
#   VARIANTS="--lr 0.3;--epochs 11" SEEDS="0 1 2" scripts/bench/fmnist_sweep.sh
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
OUT=${OUT:-out}
mkdir -p "$OUT"
RN=build-gpu/app/renaissance
[[ -e data/fashion-mnist.h5 ]] ||
  $RN data import fashion-mnist --src data/cache/fashion-mnist --out data/fashion-mnist.h5 >/dev/null || exit 1
ENGINE_DIR=${ENGINE_DIR:-$OUT/engines}
if [[ ${ENGINE_CACHE:-shared} == each ]]; then
  mkdir -p "$ENGINE_DIR"
else
  $RN train --config recipes/fmnist-resnet18.yaml --epochs 1 >/dev/null 2>&1  # fills the engine cache
fi
IFS=';' read -r -a variants <<<"${VARIANTS:- }"
run() {  # variant index, seed
  local extra=${variants[$1]} log="$OUT/sweep-$1-$2.log" t0=$SECONDS engines=() losses=()
  [[ ${LOSS_LOG:-0} == 1 ]] && losses=(--loss-log "$log.loss.jsonl")
  if [[ ${ENGINE_CACHE:-shared} == each ]]; then
    rm -f "$ENGINE_DIR/sweep-$1-$2.txt"
    engines=(--engine-cache "$ENGINE_DIR/sweep-$1-$2.txt")
  fi
  # shellcheck disable=SC2086
  $RN train --config recipes/fmnist-resnet18.yaml --seed "$2" "${engines[@]}" "${losses[@]}" $extra --metrics "$log.jsonl" >"$log" 2>&1
  python3 - "$log.jsonl" "$extra" "$2" "$((SECONDS - t0))" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
last = rows[-1]  # with --validate last only the last line has val_top1
ema = f"  ema {last['ema_val_top1']:.4f}" if "ema_val_top1" in last else ""
ema += f"  tta {last['tta_val_top1']:.4f}" if "tta_val_top1" in last else ""
print(f"[{sys.argv[2].strip() or 'recipe'}] seed {sys.argv[3]}: val_top1 {last['val_top1']:.4f}{ema}  "
      f"epochs {len(rows)}  epoch-1 train_loss {rows[0]['train_loss']:.3f}  ~{sys.argv[4]} s (shared GPU)")
PY
}
n=0
for v in "${!variants[@]}"; do
  for s in ${SEEDS:-0 1 2}; do
    run "$v" "$s" &
    n=$((n + 1))
    ((n % ${JOBS:-4} == 0)) && wait
  done
done
wait
python3 - "$OUT" "${TARGET:-0.94}" "${variants[@]}" <<'PY'
import glob, json, statistics, sys
out, target, variants = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
for i, extra in enumerate(variants):
    top1 = []
    for f in sorted(glob.glob(f"{out}/sweep-{i}-*.log.jsonl")):
        rows = [json.loads(l) for l in open(f)]
        if rows and "val_top1" in rows[-1]:
            top1.append(rows[-1]["val_top1"])
    if top1:
        print(f"[{extra.strip() or 'recipe'}] {len(top1)} runs: >= {target:.4f} in {sum(t >= target for t in top1)}, "
              f"mean {statistics.mean(top1):.4f}, lowest {min(top1):.4f}")
PY
