#include <kernels/cpu/fully_connected.h>

#include <kernels/cpu/gemm.h>
#include <kernels/cpu/reduce.h>
#include <kernels/cpu/thread_pool.h>
#include <renaissance/core/error.h>

namespace renaissance::cpu {

namespace {
void check_sizes(std::int64_t batch, std::int64_t in, std::int64_t out, const char* what) {
  RN_CHECK(batch > 0 && in > 0 && out > 0, "{}: empty size batch={} in={} out={}", what, batch, in, out);
}
}  // namespace

void fc_forward(const float* x, std::int64_t batch, std::int64_t in, const float* w, const float* bias, float* y,
                std::int64_t out) {
  check_sizes(batch, in, out, "fc_forward");
  sgemm(false, true, batch, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  if (!bias) return;
  parallel_for(0, batch, 64, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t r = b0; r < b1; ++r)
      for (std::int64_t o = 0; o < out; ++o) y[r * out + o] += bias[o];
  });
}

void fc_backward_data(const float* dy, std::int64_t batch, std::int64_t out, const float* w, float* dx,
                      std::int64_t in, bool accumulate) {
  check_sizes(batch, in, out, "fc_backward_data");
  sgemm(false, false, batch, in, out, 1.0f, dy, out, w, in, accumulate ? 1.0f : 0.0f, dx, in);
}

void fc_backward_weights(const float* x, const float* dy, std::int64_t batch, std::int64_t in, std::int64_t out,
                         float* dw, float* db, bool accumulate) {
  check_sizes(batch, in, out, "fc_backward_weights");
  sgemm(true, false, out, in, batch, 1.0f, dy, out, x, in, accumulate ? 1.0f : 0.0f, dw, in);
  if (db) detail::column_sums(dy, batch, out, out, db, accumulate);
}

}  // namespace renaissance::cpu
