"""PyTorch twins of Renaissance models and the weight-layout conversions between the two.

Used by scripts/export_pytorch.py, scripts/import_pytorch.py and the interop test. Needs numpy, h5py, PyYAML and
torch (Debian: python3-torch python3-h5py python3-yaml).

Layouts (docs/interop.md):
  * Renaissance stores activations NHWC and a conv weight as OHWI (out, kh, kw, in/groups); PyTorch uses OIHW.
  * An fc weight is (out, 1, 1, in) where `in` follows Renaissance's NHWC flatten (h, w, c); PyTorch's
    flatten is (c, h, w), so an fc after a flatten of an h×w×c map has its columns permuted.
  * BN vectors are (1, 1, 1, C); PyTorch wants (C,). BN eps is 1e-5 as in PyTorch.
  * An AMP plan pads the first conv's input channels to 8 (`logical_in_c` says how many are real) and fuses
    layers (CBR, BasicBlock*, Bottleneck*, InvResidual*, GapFC); `lower()` expands them into the plain layers,
    whose tensors are then named "<fused layer>.<part>.<tensor>" exactly as in the file.

Two PyTorch layouts:
  * "torchvision": conv1/bn1/layerS.B.{conv1,bn1,...,downsample.0,downsample.1}/fc for ResNets (the keys of
    torchvision.models.resnet*), conv1/bn1/conv2/.../fc for fmnist_cnn; only where that twin computes exactly what
    the plan does (torchvision_twin compares them layer for layer);
  * "renaissance": an ArchPlanNet (any model) whose module names are the Renaissance layer names ('.' -> '_').
"""

import os
import struct
import sys
import zlib

try:
    import h5py
    import numpy as np
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import yaml
except ImportError as e:  # a traceback said only "No module named 'h5py'", not which interpreter lacked it
    print(f"{os.path.basename(sys.argv[0]) or 'renaissance_models'}: {e} in {sys.executable}: the PyTorch scripts need "
          "numpy, h5py, PyYAML and torch (Debian: python3-h5py python3-yaml python3-torch; run them with the python3 "
          "that has them, e.g. /usr/bin/python3)", file=sys.stderr)
    sys.exit(77)

WEIGHTS_FORMAT = "renaissance-weights"
BN_EPS = 1e-5

FUSED = {"CBR", "GapFC", "BottleneckIdentity", "BottleneckProjection", "BasicBlockIdentity", "BasicBlockProjection",
         "InvResidualNoShortcut", "InvResidualIdentity"}


# ---- the Renaissance file ---------------------------------------------------------------------------------------

def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


def refuse_same_file(out, inputs):
    """SystemExit when the output `out` is (a link to, another spelling of) one of `inputs` {option: path}: writing it
    would destroy that input (export_pytorch.py W.h5 --out W.h5 replaced the weights with a zip file)."""
    for opt, path in inputs.items():
        if not path or not os.path.exists(out) or not os.path.exists(path):
            continue
        if os.path.samefile(out, path):
            raise SystemExit(f"{out}: --out is the same file as {opt} {path}: writing it would destroy that input")


CHECKSUM_MAGIC = b"RNSUMS1\n"


def verify_checksums(path):
    """The checksum header Renaissance writes before the HDF5 image (lib/renaissance/io/hdf5_util.h): the header's own
    CRC-32 and the image's, checked before h5py reads a byte (a zeroed tensor passes h5py's Fletcher32 but not this).
    Files without the header (format 1) pass unchecked."""
    with open(path, "rb") as f:
        head = f.read(40)
        if len(head) < 40 or head[:8] != CHECKSUM_MAGIC:
            return
        hbytes, _, fbytes, image_crc, _, _, head_crc = struct.unpack("<IIQIIII", head[8:40])
        if zlib.crc32(head[:36]) & 0xffffffff != head_crc:
            raise SystemExit(f"{path}: the checksum header is damaged (its CRC-32 does not match)")
        if os.path.getsize(path) != fbytes:
            raise SystemExit(f"{path}: {os.path.getsize(path)} bytes, but its header says {fbytes} (truncated or appended?)")
        f.seek(hbytes)
        crc = 0
        for block in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(block, crc)
        if crc & 0xffffffff != image_crc:
            raise SystemExit(f"{path}: the file's content does not match its checksum (corrupt or changed: a zeroed "
                             "chunk reads as valid HDF5); `renaissance checkpoint inspect` names the tensor")


def read_weights(path):
    """attrs (str -> str) and tensors {(group, name): float32 array} of a weights/checkpoint file, verified against
    its checksum header; a non-finite value is an error naming the tensor."""
    if not os.path.isfile(path):
        raise SystemExit(f"{path}: no such file")
    verify_checksums(path)
    with open_h5(path) as f:
        attrs = {k: _text(v) if isinstance(v, (bytes, str)) else str(np.asarray(v).reshape(-1)[0])
                 for k, v in f.attrs.items() if np.asarray(v).size == 1}
        if attrs.get("format") not in (WEIGHTS_FORMAT, "renaissance-checkpoint"):
            raise SystemExit(f"{path}: format is '{attrs.get('format')}', not a Renaissance weights/checkpoint file")
        tensors = {}
        for group in ("params", "bn", "ema"):
            if group not in f:
                continue
            for name, ds in f[group].items():
                value = np.asarray(ds[...], dtype=np.float32)
                if not np.isfinite(value).all():
                    raise SystemExit(f"{path}: /{group}/{name} holds a non-finite value (a diverged run's weights)")
                tensors[(group, name)] = value
    return attrs, tensors


def open_h5(path, what="file"):
    """h5py.File(path, "r"), or SystemExit naming the file when it is missing or not HDF5 (h5py's OSError was a
    traceback)."""
    if not os.path.isfile(path):
        raise SystemExit(f"{path}: no such file")
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise SystemExit(f"{path}: not an HDF5 {what} ({str(e).splitlines()[0] if str(e) else type(e).__name__})")


def arch_plan_text(path, attrs):
    """The arch_plan attribute of a weights/checkpoint file: the layer structure every conversion needs."""
    text = attrs.get("arch_plan")
    if not text:
        raise SystemExit(f"{path}: no arch_plan attribute (the ArchPlan YAML the layer names come from): not written "
                         "by `renaissance train --save`, or by a Renaissance too old to record it")
    return text


def arch_from_yaml(text):
    try:
        arch = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise SystemExit(f"the arch_plan attribute is not valid YAML ({str(e).splitlines()[0]})")
    if not isinstance(arch, dict) or arch.get("format") != "renaissance-arch-plan":
        raise SystemExit("the arch_plan attribute is not a Renaissance ArchPlan")
    missing = [k for k in ("layers", "input_channels", "num_classes") if k not in arch]
    if missing or not isinstance(arch["layers"], list):
        raise SystemExit(f"the arch_plan attribute lacks {missing or ['a layer list']}: not a complete ArchPlan")
    return arch


# ---- lowering fused layers (mirrors lib/renaissance/plan/layers/fused.cpp decompose_fused) ------------------------

def _conv_out(hw, k, s, p):
    return (hw + 2 * p - k) // s + 1


def lower(layers):
    """The plain layers of an ArchPlan layer list: fused kinds expanded into their parts, named like the file."""
    out = []
    for l in layers:
        kind = l["kind"]
        if kind not in FUSED:
            out.append(l)
            continue
        name, p = l["name"], l.get("params", {})
        cur = list(l["in"])

        def add(k, part, params=None, shape=None, **extra):
            nonlocal cur
            e = {"kind": k, "name": f"{name}.{part}", "params": params or {}, "in": list(cur)}
            e.update(extra)
            if shape is not None:
                cur = shape
            e["out"] = list(cur)
            out.append(e)

        def conv(oc, k, s, g, part, logical=0):
            n, h, w, _ = cur
            pad = k // 2
            add("Conv", part, {"out_c": oc, "k": k, "stride": s, "pad": pad, "groups": g, "bias": False,
                               "logical_in_c": logical},
                [n, _conv_out(h, k, s, pad), _conv_out(w, k, s, pad), oc])

        def conv_bn(oc, k, s, g, tag, relu):
            conv(oc, k, s, g, tag + "_conv")
            add("Bn2d", tag + "_bn")
            if relu:
                add("Relu", tag + "_relu")

        if kind == "CBR":
            n, h, w, _ = cur
            q = dict(p)
            add("Conv", "conv", q, [n, _conv_out(h, q["k"], q["stride"], q["pad"]),
                                    _conv_out(w, q["k"], q["stride"], q["pad"]), q["out_c"]])
            add("Bn2d", "bn")
            add("Relu", "relu")
        elif kind == "GapFC":
            n = cur[0]
            add("Gap", "gap", shape=[n, 1, 1, cur[3]])
            add("Fc", "fc", dict(p), [n, 1, 1, p["out"]])
        elif kind.startswith(("Bottleneck", "BasicBlock")):
            block_in = list(cur)
            add("Add2Start", "start")
            if kind.endswith("Projection"):
                conv_bn(p["out_c"], 1, p["stride"], 1, "proj", False)
            else:
                add("Identity", "shortcut")
            cur = block_in
            add("Add2ShortcutEnd", "shortcut_end")
            if kind.startswith("Bottleneck"):
                conv_bn(p["mid_c"], 1, 1, 1, "c1", True)
                conv_bn(p["mid_c"], 3, p["stride"], 1, "c2", True)
                conv_bn(p["out_c"], 1, 1, 1, "c3", False)
            else:
                conv_bn(p["out_c"], 3, p["stride"], 1, "c1", True)
                conv_bn(p["out_c"], 3, 1, 1, "c2", False)
            add("Add2End", "add")
            add("Relu", "relu")
        else:  # InvResidual*
            block_in = list(cur)
            identity = kind == "InvResidualIdentity"
            if identity:
                add("Add2Start", "start")
                add("Identity", "shortcut")
                cur = block_in
                add("Add2ShortcutEnd", "shortcut_end")
            conv_bn(p["mid_c"], 1, 1, 1, "expand", True)
            conv_bn(p["mid_c"], 3, p["stride"], p["mid_c"], "dw", True)
            conv_bn(p["out_c"], 1, 1, 1, "project", False)
            if identity:
                add("Add2End", "add")
        if cur != list(l["out"]):
            raise SystemExit(f"fused layer {name}: lowering gives {cur}, the plan says {l['out']}")
    return out


# ---- tensor layout conversion -----------------------------------------------------------------------------------

def _fc_source_hwc(layers, i):
    """(h, w, c) of the map an fc at index i flattens, or None when its input is already a vector."""
    n, h, w, c = layers[i]["in"]
    if h * w > 1:
        return h, w, c
    j = i - 1
    while j >= 0 and layers[j]["kind"] in ("Identity",):
        j -= 1
    if j >= 0 and layers[j]["kind"] == "Flatten":
        _, h, w, c = layers[j]["in"]
        if h * w > 1:
            return h, w, c
    return None


def to_torch(layer, tensor, value, layers, index):
    """A Renaissance tensor (NHWC conventions) of `layer` as the PyTorch tensor of the same role."""
    kind = layer["kind"]
    if kind == "Conv" and tensor == "w":
        w = value.transpose(0, 3, 1, 2)  # OHWI -> OIHW
        logical = layer.get("params", {}).get("logical_in_c", 0) or 0
        if logical and w.shape[1] > logical:
            w = w[:, :logical]  # AMP pads the first conv's input channels with zeros
        return np.ascontiguousarray(w)
    if kind == "Fc" and tensor == "w":
        out = value.shape[0]
        w = value.reshape(out, -1)
        src = _fc_source_hwc(layers, index)
        if src:
            h, wd, c = src
            w = w.reshape(out, h, wd, c).transpose(0, 3, 1, 2).reshape(out, c * h * wd)
        return np.ascontiguousarray(w)
    return np.ascontiguousarray(value.reshape(-1))


def torch_shape(layer, tensor, shape):
    """The shape PyTorch gives the tensor whose Renaissance shape is `shape` (n, h, w, c): to_torch's result."""
    kind = layer["kind"]
    if kind == "Conv" and tensor == "w":
        logical = layer.get("params", {}).get("logical_in_c", 0) or 0
        in_c = logical if logical and logical < shape[3] else shape[3]
        return (shape[0], in_c, shape[1], shape[2])
    if kind == "Fc" and tensor == "w":
        return (shape[0], int(np.prod(shape[1:])))
    return (int(np.prod(shape)),)


def from_torch(layer, tensor, value, shape, layers, index, key=None):
    """The inverse of to_torch: a PyTorch tensor back into the Renaissance shape `shape` (n, h, w, c). Its shape must
    be exactly torch_shape's: a tensor of the same size but another shape (a 9x1 kernel for a 3x3, an fc weight
    transposed) went in reshaped, exit 0."""
    kind = layer["kind"]
    key = key or f"{layer['name']}.{tensor}"
    value = np.asarray(value, dtype=np.float32)
    want = torch_shape(layer, tensor, shape)
    if kind == "Conv" and tensor == "w":
        if value.ndim != 4:
            raise SystemExit(f"{key}: a PyTorch tensor of shape {list(value.shape)}, not a 4-D conv weight "
                             f"{list(want)}")
        if value.shape[1] != want[1]:
            # Only the channels an AMP plan's first conv pads (logical_in_c real ones, the rest zero) are filled in;
            # elsewhere zeros hid a model of other channels (a 1-channel state_dict went into a 3-channel model).
            raise SystemExit(f"{key}: {value.shape[1]} input channels in the state_dict, {want[1]} in the model "
                             f"(shapes {list(value.shape)} and {list(want)}): not the same model "
                             "(check --model/--classes/--resolution)")
    if tuple(value.shape) != want:
        raise SystemExit(f"{key}: shape {list(value.shape)} in the state_dict, the model's is {list(want)} (PyTorch "
                         f"layout of Renaissance {layer['name']}.{tensor} {list(shape)}): not the same model "
                         "(check --model/--classes/--resolution)")
    if kind == "Conv" and tensor == "w":
        w = value.transpose(0, 2, 3, 1)  # OIHW -> OHWI
        if w.shape[3] < shape[3]:  # the AMP padding
            w = np.concatenate([w, np.zeros(w.shape[:3] + (shape[3] - w.shape[3],), np.float32)], axis=3)
        return np.ascontiguousarray(w)
    if kind == "Fc" and tensor == "w":
        src = _fc_source_hwc(layers, index)
        w = value
        if src:
            h, wd, c = src
            w = w.reshape(shape[0], c, h, wd).transpose(0, 2, 3, 1)
        return np.ascontiguousarray(w.reshape(shape))
    return np.ascontiguousarray(value.reshape(shape))


# (Renaissance tensor name, PyTorch parameter name) per plain layer kind.
TENSOR_ROLES = {
    "Conv": [("w", "weight"), ("b", "bias")],
    "Fc": [("w", "weight"), ("b", "bias")],
    "Bn2d": [("gamma", "weight"), ("beta", "bias"), ("running_mean", "running_mean"), ("running_var", "running_var")],
    "Bn1d": [("gamma", "weight"), ("beta", "bias"), ("running_mean", "running_mean"), ("running_var", "running_var")],
}


def tensor_group(tensor):
    return "bn" if tensor.startswith("running_") else "params"


# ---- PyTorch module names ---------------------------------------------------------------------------------------

def _segments(layers):
    """Top-level layers and residual blocks: [('layer', l) | ('block', {'shortcut': [...], 'main': [...]})]."""
    segs, i = [], 0
    while i < len(layers):
        l = layers[i]
        if l["kind"] != "Add2Start":
            segs.append(("layer", l))
            i += 1
            continue
        depth, part, blk = 0, "shortcut", {"shortcut": [], "main": []}
        i += 1
        while i < len(layers):
            k = layers[i]["kind"]
            if k == "Add2Start":
                depth += 1
            elif k == "Add2End":
                if depth == 0:
                    break
                depth -= 1
            elif k == "Add2ShortcutEnd" and depth == 0:
                part = "main"
                i += 1
                continue
            blk[part].append(layers[i])
            i += 1
        i += 1  # past Add2End
        segs.append(("block", blk))
    return segs


def torchvision_names(layers):
    """Renaissance layer name -> PyTorch module prefix in the torchvision layout, or None if the model does not
    have that shape (nested blocks, more than one stem conv before the blocks, ...)."""
    names, segs = {}, _segments(layers)
    blocks = [s for s in segs if s[0] == "block"]
    top = {"Conv": 0, "Bn": 0}
    fcs = [l for kind, l in segs if kind == "layer" and l["kind"] == "Fc"]
    stage, index, seen_block = 0, -1, False
    for kind, s in segs:
        if kind == "layer":
            k = s["kind"]
            if k == "Conv" or k.startswith("Bn"):
                if blocks and seen_block:
                    return None  # a conv after the residual stages: not a torchvision ResNet
                key = "Conv" if k == "Conv" else "Bn"
                top[key] += 1
                names[s["name"]] = f"conv{top[key]}" if key == "Conv" else f"bn{top[key]}"
            elif k == "Fc":
                names[s["name"]] = "fc" if len(fcs) == 1 else f"fc{fcs.index(s) + 1}"
            continue
        if any(l["kind"] == "Add2Start" for l in s["shortcut"] + s["main"]):
            return None
        projection = any(l["kind"] == "Conv" for l in s["shortcut"])
        if seen_block and projection:
            stage, index = stage + 1, 0
        else:
            index += 1
        seen_block = True
        prefix = f"layer{stage + 1}.{index}"
        sc = [l for l in s["shortcut"] if l["kind"] == "Conv" or l["kind"].startswith("Bn")]
        for j, l in enumerate(sc):
            names[l["name"]] = f"{prefix}.downsample.{j}"
        counts = {"Conv": 0, "Bn": 0}
        for l in s["main"]:
            if l["kind"] == "Conv":
                counts["Conv"] += 1
                names[l["name"]] = f"{prefix}.conv{counts['Conv']}"
            elif l["kind"].startswith("Bn"):
                counts["Bn"] += 1
                names[l["name"]] = f"{prefix}.bn{counts['Bn']}"
    if blocks and top["Conv"] != 1:
        return None
    return names


def module_key(name):
    """The PyTorch module name of a Renaissance layer: PyTorch's module names hold no '.', so '.' becomes '_'."""
    return name.replace(".", "_")


def module_keys(layers):
    """{layer name: module key} of the layers with tensors; SystemExit when two layers map to one key ('x.y' and
    'x_y', or an unnamed cbr's 'cbr1.conv' and a conv named 'cbr1_conv'): one module would have held both layers'
    tensors, the export writing one of them and dropping the other without a word."""
    keys, owner = {}, {}
    for l in layers:
        if l["kind"] not in TENSOR_ROLES:
            continue
        key = module_key(l["name"])
        if key in owner and owner[key] != l["name"]:
            raise SystemExit(f"layers '{owner[key]}' and '{l['name']}' both become the PyTorch module '{key}' "
                             "(PyTorch's module names hold no '.', which becomes '_'): rename one of them")
        owner[key] = l["name"]
        keys[l["name"]] = key
    return keys


def renaissance_names(layers):
    return {name: "mods." + key for name, key in module_keys(layers).items()}


# ---- PyTorch models ---------------------------------------------------------------------------------------------

class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)  # stride on the 3x3 (ResNet v1.5)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision.models.ResNet, key for key, plus the small-input stem (3x3 stride 1, no max-pool) of the
    *_cifar / *_fmnist zoo models and a base width other than 64 (resnet18_fmnist_narrow)."""

    def __init__(self, block, layers, num_classes=1000, in_channels=3, width=64, small_stem=False):
        super().__init__()
        self.inplanes = width
        if small_stem:
            self.conv1 = nn.Conv2d(in_channels, width, 3, 1, 1, bias=False)
            self.maxpool = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(in_channels, width, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, width, layers[0])
        self.layer2 = self._make_layer(block, width * 2, layers[1], 2)
        self.layer3 = self._make_layer(block, width * 4, layers[2], 2)
        self.layer4 = self._make_layer(block, width * 8, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(width * 8 * block.expansion, num_classes)

    def _make_layer(self, block, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes * block.expansion, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes * block.expansion))
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def signature(self, h, w, c):
        """What forward() computes, as plan_signature() writes a plan (torchvision_twin compares the two)."""
        t = _Trace(h, w, c)
        t.conv(self.conv1)
        t.add("Bn2d")
        t.add("Relu")
        if isinstance(self.maxpool, nn.MaxPool2d):
            t.pool(self.maxpool.kernel_size, self.maxpool.stride, self.maxpool.padding)
        for stage in (self.layer1, self.layer2, self.layer3, self.layer4):
            for b in stage:
                block_in = t.cur
                t.add("Add2Start")
                if b.downsample is None:
                    t.add("Identity")
                else:
                    t.conv(b.downsample[0])
                    t.add("Bn2d")
                t.cur = block_in
                t.add("Add2ShortcutEnd", in_s=None)
                convs = [b.conv1, b.conv2] + ([b.conv3] if isinstance(b, Bottleneck) else [])
                for j, conv in enumerate(convs):
                    t.conv(conv)
                    t.add("Bn2d")
                    if j < len(convs) - 1:
                        t.add("Relu")
                t.add("Add2End")
                t.add("Relu")
        t.add("Gap", out=(1, 1, t.cur[2]))
        t.fc(self.fc)
        return t.sig


class FmnistCnn(nn.Module):
    """The zoo's fmnist_cnn: 3 x (conv3x3 + BN + ReLU), max-pools after the first two, flatten, fc."""

    def __init__(self, num_classes=10, in_channels=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 32, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.conv3 = nn.Conv2d(64, 64, 3, 1, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(64)
        self.fc = nn.Linear(64 * 7 * 7, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2, 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2, 2)
        x = F.relu(self.bn3(self.conv3(x)))
        return self.fc(torch.flatten(x, 1))

    def signature(self, h, w, c):
        """What forward() computes, as plan_signature() writes a plan (torchvision_twin compares the two)."""
        t = _Trace(h, w, c)
        for conv, pool in ((self.conv1, True), (self.conv2, True), (self.conv3, False)):
            t.conv(conv)
            t.add("Bn2d")
            t.add("Relu")
            if pool:
                t.pool(2, 2, 0)
        t.add("Flatten", out=(1, 1, t.cur[0] * t.cur[1] * t.cur[2]))
        t.fc(self.fc)
        return t.sig


class ArchPlanNet(nn.Module):
    """Any plain Renaissance ArchPlan run by PyTorch (NCHW), module names = Renaissance layer names."""

    def __init__(self, layers):
        super().__init__()
        self.plan = layers
        self.mods = nn.ModuleDict()
        module_keys(layers)  # no two layers on one module
        for i, l in enumerate(layers):
            k, p, key = l["kind"], l.get("params", {}), module_key(l["name"])
            if k == "Conv":
                in_c = (p.get("logical_in_c") or 0) if i == _first_conv(layers) else 0
                in_c = in_c or l["in"][3]
                groups = p.get("groups", 1)
                if groups == -1 or groups == 0:  # depthwise marker
                    groups = l["in"][3]
                self.mods[key] = nn.Conv2d(in_c, p["out_c"], p["k"], p["stride"], p["pad"], groups=groups,
                                           bias=bool(p.get("bias", False)))
            elif k in ("Bn2d", "Bn1d"):
                self.mods[key] = (nn.BatchNorm2d if k == "Bn2d" else nn.BatchNorm1d)(l["in"][3])
            elif k == "Fc":
                self.mods[key] = nn.Linear(l["in"][1] * l["in"][2] * l["in"][3], p["out"])

    def forward(self, x):
        stack = []
        for l in self.plan:
            k, p = l["kind"], l.get("params", {})
            key = module_key(l["name"])
            if k in ("Conv", "Bn2d"):
                x = self.mods[key](x)
            elif k == "Bn1d":
                x = self.mods[key](x.flatten(1)).reshape(x.shape)
            elif k == "Relu":
                x = F.relu(x)
            elif k == "Tanh":
                x = torch.tanh(x)
            elif k == "Silu":
                x = F.silu(x)
            elif k == "MaxPool":
                x = F.max_pool2d(x, p["k"], p["stride"], p["pad"])
            elif k == "Gap":
                x = x.mean(dim=(2, 3), keepdim=True)
            elif k == "Flatten":
                x = x.flatten(1)[:, :, None, None]
            elif k == "Fc":
                x = self.mods[key](x.flatten(1))[:, :, None, None]
            elif k == "Add2Start":
                stack.append([x, None])
            elif k == "Add2ShortcutEnd":
                stack[-1][1] = x
                x = stack[-1][0]
            elif k == "Add2End":
                x = x + stack.pop()[1]
            elif k in ("Identity", "SoftmaxCE"):
                pass
            else:
                raise SystemExit(f"ArchPlanNet: layer kind {k} is not supported")
        return x.flatten(1)


def _first_conv(layers):
    for i, l in enumerate(layers):
        if l["kind"] == "Conv":
            return i
    return -1


# ---- which twin: what it computes, compared with the plan layer for layer ------------------------------------------

def plan_signature(layers, in_channels):
    """(kind, params, in (h, w, c), out (h, w, c)) of every plain layer up to the logits (a last SoftmaxCE, the loss,
    left out), as the twins' signature() methods write what they compute."""
    first, sig = _first_conv(layers), []
    for i, l in enumerate(layers):
        k, p = l["kind"], l.get("params") or {}
        if k == "SoftmaxCE" and i == len(layers) - 1:
            break
        in_s, out_s, params = tuple(l["in"][1:]), tuple(l["out"][1:]), ()
        if k == "Conv":
            groups = p.get("groups", 1)
            groups = l["in"][3] if groups in (0, -1) else groups  # the depthwise marker
            params = (p["out_c"], p["k"], p["stride"], p["pad"], groups, bool(p.get("bias", False)))
            if i == first and p.get("logical_in_c"):
                in_s = in_s[:2] + (p["logical_in_c"],)  # AMP's zero padding channels, cut off in PyTorch
        elif k == "MaxPool":
            params = (p["k"], p["stride"], p["pad"])
        elif k == "Fc":
            params = (p["out"],)
        if k == "Add2ShortcutEnd":
            in_s = None  # plans record the shortcut's output or the block's input here; its out is the block's input
        sig.append((k, params, in_s, out_s))
    return sig


class _Trace:
    """A twin's forward() written as plan_signature() writes a plan (shapes by PyTorch's arithmetic, floor mode)."""

    def __init__(self, h, w, c):
        self.cur, self.sig = (h, w, c), []

    def add(self, kind, params=(), out=None, in_s="cur"):
        in_s = self.cur if in_s == "cur" else in_s
        self.cur = out or self.cur
        self.sig.append((kind, params, in_s, self.cur))

    def conv(self, m):
        h, w, _ = self.cur
        k, s, p = m.kernel_size[0], m.stride[0], m.padding[0]
        self.add("Conv", (m.out_channels, k, s, p, m.groups, m.bias is not None),
                 (_conv_out(h, k, s, p), _conv_out(w, k, s, p), m.out_channels))

    def pool(self, k, s, p):
        h, w, c = self.cur
        self.add("MaxPool", (k, s, p), (_conv_out(h, k, s, p), _conv_out(w, k, s, p), c))

    def fc(self, m):  # on the flattened map: in_features must be what the plan's fc sees
        self.add("Fc", (m.out_features,), (1, 1, m.out_features), in_s=(1, 1, m.in_features))


def _resnet_guess(layers, num_classes, in_channels):
    """The ResNet whose block kind, stage lengths, base width and stem the plan suggests (torchvision_twin then
    compares it layer for layer), or a string saying why there is none."""
    segs = _segments(layers)
    blocks = [s for k, s in segs if k == "block"]
    stem = [s for k, s in segs if k == "layer" and s["kind"] == "Conv"]
    if len(stem) != 1:
        return f"{len(stem)} convolutions outside the residual blocks, a ResNet has one"
    main_convs = {sum(1 for l in b["main"] if l["kind"] == "Conv") for b in blocks}
    if main_convs not in ({2}, {3}):
        return "residual blocks of neither 2 (basic) nor 3 (bottleneck) convolutions"
    counts, seen = [], False
    for b in blocks:  # a stage starts at a projection shortcut (the first block's may be one too)
        projection = any(l["kind"] == "Conv" for l in b["shortcut"])
        if not counts or (seen and projection):
            counts.append(0)
        counts[-1] += 1
        seen = True
    if len(counts) != 4:
        return f"{len(counts)} stages, a torchvision ResNet has 4"
    p = stem[0]["params"]
    return ResNet(BasicBlock if main_convs == {2} else Bottleneck, counts, num_classes, in_channels,
                  width=p["out_c"], small_stem=p["k"] == 3)


def _fmt(sig):
    kind, params, in_s, out_s = sig
    return f"{kind}{list(params) if params else ''} {list(in_s) if in_s else '?'} -> {list(out_s)}"


def torchvision_twin(layers, num_classes, in_channels):
    """(module, None) where a torchvision-keyed twin (ResNet, FmnistCnn) computes exactly what the plan does, layer
    for layer (kinds, kernels, strides, pads, pools, activations, widths, shapes), else (None, why not): picked from
    the tensor kinds and the first conv's width alone, a strided or tanh CNN became an FmnistCnn, a ResNet with other
    strides, pools or widths a torchvision one, and the logits were wrong."""
    if not layers:
        return None, "no layers"
    twin = (_resnet_guess(layers, num_classes, in_channels) if any(l["kind"] == "Add2Start" for l in layers)
            else FmnistCnn(num_classes, in_channels))
    if isinstance(twin, str):
        return None, twin
    _, h, w, _ = layers[0]["in"]
    plan, want, name = plan_signature(layers, in_channels), twin.signature(h, w, in_channels), type(twin).__name__
    for i, (a, b) in enumerate(zip(plan, want)):
        if a != b:
            return None, f"layer {layers[i]['name']} is {_fmt(a)}, {name}'s is {_fmt(b)}"
    if len(plan) != len(want):
        return None, f"{len(plan)} layers, {name} has {len(want)}"
    return twin, None


def torch_model(layers, num_classes, in_channels, layout):
    """The PyTorch module for these plain layers in `layout` ('torchvision' or 'renaissance')."""
    if layout == "renaissance":
        return ArchPlanNet(layers)
    twin, why = torchvision_twin(layers, num_classes, in_channels)
    if twin is None:
        raise SystemExit(f"no torchvision-style twin computes what this model does ({why}); use --layout renaissance")
    return twin


def module_names(layers, layout):
    if layout == "renaissance":
        return renaissance_names(layers)
    names = torchvision_names(layers)
    if names is None:
        raise SystemExit("this model has no torchvision layout; use --layout renaissance")
    return names


def pick_model(layers, num_classes, in_channels, layout):
    """(layout, module); 'auto' is the torchvision twin where one matches the plan exactly, else the generic
    ArchPlanNet (exact for every plan it runs)."""
    if layout != "auto":
        return layout, torch_model(layers, num_classes, in_channels, layout)
    twin, _ = torchvision_twin(layers, num_classes, in_channels)
    return ("torchvision", twin) if twin is not None else ("renaissance", ArchPlanNet(layers))


def model_info(arch):
    layers = lower(arch["layers"])
    in_c = arch["input_channels"]
    return layers, int(arch["num_classes"]), int(in_c)


def normalize(images_u8, mean, std):
    """uint8 NHWC images -> float32 NCHW, exactly as Renaissance normalises (x * 1/(255·std) - mean/std)."""
    mean = np.asarray(mean, np.float32)
    std = np.asarray(std, np.float32)
    scale = (np.float32(1.0) / (np.float32(255.0) * std)).astype(np.float32)
    bias = (-mean / std).astype(np.float32)
    x = images_u8.astype(np.float32) * scale + bias
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))


def check_device(device):
    """torch.device(device), or SystemExit where PyTorch cannot use it here (a bogus name, cuda without CUDA:
    tracebacks in export_pytorch.py --check-logits and golden_pytorch.py)."""
    try:
        dev = torch.device(device)
    except RuntimeError as e:
        raise SystemExit(f"--device {device}: not a PyTorch device ({str(e).splitlines()[0]})")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: this PyTorch ({torch.__version__}) sees no CUDA device")
    try:
        torch.zeros(1, device=dev)
    except (RuntimeError, AssertionError) as e:
        raise SystemExit(f"--device {device}: unusable ({str(e).splitlines()[0]})")
    return dev


def relative_error(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def isfinite_all(*arrays):
    return all(np.isfinite(np.asarray(a)).all() for a in arrays)

