#!/usr/bin/env bash
# Driver of the slurm-labelled tests: starts the local one-node Slurm (scripts/slurm-local) unless
# it is already running, submits a job script with `sbatch --wait`, checks the job's exit code and
# its output file, and stops Slurm again if it started it.
#
#   run_sbatch_test.sh --source-dir DIR --work-dir DIR --job FILE [--ranks N]
#                      [--expect REGEX]... [--expect-count N REGEX]... -- PROGRAM [ARGS...]
#
# --expect: some output line matches (grep -E); --expect-count: exactly N lines match.
# Exit: 0 pass, 1 fail, 77 skip (no Slurm installed: CTest SKIP_RETURN_CODE).
set -uo pipefail

SOURCE_DIR="" WORK_DIR="" JOB="" RANKS=2 TIMEOUT=${RENAISSANCE_SLURM_JOB_TIMEOUT:-90}
EXPECT=() COUNT_N=() COUNT_RE=()
while (($#)); do
  case "$1" in
    --source-dir) SOURCE_DIR=$2; shift 2 ;;
    --work-dir) WORK_DIR=$2; shift 2 ;;
    --job) JOB=$2; shift 2 ;;
    --ranks) RANKS=$2; shift 2 ;;
    --expect) EXPECT+=("$2"); shift 2 ;;
    --expect-count) COUNT_N+=("$2"); COUNT_RE+=("$3"); shift 3 ;;
    --) shift; break ;;
    *) echo "run_sbatch_test.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[[ -n "$SOURCE_DIR" && -n "$WORK_DIR" && -n "$JOB" && $# -gt 0 ]] || {
  echo "run_sbatch_test.sh: need --source-dir, --work-dir, --job and a program" >&2
  exit 2
}

# The job runs in WORK_DIR: a program given relative to the current directory becomes absolute.
if [[ "$1" != /* && -e "$1" ]]; then
  set -- "$PWD/$1" "${@:2}"
fi

PATH=$PATH:/usr/sbin:/sbin:/usr/local/sbin
missing=()
for c in slurmctld slurmd sbatch srun sinfo scontrol; do
  command -v "$c" >/dev/null 2>&1 || missing+=("$c")
done
if ((${#missing[@]})); then
  echo "SKIP: Slurm is not installed (missing: ${missing[*]}); scripts/setup installs it (Debian 12, root)"
  exit 77
fi

T0=${EPOCHREALTIME/[.,]/}
elapsed() {
  local us=$((${EPOCHREALTIME/[.,]/} - T0))
  printf '%d.%d' $((us / 1000000)) $((us / 100000 % 10))
}

SLURM_LOCAL=$SOURCE_DIR/scripts/slurm-local
SLURM_DIR=${RENAISSANCE_SLURM_DIR:-/tmp/renaissance-slurm}
export RENAISSANCE_SLURM_DIR=$SLURM_DIR

# One slurm test at a time per cluster directory, also across build trees and ctest runs: a test
# that started the cluster stops it at the end, which must not happen under another test's job.
mkdir -p "$(dirname "$SLURM_DIR")"
exec 9>"$SLURM_DIR.lock"
if ! flock -w 120 9; then
  echo "FAIL: another slurm test holds $SLURM_DIR.lock for more than 120 s"
  exit 1
fi

STARTED=0
# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
  if ((STARTED)); then
    "$SLURM_LOCAL" stop
    echo "slurm stopped at +$(elapsed) s"
  fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if "$SLURM_LOCAL" status >/dev/null 2>&1; then
  echo "using the running local Slurm ($SLURM_DIR)"
else
  "$SLURM_LOCAL" start || { echo "FAIL: scripts/slurm-local start failed"; exit 1; }
  STARTED=1
  echo "slurm started in $(elapsed) s"
fi
eval "$("$SLURM_LOCAL" env)"

mkdir -p "$WORK_DIR"
rm -f "$WORK_DIR"/job-*.out
# RENAISSANCE_PROBE_RANKS: mpi_probe fails when the world size differs (N singletons instead of
# one N-rank job); other programs ignore it.
JOB_ID=$(timeout "$TIMEOUT" sbatch --wait --parsable --ntasks="$RANKS" --chdir="$WORK_DIR" \
  --output="$WORK_DIR/job-%j.out" --export=ALL,RENAISSANCE_PROBE_RANKS="$RANKS" "$JOB" "$@")
RC=$?
JOB_ID=${JOB_ID%%;*}
echo "sbatch --wait: job ${JOB_ID:-?} exit code $RC after +$(elapsed) s"
OUT_FILE=$WORK_DIR/job-$JOB_ID.out

FAIL=0
if ((RC == 124)); then
  echo "FAIL: the job did not finish within $TIMEOUT s"
  [[ -n "$JOB_ID" ]] && scancel "$JOB_ID" 2>/dev/null
  squeue 2>/dev/null
  FAIL=1
elif ((RC != 0)); then
  echo "FAIL: sbatch --wait returned $RC"
  FAIL=1
fi
[[ -n "$JOB_ID" ]] && scontrol show job "$JOB_ID" 2>/dev/null | grep -oE '(JobState|ExitCode)=[^ ]+' | tr '\n' ' ' && echo

if [[ -z "$JOB_ID" || ! -f "$OUT_FILE" ]]; then
  echo "FAIL: no job output file (${OUT_FILE})"
  exit 1
fi
echo "---- $OUT_FILE ----"
cat "$OUT_FILE"
echo "----"
for re in "${EXPECT[@]}"; do
  if ! grep -qE -- "$re" "$OUT_FILE"; then
    echo "FAIL: no output line matches '$re'"
    FAIL=1
  fi
done
for i in "${!COUNT_RE[@]}"; do
  n=$(grep -cE -- "${COUNT_RE[$i]}" "$OUT_FILE")
  if [[ "$n" != "${COUNT_N[$i]}" ]]; then
    echo "FAIL: $n output lines match '${COUNT_RE[$i]}', expected ${COUNT_N[$i]}"
    FAIL=1
  fi
done
((FAIL)) && exit 1
echo "PASS: job $JOB_ID ($RANKS ranks) at +$(elapsed) s"
exit 0
