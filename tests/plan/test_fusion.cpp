// The compiler's fusion phase (plan/fusion.cpp, ops/fused.h): which passes each fused layer gets, by model and by
// --fused-kernels, the named operands against the parts they replace, the per-layer fallback, serialisation, and the
// placed bytes of the passes' operands against the parts between (what the runtimes' address matchers used to check).
#include "compile_util.h"

#include <renaissance/blueprint/blueprint.h>
#include <renaissance/plan/fusion.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

namespace {

using namespace plan_test;
using renaissance::ops::FusedKind;
using rp::FusedPass;
using rp::GraphId;
using rp::Node;
using rp::OpKind;
namespace bp = renaissance::blueprint;

/// Every fused kind: CBR, BasicBlock identity/projection, Bottleneck identity/projection, InvResidual
/// identity/no-shortcut, GapFC (the model of tests/gpu_runtime/test_gpu_fused.cpp).
bp::BluePrint every_fused_kind() {
  bp::BluePrint m;
  m.name = "every_fused_kind";
  m.in_h = m.in_w = 16;
  m.in_c = 3;
  m.root = bp::seq(bp::cbr(16, 3, 1, 1), bp::block(16, 16, bp::BlockKind::RESNET_3_3, 1),
                   bp::block(16, 32, bp::BlockKind::RESNET_3_3, 2), bp::block(16, 32, bp::BlockKind::RESNET_1_3_1, 1),
                   bp::block(16, 64, bp::BlockKind::RESNET_1_3_1, 2),
                   bp::block(128, 64, bp::BlockKind::MBV2_INV_RESIDUAL, 1),
                   bp::block(128, 48, bp::BlockKind::MBV2_INV_RESIDUAL, 2), bp::gap_fc(10), bp::softmax_ce(10));
  return m;
}

rp::CompiledPlan compile_every_kind(bool fuse_kernels, bool recompute = false) {
  rp::BuildOptions o;
  o.amp = o.fuse = true;
  rp::TrainConfig t;
  t.batch = 8;
  t.dataset_size = 64;
  t.val_size = 16;
  t.amp = true;
  t.fuse_kernels = fuse_kernels;
  t.recompute_bn_relu = recompute;
  return rp::Compiler::compile(rp::ArchPlan::build(every_fused_kind(), o), t);
}

std::map<FusedKind, int> count(const std::vector<Node>& bucket) {
  std::map<FusedKind, int> c;
  for (const Node& n : bucket)
    for (const FusedPass& f : n.fusions) ++c[f.kind];
  return c;
}
std::map<FusedKind, int> operator+(std::map<FusedKind, int> a, const std::map<FusedKind, int>& b) {
  for (auto [k, v] : b) a[k] += v;
  return a;
}

const rp::FusedOperand* find(const std::vector<rp::FusedOperand>& v, const std::string& name) {
  for (const rp::FusedOperand& o : v)
    if (o.name == name) return &o;
  return nullptr;
}

TEST(Fusion, EveryFusedKindGetsItsPasses) {
  const rp::CompiledPlan p = compile_every_kind(true);
  // The train step: the first layer (CBR) in its A bucket, the rest in DEEP_FWD_BWD.
  const auto train = count(p.train.bucket(GraphId::FIRST_LAYER_FWD_A)) + count(p.train.bucket(GraphId::DEEP_FWD_BWD)) +
                     count(p.train.bucket(GraphId::FIRST_LAYER_BWD_A));
  // CBR, 2 inner ReLUs per bottleneck and 1 per basic block, 2 per inverted residual: BN → ReLU forward, the same
  // ReLUs folded into the BN backward; identity blocks: BN + add + ReLU; projection blocks: BN + BN + add + ReLU with
  // the shortcut's statistics on their own; the identity inverted residual: BN + add (no ReLU after its add). Four
  // blocks start where a block with an end ReLU stops (blocks 2-5): their second data gradient is summed in the
  // previous block's end ReLU backward, which forms its gradient inside the backward of that block's last BN; at the
  // two projection blocks' ends (blocks 3 and 5) the shortcut BN's backward joins that pass.
  const std::map<FusedKind, int> want_train{
      {FusedKind::BN_RELU, 11},     {FusedKind::BN_ADD_RELU, 2},     {FusedKind::BN_ADD, 1},
      {FusedKind::BN_BN_ADD_RELU, 2}, {FusedKind::BN_STATS, 2},      {FusedKind::RELU_BN_BWD, 11},
      {FusedKind::ADD_RELU_BN_BWD, 2}, {FusedKind::ADD_RELU_BN_BN_BWD, 2}};
  EXPECT_EQ(train, want_train);
  const std::map<FusedKind, int> want_inf{
      {FusedKind::BN_RELU, 11}, {FusedKind::BN_ADD_RELU, 2}, {FusedKind::BN_ADD, 1}, {FusedKind::BN_BN_ADD_RELU, 2}};
  EXPECT_EQ(count(p.inference.bucket(GraphId::INF_MAIN_A)), want_inf);
  EXPECT_EQ(count(p.inference.bucket(GraphId::INF_MAIN_B)), want_inf);
  // The block end's ReLU backward is never folded: its gradient is the shortcut's too (no RELU_BWD pass there).
  for (const Node& n : p.train.bucket(GraphId::DEEP_FWD_BWD)) {
    if (n.op != OpKind::FUSED_BWD) continue;
    const std::vector<int> step = rp::fused_step_of(n);
    for (std::size_t k = 0; k < n.sub.size(); ++k) {
      if (n.sub[k].op == OpKind::RELU_BWD && step[k] == -1) {
        EXPECT_NE(n.layer_kind, rp::LayerKind::CBR) << "a plain ReLU backward";
      }
    }
  }
}

TEST(Fusion, OperandsAreTheTensorsOfTheReplacedParts) {
  const rp::CompiledPlan p = compile_every_kind(true);
  int checked = 0;
  for (GraphId g : {GraphId::DEEP_FWD_BWD, GraphId::FIRST_LAYER_FWD_A}) {
    for (const Node& n : p.train.bucket(g)) {
      for (const FusedPass& f : n.fusions) {
        if (f.kind == FusedKind::ADD_RELU_BWD) continue;  // ResidualSumsMoveIntoTheConsumingReluBackward
        ASSERT_GE(f.bn, 0);
        const Node& bn = n.sub[static_cast<std::size_t>(f.bn)];
        EXPECT_NE(std::find(f.parts.begin(), f.parts.end(), f.at), f.parts.end());
        switch (f.kind) {
          case FusedKind::ADD_RELU_BN_BN_BWD:
          case FusedKind::ADD_RELU_BN_BWD: {
            const Node& acc = n.sub[static_cast<std::size_t>(f.add)];
            const Node& relu = n.sub[static_cast<std::size_t>(f.relu)];
            ASSERT_EQ(acc.op, OpKind::ACCUMULATE);
            ASSERT_EQ(relu.op, OpKind::RELU_BWD);
            ASSERT_EQ(bn.op, OpKind::BN_BWD);
            if (f.kind == FusedKind::ADD_RELU_BN_BN_BWD) {
              // the shortcut BN's backward, later in the node, reading the same gradient
              ASSERT_GT(f.shortcut_bn, f.bn);
              const Node& sc = n.sub[static_cast<std::size_t>(f.shortcut_bn)];
              ASSERT_EQ(sc.op, OpKind::BN_BWD);
              EXPECT_EQ(f.parts, (std::vector<std::int32_t>{f.add, f.relu, f.bn, f.shortcut_bn}));
              EXPECT_EQ(p.memory.front().owner_of(sc.inputs[1]), p.memory.front().owner_of(relu.outputs[0]));
              EXPECT_EQ(find(f.inputs, "shortcut.x")->id, sc.inputs[0]);
              EXPECT_EQ(find(f.inputs, "shortcut.invstd")->id, sc.inputs[4]);
              EXPECT_EQ(find(f.outputs, "shortcut.dx")->id, sc.outputs[0]);
              EXPECT_EQ(find(f.outputs, "shortcut.dgamma")->id, sc.outputs[1]);
              EXPECT_EQ(find(f.outputs, "shortcut.dbeta")->id, sc.outputs[2]);
              // nothing between the two BN backwards touches what the shortcut's reads or writes
              for (int k = f.bn + 1; k < f.shortcut_bn; ++k)
                for (renaissance::TensorId o : n.sub[static_cast<std::size_t>(k)].outputs)
                  for (renaissance::TensorId t : {sc.inputs[0], sc.outputs[0], sc.outputs[1], sc.outputs[2]})
                    EXPECT_NE(p.memory.front().owner_of(o), p.memory.front().owner_of(t));
            } else {
              EXPECT_EQ(f.parts, (std::vector<std::int32_t>{f.add, f.relu, f.bn}));
            }
            EXPECT_EQ(find(f.inputs, "y")->id, relu.inputs[0]);
            EXPECT_EQ(find(f.inputs, "dy")->id, relu.inputs[1]);
            EXPECT_EQ(find(f.inputs, "addend")->id, acc.inputs[0]);
            EXPECT_EQ(find(f.inputs, "x")->id, bn.inputs[0]);
            EXPECT_EQ(find(f.inputs, "invstd")->id, bn.inputs[4]);
            // the sum's gradient is the BN's, and stored (the shortcut reads it): an output
            EXPECT_EQ(find(f.outputs, "dsum")->id, relu.outputs[0]);
            EXPECT_EQ(p.memory.front().owner_of(bn.inputs[1]), p.memory.front().owner_of(relu.outputs[0]));
            EXPECT_EQ(find(f.outputs, "dx")->id, bn.outputs[0]);
            EXPECT_EQ(find(f.outputs, "dbeta")->id, bn.outputs[2]);
            break;
          }
          case FusedKind::RELU_BN_BWD: {
            const Node& relu = n.sub[static_cast<std::size_t>(f.relu)];
            ASSERT_EQ(bn.op, OpKind::BN_BWD);
            ASSERT_EQ(relu.op, OpKind::RELU_BWD);
            EXPECT_EQ(find(f.inputs, "x")->id, bn.inputs[0]);
            EXPECT_EQ(find(f.inputs, "dy")->id, relu.inputs[1]);
            EXPECT_EQ(find(f.outputs, "dx")->id, bn.outputs[0]);
            EXPECT_EQ(find(f.outputs, "dgamma")->id, bn.outputs[1]);
            // the ReLU gradient is never formed: not an operand
            for (const auto* v : {&f.inputs, &f.outputs})
              for (const rp::FusedOperand& o : *v) EXPECT_NE(o.id, relu.outputs[0]) << o.name;
            break;
          }
          case FusedKind::BN_STATS:
            ASSERT_EQ(bn.op, OpKind::BN_FWD_TRAIN);
            EXPECT_EQ(find(f.inputs, "x")->id, bn.inputs[0]);
            EXPECT_EQ(find(f.saved, "invstd")->id, bn.outputs[3]);
            EXPECT_EQ(find(f.outputs, "y"), nullptr) << "the shortcut BN's output is never formed";
            break;
          default: {
            ASSERT_EQ(bn.op, OpKind::BN_FWD_TRAIN);
            EXPECT_EQ(find(f.inputs, "x")->id, bn.inputs[0]);
            EXPECT_EQ(find(f.outputs, "y")->id, bn.outputs[0]);
            EXPECT_EQ(find(f.saved, "batch_mean")->id, bn.outputs[1]);
            if (renaissance::ops::fused_has_shortcut_bn(f.kind)) {
              const Node& sc = n.sub[static_cast<std::size_t>(f.shortcut_bn)];
              EXPECT_EQ(find(f.inputs, "shortcut.x")->id, sc.inputs[0]);
              EXPECT_EQ(find(f.inputs, "shortcut.invstd")->id, sc.outputs[3]);
              for (const auto* v : {&f.inputs, &f.outputs})
                for (const rp::FusedOperand& o : *v) EXPECT_NE(o.id, sc.outputs[0]) << o.name;
            } else if (f.add >= 0) {
              const Node& add = n.sub[static_cast<std::size_t>(f.add)];
              const auto* s = find(f.inputs, "shortcut");
              ASSERT_NE(s, nullptr);
              EXPECT_TRUE(s->id == add.inputs[0] || s->id == add.inputs[1]);
              EXPECT_NE(s->id, bn.outputs[0]);
            }
            break;
          }
        }
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 20);
}

TEST(Fusion, FusedKernelsOffKeepsThePlainParts) {
  const rp::CompiledPlan on = compile_every_kind(true), off = compile_every_kind(false);
  for (const rp::ComputationGraph* g : {&off.train, &off.inference})
    for (int b = 0; b < rp::kGraphIds; ++b)
      for (const Node& n : g->bucket(static_cast<GraphId>(b))) EXPECT_TRUE(n.fusions.empty());
  EXPECT_NE(on.hash, off.hash);
  // the same graph otherwise
  ASSERT_EQ(on.train.node_count(), off.train.node_count());
  const auto& a = on.train.bucket(GraphId::DEEP_FWD_BWD);
  const auto& b = off.train.bucket(GraphId::DEEP_FWD_BWD);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i].sub, b[i].sub);
  // The fallback is per layer: a ReLU that is not in place leaves its BN to the plain parts, the rest keeps its passes.
  std::size_t k = 0;
  while (k < a.size() && !(a[k].op == OpKind::FUSED_FWD && count({a[k]}).count(FusedKind::BN_RELU))) ++k;
  ASSERT_LT(k, a.size());
  std::vector<FusedPass> decided = a[k].fusions;  // less the ReLU masks, which plan_relu_masks adds afterwards
  for (FusedPass& f : decided)
    for (auto* ops : {&f.inputs, &f.outputs, &f.saved})
      ops->erase(std::remove_if(ops->begin(), ops->end(), [](const rp::FusedOperand& o) { return o.name == "mask"; }),
                 ops->end());
  EXPECT_EQ(rp::decide_fusions(a[k].sub, on.memory[0], a, k), decided) << "the decision is a function of the parts";
  std::vector<Node> parts = a[k].sub;
  for (Node& s : parts)
    if (s.op == OpKind::RELU_FWD) {
      s.outputs[0] = on.baseline.logits;  // any other tensor: the ReLU no longer writes the BN's output in place
      break;
    }
  const std::vector<FusedPass> fallback = rp::decide_fusions(parts, on.memory[0], a, k);
  EXPECT_EQ(fallback.size() + 1, a[k].fusions.size());
}

/// CONV_BWD_DATA nodes that add into their output (cuDNN beta = 1), in the deep backward.
int accumulating_dgrads(const rp::CompiledPlan& p) {
  int n = 0;
  for (const Node* s : flat(p.train.bucket(GraphId::DEEP_FWD_BWD)))
    n += s->op == OpKind::CONV_BWD_DATA && s->accumulate;
  return n;
}

TEST(Fusion, ResidualSumsMoveIntoTheConsumingReluBackward) {
  // ResNet-50: 16 blocks, each with one data gradient that adds into the block input's gradient (c1 in identity
  // blocks, the projection conv in the others). With fold_residual_sums, 15 write their own buffer and the previous
  // block's end ReLU backward sums both addends; the first block's input comes from the max pool, so it still adds.
  Cfg c{"resnet50", true, true, OptimizerKind::MOMENTUM, false, 8, 64, 16, 0, false, 64};
  rp::TrainConfig t = train_config(c);
  const rp::ArchPlan arch = arch_of(c);
  const rp::CompiledPlan fold = rp::Compiler::compile(arch, t);
  t.fold_residual_sums = false;
  const rp::CompiledPlan add = rp::Compiler::compile(arch, t);
  EXPECT_EQ(accumulating_dgrads(add), 16);
  EXPECT_EQ(accumulating_dgrads(fold), 1);
  // Each block's end ReLU backward is followed by its c3 BN's backward: the sum's gradient forms inside that; at the
  // projection blocks' ends the shortcut BN's backward joins the pass (fuse_shortcut_bn_backward).
  EXPECT_EQ(count(fold.train.bucket(GraphId::DEEP_FWD_BWD))[FusedKind::ADD_RELU_BN_BWD], 11);
  EXPECT_EQ(count(fold.train.bucket(GraphId::DEEP_FWD_BWD))[FusedKind::ADD_RELU_BN_BN_BWD], 4);
  EXPECT_EQ(count(fold.train.bucket(GraphId::DEEP_FWD_BWD)).count(FusedKind::ADD_RELU_BWD), 0u);
  EXPECT_EQ(count(add.train.bucket(GraphId::DEEP_FWD_BWD)).count(FusedKind::ADD_RELU_BWD), 0u);
  EXPECT_EQ(count(add.train.bucket(GraphId::DEEP_FWD_BWD)).count(FusedKind::ADD_RELU_BN_BWD), 0u);
  // --fuse-residual-bn-backward off: the sums' ReLU backward in passes of their own, the BN backward plain after it.
  t.fold_residual_sums = true;
  t.fuse_residual_bn_backward = false;
  const rp::CompiledPlan apart = rp::Compiler::compile(arch, t);
  t.fuse_residual_bn_backward = true;
  t.fold_residual_sums = false;
  EXPECT_EQ(count(apart.train.bucket(GraphId::DEEP_FWD_BWD))[FusedKind::ADD_RELU_BWD], 15);
  EXPECT_EQ(count(apart.train.bucket(GraphId::DEEP_FWD_BWD)).count(FusedKind::ADD_RELU_BN_BWD), 0u);
  EXPECT_NE(apart.hash, fold.hash);
  EXPECT_NE(fold.hash, add.hash);
  // The pass: ACCUMULATE(addend -> dy) then RELU_BWD(y, dy -> dx), in the previous block's FUSED_BWD node; the addend
  // is what the next block's dgrad wrote (beta = 0), and the sum itself is no operand.
  int seen = 0;
  const auto& bucket = fold.train.bucket(GraphId::DEEP_FWD_BWD);
  for (std::size_t i = 0; i < bucket.size(); ++i)
    for (const FusedPass& f : bucket[i].fusions) {
      if (f.kind != FusedKind::ADD_RELU_BWD && f.kind != FusedKind::ADD_RELU_BN_BWD &&
          f.kind != FusedKind::ADD_RELU_BN_BN_BWD)
        continue;
      ++seen;
      const Node& acc = bucket[i].sub[static_cast<std::size_t>(f.add)];
      const Node& relu = bucket[i].sub[static_cast<std::size_t>(f.relu)];
      ASSERT_EQ(acc.op, OpKind::ACCUMULATE);
      ASSERT_EQ(relu.op, OpKind::RELU_BWD);
      EXPECT_EQ(find(f.inputs, "addend")->id, acc.inputs[0]);
      EXPECT_EQ(find(f.inputs, "dy")->id, relu.inputs[1]);
      EXPECT_EQ(find(f.outputs, f.kind == FusedKind::ADD_RELU_BWD ? "dx" : "dsum")->id, relu.outputs[0]);
      ASSERT_GT(i, 0u);
      bool written = false;  // by a beta = 0 dgrad of the node before (the next block's backward)
      for (const Node& s : bucket[i - 1].sub)
        written = written || (s.op == OpKind::CONV_BWD_DATA && !s.accumulate && s.outputs[0] == acc.inputs[0]);
      EXPECT_TRUE(written) << "the addend comes from the next block's data gradient";
    }
  EXPECT_EQ(seen, 15);
  // --fused-kernels off keeps the same split (same order of sums), its parts run one by one.
  t.fold_residual_sums = true;
  t.fuse_kernels = false;
  EXPECT_EQ(accumulating_dgrads(rp::Compiler::compile(arch, t)), 1);
}

TEST(Fusion, ResidualBlockEndsKeepTheirReluSignAsOneBitMasks) {
  // TrainConfig::relu_masks (AMP): each training block end whose ReLU backward is an ADD_RELU_BN_BWD pass writes its
  // ReLU's sign into an S_MASK tensor of U8 {N, H, W, ⌈C/8⌉}, and that backward pass names the mask among its inputs.
  // ResNet-50: 15 of the 16 block ends (the last one's ReLU backward follows the pooling, not a residual sum).
  Cfg c{"resnet50", true, true, OptimizerKind::MOMENTUM, false, 8, 64, 16, 0, false, 64};
  rp::TrainConfig t = train_config(c);
  const rp::ArchPlan arch = arch_of(c);
  const rp::CompiledPlan p = rp::Compiler::compile(arch, t);
  const rp::MemoryPlan& mp = p.memory[0];
  std::map<renaissance::TensorId, renaissance::TensorId> written;  // mask -> the forward's y
  int backward = 0;
  for (const Node& n : p.train.bucket(GraphId::DEEP_FWD_BWD))
    for (const FusedPass& f : n.fusions) {
      if (const rp::FusedOperand* m = find(f.outputs, "mask")) {
        EXPECT_TRUE(f.kind == FusedKind::BN_ADD_RELU || f.kind == FusedKind::BN_BN_ADD_RELU);
        const auto& y = mp.tensor(find(f.outputs, "y")->id);
        const auto& mask = mp.tensor(m->id);
        EXPECT_EQ(mask.region, renaissance::Region::S_MASK);
        EXPECT_EQ(mask.dtype, renaissance::DType::U8);
        EXPECT_EQ(mask.shape, (renaissance::Shape{y.shape.n, y.shape.h, y.shape.w, (y.shape.c + 7) / 8}));
        EXPECT_NE(find(f.saved, "mask"), nullptr);
        written[m->id] = find(f.outputs, "y")->id;
      }
      if (const rp::FusedOperand* m = find(f.inputs, "mask")) {
        ++backward;
        ASSERT_TRUE(f.kind == FusedKind::ADD_RELU_BN_BWD || f.kind == FusedKind::ADD_RELU_BN_BN_BWD);
        ASSERT_TRUE(written.count(m->id)) << "a mask read before the forward pass wrote it";
        // the ReLU whose sign it holds: the block end's output (y stays an operand too)
        EXPECT_EQ(mp.owner_of(find(f.inputs, "y")->id), mp.owner_of(written[m->id]));
      }
    }
  EXPECT_EQ(written.size(), 15u);
  EXPECT_EQ(backward, 15);
  // every variant holds the masks with one slot (the lowres variant's shapes are smaller)
  for (const rp::MemoryPlan& v : p.memory)
    for (const auto& [mask, y] : written) EXPECT_EQ(v.tensor(mask).slot_bytes, mp.tensor(mask).slot_bytes);
  // none with relu_masks off (a different plan), in FP32 plans, or with --fused-kernels off
  t.relu_masks = false;
  const rp::CompiledPlan off = rp::Compiler::compile(arch, t);
  EXPECT_NE(off.hash, p.hash);
  for (const Node& n : off.train.bucket(GraphId::DEEP_FWD_BWD))
    for (const FusedPass& f : n.fusions) EXPECT_EQ(find(f.outputs, "mask"), nullptr);
  Cfg c32 = c;
  c32.amp = false;
  const rp::CompiledPlan f32 = rp::Compiler::compile(arch_of(c32), train_config(c32));
  for (const Node& n : f32.train.bucket(GraphId::DEEP_FWD_BWD))
    for (const FusedPass& f : n.fusions) EXPECT_EQ(find(f.outputs, "mask"), nullptr) << "FP32 plan";
  for (const auto& d : off.memory[0].tensors()) EXPECT_NE(d.region, renaissance::Region::S_MASK);
  // serialised with the plan
  const rp::CompiledPlan q = rp::deserialize(rp::serialize(p));
  EXPECT_EQ(q.train, p.train);
  EXPECT_TRUE(q.config.relu_masks);
  EXPECT_EQ(q.hash, p.hash);
}

TEST(Fusion, ProjectionShortcutBnBackwardJoinsTheBlockEndPass) {
  // TrainConfig::fuse_shortcut_bn_backward: ResNet-50's 4 projection blocks, whose shortcut BN backward reads the
  // gradient their end's sum+relu+bn backward forms; off, each runs apart (the plain BN_BWD part) and the pass is
  // ADD_RELU_BN_BWD. The same arena either way (the shortcut's data gradient is written earlier but the fallback's
  // lifetimes already hold it), a different plan.
  Cfg c{"resnet50", true, true, OptimizerKind::MOMENTUM, false, 256, 60000, 10000, 0, false, 0};
  rp::TrainConfig t = train_config(c);
  const rp::ArchPlan arch = arch_of(c);
  const rp::CompiledPlan on = rp::Compiler::compile(arch, t);
  t.fuse_shortcut_bn_backward = false;
  const rp::CompiledPlan off = rp::Compiler::compile(arch, t);
  const auto a = count(on.train.bucket(GraphId::DEEP_FWD_BWD)), b = count(off.train.bucket(GraphId::DEEP_FWD_BWD));
  EXPECT_EQ(a.at(FusedKind::ADD_RELU_BN_BN_BWD), 4);
  EXPECT_EQ(a.at(FusedKind::ADD_RELU_BN_BWD), 11);
  EXPECT_EQ(b.count(FusedKind::ADD_RELU_BN_BN_BWD), 0u);
  EXPECT_EQ(b.at(FusedKind::ADD_RELU_BN_BWD), 15);
  EXPECT_NE(on.hash, off.hash);
  EXPECT_LE(on.arena_bytes(), off.arena_bytes() + off.arena_bytes() / 100);
  std::printf("ResNet-50 AMP b256 arena: %lld bytes with the shortcut BN backward joined, %lld apart\n",
              static_cast<long long>(on.arena_bytes()), static_cast<long long>(off.arena_bytes()));
  // the parts the pass replaces run nowhere else (the fallback runs them in place)
  for (const Node& n : on.train.bucket(GraphId::DEEP_FWD_BWD))
    for (const FusedPass& f : n.fusions)
      if (f.kind == FusedKind::ADD_RELU_BN_BN_BWD) {
        const std::vector<int> step = rp::fused_step_of(n);
        EXPECT_EQ(step[static_cast<std::size_t>(f.shortcut_bn)], -2);
      }
  const rp::CompiledPlan q = rp::deserialize(rp::serialize(off));
  EXPECT_FALSE(q.config.fuse_shortcut_bn_backward);
  EXPECT_EQ(q.hash, off.hash);
}

TEST(Fusion, SerialisationCarriesThePasses) {
  const rp::CompiledPlan p = compile_every_kind(true);
  const rp::CompiledPlan q = rp::deserialize(rp::serialize(p));
  EXPECT_EQ(q.train, p.train);
  EXPECT_EQ(q.inference, p.inference);
  EXPECT_EQ(q.config.fuse_kernels, true);
  EXPECT_EQ(q.config.fold_residual_sums, true);
  EXPECT_EQ(q.hash, p.hash);
  // a pass that names a part out of range is refused
  rp::CompiledPlan bad = p;
  for (Node& n : bad.train.mutable_bucket(GraphId::DEEP_FWD_BWD))
    if (!n.fusions.empty()) {
      n.fusions[0].parts.push_back(999);
      break;
    }
  bad.hash = 0;
  EXPECT_THROW(rp::deserialize(rp::serialize(bad)), renaissance::Error);
}

TEST(Fusion, RecomputedBnReluIsOnePassBeforeItsFirstBackwardReader) {
  // --recompute bn-relu (plan/recompute.h): each inner BN -> ReLU of the deep layers (1 per basic block, 2 per
  // bottleneck and per inverted residual: 10; the first layer's CBR has buckets of its own and is kept) is formed
  // again in the backward as one BN_RELU_RECOMPUTE pass, and the backward reads only that copy.
  const rp::CompiledPlan kept = compile_every_kind(true);
  const rp::CompiledPlan p = compile_every_kind(true, true);
  const rp::MemoryPlan& mp = p.memory[0];
  auto owner = [&](renaissance::TensorId id) {
    const auto it = mp.aliases().find(id);
    return it == mp.aliases().end() ? id : it->second;
  };
  const std::vector<Node>& deep = p.train.bucket(GraphId::DEEP_FWD_BWD);
  auto train = count(deep);
  EXPECT_EQ(train[FusedKind::BN_RELU_RECOMPUTE], 10);
  train.erase(FusedKind::BN_RELU_RECOMPUTE);
  EXPECT_EQ(train, count(kept.train.bucket(GraphId::DEEP_FWD_BWD))) << "the other passes are unchanged";
  EXPECT_EQ(count(p.inference.bucket(GraphId::INF_MAIN_A)), count(kept.inference.bucket(GraphId::INF_MAIN_A)));
  std::size_t backward_begin = 0;
  while (backward_begin < deep.size() && deep[backward_begin].op != OpKind::FUSED_BWD) ++backward_begin;
  int checked = 0;
  for (std::size_t i = backward_begin; i < deep.size(); ++i) {
    const Node& n = deep[i];
    for (const FusedPass& f : n.fusions) {
      if (f.kind != FusedKind::BN_RELU_RECOMPUTE) continue;
      const Node& apply = n.sub[static_cast<std::size_t>(f.bn)];
      const Node& relu = n.sub[static_cast<std::size_t>(f.relu)];
      ASSERT_EQ(apply.op, OpKind::BN_APPLY);
      ASSERT_EQ(relu.op, OpKind::RELU_FWD);
      const renaissance::TensorId copy = apply.outputs[0];
      EXPECT_EQ(relu.inputs[0], copy);
      EXPECT_EQ(relu.outputs[0], copy);
      EXPECT_NE(mp.tensor(copy).name.find(".recomputed"), std::string::npos);
      EXPECT_EQ(find(f.outputs, "y")->id, copy);
      EXPECT_EQ(find(f.inputs, "batch_mean")->id, apply.inputs[3]);
      // the forward BN this copies: same input and statistics
      const Node* bn = nullptr;
      for (std::size_t j = 0; j < backward_begin && !bn; ++j)
        for (const Node& s : deep[j].sub)
          if (s.op == OpKind::BN_FWD_TRAIN && s.inputs[0] == apply.inputs[0]) bn = &s;
      ASSERT_NE(bn, nullptr);
      EXPECT_EQ(apply.inputs[3], bn->outputs[1]);
      EXPECT_EQ(apply.inputs[4], bn->outputs[3]);
      // no backward node reads the value the forward formed; the copy is first written by this pass
      const renaissance::TensorId kept_value = owner(bn->outputs[0]);
      const std::vector<Node> backward(deep.begin() + static_cast<std::ptrdiff_t>(backward_begin), deep.end());
      visit(backward, [&](const Node& s) {
        for (renaissance::TensorId t : s.inputs) EXPECT_NE(owner(t), kept_value) << rp::op_kind_name(s.op);
      });
      // the forward's value is dead before the backward begins, the copy's life is within the backward
      const rp::Lifetime& fwd = mp.lifetimes().at(kept_value);
      const rp::Lifetime& bwd = mp.lifetimes().at(copy);
      ASSERT_FALSE(fwd.empty());
      ASSERT_EQ(bwd.size(), 1u);
      EXPECT_LT(fwd.front().last, bwd.front().first);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 10);
  // each of these copies is read by the next convolution's weight gradient: all run with the passes
  for (const Node& n : deep)
    for (const FusedPass& f : n.fusions) EXPECT_FALSE(f.fallback_only);
  {  // MobileNetV2's last 1x1 CBR feeds the pooling, whose backward reads nothing of it: its copy is for the plain
     // ReLU backward alone, which RELU_BN_BWD replaces, so the backends skip that pass
    Cfg c{"mobilenet_v2", true, true, OptimizerKind::MOMENTUM, false, 256, 60000, 10000, 0, false, 0, true, true};
    const rp::CompiledPlan m = compile(c);
    int run = 0, fallback = 0;
    for (const Node& n : m.train.bucket(GraphId::DEEP_FWD_BWD))
      for (const FusedPass& f : n.fusions)
        if (f.kind == FusedKind::BN_RELU_RECOMPUTE) (f.fallback_only ? fallback : run) += 1;
    EXPECT_EQ(run, 33);  // 16 inverted residuals x 2, and cbr2 (the depthwise CBR of the first block, t = 1)
    EXPECT_EQ(fallback, 1);
    // its stem's output is read by the deep backward (cbr2's weight gradient): the first layer keeps it
    EXPECT_EQ(m.memory[0].find("cbr1.relu.y.recomputed"), renaissance::kNoTensor);
  }
  {  // ResNet-50's stem output is read backward only by its own ReLU backward (the max pool's reads its argmax):
     // copied in both first-layer backward buckets (one tensor), for the plain parts alone; 2 per bottleneck deep
    Cfg c{"resnet50", true, true, OptimizerKind::MOMENTUM, false, 256, 60000, 10000, 0, false, 0, true, true};
    const rp::CompiledPlan m = compile(c);
    int deep = 0;
    for (const Node& n : m.train.bucket(GraphId::DEEP_FWD_BWD))
      for (const FusedPass& f : n.fusions) deep += f.kind == FusedKind::BN_RELU_RECOMPUTE && !f.fallback_only;
    EXPECT_EQ(deep, 2 * 16);
    const renaissance::TensorId stem = m.memory[0].find("cbr1.relu.y.recomputed");
    ASSERT_NE(stem, renaissance::kNoTensor);
    for (GraphId g : {GraphId::FIRST_LAYER_BWD_A, GraphId::FIRST_LAYER_BWD_B}) {
      int passes = 0;
      for (const Node& n : m.train.bucket(g))
        for (const FusedPass& f : n.fusions)
          if (f.kind == FusedKind::BN_RELU_RECOMPUTE) {
            ++passes;
            EXPECT_TRUE(f.fallback_only);
            EXPECT_EQ(find(f.outputs, "y")->id, stem);
          }
      EXPECT_EQ(passes, 1) << rp::graph_id_name(g);
    }
  }
  EXPECT_LT(mp.pool_peak_live_bytes(), kept.memory[0].pool_peak_live_bytes());
  // serialised with the plan; off and on are different plans
  const rp::CompiledPlan q = rp::deserialize(rp::serialize(p));
  EXPECT_EQ(q.train, p.train);
  EXPECT_TRUE(q.config.recompute_bn_relu);
  EXPECT_EQ(q.hash, p.hash);
  EXPECT_NE(p.hash, kept.hash);
}

TEST(Fusion, ResNet50PassesAndTheirBytes) {
  // ResNet-50 AMP at batch 256 (the benchmark's plan): 16 blocks, 4 with a projection shortcut.
  Cfg c{"resnet50", true, true, OptimizerKind::MOMENTUM, false, 256, 60000, 10000, 0, false, 0};
  const rp::CompiledPlan p = compile(c);
  const auto train = count(p.train.bucket(GraphId::FIRST_LAYER_FWD_A)) + count(p.train.bucket(GraphId::DEEP_FWD_BWD)) +
                     count(p.train.bucket(GraphId::FIRST_LAYER_BWD_A));
  EXPECT_EQ(train.at(FusedKind::BN_RELU), 1 + 16 * 2);
  EXPECT_EQ(train.at(FusedKind::BN_ADD_RELU), 12);
  EXPECT_EQ(train.at(FusedKind::BN_BN_ADD_RELU), 4);
  EXPECT_EQ(train.at(FusedKind::BN_STATS), 4);
  EXPECT_EQ(train.at(FusedKind::RELU_BN_BWD), 1 + 16 * 2);  // the stem (first layer) in FIRST_LAYER_BWD_A
  // A projection block's apply reads the shortcut's input at the block's end: no part of the main branch in between
  // may write its bytes (the runtimes checked this by address at prepare time; the plan's lifetimes now say it).
  const rp::MemoryPlan& m = p.memory[0];
  auto overlap = [&](renaissance::TensorId a, renaissance::TensorId b) {
    const auto& x = m.tensor(a);
    const auto& y = m.tensor(b);
    return x.offset < y.offset + y.slot_bytes && y.offset < x.offset + x.slot_bytes;
  };
  int projections = 0;
  for (const Node& n : p.train.bucket(GraphId::DEEP_FWD_BWD))
    for (const FusedPass& f : n.fusions) {
      if (!renaissance::ops::fused_has_shortcut_bn(f.kind)) continue;
      ++projections;
      const renaissance::TensorId xs = find(f.inputs, "shortcut.x")->id;
      for (int k = f.shortcut_bn + 1; k < f.at; ++k)
        for (renaissance::TensorId o : n.sub[static_cast<std::size_t>(k)].outputs) {
          if (rp::is_pool_region(m.tensor(o).region)) {
            EXPECT_FALSE(overlap(o, xs)) << m.tensor(o).name << " overwrites " << m.tensor(xs).name;
          }
        }
    }
  EXPECT_EQ(projections, 4);
}

}  // namespace
