// Replaced by the CPU kernels (issue 3).
namespace renaissance::cpu { int kernels_placeholder() { return 0; } }
