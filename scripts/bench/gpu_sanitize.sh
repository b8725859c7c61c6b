#!/usr/bin/env bash
# compute-sanitizer on the GPU machine over one training of tests/gpu_runtime/gpu_race_probe (the 32x32 residual
# model of the determinism tests: every fused kind, side streams, captured graphs): what the intermittent AMP
# reproducibility failures (docs/benchmarks.md) could come from inside a kernel.
#   racecheck, synccheck, memcheck: the project's own kernels (namespace renaissance::cuda) only;
#   initcheck: every kernel (cuDNN's writes must be tracked too), reports of the project's own kernels counted.
# The engines are chosen once without the sanitizer (a shared engine cache), so every checked run replays them.
#   TOOLS="racecheck synccheck memcheck initcheck" VARIANTS="amp" TOOL_TIMEOUT=150 scripts/bench/gpu_sanitize.sh
# Logs in $OUT/sanitize-<tool>-<variant>.log (the first reports and the summary), a table on stdout.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
OUT=${OUT:-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
[[ -x $CS ]] || { say "no compute-sanitizer"; exit 1; }
OUT=$OUT STEPS="" TARGETS=gpu_race_probe scripts/bench/gpu_session.sh || exit 1  # build only
P=build-gpu/tests/gpu_runtime/gpu_race_probe
W=$(mktemp -d)
TOOLS=${TOOLS:-"racecheck synccheck memcheck initcheck"}
VARIANTS=${VARIANTS:-amp}
for v in $VARIANTS; do
  "$P" "$v" 1 "$W/engines.txt" "$W/syn.h5" >"$W/plain.$v" 2>&1
  say "variant $v without the sanitizer: $(grep '^probe' "$W/plain.$v")"
  for t in $TOOLS; do
    log="$OUT/sanitize-$t-$v.log"
    filter=(--kernel-name kns=renaissance)
    [[ $t == initcheck ]] && filter=()
    extra=()
    [[ $t == racecheck ]] && extra=(--racecheck-report hazard)
    timeout "${TOOL_TIMEOUT:-150}" "$CS" --tool "$t" "${filter[@]}" "${extra[@]}" --print-limit 40 \
      --show-backtrace device "$P" "$v" 1 "$W/engines.txt" "$W/syn.h5" >"$W/full" 2>&1
    rc=$?
    { head -c 60000 "$W/full"; echo "..."; tail -n 30 "$W/full"; } >"$log"
    own=$(grep -c "renaissance::cuda" "$W/full")
    say "$t $v: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$W/full" | tail -1); lines naming own kernels: $own;" \
      "$(grep '^probe' "$W/full" | awk '{print "losses", $6, "state", $8}')"
  done
done
rm -rf "$W"
say "done"
