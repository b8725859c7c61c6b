// Probe (not product code): a 1x1 convolution of NHWC activations is a plain GEMM, y[M x N] = x[M x K] * w[N x K]^T
// with M = N*H*W. Can CUTLASS 3's sm90 GEMM write BN's statistics (the per-channel sums of y and y^2) from its
// epilogue deterministically, and is that faster than the GEMM followed by a statistics pass over y?
//
// The epilogue visitor tree (EVT) rounds the accumulator to FP16 (the stored y), stores it, and feeds two
// Sm90RowReduction nodes with FinalReduction = false: each CTA tile writes its own partial sums (a fixed shuffle and
// shared-memory tree inside the tile, no atomics) to partials[m_tile][n]; a small kernel then adds the m tiles in a
// fixed order in FP64. So the sums should not depend on which CTA ran which tile, or when.
//
// Per ResNet-50 (batch 256) stride-1 1x1 shape, it times (CUDA events, median of 20 after 5 warm-ups, back to back):
//   fused     CUTLASS GEMM with the statistics epilogue + the FP64 finalize
//   cutlass   the same CUTLASS GEMM with a plain epilogue + a statistics pass over y + the same finalize
//   cublas    cublasGemmEx (FP16 in, FP32 compute) + the same statistics pass + finalize
// and checks: the fused sums against FP64 sums of the stored y (on the host), y bit for bit against the plain CUTLASS
// GEMM, and the fused y and sums bit for bit over 3 runs (with a kernel running beside on another stream in between).
//
// Build (sm_90a, CUTLASS headers from PyPI's nvidia-cutlass wheel): scripts/bench/cutlass_probe.sh build
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cute/tensor.hpp"
#include "cutlass/cutlass.h"
#include "cutlass/epilogue/collective/collective_builder.hpp"
#include "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp"
#include "cutlass/epilogue/thread/activation.h"
#include "cutlass/gemm/collective/collective_builder.hpp"
#include "cutlass/gemm/device/gemm_universal_adapter.h"
#include "cutlass/gemm/kernel/gemm_universal.hpp"
#include "cutlass/util/packed_stride.hpp"
#include "cutlass/version.h"

#define CK(x)                                                                                  \
  do {                                                                                         \
    cudaError_t e_ = (x);                                                                      \
    if (e_ != cudaSuccess) {                                                                   \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                            \
    }                                                                                          \
  } while (0)

using namespace cute;
namespace fus = cutlass::epilogue::fusion;

using ElementA = cutlass::half_t;  // x: M x K, K contiguous (NHWC)
using LayoutA = cutlass::layout::RowMajor;
using ElementB = cutlass::half_t;  // w: N x K, K contiguous (KRSC with R = S = 1): CUTLASS's column-major K x N
using LayoutB = cutlass::layout::ColumnMajor;
using ElementD = cutlass::half_t;  // y: M x N, N contiguous (NHWC)
using LayoutD = cutlass::layout::RowMajor;
using ElementC = void;  // no source
constexpr int kAlign = 8;
using TileShape = Shape<_128, _128, _64>;
using ClusterShape = Shape<_1, _1, _1>;
constexpr int kTileM = 128, kTileN = 128;
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

template <class T>
using Identity = cutlass::epilogue::thread::Identity<T>;

// Per-tile partial sums over the tile's rows, one per column: partials[m_tile * round_up(N, 128) + n] (FP32).
using RowPartials = fus::Sm90RowReduction<cutlass::plus, cutlass::plus, cutlass::plus, 0, TileShape, float, float,
                                          kRound, Stride<_0, _1, _0>, 4, true, /*FinalReduction=*/false>;
using ToHalf = fus::Sm90Compute<Identity, ElementD, float, kRound>;

using StatsFusion = fus::Sm90SplitTreeVisitor<
    fus::Sm90EVT<ToHalf, fus::Sm90AccFetch>,  // input: y as stored (FP16)
    fus::Sm90EVT<ToHalf, fus::Sm90SplitTreeFetch>,  // output: y
    fus::Sm90EVT<RowPartials, fus::Sm90SplitTreeFetch>,  // aux: sum y
    fus::Sm90EVT<RowPartials, fus::Sm90EVT<fus::Sm90Compute<cutlass::square, float, float, kRound>,
                                           fus::Sm90SplitTreeFetch>>>;  // aux: sum y^2
using PlainFusion = fus::Sm90EVT<ToHalf, fus::Sm90AccFetch>;

template <class Fusion>
struct GemmOf {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float, ElementC, LayoutD, kAlign, ElementD, LayoutD,
      kAlign, cutlass::epilogue::TmaWarpSpecializedCooperative, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlign, ElementB, LayoutB, kAlign,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
using StatsGemm = GemmOf<StatsFusion>::Gemm;
using PlainGemm = GemmOf<PlainFusion>::Gemm;

template <class Gemm>
struct Runner {
  Gemm gemm;
  void* ws = nullptr;
  template <class FusionArgs>
  void init(int M, int N, int K, const cutlass::half_t* x, const cutlass::half_t* w, cutlass::half_t* y,
            FusionArgs fa) {
    using K_ = typename Gemm::GemmKernel;
    auto sa = cutlass::make_cute_packed_stride(typename K_::StrideA{}, make_shape(M, K, 1));
    auto sb = cutlass::make_cute_packed_stride(typename K_::StrideB{}, make_shape(N, K, 1));
    auto sc = cutlass::make_cute_packed_stride(typename K_::StrideC{}, make_shape(M, N, 1));
    auto sd = cutlass::make_cute_packed_stride(typename K_::StrideD{}, make_shape(M, N, 1));
    typename Gemm::Arguments args{cutlass::gemm::GemmUniversalMode::kGemm,
                                  {M, N, K, 1},
                                  {x, sa, w, sb},
                                  {fa, nullptr, sc, y, sd}};
    if (gemm.can_implement(args) != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "CUTLASS cannot implement M=%d N=%d K=%d\n", M, N, K);
      std::exit(1);
    }
    const size_t bytes = Gemm::get_workspace_size(args);
    if (ws) CK(cudaFree(ws));
    ws = nullptr;
    if (bytes) CK(cudaMalloc(&ws, bytes));
    if (gemm.initialize(args, ws) != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "CUTLASS initialize failed\n");
      std::exit(1);
    }
  }
  void run(cudaStream_t s) {
    if (gemm.run(s) != cutlass::Status::kSuccess) {
      std::fprintf(stderr, "CUTLASS run failed\n");
      std::exit(1);
    }
  }
};

// ---- the statistics pass over y (the unfused baseline) and the FP64 finalize ------------------------------------
// Block: 8 column vectors of 8 halves (64 columns) x 32 row lanes; partials[block_y][2][N] over the block's rows.
__global__ void stats_pass(const __half* __restrict__ y, int M, int N, int rows_per_block, float* __restrict__ part) {
  const int cv = threadIdx.x % 8, lane = threadIdx.x / 8;
  const int c0 = (blockIdx.x * 8 + cv) * 8;
  const int r0 = blockIdx.y * rows_per_block, r1 = min(M, r0 + rows_per_block);
  float s1[8] = {}, s2[8] = {};
  if (c0 < N) {
    for (int r = r0 + lane; r < r1; r += 32) {
      const uint4 v = *reinterpret_cast<const uint4*>(y + static_cast<size_t>(r) * N + c0);
      const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 f = __half22float2(h[j]);
        s1[2 * j] += f.x;
        s2[2 * j] += f.x * f.x;
        s1[2 * j + 1] += f.y;
        s2[2 * j + 1] += f.y * f.y;
      }
    }
  }
  __shared__ float red[2][8][32][8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    red[0][cv][lane][j] = s1[j];
    red[1][cv][lane][j] = s2[j];
  }
  __syncthreads();
  for (int s = 16; s > 0; s >>= 1) {
    if (lane < s)
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        red[0][cv][lane][j] += red[0][cv][lane + s][j];
        red[1][cv][lane][j] += red[1][cv][lane + s][j];
      }
    __syncthreads();
  }
  if (lane == 0 && c0 < N)
    for (int j = 0; j < 8; ++j) {
      part[(static_cast<size_t>(blockIdx.y) * 2 + 0) * N + c0 + j] = red[0][cv][0][j];
      part[(static_cast<size_t>(blockIdx.y) * 2 + 1) * N + c0 + j] = red[1][cv][0][j];
    }
}

// sum[n] = sum over g of p1[g * stride + n] (FP64, g in order), the same for p2.
__global__ void finalize(const float* __restrict__ p1, const float* __restrict__ p2, int groups, size_t stride, int N,
                         double* __restrict__ sum, double* __restrict__ sq) {
  const int n = blockIdx.x * blockDim.x + threadIdx.x;
  if (n >= N) return;
  double a = 0, b = 0;
  for (int g = 0; g < groups; ++g) {
    a += p1[g * stride + n];
    b += p2[g * stride + n];
  }
  sum[n] = a;
  sq[n] = b;
}

__global__ void fill_half(__half* p, size_t n, unsigned seed, float scale) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    unsigned h = static_cast<unsigned>(i) * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = __float2half(scale * (static_cast<float>(h & 0xffff) / 65536.0f - 0.3f));  // a positive mean, as after a ReLU
  }
}

__global__ void spin(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

template <class F>
float median_ms(F&& f, cudaStream_t s) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 5; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(a, s));
    f();
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t[t.size() / 2];
}

struct Shape3 {
  int hw, k, n, count;
};

int main() {
  const int batch = 256;
  const Shape3 shapes[] = {{56 * 56, 64, 64, 1},     {56 * 56, 64, 256, 4},    {56 * 56, 256, 64, 2},
                           {56 * 56, 256, 128, 1},   {28 * 28, 128, 512, 4},   {28 * 28, 512, 128, 3},
                           {28 * 28, 512, 256, 1},   {14 * 14, 256, 1024, 6},  {14 * 14, 1024, 256, 5},
                           {14 * 14, 1024, 512, 1},  {7 * 7, 512, 2048, 3},    {7 * 7, 2048, 512, 2}};
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, %d SMs; CUTLASS %d.%d.%d; tile %dx%dx64, cooperative, cluster 1x1\n", prop.name,
              prop.multiProcessorCount, CUTLASS_MAJOR, CUTLASS_MINOR, CUTLASS_PATCH, kTileM, kTileN);
  cudaStream_t s, side;
  CK(cudaStreamCreate(&s));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cublasHandle_t cb;
  if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(cb, s);

  double tot_fused = 0, tot_cutlass = 0, tot_cublas = 0, tot_gemm_c = 0, tot_gemm_b = 0;
  bool all_repeat = true, all_same_y = true;
  double worst_sum = 0, worst_sq = 0;
  std::printf("%-22s %5s %9s %9s %9s %9s %9s %7s %9s %9s %s\n", "shape (HW, K->N)", "count", "fused", "cutlass+st",
              "cublas+st", "gemm_ct", "gemm_cb", "fused/", "sum err", "sq err", "bits");
  for (const Shape3& sh : shapes) {
    const int M = batch * sh.hw, K = sh.k, N = sh.n;
    const int mt = (M + kTileM - 1) / kTileM, npad = (N + kTileN - 1) / kTileN * kTileN;
    __half *x, *w, *y, *y2;
    float *part, *spart;
    double *sum, *sq;
    CK(cudaMalloc(&x, sizeof(__half) * M * K));
    CK(cudaMalloc(&w, sizeof(__half) * N * K));
    CK(cudaMalloc(&y, sizeof(__half) * M * N));
    CK(cudaMalloc(&y2, sizeof(__half) * M * N));
    CK(cudaMalloc(&part, sizeof(float) * 2 * static_cast<size_t>(mt) * npad));
    const int rpb = 512, sgroups = (M + rpb - 1) / rpb;
    CK(cudaMalloc(&spart, sizeof(float) * 2 * static_cast<size_t>(sgroups) * N));
    CK(cudaMalloc(&sum, sizeof(double) * 2 * N));
    sq = sum + N;
    fill_half<<<1024, 256, 0, s>>>(x, static_cast<size_t>(M) * K, 17u, 2.0f);
    fill_half<<<1024, 256, 0, s>>>(w, static_cast<size_t>(N) * K, 99u, 2.0f / std::sqrt(static_cast<float>(K)));
    float* p1 = part;
    float* p2 = part + static_cast<size_t>(mt) * npad;

    Runner<StatsGemm> fused;
    typename StatsFusion::Arguments fa{{{}, {}}, {{}, {p1, 0.f, {}}}, {{{}, {}}, {p2, 0.f, {}}}, {{}, {}}};
    fused.init(M, N, K, reinterpret_cast<cutlass::half_t*>(x), reinterpret_cast<cutlass::half_t*>(w),
               reinterpret_cast<cutlass::half_t*>(y), fa);
    Runner<StatsGemm>* fp = &fused;
    Runner<PlainGemm> plain;
    typename PlainFusion::Arguments pa{{}, {}};
    plain.init(M, N, K, reinterpret_cast<cutlass::half_t*>(x), reinterpret_cast<cutlass::half_t*>(w),
               reinterpret_cast<cutlass::half_t*>(y2), pa);
    const dim3 sgrid((N + 63) / 64, sgroups);
    auto stats = [&](const __half* yy) {
      stats_pass<<<sgrid, 256, 0, s>>>(yy, M, N, rpb, spart);
      finalize<<<(N + 127) / 128, 128, 0, s>>>(spart, spart + N, sgroups, 2 * static_cast<size_t>(N), N, sum, sq);
    };
    auto run_fused = [&] {
      fp->run(s);
      finalize<<<(N + 127) / 128, 128, 0, s>>>(p1, p2, mt, npad, N, sum, sq);
    };
    const float one = 1.0f, zero = 0.0f;
    auto run_cublas = [&] {
      cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, N, M, K, &one, w, CUDA_R_16F, K, x, CUDA_R_16F, K, &zero, y2,
                   CUDA_R_16F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    };

    // Correctness and repeatability first.
    run_fused();
    CK(cudaStreamSynchronize(s));
    std::vector<__half> hy(static_cast<size_t>(M) * N), hy2(hy.size());
    std::vector<double> hs(2 * N), hs2(2 * N);
    std::vector<float> hp(2 * static_cast<size_t>(mt) * npad), hp2(hp.size());
    CK(cudaMemcpy(hy.data(), y, sizeof(__half) * hy.size(), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hs.data(), sum, sizeof(double) * 2 * N, cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(hp.data(), part, sizeof(float) * hp.size(), cudaMemcpyDeviceToHost));
    bool repeat = true;
    for (int rep = 0; rep < 3; ++rep) {
      spin<<<prop.multiProcessorCount / 2, 64, 0, side>>>(200000 * (rep + 1));  // SMs held by another kernel
      CK(cudaMemsetAsync(y, 0, sizeof(__half) * hy.size(), s));
      CK(cudaMemsetAsync(part, 0xff, sizeof(float) * hp.size(), s));
      run_fused();
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(hy2.data(), y, sizeof(__half) * hy.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hs2.data(), sum, sizeof(double) * 2 * N, cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hp2.data(), part, sizeof(float) * hp.size(), cudaMemcpyDeviceToHost));
      repeat = repeat && std::memcmp(hy.data(), hy2.data(), sizeof(__half) * hy.size()) == 0 &&
               std::memcmp(hs.data(), hs2.data(), sizeof(double) * 2 * N) == 0;
      // partials: only the first N of each row of npad are written
      for (int g = 0; g < 2 * mt && repeat; ++g)
        repeat = std::memcmp(&hp[static_cast<size_t>(g) * npad], &hp2[static_cast<size_t>(g) * npad],
                             sizeof(float) * N) == 0;
    }
    plain.run(s);
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(hy2.data(), y2, sizeof(__half) * hy.size(), cudaMemcpyDeviceToHost));
    const bool same_y = std::memcmp(hy.data(), hy2.data(), sizeof(__half) * hy.size()) == 0;
    // FP64 sums of the stored y on the host; errors relative to sum |y| and sum y^2.
    std::vector<double> rs(N, 0.0), rq(N, 0.0), ra(N, 0.0);
    for (size_t r = 0; r < static_cast<size_t>(M); ++r)
      for (int c = 0; c < N; ++c) {
        const double v = __half2float(hy[r * N + c]);
        rs[c] += v;
        rq[c] += v * v;
        ra[c] += std::fabs(v);
      }
    double es = 0, eq = 0;
    for (int c = 0; c < N; ++c) {
      es = std::max(es, std::fabs(hs[c] - rs[c]) / std::max(ra[c], 1e-30));
      eq = std::max(eq, std::fabs(hs[N + c] - rq[c]) / std::max(rq[c], 1e-30));
    }
    worst_sum = std::max(worst_sum, es);
    worst_sq = std::max(worst_sq, eq);
    all_repeat = all_repeat && repeat;
    all_same_y = all_same_y && same_y;

    const float t_fused = median_ms(run_fused, s);
    const float t_gc = median_ms([&] { plain.run(s); }, s);
    const float t_cutlass = median_ms(
        [&] {
          plain.run(s);
          stats(y2);
        },
        s);
    const float t_gb = median_ms(run_cublas, s);
    const float t_cublas = median_ms(
        [&] {
          run_cublas();
          stats(y2);
        },
        s);
    const float best_unfused = std::min(t_cutlass, t_cublas);
    const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(sh.hw))));
    std::printf("%4dx%-4d %5d->%-5d %5d %9.4f %9.4f %9.4f %9.4f %9.4f %7.3f %9.2e %9.2e %s%s\n", side, side, K, N, sh.count,
                t_fused, t_cutlass, t_cublas, t_gc, t_gb, t_fused / best_unfused, es, eq,
                repeat ? "repeat" : "DIFFER", same_y ? "" : " (y != plain GEMM's y)");
    tot_fused += sh.count * t_fused;
    tot_cutlass += sh.count * t_cutlass;
    tot_cublas += sh.count * t_cublas;
    tot_gemm_c += sh.count * t_gc;
    tot_gemm_b += sh.count * t_gb;
    CK(cudaFree(x));
    CK(cudaFree(w));
    CK(cudaFree(y));
    CK(cudaFree(y2));
    CK(cudaFree(part));
    CK(cudaFree(spart));
    CK(cudaFree(sum));
    if (fused.ws) CK(cudaFree(fused.ws));
    if (plain.ws) CK(cudaFree(plain.ws));
  }
  std::printf("per step (33 convolutions, counts applied), ms: fused %.3f, CUTLASS GEMM + stats %.3f, cuBLAS GEMM + "
              "stats %.3f (GEMMs alone: CUTLASS %.3f, cuBLAS %.3f); fused / best unfused %.3f\n",
              tot_fused, tot_cutlass, tot_cublas, tot_gemm_c, tot_gemm_b,
              tot_fused / std::min(tot_cutlass, tot_cublas));
  std::printf("sums: worst error %.2e of sum|y|, %.2e of sum y^2; fused y and sums %s over 3 runs; fused y %s the "
              "plain GEMM's\n",
              worst_sum, worst_sq, all_repeat ? "REPEATED bit for bit" : "DIFFERED", all_same_y ? "equals" : "differs from");
  cublasDestroy(cb);
  return 0;
}
