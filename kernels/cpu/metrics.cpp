#include <kernels/cpu/metrics.h>

#include <kernels/cpu/softmax_ce.h>
#include <kernels/cpu/thread_pool.h>
#include <renaissance/core/error.h>

#include <algorithm>
#include <cmath>
#include <vector>

namespace renaissance::cpu {

void accumulate_metrics(const float* logits, const std::int32_t* labels, std::int64_t batch, std::int64_t classes,
                        float label_smoothing, float* result, std::int32_t* predicted) {
  RN_CHECK(batch > 0 && classes > 0, "accumulate_metrics: empty batch {} x classes {}", batch, classes);
  detail::check_labels(labels, batch, classes, "accumulate_metrics");
  std::vector<double> loss(static_cast<std::size_t>(batch));
  std::vector<std::int64_t> rank(static_cast<std::size_t>(batch));
  parallel_for(0, batch, 16, [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t i = b0; i < b1; ++i) {
      const float* z = logits + i * classes;
      const std::int32_t t = labels[i];
      const bool nan_label = std::isnan(z[t]);
      std::int64_t r = 0, best = 0;
      for (std::int64_t k = 0; k < classes; ++k) {
        r += z[k] > z[t] || (z[k] == z[t] && k < t) || (std::isnan(z[k]) && !nan_label);
        if (z[k] > z[best]) best = k;
      }
      rank[i] = nan_label ? std::max<std::int64_t>(classes, 5) : r;  // a NaN label logit: not even in the top 5
      if (predicted) predicted[i] = static_cast<std::int32_t>(best);
      loss[i] = detail::sample_ce(z, classes, t, label_smoothing);
    }
  });
  double sum_loss = 0.0, top1 = 0.0, top5 = 0.0;
  for (std::int64_t i = 0; i < batch; ++i) {
    sum_loss += loss[i];
    top1 += rank[i] == 0;
    top5 += rank[i] < 5;
  }
  result[0] = static_cast<float>(result[0] + sum_loss);
  result[1] += static_cast<float>(top1);
  result[2] += static_cast<float>(top5);
  result[3] += static_cast<float>(batch);
}

}  // namespace renaissance::cpu
