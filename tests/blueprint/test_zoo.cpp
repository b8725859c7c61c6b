// The zoo against torchvision's published parameter counts. The counter below is deliberately
// independent of the planner: it walks the BluePrint tree itself, so a planner bug cannot hide a
// zoo bug (and vice versa).
#include <renaissance/blueprint/zoo.h>
#include <renaissance/core/error.h>

#include <gtest/gtest.h>

#include <functional>
#include <map>

namespace rb = renaissance::blueprint;
using rb::BlockKind;
using rb::Layer;
using rb::NodeKind;

namespace {

struct Shape {
  std::int64_t h, w, c;
};

std::int64_t spatial(std::int64_t x, std::int64_t k, std::int64_t s, std::int64_t p) { return (x + 2 * p - k) / s + 1; }

/// Parameters of a layer tree applied to an input of shape `x`; `x` becomes the output shape.
std::int64_t count_params(const Layer& l, Shape& x) {
  switch (l.kind) {
    case NodeKind::Seq: {
      std::int64_t n = 0;
      for (const Layer& c : l.children) n += count_params(c, x);
      return n;
    }
    case NodeKind::Repeat: {
      std::int64_t n = 0;
      for (std::int64_t i = 0; i < l.count; ++i) n += count_params(l.children.at(0), x);
      return n;
    }
    case NodeKind::Conv:
    case NodeKind::Cbr: {
      const bool dw = l.groups == rb::kDepthwise;
      const std::int64_t groups = dw ? x.c : l.groups;
      const std::int64_t out = dw && l.out_c == 0 ? x.c : l.out_c;
      std::int64_t n = out * (x.c / groups) * l.k * l.k + (l.bias ? out : 0);
      if (l.kind == NodeKind::Cbr) n += 2 * out;
      x = {spatial(x.h, l.k, l.stride, l.pad), spatial(x.w, l.k, l.stride, l.pad), out};
      return n;
    }
    case NodeKind::Bn: return 2 * x.c;
    case NodeKind::MaxPool:
      x = {spatial(x.h, l.k, l.stride, l.pad), spatial(x.w, l.k, l.stride, l.pad), x.c};
      return 0;
    case NodeKind::Gap: x = {1, 1, x.c}; return 0;
    case NodeKind::Flatten: x = {1, 1, x.h * x.w * x.c}; return 0;
    case NodeKind::Fc:
    case NodeKind::GapFc: {
      const std::int64_t in = l.kind == NodeKind::Fc ? x.h * x.w * x.c : x.c;
      x = {1, 1, l.out_c};
      return in * l.out_c + l.out_c;
    }
    case NodeKind::Add2: {
      Shape shortcut = x;
      const std::int64_t n = count_params(l.children.at(0), x) + count_params(l.children.at(1), shortcut);
      EXPECT_TRUE(x.h == shortcut.h && x.w == shortcut.w && x.c == shortcut.c) << "add2 shapes differ";
      return n;
    }
    case NodeKind::Block: {
      const std::int64_t in = x.c, mid = l.mid_c, out = l.out_c;
      const bool projection = l.stride != 1 || in != out;
      std::int64_t n = 0;
      switch (l.block) {
        case BlockKind::RESNET_1_3_1:
          n = in * mid + 2 * mid + mid * mid * 9 + 2 * mid + mid * out + 2 * out;
          if (projection) n += in * out + 2 * out;
          break;
        case BlockKind::RESNET_3_3:
          n = in * out * 9 + 2 * out + out * out * 9 + 2 * out;
          if (projection) n += in * out + 2 * out;
          break;
        case BlockKind::MBV2_INV_RESIDUAL:  // no projection: the planner drops the shortcut instead
          n = in * mid + 2 * mid + mid * 9 + 2 * mid + mid * out + 2 * out;
          break;
      }
      x = {spatial(x.h, 3, l.stride, 1), spatial(x.w, 3, l.stride, 1), out};
      return n;
    }
    case NodeKind::Relu:
    case NodeKind::Tanh:
    case NodeKind::Identity:
    case NodeKind::SoftmaxCE: return 0;
    default: break;
  }
  renaissance::ops::Activation a{};
  if (rb::node_activation(l.kind, &a)) return 0;  // ops/activations.h: element-wise, no parameters
  ADD_FAILURE() << "unhandled node kind";
  return 0;
}

std::int64_t count_params(const rb::BluePrint& bp, Shape* out = nullptr) {
  Shape x{bp.in_h, bp.in_w, bp.in_c};
  const std::int64_t n = count_params(bp.root, x);
  if (out) *out = x;
  return n;
}

/// The last softmax_ce in the tree (the zoo puts it at the end of the root).
const Layer* find_softmax(const Layer& l) {
  const Layer* found = l.kind == NodeKind::SoftmaxCE ? &l : nullptr;
  for (const Layer& c : l.children)
    if (const Layer* f = find_softmax(c)) found = f;
  return found;
}

}  // namespace

TEST(Zoo, ParameterCountsMatchTorchvision) {
  const std::map<std::string, std::int64_t> published = {
      {"resnet18", 11689512}, {"resnet34", 21797672},    {"resnet50", 25557032},
      {"resnet101", 44549160}, {"mobilenet_v2", 3504872}, {"vgg16", 138357544},
  };
  for (const auto& [name, params] : published) {
    const rb::BluePrint bp = rb::zoo_model(name);
    EXPECT_EQ(bp.in_h, 224) << name;
    EXPECT_EQ(bp.in_w, 224) << name;
    EXPECT_EQ(bp.in_c, 3) << name;
    Shape out{};
    EXPECT_EQ(count_params(bp, &out), params) << name;
    EXPECT_EQ(out.c, 1000) << name;
  }
}

TEST(Zoo, SmallInputVariants) {
  // resnet18_cifar: the torchvision resnet18 with a 3×3 stem and 10 classes (the well-known 11,173,962).
  rb::BluePrint bp = rb::zoo_model("resnet18_cifar");
  EXPECT_EQ(bp.in_h, 32);
  EXPECT_EQ(bp.in_c, 3);
  EXPECT_EQ(count_params(bp), 11689512 - 64 * 3 * 49 + 64 * 3 * 9 - 513000 + 5130);

  bp = rb::zoo_model("resnet18_fmnist");
  EXPECT_EQ(bp.in_h, 28);
  EXPECT_EQ(bp.in_c, 1);
  EXPECT_EQ(count_params(bp), 11689512 - 64 * 3 * 49 + 64 * 1 * 9 - 513000 + 5130);

  bp = rb::zoo_model("fmnist_cnn");
  EXPECT_EQ(bp.in_h, 28);
  EXPECT_EQ(bp.in_w, 28);
  EXPECT_EQ(bp.in_c, 1);
  Shape out{};
  const std::int64_t n = count_params(bp, &out);
  EXPECT_EQ(n, (9 * 32 + 64) + (32 * 9 * 64 + 128) + (64 * 9 * 64 + 128) + (7 * 7 * 64 * 10 + 10));
  EXPECT_EQ(n, 87274);  // cheap on a 2-core CPU
  EXPECT_EQ(out.c, 10);
}

TEST(Zoo, ShapesReachTheClassifier) {
  // ImageNet stems reduce 224 to 7×7 before the pool; VGG flattens 7·7·512.
  for (const char* name : {"resnet18", "resnet50", "mobilenet_v2"}) {
    const rb::BluePrint bp = rb::zoo_model(name);
    Shape x{bp.in_h, bp.in_w, bp.in_c};
    const Layer& root = bp.root;
    ASSERT_EQ(root.kind, NodeKind::Seq);
    // Walk up to the gap: everything before it.
    for (const Layer& c : root.children) {
      if (c.kind == NodeKind::Gap) break;
      count_params(c, x);
    }
    EXPECT_EQ(x.h, 7) << name;
    EXPECT_EQ(x.w, 7) << name;
  }
  const rb::BluePrint vgg = rb::zoo_model("vgg16");
  Shape x{vgg.in_h, vgg.in_w, vgg.in_c};
  for (const Layer& c : vgg.root.children) {
    count_params(c, x);
    if (c.kind == NodeKind::Flatten) break;
  }
  EXPECT_EQ(x.c, 7 * 7 * 512);
}

TEST(Zoo, OptionsOverrideDefaults) {
  rb::ZooOptions opts;
  opts.num_classes = 10;
  opts.in_c = 1;
  opts.resolution = 64;
  const rb::BluePrint bp = rb::zoo_model("resnet18", opts);
  EXPECT_EQ(bp.in_h, 64);
  EXPECT_EQ(bp.in_w, 64);
  EXPECT_EQ(bp.in_c, 1);
  Shape out{};
  EXPECT_EQ(count_params(bp, &out), 11689512 - 64 * 3 * 49 + 64 * 1 * 49 - 513000 + 5130);
  EXPECT_EQ(out.c, 10);
  const Layer* sm = find_softmax(bp.root);
  ASSERT_NE(sm, nullptr);
  EXPECT_EQ(sm->count, 10);

  opts = {};
  opts.num_classes = 100;
  const rb::BluePrint m = rb::zoo_model("mobilenet_v2", opts);
  EXPECT_EQ(count_params(m), 3504872 - 1281000 + 128100);
  EXPECT_EQ(m.in_h, 224);
}

TEST(Zoo, EveryModelBuildsAndEndsInSoftmax) {
  const std::vector<std::string> names = rb::zoo_names();
  EXPECT_EQ(names, (std::vector<std::string>{"resnet18", "resnet34", "resnet50", "resnet101", "mobilenet_v2", "vgg16",
                                             "resnet18_cifar", "resnet18_fmnist", "fmnist_cnn"}));
  for (const std::string& name : names) {
    const rb::BluePrint bp = rb::zoo_model(name);
    EXPECT_EQ(bp.name, name);
    ASSERT_EQ(bp.root.kind, NodeKind::Seq) << name;
    ASSERT_FALSE(bp.root.children.empty()) << name;
    EXPECT_EQ(bp.root.children.back().kind, NodeKind::SoftmaxCE) << name;
    Shape out{};
    count_params(bp, &out);
    EXPECT_EQ(out.c, bp.root.children.back().count) << name;
  }
}

TEST(Zoo, BlockStructure) {
  // torchvision v1.5: bottleneck stages of 3/4/23/3 blocks, downsampling in the first block of stages 2-4.
  const rb::BluePrint bp = rb::zoo_model("resnet101");
  std::vector<const Layer*> blocks;
  std::function<void(const Layer&)> walk = [&](const Layer& l) {
    if (l.kind == NodeKind::Block) blocks.push_back(&l);
    if (l.kind == NodeKind::Repeat) {
      for (std::int64_t i = 0; i < l.count; ++i) walk(l.children[0]);
      return;
    }
    for (const Layer& c : l.children) walk(c);
  };
  walk(bp.root);
  ASSERT_EQ(blocks.size(), 33u);
  int downsampling = 0;
  for (const Layer* b : blocks) {
    EXPECT_EQ(b->block, BlockKind::RESNET_1_3_1);
    EXPECT_EQ(b->out_c, 4 * b->mid_c);
    downsampling += b->stride == 2;
  }
  EXPECT_EQ(downsampling, 3);
}

TEST(Zoo, UnknownNameListsKnownNames) {
  try {
    rb::zoo_model("resnet19");
    FAIL() << "expected an Error";
  } catch (const renaissance::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("resnet19"), std::string::npos) << what;
    for (const std::string& n : rb::zoo_names()) EXPECT_NE(what.find(n), std::string::npos) << what;
  }
}

TEST(Zoo, NegativeOptionsAreRejected) {
  rb::ZooOptions opts;
  opts.resolution = -1;
  EXPECT_THROW(rb::zoo_model("resnet18", opts), renaissance::Error);
}
