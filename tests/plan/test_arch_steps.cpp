// One test (or more) per ArchPlan step function (DESIGN §3), each against hand-worked expectations.
#include "plan_test_util.h"

#include <renaissance/core/dtensor.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/plan/arch_plan.h>

#include <algorithm>
#include <map>

using namespace plan_test;
using K = LayerKind;
using rb::BlockKind;
namespace steps = rp::steps;

namespace {

rp::ArchLayer L(K kind, rp::LayerParams p = rp::NoParams{}, std::string name = {}) {
  rp::ArchLayer l;
  l.kind = kind;
  l.params = std::move(p);
  l.name = std::move(name);
  return l;
}

rp::BuildOptions plain() { return {}; }
rp::BuildOptions amp_only() {
  rp::BuildOptions o;
  o.amp = true;
  return o;
}
rp::BuildOptions fused() {
  rp::BuildOptions o;
  o.amp = true;
  o.fuse = true;
  return o;
}

/// Steps 1-6 and 5, the way ArchPlan::build runs them (shapes known, flatten normalised).
steps::Layers shaped(const rb::BluePrint& bp, const rp::BuildOptions& o, Shape* input_out = nullptr) {
  rp::ArchPlan p = rp::ArchPlan::from_blueprint(bp, o);
  steps::rename_bn(p.layers);
  steps::place_softmax_ce(p.layers, 0);
  steps::insert_identity_placeholders(p.layers);
  if (o.amp) p.input = steps::pad_first_conv_channels(p.layers, p.input);
  steps::infer_shapes(p.layers, p.input);
  steps::normalize_flatten(p.layers, p.input, o.amp);
  if (input_out) *input_out = p.input;
  return p.layers;
}

rb::Layer bottleneck_by_hand(std::int64_t mid, std::int64_t out, std::int64_t stride, bool projection) {
  rb::Layer main = rb::seq(rb::conv(mid, 1), rb::bn(), rb::relu(), rb::conv(mid, 3, stride, 1), rb::bn(), rb::relu(),
                           rb::conv(out, 1), rb::bn());
  rb::Layer sc = projection ? rb::seq(rb::conv(out, 1, stride), rb::bn()) : rb::seq();
  return rb::seq(rb::add2(std::move(main), std::move(sc)), rb::relu());
}
rb::Layer basic_by_hand(std::int64_t out, std::int64_t stride, bool projection) {
  rb::Layer main = rb::seq(rb::conv(out, 3, stride, 1), rb::bn(), rb::relu(), rb::conv(out, 3, 1, 1), rb::bn());
  rb::Layer sc = projection ? rb::seq(rb::conv(out, 1, stride), rb::bn()) : rb::seq();
  return rb::seq(rb::add2(std::move(main), std::move(sc)), rb::relu());
}
rb::Layer inv_residual_identity_by_hand(std::int64_t mid, std::int64_t out) {
  return rb::add2(rb::seq(rb::conv(mid, 1), rb::bn(), rb::relu(), rb::dwconv(3, 1, 1), rb::bn(), rb::relu(),
                          rb::conv(out, 1), rb::bn()),
                  rb::seq());
}

}  // namespace

// ---- step 1: expand_tree ---------------------------------------------------------------------------

TEST(ExpandTree, FlattensTreeWithMarkersAndRepeatNames) {
  const auto bp = model(rb::seq(
      rb::conv(8, 3, 1, 1).named("c"), rb::repeat(3, rb::seq(rb::conv(8, 3, 1, 1).named("r"), rb::relu())),
      rb::cbr(16, 3, 1, 1).named("s"), rb::add2(rb::seq(rb::conv(16, 3, 1, 1), rb::bn()), rb::seq()).named("res"),
      rb::repeat(2, rb::repeat(2, rb::relu().named("x"))), rb::gap_fc(10).named("head"), rb::softmax_ce(10)));
  const steps::Layers v = steps::expand_tree(bp, plain());
  const std::vector<K> want = {K::Conv, K::Conv, K::Relu,    K::Conv,     K::Relu,      K::Conv,
                               K::Relu, K::Conv, K::Bn,      K::Relu,     K::Add2Start, K::Add2ShortcutEnd,
                               K::Conv, K::Bn,   K::Add2End, K::Relu,     K::Relu,      K::Relu,
                               K::Relu, K::Gap,  K::Fc,      K::SoftmaxCE};
  ASSERT_EQ(kinds(v), want) << kind_list(v);
  const std::vector<std::string> names = {"c",     "r.0",      "",     "r.1",    "",          "r.2",
                                          "",      "s",        "s.bn", "s.relu", "res.start", "res.shortcut_end",
                                          "",      "",         "res",  "x.0.0",  "x.0.1",     "x.1.0",
                                          "x.1.1", "head.gap", "head", ""};
  for (std::size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i].name, names[i]) << i;
  EXPECT_EQ(v[0].conv().out_c, 8);
  EXPECT_EQ(v[0].conv().k, 3);
  EXPECT_EQ(v[0].conv().pad, 1);
  EXPECT_EQ(v[20].fc().out, 10);
  EXPECT_EQ(v[21].fc().out, 10);
  // Under fuse, cbr() stays one CBR.
  const steps::Layers f = steps::expand_tree(bp, fused());
  EXPECT_EQ(f[7].kind, K::CBR);
  EXPECT_EQ(f[7].name, "s");
  EXPECT_EQ(f[8].kind, K::Add2Start);
}

TEST(ExpandTree, FuseWithoutAmpFusesTheSameLayers) {
  // FP32 and AMP plans fuse the same layers (the compiler's fused passes run in either precision); only the AMP
  // padding of the first convolution's input channels differs.
  for (const char* name : {"resnet50", "resnet18_cifar", "mobilenet_v2", "fmnist_cnn"}) {
    rp::BuildOptions fp32, amp;
    fp32.fuse = amp.fuse = amp.amp = true;
    const rp::ArchPlan a = rp::ArchPlan::build(rb::zoo_model(name), fp32);
    const rp::ArchPlan b = rp::ArchPlan::build(rb::zoo_model(name), amp);
    ASSERT_EQ(a.layers.size(), b.layers.size()) << name;
    int fused = 0;
    for (std::size_t i = 0; i < a.layers.size(); ++i) {
      EXPECT_EQ(a.layers[i].kind, b.layers[i].kind) << name << " layer " << i;
      EXPECT_EQ(a.layers[i].name, b.layers[i].name) << name << " layer " << i;
      fused += rp::is_fused(a.layers[i].kind) ? 1 : 0;
    }
    EXPECT_GT(fused, 0) << name;
  }
}

TEST(ExpandTree, BlockWithFuseMapsToFusedKinds) {
  // channels: 64 -> 256 -> 256 -> 512 -> 512 -> 256 -> 256 -> 256 -> 320
  const auto bp = model(rb::seq(rb::conv(64, 3, 1, 1), rb::block(64, 256, BlockKind::RESNET_1_3_1, 1),  // C changes
                                rb::block(64, 256, BlockKind::RESNET_1_3_1, 1),                         // same
                                rb::block(128, 512, BlockKind::RESNET_1_3_1, 2),                        // stride
                                rb::block(0, 512, BlockKind::RESNET_3_3, 1),                            // same
                                rb::block(0, 256, BlockKind::RESNET_3_3, 1),                            // C changes
                                rb::block(1536, 256, BlockKind::MBV2_INV_RESIDUAL, 1),                  // same
                                rb::block(1536, 256, BlockKind::MBV2_INV_RESIDUAL, 2),                  // stride
                                rb::block(1536, 320, BlockKind::MBV2_INV_RESIDUAL, 1),                  // C changes
                                rb::block(0, 320, BlockKind::RESNET_3_3, 2),                            // stride
                                rb::gap_fc(10), rb::softmax_ce(10)),
                        64);
  const steps::Layers v = steps::expand_tree(bp, fused());
  const std::vector<K> want = {K::Conv,
                               K::BottleneckProjection,
                               K::BottleneckIdentity,
                               K::BottleneckProjection,
                               K::BasicBlockIdentity,
                               K::BasicBlockProjection,
                               K::InvResidualIdentity,
                               K::InvResidualNoShortcut,
                               K::InvResidualNoShortcut,
                               K::BasicBlockProjection,
                               K::Gap,
                               K::Fc,
                               K::SoftmaxCE};
  ASSERT_EQ(kinds(v), want) << kind_list(v);
  EXPECT_TRUE(v[1].block() == (rp::BlockParams{64, 256, 1}));
  EXPECT_TRUE(v[3].block() == (rp::BlockParams{128, 512, 2}));
  EXPECT_TRUE(v[4].block() == (rp::BlockParams{512, 512, 1}));  // basic block: mid = out
  EXPECT_TRUE(v[7].block() == (rp::BlockParams{1536, 256, 2}));
}

TEST(ExpandTree, BlockWithoutFuseExpandsToPlainLayers) {
  const auto bp =
      model(rb::seq(rb::conv(64, 3, 1, 1), rb::block(32, 128, BlockKind::RESNET_1_3_1, 2),
                    rb::block(0, 128, BlockKind::RESNET_3_3, 1), rb::block(768, 128, BlockKind::MBV2_INV_RESIDUAL, 1),
                    rb::block(768, 160, BlockKind::MBV2_INV_RESIDUAL, 2)),
            16);
  const steps::Layers v = steps::expand_tree(bp, plain());
  const std::vector<K> want = {
      K::Conv,
      // bottleneck with projection: shortcut first, then main, then the post-add ReLU
      K::Add2Start, K::Conv, K::Bn, K::Add2ShortcutEnd, K::Conv, K::Bn, K::Relu, K::Conv, K::Bn, K::Relu, K::Conv,
      K::Bn, K::Add2End, K::Relu,
      // basic block, identity
      K::Add2Start, K::Add2ShortcutEnd, K::Conv, K::Bn, K::Relu, K::Conv, K::Bn, K::Add2End, K::Relu,
      // inverted residual, identity: no ReLU after the add
      K::Add2Start, K::Add2ShortcutEnd, K::Conv, K::Bn, K::Relu, K::Conv, K::Bn, K::Relu, K::Conv, K::Bn, K::Add2End,
      // inverted residual, no shortcut
      K::Conv, K::Bn, K::Relu, K::Conv, K::Bn, K::Relu, K::Conv, K::Bn};
  ASSERT_EQ(kinds(v), want) << kind_list(v);
  // bottleneck: projection 1×1 stride 2, the stride sits on the 3×3 (torchvision v1.5)
  EXPECT_TRUE(v[2].conv() == (rp::ConvParams{128, 1, 2, 0, 1}));
  EXPECT_TRUE(v[5].conv() == (rp::ConvParams{32, 1, 1, 0, 1}));
  EXPECT_TRUE(v[8].conv() == (rp::ConvParams{32, 3, 2, 1, 1}));
  EXPECT_TRUE(v[11].conv() == (rp::ConvParams{128, 1, 1, 0, 1}));
  EXPECT_TRUE(v[17].conv() == (rp::ConvParams{128, 3, 1, 1, 1}));
  // inverted residual: expand 1×1, depthwise 3×3 (groups = mid), project 1×1
  EXPECT_TRUE(v[26].conv() == (rp::ConvParams{768, 1, 1, 0, 1}));
  EXPECT_TRUE(v[29].conv() == (rp::ConvParams{768, 3, 1, 1, 768}));
  EXPECT_TRUE(v[38].conv() == (rp::ConvParams{768, 3, 2, 1, 768}));
  EXPECT_TRUE(v[41].conv() == (rp::ConvParams{160, 1, 1, 0, 1}));
}

TEST(ExpandTree, RejectsBadFields) {
  expect_error([] { steps::expand_tree(model(rb::seq(rb::relu(), rb::conv(-4, 3))), plain()); },
               {"layers[1]", "conv", "'out'", "-4"});
  expect_error([] { steps::expand_tree(model(rb::seq(rb::maxpool(0, 1))), plain()); }, {"layers[0]", "'k'"});
  expect_error(
      [] { steps::expand_tree(model(rb::seq(rb::flatten(), rb::block(4, 8, BlockKind::RESNET_1_3_1))), plain()); },
      {"layers[1]", "input channels"});
  expect_error([] { steps::expand_tree(model(rb::seq(rb::repeat(0, rb::relu()))), plain()); }, {"layers[0]", "repeat"});
}

// ---- step 2: rename_bn ------------------------------------------------------------------------------

TEST(RenameBn, OneDAfterFcFlattenGapLookingBackPastActivations) {
  steps::Layers v = {L(K::Bn),  // 0: first layer -> 2d
                     L(K::Conv, rp::ConvParams{}),
                     L(K::Bn),  // 2: 2d
                     L(K::Fc, rp::FcParams{4}),
                     L(K::Bn),  // 4: 1d
                     L(K::Fc, rp::FcParams{4}),
                     L(K::Relu),
                     L(K::Bn),  // 7: 1d past ReLU
                     L(K::Flatten),
                     L(K::Bn),  // 9: 1d
                     L(K::Gap),
                     L(K::Identity),
                     L(K::Tanh),
                     L(K::Bn),  // 13: 1d past Identity, Tanh
                     L(K::Conv, rp::ConvParams{}),
                     L(K::Relu),
                     L(K::Bn),  // 16: 2d past ReLU
                     L(K::Add2End),
                     L(K::Bn),  // 18: 2d (marker = conv context)
                     L(K::Fc, rp::FcParams{4}),
                     L(K::ChannelPadding, rp::FcParams{8}),
                     L(K::Bn),  // 21: 1d
                     L(K::GapFC, rp::FcParams{4}),
                     L(K::Bn),  // 23: 1d
                     L(K::MaxPool, rp::PoolParams{}),
                     L(K::Bn),  // 25: 2d
                     L(K::Add2Start),
                     L(K::Bn)};  // 27: 2d
  steps::rename_bn(v);
  const std::map<std::size_t, K> want = {{0, K::Bn2d},  {2, K::Bn2d},  {4, K::Bn1d},  {7, K::Bn1d},
                                         {9, K::Bn1d},  {13, K::Bn1d}, {16, K::Bn2d}, {18, K::Bn2d},
                                         {21, K::Bn1d}, {23, K::Bn1d}, {25, K::Bn2d}, {27, K::Bn2d}};
  for (auto [i, k] : want) EXPECT_EQ(v[i].kind, k) << "layer " << i << ": " << rp::layer_kind_name(v[i].kind);
  for (const auto& l : v) EXPECT_NE(l.kind, K::Bn);
}

// ---- step 3: place_softmax_ce -----------------------------------------------------------------------

TEST(PlaceSoftmaxCE, MovedToTheEndOnlyOnce) {
  steps::Layers v = {L(K::Conv, rp::ConvParams{}), L(K::SoftmaxCE, rp::FcParams{10}), L(K::Fc, rp::FcParams{10}),
                     L(K::SoftmaxCE, rp::FcParams{10}, "loss"), L(K::Relu)};
  steps::Layers w = v;
  EXPECT_EQ(steps::place_softmax_ce(v, 0), 10);
  ASSERT_EQ(kinds(v), (std::vector<K>{K::Conv, K::Fc, K::Relu, K::SoftmaxCE}));
  EXPECT_EQ(v.back().fc().out, 10);
  EXPECT_EQ(v.back().name, "loss");
  // an explicit number of classes wins
  EXPECT_EQ(steps::place_softmax_ce(w, 7), 7);
  EXPECT_EQ(w.back().fc().out, 7);
  EXPECT_EQ(std::count_if(w.begin(), w.end(), [](const rp::ArchLayer& l) { return l.kind == K::SoftmaxCE; }), 1);
  // none at all: appended when the caller says how many classes
  steps::Layers none = {L(K::Fc, rp::FcParams{3})};
  EXPECT_EQ(steps::place_softmax_ce(none, 3), 3);
  EXPECT_EQ(kinds(none), (std::vector<K>{K::Fc, K::SoftmaxCE}));
  steps::Layers bad = {L(K::Fc, rp::FcParams{3})};
  expect_error([&] { steps::place_softmax_ce(bad, 0); }, {"softmax_ce"});
  // Two that disagree on the classes: an error naming both counts (the last one used to win without a word).
  steps::Layers two = {L(K::SoftmaxCE, rp::FcParams{128}), L(K::Fc, rp::FcParams{10}),
                       L(K::SoftmaxCE, rp::FcParams{10}, "loss")};
  expect_error([&] { steps::place_softmax_ce(two, 0); },
               {"layer 'loss'", "a second softmax_ce with 10 classes, after one with 128"});
}

// ---- step 4: insert_identity_placeholders -----------------------------------------------------------

TEST(InsertIdentity, OnlyEmptyShortcutsGetOne) {
  steps::Layers v = {L(K::Add2Start),
                     L(K::Add2ShortcutEnd),
                     L(K::Conv, rp::ConvParams{}),
                     L(K::Add2End),
                     L(K::Add2Start),
                     L(K::Conv, rp::ConvParams{}),
                     L(K::Add2ShortcutEnd),
                     L(K::Relu),
                     L(K::Add2End),
                     L(K::Add2Start),
                     L(K::Add2ShortcutEnd),
                     L(K::Add2End)};
  steps::insert_identity_placeholders(v);
  EXPECT_EQ(kinds(v), (std::vector<K>{K::Add2Start, K::Identity, K::Add2ShortcutEnd, K::Conv, K::Add2End, K::Add2Start,
                                      K::Conv, K::Add2ShortcutEnd, K::Relu, K::Add2End, K::Add2Start, K::Identity,
                                      K::Add2ShortcutEnd, K::Add2End}))
      << kind_list(v);
}

// ---- step 6: infer_shapes ---------------------------------------------------------------------------

TEST(InferShapes, ConvAndPoolFormulas) {
  auto bp = model(rb::seq(rb::conv(16, 7, 2, 3), rb::bn(), rb::relu(), rb::maxpool(3, 2, 1), rb::conv(32, 3, 2, 1),
                          rb::dwconv(3, 2, 1), rb::conv(10, 1), rb::gap(), rb::fc(10), rb::softmax_ce(10)),
                  224);
  steps::Layers v = steps::expand_tree(bp, plain());
  steps::rename_bn(v);
  steps::infer_shapes(v, Shape{1, 224, 224, 3});
  // floor((224 + 6 - 7) / 2) + 1 = 112; maxpool floor((112 + 2 - 3) / 2) + 1 = 56; conv 3/2/1: 28; dw: 14
  EXPECT_EQ(v[0].out_shape, (Shape{1, 112, 112, 16}));
  EXPECT_EQ(v[2].out_shape, (Shape{1, 112, 112, 16}));
  EXPECT_EQ(v[3].out_shape, (Shape{1, 56, 56, 16}));
  EXPECT_EQ(v[4].out_shape, (Shape{1, 28, 28, 32}));
  EXPECT_EQ(v[5].in_shape, (Shape{1, 28, 28, 32}));
  EXPECT_EQ(v[5].out_shape, (Shape{1, 14, 14, 32}));
  EXPECT_EQ(v[5].conv().groups, 32);  // depthwise resolved
  EXPECT_EQ(v[5].conv().out_c, 32);
  EXPECT_EQ(v[6].out_shape, (Shape{1, 14, 14, 10}));
  EXPECT_EQ(v[7].out_shape, (Shape{1, 1, 1, 10}));
  EXPECT_EQ(v[8].out_shape, (Shape{1, 1, 1, 10}));
  EXPECT_EQ(v[9].out_shape, (Shape{1, 1, 1, 10}));

  // Non-square, no padding, stride 3: h (17-5)/3+1 = 5, w (11-5)/3+1 = 3; maxpool 2/2: 2 x 1; any batch size.
  auto odd = model(rb::seq(rb::conv(8, 5, 3, 0), rb::maxpool(2, 2), rb::gap_fc(2), rb::softmax_ce(2)));
  steps::Layers o = steps::expand_tree(odd, plain());
  steps::infer_shapes(o, Shape{6, 17, 11, 3});
  EXPECT_EQ(o[0].out_shape, (Shape{6, 5, 3, 8}));
  EXPECT_EQ(o[1].out_shape, (Shape{6, 2, 1, 8}));
  // grouped conv: groups must divide both channel counts
  auto grouped = model(rb::seq(rb::conv(8, 3, 1, 1, 2), rb::conv(6, 3, 1, 1, 4)));
  steps::Layers g = steps::expand_tree(grouped, plain());
  expect_error([&] { steps::infer_shapes(g, Shape{1, 8, 8, 4}); }, {"groups = 4"});
}

TEST(InferShapes, Add2BranchesMustAgree) {
  auto bp = model(rb::seq(rb::add2(rb::seq(rb::conv(8, 3, 1, 1), rb::bn()), rb::seq()).named("res")));
  steps::Layers v = steps::expand_tree(bp, plain());
  steps::rename_bn(v);
  steps::insert_identity_placeholders(v);
  expect_error([&] { steps::infer_shapes(v, Shape{1, 8, 8, 3}); }, {"res", "add2 branches disagree", "8x8x8", "8x8x3"});
}

// ---- step 5: normalize_flatten ----------------------------------------------------------------------

TEST(NormalizeFlatten, SpatialInputToFcGetsAFlatten) {
  const auto v = shaped(
      model(rb::seq(rb::conv(8, 3, 1, 1), rb::relu(), rb::maxpool(2, 2), rb::fc(10), rb::softmax_ce(10))), plain());
  ASSERT_EQ(kinds(v), (std::vector<K>{K::Conv, K::Relu, K::MaxPool, K::Flatten, K::Fc, K::SoftmaxCE})) << kind_list(v);
  EXPECT_EQ(v[3].in_shape, (Shape{1, 4, 4, 8}));
  EXPECT_EQ(v[3].out_shape, (Shape{1, 1, 1, 128}));
  EXPECT_EQ(v[4].in_shape, (Shape{1, 1, 1, 128}));
}

TEST(NormalizeFlatten, GapToFcNeedsNoneAndAUserFlattenAfterGapIsRemoved) {
  const auto a = shaped(model(rb::seq(rb::conv(64, 3, 1, 1), rb::gap(), rb::fc(10), rb::softmax_ce(10))), plain());
  EXPECT_EQ(kinds(a), (std::vector<K>{K::Conv, K::Gap, K::Fc, K::SoftmaxCE})) << kind_list(a);
  const auto b =
      shaped(model(rb::seq(rb::conv(64, 3, 1, 1), rb::gap(), rb::flatten(), rb::fc(10), rb::softmax_ce(10))), plain());
  EXPECT_EQ(kinds(b), (std::vector<K>{K::Conv, K::Gap, K::Fc, K::SoftmaxCE})) << kind_list(b);
  const auto c = shaped(model(rb::seq(rb::conv(64, 3, 1, 1), rb::gap(), rb::flatten(), rb::fc(10), rb::softmax_ce(10))),
                        amp_only());
  EXPECT_EQ(kinds(c), (std::vector<K>{K::Conv, K::Gap, K::Fc, K::SoftmaxCE})) << kind_list(c);
}

TEST(NormalizeFlatten, AmpFcWithChannelsNotMultipleOf8GetsOne) {
  const auto bp = model(rb::seq(rb::conv(12, 3, 1, 1), rb::gap(), rb::fc(10), rb::softmax_ce(10)));
  const auto a = shaped(bp, amp_only());
  EXPECT_EQ(kinds(a), (std::vector<K>{K::Conv, K::Gap, K::Flatten, K::Fc, K::SoftmaxCE})) << kind_list(a);
  const auto p = shaped(bp, plain());
  EXPECT_EQ(kinds(p), (std::vector<K>{K::Conv, K::Gap, K::Fc, K::SoftmaxCE})) << kind_list(p);
}

TEST(NormalizeFlatten, SpatialLogitsBeforeSoftmaxGetOne) {
  rb::BluePrint bp = model(rb::seq(rb::conv(5, 1), rb::softmax_ce(20)));
  bp.in_h = 2;
  bp.in_w = 2;
  const auto v = shaped(bp, plain());
  EXPECT_EQ(kinds(v), (std::vector<K>{K::Conv, K::Flatten, K::SoftmaxCE})) << kind_list(v);
  EXPECT_EQ(v[2].in_shape, (Shape{1, 1, 1, 20}));
}

// A flatten of a map larger than 1x1 leads only to fc (or the loss), through element-wise layers: a bn, conv or gap
// after it was planned on the map as if the flatten were not there (another network than the model's, silently).
// Refused naming the flatten and the layer; after a 1x1 map (gap) the flatten is nothing and anything may follow.
TEST(NormalizeFlatten, AFlattenOfAMapLeadsOnlyToFcThroughElementwiseLayers) {
  for (const auto& after : {rb::bn(), rb::conv(4, 1), rb::gap()}) {
    const auto bp = model(rb::seq(rb::conv(3, 3, 1, 1), rb::flatten(), after, rb::fc(10), rb::softmax_ce(10)));
    try {
      shaped(bp, plain());
      ADD_FAILURE() << "a flatten of an 8x8 map followed by a non-fc layer was planned";
    } catch (const renaissance::Error& e) {
      EXPECT_NE(std::string(e.what()).find("flatten of a 8x8x3 map followed by"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("not on the 192 features"), std::string::npos) << e.what();
    }
  }
  const auto ok =
      shaped(model(rb::seq(rb::conv(3, 3, 1, 1), rb::flatten(), rb::relu(), rb::fc(10), rb::softmax_ce(10))), plain());
  EXPECT_EQ(kinds(ok), (std::vector<K>{K::Conv, K::Relu, K::Flatten, K::Fc, K::SoftmaxCE})) << kind_list(ok);
  const auto after_gap =
      shaped(model(rb::seq(rb::conv(16, 3, 1, 1), rb::gap(), rb::flatten(), rb::bn(), rb::fc(10), rb::softmax_ce(10))),
             plain());
  EXPECT_EQ(kinds(after_gap), (std::vector<K>{K::Conv, K::Gap, K::Bn1d, K::Fc, K::SoftmaxCE})) << kind_list(after_gap);
}

// ---- step 7: merge_blocks ---------------------------------------------------------------------------

TEST(MergeBlocks, HandWrittenBottlenecksBecomeFusedBlocks) {
  auto bp = model(rb::seq(rb::conv(16, 3, 1, 1), rb::bn(), rb::relu(), bottleneck_by_hand(4, 16, 1, false),
                          bottleneck_by_hand(8, 32, 2, true), rb::gap(), rb::fc(8), rb::softmax_ce(8)));
  steps::Layers v = shaped(bp, fused());
  steps::merge_blocks(v);
  ASSERT_EQ(kinds(v), (std::vector<K>{K::Conv, K::Bn2d, K::Relu, K::BottleneckIdentity, K::BottleneckProjection, K::Gap,
                                      K::Fc, K::SoftmaxCE}))
      << kind_list(v);
  EXPECT_TRUE(v[3].block() == (rp::BlockParams{4, 16, 1}));
  EXPECT_TRUE(v[4].block() == (rp::BlockParams{8, 32, 2}));
  EXPECT_EQ(v[3].in_shape, (Shape{1, 8, 8, 16}));
  EXPECT_EQ(v[3].out_shape, (Shape{1, 8, 8, 16}));
  EXPECT_EQ(v[4].out_shape, (Shape{1, 4, 4, 32}));
}

TEST(MergeBlocks, BasicBlocksAndInvertedResidual) {
  auto bp = model(rb::seq(rb::conv(16, 3, 1, 1), basic_by_hand(16, 1, false), basic_by_hand(32, 2, true),
                          inv_residual_identity_by_hand(96, 32), rb::gap(), rb::fc(8), rb::softmax_ce(8)));
  steps::Layers v = shaped(bp, fused());
  steps::merge_blocks(v);
  ASSERT_EQ(kinds(v), (std::vector<K>{K::Conv, K::BasicBlockIdentity, K::BasicBlockProjection, K::InvResidualIdentity,
                                      K::Gap, K::Fc, K::SoftmaxCE}))
      << kind_list(v);
  EXPECT_TRUE(v[1].block() == (rp::BlockParams{16, 16, 1}));
  EXPECT_TRUE(v[2].block() == (rp::BlockParams{32, 32, 2}));
  EXPECT_TRUE(v[3].block() == (rp::BlockParams{96, 32, 1}));
  EXPECT_EQ(v[2].out_shape, (Shape{1, 4, 4, 32}));
  EXPECT_EQ(v[3].out_shape, (Shape{1, 4, 4, 32}));
}

TEST(MergeBlocks, NonMatchingAdd2StaysPlain) {
  struct Case {
    const char* what;
    rb::Layer layer;
  };
  std::vector<Case> cases;
  // no ReLU after the add
  cases.push_back(
      {"no post-add relu",
       rb::add2(rb::seq(rb::conv(16, 3, 1, 1), rb::bn(), rb::relu(), rb::conv(16, 3, 1, 1), rb::bn()), rb::seq())});
  // a 5×5 conv
  cases.push_back(
      {"5x5 conv",
       rb::seq(
           rb::add2(rb::seq(rb::conv(16, 5, 1, 2), rb::bn(), rb::relu(), rb::conv(16, 3, 1, 1), rb::bn()), rb::seq()),
           rb::relu())});
  // a basic block whose first conv is narrower than its output: BasicBlock assumes mid = out
  cases.push_back(
      {"narrow basic block",
       rb::seq(
           rb::add2(rb::seq(rb::conv(8, 3, 1, 1), rb::bn(), rb::relu(), rb::conv(16, 3, 1, 1), rb::bn()), rb::seq()),
           rb::relu())});
  // a bottleneck whose 3×3 changes the width: Bottleneck assumes mid -> mid
  cases.push_back({"bottleneck 3x3 changes width",
                   rb::seq(rb::add2(rb::seq(rb::conv(4, 1), rb::bn(), rb::relu(), rb::conv(8, 3, 1, 1), rb::bn(),
                                            rb::relu(), rb::conv(16, 1), rb::bn()),
                                    rb::seq()),
                           rb::relu())});
  // a shortcut that is neither empty nor a 1×1 conv + bn
  cases.push_back({"3x3 shortcut", rb::seq(rb::add2(rb::seq(rb::conv(16, 3, 1, 1), rb::bn(), rb::relu(),
                                                            rb::conv(16, 3, 1, 1), rb::bn()),
                                                    rb::seq(rb::conv(16, 3, 1, 1), rb::bn())),
                                           rb::relu())});
  for (Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto bp = model(rb::seq(rb::conv(16, 3, 1, 1), c.layer, rb::gap(), rb::fc(8), rb::softmax_ce(8)));
    steps::Layers v = shaped(bp, fused());
    const steps::Layers before = v;
    steps::merge_blocks(v);
    EXPECT_EQ(v, before) << kind_list(v);
    // and the full build keeps the parameter count of the plain plan
    EXPECT_EQ(rp::ArchPlan::build(bp, fused()).parameter_count(), rp::ArchPlan::build(bp, plain()).parameter_count());
  }
}

// ---- steps 8-10 -------------------------------------------------------------------------------------

TEST(QuadrupleFusion, ConvBnReluMaxPoolStaysSeparate) {
  auto bp =
      model(rb::seq(rb::conv(8, 3, 1, 1), rb::bn(), rb::relu(), rb::maxpool(2, 2), rb::gap_fc(8), rb::softmax_ce(8)));
  steps::Layers v = shaped(bp, fused());
  const steps::Layers before = v;
  steps::quadruple_fusion(v);
  EXPECT_EQ(v, before);
  const rp::ArchPlan p = rp::ArchPlan::build(bp, fused());
  EXPECT_EQ(kinds(p.layers), (std::vector<K>{K::CBR, K::MaxPool, K::GapFC, K::SoftmaxCE})) << kind_list(p.layers);
}

TEST(FuseCbr, ConvBn2dReluOnly) {
  auto bp = model(rb::seq(rb::conv(8, 3, 1, 1), rb::bn(), rb::relu(),   // CBR
                          rb::conv(8, 3, 1, 1), rb::bn(),               // no relu: stays
                          rb::conv(8, 3, 1, 1), rb::relu(), rb::bn(),   // wrong order: stays
                          rb::conv(8, 3, 2, 1), rb::bn(), rb::relu(),   // CBR with stride
                          rb::gap(), rb::fc(16), rb::bn(), rb::relu(),  // Fc+Bn1d+ReLU: not a CBR
                          rb::fc(4), rb::softmax_ce(4)));
  steps::Layers v = shaped(bp, amp_only());
  steps::fuse_cbr(v);
  ASSERT_EQ(kinds(v), (std::vector<K>{K::CBR, K::Conv, K::Bn2d, K::Conv, K::Relu, K::Bn2d, K::CBR, K::Gap, K::Fc,
                                      K::Bn1d, K::Relu, K::Fc, K::SoftmaxCE}))
      << kind_list(v);
  EXPECT_EQ(v[0].in_shape, (Shape{1, 8, 8, 8}));  // AMP-padded data buffer
  EXPECT_EQ(v[0].out_shape, (Shape{1, 8, 8, 8}));
  EXPECT_EQ(v[6].in_shape, (Shape{1, 8, 8, 8}));
  EXPECT_EQ(v[6].out_shape, (Shape{1, 4, 4, 8}));
  EXPECT_TRUE(v[6].conv() == (rp::ConvParams{8, 3, 2, 1, 1}));
  // Applied by build() with and without AMP (FP32 plans run the same fused passes)
  EXPECT_EQ(rp::ArchPlan::build(bp, plain()).layers[0].kind, K::CBR);
  EXPECT_EQ(rp::ArchPlan::build(bp, amp_only()).layers[0].kind, K::CBR);
}

TEST(FuseGapFc, GapFollowedByFc) {
  steps::Layers v = {L(K::Conv, rp::ConvParams{}),
                     L(K::Gap, {}, "pool"),
                     L(K::Fc, rp::FcParams{10}, "head"),
                     L(K::Gap),
                     L(K::Flatten),
                     L(K::Fc, rp::FcParams{10}),
                     L(K::SoftmaxCE, rp::FcParams{10})};
  v[1].in_shape = Shape{1, 7, 7, 64};
  v[1].out_shape = Shape{1, 1, 1, 64};
  v[2].in_shape = v[1].out_shape;
  v[2].out_shape = Shape{1, 1, 1, 10};
  steps::fuse_gap_fc(v);
  ASSERT_EQ(kinds(v), (std::vector<K>{K::Conv, K::GapFC, K::Gap, K::Flatten, K::Fc, K::SoftmaxCE})) << kind_list(v);
  EXPECT_EQ(v[1].name, "head");
  EXPECT_EQ(v[1].fc().out, 10);
  EXPECT_EQ(v[1].in_shape, (Shape{1, 7, 7, 64}));
  EXPECT_EQ(v[1].out_shape, (Shape{1, 1, 1, 10}));
  // An unnamed Fc takes the Gap's name
  steps::Layers w = {L(K::Gap, {}, "pool"), L(K::Fc, rp::FcParams{3})};
  steps::fuse_gap_fc(w);
  ASSERT_EQ(w.size(), 1u);
  EXPECT_EQ(w[0].name, "pool");
}

TEST(MarkFirstLayer, OnlyTheFirst) {
  steps::Layers v = {L(K::CBR, rp::ConvParams{}), L(K::MaxPool, rp::PoolParams{}), L(K::Conv, rp::ConvParams{})};
  v[2].is_first_layer = true;  // stale flag is cleared
  steps::mark_first_layer(v);
  EXPECT_TRUE(v[0].is_first_layer);
  EXPECT_FALSE(v[1].is_first_layer);
  EXPECT_FALSE(v[2].is_first_layer);
  const rp::ArchPlan p =
      rp::ArchPlan::build(rb::BluePrint(model(rb::seq(rb::cbr(8, 3), rb::gap_fc(2), rb::softmax_ce(2)))), plain());
  int firsts = 0;
  for (const auto& l : p.layers) firsts += l.is_first_layer;
  EXPECT_EQ(firsts, 1);
  EXPECT_TRUE(p.layers[0].is_first_layer);
}

TEST(PadFirstConvChannels, AmpPadsTo4AndKeepsParameterCount) {
  for (std::int64_t c : {1, 3}) {
    SCOPED_TRACE(c);
    auto bp = model(rb::seq(rb::conv(8, 3, 1, 1), rb::bn(), rb::relu(), rb::gap_fc(2), rb::softmax_ce(2)), 8, c);
    steps::Layers v = steps::expand_tree(bp, amp_only());
    const Shape padded = steps::pad_first_conv_channels(v, Shape{1, 8, 8, c});
    EXPECT_EQ(padded, (Shape{1, 8, 8, renaissance::kAmpInputChannelAlign}));
    EXPECT_EQ(v[0].conv().logical_in_c, c);
    for (const auto& o : {amp_only(), fused()}) {
      const rp::ArchPlan a = rp::ArchPlan::build(bp, o);
      EXPECT_EQ(a.input, (Shape{1, 8, 8, renaissance::kAmpInputChannelAlign}));
      EXPECT_EQ(a.input_channels, c);
      EXPECT_EQ(a.layers[0].in_shape.c, renaissance::kAmpInputChannelAlign);
      EXPECT_EQ(a.layers[0].conv().logical_in_c, c);
      // conv 8·3·3·c + BN 16 + fc 8·2 + 2: the padding channels are not parameters
      EXPECT_EQ(a.parameter_count(), 72 * c + 16 + 18);
      EXPECT_EQ(a.forward_macs(), rp::ArchPlan::build(bp, plain()).forward_macs());
    }
    EXPECT_EQ(rp::ArchPlan::build(bp, plain()).parameter_count(), 72 * c + 16 + 18);
    EXPECT_EQ(rp::ArchPlan::build(bp, plain()).input.c, c);
  }
  // Already a multiple of 8: untouched. 5 -> 8, 9 -> 16.
  steps::Layers v = {L(K::Conv, rp::ConvParams{8, 3, 1, 1, 1})};
  EXPECT_EQ(steps::pad_first_conv_channels(v, Shape{1, 8, 8, 8}), (Shape{1, 8, 8, 8}));
  EXPECT_EQ(v[0].conv().logical_in_c, 0);
  EXPECT_EQ(steps::pad_first_conv_channels(v, Shape{1, 8, 8, 5}), (Shape{1, 8, 8, 8}));
  EXPECT_EQ(v[0].conv().logical_in_c, 5);
  steps::Layers v9 = {L(K::Conv, rp::ConvParams{8, 3, 1, 1, 1})};
  EXPECT_EQ(steps::pad_first_conv_channels(v9, Shape{1, 8, 8, 9}), (Shape{1, 8, 8, 16}));
}

TEST(AssignNames, UniqueStableNames) {
  steps::Layers v = {L(K::Conv, rp::ConvParams{}), L(K::Relu, {}, "relu1"), L(K::Relu), L(K::Conv, rp::ConvParams{})};
  steps::assign_names(v);
  EXPECT_EQ(v[0].name, "conv1");
  EXPECT_EQ(v[1].name, "relu1");
  EXPECT_EQ(v[2].name, "relu2");  // relu1 is taken by the user
  EXPECT_EQ(v[3].name, "conv2");
  steps::Layers dup = {L(K::Relu, {}, "a"), L(K::Relu, {}, "a")};
  expect_error([&] { steps::assign_names(dup); }, {"'a'", "used twice"});
}

// ---- block() and the hand-written sequence compile to the same plan ------------------------------------

TEST(BlockEquivalence, BlockAndHandWrittenGiveTheSamePlan) {
  struct Case {
    const char* what;
    rb::Layer block, by_hand;
    std::int64_t in_c;
  };
  std::vector<Case> cases;
  cases.push_back({"RESNET_1_3_1 projection", rb::block(8, 32, BlockKind::RESNET_1_3_1, 2),
                   bottleneck_by_hand(8, 32, 2, true), 16});
  cases.push_back({"RESNET_1_3_1 projection (channels)", rb::block(8, 32, BlockKind::RESNET_1_3_1, 1),
                   bottleneck_by_hand(8, 32, 1, true), 16});
  cases.push_back(
      {"RESNET_1_3_1 identity", rb::block(4, 16, BlockKind::RESNET_1_3_1, 1), bottleneck_by_hand(4, 16, 1, false), 16});
  cases.push_back({"RESNET_3_3 identity", rb::block(0, 16, BlockKind::RESNET_3_3, 1), basic_by_hand(16, 1, false), 16});
  cases.push_back(
      {"RESNET_3_3 projection", rb::block(0, 32, BlockKind::RESNET_3_3, 2), basic_by_hand(32, 2, true), 16});
  cases.push_back(
      {"MBV2 identity", rb::block(96, 16, BlockKind::MBV2_INV_RESIDUAL, 1), inv_residual_identity_by_hand(96, 16), 16});
  for (Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto a = model(
        rb::seq(rb::conv(c.in_c, 3, 1, 1), rb::bn(), rb::relu(), c.block, rb::gap(), rb::fc(8), rb::softmax_ce(8)));
    auto b = model(
        rb::seq(rb::conv(c.in_c, 3, 1, 1), rb::bn(), rb::relu(), c.by_hand, rb::gap(), rb::fc(8), rb::softmax_ce(8)));
    const rp::ArchPlan pa = rp::ArchPlan::build(a, fused());
    const rp::ArchPlan pb = rp::ArchPlan::build(b, fused());
    EXPECT_EQ(pa, pb) << "block():\n" << pa.to_yaml() << "by hand:\n" << pb.to_yaml();
    EXPECT_EQ(pa.layers.size(), 4u) << kind_list(pa.layers);  // CBR, fused block, GapFC, SoftmaxCE
    // and fused or not, the same parameters and MACs as the plain plan
    const rp::ArchPlan plain_a = rp::ArchPlan::build(a, plain());
    EXPECT_EQ(pa.parameter_count(), plain_a.parameter_count());
    EXPECT_EQ(pa.forward_macs(), plain_a.forward_macs());
    EXPECT_EQ(plain_a, rp::ArchPlan::build(b, plain()));
  }
}
