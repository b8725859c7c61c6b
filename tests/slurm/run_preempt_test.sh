#!/usr/bin/env bash
# Preemption under a real Slurm (issue 6): submits jobs/train-cpu.sbatch (one CPU rank) on the local one-node
# cluster (scripts/slurm-local), preempts it with `scancel --signal=USR1` after a few steps, and checks that
# the trainer wrote a checkpoint and exited 75, that the job script requeued the job, that the requeued run
# resumed from the checkpoint and finished, and that its per-step losses and final weights (h5diff) equal those of an
# uninterrupted job of the same script.
#
#   run_preempt_test.sh --source-dir DIR --work-dir DIR --cli PATH
#
# Exit: 0 pass, 1 fail, 77 skip (no Slurm installed).
set -uo pipefail

SOURCE_DIR="" WORK_DIR="" CLI=""
while (($#)); do
  case "$1" in
    --source-dir) SOURCE_DIR=$2; shift 2 ;;
    --work-dir) WORK_DIR=$2; shift 2 ;;
    --cli) CLI=$2; shift 2 ;;
    *) echo "run_preempt_test.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$SOURCE_DIR" && -n "$WORK_DIR" && -n "$CLI" ]] || { echo "need --source-dir, --work-dir, --cli" >&2; exit 2; }

PATH=$PATH:/usr/sbin:/sbin:/usr/local/sbin
for c in slurmctld slurmd sbatch srun scontrol scancel h5diff; do
  command -v "$c" >/dev/null 2>&1 || { echo "SKIP: Slurm is not installed (no $c)"; exit 77; }
done

SLURM_LOCAL=$SOURCE_DIR/scripts/slurm-local
SLURM_DIR=${RENAISSANCE_SLURM_DIR:-/tmp/renaissance-slurm}
export RENAISSANCE_SLURM_DIR=$SLURM_DIR
mkdir -p "$(dirname "$SLURM_DIR")"
exec 9>"$SLURM_DIR.lock"  # one slurm test at a time (run_sbatch_test.sh takes the same lock)
flock -w 120 9 || { echo "FAIL: another slurm test holds $SLURM_DIR.lock"; exit 1; }

STARTED=0 JOB=""
cleanup() {
  [[ -n "$JOB" ]] && scancel "$JOB" 2>/dev/null
  ((STARTED)) && "$SLURM_LOCAL" stop
}
trap cleanup EXIT
trap 'exit 1' INT TERM
if ! "$SLURM_LOCAL" status >/dev/null 2>&1; then
  "$SLURM_LOCAL" start || { echo "FAIL: scripts/slurm-local start failed"; exit 1; }
  STARTED=1
fi
eval "$("$SLURM_LOCAL" env)"

rm -rf "$WORK_DIR" && mkdir -p "$WORK_DIR" && cd "$WORK_DIR" || exit 1
"$CLI" data synthetic --out data.h5 --train 300 --val 100 --shape 28,28,1 --classes 10 --seed 5 >/dev/null || exit 1
TRAIN_ARGS="--lr 0.01 --crop-padding 2 --seed 3"
# The uninterrupted reference: the same job script, never signalled, with the zoo's fmnist_cnn as a YAML model
# (MODEL_FILE; models/fmnist_cnn.yaml is the same network, so the weights must still match the preempted zoo run's).
MODEL_FILE="$SOURCE_DIR/models/fmnist_cnn.yaml" DATA=data.h5 EPOCHS=2 BATCH=32 RENAISSANCE="$CLI" CKPT_DIR="$WORK_DIR/ck-ref" \
  EXTRA_ARGS="$TRAIN_ARGS --loss-log $WORK_DIR/ref.jsonl --save $WORK_DIR/ref.h5" \
  timeout 120 sbatch --wait --nodes=1 --ntasks-per-node=1 --cpus-per-task=1 --output="$WORK_DIR/ref.out" \
  "$SOURCE_DIR/jobs/train-cpu.sbatch" >/dev/null || { echo "FAIL: the uninterrupted job"; cat ref.out; exit 1; }

state() { scontrol show job "$JOB" 2>/dev/null | grep -oE '(JobState|Restarts|ExitCode)=[^ ]+' | tr '\n' ' '; }
wait_until() {  # wait_until SECONDS CONDITION...
  local end=$((SECONDS + $1))
  shift
  while ((SECONDS < end)); do
    "$@" && return 0
    sleep 0.2
  done
  return 1
}
steps_logged() { [[ -f part.jsonl && $(wc -l <part.jsonl) -ge 3 ]]; }
requeued() { [[ "$(state)" == *"JobState=PENDING"*"Restarts=1"* ]]; }
finished() { [[ "$(state)" =~ JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT) ]]; }

# The job script as users submit it (its own #SBATCH --open-mode=append keeps the first run's lines in the log of the
# requeued job: no --open-mode here); RENAISSANCE_TEST_STEP_DELAY_MS slows the first run's steps down so the
# signal arrives mid-run (sbatch exports the environment to the job).
JOB=$(MODEL=fmnist_cnn DATA=data.h5 EPOCHS=2 BATCH=32 RENAISSANCE="$CLI" CKPT_DIR="$WORK_DIR/ck" \
  EXTRA_ARGS="$TRAIN_ARGS --loss-log $WORK_DIR/part.jsonl --save $WORK_DIR/part.h5" RENAISSANCE_TEST_STEP_DELAY_MS=150 \
  LOG_EVERY=5 sbatch --parsable --nodes=1 --ntasks-per-node=1 --cpus-per-task=1 \
  --output="$WORK_DIR/job.out" "$SOURCE_DIR/jobs/train-cpu.sbatch")
JOB=${JOB%%;*}
echo "job $JOB submitted"
wait_until 90 steps_logged || { echo "FAIL: no training steps logged: $(state)"; cat job.out; exit 1; }
scancel --signal=USR1 "$JOB"
echo "scancel --signal=USR1 $JOB after $(wc -l <part.jsonl) steps"
wait_until 60 requeued || { echo "FAIL: the job was not requeued: $(state)"; cat job.out; exit 1; }
echo "requeued: $(state)"
# Slurm holds a requeued job back for a while (BeginTime, ~2 min); once the node has cleaned up after the first
# run, start it now.
# (a step daemon of the first run still alive makes the new step 0 collide with the old one).
node_idle() { [[ "$(sinfo -h -o %T 2>/dev/null)" == idle* ]]; }
no_stepd() { ! pgrep -f "slurmstepd: \\[${JOB}\\." >/dev/null 2>&1; }
wait_until 60 node_idle || echo "warning: the node is not idle: $(sinfo -h -o %T 2>/dev/null)"
wait_until 60 no_stepd || echo "warning: step daemons of job $JOB still running"
sleep 3
scontrol update JobId="$JOB" StartTime=now
wait_until 120 finished || { echo "FAIL: the requeued job did not finish: $(state)"; cat job.out; exit 1; }
FINAL=$(state)
JOB_DONE=$JOB
JOB=""
echo "---- job.out ----"
cat job.out
echo "----"
FAIL=0
[[ "$FINAL" == *"JobState=COMPLETED"* && "$FINAL" == *"ExitCode=0:0"* ]] || { echo "FAIL: job $JOB_DONE ended $FINAL"; FAIL=1; }
for re in "preempted by SIGUSR1 at step [0-9]+: checkpoint .*ckpt-step[0-9]+\.h5; exit 75" \
          "preempted, checkpoint in .*; requeueing" \
          "resumed from .*ckpt-step[0-9]+\.h5 at step [0-9]+" "done: 20 steps"; do
  grep -qE -- "$re" job.out || { echo "FAIL: no output line matches '$re'"; FAIL=1; }
done
# One log for both runs (--open-mode=append in the script): the first run's start, its heartbeats and preemption
# lines, then the requeued run's, in that order.
order=$(awk '/CPU ranks x .*restart 0$/ {print "start0"} /CPU ranks x .*restart 1$/ {print "start1"}
  /^preempted by SIGUSR1/ {print "preempted"} /^resumed from/ {print "resumed"} /^done: 20 steps/ {print "done"}' job.out |
  tr '\n' ' ')
if [[ "$order" == "start0 preempted start1 resumed done " ]]; then
  echo "the log keeps the first run's lines before the requeued run's: $order"
else
  echo "FAIL: the log's runs are not both there in order (got: '$order'; want: 'start0 preempted start1 resumed done')"
  FAIL=1
fi
grep -qE "^step 5/20  epoch 1/2  batch 5/10  loss [0-9.]+  [0-9]+ img/s  ETA" job.out ||
  { echo "FAIL: no --log-every heartbeat 'step 5/20 ...' in the log"; FAIL=1; }
grep -qE "CPU ranks x 1 threads" job.out && grep -qE "^training .*, 1 CPU threads(, Winograd)?$" job.out ||
  { echo "FAIL: the job does not run 1 CPU thread per rank with --cpus-per-task=1"; FAIL=1; }
if cmp -s ref.jsonl part.jsonl; then
  echo "the per-step losses of the preempted and requeued job equal the uninterrupted run's ($(wc -l <ref.jsonl) steps)"
else
  echo "FAIL: per-step losses differ"; diff ref.jsonl part.jsonl | head; FAIL=1
fi
if h5diff ref.h5 part.h5 /params /params >/dev/null 2>&1; then
  echo "h5diff: the final weights of the preempted and requeued job equal the uninterrupted job's"
else
  echo "FAIL: final weights differ (h5diff ref.h5 part.h5 /params)"; h5diff ref.h5 part.h5 /params /params | head; FAIL=1
fi
((FAIL)) && exit 1
echo "PASS: job $JOB_DONE preempted, requeued, resumed"
exit 0
