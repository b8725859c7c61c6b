#include <kernels/cpu/elementwise.h>

#include <kernels/cpu/half.h>
#include <kernels/cpu/thread_pool.h>
#include <kernels/cpu/vectorize.h>
#include <renaissance/core/error.h>

#include <cmath>

// Compiled once per instruction-set level (isa.h): everything below is in namespace RN_ISA_NS.
#include <kernels/cpu/isa_target.h>

namespace renaissance::cpu::RN_ISA_NS {

namespace {
constexpr std::int64_t kGrain = 1 << 15;

std::int64_t row_grain(std::int64_t c) { return std::max<std::int64_t>(1, kGrain / std::max<std::int64_t>(c, 1)); }
}  // namespace

void relu_forward(const float* x, float* y, std::int64_t n) {
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    RN_IVDEP for (std::int64_t i = i0; i < i1; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  });
}

void relu_backward_sum(const float* y, const float* dy, const float* addend, float* dx, std::int64_t n,
                       bool round_f16) {
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      float g = dy[i] + addend[i];
      if (round_f16) g = half_to_float(float_to_half(g));
      dx[i] = y[i] > 0.0f ? g : 0.0f;
    }
  });
}

void relu_backward(const float* y, const float* dy, float* dx, std::int64_t n, bool accumulate) {
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    // dy is loaded unconditionally so the select if-converts (a conditional load blocks vectorisation).
    if (accumulate) {
      RN_IVDEP for (std::int64_t i = i0; i < i1; ++i) {
        const float g = dy[i];
        dx[i] += y[i] > 0.0f ? g : 0.0f;
      }
    } else {
      RN_IVDEP for (std::int64_t i = i0; i < i1; ++i) {
        const float g = dy[i];
        dx[i] = y[i] > 0.0f ? g : 0.0f;
      }
    }
  });
}

void tanh_forward(const float* x, float* y, std::int64_t n) {
  parallel_for(0, n, kGrain / 8, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) y[i] = std::tanh(x[i]);
  });
}

void tanh_backward(const float* y, const float* dy, float* dx, std::int64_t n, bool accumulate) {
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    if (accumulate) {
      RN_IVDEP for (std::int64_t i = i0; i < i1; ++i) dx[i] += dy[i] * (1.0f - y[i] * y[i]);
    } else {
      RN_IVDEP for (std::int64_t i = i0; i < i1; ++i) dx[i] = dy[i] * (1.0f - y[i] * y[i]);
    }
  });
}

void activation_forward(ops::Activation a, const float* x, float* y, std::int64_t n) {
  ops::visit_activation(a, [&](auto f) {
    using F = decltype(f);
    parallel_for(0, n, kGrain / 8, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) y[i] = F::forward(x[i]);
    });
  });
}

void activation_backward(ops::Activation a, const float* x, const float* dy, float* dx, std::int64_t n,
                         bool accumulate) {
  ops::visit_activation(a, [&](auto f) {
    using F = decltype(f);
    parallel_for(0, n, kGrain / 8, [&](std::int64_t i0, std::int64_t i1) {
      if (accumulate) {
        for (std::int64_t i = i0; i < i1; ++i) dx[i] += F::backward(x[i], dy[i]);
      } else {
        for (std::int64_t i = i0; i < i1; ++i) dx[i] = F::backward(x[i], dy[i]);
      }
    });
  });
}

void add2_forward(const float* a, const float* b, float* y, std::int64_t n) {
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    RN_IVDEP for (std::int64_t i = i0; i < i1; ++i) y[i] = a[i] + b[i];
  });
}

void channel_pad_forward(const float* x, std::int64_t rows, std::int64_t c, std::int64_t c_out, float* y) {
  RN_CHECK(c_out >= c && c > 0, "channel_pad_forward: cannot pad {} channels to {}", c, c_out);
  parallel_for(0, rows, row_grain(c_out), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      for (std::int64_t j = 0; j < c; ++j) y[r * c_out + j] = x[r * c + j];
      for (std::int64_t j = c; j < c_out; ++j) y[r * c_out + j] = 0.0f;
    }
  });
}

void channel_pad_backward(const float* dy, std::int64_t rows, std::int64_t c_out, std::int64_t c, float* dx,
                          bool accumulate) {
  RN_CHECK(c_out >= c && c > 0, "channel_pad_backward: cannot take {} channels of {}", c, c_out);
  parallel_for(0, rows, row_grain(c_out), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t j = 0; j < c; ++j) {
        const float g = dy[r * c_out + j];
        dx[r * c + j] = accumulate ? dx[r * c + j] + g : g;
      }
  });
}

}  // namespace renaissance::cpu::RN_ISA_NS
