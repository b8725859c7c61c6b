// Single-precision matrix product, the engine under convolutions and fully connected layers.
#pragma once

#include <cstdint>

#include <kernels/cpu/scratch.h>

namespace renaissance::cpu {

/// Which library computes the products. `Own` (a packed, cache-blocked SGEMM with AVX-512/AVX2/generic
/// micro-kernels chosen at run time) is always there; `OpenBlas` only when built with
/// RENAISSANCE_HAVE_OPENBLAS. OpenBLAS runs single-threaded inside our pool, so both are deterministic.
enum class GemmBackend : std::uint8_t { Own, OpenBlas };

bool openblas_available();
/// The backend in use; the default is the faster one on this machine class (docs/kernels-cpu.md), and
/// RENAISSANCE_GEMM=own|openblas overrides it.
GemmBackend gemm_backend();
/// Throws Error when OpenBlas is asked for and not built in.
void set_gemm_backend(GemmBackend backend);
const char* gemm_backend_name(GemmBackend backend);
/// The micro-kernel the own backend dispatched to: "avx512", "avx2" or "generic".
const char* gemm_isa();

/// C = alpha·op(A)·op(B) + beta·C, row-major; op(A) is m×k, op(B) k×n, op(X) = Xᵀ when trans_x.
/// beta == 0 overwrites C without reading it. Runs on the thread pool; every element of C is computed
/// by one thread with a K order fixed by the shape, so results do not depend on the thread count.
void sgemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

/// As sgemm, on the calling thread only (for callers that parallelise over many small products).
void sgemm_serial(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha,
                  const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
                  std::int64_t ldc);

/// op(B) (k×n) prepared once for many products that share it, e.g. a convolution's weights against
/// each row block of its im2col matrix. The own backend packs B into its micro-panel layout (in
/// parallel); OpenBLAS only remembers the pointer. B must outlive the PackedB for OpenBLAS.
class PackedB {
 public:
  PackedB(bool trans_b, std::int64_t k, std::int64_t n, const float* b, std::int64_t ldb);
  std::int64_t k() const { return m_k; }
  std::int64_t n() const { return m_n; }

 private:
  friend void sgemm_serial_packed(bool, std::int64_t, float, const float*, std::int64_t, const PackedB&, float, float*,
                                  std::int64_t);
  friend void sgemm_packed_columns(bool, std::int64_t, std::int64_t, std::int64_t, float, const float*, std::int64_t,
                                   const PackedB&, float, float*, std::int64_t);
  GemmBackend m_backend;
  bool m_trans_b;
  std::int64_t m_k, m_n, m_ldb;
  const float* m_b;               // OpenBLAS: the caller's B
  detail::AlignedBuffer m_packed;  // own: k × align(n, 16) floats in panel order
};

/// C[m×n] = alpha·op(A)·B + beta·C with a prepared B; calling thread only.
void sgemm_serial_packed(bool trans_a, std::int64_t m, float alpha, const float* a, std::int64_t lda, const PackedB& b,
                         float beta, float* c, std::int64_t ldc);

/// As sgemm_serial_packed for the columns [col_begin, col_end) of B and C only; col_begin must be a
/// multiple of 16 (a packed panel). `c` points at column 0.
void sgemm_packed_columns(bool trans_a, std::int64_t m, std::int64_t col_begin, std::int64_t col_end, float alpha,
                          const float* a, std::int64_t lda, const PackedB& b, float beta, float* c, std::int64_t ldc);

namespace detail {
/// Test and benchmark hook: forces the own backend's micro-kernel ("avx512", "avx2", "generic");
/// returns false (and changes nothing) when this CPU cannot run it.
bool set_gemm_isa(const char* isa);
}  // namespace detail

}  // namespace renaissance::cpu
