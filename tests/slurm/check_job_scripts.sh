#!/usr/bin/env bash
# The conventions every job script keeps (issue 17), checked without Slurm: bash syntax; `#SBATCH --open-mode=append`
# (a requeued job's log keeps the lines before the preemption); the thread counts exported from the job's cores per
# task (RENAISSANCE_CPU_THREADS, OMP_NUM_THREADS, SRUN_CPUS_PER_TASK); every srun passes them on with -c; BATCH is
# checked before any srun (exit 2); MODEL_FILE
# (--model-file) is honoured where MODEL is; the first line says the restart count (jobs/README.md); the training
# scripts pass EXTRA_ARGS unglobbed, requeue a 75 at most MAX_REQUEUES times and never resume a first run from a
# default checkpoint directory that an earlier job with the same id filled (stand-in srun/scontrol). The Slurm tests
# run train-cpu.sbatch and train-multinode.sbatch for real; this covers every script, the GPU ones included.
#   tests/slurm/check_job_scripts.sh JOBS_DIR        exit 0: all keep them; 1: each miss is named
set -uo pipefail
dir=${1:?usage: check_job_scripts.sh JOBS_DIR}
fail=0
n=0
miss() { echo "FAIL $1: $2"; fail=1; }
for f in "$dir"/*.sbatch; do
  [[ -e $f ]] || continue
  n=$((n + 1))
  name=$(basename "$f")
  bash -n "$f" || miss "$name" "bash -n: syntax error"
  grep -qE '^#SBATCH[[:space:]]+--open-mode=append([[:space:]]|$)' "$f" || miss "$name" "no '#SBATCH --open-mode=append'"
  for v in RENAISSANCE_CPU_THREADS OMP_NUM_THREADS SRUN_CPUS_PER_TASK; do
    grep -qE "^export $v=.*SLURM_CPUS_PER_TASK" "$f" || miss "$name" "$v is not exported from SLURM_CPUS_PER_TASK"
  done
  if grep -qE '^MODEL=' "$f"; then
    grep -qF 'MODEL_ARGS=(--model-file "${MODEL_FILE}")' "$f" || miss "$name" "MODEL_FILE is not passed as --model-file"
    grep -qE -- '--model "\$\{MODEL\}"' <(grep -vE '^[[:space:]]*(#|if )' "$f") &&
      miss "$name" "--model \"\${MODEL}\" outside MODEL_ARGS (it would exclude --model-file)"
  fi
  grep -qE '^echo "job .*restart \$\{(SLURM_RESTART_COUNT:-0|RESTARTS)\}' "$f" || miss "$name" "its first line has no restart count"
  # BATCH not a decimal integer: refused with exit 2 before any srun (bash arithmetic made it exit 0 untrained).
  for bad in 08 1.5 abc 0; do
    out=$(env -i PATH=/usr/bin:/bin BATCH=$bad bash "$f" 2>&1)
    rc=$?
    ((rc == 2)) && [[ $out == *"BATCH must be a positive integer (per rank), got '$bad'"* ]] ||
      miss "$name" "BATCH=$bad: exit $rc, not 2 with the message: $out"
  done
  sruns=$(grep -cE '^[[:space:]]*srun[[:space:]]' "$f")
  ((sruns > 0)) || miss "$name" "no srun"
  while IFS= read -r line; do
    [[ $line =~ [[:space:]](-c|--cpus-per-task)[[:space:]=] ]] || miss "$name" "srun without -c: $line"
  done < <(grep -E '^[[:space:]]*srun[[:space:]]' "$f")
  # The training scripts under a stand-in srun (records its arguments, exits $FAKE_RC) and scontrol (records its
  # call): EXTRA_ARGS is split into words, over all its lines, but never globbed ("--metrics run?.jsonl" became two
  # files' names); a 75
  # is requeued, but not past MAX_REQUEUES (a time limit shorter than the signal's lead requeued forever), and a
  # failing scontrol requeue is named and exits 75.
  if grep -q 'scontrol requeue' "$f"; then
    fake=$(mktemp -d)
    script="$(cd "$(dirname "$f")" && pwd)/$name"
    mkdir "$fake/bin"
    printf '#!/bin/bash
printf "%%s\n" "$@" >"%s/srun.args"
exit "${FAKE_RC:-0}"
' "$fake" >"$fake/bin/srun"
    # `scontrol show job`: the restart count as Slurm keeps it (FAKE_RESTARTS, else SLURM_RESTART_COUNT), not recorded.
    printf '#!/bin/bash
if [[ $1 == show ]]; then echo "   Requeue=1 Restarts=${FAKE_RESTARTS:-$SLURM_RESTART_COUNT} BatchFlag=1"; exit 0; fi
echo "$@" >>"%s/scontrol.calls"
exit "${FAKE_SCONTROL_RC:-0}"
' "$fake" >"$fake/bin/scontrol"
    chmod +x "$fake/bin/srun" "$fake/bin/scontrol"
    touch "$fake/runA.jsonl" "$fake/runB.jsonl"
    job() {  # job SLURM_RESTART_COUNT FAKE_RC FAKE_SCONTROL_RC [VAR=VALUE...]
      rm -f "$fake/scontrol.calls" "$fake/srun.args"
      (cd "$fake" && env -i PATH="$fake/bin:/usr/bin:/bin" SLURM_JOB_ID=7 SLURM_NTASKS=2 SLURM_JOB_NODELIST=n1 \
        SLURM_JOB_NUM_NODES=1 SLURM_RESTART_COUNT="$1" FAKE_RC="$2" FAKE_SCONTROL_RC="$3" "${@:4}" \
        EXTRA_ARGS=$'--amp\n--metrics run?.jsonl' bash "$script" >"$fake/out" 2>&1)
    }
    job 0 0 0
    rc=$?
    ((rc == 0)) && grep -qxF 'run?.jsonl' "$fake/srun.args" && ! grep -qxF runA.jsonl "$fake/srun.args" ||
      miss "$name" "EXTRA_ARGS with a pattern: exit $rc, srun got: $(tr '\n' ' ' <"$fake/srun.args")"
    # The GPU scripts ask for the GPU (with auto, invisible GPUs trained on the CPU, exit 0) unless EXTRA_ARGS says.
    if grep -q 'DEVICE_ARGS=(--device cuda)' "$f"; then
      grep -qxF cuda "$fake/srun.args" || miss "$name" "srun without --device cuda: $(tr '\n' ' ' <"$fake/srun.args")"
    fi
    job 0 75 0
    rc=$?
    ((rc == 0)) && grep -qx 'requeue 7' "$fake/scontrol.calls" || miss "$name" "a 75 was not requeued (exit $rc)"
    job 50 75 0
    rc=$?
    ((rc == 75)) && [[ ! -e $fake/scontrol.calls ]] && grep -q 'MAX_REQUEUES=50' "$fake/out" ||
      miss "$name" "the 51st 75 was requeued or not named (exit $rc): $(cat "$fake/out")"
    job 0 75 1
    rc=$?
    ((rc == 75)) && grep -q 'scontrol requeue failed' "$fake/out" ||
      miss "$name" "a failed requeue: exit $rc, not 75 with a message: $(cat "$fake/out")"
    # The default CKPT_DIR (checkpoints/$SLURM_JOB_ID, made absolute) already holding files on a first run: an earlier
    # job with the same id (ids repeat) left them, and --resume auto went on from its weights (or ended at once as
    # "done"). Refused with exit 2 before srun; a requeued run (restart 1) and a CKPT_DIR of the user's own resume.
    # The requeue-limit message says how to go on: resubmit with CKPT_DIR set to the directory.
    ck="$fake/checkpoints/7"
    grep -qF -- "CKPT_DIR=$ck sbatch jobs/$name" "$fake/out" ||
      miss "$name" "the failed requeue does not say 'CKPT_DIR=$ck sbatch jobs/$name': $(cat "$fake/out")"
    mkdir -p "$ck" && touch "$ck/ckpt-step00000003.h5"
    job 0 0 0
    rc=$?
    ((rc == 2)) && [[ ! -e $fake/srun.args ]] && grep -qF "$ck already holds files of an earlier job" "$fake/out" ||
      miss "$name" "a first run in a default CKPT_DIR that holds files: exit $rc (srun run: $([[ -e $fake/srun.args ]] &&
        echo yes || echo no)), not 2 naming it: $(cat "$fake/out")"
    job 1 0 0
    rc=$?
    ((rc == 0)) && grep -qxF "$ck" "$fake/srun.args" || miss "$name" "a requeued run did not go on in $ck (exit $rc)"
    # SLURM_RESTART_COUNT=1 exported by the submitting shell into a first run (Slurm: Restarts=0): still refused.
    job 1 0 0 FAKE_RESTARTS=0
    rc=$?
    ((rc == 2)) && [[ ! -e $fake/srun.args ]] ||
      miss "$name" "a first run with SLURM_RESTART_COUNT=1 inherited: exit $rc, not 2: $(cat "$fake/out")"
    job 0 0 0 CKPT_DIR=checkpoints/7
    rc=$?
    ((rc == 0)) && grep -qxF "$ck" "$fake/srun.args" ||
      miss "$name" "CKPT_DIR=checkpoints/7 given on a first run: exit $rc, not resumed from $ck: $(cat "$fake/out")"
    out=$(env -i PATH=/usr/bin:/bin bash "$f" 2>&1)
    rc=$?
    ((rc != 0)) && [[ $out == *"run it with sbatch"* ]] || miss "$name" "outside Slurm: exit $rc: $out"
    rm -rf "$fake"
  fi
done
((n > 0)) || { echo "FAIL: no *.sbatch in $dir"; exit 1; }
((fail == 0)) && echo "OK: $n job scripts keep the conventions"
exit $fail
