// Zoo models through the planner: published parameter counts and MACs, YAML round trips, bad models.
#include "plan_test_util.h"

#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>

#include <cmath>

using namespace plan_test;

namespace {

rp::BuildOptions opts(bool amp, bool fuse) {
  rp::BuildOptions o;
  o.amp = amp;
  o.fuse = fuse;
  return o;
}

const std::vector<std::pair<bool, bool>> kModes = {{false, false}, {true, false}, {true, true}};

}  // namespace

// torchvision's published figures (torchvision.models docs, "num_params").
TEST(ZooFigures, ParameterCountsMatchTorchvision) {
  const std::vector<std::pair<std::string, std::int64_t>> published = {
      {"resnet18", 11689512},  {"resnet34", 21797672},    {"resnet50", 25557032},
      {"resnet101", 44549160}, {"mobilenet_v2", 3504872}, {"vgg16", 138357544},
  };
  for (const auto& [name, count] : published)
    for (auto [amp, fuse] : kModes) {
      SCOPED_TRACE(::testing::Message() << name << " amp=" << amp << " fuse=" << fuse);
      const rp::ArchPlan p = rp::ArchPlan::build(rb::zoo_model(name), opts(amp, fuse));
      EXPECT_EQ(p.parameter_count(), count);
    }
}

TEST(ZooFigures, FmnistCnnCountedByHand) {
  // cbr 1->32: 288 + 64; cbr 32->64: 18432 + 128; cbr 64->64: 36864 + 128; fc 7·7·64 -> 10: 31360 + 10
  for (auto [amp, fuse] : kModes) {
    const rp::ArchPlan p = rp::ArchPlan::build(rb::zoo_model("fmnist_cnn"), opts(amp, fuse));
    EXPECT_EQ(p.parameter_count(), 87274);
    // MACs: 28²·32·9 + 14²·64·288 + 7²·64·576 + 3136·10
    EXPECT_EQ(p.forward_macs(), 784 * 32 * 9 + 196 * 64 * 288 + 49 * 64 * 576 + 3136 * 10);
  }
}

TEST(ZooFigures, ForwardMacs) {
  // torchvision's published GFLOPS (multiply-accumulates) at 224×224.
  const std::vector<std::tuple<std::string, double, double>> published = {
      {"resnet50", 4.09, 0.01}, {"resnet18", 1.81, 0.01}, {"vgg16", 15.47, 0.01}, {"mobilenet_v2", 0.30, 0.01}};
  for (const auto& [name, gmacs, tol] : published)
    for (auto [amp, fuse] : kModes) {
      SCOPED_TRACE(::testing::Message() << name << " amp=" << amp << " fuse=" << fuse);
      const rp::ArchPlan p = rp::ArchPlan::build(rb::zoo_model(name), opts(amp, fuse));
      EXPECT_NEAR(static_cast<double>(p.forward_macs()) / 1e9, gmacs, tol);
    }
}

TEST(ZooFigures, Resnet50FusedStructure) {
  const rp::ArchPlan p = rp::ArchPlan::build(rb::zoo_model("resnet50"), opts(true, true));
  std::map<LayerKind, int> n;
  for (const auto& l : p.layers) ++n[l.kind];
  EXPECT_EQ(n[LayerKind::CBR], 1);
  EXPECT_EQ(n[LayerKind::MaxPool], 1);
  EXPECT_EQ(n[LayerKind::BottleneckProjection], 4);  // the first block of each stage
  EXPECT_EQ(n[LayerKind::BottleneckIdentity], 12);   // 3+4+6+3 - 4
  EXPECT_EQ(n[LayerKind::GapFC], 1);
  EXPECT_EQ(n[LayerKind::SoftmaxCE], 1);
  EXPECT_EQ(p.layers.size(), 20u);
  EXPECT_EQ(p.input, (Shape{1, 224, 224, 8}));
  EXPECT_EQ(p.input_channels, 3);
  EXPECT_EQ(p.layers[1].out_shape, (Shape{1, 56, 56, 64}));
  EXPECT_EQ(p.layers[2].out_shape, (Shape{1, 56, 56, 256}));
  EXPECT_EQ(p.layers[18].in_shape, (Shape{1, 7, 7, 2048}));
  EXPECT_EQ(p.num_classes, 1000);

  const rp::ArchPlan m = rp::ArchPlan::build(rb::zoo_model("mobilenet_v2"), opts(true, true));
  std::map<LayerKind, int> k;
  for (const auto& l : m.layers) ++k[l.kind];
  EXPECT_EQ(k[LayerKind::InvResidualIdentity], 10);   // (2-1)+(3-1)+(4-1)+(3-1)+(3-1)+0
  EXPECT_EQ(k[LayerKind::InvResidualNoShortcut], 6);  // the first block of each setting
}

TEST(ArchYaml, RoundTripEveryZooModel) {
  for (const std::string& name : rb::zoo_names())
    for (auto [amp, fuse] : kModes) {
      SCOPED_TRACE(::testing::Message() << name << " amp=" << amp << " fuse=" << fuse);
      const rp::ArchPlan p = rp::ArchPlan::build(rb::zoo_model(name), opts(amp, fuse));
      const std::string text = p.to_yaml();
      const rp::ArchPlan back = rp::ArchPlan::from_yaml(text, "plan.yaml");
      EXPECT_TRUE(back == p);
      EXPECT_EQ(back.to_yaml(), text);
      EXPECT_EQ(back.parameter_count(), p.parameter_count());
    }
}

TEST(ArchYaml, RoundTripOddNames) {
  rb::BluePrint bp =
      model(rb::seq(rb::conv(8, 3, 1, 1).named("a: b"), rb::relu().named("true"), rb::bn().named("123"),
                    rb::relu().named("x\"y"), rb::gap_fc(4).named("- z"), rb::softmax_ce(4).named("null")),
            8, 3, "name with: colon");
  const rp::ArchPlan p = rp::ArchPlan::build(bp, opts(false, false));
  const std::string text = p.to_yaml();
  const rp::ArchPlan back = rp::ArchPlan::from_yaml(text);
  EXPECT_TRUE(back == p) << text;
  EXPECT_EQ(back.to_yaml(), text);
  EXPECT_EQ(back.layers[1].name, "true");
  EXPECT_EQ(back.layers.back().name, "null");
}

// ---- bad models: renaissance::Error naming the layer (or file:line) and the reason ---------------------

TEST(BadModels, UnknownLayerInYaml) {
  expect_error(
      [] {
        rb::blueprint_from_yaml("name: m\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: 4, k: 3}\n  - rleu\n", "bad.yaml");
      },
      {"bad.yaml:5", "layers[1]", "rleu"});
  // an unknown kind in an arch plan file
  rp::ArchPlan p = rp::ArchPlan::build(rb::zoo_model("fmnist_cnn"), opts(false, false));
  std::string text = p.to_yaml();
  const auto at = text.find("kind: MaxPool");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, 13, "kind: MaxPoool");
  expect_error([&] { rp::ArchPlan::from_yaml(text, "plan.yaml"); }, {"plan.yaml:", "layers[1]", "MaxPoool"});
}

TEST(BadModels, NegativeChannels) {
  expect_error(
      [] { rp::ArchPlan::build(model(rb::seq(rb::conv(8, 3), rb::relu(), rb::conv(-16, 3).named("c2"))), {}); },
      {"layers[2]", "'out'", "-16"});
  expect_error(
      [] { rb::blueprint_from_yaml("name: m\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: -4, k: 3}\n", "neg.yaml"); },
      {"neg.yaml:4", "layers[0]", "out"});
  expect_error([] { rp::ArchPlan::build(model(rb::seq(rb::fc(-3))), {}); }, {"layers[0]", "'out'", "-3"});
}

TEST(BadModels, Add2BranchesDisagree) {
  expect_error(
      [] {
        rp::ArchPlan::build(model(rb::seq(rb::conv(8, 3, 1, 1),
                                          rb::add2(rb::seq(rb::conv(16, 3, 2, 1), rb::bn()), rb::seq()).named("res"),
                                          rb::gap_fc(2), rb::softmax_ce(2))),
                            {});
      },
      {"model 'm'", "res", "add2 branches disagree", "4x4x16", "8x8x8"});
  // the same from a YAML file: the path in the tree names the add2
  expect_error(
      [] {
        rp::ArchPlan::build(
            rb::blueprint_from_yaml("name: y\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: 8, k: 3, pad: 1}\n"
                                    "  - add2:\n      main: [{conv: {out: 16, k: 3, pad: 1}}]\n"
                                    "      shortcut: []\n  - gap_fc: {out: 2}\n  - softmax_ce: {classes: 2}\n",
                                    "add.yaml"),
            {});
      },
      {"model 'y'", "layers[1]", "add2 branches disagree"});
}

TEST(BadModels, SpatialSizeShrinksToZero) {
  expect_error(
      [] {
        rp::ArchPlan::build(model(rb::seq(rb::conv(8, 3, 1, 1), rb::repeat(4, rb::maxpool(2, 2).named("pool")),
                                          rb::gap_fc(2), rb::softmax_ce(2)),
                                  4),
                            {});
      },
      {"pool.2", "spatial size shrinks to zero", "1x1x8"});
  expect_error(
      [] { rp::ArchPlan::build(model(rb::seq(rb::conv(8, 5).named("big"), rb::gap_fc(2), rb::softmax_ce(2)), 4), {}); },
      {"big", "spatial size shrinks to zero"});
}

TEST(BadModels, MalformedYaml) {
  expect_error(
      [] { rb::blueprint_from_yaml("name: m\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: 4, k: 3\n", "mal.yaml"); },
      {"mal.yaml"});
  expect_error([] { rp::ArchPlan::from_yaml("format: renaissance-arch-plan\nversion: 1\nlayers: [\n", "mal.yaml"); },
               {"mal.yaml:", "malformed YAML"});
  expect_error([] { rp::ArchPlan::from_yaml("format: something-else\nversion: 1\n", "other.yaml"); },
               {"other.yaml", "not an arch plan"});
  rp::ArchPlan p = rp::ArchPlan::build(rb::zoo_model("fmnist_cnn"), opts(false, false));
  std::string text = p.to_yaml();
  const auto at = text.find("in: [1, 28, 28, 1]");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 18, "in: [1, 28, 28]");
  expect_error([&] { rp::ArchPlan::from_yaml(text, "shape.yaml"); }, {"shape.yaml:", "layers[0]", "[n, h, w, c]"});
}

TEST(BadModels, SoftmaxClassesDisagree) {
  expect_error([] { rp::ArchPlan::build(model(rb::seq(rb::conv(8, 3), rb::gap_fc(5), rb::softmax_ce(10))), {}); },
               {"softmax_ce expects 10", "1x1x5"});
}

TEST(BadModels, ArchPlanFieldErrorsAreRenaissanceErrors) {
  const rp::ArchPlan p = rp::ArchPlan::build(rb::zoo_model("fmnist_cnn"), opts(false, false));
  const std::string text = p.to_yaml();
  {  // a layer without its params
    std::string t = text;
    const auto at = t.find("params: {out_c: 32");
    ASSERT_NE(at, std::string::npos) << text.substr(0, 600);
    const auto begin = t.rfind('\n', at) + 1, end = t.find('\n', at);
    t.erase(begin, end - begin + 1);
    expect_error([&] { rp::ArchPlan::from_yaml(t, "noparams.yaml"); }, {"noparams.yaml", "layers[0].params", "out_c"});
  }
  {  // a bad boolean
    std::string t = text;
    const auto at = t.find("first: true");
    ASSERT_NE(at, std::string::npos);
    t.replace(at, 11, "first: maybe");
    expect_error([&] { rp::ArchPlan::from_yaml(t, "first.yaml"); }, {"first.yaml", "layers[0]", "first"});
  }
  {  // a kind with the wrong type
    std::string t = text;
    const auto at = t.find("kind: CBR");
    ASSERT_NE(at, std::string::npos);
    t.replace(at, 9, "kind: [CBR]");
    expect_error([&] { rp::ArchPlan::from_yaml(t, "kind.yaml"); }, {"kind.yaml", "layers[0]", "kind"});
  }
}
