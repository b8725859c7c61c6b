#include <renaissance/blueprint/blueprint.h>
#include <renaissance/core/dtensor.h>
#include <renaissance/core/error.h>

namespace renaissance::blueprint {

const char* node_kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::Seq: return "seq";
    case NodeKind::Repeat: return "repeat";
    case NodeKind::Conv: return "conv";
    case NodeKind::Bn: return "bn";
    case NodeKind::Relu: return "relu";
    case NodeKind::Tanh: return "tanh";
    case NodeKind::Identity: return "identity";
    case NodeKind::Cbr: return "cbr";
    case NodeKind::MaxPool: return "maxpool";
    case NodeKind::Gap: return "gap";
    case NodeKind::Flatten: return "flatten";
    case NodeKind::Fc: return "fc";
    case NodeKind::GapFc: return "gap_fc";
    case NodeKind::Add2: return "add2";
    case NodeKind::Block: return "block";
    case NodeKind::SoftmaxCE: return "softmax_ce";
#define RN_BP_ACT_NAME(F, P, key) \
  case NodeKind::F: return #key;
      RN_ACTIVATIONS(RN_BP_ACT_NAME)
#undef RN_BP_ACT_NAME
  }
  return "?";
}

const char* block_kind_name(BlockKind k) {
  switch (k) {
    case BlockKind::RESNET_1_3_1: return "RESNET_1_3_1";
    case BlockKind::RESNET_3_3: return "RESNET_3_3";
    case BlockKind::MBV2_INV_RESIDUAL: return "MBV2_INV_RESIDUAL";
  }
  return "?";
}

BlockKind block_kind_from_name(const std::string& s) {
  for (BlockKind k : {BlockKind::RESNET_1_3_1, BlockKind::RESNET_3_3, BlockKind::MBV2_INV_RESIDUAL})
    if (s == block_kind_name(k)) return k;
  RN_FAIL("unknown block kind '{}' (known: RESNET_1_3_1, RESNET_3_3, MBV2_INV_RESIDUAL)", s);
}

bool operator==(const Layer& a, const Layer& b) {
  return a.kind == b.kind && a.name == b.name && a.out_c == b.out_c && a.mid_c == b.mid_c && a.k == b.k &&
         a.stride == b.stride && a.pad == b.pad && a.groups == b.groups && a.bias == b.bias && a.count == b.count &&
         a.block == b.block && a.children == b.children;
}

namespace {
Layer node(NodeKind k) {
  Layer l;
  l.kind = k;
  return l;
}
}  // namespace

Layer seq(std::vector<Layer> layers) {
  Layer l = node(NodeKind::Seq);
  l.children = std::move(layers);
  return l;
}
Layer repeat(std::int64_t n, Layer layer) {
  Layer l = node(NodeKind::Repeat);
  l.count = n;
  l.children.push_back(std::move(layer));
  return l;
}
Layer conv(std::int64_t out_c, std::int64_t k, std::int64_t stride, std::int64_t pad, std::int64_t groups, bool bias) {
  Layer l = node(NodeKind::Conv);
  l.out_c = out_c;
  l.k = k;
  l.stride = stride;
  l.pad = pad;
  l.groups = groups;
  l.bias = bias;
  return l;
}
Layer dwconv(std::int64_t k, std::int64_t stride, std::int64_t pad) { return conv(0, k, stride, pad, kDepthwise); }
Layer bn() { return node(NodeKind::Bn); }
Layer relu() { return node(NodeKind::Relu); }
Layer tanh() { return node(NodeKind::Tanh); }
Layer identity() { return node(NodeKind::Identity); }
Layer cbr(std::int64_t out_c, std::int64_t k, std::int64_t stride, std::int64_t pad) {
  Layer l = conv(out_c, k, stride, pad);
  l.kind = NodeKind::Cbr;
  return l;
}
Layer maxpool(std::int64_t k, std::int64_t stride, std::int64_t pad) {
  Layer l = node(NodeKind::MaxPool);
  l.k = k;
  l.stride = stride;
  l.pad = pad;
  return l;
}
Layer gap() { return node(NodeKind::Gap); }
Layer flatten() { return node(NodeKind::Flatten); }
Layer fc(std::int64_t n) {
  Layer l = node(NodeKind::Fc);
  l.out_c = n;
  return l;
}
Layer gap_fc(std::int64_t n) {
  Layer l = node(NodeKind::GapFc);
  l.out_c = n;
  return l;
}
Layer add2(Layer main, Layer shortcut) {
  Layer l = node(NodeKind::Add2);
  l.children.push_back(std::move(main));
  l.children.push_back(std::move(shortcut));
  return l;
}
Layer block(std::int64_t mid_c, std::int64_t out_c, BlockKind kind, std::int64_t stride) {
  Layer l = node(NodeKind::Block);
  l.mid_c = mid_c;
  l.out_c = out_c;
  l.block = kind;
  l.stride = stride;
  return l;
}
Layer softmax_ce(std::int64_t num_classes) {
  Layer l = node(NodeKind::SoftmaxCE);
  l.count = num_classes;
  return l;
}

#define RN_BP_ACT_FACTORY(F, P, key) \
  Layer key() { return node(NodeKind::F); }
RN_ACTIVATIONS(RN_BP_ACT_FACTORY)
#undef RN_BP_ACT_FACTORY

bool node_activation(NodeKind k, ops::Activation* out) {
  switch (k) {
#define RN_BP_ACT_CASE(F, P, key) \
  case NodeKind::F: *out = ops::Activation::F; return true;
    RN_ACTIVATIONS(RN_BP_ACT_CASE)
#undef RN_BP_ACT_CASE
    default: return false;
  }
}

std::string input_shape_problem(std::int64_t h, std::int64_t w, std::int64_t c) {
  if (h != w)
    return fmt::format(
        "input [{}, {}, {}]: only square inputs are supported (H = W); crop the images to a square "
        "(`--crop center`, or `data import folder --store raw --size S`)",
        h, w, c);
  if (c > kMaxImageChannels)
    return fmt::format("input [{}, {}, {}]: at most {} image channels are supported", h, w, c, kMaxImageChannels);
  return {};
}

}  // namespace renaissance::blueprint
