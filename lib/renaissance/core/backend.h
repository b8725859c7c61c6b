// Backend: where a plan runs. In core so that runtime and comm (which never include each other, DESIGN §12) name it.
#pragma once

#include <cstdint>

namespace renaissance {

enum class Backend : std::uint8_t { CPU, CUDA };
inline const char* backend_name(Backend b) { return b == Backend::CPU ? "cpu" : "cuda"; }

}  // namespace renaissance
