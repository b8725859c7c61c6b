// Helpers of the CUDA kernel tests: a fixture that skips without a device, device buffers, padded NHWC device
// tensors in FP32 or FP16, random data, and per-dtype comparisons (STYLE habit 6: abs + |ref|·tol; NaN never passes).
#pragma once

#include <kernels/cpu/half.h>
#include <kernels/cuda/common.h>
#include <kernels/cuda/device_info.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace renaissance::cuda::ktest {

using Vec = std::vector<float>;

/// cudaGetDeviceCount, asked once per process.
inline bool have_device() {
  static const bool yes = device_count() > 0;
  return yes;
}

/// Every test: skipped with a visible message when there is no device; otherwise gets its own non-blocking stream.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_device()) GTEST_SKIP() << "no CUDA device";
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream != nullptr) CUDA_CHECK_NOTHROW(cudaStreamDestroy(stream));
  }
  void sync() const { CUDA_CHECK(cudaStreamSynchronize(stream)); }

  cudaStream_t stream = nullptr;
};

/// Storage precision of the outputs under test.
inline double tol_for(DType t) { return t == DType::F16 ? 1e-2 : 1e-5; }

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) : m_bytes(bytes) { CUDA_CHECK(cudaMalloc(&m_p, bytes ? bytes : 1)); }
  ~DeviceBuffer() {
    if (m_p != nullptr) CUDA_CHECK_NOTHROW(cudaFree(m_p));
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : m_p(o.m_p), m_bytes(o.m_bytes) { o.m_p = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(m_p, o.m_p);
    std::swap(m_bytes, o.m_bytes);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* get() const { return m_p; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(m_p);
  }
  std::size_t bytes() const { return m_bytes; }
  void fill_bytes(int byte) const {
    CUDA_CHECK(cudaMemset(m_p, byte, m_bytes));
    CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  void* m_p = nullptr;
  std::size_t m_bytes = 0;
};

/// A device array of plain values (params, statistics, flags, labels).
template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());  // a pageable copy may return before its DMA lands
  return b;
}
template <typename T>
std::vector<T> download(const DeviceBuffer& b, std::size_t n) {
  std::vector<T> v(n);
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemcpy(v.data(), b.get(), n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}
template <typename T>
void upload_into(const DeviceBuffer& b, const std::vector<T>& v) {
  CUDA_CHECK(cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaDeviceSynchronize());
}

inline Vec random_vec(std::size_t n, std::uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (float& x : v) x = d(gen);
  return v;
}

/// Small integers in [lo, hi]: many exact ties.
inline Vec random_ints(std::size_t n, std::uint32_t seed, int lo, int hi) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> d(lo, hi);
  Vec v(n);
  for (float& x : v) x = static_cast<float>(d(gen));
  return v;
}

inline float round_half(float x) { return cpu::half_to_float(cpu::float_to_half(x)); }

/// The values the device holds after storing `v` as `t`.
inline Vec quantized(Vec v, DType t) {
  if (t == DType::F16)
    for (float& x : v) x = round_half(x);
  return v;
}

/// An NHWC tensor on the device: real channels shape.c of rows of c_stride elements, F32 or F16.
class DevTensor {
 public:
  DevTensor(Shape shape, DType t, std::int64_t c_stride = 0)
      : m_shape(shape),
        m_t(t),
        m_cs(c_stride > 0 ? c_stride : shape.c),
        m_buf(static_cast<std::size_t>(shape.n * shape.h * shape.w * (c_stride > 0 ? c_stride : shape.c)) *
              dtype_size(t)) {}

  TensorRef ref() const { return TensorRef{m_buf.get(), m_shape, m_t, m_cs}; }
  const Shape& shape() const { return m_shape; }
  DType dtype() const { return m_t; }
  std::int64_t c_stride() const { return m_cs; }
  std::int64_t rows() const { return m_shape.n * m_shape.h * m_shape.w; }
  std::size_t elems() const { return static_cast<std::size_t>(m_shape.elems()); }
  const DeviceBuffer& buffer() const { return m_buf; }

  /// Real channels from `compact` (N·H·W·C), padding channels zero (the layout invariant).
  void upload(const Vec& compact) const {
    ASSERT_EQ(compact.size(), elems());
    Vec full(static_cast<std::size_t>(rows() * m_cs), 0.0f);
    for (std::int64_t r = 0; r < rows(); ++r)
      for (std::int64_t c = 0; c < m_shape.c; ++c) full[r * m_cs + c] = compact[r * m_shape.c + c];
    write_full(full);
  }
  /// Every byte 0xFF (NaN in both dtypes): whatever a kernel fails to write shows up.
  void poison() const { m_buf.fill_bytes(0xFF); }

  Vec download_full() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    const auto n = static_cast<std::size_t>(rows() * m_cs);
    Vec full(n);
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
  Vec download() const {
    const Vec full = download_full();
    Vec v(elems());
    for (std::int64_t r = 0; r < rows(); ++r)
      for (std::int64_t c = 0; c < m_shape.c; ++c) v[r * m_shape.c + c] = full[r * m_cs + c];
    return v;
  }
  /// Padding channels must hold exactly +0 or -0 after any kernel.
  void expect_zero_padding(const std::string& what) const {
    const Vec full = download_full();
    for (std::int64_t r = 0; r < rows(); ++r)
      for (std::int64_t c = m_shape.c; c < m_cs; ++c)
        ASSERT_EQ(full[r * m_cs + c], 0.0f) << what << ": padding channel " << c << " of row " << r << " not zero";
  }

 private:
  void write_full(const Vec& full) const {
    if (m_t == DType::F32) {
      CUDA_CHECK(cudaMemcpy(m_buf.get(), full.data(), full.size() * 4, cudaMemcpyHostToDevice));
    } else {
      std::vector<std::uint16_t> h(full.size());
      for (std::size_t i = 0; i < full.size(); ++i) h[i] = cpu::float_to_half(full[i]);
      CUDA_CHECK(cudaMemcpy(m_buf.get(), h.data(), h.size() * 2, cudaMemcpyHostToDevice));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
  }

  Shape m_shape;
  DType m_t;
  std::int64_t m_cs;
  DeviceBuffer m_buf;
};

/// |got − ref| ≤ tol·(|ref| + scale) for every element, where scale = 1 by default (abs + rel), or the magnitude of
/// the whole reference (max |ref|) for reductions. NaN never passes (not even against a NaN reference).
inline void expect_near(const Vec& got, const Vec& ref, double tol, const std::string& what,
                        bool relative_to_max = false) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double scale = 1.0;
  if (relative_to_max) {
    scale = 0.0;
    for (float r : ref) scale = std::max(scale, static_cast<double>(std::abs(r)));
    if (!(scale > 0.0)) scale = 1.0;
  }
  std::size_t bad = 0, first = 0;
  double worst = 0.0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - static_cast<double>(ref[i]));
    const double lim = tol * (std::abs(static_cast<double>(ref[i])) + scale);
    if (!(err <= lim)) {  // NaN lands here
      if (bad++ == 0) first = i;
      if (!(err <= worst)) worst = err;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements off; first at " << first << " got "
                     << got[first] << " want " << ref[first] << " (tol " << tol << ", worst abs error " << worst
                     << ")";
}

inline std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline void expect_bits_equal(const Vec& got, const Vec& ref, const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(bits(got[i]), bits(ref[i])) << what << ": element " << i << " got " << got[i] << " want " << ref[i];
}

/// The layouts every tensor kernel is tried on: odd shapes, compact and padded rows, scalar and vector paths.
struct Layout {
  Shape shape;
  std::int64_t c_stride;
  DType dtype;
};

inline std::string layout_name(const Layout& l) {
  return l.shape.str() + "/cs" + std::to_string(l.c_stride) + "/" + dtype_name(l.dtype);
}

inline std::vector<Layout> standard_layouts() {
  std::vector<Layout> out;
  for (DType t : {DType::F32, DType::F16}) {
    out.push_back({Shape{3, 7, 5, 3}, 3, t});     // compact, odd: scalar path
    out.push_back({Shape{3, 7, 5, 3}, 8, t});     // padded to 8: vector path with padding
    out.push_back({Shape{3, 7, 5, 13}, 13, t});   // compact, odd
    out.push_back({Shape{3, 7, 5, 13}, 16, t});   // padded to 16
    out.push_back({Shape{2, 9, 11, 64}, 64, t});  // a wider aligned case
  }
  return out;
}

}  // namespace renaissance::cuda::ktest
