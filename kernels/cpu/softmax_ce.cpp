#include <kernels/cpu/softmax_ce.h>

#include <kernels/cpu/thread_pool.h>
#include <renaissance/core/error.h>

#include <cmath>
#include <vector>

namespace renaissance::cpu {

namespace detail {

void check_labels(const std::int32_t* labels, std::int64_t batch, std::int64_t classes, const char* what) {
  for (std::int64_t i = 0; i < batch; ++i)
    RN_CHECK(labels[i] >= 0 && labels[i] < classes, "{}: sample {} has label {}, outside [0, {})", what, i, labels[i],
             classes);
}

double sample_ce(const float* z, std::int64_t classes, std::int32_t label, float label_smoothing) {
  float mx = z[0];
  for (std::int64_t k = 1; k < classes; ++k) mx = z[k] > mx ? z[k] : mx;
  double sum = 0.0, zsum = 0.0;
  for (std::int64_t k = 0; k < classes; ++k) {
    sum += std::exp(static_cast<double>(z[k]) - mx);
    zsum += z[k];
  }
  const double lse = mx + std::log(sum);
  // −log p_k = lse − z_k, so the mean over classes is lse − mean(z).
  const double eps = label_smoothing;
  return (1.0 - eps) * (lse - z[label]) + eps * (lse - zsum / static_cast<double>(classes));
}

}  // namespace detail

float softmax_ce_forward(const float* logits, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                         float label_smoothing, float* probs) {
  RN_CHECK(batch > 0 && classes > 0, "softmax_ce_forward: empty batch {} x classes {}", batch, classes);
  detail::check_labels(labels, batch, classes, "softmax_ce_forward");
  std::vector<double> loss(static_cast<std::size_t>(batch));
  parallel_for(0, batch, 16, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t i = b0; i < b1; ++i) {
      const float* z = logits + i * classes;
      float* p = probs + i * classes;
      float mx = z[0];
      for (std::int64_t k = 1; k < classes; ++k) mx = z[k] > mx ? z[k] : mx;
      double sum = 0.0;
      for (std::int64_t k = 0; k < classes; ++k) sum += std::exp(static_cast<double>(z[k]) - mx);
      const double inv = 1.0 / sum;
      for (std::int64_t k = 0; k < classes; ++k)
        p[k] = static_cast<float>(std::exp(static_cast<double>(z[k]) - mx) * inv);
      loss[i] = detail::sample_ce(z, classes, labels[i], label_smoothing);
    }
  });
  double total = 0.0;
  for (double l : loss) total += l;  // in sample order: independent of the thread count
  return static_cast<float>(total / static_cast<double>(batch));
}

void softmax_ce_backward(const float* probs, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                         float label_smoothing, float loss_scale, float* dlogits, bool accumulate) {
  RN_CHECK(batch > 0 && classes > 0, "softmax_ce_backward: empty batch {} x classes {}", batch, classes);
  detail::check_labels(labels, batch, classes, "softmax_ce_backward");
  const float scale = loss_scale / static_cast<float>(batch);
  const float off = label_smoothing / static_cast<float>(classes);
  const float on = 1.0f - label_smoothing + off;
  parallel_for(0, batch, 16, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t i = b0; i < b1; ++i) {
      const float* p = probs + i * classes;
      float* d = dlogits + i * classes;
      for (std::int64_t k = 0; k < classes; ++k) {
        const float q = k == labels[i] ? on : off;
        const float v = (p[k] - q) * scale;
        d[k] = accumulate ? d[k] + v : v;
      }
    }
  });
}

}  // namespace renaissance::cpu
