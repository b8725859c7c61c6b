#include <renaissance/core/philox.h>

#include <cmath>

namespace renaissance {

float PhiloxStream::normal() {
  // Box-Muller on two uniforms in (0, 1]; deterministic because it always consumes exactly two draws.
  const float u1 = 1.0f - uniform();
  const float u2 = uniform();
  return std::sqrt(-2.0f * std::log(u1)) * std::cos(6.28318530717958647692f * u2);
}

}  // namespace renaissance
