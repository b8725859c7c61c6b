#!/usr/bin/env bash
# Renaissance vs PyTorch on one GPU, in one call (DEVELOPERS.md: ratios come from one run on one machine).
#   scripts/bench/compare_gpu.sh [build-dir] [out-dir]
# Writes raw JSON lines (ours.jsonl, pytorch.jsonl) and a markdown table (table.md) to out-dir.
set -uo pipefail
BUILD=${1:-build-gpu}
OUT_DIR=${2:-${OUT:-out}}
mkdir -p "$OUT_DIR"
RN="$BUILD/app/renaissance"
# compile-max (max-autotune) only where it compiles within a few minutes: ResNet-50's took over 8 minutes.
CASES=${CASES:-"resnet50:256:eager,compile fmnist_cnn:256:eager,compile,compile-max resnet18_cifar:512:eager,compile,compile-max"}
MAX_AUTOTUNE_TIMEOUT=${MAX_AUTOTUNE_TIMEOUT:-300}
: >"$OUT_DIR/ours.jsonl"
: >"$OUT_DIR/pytorch.jsonl"
for c in $CASES; do
  IFS=: read -r model batch modes <<<"$c"
  for graphs in on off; do
    timeout 300 "$RN" bench --model "$model" --batch "$batch" --amp --graphs "$graphs" --warmup 10 --steps 50 \
      --device cuda --json >>"$OUT_DIR/ours.jsonl" 2>>"$OUT_DIR/ours.err" || echo "ours $model graphs=$graphs failed" >>"$OUT_DIR/ours.err"
  done
  for mode in ${modes//,/ }; do
    limit=420
    [[ $mode == compile-max ]] && limit=$MAX_AUTOTUNE_TIMEOUT
    timeout "$limit" python3 scripts/bench/pytorch_gpu.py --model "$model" --batch "$batch" --mode "$mode" \
      --warmup 20 --steps 50 >>"$OUT_DIR/pytorch.jsonl" 2>>"$OUT_DIR/pytorch.err" ||
      echo "pytorch $model $mode failed or timed out" >>"$OUT_DIR/pytorch.err"
  done
done
python3 - "$OUT_DIR" <<'PY'
import json, sys, os
out = sys.argv[1]
ours = [json.loads(l) for l in open(os.path.join(out, "ours.jsonl")) if l.strip()]
pt = [json.loads(l) for l in open(os.path.join(out, "pytorch.jsonl")) if l.strip()]
rows = ["| model | batch | ours img/s (graphs) | ours img/s (no graphs) | eager img/s | compile img/s | max-autotune img/s | ours/eager | ours/compile | ours/max-autotune | arena GiB | eager peak GiB | compile peak GiB | max-autotune peak GiB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
for model in dict.fromkeys(o["model"] for o in ours):
    og = next((o for o in ours if o["model"] == model and o["graphs"]), None)
    on = next((o for o in ours if o["model"] == model and not o["graphs"]), None)
    e = next((p for p in pt if p["model"] == model and p["mode"] == "eager"), None)
    c = next((p for p in pt if p["model"] == model and p["mode"] == "compile"), None)
    x = next((p for p in pt if p["model"] == model and p["mode"] == "compile-max"), None)
    f = lambda d, k: f"{d[k]:,.0f}" if d else "n/a"
    g = lambda d, k: f"{d[k] / 2**30:.2f}" if d else "n/a"
    r = lambda a, b: f"{a['images_per_s'] / b['images_per_s']:.2f}" if a and b else "n/a"
    rows.append(f"| {model} | {og['batch'] if og else '?'} | {f(og, 'images_per_s')} | {f(on, 'images_per_s')} | "
                f"{f(e, 'images_per_s')} | {f(c, 'images_per_s')} | {f(x, 'images_per_s')} | {r(og, e)} | {r(og, c)} | "
                f"{r(og, x)} | {g(og, 'arena_bytes')} | {g(e, 'peak_allocated_bytes')} | {g(c, 'peak_allocated_bytes')} | "
                f"{g(x, 'peak_allocated_bytes')} |")
open(os.path.join(out, "table.md"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
