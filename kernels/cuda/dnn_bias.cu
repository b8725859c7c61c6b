#include <kernels/cuda/dnn_bias.h>

#include <cuda_fp16.h>

#include <algorithm>

namespace renaissance::cuda {

namespace {

__device__ __forceinline__ float load_f(const float* p) { return *p; }
__device__ __forceinline__ float load_f(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ void store_f(float* p, float v) { *p = v; }
__device__ __forceinline__ void store_f(__half* p, float v) { *p = __float2half_rn(v); }

void check_rows(const char* what, const void* p, DType dtype, std::int64_t rows, std::int64_t channels,
                std::int64_t ld) {
  RN_CHECK(p != nullptr, "{}: null tensor", what);
  RN_CHECK(dtype == DType::F32 || dtype == DType::F16, "{}: dtype {} (F32 or F16 expected)", what,
           dtype_name(dtype));
  RN_CHECK(rows > 0 && channels > 0 && ld >= channels, "{}: rows={} channels={} ld={}", what, rows, channels, ld);
}

// ---- bias add -------------------------------------------------------------------------------------------------

template <typename T>
__global__ void add_bias_rows_kernel(T* y, std::int64_t rows, std::int64_t channels, std::int64_t ld,
                                     const float* __restrict__ bias) {
  const std::int64_t n = rows * channels;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / channels, c = i - r * channels;
    T* p = y + r * ld + c;
    store_f(p, load_f(p) + bias[c]);
  }
}

// ---- bias gradient ----------------------------------------------------------------------------------------------

constexpr int kColTile = 32;  // channels per block (one warp wide, coalesced along C)
constexpr int kRowLanes = 8;  // rows read in parallel per block

struct Segments {
  std::int64_t count = 1, rows_per = 1;
};

// Splits the rows into segments so that large reductions fill the GPU; depends only on the size, never the device,
// so the summation order (and the bits) are the same everywhere.
Segments segments_for(std::int64_t rows, std::int64_t channels) {
  const std::int64_t col_blocks = (channels + kColTile - 1) / kColTile;
  std::int64_t count = std::min<std::int64_t>((rows + 127) / 128, std::max<std::int64_t>(1, 2048 / col_blocks));
  count = std::max<std::int64_t>(1, std::min<std::int64_t>(count, 1024));
  Segments s;
  s.rows_per = (rows + count - 1) / count;
  s.count = (rows + s.rows_per - 1) / s.rows_per;
  return s;
}

template <typename T>
__global__ void column_partial_sums(const T* __restrict__ dy, std::int64_t rows, std::int64_t channels,
                                    std::int64_t ld, std::int64_t rows_per, float* __restrict__ partial) {
  __shared__ float s[kRowLanes][kColTile + 1];
  const std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const std::int64_t r0 = static_cast<std::int64_t>(blockIdx.y) * rows_per;
  const std::int64_t r1 = r0 + rows_per < rows ? r0 + rows_per : rows;
  float acc = 0.0f;
  if (c < channels)
    for (std::int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) acc += load_f(dy + r * ld + c);
  s[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < channels) {
    float t = s[0][threadIdx.x];
#pragma unroll
    for (int i = 1; i < kRowLanes; ++i) t += s[i][threadIdx.x];
    partial[static_cast<std::int64_t>(blockIdx.y) * channels + c] = t;
  }
}

__global__ void column_finish(const float* __restrict__ partial, std::int64_t segments, std::int64_t channels,
                              float* db, bool accumulate, float alpha) {
  const std::int64_t c = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (c >= channels) return;
  float t = 0.0f;
  for (std::int64_t s = 0; s < segments; ++s) t += partial[s * channels + c];
  t *= alpha;
  db[c] = accumulate ? db[c] + t : t;
}

// ---- staging copy -------------------------------------------------------------------------------------------------

template <typename T>
__global__ void copy_rows_kernel(const T* __restrict__ src, std::int64_t src_ld, T* dst, std::int64_t dst_ld,
                                 std::int64_t rows, std::int64_t channels, float beta) {
  const std::int64_t n = rows * channels;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t r = i / channels, c = i - r * channels;
    T* d = dst + r * dst_ld + c;
    const float v = load_f(src + r * src_ld + c);
    store_f(d, beta == 0.0f ? v : v + beta * load_f(d));
  }
}

}  // namespace

void add_bias_rows(cudaStream_t stream, void* y, DType dtype, std::int64_t rows, std::int64_t channels,
                   std::int64_t ld, const float* bias) {
  check_rows("add_bias_rows", y, dtype, rows, channels, ld);
  RN_CHECK(bias != nullptr, "add_bias_rows: null bias");
  const unsigned grid = grid_for(rows * channels);
  if (dtype == DType::F32)
    add_bias_rows_kernel<<<grid, 256, 0, stream>>>(static_cast<float*>(y), rows, channels, ld, bias);
  else
    add_bias_rows_kernel<<<grid, 256, 0, stream>>>(static_cast<__half*>(y), rows, channels, ld, bias);
  CUDA_CHECK_LAUNCH();
}

std::size_t bias_grad_workspace_bytes(std::int64_t rows, std::int64_t channels) {
  const Segments s = segments_for(std::max<std::int64_t>(rows, 1), std::max<std::int64_t>(channels, 1));
  return static_cast<std::size_t>(align_up(s.count * std::max<std::int64_t>(channels, 1) * 4, 256));
}

void bias_grad_rows(cudaStream_t stream, const void* dy, DType dtype, std::int64_t rows, std::int64_t channels,
                    std::int64_t ld, float* db, bool accumulate, float alpha, void* workspace,
                    std::size_t workspace_bytes) {
  check_rows("bias_grad_rows", dy, dtype, rows, channels, ld);
  RN_CHECK(db != nullptr, "bias_grad_rows: null db");
  const std::size_t need = bias_grad_workspace_bytes(rows, channels);
  RN_CHECK(workspace != nullptr && workspace_bytes >= need, "bias_grad_rows: workspace of {} bytes, {} needed",
           workspace_bytes, need);
  RN_CHECK(reinterpret_cast<std::uintptr_t>(workspace) % 16 == 0, "bias_grad_rows: workspace not 16-byte aligned");
  const Segments s = segments_for(rows, channels);
  float* partial = static_cast<float*>(workspace);
  const dim3 grid(static_cast<unsigned>((channels + kColTile - 1) / kColTile), static_cast<unsigned>(s.count));
  const dim3 block(kColTile, kRowLanes);
  if (dtype == DType::F32)
    column_partial_sums<<<grid, block, 0, stream>>>(static_cast<const float*>(dy), rows, channels, ld, s.rows_per,
                                                    partial);
  else
    column_partial_sums<<<grid, block, 0, stream>>>(static_cast<const __half*>(dy), rows, channels, ld, s.rows_per,
                                                    partial);
  CUDA_CHECK_LAUNCH();
  column_finish<<<grid_for(channels, 128), 128, 0, stream>>>(partial, s.count, channels, db, accumulate, alpha);
  CUDA_CHECK_LAUNCH();
}

void copy_rows(cudaStream_t stream, const void* src, std::int64_t src_ld, void* dst, std::int64_t dst_ld,
               DType dtype, std::int64_t rows, std::int64_t channels, float beta) {
  check_rows("copy_rows (source)", src, dtype, rows, channels, src_ld);
  check_rows("copy_rows (destination)", dst, dtype, rows, channels, dst_ld);
  const unsigned grid = grid_for(rows * channels);
  if (dtype == DType::F32)
    copy_rows_kernel<<<grid, 256, 0, stream>>>(static_cast<const float*>(src), src_ld, static_cast<float*>(dst),
                                               dst_ld, rows, channels, beta);
  else
    copy_rows_kernel<<<grid, 256, 0, stream>>>(static_cast<const __half*>(src), src_ld, static_cast<__half*>(dst),
                                               dst_ld, rows, channels, beta);
  CUDA_CHECK_LAUNCH();
}

}  // namespace renaissance::cuda
