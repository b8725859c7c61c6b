// Trainer: the training loop (DESIGN §8). It reads like the algorithm: data → forward → backward/reduce →
// update → log; schedules, validation and metrics are small pieces called from it.
#pragma once

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/core/error.h>
#include <renaissance/io/checkpoint.h>
#include <renaissance/io/weights.h>
#include <renaissance/plan/compiler.h>
#include <renaissance/runtime/data_pipeline.h>
#include <renaissance/runtime/executor.h>
#include <renaissance/runtime/gpu_input.h>
#include <renaissance/runtime/gpu_jpeg.h>
#include <renaissance/runtime/profiler.h>
#include <renaissance/runtime/schedule.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace renaissance::io {
class DatasetFile;
enum class Split;
}  // namespace renaissance::io

namespace renaissance::runtime {

/// The run diverged (a weight or statistic no longer finite): never a preemption's "could not write" (exit 75, which
/// a job script requeues into the same divergence), always an error.
class DivergedError : public Error {
 public:
  using Error::Error;
};

struct TrainOptions {
  std::string data_path;
  Backend backend = Backend::CPU;
  std::int64_t workspace_mib = 256;  ///< GPU: the one cuDNN/cuBLASLt workspace, allocated at start-up
  std::int64_t epochs = 3;
  std::int64_t batch = 128;
  std::int64_t val_batch = 0;  ///< 0: the training batch
  plan::OptimizerKind optimizer = plan::OptimizerKind::NESTEROV;
  double lr = 0.1;
  double momentum = 0.9;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double weight_decay = 5e-4;  ///< not applied to BN parameters and biases
  double lars_eta = 0.001;
  ScheduleKind schedule = ScheduleKind::ONE_CYCLE;
  double warmup_epochs = 0.0;
  /// ONE_CYCLE (PyTorch OneCycleLR's pct_start and div_factor): the fraction of the steps over which the rate rises,
  /// and the peak over the initial rate (`--onecycle-pct`, `--onecycle-div`).
  double onecycle_pct = 0.25, onecycle_div = 25.0;
  /// ONE_CYCLE, SGD family and LARS (`--onecycle-momentum BASE,MAX`): the momentum cycles inversely to the rate,
  /// from onecycle_max_momentum down to onecycle_base_momentum at the peak rate and back (PyTorch OneCycleLR's
  /// cycle_momentum); off: `momentum` throughout.
  bool onecycle_momentum = false;
  double onecycle_base_momentum = 0.85, onecycle_max_momentum = 0.95;
  std::int64_t step_epochs = 0;  ///< STEP: decay every this many epochs
  double step_gamma = 0.1;
  double label_smoothing = 0.1;
  bool ema = false;
  double ema_decay = 0.999;
  /// Test-time augmentation at the end of training (`--tta flip`): the last epoch's validation also scores the
  /// average of each image's logits and its horizontal mirror's (EpochMetrics::tta_val_*).
  bool tta_flip = false;
  bool amp = false;
  bool fuse = true;  ///< residual blocks as fused layers (plan::BuildOptions::fuse)
  std::uint64_t seed = 0;
  /// `--zero-init-residual`: the last BN of every residual branch starts with γ = 0 (plan/residual_init.h); a model
  /// without residual sums is an error.
  bool zero_init_residual = false;
  /// `--drop-last`: each epoch trains only full global batches; the n mod batch samples at the end of the epoch's
  /// order (another set each epoch) are left out, as PyTorch's DataLoader(drop_last=True). Off: the last, partial
  /// batch is trained (sharding.h).
  bool drop_last = false;
  /// eval, predict: no training step will run, so the train variants are not checked for what only a step needs
  /// (a batch normalisation over one value per channel).
  bool inference_only = false;
  std::int64_t max_steps = -1;  ///< stop after this many optimizer steps (-1: all epochs)
  Augmentation augmentation;
  /// Host threads that decode (JPEG stores), augment and normalise samples (issue 12); 0: every CPU of the affinity
  /// mask. The results do not depend on it.
  int loader_threads = 0;
  /// The device-resident dataset cache (runtime/gpu_input.h): auto uses it where it can, off never, on or an error.
  DataCacheMode data_cache = DataCacheMode::automatic;
  /// Where JPEG stores are decoded (runtime/gpu_jpeg.h): auto (the GPU with nvJPEG on the CUDA backend when the
  /// build has it), gpu (or an error), cpu (libjpeg-turbo on the loader threads).
  DecodeMode decode = DecodeMode::automatic;
  /// --decode gpu: threads decoding batches ahead with nvJPEG, each with its own state and stream (1 to 16). With
  /// more than one, the JPEG engines' pixels depend on which thread decoded a batch (measured on the H200: a few
  /// percent of the bytes differ by small amounts), so only 1 keeps runs bit-reproducible.
  int gpu_decoders = 1;
  bool shuffle = true;
  std::int64_t start_resolution = 0;  ///< progressive resize: the first `lowres_epochs` epochs at this size
  std::int64_t lowres_epochs = 0;
  double bn_momentum = 0.1, bn_eps = 1e-5;
  double loss_scale = 65536.0;  ///< AMP: initial dynamic loss scale
  std::int64_t loss_scale_interval = 2000;
  bool validate = true;
  /// With validate: after every epoch (true), or only after the run's last epoch (`--validate last`: the epoch
  /// count or --max-steps ends it; also when a preemption arrives in its last step, as with every-epoch validation:
  /// the resumed run would have no epoch left to validate after).
  bool validate_each_epoch = true;
  bool reuse_memory = true;  ///< plan features and gradients by liveness (plan::TrainConfig::reuse_memory)
  /// Fused element-wise passes (ExecEnv::fuse_kernels): the compiler's passes in fused layers, both backends. Off:
  /// every part runs on its own (same bits, for comparisons).
  bool fuse_kernels = true;
  /// plan::TrainConfig::fold_residual_sums (AMP plans): residual joins' second data gradient written on its own (beta =
  /// 0), the sum folded into the consumer's ReLU backward. Off: that dgrad accumulates (the order of the plain-layer
  /// plan).
  bool fold_residual_sums = true;
  /// plan::TrainConfig::fuse_residual_bn_backward (`bench --fuse-residual-bn-backward on|off`).
  bool fuse_residual_bn_backward = true;
  /// plan::TrainConfig::relu_masks (`train`/`bench --relu-mask on|off`): residual block ends keep their ReLU's sign as 1-bit
  /// masks for the backward (AMP; the same bits).
  bool relu_masks = true;
  /// plan::TrainConfig::fuse_shortcut_bn_backward (`bench --fuse-shortcut-bn-backward on|off`).
  bool fuse_shortcut_bn_backward = true;
  /// plan::TrainConfig::recompute_bn_relu (`--recompute bn-relu`): BN -> ReLU outputs the backward reads are formed
  /// again there instead of kept through the peak (less memory, one element-wise pass each; the same bits).
  bool recompute_bn_relu = false;
  /// plan::TrainConfig::recompute_budget_bytes (`--recompute-budget`): with recompute_bn_relu, recompute only as
  /// many values as bring the arena within this many bytes; 0: all.
  std::int64_t recompute_budget_bytes = 0;
  /// GPU (`--streams on`): weight gradients and projection shortcuts on side streams beside the main one
  /// (ExecEnv::streams; one more workspace of workspace_mib). Off (the default: every model measured on an H100 ran
  /// 0.5-3.5 % faster on one compute stream, docs/benchmarks.md): one compute stream.
  bool concurrent_streams = false;
  /// Same seed, same binary, same GPU (and the same engine choices, which `engine_cache` keeps) → the same weights,
  /// BN statistics, optimizer state and losses bit for bit. Off: non-deterministic cuDNN engines and cuBLASLt
  /// reductions are admitted where they are faster (ExecEnv::deterministic).
  bool deterministic = true;
  /// Tests only: a byte written over the whole arena after start-up (engine timing, warm-up runs) and before the
  /// weights are initialised (-1: none). Initialisation zeroes the arena first, so no value may change a run.
  int debug_arena_fill = -1;
  /// Tests only: the byte the compute streams' cuDNN/cuBLASLt workspaces hold when the run starts (-1: zero, what
  /// every run gets). No value may change a run: a step that read workspace bytes it had not written would.
  int debug_workspace_fill = -1;
  /// Tests only: region families (names of RegionFamily: "F,S,T,I", ...) whose tensors are filled with 0xFF bytes
  /// (NaN in FP16/FP32) after initialisation, to find what a step reads before it writes.
  std::string debug_poison_families;
  /// GPU: the file of convolution engine choices (engine_cache_file.h): loaded before the engines are chosen, new
  /// choices saved after, so a second start-up times nothing and chooses the same engines. Empty: none.
  std::string engine_cache;
  /// GPU convolutions: 0 the cuDNN graph API with the legacy API as the fallback, 1 the graph API only, 2 the legacy
  /// API only (ExecEnv::conv_api; for comparisons).
  int conv_api = 0;
  /// GPU convolutions with conv_api 0, the own depthwise kernels (kernels/cuda/depthwise.h; ExecEnv::own_kernels,
  /// cuda::OwnKernels): 1 timed beside cuDNN's choice, the faster kept (--own-kernels on); 0 cuDNN only (off, for
  /// comparisons); 2 wherever they cover a pass, untimed (tests).
  int own_kernels = 1;
  /// GPU, AMP fused layers (issue 15): the batch-norm statistics of a convolution's output computed in the
  /// convolution's epilogue (cuDNN's GEN_STATS) instead of by the own statistics kernel, layer by layer where the
  /// start-up timing finds it faster (ExecEnv::conv_stats; `--conv-stats on|auto`). Other bits than off, and not the
  /// same bits twice: no GEN_STATS plan repeats its sums, so the trainer refuses it with `deterministic`.
  bool conv_stats = false;
  // Checkpoints (DESIGN §10, docs/checkpoints.md): written by rank 0 into checkpoint_dir (empty: none) as
  // ckpt-stepNNNNNNNN.h5 with latest.h5 pointing at the newest; the newest checkpoint_keep files are kept.
  std::string checkpoint_dir;
  std::int64_t checkpoint_every = 0;   ///< every this many steps (0: not by steps)
  bool checkpoint_each_epoch = false;  ///< at the end of every epoch
  int checkpoint_keep = 2;
  /// Also keep the checkpoint of the best validation top-1 so far as checkpoint_dir/best.h5 (--keep-best val_top1).
  bool checkpoint_keep_best = false;
  /// Preemption: a flag a SIGUSR1/SIGTERM handler sets. At each step boundary the ranks agree on it (MAX); when
  /// set, rank 0 writes a checkpoint into checkpoint_dir and run() returns early with preempted() true.
  const std::atomic<int>* stop_request = nullptr;
  /// Lines of the command's own settings ("name=value\n") that every rank must share, compared across ranks at
  /// start-up with the run options (describe_run_options): bench's step counts (each step is a collective), which
  /// outputs rank 0 writes (one named on another rank only would be dropped without a word).
  std::string command_settings;
  /// Data-parallel runs (DESIGN §9): the collectives of this rank, borrowed (lib/renaissance/comm makes it);
  /// nullptr: one rank. With N ranks `batch` (and `val_batch`) are global: each rank trains batch/N samples of
  /// every global batch, the same samples in the same order with the same augmentation as one rank would.
  Communicator* comm = nullptr;
  /// Synchronised BatchNorm: training statistics of the global batch (all ranks), so N ranks train exactly
  /// like one. Off: each rank normalises with its own batch/N samples (PyTorch DDP without SyncBatchNorm).
  bool sync_bn = false;
};

struct EpochMetrics {
  std::int64_t epoch = 0;  ///< 1-based
  std::int64_t step = 0;   ///< optimizer steps so far
  std::int64_t train_samples = 0;
  double train_loss = 0, train_top1 = 0;
  bool validated = false;  ///< the val_* figures below were measured after this epoch
  double val_loss = 0, val_top1 = 0, val_top5 = 0;
  double ema_val_top1 = -1;  ///< -1 without EMA
  /// The last epoch with TrainOptions::tta_flip: top-1 and cross-entropy of the mean of the logits of each val image
  /// and of its mirror image (evaluate_flip_tta); -1 otherwise.
  double tta_val_top1 = -1, tta_val_loss = -1;
  double images_per_s = 0;   ///< training throughput of the epoch
  double seconds = 0;
  double lr = 0;  ///< at the last step of the epoch
  double loss_scale = 0;
};

/// Where a Trainer's start-up went (seconds): planning, choosing the GPU convolution engines (building cuDNN plans
/// and timing them), preparing and capturing every subgraph less the engine choice, initialising the weights.
struct StartupTimes {
  double compile_s = 0, engines_s = 0, capture_s = 0, init_s = 0;
  std::int64_t engines_cached = 0, engines_chosen = 0;  ///< convolution passes found in the engine cache / chosen
  std::int64_t engines_legacy = 0;  ///< convolution passes on the legacy API (fallback or --conv-api legacy)
  std::int64_t engines_own = 0;     ///< convolution passes on the own depthwise kernels (--own-kernels)
  std::int64_t engines_stats = 0;   ///< forward convolutions with their BN's statistics in the epilogue (--conv-stats)
  double data_cache_s = 0;          ///< reading the dataset and uploading it into the device cache (--data-cache)
  double device_s = 0;  ///< the device context, the arena, the library handles and the loader (after planning)
  double data_s = 0;    ///< the input pipeline: the GPU JPEG decoder and the device cache (data_cache_s within it)
  double total_s = 0;   ///< the whole constructor, the dataset's first checks included
};

struct BenchResult {
  std::int64_t steps = 0, batch = 0;
  double ms_per_step = 0, images_per_s = 0;
  std::int64_t arena_bytes = 0;
  std::int64_t captures = 0;  ///< distinct captured subgraphs after deduplication
  std::int64_t ranks = 1;     ///< data-parallel ranks: batch and images_per_s are global (all ranks together)
};

/// Progress reporting hook: called after every step (for the progress bar) and every epoch.
struct TrainObserver {
  std::function<void(std::int64_t epoch, std::int64_t batch, std::int64_t batches, double images_per_s)> on_step;
  std::function<void(const EpochMetrics&)> on_epoch;
  /// After every step (when set; it reads the loss back, a host sync): the step (1-based), its epoch (1-based)
  /// and the mean training loss of its batch on this rank.
  std::function<void(std::int64_t step, std::int64_t epoch, double loss)> on_step_loss;
  /// When set, on_step_loss is called only for the steps this approves (the progress bar's redraws, --log-every):
  /// the other steps skip the host sync.
  std::function<bool(std::int64_t step)> wants_step_loss;
  /// After a checkpoint was written (rank 0).
  std::function<void(const std::string& path, std::int64_t step)> on_checkpoint;
};

/// A file's state, read and verified, for a Trainer to start from: a checkpoint to resume or to evaluate, or a
/// weights file (io::read_checkpoint, io::read_weights).
struct InitialState {
  std::vector<io::NamedTensor> tensors;
  io::CheckpointState state;  ///< a weights file's: the model name alone
  std::string path;           ///< for messages
  bool weights_only = false;  ///< the masters, BN statistics and EMA weights alone (evaluation), no run state
  bool checkpoint = true;     ///< false: a weights file (its tensors by name, not in the writer's plan order)
  /// The image channels the writer's model reads (its recorded arch plan's input_channels); 0: not recorded.
  std::int64_t input_channels = 0;
  /// The writer's --val-resize (a checkpoint's run_config, a weights file's val_resize attribute); -1: not recorded.
  /// eval and predict score with it, as the run validated (they scored with the default size/0.875).
  std::int64_t val_resize = -1;
  static InitialState of_checkpoint(io::Checkpoint ck, std::string path, bool weights_only = false);
  static InitialState of_weights(io::WeightsFile wf, std::string path);
  const char* noun() const { return checkpoint ? "the checkpoint" : "the weights file"; }
  bool in_plan_order() const { return checkpoint; }
};

class Trainer {
 public:
  /// initial: a state the Trainer starts from (loaded as load_checkpoint / load_weights would, at the end of the
  /// start-up; the warnings are logged). Its tensors are matched against the plan as soon as it is compiled, before
  /// the device, the engine timing and the capture: a file of another architecture costs no start-up.
  Trainer(const blueprint::BluePrint& model, TrainOptions opts, const InitialState* initial = nullptr);
  ~Trainer();

  /// Before any data exists: the arena of the plan a Trainer with these options compiles for a train split of
  /// `train_samples` (a validation split of `val_samples`), checked against the memory it will live in (the GPU's
  /// free memory on CUDA, the host's available memory on the CPU). `bench` calls it before it writes its synthetic
  /// batch; the constructor makes the same check. Throws Error naming the model, the batch and the figures.
  static void check_memory(const blueprint::BluePrint& model, const TrainOptions& opts, std::int64_t train_samples,
                           std::int64_t val_samples);

  /// Trains for the configured epochs (or max_steps); returns one entry per epoch.
  std::vector<EpochMetrics> run(const TrainObserver& observer = {});
  /// Times `steps` training steps on one staged batch after `warmup` steps (graphs: captured replay; off: the
  /// same nodes launched one by one). Measures the step itself: no loader, no validation.
  BenchResult benchmark(std::int64_t warmup, std::int64_t steps, bool graphs = true);
  /// `renaissance bench --profile`: `warmup` steps as benchmark() runs them, then `steps` steps node by node
  /// (un-captured) with a kernel timer, summed per subgraph and per kernel label. The same training steps as
  /// benchmark(warmup, steps): profiling changes no result. For finding where the time goes, not for throughput
  /// (un-captured steps include launch gaps).
  ProfileResult profile(std::int64_t warmup, std::int64_t steps);
  /// Scores the current weights on the validation split: {loss, top1, top5}. ema: on the EMA weights.
  EpochMetrics evaluate(bool ema = false);

  const plan::CompiledPlan& plan() const { return *m_plan; }
  const StartupTimes& startup() const;
  /// Every GPU convolution pass of every capture made at start-up with its layer and engine
  /// ("s1.b1.c1 dgrad [graph eng63_k25=1]"); empty on the CPU.
  std::vector<std::string> conv_engines() const;
  std::int64_t steps() const { return m_step; }
  /// The learning rate of the last optimizer step (0 before the first): the loss log records it per step.
  double last_lr() const;
  /// The momentum of the last optimizer step when it is cycled (--onecycle-momentum), else a negative value: the
  /// loss log records it per step then.
  double last_cycled_momentum() const;
  /// FP32 values of a named tensor (e.g. "conv1.w", "bn2d1.running_mean") in the arena.
  std::vector<float> tensor_values(const std::string& name) const;
  /// The raw bytes of a named tensor of any dtype (the labels' int32, FP16 copies as stored; tests).
  std::vector<std::uint8_t> tensor_bytes(const std::string& name) const;
  /// Every FP32 master weight, BN running statistic, in plan order (for bit-exact comparisons).
  std::vector<float> state_values() const;
  /// Test hook (gradient checks, tests/golden): overwrites the FP32 tensor `name` in the arena with `values` (its
  /// element count, plan order); after a master weight of an AMP plan the FP16 compute copies are cast afresh.
  /// Nothing else is derived again (EMA, optimizer state): not a way to load weights (load_weights).
  void set_tensor_values(const std::string& name, const std::vector<float>& values);

  /// Masters (/params), BN running statistics (/bn) and EMA weights (/ema) as named tensors in HDF5.
  void save_weights(const std::string& path) const;
  /// Loads a weights file written for the same architecture; the first tensor that is missing or has
  /// another shape is an error naming it. EMA weights are loaded when the Trainer keeps an EMA
  /// (TrainOptions::ema); a file without them is then an error.
  void load_weights(const std::string& path);
  /// The same from a file already read (io::read_weights, `path` for messages): `eval` and `predict` read and verify
  /// the file before the Trainer is built, so a corrupt or wrong file costs no start-up (engine timing).
  void load_weights(const io::WeightsFile& wf, const std::string& path);
  /// FP32 logits [count][classes] of samples [first, first + count) of `split`: the inference graph on the current
  /// weights (ema: the EMA weights), no augmentation, the dataset's normalisation. A last partial batch is padded
  /// with copies of its last sample. For checks against other frameworks (`renaissance predict`). hflip: of each
  /// image mirrored left to right (as validation renders it, then mirrored), for test-time augmentation.
  std::vector<float> logits(io::Split split, std::int64_t first, std::int64_t count, bool ema = false,
                            bool hflip = false);
  /// Flip test-time augmentation over the whole val split: each image's logits averaged with its mirror image's
  /// (both through logits()), then top-1 and the mean cross-entropy (no label smoothing) in double precision.
  struct TtaResult {
    double top1 = 0, loss = 0;
  };
  TtaResult evaluate_flip_tta(bool ema = false);

  /// A checkpoint of the state after the last step (masters, BN statistics, optimizer moments, EMA, loss scale,
  /// the partial epoch's metric sums, step/epoch/position): a run resumed from it continues bit for bit. Not
  /// collective: the calling rank writes (run() itself checkpoints into checkpoint_dir from rank 0).
  void save_checkpoint(const std::string& path) const;
  /// The tensor bytes a checkpoint (or, `checkpoint` false, a weights file) of this run holds: what its disk must
  /// have room for, less the attributes (train checks it against the free space before the first step).
  std::int64_t file_tensor_bytes(bool checkpoint) const;
  /// Loads a checkpoint (validated first; nothing changes when it fails); the next run() continues at its
  /// step, epoch and position in the epoch. Another batch size, AMP setting, world size, seed or optimizer loads
  /// with a warning (returned and logged); another architecture is an error naming the first mismatching tensor.
  /// weights_only: the masters, BN statistics and EMA weights alone (for evaluation), no run state.
  std::vector<std::string> load_checkpoint(const std::string& path, bool weights_only = false);
  /// run() stopped early because of stop_request (a checkpoint was written when checkpoint_dir is set).
  bool preempted() const;
  /// The checkpoint run() wrote last (rank 0), or empty.
  std::string last_checkpoint() const;

 private:
  /// load_checkpoint's and load_weights's work on a state already read. Matching by name, the first conv's channels
  /// padded or cut across AMP settings, and where fused layers renamed tensors by position within each group when
  /// the file lists them in the writer's plan order (checkpoints); weights_only: no run state.
  std::vector<std::string> load_state(const InitialState& st);
  /// The tensors a weights file holds (/params, /bn, /ema), read from the arena: save_weights writes them, and an AMP
  /// epoch with a non-finite loss checks them for divergence.
  std::vector<io::NamedTensor> weight_tensors() const;
  struct Impl;
  std::unique_ptr<Impl> m_impl;
  std::unique_ptr<plan::CompiledPlan> m_plan;
  std::int64_t m_step = 0;
};

}  // namespace renaissance::runtime
