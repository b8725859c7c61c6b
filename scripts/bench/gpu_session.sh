#!/usr/bin/env bash
# One call on the GPU machine: build (sm_90), the gpu-labelled tests, then the jobs named in STEPS.
#   STEPS="tests bench fmnist" scripts/bench/gpu_session.sh      (logs and results in $OUT)
# STEPS unset: "tests bench fmnist"; STEPS="" (set, empty): build only.
# bench: Renaissance (graphs on/off) and PyTorch (MODES, default eager) on CASES, via compare_gpu.sh.
# scaling: 1 vs N GPUs, Renaissance (mpirun) and PyTorch DDP (torchrun), via scaling_gpu.sh.
# fmnist: Fashion-MNIST (idx.gz carried in data/cache/fashion-mnist) trained on the GPU with FMNIST_ARGS.
# startup: ResNet-50 b256 AMP start-up with a cold and then a warm engine cache (bench --json), into misc.log.
# profile: bench --profile of ResNet-50 b256 AMP (every convolution pass with its engine), graph API and
#          --conv-api legacy, into profile.log.
# repro: the issue-11 reproducer on synthetic 28x28 data: two `train` runs sharing an engine cache, two that time
#        from scratch (--engine-cache off); how many saved tensors differ, into misc.log.
# recompute: mobilenet_v2 and resnet50 (32x32, synthetic, AMP) trained with --recompute off and bn-relu: how many
#        saved tensors differ (0 expected), into misc.log.
# CTEST_ARGS: more ctest arguments for `tests` (e.g. -E interop); TESTS_TIMEOUT (s, default: what DEADLINE leaves).
# GTEST_BATCH (default test_gpu_dnn,test_gpu_kernels; empty: none): `tests` runs these GoogleTest binaries' gpu tests
#   as GTEST_SHARDS (4) whole processes each (scripts/bench/gtest_batch.py: a test that fails there runs again alone;
#   one process per test costs 2-8 s of CUDA start-up on the GPU machine), the other gpu tests through ctest, the
#   interop test (the longest) apart from the start (ctest-interop.log).
# TESTS_FROM: a file of test names, one per line: `tests` runs only those through ctest (no GTEST_BATCH then);
#   TEST_JOBS: ctest -j (default 4).
# TARGETS: build only these targets (default: everything). The GPU machine needs .deps/cudnn-frontend carried.
# NVJPEG=1: configure with -DRENAISSANCE_NVJPEG=ON (carry .deps/nvjpeg; with .deps/debs holding the libturbojpeg0 and
#   libturbojpeg0-dev .debs from `apt-get download`, they are unpacked into /tmp/rn-turbojpeg and found there: outside
#   the source tree, which CMake requires of an exported target's include directories).
# recipe: `renaissance train --config recipes/fmnist-resnet18.yaml` RECIPE_RUNS (3) times one after another (the first
#   times the engines unless the cache has them), RECIPE_ARGS appended: wall time, the start-up line and the result of
#   each into recipe.log (carry data/fashion-mnist.h5, or the idx.gz files in data/cache/fashion-mnist).
# kernels: tests/bench/bench_gpu_kernels (the batch-norm family against a device copy, GB/s; ResNet-50's forward
#   convolutions with their BN statistics, plain and GEN_STATS, summed per step by conv_stats_summary.py) into
#   kernels.log and kernels.json (KERNELS_FILTER: a --benchmark_filter regex); the build then includes the benchmarks.
# levers: ResNet-50 b256 AMP `bench` with each fusion/option the other way, one at a time (issue 15's per-lever
#   rows), and batch 400, into levers.jsonl and levers.md (LEVER_MODEL, LEVER_BATCH).
# convstats: --conv-stats's GPU tests, ResNet-50 b256 bench deterministic (off) and not (off, on), its profile and
#   two --deterministic off trainings compared bit for bit, into convstats-tests.log and convstats.log (with
#   `kernels` and KERNELS_FILTER=ConvStats: the per-shape timings).
# cutlass: the CUTLASS statistics-epilogue probe (tests/bench/probes/cutlass_stats), built on this machine by
#   `scripts/bench/cutlass_probe.sh build` and carried as .deps/cutlass-probe, into cutlass-probe.log.
# DEADLINE (s, default 570): `tests` gets what is left of it after the build, so one call fits the device's 600 s.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit
OUT=${OUT:-out}
mkdir -p "$OUT"
STEPS=${STEPS-"tests bench fmnist"}
T0=$SECONDS
say() { echo "[$((SECONDS - T0))s] $*"; }
BENCHMARKS=OFF
[[ " $STEPS " == *" kernels "* ]] && BENCHMARKS=ON
if [[ ! -x build-gpu/app/renaissance ]] || [[ ${REBUILD:-1} == 1 ]]; then
  G=Ninja; command -v ninja >/dev/null || G="Unix Makefiles"
  EXTRA=()
  if [[ ${NVJPEG:-0} == 1 ]]; then
    EXTRA+=(-DRENAISSANCE_NVJPEG=ON)
    if compgen -G ".deps/debs/libturbojpeg0*.deb" >/dev/null; then
      for deb in .deps/debs/libturbojpeg0*.deb; do dpkg -x "$deb" /tmp/rn-turbojpeg; done
      EXTRA+=(-DCMAKE_PREFIX_PATH=/tmp/rn-turbojpeg/usr)
    fi
  fi
  cmake -S . -B build-gpu -G "$G" -DCMAKE_BUILD_TYPE=Release -DRENAISSANCE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DRENAISSANCE_BUILD_BENCHMARKS="$BENCHMARKS" "${EXTRA[@]}" >"$OUT/configure.log" 2>&1 || { say "configure failed"; tail -20 "$OUT/configure.log"; exit 1; }
  # shellcheck disable=SC2086
  cmake --build build-gpu -j"$(nproc)" ${TARGETS:+--target $TARGETS} >"$OUT/build.log" 2>&1 ||
    { say "build failed"; grep -A5 error "$OUT/build.log" | head -40; exit 1; }
  say "built"
  rm -f "$OUT/configure.log" "$OUT/build.log"  # at most 8 files come back from the GPU machine
fi
RN=build-gpu/app/renaissance
for s in $STEPS; do
  case $s in
    tests)
      OUT=$(cd "$OUT" && pwd)
      from=${TESTS_FROM:+$(realpath "$TESTS_FROM")}
      ipid=
      # At least 60 s each (after a long build DEADLINE - SECONDS reached 0, which is no limit to timeout(1), or
      # went negative, its usage error).
      budget=$((${DEADLINE:-570} - SECONDS)); ((budget > 60)) || budget=60
      if [[ -z $from && -n ${GTEST_BATCH-test_gpu_dnn,test_gpu_kernels} ]]; then
        # The longest test (five models against PyTorch, ~300 s on the H200) from the start, beside everything else.
        (cd build-gpu && timeout "$budget" ctest -L gpu -R '^interop[.]' --output-on-failure \
          >"$OUT/ctest-interop.log" 2>&1) &
        ipid=$!
        # The kernel-level binaries as a few whole processes (gtest_batch.py), the rest through ctest.
        from=$OUT/.ctest-rest.txt
        timeout "$budget" python3 scripts/bench/gtest_batch.py --build build-gpu --label gpu \
          --batch "${GTEST_BATCH-test_gpu_dnn,test_gpu_kernels}" --shards "${GTEST_SHARDS:-4}" --rest "$from" \
          --log "$OUT/gtest-batch.log"
        say "batched gpu tests exit $?"
      fi
      left=$((${DEADLINE:-570} - SECONDS)); ((left > 60)) || left=60
      sel=()  # the names in $from as one anchored regex (ctest's --tests-from-file needs CMake >= 3.29)
      [[ -n $from ]] && sel=(-R "$(python3 -c 'import re, sys
skip = sys.argv[2] == "1"  # the interop test runs apart (above)
print("^(" + "|".join(re.escape(n.strip()) for n in open(sys.argv[1])
                      if n.strip() and not (skip and n.startswith("interop."))) + ")$")' "$from" "${ipid:+1}")")
      # shellcheck disable=SC2086
      (cd build-gpu && timeout "${TESTS_TIMEOUT:-$left}" ctest -L gpu --output-on-failure -j"${TEST_JOBS:-4}" \
        "${sel[@]}" ${CTEST_ARGS:-} >"$OUT/ctest-gpu.log" 2>&1)
      say "gpu tests exit $?: $(grep -E 'tests passed' "$OUT/ctest-gpu.log")"
      grep -E '\*\*\*|Failed ' "$OUT/ctest-gpu.log" | head -20; rm -f "$OUT/.ctest-rest.txt"
      if [[ -n $ipid ]]; then
        wait "$ipid"
        say "interop test exit $?: $(grep -E 'tests passed|INTEROP (OK|FAILED)' "$OUT/ctest-interop.log" | tail -2)"
      fi ;;
    bench)
      m=${MODES:-eager}
      MODES=$m CASES=${CASES:-"resnet50:256:$m fmnist_cnn:256:$m resnet18_cifar:512:$m"} \
        scripts/bench/compare_gpu.sh build-gpu "$OUT" >"$OUT/compare.log" 2>&1
      say "bench done"; cat "$OUT/table.md" 2>/dev/null; tail -5 "$OUT/ours.err" "$OUT/pytorch.err" 2>/dev/null ;;
    scaling)
      scripts/bench/scaling_gpu.sh build-gpu "$OUT" >"$OUT/scaling.log" 2>&1
      say "scaling done"; cat "$OUT/scaling.md" 2>/dev/null; tail -5 "$OUT/scaling.err" 2>/dev/null ;;
    startup)
      rm -f "$OUT/cold-engines.txt"
      for cache in cold warm; do
        "$RN" bench --model resnet50 --batch 256 --amp --warmup 5 --steps 20 --device cuda --json \
          --engine-cache "$OUT/cold-engines.txt" >>"$OUT/misc.log" 2>&1
        say "startup ($cache cache) exit $?"
      done
      rm -f "$OUT/cold-engines.txt" "$OUT/cold-engines.txt.lock" ;;
    profile)
      for api in auto legacy; do
        echo "=== conv-api $api" >>"$OUT/profile.log"
        "$RN" bench --model resnet50 --batch 256 --amp --warmup 5 --steps 20 --device cuda --profile --profile-steps 3 \
          --conv-api $api >>"$OUT/profile.log" 2>&1
        say "profile ($api) exit $?"
      done ;;
    repro)
      d=$(mktemp -d)
      "$RN" data synthetic --out "$d/syn.h5" --train 2560 --val 512 --shape 28,28,1 --classes 10 --seed 3 >/dev/null
      args=(--model resnet18_fmnist --amp --epochs 2 --batch 256 --crop-padding 2 --device cuda --data "$d/syn.h5")
      mkdir -p "$d/shared"
      for r in s1 s2; do "$RN" train "${args[@]}" --save "$d/shared/$r.h5" >>"$OUT/misc.log" 2>&1; done
      for r in c1 c2; do "$RN" train "${args[@]}" --engine-cache off --save "$d/$r.h5" >>"$OUT/misc.log" 2>&1; done
      for p in "shared/s1 shared/s2" "c1 c2"; do  # how many saved tensors differ (tests/dist/compare_weights.py)
        read -r a b <<<"$p"
        echo "repro $a vs $b: $(python3 tests/dist/compare_weights.py "$d/$a.h5" "$d/$b.h5" | grep 'tensors differ')" \
          >>"$OUT/misc.log"
      done
      tail -2 "$OUT/misc.log"; rm -rf "$d" ;;
    recompute)
      # --recompute bn-relu must train to the same bits as off: mobilenet_v2 (inverted residuals) and resnet50
      # (bottlenecks) at 32x32 on a synthetic set, AMP, two epochs each way, sharing the engine cache; lr 0.02 (at 0.1,
      # ResNet-50 diverges on random labels and its BN running statistics overflow, which compare_weights.py rejects).
      d=$(mktemp -d)
      "$RN" data synthetic --out "$d/syn.h5" --train 2048 --val 256 --shape 32,32,3 --classes 10 --seed 5 >/dev/null
      for m in mobilenet_v2 resnet50; do
        for r in off bn-relu; do
          "$RN" train --model $m --resolution 32 --classes 10 --amp --epochs 2 --batch 128 --device cuda --data "$d/syn.h5" \
            --lr 0.02 --recompute $r --save "$d/$m-$r.h5" >>"$OUT/misc.log" 2>&1 || echo "recompute $m $r: exit $?" >>"$OUT/misc.log"
        done
      done
      for m in mobilenet_v2 resnet50; do
        echo "recompute $m, off vs bn-relu: $(python3 tests/dist/compare_weights.py "$d/$m-off.h5" "$d/$m-bn-relu.h5" |
          grep 'tensors differ')" >>"$OUT/misc.log"
      done
      say "recompute done"; grep "^recompute" "$OUT/misc.log"; rm -rf "$d" ;;
    levers)
      # Issue 15's per-lever rows: ResNet-50 b256 AMP with each fusion or option turned the other way, one at a time,
      # the defaults first and last (drift), one engine cache; then batch 400 (MLPerf's per-GPU batch) with the
      # defaults. LEVER_MODEL / LEVER_BATCH change the model and batch.
      lm=${LEVER_MODEL:-resnet50}; lb=${LEVER_BATCH:-256}
      : >"$OUT/levers.jsonl"
      while IFS= read -r flags; do
        # shellcheck disable=SC2086  # flags: options, split on purpose
        "$RN" bench --model "$lm" --batch "${flags%%|*}" --amp --warmup 10 --steps 50 --device cuda --json ${flags#*|} \
          2>>"$OUT/misc.log" | python3 -c 'import json,sys; j=json.loads([l for l in sys.stdin if l.startswith("{")][-1]); j["flags"]=sys.argv[1]; print(json.dumps(j))' \
          "${flags#*|}" >>"$OUT/levers.jsonl" || echo "levers: $flags failed" >>"$OUT/misc.log"
      done <<EOF_LEVERS
$lb|
$lb|--fused-kernels off
$lb|--fold-residual-sums off
$lb|--fuse-residual-bn-backward off
$lb|--relu-mask off
$lb|--fuse-shortcut-bn-backward off
$lb|--deterministic off
$lb|--deterministic off --conv-stats off
$lb|--recompute bn-relu
$lb|--streams on
$lb|--conv-api legacy
$lb|
400|
EOF_LEVERS
      python3 - "$OUT/levers.jsonl" <<'PY' | tee "$OUT/levers.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().startswith("{")]
base = [r for r in rows if not r["flags"] and r["batch"] == rows[0]["batch"]]
ref = sum(r["images_per_s"] for r in base) / max(len(base), 1)
print("| batch | flags | img/s | ms/step | arena GiB | vs the defaults' mean | convs with GEN_STATS |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['batch']} | {r['flags'] or '(defaults)'} | {r['images_per_s']:,.1f} | {r['ms_per_step']:.2f} | "
          f"{r['arena_bytes'] / 2**30:.2f} | {r['images_per_s'] / ref:.3f} | {r.get('engines_conv_stats', '-')} |")
PY
      ;;
    convstats)
      # --conv-stats (issue 15's conv + BN-statistics epilogue, --deterministic off only): its GPU tests, ResNet-50
      # b256 deterministic and not, with it off and on (interleaved, one engine cache), a profile with it on, and two
      # trainings with it on compared tensor by tensor.
      {
        build-gpu/tests/gpu_dnn/test_gpu_dnn --gtest_filter='GpuConvEngines.Genstats*'
        build-gpu/tests/gpu_kernels/test_gpu_kernels --gtest_filter='BatchNormTest.StatisticsFromSums*'
        build-gpu/tests/gpu_runtime/test_gpu_runtime --gtest_filter='GpuFused.ConvStats*'
      } >"$OUT/convstats-tests.log" 2>&1
      say "convstats tests exit $?"; grep -E "^\[ (genstats|conv-stats) \] [0-9]|^\[ +(PASSED|FAILED) +\]|conv-stats \]" \
        "$OUT/convstats-tests.log" | head -20
      for _ in 1 2; do
        for dc in "on off" "off off" "off on"; do  # --conv-stats on needs --deterministic off
          # shellcheck disable=SC2086  # two words on purpose
          set -- $dc
          echo "resnet50 b256 deterministic $1 conv-stats $2: $("$RN" bench --model resnet50 --batch 256 --amp \
            --warmup 10 --steps 40 --device cuda --json --deterministic "$1" --conv-stats "$2" 2>>"$OUT/misc.log" |
            python3 -c 'import json,sys; j=json.loads([l for l in sys.stdin if l.startswith("{")][-1]); print(j["images_per_s"], "img/s,", j.get("engines_conv_stats"), "convs with GEN_STATS")')" |
            tee -a "$OUT/convstats.log"
        done
      done
      "$RN" bench --model resnet50 --batch 256 --amp --warmup 5 --steps 20 --device cuda --profile --profile-steps 3 \
        --deterministic off --conv-stats on >>"$OUT/convstats.log" 2>&1
      d=$(mktemp -d)
      "$RN" data synthetic --out "$d/syn.h5" --train 2560 --val 512 --shape 28,28,1 --classes 10 --seed 3 >/dev/null
      for r in a b; do
        "$RN" train --model resnet18_fmnist --amp --epochs 2 --batch 256 --crop-padding 2 --device cuda --data "$d/syn.h5" \
          --deterministic off --conv-stats on --engine-cache "$d/engines.txt" --save "$d/$r.h5" >>"$OUT/misc.log" 2>&1
      done
      echo "conv-stats repro (--deterministic off): $(python3 tests/dist/compare_weights.py "$d/a.h5" "$d/b.h5" | grep 'tensors differ')" |
        tee -a "$OUT/convstats.log"
      rm -rf "$d" ;;
    recipe)
      if [[ ! -f data/fashion-mnist.h5 ]]; then
        "$RN" data import fashion-mnist --src data/cache/fashion-mnist --out data/fashion-mnist.h5 >/dev/null || exit 1
      fi
      for r in $(seq "${RECIPE_RUNS:-3}"); do
        t0=$(date +%s%N)
        # shellcheck disable=SC2086  # RECIPE_ARGS: options, split on purpose
        "$RN" train --config recipes/fmnist-resnet18.yaml ${RECIPE_ARGS:-} >"$OUT/recipe-$r.log" 2>&1
        rc=$?
        t1=$(date +%s%N)
        echo "recipe run $r: exit $rc, wall $(((t1 - t0) / 1000000)) ms; $(grep -o 'start-up .*' "$OUT/recipe-$r.log" | head -1);" \
          "$(tail -1 "$OUT/recipe-$r.log")" | tee -a "$OUT/recipe.log"
        echo "recipe run $r, epochs' img/s: $(grep -E '^epoch ' "$OUT/recipe-$r.log" | grep -oE '[0-9]+ img/s' | cut -d' ' -f1 |
          tr '\n' ' ')" | tee -a "$OUT/recipe.log"
      done
      rm -f "$OUT"/recipe-[0-9]*.log ;;
    kernels)
      build-gpu/tests/bench/bench_gpu_kernels ${KERNELS_FILTER:+--benchmark_filter="$KERNELS_FILTER"} \
        --benchmark_out="$OUT/kernels.json" --benchmark_out_format=json >"$OUT/kernels.log" 2>&1
      say "kernels exit $?"; grep -E "GB/s" "$OUT/kernels.log" | sed -E 's/ +/ /g' | head -100
      python3 scripts/bench/conv_stats_summary.py "$OUT/kernels.json" | grep -v "^no ConvStats" ;;
    cutlass)
      if [[ -x .deps/cutlass-probe ]]; then
        timeout "${CUTLASS_TIMEOUT:-300}" .deps/cutlass-probe >"$OUT/cutlass-probe.log" 2>&1
        say "cutlass probe exit $?"; grep -E "^per step|^sums|^backward" "$OUT/cutlass-probe.log"
      else
        say "cutlass: no .deps/cutlass-probe (build it here: scripts/bench/cutlass_probe.sh build, then carry it)"
      fi ;;
    fmnist)
      "$RN" data import fashion-mnist --src data/cache/fashion-mnist --out data/fm.h5 >/dev/null || exit 1
      # shellcheck disable=SC2086  # FMNIST_ARGS: options, split on purpose
      timeout "${FMNIST_TIMEOUT:-300}" "$RN" train --data data/fm.h5 --device cuda ${FMNIST_ARGS:---model resnet18_fmnist --amp --epochs 20 --batch 256 --crop-padding 2} \
        --metrics "$OUT/fmnist_gpu.jsonl" >"$OUT/fmnist_gpu.log" 2>&1
      say "fmnist exit $?"; tail -4 "$OUT/fmnist_gpu.log" ;;
  esac
done
say "done"
