#!/usr/bin/env bash
# The nvJPEG state hazard behind kernels/cuda/jpeg_decode.cpp's Fence, on its own, in one short call on the GPU
# machine (no project build): compiles tests/gpu_runtime/nvjpeg_fence_probe.cpp, writes baseline and progressive
# JPEGs with Pillow, and prints how many progressive decodes differ from their reference without and with the fence.
#   scripts/bench/nvjpeg_fence_probe.sh        (ITERATIONS, default 300; carry .deps/nvjpeg if the toolkit has no
#                                               nvjpeg.h)
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
CUDA=${CUDA_HOME:-/usr/local/cuda}
INC=(-I"$CUDA/include") LIB=(-L"$CUDA/lib64")
if [[ ! -e $CUDA/include/nvjpeg.h && -e .deps/nvjpeg/include/nvjpeg.h ]]; then
  INC+=(-I.deps/nvjpeg/include) LIB+=(-L.deps/nvjpeg/lib)
  export LD_LIBRARY_PATH=$PWD/.deps/nvjpeg/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
g++ -std=c++17 -O2 "${INC[@]}" tests/gpu_runtime/nvjpeg_fence_probe.cpp "${LIB[@]}" -lnvjpeg -lcudart \
  -o /tmp/nvjpeg_fence_probe || exit 1
D=/tmp/nvjpeg-fence-jpegs
rm -rf "$D" && mkdir -p "$D"
python3 - "$D" <<'EOF' || exit 1
import sys
import numpy as np
from PIL import Image
d = sys.argv[1]
rng = np.random.RandomState(7)
def picture(h, w):  # smooth colour gradients with noise: Huffman work in every block
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], -1)
    return np.clip(base + rng.normal(0, 24, (h, w, 3)), 0, 255).astype(np.uint8)
for i in range(4):
    Image.fromarray(picture(375, 500)).save(f"{d}/base_{i}.jpg", quality=90)
for i in range(3):
    Image.fromarray(picture(192 + 16 * i, 256)).save(f"{d}/prog_{i}.jpg", quality=90, progressive=True)
EOF
/tmp/nvjpeg_fence_probe "$D" "${ITERATIONS:-300}"
