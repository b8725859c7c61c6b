# Spack recipe for Renaissance. Use it from a local repository (Spack >= 1.0 layout):
#
#   spack repo create ~/spack-repos/renaissance renaissance     # once; then copy this file to
#   mkdir -p ~/spack-repos/renaissance/spack_repo/renaissance/packages/renaissance
#   cp package.py ~/spack-repos/renaissance/spack_repo/renaissance/packages/renaissance/
#   spack repo add ~/spack-repos/renaissance/spack_repo/renaissance
#   spack install renaissance +cuda cuda_arch=90
#   spack install --test=root renaissance              # also builds and runs the CPU test suites
#
# or, in a Spack environment, from a checkout:
#   spack develop --no-clone --path . renaissance@main
#   spack add renaissance@main && spack install
# scripts/check-spack-recipe --install runs `spack install --test=root renaissance` offline
# (docs/build.md, "Spack").
import glob
import zipfile

try:  # Spack >= 1.0 (package API v2: build systems live in the builtin repository)
    from spack_repo.builtin.build_systems.cmake import CMakePackage
    from spack_repo.builtin.build_systems.cuda import CudaPackage
except ImportError:  # Spack 0.2x: everything comes from spack.package
    pass

from spack.package import *  # noqa: F401,F403


class Renaissance(CMakePackage, CudaPackage):
    """Renaissance: a C++17/CUDA training framework for convolutional image classifiers that
    plans every tensor offset and kernel launch before the first step. MPI-native (one SPMD
    executable, NCCL on GPUs, MPI on CPU ranks), HDF5 datasets and checkpoints."""

    # Placeholders: the project has no public home yet (the tarball itself is real, see below).
    homepage = "https://example.org/renaissance"
    url = "https://example.org/renaissance/releases/renaissance-0.1.0.tar.gz"
    git = "https://example.org/renaissance.git"

    # Placeholder: spack-packages needs the GitHub handles of those who answer for this recipe.
    maintainers("renaissance-team")

    # No license has been chosen yet: spack-packages needs an SPDX identifier, e.g. license("MIT").

    version("main", branch="main")
    # The tarball of commit 9ff740c made by `scripts/make-release-tarball 0.1.0 9ff740c` (git
    # archive + gzip -n: the same commit gives the same bytes). Offline: a Spack mirror (build.md).
    version("0.1.0", sha256="8c12f43ed427ec0cb337ea81414c31d77acc717cb1050e8ffedbf03c1c8968b6")

    # cuda / cuda_arch come from CudaPackage.
    variant("xnnpack", default=False, description="Use XNNPACK for CPU forward operators")
    variant("openblas", default=False, description="Offer OpenBLAS as a CPU GEMM backend")
    variant("onednn", default=False, description="oneDNN 2.x primitives for CPU convolutions")
    variant("images", default=True, description="JPEG/PNG import, JPEG stores (turbojpeg, png)")
    # nvJPEG came after 0.1.0, whose tree has no switch for it (a spec could claim it for a binary
    # without it). "@0.1.1:" holds main: Spack orders main above every numbered version.
    variant(
        "nvjpeg",
        default=True,
        when="@0.1.1: +cuda",
        description="Decode JPEG stores on the GPU with nvJPEG (the CUDA toolkit's libnvjpeg)",
    )

    # No generator() line: CMakePackage's default (Unix Makefiles) keeps Ninja, and the Python
    # build that Spack's ninja package drags in, out of the DAG.

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.24:", type="build")

    depends_on("mpi")
    # The C library only; serial is enough (~mpi is fine). 1.10.3: H5Dread_chunk.
    depends_on("hdf5@1.10.3:")
    depends_on("cli11@2.1:")
    depends_on("yaml-cpp@0.7:")
    # fmt 11 moved fmt::join to <fmt/ranges.h>, which some sources do not include; spdlog 1.15
    # bundles and needs fmt 11.
    depends_on("fmt@9:10")
    depends_on("spdlog@1.10:1.14")
    depends_on("zlib-api")

    # The code targets the 2022-02-16 XNNPACK API (no reshape step), as in Debian 12.
    depends_on("xnnpack@2022-02-16", when="+xnnpack")

    depends_on("openblas", when="+openblas")
    # the TurboJPEG API (turbojpeg.h, libturbojpeg) and its libjpeg API
    # (jpeglib.h: random-resized crops decode only their box)
    depends_on("libjpeg-turbo@2:", when="+images")
    depends_on("libpng@1.6:", when="+images")

    # The 2.x API (operation descriptors; oneDNN 3 removed them). Each primitive runs
    # single-threaded on batch pieces of Renaissance's own thread pool, which needs the OpenMP or
    # sequential runtime (not TBB or threadpool).
    depends_on("onednn@2.0:2 cpu_runtime=omp", when="+onednn")

    # `spack install --test=root renaissance`: the GoogleTest suites are built (self.run_tests)
    # and run by check().
    depends_on("googletest", type="test")

    depends_on("cuda@12:", when="+cuda")
    # nvJPEG (JPEG stores decoded on the GPU, +nvjpeg) ships with the CUDA toolkit (libnvjpeg).
    depends_on("cudnn@9:", when="+cuda")
    depends_on("nccl", when="+cuda")
    # cudnn-frontend (header-only C++ over cuDNN's graph API, the convolutions) has no Spack
    # package: its headers come from NVIDIA's PyPI wheel (a zip). Spack never unpacks a .whl
    # (with expand=True cudnn-frontend/ stayed empty) and moves an unexpanded file only with a
    # placement: the wheel goes to cudnn-frontend/wheel/, unpack_cudnn_frontend() takes
    # include/ out of it before cmake.
    resource(
        name="cudnn-frontend",
        url="https://files.pythonhosted.org/packages/cp311/n/nvidia-cudnn-frontend/"
        "nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        sha256="c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0",
        expand=False,
        destination="cudnn-frontend",
        placement="wheel",
        when="+cuda",
    )

    conflicts("%gcc@:8", msg="Renaissance needs C++17 (GCC 9 or newer)")
    conflicts(
        "cuda_arch=none", when="+cuda", msg="+cuda needs a GPU architecture, e.g. cuda_arch=90"
    )

    @run_before("cmake", when="+cuda")
    def unpack_cudnn_frontend(self):
        root = join_path(self.stage.source_path, "cudnn-frontend")
        wheels = glob.glob(join_path(root, "wheel", "*.whl"))
        if not wheels:
            raise InstallError(f"no cudnn-frontend wheel in {root}")
        with zipfile.ZipFile(wheels[0]) as z:
            z.extractall(root, [n for n in z.namelist() if n.startswith("include/")])
        if not glob.glob(join_path(root, "include", "cudnn_frontend.h")):
            raise InstallError(f"{wheels[0]} has no include/cudnn_frontend.h")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("RENAISSANCE_CUDA", spec.satisfies("+cuda")),
            self.define("RENAISSANCE_XNNPACK", spec.satisfies("+xnnpack")),
            self.define("RENAISSANCE_OPENBLAS", spec.satisfies("+openblas")),
            self.define("RENAISSANCE_ONEDNN", spec.satisfies("+onednn")),
            self.define("RENAISSANCE_JPEG", spec.satisfies("+images")),
            self.define("RENAISSANCE_PNG", spec.satisfies("+images")),
            self.define("RENAISSANCE_BUILD_TESTS", self.run_tests),
            self.define("RENAISSANCE_BUILD_BENCHMARKS", False),
        ]
        if spec.satisfies("+cuda"):
            archs = spec.variants["cuda_arch"].value
            args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs)))
            args.append(self.define("CUDAToolkit_ROOT", spec["cuda"].prefix))
            frontend = join_path(self.stage.source_path, "cudnn-frontend")
            args.append(self.define("CUDNN_FRONTEND_ROOT", frontend))
            args.append(self.define("RENAISSANCE_NVJPEG", spec.satisfies("+nvjpeg")))
            if spec.satisfies("+nvjpeg"):
                args.append(self.define("NVJPEG_ROOT", spec["cuda"].prefix))
        else:
            args.append(self.define("RENAISSANCE_NVJPEG", False))
        return args

    def check(self):
        """The CPU suites (labels unit, integration); GPU, MPI-launcher and Slurm tests need a
        GPU or a scheduler that a build sandbox does not have."""
        ctest = Executable(self.spec["cmake"].prefix.bin.ctest)
        labels = ["-L", "unit|integration", "-LE", "gpu|slurm|mpi"]
        with working_dir(self.build_directory):
            ctest("--output-on-failure", *labels, "-j", str(make_jobs))
