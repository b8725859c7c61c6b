#!/usr/bin/env bash
# scripts/plot_metrics.py on bad input: each case exits 1 with a message naming the file (and line) or --out, never
# a Python traceback, and before matplotlib is needed.
#   tests/runtime/plot_metrics_bad_input.sh PYTHON SOURCE_DIR WORK_DIR
set -uo pipefail
py=$1 src=$2 work=$3
script=$src/scripts/plot_metrics.py
fixtures=$src/tests/runtime/fixtures
rm -rf "$work" && mkdir -p "$work" || exit 1
fail=0
expect() {  # expect MESSAGE ARGS...: exit 1, MESSAGE in the output, no traceback
  local want=$1
  shift
  local out rc
  out=$("$py" "$script" "$@" 2>&1)
  rc=$?
  if ((rc != 1)) || [[ $out != *"$want"* ]] || [[ $out == *Traceback* ]]; then
    echo "FAIL ($*): exit $rc, wanted 1 and '$want':"
    echo "$out"
    fail=1
  else
    echo "ok: $want"
  fi
}
expect "loss_log_ema.jsonl:1: missing key 'train_loss'" "$fixtures/loss_log_ema.jsonl" --out "$work/a.png"
# Every line has the keys (a later line without "step" was a KeyError while plotting), a run_id is a string.
printf '{"step":1,"epoch":1,"train_loss":1.0}\n{"epoch":2,"train_loss":0.5}\n' >"$work/nostep.jsonl"
expect "nostep.jsonl:2: missing key 'step'" "$work/nostep.jsonl" --out "$work/a.png"
printf '{"step":1,"epoch":1,"train_loss":1.0,"run_id":5}\n' >"$work/rid.jsonl"
expect "rid.jsonl:1: 'run_id' must be a string, got 5" "$work/rid.jsonl" --out "$work/a.png"
# Runs concatenated into one file: a step that does not advance (within a run_id, across two, or without run_ids).
cat "$fixtures/metrics_ema.jsonl" "$fixtures/metrics_ema.jsonl" >"$work/twice.jsonl"
expect "twice.jsonl:6: step 32 after step 160 (line 5) of run" "$work/twice.jsonl" --out "$work/a.png"
{ cat "$fixtures/metrics_ema.jsonl"; sed 's/"run_id":"[^"]*"/"run_id":"another"/' "$fixtures/metrics_ema.jsonl"; } \
  >"$work/two_runs.jsonl"
expect "two_runs.jsonl:6: step 32 after step 160 (line 5) of run" "$work/two_runs.jsonl" --out "$work/a.png"
cat "$fixtures/loss_log_ema.jsonl" "$fixtures/loss_log_ema.jsonl" >"$work/twice_steps.jsonl"
expect "twice_steps.jsonl:$(($(wc -l <"$fixtures/loss_log_ema.jsonl") + 1)): step 1 after step" \
  "$fixtures/metrics_ema.jsonl" --loss-log "$work/twice_steps.jsonl" --out "$work/a.png"
# A missing input while --out exists (was os.path.samefile's FileNotFoundError).
: >"$work/old.png"
expect "none.jsonl: No such file or directory" "$work/none.jsonl" --out "$work/old.png"
printf '{"step":1,"epoch":1,"train_loss":"x"}\n' >"$work/str.jsonl"
expect "str.jsonl:1: 'train_loss' must be a number, got \"x\"" "$work/str.jsonl" --out "$work/a.png"
printf '{"step":"abc","epoch":1,"train_loss":1.0}\n' >"$work/step.jsonl"
expect "step.jsonl:1: 'step' must be an integer, got \"abc\"" "$work/step.jsonl" --out "$work/a.png"
printf '\xff\xfe\n' >"$work/bytes.jsonl"
expect "bytes.jsonl: cannot read it as UTF-8 text" "$work/bytes.jsonl" --out "$work/a.png"
expect "the directory $work/none does not exist or is not writable" "$fixtures/metrics.jsonl" --out "$work/none/x.png"
expect "--out $work/m.jsonl: the figure is a PNG" "$fixtures/metrics.jsonl" --out "$work/m.jsonl"
[[ ! -e $work/a.png ]] || { echo "FAIL: a.png was written"; fail=1; }
exit $fail
