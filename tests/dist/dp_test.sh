#!/usr/bin/env bash
# Data-parallel tests of `renaissance train` on CPU ranks (labels mpi, slurm).
#
#   dp_test.sh MODE --cli RENAISSANCE --work DIR [--mpiexec MPIEXEC] [--python PY] [--launch LAUNCHER]
#
# MODE:
#   equality        2 ranks x batch b/2 give the weights of 1 rank x batch b after k steps (rel. diff <= 1e-5),
#                   the same validation metrics, and the comparison can fail (another seed differs)
#   equality-syncbn the same for a model with BatchNorm and --sync-bn (running statistics too); without
#                   --sync-bn each rank normalises with its own samples and the weights differ
#   mismatch-lr     one rank runs with another --lr: every rank reports the mismatch, exit != 0
#   mismatch-batch  one rank runs with another --batch: the same
#   kill9           kill -9 one of 2 ranks mid-training: every rank exits != 0 within the timeout + 30 s, no orphans
#   sigstop         SIGSTOP one of 2 ranks: the other's watchdog aborts the job, the same bounds
#   slurm-ntasks    a Slurm step whose tasks did not join one MPI job (SLURM_STEP_NUM_TASKS=2, one process):
#                   a clear error, exit != 0
#   startup-stop    (issue 13) rank 1 stopped before MPI_Init: rank 0's start-up watchdog ends the job, exit 3
#   startup-kill9   rank 1 killed before MPI_Init: the job ends at once (mpirun reports the signal, or exits 137)
#   finalize-stop   rank 1 stops itself on its way into MPI_Finalize: the job ends within the timeout, exit 3
#   sigterm-mpirun  SIGTERM to scripts/mpirun-preemptible's process group mid-run: the ranks checkpoint and the
#                   launcher exits 75
#   data-differs    rank 1's dataset has the same shapes but other contents: every rank reports it, exit 1
#   eval-differs    `eval` with another dataset or other weights on rank 1: every rank reports it, exit 1; the same
#                   inputs on 2 ranks give one process's top-1; `predict` on 2 ranks is refused
#   resume-differs  rank 1 resumes another checkpoint, or none (node-local directories), or runs with another
#                   --checkpoint-every: every rank reports it before the first step, exit 1; the same checkpoint resumes
#   compile-once    (issue 16) 4 ranks: only rank 0 compiles the plan (each rank reports its process's compilation
#                   count, RENAISSANCE_TEST_PLAN_REPORT), the others receive it, and all hold the same plan hash
#   mismatch-4ranks rank 2 of 4 runs with another --lr: all 4 ranks stop with the same message naming rank 2
#   plan-error      a model that does not build (a kernel larger than the input): rank 0 alone plans, its error is
#                   broadcast, and both ranks stop with it (exit 1, no rank waits for a plan that never comes)
# --launch "srun --mpi=pmix" runs the ranks through Slurm instead of mpirun (inside an allocation).
set -uo pipefail

MODE=$1
shift
CLI="" WORK="" MPIEXEC=mpirun PY=python3 LAUNCH="" DEVICE=""
while (($#)); do
  case "$1" in
    --cli) CLI=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --mpiexec) MPIEXEC=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --launch) LAUNCH=$2; shift 2 ;;
    --device) DEVICE=$2; shift 2 ;;  # cuda: one GPU per rank (the gpu.dp_* tests); default: the CLI's auto
    *) echo "dp_test.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODEL=$HERE/fixtures/dp_cnn.yaml
DEV=()
if [[ $DEVICE == cuda ]]; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
  if ((gpus < 2)); then
    echo "SKIP: $MODE on GPU ranks needs 2 GPUs, ${gpus:-0} visible (the nvidia-h200-x2 machine runs it)"
    exit 77
  fi
  DEV=(--device cuda)
elif [[ -n $DEVICE ]]; then
  DEV=(--device "$DEVICE")
fi
rm -rf "$WORK"
mkdir -p "$WORK"
cd "$WORK" || exit 1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Open MPI on a 2-core machine: more ranks than cores, no binding (other tests share the cores).
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_hwloc_base_binding_policy=none
TIMEOUT=${RENAISSANCE_TEST_COMM_TIMEOUT:-15}  # --comm-timeout of the fault modes

fail() {
  echo "FAIL: $*"
  exit 1
}

launchn() {  # launchn N PROGRAM ARGS...: N ranks
  local n=$1
  shift
  if [[ -n "$LAUNCH" ]]; then
    $LAUNCH -n "$n" "$@"
  else
    "$MPIEXEC" -n "$n" "$@"
  fi
}
launch2() { launchn 2 "$@"; }

"$CLI" data synthetic --out ds.h5 --train 200 --val 50 --shape 28,28,1 --classes 10 --seed 3 >/dev/null ||
  fail "cannot make the synthetic dataset"
# 200 samples, global batch 32: 6 full batches and a partial one of 8 (4 per rank) per epoch; 2 epochs, 12 steps,
# random crops and flips keyed by the global sample position.
TRAIN=(train --model-file "$MODEL" --data ds.h5 --batch 32 --epochs 2 --max-steps 12 --lr 0.05 --crop-padding 2
  "${DEV[@]}")

# A wrapper that changes the command line of rank 1 (or of rank $RANK_SEL; the rank from the launcher's environment)
# and records pids.
cat >rank_wrapper.sh <<WRAP
#!/usr/bin/env bash
r=\${OMPI_COMM_WORLD_RANK:-\${PMIX_RANK:-\${SLURM_PROCID:-0}}}
echo \$\$ > "$WORK/pid.\$r"
if [[ "\$r" == 1 && -n "\${RANK1_SIGNAL:-}" ]]; then kill -"\$RANK1_SIGNAL" \$\$; fi  # before MPI_Init
args=("\$@")
if [[ "\$r" == "\${RANK_SEL:-1}" && -n "\${RANK1_OPT:-}" ]]; then  # rank 1: RANK1_OPT's value becomes RANK1_VAL
  for i in "\${!args[@]}"; do
    if [[ "\${args[\$i]}" == "\$RANK1_OPT" ]]; then args[\$((i + 1))]=\$RANK1_VAL; fi
  done
fi
exec "$CLI" "\${args[@]}"
WRAP
chmod +x rank_wrapper.sh

# rank1_fails OPT VAL MESSAGE ARGS...: `renaissance ARGS` on 2 ranks, rank 1 with OPT's value VAL, exits 1 and every
# rank reports "data-parallel run: MESSAGE" (a grep pattern).
rank1_fails() {
  local opt=$1 val=$2 message=$3
  shift 3
  RANK1_OPT=$opt RANK1_VAL=$val launch2 ./rank_wrapper.sh "$@" >out.txt 2>&1
  both_reported $? "$opt on rank 1" "$message"
}
# both_reported RC LABEL MESSAGE: the launch (its output in out.txt) exited 1 and both ranks said
# "data-parallel run: MESSAGE".
both_reported() {
  local rc=$1 label=$2 message=$3 r
  cat out.txt
  ((rc == 1)) || fail "$label: exit $rc, not 1"
  for r in 0 1; do
    grep -q "error: rank $r/2: data-parallel run: $message" out.txt || fail "$label: rank $r did not report the difference"
  done
}
# rank1_differs OPT VAL WHAT ARGS...: every rank reports "WHAT differs between ranks: rank 1's copy".
rank1_differs() {
  local opt=$1 val=$2 what=$3
  shift 3
  rank1_fails "$opt" "$val" "$what differs between ranks: rank 1's copy" "$@"
}

if [[ $MODE == equality* ]] && ! "$PY" -c "import h5py, numpy" 2>/dev/null; then
  echo "SKIP: $PY has no h5py/numpy (the weights comparison needs them; scripts/setup installs python3-h5py)"
  exit 77
fi

case "$MODE" in
  equality)
    "$CLI" "${TRAIN[@]}" --save w1.h5 --metrics m1.jsonl >out1.txt 2>&1 || { cat out1.txt; fail "1-rank run"; }
    launch2 "$CLI" "${TRAIN[@]}" --save w2.h5 --metrics m2.jsonl >out2.txt 2>&1 || { cat out2.txt; fail "2-rank run"; }
    cat out2.txt
    [[ $(grep -o "epoch [12]/2  step" out2.txt | wc -l) == 2 ]] || fail "expected 2 epoch summaries, from rank 0 only"
    grep -q "data-parallel: 2 ranks x 16 samples" out2.txt || fail "no data-parallel line"
    if [[ $DEVICE == cuda ]]; then
      grep -q "all-reduced by NCCL inside the captured step graphs, bucket 1 beside" out2.txt ||
        fail "the GPU run does not say its all-reduces are captured NCCL buckets"
    fi
    "$PY" "$HERE/compare_weights.py" w1.h5 w2.h5 --max-rel 1e-5 || fail "2-rank weights differ from 1-rank weights"
    "$PY" - m1.jsonl m2.jsonl <<'PYEOF' || fail "metrics differ"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 2, (len(a), len(b))
for x, y in zip(a, b):
    for k in ("step", "train_loss", "train_top1", "val_loss", "val_top1", "val_top5"):
        d = abs(x[k] - y[k]) / max(abs(x[k]), 1e-12)
        print(f"epoch {x['epoch']} {k}: {x[k]} vs {y[k]} (rel {d:.2e})")
        assert d <= 1e-5, k
PYEOF
    "$CLI" "${TRAIN[@]}" --seed 1 --save w3.h5 >out3.txt 2>&1 || { cat out3.txt; fail "seed-1 run"; }
    "$PY" "$HERE/compare_weights.py" w1.h5 w3.h5 --min-rel 1e-3 >/dev/null || fail "the comparison cannot fail"
    ;;
  equality-syncbn)
    BN=(train --model-file "$HERE/fixtures/dp_bn_cnn.yaml" --data ds.h5 --batch 32 --epochs 2 --max-steps 12 --lr 0.05
        --crop-padding 2 "${DEV[@]}")
    "$CLI" "${BN[@]}" --save w1.h5 >out1.txt 2>&1 || { cat out1.txt; fail "1-rank run"; }
    launch2 "$CLI" "${BN[@]}" --sync-bn --save w2.h5 >out2.txt 2>&1 || { cat out2.txt; fail "2-rank --sync-bn run"; }
    launch2 "$CLI" "${BN[@]}" --save w3.h5 >out3.txt 2>&1 || { cat out3.txt; fail "2-rank run"; }
    "$PY" "$HERE/compare_weights.py" w1.h5 w2.h5 --max-rel 1e-5 || fail "2 ranks with --sync-bn differ from 1 rank"
    "$PY" "$HERE/compare_weights.py" w1.h5 w3.h5 --min-rel 1e-3 | tail -2 || fail "per-rank BN gave the 1-rank weights"
    ;;
  mismatch-lr | mismatch-batch)
    if [[ $MODE == mismatch-lr ]]; then export RANK1_OPT=--lr RANK1_VAL=0.2 WHAT="lr is 0.05 on rank 0 but 0.2 on rank 1"
    else export RANK1_OPT=--batch RANK1_VAL=64 WHAT="per-rank batch is 16 on rank 0 but 32 on rank 1"; fi
    launch2 ./rank_wrapper.sh "${TRAIN[@]}" >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc != 0)) || fail "exit 0 despite the mismatch"
    for r in 0 1; do
      grep -q "error: rank $r/2: data-parallel run: the configuration of rank 1 differs from rank 0's: .*$WHAT" out.txt ||
        fail "rank $r did not report the mismatch ($WHAT)"
    done
    ;;
  kill9 | sigstop)
    export RENAISSANCE_COMM_TIMEOUT=$TIMEOUT
    start=$SECONDS
    launch2 ./rank_wrapper.sh train --model-file "$MODEL" --data ds.h5 --batch 32 --epochs 100000 \
      --metrics m.jsonl "${DEV[@]}" >out.txt 2>&1 &
    launcher=$!
    for _ in $(seq 1 600); do  # the first epoch done: both ranks are in the training loop
      [[ -s m.jsonl ]] && break
      kill -0 $launcher 2>/dev/null || break
      sleep 0.1
    done
    [[ -s m.jsonl && -f pid.1 && -f pid.0 ]] || { cat out.txt; fail "training did not start"; }
    victim=$(cat pid.1) other=$(cat pid.0)
    if [[ $MODE == kill9 ]]; then kill -9 "$victim"; else kill -STOP "$victim"; fi
    t0=$SECONDS
    limit=$((TIMEOUT + 30))
    while kill -0 $launcher 2>/dev/null && ((SECONDS - t0 < limit + 5)); do sleep 0.2; done
    if kill -0 $launcher 2>/dev/null; then
      kill -9 $launcher "$victim" "$other" 2>/dev/null
      cat out.txt
      fail "the job still runs $limit s after the fault"
    fi
    wait $launcher
    rc=$?
    took=$((SECONDS - t0))
    cat out.txt
    echo "launcher exit $rc after ${took} s"
    ((rc != 0)) || fail "the launcher exited 0 after a rank failed"
    ((took <= limit)) || fail "took ${took} s > timeout + 30 s"
    alive() {  # a zombie is dead: only its parent (or init, after the launcher exited) has yet to reap it
      local st
      st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
      [[ -n "$st" && "$st" != Z* ]]
    }
    for _ in $(seq 1 50); do
      alive "$victim" || alive "$other" || break
      sleep 0.1
    done
    for p in "$victim" "$other"; do
      if alive "$p"; then
        kill -CONT "$p" 2>/dev/null; kill -9 "$p" 2>/dev/null
        fail "rank process $p is still alive (orphan)"
      fi
    done
    if [[ $MODE == sigstop ]]; then
      grep -q "rank 0: .*did not finish within $TIMEOUT s" out.txt || fail "no watchdog message from rank 0"
    fi
    ;;
  startup-stop | startup-kill9 | finalize-stop)
    export RENAISSANCE_COMM_TIMEOUT=$TIMEOUT
    case $MODE in
      startup-stop) export RANK1_SIGNAL=STOP WHAT="MPI start-up (MPI_Init, waiting for every rank) did not finish" ;;
      startup-kill9) export RANK1_SIGNAL=KILL WHAT="exited on signal 9" ;;
      finalize-stop) export RENAISSANCE_TEST_STOP_BEFORE_FINALIZE=1 WHAT="MPI_Finalize (waiting for every rank) did not finish" ;;
    esac
    t0=$SECONDS
    launch2 ./rank_wrapper.sh "${TRAIN[@]}" --epochs 1 --max-steps 2 >out.txt 2>&1 &
    launcher=$!
    limit=$((TIMEOUT + 30))
    while kill -0 $launcher 2>/dev/null && ((SECONDS - t0 < limit + 5)); do sleep 0.2; done
    if kill -0 $launcher 2>/dev/null; then
      for r in 0 1; do [[ -f pid.$r ]] && { kill -CONT "$(cat pid.$r)"; kill -9 "$(cat pid.$r)"; } 2>/dev/null; done
      kill -9 $launcher 2>/dev/null
      cat out.txt
      fail "the job still runs $limit s after the fault"
    fi
    wait $launcher
    rc=$?
    cat out.txt
    echo "launcher exit $rc after $((SECONDS - t0)) s"
    if [[ $MODE == startup-kill9 ]]; then
      # mpirun reports the signal in words, or (seen under load, when it aborts the job before printing that line,
      # leaving only "1 process returned a non-zero exit code") in its own exit status, 128 + 9.
      grep -q "$WHAT" out.txt || ((rc == 137)) || fail "neither the message '$WHAT' nor exit 137 (rc $rc)"
      ((rc != 0)) || fail "exit 0 after a rank was killed"
    else
      grep -q "$WHAT" out.txt || fail "no message '$WHAT'"
      ((rc == 3)) || fail "exit $rc, not 3 (a collective timed out)"
    fi
    for r in 0 1; do
      p=$(cat pid.$r 2>/dev/null) || continue
      st=$(ps -o stat= -p "$p" 2>/dev/null)
      if [[ -n "$st" && "$st" != Z* ]]; then kill -CONT "$p"; kill -9 "$p"; fail "rank $r ($p) is still alive"; fi
    done
    ;;
  sigterm-mpirun)
    # Open MPI's mpirun aborts on SIGTERM with exit 1 and cannot forward it: the wrapper turns it into SIGUSR1. The
    # SIGTERM goes to the wrapper's whole process group, as Ctrl-C or a container's stop sends it: mpirun, in the
    # wrapper's group, got it too and aborted with 1 (the wrapper now starts it in a session of its own).
    export RENAISSANCE_TEST_STEP_DELAY_MS=150
    setsid "$HERE/../../scripts/mpirun-preemptible" -n 2 "$CLI" train --model-file "$MODEL" --data ds.h5 --batch 32 --epochs 50 \
      --checkpoint-dir ck --metrics m.jsonl >out.txt 2>&1 &
    launcher=$!
    for _ in $(seq 1 600); do [[ -s m.jsonl ]] && break; kill -0 $launcher 2>/dev/null || break; sleep 0.1; done
    [[ -s m.jsonl ]] || { cat out.txt; fail "training did not start"; }
    kill -TERM -- "-$launcher"
    wait $launcher
    rc=$?
    cat out.txt
    ((rc == 75)) || fail "exit $rc after SIGTERM, not 75"
    grep -q "preempted by SIGUSR1" out.txt || fail "no preemption message"
    [[ -L ck/latest.h5 ]] && "$CLI" checkpoint inspect ck/latest.h5 >/dev/null || fail "no valid checkpoint"
    ;;
  diverged)
    # A run that diverges by rank 0's checkpoint (AMP at lr 10000: every step overflows FP16 down to loss scale 1):
    # every rank exits 1 naming it. Rank 1 said only "rank 0 could not write", which a preemption turned into 75, and
    # the launcher's highest code then requeued a run that had diverged.
    launch2 "$CLI" train --model-file "$MODEL" --data ds.h5 --batch 32 --epochs 5 --amp --lr 10000 --schedule constant \
      --checkpoint-dir ck --checkpoint-every 1 --keep 1 "${DEV[@]}" >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc == 1)) || fail "exit $rc, not 1"
    grep -q "error: rank 0/2: .*the run diverged by step" out.txt || fail "rank 0 did not name the divergence"
    grep -q "error: rank 1/2: .*rank 0 found the run diverged while writing" out.txt ||
      fail "rank 1 did not report the divergence"
    ;;
  commands-differ)
    # Ranks started with other command lines (mpirun's MPMD form). A usage error on rank 1 only was never printed
    # (only rank 0 prints usage errors), --help on rank 1 returned while rank 0 waited in a collective (a hang until
    # --comm-timeout), ranks running train and eval paired unrelated collectives, bench ranks with other --steps
    # paired a gradient all-reduce with an agreement (MPI_ERR_TRUNCATE), and --save given to rank 1 only was dropped.
    # Each is now an error on every rank, at once.
    mpmd() {  # mpmd "RANK0 ARGS" "RANK1 ARGS" EXPECTED-EXIT PATTERN0 PATTERN1
      local a0=$1 a1=$2 want=$3 p0=$4 p1=$5 rc
      # shellcheck disable=SC2086
      timeout 60 "$MPIEXEC" -n 1 "$CLI" $a0 : -n 1 "$CLI" $a1 >out.txt 2>&1
      rc=$?
      cat out.txt
      ((rc == want)) || fail "'$a0' : '$a1': exit $rc, not $want"
      grep -q "error: rank 0/2: $p0" out.txt || fail "'$a0' : '$a1': rank 0 did not say '$p0'"
      grep -q "error: rank 1/2: $p1" out.txt || fail "'$a0' : '$a1': rank 1 did not say '$p1'"
    }
    T="${TRAIN[*]} --comm-timeout 50"
    differ="the ranks were started with different command lines: this rank"
    mpmd "$T" "$T --bogus-option" 2 "$differ runs \`renaissance train\`" "$differ has this usage error"
    grep -q "unknown option '--bogus-option'" out.txt || fail "rank 1's usage error was not printed"
    mpmd "$T" "$T --help" 2 "$differ runs" "$differ asks for the help or the version"
    mpmd "$T" "eval --model-file $MODEL --data ds.h5 --weights none.h5 ${DEV[*]}" 2 "$differ runs \`renaissance train\`" \
      "$differ runs \`renaissance eval\`"
    mpmd "$T" "$T --save s1.h5" 1 "data-parallel run: the configuration of rank 1 differs from rank 0's: save is none on rank 0 but given on rank 1" \
      "data-parallel run: the configuration of rank 1 differs"
    [[ ! -e s1.h5 ]] || fail "--save on rank 1 only: a file was written"
    rank1_fails --steps 5 "the configuration of rank 1 differs from rank 0's: .*bench steps is 2 on rank 0 but 5 on rank 1" \
      bench --model-file "$MODEL" --batch 32 --warmup 1 --steps 2 "${DEV[@]}"
    # The CPU convolutions' Winograd setting on one rank only (--cpu-winograd, or RENAISSANCE_CPU_WINOGRAD from a
    # node's profile): the ranks' gradients were rounded otherwise. The setting is compared, not whether the CPU has
    # the kernels (nodes may differ).
    rank1_fails --cpu-winograd off "the configuration of rank 1 differs from rank 0's: .*cpu winograd is true on rank 0 but false on rank 1" \
      "${TRAIN[@]}" --cpu-winograd on
    # shellcheck disable=SC2086
    timeout 60 "$MPIEXEC" -n 1 env RENAISSANCE_CPU_WINOGRAD=off "$CLI" $T : -n 1 env -u RENAISSANCE_CPU_WINOGRAD "$CLI" $T \
      >out.txt 2>&1
    both_reported $? "RENAISSANCE_CPU_WINOGRAD=off on rank 0 only" \
      "the configuration of rank 1 differs from rank 0's: .*cpu winograd is false on rank 0 but true on rank 1"
    # So are the GEMM backend and the instruction-set caps asked for (weights 1e-6 apart after 6 steps).
    # shellcheck disable=SC2086
    timeout 60 "$MPIEXEC" -n 1 env RENAISSANCE_GEMM_ISA=generic "$CLI" $T : -n 1 env -u RENAISSANCE_GEMM_ISA "$CLI" $T \
      >out.txt 2>&1
    rc=$?
    if [[ $DEVICE != cuda ]]; then  # the CPU kernels: what a GPU rank does not use
      both_reported $rc "RENAISSANCE_GEMM_ISA=generic on rank 0 only" \
        "the configuration of rank 1 differs from rank 0's: .*gemm isa cap is generic on rank 0 but default on rank 1"
    fi
    # RENAISSANCE_GEMM=own on one rank and unset on the other is the same kernel: accepted (it was refused).
    if [[ $DEVICE != cuda ]]; then
      # shellcheck disable=SC2086
      timeout 60 "$MPIEXEC" -n 1 env RENAISSANCE_GEMM=own "$CLI" $T : -n 1 env -u RENAISSANCE_GEMM "$CLI" $T \
        >out.txt 2>&1 || { cat out.txt; fail "RENAISSANCE_GEMM=own on rank 0 only was refused"; }
    fi
    # --tta flip on rank 1 only: its extra passes ran and their result was dropped (rank 0 reports).
    rank1_fails --tta flip "the configuration of rank 1 differs from rank 0's: .*tta flip is false on rank 0 but true on rank 1" \
      "${TRAIN[@]}" --tta off
    # RENAISSANCE_MPI=never under a launcher of 2 ranks: each trained alone on all of the data and wrote the same
    # outputs (or waited for the other until --comm-timeout). Refused on every rank, nothing written.
    launch2 env RENAISSANCE_MPI=never "$CLI" "${TRAIN[@]}" --save never.h5 >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc == 1)) && (($(grep -c "RENAISSANCE_MPI=never, but the launcher started this process as one of 2 ranks" out.txt) == 2)) ||
      fail "RENAISSANCE_MPI=never on 2 ranks: exit $rc, not 1 with the error on both"
    [[ ! -e never.h5 ]] || fail "RENAISSANCE_MPI=never on 2 ranks wrote --save"
    # The same usage error on both ranks is said once, by rank 0 (exit 2).
    launch2 "$CLI" "${TRAIN[@]}" --bogus-option >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc == 2)) || fail "the same usage error on 2 ranks: exit $rc, not 2"
    (($(grep -c "unknown option '--bogus-option'" out.txt) == 1)) || fail "the same usage error was not said once"
    ;;
  data-differs)
    "$CLI" data synthetic --out ds_other.h5 --train 200 --val 50 --shape 28,28,1 --classes 10 --seed 4 >/dev/null
    rank1_differs --data ds_other.h5 "the dataset's content" "${TRAIN[@]}"
    ;;
  eval-differs)
    # eval deals the val batches over the ranks and sums them: another dataset or other weights on one rank blended
    # two evaluations under rank 0's file names, exit 0. The same inputs on both ranks score as one process does.
    "$CLI" train --model-file "$MODEL" --data ds.h5 --batch 32 --max-steps 2 "${DEV[@]}" --save w.h5 >/dev/null 2>&1 ||
      fail "cannot train the weights"
    "$CLI" train --model-file "$MODEL" --data ds.h5 --batch 32 --max-steps 3 "${DEV[@]}" --save w_other.h5 \
      >/dev/null 2>&1 || fail "cannot train the other weights"
    "$CLI" data synthetic --out ds_other.h5 --train 200 --val 50 --shape 28,28,1 --classes 10 --seed 4 >/dev/null
    EVAL=(eval --model-file "$MODEL" --data ds.h5 --weights w.h5 --batch 8 "${DEV[@]}" --json)
    rank1_differs --data ds_other.h5 "the dataset's content" "${EVAL[@]}"
    rank1_differs --weights w_other.h5 "the content of the weights" "${EVAL[@]}"
    # --tta flip on rank 1 only: its two more passes ran there, and rank 0 reported no TTA score, exit 0.
    rank1_fails --tta flip "the configuration of rank 1 differs from rank 0's: .*tta flip is false on rank 0 but true on rank 1" \
      "${EVAL[@]}" --tta off
    one=$("$CLI" "${EVAL[@]}" 2>/dev/null) || fail "eval on one process"
    two=$(launch2 "$CLI" "${EVAL[@]}" 2>/dev/null) || fail "eval on 2 ranks"
    echo "1 process: $one"
    echo "2 ranks:   $two"
    [[ $(grep -o '"val_top1":[^,]*' <<<"$one") == $(grep -o '"val_top1":[^,]*' <<<"$two") ]] ||
      fail "2 ranks score another top-1 than one process"
    # predict has no data-parallel mode: on 2 ranks both computed and wrote --out over each other. Refused.
    launch2 "$CLI" predict --model-file "$MODEL" --data ds.h5 --weights w.h5 --out p.h5 "${DEV[@]}" >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc == 1)) || fail "predict on 2 ranks: exit $rc, not 1"
    grep -q "error: rank 0/2: predict: it runs in one process, and this job has 2 ranks" out.txt ||
      fail "predict on 2 ranks: no error"
    [[ ! -e p.h5 ]] || fail "predict on 2 ranks wrote --out"
    # Neither do plan, data and checkpoint: every rank printed each line (`plan --json` interleaved past parsing) and
    # wrote the same file. Refused on every rank.
    launch2 "$CLI" plan --model-file "$MODEL" --json >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc == 1)) && grep -q "error: rank 1/2: plan: it runs in one process, and this job has 2 ranks" out.txt ||
      fail "plan on 2 ranks: exit $rc, not 1 with the error on every rank"
    launch2 "$CLI" data synthetic --out d2.h5 --train 20 --val 10 --shape 28,28,1 --classes 10 >out.txt 2>&1
    rc=$?
    ((rc == 1)) && grep -q "data synthetic: it runs in one process" out.txt && [[ ! -e d2.h5 ]] ||
      fail "data synthetic on 2 ranks: exit $rc, not 1 without a file: $(cat out.txt)"
    # The default --batch (256) over 3 ranks: rounded down to a multiple of them (255), the same scores as one
    # process; it was refused as "not divisible by the 3 ranks". A --batch typed must still divide.
    DEFAULT_EVAL=(eval --model-file "$MODEL" --data ds.h5 --weights w.h5 "${DEV[@]}" --json)
    one=$("$CLI" "${DEFAULT_EVAL[@]}" 2>/dev/null) || fail "eval on one process (default batch)"
    three=$(launchn 3 "$CLI" "${DEFAULT_EVAL[@]}" 2>out.txt) || { cat out.txt; fail "eval on 3 ranks, default batch"; }
    echo "3 ranks:   $three"
    [[ $(grep -o '"val_top1":[^,]*' <<<"$one") == $(grep -o '"val_top1":[^,]*' <<<"$three") ]] ||
      fail "3 ranks with the default batch score another top-1 than one process"
    launchn 3 "$CLI" "${DEFAULT_EVAL[@]}" --batch 256 >out.txt 2>&1 && fail "eval --batch 256 on 3 ranks ran"
    grep -q "not divisible by the 3 ranks" out.txt || fail "eval --batch 256 on 3 ranks: no error: $(cat out.txt)"
    ;;
  resume-differs)
    # Each rank reads the checkpoint it resumes from: another file on rank 1, or none (node-local directories), trained
    # other replicas under averaged gradients and blended their metrics, exit 0. Checkpoint options that decide the
    # collectives of every step (--checkpoint-every here) failed at the first step or hung.
    R=(train --model-file "$MODEL" --data ds.h5 --batch 32 "${DEV[@]}")
    "$CLI" "${R[@]}" --lr 0.05 --max-steps 3 --checkpoint-dir ckA >/dev/null 2>&1 || fail "cannot write checkpoint A"
    "$CLI" "${R[@]}" --lr 0.02 --max-steps 3 --checkpoint-dir ckB >/dev/null 2>&1 || fail "cannot write checkpoint B"
    rank1_differs --resume ckB/ckpt-step00000003.h5 "the checkpoint to resume from" "${R[@]}" --lr 0.05 --max-steps 6 \
      --resume ckA/ckpt-step00000003.h5
    mkdir -p empty
    rank1_differs --checkpoint-dir empty "the checkpoint to resume from" "${R[@]}" --lr 0.05 --max-steps 6 \
      --checkpoint-dir ckA --resume auto
    # Rank 1's newest checkpoint corrupt (node-local directories): it went back to an older one, and only rank 0
    # warns of skipped files, so the error did not say why. Rank 1 names what it skipped.
    "$CLI" "${R[@]}" --lr 0.05 --max-steps 3 --checkpoint-dir ckD --checkpoint-every 1 >/dev/null 2>&1 ||
      fail "cannot write checkpoints D"
    truncate -s 1000 ckD/ckpt-step00000003.h5
    RANK1_OPT=--checkpoint-dir RANK1_VAL=ckD launch2 ./rank_wrapper.sh "${R[@]}" --lr 0.05 --max-steps 6 \
      --checkpoint-dir ckA --resume auto >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc == 1)) && grep -q "error: rank 1/2: .*this rank, 1, read ckD/ckpt-step00000002.h5 (after skipping 1 invalid: .*ckpt-step00000003.h5" out.txt ||
      fail "a corrupt newest checkpoint on rank 1 only: exit $rc, or rank 1 did not name what it skipped"
    rank1_fails --checkpoint-every 2 \
      "the configuration of rank 1 differs from rank 0's: .*checkpoint every is 1 on rank 0 but 2 on rank 1" \
      "${R[@]}" --lr 0.05 --max-steps 4 --checkpoint-dir ckC --checkpoint-every 1
    [[ ! -e ckC/latest.h5 ]] || fail "a checkpoint was written despite the mismatch"
    # The same checkpoint on both ranks resumes.
    launch2 "$CLI" "${R[@]}" --lr 0.05 --max-steps 6 --resume ckA/ckpt-step00000003.h5 >out.txt 2>&1 ||
      { cat out.txt; fail "resuming the same checkpoint on 2 ranks"; }
    grep -q "resumed from ckA/ckpt-step00000003.h5 at step 3" out.txt || { cat out.txt; fail "no resume line"; }
    ;;
  compile-once)
    RENAISSANCE_TEST_PLAN_REPORT=1 launchn 4 "$CLI" "${TRAIN[@]}" >out.txt 2>&1 ||
      { cat out.txt; fail "4-rank run"; }
    grep "plan report" out.txt
    [[ $(grep -c "plan report: rank [0-3]/4: " out.txt) == 4 ]] || fail "expected one plan report per rank"
    grep -qE "plan report: rank 0/4: plan compiled here \([0-9]+ bytes, hash [0-9a-f]+\), 1 compilation\(s\)" out.txt ||
      fail "rank 0 did not compile exactly once"
    for r in 1 2 3; do
      grep -qE "plan report: rank $r/4: plan received from rank 0 \([0-9]+ bytes, hash [0-9a-f]+\), 0 compilation\(s\)" out.txt ||
        fail "rank $r compiled a plan (or did not receive rank 0's)"
    done
    hashes=$(grep -oE "plan report: rank [0-3]/4: .*hash [0-9a-f]+" out.txt | grep -oE "hash [0-9a-f]+$" | sort -u | wc -l)
    [[ $hashes == 1 ]] || fail "the ranks hold $hashes different plans"
    ;;
  mismatch-4ranks)
    export RANK_SEL=2 RANK1_OPT=--lr RANK1_VAL=0.2 RENAISSANCE_TEST_PLAN_REPORT=1
    launchn 4 ./rank_wrapper.sh "${TRAIN[@]}" >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc != 0 && rc < 128)) || fail "exit $rc (expected an error exit below 128)"
    msg="data-parallel run: the configuration of rank 2 differs from rank 0's: lr is 0.05 on rank 0 but 0.2 on rank 2"
    for r in 0 1 2 3; do
      grep -q "error: rank $r/4: $msg" out.txt || fail "rank $r did not stop with the message '$msg'"
    done
    # The same message on every rank: the text after the rank prefix is one line, four times.
    [[ $(grep -oE "error: rank [0-3]/4: data-parallel run: .*" out.txt | sed -E 's/rank [0-3]\/4: //' | sort -u | wc -l) == 1 ]] ||
      fail "the ranks' messages differ"
    ! grep -q "plan compiled\|compiling" out.txt || true
    ;;
  plan-error)
    cat >bad.yaml <<'YAML'
name: bad_cnn
input: [28, 28, 1]
layers:
  - conv: {out: 8, k: 31, stride: 1, pad: 0}
  - flatten
  - fc: {out: 10}
  - softmax_ce: {classes: 10}
YAML
    RENAISSANCE_TEST_PLAN_REPORT=1 launch2 "$CLI" train --model-file bad.yaml --data ds.h5 --batch 32 --max-steps 2 \
      >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc == 1)) || fail "exit $rc, not 1"
    msg="model 'bad_cnn': layers\[0\]: spatial size shrinks to zero"
    for r in 0 1; do grep -q "error: rank $r/2: $msg" out.txt || fail "rank $r did not stop with rank 0's planning error"; done
    ! grep -q "plan report" out.txt || fail "a rank reported a plan"
    ;;
  slurm-ntasks)
    env SLURM_STEP_NUM_TASKS=2 SLURM_NTASKS=2 "$CLI" "${TRAIN[@]}" >out.txt 2>&1
    rc=$?
    cat out.txt
    ((rc != 0)) || fail "exit 0 with SLURM_STEP_NUM_TASKS=2 and one process"
    grep -q "the MPI world has 1 rank(s) but Slurm started 2 task(s)" out.txt || fail "no clear message"
    ;;
  *) echo "dp_test.sh: unknown mode '$MODE'" >&2; exit 2 ;;
esac
echo "PASS: $MODE"
