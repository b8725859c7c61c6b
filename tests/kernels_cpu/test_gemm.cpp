// SGEMM (own kernel with each micro-kernel this CPU runs, and OpenBLAS when built in) against a naive
// double-precision product; small-integer inputs make the product exact, so those compare bit for bit.
#include <kernels/cpu/gemm.h>
#include <kernels/cpu/scratch.h>
#include <kernels/cpu/thread_pool.h>
#include <renaissance/core/error.h>

#include "kernel_test_util.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace renaissance::cpu::test {
namespace {

struct Backend {
  GemmBackend backend;
  const char* isa;  // own backend: micro-kernel; ignored for OpenBLAS
  std::string name() const {
    return backend == GemmBackend::Own ? std::string("own-") + isa : std::string("openblas");
  }
};

std::vector<Backend> backends() {
  std::vector<Backend> out;
  for (const char* isa : {"avx512", "avx2", "generic"})
    if (detail::set_gemm_isa(isa)) out.push_back({GemmBackend::Own, isa});
  if (openblas_available()) out.push_back({GemmBackend::OpenBlas, ""});
  return out;
}

// Restores the process defaults after each test.
class GemmTest : public ::testing::Test {
 protected:
  void SetUp() override {
    m_backend = gemm_backend();
    m_isa = gemm_isa();
  }
  void TearDown() override {
    set_gemm_backend(m_backend);
    detail::set_gemm_isa(m_isa.c_str());
  }
  void use(const Backend& b) {
    set_gemm_backend(b.backend);
    if (b.backend == GemmBackend::Own) {
      ASSERT_TRUE(detail::set_gemm_isa(b.isa));
    }
  }

 private:
  GemmBackend m_backend;
  std::string m_isa;
};

// C = alpha·op(A)·op(B) + beta·C in double.
DVec gemm_ref(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, double alpha, const Vec& a,
              std::int64_t lda, const Vec& b, std::int64_t ldb, double beta, const Vec& c, std::int64_t ldc) {
  DVec out = to_double(c);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j) {
      double s = 0.0;
      for (std::int64_t p = 0; p < k; ++p) s += static_cast<double>(ta ? a[p * lda + i] : a[i * lda + p]) *
                                                 static_cast<double>(tb ? b[j * ldb + p] : b[p * ldb + j]);
      out[i * ldc + j] = alpha * s + (beta == 0.0 ? 0.0 : beta * c[i * ldc + j]);
    }
  return out;
}

Vec small_ints(std::size_t n, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> u(-3, 3);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(u(rng));
  return v;
}

struct Case {
  std::int64_t m, n, k;
};

// Edge sizes around the 6×16 register tile, the K block (256, split evenly), the 144-row M block and the
// direct-operand thresholds (n ≤ 64 reads A in place, m ≤ 96 reads B in place).
const Case kCases[] = {{1, 1, 1},   {5, 7, 3},    {6, 16, 8},    {7, 17, 9},   {13, 33, 257}, {96, 64, 300},
                       {97, 65, 31}, {150, 20, 40}, {145, 130, 513}, {300, 48, 17}, {33, 200, 700}};

TEST_F(GemmTest, MatchesDoubleReferenceAllTransposesAndBackends) {
  for (const Backend& be : backends()) {
    use(be);
    for (const Case& cs : kCases)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        // Leading dimensions larger than the minimum: products on sub-matrices must work.
        const std::int64_t lda = (ta ? cs.m : cs.k) + 3, ldb = (tb ? cs.k : cs.n) + 5, ldc = cs.n + 2;
        const Vec a = random_vec((ta ? cs.k : cs.m) * lda, 1), b = random_vec((tb ? cs.n : cs.k) * ldb, 2);
        Vec c = random_vec(cs.m * ldc, 3);
        for (const auto& [alpha, beta] : {std::pair<float, float>{1.0f, 0.0f}, {0.5f, 1.0f}, {-1.5f, 0.25f}}) {
          const DVec ref = gemm_ref(ta, tb, cs.m, cs.n, cs.k, alpha, a, lda, b, ldb, beta, c, ldc);
          for (bool parallel : {false, true}) {
            Vec got = c;
            if (parallel) {
              sgemm(ta, tb, cs.m, cs.n, cs.k, alpha, a.data(), lda, b.data(), ldb, beta, got.data(), ldc);
            } else {
              sgemm_serial(ta, tb, cs.m, cs.n, cs.k, alpha, a.data(), lda, b.data(), ldb, beta, got.data(), ldc);
            }
            // FP32 accumulation over k terms of magnitude ≤ 1.
            const double tol = 2e-6 * std::sqrt(static_cast<double>(cs.k)) + 1e-6;
            expect_close(got, ref, tol,
                         be.name() + " m=" + std::to_string(cs.m) + " n=" + std::to_string(cs.n) +
                             " k=" + std::to_string(cs.k) + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
                             (parallel ? " parallel" : " serial"));
          }
        }
      }
  }
}

TEST_F(GemmTest, SmallIntegersAreExact) {
  for (const Backend& be : backends()) {
    use(be);
    for (const Case& cs : kCases)
      for (int t = 0; t < 4; ++t) {
        const bool ta = t & 1, tb = t & 2;
        const std::int64_t lda = ta ? cs.m : cs.k, ldb = tb ? cs.k : cs.n;
        const Vec a = small_ints(cs.m * cs.k, 4), b = small_ints(cs.k * cs.n, 5);
        Vec c = small_ints(cs.m * cs.n, 6);
        const DVec ref = gemm_ref(ta, tb, cs.m, cs.n, cs.k, 1.0, a, lda, b, ldb, 2.0, c, cs.n);
        sgemm(ta, tb, cs.m, cs.n, cs.k, 1.0f, a.data(), lda, b.data(), ldb, 2.0f, c.data(), cs.n);
        for (std::size_t i = 0; i < c.size(); ++i)
          ASSERT_EQ(c[i], ref[i]) << be.name() << " m=" << cs.m << " n=" << cs.n << " k=" << cs.k << " i=" << i;
      }
  }
}

TEST_F(GemmTest, BetaZeroIgnoresNanInC) {
  for (const Backend& be : backends()) {
    use(be);
    const std::int64_t m = 37, n = 41, k = 19;
    const Vec a = random_vec(m * k, 7), b = random_vec(k * n, 8);
    Vec c(m * n, std::numeric_limits<float>::quiet_NaN());
    sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, c.data(), n);
    expect_close(c, gemm_ref(false, false, m, n, k, 1.0, a, k, b, n, 0.0, Vec(m * n, 0.0f), n), 1e-5, be.name());
  }
}

TEST_F(GemmTest, ZeroDepthScalesC) {
  Vec c = {1.0f, 2.0f, 3.0f, 4.0f};
  sgemm(false, false, 2, 2, 0, 1.0f, nullptr, 1, nullptr, 2, 0.5f, c.data(), 2);
  EXPECT_EQ(c, (Vec{0.5f, 1.0f, 1.5f, 2.0f}));
}

TEST_F(GemmTest, PackedBAndColumnRanges) {
  for (const Backend& be : backends()) {
    use(be);
    const std::int64_t m = 53, n = 70, k = 300;
    for (bool tb : {false, true}) {
      const Vec a = random_vec(m * k, 9), b = random_vec(k * n, 10);
      const std::int64_t ldb = tb ? k : n;
      const PackedB pb(tb, k, n, b.data(), ldb);
      const DVec ref = gemm_ref(false, tb, m, n, k, 1.0, a, k, b, ldb, 0.0, Vec(m * n, 0.0f), n);
      Vec c(m * n, 0.0f);
      sgemm_serial_packed(false, m, 1.0f, a.data(), k, pb, 0.0f, c.data(), n);
      expect_close(c, ref, 1e-4, be.name() + " packed");
      Vec parts(m * n, 0.0f);
      sgemm_packed_columns(false, m, 0, 32, 1.0f, a.data(), k, pb, 0.0f, parts.data(), n);
      sgemm_packed_columns(false, m, 32, n, 1.0f, a.data(), k, pb, 0.0f, parts.data(), n);
      expect_close(parts, ref, 1e-4, be.name() + " columns");
    }
  }
}

TEST_F(GemmTest, OwnResultsDoNotDependOnTiling) {
  // The own kernel computes each element with a K order fixed by k alone, so a row block of C computed
  // on its own has the same bits as inside the whole product.
  set_gemm_backend(GemmBackend::Own);
  const std::int64_t m = 301, n = 77, k = 520;
  const Vec a = random_vec(m * k, 11), b = random_vec(k * n, 12);
  Vec whole(m * n), rows(m * n);
  sgemm(false, false, m, n, k, 1.0f, a.data(), k, b.data(), n, 0.0f, whole.data(), n);
  for (std::int64_t i0 = 0; i0 < m; i0 += 37)
    sgemm_serial(false, false, std::min<std::int64_t>(37, m - i0), n, k, 1.0f, a.data() + i0 * k, k, b.data(), n,
                 0.0f, rows.data() + i0 * n, n);
  expect_bits_equal(whole, rows, "row blocks vs whole");
}

TEST_F(GemmTest, RejectsBadLeadingDimensions) {
  Vec a(4), b(4), c(4);
  EXPECT_THROW(sgemm(false, false, 2, 2, 2, 1.0f, a.data(), 1, b.data(), 2, 0.0f, c.data(), 2), Error);
  if (!openblas_available()) {
    EXPECT_THROW(set_gemm_backend(GemmBackend::OpenBlas), Error);
  }
}

// A scratch buffer whose growth fails (the allocation refused: a memory limit) keeps no capacity: the next, smaller
// request allocates again. It kept the old capacity beside a null pointer and returned null, which a oneDNN kernel
// wrote through (SIGSEGV under `ulimit -v` instead of the "out of host memory" error).
TEST(ScratchBuffer, AFailedGrowthLeavesNoNullBufferBehind) {
#if defined(__SANITIZE_ADDRESS__)
  // ASan aborts on a request that large unless told to return null, as malloc does (scripts/sanitize tells it).
  const char* asan = std::getenv("ASAN_OPTIONS");
  if (!asan || !std::strstr(asan, "allocator_may_return_null=1"))
    GTEST_SKIP() << "under ASan without allocator_may_return_null=1";
#endif
  detail::AlignedBuffer buffer;
  ASSERT_NE(buffer.get(16), nullptr);
  EXPECT_THROW(buffer.get(std::size_t{1} << 52), std::bad_alloc);  // 16 PiB: more than any address space
  float* again = buffer.get(16);
  ASSERT_NE(again, nullptr);
  again[15] = 1.0f;  // writable
}

}  // namespace
}  // namespace renaissance::cpu::test
