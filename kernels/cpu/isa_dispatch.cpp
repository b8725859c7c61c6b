// The public element-wise kernels of batchnorm.h and elementwise.h: each calls its variant for vector_isa() (isa.h).
#include <kernels/cpu/batchnorm.h>
#include <kernels/cpu/elementwise.h>
#include <kernels/cpu/isa.h>

namespace renaissance::cpu {

// The variants' declarations: the same functions in each level's namespace.
namespace isa_generic {
#include <kernels/cpu/batchnorm_api.inc>
#include <kernels/cpu/elementwise_api.inc>
}  // namespace isa_generic
#ifdef RN_HAVE_ISA_VARIANTS
namespace isa_avx2 {
#include <kernels/cpu/batchnorm_api.inc>
#include <kernels/cpu/elementwise_api.inc>
}  // namespace isa_avx2
namespace isa_avx512 {
#include <kernels/cpu/batchnorm_api.inc>
#include <kernels/cpu/elementwise_api.inc>
}  // namespace isa_avx512
#define RN_ISA_CALL(fn, ...)                                    \
  switch (vector_isa()) {                                       \
    case VectorIsa::Avx512: return isa_avx512::fn(__VA_ARGS__); \
    case VectorIsa::Avx2: return isa_avx2::fn(__VA_ARGS__);     \
    case VectorIsa::Generic: break;                             \
  }                                                             \
  return isa_generic::fn(__VA_ARGS__)
#else
#define RN_ISA_CALL(fn, ...) return isa_generic::fn(__VA_ARGS__)
#endif

// ---- batchnorm.h ----

void batchnorm_forward_train(const float* x, const Shape& s, const float* gamma, const float* beta, float* y,
                             float* save_mean, float* save_invstd, float* running_mean, float* running_var,
                             float momentum, float eps) {
  RN_ISA_CALL(batchnorm_forward_train, x, s, gamma, beta, y, save_mean, save_invstd, running_mean, running_var,
              momentum, eps);
}

void batchnorm_forward_inference(const float* x, const Shape& s, const float* gamma, const float* beta,
                                 const float* running_mean, const float* running_var, float* y, float eps) {
  RN_ISA_CALL(batchnorm_forward_inference, x, s, gamma, beta, running_mean, running_var, y, eps);
}

void batchnorm_backward(const float* x, const float* dy, const Shape& s, const float* gamma, const float* save_mean,
                        const float* save_invstd, float* dx, float* dgamma, float* dbeta, bool accumulate_dx,
                        bool accumulate_params) {
  RN_ISA_CALL(batchnorm_backward, x, dy, s, gamma, save_mean, save_invstd, dx, dgamma, dbeta, accumulate_dx,
              accumulate_params);
}

void batchnorm_train_statistics(const float* x, const Shape& s, float* save_mean, float* save_invstd,
                                float* running_mean, float* running_var, float momentum, float eps) {
  RN_ISA_CALL(batchnorm_train_statistics, x, s, save_mean, save_invstd, running_mean, running_var, momentum, eps);
}

void batchnorm_apply_fused(const BnApply& a, const Shape& s, BnShortcut kind, const float* shortcut, const BnApply* b,
                           bool relu, bool round_f16, float* y) {
  RN_ISA_CALL(batchnorm_apply_fused, a, s, kind, shortcut, b, relu, round_f16, y);
}

void batchnorm_relu_backward(const float* x, const float* dy, const Shape& s, const float* gamma, const float* beta,
                             const float* save_mean, const float* save_invstd, bool round_f16, float* dx, float* dgamma,
                             float* dbeta, bool accumulate_dx, bool accumulate_params) {
  RN_ISA_CALL(batchnorm_relu_backward, x, dy, s, gamma, beta, save_mean, save_invstd, round_f16, dx, dgamma, dbeta,
              accumulate_dx, accumulate_params);
}

// ---- elementwise.h ----

void relu_forward(const float* x, float* y, std::int64_t n) { RN_ISA_CALL(relu_forward, x, y, n); }

void relu_backward(const float* y, const float* dy, float* dx, std::int64_t n, bool accumulate) {
  RN_ISA_CALL(relu_backward, y, dy, dx, n, accumulate);
}

void relu_backward_sum(const float* y, const float* dy, const float* addend, float* dx, std::int64_t n,
                       bool round_f16) {
  RN_ISA_CALL(relu_backward_sum, y, dy, addend, dx, n, round_f16);
}

void tanh_forward(const float* x, float* y, std::int64_t n) { RN_ISA_CALL(tanh_forward, x, y, n); }

void tanh_backward(const float* y, const float* dy, float* dx, std::int64_t n, bool accumulate) {
  RN_ISA_CALL(tanh_backward, y, dy, dx, n, accumulate);
}

void activation_forward(ops::Activation a, const float* x, float* y, std::int64_t n) {
  RN_ISA_CALL(activation_forward, a, x, y, n);
}

void activation_backward(ops::Activation a, const float* x, const float* dy, float* dx, std::int64_t n,
                         bool accumulate) {
  RN_ISA_CALL(activation_backward, a, x, dy, dx, n, accumulate);
}

void add2_forward(const float* a, const float* b, float* y, std::int64_t n) { RN_ISA_CALL(add2_forward, a, b, y, n); }

void channel_pad_forward(const float* x, std::int64_t rows, std::int64_t c, std::int64_t c_out, float* y) {
  RN_ISA_CALL(channel_pad_forward, x, rows, c, c_out, y);
}

void channel_pad_backward(const float* dy, std::int64_t rows, std::int64_t c_out, std::int64_t c, float* dx,
                          bool accumulate) {
  RN_ISA_CALL(channel_pad_backward, dy, rows, c_out, c, dx, accumulate);
}

}  // namespace renaissance::cpu
