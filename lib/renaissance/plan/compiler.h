// Compiler: ArchPlan + TrainConfig → six MemoryPlans + the train and inference ComputationGraphs (DESIGN §4).
#pragma once

#include <renaissance/plan/arch_plan.h>
#include <renaissance/plan/compile_spec.h>
#include <renaissance/plan/computation_graph.h>
#include <renaissance/plan/layer_descriptor.h>
#include <renaissance/plan/memory_plan.h>
#include <renaissance/plan/step_schedule.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace renaissance::plan {

/// Slots of the `scalars.hyper` tensor (S_SCALAR_FP32), written by the trainer, read by kernels on device.
enum HyperSlot : int {
  kHyperLr = 0,
  kHyperMomentum,
  kHyperBeta1,
  kHyperBeta2,
  kHyperEps,
  kHyperWeightDecay,
  kHyperStep,
  kHyperLarsEta,
  kHyperEmaDecay,
  kHyperLabelSmoothing,
  kHyperBnMomentum,
  kHyperBnEps,
  kHyperWorldSize,
  kHyperSlots = 16
};
static_assert(kHyperLr == 0 && kHyperMomentum == 1 && kHyperBeta1 == 2 && kHyperBeta2 == 3 && kHyperEps == 4 &&
                  kHyperWeightDecay == 5 && kHyperStep == 6 && kHyperLarsEta == 7,
              "the first 8 hyper slots are OptimizerScalars (core/optimizer_scalars.h), field by field");
/// Slots of `scalars.loss_scale`: scale, clean steps since the last overflow, growth interval, growth factor.
enum LossScaleSlot : int { kLossScale = 0, kLossScaleCleanSteps, kLossScaleInterval, kLossScaleFactor, kLossScaleSlots };
/// Slots of `result.step` and `result.accumulated`: loss sum, top-1 correct, top-5 correct, samples.
enum ResultSlot : int { kResultLoss = 0, kResultTop1, kResultTop5, kResultCount, kResultSlots };

/// A plain layer of the lowered plan: fused layers appear as their parts.
struct LoweredLayer {
  ArchLayer layer;
  int owner = -1;  ///< index into ArchPlan::layers
};

/// Ids of the tensors every plan has (alloc_baseline_dtensors).
struct BaselineIds {
  TensorId labels_a = kNoTensor, data_a = kNoTensor, labels_b = kNoTensor, data_b = kNoTensor;
  TensorId hyper = kNoTensor, loss_scale = kNoTensor, nan_flag = kNoTensor, step = kNoTensor;
  TensorId labels = kNoTensor, result = kNoTensor, predicted = kNoTensor, accumulated = kNoTensor;
  TensorId logits = kNoTensor;  ///< the input of SoftmaxCE
};

struct CompiledPlan {
  ArchPlan arch;
  TrainConfig config;
  std::vector<CompileSpec> specs;  ///< Variant order
  std::vector<MemoryPlan> memory;  ///< Variant order
  ComputationGraph train{"train"};
  ComputationGraph inference{"inference"};
  BaselineIds baseline;
  /// The order in which the runtime replays the buckets (plan/step_schedule.h); liveness measured on it. Derived,
  /// not serialised (deserialize rebuilds it), so not in the hash.
  StepSchedule schedule;
  std::uint64_t hash = 0;  ///< content hash of the serialised plan (without this field)

  const MemoryPlan& plan(Variant v) const { return memory[static_cast<std::size_t>(v)]; }
  std::int64_t arena_bytes() const;  ///< the largest variant: the ArenaKeeper's one allocation
  friend bool operator==(const CompiledPlan& a, const CompiledPlan& b);
  friend bool operator!=(const CompiledPlan& a, const CompiledPlan& b) { return !(a == b); }
};

class Compiler {
 public:
  static CompiledPlan compile(const ArchPlan& arch, const TrainConfig& cfg);
  /// How many times compile() ran in this process (start-up reports and the test that only rank 0 compiles).
  static std::int64_t compilations();

  // Phases, exposed for tests.
  static std::vector<LoweredLayer> lower(const ArchPlan& arch);
  /// Phase 1: per variant, the lowered layers with that variant's shapes and their tensors; checks that every
  /// layer has the same tensor names, regions and dtypes in every variant.
  struct VariantTensors {
    std::vector<LoweredLayer> layers;
    std::vector<LayerTensors> tensors;
  };
  static std::vector<VariantTensors> derive_all_shapes(const std::vector<LoweredLayer>& lowered,
                                                       const std::vector<CompileSpec>& specs, const ArchPlan& arch);
};

/// A layer whose batch normalisation would see one value per channel in a training variant: batch x height x width
/// of its output is 1 (an epoch's last batch of one sample before a BN on 1x1 features, or --batch 1). The batch
/// statistics are then undefined and the kernels stop the run at that step, after the work before it.
struct SingleValueBatchNorm {
  std::string layer;
  Variant variant = Variant::TRAIN_BASE;
  std::int64_t batch = 0;  ///< the variant's batch (per rank)
};
/// The first such layer of `plan`'s training variants, in variant then layer order; nullopt when there is none.
std::optional<SingleValueBatchNorm> single_value_batch_norm(const CompiledPlan& plan);

// Serialisation for the MPI broadcast: deserialize(serialize(x)) == x; the hash covers every byte.
std::vector<std::uint8_t> serialize(const CompiledPlan& plan);
CompiledPlan deserialize(const std::vector<std::uint8_t>& bytes);
std::uint64_t content_hash(const CompiledPlan& plan);

}  // namespace renaissance::plan
