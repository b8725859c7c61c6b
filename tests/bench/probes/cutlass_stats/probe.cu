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
// The epilogue subtile: the forward GEMMs take CUTLASS's choice (128x32 for this tile), the backward ones one subtile
// of 128x128 (measured on an H100, session 27: forward 4.86 ms a step with the automatic subtile against 5.23 with
// 128x128; backward 9.27 against 7.98).
// PROBE_PINGPONG: the ping-pong schedule (two consumer warpgroups on two tiles, one's epilogue beside the other's
// main loop) instead of the cooperative one (both on one tile, the epilogue not overlapped).
// The epilogue subtile: the forward GEMMs take CUTLASS's choice (128x32 for this tile), the cooperative backward ones
// one subtile of 128x128 (one H100, session 27: forward 4.86 ms a step with CUTLASS's choice against 5.23 with
// 128x128; backward 9.27 against 7.98).
using FwdEpiTile = cutlass::epilogue::collective::EpilogueTileAuto;
#ifdef PROBE_PINGPONG
using MainSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;
using EpiSchedule = cutlass::epilogue::TmaWarpSpecialized;
constexpr const char* kScheduleName = "ping-pong";
using BwdEpiTile = Shape<_64, _128>;  // a warp-specialized (not cooperative) epilogue's subtile is 64 rows
#else
using MainSchedule = cutlass::gemm::KernelTmaWarpSpecializedCooperative;
using EpiSchedule = cutlass::epilogue::TmaWarpSpecializedCooperative;
constexpr const char* kScheduleName = "cooperative";
using BwdEpiTile = Shape<_128, _128>;
#endif
// VisitCheckOOB = true (CUTLASS's default) tests every element's coordinate before adding it. Every M here is a
// multiple of the tile's; columns past N (N = 64) come from TMA's zero fill of w, so they add 0 (the identity).
#ifndef PROBE_CHECK_OOB
#define PROBE_CHECK_OOB false
#endif
constexpr auto kRound = cutlass::FloatRoundStyle::round_to_nearest;

template <class T>
using Identity = cutlass::epilogue::thread::Identity<T>;

// Per-tile partial sums over the tile's rows, one per column: partials[m_tile * round_up(N, 128) + n] (FP32).
// PROBE_NOSWAP: CUTLASS's Sm90RowReduction copied with its "swap shuffle" turned off (scripts/bench/cutlass_probe.sh
// generates the copy from the fetched headers). The first runs' statistics GEMM took 5x the plain GEMM; in its PTX
// the per-tile reduction's lane-dependent swaps go through local memory (a 1,232-1,616-byte stack frame), which the
// plain shuffle-down tree (fixed order too) does not need.
#ifdef PROBE_NOSWAP
#include "row_reduction_noswap.hpp"
#define PROBE_ROW_REDUCTION fus::Sm90RowReductionNoSwap
constexpr const char* kRowReductionName = "CUTLASS's without the swap shuffle";
#else
#define PROBE_ROW_REDUCTION fus::Sm90RowReduction
constexpr const char* kRowReductionName = "CUTLASS's";
#endif
using RowPartials = PROBE_ROW_REDUCTION<cutlass::plus, cutlass::plus, cutlass::plus, 0, TileShape, float, float,
                                          kRound, Stride<_0, _1, _0>, 4, true, /*FinalReduction=*/false,
                                          /*VisitCheckOOB=*/PROBE_CHECK_OOB>;
using ToHalf = fus::Sm90Compute<Identity, ElementD, float, kRound>;
// The reductions take FP32 inputs: the no-OOB-check path converts its input fragment as whole FP32 words.
using ToFloat = fus::Sm90Compute<Identity, float, float, kRound>;

using StatsFusion = fus::Sm90SplitTreeVisitor<
    fus::Sm90EVT<ToHalf, fus::Sm90AccFetch>,  // input: y as stored (FP16)
    fus::Sm90EVT<ToHalf, fus::Sm90SplitTreeFetch>,  // output: y
    fus::Sm90EVT<RowPartials, fus::Sm90EVT<ToFloat, fus::Sm90SplitTreeFetch>>,  // aux: sum y
    fus::Sm90EVT<RowPartials, fus::Sm90EVT<fus::Sm90Compute<cutlass::square, float, float, kRound>,
                                           fus::Sm90SplitTreeFetch>>>;  // aux: sum y^2
using PlainFusion = fus::Sm90EVT<ToHalf, fus::Sm90AccFetch>;

template <class Fusion, class LayoutB_ = LayoutB, class EpiTile = FwdEpiTile>
struct GemmOf {
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      EpiTile, float, float, ElementC, LayoutD, kAlign, ElementD, LayoutD,
      kAlign, EpiSchedule, Fusion>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, ElementA, LayoutA, kAlign, ElementB, LayoutB_, kAlign,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      MainSchedule>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<Shape<int, int, int, int>, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};
using StatsGemm = GemmOf<StatsFusion>::Gemm;
using PlainGemm = GemmOf<PlainFusion>::Gemm;

// ---- the backward half: the data gradient of the 1x1 convolution that follows an in-block BN -> ReLU ------------
// dX'[M x C] = dY[M x C'] * W[C' x C] (W as stored, [C'][C]: CUTLASS's row-major K x N). The BN backward (RELU_BN_BWD)
// needs g = dX' where the ReLU let its input through (sign of round_fp16((x - mean) * a + b), a = invstd * gamma,
// b = beta, formed again from the BN input x as the project's kernel does) and the per-channel sums of g and of
// g * (x - mean). The epilogue loads x beside the accumulator, stores g, and reduces both per CTA tile.
template <class T>
struct MaskedGrad;
template <int N>
struct MaskedGrad<cutlass::Array<float, N>> {
  using A = cutlass::Array<float, N>;
  CUTLASS_HOST_DEVICE A operator()(A const& g, A const& x, A const& mean, A const& a, A const& b) const {
    A out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) {
      const float z = static_cast<float>(cutlass::half_t((x[i] - mean[i]) * a[i] + b[i]));
      out[i] = z > 0.0f ? g[i] : 0.0f;
    }
    return out;
  }
};
template <class T>
struct Centered;
template <int N>
struct Centered<cutlass::Array<float, N>> {
  using A = cutlass::Array<float, N>;
  CUTLASS_HOST_DEVICE A operator()(A const& g, A const& x, A const& mean) const {
    A out;
    CUTLASS_PRAGMA_UNROLL
    for (int i = 0; i < N; ++i) out[i] = g[i] * (x[i] - mean[i]);
    return out;
  }
};
using XLoad = fus::Sm90AuxLoad<0, void, ElementD, LayoutD, void, void, kAlign, false>;
using PerChannel = fus::Sm90RowBroadcast<0, TileShape, float>;
using BwdFusion = fus::Sm90TopologicalVisitor<
    float,
    cute::tuple<cute::seq<>, cute::seq<0>, cute::seq<>, cute::seq<>, cute::seq<>, cute::seq<>,
                cute::seq<1, 2, 3, 4, 5>, cute::seq<6>, cute::seq<6, 2, 3>, cute::seq<8>, cute::seq<7>>,
    fus::Sm90AccFetch,                                   // 0 dX' (FP32)
    ToHalf,                                              // 1 dX' as an FP16 store would hold it
    XLoad,                                               // 2 x, the BN input
    PerChannel, PerChannel, PerChannel,                  // 3 mean, 4 a, 5 b
    fus::Sm90Compute<MaskedGrad, float, float, kRound>,  // 6 g (FP16 values, held in FP32)
    RowPartials,                                         // 7 sum g (passes g on)
    fus::Sm90Compute<Centered, float, float, kRound>,    // 8 g (x - mean)
    RowPartials,                                         // 9 sum g (x - mean)
    ToHalf>;                                             // 10 store g
using BwdGemm = GemmOf<BwdFusion, cutlass::layout::RowMajor, BwdEpiTile>::Gemm;
using BwdPlainGemm = GemmOf<PlainFusion, cutlass::layout::RowMajor, BwdEpiTile>::Gemm;

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

// The statistics passes' end: the block's 32 row lanes added in a fixed tree; partials[block_y][2][N].
__device__ void block_sums_to_partials(const float* s1, const float* s2, int cv, int lane, int c0, int N,
                                       float* __restrict__ part) {
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
  block_sums_to_partials(s1, s2, cv, lane, c0, N, part);
}

// The unfused backward statistics: g = dx' masked by the ReLU sign formed from x (stored), s1 = sum g,
// s2 = sum g (x - mean); same tiling as stats_pass.
__global__ void bwd_stats_pass(const __half* __restrict__ dxp, const __half* __restrict__ x, const float* __restrict__ mean,
                               const float* __restrict__ a, const float* __restrict__ b, int M, int N,
                               int rows_per_block, __half* __restrict__ g, float* __restrict__ part) {
  const int cv = threadIdx.x % 8, lane = threadIdx.x / 8;
  const int c0 = (blockIdx.x * 8 + cv) * 8;
  const int r0 = blockIdx.y * rows_per_block, r1 = min(M, r0 + rows_per_block);
  float s1[8] = {}, s2[8] = {};
  if (c0 < N) {
    float mu[8], av[8], bv[8];
    for (int j = 0; j < 8; ++j) {
      mu[j] = mean[c0 + j];
      av[j] = a[c0 + j];
      bv[j] = b[c0 + j];
    }
    for (int r = r0 + lane; r < r1; r += 32) {
      const size_t o = static_cast<size_t>(r) * N + c0;
      const uint4 dv = *reinterpret_cast<const uint4*>(dxp + o);
      const uint4 xv = *reinterpret_cast<const uint4*>(x + o);
      const __half* dh = reinterpret_cast<const __half*>(&dv);
      const __half* xh = reinterpret_cast<const __half*>(&xv);
      uint4 gv;
      __half* gh = reinterpret_cast<__half*>(&gv);
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float xf = __half2float(xh[j]);
        const float z = __half2float(__float2half_rn((xf - mu[j]) * av[j] + bv[j]));
        const float gf = z > 0.0f ? __half2float(dh[j]) : 0.0f;
        gh[j] = __float2half_rn(gf);
        s1[j] += gf;
        s2[j] += gf * (xf - mu[j]);
      }
      *reinterpret_cast<uint4*>(g + o) = gv;
    }
  }
  block_sums_to_partials(s1, s2, cv, lane, c0, N, part);
}

// sum[n] = sum over g of p1[g * stride + n] in FP64, the same for p2, in a fixed order: block (32 columns x 32 lanes),
// lane l adds the groups l, l + 32, ... in order, then the 32 lane sums are added by a fixed shared-memory tree. (One
// thread per column walking thousands of groups was the first version: it, not the GEMM, was most of the time.)
__global__ void finalize(const float* __restrict__ p1, const float* __restrict__ p2, int groups, size_t stride, int N,
                         double* __restrict__ sum, double* __restrict__ sq) {
  __shared__ double red[2][32][33];
  const int c = threadIdx.x, l = threadIdx.y, n = blockIdx.x * 32 + c;
  double a = 0, b = 0;
  if (n < N)
    for (int g = l; g < groups; g += 32) {
      a += p1[g * stride + n];
      b += p2[g * stride + n];
    }
  red[0][l][c] = a;
  red[1][l][c] = b;
  __syncthreads();
  for (int h = 16; h > 0; h /= 2) {
    if (l < h) {
      red[0][l][c] += red[0][l + h][c];
      red[1][l][c] += red[1][l + h][c];
    }
    __syncthreads();
  }
  if (l == 0 && n < N) {
    sum[n] = red[0][0][c];
    sq[n] = red[1][0][c];
  }
}
#define FINALIZE(N_) finalize<<<((N_) + 31) / 32, dim3(32, 32), 0, s>>>

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
  std::printf("device %s, %d SMs; CUTLASS %d.%d.%d; tile %dx%dx64, %s, cluster 1x1; row reduction: %s\n",
              prop.name, prop.multiProcessorCount, CUTLASS_MAJOR, CUTLASS_MINOR, CUTLASS_PATCH, kTileM, kTileN,
              kScheduleName, kRowReductionName);
  cudaStream_t s, side;
  CK(cudaStreamCreate(&s));
  CK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
  cublasHandle_t cb;
  if (cublasCreate(&cb) != CUBLAS_STATUS_SUCCESS) return 1;
  cublasSetStream(cb, s);

  double tot_fg = 0, btot_fg = 0;
  double tot_fused = 0, tot_cutlass = 0, tot_cublas = 0, tot_gemm_c = 0, tot_gemm_b = 0;
  bool all_repeat = true, all_same_y = true;
  double worst_sum = 0, worst_sq = 0;
  double btot_fused = 0, btot_cutlass = 0, btot_cublas = 0, bworst1 = 0, bworst2 = 0;
  bool ball_repeat = true, ball_same_g = true;
  std::vector<char> bwd_lines;
  std::printf("%-22s %5s %9s %9s %9s %9s %9s %9s %7s %9s %9s %s\n", "shape (HW, K->N)", "count", "fused", "gemm_st",
              "cutlass+st", "cublas+st", "gemm_ct", "gemm_cb", "fused/", "sum err", "sq err", "bits");
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
    Runner<PlainGemm> plain;
    typename PlainFusion::Arguments pa{{}, {}};
    plain.init(M, N, K, reinterpret_cast<cutlass::half_t*>(x), reinterpret_cast<cutlass::half_t*>(w),
               reinterpret_cast<cutlass::half_t*>(y2), pa);
    const dim3 sgrid((N + 63) / 64, sgroups);
    auto stats = [&](const __half* yy) {
      stats_pass<<<sgrid, 256, 0, s>>>(yy, M, N, rpb, spart);
      FINALIZE(N)(spart, spart + N, sgroups, 2 * static_cast<size_t>(N), N, sum, sq);
    };
    auto run_fused = [&] {
      fused.run(s);
      FINALIZE(N)(p1, p2, mt, npad, N, sum, sq);
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
    const float t_fg = median_ms([&] { fused.run(s); }, s);  // the statistics GEMM alone (no finalize)
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
    const int px = static_cast<int>(std::lround(std::sqrt(static_cast<double>(sh.hw))));
    std::printf("%4dx%-4d %5d->%-5d %5d %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %7.3f %9.2e %9.2e %s%s\n", px, px, K, N,
                sh.count, t_fused, t_fg, t_cutlass, t_cublas, t_gc, t_gb, t_fused / best_unfused, es, eq,
                repeat ? "repeat" : "DIFFER", same_y ? "" : " (y != plain GEMM's y)");
    tot_fused += sh.count * t_fused;
    tot_fg += sh.count * t_fg;
    tot_cutlass += sh.count * t_cutlass;
    tot_cublas += sh.count * t_cublas;
    tot_gemm_c += sh.count * t_gc;
    tot_gemm_b += sh.count * t_gb;

    // ---- backward: this convolution's data gradient with the BN backward's two sums -------------------------
    {
      const int C = K, Cp = N;  // dX' is M x C (the BN's channels), dY is M x C'
      const int mtb = (M + kTileM - 1) / kTileM, npb = (C + kTileN - 1) / kTileN * kTileN;
      __half *dy, *xb, *g, *g2, *dxp;
      float *bpart, *pc, *bspart;
      double* bsum;
      CK(cudaMalloc(&dy, sizeof(__half) * M * Cp));
      CK(cudaMalloc(&xb, sizeof(__half) * M * C));
      CK(cudaMalloc(&g, sizeof(__half) * M * C));
      CK(cudaMalloc(&g2, sizeof(__half) * M * C));
      CK(cudaMalloc(&dxp, sizeof(__half) * M * C));
      CK(cudaMalloc(&bpart, sizeof(float) * 2 * static_cast<size_t>(mtb) * npb));
      CK(cudaMalloc(&pc, sizeof(float) * 3 * C));
      CK(cudaMalloc(&bspart, sizeof(float) * 2 * static_cast<size_t>(sgroups) * C));
      CK(cudaMalloc(&bsum, sizeof(double) * 2 * C));
      fill_half<<<1024, 256, 0, s>>>(dy, static_cast<size_t>(M) * Cp, 5u, 0.02f);
      fill_half<<<1024, 256, 0, s>>>(xb, static_cast<size_t>(M) * C, 7u, 3.0f);
      std::vector<float> hpc(3 * static_cast<size_t>(C));
      for (int c = 0; c < C; ++c) {
        hpc[c] = 0.6f + 0.01f * static_cast<float>(c % 11);          // mean
        hpc[C + c] = 1.2f + 0.05f * static_cast<float>(c % 7);       // a = invstd * gamma
        hpc[2 * C + c] = -0.1f + 0.04f * static_cast<float>(c % 5);  // b = beta
      }
      CK(cudaMemcpy(pc, hpc.data(), sizeof(float) * hpc.size(), cudaMemcpyHostToDevice));
      float* q1 = bpart;
      float* q2 = bpart + static_cast<size_t>(mtb) * npb;
      using XS = typename XLoad::StrideMNL;
      const XS sx = cutlass::make_cute_packed_stride(XS{}, make_shape(M, C, 1));
      typename BwdFusion::Arguments ba{{},
                                       {},
                                       {reinterpret_cast<cutlass::half_t*>(xb), cutlass::half_t(0), sx},
                                       {pc, 0.f, {}},
                                       {pc + C, 0.f, {}},
                                       {pc + 2 * C, 0.f, {}},
                                       {},
                                       {q1, 0.f, {}},
                                       {},
                                       {q2, 0.f, {}},
                                       {}};
      Runner<BwdGemm> bf;
      bf.init(M, C, Cp, reinterpret_cast<cutlass::half_t*>(dy), reinterpret_cast<cutlass::half_t*>(w),
              reinterpret_cast<cutlass::half_t*>(g), ba);
      Runner<BwdPlainGemm> bp;
      bp.init(M, C, Cp, reinterpret_cast<cutlass::half_t*>(dy), reinterpret_cast<cutlass::half_t*>(w),
              reinterpret_cast<cutlass::half_t*>(dxp), pa);
      const dim3 bgrid((C + 63) / 64, sgroups);
      auto bfused = [&] {
        bf.run(s);
        FINALIZE(C)(q1, q2, mtb, npb, C, bsum, bsum + C);
      };
      auto bstats = [&] {
        bwd_stats_pass<<<bgrid, 256, 0, s>>>(dxp, xb, pc, pc + C, pc + 2 * C, M, C, rpb, g2, bspart);
        FINALIZE(C)(bspart, bspart + C, sgroups, 2 * static_cast<size_t>(C), C, bsum,
                                                 bsum + C);
      };
      auto bcublas = [&] {
        cublasGemmEx(cb, CUBLAS_OP_N, CUBLAS_OP_N, C, M, Cp, &one, w, CUDA_R_16F, C, dy, CUDA_R_16F, Cp, &zero, dxp,
                     CUDA_R_16F, C, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      };
      // The unfused reference first: its g (from the plain GEMM's stored dX'), then the fused runs.
      bp.run(s);
      bstats();
      CK(cudaStreamSynchronize(s));
      std::vector<__half> hg2(static_cast<size_t>(M) * C), hx(hg2.size()), hg(hg2.size()), hgr(hg2.size());
      CK(cudaMemcpy(hg2.data(), g2, sizeof(__half) * hg2.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hx.data(), xb, sizeof(__half) * hx.size(), cudaMemcpyDeviceToHost));
      bfused();
      CK(cudaStreamSynchronize(s));
      std::vector<double> hb(2 * C), hb2(2 * C);
      CK(cudaMemcpy(hg.data(), g, sizeof(__half) * hg.size(), cudaMemcpyDeviceToHost));
      CK(cudaMemcpy(hb.data(), bsum, sizeof(double) * 2 * C, cudaMemcpyDeviceToHost));
      const bool same_g = std::memcmp(hg.data(), hg2.data(), sizeof(__half) * hg.size()) == 0;
      bool brepeat = true;
      for (int rep = 0; rep < 3; ++rep) {
        spin<<<prop.multiProcessorCount / 2, 64, 0, side>>>(200000 * (rep + 1));
        CK(cudaMemsetAsync(g, 0, sizeof(__half) * hg.size(), s));
        CK(cudaMemsetAsync(bpart, 0xff, sizeof(float) * 2 * static_cast<size_t>(mtb) * npb, s));
        bfused();
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(hgr.data(), g, sizeof(__half) * hg.size(), cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(hb2.data(), bsum, sizeof(double) * 2 * C, cudaMemcpyDeviceToHost));
        brepeat = brepeat && std::memcmp(hg.data(), hgr.data(), sizeof(__half) * hg.size()) == 0 &&
                  std::memcmp(hb.data(), hb2.data(), sizeof(double) * 2 * C) == 0;
      }
      // FP64 sums of the stored g (the unfused pass's) and x on the host.
      std::vector<double> r1(C, 0.0), r2(C, 0.0), a1(C, 0.0), a2(C, 0.0);
      for (size_t r = 0; r < static_cast<size_t>(M); ++r)
        for (int c = 0; c < C; ++c) {
          const double gv = __half2float(hg2[r * C + c]);
          const double d = gv * (static_cast<double>(__half2float(hx[r * C + c])) - hpc[c]);
          r1[c] += gv;
          r2[c] += d;
          a1[c] += std::fabs(gv);
          a2[c] += std::fabs(d);
        }
      double e1 = 0, e2 = 0;
      for (int c = 0; c < C; ++c) {
        e1 = std::max(e1, std::fabs(hb[c] - r1[c]) / std::max(a1[c], 1e-30));
        e2 = std::max(e2, std::fabs(hb[C + c] - r2[c]) / std::max(a2[c], 1e-30));
      }
      const float tb_fused = median_ms(bfused, s);
      const float tb_fg = median_ms([&] { bf.run(s); }, s);
      const float tb_cutlass = median_ms(
          [&] {
            bp.run(s);
            bstats();
          },
          s);
      const float tb_cublas = median_ms(
          [&] {
            bcublas();
            bstats();
          },
          s);
      char line[256];
      std::snprintf(line, sizeof line, "%4dx%-4d %5d<-%-5d %5d %9.4f %9.4f %9.4f %9.4f %7.3f %9.2e %9.2e %s%s\n",
                    px, px, C, Cp, sh.count, tb_fused, tb_fg, tb_cutlass, tb_cublas, tb_fused / std::min(tb_cutlass, tb_cublas),
                    e1, e2, brepeat ? "repeat" : "DIFFER", same_g ? "" : " (g != the unfused pass's g)");
      bwd_lines.insert(bwd_lines.end(), line, line + std::strlen(line));
      btot_fused += sh.count * tb_fused;
      btot_fg += sh.count * tb_fg;
      btot_cutlass += sh.count * tb_cutlass;
      btot_cublas += sh.count * tb_cublas;
      bworst1 = std::max(bworst1, e1);
      bworst2 = std::max(bworst2, e2);
      ball_repeat = ball_repeat && brepeat;
      ball_same_g = ball_same_g && same_g;
      for (void* q : {static_cast<void*>(dy), static_cast<void*>(xb), static_cast<void*>(g), static_cast<void*>(g2),
                      static_cast<void*>(dxp), static_cast<void*>(bpart), static_cast<void*>(pc),
                      static_cast<void*>(bspart), static_cast<void*>(bsum)})
        CK(cudaFree(q));
      if (bf.ws) CK(cudaFree(bf.ws));
      if (bp.ws) CK(cudaFree(bp.ws));
    }
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
  std::printf("per step (33 convolutions, counts applied), ms: fused %.3f (its GEMM alone %.3f), CUTLASS GEMM + stats "
              "%.3f, cuBLAS GEMM + stats %.3f (GEMMs alone: CUTLASS %.3f, cuBLAS %.3f); fused / best unfused %.3f\n",
              tot_fused, tot_fg, tot_cutlass, tot_cublas, tot_gemm_c, tot_gemm_b,
              tot_fused / std::min(tot_cutlass, tot_cublas));
  std::printf("sums: worst error %.2e of sum|y|, %.2e of sum y^2; fused y and sums %s over 3 runs; fused y %s the "
              "plain GEMM's\n",
              worst_sum, worst_sq, all_repeat ? "REPEATED bit for bit" : "DIFFERED", all_same_y ? "equals" : "differs from");
  std::printf("\nbackward: the data gradient of the same convolutions with the BN backward's sums (sum g, sum g(x-mean))\n");
  std::printf("%-22s %5s %9s %9s %9s %9s %7s %9s %9s %s\n", "shape (HW, C<-C')", "count", "fused", "gemm_st", "cutlass+st",
              "cublas+st", "fused/", "g err", "gx err", "bits");
  bwd_lines.push_back('\0');
  std::fputs(bwd_lines.data(), stdout);
  std::printf("per step, ms: fused %.3f (its GEMM alone %.3f), CUTLASS GEMM + stats %.3f, cuBLAS GEMM + stats %.3f; "
              "fused / best unfused %.3f\n",
              btot_fused, btot_fg, btot_cutlass, btot_cublas, btot_fused / std::min(btot_cutlass, btot_cublas));
  std::printf("sums: worst error %.2e of sum|g|, %.2e of sum|g(x-mean)|; fused g and sums %s over 3 runs; fused g %s "
              "the unfused pass's\n",
              bworst1, bworst2, ball_repeat ? "REPEATED bit for bit" : "DIFFERED",
              ball_same_g ? "equals" : "differs from");
  cublasDestroy(cb);
  return 0;
}
