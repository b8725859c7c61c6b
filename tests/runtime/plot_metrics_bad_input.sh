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
expect "loss_log_ema.jsonl: missing key 'train_loss'" "$fixtures/loss_log_ema.jsonl" --out "$work/a.png"
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
