// The CUDA backend's adapters (internal to runtime/cuda_*.cpp): what turns a resolved plan node into the arguments of
// a kernel in kernels/cuda (tensor references, parameters, workspaces, prepared state) and the synchronised-BN
// reductions. The kernel table is runtime/cuda_kernel_table.cpp, the fused layers runtime/cuda_fused.cpp, the session
// (streams, events, workspaces) runtime/cuda_session.cpp.
#pragma once

#include <renaissance/core/error.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/collectives.h>
#include <renaissance/runtime/executor.h>
#include <renaissance/runtime/memory_guard.h>

#include <kernels/cuda/batchnorm.h>
#include <kernels/cuda/common.h>
#include <kernels/cuda/conv.h>
#include <kernels/cuda/dnn_handles.h>
#include <kernels/cuda/elementwise.h>
#include <kernels/cuda/fc.h>
#include <kernels/cuda/metrics.h>
#include <kernels/cuda/optimizer.h>
#include <kernels/cuda/pooling.h>
#include <kernels/cuda/range_ops.h>
#include <kernels/cuda/runtime_api.h>
#include <kernels/cuda/softmax_ce.h>
#include <renaissance/ops/pool.h>

#include <renaissance/core/log.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>

namespace renaissance::runtime::cuda_backend {

using plan::OpKind;
using plan::RangeOp;

/// What the CUDA ops share besides the stream: the library handles and a device error counter.
struct CudaEnv {
  cuda::DnnHandles* dnn = nullptr;
  cuda::DnnHandles* wgrad_dnn = nullptr;  ///< the weight-gradient convolutions' own cuDNN handle (their stream's)
  std::int32_t* label_errors = nullptr;   ///< labels outside [0, classes) seen on the device
};

inline CudaEnv& cenv(const ExecEnv& env) { return *static_cast<CudaEnv*>(env.dnn); }
inline cudaStream_t stream_of(const ExecEnv& env) { return static_cast<cudaStream_t>(env.stream); }

inline cuda::TensorRef ref(const TensorView& v) {
  cuda::TensorRef r;
  r.ptr = v.ptr;
  r.shape = v.shape;
  r.dtype = v.dtype;
  r.c_stride = v.strides[2];
  return r;
}

inline cuda::Workspace workspace(const ExecEnv& env) {
  return cuda::Workspace{env.workspace, static_cast<std::size_t>(env.workspace_bytes)};
}

template <typename T>
T* state_of(const ResolvedNode& r) {
  return static_cast<T*>(r.state.get());
}

inline cuda::ConvParams conv_params(const plan::Node& n) {
  const plan::ConvParams& p = std::get<plan::ConvParams>(n.params);
  cuda::ConvParams c;
  c.kernel_h = c.kernel_w = static_cast<int>(p.k);
  c.stride_h = c.stride_w = static_cast<int>(p.stride);
  c.pad_h = c.pad_w = static_cast<int>(p.pad);
  c.groups = static_cast<int>(p.groups);
  return c;
}

inline cuda::Pool2dParams pool_params(const plan::Node& n) {
  const plan::PoolParams& p = std::get<plan::PoolParams>(n.params);
  cuda::Pool2dParams c;
  c.kernel_h = c.kernel_w = static_cast<int>(p.k);
  c.stride_h = c.stride_w = static_cast<int>(p.stride);
  c.pad_h = c.pad_w = static_cast<int>(p.pad);
  return c;
}

inline const char* pass_label(cuda::ConvPass p) {
  switch (p) {
    case cuda::ConvPass::Forward: return "fwd";
    case cuda::ConvPass::BackwardData: return "dgrad";
    case cuda::ConvPass::BackwardFilter: return "wgrad";
  }
  return "?";
}

/// A ConvOp for x → y and the one pass (and accumulate mode) this node runs, its engine chosen once: the graph API's
/// candidates (or the legacy fallback) timed on the node's own arena tensors, which hold nothing yet at start-up
/// (a pass writes only its own output). Deterministic mode falls back, with a warning, to a non-deterministic engine
/// when cuDNN has no deterministic one for a shape.
inline PrepareFn prepare_conv(int x_index_in, bool x_is_output, int y_index_in, bool y_is_output, cuda::ConvPass pass) {
  return [=](ResolvedNode& r, ExecEnv& env) {
    const TensorView& x =
        x_is_output ? r.out[static_cast<std::size_t>(x_index_in)] : r.in[static_cast<std::size_t>(x_index_in)];
    const TensorView& y =
        y_is_output ? r.out[static_cast<std::size_t>(y_index_in)] : r.in[static_cast<std::size_t>(y_index_in)];
    cuda::ConvSpec spec;
    spec.x = x.shape;
    spec.x_c_stride = x.strides[2];
    spec.y = y.shape;
    spec.y_c_stride = y.strides[2];
    spec.params = conv_params(*r.node);
    spec.dtype = x.dtype;
    auto op = std::make_shared<cuda::ConvOp>(spec);
    const auto ws = static_cast<std::size_t>(env.workspace_bytes);
    // The pass's own tensors: x (dx), w (dw), y (dy).
    cuda::ConvTensors t;
    t.x = x.ptr;
    t.y = y.ptr;
    t.w = pass == cuda::ConvPass::BackwardFilter ? r.out[0].ptr : r.in[1].ptr;
    // Weight-gradient convolutions may run on the second compute stream: they get that stream's handle.
    cuda::DnnHandles& handles =
        pass == cuda::ConvPass::BackwardFilter && cenv(env).wgrad_dnn ? *cenv(env).wgrad_dnn : *cenv(env).dnn;
    const bool acc = r.node->accumulate;
    auto choose = [&](bool deterministic) {
      cuda::ConvChoose how;
      how.deterministic = deterministic;
      how.engine = static_cast<cuda::ConvEngine>(env.conv_api);
      how.own = env.own_kernels == 0   ? cuda::OwnKernels::Off
                : env.own_kernels == 2 ? cuda::OwnKernels::Always
                                       : cuda::OwnKernels::Timed;
      how.tensors = &t;
      op->choose(handles, env.workspace, ws, how, cuda::conv_pass_bit(pass, acc));
    };
    try {
      choose(env.deterministic);
    } catch (const Error& e) {
      if (!env.deterministic) throw;
      spdlog::warn("{}; using a non-deterministic engine for this layer", e.what());
      choose(false);
    }
    RN_CHECK(op->workspace_bytes() <= ws, "convolution needs a {} byte workspace but {} were allocated",
             op->workspace_bytes(), ws);
    // A fused layer holds several convolutions: the shapes tell them apart.
    const cuda::ConvParams& cp = spec.params;
    r.detail = fmt::format("{} {}{} {}x{}x{}>{} k{}s{}{} [{}]", r.layer.empty() ? "conv" : r.layer, pass_label(pass),
                           acc ? "+acc" : "", spec.x.h, spec.x.w, spec.x.c, spec.y.c, cp.kernel_h, cp.stride_h,
                           cp.groups > 1 ? fmt::format("g{}", cp.groups) : "", op->engine_label(pass, acc));
    r.state = op;
  };
}

/// An FcOp for x (N, in...) → y (N, 1, 1, out); its algorithm chosen once.
inline std::shared_ptr<cuda::FcOp> make_fc(const TensorView& x, const TensorView& y, ExecEnv& env) {
  cuda::FcSpec spec;
  spec.batch = x.shape.n;
  spec.in = x.shape.per_sample();
  spec.out = y.shape.c;
  spec.x_ld = x.shape.h * x.shape.w == 1 ? x.strides[2] : 0;
  spec.y_ld = y.strides[2];
  spec.dtype = x.dtype;
  auto op = std::make_shared<cuda::FcOp>(spec);
  op->choose(*cenv(env).dnn, static_cast<std::size_t>(env.workspace_bytes), env.deterministic);
  return op;
}

/// Checks at prepare time that a kernel's scratch fits the one workspace.
inline PrepareFn need_workspace(std::function<std::size_t(const ResolvedNode&)> bytes) {
  return [bytes](ResolvedNode& r, ExecEnv& env) {
    const std::size_t b = bytes(r);
    RN_CHECK(b <= static_cast<std::size_t>(env.workspace_bytes),
             "{} needs a {} byte workspace but {} were allocated (raise TrainOptions::workspace_mib)",
             plan::op_kind_name(r.node->op), b, env.workspace_bytes);
  };
}

inline const float* hyper_slot(const TensorView& hyper, int slot) { return hyper.as<const float>() + slot; }

// ---- synchronised BatchNorm (--sync-bn, DESIGN §9) ------------------------------------------------------
// The statistics of the global batch: the BN kernels' per-channel sums are summed over the ranks by an ncclAllReduce
// on the launch's stream (the compute stream's communicator), so the capture of the step holds it. What each rank
// reduces and in which order: runtime/collectives.h (sync_bn_reductions), the same for every rank.

inline bool sync_bn_active(const ExecEnv& env) { return env.sync_bn && env.comm && env.comm->world_size() > 1; }

/// The SyncReduce of a BN node with input `x`, or nullptr without --sync-bn (or with one rank).
inline const cuda::SyncReduce* sync_of(const TensorView& x, ExecEnv& env, cuda::SyncReduce& storage) {
  if (!sync_bn_active(env)) return nullptr;
  Communicator* comm = env.comm;
  void* stream = env.stream;
  storage.sum = [comm, stream](float* data, std::int64_t count) {
    comm->allreduce_device_lane(kLaneCompute, data, count, false, stream);
  };
  storage.global_rows = sync_bn_global_rows(x, comm->world_size());
  return &storage;
}

inline std::size_t bn_workspace_bytes(const ResolvedNode& r, const ExecEnv& env) {
  return sync_bn_active(env) ? cuda::batchnorm_sync_workspace_bytes(ref(r.in[0]))
                             : cuda::batchnorm_workspace_bytes(ref(r.in[0]));
}

inline PrepareFn need_bn_workspace() {
  return [](ResolvedNode& r, ExecEnv& env) {
    const std::size_t b = bn_workspace_bytes(r, env);
    RN_CHECK(b <= static_cast<std::size_t>(env.workspace_bytes),
             "{} needs a {} byte workspace but {} were allocated (raise TrainOptions::workspace_mib)",
             plan::op_kind_name(r.node->op), b, env.workspace_bytes);
  };
}

// ---- fused layers (runtime/cuda_fused.cpp) -------------------------------------------------------------------
/// Runs a FUSED_* node as its prepared program (fused element-wise tails, the shortcut branch on its own stream).
void run_fused(const ResolvedNode& r, ExecEnv& env);
/// Matches a FUSED_* node's parts against the fused kernels and prepares the shortcut branch.
void prepare_fused(ResolvedNode& r, ExecEnv& env);
/// The normalisation a BN node applies (BN_FWD_TRAIN: its batch statistics; BN_APPLY: the forward's, as inputs;
/// BN_FWD_INFER: the running statistics).
cuda::BnApply bn_apply_of(const ResolvedNode& bn);

}  // namespace renaissance::runtime::cuda_backend
