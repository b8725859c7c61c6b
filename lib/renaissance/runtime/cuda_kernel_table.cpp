// The CUDA backend's kernel table: each entry adapts one plan node to the CUDA kernels in kernels/cuda.
// Every `run` only launches on env.stream (no allocation, no synchronisation, no host reads), so it can be
// captured into a CUDA graph; descriptors, algorithm choices and LARS tables are made in `prepare`.
#include <renaissance/runtime/cuda_adapters.h>

namespace renaissance::runtime {

namespace cuda_backend {
namespace {

// ---- COMPUTE ops ---------------------------------------------------------------------------------------

void register_compute(KernelTable& t) {
  t.add_compute(
      OpKind::CONV_FWD,
      [](const ResolvedNode& r, ExecEnv& env) {
        const float* bias = r.in.size() > 2 ? r.in[2].as<const float>() : nullptr;
        state_of<cuda::ConvOp>(r)->forward(stream_of(env), ref(r.in[0]), r.in[1].ptr, bias, ref(r.out[0]),
                                           workspace(env));
      },
      prepare_conv(0, false, 0, true, cuda::ConvPass::Forward));
  t.add_compute(
      OpKind::CONV_BWD_DATA,
      [](const ResolvedNode& r, ExecEnv& env) {
        state_of<cuda::ConvOp>(r)->backward_data(stream_of(env), ref(r.in[0]), r.in[1].ptr, ref(r.out[0]),
                                                 r.node->accumulate, workspace(env));
      },
      prepare_conv(0, true, 0, false, cuda::ConvPass::BackwardData));
  t.add_compute(
      OpKind::CONV_BWD_FILTER,
      [](const ResolvedNode& r, ExecEnv& env) {
        float* db = r.out.size() > 1 ? r.out[1].as<float>() : nullptr;
        state_of<cuda::ConvOp>(r)->backward_filter(stream_of(env), ref(r.in[0]), ref(r.in[1]), r.out[0].ptr, db,
                                                   r.node->accumulate, workspace(env));
      },
      prepare_conv(0, false, 1, false, cuda::ConvPass::BackwardFilter));
  t.add_compute(
      OpKind::BN_FWD_TRAIN,
      [](const ResolvedNode& r, ExecEnv& env) {
        cuda::SyncReduce sync;
        cuda::batchnorm_forward_train(stream_of(env), ref(r.in[0]), r.in[1].as<const float>(),
                                      r.in[2].as<const float>(), hyper_slot(r.in[3], plan::kHyperBnEps), ref(r.out[0]),
                                      r.out[1].as<float>(), r.out[2].as<float>(), r.out[3].as<float>(), env.workspace,
                                      static_cast<std::size_t>(env.workspace_bytes), sync_of(r.in[0], env, sync));
      },
      need_bn_workspace());
  t.add_compute(OpKind::BN_APPLY, [](const ResolvedNode& r, ExecEnv& env) {  // a recomputed BN output
    cuda::batchnorm_apply_fused(stream_of(env), false, bn_apply_of(r), cuda::Shortcut::kNone, cuda::TensorRef{},
                                nullptr, false, ref(r.out[0]));
  });
  t.add_compute(OpKind::BN_FWD_INFER, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::batchnorm_forward_inference(stream_of(env), ref(r.in[0]), r.in[1].as<const float>(),
                                      r.in[2].as<const float>(), r.in[3].as<const float>(), r.in[4].as<const float>(),
                                      hyper_slot(r.in[5], plan::kHyperBnEps), ref(r.out[0]));
  });
  t.add_compute(
      OpKind::BN_BWD,
      [](const ResolvedNode& r, ExecEnv& env) {
        cuda::SyncReduce sync;
        cuda::batchnorm_backward(stream_of(env), ref(r.in[0]), ref(r.in[1]), r.in[2].as<const float>(),
                                 r.in[3].as<const float>(), r.in[4].as<const float>(), ref(r.out[0]),
                                 r.node->accumulate, r.out[1].as<float>(), r.out[2].as<float>(), env.workspace,
                                 static_cast<std::size_t>(env.workspace_bytes), sync_of(r.in[0], env, sync));
      },
      need_bn_workspace());
  t.add_compute(OpKind::RELU_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::relu_forward(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::RELU_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::relu_backward(stream_of(env), ref(r.in[0]), ref(r.in[1]), ref(r.out[0]), r.node->accumulate);
  });
  t.add_compute(OpKind::TANH_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::tanh_forward(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::TANH_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::tanh_backward(stream_of(env), ref(r.in[0]), ref(r.in[1]), ref(r.out[0]), r.node->accumulate);
  });
  for (const ops::Activation a : ops::kActivations) {  // ops/activations.h: the backward reads x
    t.add_compute(plan::activation_op(a, false), [a](const ResolvedNode& r, ExecEnv& env) {
      cuda::activation_forward(a, stream_of(env), ref(r.in[0]), ref(r.out[0]));
    });
    t.add_compute(plan::activation_op(a, true), [a](const ResolvedNode& r, ExecEnv& env) {
      cuda::activation_backward(a, stream_of(env), ref(r.in[0]), ref(r.in[1]), ref(r.out[0]), r.node->accumulate);
    });
  }
  t.add_compute(OpKind::MAXPOOL_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    using O = ops::MaxPoolFwd;
    cuda::maxpool2d_forward(stream_of(env), ref(r.in[O::kX]), ref(r.out[O::kY]), ref(r.out[O::kArgmax]),
                            pool_params(*r.node));
  });
  t.add_compute(OpKind::MAXPOOL_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    using O = ops::MaxPoolBwd;
    cuda::maxpool2d_backward(stream_of(env), ref(r.in[O::kDy]), ref(r.in[O::kArgmax]), ref(r.out[O::kDx]),
                             pool_params(*r.node), r.node->accumulate);
  });
  t.add_compute(OpKind::GAP_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::global_avgpool_forward(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::GAP_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::global_avgpool_backward(stream_of(env), ref(r.in[0]), ref(r.out[0]), r.node->accumulate);
  });
  t.add_compute(OpKind::FLATTEN_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::tensor_copy(stream_of(env), ref(r.in[0]), ref(r.out[0]), false);
  });
  t.add_compute(OpKind::FLATTEN_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::tensor_copy(stream_of(env), ref(r.in[0]), ref(r.out[0]), r.node->accumulate);
  });
  t.add_compute(OpKind::ACCUMULATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::accumulate(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::COPY, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in[0].dtype == r.out[0].dtype, "COPY between tensors of different dtypes");
    if (r.in[0].dtype == DType::I32 || r.in[0].dtype == DType::I8 || r.in[0].dtype == DType::U8)
      cuda::range_copy(stream_of(env), r.out[0].ptr, r.in[0].ptr,
                       static_cast<std::size_t>(r.in[0].elems()) * dtype_size(r.in[0].dtype));
    else
      cuda::tensor_copy(stream_of(env), ref(r.in[0]), ref(r.out[0]), false);
  });
  t.add_compute(
      OpKind::FC_FWD,
      [](const ResolvedNode& r, ExecEnv& env) {
        state_of<cuda::FcOp>(r)->forward(stream_of(env), ref(r.in[0]), r.in[1].ptr, r.in[2].as<const float>(),
                                         ref(r.out[0]), workspace(env));
      },
      [](ResolvedNode& r, ExecEnv& env) { r.state = make_fc(r.in[0], r.out[0], env); });
  t.add_compute(
      OpKind::FC_BWD_DATA,
      [](const ResolvedNode& r, ExecEnv& env) {
        state_of<cuda::FcOp>(r)->backward_data(stream_of(env), ref(r.in[0]), r.in[1].ptr, ref(r.out[0]),
                                               r.node->accumulate, workspace(env));
      },
      // x of this FC is dx (an output here), y is dy (input 0).
      [](ResolvedNode& r, ExecEnv& env) { r.state = make_fc(r.out[0], r.in[0], env); });
  t.add_compute(
      OpKind::FC_BWD_WEIGHT,
      [](const ResolvedNode& r, ExecEnv& env) {
        state_of<cuda::FcOp>(r)->backward_weights(stream_of(env), ref(r.in[0]), ref(r.in[1]), r.out[0].ptr,
                                                  r.out[1].as<float>(), r.node->accumulate, workspace(env));
      },
      [](ResolvedNode& r, ExecEnv& env) { r.state = make_fc(r.in[0], r.in[1], env); });
  t.add_compute(
      OpKind::SOFTMAX_CE_FWD,
      [](const ResolvedNode& r, ExecEnv& env) {
        cuda::softmax_ce_forward(stream_of(env), ref(r.in[0]), r.in[1].as<const std::int32_t>(),
                                 hyper_slot(r.in[2], plan::kHyperLabelSmoothing), ref(r.out[0]), r.out[1].as<float>(),
                                 env.workspace, static_cast<std::size_t>(env.workspace_bytes), cenv(env).label_errors);
      },
      need_workspace([](const ResolvedNode& r) { return cuda::softmax_ce_workspace_bytes(r.in[0].shape.n); }));
  t.add_compute(OpKind::SOFTMAX_CE_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::softmax_ce_backward(stream_of(env), ref(r.in[0]), r.in[1].as<const std::int32_t>(),
                              hyper_slot(r.in[2], plan::kHyperLabelSmoothing), r.in[3].as<const float>(), ref(r.out[0]),
                              r.node->accumulate, cenv(env).label_errors);
  });
  t.add_compute(OpKind::CHANNEL_PAD_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::channel_pad_forward(stream_of(env), ref(r.in[0]), ref(r.out[0]));
  });
  t.add_compute(OpKind::CHANNEL_PAD_BWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::channel_pad_backward(stream_of(env), ref(r.in[0]), ref(r.out[0]), r.node->accumulate);
  });
  t.add_compute(OpKind::ADD2_FWD, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::add2_forward(stream_of(env), ref(r.in[0]), ref(r.in[1]), ref(r.out[0]));
  });
  t.add_compute(
      OpKind::METRICS,
      [](const ResolvedNode& r, ExecEnv& env) {
        cuda::range_clear(stream_of(env), r.out[0].ptr, plan::kResultSlots * sizeof(float));
        cuda::batch_metrics(stream_of(env), ref(r.in[0]), r.in[1].as<const std::int32_t>(), 0.0f, r.out[0].as<float>(),
                            r.out[1].as<std::int32_t>(), env.workspace, static_cast<std::size_t>(env.workspace_bytes),
                            cenv(env).label_errors);
      },
      need_workspace([](const ResolvedNode& r) { return cuda::metrics_workspace_bytes(r.in[0].shape.n); }));
  for (OpKind k : {OpKind::FUSED_FWD, OpKind::FUSED_BWD, OpKind::FUSED_INFER})
    t.add_compute(k, run_fused, prepare_fused);
}

// ---- RANGE ops ------------------------------------------------------------------------------------------

float* f(const RangeView& v) { return reinterpret_cast<float*>(v.ptr); }
std::int64_t floats(const RangeView& v) { return v.bytes / 4; }
const cuda::OptimizerScalars* scalars(const ResolvedNode& r) {
  return reinterpret_cast<const cuda::OptimizerScalars*>(r.in[0].ptr);
}
const std::int32_t* skip_flag(const ResolvedNode& r) { return r.in[1].as<const std::int32_t>(); }

/// LARS tables of one weight range: segments (device), chunk count and the norm workspace, shared by the
/// LARS_NORMS and LARS_UPDATE nodes of every variant (same range, same tensors).
struct LarsState {
  cuda::LarsSegment* segments = nullptr;
  std::size_t count = 0;
  std::int64_t chunks = 0;
  void* workspace = nullptr;
  std::size_t workspace_bytes = 0;
};

LarsState& lars_state(const RangeView& w) {
  static std::mutex mu;
  static std::map<const std::byte*, LarsState> states;  // start-up only; the device buffers live as long as the process
  std::lock_guard<std::mutex> lock(mu);
  LarsState& s = states[w.ptr];
  if (s.segments) return s;
  std::vector<cuda::LarsSegment> host;
  for (const Segment& seg : w.segments) host.push_back({seg.offset / 4, seg.elems});
  s.count = host.size();
  s.chunks = cuda::lars_num_chunks(host.data(), host.size());
  const auto table_bytes = static_cast<std::int64_t>(std::max<std::size_t>(host.size(), 1) * sizeof(cuda::LarsSegment));
  s.segments = static_cast<cuda::LarsSegment*>(cuda::device_alloc(table_bytes, "the LARS segment table"));
  if (!host.empty())
    cuda::copy_h2d(s.segments, host.data(), static_cast<std::int64_t>(host.size() * sizeof(cuda::LarsSegment)));
  s.workspace_bytes = std::max<std::size_t>(cuda::lars_workspace_bytes(s.chunks), 256);
  s.workspace = cuda::device_alloc(static_cast<std::int64_t>(s.workspace_bytes), "the LARS norm workspace");
  return s;
}

void register_range(KernelTable& t) {
  t.add_range(RangeOp::H2D_COPY, [](const ResolvedNode& r, ExecEnv& env) {
    const RangeView& dst = r.out_ranges[0];
    const int buffer = dst.range.first == Region::I_A_LABEL ? 0 : 1;
    RN_CHECK(env.host_input[buffer] != nullptr, "TRANSFER_{}: no host input buffer", buffer == 0 ? 'A' : 'B');
    cuda::copy_h2d_async(dst.ptr, env.host_input[buffer], dst.bytes, env.stream);
  });
  t.add_range(RangeOp::CLEAR, [](const ResolvedNode& r, ExecEnv& env) {
    for (const RangeView& o : r.out_ranges) cuda::range_clear(stream_of(env), o.ptr, static_cast<std::size_t>(o.bytes));
  });
  auto copy = [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "D2D copy between ranges of different sizes");
    cuda::range_copy(stream_of(env), r.out_ranges[0].ptr, r.in_ranges[0].ptr,
                     static_cast<std::size_t>(r.in_ranges[0].bytes));
  };
  t.add_range(RangeOp::D2D_COPY, copy);
  t.add_range(RangeOp::EMA_SWITCH, copy);
  t.add_range(RangeOp::CAST_F32_TO_F16, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in_ranges[0].bytes == 2 * r.out_ranges[0].bytes, "FP32 → FP16 cast ranges are not 2:1");
    cuda::range_cast_f32_to_f16(stream_of(env), f(r.in_ranges[0]),
                                reinterpret_cast<std::uint16_t*>(r.out_ranges[0].ptr), r.out_ranges[0].bytes / 2);
  });
  t.add_range(RangeOp::CAST_F16_TO_F32, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(2 * r.in_ranges[0].bytes == r.out_ranges[0].bytes, "FP16 → FP32 cast ranges are not 1:2");
    cuda::range_cast_f16_to_f32(stream_of(env), reinterpret_cast<const std::uint16_t*>(r.in_ranges[0].ptr),
                                f(r.out_ranges[0]), r.in_ranges[0].bytes / 2);
  });
  t.add_range(RangeOp::SGD_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::sgd_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), floats(r.in_ranges[0]), scalars(r),
                     r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::MOMENTUM_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::momentum_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]),
                          floats(r.in_ranges[0]), scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::NESTEROV_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::nesterov_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]),
                          floats(r.in_ranges[0]), scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::ADAM_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::adam_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), f(r.in_ranges[3]),
                      floats(r.in_ranges[0]), scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  t.add_range(RangeOp::ADAMW_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::adamw_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), f(r.in_ranges[3]),
                       floats(r.in_ranges[0]), scalars(r), r.node->apply_weight_decay, skip_flag(r));
  });
  auto lars_prepare = [](ResolvedNode& r, ExecEnv&) { lars_state(r.in_ranges[0]); };
  t.add_range(
      RangeOp::LARS_NORMS,
      [](const ResolvedNode& r, ExecEnv& env) {
        LarsState& s = lars_state(r.in_ranges[0]);
        cuda::lars_norms(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), s.segments, s.count, s.chunks,
                         s.workspace, s.workspace_bytes);
      },
      lars_prepare);
  t.add_range(
      RangeOp::LARS_UPDATE,
      [](const ResolvedNode& r, ExecEnv& env) {
        LarsState& s = lars_state(r.in_ranges[0]);
        const RangeView& n = r.in_ranges[3];
        const std::int64_t stride = n.segments.size() > 1 ? (n.segments[1].offset - n.segments[0].offset) / 4 : 2;
        cuda::lars_update(stream_of(env), f(r.in_ranges[0]), f(r.in_ranges[1]), f(r.in_ranges[2]), s.segments, s.count,
                          s.chunks, scalars(r), r.node->apply_weight_decay, skip_flag(r), s.workspace,
                          s.workspace_bytes, f(n), stride);
      },
      lars_prepare);
  t.add_range(RangeOp::EMA_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "EMA range differs from the master range");
    cuda::range_ema_update(stream_of(env), f(r.out_ranges[0]), f(r.in_ranges[0]), floats(r.in_ranges[0]),
                           hyper_slot(r.in[0], plan::kHyperEmaDecay), skip_flag(r));
  });
  // One GPU: nothing to reduce. Several: the communicator (NCCL, lib/renaissance/comm) enqueues one all-reduce per
  // range on the compute stream, so the capture of DEEP_COMM/FIRST_COMM/... holds the collective (DESIGN §9).
  // Bucket 1 (DEEP_COMM, replayed on the side stream) goes through the side lane's communicator, everything else
  // through the compute stream's (runtime/collectives.h), so bucket 2 never queues behind bucket 1.
  auto allreduce = [](const ResolvedNode& r, ExecEnv& env, bool mean) {
    if (!env.comm || env.comm->world_size() == 1) return;
    const int lane = comm_lane(*r.node);
    for (const RangeView& v : r.out_ranges)
      if (floats(v) > 0) env.comm->allreduce_device_lane(lane, f(v), floats(v), mean, env.stream);
  };
  t.add_range(RangeOp::ALLREDUCE_MEAN, [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, true); });
  t.add_range(RangeOp::ALLREDUCE_SUM, [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, false); });
  // Running statistics use the mean over ranks of the per-rank batch statistics.
  t.add_range(RangeOp::BN_STATS_ALLREDUCE,
              [allreduce](const ResolvedNode& r, ExecEnv& env) { allreduce(r, env, true); });
  t.add_range(RangeOp::BN_RUNNING_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    RN_CHECK(r.in_ranges[0].bytes == r.out_ranges[0].bytes, "BN running/batch statistics ranges differ");
    cuda::range_bn_running_update(stream_of(env), f(r.out_ranges[0]), f(r.in_ranges[0]), floats(r.out_ranges[0]),
                                  hyper_slot(r.in[0], plan::kHyperBnMomentum), skip_flag(r));
  });
  t.add_range(RangeOp::NAN_CHECK, [](const ResolvedNode& r, ExecEnv& env) {
    std::int32_t* flag = r.in[0].as<std::int32_t>();
    cuda::range_clear(stream_of(env), flag, sizeof(std::int32_t));
    for (const RangeView& v : r.in_ranges) cuda::range_mark_nonfinite(stream_of(env), f(v), floats(v), flag);
  });
  t.add_range(RangeOp::GRAD_SCALE, [](const ResolvedNode& r, ExecEnv& env) {
    for (const RangeView& v : r.out_ranges)
      cuda::range_grad_scale(stream_of(env), f(v), floats(v), r.in[0].as<const float>() + plan::kLossScale,
                             r.in[1].as<const std::int32_t>());
  });
  t.add_range(RangeOp::LOSS_SCALE_UPDATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::loss_scale_update(stream_of(env), r.in[0].as<float>(), r.in[1].as<const std::int32_t>());
  });
  t.add_range(RangeOp::METRIC_ACCUMULATE, [](const ResolvedNode& r, ExecEnv& env) {
    cuda::range_metric_accumulate(stream_of(env), f(r.out_ranges[0]), f(r.in_ranges[0]), plan::kResultSlots);
  });
}

}  // namespace
}  // namespace cuda_backend

void register_cuda_ops(KernelTable& t) {
  t.backend = Backend::CUDA;
  cuda_backend::register_compute(t);
  cuda_backend::register_range(t);
}

}  // namespace renaissance::runtime
