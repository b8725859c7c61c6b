// Compiled with -ffp-contract=off (kernels/cpu/CMakeLists.txt): the formulas in optimizer.h are evaluated
// exactly as written, which is what makes them reproducible against a reference bit for bit.
#include <kernels/cpu/optimizer.h>

#include <kernels/cpu/thread_pool.h>
#include <renaissance/core/error.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace renaissance::cpu {

namespace {

constexpr std::int64_t kGrain = 1 << 14;

bool skipped(const std::int32_t* skip) { return skip != nullptr && *skip != 0; }

void check(const OptimizerScalars* s, const char* what) { RN_CHECK(s != nullptr, "{}: scalars pointer is null", what); }

}  // namespace

void sgd_update(float* w, const float* g, std::int64_t n, const OptimizerScalars* s, bool apply_weight_decay,
                const std::int32_t* skip) {
  check(s, "sgd_update");
  if (skipped(skip)) return;
  const float lr = s->lr, wd = apply_weight_decay ? s->weight_decay : 0.0f;
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const float gi = apply_weight_decay ? g[i] + wd * w[i] : g[i];
      w[i] = w[i] - lr * gi;
    }
  });
}

void momentum_update(float* w, const float* g, float* v, std::int64_t n, const OptimizerScalars* s,
                     bool apply_weight_decay, const std::int32_t* skip) {
  check(s, "momentum_update");
  if (skipped(skip)) return;
  const float lr = s->lr, mu = s->momentum, wd = apply_weight_decay ? s->weight_decay : 0.0f;
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const float gi = apply_weight_decay ? g[i] + wd * w[i] : g[i];
      v[i] = mu * v[i] + gi;
      w[i] = w[i] - lr * v[i];
    }
  });
}

void nesterov_update(float* w, const float* g, float* v, std::int64_t n, const OptimizerScalars* s,
                     bool apply_weight_decay, const std::int32_t* skip) {
  check(s, "nesterov_update");
  if (skipped(skip)) return;
  const float lr = s->lr, mu = s->momentum, wd = apply_weight_decay ? s->weight_decay : 0.0f;
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    for (std::int64_t i = i0; i < i1; ++i) {
      const float gi = apply_weight_decay ? g[i] + wd * w[i] : g[i];
      v[i] = mu * v[i] + gi;
      w[i] = w[i] - lr * (gi + mu * v[i]);
    }
  });
}

namespace {

// One chunk of the Adam body; the two flags are template parameters so that each variant is a
// straight-line loop the compiler vectorises (sqrt included: -fno-math-errno).
template <bool kL2, bool kDecoupled>
void adam_chunk(float* __restrict w, const float* __restrict g, float* __restrict m, float* __restrict v,
                std::int64_t i0, std::int64_t i1, float lr, float b1, float b2, float one_b1, float one_b2, float bc1,
                float bc2, float eps, float wd, float shrink) {
  for (std::int64_t i = i0; i < i1; ++i) {
    float wi = w[i];
    if (kDecoupled) wi = wi * shrink;
    const float gi = kL2 ? g[i] + wd * wi : g[i];
    const float mi = b1 * m[i] + one_b1 * gi;
    const float vi = b2 * v[i] + one_b2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi / bc1;
    const float vhat = vi / bc2;
    w[i] = wi - lr * mhat / (std::sqrt(vhat) + eps);
  }
}

// The Adam body shared by Adam (L2 in g') and AdamW (decoupled decay applied to w first).
void adam_core(float* w, const float* g, float* m, float* v, std::int64_t n, const OptimizerScalars& s, bool l2,
               bool decoupled) {
  const float lr = s.lr, b1 = s.beta1, b2 = s.beta2, eps = s.eps, wd = s.weight_decay;
  const float one_b1 = 1.0f - b1, one_b2 = 1.0f - b2, shrink = 1.0f - lr * wd;
  const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), static_cast<double>(s.step)));
  const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), static_cast<double>(s.step)));
  auto* chunk = l2 ? (decoupled ? adam_chunk<true, true> : adam_chunk<true, false>)
                   : (decoupled ? adam_chunk<false, true> : adam_chunk<false, false>);
  parallel_for(0, n, kGrain, [&](std::int64_t i0, std::int64_t i1) {
    chunk(w, g, m, v, i0, i1, lr, b1, b2, one_b1, one_b2, bc1, bc2, eps, wd, shrink);
  });
}

}  // namespace

void adam_update(float* w, const float* g, float* m, float* v, std::int64_t n, const OptimizerScalars* s,
                 bool apply_weight_decay, const std::int32_t* skip) {
  check(s, "adam_update");
  if (skipped(skip)) return;
  adam_core(w, g, m, v, n, *s, apply_weight_decay, false);
}

void adamw_update(float* w, const float* g, float* m, float* v, std::int64_t n, const OptimizerScalars* s,
                  bool apply_weight_decay, const std::int32_t* skip) {
  check(s, "adamw_update");
  if (skipped(skip)) return;
  adam_core(w, g, m, v, n, *s, false, apply_weight_decay);
}

void lars_update(float* w, const float* g, float* v, const LarsSegment* segments, std::size_t num_segments,
                 const OptimizerScalars* s, bool apply_weight_decay, const std::int32_t* skip) {
  check(s, "lars_update");
  if (skipped(skip) || num_segments == 0) return;
  RN_CHECK(segments != nullptr, "lars_update: {} segments but the segment list is null", num_segments);
  const float lr = s->lr, mu = s->momentum, eta = s->lars_eta, wd = apply_weight_decay ? s->weight_decay : 0.0f;

  // Norm blocks of every segment in one task list, so small and large tensors share the threads.
  std::vector<std::int64_t> first_block(num_segments + 1, 0);
  for (std::size_t i = 0; i < num_segments; ++i) {
    RN_CHECK(segments[i].count >= 0 && segments[i].offset >= 0, "lars_update: segment {} has offset {} count {}", i,
             segments[i].offset, segments[i].count);
    first_block[i + 1] = first_block[i] + (segments[i].count + kLarsNormBlock - 1) / kLarsNormBlock;
  }
  const std::int64_t blocks = first_block[num_segments];
  std::vector<double> wsq(static_cast<std::size_t>(blocks)), gsq(static_cast<std::size_t>(blocks));
  parallel_for(0, blocks, 4, [&](std::int64_t b0, std::int64_t b1) {
    std::size_t seg = 0;
    for (std::int64_t b = b0; b < b1; ++b) {
      while (first_block[seg + 1] <= b) ++seg;
      const std::int64_t begin = segments[seg].offset + (b - first_block[seg]) * kLarsNormBlock;
      const std::int64_t end = std::min(begin + kLarsNormBlock, segments[seg].offset + segments[seg].count);
      double sw = 0.0, sg = 0.0;
      for (std::int64_t i = begin; i < end; ++i) {
        sw += static_cast<double>(w[i]) * w[i];
        sg += static_cast<double>(g[i]) * g[i];
      }
      wsq[b] = sw;
      gsq[b] = sg;
    }
  });
  std::vector<float> scale(num_segments);
  for (std::size_t i = 0; i < num_segments; ++i) {
    double sw = 0.0, sg = 0.0;
    for (std::int64_t b = first_block[i]; b < first_block[i + 1]; ++b) {
      sw += wsq[b];
      sg += gsq[b];
    }
    const auto wn = static_cast<float>(std::sqrt(sw)), gn = static_cast<float>(std::sqrt(sg));
    const float trust = (wn > 0.0f && gn > 0.0f) ? eta * wn / (gn + wd * wn) : 1.0f;
    scale[i] = lr * trust;
  }
  for (std::size_t i = 0; i < num_segments; ++i) {
    const std::int64_t off = segments[i].offset;
    const float sc = scale[i];
    parallel_for(off, off + segments[i].count, kGrain, [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t j = i0; j < i1; ++j) {
        v[j] = mu * v[j] + sc * (g[j] + wd * w[j]);
        w[j] = w[j] - v[j];
      }
    });
  }
}

}  // namespace renaissance::cpu
