// Softmax cross-entropy. Forward: one warp per sample (three coalesced passes over its row: max and Σz, Σexp in
// FP64, then the probabilities), the per-sample loss into the workspace, and a one-thread kernel that sums the
// losses in sample order (the CPU's order, so the FP64 total is the same). Backward: one pass per dlogits element.
// Built with -fmad=false.
#include <kernels/cuda/softmax_ce.h>

#include <kernels/cuda/softmax_row.cuh>

namespace renaissance::cuda {

namespace {

using detail::kThreads;
constexpr int kWarpsPerBlock = kThreads / 32;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    softmax_ce_forward_kernel(const T* __restrict__ logits, unsigned lcs, const std::int32_t* __restrict__ labels,
                              int batch, int classes, const float* __restrict__ smoothing, float* __restrict__ probs,
                              unsigned pcs, double* __restrict__ sample_loss, std::int32_t* label_errors) {
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warps = static_cast<int>(gridDim.x) * kWarpsPerBlock;
  for (int n = static_cast<int>(blockIdx.x) * kWarpsPerBlock + static_cast<int>(threadIdx.x >> 5); n < batch;
       n += warps) {
    const T* z = logits + static_cast<std::size_t>(n) * lcs;
    const int t = detail::checked_label(labels, n, classes, label_errors, lane == 0);
    const detail::RowStats r = detail::row_stats(z, classes, lane);
    const double inv_sum = 1.0 / r.sum;
    float* p = probs + static_cast<std::size_t>(n) * pcs;
    for (int k = lane; k < static_cast<int>(pcs); k += 32)
      p[k] = k < classes ? static_cast<float>(exp(static_cast<double>(detail::to_float(z[k])) -
                                                  static_cast<double>(r.mx)) *
                                              inv_sum)
                         : 0.0f;
    if (lane == 0) sample_loss[n] = detail::sample_ce(r, detail::to_float(z[t]), classes, *smoothing);
  }
}

__global__ void softmax_ce_total_kernel(const double* __restrict__ sample_loss, int batch, float* __restrict__ result) {
  double total = 0.0;
  for (int n = 0; n < batch; ++n) total += sample_loss[n];
  const auto loss = static_cast<float>(total / static_cast<double>(batch));
  result[0] = loss * static_cast<float>(batch);
}

template <typename T, bool kAcc>
__global__ void __launch_bounds__(kThreads)
    softmax_ce_backward_kernel(const float* __restrict__ probs, unsigned pcs, const std::int32_t* __restrict__ labels,
                               int classes, const float* __restrict__ smoothing, const float* __restrict__ loss_scale,
                               float batch, T* __restrict__ dx, unsigned dcs, unsigned total,
                               std::int32_t* label_errors) {
  const float eps = *smoothing;
  const float scale = *loss_scale / batch;
  const float off = eps / static_cast<float>(classes);
  const float on = 1.0f - eps + off;
  for (std::int64_t e = detail::thread_index(); e < total; e += detail::grid_stride()) {
    const auto i = static_cast<unsigned>(e);
    const unsigned n = i / dcs, k = i - n * dcs;
    if (k >= static_cast<unsigned>(classes)) {
      if (!kAcc) dx[i] = detail::from_float<T>(0.0f);
      continue;
    }
    const int t = detail::checked_label(labels, n, classes, label_errors, k == 0);
    const float q = static_cast<int>(k) == t ? on : off;
    const float v = (probs[static_cast<std::size_t>(n) * pcs + k] - q) * scale;
    dx[i] = detail::from_float<T>(kAcc ? detail::to_float(dx[i]) + v : v);
  }
}

void check_logits(const TensorRef& t, const char* what, const char* name) {
  detail::check_float_tensor(t, what, name);
  RN_CHECK(t.shape.h == 1 && t.shape.w == 1, "{}: {} must be (N,1,1,K), got {}", what, name, t.shape.str());
  detail::check_index32(t, what, name);
}

std::size_t align256(std::size_t b) { return (b + 255) / 256 * 256; }

}  // namespace

std::size_t softmax_ce_workspace_bytes(std::int64_t batch) {
  return align256(static_cast<std::size_t>(batch) * sizeof(double));
}

void softmax_ce_forward(cudaStream_t stream, const TensorRef& logits, const std::int32_t* labels,
                        const float* label_smoothing, const TensorRef& probs, float* result, void* workspace,
                        std::size_t workspace_bytes, std::int32_t* label_errors) {
  const char* what = "softmax_ce_forward";
  check_logits(logits, what, "logits");
  check_logits(probs, what, "probs");
  RN_CHECK(probs.dtype == DType::F32, "{}: probs must be f32, got {}", what, dtype_name(probs.dtype));
  RN_CHECK(probs.shape == logits.shape, "{}: probs {} differ from logits {}", what, probs.shape.str(),
           logits.shape.str());
  RN_CHECK(labels && label_smoothing && result, "{}: labels, label_smoothing or result is null", what);
  const std::int64_t n = logits.shape.n;
  RN_CHECK(workspace != nullptr && detail::aligned16(workspace) && workspace_bytes >= softmax_ce_workspace_bytes(n),
           "{}: workspace of {} bytes is null, misaligned or below softmax_ce_workspace_bytes = {}", what,
           workspace_bytes, softmax_ce_workspace_bytes(n));
  auto* sample_loss = static_cast<double*>(workspace);
  const unsigned blocks = grid_for(n, kWarpsPerBlock);
  const auto batch = static_cast<int>(n), classes = static_cast<int>(logits.shape.c);
  const auto lcs = static_cast<unsigned>(logits.c_stride), pcs = static_cast<unsigned>(probs.c_stride);
  auto* p = static_cast<float*>(probs.ptr);
  if (logits.dtype == DType::F32)
    softmax_ce_forward_kernel<float><<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(logits.ptr), lcs,
                                                                      labels, batch, classes, label_smoothing, p, pcs,
                                                                      sample_loss, label_errors);
  else
    softmax_ce_forward_kernel<__half><<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(logits.ptr), lcs,
                                                                       labels, batch, classes, label_smoothing, p,
                                                                       pcs, sample_loss, label_errors);
  CUDA_CHECK_LAUNCH();
  softmax_ce_total_kernel<<<1, 1, 0, stream>>>(sample_loss, batch, result);
  CUDA_CHECK_LAUNCH();
}

void softmax_ce_backward(cudaStream_t stream, const TensorRef& probs, const std::int32_t* labels,
                         const float* label_smoothing, const float* loss_scale, const TensorRef& dlogits,
                         bool accumulate, std::int32_t* label_errors) {
  const char* what = "softmax_ce_backward";
  check_logits(probs, what, "probs");
  check_logits(dlogits, what, "dlogits");
  RN_CHECK(probs.dtype == DType::F32, "{}: probs must be f32, got {}", what, dtype_name(probs.dtype));
  RN_CHECK(probs.shape == dlogits.shape, "{}: probs {} differ from dlogits {}", what, probs.shape.str(),
           dlogits.shape.str());
  RN_CHECK(labels && label_smoothing && loss_scale, "{}: labels, label_smoothing or loss_scale is null", what);
  const auto total = static_cast<unsigned>(dlogits.rows() * dlogits.c_stride);
  const auto pcs = static_cast<unsigned>(probs.c_stride), dcs = static_cast<unsigned>(dlogits.c_stride);
  const auto classes = static_cast<int>(probs.shape.c);
  const auto batch = static_cast<float>(probs.shape.n);
  const auto* p = static_cast<const float*>(probs.ptr);
  auto launch = [&](auto type) {
    using T = typename decltype(type)::type;
    T* d = static_cast<T*>(dlogits.ptr);
    if (accumulate)
      softmax_ce_backward_kernel<T, true><<<grid_for(total), kThreads, 0, stream>>>(
          p, pcs, labels, classes, label_smoothing, loss_scale, batch, d, dcs, total, label_errors);
    else
      softmax_ce_backward_kernel<T, false><<<grid_for(total), kThreads, 0, stream>>>(
          p, pcs, labels, classes, label_smoothing, loss_scale, batch, d, dcs, total, label_errors);
    CUDA_CHECK_LAUNCH();
  };
  if (dlogits.dtype == DType::F32)
    launch(detail::TypeTag<float>{});
  else
    launch(detail::TypeTag<__half>{});
}

}  // namespace renaissance::cuda
