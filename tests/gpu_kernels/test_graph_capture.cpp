// Graph-capture safety: a step-like sequence of every launcher kind (element-wise, BN forward/backward, pooling,
// loss, metrics, NaN check, grad scaling, optimizers, LARS, loss-scale update, EMA, casts, clears, copies) captured
// into a CUDA graph under cudaStreamCaptureModeGlobal (any synchronising or unsafe call inside a launcher fails the
// capture), then replayed from the same initial arena: the result must equal direct execution byte for byte.
#include "gpu_test_util.h"

#include <kernels/cuda/batchnorm.h>
#include <kernels/cuda/elementwise.h>
#include <kernels/cuda/metrics.h>
#include <kernels/cuda/optimizer.h>
#include <kernels/cuda/pooling.h>
#include <kernels/cuda/range_ops.h>
#include <kernels/cuda/runtime_api.h>
#include <kernels/cuda/softmax_ce.h>

namespace renaissance::cuda::ktest {
namespace {

class GraphCaptureTest : public GpuTest {};

/// One allocation carved into 256-byte-aligned pieces, like the real arena; snapshots are one copy.
class Arena {
 public:
  explicit Arena(std::size_t bytes) : m_buf(bytes) { m_buf.fill_bytes(0); }
  void* take(std::size_t bytes) {
    void* p = m_buf.as<char>() + m_used;
    m_used += (bytes + 255) / 256 * 256;
    EXPECT_LE(m_used, m_buf.bytes());
    return p;
  }
  template <typename T>
  T* put(const std::vector<T>& v) {
    void* p = take(v.size() * sizeof(T));
    CUDA_CHECK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
    return static_cast<T*>(p);
  }
  TensorRef tensor(Shape s, DType t, std::int64_t cs, const Vec& compact) {
    const std::int64_t rows = s.n * s.h * s.w;
    Vec full(static_cast<std::size_t>(rows * cs), 0.0f);
    for (std::int64_t r = 0; r < rows; ++r)
      for (std::int64_t c = 0; c < s.c; ++c) full[r * cs + c] = compact[r * s.c + c];
    void* p;
    if (t == DType::F32) {
      p = put(full);
    } else {
      std::vector<std::uint16_t> h(full.size());
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = cpu::float_to_half(full[i]);
      p = put(h);
    }
    return TensorRef{p, s, t, cs};
  }
  std::vector<std::uint8_t> snapshot() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<std::uint8_t> v(m_used);
    CUDA_CHECK(cudaMemcpy(v.data(), m_buf.get(), m_used, cudaMemcpyDeviceToHost));
    return v;
  }
  void restore(const std::vector<std::uint8_t>& v) const {
    CUDA_CHECK(cudaMemcpy(m_buf.get(), v.data(), v.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaDeviceSynchronize());
  }

 private:
  DeviceBuffer m_buf;
  std::size_t m_used = 0;
};

TEST_F(GraphCaptureTest, ReplayEqualsDirectExecution) {
  Arena a(64u << 20);
  const Shape fs{8, 9, 7, 13};
  const std::int64_t cs = 16;
  const auto c = static_cast<std::size_t>(fs.c);
  const std::size_t fe = static_cast<std::size_t>(fs.elems());
  const TensorRef x = a.tensor(fs, DType::F16, cs, random_vec(fe, 1, -2.0f, 2.0f));
  const TensorRef y = a.tensor(fs, DType::F16, cs, Vec(fe, 0.0f));
  const TensorRef z = a.tensor(fs, DType::F16, cs, Vec(fe, 0.0f));
  const TensorRef dy = a.tensor(fs, DType::F16, cs, random_vec(fe, 2));
  const TensorRef dx = a.tensor(fs, DType::F16, cs, random_vec(fe, 3));
  float* gamma = a.put(random_vec(c, 4, 0.5f, 1.5f));
  float* beta = a.put(random_vec(c, 5));
  float* mean = a.put(Vec(c, 0.0f));
  float* var = a.put(Vec(c, 0.0f));
  float* invstd = a.put(Vec(c, 0.0f));
  float* dgamma = a.put(Vec(c, 0.0f));
  float* dbeta = a.put(Vec(c, 0.0f));
  float* running = a.put(Vec(2 * c, 1.0f));  // running mean | var, blended with the batch stats
  // hyper: lr .. lars_eta (OptimizerScalars), ema decay, label smoothing, bn momentum, bn eps
  float* hyper = a.put(Vec{0.01f, 0.9f, 0.9f, 0.999f, 1e-8f, 1e-4f, 3.0f, 0.001f, 0.99f, 0.1f, 0.1f, 1e-5f});
  const auto* scalars = reinterpret_cast<const OptimizerScalars*>(hyper);
  const std::size_t bn_ws_bytes = batchnorm_workspace_bytes(x);
  void* bn_ws = a.take(bn_ws_bytes);

  Pool2dParams pp;
  pp.kernel_h = pp.kernel_w = 3;
  pp.pad_h = pp.pad_w = 1;
  const Shape ps = maxpool2d_output_shape(fs, pp);
  const TensorRef pooled = a.tensor(ps, DType::F16, cs, Vec(static_cast<std::size_t>(ps.elems()), 0.0f));
  const TensorRef argmax{a.take(static_cast<std::size_t>(ps.elems())), ps, DType::U8, ps.c};

  const Shape ls{8, 1, 1, 10};
  const TensorRef logits = a.tensor(ls, DType::F16, 16, random_vec(80, 6, -3.0f, 3.0f));
  const TensorRef probs = a.tensor(ls, DType::F32, 10, Vec(80, 0.0f));
  const TensorRef dlogits = a.tensor(ls, DType::F16, 16, Vec(80, 0.0f));
  std::int32_t* labels = a.put(std::vector<std::int32_t>{0, 3, 9, 2, 2, 7, 11, 5});  // 11 is bad: counted
  float* result = a.put(Vec(4, 0.0f));
  float* accumulated = a.put(Vec(4, 0.0f));
  float* loss_scale = a.put(Vec{1024.0f, 0.0f, 2.0f, 2.0f});
  std::int32_t* label_errors = a.put(std::vector<std::int32_t>{0});
  std::int32_t* predicted = a.put(std::vector<std::int32_t>(8, -1));
  const std::size_t sm_ws_bytes = softmax_ce_workspace_bytes(8), mt_ws_bytes = metrics_workspace_bytes(8);
  void* sm_ws = a.take(sm_ws_bytes);
  void* mt_ws = a.take(mt_ws_bytes);

  constexpr std::int64_t kP = 9000;
  float* w = a.put(random_vec(kP, 7));
  float* g = a.put(random_vec(kP, 8, -0.1f, 0.1f));
  float* m1 = a.put(Vec(kP, 0.0f));
  float* m2 = a.put(Vec(kP, 0.0f));
  float* ema = a.put(random_vec(kP, 9));
  float* vel = a.put(Vec(kP, 0.0f));
  auto* w16 = reinterpret_cast<std::uint16_t*>(a.take(kP * 2));
  float* scratch = a.put(random_vec(kP, 10));
  std::int32_t* flag = a.put(std::vector<std::int32_t>{5});
  const std::vector<LarsSegment> segs{{0, 5000}, {5000, 4000}};
  const LarsSegment* dsegs = a.put(segs);
  const std::int64_t chunks = lars_num_chunks(segs.data(), segs.size());
  const std::size_t lars_ws_bytes = lars_workspace_bytes(chunks);
  void* lars_ws = a.take(lars_ws_bytes);
  float* norms = a.put(Vec(4, 0.0f));
  CUDA_CHECK(cudaDeviceSynchronize());

  auto step = [&](cudaStream_t s) {
    relu_forward(s, x, y);
    batchnorm_forward_train(s, y, gamma, beta, hyper + 11, z, mean, var, invstd, bn_ws, bn_ws_bytes);
    batchnorm_backward(s, y, dy, gamma, mean, invstd, dx, true, dgamma, dbeta, bn_ws, bn_ws_bytes);
    relu_backward(s, y, dx, dx, false);
    maxpool2d_forward(s, z, pooled, argmax, pp);
    maxpool2d_backward(s, pooled, argmax, z, pp, true);
    tensor_copy(s, z, y, true);
    softmax_ce_forward(s, logits, labels, hyper + 9, probs, result, sm_ws, sm_ws_bytes, label_errors);
    softmax_ce_backward(s, probs, labels, hyper + 9, loss_scale, dlogits, false, nullptr);
    batch_metrics(s, logits, labels, 0.0f, result, predicted, mt_ws, mt_ws_bytes, label_errors);
    range_metric_accumulate(s, accumulated, result, 4);
    const FloatRange ranges[] = {{g, kP}, {dgamma, static_cast<std::int64_t>(c)}};
    range_check_finite(s, ranges, 2, flag);
    range_grad_scale(s, g, kP, loss_scale, flag);
    loss_scale_update(s, loss_scale, flag);
    adam_update(s, w, g, m1, m2, 5000, scalars, true, flag);
    lars_norms(s, w, g, dsegs, segs.size(), chunks, lars_ws, lars_ws_bytes);
    lars_update(s, w, g, vel, dsegs, segs.size(), chunks, scalars, true, flag, lars_ws, lars_ws_bytes, norms, 2);
    range_ema_update(s, ema, w, kP, hyper + 8, flag);
    range_bn_running_update(s, running, mean, static_cast<std::int64_t>(c), hyper + 10, nullptr);
    range_cast_f32_to_f16(s, w, w16, kP);
    range_copy(s, scratch, ema, kP * 4);
    range_clear(s, m1 + 5000, 4000 * 4);
  };

  const std::vector<std::uint8_t> initial = a.snapshot();
  step(stream);
  sync();
  const std::vector<std::uint8_t> direct = a.snapshot();
  ASSERT_NE(direct, initial);

  a.restore(initial);
  cudaGraph_t graph = nullptr;
  CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  step(stream);
  CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec = nullptr;
  CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  EXPECT_EQ(a.snapshot(), initial) << "capturing must not execute anything";
  for (int replay = 0; replay < 2; ++replay) {
    a.restore(initial);
    CUDA_CHECK(cudaGraphLaunch(exec, stream));
    sync();
    const std::vector<std::uint8_t> replayed = a.snapshot();
    ASSERT_EQ(replayed.size(), direct.size());
    std::size_t first = replayed.size();
    for (std::size_t i = 0; i < replayed.size() && first == replayed.size(); ++i)
      if (replayed[i] != direct[i]) first = i;
    EXPECT_EQ(first, replayed.size()) << "replay " << replay << " differs from direct execution at arena byte "
                                      << first;
  }
  CUDA_CHECK(cudaGraphExecDestroy(exec));
  CUDA_CHECK(cudaGraphDestroy(graph));
}

// The race-hunting delay (RN_DEBUG_STREAM_DELAY uses it) holds back only the stream it is on: a reader on another
// stream that does not wait sees the bytes from before the delayed write, one that waits for an event sees the write.
// So a missing wait becomes a visible difference instead of a rare one.
TEST_F(GraphCaptureTest, StreamDelayExposesAMissingWait) {
  cudaStream_t other = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  cudaEvent_t written = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&written, cudaEventDisableTiming));
  DeviceBuffer buf(4);
  for (const bool wait : {false, true}) {
    std::int32_t seen = -1;
    buf.fill_bytes(0);
    stream_delay(stream, 50000);  // 50 ms
    CUDA_CHECK(cudaMemsetAsync(buf.get(), 0x01, 4, stream));
    CUDA_CHECK(cudaEventRecord(written, stream));
    if (wait) CUDA_CHECK(cudaStreamWaitEvent(other, written, 0));
    CUDA_CHECK(cudaMemcpyAsync(&seen, buf.get(), 4, cudaMemcpyDeviceToHost, other));
    CUDA_CHECK(cudaStreamSynchronize(other));
    sync();
    EXPECT_EQ(seen, wait ? 0x01010101 : 0) << (wait ? "with" : "without") << " the wait";
  }
  CUDA_CHECK(cudaEventDestroy(written));
  CUDA_CHECK(cudaStreamDestroy(other));
}

}  // namespace
}  // namespace renaissance::cuda::ktest
