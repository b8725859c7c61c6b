#!/usr/bin/env bash
# Renaissance vs PyTorch on one GPU, in one call (DEVELOPERS.md: ratios come from one run on one machine).
#   scripts/bench/compare_gpu.sh [build-dir] [out-dir]
# Writes raw JSON lines (ours.jsonl, pytorch.jsonl) and a markdown table (table.md) to out-dir.
# CASES: model:batch:pytorch-modes ...; NO_GRAPHS_OFF=1 skips ours with --graphs off; OURS_EXTRA: more runs of
# ours per case beside graphs on/off:
#   nondet (--deterministic off), legacy (--conv-api legacy: the convolutions on cuDNN's legacy API),
#   noown (--own-kernels off: cuDNN only, no own depthwise kernels),
#   recompute (--recompute bn-relu: BN -> ReLU outputs formed again in the backward instead of kept),
#   streams (--streams on: weight gradients and projection shortcuts on side streams; the default is one stream).
# Ours runs with its default engine cache (~/.cache/renaissance/engines.txt): the first run of a shape times the
# engines, later runs reuse them; its start-up figures are in the JSON lines.
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
  runs=("--graphs on")
  [[ ${NO_GRAPHS_OFF:-0} == 1 ]] || runs+=("--graphs off")
  for x in ${OURS_EXTRA:-}; do
    case $x in
      nondet) runs+=("--graphs on --deterministic off") ;;
      legacy) runs+=("--graphs on --conv-api legacy") ;;
      noown) runs+=("--graphs on --own-kernels off") ;;
      recompute) runs+=("--graphs on --recompute bn-relu") ;;
      streams) runs+=("--graphs on --streams on") ;;
    esac
  done
  for flags in "${runs[@]}"; do
    # shellcheck disable=SC2086
    timeout 300 "$RN" bench --model "$model" --batch "$batch" --amp $flags --warmup 10 --steps 50 \
      --device cuda --json >>"$OUT_DIR/ours.jsonl" 2>>"$OUT_DIR/ours.err" || echo "ours $model $flags failed" >>"$OUT_DIR/ours.err"
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
# Only the JSON lines (before lib/renaissance/core/log.h, log lines reached stdout on the GPU machine's spdlog 1.12).
ours = [json.loads(l) for l in open(os.path.join(out, "ours.jsonl")) if l.strip().startswith("{")]
pt = [json.loads(l) for l in open(os.path.join(out, "pytorch.jsonl")) if l.strip().startswith("{")]
rows = ["| model | batch | ours img/s (graphs) | no graphs | --deterministic off | --conv-api legacy | --own-kernels off | --recompute bn-relu | --streams on | eager img/s | compile img/s | max-autotune img/s | ours/eager | ours/compile | ours/max-autotune | arena GiB | arena GiB, --recompute bn-relu | eager peak GiB | compile reserved GiB | max-autotune reserved GiB | ours start-up s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
def pick(model, graphs=True, det=True, api="auto", own=True, rec="off", streams=False):
    return next((o for o in ours if o["model"] == model and o["graphs"] == graphs and o.get("deterministic", True) == det
                 and o.get("conv_api", "auto") == api and o.get("own_kernels", True) == own
                 and o.get("recompute", "off") == rec and o.get("streams", True) == streams), None)
for model in dict.fromkeys(o["model"] for o in ours):
    og = pick(model)
    on = pick(model, graphs=False)
    ond = pick(model, det=False)
    ol = pick(model, api="legacy")
    oo = pick(model, own=False)
    orc = pick(model, rec="bn-relu")
    ons = pick(model, streams=True)
    e = next((p for p in pt if p["model"] == model and p["mode"] == "eager"), None)
    c = next((p for p in pt if p["model"] == model and p["mode"] == "compile"), None)
    x = next((p for p in pt if p["model"] == model and p["mode"] == "compile-max"), None)
    f = lambda d, k: f"{d[k]:,.0f}" if d else "n/a"
    g = lambda d, k: f"{d[k] / 2**30:.2f}" if d else "n/a"
    r = lambda a, b: f"{a['images_per_s'] / b['images_per_s']:.2f}" if a and b else "n/a"
    s = lambda d: f"{d['startup_s']:.1f}" if d and "startup_s" in d else "n/a"
    # torch.compile under CUDA graphs: its pools are reserved, not allocated, after the recording (pytorch_gpu.py)
    gr = lambda d: g(d, 'peak_reserved_bytes') if d and 'peak_reserved_bytes' in d else "n/a"
    rows.append(f"| {model} | {og['batch'] if og else '?'} | {f(og, 'images_per_s')} | {f(on, 'images_per_s')} | "
                f"{f(ond, 'images_per_s')} | {f(ol, 'images_per_s')} | {f(oo, 'images_per_s')} | {f(orc, 'images_per_s')} | {f(ons, 'images_per_s')} | "
                f"{f(e, 'images_per_s')} | {f(c, 'images_per_s')} | {f(x, 'images_per_s')} | {r(og, e)} | {r(og, c)} | "
                f"{r(og, x)} | {g(og, 'arena_bytes')} | {g(orc, 'arena_bytes')} | {g(e, 'peak_allocated_bytes')} | {gr(c)} | "
                f"{gr(x)} | {s(og)} |")
open(os.path.join(out, "table.md"), "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
