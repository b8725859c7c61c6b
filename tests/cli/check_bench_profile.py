#!/usr/bin/env python3
"""`renaissance bench --profile` through the user's path: the text tables and the JSON rows.

Usage: check_bench_profile.py RENAISSANCE_EXECUTABLE
Runs a small CPU benchmark with --profile three times (text, --json, and with --fused-kernels off) and checks that
both tables are printed, that the expected kernel rows appear (the fused element-wise passes, or with them off the
plain BN and ReLU nodes), and that the per-kernel times add up to the profiled total.
"""
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
    check(lines[headers[1]].split() == ["kernel", "calls/step", "ms/step", "%"], "kernel table header", text)
    check(any(l.split()[:1] == ["train_base/DEEP_FWD_BWD"] for l in lines), "a DEEP_FWD_BWD subgraph row", text)
    def kernel_rows_of(lines, header):
        # label (it may hold a space: "FUSED:relu+bn backward"), calls/step, ms/step, % — up to the first blank line
        rows = {}
        for l in lines[header + 1:]:
            if not l.strip():
                break
            f = l.split()
            rows[" ".join(f[:-3])] = f[-3:]
        return rows

    kernel_rows = kernel_rows_of(lines, headers[1])
    for k in EXPECTED:
        check(k in kernel_rows, f"a {k} row in the kernel table", text)
        check(len(kernel_rows[k]) == 3, f"the {k} row has calls, ms and %", text)
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
    print(f"bench --profile: {len(rows)} kernel rows, {len(j['profile_graphs'])} subgraph rows, "
          f"{total:.3f} ms/step in kernels")


if __name__ == "__main__":
    main()
