// Helpers for the cuDNN / cuBLASLt tests: device buffers, padded NHWC device tensors in F32 or F16, random data,
// and the per-dtype comparison (relative to max |ref|; NaN never passes).
#pragma once

#include <kernels/cpu/half.h>
#include <kernels/cuda/common.h>
#include <kernels/cuda/device_info.h>
#include <kernels/cuda/dnn_handles.h>

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace renaissance::cuda::test {

inline bool have_gpu() { return device_count() > 0; }

#define RN_SKIP_WITHOUT_GPU() \
  if (!::renaissance::cuda::test::have_gpu()) GTEST_SKIP() << "no CUDA device"

inline DnnHandles& handles() {
  int dev = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  return DnnHandles::for_device(dev);
}

class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t bytes) : m_bytes(bytes) {
    CUDA_CHECK(cudaMalloc(&m_p, bytes ? bytes : 1));
  }
  ~DeviceBuffer() { CUDA_CHECK_NOTHROW(cudaFree(m_p)); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return m_p; }
  std::size_t bytes() const { return m_bytes; }
  Workspace workspace() const { return Workspace{m_p, m_bytes}; }

 private:
  void* m_p = nullptr;
  std::size_t m_bytes = 0;
};

/// A stream owned by a test.
class Stream {
 public:
  Stream() { CUDA_CHECK(cudaStreamCreateWithFlags(&m_s, cudaStreamNonBlocking)); }
  ~Stream() { CUDA_CHECK_NOTHROW(cudaStreamDestroy(m_s)); }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return m_s; }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(m_s)); }

 private:
  cudaStream_t m_s = nullptr;
};

inline std::vector<float> random_vec(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

/// Rounds every value to the nearest FP16 (the values the device then holds exactly).
inline void quantize(std::vector<float>& v, DType t) {
  if (t != DType::F16) return;
  for (float& x : v) x = cpu::half_to_float(cpu::float_to_half(x));
}

inline std::vector<float> nan_vec(std::size_t n) { return std::vector<float>(n, std::nanf("")); }

/// rows × c real values in rows of c_stride elements, F32 or F16, on the device.
class DevTensor {
 public:
  DevTensor(std::int64_t rows, std::int64_t c, std::int64_t c_stride, DType t)
      : m_rows(rows), m_c(c), m_cs(c_stride), m_t(t), m_buf(static_cast<std::size_t>(rows * c_stride) * dtype_size(t)) {}

  /// Real channels from `compact` (rows × c), padding channels set to `pad`.
  void upload(const std::vector<float>& compact, float pad = 0.0f) {
    EXPECT_EQ(compact.size(), static_cast<std::size_t>(m_rows * m_c));
    std::vector<float> full(static_cast<std::size_t>(m_rows * m_cs), pad);
    for (std::int64_t r = 0; r < m_rows; ++r)
      for (std::int64_t c = 0; c < m_c; ++c) full[r * m_cs + c] = compact[r * m_c + c];
    if (m_t == DType::F32) {
      CUDA_CHECK(cudaMemcpy(m_buf.get(), full.data(), full.size() * 4, cudaMemcpyHostToDevice));
    } else {
      std::vector<std::uint16_t> h(full.size());
      for (std::size_t i = 0; i < full.size(); ++i) h[i] = cpu::float_to_half(full[i]);
      CUDA_CHECK(cudaMemcpy(m_buf.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    // A pageable cudaMemcpy may return before its DMA lands; the ops run on non-blocking streams.
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  std::vector<float> download_full() const {
    const std::size_t n = static_cast<std::size_t>(m_rows * m_cs);
    std::vector<float> full(n);
    if (m_t == DType::F32) {
      CUDA_CHECK(cudaMemcpy(full.data(), m_buf.get(), n * 4, cudaMemcpyDeviceToHost));
    } else {
      std::vector<std::uint16_t> h(n);
      CUDA_CHECK(cudaMemcpy(h.data(), m_buf.get(), n * 2, cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < n; ++i) full[i] = cpu::half_to_float(h[i]);
    }
    return full;
  }

  /// The real channels, compact.
  std::vector<float> download() const {
    const std::vector<float> full = download_full();
    std::vector<float> v(static_cast<std::size_t>(m_rows * m_c));
    for (std::int64_t r = 0; r < m_rows; ++r)
      for (std::int64_t c = 0; c < m_c; ++c) v[r * m_c + c] = full[r * m_cs + c];
    return v;
  }

  /// The padding channels (empty when compact).
  std::vector<float> padding() const {
    const std::vector<float> full = download_full();
    std::vector<float> v;
    for (std::int64_t r = 0; r < m_rows; ++r)
      for (std::int64_t c = m_c; c < m_cs; ++c) v.push_back(full[r * m_cs + c]);
    return v;
  }

  std::vector<std::uint8_t> bytes() const {
    std::vector<std::uint8_t> b(m_buf.bytes());
    CUDA_CHECK(cudaMemcpy(b.data(), m_buf.get(), b.size(), cudaMemcpyDeviceToHost));
    return b;
  }

  void* ptr() const { return m_buf.get(); }
  TensorRef ref(const Shape& s) const { return TensorRef{m_buf.get(), s, m_t, m_cs}; }

 private:
  std::int64_t m_rows, m_c, m_cs;
  DType m_t;
  DeviceBuffer m_buf;
};

/// A plain FP32 device vector.
class DevF32 {
 public:
  explicit DevF32(std::size_t n) : m_n(n), m_buf(n * 4) {}
  void upload(const std::vector<float>& v) {
    EXPECT_EQ(v.size(), m_n);
    CUDA_CHECK(cudaMemcpy(m_buf.get(), v.data(), m_n * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  std::vector<float> download() const {
    std::vector<float> v(m_n);
    CUDA_CHECK(cudaMemcpy(v.data(), m_buf.get(), m_n * 4, cudaMemcpyDeviceToHost));
    return v;
  }
  std::vector<std::uint8_t> bytes() const {
    std::vector<std::uint8_t> b(m_n * 4);
    CUDA_CHECK(cudaMemcpy(b.data(), m_buf.get(), b.size(), cudaMemcpyDeviceToHost));
    return b;
  }
  float* get() const { return static_cast<float*>(m_buf.get()); }

 private:
  std::size_t m_n;
  DeviceBuffer m_buf;
};

inline double tolerance(DType t) { return t == DType::F16 ? 1e-2 : 1e-5; }

/// max |got − ref| ≤ tol · max |ref|, and no NaN/Inf in got.
inline ::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& ref, double tol) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs reference " << ref.size();
  double max_ref = 0.0;
  for (float r : ref) max_ref = std::max(max_ref, std::fabs(static_cast<double>(r)));
  const double scale = max_ref > 0.0 ? max_ref : 1.0;
  double worst = 0.0;
  std::size_t worst_i = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]))
      return ::testing::AssertionFailure() << "non-finite value " << got[i] << " at " << i << " (ref " << ref[i] << ")";
    const double e = std::fabs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    if (e > worst) {
      worst = e;
      worst_i = i;
    }
  }
  if (worst > tol * scale)
    return ::testing::AssertionFailure() << "max error " << worst << " at " << worst_i << " (got " << got[worst_i]
                                         << ", ref " << ref[worst_i] << "), relative " << worst / scale
                                         << " > " << tol << " (max |ref| " << max_ref << ")";
  return ::testing::AssertionSuccess() << "relative error " << worst / scale;
}

inline ::testing::AssertionResult all_zero(const std::vector<float>& v) {
  for (std::size_t i = 0; i < v.size(); ++i)
    if (v[i] != 0.0f) return ::testing::AssertionFailure() << "padding value " << v[i] << " at " << i;
  return ::testing::AssertionSuccess();
}

inline const char* dtype_label(DType t) { return t == DType::F16 ? "f16" : "f32"; }

}  // namespace renaissance::cuda::test
