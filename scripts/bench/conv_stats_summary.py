#!/usr/bin/env python3
"""Sums bench_gpu_kernels' ConvStats rows (Google Benchmark JSON) into ResNet-50's forward convolutions per step.

For each shape: the plain forward + the own BN statistics kernel (deterministic plans) and the best GEN_STATS plan
(non-deterministic: cuDNN offers none under the deterministic filter), in microseconds with the engines; then each
variant's total over one step (time x per_step), which is what --conv-stats on can save at most. Usage:
  bench_gpu_kernels --benchmark_filter=ConvStats --benchmark_out=k.json --benchmark_out_format=json
  python3 scripts/bench/conv_stats_summary.py k.json
"""
import json
import sys

VARIANTS = ["conv+bn_statistics", "conv_genstats"]


def main(path):
    with open(path) as f:
        rows = json.load(f)["benchmarks"]
    shapes, table = [], {}
    for r in rows:
        parts = r["name"].split("/")
        if len(parts) < 3 or parts[0] != "ConvStats":
            continue
        variant, shape = parts[1], parts[2]
        if shape not in table:
            shapes.append(shape)
            table[shape] = {}
        ok = not r.get("error_occurred", False)
        table[shape][variant] = (r.get("us") if ok else None, int(r.get("per_step", 0)), r.get("label", ""))
    if not shapes:
        print("no ConvStats rows in", path)
        return 1
    totals = {v: 0.0 for v in VARIANTS}
    bases = {v: 0.0 for v in VARIANTS}  # the plain variant over the shapes where v has a plan
    missing = {v: 0 for v in VARIANTS}
    print(f"{'shape':24} {'n':>2} " + " ".join(f"{v:>28}" for v in VARIANTS))
    for s in shapes:
        cells = []
        for v in VARIANTS:
            us, n, label = table[s].get(v, (None, 0, ""))
            if us is None:
                missing[v] += 1
                cells.append(f"{'-':>28}")
                continue
            totals[v] += us * n
            plain = table[s].get(VARIANTS[0], (None, 0, ""))[0]
            bases[v] += (plain or 0.0) * n
            cells.append(f"{us:9.1f} {label[:18]:>18}")
        n = max(table[s].get(v, (None, 0, ""))[1] for v in VARIANTS)
        print(f"{s:24} {n:>2} " + " ".join(cells))
    for v in VARIANTS:
        gap = f" (over the shapes it has a plan for: {missing[v]} without)" if missing[v] else ""
        ratio = f", {totals[v] / bases[v]:.3f} of the plain" if bases[v] > 0 else ""
        print(f"per step {v}: {totals[v] / 1000:.3f} ms{ratio}{gap}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
