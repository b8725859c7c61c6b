#!/usr/bin/env python3
"""Runs the GoogleTest binaries named in --batch as a few whole processes instead of one process per test.

ctest (gtest_discover_tests) starts one process per test; on the GPU machine each start costs 2-8 s of CUDA context
and library loading, so the 351 tests of test_gpu_dnn and test_gpu_kernels took most of a device call. This runs each
named binary's tests of the ctest selection (--label) in --shards processes at once (GoogleTest's
GTEST_TOTAL_SHARDS/GTEST_SHARD_INDEX), in the working directory ctest would use, then runs every test that failed
there again on its own (a test that only fails beside others is reported as such, and still counts as a failure),
and writes the names of the selection's other tests to --rest, one per line, for `ctest --tests-from-file`.

    gtest_batch.py --build build-gpu --label gpu --batch test_gpu_dnn,test_gpu_kernels --shards 4 \\
        --rest rest.txt --log out/gtest-batch.log

Exit status: 0 when every batched test passed (skips included), 1 when one failed, 2 on a usage or set-up error.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time


def ctest_tests(build, label):
    out = subprocess.run(["ctest", "--test-dir", build, "-L", label, "--show-only=json-v1"], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out)["tests"]


def gtest_name(cmd):
    for a in cmd:
        if a.startswith("--gtest_filter="):
            return a[len("--gtest_filter="):]
    return None


def workdir(test):
    for p in test.get("properties", []):
        if p["name"] == "WORKING_DIRECTORY":
            return p["value"]
    return None


# "[  FAILED  ] Cases/X.Y/1, where GetParam() = 7 (0 ms)": a parameterised test names its parameter.
RESULT = re.compile(r"^\[\s+(OK|FAILED|SKIPPED)\s+\] ([^\s,]+)(?:, where .*)? \(\d+ ms\)$")


def parse(text):
    """{test name: OK|FAILED|SKIPPED} from GoogleTest's output."""
    res = {}
    for line in text.splitlines():
        m = RESULT.match(line.strip())
        if m:
            res[m.group(2)] = m.group(1)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", required=True)
    ap.add_argument("--label", default="gpu")
    ap.add_argument("--batch", required=True, help="binary names, comma-separated")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--rest", help="write the selection's other test names here")
    ap.add_argument("--log", help="write the binaries' output here")
    ap.add_argument("--timeout", type=float, default=1500, help="seconds for all the shards together")
    a = ap.parse_args()
    if a.shards < 1:
        print("gtest_batch: --shards must be >= 1", file=sys.stderr)
        return 2
    wanted = {b for b in a.batch.split(",") if b}
    groups = {}  # binary path -> (working directory, [gtest names])
    rest = []
    for t in ctest_tests(a.build, a.label):
        cmd = t.get("command") or []
        name = gtest_name(cmd)
        if cmd and name and os.path.basename(cmd[0]) in wanted:
            wd = workdir(t) or os.path.dirname(cmd[0])
            groups.setdefault(cmd[0], (wd, []))[1].append(name)
        else:
            rest.append(t["name"])
    missing = wanted - {os.path.basename(b) for b in groups}
    if missing:
        print(f"gtest_batch: no {a.label}-labelled tests of {sorted(missing)} in {a.build}", file=sys.stderr)
        return 2
    if a.rest:
        with open(a.rest, "w") as f:
            f.writelines(n + "\n" for n in rest)

    t0 = time.monotonic()
    procs = []
    for binary, (wd, names) in sorted(groups.items()):
        shards = min(a.shards, len(names))
        for s in range(shards):
            env = dict(os.environ, GTEST_TOTAL_SHARDS=str(shards), GTEST_SHARD_INDEX=str(s))
            p = subprocess.Popen([binary, "--gtest_filter=" + ":".join(names), "--gtest_also_run_disabled_tests"],
                                 cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            procs.append((binary, s, names, p))
    logs, results, crashed = [], {}, []
    for binary, s, names, p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, a.timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n[gtest_batch: killed at the timeout]\n"
        logs.append(f"===== {os.path.basename(binary)} shard {s}: exit {p.returncode}\n{out}")
        got = parse(out)
        results.update({n: got[n] for n in got if n in names})
        if p.returncode != 0 and not any(v == "FAILED" for v in got.values()):
            crashed.append(f"{os.path.basename(binary)} shard {s} (exit {p.returncode})")
    batch_s = time.monotonic() - t0

    every = [(b, wd, n) for b, (wd, names) in sorted(groups.items()) for n in names]
    failed = [(b, wd, n) for b, wd, n in every if results.get(n) == "FAILED"]
    not_run = [(b, wd, n) for b, wd, n in every if n not in results]
    alone = {}  # the failed and the unfinished, each in a process of its own
    for b, wd, n in failed + not_run:
        r = subprocess.run([b, "--gtest_filter=" + n, "--gtest_also_run_disabled_tests"], cwd=wd,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got = parse(r.stdout).get(n, "FAILED" if r.returncode else "NOT RUN")
        alone[n] = got
        logs.append(f"===== {os.path.basename(b)} {n} alone: exit {r.returncode}\n{r.stdout}")
    if a.log:
        with open(a.log, "w") as f:
            f.write("\n".join(logs))

    counts = {k: sum(1 for _, _, n in every if results.get(n) == k) for k in ("OK", "SKIPPED", "FAILED")}
    print(f"gtest_batch: {len(every)} tests of {len(groups)} binaries in {sum(min(a.shards, len(v[1])) for v in groups.values())} "
          f"processes, {batch_s:.0f} s: {counts['OK']} passed, {counts['SKIPPED']} skipped, {counts['FAILED']} failed, "
          f"{len(not_run)} not run{'; crashed: ' + ', '.join(crashed) if crashed else ''}")
    bad = 0
    failed_names = {n for _, _, n in failed}
    for _, _, n in failed + not_run:
        how = "failed beside the others" if n in failed_names else "did not run to its end"
        verdict = {"OK": "passed alone", "SKIPPED": "skipped alone"}.get(alone[n], "failed alone too")
        print(f"gtest_batch: {n}: {how}, {verdict}")
        bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
