#pragma once
#include <cstdint>
#include <string>

namespace renaissance::cuda {
/// Number of visible CUDA devices; 0 when there is no driver or no device (never throws).
int device_count();
/// "NVIDIA H200, 139.8 GiB, sm_90" for device `index`.
std::string device_description(int index);
/// Free and total bytes of the current device.
void device_memory(std::int64_t* free_bytes, std::int64_t* total_bytes);
}  // namespace renaissance::cuda
