// Fused AMP kinds: CBR, Bottleneck/BasicBlock (identity/projection), InvResidual (no shortcut/identity), GapFC.
// Each stands for a fixed plain composition (its `decompose`); the compiler plans tensors and nodes through
// that composition and wraps each pass in one FUSED_* node whose sub-nodes the CPU backend runs and whose
// tensors the fused GPU kernels read.
#include <renaissance/core/error.h>
#include <renaissance/plan/layer_descriptor.h>

#include <fmt/format.h>

namespace renaissance::plan {

namespace {

struct Builder {
  const ArchLayer& fused;
  std::vector<ArchLayer> parts;
  Shape cur;
  std::vector<Shape> open;  // block inputs of open add2 regions

  ArchLayer& add(LayerKind k, LayerParams p, const std::string& part) {
    ArchLayer l;
    l.kind = k;
    l.params = std::move(p);
    l.name = fmt::format("{}.{}", fused.name, part);
    l.in_shape = cur;
    if (k == LayerKind::Add2Start) {
      open.push_back(cur);
    } else if (k == LayerKind::Add2ShortcutEnd) {
      cur = open.back();
    } else if (k == LayerKind::Add2End) {
      open.pop_back();
    } else {
      cur = infer_out_shape(l, cur);
    }
    l.out_shape = cur;
    parts.push_back(std::move(l));
    return parts.back();
  }
  void conv(std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t groups, const std::string& part) {
    ConvParams p;
    p.out_c = out;
    p.k = k;
    p.stride = stride;
    p.pad = k / 2;
    p.groups = groups;
    add(LayerKind::Conv, p, part);
  }
  void conv_bn(std::int64_t out, std::int64_t k, std::int64_t stride, std::int64_t groups, const std::string& tag,
               bool relu) {
    conv(out, k, stride, groups, tag + "_conv");
    add(LayerKind::Bn2d, NoParams{}, tag + "_bn");
    if (relu) add(LayerKind::Relu, NoParams{}, tag + "_relu");
  }
};

std::vector<ArchLayer> decompose_fused(const ArchLayer& l) {
  Builder b{l, {}, l.in_shape, {}};
  switch (l.kind) {
    case LayerKind::CBR: {
      ArchLayer& c = b.add(LayerKind::Conv, l.params, "conv");
      c.is_first_layer = l.is_first_layer;
      b.add(LayerKind::Bn2d, NoParams{}, "bn");
      b.add(LayerKind::Relu, NoParams{}, "relu");
      break;
    }
    case LayerKind::GapFC:
      b.add(LayerKind::Gap, NoParams{}, "gap");
      b.add(LayerKind::Fc, l.params, "fc");
      break;
    case LayerKind::BottleneckIdentity:
    case LayerKind::BottleneckProjection:
    case LayerKind::BasicBlockIdentity:
    case LayerKind::BasicBlockProjection: {
      const BlockParams& p = l.block();
      const bool projection = l.kind == LayerKind::BottleneckProjection || l.kind == LayerKind::BasicBlockProjection;
      b.add(LayerKind::Add2Start, NoParams{}, "start");
      if (projection) {
        b.conv_bn(p.out_c, 1, p.stride, 1, "proj", false);
      } else {
        b.add(LayerKind::Identity, NoParams{}, "shortcut");
      }
      b.add(LayerKind::Add2ShortcutEnd, NoParams{}, "shortcut_end");
      if (l.kind == LayerKind::BottleneckIdentity || l.kind == LayerKind::BottleneckProjection) {
        b.conv_bn(p.mid_c, 1, 1, 1, "c1", true);
        b.conv_bn(p.mid_c, 3, p.stride, 1, "c2", true);
        b.conv_bn(p.out_c, 1, 1, 1, "c3", false);
      } else {
        b.conv_bn(p.out_c, 3, p.stride, 1, "c1", true);
        b.conv_bn(p.out_c, 3, 1, 1, "c2", false);
      }
      b.add(LayerKind::Add2End, NoParams{}, "add");
      b.add(LayerKind::Relu, NoParams{}, "relu");
      break;
    }
    case LayerKind::InvResidualNoShortcut:
    case LayerKind::InvResidualIdentity: {
      const BlockParams& p = l.block();
      const bool identity = l.kind == LayerKind::InvResidualIdentity;
      if (identity) {
        b.add(LayerKind::Add2Start, NoParams{}, "start");
        b.add(LayerKind::Identity, NoParams{}, "shortcut");
        b.add(LayerKind::Add2ShortcutEnd, NoParams{}, "shortcut_end");
      }
      b.conv_bn(p.mid_c, 1, 1, 1, "expand", true);
      b.conv_bn(p.mid_c, 3, p.stride, p.mid_c, "dw", true);
      b.conv_bn(p.out_c, 1, 1, 1, "project", false);
      if (identity) b.add(LayerKind::Add2End, NoParams{}, "add");
      break;
    }
    default: RN_FAIL("{} is not a fused layer kind", layer_kind_name(l.kind));
  }
  RN_CHECK(b.cur == l.out_shape, "fused layer '{}': its parts give {} but the layer says {}", l.name, b.cur.str(),
           l.out_shape.str());
  return b.parts;
}

LayerDescriptor fused_descriptor(LayerKind kind) {
  LayerDescriptor d;
  d.kind = kind;
  d.decompose = decompose_fused;
  // The union of the parts' tensors, named "<part suffix>.<tensor>" (the compiler plans the parts directly).
  d.infer_tensors = [](const ArchLayer& l, const Shape& in, const Shape& out, const InferContext& ctx) {
    ArchLayer shaped = l;
    shaped.in_shape = in;
    shaped.out_shape = out;
    LayerTensors all;
    for (const ArchLayer& part : lower_layer(shaped)) {
      const LayerDescriptor& pd = LayerRegistry::instance().get(part.kind);
      InferContext pctx = ctx;
      pctx.first_layer = part.is_first_layer;
      LayerTensors t = pd.infer_tensors(part, part.in_shape, part.out_shape, pctx);
      const std::string prefix = part.name.substr(l.name.size() + 1) + ".";
      for (ParamDesc& p : t.params) all.params.push_back({prefix + p.name, p.shape, p.kind});
      for (TensorDesc& x : t.tensors) all.tensors.push_back({prefix + x.name, x.shape, x.dtype, x.region});
    }
    return all;
  };
  return d;
}

}  // namespace

void register_fused_layers(LayerRegistry& r) {
  for (LayerKind k : {LayerKind::CBR, LayerKind::BottleneckIdentity, LayerKind::BottleneckProjection,
                      LayerKind::BasicBlockIdentity, LayerKind::BasicBlockProjection, LayerKind::InvResidualNoShortcut,
                      LayerKind::InvResidualIdentity, LayerKind::GapFC})
    r.add(fused_descriptor(k));
}

}  // namespace renaissance::plan
