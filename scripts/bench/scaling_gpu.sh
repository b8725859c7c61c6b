#!/usr/bin/env bash
# Data-parallel scaling on the GPUs of one host, in one call: Renaissance (`renaissance bench` under mpirun, NCCL)
# and PyTorch DDP (torchrun), 1 GPU then N GPUs, the same per-GPU batch, AMP, synthetic data.
#   scripts/bench/scaling_gpu.sh [build-dir] [out-dir]        (env: MODEL, BATCH_PER_GPU, GPUS, STEPS)
# Writes scaling.jsonl (raw lines) and scaling.md (table: images/s, per GPU, efficiency = N-GPU / (N × 1-GPU)).
set -uo pipefail
BUILD=${1:-build-gpu}
OUT_DIR=${2:-${OUT:-out}}
mkdir -p "$OUT_DIR"
RN="$BUILD/app/renaissance"
MODEL=${MODEL:-resnet50}
B=${BATCH_PER_GPU:-256}
N=${GPUS:-2}
STEPS=${STEPS:-50}
MPIRUN=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x PATH -x LD_LIBRARY_PATH)
J="$OUT_DIR/scaling.jsonl"
: >"$J"
for n in 1 "$N"; do
  timeout 400 "${MPIRUN[@]}" -n "$n" "$RN" bench --model "$MODEL" --batch $((B * n)) --amp --graphs on --warmup 10 \
    --steps "$STEPS" --device cuda --json >>"$J" 2>>"$OUT_DIR/scaling.err" || echo "ours n=$n failed" >>"$OUT_DIR/scaling.err"
  (cd scripts/bench && timeout 400 torchrun --standalone --nproc_per_node "$n" pytorch_ddp.py --model "$MODEL" \
    --batch-per-gpu "$B" --warmup 20 --steps "$STEPS") >>"$J" 2>>"$OUT_DIR/scaling.err" || echo "ddp n=$n failed" >>"$OUT_DIR/scaling.err"
done
python3 - "$J" "$N" "$OUT_DIR/scaling.md" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
n = int(sys.argv[2])
def world(r): return r.get("ranks", r.get("world", 1))
out = ["| framework | model | batch/GPU | 1 GPU img/s | %d GPUs img/s | per GPU img/s | scaling efficiency |" % n,
       "|---|---|---|---|---|---|---|"]
for fw in ("renaissance", "pytorch-ddp"):
    mine = [r for r in rows if (r.get("framework") or "renaissance") == fw]
    one = next((r for r in mine if world(r) == 1), None)
    many = next((r for r in mine if world(r) == n), None)
    if not one or not many:
        out.append(f"| {fw} | | | {one['images_per_s'] if one else 'n/a'} | {many['images_per_s'] if many else 'n/a'} | | |")
        continue
    b = one.get("batch_per_gpu", one.get("batch"))
    eff = many["images_per_s"] / (n * one["images_per_s"])
    out.append(f"| {fw} | {one['model']} | {b} | {one['images_per_s']:,.0f} | {many['images_per_s']:,.0f} | "
               f"{many['images_per_s'] / n:,.0f} | {eff:.3f} |")
open(sys.argv[3], "w").write("\n".join(out) + "\n")
print("\n".join(out))
PY
