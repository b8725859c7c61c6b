// Batch metrics: one warp per sample (loss statistics, rank of the label, first argmax) into the workspace, then a
// one-thread kernel that adds them in sample order (deterministic; the CPU's FP64 sums). Built with -fmad=false.
#include <kernels/cuda/metrics.h>

#include <kernels/cuda/softmax_row.cuh>

#include <cmath>

namespace renaissance::cuda {

namespace {

using detail::kThreads;
constexpr int kWarpsPerBlock = kThreads / 32;

/// Candidate for the first maximum: NaNs never win (as in the CPU's `z[k] > z[best]` scan).
struct ArgBest {
  bool valid;
  float v;
  int k;
};

__device__ __forceinline__ ArgBest better(const ArgBest& a, const ArgBest& b) {
  if (!a.valid) return b;
  if (!b.valid) return a;
  if (b.v > a.v) return b;
  if (a.v > b.v) return a;
  return b.k < a.k ? b : a;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    metrics_kernel(const T* __restrict__ logits, unsigned lcs, const std::int32_t* __restrict__ labels, int batch,
                   int classes, float smoothing, double* __restrict__ sample_loss, int* __restrict__ sample_rank,
                   std::int32_t* __restrict__ predicted, std::int32_t* label_errors) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warps = static_cast<int>(gridDim.x) * kWarpsPerBlock;
  for (int n = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x >> 5); n < batch;
       n += warps) {
    const T* z = logits + static_cast<std::size_t>(n) * lcs;
    const int t = detail::checked_label(labels, n, classes, label_errors, lane == 0);
    const float zt = detail::to_float(z[t]);
    int rank = 0;
    ArgBest best{false, 0.0f, 0};
    for (int k = lane; k < classes; k += 32) {
      const float v = detail::to_float(z[k]);
      rank += (v > zt || (v == zt && k < t) || (isnan(v) && !isnan(zt))) ? 1 : 0;
      if (!isnan(v) && (!best.valid || v > best.v)) best = ArgBest{true, v, k};
    }
    rank = detail::warp_sum(rank);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      ArgBest o;
      o.valid = __shfl_xor_sync(0xffffffffu, best.valid ? 1 : 0, off) != 0;
      o.v = __shfl_xor_sync(0xffffffffu, best.v, off);
      o.k = __shfl_xor_sync(0xffffffffu, best.k, off);
      best = better(best, o);
    }
    const detail::RowStats r = detail::row_stats(z, classes, lane);
    if (lane == 0) {
      sample_loss[n] = detail::sample_ce(r, zt, classes, smoothing);
      sample_rank[n] = isnan(zt) ? max(classes, 5) : rank;  // a NaN label logit: not in the top 5 (the CPU's rule)
      if (predicted != nullptr) predicted[n] = (isnan(detail::to_float(z[0])) || !best.valid) ? 0 : best.k;
    }
  }
}

/// The batch totals, summed by one thread in sample order (the CPU's order, so the same bits); the block first
/// stages each chunk of the per-sample values in shared memory with coalesced loads, so the sequential sum waits on
/// shared memory, not on one global load per sample.
__global__ void __launch_bounds__(kThreads)
    metrics_total_kernel(const double* __restrict__ sample_loss, const int* __restrict__ sample_rank, int batch,
                         float* __restrict__ result) {
  __shared__ double chunk_loss[kThreads];
  __shared__ int chunk_rank[kThreads];
  double loss = 0.0, top1 = 0.0, top5 = 0.0;
  for (int n0 = 0; n0 < batch; n0 += kThreads) {
    const int m = min(kThreads, batch - n0);
    if (static_cast<int>(threadIdx.x) < m) {
      chunk_loss[threadIdx.x] = sample_loss[n0 + threadIdx.x];
      chunk_rank[threadIdx.x] = sample_rank[n0 + threadIdx.x];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 0; k < m; ++k) {
        loss += chunk_loss[k];
        top1 += chunk_rank[k] == 0 ? 1.0 : 0.0;
        top5 += chunk_rank[k] < 5 ? 1.0 : 0.0;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    result[0] = static_cast<float>(loss);
    result[1] = static_cast<float>(top1);
    result[2] = static_cast<float>(top5);
    result[3] = static_cast<float>(batch);
  }
}

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

std::size_t metrics_workspace_bytes(std::int64_t batch) {
  return align256(static_cast<std::size_t>(batch) * sizeof(double)) +
         align256(static_cast<std::size_t>(batch) * sizeof(int));
}

void batch_metrics(cudaStream_t stream, const TensorRef& logits, const std::int32_t* labels, float label_smoothing,
                   float* result, std::int32_t* predicted, void* workspace, std::size_t workspace_bytes,
                   std::int32_t* label_errors) {
  const char* what = "batch_metrics";
  detail::check_float_tensor(logits, what, "logits");
  RN_CHECK(logits.shape.h == 1 && logits.shape.w == 1, "{}: logits must be (N,1,1,K), got {}", what,
           logits.shape.str());
  detail::check_index32(logits, what, "logits");
  RN_CHECK(labels && result, "{}: labels or result is null", what);
  const std::int64_t n = logits.shape.n;
  RN_CHECK(workspace != nullptr && detail::aligned16(workspace) && workspace_bytes >= metrics_workspace_bytes(n),
           "{}: workspace of {} bytes is null, misaligned or below metrics_workspace_bytes = {}", what,
           workspace_bytes, metrics_workspace_bytes(n));
  auto* sample_loss = static_cast<double*>(workspace);
  auto* sample_rank = reinterpret_cast<int*>(static_cast<char*>(workspace) +
                                             align256(static_cast<std::size_t>(n) * sizeof(double)));
  const unsigned blocks = grid_for(n, kWarpsPerBlock);
  const auto batch = static_cast<int>(n), classes = static_cast<int>(logits.shape.c);
  const auto lcs = static_cast<unsigned>(logits.c_stride);
  if (logits.dtype == DType::F32)
    metrics_kernel<float><<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(logits.ptr), lcs, labels, batch,
                                                           classes, label_smoothing, sample_loss, sample_rank,
                                                           predicted, label_errors);
  else
    metrics_kernel<__half><<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(logits.ptr), lcs, labels,
                                                            batch, classes, label_smoothing, sample_loss, sample_rank,
                                                            predicted, label_errors);
  CUDA_CHECK_LAUNCH();
  metrics_total_kernel<<<1, kThreads, 0, stream>>>(sample_loss, sample_rank, batch, result);
  CUDA_CHECK_LAUNCH();
}

}  // namespace renaissance::cuda
