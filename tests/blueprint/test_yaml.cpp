// The YAML model format: exact round trips, the shipped model files, and error messages that a
// user can act on (file:line, path in the tree, reason).
#include <renaissance/blueprint/yaml.h>
#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>
#include <renaissance/plan/arch_plan.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <unistd.h>

namespace rb = renaissance::blueprint;
namespace fs = std::filesystem;
using rb::BlockKind;
using rb::Layer;

namespace {

const fs::path kModels = fs::path(RENAISSANCE_SOURCE_DIR) / "models";

/// Emit → parse → equal, and emitting the parsed tree gives the same text (canonical form).
void expect_round_trip(const rb::BluePrint& bp) {
  const std::string text = rb::blueprint_to_yaml(bp);
  rb::BluePrint back;
  ASSERT_NO_THROW(back = rb::blueprint_from_yaml(text, "roundtrip.yaml")) << text;
  EXPECT_TRUE(back == bp) << text;
  EXPECT_EQ(rb::blueprint_to_yaml(back), text);
}

/// Parses `text` as bad.yaml and checks that the error names every expected fragment.
void expect_error(const std::string& text, const std::vector<std::string>& fragments) {
  try {
    rb::blueprint_from_yaml(text, "bad.yaml");
    ADD_FAILURE() << "expected an Error for:\n" << text;
  } catch (const renaissance::Error& e) {
    const std::string what = e.what();
    for (const std::string& f : fragments) EXPECT_NE(what.find(f), std::string::npos) << "'" << f << "' not in: " << what;
  }
}

std::string model(const std::string& layers) { return "name: m\ninput: [8, 8, 3]\nlayers:\n" + layers; }

}  // namespace

TEST(Yaml, ZooModelsRoundTrip) {
  for (const std::string& name : rb::zoo_names()) {
    SCOPED_TRACE(name);
    expect_round_trip(rb::zoo_model(name));
  }
}

TEST(Yaml, EveryFieldRoundTrips) {
  rb::BluePrint bp;
  bp.name = "all fields: \"quoted\"";
  bp.in_h = 17;  // square: a model file's input must be (the emitter writes H, then W: checked below)
  bp.in_w = 17;
  bp.in_c = 2;
  bp.root = rb::seq(
      rb::conv(8, 3, 2, 1).named("stem"), rb::conv(8, 3, 1, 1, 4, true), rb::conv(8, 3, 1, 1, rb::kDepthwise),
      rb::dwconv(5, 2, 2).named("dw"), rb::bn().named("true"),
      rb::relu().named("null"), rb::tanh().named("123"), rb::identity().named("a\\b c\"d"), rb::cbr(16, 1).named(""),
      rb::maxpool(3, 2, 1).named("pool.1"), rb::seq(), rb::seq().named("empty"),
      rb::seq(rb::bn(), rb::seq(rb::relu())).named("nested"),
      rb::repeat(3, rb::seq(rb::cbr(16, 3, 1, 1), rb::bn())).named("r"), rb::repeat(1, rb::relu()),
      rb::repeat(2, rb::repeat(2, rb::block(4, 16, BlockKind::MBV2_INV_RESIDUAL))),
      rb::add2(rb::seq(rb::conv(16, 3, 1, 1), rb::bn()), rb::seq()).named("res"),
      rb::add2(rb::block(4, 16, BlockKind::RESNET_1_3_1, 2), rb::conv(16, 1, 2).named("proj")),
      rb::add2(rb::seq(rb::relu()).named("m"), rb::identity()), rb::block(16, 16, BlockKind::RESNET_3_3).named("b"),
      rb::gap(), rb::flatten(), rb::fc(32).named("fc1"), rb::gap_fc(7), rb::softmax_ce(7).named("loss"));
  // Depthwise with an explicit bias but no explicit out channels, and a cbr that is grouped.
  Layer dw_bias = rb::dwconv(3);
  dw_bias.bias = true;
  bp.root.children.push_back(dw_bias);
  Layer grouped_cbr = rb::cbr(16, 3);
  grouped_cbr.groups = 2;
  bp.root.children.push_back(grouped_cbr);
  expect_round_trip(bp);

  // A root that is not an unnamed seq.
  bp.root = rb::seq(rb::relu()).named("root");
  expect_round_trip(bp);
  bp.root = rb::block(4, 8, BlockKind::RESNET_1_3_1);
  expect_round_trip(bp);
  bp.root = rb::seq();
  expect_round_trip(bp);
  bp.name = "";
  expect_round_trip(bp);
  // H before W; a non-square input is written as it is, and the reader refuses it naming the line.
  bp.in_w = 19;
  const std::string text = rb::blueprint_to_yaml(bp);
  EXPECT_NE(text.find("input: [17, 19, 2]"), std::string::npos) << text;
  try {
    (void)rb::blueprint_from_yaml(text, "rect.yaml");
    ADD_FAILURE() << "a 17x19 input was read";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("rect.yaml:2: input [17, 19, 2]: only square inputs are supported"),
              std::string::npos)
        << e.what();
  }
}

TEST(Yaml, ParsesTheDocumentedFormat) {
  const std::string text = R"(
name: example
input: [224, 224, 3]        # H, W, C per sample
layers:
  - conv: {out: 64, k: 7, stride: 2, pad: 3}
  - dwconv: {k: 3, stride: 1, pad: 1}
  - bn
  - relu
  - maxpool: {k: 3, stride: 2, pad: 1}
  - repeat: {n: 2, layer: {block: {mid: 64, out: 64, kind: RESNET_3_3, stride: 1}}}
  - add2: {main: [conv: {out: 64, k: 3, pad: 1, groups: depthwise, bias: true, name: c}, bn], shortcut: []}
  - seq: [relu, {identity: {name: id}}]
  - gap
  - fc: {out: 1000}
  - softmax_ce: {classes: 1000}
)";
  const rb::BluePrint bp = rb::blueprint_from_yaml(text, "example.yaml");
  rb::BluePrint want;
  want.name = "example";
  want.in_h = want.in_w = 224;
  want.in_c = 3;
  want.root = rb::seq(rb::conv(64, 7, 2, 3), rb::dwconv(3, 1, 1), rb::bn(), rb::relu(), rb::maxpool(3, 2, 1),
                      rb::repeat(2, rb::block(64, 64, BlockKind::RESNET_3_3, 1)),
                      rb::add2(rb::seq(rb::conv(64, 3, 1, 1, rb::kDepthwise, true).named("c"), rb::bn()), rb::seq()),
                      rb::seq(rb::relu(), rb::identity().named("id")), rb::gap(), rb::fc(1000), rb::softmax_ce(1000));
  EXPECT_TRUE(bp == want) << rb::blueprint_to_yaml(bp);
}

// Every activation of ops/activations.h: its YAML key parses (bare and named), round-trips, and becomes its layer
// kind in the ArchPlan with the input's shape.
TEST(Yaml, EveryActivationParsesRoundTripsAndPlans) {
  for (const renaissance::ops::Activation a : renaissance::ops::kActivations) {
    const std::string key = renaissance::ops::activation_name(a);
    const rb::BluePrint bp =
        rb::blueprint_from_yaml(model("  - conv: {out: 4, k: 3, pad: 1}\n  - " + key + "\n  - " + key +
                                      ": {name: act2}\n  - gap\n" + "  - softmax_ce: {classes: 4}\n"),
                                "act.yaml");
    ASSERT_EQ(bp.root.children.size(), 5u) << key;
    for (std::size_t i : {1u, 2u}) {
      renaissance::ops::Activation got{};
      ASSERT_TRUE(rb::node_activation(bp.root.children[i].kind, &got)) << key;
      EXPECT_EQ(got, a) << key;
      EXPECT_EQ(rb::node_kind_name(bp.root.children[i].kind), key);
    }
    EXPECT_EQ(bp.root.children[2].name, "act2");
    expect_round_trip(bp);
    const auto plan = renaissance::plan::ArchPlan::build(bp, {});
    int seen = 0;
    for (const auto& l : plan.layers) {
      renaissance::ops::Activation got{};
      if (!renaissance::plan::layer_activation(l.kind, &got)) continue;
      EXPECT_EQ(got, a);
      EXPECT_EQ(l.in_shape, l.out_shape);
      EXPECT_EQ(l.out_shape.c, 4);
      ++seen;
    }
    EXPECT_EQ(seen, 2) << key;
    EXPECT_EQ(renaissance::plan::ArchPlan::from_yaml(plan.to_yaml()), plan) << key;
  }
}

TEST(Yaml, DefaultsForOptionalFields) {
  const rb::BluePrint bp = rb::blueprint_from_yaml(model(R"(
  - conv: {out: 4, k: 3}
  - maxpool: {k: 2}
  - block: {out: 8, kind: RESNET_3_3}
  - add2: {main: [relu]}
  - bn: {}
  - relu:
)"));
  EXPECT_TRUE(bp.root == rb::seq(rb::conv(4, 3, 1, 0), rb::maxpool(2, 2, 0), rb::block(8, 8, BlockKind::RESNET_3_3, 1),
                                 rb::add2(rb::seq(rb::relu()), rb::seq()), rb::bn(), rb::relu()));
}

TEST(Yaml, ModelFilesParse) {
  ASSERT_TRUE(fs::is_directory(kModels)) << kModels;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(kModels)) {
    if (entry.path().extension() != ".yaml") continue;
    SCOPED_TRACE(entry.path().string());
    ++files;
    rb::BluePrint bp;
    ASSERT_NO_THROW(bp = rb::load_blueprint_file(entry.path().string()));
    EXPECT_EQ(bp.name, entry.path().stem().string());
    expect_round_trip(bp);
  }
  EXPECT_GE(files, 3);
}

TEST(Yaml, ModelFilesMatchTheZoo) {
  for (const char* name : {"resnet18", "fmnist_cnn"}) {
    SCOPED_TRACE(name);
    const rb::BluePrint bp = rb::load_blueprint_file((kModels / (std::string(name) + ".yaml")).string());
    EXPECT_TRUE(bp == rb::zoo_model(name));
  }
}

TEST(Yaml, HandWrittenResidualExample) {
  const rb::BluePrint bp = rb::load_blueprint_file((kModels / "tiny_resnet.yaml").string());
  int add2 = 0;
  std::function<void(const Layer&)> walk = [&](const Layer& l) {
    add2 += l.kind == rb::NodeKind::Add2;
    for (const Layer& c : l.children) walk(c);
  };
  walk(bp.root);
  EXPECT_GE(add2, 2);
  ASSERT_FALSE(bp.root.children.empty());
  EXPECT_EQ(bp.root.children.back().kind, rb::NodeKind::SoftmaxCE);
}

// ---- errors ------------------------------------------------------------------------------------

TEST(YamlErrors, UnknownLayerKindListsKnownKinds) {
  expect_error(model("  - conv: {out: 4, k: 3}\n  - convv: {out: 4}\n"),
               {"bad.yaml:5", "layers[1]", "unknown layer kind 'convv'", "known: seq, repeat, conv", "softmax_ce"});
  expect_error(model("  - bn\n  - rleu\n"), {"bad.yaml:5", "layers[1]", "unknown layer kind 'rleu'", "relu"});
}

TEST(YamlErrors, UnknownAndMissingFields) {
  expect_error(model("  - conv: {out: 4, k: 3, kernel: 3}\n"),
               {"bad.yaml:4", "layers[0].conv", "unknown field 'kernel'", "out, k, stride, pad, groups, bias, name"});
  expect_error(model("  - relu\n  - conv: {out: 4}\n"), {"bad.yaml:5", "layers[1].conv", "missing field 'k'"});
  expect_error(model("  - block: {mid: 4, out: 8}\n"), {"bad.yaml:4", "layers[0].block", "missing field 'kind'"});
  expect_error(model("  - block: {out: 8, kind: RESNET_1_3_1}\n"), {"bad.yaml:4", "missing field 'mid'"});
  expect_error(model("  - conv: {out: 4, k: 3, k: 5}\n"), {"bad.yaml:4", "duplicate field 'k'"});
  expect_error("name: m\ninput: [8, 8, 3]\n", {"bad.yaml:1", "missing field 'layers'"});
  expect_error("name: m\ninput: [8, 8, 3]\nlayers: []\nextra: 1\n", {"bad.yaml:4", "unknown field 'extra'"});
  expect_error(model("  - block: {mid: 4, out: 8, kind: RESNET_9}\n"),
               {"bad.yaml:4", "layers[0].block", "unknown block kind 'RESNET_9'", "RESNET_1_3_1"});
}

TEST(YamlErrors, WrongTypes) {
  expect_error(model("  - conv: {out: 4, k: abc}\n"), {"bad.yaml:4", "layers[0].conv", "field 'k' must be", "'abc'"});
  expect_error(model("  - conv: {out: 4, k: 2.5}\n"), {"bad.yaml:4", "field 'k' must be"});
  expect_error(model("  - conv: {out: [4], k: 3}\n"), {"bad.yaml:4", "field 'out' must be", "a list"});
  expect_error(model("  - conv: {out: 4, k: 3, bias: 1}\n"), {"bad.yaml:4", "field 'bias' must be true or false"});
  expect_error(model("  - conv: {out: 4, k: 3, groups: many}\n"), {"bad.yaml:4", "'groups'", "depthwise"});
  expect_error(model("  - relu: {name: [a]}\n"), {"bad.yaml:4", "layers[0].relu", "field 'name' must be a string"});
  expect_error(model("  - conv: 3\n"), {"bad.yaml:4", "layers[0].conv", "must be a map"});
  expect_error(model("  - conv\n"), {"bad.yaml:4", "layers[0]", "'conv' needs parameters"});
  expect_error(model("  - {conv: {out: 4, k: 3}, name: c}\n"), {"bad.yaml:4", "layers[0]", "exactly one key"});
  expect_error(model("  - [relu]\n"), {"bad.yaml:4", "layers[0]", "got a list"});
  expect_error("name: m\ninput: [8, 8]\nlayers: []\n", {"bad.yaml:2", "field 'input' must be a list [H, W, C]"});
  // yaml-cpp quotes the offending byte: a control character is shown as \xNN, not written to the terminal.
  expect_error(std::string("name: \"a\\\x01\"\ninput: [8, 8, 3]\nlayers: []\n"),
               {"bad.yaml:1", "malformed YAML: unknown escape character: \\x01"});
  expect_error("name: m\ninput: [8, 8, 3]\nlayers: 5\n", {"bad.yaml:3", "layers", "unknown layer kind '5'"});
  expect_error("- a\n- b\n", {"bad.yaml:1", "must be a map"});
  expect_error("", {"bad.yaml:1", "empty model"});
  expect_error("# only a comment\n", {"bad.yaml:1", "empty model"});
  expect_error("name: m\ninput: [8, 8, 3]\nlayers: []\n---\nname: n\n", {"bad.yaml:5", "one YAML document"});
  expect_error(model("  - relu\n  - conv:\n  - relu\n"), {"bad.yaml:5", "layers[1].conv", "'conv' needs parameters"});
}

TEST(YamlErrors, NonPositiveValues) {
  expect_error(model("  - conv: {out: 0, k: 3}\n"), {"bad.yaml:4", "layers[0].conv", "'out' must be a positive integer"});
  expect_error(model("  - fc: {out: -3}\n"), {"bad.yaml:4", "layers[0].fc", "'out' must be a positive integer, got -3"});
  expect_error(model("  - conv: {out: 4, k: 0}\n"), {"bad.yaml:4", "'k' must be a positive integer, got 0"});
  expect_error(model("  - maxpool: {k: 2, stride: 0}\n"), {"bad.yaml:4", "layers[0].maxpool", "'stride' must be a positive"});
  expect_error(model("  - conv: {out: 4, k: 3, pad: -1}\n"), {"bad.yaml:4", "'pad' must be a non-negative integer, got -1"});
  expect_error(model("  - conv: {out: 6, k: 3, groups: 4}\n"), {"bad.yaml:4", "divisible by 'groups'"});
  expect_error(model("  - softmax_ce: {classes: 0}\n"), {"bad.yaml:4", "'classes' must be a positive integer"});
  expect_error("name: m\ninput: [8, 0, 3]\nlayers: []\n", {"bad.yaml:2", "field 'input[1] (W)' must be a positive integer, got 0"});
}

TEST(YamlErrors, LayerNamesThatCannotBeHdf5PathsAreRefused) {
  // A '/' in a name trained to the end and then failed to save (/params/a/b.w); a NUL cut the name short.
  expect_error(model("  - conv: {out: 4, k: 3, name: \"a/b\"}\n"),
               {"bad.yaml:4", "layers[0].conv", "name 'a/b': '/' is not allowed in a layer name"});
  expect_error(model("  - relu\n  - bn: {name: \"x\\0y\"}\n"),
               {"bad.yaml:5", "layers[1].bn", "name 'x\\x00y': the control character 0x00 is not allowed"});
  expect_error(model("  - relu: {name: \"two\\nlines\"}\n"), {"bad.yaml:4", "the control character 0x0a"});
}

TEST(YamlErrors, RepeatCountBelowOne) {
  expect_error(model("  - relu\n  - repeat:\n      n: 0\n      layer: relu\n"),
               {"bad.yaml:6", "layers[1].repeat", "field 'n' must be a positive integer, got 0"});
}

TEST(YamlErrors, NestedPathsAndLines) {
  const std::string text = R"(name: nested
input: [32, 32, 3]
layers:
  - conv: {out: 16, k: 3, pad: 1}
  - repeat:
      n: 2
      layer:
        block: {mid: 16, out: 16, kind: RESNET_3_3, stride: -2}
)";
  expect_error(text, {"bad.yaml:8", "layers[1].repeat.layer.block", "'stride' must be a positive integer, got -2"});
  const std::string add = R"(name: nested
input: [32, 32, 3]
layers:
  - add2:
      main:
        - conv: {out: 16, k: 3, pad: 1}
        - seq: [bn, {relu: {nme: r}}]
      shortcut: []
)";
  expect_error(add, {"bad.yaml:7", "layers[0].add2.main[1].seq[1].relu", "unknown field 'nme'"});
}

TEST(YamlErrors, MalformedYaml) {
  expect_error("name: m\ninput: [8, 8, 3]\nlayers:\n  - conv: {out: 4, k: 3\n  - relu\n", {"bad.yaml:", "malformed YAML"});
  expect_error("name: m\ninput: [8, 8, 3\nlayers: []\n", {"bad.yaml:", "malformed YAML"});
  // The line of a parser error must be a real line of the input (1-based).
  try {
    rb::blueprint_from_yaml("name: m\ninput: [8, 8, 3]\nlayers:\n  - a: b: c\n", "bad.yaml");
    ADD_FAILURE() << "expected an Error";
  } catch (const renaissance::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad.yaml:4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("malformed YAML"), std::string::npos) << e.what();
  }
}

TEST(YamlErrors, FilesAreNamed) {
  const std::string missing = "/nonexistent/dir/model.yaml";
  try {
    rb::load_blueprint_file(missing);
    ADD_FAILURE() << "expected an Error";
  } catch (const renaissance::Error& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const fs::path tmp = fs::temp_directory_path() / ("rn_bad_model_" + std::to_string(::getpid()) + ".yaml");
  {
    std::ofstream out(tmp);
    out << model("  - bn\n  - conv: {out: 4, k: -3}\n");
  }
  try {
    rb::load_blueprint_file(tmp.string());
    ADD_FAILURE() << "expected an Error";
  } catch (const renaissance::Error& e) {
    EXPECT_NE(std::string(e.what()).find(tmp.string() + ":5: layers[1].conv"), std::string::npos) << e.what();
  }
  fs::remove(tmp);
}

// Found by tests/fuzz/fuzz_blueprint_yaml: yaml-cpp 0.7's LoadAll never returns on a lone ',' (the first document
// is now built by YAML::Load and the documents are counted with a bounded loop). Must answer, with an Error.
TEST(Yaml, MalformedInputThatHangsYamlCppLoadAllIsAnError) {
  for (const char* text : {",", ",,", "name: x\n,\n", "- ,"}) {
    EXPECT_THROW(rb::blueprint_from_yaml(text, "hang.yaml"), renaissance::Error) << text;
  }
  try {
    rb::blueprint_from_yaml("name: a\ninput: [4, 4, 1]\nlayers: [relu]\n---\nname: b\n", "two.yaml");
    ADD_FAILURE() << "a second document must be refused";
  } catch (const renaissance::Error& e) {
    EXPECT_NE(std::string(e.what()).find("two.yaml:5"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("second one"), std::string::npos) << e.what();
  }
}

// ---- issue 13: bounded parsing --------------------------------------------------------------------------------

namespace {

/// A model whose layers are 9 levels of anchors, each a seq of ten aliases of the one before: 697 bytes that
/// expand to 10^9 relu layers ("billion laughs").
std::string billion_laughs_model() {
  std::string s = "name: lol\ninput: [28, 28, 1]\nlayers:\n  - &a0 {seq: [relu, relu, relu, relu, relu, relu, relu, relu, relu, relu]}\n";
  for (int i = 1; i < 9; ++i) {
    s += "  - &a" + std::to_string(i) + " {seq: [";
    for (int k = 0; k < 10; ++k) s += (k ? ", *a" : "*a") + std::to_string(i - 1);
    s += "]}\n";
  }
  return s + "  - gap\n  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n";
}

}  // namespace

TEST(YamlLimits, BillionLaughsIsRefusedQuicklyNamingTheFileAndTheLimit) {
  const std::string text = billion_laughs_model();
  ASSERT_LT(text.size(), 1000u);
  const auto t0 = std::chrono::steady_clock::now();
  expect_error(text, {"bad.yaml:", "aliases expand to more than 1000000 nodes", "billion laughs"});
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  // The same limit guards every other YAML reader: the arch plan (the reader behind weights' arch_plan).
  try {
    renaissance::plan::ArchPlan::from_yaml("format: renaissance-arch-plan\nx: &a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n" +
                                               [] {
                                                 std::string s;
                                                 for (int i = 1; i < 8; ++i) {
                                                   s += "x" + std::to_string(i) + ": &a" + std::to_string(i) + " [";
                                                   for (int k = 0; k < 10; ++k)
                                                     s += std::string(k ? ", " : "") +
                                                          (i == 1 ? "*a" : "*a" + std::to_string(i - 1));
                                                   s += "]\n";
                                                 }
                                                 return s;
                                               }(),
                                           "plan.yaml");
    ADD_FAILURE() << "expected an Error";
  } catch (const renaissance::Error& e) {
    EXPECT_NE(std::string(e.what()).find("plan.yaml:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1000000"), std::string::npos) << e.what();
  }
}

TEST(YamlLimits, DeepNestingNamesTheFileAndTheLimit) {
  const std::string deep = "name: deep\ninput: [8, 8, 3]\nlayers: " + std::string(5000, '[') + std::string(5000, ']') + "\n";
  expect_error(deep, {"bad.yaml:3", "deeper than 100 levels", "the limit"});
  // Nesting built by aliases counts too: each anchor nests the one before 60 levels deeper.
  std::string viaalias = "name: deep\ninput: [8, 8, 3]\na: &a " + std::string(60, '[') + std::string(60, ']') + "\n";
  viaalias += "b: &b " + std::string(59, '[') + "*a" + std::string(59, ']') + "\nlayers: [relu]\n";
  expect_error(viaalias, {"bad.yaml:4", "with this alias expanded", "deeper than 100"});
}

TEST(YamlLimits, ModestAnchorsAndNestingStillParse) {
  // An anchor reused a few times (a repeated block) and 40 levels of nested seq are fine.
  std::string nested = "layers:\n  - &c {cbr: {out: 8, k: 3, pad: 1}}\n  - *c\n  - *c\n  - ";
  for (int i = 0; i < 40; ++i) nested += "{seq: [";
  nested += "relu";
  for (int i = 0; i < 40; ++i) nested += "]}";
  nested += "\n  - gap\n  - fc: {out: 10}\n  - softmax_ce: {classes: 10}\n";
  rb::BluePrint bp;
  ASSERT_NO_THROW(bp = rb::blueprint_from_yaml("name: ok\ninput: [8, 8, 3]\n" + nested, "ok.yaml"));
  EXPECT_EQ(bp.root.children.size(), 7u);
  EXPECT_TRUE(bp.root.children[0] == bp.root.children[2]);  // the alias is the anchored layer
}

TEST(YamlLimits, ADirectoryOrMissingModelFileIsNamedAsSuch) {
  try {
    rb::load_blueprint_file(fs::temp_directory_path().string());
    ADD_FAILURE();
  } catch (const renaissance::Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory, not a file"), std::string::npos) << e.what();
  }
  try {
    rb::load_blueprint_file("/nonexistent/m.yaml");
    ADD_FAILURE();
  } catch (const renaissance::Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/m.yaml: model file: no such file"), std::string::npos) << e.what();
  }
}
