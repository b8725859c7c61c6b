#!/usr/bin/env python3
"""Turn a PyTorch state_dict into a Renaissance weights file (`renaissance eval --weights`, `predict`, ...).

    # the layer names come from the model's ArchPlan: from `renaissance plan --yaml` ...
    python3 scripts/import_pytorch.py model.pt --out weights.h5 --model resnet18_cifar [--renaissance build/app/renaissance]
    python3 scripts/import_pytorch.py model.pt --out weights.h5 --model-file models/tiny_resnet.yaml --classes 10
    # ... or from any weights file Renaissance wrote for the same model
    python3 scripts/import_pytorch.py model.pt --out weights.h5 --like run/weights.h5

The state_dict may use the torchvision layout (conv1, bn1, layer1.0.conv1, ..., fc; fmnist_cnn: conv1..conv3,
bn1..bn3, fc) or the "renaissance" layout that export_pytorch.py --layout renaissance writes (detected by its
"mods." prefix). Conv weights go OIHW -> OHWI, an fc after a flatten gets its columns back in NHWC order.
Needs numpy, h5py, PyYAML and torch.
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import renaissance_models as rm  # noqa: E402


def find_cli(explicit):
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise SystemExit(f"--renaissance {explicit}: no such executable")
        return explicit
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for cand in ("build/app/renaissance", "build-interop/app/renaissance", "build/release/app/renaissance"):
        p = os.path.join(here, cand)
        if os.access(p, os.X_OK):
            return p
    p = shutil.which("renaissance")
    if p:
        return p
    raise SystemExit("cannot find the renaissance executable; pass --renaissance PATH or --like FILE.h5")


def arch_yaml(args):
    if args.like:
        attrs, _ = rm.read_weights(args.like)
        return rm.arch_plan_text(args.like, attrs)
    cmd = [find_cli(args.renaissance), "plan", "--yaml"]
    cmd += ["--model-file", args.model_file] if args.model_file else ["--model", args.model]
    if args.classes:
        cmd += ["--classes", str(args.classes)]
    if args.resolution:
        cmd += ["--resolution", str(args.resolution)]
    if args.amp:
        cmd += ["--amp"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:  # not executable after all (a directory, no permission, a foreign binary)
        raise SystemExit(f"{cmd[0]}: cannot run it ({e.strerror or e})")
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr.strip()}")
    return r.stdout


def write_weights(path, tensors, attrs):
    import h5py
    import numpy as np
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            for k, v in attrs.items():
                # as Renaissance writes them: integers as int64, strings variable-length UTF-8 (h5py's str)
                f.attrs[k] = np.int64(v) if isinstance(v, int) else str(v)
            for (group, name), value in tensors.items():
                g = f.require_group(group)
                g.create_dataset(name, data=value.astype("<f4"), chunks=value.shape, fletcher32=True)
        os.replace(tmp, path)
    except OSError as e:  # an unwritable directory, a full disk
        raise SystemExit(f"{path}: cannot write it ({e.strerror or str(e).splitlines()[0]})")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("state_dict", help="PyTorch state_dict (.pt), e.g. written by export_pytorch.py")
    ap.add_argument("--out", required=True, help="Renaissance weights file to write (.h5)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="zoo model name (see `renaissance plan --help`)")
    src.add_argument("--model-file", help="model YAML")
    src.add_argument("--like", help="a Renaissance weights/checkpoint file of the same model (gives the ArchPlan)")
    ap.add_argument("--classes", type=int, default=0)
    ap.add_argument("--resolution", type=int, default=0)
    ap.add_argument("--amp", action="store_true", help="for an --amp run: the first conv padded to 8 input channels")
    ap.add_argument("--renaissance", help="path of the renaissance executable (default: build/app/renaissance)")
    ap.add_argument("--ema", action="store_true", help="also write the weights as the EMA copy (/ema)")
    args = ap.parse_args()

    rm.refuse_same_file(args.out, {"the state_dict": args.state_dict, "--like": args.like,
                                   "--model-file": args.model_file})
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if os.path.isdir(args.out) or not os.path.isdir(out_dir):
        raise SystemExit(f"{args.out}: --out must be a file in an existing directory")
    torch = rm.torch
    if not os.path.isfile(args.state_dict):
        raise SystemExit(f"{args.state_dict}: no such file")
    with open(args.state_dict, "rb") as f:
        head = f.read(4)
    # torch.save writes a zip archive (PyTorch >= 1.6), older versions a pickle (protocol 2: b"\x80\x02"); anything
    # else (text, HDF5) gave torch's "invalid load key" under a misleading "not a plain state_dict".
    if head != b"PK\x03\x04" and head[:1] != b"\x80":
        raise SystemExit(f"{args.state_dict}: not a PyTorch file (torch.save writes a zip archive or a pickle)")
    # weights_only: tensors and plain containers only; a pickle that would run code (a crafted .pt ran os.system
    # here) or a whole pickled module is refused.
    try:
        sd = torch.load(args.state_dict, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (torch raises UnpicklingError, RuntimeError, ...)
        # One line (the error is the last line) with torch's reason. PyTorch 1.13: "... WeightsUnpickler error:
        # Unsupported class posix.system"; 2.x: a paragraph of advice, then "Trying to load unsupported GLOBAL
        # posix.system whose module posix is blocked." on a line of its own.
        reason = re.search(r"\w+ error:\s*[^\n]+", str(e))
        lines = [" ".join(line.split()) for line in str(e).splitlines() if line.strip()]
        why = reason.group(0) if reason else next((line for line in lines if "unsupported" in line.lower()),
                                                 lines[0] if lines else type(e).__name__)
        why = why if len(why) <= 300 else why[:297] + "..."
        raise SystemExit(f"{args.state_dict}: not a plain state_dict (loaded with weights_only=True: {why}); save "
                         "model.state_dict() instead of the module")
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict):
        raise SystemExit(f"{args.state_dict}: holds a {type(sd).__name__}, not a state_dict (a dict of tensors)")
    text = arch_yaml(args)
    arch = rm.arch_from_yaml(text)
    layers, classes, in_c = rm.model_info(arch)
    bad = [k for k in sd if not isinstance(k, str)]
    if bad:
        raise SystemExit(f"{args.state_dict}: key {bad[0]!r} is not a string: not a state_dict")
    layout = "renaissance" if any(k.startswith("mods.") for k in sd) else "torchvision"
    if layout == "torchvision":  # torchvision keys come from a twin: this plan must compute what that twin does
        twin, why = rm.torchvision_twin(layers, classes, in_c)
        if twin is None:
            raise SystemExit(f"{args.state_dict}: torchvision-layout keys, but no torchvision-style twin computes what "
                             f"this model does ({why}): not this model's state_dict (export with --layout renaissance)")
    names = rm.module_names(layers, layout)

    # Shapes come from the Renaissance side: the conversions need them (padded first-conv channels under AMP).
    out, used = {}, set()
    for i, l in enumerate(layers):
        if l["kind"] not in rm.TENSOR_ROLES:
            continue
        prefix = names[l["name"]]
        for tname, pname in rm.TENSOR_ROLES[l["kind"]]:
            key = f"{prefix}.{pname}"
            if l["kind"] == "Conv" and tname == "b" and not l.get("params", {}).get("bias", False):
                continue
            if key not in sd:
                raise SystemExit(f"{args.state_dict}: no '{key}' for Renaissance tensor {l['name']}.{tname}")
            value = plain_array(args.state_dict, key, sd[key])
            shape = renaissance_shape(l, tname)
            out[(rm.tensor_group(tname), f"{l['name']}.{tname}")] = rm.from_torch(
                l, tname, value, shape, layers, i, key=f"{args.state_dict}: '{key}'")
            used.add(key)
    unused = [k for k in sd if k not in used and not k.endswith("num_batches_tracked")]
    if unused:
        raise SystemExit(f"{args.state_dict}: tensors with no Renaissance counterpart: {unused[:8]}")
    if args.ema:
        for (g, n), v in list(out.items()):
            if g == "params":
                out[("ema", n)] = v
    attrs = {"format": rm.WEIGHTS_FORMAT, "version": 1, "model": str(arch.get("model", "")), "arch_plan": text,
             "step": 0, "plan_hash": "imported", "source": os.path.basename(args.state_dict)}
    write_weights(args.out, out, attrs)
    print(f"{args.state_dict} ({layout} layout) -> {args.out}: {len(out)} tensors for model '{attrs['model']}'")


def plain_array(path, key, t):
    """A state_dict value as a float32 array: a dense floating-point tensor of finite values (a list, a sparse or
    complex tensor was a traceback or lost its imaginary part; a NaN/Inf went into the file with exit 0)."""
    torch = rm.torch
    if not isinstance(t, torch.Tensor):
        raise SystemExit(f"{path}: '{key}' is of type {type(t).__name__}, not a tensor")
    if t.layout != torch.strided:
        raise SystemExit(f"{path}: '{key}' is a {t.layout} tensor, not a dense one (save it with .to_dense())")
    if not t.dtype.is_floating_point:
        raise SystemExit(f"{path}: '{key}' is a {t.dtype} tensor, not a floating-point one")
    value = t.detach().cpu().float().numpy()
    if not rm.isfinite_all(value):
        raise SystemExit(f"{path}: '{key}' holds a non-finite value (NaN, Inf or beyond float32's range: a diverged "
                         "run's weights?)")
    return value


def renaissance_shape(layer, tname):
    """(n, h, w, c) of a Renaissance tensor, as infer_tensors in lib/renaissance/plan/layers/ declares it."""
    kind, p = layer["kind"], layer.get("params", {})
    n, h, w, c = layer["in"]
    if kind == "Conv":
        if tname == "w":
            groups = p.get("groups", 1) or 1
            if groups < 1:
                groups = c
            return (p["out_c"], p["k"], p["k"], c // groups)
        return (1, 1, 1, layer["out"][3])
    if kind == "Fc":
        return (p["out"], 1, 1, h * w * c) if tname == "w" else (1, 1, 1, p["out"])
    return (1, 1, 1, c)


if __name__ == "__main__":
    main()
