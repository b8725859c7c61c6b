# Spack recipe for Renaissance. Use it from a local repository:
#
#   spack repo create ~/spack-repos/renaissance        # once; then copy this file to
#   cp package.py ~/spack-repos/renaissance/packages/renaissance/package.py   (older layout) or
#      ~/spack-repos/renaissance/spack_repo/renaissance/packages/renaissance/package.py (Spack 1.x)
#   spack repo add ~/spack-repos/renaissance
#   spack install renaissance +cuda cuda_arch=90
#
# or, from a checkout:  spack develop --path . renaissance@main && spack install
try:  # Spack >= 1.0 (package API v2: build systems live in the builtin repository)
    from spack_repo.builtin.build_systems.cmake import CMakePackage, generator
    from spack_repo.builtin.build_systems.cuda import CudaPackage
except ImportError:  # Spack 0.2x: everything comes from spack.package
    pass

from spack.package import *  # noqa: F401,F403


class Renaissance(CMakePackage, CudaPackage):
    """Renaissance: a C++17/CUDA training framework for convolutional image classifiers that
    plans every tensor offset and kernel launch before the first step. MPI-native (one SPMD
    executable, NCCL on GPUs, MPI on CPU ranks), HDF5 datasets and checkpoints."""

    homepage = "https://example.org/renaissance"  # placeholder
    git = "https://example.org/renaissance.git"  # placeholder

    maintainers("renaissance-team")  # placeholder

    version("main", branch="main")

    # cuda / cuda_arch come from CudaPackage; cuda_arch=none means sm_90 (the H200).
    variant("xnnpack", default=False, description="Use XNNPACK for CPU forward operators")
    variant("openblas", default=False, description="Offer OpenBLAS as a CPU GEMM backend")
    variant("onednn", default=False, description="oneDNN 2.x training primitives for the CPU convolutions")
    variant("images", default=True, description="JPEG/PNG import and JPEG stores (libjpeg-turbo, libpng)")
    variant("tests", default=False, description="Build the GoogleTest suites and Google Benchmark programs")

    generator("ninja")

    depends_on("c", type="build")
    depends_on("cxx", type="build")
    depends_on("cmake@3.24:", type="build")
    depends_on("ninja", type="build")

    depends_on("mpi")
    depends_on("hdf5@1.10:")  # the C library only; serial is enough (~mpi is fine)
    depends_on("cli11@2.1:")
    depends_on("yaml-cpp@0.7:")
    depends_on("fmt@9:")
    depends_on("spdlog@1.10:")
    depends_on("zlib-api")

    # The code targets the 2022-02-16 XNNPACK API (no reshape step), as in Debian 12.
    depends_on("xnnpack@2022-02-16", when="+xnnpack")

    depends_on("openblas", when="+openblas")
    depends_on("libjpeg-turbo@2:", when="+images")  # the TurboJPEG API (turbojpeg.h, libturbojpeg)
    depends_on("libpng@1.6:", when="+images")

    # The 2.x API (operation descriptors; oneDNN 3 removed them). Renaissance runs each primitive single-threaded on
    # batch pieces of its own thread pool, which needs the OpenMP or sequential runtime (not TBB or threadpool).
    depends_on("onednn@2.0:2 cpu_runtime=omp", when="+onednn")

    depends_on("googletest", type=("build", "test"), when="+tests")
    depends_on("benchmark", type=("build", "test"), when="+tests")

    depends_on("cuda@12:", when="+cuda")
    depends_on("cudnn@9:", when="+cuda")
    depends_on("nccl", when="+cuda")
    # cudnn-frontend (header-only C++ over cuDNN's graph API, the convolutions) has no Spack package: its headers
    # come from NVIDIA's PyPI wheel (a zip), unpacked beside the sources.
    resource(
        name="cudnn-frontend",
        url="https://files.pythonhosted.org/packages/cp311/n/nvidia-cudnn-frontend/"
        "nvidia_cudnn_frontend-1.32.0-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
        sha256="c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0",
        expand=True,
        destination="cudnn-frontend",
        when="+cuda",
    )

    conflicts("%gcc@:8", msg="Renaissance needs C++17 (GCC 9 or newer)")

    def cmake_args(self):
        spec = self.spec
        args = [
            self.define("RENAISSANCE_CUDA", "ON" if spec.satisfies("+cuda") else "OFF"),
            self.define("RENAISSANCE_XNNPACK", "ON" if spec.satisfies("+xnnpack") else "OFF"),
            self.define("RENAISSANCE_OPENBLAS", "ON" if spec.satisfies("+openblas") else "OFF"),
            self.define("RENAISSANCE_ONEDNN", "ON" if spec.satisfies("+onednn") else "OFF"),
            self.define("RENAISSANCE_JPEG", "ON" if spec.satisfies("+images") else "OFF"),
            self.define("RENAISSANCE_PNG", "ON" if spec.satisfies("+images") else "OFF"),
            self.define_from_variant("RENAISSANCE_BUILD_TESTS", "tests"),
            self.define_from_variant("RENAISSANCE_BUILD_BENCHMARKS", "tests"),
        ]
        if spec.satisfies("+cuda"):
            archs = [a for a in spec.variants["cuda_arch"].value if a != "none"]
            args.append(self.define("CMAKE_CUDA_ARCHITECTURES", ";".join(archs) if archs else "90"))
            args.append(self.define("CUDAToolkit_ROOT", spec["cuda"].prefix))
            args.append(
                self.define("CUDNN_FRONTEND_ROOT", join_path(self.stage.source_path, "cudnn-frontend"))
            )
        return args
