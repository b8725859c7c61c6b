// ArchPlan: the ten steps of DESIGN §3 and the per-layer shape/parameter/MAC formulas.
#include <renaissance/core/error.h>
#include <renaissance/ops/pool.h>
#include <renaissance/plan/arch_plan.h>
#include <renaissance/core/dtensor.h>

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

namespace renaissance::plan {

namespace bp = renaissance::blueprint;

namespace {

std::string describe(const ArchLayer& l, std::size_t index) {
  if (!l.name.empty()) return fmt::format("layer '{}' ({})", l.name, layer_kind_name(l.kind));
  return fmt::format("layer #{} ({})", index, layer_kind_name(l.kind));
}

ArchLayer make(LayerKind kind, LayerParams params = NoParams{}, std::string name = {}) {
  ArchLayer l;
  l.kind = kind;
  l.params = std::move(params);
  l.name = std::move(name);
  return l;
}

/// Upper bounds that keep every size product of a plan inside int64 (found by tests/fuzz/fuzz_blueprint_yaml: an input
/// of 32333333333333333 rows overflowed the flatten size). Far beyond any real model.
constexpr std::int64_t kMaxExtent = std::int64_t(1) << 20;       // one H, W, C, stride, pad, output width
constexpr std::int64_t kMaxKernel = std::int64_t(1) << 10;       // so out_c * k * k * in_c stays < 2^60
constexpr std::size_t kMaxLayers = 100000;                       // after expanding repeat/block (ResNet-152: ~500)
constexpr std::int64_t kMaxSampleElems = std::int64_t(1) << 36;  // H*W*C of one sample (fc weights < 2^56)
constexpr std::int64_t kMaxLayerMacs = std::int64_t(1) << 45;    // per sample (ResNet-50's largest: ~1.2e8), so
                                                                 // kMaxLayers of them stay < 2^62

void check_extents(const Shape& s, const std::string& ctx) {
  RN_CHECK_CTX(s.h <= kMaxExtent && s.w <= kMaxExtent && s.c <= kMaxExtent, ctx,
               "shape {} is too large (each of H, W, C must be at most {})", s.str_hwc(), kMaxExtent);
  RN_CHECK_CTX(s.h * s.w <= kMaxSampleElems / s.c, ctx, "shape {} has more than {} elements per sample", s.str_hwc(),
               kMaxSampleElems);
}

void check_param(std::int64_t v, const char* what, const std::string& ctx, std::int64_t max = kMaxExtent) {
  RN_CHECK_CTX(v <= max, ctx, "{} = {} is too large (at most {})", what, v, max);
}

std::int64_t conv_out(std::int64_t in, std::int64_t k, std::int64_t s, std::int64_t p) {
  return ops::window_out(in, k, s, p);
}

// ---- step 1 ----------------------------------------------------------------------------------

struct Expander {
  const BuildOptions& opts;
  steps::Layers out;

  static std::string suffix(const std::string& name, const std::string& s) { return name.empty() ? name : name + s; }

  ConvParams conv_params(const bp::Layer& n) const {
    ConvParams p;
    p.out_c = n.out_c;
    p.k = n.k;
    p.stride = n.stride;
    p.pad = n.pad;
    p.groups = n.groups;
    p.bias = n.bias;
    return p;
  }

  void check_positive(const bp::Layer& n, const std::string& path, const char* field, std::int64_t v) const {
    RN_CHECK_CTX(v > 0, path, "{}: field '{}' must be positive, got {}", bp::node_kind_name(n.kind), field, v);
  }

  // Returns the channel count after the node (-1: unknown, e.g. after flatten).
  std::int64_t walk(const bp::Layer& n, std::int64_t c, const std::string& path, const std::string& name_suffix) {
    // Every node visited counts, not only the layers pushed: repeats of repeats of an empty body (`layer: []`) add
    // no layer, and n = 100000 three deep walked for hours.
    RN_CHECK_CTX(++visits <= kMaxVisits, path,
                 "the model expands to more than {} nodes (layers, and the seq and repeat nodes around them, empty "
                 "ones too)",
                 kMaxVisits);
    const std::string name = suffix(n.name, name_suffix);
    switch (n.kind) {
      case bp::NodeKind::Seq: {
        for (std::size_t i = 0; i < n.children.size(); ++i)
          c = walk(n.children[i], c, fmt::format("{}[{}]", path, i), name_suffix);
        return c;
      }
      case bp::NodeKind::Repeat: {
        RN_CHECK_CTX(n.count >= 1 && n.children.size() == 1, path, "repeat needs n >= 1 and one layer, got n = {}",
                     n.count);
        RN_CHECK_CTX(n.count <= static_cast<std::int64_t>(kMaxLayers), path, "repeat n = {} is more than {}", n.count,
                     kMaxLayers);
        for (std::int64_t i = 0; i < n.count; ++i)
          c = walk(n.children[0], c, fmt::format("{}.repeat[{}]", path, i),
                   n.count > 1 ? fmt::format("{}.{}", name_suffix, i) : name_suffix);
        return c;
      }
      case bp::NodeKind::Conv: {
        if (n.groups != bp::kDepthwise) {
          check_positive(n, path, "out", n.out_c);
          RN_CHECK_CTX(n.groups >= 1, path, "conv: field 'groups' must be >= 1, got {}", n.groups);
        }
        check_positive(n, path, "k", n.k);
        check_positive(n, path, "stride", n.stride);
        RN_CHECK_CTX(n.pad >= 0, path, "conv: field 'pad' must be >= 0, got {}", n.pad);
        push(make(LayerKind::Conv, conv_params(n), name), path);
        return n.groups == bp::kDepthwise ? (n.out_c > 0 ? n.out_c : c) : n.out_c;
      }
      case bp::NodeKind::Cbr: {
        check_positive(n, path, "out", n.out_c);
        check_positive(n, path, "k", n.k);
        check_positive(n, path, "stride", n.stride);
        RN_CHECK_CTX(n.pad >= 0, path, "cbr: field 'pad' must be >= 0, got {}", n.pad);
        if (opts.fuse) {
          push(make(LayerKind::CBR, conv_params(n), name), path);
        } else {
          push(make(LayerKind::Conv, conv_params(n), name), path);
          push(make(LayerKind::Bn, NoParams{}, suffix(name, ".bn")), path);
          push(make(LayerKind::Relu, NoParams{}, suffix(name, ".relu")), path);
        }
        return n.out_c;
      }
      case bp::NodeKind::Bn: push(make(LayerKind::Bn, NoParams{}, name), path); return c;
      case bp::NodeKind::Relu: push(make(LayerKind::Relu, NoParams{}, name), path); return c;
      case bp::NodeKind::Tanh: push(make(LayerKind::Tanh, NoParams{}, name), path); return c;
      case bp::NodeKind::Identity: push(make(LayerKind::Identity, NoParams{}, name), path); return c;
      case bp::NodeKind::MaxPool: {
        check_positive(n, path, "k", n.k);
        check_positive(n, path, "stride", n.stride);
        RN_CHECK_CTX(n.pad >= 0, path, "maxpool: field 'pad' must be >= 0, got {}", n.pad);
        push(make(LayerKind::MaxPool, PoolParams{n.k, n.stride, n.pad}, name), path);
        return c;
      }
      case bp::NodeKind::Gap: push(make(LayerKind::Gap, NoParams{}, name), path); return c;
      case bp::NodeKind::Flatten: push(make(LayerKind::Flatten, NoParams{}, name), path); return -1;
      case bp::NodeKind::Fc: {
        check_positive(n, path, "out", n.out_c);
        push(make(LayerKind::Fc, FcParams{n.out_c}, name), path);
        return n.out_c;
      }
      case bp::NodeKind::GapFc: {
        check_positive(n, path, "out", n.out_c);
        push(make(LayerKind::Gap, NoParams{}, suffix(name, ".gap")), path);
        push(make(LayerKind::Fc, FcParams{n.out_c}, name), path);
        return n.out_c;
      }
      case bp::NodeKind::SoftmaxCE: {
        check_positive(n, path, "classes", n.count);
        push(make(LayerKind::SoftmaxCE, FcParams{n.count}, name), path);
        return c;
      }
      case bp::NodeKind::Add2: {
        RN_CHECK_CTX(n.children.size() == 2, path, "add2 needs exactly two branches (main, shortcut)");
        push(make(LayerKind::Add2Start, NoParams{}, suffix(name, ".start")), path);
        const std::int64_t cs = walk(n.children[1], c, path + ".shortcut", name_suffix);
        push(make(LayerKind::Add2ShortcutEnd, NoParams{}, suffix(name, ".shortcut_end")), path);
        const std::int64_t cm = walk(n.children[0], c, path + ".main", name_suffix);
        push(make(LayerKind::Add2End, NoParams{}, name), path);
        (void)cs;  // shape agreement is checked by infer_shapes, which knows the spatial sizes too
        return cm;
      }
      case bp::NodeKind::Block: return block(n, c, path, name);
      default: break;
    }
    ops::Activation a{};
    if (bp::node_activation(n.kind, &a)) {
      push(make(activation_layer_kind(a), NoParams{}, name), path);
      return c;
    }
    RN_FAIL_CTX(path, "unknown node kind");
  }

  std::int64_t block(const bp::Layer& n, std::int64_t in_c, const std::string& path, const std::string& name) {
    check_positive(n, path, "out", n.out_c);
    check_positive(n, path, "stride", n.stride);
    if (n.block != bp::BlockKind::RESNET_3_3) check_positive(n, path, "mid", n.mid_c);
    RN_CHECK_CTX(in_c > 0, path, "block: the number of input channels is unknown here (after a flatten?)");
    const std::int64_t mid = n.block == bp::BlockKind::RESNET_3_3 ? n.out_c : n.mid_c;
    const bool same = n.stride == 1 && in_c == n.out_c;
    const BlockParams bpar{mid, n.out_c, n.stride};
    auto conv_bn = [&](std::int64_t out, std::int64_t k, std::int64_t s, std::int64_t groups, bool relu) {
      ConvParams p;
      p.out_c = out;
      p.k = k;
      p.stride = s;
      p.pad = k / 2;
      p.groups = groups;
      push(make(LayerKind::Conv, p), path);
      push(make(LayerKind::Bn), path);
      if (relu) push(make(LayerKind::Relu), path);
    };
    switch (n.block) {
      case bp::BlockKind::RESNET_1_3_1:
      case bp::BlockKind::RESNET_3_3: {
        const bool bottleneck = n.block == bp::BlockKind::RESNET_1_3_1;
        if (opts.fuse) {
          LayerKind k = bottleneck ? (same ? LayerKind::BottleneckIdentity : LayerKind::BottleneckProjection)
                                   : (same ? LayerKind::BasicBlockIdentity : LayerKind::BasicBlockProjection);
          push(make(k, bpar, name), path);
          return n.out_c;
        }
        push(make(LayerKind::Add2Start, NoParams{}, suffix(name, ".start")), path);
        if (!same) conv_bn(n.out_c, 1, n.stride, 1, false);
        push(make(LayerKind::Add2ShortcutEnd, NoParams{}, suffix(name, ".shortcut_end")), path);
        if (bottleneck) {
          conv_bn(mid, 1, 1, 1, true);
          conv_bn(mid, 3, n.stride, 1, true);
          conv_bn(n.out_c, 1, 1, 1, false);
        } else {
          conv_bn(n.out_c, 3, n.stride, 1, true);
          conv_bn(n.out_c, 3, 1, 1, false);
        }
        push(make(LayerKind::Add2End, NoParams{}, name), path);
        push(make(LayerKind::Relu, NoParams{}, suffix(name, ".relu")), path);
        return n.out_c;
      }
      case bp::BlockKind::MBV2_INV_RESIDUAL: {
        if (opts.fuse) {
          push(make(same ? LayerKind::InvResidualIdentity : LayerKind::InvResidualNoShortcut, bpar, name), path);
          return n.out_c;
        }
        if (same) {
          push(make(LayerKind::Add2Start, NoParams{}, suffix(name, ".start")), path);
          push(make(LayerKind::Add2ShortcutEnd, NoParams{}, suffix(name, ".shortcut_end")), path);
        }
        conv_bn(mid, 1, 1, 1, true);
        conv_bn(mid, 3, n.stride, mid, true);
        conv_bn(n.out_c, 1, 1, 1, false);
        if (same) push(make(LayerKind::Add2End, NoParams{}, name), path);
        return n.out_c;
      }
    }
    RN_FAIL_CTX(path, "unknown block kind");
  }

  static constexpr std::uint64_t kMaxVisits = 4 * kMaxLayers;
  std::uint64_t visits = 0;

  void push(ArchLayer l, const std::string& path) {
    // A `repeat: {n: 1000000000}` must be an error, not an hour of expansion (tests/fuzz).
    RN_CHECK_CTX(out.size() < kMaxLayers, path, "the model expands to more than {} layers", kMaxLayers);
    l.origin = path;
    out.push_back(std::move(l));
  }
};

bool is_transparent_for_bn(LayerKind k) {
  ops::Activation a{};
  return k == LayerKind::Relu || k == LayerKind::Tanh || k == LayerKind::Identity || k == LayerKind::ChannelPadding ||
         layer_activation(k, &a);
}

}  // namespace

// ---- per-layer formulas --------------------------------------------------------------------------

Shape infer_out_shape(const ArchLayer& l, const Shape& in) {
  const std::string ctx = l.name.empty() ? (l.origin.empty() ? std::string(layer_kind_name(l.kind)) : l.origin)
                                         : fmt::format("layer '{}'", l.name);
  RN_CHECK_CTX(in.valid(), ctx, "{} gets an empty input {}", layer_kind_name(l.kind), in.str_hwc());
  check_extents(in, ctx);
  auto spatial = [&](std::int64_t k, std::int64_t s, std::int64_t p) {
    check_param(k, "kernel", ctx, kMaxKernel);
    check_param(s, "stride", ctx);
    check_param(p, "pad", ctx);
    const std::int64_t oh = conv_out(in.h, k, s, p), ow = conv_out(in.w, k, s, p);
    RN_CHECK_CTX(oh > 0 && ow > 0, ctx,
                 "spatial size shrinks to zero: input {} with kernel {}, stride {}, pad {} (hint: the input is too "
                 "small for this many downsampling layers)",
                 in.str_hwc(), k, s, p);
    return std::pair<std::int64_t, std::int64_t>(oh, ow);
  };
  switch (l.kind) {
    case LayerKind::Conv:
    case LayerKind::CBR: {
      const ConvParams& p = l.conv();
      const std::int64_t out_c = p.groups == bp::kDepthwise ? (p.out_c > 0 ? p.out_c : in.c) : p.out_c;
      const std::int64_t groups = p.groups == bp::kDepthwise ? in.c : p.groups;
      RN_CHECK_CTX(out_c > 0, ctx, "negative or zero output channels ({})", out_c);
      check_param(out_c, "output channels", ctx);
      RN_CHECK_CTX(groups >= 1 && in.c % groups == 0 && out_c % groups == 0, ctx,
                   "groups = {} must divide the input channels ({}) and the output channels ({})", groups, in.c,
                   out_c);
      auto [oh, ow] = spatial(p.k, p.stride, p.pad);
      return Shape{in.n, oh, ow, out_c};
    }
    case LayerKind::Bn:
    case LayerKind::Bn2d:
    case LayerKind::Bn1d:
    case LayerKind::Relu:
    case LayerKind::Tanh:
    case LayerKind::Identity:
    case LayerKind::Add2Start:
    case LayerKind::Add2ShortcutEnd:
    case LayerKind::Add2End: return in;
    case LayerKind::MaxPool: {
      const PoolParams& p = l.pool();
      RN_CHECK_CTX(p.pad * 2 <= p.k, ctx, "maxpool pad {} must be at most half the kernel {}", p.pad, p.k);
      auto [oh, ow] = spatial(p.k, p.stride, p.pad);
      return Shape{in.n, oh, ow, in.c};
    }
    case LayerKind::Gap: return Shape{in.n, 1, 1, in.c};
    case LayerKind::Flatten: return Shape{in.n, 1, 1, in.h * in.w * in.c};
    case LayerKind::Fc:
    case LayerKind::GapFC: {
      RN_CHECK_CTX(l.fc().out > 0, ctx, "negative or zero output features ({})", l.fc().out);
      check_param(l.fc().out, "output features", ctx);
      return Shape{in.n, 1, 1, l.fc().out};
    }
    case LayerKind::SoftmaxCE: {
      RN_CHECK_CTX(in.h * in.w * in.c == l.fc().out, ctx,
                   "softmax_ce expects {} class scores but gets {} (hint: the last fc must output num_classes)",
                   l.fc().out, in.str_hwc());
      return in;
    }
    case LayerKind::ChannelPadding: {
      RN_CHECK_CTX(l.fc().out >= in.c, ctx, "channel padding to {} is smaller than the input's {}", l.fc().out, in.c);
      return Shape{in.n, in.h, in.w, l.fc().out};
    }
    case LayerKind::BottleneckIdentity:
    case LayerKind::BottleneckProjection:
    case LayerKind::BasicBlockIdentity:
    case LayerKind::BasicBlockProjection:
    case LayerKind::InvResidualNoShortcut:
    case LayerKind::InvResidualIdentity: {
      const BlockParams& p = l.block();
      RN_CHECK_CTX(p.out_c > 0 && p.mid_c > 0, ctx, "negative or zero channels (mid {}, out {})", p.mid_c, p.out_c);
      auto [oh, ow] = spatial(3, p.stride, 1);
      const bool identity = l.kind == LayerKind::BottleneckIdentity || l.kind == LayerKind::BasicBlockIdentity ||
                            l.kind == LayerKind::InvResidualIdentity;
      if (identity)
        RN_CHECK_CTX(p.stride == 1 && in.c == p.out_c, ctx,
                     "add2 branches disagree in shape: identity shortcut {} vs main branch {}x{}x{}", in.str_hwc(), oh,
                     ow, p.out_c);
      return Shape{in.n, oh, ow, p.out_c};
    }
    default: break;
  }
  ops::Activation a{};
  if (layer_activation(l.kind, &a)) return in;  // element-wise
  RN_FAIL_CTX(ctx, "no shape rule for {}", layer_kind_name(l.kind));
}

namespace {
/// Input channels one output channel of a conv sees, counting the real input (not the AMP padding to 8).
std::int64_t logical_in_per_group(const ArchLayer& l) {
  const ConvParams& p = l.conv();
  const std::int64_t in_c = p.logical_in_c > 0 ? p.logical_in_c : l.in_shape.c;
  const std::int64_t groups = p.groups == bp::kDepthwise ? l.in_shape.c : p.groups;
  return in_c / groups;
}
}  // namespace

std::int64_t layer_parameter_count(const ArchLayer& l) {
  const Shape& in = l.in_shape;
  auto bn = [](std::int64_t c) { return 2 * c; };
  switch (l.kind) {
    case LayerKind::Conv:
    case LayerKind::CBR: {
      const ConvParams& p = l.conv();
      const std::int64_t out = l.out_shape.c;
      std::int64_t n = out * p.k * p.k * logical_in_per_group(l) + (p.bias ? out : 0);
      if (l.kind == LayerKind::CBR) n += bn(out);
      return n;
    }
    case LayerKind::Bn2d:
    case LayerKind::Bn1d:
    case LayerKind::Bn: return bn(in.c);
    case LayerKind::Fc: return in.h * in.w * in.c * l.fc().out + l.fc().out;
    case LayerKind::GapFC: return in.c * l.fc().out + l.fc().out;
    case LayerKind::BottleneckIdentity:
    case LayerKind::BottleneckProjection: {
      const BlockParams& p = l.block();
      std::int64_t n = in.c * p.mid_c + bn(p.mid_c) + 9 * p.mid_c * p.mid_c + bn(p.mid_c) + p.mid_c * p.out_c + bn(p.out_c);
      if (l.kind == LayerKind::BottleneckProjection) n += in.c * p.out_c + bn(p.out_c);
      return n;
    }
    case LayerKind::BasicBlockIdentity:
    case LayerKind::BasicBlockProjection: {
      const BlockParams& p = l.block();
      std::int64_t n = 9 * in.c * p.out_c + bn(p.out_c) + 9 * p.out_c * p.out_c + bn(p.out_c);
      if (l.kind == LayerKind::BasicBlockProjection) n += in.c * p.out_c + bn(p.out_c);
      return n;
    }
    case LayerKind::InvResidualNoShortcut:
    case LayerKind::InvResidualIdentity: {
      const BlockParams& p = l.block();
      return in.c * p.mid_c + bn(p.mid_c) + 9 * p.mid_c + bn(p.mid_c) + p.mid_c * p.out_c + bn(p.out_c);
    }
    default: return 0;
  }
}

namespace {
/// The forward multiply-accumulates of one sample through `l`, counted in T: std::int64_t for reports, long double
/// for the bound infer_shapes checks first (the extents' bounds leave out_h * out_w * out_c * k * k * in_c up to
/// 2^102: a plan printed -2251795 GMACs/image).
template <typename T>
T forward_macs_in(const ArchLayer& l) {
  const Shape& in = l.in_shape;
  const Shape& out = l.out_shape;
  switch (l.kind) {
    case LayerKind::Conv:
    case LayerKind::CBR: {
      const ConvParams& p = l.conv();
      return T(out.h) * out.w * out.c * p.k * p.k * logical_in_per_group(l);
    }
    case LayerKind::Fc: return T(in.h) * in.w * in.c * l.fc().out;
    case LayerKind::GapFC: return T(in.c) * l.fc().out;
    case LayerKind::BottleneckIdentity:
    case LayerKind::BottleneckProjection: {
      const BlockParams& p = l.block();
      T n = T(in.h) * in.w * in.c * p.mid_c + T(out.h) * out.w * 9 * p.mid_c * p.mid_c +
            T(out.h) * out.w * p.mid_c * p.out_c;
      if (l.kind == LayerKind::BottleneckProjection) n += T(out.h) * out.w * in.c * p.out_c;
      return n;
    }
    case LayerKind::BasicBlockIdentity:
    case LayerKind::BasicBlockProjection: {
      const BlockParams& p = l.block();
      T n = T(out.h) * out.w * 9 * (T(in.c) * p.out_c + T(p.out_c) * p.out_c);
      if (l.kind == LayerKind::BasicBlockProjection) n += T(out.h) * out.w * in.c * p.out_c;
      return n;
    }
    case LayerKind::InvResidualNoShortcut:
    case LayerKind::InvResidualIdentity: {
      const BlockParams& p = l.block();
      return T(in.h) * in.w * in.c * p.mid_c + T(out.h) * out.w * 9 * p.mid_c + T(out.h) * out.w * p.mid_c * p.out_c;
    }
    default: return 0;
  }
}
}  // namespace

std::int64_t layer_forward_macs(const ArchLayer& l) { return forward_macs_in<std::int64_t>(l); }

// ---- the steps ----------------------------------------------------------------------------------

namespace steps {

Layers expand_tree(const bp::BluePrint& model, const BuildOptions& opts) {
  RN_CHECK_CTX(model.in_c > 0 && model.in_h > 0 && model.in_w > 0, model.name,
               "input must be positive H, W, C, got {}x{}x{}", model.in_h, model.in_w, model.in_c);
  Expander e{opts, {}};
  e.walk(model.root, model.in_c, "layers", "");
  RN_CHECK_CTX(!e.out.empty(), model.name, "the model has no layers");
  return std::move(e.out);
}

void rename_bn(Layers& layers) {
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].kind != LayerKind::Bn) continue;
    std::size_t j = i;
    while (j > 0 && is_transparent_for_bn(layers[j - 1].kind)) --j;
    bool one_d = false;
    if (j > 0) {
      const LayerKind prev = layers[j - 1].kind;
      one_d = prev == LayerKind::Fc || prev == LayerKind::Flatten || prev == LayerKind::Gap || prev == LayerKind::GapFC;
    }
    layers[i].kind = one_d ? LayerKind::Bn1d : LayerKind::Bn2d;
  }
}

std::int64_t place_softmax_ce(Layers& layers, std::int64_t num_classes_override) {
  std::int64_t classes = 0;
  std::string name;
  for (const ArchLayer& l : layers)
    if (l.kind == LayerKind::SoftmaxCE) {
      // DESIGN: wherever it is, the loss goes to the end; two that disagree on the classes were resolved silently
      // in favour of the last one.
      RN_CHECK_CTX(classes == 0 || classes == l.fc().out,
                   fmt::format("layer '{}'", l.name.empty() ? "softmax_ce" : l.name),
                   "a second softmax_ce with {} classes, after one with {} (a model has one loss: remove one)",
                   l.fc().out, classes);
      classes = l.fc().out;
      name = l.name;
    }
  layers.erase(std::remove_if(layers.begin(), layers.end(),
                              [](const ArchLayer& l) { return l.kind == LayerKind::SoftmaxCE; }),
               layers.end());
  if (num_classes_override > 0) classes = num_classes_override;
  RN_CHECK(classes > 0, "the model has no softmax_ce(num_classes) layer and no number of classes was given");
  ArchLayer s = make(LayerKind::SoftmaxCE, FcParams{classes}, name);
  s.origin = "softmax_ce";
  layers.push_back(std::move(s));
  return classes;
}

void insert_identity_placeholders(Layers& layers) {
  for (std::size_t i = 0; i + 1 < layers.size(); ++i) {
    if (layers[i].kind == LayerKind::Add2Start && layers[i + 1].kind == LayerKind::Add2ShortcutEnd) {
      ArchLayer id = make(LayerKind::Identity);
      id.origin = layers[i].origin + ".shortcut";
      layers.insert(layers.begin() + static_cast<std::ptrdiff_t>(i) + 1, std::move(id));
    }
  }
}

void infer_shapes(Layers& layers, const Shape& input) {
  struct Open {
    Shape block_in;
    Shape shortcut_out;
    bool shortcut_done = false;
  };
  std::vector<Open> open;
  Shape cur = input;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    ArchLayer& l = layers[i];
    l.in_shape = cur;
    switch (l.kind) {
      case LayerKind::Add2Start: open.push_back({cur, {}, false}); break;
      case LayerKind::Add2ShortcutEnd:
        RN_CHECK_CTX(!open.empty() && !open.back().shortcut_done, describe(l, i), "unbalanced add2 markers");
        open.back().shortcut_out = cur;
        open.back().shortcut_done = true;
        cur = open.back().block_in;
        break;
      case LayerKind::Add2End: {
        RN_CHECK_CTX(!open.empty() && open.back().shortcut_done, describe(l, i), "unbalanced add2 markers");
        const Shape sc = open.back().shortcut_out;
        open.pop_back();
        std::string ctx = l.name.empty() ? (l.origin.empty() ? describe(l, i) : l.origin) : describe(l, i);
        RN_CHECK_CTX(sc == cur, ctx, "add2 branches disagree in shape: main branch gives {}, shortcut gives {}",
                     cur.str_hwc(), sc.str_hwc());
        break;
      }
      default: cur = infer_out_shape(l, cur);
    }
    // Depthwise is resolved once the input channels are known.
    if ((l.kind == LayerKind::Conv || l.kind == LayerKind::CBR) && l.conv().groups == bp::kDepthwise) {
      ConvParams p = l.conv();
      p.groups = l.in_shape.c;
      p.out_c = cur.c;
      l.params = p;
    }
    l.out_shape = cur;
    // The MACs fit the int64 the reports count them in (per layer, and a model of kMaxLayers such layers).
    const long double macs = forward_macs_in<long double>(l);
    RN_CHECK_CTX(macs <= static_cast<long double>(kMaxLayerMacs),
                 l.name.empty() ? (l.origin.empty() ? describe(l, i) : l.origin) : describe(l, i),
                 "{:.3g} multiply-accumulates per sample is more than the {:.3g} a layer may have", macs,
                 static_cast<long double>(kMaxLayerMacs));
  }
  RN_CHECK(open.empty(), "unbalanced add2 markers at the end of the model");
}

void normalize_flatten(Layers& layers, const Shape& input, bool amp) {
  // A flatten is where a map meets the classifier: the plan keeps maps as they are and lets the fc read them whole,
  // so a flatten of a map larger than 1x1 may lead only to fc (or the loss), through element-wise layers. Any other
  // layer after it was planned on the map as if the flatten were not there (a bn became a per-channel BN of the map,
  // a 1x1 conv or gap ran on its channels), silently another network than the YAML's.
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const ArchLayer& f = layers[i];
    if (f.kind != LayerKind::Flatten || (f.in_shape.h == 1 && f.in_shape.w == 1)) continue;
    std::size_t j = i + 1;
    while (j < layers.size() && is_transparent_for_bn(layers[j].kind)) ++j;
    if (j == layers.size() || layers[j].kind == LayerKind::Fc || layers[j].kind == LayerKind::SoftmaxCE) continue;
    const ArchLayer& next = layers[j];
    RN_FAIL_CTX(
        f.origin.empty() ? describe(f, i) : f.origin,
        "flatten of a {}x{}x{} map followed by {}: a flatten may lead only to fc (through element-wise "
        "layers), anything else would run on the {}x{} map, not on the {} features (hint: put the layer "
        "before the flatten, or use gap)",
        f.in_shape.h, f.in_shape.w, f.in_shape.c,
        next.origin.empty() ? describe(next, j) : fmt::format("{} ({})", next.origin, layer_kind_name(next.kind)),
        f.in_shape.h, f.in_shape.w, f.in_shape.h * f.in_shape.w * f.in_shape.c);
  }
  layers.erase(std::remove_if(layers.begin(), layers.end(),
                              [](const ArchLayer& l) { return l.kind == LayerKind::Flatten; }),
               layers.end());
  infer_shapes(layers, input);
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const ArchLayer& l = layers[i];
    const bool spatial = l.in_shape.h != 1 || l.in_shape.w != 1;
    bool needed = false;
    if (l.kind == LayerKind::Fc) needed = spatial || (amp && l.in_shape.c % 8 != 0);
    if (l.kind == LayerKind::SoftmaxCE) needed = spatial;
    if (!needed) continue;
    ArchLayer f = make(LayerKind::Flatten);
    f.origin = l.origin + ".flatten";
    layers.insert(layers.begin() + static_cast<std::ptrdiff_t>(i), std::move(f));
    ++i;
  }
  infer_shapes(layers, input);
}

namespace {
bool is_conv(const ArchLayer& l, std::int64_t k, std::int64_t stride, bool depthwise) {
  if (l.kind != LayerKind::Conv) return false;
  const ConvParams& p = l.conv();
  if (p.k != k || p.pad != k / 2 || p.bias) return false;
  if (stride > 0 && p.stride != stride) return false;
  return depthwise ? (p.groups == l.in_shape.c && l.out_shape.c == l.in_shape.c) : p.groups == 1;
}
bool kinds_are(const Layers& v, std::size_t at, std::initializer_list<LayerKind> ks) {
  if (at + ks.size() > v.size()) return false;
  std::size_t i = at;
  for (LayerKind k : ks)
    if (v[i++].kind != k) return false;
  return true;
}
}  // namespace

void merge_blocks(Layers& layers) {
  using K = LayerKind;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].kind != K::Add2Start) continue;
    std::size_t s = i + 1;
    while (s < layers.size() && layers[s].kind != K::Add2ShortcutEnd && layers[s].kind != K::Add2Start) ++s;
    if (s >= layers.size() || layers[s].kind != K::Add2ShortcutEnd) continue;
    std::size_t e = s + 1;
    while (e < layers.size() && layers[e].kind != K::Add2End && layers[e].kind != K::Add2Start) ++e;
    if (e >= layers.size() || layers[e].kind != K::Add2End) continue;

    const Shape in = layers[i].in_shape;
    const Shape out = layers[e].out_shape;
    const std::size_t sc_len = s - i - 1, main_len = e - s - 1, m = s + 1;
    const bool identity = sc_len == 1 && layers[i + 1].kind == K::Identity;
    std::int64_t stride = 0;
    const bool projection = sc_len == 2 && is_conv(layers[i + 1], 1, -1, false) && layers[i + 2].kind == K::Bn2d;
    if (projection) stride = layers[i + 1].conv().stride;
    if (!identity && !projection) continue;
    const bool post_relu = e + 1 < layers.size() && layers[e + 1].kind == K::Relu;

    LayerKind fused = K::Identity;
    BlockParams bpar;
    if (main_len == 8 && post_relu &&
        kinds_are(layers, m, {K::Conv, K::Bn2d, K::Relu, K::Conv, K::Bn2d, K::Relu, K::Conv, K::Bn2d}) &&
        is_conv(layers[m], 1, 1, false) && is_conv(layers[m + 3], 3, -1, false) &&
        is_conv(layers[m + 6], 1, 1, false) && layers[m + 3].out_shape.c == layers[m].out_shape.c) {  // Bottleneck's 3×3 is mid -> mid
      const std::int64_t st = layers[m + 3].conv().stride;
      if ((identity && st == 1) || (projection && st == stride)) {
        fused = identity ? K::BottleneckIdentity : K::BottleneckProjection;
        bpar = {layers[m].out_shape.c, out.c, st};
      }
    } else if (main_len == 5 && post_relu && kinds_are(layers, m, {K::Conv, K::Bn2d, K::Relu, K::Conv, K::Bn2d}) &&
               is_conv(layers[m], 3, -1, false) && is_conv(layers[m + 3], 3, 1, false) &&
               layers[m].out_shape.c == out.c) {  // BasicBlock's first 3×3 is in -> out (mid = out)
      const std::int64_t st = layers[m].conv().stride;
      if ((identity && st == 1) || (projection && st == stride)) {
        fused = identity ? K::BasicBlockIdentity : K::BasicBlockProjection;
        bpar = {out.c, out.c, st};
      }
    } else if (main_len == 8 && identity &&
               kinds_are(layers, m, {K::Conv, K::Bn2d, K::Relu, K::Conv, K::Bn2d, K::Relu, K::Conv, K::Bn2d}) &&
               is_conv(layers[m], 1, 1, false) && is_conv(layers[m + 3], 3, 1, true) &&
               is_conv(layers[m + 6], 1, 1, false)) {
      fused = K::InvResidualIdentity;
      bpar = {layers[m].out_shape.c, out.c, 1};
    }
    if (fused == K::Identity) continue;
    const bool takes_relu = fused != K::InvResidualIdentity;
    ArchLayer f = make(fused, bpar, layers[e].name);
    f.origin = layers[i].origin;
    f.in_shape = in;
    f.out_shape = out;
    const std::size_t end = e + (takes_relu ? 2 : 1);
    layers.erase(layers.begin() + static_cast<std::ptrdiff_t>(i), layers.begin() + static_cast<std::ptrdiff_t>(end));
    layers.insert(layers.begin() + static_cast<std::ptrdiff_t>(i), std::move(f));
  }
}

void quadruple_fusion(Layers& layers) {
  // Deliberately none: Conv+BN+ReLU+MaxPool stays CBR + MaxPool. A fused pooling epilogue would save one
  // pass over the stem's output only, and would block the BN-folding of DESIGN §11 on the stem.
  (void)layers;
}

void fuse_cbr(Layers& layers) {
  for (std::size_t i = 0; i + 2 < layers.size(); ++i) {
    if (layers[i].kind == LayerKind::Conv && layers[i + 1].kind == LayerKind::Bn2d && layers[i + 2].kind == LayerKind::Relu) {
      ArchLayer f = layers[i];
      f.kind = LayerKind::CBR;
      f.out_shape = layers[i + 2].out_shape;
      layers.erase(layers.begin() + static_cast<std::ptrdiff_t>(i), layers.begin() + static_cast<std::ptrdiff_t>(i) + 3);
      layers.insert(layers.begin() + static_cast<std::ptrdiff_t>(i), std::move(f));
    }
  }
}

void fuse_gap_fc(Layers& layers) {
  for (std::size_t i = 0; i + 1 < layers.size(); ++i) {
    if (layers[i].kind == LayerKind::Gap && layers[i + 1].kind == LayerKind::Fc) {
      ArchLayer f = layers[i + 1];
      f.kind = LayerKind::GapFC;
      f.in_shape = layers[i].in_shape;
      if (f.name.empty()) f.name = layers[i].name;
      layers.erase(layers.begin() + static_cast<std::ptrdiff_t>(i));
      layers[i] = std::move(f);
    }
  }
}

void mark_first_layer(Layers& layers) {
  for (ArchLayer& l : layers) l.is_first_layer = false;
  if (!layers.empty()) layers.front().is_first_layer = true;
}

Shape pad_first_conv_channels(Layers& layers, const Shape& input) {
  const std::int64_t padded = align_up(input.c, kAmpInputChannelAlign);
  if (padded == input.c || layers.empty()) return input;
  ArchLayer& first = layers.front();
  if (first.kind != LayerKind::Conv && first.kind != LayerKind::CBR) return input;
  ConvParams p = first.conv();
  if (p.groups != 1) return input;  // a grouped first conv cannot read the padding channels
  p.logical_in_c = input.c;
  first.params = p;
  return Shape{input.n, input.h, input.w, padded};
}

void assign_names(Layers& layers) {
  std::map<std::string, int> counters;
  std::set<std::string> used;
  for (const ArchLayer& l : layers)
    if (!l.name.empty()) used.insert(l.name);
  for (ArchLayer& l : layers) {
    if (!l.name.empty()) continue;
    std::string base = layer_kind_name(l.kind);
    std::transform(base.begin(), base.end(), base.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string name;
    do {
      name = fmt::format("{}{}", base, ++counters[base]);
    } while (used.count(name));
    used.insert(name);
    l.name = name;
  }
  std::set<std::string> seen;
  for (const ArchLayer& l : layers)
    RN_CHECK_CTX(seen.insert(l.name).second, fmt::format("layer '{}'", l.name),
                 "layer name used twice (hint: names inside repeat() get '.<i>' suffixes; rename one of them)");
}

}  // namespace steps

// ---- ArchPlan ---------------------------------------------------------------------------------------

ArchPlan ArchPlan::from_blueprint(const bp::BluePrint& model, const BuildOptions& opts) {
  ArchPlan plan;
  plan.model_name = model.name;
  plan.amp = opts.amp;
  plan.fuse = opts.fuse;
  if (const std::string problem = bp::input_shape_problem(model.in_h, model.in_w, model.in_c); !problem.empty())
    RN_FAIL("{}", problem);
  const std::int64_t res = opts.resolution;
  plan.input = Shape{1, res > 0 ? res : model.in_h, res > 0 ? res : model.in_w, model.in_c};
  plan.input_channels = model.in_c;
  plan.layers = steps::expand_tree(model, opts);
  return plan;
}

ArchPlan ArchPlan::build(const bp::BluePrint& model, const BuildOptions& opts) {
  try {
    ArchPlan plan = from_blueprint(model, opts);  // step 1
    auto& L = plan.layers;
    steps::rename_bn(L);                                                   // 2
    plan.num_classes = steps::place_softmax_ce(L, opts.num_classes);       // 3
    steps::insert_identity_placeholders(L);                                // 4
    if (plan.amp) plan.input = steps::pad_first_conv_channels(L, plan.input);
    steps::infer_shapes(L, plan.input);                                    // 6
    steps::normalize_flatten(L, plan.input, plan.amp);                     // 5 (needs shapes)
    if (plan.fuse) steps::merge_blocks(L);                                 // 7
    steps::quadruple_fusion(L);                                            // 8
    steps::fuse_cbr(L);                                                    // 9
    steps::fuse_gap_fc(L);                                                 // 10
    steps::mark_first_layer(L);
    steps::infer_shapes(L, plan.input);  // re-check every fused layer's shape rule
    steps::assign_names(L);
    return plan;
  } catch (const Error& e) {
    throw e.with_context(fmt::format("model '{}'", model.name));
  }
}

std::int64_t ArchPlan::parameter_count() const {
  std::int64_t n = 0;
  for (const ArchLayer& l : layers) n += layer_parameter_count(l);
  return n;
}

std::int64_t ArchPlan::forward_macs() const {
  std::int64_t n = 0;
  for (const ArchLayer& l : layers) n += layer_forward_macs(l);
  return n;
}

}  // namespace renaissance::plan
