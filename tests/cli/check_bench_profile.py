#!/usr/bin/env python3
"""`renaissance bench --profile` through the user's path: the text tables and the JSON rows.

Usage: check_bench_profile.py RENAISSANCE_EXECUTABLE
Runs a small CPU benchmark with --profile three times (text, --json, and with --fused-kernels off) and checks that
both tables are printed, that the expected kernel rows appear (the fused element-wise passes, or with them off the
plain BN and ReLU nodes), and that the per-kernel times add up to the profiled total. The fused passes' GB/s column:
their bytes a step against the activation sizes of `renaissance plan`'s layer table (a BN -> ReLU pass reads x and
writes y: twice the CBR outputs; its backward reads dy and x and writes dx: three times), plus the per-channel
vectors.
"""
import re
import json
import subprocess
import sys

ARGS = ["bench", "--device", "cpu", "--model", "fmnist_cnn", "--batch", "32", "--warmup", "1", "--steps", "2",
        "--profile", "--profile-steps", "3"]
COMMON = ["CONV_FWD", "CONV_BWD_DATA", "CONV_BWD_FILTER", "SOFTMAX_CE_FWD", "SOFTMAX_CE_BWD"]
EXPECTED = COMMON + ["FUSED:bn+relu", "FUSED:relu+bn backward"]  # fmnist_cnn's BN → ReLU pairs, fused on the CPU
EXPECTED_UNFUSED = COMMON + ["BN_FWD_TRAIN", "BN_BWD", "RELU_FWD", "RELU_BWD"]


def run(cli, extra):
    p = subprocess.run([cli] + ARGS + extra, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        sys.exit(f"renaissance {' '.join(ARGS + extra)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p.stdout


def check(cond, what, context=""):
    if not cond:
        sys.exit(f"FAILED: {what}\n{context}")


def main():
    cli = sys.argv[1]

    text = run(cli, [])
    lines = text.splitlines()
    check(any("images/s" in l and "ms/step" in l for l in lines), "the normal bench line is printed", text)
    check(any(l.startswith("profile: 3 steps") for l in lines), "a profile header with the step count", text)
    headers = [i for i, l in enumerate(lines) if l.split()[:1] in (["subgraph"], ["kernel"])]
    check(len(headers) == 2, "two tables (subgraph, kernel)", text)
    check(lines[headers[0]].split() == ["subgraph", "ms/step", "%"], "subgraph table header", text)
    check(lines[headers[1]].split() == ["kernel", "calls/step", "ms/step", "%", "GB/s"], "kernel table header", text)
    check(any(l.split()[:1] == ["train_base/DEEP_FWD_BWD"] for l in lines), "a DEEP_FWD_BWD subgraph row", text)
    def kernel_rows_of(lines, header):
        # label (it may hold a space: "FUSED:relu+bn backward"), calls/step, ms/step, %, GB/s — up to a blank line
        rows = {}
        for l in lines[header + 1:]:
            if not l.strip():
                break
            f = l.split()
            rows[" ".join(f[:-4])] = f[-4:]
        return rows

    kernel_rows = kernel_rows_of(lines, headers[1])
    for k in EXPECTED:
        check(k in kernel_rows, f"a {k} row in the kernel table", text)
        check(len(kernel_rows[k]) == 4, f"the {k} row has calls, ms, % and GB/s", text)
    for k in ("FUSED:bn+relu", "FUSED:relu+bn backward"):
        check(float(kernel_rows[k][3]) > 0, f"the {k} row has a bandwidth", text)
    check(kernel_rows["CONV_FWD"][3] == "-", "no bandwidth for a convolution row", text)
    check(float(kernel_rows["CONV_FWD"][0]) == 3.0, "3 convolutions forward per step", text)
    check(float(kernel_rows["SOFTMAX_CE_FWD"][0]) == 1.0, "1 softmax-CE forward per step", text)
    check(float(kernel_rows["FUSED:bn+relu"][0]) == 3.0, "3 fused BN + ReLU passes per step", text)

    plain = run(cli, ["--fused-kernels", "off"])
    plines = plain.splitlines()
    pheaders = [i for i, l in enumerate(plines) if l.split()[:1] in (["subgraph"], ["kernel"])]
    check(len(pheaders) == 2, "two tables with --fused-kernels off", plain)
    prows = kernel_rows_of(plines, pheaders[1])
    for k in EXPECTED_UNFUSED:
        check(k in prows, f"a {k} row in the kernel table with --fused-kernels off", plain)
    check(not any(k.startswith("FUSED:") for k in prows), "no fused pass with --fused-kernels off", plain)

    out = run(cli, ["--json"])
    j = json.loads(out)
    check(j["images_per_s"] > 0 and j["ms_per_step"] > 0, "the benchmark figures are still reported", out)
    check(j["profile_steps"] == 3, "profile_steps", out)
    rows = j["profile"]
    total = j["profile_total_ms_per_step"]
    check(total > 0, "a positive profiled total", out)
    check(total <= j["profile_wall_ms_per_step"] * 1.001, "the kernel total fits in the wall time", out)
    labels = {r["label"]: r for r in rows}
    check(len(labels) == len(rows), "each kernel label once", out)
    for k in EXPECTED:
        check(k in labels, f"a {k} row in the JSON profile", out)
    ms = sum(r["ms_per_step"] for r in rows)
    check(abs(ms - total) <= 0.01 * total, f"kernel rows sum to the total within 1% ({ms} vs {total})", out)
    pct = sum(r["percent"] for r in rows)
    check(abs(pct - 100.0) <= 1.0, f"kernel shares sum to 100% ({pct})", out)
    gms = sum(r["ms_per_step"] for r in j["profile_graphs"])
    check(abs(gms - total) <= 0.01 * total, f"subgraph rows sum to the total within 1% ({gms} vs {total})", out)
    check(all("graph" in r for r in j["profile_graph_kernels"]), "(subgraph, kernel) rows name their subgraph", out)
    # The fused passes' bytes a step against the CBR layers' output sizes from `renaissance plan` (FP32 on the CPU).
    plan = subprocess.run([cli, "plan", "--model", "fmnist_cnn", "--batch", "32"], capture_output=True, text=True,
                          timeout=120)
    check(plan.returncode == 0, "renaissance plan runs", plan.stdout + plan.stderr)
    outs = [tuple(int(v) for v in m.groups()) for m in re.finditer(r"^\d+\s+cbr\d+\s+CBR\s+\S+\s+->\s+(\d+)x(\d+)x(\d+)",
                                                                     plan.stdout, re.M)]
    check(len(outs) == 3, "three CBR layers in the plan's table", plan.stdout)
    act = sum(h * w * c for h, w, c in outs) * 32 * 4
    vectors = sum(c for _, _, c in outs) * 4 * 16 + 4096  # gamma, beta, statistics and their gradients; hyper
    for k, times in (("FUSED:bn+relu", 2), ("FUSED:relu+bn backward", 3)):
        b = labels[k].get("bytes_per_step")
        check(b is not None and times * act <= b <= times * act + vectors,
              f"{k}: {b} bytes a step, {times} x {act} activation bytes plus at most {vectors}", out)
        gbps = b / (labels[k]["ms_per_step"] * 1e-3) / 1e9
        check(abs(labels[k]["gb_per_s"] - gbps) <= 1e-6 * gbps, f"{k}: gb_per_s is its bytes over its time", out)
    check("bytes_per_step" not in labels["CONV_FWD"], "no bytes for a convolution row", out)
    print(f"bench --profile: {len(rows)} kernel rows, {len(j['profile_graphs'])} subgraph rows, "
          f"{total:.3f} ms/step in kernels")


if __name__ == "__main__":
    main()
