// Compiler and MemoryPlan: the six variants, shared offsets, regions per configuration, the self-checks
// (with planted faults), contiguity of RANGE spans, gradient slots, serialisation.
#include "compile_util.h"

#include <renaissance/core/dtensor.h>

#include <map>
#include <set>

using namespace plan_test;
using renaissance::compute_slot_bytes;
using renaissance::DType;
using renaissance::ParamKind;
using renaissance::RegionFamily;
using rp::ByteRange;
using rp::MemoryPlan;
using rp::Variant;

namespace {

const std::vector<ParamKind> kKinds = {ParamKind::BN_BIAS,   ParamKind::BN_WEIGHT,  ParamKind::FC_BIAS,
                                       ParamKind::FC_WEIGHT, ParamKind::FIRST_CONV, ParamKind::DEEP_CONV};

/// first cbr (FIRST_CONV), a deep conv with bias (DEEP_CONV + FC_BIAS), a BN, gap_fc (FC_WEIGHT + FC_BIAS)
rb::BluePrint small_model() {
  return model(rb::seq(rb::cbr(8, 3, 1, 1), rb::conv(16, 3, 2, 1, 1, true), rb::bn(), rb::relu(), rb::gap_fc(10),
                       rb::softmax_ce(10)),
               8, 3, "small");
}
/// Weights per parameter kind of small_model(), counted by hand.
std::map<ParamKind, std::int64_t> small_model_weights() {
  return {{ParamKind::BN_BIAS, 2},   {ParamKind::BN_WEIGHT, 2},  {ParamKind::FC_BIAS, 2},
          {ParamKind::FC_WEIGHT, 1}, {ParamKind::FIRST_CONV, 1}, {ParamKind::DEEP_CONV, 1}};
}

rp::CompiledPlan compile_small(bool amp, OptimizerKind opt, bool ema) {
  rp::BuildOptions o;
  o.amp = amp;
  o.fuse = amp;
  rp::TrainConfig t;
  t.dataset_size = 100;
  t.batch = 16;
  t.val_size = 50;
  t.optimizer = opt;
  t.ema = ema;
  t.amp = amp;
  return rp::Compiler::compile(rp::ArchPlan::build(small_model(), o), t);
}

std::int64_t grad_slot_count(const MemoryPlan& mp) {
  std::int64_t n = 0;
  for (const auto& t : mp.tensors())
    if (t.name.rfind("grad_slot.", 0) == 0) ++n;
  return n;
}

}  // namespace

// ---- variants ------------------------------------------------------------------------------------------

TEST(Variants, SixSpecsDerivedByHand) {
  rp::TrainConfig c;
  c.dataset_size = 60000;
  c.batch = 256;
  c.start_resolution = 160;
  c.val_size = 10000;
  c.amp = true;
  const auto s = rp::derive_variant_specs(c, 224, 4);
  ASSERT_EQ(s.size(), 6u);
  // 60000 = 234·256 + 96; 10000 = 39·256 + 16
  const std::int64_t want[6][2] = {{224, 256}, {224, 96}, {160, 256}, {160, 96}, {224, 256}, {224, 16}};
  for (int v = 0; v < 6; ++v) {
    SCOPED_TRACE(rp::variant_name(static_cast<Variant>(v)));
    EXPECT_EQ(s[v].actual_resolution, want[v][0]);
    EXPECT_EQ(s[v].batch_size, want[v][1]);
    EXPECT_EQ(s[v].max_sample_resolution, 224);
    EXPECT_EQ(s[v].num_color_channels, 4);
    EXPECT_TRUE(s[v].amp_enabled);
  }
  // An even split keeps a full last batch; a validation batch of its own.
  c.dataset_size = 1024;
  c.start_resolution = 0;
  c.val_batch = 500;
  c.val_size = 10250;
  const auto e = rp::derive_variant_specs(c, 32, 3);
  EXPECT_EQ(e[1].batch_size, 256);
  EXPECT_EQ(e[2].actual_resolution, 32);  // no progressive resize: lowres = base
  EXPECT_EQ(e[4].batch_size, 500);
  EXPECT_EQ(e[5].batch_size, 250);
  // the names in Variant order
  const char* names[] = {"train_base", "train_last", "train_lowres", "train_lowres_last", "val_base", "val_last"};
  for (int v = 0; v < 6; ++v) EXPECT_STREQ(rp::variant_name(static_cast<Variant>(v)), names[v]);
  c.batch = 0;
  EXPECT_THROW(rp::derive_variant_specs(c, 32, 3), renaissance::Error);
}

TEST(Variants, CompiledPlanCarriesTheSixShapes) {
  Cfg c;
  c.model = "tiny_resnet.yaml";  // 32×32×3, gap + fc: any resolution gives the same weights
  c.dataset = 1000;              // 31·32 + 8
  c.val = 300;                   // 9·32 + 12
  c.start_res = 24;
  const rp::CompiledPlan p = compile(c);
  ASSERT_EQ(p.memory.size(), 6u);
  const std::int64_t want[6][2] = {{32, 32}, {32, 8}, {24, 32}, {24, 8}, {32, 32}, {32, 12}};
  for (int v = 0; v < 6; ++v) {
    const MemoryPlan& m = p.memory[static_cast<std::size_t>(v)];
    EXPECT_EQ(m.variant(), rp::variant_name(static_cast<Variant>(v)));
    EXPECT_EQ(p.specs[static_cast<std::size_t>(v)].batch_size, want[v][1]);
    EXPECT_EQ(m.tensor(p.baseline.data_a).shape, (Shape{want[v][1], want[v][0], want[v][0], 3}));
    // the stem conv's output follows the variant's batch and resolution
    EXPECT_EQ(m.tensor(m.at("stem.conv.y")).shape, (Shape{want[v][1], want[v][0], want[v][0], 16}));
    // res3 (stride 2 after res2's stride 2): 32 -> 8, 24 -> 6
    const TensorId gap = m.at(p.arch.layers[p.arch.layers.size() - 2].name + ".gap.y");
    EXPECT_EQ(m.tensor(gap).shape, (Shape{want[v][1], 1, 1, 64}));
  }
}

TEST(Variants, ProgressiveResizeOfAFlattenModelIsAnError) {
  // fmnist_cnn flattens 7×7×64 into its fc: at 20×20 the fc would need other weights.
  Cfg c;
  c.start_res = 20;
  expect_error([&] { compile(c); },
               {"layer 'fc1'", "train_lowres", "10x1x1x1600 here but 10x1x1x3136 in train_base", "--start-resolution"});
}

// ---- one layout for six variants ----------------------------------------------------------------------

TEST(MemoryPlans, SameOffsetAndSlotInAllSixVariants) {
  Cfg big;
  big.model = "resnet50";
  big.amp = big.fuse = big.ema = true;
  big.opt = OptimizerKind::ADAMW;
  big.batch = 8;
  big.dataset = 20;
  big.val = 10;
  big.start_res = 160;
  Cfg small;
  small.opt = OptimizerKind::SGD;
  for (const Cfg& c : {big, small}) {
    SCOPED_TRACE(c.model);
    const rp::CompiledPlan p = compile(c);
    const MemoryPlan& base = p.memory[0];
    for (std::size_t v = 1; v < 6; ++v) {
      const MemoryPlan& m = p.memory[v];
      ASSERT_EQ(m.tensors().size(), base.tensors().size());
      for (std::size_t t = 0; t < base.tensors().size(); ++t) {
        const auto& a = base.tensors()[t];
        const auto& b = m.tensors()[t];
        ASSERT_EQ(a.id, b.id);
        ASSERT_EQ(a.name, b.name);
        ASSERT_EQ(a.offset, b.offset) << a.name << " in " << m.variant();
        ASSERT_EQ(a.slot_bytes, b.slot_bytes) << a.name << " in " << m.variant();
        ASSERT_EQ(a.region, b.region);
        ASSERT_EQ(a.dtype, b.dtype);
      }
      EXPECT_EQ(m.total_bytes(), base.total_bytes());
      for (int r = 0; r < renaissance::kNamedRegions; ++r)
        EXPECT_EQ(m.region_range(renaissance::region_at(r)), base.region_range(renaissance::region_at(r)));
    }
    EXPECT_EQ(p.arena_bytes(), base.total_bytes());
    // Each slot holds its tensor in every variant (max over variants, DESIGN §4 phase 2).
    for (const MemoryPlan& m : p.memory)
      for (const auto& t : m.tensors()) {
        if (m.aliases().count(t.id)) continue;
        ASSERT_GE(t.slot_bytes, compute_slot_bytes(t.shape, t.dtype, t.region)) << t.name << " in " << m.variant();
      }
    // features do change shape between variants
    const auto& d0 = p.memory[0].tensor(p.baseline.data_a).shape;
    const auto& d1 = p.memory[1].tensor(p.baseline.data_a).shape;
    EXPECT_NE(d0, d1);
  }
}

// ---- regions per configuration -------------------------------------------------------------------------

TEST(MemoryPlans, RegionCountsPerOptimizer) {
  const auto w = small_model_weights();
  for (OptimizerKind opt : {OptimizerKind::SGD, OptimizerKind::MOMENTUM, OptimizerKind::NESTEROV, OptimizerKind::ADAM,
                            OptimizerKind::ADAMW, OptimizerKind::LARS})
    for (bool amp : {false, true}) {
      SCOPED_TRACE(::testing::Message() << rp::optimizer_name(opt) << " amp=" << amp);
      const rp::CompiledPlan p = compile_small(amp, opt, false);
      const MemoryPlan& m = p.memory[0];
      const bool has_m = opt != OptimizerKind::SGD;
      const bool has_v = opt == OptimizerKind::ADAM || opt == OptimizerKind::ADAMW;
      const bool has_n = opt == OptimizerKind::LARS;
      for (ParamKind k : kKinds) {
        SCOPED_TRACE(renaissance::param_kind_name(k));
        const std::int64_t n = w.at(k);
        EXPECT_EQ(m.region_tensor_count(renaissance::master_region(k)), n);
        EXPECT_EQ(m.region_tensor_count(renaissance::grad_region(k)), n);
        EXPECT_EQ(m.region_tensor_count(renaissance::m_region(k)), has_m ? n : 0);
        EXPECT_EQ(m.region_tensor_count(renaissance::v_region(k)), has_v ? n : 0);
        if (!has_m) {
          EXPECT_EQ(m.region_range(renaissance::m_region(k)).bytes, 0);
        }
        if (!has_v) {
          EXPECT_EQ(m.region_range(renaissance::v_region(k)).bytes, 0);
        }
        EXPECT_EQ(m.region_tensor_count(renaissance::ema_region(k)), 0);
        EXPECT_EQ(m.region_range(renaissance::ema_region(k)).bytes, 0);
        if (renaissance::has_fp16_twin(k)) {
          EXPECT_EQ(m.region_tensor_count(renaissance::n_region(k)), has_n ? n : 0);
          if (!has_n) {
            EXPECT_EQ(m.region_range(renaissance::n_region(k)).bytes, 0);
          }
          EXPECT_EQ(m.region_tensor_count(renaissance::compute_region(k)), amp ? n : 0);
          EXPECT_EQ(m.region_tensor_count(renaissance::grad_fp16_region(k)), amp ? n : 0);
          if (!amp) {
            EXPECT_EQ(m.region_range(renaissance::compute_region(k)).bytes, 0);
          }
          if (!amp) {
            EXPECT_EQ(m.region_range(renaissance::grad_fp16_region(k)).bytes, 0);
          }
        }
      }
      // BN folding is not enabled: W_EQ_* stay empty
      EXPECT_EQ(m.region_range(Region::W_EQ_BIAS).bytes, 0);
      EXPECT_EQ(m.region_range(Region::W_EQ_SCALE).bytes, 0);
      // two BN layers (the cbr's and the explicit one): one running mean and one batch variance each
      EXPECT_EQ(m.region_tensor_count(Region::B_PREV_MEAN), 2);
      EXPECT_EQ(m.region_tensor_count(Region::B_NEXT_VAR), 2);
    }
}

TEST(MemoryPlans, EmaAndAmpRegions) {
  const auto w = small_model_weights();
  for (bool amp : {false, true}) {
    const rp::CompiledPlan p = compile_small(amp, OptimizerKind::MOMENTUM, true);
    const MemoryPlan& m = p.memory[0];
    for (ParamKind k : kKinds) {
      EXPECT_EQ(m.region_tensor_count(renaissance::ema_region(k)), w.at(k));
      if (renaissance::has_fp16_twin(k)) {
        EXPECT_EQ(m.region_tensor_count(renaissance::ema_fp16_region(k)), amp ? w.at(k) : 0);
        EXPECT_EQ(m.region_tensor_count(renaissance::compute_region(k)), amp ? w.at(k) : 0);
      }
    }
    // dtypes by family
    for (const auto& t : m.tensors()) {
      const RegionFamily f = renaissance::region_family(t.region);
      if (f == RegionFamily::W || f == RegionFamily::G || f == RegionFamily::M || f == RegionFamily::V ||
          f == RegionFamily::N || f == RegionFamily::B) {
        EXPECT_EQ(t.dtype, DType::F32) << t.name;
      }
      if (f == RegionFamily::A || f == RegionFamily::G16) {
        EXPECT_EQ(t.dtype, DType::F16) << t.name;
      }
      if (t.region == Region::E_DEEP_CONV_FP16) {
        EXPECT_EQ(t.dtype, DType::F16) << t.name;
      }
      if (t.region == Region::F_FEATURE_FP16) {
        EXPECT_TRUE(amp) << t.name;
      }
      if (t.region == Region::F_FEATURE_FP32) {
        EXPECT_FALSE(amp) << t.name;
      }
    }
  }
}

TEST(MemoryPlans, EveryWeightHasAGradientOfTheSameShape) {
  for (const Cfg& c : {Cfg{}, Cfg{"resnet18_cifar", true, true, OptimizerKind::ADAMW, true},
                       Cfg{"mobilenet_v2", true, true, OptimizerKind::LARS, false, 2, 10, 4, 0, false, 64},
                       Cfg{"tiny_resnet.yaml", false, false, OptimizerKind::SGD}}) {
    SCOPED_TRACE(c.model);
    const rp::CompiledPlan p = compile(c);
    const MemoryPlan& m = p.memory[0];
    std::int64_t weights = 0, params = 0;
    for (ParamKind k : kKinds)
      for (TensorId id : m.region_tensors(renaissance::master_region(k))) {
        const auto& wt = m.tensor(id);
        ++weights;
        params += wt.shape.elems();
        const TensorId g = m.find(wt.name + ".grad");
        ASSERT_NE(g, renaissance::kNoTensor) << wt.name;
        EXPECT_EQ(m.tensor(g).region, renaissance::grad_region(k)) << wt.name;
        EXPECT_EQ(m.tensor(g).shape, wt.shape) << wt.name;
        if (c.amp && renaissance::has_fp16_twin(k)) {
          const TensorId a = m.find(wt.name + ".fp16"), g16 = m.find(wt.name + ".grad16");
          ASSERT_NE(a, renaissance::kNoTensor);
          ASSERT_NE(g16, renaissance::kNoTensor);
          EXPECT_EQ(m.tensor(a).shape, wt.shape);
          EXPECT_EQ(m.tensor(g16).shape, wt.shape);
        }
      }
    EXPECT_GT(weights, 0);
    // Stored weights = the model's parameters, plus the AMP padding channels of the first conv.
    std::int64_t padding = 0;
    const auto& first = p.arch.layers[0];
    if (first.conv().logical_in_c > 0)
      padding = first.conv().out_c * first.conv().k * first.conv().k * (p.arch.input.c - first.conv().logical_in_c);
    EXPECT_EQ(params, p.arch.parameter_count() + padding);
  }
}

// ---- planted faults -------------------------------------------------------------------------------------

TEST(MemoryPlans, PlantedFaultsAreCaught) {
  const rp::CompiledPlan p = compile(Cfg{});
  const MemoryPlan& good = p.memory[0];
  EXPECT_NO_THROW(good.validate());
  const TensorId w = good.region_tensors(Region::W_DEEP_CONV).at(0);

  {  // a tensor moved to the wrong region
    MemoryPlan bad = good;
    bad.mutable_tensor(w).region = Region::G_DEEP_CONV;
    expect_error([&] { bad.check_region_order(); }, {bad.tensor(w).name, "outside its region", "G_DEEP_CONV"});
    EXPECT_THROW(bad.validate(), renaissance::Error);
  }
  {  // a feature moved into the BN statistics
    MemoryPlan bad = good;
    const TensorId f = good.region_tensors(Region::F_FEATURE_FP32).at(0);
    bad.mutable_tensor(f).region = Region::B_PREV_MEAN;
    EXPECT_THROW(bad.check_region_order(), renaissance::Error);
  }
  {  // a misaligned offset
    MemoryPlan bad = good;
    bad.mutable_tensor(w).offset += 16;
    expect_error([&] { bad.check_alignment(); }, {bad.tensor(w).name, "not 256-byte aligned"});
    EXPECT_THROW(bad.validate(), renaissance::Error);
  }
  {  // a slot that is not a multiple of 256
    MemoryPlan bad = good;
    bad.mutable_tensor(w).slot_bytes -= 8;
    EXPECT_THROW(bad.check_alignment(), renaissance::Error);
  }
  {  // two tensors overlapping
    MemoryPlan bad = good;
    const auto ids = good.region_tensors(Region::F_FEATURE_FP32);
    bad.mutable_tensor(ids[1]).offset = good.tensor(ids[0]).offset;
    expect_error([&] { bad.check_no_overlap(); }, {"overlap"});
  }
}

TEST(MemoryPlans, HandBuiltPlanOffsetsAndMissingGradient) {
  // W: 8·3·3·3 = 216 FP32 -> 2·align256(432 + 16) = 1024 bytes; G the same, right after the W..A regions.
  MemoryPlan ok("hand");
  const TensorId w = ok.alloc_master(ParamKind::DEEP_CONV, "c.w", Shape{8, 3, 3, 3});
  const TensorId g = ok.alloc_grad(ParamKind::DEEP_CONV, "c.w.grad", Shape{8, 3, 3, 3});
  const TensorId y = ok.alloc_feature("c.y", Shape{2, 4, 4, 8}, DType::F16);  // 256 elems -> 528 -> 768
  ok.finalize();
  EXPECT_EQ(ok.tensor(w).offset, 0);
  EXPECT_EQ(ok.tensor(w).slot_bytes, 1024);
  EXPECT_EQ(ok.tensor(g).offset, 1024);
  EXPECT_EQ(ok.tensor(y).offset, 2048);
  EXPECT_EQ(ok.tensor(y).slot_bytes, 768);
  EXPECT_EQ(ok.total_bytes(), 2816);
  EXPECT_EQ(ok.region_range(Region::W_DEEP_CONV), (ByteRange{0, 1024}));
  EXPECT_EQ(ok.region_range(Region::A_DEEP_CONV), (ByteRange{1024, 0}));
  EXPECT_EQ(ok.region_range(Region::G_DEEP_CONV), (ByteRange{1024, 1024}));
  EXPECT_EQ(ok.region_range(Region::F_FEATURE_FP16), (ByteRange{2048, 768}));
  EXPECT_EQ(ok.region_range(Region::R_RESULT_ACCUMULATED), (ByteRange{2816, 0}));

  MemoryPlan missing("hand");
  missing.alloc_master(ParamKind::DEEP_CONV, "c.w", Shape{8, 3, 3, 3});
  missing.alloc_master(ParamKind::BN_WEIGHT, "b.gamma", Shape{1, 1, 1, 8});
  missing.alloc_grad(ParamKind::BN_WEIGHT, "b.gamma.grad", Shape{1, 1, 1, 8});
  expect_error([&] { missing.finalize(); }, {"G_DEEP_CONV", "W_DEEP_CONV", "gradient"});

  MemoryPlan wrong_shape("hand");
  wrong_shape.alloc_master(ParamKind::FC_WEIGHT, "f.w", Shape{10, 1, 1, 64});
  wrong_shape.alloc_grad(ParamKind::FC_WEIGHT, "f.w.grad", Shape{10, 1, 1, 32});
  expect_error([&] { wrong_shape.finalize(); }, {"G_FC_WEIGHT", "f.w"});

  MemoryPlan half_amp("hand");
  half_amp.alloc_master(ParamKind::DEEP_CONV, "c.w", Shape{8, 3, 3, 3});
  half_amp.alloc_grad(ParamKind::DEEP_CONV, "c.w.grad", Shape{8, 3, 3, 3});
  half_amp.alloc_compute_weight(ParamKind::DEEP_CONV, "c.w.fp16", Shape{8, 3, 3, 3});
  EXPECT_THROW(half_amp.finalize(), renaissance::Error);  // an FP16 copy without its FP16 gradient

  MemoryPlan twice("hand");
  twice.alloc_master(ParamKind::DEEP_CONV, "c.w", Shape{8, 3, 3, 3});
  EXPECT_THROW(twice.alloc_grad(ParamKind::DEEP_CONV, "c.w", Shape{8, 3, 3, 3}), renaissance::Error);
  EXPECT_THROW(twice.alloc_compute_weight(ParamKind::BN_BIAS, "b", Shape{1, 1, 1, 8}), renaissance::Error);
  EXPECT_THROW(twice.alloc_other(Region::W_DEEP_CONV, "x", Shape{1, 1, 1, 8}, DType::F32), renaissance::Error);
}

// ---- contiguity of RANGE spans --------------------------------------------------------------------------

TEST(MemoryPlans, RegionRangesAreContiguous) {
  for (bool amp : {false, true})
  for (bool reuse : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "amp=" << amp << " reuse=" << reuse);
    Cfg c;
    c.model = "resnet18_cifar";
    c.amp = c.fuse = amp;
    c.ema = true;
    c.opt = OptimizerKind::ADAM;
    c.reuse = reuse;
    const rp::CompiledPlan p = compile(c);
    const MemoryPlan& m = p.memory[0];
    EXPECT_EQ(m.reuses_memory(), reuse);
    // one cursor: every region starts where the previous one ends, and the last ends at the arena's end; with
    // reuse the activation pool is one unit in that walk, every pool tensor inside it
    std::int64_t cursor = 0;
    for (int r = 0; r < renaissance::kNamedRegions; ++r) {
      if (reuse && rp::is_pool_region(renaissance::region_at(r))) {
        if (renaissance::region_at(r) != rp::kPoolFirst) continue;
        const ByteRange pool = m.pool_range();
        EXPECT_EQ(pool.offset, cursor);
        for (const auto& t : m.tensors())
          if (rp::is_pool_region(t.region) && !m.aliases().count(t.id)) {
            EXPECT_GE(t.offset, pool.offset) << t.name;
            EXPECT_LE(t.offset + t.slot_bytes, pool.end()) << t.name;
          }
        EXPECT_LT(pool.bytes, m.pool_slot_bytes());  // reuse happened
        cursor = pool.end();
        continue;
      }
      const ByteRange b = m.region_range(renaissance::region_at(r));
      EXPECT_EQ(b.offset, cursor) << renaissance::region_name(renaissance::region_at(r));
      std::int64_t sum = 0;
      for (TensorId id : m.region_tensors(renaissance::region_at(r))) {
        EXPECT_EQ(m.tensor(id).offset, cursor + sum);
        sum += m.tensor(id).slot_bytes;
      }
      EXPECT_EQ(b.bytes, sum);
      cursor = b.end();
    }
    EXPECT_EQ(cursor, m.total_bytes());
    // gradient bucket 2 ends where bucket 1 (G_DEEP_CONV) starts
    const ByteRange first = m.resolve_region_bounds(rp::kGradBucketFirst);
    EXPECT_EQ(first.offset, m.region_range(Region::G_BN_BIAS).offset);
    EXPECT_EQ(first.end(), m.region_range(Region::G_DEEP_CONV).offset);
    std::int64_t bucket = 0;
    for (Region r :
         {Region::G_BN_BIAS, Region::G_BN_WEIGHT, Region::G_FC_BIAS, Region::G_FC_WEIGHT, Region::G_FIRST_CONV})
      bucket += m.region_range(r).bytes;
    EXPECT_EQ(first.bytes, bucket);
    EXPECT_GT(first.bytes, 0);
    EXPECT_EQ(m.resolve_region_bounds(rp::kGradBucketDeep), m.region_range(Region::G_DEEP_CONV));
    // FP32 ranges exactly twice their FP16 twins under AMP: one cast kernel per range
    const ByteRange wr = m.resolve_region_bounds({Region::W_FC_WEIGHT, Region::W_DEEP_CONV});
    const ByteRange ar = m.resolve_region_bounds({Region::A_FC_WEIGHT, Region::A_DEEP_CONV});
    const ByteRange gr = m.resolve_region_bounds({Region::G_FC_WEIGHT, Region::G_DEEP_CONV});
    const ByteRange g16 = m.resolve_region_bounds({Region::G_FC_WEIGHT_FP16, Region::G_DEEP_CONV_FP16});
    const ByteRange er = m.resolve_region_bounds({Region::E_FC_WEIGHT, Region::E_DEEP_CONV});
    const ByteRange e16 = m.resolve_region_bounds({Region::E_FC_WEIGHT_FP16, Region::E_DEEP_CONV_FP16});
    if (amp) {
      EXPECT_EQ(wr.bytes, 2 * ar.bytes);
      EXPECT_EQ(gr.bytes, 2 * g16.bytes);
      EXPECT_EQ(er.bytes, 2 * e16.bytes);
      EXPECT_GT(ar.bytes, 0);
      // every W tensor and its A twin sit at the same relative position
      for (ParamKind k : {ParamKind::FC_WEIGHT, ParamKind::FIRST_CONV, ParamKind::DEEP_CONV})
        for (TensorId id : m.region_tensors(renaissance::master_region(k))) {
          const auto& t = m.tensor(id);
          const auto& a = m.tensor(m.at(t.name + ".fp16"));
          EXPECT_EQ(t.offset - wr.offset, 2 * (a.offset - ar.offset)) << t.name;
        }
    } else {
      EXPECT_EQ(ar.bytes, 0);
      EXPECT_EQ(g16.bytes, 0);
    }
    EXPECT_THROW(m.resolve_region_bounds({Region::G_DEEP_CONV, Region::G_BN_BIAS}), renaissance::Error);
  }
}

TEST(MemoryPlans, AtMostFourGradSlots) {
  for (const Cfg& c : {Cfg{}, Cfg{"resnet50", true, true, OptimizerKind::SGD, false, 2, 10, 4, 0, false, 64},
                       Cfg{"resnet50", false, false, OptimizerKind::SGD, false, 2, 10, 4, 0, false, 64},
                       Cfg{"mobilenet_v2", false, false, OptimizerKind::SGD, false, 2, 10, 4, 0, false, 64},
                       Cfg{"tiny_resnet.yaml"}}) {
    SCOPED_TRACE(c.model);
    // With reuse: a buffer per gradient, placed by its lifetime; at most four are live at any program point, five
    // where a projection block's shortcut BN backward joins its block end's pass (ADD_RELU_BN_BN_BWD: the shortcut's
    // data gradient is written there, before the main branch's backward, instead of after it).
    auto max_live = [](const rp::CompiledPlan& p) {
      const MemoryPlan& m = p.memory[0];
      std::map<std::int32_t, int> live;
      int buffers = 0, most = 0;
      for (const auto& t : m.tensors())
        if (t.name.rfind("grad_buffer.", 0) == 0) {
          ++buffers;
          for (const rp::LiveInterval& i : m.lifetimes().at(t.id))
            for (std::int32_t q = i.first; q <= i.last; ++q) most = std::max(most, ++live[q]);
        }
      EXPECT_GE(buffers, 1);
      return most;
    };
    {
      const rp::CompiledPlan p = compile(c);
      const MemoryPlan& m = p.memory[0];
      EXPECT_EQ(grad_slot_count(m), 0);
      bool joined = false;
      for (const rp::Node& n : p.train.bucket(rp::GraphId::DEEP_FWD_BWD))
        for (const rp::FusedPass& f : n.fusions) joined = joined || f.kind == renaissance::ops::FusedKind::ADD_RELU_BN_BN_BWD;
      EXPECT_LE(max_live(p), rp::kMaxGradSlots + (joined ? 1 : 0));
      if (joined) {
        rp::TrainConfig t = train_config(c);
        t.fuse_shortcut_bn_backward = false;
        EXPECT_LE(max_live(rp::Compiler::compile(arch_of(c), t)), rp::kMaxGradSlots);
      }
      for (auto [view, owner] : m.aliases()) {
        EXPECT_EQ(m.tensor(view).offset, m.tensor(owner).offset);
        EXPECT_LE(compute_slot_bytes(m.tensor(view).shape, m.tensor(view).dtype, m.tensor(view).region),
                  m.tensor(owner).slot_bytes);
      }
    }
    Cfg fixed = c;
    fixed.reuse = false;
    const rp::CompiledPlan p = compile(fixed);
    for (const MemoryPlan& m : p.memory) {
      const std::int64_t n = grad_slot_count(m);
      EXPECT_GE(n, 1);
      EXPECT_LE(n, rp::kMaxGradSlots);
      // a slot holds the gradient of the largest feature of every variant
      std::int64_t largest = 0;
      for (const auto& t : m.tensors())
        if (t.region == Region::F_FEATURE_FP32 || t.region == Region::F_FEATURE_FP16) {
          for (const MemoryPlan& v : p.memory) {
            const auto& tv = v.tensor(t.id);
            largest = std::max(
                largest,
                compute_slot_bytes(tv.shape, tv.dtype, c.amp ? Region::F_GRAD_SLOT_FP16 : Region::F_GRAD_SLOT_FP32));
          }
        }
      for (const auto& t : m.tensors())
        if (t.name.rfind("grad_slot.", 0) == 0) {
          EXPECT_GE(t.slot_bytes, largest) << t.name;
        }
      // every view sits at its slot's offset and fits it
      for (auto [view, slot] : m.aliases()) {
        EXPECT_EQ(m.tensor(view).offset, m.tensor(slot).offset);
        EXPECT_LE(compute_slot_bytes(m.tensor(view).shape, m.tensor(view).dtype, m.tensor(view).region),
                  m.tensor(slot).slot_bytes);
      }
    }
  }
}

// ---- serialisation ---------------------------------------------------------------------------------------

TEST(Serialize, RoundTripHashAndCorruption) {
  const std::vector<Cfg> cfgs = {
      Cfg{}, Cfg{"resnet18_cifar", true, true, OptimizerKind::ADAMW, true},
      Cfg{"tiny_resnet.yaml", false, false, OptimizerKind::LARS, true},
      Cfg{"mobilenet_v2", true, false, OptimizerKind::NESTEROV, false, 4, 10, 6, 0, true, 64}};
  std::set<std::uint64_t> hashes;
  for (const Cfg& c : cfgs) {
    SCOPED_TRACE(c.model);
    const rp::CompiledPlan p = compile(c);
    const std::vector<std::uint8_t> bytes = rp::serialize(p);
    const rp::CompiledPlan back = rp::deserialize(bytes);
    EXPECT_TRUE(back == p);
    EXPECT_EQ(back.hash, p.hash);
    EXPECT_EQ(rp::serialize(back), bytes);
    EXPECT_NE(p.hash, 0u);
    EXPECT_EQ(rp::content_hash(p), p.hash);
    // stable across two compiles
    const rp::CompiledPlan again = compile(c);
    EXPECT_EQ(again.hash, p.hash);
    EXPECT_TRUE(again == p);
    hashes.insert(p.hash);
    // a flipped byte anywhere is rejected
    for (std::size_t at :
         {std::size_t{0}, std::size_t{9}, bytes.size() / 3, bytes.size() / 2, bytes.size() - 9, bytes.size() - 1}) {
      std::vector<std::uint8_t> bad = bytes;
      bad[at] ^= 0x10;
      EXPECT_THROW(rp::deserialize(bad), renaissance::Error) << "byte " << at;
    }
    std::vector<std::uint8_t> cut(bytes.begin(), bytes.end() - 100);
    EXPECT_THROW(rp::deserialize(cut), renaissance::Error);
    EXPECT_THROW(rp::deserialize({}), renaissance::Error);
  }
  EXPECT_EQ(hashes.size(), cfgs.size());
  // a different configuration of the same model hashes differently
  Cfg a;
  Cfg b = a;
  b.batch = 64;
  Cfg e = a;
  e.ema = true;
  EXPECT_NE(compile(a).hash, compile(b).hash);
  EXPECT_NE(compile(a).hash, compile(e).hash);
}
