#!/usr/bin/env bash
# Exact resume and preemption with 2 MPI ranks (issue 6): `renaissance train` under mpirun -n 2
#  1. 14 steps uninterrupted  vs  7 steps + checkpoint, then --resume auto to 14: the per-step losses (rank 0's
#     --loss-log) and the epoch metrics are identical;
#  2. SIGUSR1 to mpirun (forwarded to both ranks) mid-run: exit 75, one checkpoint; the rerun continues the
#     uninterrupted loss curve;
#  3. SIGUSR1 to rank 1 alone: both ranks stop at the same step (exit 75), and rank 0, which got no signal, says
#     the signal went to another rank.
#
#   run_mpi_resume_test.sh --mpiexec PATH --cli PATH --work-dir DIR
set -uo pipefail

MPIEXEC="" CLI="" WORK_DIR=""
while (($#)); do
  case "$1" in
    --mpiexec) MPIEXEC=$2; shift 2 ;;
    --cli) CLI=$2; shift 2 ;;
    --work-dir) WORK_DIR=$2; shift 2 ;;
    *) echo "unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$MPIEXEC" && -n "$CLI" && -n "$WORK_DIR" ]] || { echo "need --mpiexec, --cli, --work-dir" >&2; exit 2; }

FLAGS=()
if "$MPIEXEC" --version 2>/dev/null | grep -qE "Open MPI|OpenRTE"; then
  FLAGS=(--allow-run-as-root --oversubscribe)
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpi2() { "$MPIEXEC" "${FLAGS[@]}" -n 2 -x RENAISSANCE_TEST_STEP_DELAY_MS "$CLI" "$@"; }
export RENAISSANCE_TEST_STEP_DELAY_MS=0

rm -rf "$WORK_DIR" && mkdir -p "$WORK_DIR" && cd "$WORK_DIR" || exit 1
"$CLI" data synthetic --out data.h5 --train 300 --val 100 --shape 28,28,1 --classes 10 --seed 5 >/dev/null || exit 1
ARGS=(train --data data.h5 --epochs 2 --batch 32 --lr 0.01 --crop-padding 2 --seed 3 --device cpu)
FAIL=0
fail() { echo "FAIL: $*"; FAIL=1; }
strip_timing() { sed -E 's/,"images_per_s".*//' "$1"; }

# 1. --max-steps 7, then resume to 14 (constant schedule: the lr does not depend on the run length).
mpi2 "${ARGS[@]}" --schedule constant --max-steps 14 --loss-log full.jsonl --metrics mfull.jsonl >full.log 2>&1 ||
  { cat full.log; fail "uninterrupted run"; }
mpi2 "${ARGS[@]}" --schedule constant --max-steps 7 --loss-log part.jsonl --metrics mpart.jsonl \
  --checkpoint-dir ck --resume auto >part1.log 2>&1 || { cat part1.log; fail "first part"; }
mpi2 "${ARGS[@]}" --schedule constant --max-steps 14 --loss-log part.jsonl --metrics mpart.jsonl \
  --checkpoint-dir ck --resume auto >part2.log 2>&1 || { cat part2.log; fail "resumed part"; }
grep -q "resumed from .*ckpt-step00000007.h5 at step 7" part2.log || fail "the second run did not resume at step 7"
"$CLI" checkpoint inspect ck/latest.h5 | grep -qE "world_size +2" || fail "the checkpoint does not record 2 ranks"
[[ $(wc -l <full.jsonl) -eq 14 ]] || fail "expected 14 loss lines"
cmp -s full.jsonl part.jsonl || { diff full.jsonl part.jsonl | head; fail "per-step losses differ"; }
# The epochs after the resume (the partial first line of mpart is the stopped run's) report the same metrics.
diff <(strip_timing mfull.jsonl) <(strip_timing mpart.jsonl | tail -n +2) || fail "epoch metrics differ"

# A resume that adds --sync-bn (batch-norm statistics over both ranks' batches from here on) says so.
mpi2 "${ARGS[@]}" --schedule constant --max-steps 16 --sync-bn --resume ck/latest.h5 >sbn.log 2>&1 ||
  { cat sbn.log; fail "the resume with --sync-bn"; }
grep -q "written without --sync-bn, resumed with it" sbn.log || { cat sbn.log; fail "no --sync-bn warning"; }

# start_slow NAME CKPT_DIR: a 2-rank run with a 100 ms step delay, mpirun itself in the background (in this shell,
# not a subshell: PID is mpirun's, which forwards SIGUSR1 to the ranks); returns once 3 steps are logged (NAME.jsonl).
start_slow() {
  RENAISSANCE_TEST_STEP_DELAY_MS=100 "$MPIEXEC" "${FLAGS[@]}" -n 2 -x RENAISSANCE_TEST_STEP_DELAY_MS "$CLI" \
    "${ARGS[@]}" --loss-log "$1.jsonl" --checkpoint-dir "$2" --resume auto >"$1.log" 2>&1 &
  PID=$!
  for _ in $(seq 1 300); do
    [[ -f $1.jsonl && $(wc -l <"$1.jsonl") -ge 3 ]] && break
    sleep 0.1
  done
}

# 2. Preemption: SIGUSR1 to mpirun mid-run (the default one-cycle schedule).
mpi2 "${ARGS[@]}" --loss-log ref.jsonl >ref.log 2>&1 || { cat ref.log; fail "reference run"; }
start_slow pre pk
kill -USR1 "$PID"
wait "$PID"
RC=$?
[[ $RC -eq 75 ]] || { cat pre.log; fail "preempted run exited $RC, not 75"; }
grep -q "preempted by SIGUSR1" pre.log || fail "no preemption message"
mpi2 "${ARGS[@]}" --loss-log pre.jsonl --checkpoint-dir pk --resume auto >post.log 2>&1 || { cat post.log; fail "rerun"; }
grep -q "resumed from" post.log || fail "the rerun did not resume"
cmp -s ref.jsonl pre.jsonl || { diff ref.jsonl pre.jsonl | head; fail "the preempted run's loss curve differs"; }

# 3. The signal to one rank only (a node's own preemption notice): rank 0's report names no signal it never got.
start_slow one ok
RANK1=""
for p in $(pgrep -f -- "--loss-log one.jsonl"); do
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1" && RANK1=$p
done
if [[ -z "$RANK1" ]]; then
  fail "rank 1's process not found"
  kill -USR1 "$PID"
else
  kill -USR1 "$RANK1"
fi
wait "$PID"
RC=$?
[[ $RC -eq 75 ]] || { cat one.log; fail "the run preempted on rank 1 exited $RC, not 75"; }
grep -q "preempted by a signal to another rank at step" one.log || { cat one.log; fail "rank 0's preemption report"; }

((FAIL)) && exit 1
echo "PASS: 2-rank exact resume and preemption"
exit 0
