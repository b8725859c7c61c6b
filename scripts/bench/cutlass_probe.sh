#!/usr/bin/env bash
# The CUTLASS statistics-epilogue probe (tests/bench/probes/cutlass_stats/): a 1x1 convolution as a CUTLASS sm90 GEMM
# writing BN's per-channel sums deterministically from its epilogue, against the GEMM + a statistics pass.
#   scripts/bench/cutlass_probe.sh build   fetch PyPI's nvidia-cutlass wheel (C++ headers) into .deps/cutlass and
#                                          build .deps/cutlass-probe with nvcc -arch=sm_90a (here: no GPU needed)
#   scripts/bench/cutlass_probe.sh run     run it (the GPU machine; carry .deps/cutlass-probe)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
case ${1:-build} in
  build)
    if [[ ! -d .deps/cutlass/include/cutlass ]]; then
      tmp=$(mktemp -d)
      python3 -m pip download --no-deps -q -d "$tmp" "nvidia-cutlass==${CUTLASS_VERSION:-4.2.0.0}"
      python3 - "$tmp"/nvidia_cutlass-*.whl <<'PY'
import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    for pre, dst in (("cutlass_library/source/include/", ".deps/cutlass/include/"),
                     ("cutlass_library/source/tools/util/include/", ".deps/cutlass/include/")):
        if n.startswith(pre) and not n.endswith("/"):
            out = dst + n[len(pre):]
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(z.read(n))
PY
      rm -rf "$tmp"
    fi
    NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
    "$NVCC" -std=c++17 -O3 -DNDEBUG -arch=sm_90a --expt-relaxed-constexpr -Xcompiler -Wno-psabi \
      -I.deps/cutlass/include tests/bench/probes/cutlass_stats/probe.cu -o .deps/cutlass-probe -lcublas
    echo "built .deps/cutlass-probe" ;;
  run) .deps/cutlass-probe ;;
  *) echo "usage: $0 build|run" >&2; exit 2 ;;
esac
