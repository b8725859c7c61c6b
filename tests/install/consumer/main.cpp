// Uses the installed headers and libraries: one call into renaissance_core.
#include <renaissance/core/dtensor.h>

#include <cstdio>

int main() {
  using namespace renaissance;
  const Shape shape{2, 8, 8, 3};
  const std::int64_t bytes = compute_slot_bytes(shape, DType::F16, Region::I_A_DATA);
  std::printf("compute_slot_bytes = %lld\n", static_cast<long long>(bytes));
  return bytes > 0 ? 0 : 1;
}
